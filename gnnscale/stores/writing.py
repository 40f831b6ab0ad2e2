"""Writing a prepared folder: the atomic prepare every writer goes through, and two writers.

:func:`prepare` fills a partial folder beside the target and renames it into place, with the
manifest written last (``gnnscale.stores.atomic``): a killed prepare leaves nothing that looks
prepared, and the next prepare starts again cleanly. It keeps a folder already prepared from the
same settings, refuses to overwrite anything else, and checks the disk's room first. Every writer
of the format (``gnnscale.stores.manifest``) goes through it: the two here, ``streaming`` (inputs
read chunk by chunk) and ``link_split``.

Two ways to fill a folder from a graph: :func:`write_graph` writes any in-memory PyG ``Data``
(the datasets ``gnnscale fit`` loads), and :func:`write_node_chunks` a graph that arrives chunk by
chunk from a generator (``gnnscale.data.synthetic.write_streamed_synthetic``), so its feature file
can be larger than the machine's memory.

Writing is apart from reading (``gnnscale.stores.prepared``): it changes with what is prepared
and from what, not with how a prepared folder is mapped and served.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.sampler.utils import to_csc
from tqdm import tqdm

from gnnscale.errors import NO_ROOM
from gnnscale.stores import atomic
from gnnscale.stores.manifest import (
    CHECKS,
    DTYPES,
    SPLIT_MASKS,
    FeatureDtype,
    FileEntry,
    FileWriter,
    Manifest,
    PreparedGraphError,
    split_labels,
)
from gnnscale.stores.prepared import PreparedGraph, map_file

__all__ = ["NodeChunk", "write_graph", "write_node_chunks"]


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

    def close(self) -> dict[str, FileEntry]:
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
        if graph.manifest.key != key:  # before ``check``: an older layout's files differ
            print(f"gnnscale: {out} was made from other settings; writing it again")
            return False
        if check is not None:
            check(graph)
    except PreparedGraphError as err:
        print(f"gnnscale: {out} is damaged ({err}); writing it again")
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
    fill: Callable[[Path], Manifest],
    size: int,
    derived: bool = False,
    verify: Literal["full", "size"] = "size",
    check: Callable[[PreparedGraph], None] | None = None,
) -> Path:
    """Run ``fill`` into a partial folder beside ``out``, then commit it as ``out`` (atomic).

    ``fill`` writes the files into the folder it is given and returns their :class:`Manifest`
    (the graph's counts and each file's entry); the source, its key and the split labels are
    added here.

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
            manifest = Manifest.read(out)
        except PreparedGraphError as err:
            raise PreparedGraphError(
                f"{out} exists and is not a prepared graph ({err}); remove it or choose "
                "another --out"
            ) from None
        if manifest.key != key:
            raise PreparedGraphError(
                f"{out} holds a graph prepared from other settings ({manifest.source}); "
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
                manifest = fill(tmp)
                counted = _split_labels_of(tmp, manifest.files)
                manifest = replace(manifest, split_labels=counted, source=source, key=key)
                manifest.write(tmp, out)
    except OSError as err:
        if err.errno not in NO_ROOM:
            raise
        raise PreparedGraphError(
            f"--out {out}: the disk filled while preparing ({err.strerror}); nothing was left "
            "behind: free space there or choose another --out"
        ) from None
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    nodes, edges = (sum(c.values()) for c in (manifest.node_counts, manifest.edge_counts))
    print(
        f"gnnscale prepare: wrote {out} ({size / 2**30:.2f} GiB, {nodes:,} nodes, "
        f"{edges:,} edges) in {time.perf_counter() - start:.0f} s"
    )
    return out


def _split_labels_of(folder: Path, files: dict[str, FileEntry]) -> dict[str, list[int]] | None:
    """Each labelled node type's split labels, as the manifest records them (``split_labels``).

    The lowest, the highest and how many distinct, by node type (``""``: a homogeneous graph),
    read from the files just written (from the page cache, with readahead): a fit checks them
    against what it needs (``gnnscale.data.datasets.check_labels``) without reading ``y``,
    which the store maps for random reads when the graph is large (a page per fault). On the
    papers100M-sized graph the check took 12.4 s of a cold fit's start reading the labels and
    0.3 s from the counts, which cost its prepare 4-5 s.
    """

    def mapped(name: str) -> Tensor:
        entry = files[name]
        path = folder / f"{name}.bin" if entry.path is None else Path(entry.path)
        return map_file(str(path), entry.offset, entry.dtype, entry.shape, random=False)

    counted = {}
    for name in files:
        group, _, attr = name.rpartition("/")
        prefix = f"{group}/" if group else ""
        needed = [f"{prefix}{k}" for k in ("y", *SPLIT_MASKS)]
        if attr != "y" or not all(k in files for k in needed):
            continue
        if not math.prod(files[name].shape):
            continue
        masks = {k: mapped(f"{prefix}{k}") for k in SPLIT_MASKS}
        classes, _ = split_labels(mapped(name), masks)
        if classes.numel():
            counted[group] = [int(classes[0]), int(classes[-1]), classes.numel()]
    return counted or None  # none: the manifest has no split_labels


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

    def fill(folder: Path) -> Manifest:
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
        return Manifest(
            num_nodes=n,
            num_edges=row.numel(),
            num_features=data.num_features,
            num_classes=int(data.y.max()) + 1,
            files=files,
            checked=tuple(
                c for c, ok in zip(CHECKS, (in_range, finite, disjoint), strict=True) if ok
            ),
        )

    size = _size(data.num_nodes, data.num_edges, data.num_features, feature_dtype)
    return prepare(out, source, fill, size)


@dataclass
class NodeChunk:
    """Consecutive nodes of a homogeneous node-classification graph, with their in-edges.

    A generator hands :func:`write_node_chunks` these in node order; since each node brings its
    own in-edges, the CSC comes out in order and no step needs the whole graph.

    Args:
        x: Features, one row per node.
        y: Labels.
        masks: The train, validation and test masks.
        degree: Each node's in-degree.
        row: The sources of their in-edges, node after node (``degree.sum()`` of them).
    """

    x: Tensor
    y: Tensor
    masks: tuple[Tensor, Tensor, Tensor]
    degree: Tensor
    row: Tensor


def write_node_chunks(
    chunks: Iterable[NodeChunk],
    out: Path,
    source: dict[str, Any],
    num_nodes: int,
    num_features: int,
    num_classes: int,
    expected_edges: int,
    feature_dtype: FeatureDtype = "bfloat16",
    checked: Sequence[str] = (),
) -> Path:
    """Write a graph that arrives chunk by chunk to ``out``: memory bounded by one chunk.

    ``chunks`` is read only if the folder is written (not when it is already prepared).

    Args:
        chunks: The graph's nodes, in order, each chunk with its in-edges.
        out: The folder to create.
        source: What the graph was made from (recorded, and hashed into the folder's key).
        num_nodes: Nodes the chunks hold in all.
        num_features: Features per node.
        num_classes: Number of classes.
        expected_edges: About how many edges the chunks hold (the disk's room is checked for
            them before writing).
        feature_dtype: Dtype of the stored features.
        checked: The manifest's checks (``gnnscale.stores.manifest.CHECKS``) the chunks hold
            by construction.
    """

    def fill(folder: Path) -> Manifest:
        w = _Writer.node_graph(folder, feature_dtype)
        w["colptr"].write(torch.zeros(1, dtype=torch.long))
        nodes = edges = 0
        for chunk in chunks:
            w["x"].write(chunk.x.to(DTYPES[feature_dtype]))
            w["y"].write(chunk.y)
            for key, mask in zip(SPLIT_MASKS, chunk.masks, strict=True):
                w[key].write(mask)
            w["colptr"].write(edges + chunk.degree.cumsum(0))
            w["row"].write(chunk.row)
            nodes += chunk.y.numel()
            edges += int(chunk.degree.sum())
        if nodes != num_nodes:
            raise PreparedGraphError(f"{out}: the generator gave {nodes:,} of {num_nodes:,} nodes")
        return Manifest(
            num_nodes=num_nodes,
            num_edges=edges,
            num_features=num_features,
            num_classes=num_classes,
            files=w.close(),
            checked=tuple(checked),
        )

    size = _size(num_nodes, expected_edges, num_features, feature_dtype)
    return prepare(out, {**source, "feature_dtype": feature_dtype}, fill, size)
