"""The prepared format: what a prepared folder holds and how each file is held to its manifest.

``gnnscale prepare`` writes a node-classification graph as flat files: features (``x.bin``, in
the dtype asked for), labels, the three split masks, and the neighbour sampler's structure in
CSC form (``colptr.bin``, ``row.bin``: each node's in-neighbours, contiguous). ``manifest.json``
records the graph's counts and every file's dtype, shape, size and a CRC-32 per 64 MiB block,
and is written last (``gnnscale.stores.writing``), so a folder with a manifest is complete.

This module is that format and nothing else: the files' names and dtypes, the manifest
(:class:`Manifest`, read and written here only, each file's entry a :class:`FileEntry`;
:class:`FileWriter` checksums a file as it is appended, :func:`file_entry` one written in
place) and the checks that hold a file to its entry when a folder is opened (:func:`check_file`,
:func:`check_colptr`). It is apart from the reader (``gnnscale.stores.prepared``) and the
writers (``writing``, ``streaming``, ``link_split``) because both sides must agree on it, and it
changes only when the format does.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import mmap
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, TypeAlias

import numpy as np
import torch
from torch import Tensor

from gnnscale.errors import ConfigError
from gnnscale.stores import atomic

__all__ = ["FileEntry", "Manifest", "PreparedGraphError"]

FORMAT = "gnnscale.prepared_graph/1"
BLOCK_BYTES = 64 << 20  # one CRC-32 per block: a damaged file names the block that is wrong
# What a writer checked of the graph it wrote, recorded in the manifest ("checked"), so that a
# fit does not read the whole folder again to check it: every node id of the edges and splits
# within its node count, every feature finite, no node in two splits.
CHECKS = ("node ids in range", "features finite", "splits disjoint")
SPLIT_MASKS = ("train_mask", "val_mask", "test_mask")  # one bool per node each
NODE_FILES = ("x", "y", *SPLIT_MASKS)  # a node-classification graph's files, one row per node
# Files an append grows at their end (``gnnscale.stores.append``): one row per node or per edge,
# in id order. Bytes past an entry's size are a killed append's tail, which nothing reads.
GROWN_FILES = (*NODE_FILES, "time", "edge_attr")
DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "bool": torch.bool,
    "float64": torch.float64,
}
FeatureDtype = Literal["float32", "float16", "bfloat16"]


class PreparedGraphError(ConfigError):
    """A prepared folder that is missing, incomplete or damaged; the message names the file."""


# One count, or one per type: node types by name, edge types as "src__rel__dst".
Counts: TypeAlias = int | dict[str, int]


@dataclass(frozen=True)
class FileEntry:
    """One file's manifest entry: its dtype and shape, its size and a CRC-32 per block.

    An input used where it lies (not copied into the folder) also records its ``path``, the
    ``offset`` its data starts at and its modification time (``mtime_ns``); one recorded before
    in-place inputs were checksummed has no ``crc32``. ``extra``: keys this gnnscale does not
    read, kept as they were.
    """

    dtype: str
    shape: tuple[int, ...]
    bytes: int
    crc32: tuple[int, ...] | None = None
    path: str | None = None
    offset: int = 0
    mtime_ns: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, entry: Any, name: str, where: str) -> FileEntry:
        """File ``name``'s entry as the manifest at ``where`` holds it; one error if damaged."""
        of = f" of file {name!r}"
        _check(isinstance(entry, dict), f"the entry{of}", "an object", where)
        get = functools.partial(_get, entry, where=where, of=of)
        # An input used in place (a "path") was recorded without checksums by an older gnnscale.
        crc32 = get("crc32", "a list of numbers", required="path" not in entry)
        return cls(
            dtype=get("dtype", "a dtype gnnscale stores"),
            shape=tuple(get("shape", "a list of numbers")),
            bytes=get("bytes", "a number"),
            crc32=None if crc32 is None else tuple(crc32),
            path=get("path", "a string", required=False),
            offset=get("offset", "a number", required=False) or 0,
            mtime_ns=get("mtime_ns", "a number", required=False),
            extra={k: v for k, v in entry.items() if k not in _ENTRY_KEYS},
        )

    def to_json(self) -> dict[str, Any]:
        """The entry as the manifest holds it (the keys it was read with, in the writers' order)."""
        entry: dict[str, Any] = {"dtype": self.dtype, "shape": list(self.shape)}
        entry["bytes"] = self.bytes
        if self.crc32 is not None:
            entry["crc32"] = list(self.crc32)
        if self.path is not None:
            entry["path"] = self.path
        if self.path is not None or self.offset:
            entry["offset"] = self.offset
        if self.mtime_ns is not None:
            entry["mtime_ns"] = self.mtime_ns
        return entry | self.extra


