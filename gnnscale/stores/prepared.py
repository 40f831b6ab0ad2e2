"""A graph prepared once on disk, then memory-mapped by every process that trains on it.

``gnnscale prepare`` writes a node-classification graph as flat files: features (``x.bin``, in
the dtype asked for), labels, the three split masks, and the neighbour sampler's structure in
CSC form (``colptr.bin``, ``row.bin``: each node's in-neighbours, contiguous). ``manifest.json``
records every file's dtype, shape, size and a CRC-32 per 64 MiB block, and is written last: a
folder is only ever renamed into place complete, so a killed prepare leaves nothing that looks
prepared, and the next prepare starts again cleanly.

:class:`PreparedGraph` checks a folder against its manifest (sizes, then every block's checksum)
and maps the files shared and read-only. The tensors it returns live in the page
cache, not in the process: a batch gathers its rows from the mapped feature file, the sampler
walks the mapped CSC, and processes that open the same folder (DDP ranks under ``torchrun``, on
one machine or on several that share the storage) share those pages instead of each holding a
copy. Nothing is read into private memory but the batches and the training split's node ids.

Two ways to fill a folder: :func:`write_graph` writes any in-memory PyG ``Data`` (the datasets
``gnnscale fit`` loads), and :func:`write_streamed_synthetic` generates a graph chunk by chunk,
so its feature file can be larger than the machine's memory.
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import shutil
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import cached_property
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import psutil
import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.sampler.utils import to_csc
from tqdm import tqdm

from gnnscale.errors import NO_ROOM, ConfigError
from gnnscale.stores import atomic, reads

if TYPE_CHECKING:  # its settings only: stores do not depend on the data package
    from gnnscale.data.synthetic import SyntheticGraph

__all__ = ["PreparedGraph", "write_graph", "write_streamed_synthetic"]

FORMAT = "gnnscale.prepared_graph/1"
BLOCK_BYTES = 64 << 20  # one CRC-32 per block: a damaged file names the block that is wrong
# What a writer checked of the graph it wrote, recorded in the manifest ("checked"), so that a
# fit does not read the whole folder again to check it: every node id of the edges and splits
# within its node count, every feature finite, no node in two splits.
CHECKS = ("node ids in range", "features finite", "splits disjoint")
_SPLITS = ("train_mask", "val_mask", "test_mask")
NODE_FILES = ("x", "y", *_SPLITS)  # a node-classification graph's files, one row per node
DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "bool": torch.bool,
}
FeatureDtype = Literal["float32", "float16", "bfloat16"]
# Reads in flight when a graph is read from disk: cold random rows here, 32 threads 85k/s, 64
# 92k/s, against the disk's 72-80k/s at queue depth 32 (gnnscale.stores.reads).
READ_THREADS = 32


class PreparedGraphError(ConfigError):
    """A prepared folder that is missing, incomplete or damaged; the message names the file."""


# --- writing -------------------------------------------------------------------------------


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


class _Writer:
    """The files of one prepared graph, in a partial folder until it is committed."""

    def __init__(self, folder: Path, dtypes: dict[str, str]) -> None:
        self.files = {name: FileWriter(folder / f"{name}.bin", d) for name, d in dtypes.items()}

    @classmethod
    def node_graph(cls, folder: Path, feature_dtype: str) -> _Writer:
        """The files of a homogeneous node-classification graph."""
        dtypes = {"x": feature_dtype, "y": "int64", "colptr": "int64", "row": "int64"}
        return cls(folder, dtypes | dict.fromkeys(_SPLITS, "bool"))

    def __getitem__(self, name: str) -> FileWriter:
        return self.files[name]

    def close(self) -> dict[str, Any]:
        """Each file's manifest entry."""
        return {name: w.close() for name, w in self.files.items()}


def file_entry(path: Path, dtype: str, shape: list[int]) -> dict[str, Any]:
    """The manifest entry of a file written in place (not appended): read once to checksum it."""
    crcs, size = [], path.stat().st_size
    buffer = memoryview(bytearray(1 << 20))  # one 1 MiB buffer, reused: the memory of a read
    with path.open("rb") as f:
        for start in range(0, size, BLOCK_BYTES):
            crc, left = 0, min(BLOCK_BYTES, size - start)
            while left:
                read = f.readinto(buffer[: min(left, len(buffer))])
                if not read:
                    raise EOFError(f"{path} ended while it was checksummed")
                crc, left = zlib.crc32(buffer[:read], crc), left - read
            crcs.append(crc)
    return {"dtype": dtype, "shape": shape, "bytes": size, "crc32": crcs}


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
    per_node = num_features * DTYPES[feature_dtype].itemsize + 8 + len(_SPLITS) + 8  # x y m colptr
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
            for key in _SPLITS:
                w[key].write(data[key][a:b])
            finite = finite and bool(torch.isfinite(data.x[a:b]).all())
            disjoint = disjoint and not bool((sum(data[k][a:b].long() for k in _SPLITS) > 1).any())
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


