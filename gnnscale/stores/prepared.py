"""A prepared folder opened: checked against its manifest, then memory-mapped by every process.

:class:`PreparedGraph` checks a folder against its manifest (sizes, then every block's checksum,
as ``gnnscale.stores.manifest`` describes them) and maps the files shared and read-only. The
tensors it returns live in the page cache, not in the process: a batch gathers its rows from the
mapped feature file, the sampler walks the mapped CSC, and processes that open the same folder
(DDP ranks under ``torchrun``, on one machine or on several that share the storage) share those
pages instead of each holding a copy. Nothing is read into private memory but the batches and the
training split's node ids.

Reading is apart from writing (``gnnscale.stores.writing``): how files are mapped, advised and
gathered changes with the machines a graph is trained on, not with how it was written.
"""

from __future__ import annotations

import math
import mmap
import os
import warnings
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

import numpy as np
import psutil
import torch
from torch import Tensor
from torch_geometric.data import Data

from gnnscale._compat import disable_torch_function_subclass
from gnnscale.stores import reads
from gnnscale.stores.manifest import (
    DTYPES,
    NODE_FILES,
    Manifest,
    PreparedGraphError,
    check_colptr,
    check_file,
)

__all__ = ["PreparedGraph", "map_file"]

# Reads in flight when a graph is read from disk: cold random rows here, 32 threads 85k/s, 64
# 92k/s, against the disk's 72-80k/s at queue depth 32 (gnnscale.stores.reads).
READ_THREADS = 32

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
        with disable_torch_function_subclass():
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
        with disable_torch_function_subclass():
            whole = tuple(self.shape) == self._file[3] and self.storage_offset() == 0
            if not whole:  # a view: its own values, copied
                return Tensor.__reduce_ex__(self.clone(), protocol)
        return map_file, self._file


def map_file(
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
        self.manifest = Manifest.read(self.folder)
        for name in self.manifest.files:
            check_file(self.manifest, name, self.path(name), self.verify, self.folder)
        for name in self.manifest.files:
            if name == "colptr" or name.endswith("/colptr"):
                check_colptr(self.manifest, name, self.path(name))

    def path(self, name: str) -> Path:
        """Where file ``name`` lies: in the folder, or where an input file was used in place.

        Nothing else: a manifest naming a file outside the folder that is not one of the inputs
        it records having been prepared from (an edited or damaged manifest) is refused.
        """
        entry = self.manifest.files[name]
        if entry.path is None:
            path = self.folder / f"{name}.bin"
            if self.folder.resolve() in path.resolve().parents:
                return path
        else:
            path = Path(entry.path)
            if path.resolve() in self._inputs:
                return path
        raise PreparedGraphError(
            f"the manifest of {self.folder} names {path} for its file {name!r}, outside the "
            "folder and not an input it was prepared from; prepare the graph again"
        )

    @cached_property
    def _inputs(self) -> set[Path]:
        """The input files the manifest records having been prepared from (used in place)."""
        source = self.manifest.source or {}
        root = source.get("root") or source.get("npy")
        if not isinstance(root, str):
            return set()
        return {(Path(root) / rel).resolve() for rel in source.get("inputs", {})}

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
        count = self.manifest.node_count(node_type)
        if 0 <= low and high < count:
            return
        rows = [  # the edge types whose sources are of this node type
            str(self.path(name))
            for name in self.manifest.files
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
        (``figures.py on_disk``).
        """
        entry = self.manifest.files[name]
        if math.prod(entry.shape) == 0:
            return torch.empty(entry.shape, dtype=DTYPES[entry.dtype])
        random = not name.endswith("_mask") and self._larger_than_cache
        return map_file(str(self.path(name)), entry.offset, entry.dtype, entry.shape, random)

    @cached_property
    def _larger_than_cache(self) -> bool:
        """Whether the randomly read files exceed half the machine's memory."""
        size = sum(
            math.prod(f.shape) * DTYPES[f.dtype].itemsize
            for name, f in self.manifest.files.items()
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
        offset = self.manifest.files[name].offset
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
        return sum(entry.bytes for entry in self.manifest.files.values())

    @property
    def num_classes(self) -> int:
        """Classes, as counted when the graph was prepared."""
        return self.manifest.class_count()

    @cached_property
    def data(self) -> Data:
        """Features, labels and masks as mapped tensors; ``edge_index`` left empty (see csc)."""
        n = self.manifest.node_count()
        tensors = {name: self.tensor(name) for name in NODE_FILES}
        return Data(**tensors, edge_index=torch.empty(2, 0, dtype=torch.long), num_nodes=n)

    @cached_property
    def csc(self) -> tuple[Tensor, Tensor]:
        """``colptr`` and ``row``: every node's in-neighbours, as PyG's samplers read them."""
        return self.tensor("colptr"), self.tensor("row")
