"""Write a prepared folder from inputs read chunk by chunk: memory of one chunk, any graph size.

The readers (``gnnscale.stores.npy``) describe each input as an :class:`Array` (node features,
labels) or :class:`Edges` (one edge type's edge list) that yields its rows in order, a chunk at a
time; :func:`write` turns them into the folder :class:`~gnnscale.stores.prepared.PreparedGraph`
and :func:`gnnscale.stores.open` map. No step holds a whole array:

- **CSC out of core**, per edge type, in two passes over its edges: count in-degrees chunk by
  chunk into the mapped ``colptr`` file (checking every index against the node counts on the
  way, so a bad file is refused before the long work), prefix-sum it, then place each chunk's
  sources at their destinations' next free slots in the mapped ``row`` file. Within a
  destination, sources keep their input order: the CSC PyG's ``to_csc`` builds in memory (a
  stable sort by destination), so batches sampled from the store equal those sampled in memory.
- **Features** are copied chunk by chunk (cast if asked), or, when the input is a file already
  laid out as the store would write it (a C-order ``.npy`` of the stored dtype), used where it
  lies: the manifest records its path, offset, size and modification time instead of a copy.
- **Splits** (node indices) become the masks the DataModules read.
- **Edge features** (``edge_attr``) are copied as node features are, in the input's edge order:
  a batch's ``e_id`` (the input's edge ids, through ``perm``) gathers them.
- **Edge times** (``edge_time``) are placed with the sources, in the CSC's order; a last pass
  over the CSC, a block of destinations at a time, sorts each neighbourhood by time (stable:
  edges of one time keep the input's order), so a time-respecting sampler finds the edges a
  seed may see by binary search, with nothing sorted when a fit starts. A stream given in time
  order is sorted already and that pass only checks it.

Files a pass fills in place (``colptr``, ``row``, masks) are mapped shared: their pages belong
to the page cache, which the kernel writes back and reclaims; the process's own memory holds
one chunk's arrays.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from gnnscale.stores.manifest import (
    CHECKS,
    DTYPES,
    FileEntry,
    FileWriter,
    Manifest,
    PreparedGraphError,
    file_entry,
)
from gnnscale.stores.writing import prepare

__all__ = ["Array", "Edges", "NodeInputs", "write"]

SPLITS = ("train", "val", "test")
_STORED = {"float32", "float16", "bfloat16"}


@dataclass
class Array:
    """One input array, read as consecutive row chunks.

    Args:
        where: What to name in an error (its file).
        shape: Its shape (rows first).
        dtype: Its numpy dtype.
        chunks: ``rows -> iterator`` over consecutive chunks of at most ``rows`` rows.
        in_place: ``(file, offset)`` when the file holds exactly this array, C-order and native
            byte order, from ``offset`` to its end: mappable where it lies.
    """

    where: str
    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: Callable[[int], Iterator[np.ndarray]]
    in_place: tuple[Path, int] | None = None


@dataclass
class Edges:
    """One edge type's edges (sources and destinations), read twice as consecutive chunks.

    Args:
        where: What to name in an error (its file).
        num_edges: How many.
        chunks: ``edges -> iterator`` over ``(sources, destinations)`` of at most ``edges``.
        attr: Each edge's features (``edge_attr``), one row per edge in the same order.
        time: Each edge's time (integers or floats, one per edge in the same order).
    """

    where: str
    num_edges: int
    chunks: Callable[[int], Iterator[tuple[np.ndarray, np.ndarray]]]
    attr: Array | None = None
    time: Array | None = None


@dataclass
class NodeInputs:
    """One node type's inputs: features, labels, split indices, times (each optional), count."""

    num_nodes: int
    x: Array | None = None
    y: Array | None = None
    splits: dict[str, Array] | None = None
    time: Array | None = None


def _bar(total: int, desc: str) -> tqdm:
    return tqdm(total=total, desc=desc, unit="row", unit_scale=True, mininterval=2, leave=False)


def _check_range(index: np.ndarray, n: int, where: str, what: str, first: int) -> None:
    """Refuse an index outside ``0..n-1``, naming the file and the position."""
    if index.size and (index.min() < 0 or index.max() >= n):
        at = int(np.flatnonzero((index < 0) | (index >= n))[0])
        found = f"{where}: {what} {int(index[at])} at position {first + at:,}"
        if n == 0:
            raise PreparedGraphError(
                f"{found} is given, but its node type has no nodes; fix the file"
            )
        raise PreparedGraphError(f"{found} is outside 0..{n - 1} (the node count); fix the file")


