"""Datasets of many small graphs (molecules, crystals) on disk, read one graph at a time.

Atom-level models train on millions of small graphs. Held in memory (a list of ``Data``, or
PyG's ``InMemoryDataset``) the dataset is copied into every DDP process, and DataLoader workers
that index Python objects grow every epoch (reference counts touch copy-on-write pages). Here
the graphs are written once to a key-value store and each process reads the graphs of its
batches, nothing more:

- :func:`write_graphs` (``gnnscale prepare-graphs``) writes any sequence or iterable of
  ``Data`` (an in-memory PyG dataset, a generator) in chunks, each one committed transaction,
  under a partial folder that is renamed into place when complete (:mod:`gnnscale.stores.atomic`).
  A killed prepare resumes from its last committed chunk.
- Two stores, one record format (:func:`encode`: the graph's tensors as raw bytes, integer
  tensors narrowed, behind a CRC-32): ``lmdb`` (the ``lmdb`` package) and ``sqlite`` (PyG's
  ``SQLiteDatabase``, the backend of ``OnDiskDataset``). Both are opened lazily, once per
  process, after the DataLoader's fork.
- :class:`GraphDataModule` splits the graphs, batches them with PyG's ``Batch`` and, under
  DDP, shards every epoch's batches: every graph is trained once per epoch across ranks; the
  copies that even out the ranks' batch counts weigh 0.
- :class:`AtomGraphs` generates atom-like graphs offline: typed 3-D point clouds, radius-graph
  edges with their lengths, and an energy (a sum of pair potentials over the edges) that a model
  which ignores the edges cannot predict.
"""

from __future__ import annotations

import json
import logging
import math
import os
import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset
from torch_geometric.data import Data
from tqdm import tqdm

from gnnscale.errors import ConfigError
from gnnscale.stores import atomic
from gnnscale.stores.graph_db_manifest import (
    BACKENDS,
    Backend,
    GraphStoreError,
    StoreManifest,
)

log = logging.getLogger(__name__)

SOURCE = "source.json"  # written first into a partial folder: what it is being filled from
_FILES = {"lmdb": "data.mdb", "sqlite": "graphs.sqlite"}
_TABLE = "graphs"
_LMDB_MAP_SIZE = 1 << 40  # address space only: the file grows with what is written
_SAMPLE = 256  # graphs encoded to estimate the size of a store
# File bytes per encoded byte (LMDB's pages, SQLite's rows): 1.33 to 1.43 measured on the
# generated atom graphs, both backends.
_OVERHEAD = 1.45


# --- one graph <-> bytes ------------------------------------------------------------------

_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
)
_CODE = {dtype: i for i, dtype in enumerate(_DTYPES)}
_NARROW = (torch.int8, torch.int16, torch.int32)


def _narrowed(t: Tensor) -> Tensor:
    """An integer tensor in the smallest signed type that holds its values (indices: 1-2 bytes)."""
    if t.dtype not in (torch.int64, torch.int32, torch.int16) or t.numel() == 0:
        return t
    lo, hi = int(t.min()), int(t.max())
    for dtype in _NARROW:
        info = torch.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return t.to(dtype) if dtype != t.dtype else t
    return t


def encode(data: Data) -> bytes:
    """One graph as bytes: a CRC-32, then each tensor's key, dtype, shape and raw values.

    Integer tensors are stored in the smallest type that holds them and restored to their own
    dtype, so :func:`decode` returns the same tensors bit for bit. Only tensors are stored.

    Args:
        data: A graph whose attributes are all tensors.
    """
    parts = [struct.pack("<H", len(data.keys()))]
    for key in sorted(data.keys()):
        t = data[key]
        if not isinstance(t, Tensor) or t.dtype not in _CODE:
            raise ConfigError(
                f"graph attribute {key!r} is a {type(t).__name__} "
                f"({getattr(t, 'dtype', '')}); gnnscale stores tensors of "
                f"{', '.join(str(d).removeprefix('torch.') for d in _DTYPES)}: drop or convert "
                "it (a transform) before writing"
            )
        t = t.detach().cpu().contiguous()
        stored = _narrowed(t)
        name = key.encode()
        parts.append(
            struct.pack(
                f"<B{len(name)}sBBB{t.dim()}q",
                len(name),
                name,
                _CODE[t.dtype],
                _CODE[stored.dtype],
                t.dim(),
                *t.shape,
            )
        )
        raw = stored.view(torch.int16) if stored.dtype == torch.bfloat16 else stored
        parts.append(raw.numpy().tobytes())
    payload = b"".join(parts)
    return struct.pack("<I", zlib.crc32(payload)) + payload


