"""New nodes and edges into a prepared folder, in time that grows with them, not with the graph.

A CSC cannot take an edge in place: every later neighbourhood would move. An append writes its
edges as a small CSC of their own beside the folder's (``append<g>/``: the destinations they
reach, each one's new in-edges sorted by time, each slot's edge id and time), and grows at their
end the files that hold a row per node or per edge (features, labels, times, masks, edge
features). A
sampler reads a node's in-edges as the folder's, then each append's, in order
(:mod:`gnnscale.sampling.segments`). An append's edges are no older than any the folder holds,
so every neighbourhood stays sorted by time, and a grown folder is, as a graph, the one a
prepare of the whole stream writes: same nodes, same edge ids, same batches under a seed.

Atomic as a prepare is: the new files are written and flushed, then the manifest is replaced,
by rename, last. A fit that opened the folder keeps its snapshot (its manifest's sizes: grown
files' new rows lie past them); a kill midway leaves the manifest as it was, and nothing reads
what the append had written (a grown file's bytes past its entry are ignored, ``GROWN_FILES``,
and files no manifest names); a rerun cuts those tails and writes the append again.

The part to append is a folder of ``.npy`` arrays laid out as ``gnnscale prepare --source Npy``
reads one (``gnnscale.stores.npy``), holding only what is new: the new nodes' rows (their ids
continue the folder's: ``n, n + 1, ...``), counted by ``x.npy``, ``y.npy`` or ``time.npy``, else by
``num_nodes.json`` (``{"": k}`` in a homogeneous graph), else none; and the new edges, between
any nodes old or new, with ``edge_time.npy`` and ``edge_attr.npy`` where the folder has them.
New nodes join no split. The batch is read into memory (about 40 bytes an edge).
"""

from __future__ import annotations

import shutil
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gnnscale.stores import atomic
from gnnscale.stores.manifest import (
    DTYPES,
    SPLIT_MASKS,
    FileEntry,
    FileWriter,
    Manifest,
    PreparedGraphError,
    check_file,
)
from gnnscale.stores.npy import _array, _edge_file, read_counts
from gnnscale.stores.streaming import Array, Edges

__all__ = ["append_npy", "newest_time"]


def _all(array: Array) -> np.ndarray:
    """A streamed input read whole (an append's part is held in memory)."""
    parts = list(array.chunks(max(array.shape[0], 1)))
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(array.shape, array.dtype)


def _edges_whole(edges: Edges) -> tuple[np.ndarray, np.ndarray]:
    parts = list(edges.chunks(max(edges.num_edges, 1)))
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


@dataclass(frozen=True)
class _Folder:
    """A prepared folder as an append sees it: its manifest, and where its files lie.

    Not opened as ``PreparedGraph`` opens one (every file's size, every ``colptr`` read): an
    append checks the files it grows, and reads nothing else.
    """

    path: Path
    manifest: Manifest

    def file(self, name: str) -> Path:
        return self.path / f"{name}.bin"


def newest_time(folder: Path, manifest: Manifest, key: str) -> float | None:
    """Edge type ``key``'s newest edge time (``""``: a homogeneous graph's); ``None``: untimed.

    As ``manifest`` (``folder``'s) records it; a folder prepared before it did is read once
    (its time files).
    """
    if manifest.newest_time is not None and key in manifest.newest_time:
        return manifest.newest_time[key]
    prefix = f"{key}/" if key else ""
    names = [n for n in manifest.files if n.startswith(prefix) and n.endswith("edge_time")]
    names = [n for n in names if n.removeprefix(prefix).count("/") <= 1]
    found = []
    for name in names:
        entry = manifest.files[name]
        if entry.bytes:
            times = np.memmap(folder / f"{name}.bin", np.dtype(entry.dtype), "r", shape=entry.shape)
            found.append(times.max().item())
    return max(found) if found else None