def _mapped(path: Path, dtype: Any, length: int) -> np.ndarray:
    """A new file of ``length`` zeros, mapped shared for writing (empty files: an empty array)."""
    if length == 0:
        path.touch()
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="w+", shape=(length,))


def _time_dtype(time: Array) -> str:
    """The stored dtype of edge times: integers as int64, floats as float64."""
    return "int64" if time.dtype.kind in "iu" else "float64"


def _aligned(chunks: Iterator[np.ndarray]) -> Callable[[int], np.ndarray]:
    """``take(n)``: the next ``n`` values of ``chunks``, whatever sizes its chunks have."""
    held: list[np.ndarray] = []
    count = 0

    def take(n: int) -> np.ndarray:
        nonlocal held, count
        while count < n:
            chunk = next(chunks, None)
            if chunk is None:
                break
            held.append(np.asarray(chunk).reshape(-1))
            count += held[-1].size
        joined = np.concatenate(held) if held else np.zeros(0)
        held, count = [joined[n:]], joined.size - min(n, joined.size)
        return joined[:n]

    return take


def write_csc(
    edges: Edges, num_src: int, num_dst: int, folder: Path, chunk_edges: int, ids: bool = True
) -> tuple[dict[str, FileEntry], float | None]:
    """``colptr.bin`` and ``row.bin`` of one edge type in ``folder``; their manifest entries.

    With ``ids``, also ``perm.bin``, each CSC slot's position in ``edges`` (the edge ids of a
    batch), unless every edge lies where the input has it. With ``edges.time``, also
    ``edge_time.bin``: each slot's time, every neighbourhood sorted by it. Returns the entries
    and the newest edge time (``None``: untimed, or no edges).
    """
    folder.mkdir(parents=True, exist_ok=True)
    colptr = _mapped(folder / "colptr.bin", np.int64, num_dst + 1)
    with _bar(edges.num_edges, f"degrees {edges.where}") as bar:
        first = 0
        for src, dst in edges.chunks(chunk_edges):
            _check_range(src, num_src, edges.where, "source", first)
            _check_range(dst, num_dst, edges.where, "destination", first)
            nodes, counts = np.unique(dst, return_counts=True)
            colptr[nodes + 1] += counts
            first += len(dst)
            bar.update(len(dst))
    if first != edges.num_edges:
        raise PreparedGraphError(f"{edges.where}: read {first:,} edges of {edges.num_edges:,}")
    carry = 0
    for a in range(0, num_dst + 1, chunk_edges):  # prefix sum, chunk by chunk
        part = np.cumsum(colptr[a : a + chunk_edges]) + carry
        colptr[a : a + chunk_edges] = part
        carry = int(part[-1])
    timed = edges.time is not None
    ids = ids or timed  # sorted by time, slots need their input positions
    row = _mapped(folder / "row.bin", np.int64, edges.num_edges)
    perm = _mapped(folder / "perm.bin", np.int64, edges.num_edges) if ids else None
    clock, newest = None, None
    if edges.time is not None:
        time_dtype = _time_dtype(edges.time)
        clock = _mapped(folder / "edge_time.bin", np.dtype(time_dtype), edges.num_edges)
        times = _aligned(edges.time.chunks(chunk_edges))
    cursor = _mapped(folder / "cursor.tmp", np.int64, num_dst)  # each destination's next slot
    for a in range(0, num_dst, chunk_edges):
        cursor[a : a + chunk_edges] = colptr[a : min(a + chunk_edges, num_dst)]
    sorted_input, first = True, 0  # whether every edge lies where the input has it
    with _bar(edges.num_edges, f"placing {edges.where}") as bar:
        for src, dst in edges.chunks(chunk_edges):
            order = np.argsort(dst, kind="stable")  # input order within a destination
            dst = dst[order]
            starts = np.flatnonzero(np.r_[True, dst[1:] != dst[:-1]])
            counts = np.diff(np.r_[starts, dst.size])
            slot = cursor[dst] + np.arange(dst.size) - np.repeat(starts, counts)
            row[slot] = src[order]
            if perm is not None:  # each slot's input position
                perm[slot] = first + order
                sorted_input = sorted_input and np.array_equal(slot, first + order)
            if clock is not None:
                assert edges.time is not None
                t = times(dst.size)
                _check_times(t, edges.time.where, first, dst.size)
                clock[slot] = t[order]
                if t.size:
                    newest = max(t.max().item(), newest if newest is not None else t.max().item())
            cursor[dst[starts]] += counts
            first += dst.size
            bar.update(len(dst))
    if clock is not None and perm is not None:
        sorted_input = _sort_by_time(colptr, row, perm, clock, chunk_edges) and sorted_input
    for mapped in (colptr, row, perm, cursor, clock):
        if isinstance(mapped, np.memmap):
            mapped.flush()
    del colptr, row, perm, cursor, clock
    (folder / "cursor.tmp").unlink()
    entries = {
        "colptr": file_entry(folder / "colptr.bin", "int64", [num_dst + 1]),
        "row": file_entry(folder / "row.bin", "int64", [edges.num_edges]),
    }
    if ids and sorted_input:  # the CSC is the input's order: edge ids need no map
        (folder / "perm.bin").unlink()
    elif ids:
        entries["perm"] = file_entry(folder / "perm.bin", "int64", [edges.num_edges])
    if timed:
        entries["edge_time"] = file_entry(folder / "edge_time.bin", time_dtype, [edges.num_edges])
    return entries, newest


