"""Writing a prepared folder: the atomic prepare every writer goes through, and two writers.

:func:`prepare` fills a partial folder beside the target and renames it into place, with the
manifest written last (``gnnscale.stores.atomic``): a killed prepare leaves nothing that looks
prepared, and the next prepare starts again cleanly. It keeps a folder already prepared from the
same settings, refuses to overwrite anything else, and checks the disk's room first. Every writer
of the format (``gnnscale.stores.manifest``) goes through it: the two here, ``streaming`` (inputs
read chunk by chunk) and ``link_split``.

Two ways to fill a folder from a graph: :func:`write_graph` writes any in-memory PyG ``Data``
(the datasets ``gnnscale fit`` loads), and :func:`write_streamed_synthetic` generates a graph chunk
by chunk, so its feature file can be larger than the machine's memory.

Writing is apart from reading (``gnnscale.stores.prepared``): it changes with what is prepared
and from what, not with how a prepared folder is mapped and served.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch_geometric.data import Data
from torch_geometric.sampler.utils import to_csc
from tqdm import tqdm

from gnnscale.errors import NO_ROOM
from gnnscale.stores import atomic
from gnnscale.stores.manifest import (
    BLOCK_BYTES,
    CHECKS,
    DTYPES,
    FORMAT,
    SPLIT_MASKS,
    FeatureDtype,
    FileWriter,
    PreparedGraphError,
)
from gnnscale.stores.prepared import PreparedGraph

if TYPE_CHECKING:  # its settings only: stores do not depend on the data package
    from gnnscale.data.synthetic import SyntheticGraph

__all__ = ["write_graph", "write_streamed_synthetic"]


class _Writer:
    """The files of one prepared graph, in a partial folder until it is committed."""

    def __init__(self, folder: Path, dtypes: dict[str, str]) -> None:
        self.files = {name: FileWriter(folder / f"{name}.bin", d) for name, d in dtypes.items()}

    @classmethod
    def node_graph(cls, folder: Path, feature_dtype: str) -> _Writer:
        """The files of a homogeneous node-classification graph."""
        dtypes = {"x": feature_dtype, "y": "int64", "colptr": "int64", "row": "int64"}
        return cls(folder, dtypes | dict.fromkeys(SPLIT_MASKS, "bool"))

    def __getitem__(self, name: str) -> FileWriter:
        return self.files[name]

    def close(self) -> dict[str, Any]:
        """Each file's manifest entry."""
        return {name: w.close() for name, w in self.files.items()}


def _key(source: dict[str, Any]) -> str:
    return hashlib.blake2b(json.dumps(source, sort_keys=True).encode(), digest_size=8).hexdigest()


def _sound(
    out: Path,
    key: str,
    verify: Literal["full", "size"],
    check: Callable[[PreparedGraph], None] | None,
) -> bool:
    """Whether derived data at ``out`` is whole and made from ``key``.

    Whole: as ``verify`` checks it (sizes, or checksums too), then as ``check`` does.
    """
    try:
        graph = PreparedGraph(out, verify)
        if check is not None:
            check(graph)
    except PreparedGraphError as err:
        print(f"gnnscale: {out} is damaged ({err}); writing it again")
        return False
    if graph.manifest.get("key") != key:
        print(f"gnnscale: {out} was made from other settings; writing it again")
        return False
    return True


def _size(num_nodes: int, num_edges: int, num_features: int, feature_dtype: str) -> int:
    """Bytes of a prepared graph's files (what :class:`_Writer` writes)."""
    # x y m colptr
    per_node = num_features * DTYPES[feature_dtype].itemsize + 8 + len(SPLIT_MASKS) + 8
    return num_nodes * per_node + 8 + num_edges * 8  # + colptr's first entry, row