# --- reading -------------------------------------------------------------------------------

# The in-place ops that Python spells as operators (``t += 1``, ``t[i] = v``); the others end
# in one underscore (``add_``, ``copy_``).
_WRITES = {f"__{op}__" for op in ("setitem", "iadd", "isub", "imul", "itruediv", "ifloordiv")}
_WRITES |= {f"__{op}__" for op in ("imod", "ipow", "iand", "ior", "ixor", "ilshift", "irshift")}


class MappedTensor(Tensor):
    """A prepared file's tensor, mapped read-only: a write is an error, and it pickles as its file.

    The pages are mapped ``ACCESS_READ``: a write into them killed the process (a segmentation
    fault). An in-place op on it or on a view of it raises :class:`PreparedGraphError` instead;
    ops that read it return plain tensors, views stay mapped tensors. Pickled (a loader worker or
    a DDP rank started with ``spawn``, ``torch.save``), it is its file's path and place, mapped
    again where it is unpickled: no copy of the file's contents travels, and processes on one
    machine share the page cache's one copy. (An op's cost: one Python call, microseconds.)
    """

    _file: tuple[str, int, str, tuple[int, ...], bool]  # path, offset, dtype, shape, random

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: Any = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        write = name in _WRITES or (name.endswith("_") and not name.endswith("__"))
        for target in (args[0] if write and args else None, kwargs.get("out")):
            if isinstance(target, MappedTensor):
                raise PreparedGraphError(
                    f"{name}: a tensor of a prepared graph ({target._file[0]}) is read-only; "
                    "write into a copy (.clone()) or prepare a new folder"
                )
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        source = args[0] if args and isinstance(args[0], MappedTensor) else None
        if (
            source is not None
            and type(out) is Tensor
            and out.numel()
            and out.untyped_storage().data_ptr() == source.untyped_storage().data_ptr()
        ):  # a view of the file: read-only too, pickled as a copy (its own bytes only)
            out = out.as_subclass(MappedTensor)
            out._file = source._file
        return out

    def __reduce_ex__(self, protocol: Any) -> Any:
        with torch._C.DisableTorchFunctionSubclass():
            whole = tuple(self.shape) == self._file[3] and self.storage_offset() == 0
            if not whole:  # a view: its own values, copied
                return Tensor.__reduce_ex__(self.clone(), protocol)
        return _mapped, self._file


def _mapped(
    path: str, offset: int, dtype: str, shape: tuple[int, ...], random: bool
) -> MappedTensor:
    """A file's tensor, mapped read-only (``PreparedGraph.tensor``; unpickling one)."""
    torch_dtype = DTYPES[dtype]
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if random:
        mapped.madvise(mmap.MADV_RANDOM)
    # numpy has no bfloat16: read 2-byte floats as integers and view them as torch's dtype.
    half = torch_dtype.itemsize == 2 and torch_dtype.is_floating_point
    np_dtype = np.dtype(np.uint16) if half else torch.empty(0, dtype=torch_dtype).numpy().dtype
    array = np.frombuffer(mapped, dtype=np_dtype, count=math.prod(shape), offset=offset)
    with warnings.catch_warnings():  # read-only on purpose: see MappedTensor
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensor = torch.from_numpy(array.reshape(shape)).view(torch_dtype).as_subclass(MappedTensor)
    tensor._file = (path, offset, dtype, tuple(shape), random)
    return tensor