def _grow(folder: _Folder, name: str, data: bytes, rows: int) -> tuple[FileEntry, Path]:
    """Append ``data`` (``rows`` rows) to file ``name`` after its entry's bytes; its new entry.

    A tail past the entry (a killed append's) is cut first. The block checksums go on from the
    last one: only the new bytes are read.
    """
    entry, path = folder.manifest.files[name], folder.file(name)
    check_file(folder.manifest, name, path, "size", folder.path)  # missing, or cut short
    with path.open("r+b") as f:
        f.truncate(entry.bytes)
        f.seek(entry.bytes)
        f.write(data)
    block, crcs, view = folder.manifest.block_bytes, list(entry.crc32 or ()), memoryview(data)
    at = 0
    if entry.bytes % block and crcs:  # the last block goes on
        at = min(block - entry.bytes % block, len(view))
        crcs[-1] = zlib.crc32(view[:at], crcs[-1])
    for start in range(at, len(view), block):
        crcs.append(zlib.crc32(view[start : start + block]))
    shape = (entry.shape[0] + rows, *entry.shape[1:])
    return replace(entry, shape=shape, bytes=entry.bytes + len(data), crc32=tuple(crcs)), path


def _as_bytes(values: np.ndarray, dtype: str) -> bytes:
    tensor = torch.from_numpy(np.ascontiguousarray(values)).to(DTYPES[dtype]).contiguous()
    return tensor.view(-1).view(torch.uint8).numpy().tobytes()


def _read_part(
    root: Path, manifest: Manifest
) -> tuple[dict[str, tuple[int, dict[str, Array]]], dict[str, Edges]]:
    """Per node type, the part's new nodes (how many, their rows); its edges per edge type."""
    if not root.is_dir():
        raise PreparedGraphError(f"--root {root} is not a folder of .npy arrays")
    counts = read_counts(root)
    hetero = manifest.is_hetero
    nodes: dict[str, tuple[int, dict[str, Array]]] = {}
    for t in manifest.node_counts:
        where = root / "nodes" / t if hetero else root
        found = {
            k: _array(where / f"{k}.npy")
            for k in ("x", "y", "time")
            if (where / f"{k}.npy").is_file()
        }
        arrays = list(found.values())
        count = arrays[0].shape[0] if arrays else counts.get(t, 0)
        for a in arrays:
            if a.shape[0] != count:
                raise PreparedGraphError(
                    f"{a.where} has {a.shape[0]:,} rows, the part's other node file {count:,}: "
                    "give one row per new node in each"
                )
        nodes[t] = count, found
    edges: dict[str, Edges] = {}
    folders = (
        {"": root}
        if not hetero
        else {p.name: p for p in sorted((root / "edges").glob("*")) if p.is_dir()}
    )
    for key, where in folders.items():
        if key not in manifest.edge_counts:
            raise PreparedGraphError(
                f"{where}: the folder has no edge type {key!r}; its edge types are "
                f"{', '.join(manifest.edge_counts)}"
            )
        found_edges = _edge_file(where)
        if found_edges is not None:
            edges[key] = found_edges
    if not edges and not any(count for count, _ in nodes.values()):
        raise PreparedGraphError(f"{root} holds no new nodes and no new edges")
    return nodes, edges


def append_npy(folder: Path, root: Path) -> Manifest:
    """Append the new nodes and edges of the ``.npy`` folder ``root`` to prepared ``folder``.

    Args:
        folder: A prepared folder (``gnnscale prepare``).
        root: The part to append (layout above).

    Returns:
        The folder's new manifest.
    """
    folder, root = Path(folder), Path(root)
    with atomic.locked(folder):
        manifest = Manifest.read(folder)
        nodes, edges = _read_part(root, manifest)
        grown = {t: manifest.node_counts[t] + count for t, (count, _) in nodes.items()}
        # Everything read and checked first: a refusal writes nothing.
        rows = _node_rows(root, folder, manifest, nodes)
        newest = dict(manifest.newest_time or {})
        parts = {
            key: _edge_part(e, key, manifest, folder, grown, newest) for key, e in edges.items()
        }
        target, files, written = _Folder(folder, manifest), dict(manifest.files), []
        for name, (values, count) in rows.items():
            files[name], path = _grow(target, name, _as_bytes(values, files[name].dtype), count)
            written.append(path)
        g = len(manifest.appends or []) + 1
        for key, (src, dst, time, attr) in parts.items():
            prefix = f"{key}/" if key else ""
            if attr is not None:
                name = f"{prefix}edge_attr"
                files[name], path = _grow(
                    target, name, _as_bytes(attr, files[name].dtype), src.size
                )
                written.append(path)
            first = manifest.edge_count(key or None)  # the part's first edge id
            entries, paths = _write_delta(folder / f"{prefix}append{g}", src, dst, time, first)
            files |= {f"{prefix}append{g}/{name}": e for name, e in entries.items()}
            written += paths
        new_edges = {key: int(part[0].size) for key, part in parts.items()}
        edge_counts = {
            k: manifest.edge_counts[k] + new_edges.get(k, 0) for k in manifest.edge_counts
        }
        record = {
            "nodes": {t: count for t, (count, _) in nodes.items()},
            "edges": new_edges,
            "root": str(root.resolve()),
        }
        updated = replace(
            manifest,
            num_nodes=grown if manifest.is_hetero else grown[""],
            num_edges=edge_counts if manifest.is_hetero else edge_counts[""],
            files=files,
            newest_time=newest or None,
            appends=[*(manifest.appends or []), record],
        )
        atomic.replace_manifest(folder, updated.to_json(), written)
        return updated