def prepare(
    out: Path,
    source: dict[str, Any],
    fill: Callable[[Path], dict[str, Any]],
    size: int,
    derived: bool = False,
    verify: Literal["full", "size"] = "size",
    check: Callable[[PreparedGraph], None] | None = None,
) -> Path:
    """Run ``fill`` into a partial folder beside ``out``, then commit it as ``out`` (atomic).

    ``fill`` writes the files into the folder it is given and returns the manifest's
    description of the graph, ``files`` (each file's entry) included.

    A complete ``out`` made from the same source is kept; one from another source, or anything
    else at ``out`` but an empty folder, is refused rather than overwritten, and so is a second
    prepare of ``out`` while one runs, and one whose disk has less free space than ``size``
    (the files' expected bytes) with a margin. A disk that fills anyway leaves nothing behind.

    ``derived``: ``out`` is made from other prepared data (a link split), so nothing is lost in
    writing it again: one that is damaged (its files' sizes) or made from other settings is
    written again, and a second writer waits for the first and keeps what it wrote. One that
    exists is checked as ``verify`` says (sizes, or every block's checksum), then by ``check``
    (which raises :class:`PreparedGraphError`).
    """
    out = Path(out)
    key = _key(source)
    for parent in out.parents:
        if parent.exists() and not parent.is_dir():
            raise PreparedGraphError(f"--out {out}: {parent} is a file, not a folder")
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()  # an empty folder made for it: written in its place
    if derived:
        with atomic.locked(out, wait=True):
            if out.exists() and _sound(out, key, verify, check):
                return out
            shutil.rmtree(out, ignore_errors=True)  # damaged or stale: written again below
    if out.exists():
        try:
            manifest = PreparedGraph.read_manifest(out)
        except PreparedGraphError as err:
            raise PreparedGraphError(
                f"{out} exists and is not a prepared graph ({err}); remove it or choose "
                "another --out"
            ) from None
        if manifest.get("key") != key:
            raise PreparedGraphError(
                f"{out} holds a graph prepared from other settings ({manifest.get('source')}); "
                "remove it or choose another --out"
            )
        print(f"gnnscale prepare: {out} is already prepared from these settings (key {key})")
        return out
    atomic.check_room(out, size, "the prepared graph", PreparedGraphError)
    start = time.perf_counter()
    try:
        with atomic.locked(out, wait=derived):
            if derived and out.exists():  # written by the process this one waited for
                return out
            with atomic.writing(out) as tmp:  # a killed prepare's partial folder: removed
                meta = fill(tmp)
                manifest = {"format": FORMAT, **meta, "source": source, "key": key}
                atomic.commit(tmp, out, manifest | {"block_bytes": BLOCK_BYTES})
    except OSError as err:
        if err.errno not in NO_ROOM:
            raise
        raise PreparedGraphError(
            f"--out {out}: the disk filled while preparing ({err.strerror}); nothing was left "
            "behind: free space there or choose another --out"
        ) from None
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    nodes, edges = (_total(meta[k]) for k in ("num_nodes", "num_edges"))
    print(
        f"gnnscale prepare: wrote {out} ({size / 2**30:.2f} GiB, {nodes:,} nodes, "
        f"{edges:,} edges) in {time.perf_counter() - start:.0f} s"
    )
    return out


def _total(count: int | dict[str, int]) -> int:
    """A count, or the sum of a count per node or edge type."""
    return sum(count.values()) if isinstance(count, dict) else count


def _chunks(total: int, size: int, desc: str) -> Iterator[tuple[int, int]]:
    for start in tqdm(range(0, total, size), desc=desc, unit="chunk", mininterval=2):
        yield start, min(start + size, total)


def write_graph(
    data: Data,
    out: Path,
    source: dict[str, Any],
    feature_dtype: FeatureDtype = "float32",
    chunk_nodes: int = 1 << 20,
) -> Path:
    """Write an in-memory graph to ``out`` (as :class:`PreparedGraph` reads it), atomically.

    The CSC is PyG's own (``to_csc``, as ``NeighborLoader`` builds it), so a run from the
    prepared folder samples exactly the batches a run from ``data`` in memory samples.

    Args:
        data: A graph with ``x``, ``edge_index``, ``y`` and the three split masks.
        out: The folder to create.
        source: What the graph was made from (recorded, and hashed into the folder's key).
        feature_dtype: Dtype of the stored features.
        chunk_nodes: Nodes written per step (bounds the temporary memory of a dtype cast).
    """
    source = {**source, "feature_dtype": feature_dtype}

    def fill(folder: Path) -> dict[str, Any]:
        w = _Writer.node_graph(folder, feature_dtype)
        n = data.num_nodes
        colptr, row, perm = to_csc(data, device=torch.device("cpu"))
        ids = data.edge_index  # what the graph passes is recorded, not refused
        in_range = not ids.numel() or (int(ids.min()) >= 0 and int(ids.max()) < n)
        finite = disjoint = True
        for a, b in _chunks(n, chunk_nodes, "nodes"):
            w["x"].write(data.x[a:b].to(DTYPES[feature_dtype]))
            w["y"].write(data.y[a:b].long())
            for key in SPLIT_MASKS:
                w[key].write(data[key][a:b])
            finite = finite and bool(torch.isfinite(data.x[a:b]).all())
            disjoint = disjoint and not bool(
                (sum(data[k][a:b].long() for k in SPLIT_MASKS) > 1).any()
            )
        w["colptr"].write(colptr)
        w["row"].write(row)
        files = w.close()
        if perm is not None and not torch.equal(perm, torch.arange(perm.numel())):
            perm_file = FileWriter(folder / "perm.bin", "int64")  # each slot's input position
            perm_file.write(perm)
            files["perm"] = perm_file.close()
        meta = _meta(n, row.numel(), data.num_features, int(data.y.max()) + 1)
        return meta | {
            "files": files,
            "checked": [
                c for c, ok in zip(CHECKS, (in_range, finite, disjoint), strict=True) if ok
            ],
        }

    size = _size(data.num_nodes, data.num_edges, data.num_features, feature_dtype)
    return prepare(out, source, fill, size)


