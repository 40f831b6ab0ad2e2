"""A prepared folder as PyG's ``(FeatureStore, GraphStore)`` pair, every tensor memory-mapped.

    fs, gs = gnnscale.stores.open("data/my_graph")
    sampler = HopSampler((fs, gs), [10, 5])  # PyG's sampler, without pyg-lib or torch-sparse
    loader = NeighborLoader((fs, gs), [10, 5], input_nodes=train, neighbor_sampler=sampler)

PyG's ``NeighborLoader`` and ``LinkNeighborLoader`` take any such pair (cuGraph-PyG and other
out-of-memory backends implement the same two interfaces). Here the graph store hands the
sampler each edge type's destination-sorted CSC (``colptr``, ``row``) as it lies on disk, so
nothing is sorted or copied when a loader starts; the feature store gathers a batch's rows from
the mapped files. Processes that open one folder share its pages.

What the feature store holds, per node type (``None`` in a homogeneous graph): the prepared
files (``x``, ``y``, ``train_mask``, ``val_mask``, ``test_mask``, those that exist) and ``n_id``,
each node's own index, computed rather than stored. PyG's samplers learn a graph's node types
from the feature store, so ``n_id`` makes a node type without features (MAG's authors) visible;
batches carry it as PyG's in-memory loaders do. Both stores are read-only.

Edge features (``edge_attr``, per edge type) are held too, but PyG's loaders read only node
tensors from a feature store (``filter_custom_store``: "TODO support edge attributes", PyG 2.8),
so a loader takes :meth:`MappedFeatureStore.add_edge_attr` as its transform::

    loader = NeighborLoader((fs, gs), ..., transform=fs.add_edge_attr)  # batch.edge_attr
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor
from torch_geometric.data import EdgeAttr, FeatureStore, HeteroData, TensorAttr
from torch_geometric.data.graph_store import EdgeLayout
from torch_geometric.sampler import BaseSampler, NodeSamplerInput
from torch_geometric.typing import EdgeTensorType, EdgeType, NodeType

from gnnscale._compat import GraphStore
from gnnscale.batch import FeatureReads
from gnnscale.errors import ConfigError
from gnnscale.sampling import HopSampler
from gnnscale.sampling.segments import Appended
from gnnscale.stores import link_split, reads
from gnnscale.stores.prepared import PreparedGraph
from gnnscale.stores.reads import RowCache, gather

__all__ = [
    "MappedFeatureStore",
    "MappedGraphStore",
    "fill_cache",
    "open",
    "seed_edges",
    "stores_of",
]

_READ_ONLY = "a prepared store is read-only: prepare a new folder to change it"


class MappedFeatureStore(FeatureStore):
    """Node tensors of a prepared folder, by ``(node type, name)``; ``n_id`` computed.

    Every index a caller gathers with is checked against the node count first
    (:meth:`PreparedGraph.check_ids`: a damaged neighbour id is named, not read past a file's
    end), once a batch however many tensors it reads. ``graph.threads`` threads gather a
    batch's rows at once (:mod:`gnnscale.stores.reads`), and the feature rows of ``cache``, one
    :class:`RowCache` per node type (:meth:`hold_drawn_rows` fills it), come from memory.
    """

    def __init__(
        self,
        graph: PreparedGraph,
        tensors: dict[tuple[NodeType | None, str], Tensor],
        num_nodes: dict[NodeType | None, int],
        edge_attr: dict[EdgeType | None, Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.graph = graph
        self.tensors = tensors
        self.num_nodes = num_nodes
        self.edge_attr = edge_attr or {}  # by edge type, in the input's edge order
        self.cache: dict[NodeType | None, RowCache] = {}
        self._held = [0, 0]  # feature rows the cache held, rows gathered: since the last take

    def _multi_get_tensor(self, attrs: list[TensorAttr]) -> list[Tensor | None]:
        checked: set[tuple[NodeType | None, int]] = set()
        for attr in attrs:  # PyG gathers a batch's every tensor with one index per node type
            if (attr.group_name, id(attr.index)) not in checked:
                self._check(attr)
                checked.add((attr.group_name, id(attr.index)))
        return [self._read(attr) for attr in attrs]

    def _get_tensor(self, attr: TensorAttr) -> Tensor | None:
        self._check(attr)
        return self._read(attr)

    def _check(self, attr: TensorAttr) -> None:
        index, group = attr.index, attr.group_name
        if isinstance(index, Tensor) and (index.is_floating_point() or index.is_complex()):
            raise IndexError(  # gathered, it would be truncated to ids without a word
                f"an index given to the store is {index.dtype}: give integer node ids "
                "(torch.long), or a boolean mask"
            )
        if isinstance(index, Tensor) and index.dtype != torch.bool and group in self.num_nodes:
            self.graph.check_ids(index, group, given=True)

    def _read(self, attr: TensorAttr) -> Tensor | None:
        index, group = attr.index, attr.group_name
        rows = isinstance(index, Tensor) and index.dtype != torch.bool
        if attr.attr_name == "n_id" and group in self.num_nodes:
            if rows:
                return index.long()  # type: ignore[union-attr]  # each node's id is its index
            every = torch.arange(self.num_nodes[group])
            return every if index is None else every[index]
        tensor = self.tensors.get((group, attr.attr_name))
        if tensor is None or index is None:
            return tensor
        if not rows:
            return tensor[index]
        cache = self.cache.get(group) if attr.attr_name == "x" else None
        if cache is None:
            return gather(tensor, index, self.graph.threads)  # from the page cache or disk
        out, held = cache.gather(tensor, index, self.graph.threads)
        self._held[0] += held
        self._held[1] += index.numel()  # type: ignore[union-attr]
        return out

    def add_edge_attr(self, batch: Any) -> Any:
        """A loader's transform: each sampled edge type's ``edge_attr``, gathered by its ``e_id``.

        ``e_id`` is the input's edge id (the CSC's through ``perm``), so the features equal those
        an in-memory loader slices from ``data.edge_attr``. Edge types without features, or
        without ``e_id``, are left as they are.
        """
        hetero = isinstance(batch, HeteroData)
        stores = {t: batch[t] for t in batch.edge_types} if hetero else {None: batch}
        for edge_type, store in stores.items():
            attr = self.edge_attr.get(edge_type)
            if attr is not None and "e_id" in store:
                store.edge_attr = gather(attr, store.e_id, self.graph.threads)
        return batch

    def count_held(self, batch: Any) -> Any:
        """A loader's transform: ``batch`` with the feature rows the cache held and gathered.

        ``batch.feature_reads`` (``gnnscale.batch.FeatureReads``): those of this process since
        the last count. A loader's worker gathers one batch at a time, so they are the batch's
        own.
        """
        batch.feature_reads, self._held = FeatureReads(*self._held), [0, 0]
        return batch

    def hold_drawn_rows(
        self,
        sampler: BaseSampler,
        seeds: Tensor | Mapping[NodeType | None, Tensor],
        batch_size: int,
        gib: float,
    ) -> str:
        """Keep in memory the feature rows that one sampling pass over ``seeds`` draws most often.

        As many as ``gib`` holds (rows and their ids), whatever their node types, never a row
        the pass did not draw: on the papers100M-sized graph the rows one epoch drew were 75% of
        the next epoch's, against 10% for as many rows of the highest in-degree, or at random
        (``benchmarks/store_reads.py``). The pass samples without reading features (it warms
        the sampler's pages for the first epoch); each type's rows are then read in one
        sequential pass over its feature file. Fill it before a loader's workers start: forked,
        they share it.

        Args:
            sampler: The training loader's sampler (its fan-out).
            seeds: Training seeds (heterogeneous: by node type), drawn ``batch_size`` at a
                time in a shuffled order under a fixed seed (the run's own draws are not moved).
            batch_size: Seeds a batch.
            gib: The budget.

        Returns:
            What it holds, in a sentence.
        """
        start = time.perf_counter()
        counts = {t: torch.zeros(n, dtype=torch.int32) for t, n in self.num_nodes.items()}
        typed_seeds = seeds.items() if isinstance(seeds, Mapping) else [(None, seeds)]
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(0)
            for node_type, some in typed_seeds:
                for batch in some[torch.randperm(some.numel())].split(batch_size):
                    out = sampler.sample_from_nodes(
                        NodeSamplerInput(None, batch, input_type=node_type)
                    )
                    nodes = out.node if isinstance(out.node, dict) else {None: out.node}
                    for t, ids in nodes.items():
                        counts[t].index_add_(0, ids, torch.ones(ids.numel(), dtype=torch.int32))
        typed = [t for t in counts if (t, "x") in self.tensors]
        if not typed:
            return "no feature rows to hold: the folder has no features"
        ids = {t: counts[t].nonzero().view(-1) for t in typed}
        drawn = torch.cat([counts[t].index_select(0, ids[t]) for t in typed])
        cost = torch.cat(
            [torch.full_like(ids[t], self.tensors[t, "x"][:1].nbytes + 8) for t in typed]
        )
        order = drawn.argsort(descending=True, stable=True)
        keep = torch.zeros_like(drawn, dtype=torch.bool)
        keep[order[cost[order].cumsum(0) <= int(gib * 2**30)]] = True
        held = rows = 0
        for t, part in zip(typed, keep.split([ids[t].numel() for t in typed]), strict=True):
            kept = ids[t][part]  # sorted, as nonzero returns them
            name = "x" if t is None else f"{t}/x"
            self.cache[t] = RowCache(kept, self.graph.read_rows(name, kept))
            held, rows = held + kept.numel(), rows + self.num_nodes[t]
        nbytes = sum(c.nbytes for c in self.cache.values())
        share = int(drawn[keep].sum()) / max(int(drawn.sum()), 1)
        return (
            f"holding {held:,} feature rows in memory ({nbytes / 2**30:.2f} GiB, {held / rows:.1%}"
            f" of the rows): those a sampling pass drew most often, {share:.0%} of its rows "
            f"({time.perf_counter() - start:.0f} s)"
        )

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...] | None:
        if attr.attr_name == "n_id" and attr.group_name in self.num_nodes:
            return (self.num_nodes[attr.group_name],)
        tensor = self.tensors.get((attr.group_name, attr.attr_name))
        return None if tensor is None else tuple(tensor.shape)

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        """Every tensor, ``n_id`` of each node type last."""
        stored = [TensorAttr(group, name) for group, name in self.tensors]
        return stored + [TensorAttr(group, "n_id") for group in self.num_nodes]

    def _put_tensor(self, tensor: Tensor, attr: TensorAttr) -> bool:
        raise ConfigError(_READ_ONLY)

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        raise ConfigError(_READ_ONLY)


class MappedGraphStore(GraphStore):
    """Each edge type's CSC (``row``, ``colptr``), destination-sorted, as PyG's samplers read it.

    ``graph``, the folder the CSC lies in, lets a sampler read a batch's neighbour lists ahead
    and check the ids it drew (:meth:`read_ahead`, :meth:`check_sampled`); gnnscale's
    :class:`~gnnscale.sampling.HopSampler` does both. ``perm``: for an edge type whose input
    was not in the CSC's order, each CSC slot's position in the input's edge list; PyG's
    loaders map a batch's ``e_id`` through it, so that edge ids are the input's, as in memory.
    ``edge_time``: each timed edge type's edge times in the CSC's order, ascending within every
    neighbourhood (``gnnscale prepare`` sorts them so): what ``HopSampler(..., time_attr=
    "edge_time")`` samples by, read where it lies. ``appended``: in a folder that took
    appends (``gnnscale.stores.append``), every edge type's appended edges, one part per append
    that reached it: a node's in-edges are its CSC's, then each part's
    (:mod:`gnnscale.sampling.segments`).
    """

    def __init__(
        self,
        csc: dict[EdgeType | None, tuple[Tensor, Tensor, tuple[int, int]]],
        graph: PreparedGraph | None = None,
        perm: dict[EdgeType | None, Tensor] | None = None,
        edge_time: dict[EdgeType | None, Tensor] | None = None,
        appended: dict[EdgeType | None, list[Appended]] | None = None,
    ) -> None:
        super().__init__()
        self.csc_by_type = csc
        self.graph = graph
        self.perm_by_type = perm or {}
        self.edge_time = edge_time or {}
        self.appended = appended or {}

    def read_ahead(
        self,
        seeds: Tensor | Mapping[NodeType | None, Tensor],
        fanout: list[int] | Mapping[EdgeType | None, list[int]],
    ) -> None:
        """Read and check the CSCs that sampling ``fanout`` from ``seeds`` walks.

        :func:`gnnscale.stores.reads.read_ahead_typed`, with the folder's threads: PyG's
        samplers fault the CSC's pages in one at a time, half of a cold batch's time once its
        features were read by threads. Heterogeneous: seeds by node type, fan-outs by edge type.
        """
        if self.graph is None:
            return
        typed_seeds = seeds if isinstance(seeds, Mapping) else {None: seeds}
        typed_fanout = fanout if isinstance(fanout, Mapping) else {None: fanout}
        csc = {t: (colptr, row) for t, (row, colptr, _) in self.csc_by_type.items()}
        threads, check = self.graph.threads, self.graph.check_ids
        reads.read_ahead_typed(csc, typed_seeds, typed_fanout, threads, check)

    def check_sampled(self, node: Tensor | dict[NodeType, Tensor]) -> None:
        """Refuse a sampled batch whose node ids lie outside their type's count (a damaged row)."""
        if self.graph is None:
            return
        for t, ids in node.items() if isinstance(node, dict) else [(None, node)]:
            self.graph.check_ids(ids, t)

    def edge_layout(
        self, attr: EdgeAttr, layout: EdgeLayout, store: bool = False
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """PyG's conversion; the stored CSC comes with its map to the input's edge ids."""
        row, col, perm = super().edge_layout(attr, layout, store)
        if layout == EdgeLayout.CSC:
            perm = self.perm_by_type.get(attr.edge_type)
        return row, col, perm

    def _get_edge_index(self, edge_attr: EdgeAttr) -> EdgeTensorType | None:
        found = self.csc_by_type.get(edge_attr.edge_type)
        if found is None or edge_attr.layout != EdgeLayout.CSC:
            return None  # PyG's csc() asks for the layout each edge type is stored in
        row, colptr, _ = found
        return row, colptr

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        """One CSC attribute per edge type, with its (source, destination) node counts."""
        return [
            EdgeAttr(edge_type, EdgeLayout.CSC, size=size)
            for edge_type, (_, _, size) in self.csc_by_type.items()
        ]

    def _put_edge_index(self, edge_index: EdgeTensorType, edge_attr: EdgeAttr) -> bool:
        raise ConfigError(_READ_ONLY)

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        raise ConfigError(_READ_ONLY)


def edge_type(key: str) -> EdgeType:
    """``"paper__cites__paper"`` (a prepared folder's name for an edge type) as PyG's tuple."""
    src, rel, dst = key.split("__")
    return src, rel, dst


def open(  # noqa: A001 (gnnscale.stores.open, as the builtin opens a file)
    folder: Path | str,
    verify: Literal["full", "size"] = "full",
    read_threads: int | None = None,
    feature_cache_gib: float = 0.0,
    num_neighbors: list[int] | dict[EdgeType, list[int]] | None = None,
    batch_size: int = 1024,
) -> tuple[MappedFeatureStore, MappedGraphStore]:
    """A prepared folder (``gnnscale prepare``) as PyG's ``(FeatureStore, GraphStore)`` pair.

    Args:
        folder: The prepared folder.
        verify: ``full`` checks every block's checksum first; ``size`` only the files' sizes.
        read_threads: Threads that gather a batch's rows at once; ``None``: as
            :class:`PreparedGraph` chooses (many where the graph is read from disk).
        feature_cache_gib: Feature rows held in memory (0: none): those a sampling pass over
            the folder's training nodes (``train_mask``; of every node type that has one) with
            ``num_neighbors`` and ``batch_size`` draws most often
            (:meth:`MappedFeatureStore.hold_drawn_rows`).
        num_neighbors: The fan-out you train with (needed with ``feature_cache_gib``).
        batch_size: The training batch size.
    """
    fs, gs = stores_of(PreparedGraph(Path(folder), verify, read_threads))
    if feature_cache_gib < 0 or (feature_cache_gib and num_neighbors is None):
        raise ConfigError(
            f"feature_cache_gib={feature_cache_gib}: give a size >= 0 in GiB, and the "
            "num_neighbors you train with (the rows it holds are those they draw most often)"
        )
    if feature_cache_gib:
        assert num_neighbors is not None
        fill_cache((fs, gs), num_neighbors, batch_size, feature_cache_gib)
    return fs, gs


def fill_cache(
    stores: tuple[MappedFeatureStore, MappedGraphStore],
    num_neighbors: list[int] | dict[EdgeType, list[int]],
    batch_size: int,
    gib: float,
    seeds: Tensor | Mapping[Any, Tensor] | None = None,
    vectorized: bool = True,
) -> str:
    """Fill the feature store's cache from one sampling pass (``hold_drawn_rows``).

    Args:
        stores: The pair (:func:`open`, :func:`stores_of`).
        num_neighbors: The training fan-out.
        batch_size: The training batch size.
        gib: The cache's budget.
        seeds: The training seeds; ``None``: the training nodes (``train_mask``) of every node
            type that has them.
        vectorized: Sample as ``--data.loader.sampler`` would (``HopSampler.vectorized``).

    Returns:
        What the cache holds, in a sentence.
    """
    fs, _ = stores
    if seeds is None:
        seeds = {t: m.nonzero().view(-1) for (t, k), m in fs.tensors.items() if k == "train_mask"}
    sampler = HopSampler(stores, num_neighbors, vectorized=vectorized)
    return fs.hold_drawn_rows(sampler, seeds, batch_size, gib)


def seed_edges(
    graph_store: MappedGraphStore, edge_type: EdgeType | None = None
) -> tuple[EdgeType | None, Tensor]:
    """Every edge of ``edge_type`` as ``LinkNeighborLoader``'s ``edge_label_index``, mapped.

    PyG's loader given only an edge type of a store builds its ``(2, E)`` pairs in memory
    (``torch.stack`` of the store's COO: 16 bytes an edge, private to each process). These
    pairs are written once into a folder beside the prepared one, ``<folder>.edges-<edge
    type>`` (``link_split.write_pairs``), and mapped: processes share their pages. They come in
    the store's CSC order, the order PyG's own conversion gives, so batches are the same::

        loader = LinkNeighborLoader((fs, gs), ..., edge_label_index=seed_edges(gs, edge_type))

    Args:
        graph_store: A prepared folder's graph store (:func:`open`).
        edge_type: The relation; ``None`` in a homogeneous graph.
    """
    graph = graph_store.graph
    if graph is None:
        raise ConfigError("seed_edges needs a graph store opened from a prepared folder")
    name = "edges" if edge_type is None else "__".join(edge_type)
    out = link_split.write_pairs(
        graph, edge_type, graph.folder.with_name(f"{graph.folder.name}.edges-{name}")
    )
    return edge_type, PreparedGraph(out, "size").tensor("edge_label_index")


def stores_of(graph: PreparedGraph) -> tuple[MappedFeatureStore, MappedGraphStore]:
    """An opened prepared folder's ``(FeatureStore, GraphStore)`` pair (see :func:`open`)."""
    manifest = graph.manifest
    if manifest.is_hetero:  # "type/name" files
        groups: dict[str, NodeType | None] = {k: k for k in manifest.node_counts}
        edge_types: dict[str, EdgeType | None] = {k: edge_type(k) for k in manifest.edge_counts}
    else:  # counted as type "", its files unprefixed; PyG's type None
        groups, edge_types = {"": None}, {"": None}
    num_nodes = {groups[k]: n for k, n in manifest.node_counts.items()}
    tensors = {}
    for name in manifest.files:
        group, _, attr = name.rpartition("/")
        if group in groups and attr not in ("colptr", "row", "perm", "edge_attr", "edge_time"):
            tensors[groups[group], attr] = graph.tensor(name)
    csc, perm, edge_attr, edge_time = {}, {}, {}, {}
    appended: dict[EdgeType | None, list[Appended]] = {}
    appends = len(manifest.appends or [])
    for key, et in edge_types.items():
        prefix = f"{key}/" if key else ""
        src, dst = (None, None) if et is None else (et[0], et[-1])
        size = (num_nodes[src], num_nodes[dst])
        csc[et] = (graph.tensor(f"{prefix}row"), graph.tensor(f"{prefix}colptr"), size)
        if f"{prefix}perm" in manifest.files:
            perm[et] = graph.tensor(f"{prefix}perm")
        if f"{prefix}edge_attr" in manifest.files:
            edge_attr[et] = graph.tensor(f"{prefix}edge_attr")
        if f"{prefix}edge_time" in manifest.files:
            edge_time[et] = graph.tensor(f"{prefix}edge_time")
        if appends:  # every edge type: nodes an append added have no slots in the CSC
            appended[et] = [
                _appended(graph, f"{prefix}append{g}/")
                for g in range(1, appends + 1)
                if f"{prefix}append{g}/colptr" in manifest.files
            ]
    fs = MappedFeatureStore(graph, tensors, num_nodes, edge_attr)
    return fs, MappedGraphStore(csc, graph, perm, edge_time, appended)


def _appended(graph: PreparedGraph, prefix: str) -> Appended:
    """One append's part of an edge type (files ``<prefix>nodes``, ``colptr``, ...)."""
    timed = f"{prefix}edge_time" in graph.manifest.files
    return Appended(
        nodes=graph.tensor(f"{prefix}nodes"),
        colptr=graph.tensor(f"{prefix}colptr"),
        row=graph.tensor(f"{prefix}row"),
        edge_id=graph.tensor(f"{prefix}edge_id"),
        clock=graph.tensor(f"{prefix}edge_time") if timed else None,
    )
