"""OGB's node-property downloads, read as they unpack and prepared by streaming.

``--source.root DIR`` holds ``DIR/ogbn_<name>/``, the folder OGB's own loader (and
``--data.dataset``) reads: OGB's zip unpacked into DIR, its folder renamed ``ogbn_<name>``. The
files, read as OGB's reader (``ogb.io.read_graph_raw``) reads them, are listed in docs/stores.md:
headerless ``raw/*.csv.gz`` for ogbn-arxiv and ogbn-products, ``raw/data.npz`` and
``raw/node-label.npz`` for ogbn-papers100M, a ``raw/relations/<src>___<rel>___<dst>/`` tree for
ogbn-mag; the splits in ``split/<scheme>/``. Edges are stored as the files list them, but for
ogbn-products, whose file lists each undirected edge once: OGB's loader follows each edge with
its reverse (``add_inverse_edge`` in its ``master.csv``), and so does this reader. OGB's
``valid`` split is gnnscale's ``val``; papers100M's NaN labels (unlabelled nodes) become -1.

CSVs are parsed a block at a time (pyarrow, over a gzip stream); an ``.npz`` member is read as a
stream (deflated) or mapped where it lies (stored), so no step holds a whole array.
"""

from __future__ import annotations

import csv
import gzip
import struct
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npy_format

from gnnscale.stores.manifest import PreparedGraphError
from gnnscale.stores.streaming import Array, Edges, NodeInputs, write

__all__ = ["OGB", "prepare_ogb", "read_ogb"]

OGB = {  # name: (the folder its zip unpacks to, its split, its layout)
    "ogbn-arxiv": ("arxiv", "time", "csv"),
    "ogbn-products": ("products", "sales_ranking", "csv"),
    "ogbn-papers100M": ("papers100M-bin", "time", "npz"),
    "ogbn-mag": ("mag", "time", "mag"),
}
INVERSE = {"ogbn-products"}  # OGB's loader adds each edge's reverse (master.csv)
SPLITS = {"train": "train", "val": "valid", "test": "test"}  # gnnscale's: OGB's file


def _need(path: Path) -> Path:
    if not path.is_file():
        raise PreparedGraphError(
            f"{path} is missing; unpack OGB's zip of the dataset again (docs/stores.md)"
        )
    return path


def _damaged(path: Path | str, err: Any) -> PreparedGraphError:
    return PreparedGraphError(
        f"{path} cannot be read ({err}); the download is damaged: unpack OGB's zip again"
    )


def _system(err: BaseException) -> bool:
    """Whether an ``OSError`` is the system's (an errno: permissions, an I/O error, no memory).

    Decompression reports damaged bytes as an ``OSError`` without one (gzip's ``BadGzipFile``,
    pyarrow's "zlib inflate failed", "Truncated compressed stream"); only those, parse errors
    (``ArrowInvalid``, ``ValueError``), ``zlib.error`` and ``EOFError`` blame the download.
    Anything else (a system error, a reader thread that could not start, ``MemoryError``)
    says nothing about the file and is raised as it is.
    """
    return isinstance(err, OSError) and err.errno is not None


def _small_csv(path: Path, lines: int = -1) -> list[list[str]]:
    """The rows of a small .csv.gz (counts, type lists), or its first ``lines``."""
    try:
        with gzip.open(_need(path), "rt", newline="") as f:
            reader = csv.reader(f if lines < 0 else [f.readline(1 << 20) for _ in range(lines)])
            return [row for row in reader if row]
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err:
        if _system(err):
            raise
        raise _damaged(path, err) from None


def _count(path: Path) -> int:
    """The one number of ``num-node-list.csv.gz`` / ``num-edge-list.csv.gz``."""
    rows = _small_csv(path)
    if len(rows) != 1 or len(rows[0]) != 1 or not rows[0][0].strip().isdigit():
        raise PreparedGraphError(f"{path} must hold one count (one graph); it holds {rows[:3]}")
    return int(rows[0][0])