@dataclass
class PreparedGraph:
    """A prepared folder, checked against its manifest, its files mapped read-only.

    Args:
        folder: The folder ``gnnscale prepare`` wrote.
        verify: ``full`` checks every block's CRC-32 (one read of every file, once per process;
            about a second per GiB from the page cache); ``size`` only the files' sizes.
        read_threads: Threads that gather a batch's rows at once (:mod:`gnnscale.stores.reads`);
            ``None``: 32 where the files are larger than the page cache can keep (read from
            disk), 1 (one mapped gather) where it keeps them.
    """

    folder: Path
    verify: Literal["full", "size"] = "full"
    read_threads: int | None = None

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        self.manifest = self.read_manifest(self.folder)
        for name, entry in self.manifest["files"].items():
            self._check(name, entry)
        for name in self.manifest["files"]:
            if name == "colptr" or name.endswith("/colptr"):
                self._check_colptr(name)

    @staticmethod
    def read_manifest(folder: Path) -> dict[str, Any]:
        """The folder's manifest, or an error saying why there is none."""
        command = f"gnnscale prepare --out {folder}"
        return atomic.read_manifest(folder, FORMAT, "prepared graph", command, PreparedGraphError)

    def path(self, name: str) -> Path:
        """Where file ``name`` lies: in the folder, or where an input file was used in place."""
        entry = self.manifest["files"][name]
        return Path(entry["path"]) if "path" in entry else self.folder / f"{name}.bin"

    def _check(self, name: str, entry: dict[str, Any]) -> None:
        path = self.path(name)
        if not path.is_file():
            raise PreparedGraphError(f"{path} is missing; prepare the graph again")
        size = path.stat().st_size
        if "path" in entry:  # an input used in place: its data from offset to the end, unchanged
            if (
                size != entry["offset"] + entry["bytes"]
                or path.stat().st_mtime_ns != entry["mtime_ns"]
            ):
                raise PreparedGraphError(
                    f"{path} changed since {self.folder} was prepared from it; prepare the "
                    "graph again"
                )
            return
        if size != entry["bytes"]:
            raise PreparedGraphError(
                f"{path} has {size:,} bytes where the manifest says {entry['bytes']:,} "
                "(truncated or overwritten); prepare the graph again"
            )
        if self.verify == "size" or size == 0:
            return
        block = self.manifest["block_bytes"]
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                for i, expected in enumerate(entry["crc32"]):
                    if zlib.crc32(view[i * block : (i + 1) * block]) != expected:
                        raise PreparedGraphError(
                            f"{path} is corrupted: bytes {i * block:,} to "
                            f"{min((i + 1) * block, size):,} do not match their checksum; "
                            "prepare the graph again"
                        )
            finally:
                view.release()

    def _check_colptr(self, name: str) -> None:
        """Range-check a CSC's ``colptr``, whatever ``verify`` says.

        It must start at 0, end at the count of ``row`` and never decrease. PyG's samplers
        trust it: past ``row``'s
        end they crashed the process (a segmentation fault), and a decreasing entry trained on
        wrong neighbours without a word. One sequential read, 8 bytes a node (under a second
        per 100M nodes from the page cache). ``row``'s ids are checked by ``verify: full``'s
        checksums, and in every batch by :meth:`check_ids`, not here: a read of every edge.
        """
        files, path = self.manifest["files"], self.path(name)
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

    def check_ids(self, node: Tensor, node_type: str | None = None, given: bool = False) -> None:
        """Refuse a sampled batch's node ids outside ``0..count - 1`` (a damaged ``row``).

        ``verify: size`` reads no ``row`` id, and PyG's samplers and gathers trust them; an id
        past the node count failed as an ``IndexError`` from the feature gather. One pass over
        the batch's ids: about 50 us for 170k ids beside their gather's 65 ms (128 float32
        features, from the page cache) here. It sees an id once the sampler has returned it,
        so an id far out of range that the sampler itself expands (one sampled before the last
        hop) can still crash PyG's sampler first; ``verify: full`` finds every damaged block.

        Args:
            node: The batch's node ids (of ``node_type``, in a heterogeneous graph).
            node_type: Their node type; ``None`` in a homogeneous graph.
            given: The ids were given to a store by its caller (an ``IndexError`` names them
                as theirs), not drawn by gnnscale's sampler.
        """
        if not node.numel():
            return
        low, high = (int(v) for v in torch.aminmax(node))
        counts = self.manifest["num_nodes"]
        count = int(counts if node_type is None else counts[node_type])
        if 0 <= low and high < count:
            return
        files = self.manifest["files"]
        rows = [  # the edge types whose sources are of this node type
            str(self.path(name))
            for name in files
            if name == "row" or (name.endswith("/row") and name.split("__")[0] == node_type)
        ]
        kind = "" if node_type is None else f" of type {node_type!r}"
        node_id, files = f"{low if low < 0 else high:,}{kind}", " or ".join(rows)
        if given:
            raise IndexError(
                f"an index given to the store holds node {node_id}, outside 0..{count - 1:,} (the "
                f"node count): pass node ids below the count (if a sampler drew it, {files} "
                "holds a damaged neighbour id: prepare the graph again, or open it with verify: "
                "full to find the damaged block)"
            )
        raise PreparedGraphError(
            f"a sampled batch holds node {node_id}, outside 0..{count - 1:,} (the node count): "
            f"{files} holds a damaged neighbour id; prepare the graph again, or open it with "
            "verify: full to find the damaged block"
        )

    def tensor(self, name: str) -> Tensor:
        """One file as a read-only memory-mapped tensor.

        Mapped shared and read-only (``mmap``, ``ACCESS_READ``), not with ``torch.from_file``:
        its private, writable mapping is charged against the kernel's overcommit limit, which
        refuses a file larger than memory. An in-place write to the tensor is a fault, never a
        silent private copy. When the files a sampler reads at random rows (all but the masks)
        are larger than half the machine's memory, so that the page cache cannot keep them, they
        are advised ``MADV_RANDOM``: the kernel's readahead would read 128 KiB around each
        256-byte feature row it faults in; without it, cold gathers from the papers100M-sized
        graph's features ran 25-40 times faster here (``benchmarks/on_disk_large.py``). A graph
        that fits keeps the readahead, which fills the cache sooner and maps pages 16 at a time:
        with ``MADV_RANDOM`` the recipe's 375 MiB graph trained 1.22x slower than in memory
        (``figures.py ondisk``).
        """
        entry = self.manifest["files"][name]
        if math.prod(entry["shape"]) == 0:
            return torch.empty(entry["shape"], dtype=DTYPES[entry["dtype"]])
        random = not name.endswith("_mask") and self._larger_than_cache
        path, offset = str(self.path(name)), entry.get("offset", 0)
        return _mapped(path, offset, entry["dtype"], tuple(entry["shape"]), random)

    @cached_property
    def _larger_than_cache(self) -> bool:
        """Whether the randomly read files exceed half the machine's memory."""
        files = self.manifest["files"]
        size = sum(
            math.prod(f["shape"]) * DTYPES[f["dtype"]].itemsize
            for name, f in files.items()
            if not name.endswith("_mask")
        )
        return size > psutil.virtual_memory().total / 2

    @cached_property
    def threads(self) -> int:
        """Threads that gather a batch's rows at once: ``read_threads``, or as it says."""
        if self.read_threads is not None:
            return self.read_threads
        return READ_THREADS if self._larger_than_cache else 1

    def gather(self, tensor: Tensor, index: Tensor) -> Tensor:
        """``tensor[index]`` (rows of one of its files), read by :attr:`threads` threads."""
        return reads.gather(tensor, index, self.threads)

    def read_rows(self, name: str, ids: Tensor, chunk_bytes: int = 64 << 20) -> Tensor:
        """Rows ``ids`` (sorted, unique) of file ``name``, read in one pass from start to end.

        Sequential reads, each chunk's pages dropped from the page cache once copied where the
        graph is larger than the cache (they would push out the pages training reads). For a
        few percent of the rows or more, a pass is faster than a random read of each: with
        256-byte rows nearly every page holds one (here 0.6 GB/s against 85k random rows/s).
        """
        tensor = self.tensor(name)
        count, row_bytes = tensor.size(0), tensor[:1].nbytes
        out = tensor.new_empty((ids.numel(), *tensor.shape[1:]))
        flat = out.view(torch.uint8).view(ids.numel(), row_bytes)
        per_chunk = max(1, chunk_bytes // row_bytes)
        bounds = torch.searchsorted(ids, torch.arange(0, count + per_chunk, per_chunk)).tolist()
        buffer = bytearray(per_chunk * row_bytes)
        offset = self.manifest["files"][name].get("offset", 0)
        with self.path(name).open("rb", buffering=0) as f:
            for first, (a, b) in zip(range(0, count, per_chunk), pairwise(bounds), strict=False):
                if a == b:
                    continue
                size = min(per_chunk, count - first) * row_bytes
                f.seek(offset + first * row_bytes)
                if f.readinto(memoryview(buffer)[:size]) != size:
                    raise PreparedGraphError(f"{self.path(name)} ended early; prepare it again")
                chunk = torch.frombuffer(buffer, dtype=torch.uint8, count=size)
                flat[a:b] = chunk.view(-1, row_bytes)[ids[a:b] - first]
                if self._larger_than_cache:
                    os.posix_fadvise(
                        f.fileno(), offset + first * row_bytes, size, os.POSIX_FADV_DONTNEED
                    )
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of all its files."""
        return sum(int(entry["bytes"]) for entry in self.manifest["files"].values())

    @property
    def num_classes(self) -> int:
        """Classes, as counted when the graph was prepared."""
        return int(self.manifest["num_classes"])

    @cached_property
    def data(self) -> Data:
        """Features, labels and masks as mapped tensors; ``edge_index`` left empty (see csc)."""
        n = int(self.manifest["num_nodes"])
        tensors = {name: self.tensor(name) for name in NODE_FILES}
        return Data(**tensors, edge_index=torch.empty(2, 0, dtype=torch.long), num_nodes=n)

    @cached_property
    def csc(self) -> tuple[Tensor, Tensor]:
        """``colptr`` and ``row``: every node's in-neighbours, as PyG's samplers read them."""
        return self.tensor("colptr"), self.tensor("row")