def _meta(num_nodes: int, num_edges: int, num_features: int, num_classes: int) -> dict[str, Any]:
    return {
        "num_nodes": num_nodes,
        "num_edges": num_edges,
        "num_features": num_features,
        "num_classes": num_classes,
    }


def write_streamed_synthetic(
    cfg: SyntheticGraph,
    out: Path,
    feature_dtype: FeatureDtype = "bfloat16",
    chunk_nodes: int = 1 << 20,
) -> Path:
    """Generate a graph chunk by chunk straight to ``out``: memory bounded by one chunk.

    The same model as :func:`gnnscale.make_synthetic_graph` (homophilous edges, power-law
    degrees, class centroids in Gaussian noise), arranged so that no step needs the whole graph:
    node ``i`` has class ``i % num_classes``, so a same-class node is drawn without an index;
    each node draws its own in-neighbours (a power-law in-degree), so the CSC comes out in
    order. It is not the graph ``make_synthetic_graph`` draws from the same settings.

    Args:
        cfg: Size and difficulty (``num_nodes`` may exceed what fits in memory).
        out: The folder to create.
        feature_dtype: Dtype of the stored features (``bfloat16`` halves the file).
        chunk_nodes: Nodes generated per step; part of the graph's identity with ``cfg.seed``.
    """
    source = {
        "generator": "write_streamed_synthetic",
        "synthetic": asdict(cfg),
        "chunk_nodes": chunk_nodes,
        "feature_dtype": feature_dtype,
    }
    n, c = cfg.num_nodes, cfg.num_classes

    def fill(folder: Path) -> dict[str, Any]:
        w = _Writer.node_graph(folder, feature_dtype)
        g = torch.Generator().manual_seed(cfg.seed)
        centroids = torch.randn(c, cfg.num_features, generator=g)
        # Mean of the capped Pareto propensity, to scale in-degrees to avg_degree on average.
        probe = torch.rand(1 << 20, generator=g, dtype=torch.float64)
        probe = probe.pow_(-1 / (cfg.degree_exponent - 1)).clamp_(max=n**0.5)
        scale = cfg.avg_degree / float(probe.mean())
        per_class = torch.tensor([(n - k + c - 1) // c for k in range(c)])  # nodes of class k
        num_train = max(1, int(cfg.train_fraction * n))
        num_val = int(cfg.val_fraction * n)
        w["colptr"].write(torch.zeros(1, dtype=torch.long))
        edges = 0
        for index, (a, b) in enumerate(_chunks(n, chunk_nodes, "nodes")):
            gc = torch.Generator().manual_seed(cfg.seed * 1_000_003 + index + 1)
            ids = torch.arange(a, b)
            y = ids % c
            x = centroids[y].add_(
                torch.randn(b - a, cfg.num_features, generator=gc), alpha=cfg.feature_noise
            )
            theta = torch.rand(b - a, generator=gc, dtype=torch.float64)
            theta = theta.pow_(-1 / (cfg.degree_exponent - 1)).clamp_(max=n**0.5)
            degree = torch.poisson(theta * scale, generator=gc).long().clamp_(min=1)
            dst = torch.repeat_interleave(ids, degree)
            k = y[dst - a]
            same = k + c * (torch.rand(dst.numel(), generator=gc) * per_class[k]).long()
            other = torch.randint(n, (dst.numel(),), generator=gc)
            src = torch.where(torch.rand(dst.numel(), generator=gc) < cfg.homophily, same, other)
            src = torch.where(src == dst, (src + c) % n, src)  # no self-loops; same class
            u = torch.rand(b - a, generator=gc)  # splits by a uniform draw per node
            w["x"].write(x.to(DTYPES[feature_dtype]))
            w["y"].write(y)
            w["train_mask"].write(u < num_train / n)
            w["val_mask"].write((u >= num_train / n) & (u < (num_train + num_val) / n))
            w["test_mask"].write(u >= (num_train + num_val) / n)
            w["colptr"].write(edges + degree.cumsum(0))
            w["row"].write(src)
            edges += int(degree.sum())
        meta = _meta(n, edges, cfg.num_features, c)  # checked as it is drawn (in range, finite,
        return meta | {"files": w.close(), "checked": list(CHECKS)}  # one split per node)

    # The edges are drawn while writing: their expected count (capped Pareto in-degrees, at
    # least 1) is about avg_degree per node.
    size = _size(n, math.ceil(n * max(cfg.avg_degree, 1.0)), cfg.num_features, feature_dtype)
    return prepare(out, source, fill, size)