def _first_row(path: Path) -> dict[str, str]:
    """A .csv.gz of a header of node types and one row (``num-node-dict``, ``nodetype-has-*``)."""
    rows = _small_csv(path)
    if len(rows) < 2 or len(rows[0]) != len(rows[1]):
        raise PreparedGraphError(f"{path} must hold a header of node types and one row under it")
    return dict(zip(rows[0], rows[1], strict=True))


def _csv_chunks(path: Path, columns: int, dtype: Any, rows: int, width: int) -> Iterator[Any]:
    """Consecutive ``(k, columns)`` arrays (``k <= rows``) of a headerless .csv.gz.

    Parsed a block at a time: about the bytes of ``rows`` rows as ``dtype`` (at least 16 lines
    of ``width`` bytes). Floats are parsed as float64, then rounded, as OGB's reader does.
    """
    try:
        import pyarrow as pa
        import pyarrow.csv as pa_csv
    except ImportError as err:
        raise ImportError(f"{path}: reading OGB's CSVs needs pyarrow: pip install pyarrow") from err

    names = [str(i) for i in range(columns)]
    block = max(rows * columns * np.dtype(dtype).itemsize, 16 * width, 1 << 14)
    read = pa_csv.ReadOptions(column_names=names, block_size=block, use_threads=False)
    kind = pa.int64() if np.dtype(dtype).kind in "iu" else pa.float64()
    convert = pa_csv.ConvertOptions(
        column_types=dict.fromkeys(names, kind), null_values=[], quoted_strings_can_be_null=False
    )
    try:
        with pa.input_stream(str(_need(path)), compression="gzip") as stream:
            for batch in pa_csv.open_csv(stream, read_options=read, convert_options=convert):
                out = np.empty((batch.num_rows, columns), dtype)
                for i in range(columns):
                    out[:, i] = batch.column(i).to_numpy()
                for a in range(0, len(out), rows):
                    yield out[a : a + rows]
    except (pa.ArrowInvalid, OSError) as err:
        if _system(err):
            raise
        raise _damaged(path, err) from None


def _counted(chunks: Iterator[Any], n: int, where: Path, counts: Path) -> Iterator[Any]:
    """``chunks``, refused unless they hold ``n`` rows in all, the count ``counts`` gives."""
    seen = 0
    for chunk in chunks:
        if seen + len(chunk) > n:  # count the rest, to say how many
            seen += len(chunk) + sum(len(c) for c in chunks)
            break
        seen += len(chunk)
        yield chunk
    if seen != n:
        raise PreparedGraphError(
            f"{where} has {seen:,} rows where {counts} gives {n:,}; the files are from different "
            "downloads or damaged: unpack OGB's zip again"
        )


def _csv_array(path: Path, n: int, counts: Path, dtype: Any) -> Array:
    """A per-node .csv.gz (features, labels, a split) of ``n`` rows; one column: a vector."""
    first = ",".join(next(iter(_small_csv(path, 1)), []))
    columns, width = first.count(",") + 1, len(first) + 1

    def chunks(rows: int) -> Iterator[np.ndarray]:
        for chunk in _counted(_csv_chunks(path, columns, dtype, rows, width), n, path, counts):
            yield chunk[:, 0] if columns == 1 else chunk

    return Array(str(path), (n,) if columns == 1 else (n, columns), np.dtype(dtype), chunks)


