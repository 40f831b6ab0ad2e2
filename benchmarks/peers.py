"""gnnscale against DGL and GraphBolt on the default recipe's job, side by side; where a batch goes.

Written by ``python benchmarks/figures.py peers`` (``peers`` in benchmarks/README.md and the
README's one line); ``--size tiny`` checks the pipeline on a small graph.

- **The peers' environment** is built once, beside the project and never inside it: a virtualenv
  at ``$GNNSCALE_PEERS_VENV`` (default ``~/.cache/gnnscale/peers-venv``) with DGL 2.1.0 from PyPI,
  which loads its C++ parts only with torch 2.0.0-2.2.1 (PyPI's 2.2.1: a CUDA build, run on the
  CPU), numpy < 2, and torchdata 0.7.1 without its dependencies, for GraphBolt (about 5 GB).
- **The graph** is the recipe's own, built by its DataModule from ``recipes/neighbor_sage/
  config.yaml`` and dumped to one ``.npz`` (edges, features, labels, splits and the 1,024 nodes
  validated each epoch) that the peers read (``peer_dgl.py``).
- **The runs**, alternated over five rounds, each a fresh process, every round: ``gnnscale fit``
  on the recipe and ``peer_dgl.py`` with DGL's ``NeighborSampler`` and with GraphBolt, at 0 and 1
  loader workers. Same model (2 SAGE layers, mean, hidden 256, dropout 0.5), fan-out [15, 10],
  1,024 seeds a batch, Adam 0.003, gradient accumulation 2, 4 epochs, validation of the same 1,024
  nodes sampled each epoch, an exact layer-wise test; fp32 everywhere (gnnscale's recipe trains in
  bf16 where the CPU has bf16 kernels: a row of its own), torch's default threads.
- **Where an epoch goes**: two epochs of each tool's training loop in one process, each step
  timed inside the loop; the loader's share (what the steps leave) split into the sampler,
  PyG's gather of the batch's rows, gnnscale's layout (with the first layer's aggregation) and
  the rest (collation, the resumable order). DGL's and GraphBolt's sampling and gather are
  timed apart on the same seed batches (``peer_dgl.py --profile``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness
import numpy as np
import peers_tasks
import torch
from blocks import Block, Section
from registry import REPO, recipe

from recipes import Result, measure

PEERS_VENV = Path(
    os.environ.get("GNNSCALE_PEERS_VENV", Path.home() / ".cache" / "gnnscale" / "peers-venv")
)
PEER_SCRIPT = REPO / "benchmarks" / "peer_dgl.py"
# dgl 2.1.0 imports its C++ library only beside torch 2.0.0-2.2.1; GraphBolt's datapipes need
# torchdata 0.7.1, whose own pins would replace that torch, hence --no-deps.
PEER_PACKAGES = ("torch==2.2.1", "numpy<2", "dgl==2.1.0", "pandas<2.3", "pydantic", "pyyaml")
PEER_NO_DEPS = ("torchdata==0.7.1", "psutil")
FP32 = "--trainer.precision=32-true"
# The default job's epoch lasts under a second, and one tool's runs spread by 10-20% on a shared
# 2-core machine: five alternated rounds, the median (the hetero and link jobs: three).
ROUNDS = 5
TASKS = {"hetero": "heterogeneous node classification", "link": "link prediction"}
TOOLS = {"gnnscale": "gnnscale", "dgl": "DGL 2.1.0 `NeighborSampler`", "graphbolt": "GraphBolt"}


def peers_python() -> Path:
    """The peers' Python, its virtualenv built first if it is not there (once, minutes)."""
    python, done = PEERS_VENV / "bin" / "python", PEERS_VENV / ".complete"
    if done.exists():
        return python
    print(f"peers: building {PEERS_VENV} (DGL 2.1.0, torch 2.2.1; about 5 GB)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(PEERS_VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, *PEER_PACKAGES], check=True)
    subprocess.run([*pip, "--no-deps", *PEER_NO_DEPS], check=True)
    check = "import dgl, dgl.graphbolt, numpy; assert numpy.__version__ < '2'"
    subprocess.run([str(python), "-c", check], check=True)
    done.touch()
    return python


def _graph_args(tiny: bool) -> list[str]:
    """At tiny size, a small graph; every other setting as shipped, as the peers train.

    30,000 nodes: 3 batches of the recipe's 1,024 training seeds, enough for its accumulation.
    """
    return ["--data.init_args.synthetic.num_nodes=30000"] if tiny else []


def dump_graph(path: Path, tiny: bool) -> dict[str, int]:
    """The recipe's graph, built by its DataModule, in the ``.npz`` layout ``peer_dgl.py`` reads."""
    from gnnscale.cli import main

    cli = main(["--config", str(recipe("neighbor_sage").config), *_graph_args(tiny)], run=False)
    dm = cli.datamodule
    data = dm.data
    val_nodes = dm.eval.validated(data.val_mask).nonzero().view(-1)
    ids = {k: data[f"{k}_mask"].nonzero().view(-1).numpy() for k in ("train", "val", "test")}
    np.savez(
        path,
        src=data.edge_index[0].numpy(),
        dst=data.edge_index[1].numpy(),
        x=data.x.float().numpy(),
        y=data.y.numpy(),
        train_idx=ids["train"],
        val_idx=ids["val"],
        test_idx=ids["test"],
        val_nodes=val_nodes.numpy(),
    )
    return {"nodes": data.num_nodes, "edges": data.num_edges, "train": len(ids["train"])}


def _gnnscale(workers: int, workdir: Path, tiny: bool, shipped: bool = False) -> dict[str, Any]:
    """One ``gnnscale fit`` of the recipe in a fresh process (``recipes.measure``)."""
    extra = [
        *_graph_args(tiny),
        f"--data.init_args.loader.num_workers={workers}",
        f"--data.init_args.loader.persistent_workers={'true' if workers else 'false'}",
        *([] if shipped else [FP32]),
    ]
    result: Result = measure(recipe("neighbor_sage"), extra, workdir, False, 0, tiny)
    return {
        "epoch_s": result.epoch_s,
        "wall_s": result.fit_s,
        "acc": result.acc,
        "peak_mib": result.peak_mb,
    }


def _peer(
    python: Path, graph: Path, loader: str, workers: int, tiny: bool, profile: bool = False
) -> dict[str, Any]:
    """One run of ``peer_dgl.py`` in a fresh process; its figures."""
    argv = [str(python), str(PEER_SCRIPT), "--graph", str(graph), "--loader", loader]
    argv += ["--workers", str(workers), "--epochs", "4", "--threads", str(torch.get_num_threads())]
    if profile:
        argv.append("--profile")
    done = harness.run(argv, timeout_s=3600)
    wall = done.wall_s
    line = next(x for x in done.stdout.splitlines() if x.startswith("PEER_RESULT "))
    out = json.loads(line.removeprefix("PEER_RESULT "))
    if profile:
        return out
    train = out["train_s"]
    return {
        "epoch_s": statistics.median(train[1:] or train),
        "wall_s": wall,
        "acc": out["test_acc"],
        "peak_mib": max(out["peak_rss_mib"], out.get("children_peak_rss_mib") or 0),
        "versions": out["versions"],
    }


class _Timed:
    """Seconds spent in the functions it wraps, by label."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start

        return timed


def profile_gnnscale(tiny: bool) -> dict[str, Any]:
    """Where an epoch of the recipe's training goes: its loader's parts, and the steps.

    In this process, loader in the main process (workers 0), fp32, two epochs of the training
    loop (accumulation 2, as the recipe), the second reported: each step (forward, backward,
    Adam) timed inside the loop; the loader's share split into the sampler
    (``HopSampler.sample_seeds``), PyG's gather of the batch (``filter_data``: labels, masks, ids
    and edges, and the features where the loader does not aggregate them), gnnscale's layout
    (``hop_layout``: edges sorted by target, and the first layer's aggregation with its
    targets' feature rows) and the rest (collation, ``ResumableLoader``, the DataLoader).
    """
    import torch_geometric.loader.node_loader as node_loader
    from roofline import build

    import gnnscale.data.node as node
    from gnnscale.sampling import HopSampler

    timed = _Timed()
    patches = [
        (HopSampler, "_sample", "sample"),
        (node_loader, "filter_data", "gather"),
        (node, "hop_layout", "layout"),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, label in patches:
            setattr(owner, name, timed.wrap(label, getattr(owner, name)))
        model, dm, _ = build("neighbor_sage", False, [FP32, *_graph_args(tiny)])
        optimizer = model.configure_optimizers()
        optimizer = optimizer["optimizer"] if isinstance(optimizer, dict) else optimizer
        loader, accumulate = dm.train_dataloader(), 2
        model.train()
        for _ in range(2):  # the first epoch warms the allocator and the caches
            timed.seconds.clear()
            steps, nodes, edges = [], [], []
            start = time.perf_counter()
            for i, batch in enumerate(loader):
                step_start = time.perf_counter()
                batch.loss_weight, batch.num_loss_nodes = dm._loss_weight(batch)
                (model.training_step(batch, i) / accumulate).backward()
                if i % accumulate == accumulate - 1:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                steps.append(time.perf_counter() - step_start)
                nodes.append(sum(batch.layout.num_sampled_nodes))
                edges.append(sum(batch.layout.num_sampled_edges))
            epoch_s = time.perf_counter() - start
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)
    parts = dict(timed.seconds)
    loader_s = epoch_s - sum(steps)
    parts["rest"] = loader_s - sum(parts.values())
    return {
        "epoch_s": epoch_s,
        "loader_s": loader_s,
        "parts": parts,
        "step_s": sum(steps),
        "batches": len(steps),
        "nodes": statistics.mean(nodes),
        "edges": statistics.mean(edges),
    }


def measure_all(tiny: bool, workdir: Path) -> dict[str, Any]:
    """Every run, alternated over rounds, and the profiles."""
    python = peers_python()
    graph = workdir / "graph.npz"
    sizes = dump_graph(graph, tiny)
    runs = [("gnnscale", 0), ("dgl", 0), ("graphbolt", 0), ("gnnscale", 1), ("dgl", 1)]
    runs += [("graphbolt", 1), ("gnnscale shipped", 0)]
    results: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in range(1 if tiny else ROUNDS):
        for tool, workers in runs:
            print(f"peers: round {r + 1}, {tool}, {workers} workers", flush=True)
            if tool.startswith("gnnscale"):
                out = _gnnscale(workers, workdir, tiny, shipped=tool == "gnnscale shipped")
            else:
                out = _peer(python, graph, tool, workers, tiny)
            results[(tool, workers)].append(out)
    profiles = {"gnnscale": profile_gnnscale(tiny)}
    for tool in ("dgl", "graphbolt"):
        profiles[tool] = _peer(python, graph, tool, 0, tiny, profile=True)
    tasks = {task: peers_tasks.measure_task(task, python, tiny, workdir) for task in TASKS}
    return {"sizes": sizes, "results": results, "profiles": profiles, "tasks": tasks}


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _row(label: str, workers: int, runs: list[dict[str, Any]]) -> str:
    epochs = " / ".join(f"{r['epoch_s']:.2f}" for r in runs)
    walls = " / ".join(f"{r['wall_s']:.0f}" for r in runs)
    accs = " / ".join(f"{r['acc']:.3f}" for r in runs)
    return (
        f"| {label} | {workers} | {_median(runs, 'epoch_s'):.2f} ({epochs}) | "
        f"{_median(runs, 'wall_s'):.0f} ({walls}) | {accs} | {_median(runs, 'peak_mib'):,.0f} |"
    )


def _profile_rows(profiles: dict[str, Any]) -> list[str]:
    g = profiles["gnnscale"]
    rows = [
        "| seconds, the second epoch of a training loop (loader in the main process) "
        "| batches | nodes / edges a batch | sampling | gather of rows | layout and first "
        "layer's aggregation | rest of the loader | loader | steps | epoch |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    p = g["parts"]
    rows.append(
        f"| gnnscale | {g['batches']} | {g['nodes']:,.0f} / {g['edges']:,.0f} | "
        f"{p.get('sample', 0):.2f} | {p.get('gather', 0):.2f} | {p.get('layout', 0):.2f} | "
        f"{p['rest']:.2f} | {g['loader_s']:.2f} | {g['step_s']:.2f} | {g['epoch_s']:.2f} |"
    )
    for tool in ("dgl", "graphbolt"):
        d = profiles[tool]
        loader = d["loader_s"]
        sample, gather = d.get("sample_s"), d.get("gather_s")
        # Timed in passes of their own: what is left of the loader's time, or nothing.
        rest = max(loader - (sample or 0) - (gather or 0), 0.0) if sample is not None else None
        cells = [f"{v:.2f}" if v is not None else "–" for v in (sample, gather)]
        rows.append(
            f"| {TOOLS[tool]} | {d.get('batches', '–')} | {d['batch_nodes_mean']:,.0f} / "
            f"{d['batch_edges_mean']:,.0f} | {cells[0]} | {cells[1]} | – | "
            f"{'–' if rest is None else f'{rest:.2f}'} | {loader:.2f} | {d['step_s']:.2f} "
            f"| {d['epoch_s']:.2f} |"
        )
    return rows


def blocks(tiny: bool) -> list[Block]:
    """Measure and return the ``peers`` block (benchmarks/README.md) and the README's line."""
    with tempfile.TemporaryDirectory(prefix="gnnscale-peers-") as tmp:
        m = measure_all(tiny, Path(tmp))
    res, sizes = m["results"], m["sizes"]
    label = {
        "gnnscale": "gnnscale `fit`",
        "dgl": TOOLS["dgl"],
        "graphbolt": "GraphBolt (`FusedCSCSamplingGraph`, `ItemSampler`)",
        "gnnscale shipped": "gnnscale `fit`, the recipe's precision as shipped",
    }
    lines = [
        f"The default recipe's job (neighbor_sage: its {sizes['nodes']:,}-node, "
        f"{sizes['edges']:,}-edge graph dumped by its own DataModule; fan-out [15, 10], 1,024 "
        "seeds a batch, SAGE mean, hidden 256, 2 layers, Adam 0.003, accumulation 2, fp32 "
        f"unless the row says, 4 epochs), each run a fresh process, alternated; cells: the "
        "median, then each round.",
        "",
        "| tool | loader workers | s/epoch, training | whole run, s | test acc | peak RSS (MiB) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    order = [("gnnscale", 0), ("dgl", 0), ("graphbolt", 0), ("gnnscale", 1), ("dgl", 1)]
    order += [("graphbolt", 1), ("gnnscale shipped", 0)]
    for key in order:
        lines.append(_row(label[key[0]], key[1], res[key]))
    ours = _median(res[("gnnscale", 0)], "epoch_s")
    dgl, gb = _median(res[("dgl", 0)], "epoch_s"), _median(res[("graphbolt", 0)], "epoch_s")
    fit = _median(res[("gnnscale", 0)], "wall_s") / _median(res[("dgl", 0)], "wall_s")
    summary = (
        f"gnnscale's training epoch is {ours / dgl:.2f}x DGL's and {ours / gb:.2f}x "
        f"GraphBolt's (0 workers, fp32); its whole `fit` {fit:.2f}x DGL's whole run."
    )
    lines += ["", summary, "", "Where an epoch goes:", ""]
    lines += _profile_rows(m["profiles"])
    versions = res[("dgl", 0)][0].get("versions", {})
    lines += [
        "",
        f"Peers: dgl {versions.get('dgl')}, torch {versions.get('torch')} (CPU), numpy "
        f"{versions.get('numpy')}, in their own environment. Whole run: the process's wall time,"
        " start-up to the printed test accuracy (gnnscale's includes generating the graph).",
    ]
    short = [
        "| training s/epoch, fp32, 0 loader workers | gnnscale | DGL | GraphBolt "
        "| gnnscale / DGL |",
        "|---|---:|---:|---:|---:|",
        f"| neighbor_sage | {ours:.2f} | {dgl:.2f} | {gb:.2f} | {ours / dgl:.2f}x |",
    ]
    task_blocks = []
    for task, title in TASKS.items():
        t = m["tasks"][task]
        mine = _median(t["results"][("gnnscale", "fp32", 0)], "epoch_s")
        theirs = _median(t["results"][("dgl", "fp32", 0)], "epoch_s")
        name = peers_tasks.RECIPE[task]
        short.append(f"| {name} ({title}) | {mine:.2f} | {theirs:.2f} | – | {mine / theirs:.2f}x |")
        text = "\n".join(peers_tasks.task_lines(task, t))
        task_blocks.append(Block(Path("benchmarks/README.md"), f"peers-{task}", text))
    short += ["", summary]
    return [
        Block(Path("benchmarks/README.md"), "peers", "\n".join(lines)),
        *task_blocks,
        Block(Path("README.md"), "peers", "\n".join(short)),
    ]


SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about=(
        "the default, heterogeneous node and link recipes' jobs trained by gnnscale and DGL "
        "(the default one by GraphBolt too) on the same graph, alternated, and where an "
        "epoch of each one's loader goes (builds DGL's environment once, about 5 GB; about "
        "45 minutes)"
    ),
    writes=(
        "peers in benchmarks/README.md and README.md; peers-hetero, peers-link in "
        "benchmarks/README.md"
    ),
    threads=f"{torch.get_num_threads()} torch threads per process (torch's default), "
    "loader workers as each row says",
    on_request=True,
)