@dataclass(frozen=True)
class Manifest:
    """A prepared folder's ``manifest.json``: its graph's counts, its files, how it was made.

    Read (:meth:`read`, :meth:`from_json`) and written (:meth:`to_json`, :meth:`write`) here
    only. Counts are one number in a homogeneous graph and one per type in a heterogeneous one
    (:attr:`is_hetero`), whose files are then named ``"type/name"``. A link split or seed-edge
    folder (``gnnscale.stores.link_split``) records its graph's node counts, no edge counts
    (``{}``) and neither features nor classes.

    What a writer left out is ``None`` here and absent on disk: features and classes (a link
    folder), edge features (recorded by the streaming writer only), ``checked``,
    ``split_labels``, ``source`` and ``key`` (an older gnnscale's folder may lack them).
    ``extra``: keys this gnnscale does not read, kept as they were.

    Args:
        num_nodes: Nodes (per node type).
        num_edges: Edges (per edge type).
        files: Each file's entry, by name (``x``, ``paper/x``, ``train/label_index``).
        num_features: Features per node (per node type; a type without features is left out).
        num_classes: Classes (per labelled node type).
        num_edge_features: Features per edge (per edge type; 0: none).
        checked: What its writer checked of the graph (:data:`CHECKS`).
        split_labels: Each labelled node type's split labels, by type (``""``: a homogeneous
            graph): the lowest, the highest and how many distinct.
        newest_time: Each timed edge type's newest edge time (``""``: a homogeneous graph's).
        appends: The batches appended since it was prepared (``gnnscale.stores.append``), in
            order: each one's new nodes and edges by type, and what it was read from.
        source: What it was made from.
        key: The hash of ``source``: a prepare of the same settings keeps the folder.
        format: The format's name and version (:data:`FORMAT`).
        block_bytes: Bytes per checksummed block.
    """

    num_nodes: Counts
    num_edges: Counts
    files: dict[str, FileEntry]
    num_features: Counts | None = None
    num_classes: Counts | None = None
    num_edge_features: Counts | None = None
    checked: tuple[str, ...] | None = None
    split_labels: dict[str, list[int]] | None = None
    newest_time: dict[str, float] | None = None
    appends: list[dict[str, Any]] | None = None
    source: dict[str, Any] | None = None
    key: str | None = None
    format: str = FORMAT
    block_bytes: int = BLOCK_BYTES
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        """The manifest of ``folder``, or one error saying why there is none or what is wrong."""
        command = f"gnnscale prepare --source ... --out {folder}"
        data = atomic.read_manifest(folder, FORMAT, "prepared graph", command, PreparedGraphError)
        return cls.from_json(data, str(Path(folder) / atomic.MANIFEST))

    @classmethod
    def from_json(cls, data: Any, where: str = atomic.MANIFEST) -> Manifest:
        """The manifest a writer wrote (:meth:`to_json`), checked key by key.

        A required key missing, or any key of the wrong kind, is one :class:`PreparedGraphError`
        naming ``where`` (the file) and the key.
        """
        _check(isinstance(data, dict), "the manifest", "an object", where)
        get = functools.partial(_get, data, where=where)
        counts = "a count, or counts by type"
        checked = get("checked", "a list of strings", required=False)
        return cls(
            num_nodes=get("num_nodes", counts),
            num_edges=get("num_edges", counts),
            files={
                name: FileEntry.from_json(e, name, where)
                for name, e in get("files", "an object").items()
            },
            num_features=get("num_features", counts, required=False),
            num_classes=get("num_classes", counts, required=False),
            num_edge_features=get("num_edge_features", counts, required=False),
            checked=None if checked is None else tuple(checked),
            split_labels=get("split_labels", "[lowest, highest, distinct] by type", required=False),
            newest_time=get("newest_time", "a time by type", required=False),
            appends=get("appends", "a list of objects", required=False),
            source=get("source", "an object", required=False),
            key=get("key", "a string", required=False),
            format=get("format", "a string"),
            block_bytes=get("block_bytes", "a number"),
            extra={k: v for k, v in data.items() if k not in _MANIFEST_KEYS},
        )

    def to_json(self) -> dict[str, Any]:
        """The manifest as ``manifest.json`` holds it: its keys in the writers' order."""
        data = {
            "format": self.format,
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
            "num_features": self.num_features,
            "num_classes": self.num_classes,
            "num_edge_features": self.num_edge_features,
            "files": {name: entry.to_json() for name, entry in self.files.items()},
            "checked": None if self.checked is None else list(self.checked),
            "split_labels": self.split_labels,
            "newest_time": self.newest_time,
            "appends": self.appends,
            "source": self.source,
            "key": self.key,
            "block_bytes": self.block_bytes,
        }
        return {k: v for k, v in data.items() if v is not None} | self.extra

    def write(self, partial: Path, out: Path) -> None:
        """Write it into the filled ``partial`` folder, last, and rename that to ``out``.

        ``gnnscale.stores.atomic.commit``: every file flushed to disk first, so that under its
        name a folder is complete or absent.
        """
        atomic.commit(partial, out, self.to_json())

    @property
    def is_hetero(self) -> bool:
        """Whether the graph has node and edge types (its counts are by type)."""
        return isinstance(self.num_nodes, dict)

    @property
    def node_counts(self) -> dict[str, int]:
        """Nodes per node type; ``{"": n}`` in a homogeneous graph (its files have no prefix)."""
        return _by_type(self.num_nodes)

    @property
    def edge_counts(self) -> dict[str, int]:
        """Edges per edge type (``"src__rel__dst"``); ``{"": m}`` in a homogeneous graph."""
        return _by_type(self.num_edges)

    def node_count(self, node_type: str | None = None) -> int:
        """Nodes of ``node_type`` (``None``: of a homogeneous graph)."""
        return _count(self.num_nodes, node_type, "node count")

    def edge_count(self, edge_type: str | None = None) -> int:
        """Edges of ``edge_type`` (``"src__rel__dst"``; ``None``: of a homogeneous graph)."""
        return _count(self.num_edges, edge_type, "edge count")

    def feature_dim(self, node_type: str | None = None) -> int:
        """Features per node of ``node_type`` (``None``: a homogeneous graph's); 0: none."""
        return _count(self.num_features, node_type, "feature count", default=0)

    def class_count(self, node_type: str | None = None) -> int:
        """Classes of labelled ``node_type`` (``None``: of a homogeneous graph), as prepared."""
        return _count(self.num_classes, node_type, "class count")

    def edge_feature_dim(self, edge_type: str | None = None) -> int:
        """Features per edge of ``edge_type`` (``None``: a homogeneous graph's); 0: none."""
        return _count(self.num_edge_features, edge_type, "edge feature count", default=0)

    def digest(self) -> str:
        """A digest of its files (each one's dtype, shape and block checksums): its contents.

        What a checkpoint records of the folder it was trained from.
        """
        files = {name: entry.to_json() for name, entry in self.files.items()}
        text = json.dumps(files, sort_keys=True).encode()
        return hashlib.blake2b(text, digest_size=8).hexdigest()


