"""The prepared format: what a prepared folder holds and how each file is held to its manifest.

``gnnscale prepare`` writes a node-classification graph as flat files: features (``x.bin``, in
the dtype asked for), labels, the three split masks, and the neighbour sampler's structure in
CSC form (``colptr.bin``, ``row.bin``: each node's in-neighbours, contiguous). ``manifest.json``
records every file's dtype, shape, size and a CRC-32 per 64 MiB block, and is written last
(``gnnscale.stores.writing``), so a folder with a manifest is complete.

This module is that format and nothing else: the files' names and dtypes, each file's manifest
entry (:class:`FileWriter` checksums a file as it is appended, :func:`file_entry` one written in
place) and the checks that hold a file to its entry when a folder is opened (:func:`check_file`,
:func:`check_colptr`). It is apart from the reader (``gnnscale.stores.prepared``) and the
writers (``writing``, ``streaming``, ``link_split``) because both sides must agree on it, and it
changes only when the format does.
"""

from __future__ import annotations

import functools
import itertools
import math
import mmap
import zlib
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from gnnscale.errors import ConfigError

__all__ = ["PreparedGraphError"]

FORMAT = "gnnscale.prepared_graph/1"
BLOCK_BYTES = 64 << 20  # one CRC-32 per block: a damaged file names the block that is wrong
# What a writer checked of the graph it wrote, recorded in the manifest ("checked"), so that a
# fit does not read the whole folder again to check it: every node id of the edges and splits
# within its node count, every feature finite, no node in two splits.
CHECKS = ("node ids in range", "features finite", "splits disjoint")
SPLIT_MASKS = ("train_mask", "val_mask", "test_mask")  # one bool per node each
NODE_FILES = ("x", "y", *SPLIT_MASKS)  # a node-classification graph's files, one row per node
DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "bool": torch.bool,
}
FeatureDtype = Literal["float32", "float16", "bfloat16"]


class PreparedGraphError(ConfigError):
    """A prepared folder that is missing, incomplete or damaged; the message names the file."""


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

    def close(self) -> dict[str, Any]:
        if self.fill:
            self.crcs.append(self.crc)
        self.file.close()  # flushed to disk by atomic.commit()
        shape = [self.rows, *self.row_shape]
        return {"dtype": self.dtype, "shape": shape, "bytes": self.size, "crc32": self.crcs}


def file_entry(path: Path, dtype: str, shape: list[int], offset: int = 0) -> dict[str, Any]:
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
    return {"dtype": dtype, "shape": shape, "bytes": size, "crc32": crcs}


def check_file(
    manifest: dict[str, Any], name: str, path: Path, verify: Literal["full", "size"], folder: Path
) -> None:
    """Refuse file ``name`` of ``folder`` (at ``path``) where it is not as its manifest entry says.

    Missing, of another size, or (``verify: full``) with a block whose CRC-32 differs; an input
    used in place (an entry with a ``path``): of another size or modification time.
    """
    entry = manifest["files"][name]
    if not path.is_file():
        raise PreparedGraphError(f"{path} is missing; prepare the graph again")
    size = path.stat().st_size
    offset = entry.get("offset", 0)
    if "path" in entry:  # an input used in place: its data from offset to the end, unchanged
        if size != offset + entry["bytes"] or path.stat().st_mtime_ns != entry["mtime_ns"]:
            raise PreparedGraphError(
                f"{path} changed since {folder} was prepared from it; prepare the graph again"
            )
        if "crc32" not in entry:  # recorded before in-place inputs were checksummed
            return
    elif size != entry["bytes"]:
        raise PreparedGraphError(
            f"{path} has {size:,} bytes where the manifest says {entry['bytes']:,} "
            "(truncated or overwritten); prepare the graph again"
        )
    if verify == "size" or size == 0:
        return
    block = manifest["block_bytes"]
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            for i, expected in enumerate(entry["crc32"]):
                start = offset + i * block
                if zlib.crc32(view[start : start + block]) != expected:
                    raise PreparedGraphError(
                        f"{path} is corrupted: bytes {start:,} to "
                        f"{min(start + block, size):,} do not match their checksum; "
                        "prepare the graph again"
                    )
        finally:
            view.release()


def check_colptr(manifest: dict[str, Any], name: str, path: Path) -> None:
    """Range-check a CSC's ``colptr`` (file ``name``, at ``path``), whatever ``verify`` says.

    It must start at 0, end at the count of ``row`` and never decrease. PyG's samplers trust
    it: past ``row``'s end they crashed the process (a segmentation fault), and a decreasing
    entry trained on wrong neighbours without a word. One sequential read, 8 bytes a node (under
    a second per 100M nodes from the page cache). ``row``'s ids are checked by ``verify:
    full``'s checksums, and in every batch by ``PreparedGraph.check_ids``, not here: a read of
    every edge.
    """
    files = manifest["files"]
    edges = math.prod(files[name.removesuffix("colptr") + "row"]["shape"])
    count, offset = math.prod(files[name]["shape"]), files[name].get("offset", 0)
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