_NUMPY = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.float16: np.float16,
    torch.bfloat16: np.int16,  # numpy has no bfloat16: its bits, viewed back below
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
}


def decode(record: bytes | memoryview, where: str = "record") -> Data:
    """The graph :func:`encode` wrote; a record that fails its CRC-32 raises GraphStoreError.

    Args:
        record: The bytes of one record.
        where: Named in the error (store and index).
    """
    buf = memoryview(record)
    if len(buf) < 6 or struct.unpack_from("<I", buf)[0] != zlib.crc32(buf[4:]):
        raise GraphStoreError(
            f"{where} fails its CRC-32 check: the store is damaged; prepare it again "
            "(gnnscale prepare-graphs)"
        )
    (count,) = struct.unpack_from("<H", buf, 4)
    pos, out = 6, {}
    for _ in range(count):
        (length,) = struct.unpack_from("<B", buf, pos)
        key = bytes(buf[pos + 1 : pos + 1 + length]).decode()
        pos += 1 + length
        code, stored_code, ndim = struct.unpack_from("<BBB", buf, pos)
        shape = struct.unpack_from(f"<{ndim}q", buf, pos + 3)
        pos += 3 + 8 * ndim
        dtype, stored = _DTYPES[code], _DTYPES[stored_code]
        n = math.prod(shape)
        arr: np.ndarray = np.frombuffer(buf, dtype=_NUMPY[stored], count=n, offset=pos)
        pos += arr.nbytes
        t = torch.from_numpy(arr.copy()).view(shape)  # a copy: the buffer is the store's
        if stored == torch.bfloat16:
            t = t.view(torch.bfloat16)
        out[key] = t.to(dtype) if stored != dtype else t
    return Data(**out)


# --- the two stores ------------------------------------------------------------------------


def _key(i: int) -> bytes:
    return i.to_bytes(8, "big")  # big-endian: LMDB's byte order is index order, appends are cheap


class _Writer:
    """Appends records to a store, one committed transaction per chunk."""

    def __init__(self, folder: Path, backend: Backend) -> None:
        self.backend = backend
        path = folder / _FILES[backend]
        if backend == "lmdb":
            import lmdb

            self.env = lmdb.open(
                str(path), subdir=False, map_size=_LMDB_MAP_SIZE, readahead=False, lock=False
            )
        else:
            from torch_geometric.data import SQLiteDatabase

            self.db = SQLiteDatabase(str(path), _TABLE, {"record": {"dtype": torch.uint8}})

    def __len__(self) -> int:
        """Records committed: chunks are written in order, each in one transaction."""
        if self.backend == "lmdb":
            return int(self.env.stat()["entries"])
        return len(self.db)

    def append(self, start: int, records: list[bytes]) -> None:
        if self.backend == "lmdb":
            with self.env.begin(write=True) as txn:
                items = [(_key(start + k), r) for k, r in enumerate(records)]
                txn.cursor().putmulti(items, append=True)
            return
        rows = [{"record": torch.frombuffer(bytearray(r), dtype=torch.uint8)} for r in records]
        self.db.multi_insert(range(start, start + len(records)), rows)

    def first(self) -> Data:
        """Graph 0, read back: the manifest's schema."""
        if self.backend == "lmdb":
            with self.env.begin() as txn:
                return decode(txn.get(_key(0), b""))
        row = self.db.get(0)
        return decode(row["record"].numpy().tobytes())

    def close(self) -> None:
        if self.backend == "lmdb":
            self.env.sync(True)
            self.env.close()
        else:
            self.db.close()