# The keys each reads (those of its fields); any other is kept in ``extra``.
_ENTRY_KEYS = {f.name for f in fields(FileEntry)} - {"extra"}
_MANIFEST_KEYS = {f.name for f in fields(Manifest)} - {"extra"}


def _by_type(counts: Counts) -> dict[str, int]:
    return dict(counts) if isinstance(counts, dict) else {"": counts}


def _count(counts: Counts | None, key: str | None, what: str, default: int | None = None) -> int:
    """Type ``key``'s count of ``counts`` (``None``: the one of a homogeneous graph)."""
    if isinstance(counts, dict) and key is not None:
        found = counts.get(key, default)
    elif isinstance(counts, int) and key is None:
        found = counts
    else:  # not recorded, or asked of the other kind of graph
        found = default if counts is None else None
    if found is None:
        raise KeyError(f"the manifest records no {what}" + (f" of {key!r}" if key else ""))
    return found


def _numbers(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) for v in value)


# What a key of the manifest may hold, by the name its error gives it.
_KINDS: dict[str, Callable[[Any], bool]] = {
    "a number": lambda v: isinstance(v, int),
    "a string": lambda v: isinstance(v, str),
    "an object": lambda v: isinstance(v, dict),
    "a list of numbers": _numbers,
    "a list of strings": lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v),
    "a list of objects": lambda v: isinstance(v, list) and all(isinstance(s, dict) for s in v),
    "a time by type": lambda v: (
        isinstance(v, dict) and all(isinstance(t, int | float) for t in v.values())
    ),
    "a dtype gnnscale stores": lambda v: isinstance(v, str) and v in DTYPES,
    "a count, or counts by type": lambda v: (
        isinstance(v, int) or (isinstance(v, dict) and all(isinstance(n, int) for n in v.values()))
    ),
    "[lowest, highest, distinct] by type": lambda v: (
        isinstance(v, dict) and all(_numbers(c) and len(c) == 3 for c in v.values())
    ),
}