def _csv_edges(path: Path, counts: Path, inverse: bool) -> Edges:
    """``edge.csv.gz``: a source,destination row per edge (each followed by its reverse)."""
    m, columns = _count(counts), len(next(iter(_small_csv(path, 1)), []))
    if columns != 2:
        raise PreparedGraphError(f"{path} must hold two columns, source,destination")

    def chunks(size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        step = max(size // 2, 1) if inverse else size
        for pair in _counted(_csv_chunks(path, 2, np.int64, step, 24), m, path, counts):
            src, dst = np.ascontiguousarray(pair[:, 0]), np.ascontiguousarray(pair[:, 1])
            if inverse:  # edge i at 2i, its reverse at 2i + 1: OGB's order
                src, dst = np.stack([src, dst], 1).reshape(-1), np.stack([dst, src], 1).reshape(-1)
            yield src, dst

    return Edges(str(path), 2 * m if inverse else m, chunks)


def _splits(folder: Path) -> dict[str, Array]:
    """``train``/``valid``/``test.csv.gz``: node indices, counted now (small; checked early)."""
    paths = {ours: _need(folder / f"{theirs}.csv.gz") for ours, theirs in SPLITS.items()}
    counts = {k: sum(map(len, _csv_chunks(p, 1, np.int64, 1 << 16, 12))) for k, p in paths.items()}
    return {k: _csv_array(p, counts[k], p, np.int64) for k, p in paths.items()}


@dataclass
class _Member:
    """One ``.npy`` array inside an ``.npz``: its header, and where its data starts."""

    npz: Path
    key: str
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran: bool
    header: int  # bytes of .npy header before the data, within the member
    start: int | None  # the data's offset in the file when stored uncompressed: mappable

    def read(self, first: int, count: int, per: int, rows: int) -> Iterator[np.ndarray]:
        """Records ``first..first+count-1`` of ``per`` items each, ``rows`` records a chunk."""
        native = self.dtype.newbyteorder("=")
        if self.start is not None:
            mapped = np.memmap(self.npz, self.dtype, "r", self.start, (int(np.prod(self.shape)),))
            for a in range(first, first + count, rows):
                end = min(a + rows, first + count)
                yield np.array(mapped[a * per : end * per], native).reshape(-1, per)
            return
        size, where = self.dtype.itemsize, f"{self.npz} ({self.key})"
        try:
            with zipfile.ZipFile(self.npz) as archive, archive.open(f"{self.key}.npy") as f:
                skip = self.header + first * per * size
                while skip:  # read on, a bounded block at a time (a deflated stream cannot seek)
                    skip -= len(f.read(min(skip, 1 << 20)))
                for a in range(0, count, rows):
                    data = f.read(min(rows, count - a) * per * size)
                    if len(data) != min(rows, count - a) * per * size:
                        raise _damaged(where, "it ends early")
                    yield np.frombuffer(data, self.dtype).astype(native).reshape(-1, per)
                if (first + count) * per == np.prod(self.shape) and f.read(1):  # checks the CRC
                    raise _damaged(where, "it is longer than its header says")
        except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as err:
            if _system(err):
                raise
            raise _damaged(where, err) from None


def _member(npz: Path, key: str) -> _Member:
    """The header of ``key`` in ``npz``, read as a stream."""
    _need(npz)
    try:
        with zipfile.ZipFile(npz) as archive:
            info = archive.getinfo(f"{key}.npy")
            with archive.open(info) as f:
                version = npy_format.read_magic(f)
                read = npy_format.read_array_header_1_0 if version == (1, 0) else None
                read = npy_format.read_array_header_2_0 if version == (2, 0) else read
                if read is None:
                    raise ValueError(f".npy format version {version} is not read here")
                shape, fortran, dtype = read(f)
                header = f.tell()
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if info.file_size != header + nbytes:
            raise ValueError(
                f"its header promises {nbytes:,} bytes of {key}, the member holds "
                f"{info.file_size - header:,}"
            )
        start = None
        if info.compress_type == zipfile.ZIP_STORED:  # past the member's local header
            with open(npz, "rb") as raw:
                raw.seek(info.header_offset)
                local = raw.read(30)
            names, extra = struct.unpack("<HH", local[26:30])
            start = info.header_offset + 30 + names + extra + header
    except KeyError:
        raise PreparedGraphError(f"{npz} has no array {key!r}; unpack OGB's zip again") from None
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError) as err:
        if _system(err):
            raise
        raise PreparedGraphError(
            f"{npz} is not a readable .npz archive ({err}); unpack OGB's zip again"
        ) from None
    return _Member(npz, key, tuple(shape), dtype, fortran, header, start)


def _npz_count(npz: Path, key: str) -> int:
    """``num_nodes_list`` / ``num_edges_list``: one count (one graph)."""
    member = _member(npz, key)
    counts = np.concatenate(list(member.read(0, 1, int(np.prod(member.shape)), 1)), None)
    if counts.size != 1:
        raise PreparedGraphError(f"{npz}: {key} must hold one count; it holds {counts}")
    return int(counts[0])


def _papers(raw: Path, split: Path) -> tuple[dict[Any, NodeInputs], dict[Any, Edges]]:
    """papers100M's ``data.npz`` and ``node-label.npz``; its splits."""
    data, labels = raw / "data.npz", raw / "node-label.npz"
    n, m = _npz_count(data, "num_nodes_list"), _npz_count(data, "num_edges_list")
    x, y, e = _member(data, "node_feat"), _member(labels, "node_label"), _member(data, "edge_index")
    if x.fortran and len(x.shape) > 1 and x.shape[1] > 1:
        raise PreparedGraphError(f"{data}: node_feat is column-major; save it C-order")
    if int(np.prod(y.shape[1:])) != 1:
        raise PreparedGraphError(f"{labels}: node_label must hold one label per node")
    if len(e.shape) != 2 or e.shape[0] != 2 or e.dtype.kind not in "iu" or e.shape[1] != m:
        raise PreparedGraphError(
            f"{data}: edge_index must be integers of shape (2, {m:,}) (num_edges_list); it is "
            f"{e.dtype} of shape {e.shape}"
        )
    per = int(np.prod(x.shape[1:]))

    def features(rows: int) -> Iterator[np.ndarray]:
        for chunk in x.read(0, x.shape[0], per, rows):
            yield chunk.reshape(-1, *x.shape[1:])

    def label(rows: int) -> Iterator[np.ndarray]:
        first = 0
        for chunk in y.read(0, y.shape[0], 1, rows):
            if chunk.dtype.kind == "f":  # NaN: a node without a label
                chunk = np.where(np.isnan(chunk), -1, chunk)
                if not (whole := np.isfinite(chunk) & (chunk == np.round(chunk))).all():
                    at = int(np.argmin(whole))
                    raise PreparedGraphError(
                        f"{labels} (node_label): row {first + at:,} holds {chunk[at, 0]}, not a "
                        "class id (or NaN: no label); the download is damaged: unpack OGB's zip "
                        "again"
                    )
            first += len(chunk)
            yield chunk.reshape(-1).astype(np.int64)

    def edges(size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        if e.fortran:  # (source, destination) pairs, one after the other
            pairs: Iterator[tuple[np.ndarray, np.ndarray]] = (
                (p[:, 0], p[:, 1]) for p in e.read(0, m, 2, size)
            )
        else:  # row 0 and row 1, read side by side
            pairs = zip(e.read(0, m, 1, size), e.read(m, m, 1, size), strict=True)
        for src, dst in pairs:
            yield src.reshape(-1).astype(np.int64), dst.reshape(-1).astype(np.int64)

    inputs = NodeInputs(
        n,
        Array(f"{data} (node_feat)", x.shape, x.dtype, features),
        Array(f"{labels} (node_label)", (y.shape[0],), np.dtype(np.int64), label),
        _splits(split),
    )
    return {None: inputs}, {None: Edges(f"{data} (edge_index)", m, edges)}


def _csv_graph(
    raw: Path, split: Path, inverse: bool
) -> tuple[dict[Any, NodeInputs], dict[Any, Edges]]:
    """The ``raw/*.csv.gz`` of ogbn-arxiv and ogbn-products."""
    counts = raw / "num-node-list.csv.gz"
    n = _count(counts)
    x = _csv_array(raw / "node-feat.csv.gz", n, counts, np.float32)
    y = _csv_array(raw / "node-label.csv.gz", n, counts, np.int64)
    edges = _csv_edges(raw / "edge.csv.gz", raw / "num-edge-list.csv.gz", inverse)
    return {None: NodeInputs(n, x, y, _splits(split))}, {None: edges}


def _mag(raw: Path, split: Path) -> tuple[dict[Any, NodeInputs], dict[Any, Edges]]:
    """ogbn-mag's tree: node types with features, labels, splits (as listed), or a count.

    Each relation between two node types is also written reversed (``rev_<rel>``), as PyG's
    ``ToUndirected`` adds it: every node type then receives messages.
    """
    counts, nodes = raw / "num-node-dict.csv.gz", {}
    labelled = _first_row(raw / "nodetype-has-label.csv.gz")
    with_split = _first_row(split / "nodetype-has-split.csv.gz")
    for node_type, count in sorted(_first_row(counts).items()):
        if not count.strip().isdigit():
            raise PreparedGraphError(f"{counts}: the count of {node_type!r} is {count!r}")
        n, feat = int(count), raw / "node-feat" / node_type / "node-feat.csv.gz"
        label = raw / "node-label" / node_type / "node-label.csv.gz"
        nodes[node_type] = NodeInputs(
            n,
            _csv_array(feat, n, counts, np.float32) if feat.is_file() else None,
            _csv_array(label, n, counts, np.int64) if labelled.get(node_type) == "True" else None,
            _splits(split / node_type) if with_split.get(node_type) == "True" else None,
        )
    edges: dict[Any, Edges] = {}
    for triplet in sorted(tuple(row) for row in _small_csv(raw / "triplet-type-list.csv.gz")):
        if len(triplet) != 3:
            raise PreparedGraphError(
                f"{raw / 'triplet-type-list.csv.gz'}: {triplet}: not src,rel,dst"
            )
        folder = raw / "relations" / "___".join(triplet)
        edges[triplet] = _csv_edges(folder / "edge.csv.gz", folder / "num-edge-list.csv.gz", False)
    for (src, rel, dst), forward in list(edges.items()):
        if src != dst:  # authors are never a destination otherwise: nothing updates them
            edges.setdefault((dst, f"rev_{rel}", src), _reversed(forward))
    return dict(nodes), edges


def _reversed(edges: Edges) -> Edges:
    """``edges`` from destination to source (PyG's ``ToUndirected`` names it ``rev_<rel>``)."""

    def chunks(size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for src, dst in edges.chunks(size):
            yield dst, src

    return Edges(f"{edges.where} (reversed)", edges.num_edges, chunks)


def read_ogb(name: str, root: Path) -> tuple[dict[Any, NodeInputs], dict[Any, Edges], Path]:
    """The inputs of OGB's download of ``name`` under ``root``; its folder."""
    zip_folder, scheme, layout = OGB[name]
    folder = Path(root) / name.replace("-", "_")
    raw, split = folder / "raw", folder / "split" / scheme
    if not raw.is_dir():
        raise PreparedGraphError(
            f"--source.root {root}: {raw} is missing; download "
            f"http://snap.stanford.edu/ogb/data/nodeproppred/{zip_folder}.zip, unpack it into "
            f"{root} and rename its folder {zip_folder} to {folder.name}"
        )
    if layout == "csv":
        nodes, edges = _csv_graph(raw, split, name in INVERSE)
    elif layout == "npz":
        nodes, edges = _papers(raw, split)
    else:
        nodes, edges = _mag(raw, split)
    return nodes, edges, folder


def prepare_ogb(
    name: str,
    root: Path,
    out: Path,
    feature_dtype: str | None = None,
    chunk_bytes: int = 64 << 20,
) -> Path:
    """Prepare OGB's download of ``name`` (``root/ogbn_<name>/``) into ``out`` by streaming.

    Args:
        name: ``ogbn-arxiv``, ``ogbn-products``, ``ogbn-papers100M`` or ``ogbn-mag``.
        root: The folder holding ``ogbn_<name>/`` (layout above).
        out: The prepared folder to create (atomically).
        feature_dtype: Dtype of the stored features; ``None`` keeps the input's (float32 from
            CSV; papers100M's as its ``data.npz`` holds them).
        chunk_bytes: Bytes of input per chunk.
    """
    nodes, edges, folder = read_ogb(name, root)
    inputs = sorted(p for sub in ("raw", "split") for p in (folder / sub).rglob("*") if p.is_file())
    source = {
        "ogb": name,
        "root": str(folder.resolve()),
        "inputs": {
            str(p.relative_to(folder)): [p.stat().st_size, p.stat().st_mtime_ns] for p in inputs
        },
    }
    return write(out, source, nodes, edges, feature_dtype, chunk_bytes)