class GraphStore(Dataset):
    """A prepared store of graphs: ``store[i]`` reads and decodes graph ``i`` from disk.

    Nothing is read at construction but the manifest; the database is opened on first access
    in each process (after a DataLoader forks its workers, which must not share the parent's
    LMDB environment or SQLite connection), read-only.

    Args:
        folder: The folder ``gnnscale prepare-graphs`` wrote.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.manifest = StoreManifest.read(self.folder)
        self.backend: Backend = self.manifest.backend
        self.path = self.folder / _FILES[self.backend]
        size = self.path.stat().st_size if self.path.is_file() else -1
        if size != self.manifest.file_bytes:
            raise GraphStoreError(
                f"{self.path} has {size} bytes, its manifest says {self.manifest.file_bytes}: the "
                "store is truncated or was changed; prepare it again (gnnscale prepare-graphs)"
            )
        self._db: Any = None
        self._pid = -1

    def __len__(self) -> int:
        return self.manifest.num_graphs

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_db": None, "_pid": -1}  # spawned workers open their own

    def _open(self) -> Any:
        # A forked worker inherits the parent's handle: LMDB and SQLite forbid using it there,
        # so each process opens its own (the parent's is left alone, not closed, in the child).
        if self._db is not None and self._pid == os.getpid():
            return self._db
        if self.backend == "lmdb":
            env = _lmdb_env(self.path)
            self._db = env.begin(buffers=True)  # one long read transaction: no lock, no copy
        else:
            import sqlite3

            uri = f"file:{self.path}?mode=ro&immutable=1"
            self._db = sqlite3.connect(uri, uri=True, check_same_thread=False)
        self._pid = os.getpid()
        return self._db

    def record(self, i: int) -> bytes | memoryview:
        """The raw bytes of graph ``i``."""
        if not 0 <= i < len(self):
            raise IndexError(f"graph {i} of {len(self)}")
        db = self._open()
        try:
            if self.backend == "lmdb":
                value = db.get(_key(i))
            else:
                row = db.execute(f"SELECT COL_record FROM {_TABLE} WHERE id = ?", (i,)).fetchone()
                value = None if row is None else row[0]
        except Exception as err:  # lmdb.Error, sqlite3.DatabaseError: damaged pages
            raise GraphStoreError(
                f"{self.path}: reading graph {i} failed ({err}); the store is damaged, prepare "
                "it again (gnnscale prepare-graphs)"
            ) from None
        if value is None:
            raise GraphStoreError(
                f"{self.path} has no graph {i} though its manifest counts {len(self)}: the store "
                "is damaged; prepare it again (gnnscale prepare-graphs)"
            )
        return value

    def __getitem__(self, i: int) -> Data:
        return decode(self.record(int(i)), f"{self.path} graph {i}")


# LMDB allows one environment per file and process: stores of the same file share it. Keyed by
# the file's identity too, so a store written again under the same name is opened afresh, and by
# the process, so a forked worker opens its own.
_ENVS: dict[tuple[str, int, int, int], Any] = {}


def _lmdb_env(path: Path) -> Any:
    import lmdb

    stat = path.stat()
    key = (str(path.resolve()), stat.st_ino, stat.st_mtime_ns, os.getpid())
    for inherited in [k for k in _ENVS if k[0] == key[0] and k[3] != key[3]]:
        # Opened by the parent before a fork: py-lmdb refuses a second environment of the file
        # in the child until this copy of the parent's is closed (its own mapping and file).
        _ENVS.pop(inherited).close()
    if key not in _ENVS:
        try:
            _ENVS[key] = lmdb.open(
                str(path), subdir=False, readonly=True, lock=False, readahead=False, meminit=False
            )
        except lmdb.Error as err:
            raise GraphStoreError(
                f"{path} cannot be opened by LMDB ({err}): the store is damaged; prepare it again"
            ) from None
    return _ENVS[key]


# --- writing -------------------------------------------------------------------------------


def _estimated_bytes(graphs: Sequence[Data] | Dataset, num_graphs: int) -> int:
    """About the bytes of a store of ``num_graphs`` of ``graphs``: a spread sample encoded."""
    available = min(num_graphs, len(graphs))  # type: ignore[arg-type]
    if available == 0:
        return 0
    picks = np.unique(np.linspace(0, available - 1, min(available, _SAMPLE)).round())
    sampled = sum(len(encode(graphs[int(i)])) for i in picks)
    return int(sampled / len(picks) * num_graphs * _OVERHEAD)


def write_graphs(
    graphs: Sequence[Data] | Dataset | Iterable[Data],
    out: Path,
    source: dict[str, Any],
    backend: Backend = "lmdb",
    num_graphs: int | None = None,
    chunk_graphs: int = 10_000,
    num_classes: int = 0,
    progress: bool = True,
) -> Path:
    """Write graphs to a store at ``out``: in chunks, atomically, resumable if killed.

    Chunks are committed one transaction each into ``.<out>.partial-<pid>``; a prepare killed
    part way leaves that folder, and the next call with the same ``source`` and ``backend``
    continues after its last committed chunk (other settings start it again). When every graph is
    written, the manifest (count, schema, file size, a checksum) is written and the folder renamed
    to ``out``: a store either is complete or does not exist under its name. A second prepare of
    ``out`` is refused while one runs, and so is one whose disk has less free space than the
    store's estimated size (``graphs`` a sequence: a sample encoded) with a margin.

    Args:
        graphs: A sequence (read by index, so a resumed prepare skips without reading) or an
            iterable (a resumed prepare draws and drops what was written).
        out: Folder to create.
        source: What the graphs are, as JSON (kept in the manifest; part of the resume key).
        backend: ``lmdb`` or ``sqlite``.
        num_graphs: How many to write (default: ``len(graphs)``).
        chunk_graphs: Graphs per committed transaction.
        num_classes: Classes of an integer graph label ``y`` (0: ``y`` is a regression target).
        progress: Show a progress bar.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"--backend {backend!r} is not known; choose one of {BACKENDS}")
    if chunk_graphs < 1:
        raise ConfigError(f"--chunk_graphs must be >= 1 (got {chunk_graphs})")
    if num_graphs is None:
        if not isinstance(graphs, Sequence | Dataset):
            raise ConfigError("write_graphs needs num_graphs for an iterable without len()")
        num_graphs = len(graphs)  # type: ignore[arg-type]
    out = Path(out)
    meta = {"source": source, "backend": backend, "num_graphs": num_graphs}
    if out.exists():
        if out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        else:
            manifest = StoreManifest.read(out)
            recorded = manifest.to_json()
            if {k: recorded[k] for k in meta} != meta:
                raise GraphStoreError(
                    f"{out} holds graphs prepared from other settings ({manifest.source}"
                    f", {manifest.backend}); remove it or choose another --out"
                )
            log.info("%s is already prepared from these settings", out)
            return out
    if isinstance(graphs, Sequence | Dataset):  # an iterable cannot be sampled before it is drawn
        # A killed prepare's partial folder is continued or removed: its bytes are not needed again.
        partial = sum(
            f.stat().st_size for p in atomic.leftovers(out) for f in p.rglob("*") if f.is_file()
        )
        need = _estimated_bytes(graphs, num_graphs) - partial
        atomic.check_room(out, need, "the graph store", GraphStoreError)

    def resumable(partial: Path) -> bool:
        previous = partial / SOURCE
        if previous.is_file() and json.loads(previous.read_text()) == meta:
            return True
        log.warning("%s: a partial prepare from other settings; starting again", partial)
        return False

    with atomic.locked(out), atomic.writing(out, resume=resumable) as tmp:
        (tmp / SOURCE).write_text(json.dumps(meta))
        writer = _Writer(tmp, backend)
        try:
            done = len(writer)
            if done:
                log.info("%s: resuming a killed prepare after %d committed graphs", out, done)
            if isinstance(graphs, Sequence | Dataset):
                items: Iterator[Data] = (graphs[i] for i in range(done, num_graphs))
            else:
                items = islice(iter(graphs), done, num_graphs)
            bar = tqdm(
                total=num_graphs,
                initial=done,
                desc=f"prepare {out.name}",
                unit="graph",
                mininterval=2,
                disable=not progress,
            )
            with bar:
                while done < num_graphs:
                    chunk = list(islice(items, min(chunk_graphs, num_graphs - done)))
                    if not chunk:
                        raise ConfigError(f"the graphs ran out after {done} of {num_graphs}")
                    writer.append(done, [encode(g) for g in chunk])
                    done += len(chunk)
                    bar.update(len(chunk))
            sample = writer.first() if num_graphs else Data()
        finally:
            writer.close()
        (tmp / SOURCE).unlink()
        path = tmp / _FILES[backend]
        manifest = StoreManifest(
            source=source,
            backend=backend,
            num_graphs=num_graphs,
            schema={k: str(v.dtype).removeprefix("torch.") for k, v in sample.items()},
            num_features=int(sample.x.size(-1)) if sample.get("x") is not None else 0,
            num_edge_features=(
                math.prod(sample.edge_attr.shape[1:])  # a first graph may have no edge
                if sample.get("edge_attr") is not None
                else 0
            ),
            num_classes=num_classes,
            file_name=path.name,
            file_bytes=path.stat().st_size,
            file_crc32=atomic.crc32(path),
        )
        atomic.commit(tmp, out, manifest.to_json())
    return out


def verify(folder: Path) -> None:
    """Check a store end to end: its file's CRC-32, then every record's; raise if damaged."""
    store = GraphStore(folder)
    if atomic.crc32(store.path) != store.manifest.file_crc32:
        raise GraphStoreError(f"{store.path} fails its CRC-32 check: prepare it again")
    for i in range(len(store)):
        store[i]