def _check_own(manifest: Manifest, name: str, folder: Path) -> FileEntry:
    """File ``name``'s entry, refused if it is an input used where it lies (not the folder's)."""
    entry = manifest.files[name]
    if entry.path is not None:
        raise PreparedGraphError(
            f"{folder}: its {name} is the input {entry.path}, used where it lies; an append "
            "would write into your file: prepare the folder again with --feature_dtype set "
            "(the features are then copied into it), then append"
        )
    return entry


def _node_rows(
    root: Path, folder: Path, manifest: Manifest, nodes: dict[str, tuple[int, dict[str, Array]]]
) -> dict[str, tuple[np.ndarray, int]]:
    """The rows to add to each node file (by its name), checked; how many."""
    rows = {}
    for t, (count, part) in nodes.items():
        prefix = f"{t}/" if t else ""
        for name in ("x", "y", "time", *SPLIT_MASKS):
            entry, given = manifest.files.get(f"{prefix}{name}"), part.get(name)
            if entry is None:
                if given is not None:
                    raise PreparedGraphError(
                        f"{given.where}: the folder holds no {name} for these nodes; leave it out"
                    )
                continue
            if not count:
                continue
            entry = _check_own(manifest, f"{prefix}{name}", folder)
            if name in SPLIT_MASKS:
                values = np.zeros(count, np.bool_)  # new nodes join no split
            elif given is None:
                raise PreparedGraphError(
                    f"{root}: the folder holds {name} for every node: give the {count:,} new "
                    f"nodes' {name}.npy"
                )
            else:
                values = _all(given)
                _check_rows(values, entry, given.where, name)
            rows[f"{prefix}{name}"] = values, count
    return rows