def _check_times(t: np.ndarray, where: str, first: int, expected: int, what: str = "edge") -> None:
    """Refuse a time column that ended early or holds NaN or infinite times."""
    if t.size != expected:
        raise PreparedGraphError(f"{where}: fewer times than {what}s ({what} {first + t.size:,})")
    if t.dtype.kind == "f" and not np.isfinite(t).all():
        at = first + int(np.argmin(np.isfinite(t)))
        raise PreparedGraphError(
            f"{where}: the time of {what} {at:,} is NaN or infinite; give every {what} a time"
        )


def _sort_by_time(
    colptr: np.ndarray, row: np.ndarray, perm: np.ndarray, clock: np.ndarray, chunk_edges: int
) -> bool:
    """Sort every neighbourhood of a placed CSC by time, a block of destinations at a time.

    Stable: edges of one time keep their order. Returns whether no slot moved.
    """
    num_dst, untouched, a = colptr.size - 1, True, 0
    while a < num_dst:
        lo = int(colptr[a])  # the block: destinations a..b-1, about chunk_edges edges
        b = int(np.searchsorted(colptr, lo + chunk_edges, side="right")) - 1
        b = min(max(b, a + 1), num_dst)
        hi = int(colptr[b])
        t = np.asarray(clock[lo:hi])
        target = np.repeat(np.arange(b - a), np.diff(colptr[a : b + 1]))
        if ((t[1:] < t[:-1]) & (target[1:] == target[:-1])).any():
            order = np.lexsort((t, target))  # by destination, then time; stable
            clock[lo:hi], row[lo:hi], perm[lo:hi] = t[order], row[lo:hi][order], perm[lo:hi][order]
            untouched = False
        a = b
    return untouched