def _check(ok: bool, what: str, kind: str, where: str) -> None:
    if not ok:
        raise PreparedGraphError(
            f"{where} cannot be read ({what} is not {kind}); prepare the graph again"
        )


def _get(
    data: dict[str, Any], key: str, kind: str, where: str, of: str = "", required: bool = True
) -> Any:
    """``data[key]`` if it is of its ``kind`` (``_KINDS``); ``None`` if absent and not required.

    Else one error naming ``where`` (the file) and the key (``of``: whose key it is).
    """
    if key not in data:
        if required:
            raise PreparedGraphError(
                f"{where} cannot be read ({key!r}{of} is missing); prepare the graph again"
            )
        return None
    _check(_KINDS[kind](data[key]), f"{key!r}{of}", kind, where)
    return data[key]


class FileWriter:
    """Appends tensors to one flat file and checksums it block by block as it goes."""

    def __init__(self, path: Path, dtype: str) -> None:
        self.path, self.dtype = path, dtype
        self.file = path.open("wb")
        self.crcs: list[int] = []
        self.crc, self.fill, self.size, self.rows = 0, 0, 0, 0
        self.row_shape: tuple[int, ...] = ()

    def write(self, t: Tensor) -> None:
        assert str(t.dtype).removeprefix("torch.") == self.dtype, (t.dtype, self.dtype)
        self.rows += t.size(0)
        self.row_shape = tuple(t.shape[1:])
        buf = memoryview(t.contiguous().view(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]
        self.file.write(buf)
        self.size += len(buf)
        pos = 0
        while pos < len(buf):
            take = min(BLOCK_BYTES - self.fill, len(buf) - pos)
            self.crc = zlib.crc32(buf[pos : pos + take], self.crc)
            self.fill, pos = self.fill + take, pos + take
            if self.fill == BLOCK_BYTES:
                self.crcs.append(self.crc)
                self.crc, self.fill = 0, 0

    def close(self) -> FileEntry:
        """Close the file; its manifest entry."""
        if self.fill:
            self.crcs.append(self.crc)
        self.file.close()  # flushed to disk by atomic.commit()
        shape = (self.rows, *self.row_shape)
        return FileEntry(self.dtype, shape, self.size, tuple(self.crcs))


def file_entry(path: Path, dtype: str, shape: list[int], offset: int = 0) -> FileEntry:
    """The manifest entry of a file written in place (not appended): read once to checksum it.

    ``offset``: the checksums cover the bytes from there (an input used in place, its header
    left out).
    """
    crcs, size = [], path.stat().st_size - offset
    buffer = memoryview(bytearray(1 << 20))  # one 1 MiB buffer, reused: the memory of a read
    with path.open("rb") as f:
        f.seek(offset)
        for start in range(0, size, BLOCK_BYTES):
            crc, left = 0, min(BLOCK_BYTES, size - start)
            while left:
                read = f.readinto(buffer[: min(left, len(buffer))])
                if not read:
                    raise EOFError(f"{path} ended while it was checksummed")
                crc, left = zlib.crc32(buffer[:read], crc), left - read
            crcs.append(crc)
    return FileEntry(dtype, tuple(shape), size, tuple(crcs))


def check_file(
    manifest: Manifest, name: str, path: Path, verify: Literal["full", "size"], folder: Path
) -> None:
    """Refuse file ``name`` of ``folder`` (at ``path``) where it is not as its manifest entry says.

    Missing, of another size, or (``verify: full``) with a block whose CRC-32 differs; an input
    used in place (an entry with a ``path``): of another size or modification time.
    """
    entry = manifest.files[name]
    if not path.is_file():
        raise PreparedGraphError(f"{path} is missing; prepare the graph again")
    size = path.stat().st_size
    offset = entry.offset
    if entry.path is not None:  # an input used in place: its data from offset to the end, as it was
        if size != offset + entry.bytes or path.stat().st_mtime_ns != entry.mtime_ns:
            raise PreparedGraphError(
                f"{path} changed since {folder} was prepared from it; prepare the graph again"
            )
    elif size != entry.bytes and not (size > entry.bytes and name.split("/")[-1] in GROWN_FILES):
        raise PreparedGraphError(
            f"{path} has {size:,} bytes where the manifest says {entry.bytes:,} "
            "(truncated or overwritten); prepare the graph again"
        )
    if verify == "size" or size == 0 or entry.crc32 is None:  # None: see FileEntry
        return
    block = manifest.block_bytes
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            end = offset + entry.bytes  # past it: a killed append's tail (GROWN_FILES)
            for i, expected in enumerate(entry.crc32):
                start = offset + i * block
                if zlib.crc32(view[start : min(start + block, end)]) != expected:
                    raise PreparedGraphError(
                        f"{path} is corrupted: bytes {start:,} to "
                        f"{min(start + block, size):,} do not match their checksum; "
                        "prepare the graph again"
                    )
        finally:
            view.release()


def check_colptr(manifest: Manifest, name: str, path: Path) -> None:
    """Range-check a CSC's ``colptr`` (file ``name``, at ``path``), whatever ``verify`` says.

    It must start at 0, end at the count of ``row`` and never decrease. PyG's samplers trust
    it: past ``row``'s end they crashed the process (a segmentation fault), and a decreasing
    entry trained on wrong neighbours without a word. One sequential read, 8 bytes a node (under
    a second per 100M nodes from the page cache). ``row``'s ids are checked by ``verify:
    full``'s checksums, and in every batch by ``PreparedGraph.check_ids``, not here: a read of
    every edge.
    """
    files = manifest.files
    edges = math.prod(files[name.removesuffix("colptr") + "row"].shape)
    count, offset = math.prod(files[name].shape), files[name].offset
    last, problem, chunk = 0, None, 1 << 22
    for start in range(0, count, chunk):
        part = np.fromfile(path, np.int64, min(chunk, count - start), offset=offset + 8 * start)
        drops = np.flatnonzero(np.diff(part, prepend=last) < 0)
        if start == 0 and part[0] != 0:
            problem = f"it starts at {part[0]:,}, not 0"
        elif len(drops):
            problem = f"entry {start + drops[0]:,} is smaller than the one before it"
        if problem:
            break
        last = part[-1]
    else:
        if last != edges:
            problem = f"it ends at {last:,} where row has {edges:,} entries"
    if problem:
        raise PreparedGraphError(f"{path} is damaged ({problem}); prepare the graph again")


def split_labels(
    y: Tensor, masks: dict[str, Tensor], chunk: int = 1 << 22
) -> tuple[Tensor, dict[tuple[str, str], int]]:
    """The distinct labels of the split nodes (sorted), and the nodes each two splits share.

    Read ``chunk`` nodes at a time: a prepared graph's labels and masks are mapped files, and
    its splits may hold most of its nodes (on the papers100M-sized graph, a copy of the split
    nodes' labels and their sort took 3.4 GiB).
    """
    classes = y.new_empty(0)
    pairs = list(itertools.combinations(masks, 2))
    shared = dict.fromkeys(pairs, 0)
    for start in range(0, y.size(0), chunk):
        part = {k: m[start : start + chunk] for k, m in masks.items()}
        labelled = functools.reduce(torch.logical_or, part.values())
        classes = torch.unique(
            torch.cat([classes, torch.unique(y[start : start + chunk][labelled])])
        )
        for a, b in pairs:
            shared[a, b] += int((part[a] & part[b]).sum())
    return classes, shared
