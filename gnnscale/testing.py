"""Test helpers, modelled on ``torch_geometric.testing``: skip decorators, tiny graphs, baselines.

Tests import these instead of each other. gnnscale samples every task itself; torch-sparse is
optional, and the tests that compare with it (or use its ``SparseTensor``) skip without it,
:data:`TORCH_SPARSE_MISSING` in their reason. With ``GNNSCALE_REQUIRE_TORCH_SPARSE=1`` the
suite's conftest fails them instead, so CI's torch-sparse run cannot pass by skipping.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import struct
import subprocess
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import psutil
import pytest
import torch
from torch_geometric.data import Data, HeteroData

from gnnscale import stores
from gnnscale.data.synthetic import SyntheticGraph, SyntheticRecommender, make_recommender_graph

__all__ = [
    "LINK_TINY",
    "MAG_COUNTS",
    "MAG_RELATIONS",
    "SPLITS",
    "TORCH_SPARSE_MISSING",
    "KillAtStep",
    "TINY",
    "TINY_ARGS",
    "by_destination",
    "centroid_accuracy",
    "cli_args",
    "damage_a_weight",
    "npy_homogeneous",
    "npy_mag",
    "prepared_recommender",
    "quiet_trainer",
    "requires_cuda",
    "requires_torch_sparse",
    "run_or_show_stacks",
    "users_items_tags",
    "with_package",
]

TORCH_SPARSE_MISSING = "torch-sparse not installed (WITH_TORCH_SPARSE=1 ./install.sh)"

# The suite's conftest skips tests marked so where torch-sparse does not import (CI's
# torch-sparse run selects them: ``pytest -m torch_sparse``).
requires_torch_sparse: Callable[[Any], Any] = pytest.mark.torch_sparse
requires_cuda: Callable[[Any], Any] = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"
)


# Small enough for a CPU test, hard enough that features alone are weak (see centroid_accuracy).
TINY = SyntheticGraph(
    num_nodes=3000, avg_degree=12, num_features=32, num_classes=5, feature_noise=4.0, seed=0
)
TINY_ARGS = [
    "--data.synthetic.num_nodes=3000",
    "--data.synthetic.avg_degree=12",
    "--data.synthetic.num_features=32",
    "--data.synthetic.num_classes=5",
    "--data.synthetic.feature_noise=4.0",
]


def with_package(name: str) -> Callable[[Any], Any]:
    """Skip unless ``name`` can be imported."""
    return pytest.mark.skipif(
        importlib.util.find_spec(name) is None, reason=f"needs the {name} package"
    )


def centroid_accuracy(data: Data) -> float:
    """Test accuracy of the nearest class centroid of the training features: edges ignored.

    On the generated graphs (a class centroid plus isotropic Gaussian noise) this is about the
    best a classifier of the features alone can do, so a GNN must beat it clearly to show it
    reads the edges.
    """
    x, y = data.x.float(), data.y
    classes = int(y.max()) + 1
    train = data.train_mask
    centroids = torch.zeros(classes, x.size(1)).index_add_(0, y[train], x[train])
    centroids /= torch.bincount(y[train], minlength=classes).clamp(min=1)[:, None]
    pred = torch.cdist(x[data.test_mask], centroids).argmin(-1)
    return float((pred == y[data.test_mask]).float().mean())


def cli_args(folder: Path) -> list[str]:
    """Arguments that keep a ``gnnscale fit`` on the CPU, quiet, on :data:`TINY`, in ``folder``."""
    return [
        f"--data.root={folder / 'data'}",
        "--trainer.accelerator=cpu",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={folder}",
        f"--trainer.logger.init_args.save_dir={folder / 'runs'}",
        *TINY_ARGS,
    ]


class KillAtStep(L.Callback):
    """Sends its own process a signal after optimizer step ``step``, mid-epoch.

    ``SIGKILL`` is a crash: nothing is flushed or saved, the run keeps what it had written.
    ``SIGTERM`` is what a scheduler sends to pre-empt a job.

    Args:
        step: The ``global_step`` after which the signal is sent.
        signal: Its name.
    """

    def __init__(self, step: int, signal: str = "SIGKILL") -> None:
        self.step, self.signal, self.sent = step, signal, False

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        """Send it once the step is reached."""
        if trainer.global_step >= self.step and not self.sent:
            self.sent = True
            os.kill(os.getpid(), getattr(signal, self.signal))


class KillAtPredictBatch(L.Callback):
    """Sends its own process a signal after prediction batch ``batch`` (0: the first).

    Args:
        batch: The batch index after which the signal is sent.
        signal: Its name.
    """

    def __init__(self, batch: int, signal: str = "SIGTERM") -> None:
        self.batch, self.signal, self.seen = batch, signal, 0

    def on_predict_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        """Send it after the batch."""
        if self.seen == self.batch:
            os.kill(os.getpid(), getattr(signal, self.signal))
        self.seen += 1


def damage_a_weight(path: Path) -> str:
    """Flip one byte inside the first tensor record of a ``torch.save`` file; return its name."""
    with zipfile.ZipFile(path) as archive:
        record = next(r for r in archive.infolist() if "/data/" in r.filename and r.file_size)
    data = bytearray(path.read_bytes())
    header = record.header_offset  # a zip local header: 30 bytes, then its name and extra field
    name_len, extra_len = struct.unpack("<HH", data[header + 26 : header + 30])
    data[header + 30 + name_len + extra_len + record.file_size // 2] ^= 0x40
    path.write_bytes(data)
    return record.filename


def run_or_show_stacks(
    argv: list[str], timeout: float, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True)`` that fails with stacks on a hang.

    The command runs with ``PYTHONFAULTHANDLER=1``, which every process it forks inherits
    (ranks, loader workers). If it has not finished after ``timeout`` seconds, every process of
    its tree is stopped, then each, the deepest first, gets ``SIGABRT`` and is let die before
    the next, so that each Python process prints every thread's stack to the shared stderr in
    turn (sent at once, two stacks came out mixed character by character); the test then fails
    with that stderr's tail: where the run was stuck.

    Args:
        argv: The command.
        timeout: Seconds it may take.
        kwargs: ``cwd``, ``env`` (default: this process's), as for ``subprocess.run``.
    """
    env = {**kwargs.pop("env", os.environ), "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kwargs
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        tree = [psutil.Process(proc.pid)]
        with contextlib.suppress(psutil.Error):
            tree += tree[0].children(recursive=True)
        for process in tree:  # all stopped first: none moves on when another one dies
            with contextlib.suppress(psutil.Error):
                process.suspend()
        for process in reversed(tree):  # the deepest first, one at a time: stacks not mixed
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGABRT)
                process.resume()
                _wait_until_dead(process)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            for process in tree:
                with contextlib.suppress(psutil.Error):
                    process.kill()
            out, err = proc.communicate()
        pytest.fail(
            f"{' '.join(argv[:6])} ... did not finish in {timeout:g} s; every process of it was "
            f"sent SIGABRT, and its stderr ends with their stacks:\n{err[-20000:]}"
        )
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _wait_until_dead(process: psutil.Process, timeout: float = 10.0) -> None:
    """Until ``process`` has exited (a zombie counts: its parent may be stopped), or ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.02)


def users_items_tags(
    sizes: tuple[int, int, int],
    num_buys: int,
    bought_items: int,
    num_tagged: int,
    features: int,
    seed: int = 0,
) -> HeteroData:
    """A small heterogeneous graph for sampler tests: users buy items, items have tags.

    Every node type is reached two ways (each relation and its reverse); the first
    ``bought_items`` items are the only ones bought, so the rest have no user in-edges.
    """
    g = torch.Generator().manual_seed(seed)
    data = HeteroData()
    for t, n in zip(("user", "item", "tag"), sizes, strict=True):
        data[t].x = torch.randn(n, features, generator=g)
    users, items, tags = sizes
    buys = torch.stack(
        [
            torch.randint(0, users, (num_buys,), generator=g),
            torch.randint(0, bought_items, (num_buys,), generator=g),
        ]
    )
    tagged = torch.stack(
        [
            torch.randint(0, items, (num_tagged,), generator=g),
            torch.randint(0, tags, (num_tagged,), generator=g),
        ]
    )
    data["user", "buys", "item"].edge_index = buys
    data["item", "bought_by", "user"].edge_index = buys.flip(0)
    data["item", "has", "tag"].edge_index = tagged
    data["tag", "of", "item"].edge_index = tagged.flip(0)
    return data


def quiet_trainer(**kwargs: Any) -> L.Trainer:
    """A CPU ``Trainer`` that logs, checkpoints and prints nothing; ``kwargs`` add or override."""
    quiet: dict[str, Any] = {
        "accelerator": "cpu",
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    return L.Trainer(**{**quiet, **kwargs})


# A MAG-shaped graph small enough for a test (``npy_mag``): papers with labels, authors with
# float16 features, featureless institutions.
MAG_RELATIONS = {  # (src, rel, dst): edges
    ("paper", "cites", "paper"): 3000,
    ("author", "writes", "paper"): 1500,
    ("paper", "rev_writes", "author"): 1500,
    ("author", "affiliated_with", "inst"): 300,
}
MAG_COUNTS = {"paper": 400, "author": 300, "inst": 20}
SPLITS = ("train", "val", "test")
# The generated recommender graph the store tests prepare (``prepared_recommender``).
LINK_TINY = SyntheticRecommender(
    num_users=600, num_items=300, num_categories=20, num_communities=5, interactions_per_user=12
)


def by_destination(edge_index: torch.Tensor) -> torch.Tensor:
    """The edges in a store's order: stably sorted by destination (PyG's CSC with pyg-lib)."""
    return edge_index[:, edge_index[1].sort(stable=True).indices]


def npy_homogeneous(folder: Path) -> Data:
    """A random graph written to ``folder`` as a .npy folder (int32 edges); the graph itself."""
    g = torch.Generator().manual_seed(0)
    n = 500
    x, y = torch.randn(n, 8, generator=g), torch.randint(5, (n,), generator=g)
    edge_index = torch.randint(n, (2, 4000), generator=g)
    perm = torch.randperm(n, generator=g)
    splits = dict(zip(SPLITS, (perm[:300], perm[300:400], perm[400:]), strict=True))
    folder.mkdir()
    np.save(folder / "x.npy", x.numpy())
    np.save(folder / "y.npy", y.numpy())
    np.save(folder / "edge_index.npy", edge_index.numpy().astype(np.int32))
    for name, index in splits.items():
        np.save(folder / f"{name}.npy", index.numpy())
    masks = {
        f"{k}_mask": torch.zeros(n, dtype=torch.bool).index_fill_(0, v, True)
        for k, v in splits.items()
    }
    return Data(x=x, y=y, edge_index=by_destination(edge_index), **masks)


def npy_mag(folder: Path) -> tuple[HeteroData, torch.Tensor]:
    """:data:`MAG_RELATIONS`' graph as a .npy folder in ``folder``; it, and its training papers."""
    g = torch.Generator().manual_seed(1)
    data = HeteroData()
    data["paper"].x = torch.randn(MAG_COUNTS["paper"], 8, generator=g)
    data["paper"].y = torch.randint(4, (MAG_COUNTS["paper"],), generator=g)
    data["author"].x = torch.randn(MAG_COUNTS["author"], 4, generator=g).half()
    data["inst"].num_nodes = MAG_COUNTS["inst"]
    train = torch.randperm(MAG_COUNTS["paper"], generator=g)[:200]
    data["paper"].train_mask = torch.zeros(MAG_COUNTS["paper"], dtype=torch.bool).index_fill_(
        0, train, True
    )
    for (src, rel, dst), m in MAG_RELATIONS.items():
        edge_index = torch.stack(
            [
                torch.randint(MAG_COUNTS[src], (m,), generator=g),
                torch.randint(MAG_COUNTS[dst], (m,), generator=g),
            ]
        )
        data[src, rel, dst].edge_index = by_destination(edge_index)
        (folder / "edges" / f"{src}__{rel}__{dst}").mkdir(parents=True)
        np.save(folder / "edges" / f"{src}__{rel}__{dst}" / "edge_index.npy", edge_index.numpy())
    for node_type in ("paper", "author"):
        (folder / "nodes" / node_type).mkdir(parents=True)
        np.save(folder / "nodes" / node_type / "x.npy", data[node_type].x.numpy())
    np.save(folder / "nodes" / "paper" / "y.npy", data["paper"].y.numpy())
    np.save(folder / "nodes" / "paper" / "train.npy", train.numpy())
    (folder / "num_nodes.json").write_text(json.dumps({"inst": MAG_COUNTS["inst"]}))
    return data, train


def prepared_recommender(folder: Path, cfg: SyntheticRecommender) -> tuple[Path, HeteroData]:
    """The recommender graph ``cfg`` generates, saved as .npy and prepared in ``folder``; it too."""
    data = make_recommender_graph(cfg)
    for store in data.node_stores:
        store.pop("community", None)
    npy = stores.save_npy(data, folder / "npy")
    return stores.prepare_npy(npy, folder / "store"), data