def _edge_part(
    edges: Edges,
    key: str,
    manifest: Manifest,
    folder: Path,
    grown: dict[str, int],
    newest: dict[str, Any],
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """One edge type's new edges, checked: sources, destinations, times, features."""
    prefix = f"{key}/" if key else ""
    src_type, dst_type = (key.split("__")[0], key.split("__")[-1]) if key else ("", "")
    src, dst = _edges_whole(edges)
    for ids, t, what in ((src, src_type, "source"), (dst, dst_type, "destination")):
        n = grown[t]
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            at = int(np.flatnonzero((ids < 0) | (ids >= n))[0])
            raise PreparedGraphError(
                f"{edges.where}: {what} {int(ids[at])} at position {at:,} is outside "
                f"0..{n - 1} (the folder's nodes and the part's new ones); fix the file"
            )
    time = _time_of(edges, key, folder, manifest, newest)
    entry = manifest.files.get(f"{prefix}edge_attr")
    if entry is not None:
        entry = _check_own(manifest, f"{prefix}edge_attr", folder)
    if entry is None:
        if edges.attr is not None:
            raise PreparedGraphError(
                f"{edges.attr.where}: the folder holds no edge features; leave it out"
            )
        return src, dst, time, None
    if edges.attr is None:
        raise PreparedGraphError(
            f"{edges.where}: the folder holds edge features: give the new edges' edge_attr.npy"
        )
    attr = _all(edges.attr)
    _check_rows(attr, entry, edges.attr.where, "edge_attr")
    return src, dst, time, attr


def _check_rows(values: np.ndarray, entry: FileEntry, where: str, name: str) -> None:
    """Refuse new rows that are not of the stored rows' shape, or not finite."""
    if tuple(values.shape[1:]) != tuple(entry.shape[1:]):
        raise PreparedGraphError(
            f"{where}: its rows are of shape {tuple(values.shape[1:])}, the folder's {name} "
            f"{tuple(entry.shape[1:])}; give rows like the folder's"
        )
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        raise PreparedGraphError(f"{where} holds a NaN or infinite value; fix it before appending")
    if name == "time" and values.dtype.kind not in "iuf":
        raise PreparedGraphError(f"{where} must hold numbers (times); it is {values.dtype}")
    if name == "y" and values.dtype.kind not in "iu":
        raise PreparedGraphError(f"{where} must hold integer labels; it is {values.dtype}")


def _time_of(
    edges: Edges, key: str, folder: Path, manifest: Manifest, newest: dict[str, Any]
) -> np.ndarray | None:
    """The part's edge times, held to the folder's: none where it has none, none older."""
    timed = f"{key}/edge_time" in manifest.files if key else "edge_time" in manifest.files
    if edges.time is None:
        if timed:
            raise PreparedGraphError(
                f"{edges.where}: the folder holds edge times: give the new edges' edge_time.npy"
            )
        return None
    if not timed:
        raise PreparedGraphError(
            f"{edges.time.where}: the folder holds no edge times; leave it out"
        )
    time = _all(edges.time)
    if time.shape != (edges.num_edges,) or time.dtype.kind not in "iuf":
        raise PreparedGraphError(
            f"{edges.time.where} must hold one time per new edge ({edges.num_edges:,}); it is "
            f"{time.dtype} of shape {time.shape}"
        )
    if time.dtype.kind == "f" and not np.isfinite(time).all():
        raise PreparedGraphError(f"{edges.time.where} holds a NaN or infinite time")
    before = newest_time(folder, manifest, key)
    if before is not None and time.size and time.min() < before:
        at = int(np.argmax(time < before))
        raise PreparedGraphError(
            f"{edges.time.where}: edge {at:,} is at time {time[at]}, before the folder's newest "
            f"edge ({before}); an append adds edges no older than those the folder holds: "
            "prepare the whole stream again to add edges from its past"
        )
    if time.size:
        newest[key] = max(time.max().item(), before if before is not None else time.max().item())
    return time


def _write_delta(
    where: Path, src: np.ndarray, dst: np.ndarray, time: np.ndarray | None, first_id: int
) -> tuple[dict[str, FileEntry], list[Path]]:
    """The part's edges as a CSC of the destinations they reach; each slot's id and time.

    Within a destination, by time, then the part's order (stable), as a prepare sorts them.
    """
    if where.exists():  # a killed append's: written again whole
        shutil.rmtree(where)
    where.mkdir(parents=True)
    first = torch.arange(dst.size)
    if time is not None:  # by time, then (stably) by destination: each destination's by time
        first = torch.sort(torch.from_numpy(time), stable=True).indices
    by_dst = torch.from_numpy(dst).index_select(0, first)
    order = first.index_select(0, torch.sort(by_dst, stable=True).indices).numpy()
    sorted_dst = dst[order]
    starts = np.flatnonzero(np.r_[True, sorted_dst[1:] != sorted_dst[:-1]][: dst.size])
    arrays: dict[str, tuple[np.ndarray, str]] = {
        "nodes": (sorted_dst[starts].astype(np.int64, copy=False), "int64"),
        "colptr": (np.r_[starts, dst.size].astype(np.int64, copy=False), "int64"),
        "row": (src[order].astype(np.int64, copy=False), "int64"),
        "edge_id": ((first_id + order).astype(np.int64, copy=False), "int64"),
    }
    if time is not None:
        kind = "int64" if time.dtype.kind in "iu" else "float64"
        arrays["edge_time"] = (time[order].astype(kind, copy=False), kind)
    entries, paths = {}, []
    for name, (values, dtype) in arrays.items():
        writer = FileWriter(where / f"{name}.bin", dtype)
        writer.write(torch.from_numpy(np.ascontiguousarray(values)))
        entries[name] = writer.close()
        paths.append(where / f"{name}.bin")
    return entries, paths
