"""A graph given as a folder of ``.npy`` arrays, prepared by streaming (``gnnscale prepare``).

Homogeneous::

    x.npy            float (num_nodes, num_features)  node features
    y.npy            int   (num_nodes,)               labels (optional)
    time.npy         int or float (num_nodes,)        each node's time (optional)
    edge_index.npy   int   (2, num_edges)             row 0 sources, row 1 destinations
    edge_attr.npy    float (num_edges, num_edge_features)  edge features (optional)
    edge_time.npy    int or float (num_edges,)        each edge's time (optional)
                     (or edges.parquet: integer columns src, dst, an optional column time, and
                     its other float columns, in the file's order, the edge features; read a
                     row batch at a time; a folder of part files, as Spark writes one, is read
                     in name order)
    train.npy, val.npy, test.npy                      node indices of each split (optional)

Heterogeneous: the same files per node type and per edge type::

    nodes/<type>/x.npy, y.npy, time.npy, train.npy, val.npy, test.npy   each optional
    edges/<src>__<rel>__<dst>/edge_index.npy (or edges.parquet) indices into src's and dst's nodes
    edges/<src>__<rel>__<dst>/edge_attr.npy    edge features (optional)
    edges/<src>__<rel>__<dst>/edge_time.npy    edge times (optional)
    num_nodes.json    {"<type>": count} for node types with neither x.npy nor y.npy

Every array is opened with ``numpy.load(mmap_mode="r")`` (its header and shape) and read a chunk
at a time with plain reads (its pages stay in the page cache, out of the process's resident
memory), so an input larger than memory prepares in the memory of a chunk; a C-order ``x.npy``
whose dtype is the one stored is used where it lies, not copied
(:mod:`gnnscale.stores.streaming`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gnnscale.stores.manifest import PreparedGraphError
from gnnscale.stores.streaming import SPLITS, Array, Edges, NodeInputs, write

__all__ = ["prepare_data", "prepare_npy", "read_data", "read_npy", "save_npy"]


def _load(path: Path) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as err:
        raise PreparedGraphError(
            f"{path} is not a readable .npy array ({err}); write it again with numpy.save"
        ) from None


def _reader(path: Path, m: np.ndarray) -> Any:
    """``read(first, count)``: elements of ``m`` in C order, read from its file, not mapped.

    The pages stay in the page cache, out of the process's resident memory. ``None`` when the
    array is not a C-order file that ``numpy.load`` mapped.
    """
    if not (isinstance(m, np.memmap) and m.flags.c_contiguous):
        return None
    offset, dtype = int(m.offset), m.dtype  # type: ignore[attr-defined]

    def read(first: int, count: int) -> np.ndarray:
        return np.fromfile(path, dtype, count, offset=offset + first * dtype.itemsize)

    return read


def _array(path: Path) -> Array:
    m = _load(path)
    read, per_row = _reader(path, m), int(np.prod(m.shape[1:], dtype=np.int64))
    native = m.dtype.newbyteorder("=")  # a big-endian file is read in the machine's order

    def chunks(rows: int) -> Iterator[np.ndarray]:
        for a in range(0, m.shape[0], rows):
            b = min(a + rows, m.shape[0])
            if read is None:
                yield np.array(m[a:b], native)
            else:
                chunk = read(a * per_row, (b - a) * per_row).reshape(b - a, *m.shape[1:])
                yield chunk.astype(native, copy=False)

    mappable = read is not None and m.dtype.isnative
    in_place = (path, int(m.offset)) if mappable and m.ndim == 2 else None  # type: ignore[attr-defined]
    return Array(str(path), tuple(m.shape), native, chunks, in_place)


def _edges(path: Path) -> Edges:
    m = _load(path)
    if m.ndim != 2 or m.shape[0] != 2 or m.dtype.kind not in "iu":
        raise PreparedGraphError(
            f"{path} must be an integer array of shape (2, num_edges) (sources, destinations); "
            f"it is {m.dtype} of shape {m.shape}"
        )
    read, num_edges = _reader(path, m), int(m.shape[1])

    def chunks(size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for a in range(0, num_edges, size):
            b = min(a + size, num_edges)
            if read is None:
                yield np.array(m[0, a:b], np.int64), np.array(m[1, a:b], np.int64)
            else:
                src, dst = read(a, b - a), read(num_edges + a, b - a)
                yield src.astype(np.int64, copy=False), dst.astype(np.int64, copy=False)

    return Edges(str(path), num_edges, chunks)


def _parquet_parts(path: Path) -> list[Path]:
    """``path`` itself, or the part files of a folder as Spark, Dask or pyarrow write one.

    Parts are read in name order (``part-00000-…``, ``part-00001-…``: the order written); names
    starting with ``_`` or ``.`` (``_SUCCESS``, ``.crc`` files) are not data, as pyarrow skips them.
    """
    if not path.is_dir():
        return [path]
    parts = sorted(p for p in path.iterdir() if p.is_file() and p.name[0] not in "_.")
    if not parts:
        raise PreparedGraphError(f"{path} is a folder without Parquet part files")
    return parts


def _parquet_edges(path: Path) -> Edges:
    """An edge list in Parquet (a file or a folder of parts), read a batch at a time.

    Integer columns ``src`` and ``dst``; a column ``time`` (integers or floats), each edge's
    time; its other float columns, in the file's order, are the edges' features
    (``edge_attr``); other columns are not read.
    """
    import pyarrow.parquet as pq
    import pyarrow.types

    parts, num_rows, features = _parquet_parts(path), 0, None
    times: bool | None = None
    for part in parts:
        try:
            file = pq.ParquetFile(part)
        except (OSError, ValueError) as err:  # pyarrow's errors derive from these
            raise PreparedGraphError(f"{part} is not a readable Parquet file ({err})") from None
        schema = file.schema_arrow
        if not {"src", "dst"} <= set(schema.names):
            raise PreparedGraphError(
                f"{part} needs integer columns src and dst (sources, destinations); it has "
                f"{', '.join(sorted(schema.names))}"
            )
        floats = [f.name for f in schema if f.name not in ("src", "dst", "time")]
        floats = [n for n in floats if pyarrow.types.is_floating(schema.field(n).type)]
        if features is not None and floats != features:
            raise PreparedGraphError(
                f"{part} has the float columns (edge features) {floats or 'none'}, the parts "
                f"before it {features or 'none'}: give every part the same columns"
            )
        features = floats
        timed = "time" in schema.names
        kind = schema.field("time").type if timed else None
        if timed and not (_is_integer(kind) or pyarrow.types.is_floating(kind)):
            raise PreparedGraphError(f"{part}: column time must hold numbers; it holds {kind}")
        if times is not None and timed != times:
            raise PreparedGraphError(
                f"{part} {'has' if timed else 'lacks'} a time column, the parts before it "
                f"{'do not' if timed else 'have one'}: give every part the same columns"
            )
        times = timed
        num_rows += int(file.metadata.num_rows)

    def batches(size: int, columns: list[str]) -> Iterator[tuple[Path, int, Any]]:
        first = 0
        for part in parts:
            for batch in pq.ParquetFile(part).iter_batches(size, columns=columns):
                yield part, first, batch
                first += batch.num_rows

    def chunks(size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for part, first, batch in batches(size, ["src", "dst"]):
            pair = []
            for name in ("src", "dst"):
                column = batch.column(name)
                if column.null_count or not _is_integer(column.type):
                    raise PreparedGraphError(
                        f"{part}: column {name} must be integers without nulls (rows from "
                        f"{first:,} hold {column.type}, {column.null_count} null)"
                    )
                pair.append(column.to_numpy().astype(np.int64, copy=False))
            yield pair[0], pair[1]

    edges = Edges(str(path), num_rows, chunks)
    if times:

        def time_chunks(size: int) -> Iterator[np.ndarray]:
            for part, start, batch in batches(size, ["time"]):
                if batch.column("time").null_count:
                    raise PreparedGraphError(
                        f"{part}: column time has nulls (rows from {start:,}): give every "
                        "edge a time"
                    )
                yield batch.column("time").to_numpy()

        kind = pq.ParquetFile(parts[0]).schema_arrow.field("time").type
        dtype = np.dtype(np.int64 if _is_integer(kind) else np.float64)
        edges.time = Array(f"{path} (column time)", (num_rows,), dtype, time_chunks)
    if features:
        first = pq.ParquetFile(parts[0]).schema_arrow
        empty = (pyarrow.array([], type=first.field(n).type) for n in features)
        dtype = np.result_type(*(column.to_numpy().dtype for column in empty))  # pandas-free

        def rows(size: int) -> Iterator[np.ndarray]:
            for part, start, batch in batches(size, features):
                nulls = [n for n in features if batch.column(n).null_count]
                if nulls:
                    raise PreparedGraphError(
                        f"{part}: edge feature column {nulls[0]} has nulls (rows from "
                        f"{start:,}): fill them, or leave the column out"
                    )
                yield np.stack([batch.column(n).to_numpy() for n in features], 1).astype(dtype)

        edges.attr = Array(
            f"{path} (columns {', '.join(features)})",
            (num_rows, len(features)),
            np.dtype(dtype),
            rows,
        )
    return edges


def _is_integer(kind: Any) -> bool:
    """Whether a pyarrow type is an integer type."""
    import pyarrow.types

    return bool(pyarrow.types.is_integer(kind))


def _edge_file(folder: Path) -> Edges | None:
    """``folder``'s ``edge_index.npy`` or ``edges.parquet``; ``None`` if it has neither.

    With the edges' features, ``edge_attr.npy``, where there is one.
    """
    if (folder / "edge_index.npy").is_file():
        edges = _edges(folder / "edge_index.npy")
    elif (folder / "edges.parquet").exists():  # a file, or a folder of part files
        edges = _parquet_edges(folder / "edges.parquet")
    else:
        return None
    # The messages spelled out: what a user searches for is the sentence they got.
    if (folder / "edge_attr.npy").is_file():
        if edges.attr is not None:
            raise PreparedGraphError(
                f"{folder} gives edge features twice, as edge_attr.npy and as {edges.attr.where}"
                ": keep one"
            )
        edges.attr = _array(folder / "edge_attr.npy")
    if (folder / "edge_time.npy").is_file():
        if edges.time is not None:
            raise PreparedGraphError(
                f"{folder} gives edge times twice, as edge_time.npy and as {edges.time.where}"
                ": keep one"
            )
        edges.time = _array(folder / "edge_time.npy")
    return edges


def _node_inputs(folder: Path, count: int | None) -> NodeInputs:
    x = _array(folder / "x.npy") if (folder / "x.npy").is_file() else None
    y = _array(folder / "y.npy") if (folder / "y.npy").is_file() else None
    splits = {s: _array(folder / f"{s}.npy") for s in SPLITS if (folder / f"{s}.npy").is_file()}
    time = _array(folder / "time.npy") if (folder / "time.npy").is_file() else None
    if count is None:
        if x is None and y is None:
            raise PreparedGraphError(
                f"{folder} has neither x.npy nor y.npy: give its node count in num_nodes.json"
            )
        count = (x or y).shape[0]  # type: ignore[union-attr]
    return NodeInputs(count, x, y, splits, time)


def read_counts(root: Path) -> dict[str, int]:
    """``root/num_nodes.json``: node counts by type (none where there is no such file)."""
    path = root / "num_nodes.json"
    if not path.is_file():
        return {}
    try:
        counts = {str(k): int(v) for k, v in json.loads(path.read_text()).items()}
    except (ValueError, TypeError, AttributeError) as err:
        raise PreparedGraphError(f"{path} must map node types to counts ({err})") from None
    if negative := {k: v for k, v in counts.items() if v < 0}:
        raise PreparedGraphError(
            f"{path}: a node count is at least 0 (got {negative}); give each node type's "
            "number of nodes"
        )
    return counts


def read_npy(root: Path) -> tuple[dict[str | None, NodeInputs], dict[Any, Edges]]:
    """The inputs of a ``.npy`` folder: each node type's arrays and each edge type's edges."""
    root = Path(root)
    if not root.is_dir():
        raise PreparedGraphError(f"--source.root {root} is not a folder of .npy arrays")
    if not (root / "nodes").is_dir() and not (root / "edges").is_dir():
        found = _edge_file(root)
        if found is None:
            raise PreparedGraphError(
                f"{root} has no edge_index.npy or edges.parquet (homogeneous) and no edges/ "
                "folder (heterogeneous): see docs/stores.md for the layout"
            )
        return {None: _node_inputs(root, None)}, {None: found}
    counts = read_counts(root)
    node_types = sorted({p.name for p in (root / "nodes").glob("*") if p.is_dir()} | set(counts))
    nodes: dict[str | None, NodeInputs] = {
        t: _node_inputs(root / "nodes" / t, counts.get(t)) for t in node_types
    }
    edges: dict[Any, Edges] = {}
    for folder in sorted(p for p in (root / "edges").glob("*") if p.is_dir()):
        parts = folder.name.split("__")
        if len(parts) != 3 or not all(parts):
            raise PreparedGraphError(
                f"{folder}: an edge type's folder is named <src>__<rel>__<dst>"
            )
        found = _edge_file(folder)
        if found is None:
            raise PreparedGraphError(f"{folder / 'edge_index.npy'} is missing (or edges.parquet)")
        edges[tuple(parts)] = found
    if not edges:
        raise PreparedGraphError(f"{root / 'edges'} holds no <src>__<rel>__<dst> folder")
    for t, inputs in nodes.items():
        where = f"{root / 'num_nodes.json'}" if t in counts else f"{root / 'nodes' / str(t)}"
        if inputs.num_nodes == 0:
            raise PreparedGraphError(
                f"node type {t!r} has no nodes ({where}): remove it, or give its nodes"
            )
        if not any(dst == t for _, _, dst in edges):
            raise PreparedGraphError(
                f"node type {t!r} ({where}) is the destination of no edge type in "
                f"{root / 'edges'}: the models would pass it no messages; add a relation into "
                f"it (<src>__<rel>__{t}, such as the reverse of one out of it) or remove it"
            )
    return nodes, edges


def prepare_npy(
    root: Path, out: Path, feature_dtype: str | None = None, chunk_bytes: int = 64 << 20
) -> Path:
    """Prepare the graph of the ``.npy`` folder ``root`` into ``out`` by streaming.

    Args:
        root: The folder of arrays (layout above).
        out: The prepared folder to create (atomically).
        feature_dtype: Dtype of the stored features; ``None`` keeps the input's.
        chunk_bytes: Bytes of input per chunk.
    """
    nodes, edges = read_npy(root)
    inputs = sorted(p for p in Path(root).rglob("*") if p.is_file())
    source = {
        "npy": str(Path(root).resolve()),
        "inputs": {
            str(p.relative_to(root)): [p.stat().st_size, p.stat().st_mtime_ns] for p in inputs
        },
    }
    return write(out, source, nodes, edges, feature_dtype, chunk_bytes)


def save_npy(data: Any, folder: Path) -> Path:
    """Write an in-memory PyG ``Data`` or ``HeteroData`` as a ``.npy`` folder (layout above).

    Node attributes ``x`` and ``y`` are saved as they are; masks ``train_mask``, ``val_mask``,
    ``test_mask`` as the node indices of each split; a node type without ``x`` or ``y`` gives its
    count in ``num_nodes.json``; edge features ``edge_attr`` and times ``edge_time`` as they
    are.
    For graphs that fit in memory: tests, examples, small datasets.
    """
    from torch_geometric.data import HeteroData

    folder = Path(folder)
    hetero = isinstance(data, HeteroData)
    node_types = data.node_types if hetero else [None]
    edge_types = data.edge_types if hetero else [None]
    counts = {}
    for node_type in node_types:
        store = data[node_type] if hetero else data
        where = folder / "nodes" / str(node_type) if hetero else folder
        where.mkdir(parents=True, exist_ok=True)
        for key in ("x", "y", "time"):  # time: a node attribute only (PyG's rule)
            if key in store and (key != "time" or store.is_node_attr(key)):
                np.save(where / f"{key}.npy", store[key].numpy())
        for split in SPLITS:
            if f"{split}_mask" in store:
                np.save(where / f"{split}.npy", store[f"{split}_mask"].nonzero().view(-1).numpy())
        if hetero and "x" not in store and "y" not in store:
            counts[node_type] = int(store.num_nodes)
    for edge_type in edge_types:
        store = data[edge_type] if hetero else data
        where = folder / "edges" / "__".join(edge_type or ()) if hetero else folder
        where.mkdir(parents=True, exist_ok=True)
        np.save(where / "edge_index.npy", store.edge_index.numpy())
        for key in ("edge_attr", "edge_time"):
            if key in store:
                np.save(where / f"{key}.npy", store[key].numpy())
    if counts:
        (folder / "num_nodes.json").write_text(json.dumps(counts))
    return folder


def _held(where: str, a: np.ndarray) -> Array:
    """An array in memory as a streamed input (its chunks are views)."""
    return Array(
        where, a.shape, a.dtype, lambda rows: (a[i : i + rows] for i in range(0, len(a), rows))
    )


def read_data(data: Any) -> tuple[dict[str | None, NodeInputs], dict[Any, Edges]]:
    """The inputs of an in-memory ``Data`` or ``HeteroData`` (what :func:`save_npy` would write)."""
    from torch_geometric.data import HeteroData

    hetero = isinstance(data, HeteroData)
    nodes: dict[str | None, NodeInputs] = {}
    for node_type in data.node_types if hetero else [None]:
        store = data[node_type] if hetero else data
        name = f"node type {node_type}" if hetero else "the graph"
        x, y, time = (
            _held(f"{name}'s {k}", store[k].numpy())
            if k in store and (k != "time" or store.is_node_attr(k))  # node time (PyG's rule)
            else None
            for k in ("x", "y", "time")
        )
        splits = {
            s: _held(f"{name}'s {s}_mask", store[f"{s}_mask"].nonzero().view(-1).numpy())
            for s in SPLITS
            if f"{s}_mask" in store
        }
        nodes[node_type] = NodeInputs(int(store.num_nodes), x, y, splits or None, time)
    edges: dict[Any, Edges] = {}
    for edge_type in data.edge_types if hetero else [None]:
        index = (data[edge_type] if hetero else data).edge_index.numpy()

        def chunks(size: int, index: np.ndarray = index) -> Iterator[tuple[np.ndarray, np.ndarray]]:
            for a in range(0, index.shape[1], size):
                yield index[0, a : a + size], index[1, a : a + size]

        name = "the graph's edges" if edge_type is None else "__".join(edge_type)
        store = data[edge_type] if hetero else data
        attr, time = (
            _held(f"{name}: {key}", store[key].numpy()) if key in store else None
            for key in ("edge_attr", "edge_time")
        )
        edges[edge_type] = Edges(name, index.shape[1], chunks, attr, time)
    return nodes, edges


def prepare_data(
    data: Any, out: Path, source: dict[str, Any], feature_dtype: str | None = None
) -> Path:
    """Write an in-memory ``Data`` or ``HeteroData`` as a prepared folder (the streamed writer's).

    Args:
        data: The graph (node ``x``, ``y`` and split masks where it has them).
        out: The prepared folder to create (atomically).
        source: What the graph was made from (recorded, and hashed into the folder's key).
        feature_dtype: Dtype of the stored features; ``None`` keeps the graph's.
    """
    return write(out, source, *read_data(data), feature_dtype)