def _rows(array: Array, chunk_bytes: int) -> int:
    """Rows per chunk of ``array``: ``chunk_bytes`` of them, at least one."""
    per_row = int(np.prod(array.shape[1:], dtype=np.int64)) * array.dtype.itemsize
    return max(1, chunk_bytes // max(per_row, 1))


def _stored_dtype(x: Array, feature_dtype: str | None) -> str:
    """The stored features' dtype: as asked, else the input's (float64 as float32)."""
    if feature_dtype is not None:
        return feature_dtype
    name = str(x.dtype)
    return name if name in _STORED else "float32"


def write_features(x: Array, dtype: str, path: Path, chunk_bytes: int) -> FileEntry:
    """Copy (and cast) the features to ``path``, or record the input in place if it can be."""
    if x.in_place is not None and str(x.dtype) == dtype:
        file, offset = x.in_place
        stat = os.stat(file)
        _check_finite(x, chunk_bytes, lambda chunk: None)  # read once: nothing is copied
        # Its checksums, as a copied file's: `verify: full` finds a changed byte, where the
        # size and modification time (checked at every open) would not.
        checked = file_entry(Path(file), dtype, list(x.shape), offset)
        resolved = str(Path(file).resolve())
        return replace(checked, path=resolved, offset=offset, mtime_ns=stat.st_mtime_ns)
    writer = FileWriter(path, dtype)
    _check_finite(
        x,
        chunk_bytes,
        lambda chunk: writer.write(torch.from_numpy(np.ascontiguousarray(chunk)).to(DTYPES[dtype])),
    )
    return writer.close()


def _check_finite(x: Array, chunk_bytes: int, each: Callable[[np.ndarray], Any]) -> None:
    """Read ``x`` chunk by chunk, handing each to ``each``; refuse NaN or infinite features.

    Refused once the whole array is read, so that a damaged file says so first, naming the
    first bad row and how many there are.
    """
    rows, first_bad, bad = 0, None, 0
    with _bar(x.shape[0], f"features {x.where}") as bar:
        for chunk in x.chunks(_rows(x, chunk_bytes)):
            finite = np.isfinite(chunk).all(axis=tuple(range(1, chunk.ndim)))
            if not finite.all():
                first_bad = rows + int(np.argmin(finite)) if first_bad is None else first_bad
                bad += int((~finite).sum())
            each(chunk)
            rows += len(chunk)
            bar.update(len(chunk))
    if rows != x.shape[0]:
        raise PreparedGraphError(f"{x.where}: read {rows:,} rows of {x.shape[0]:,}")
    if first_bad is not None:
        raise PreparedGraphError(
            f"{x.where}: {bad:,} row(s) hold a NaN or infinite feature, row {first_bad:,} "
            "first; fix, impute or drop them before preparing"
        )


def _check_disjoint(masks: dict[str, Path], num_nodes: int, where: str) -> None:
    """Refuse splits that share nodes, naming the two and how many they share."""
    held = {k: np.memmap(p, np.bool_, "r", shape=(num_nodes,)) for k, p in masks.items()}
    names = list(held)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            shared = np.flatnonzero(held[a] & held[b])
            if shared.size:
                raise PreparedGraphError(
                    f"{where}: the {a} and {b} splits share {shared.size:,} node(s) (node "
                    f"{int(shared[0]):,} first); a node belongs to one split: remove it from one"
                )


def write_node_time(time: Array, path: Path, chunk_bytes: int) -> FileEntry:
    """Node times as int64 (integers) or float64; NaN or infinite refused."""
    writer, first = FileWriter(path, _time_dtype(time)), 0
    for chunk in time.chunks(_rows(time, chunk_bytes)):
        t = np.ascontiguousarray(chunk)
        _check_times(t, time.where, first, t.size, "node")
        writer.write(torch.from_numpy(t.astype(np.dtype(writer.dtype), copy=False)))
        first += t.size
    return writer.close()


def write_labels(y: Array, path: Path, chunk_bytes: int) -> tuple[FileEntry, int]:
    """Labels as int64; their manifest entry and the number of classes (largest label + 1)."""
    writer = FileWriter(path, "int64")
    largest = -1
    for chunk in y.chunks(_rows(y, chunk_bytes)):
        labels = torch.from_numpy(np.ascontiguousarray(chunk).astype(np.int64, copy=False))
        largest = max(largest, int(labels.max()) if labels.numel() else -1)
        writer.write(labels)
    return writer.close(), largest + 1


def write_mask(split: Array, num_nodes: int, path: Path, chunk_bytes: int) -> FileEntry:
    """The boolean mask of a split: its node indices, or a boolean mask as given."""
    mask = _mapped(path, np.bool_, num_nodes)
    first = 0
    for chunk in split.chunks(_rows(split, chunk_bytes)):
        if split.dtype.kind == "b":  # a mask already, one entry per node (check_inputs)
            mask[first : first + len(chunk)] = chunk
        else:
            index = np.asarray(chunk).astype(np.int64, copy=False)
            _check_range(index, num_nodes, split.where, "node index", first)
            mask[index] = True
        first += len(chunk)
    if isinstance(mask, np.memmap):
        mask.flush()
    del mask
    return file_entry(path, "bool", [num_nodes])


def check_inputs(nodes: dict[str | None, NodeInputs], edge_types: dict[Any, Edges]) -> None:
    """What can be checked from shapes alone, before any long work."""
    for inputs in nodes.values():
        n = inputs.num_nodes
        for array in (inputs.x, inputs.y):
            if array is not None and array.shape[0] != n:
                raise PreparedGraphError(
                    f"{array.where} has {array.shape[0]:,} rows where the node type has {n:,} "
                    "nodes; give one row per node"
                )
        if inputs.x is not None and 0 in tuple(inputs.x.shape)[1:]:
            raise PreparedGraphError(
                f"{inputs.x.where} must hold a row of at least one feature per node; it has "
                f"shape {tuple(inputs.x.shape)}: give the features, or leave the file out (a "
                "heterogeneous node type without features learns an embedding)"
            )
        if inputs.y is not None and (len(inputs.y.shape) != 1 or inputs.y.dtype.kind not in "iu"):
            raise PreparedGraphError(
                f"{inputs.y.where} must hold one integer label per node; it is "
                f"{inputs.y.dtype} of shape {inputs.y.shape}"
            )
        for split in (inputs.splits or {}).values():
            if split.dtype.kind not in "biu" or len(split.shape) != 1:
                raise PreparedGraphError(
                    f"{split.where} must hold a split's node ids (integers) or a boolean mask "
                    f"of one entry per node; it is {split.dtype} of shape {split.shape}"
                )
            if split.dtype.kind == "b" and split.shape[0] != n:
                raise PreparedGraphError(
                    f"{split.where} is a boolean mask of {split.shape[0]:,} entries where the "
                    f"node type has {n:,} nodes; give one per node, or the split's node ids"
                )
        time = inputs.time
        if time is not None and (time.shape != (n,) or time.dtype.kind not in "iuf"):
            raise PreparedGraphError(
                f"{time.where} must hold one time per node ({n:,}), integers or floats; it is "
                f"{time.dtype} of shape {time.shape}"
            )
        if inputs.x is not None and (len(inputs.x.shape) != 2 or inputs.x.dtype.kind != "f"):
            raise PreparedGraphError(
                f"{inputs.x.where} must be a 2-D float array (nodes x features); it is "
                f"{inputs.x.dtype} of shape {inputs.x.shape}"
            )
    for key, edges in edge_types.items():
        src, dst = (None, None) if key is None else (key[0], key[-1])
        attr = edges.attr
        if attr is not None and (attr.shape[0] != edges.num_edges or len(attr.shape) > 2):
            raise PreparedGraphError(
                f"{attr.where} must hold one row of features per edge of {edges.where} "
                f"({edges.num_edges:,}); it is of shape {attr.shape}"
            )
        if attr is not None and attr.dtype.kind != "f":
            raise PreparedGraphError(
                f"{attr.where} must be a float array (edges x features); it is {attr.dtype}: "
                "cast it to float"
            )
        time = edges.time
        if time is not None and (time.shape != (edges.num_edges,) or time.dtype.kind not in "iuf"):
            raise PreparedGraphError(
                f"{time.where} must hold one time per edge of {edges.where} "
                f"({edges.num_edges:,}), integers or floats; it is {time.dtype} of shape "
                f"{time.shape}"
            )
        for end in (src, dst):
            if end not in nodes:
                raise PreparedGraphError(
                    f"{edges.where}: the edge type {key} names node type {end!r}, which has no "
                    "inputs; add its folder (or its count to num_nodes.json)"
                )


def write(
    out: Path,
    source: dict[str, Any],
    nodes: dict[str | None, NodeInputs],
    edge_types: dict[Any, Edges],
    feature_dtype: str | None = None,
    chunk_bytes: int = 64 << 20,
) -> Path:
    """Write a prepared folder from streamed inputs (``None`` keys: a homogeneous graph).

    Args:
        out: The folder to create (atomically).
        source: What the inputs are (recorded, and hashed into the folder's key).
        nodes: Each node type's inputs.
        edge_types: Each edge type's edges, by PyG's ``(src, rel, dst)`` (or ``None``).
        feature_dtype: Dtype of the stored features; ``None`` keeps the input's.
        chunk_bytes: Bytes of input per chunk (bounds the process's memory, with a few copies).
    """
    check_inputs(nodes, edge_types)
    hetero = None not in nodes

    def prefix(key: Any) -> str:
        if key is None:
            return ""
        return f"{'__'.join(key) if isinstance(key, tuple) else key}/"

    def fill(folder: Path) -> Manifest:
        files: dict[str, FileEntry] = {}
        num_edges, num_edge_features, newest = {}, {}, {}
        for key, edges in edge_types.items():  # first: a bad index is refused early
            src, dst = (None, None) if key is None else (key[0], key[-1])
            n_src, n_dst = nodes[src].num_nodes, nodes[dst].num_nodes
            entries, last = write_csc(edges, n_src, n_dst, folder / prefix(key), chunk_bytes // 16)
            files |= {f"{prefix(key)}{name}": e for name, e in entries.items()}
            num_edges[prefix(key)[:-1]] = edges.num_edges
            if last is not None:  # what an append must not precede
                newest[prefix(key)[:-1]] = last
        for key, edges in edge_types.items():  # in the input's order: gathered by e_id
            if edges.attr is not None:
                dtype = _stored_dtype(edges.attr, feature_dtype)
                path = folder / f"{prefix(key)}edge_attr.bin"
                files[f"{prefix(key)}edge_attr"] = write_features(
                    edges.attr, dtype, path, chunk_bytes
                )
                num_edge_features[prefix(key)[:-1]] = int(np.prod(edges.attr.shape[1:]))
        num_features, num_classes = {}, {}
        for key, inputs in nodes.items():
            (folder / prefix(key)).mkdir(parents=True, exist_ok=True)
            name = prefix(key)[:-1]
            if inputs.x is not None:
                dtype = _stored_dtype(inputs.x, feature_dtype)
                path = folder / f"{prefix(key)}x.bin"
                files[f"{prefix(key)}x"] = write_features(inputs.x, dtype, path, chunk_bytes)
                num_features[name] = inputs.x.shape[1]
            if inputs.time is not None:  # each node's time: what a seed of it may see
                path = folder / f"{prefix(key)}time.bin"
                files[f"{prefix(key)}time"] = write_node_time(inputs.time, path, chunk_bytes)
            if inputs.y is not None:
                path = folder / f"{prefix(key)}y.bin"
                files[f"{prefix(key)}y"], num_classes[name] = write_labels(
                    inputs.y, path, chunk_bytes
                )
            masks = {}
            for split, array in (inputs.splits or {}).items():
                path = masks[split] = folder / f"{prefix(key)}{split}_mask.bin"
                files[f"{prefix(key)}{split}_mask"] = write_mask(
                    array, inputs.num_nodes, path, chunk_bytes
                )
            where = ", ".join(a.where for a in (inputs.splits or {}).values())
            _check_disjoint(masks, inputs.num_nodes, where)
        counts = {prefix(k)[:-1]: v.num_nodes for k, v in nodes.items()}
        if hetero:
            return Manifest(
                num_nodes=counts,
                num_edges=num_edges,
                num_features=num_features,
                num_classes=num_classes,
                num_edge_features=num_edge_features,
                files=files,
                checked=CHECKS,  # each as it streamed
                newest_time=newest or None,
            )
        return Manifest(
            num_nodes=counts[""],
            num_edges=num_edges[""],
            num_features=num_features.get("", 0),
            num_classes=num_classes.get("", 0),
            num_edge_features=num_edge_features.get("", 0),
            files=files,
            checked=CHECKS,
            newest_time=newest or None,
        )

    size = 0  # bytes written: labels, masks, copied features, each edge type's CSC
    for inputs in nodes.values():
        size += inputs.num_nodes * (8 + len(SPLITS) + (8 if inputs.time is not None else 0))
        if inputs.x is not None and inputs.x.in_place is None:
            dtype = DTYPES[_stored_dtype(inputs.x, feature_dtype)]
            size += int(np.prod(inputs.x.shape)) * dtype.itemsize
    for key, edges in edge_types.items():  # row and perm, colptr; copied edge features
        size += 8 * (2 * edges.num_edges + nodes[None if key is None else key[-1]].num_nodes + 1)
        size += 8 * edges.num_edges if edges.time is not None else 0
        if edges.attr is not None and edges.attr.in_place is None:
            dtype = DTYPES[_stored_dtype(edges.attr, feature_dtype)]
            size += int(np.prod(edges.attr.shape)) * dtype.itemsize
    return prepare(out, source | {"feature_dtype": feature_dtype}, fill, size)
