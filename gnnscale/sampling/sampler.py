"""``HopSampler``: PyG's ``NeighborSampler``, drawing every batch by :mod:`gnnscale.sampling.hops`.

PyG's ``NeighborSampler`` hands sampling to pyg-lib or, where pyg-lib is not installed (it is not
on PyPI), to torch-sparse, which samples neither by time nor by weight and draws every neighbour
with a ``torch::randint`` call of its own (a [15, 10] batch of 1,024 seeds makes about 160,000,
most of the batch's time: ``benchmarks/peers.py``). :class:`HopSampler` replaces one method,
``_sample``: uniform, timed and weighted draws of homogeneous and heterogeneous graphs, joint or
disjoint, a hop at a time. PyG's loaders, arguments and outputs stay as they are.
"""

from __future__ import annotations

import copy
import functools
import warnings
from typing import Any, Protocol, runtime_checkable

import torch_geometric.typing
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch_geometric.sampler import HeteroSamplerOutput, NodeSamplerInput
from torch_geometric.sampler.base import DataType, SubgraphType

from gnnscale._compat import NeighborSampler, backend_checks_lifted
from gnnscale.sampling.hops import sample_hops, sample_typed_hops
from gnnscale.sampling.segments import Appended, take
from gnnscale.sampling.time import TimeRule, time_order
from gnnscale.sampling.weights import check_weights

__all__ = [
    "HopSampler",
    "ReadsAhead",
    "describe",
    "log_backend_once",
    "sampling_backend",
    "vectorized",
]


@runtime_checkable
class ReadsAhead(Protocol):
    """A graph store that reads a batch's neighbour lists ahead and checks the ids drawn.

    A prepared folder's (``gnnscale.stores.MappedGraphStore``): :class:`HopSampler` asks it
    before and after each batch, so the sampler needs nothing from the stores. Its
    ``edge_time``: each timed edge type's times in the CSC's order, every neighbourhood sorted
    by them (the folder's ``edge_time``), sampled by as they lie. Its ``appended``: each edge
    type's appended edges (``gnnscale.sampling.segments``), empty where it took no append.
    """

    edge_time: dict[Any, Tensor]
    appended: dict[Any, list[Appended]]

    def read_ahead(self, seeds: Any, fanout: Any) -> None:
        """Read the neighbour lists ``seeds`` will need, ``fanout`` hops out, in flight."""
        ...

    def check_sampled(self, node: Any) -> None:
        """Refuse a sampled batch whose node ids lie outside their type's count."""
        ...


def sampling_backend() -> str:
    """Name the library that PyG's neighbour sampling runs on."""
    if torch_geometric.typing.WITH_PYG_LIB:
        return "pyg-lib"
    if torch_geometric.typing.WITH_TORCH_SPARSE:
        return "torch-sparse"
    return "none"


@functools.cache
def log_backend_once(sampler: str | None = None) -> None:
    """Log who samples neighbours, once a process: ``sampler``, else PyG's backend."""
    rank_zero_info(f"gnnscale: neighbour sampling by {sampler or sampling_backend()}")


def vectorized(sampler: str) -> bool:
    """Whether ``--data.loader.sampler`` ``sampler`` means :func:`sample_hops` on this install.

    ``auto``: where pyg-lib is not installed (torch-sparse, PyG's other backend, is the slow
    one, and neither is on PyPI).
    """
    return sampler == "vectorized" or (
        sampler == "auto" and not torch_geometric.typing.WITH_PYG_LIB
    )


def describe(sampler: str) -> str:
    """Who samples neighbours under ``--data.loader.sampler`` ``sampler``, in a few words."""
    if vectorized(sampler):
        return "gnnscale's vectorized sampler"
    return sampling_backend()


class HopSampler(NeighborSampler):
    """PyG's ``NeighborSampler``, sampling by :func:`~gnnscale.sampling.hops.sample_typed_hops`.

    Takes PyG's arguments, with PyG's meaning: ``time_attr`` (node or edge time: a node's
    in-edges from sources, or along edges, no newer than its seed's time, compared at every hop
    with the root seed's; temporal sampling is disjoint), ``temporal_strategy`` (``uniform`` or
    ``last``: the newest), ``weight_attr`` (each in-edge drawn with probability proportional to
    its weight; with time too, which pyg-lib refuses), and a seed's time from ``input_time`` or
    ``edge_label_time``, else its node time. Each neighbourhood is sorted by time once, here.
    Homogeneous and heterogeneous graphs, joint or disjoint subgraphs, node and edge seeds
    (``NeighborLoader``, ``LinkNeighborLoader`` with PyG's negatives), in memory or over a
    ``(FeatureStore, GraphStore)`` pair. Induced subgraphs go to PyG's backend (refused here
    where there is none), as does everything with ``vectorized`` false (time and weights too,
    where pyg-lib is installed).

    Over a prepared folder's store pair (``gnnscale.stores.open``) it reads each batch's
    neighbour lists ahead with the folder's threads and checks the ids it drew
    (``MappedGraphStore.read_ahead``, ``check_sampled``). There a batch's ``e_id`` costs a read
    of the folder's ``perm`` file per sampled edge (random, and from the disk when the graph is
    larger than memory): ``edge_ids=False`` leaves it out, for batches whose model reads no
    edge features.

    Args (beyond PyG's):
        strict: Sample only edges *before* the seed's time (``<``); PyG's rule, the default,
            is ``<=``, which lets an edge at exactly a label's time be its own message.
        window: Sample only edges not older than the seed's time minus ``window`` (the time
            column's units); ``None``: all.
        vectorized: Draw here; false: by PyG's backend (pyg-lib or torch-sparse).
        edge_ids: Give batches over a prepared folder their edges' ids (``e_id``).
    """

    def __init__(
        self,
        data: Any,
        num_neighbors: Any,
        subgraph_type: SubgraphType | str = "directional",
        replace: bool = False,
        disjoint: bool = False,
        temporal_strategy: str = "uniform",
        time_attr: str | None = None,
        weight_attr: str | None = None,
        is_sorted: bool = False,
        share_memory: bool = False,
        directed: bool = True,
        sample_direction: str = "forward",
        *,
        strict: bool = False,
        window: float | None = None,
        vectorized: bool = True,
        edge_ids: bool = True,
    ) -> None:
        self.rule = TimeRule(strict, temporal_strategy, window)
        self.vectorized = vectorized
        self.edge_ids = edge_ids
        if not vectorized:
            _check_backend(time_attr, weight_attr, strict, window)
        elif SubgraphType(subgraph_type) == SubgraphType.induced and sampling_backend() == "none":
            raise ValueError(
                "subgraph_type='induced' needs PyG's pyg-lib or torch-sparse: gnnscale's "
                "sampler draws directional and bidirectional subgraphs"
            )
        mapped = isinstance(data, tuple) and isinstance(data[1], ReadsAhead)
        held = None  # a prepared folder's edge times, kept from PyG's constructor
        if mapped and time_attr is not None:
            held = _held_time(data, time_attr)
        lifted = backend_checks_lifted() if vectorized else warnings.catch_warnings()
        with warnings.catch_warnings(), lifted:  # its advice to install pyg-lib, needless here
            warnings.filterwarnings("ignore", "Using '.*' without a 'pyg-lib' installation")
            super().__init__(
                data,
                num_neighbors,
                subgraph_type,
                replace,
                disjoint,
                temporal_strategy,
                None if held is not None else time_attr,
                weight_attr,
                is_sorted,
                share_memory,
                directed,
                sample_direction,  # type: ignore[arg-type]
            )
        self.store: ReadsAhead | None = data[1] if mapped else None
        self.held_time = held is not None  # edge times in CSC order, sorted: used as they are
        pyg: Any = self
        if held is not None:
            pyg.edge_time = held if self.is_hetero else held[None]
        #: Edges appended to a prepared folder, by the keys draws use (0, or rel strings).
        self.appended: dict[Any, list[Appended]] = {}
        if self.store is not None and self.store.appended:
            _check_appended(vectorized, weight_attr, sample_direction, self.subgraph_type)
            grown = self.store.appended
            if self.is_hetero:
                self.appended = {pyg.to_rel_type[t]: parts for t, parts in grown.items()}
            else:
                self.appended = {0: grown[None]}
        #: Each edge type's edge times in CSC order, ascending in every neighbourhood.
        self.clock: dict[Any, Tensor] | None = self._clock() if self.is_temporal else None
        weights: Any = self.edge_weight
        for key, weight in self._keyed(weights).items():
            check_weights(weight, f"{weight_attr} of {key}" if self.is_hetero else str(weight_attr))

    def with_fanout(self, num_neighbors: Any, edge_ids: bool | None = None) -> HopSampler:
        """A copy drawing ``num_neighbors`` that shares this sampler's CSC (one copy in memory)."""
        sampler = copy.copy(self)
        sampler.num_neighbors = num_neighbors
        if edge_ids is not None:
            sampler.edge_ids = edge_ids
        return sampler

    def sample_from_nodes(self, inputs: NodeSamplerInput) -> Any:
        """PyG's; without edge ids over a prepared folder if ``edge_ids`` is false."""
        return self._without_edge_ids(super().sample_from_nodes(inputs))

    def sample_from_edges(self, inputs: Any, neg_sampling: Any = None) -> Any:
        """PyG's; without edge ids over a prepared folder if ``edge_ids`` is false."""
        return self._without_edge_ids(super().sample_from_edges(inputs, neg_sampling))

    @property
    def edge_permutation(self) -> Any:
        """PyG's map of a batch's edges to edge ids; none where they are ids already (appends)."""
        return None if self.appended else self.perm

    def _without_edge_ids(self, out: Any) -> Any:
        if self.store is not None and not self.edge_ids:
            out.edge = None  # PyG's loader then maps no edge through perm and sets no e_id
        return out

    def sample_seeds(self, seed: Any, seed_time: Any = None, **kwargs: Any) -> Any:
        """One batch around ``seed``: read ahead and checked over a prepared folder."""
        if self.store is None:
            return self._draw(seed, seed_time, **kwargs)
        if self.is_hetero:
            fanout = self.num_neighbors.get_values(self.edge_types)
        else:
            fanout = {None: list(self.num_neighbors.values)}
        self.store.read_ahead(seed if isinstance(seed, dict) else {None: seed}, fanout)
        out = self._draw(seed, seed_time, **kwargs)
        self.store.check_sampled(out.node)
        return out

    # One edge type's tensors are keyed 0 in a homogeneous graph, by rel string in a
    # heterogeneous one, as PyG keys colptr_dict.

    def _keyed(self, values: Any) -> dict[Any, Any]:
        if values is None:
            return {}
        return values if self.is_hetero else {0: values}

    def _clock(self) -> dict[Any, Tensor]:
        """Each edge type's edge times in CSC order, sorting neighbourhoods by them if need be.

        PyG's constructor sorts a graph in memory (unless ``is_sorted``) and trusts a store to
        be sorted; a neighbourhood found unsorted is sorted here, its CSC, ``perm`` and weights
        with it. A prepared folder's times are in CSC order and sorted already
        (``held_time``): used as they lie. An edge type with no time (neither its own nor its
        source type's) is untimed.
        """
        pyg: Any = self  # PyG's attributes, typed in its branches only
        hetero = self.is_hetero
        colptrs = pyg.colptr_dict if hetero else {0: pyg.colptr}
        rows = pyg.row_dict if hetero else {0: pyg.row}
        edge_types: dict[Any, Any] = pyg.to_edge_type if hetero else {0: None}
        perms = pyg.perm if hetero else {None: pyg.perm}
        weights = self._keyed(pyg.edge_weight)
        edge_time = self._keyed(pyg.edge_time)
        clocks: dict[Any, Tensor] = {}
        for key, edge_type in edge_types.items():
            perm = perms.get(edge_type) if perms is not None else None
            if pyg.edge_time is not None:
                clock = edge_time.get(key, edge_time.get(edge_type))
                if clock is None:
                    continue
                if self.held_time:
                    clocks[key] = clock
                    continue
                if self.data_type == DataType.remote and perm is not None:
                    clock = clock.index_select(0, perm)  # a store's times are in its edge order
            else:
                node_time = pyg.node_time if not hetero else pyg.node_time.get(edge_type[0])
                if node_time is None:
                    continue
                clock = node_time.index_select(0, rows[key].long())
            order = time_order(colptrs[key], clock)
            if order is not None:
                clock = clock.index_select(0, order)
                rows[key] = rows[key].index_select(0, order)
                perm = order if perm is None else perm.index_select(0, order)
                if key in weights:
                    weights[key] = weights[key].index_select(0, order)
                if hetero:
                    pyg.perm[edge_type] = perm
                else:
                    pyg.row, pyg.perm = rows[key], perm
                    if pyg.edge_weight is not None:
                        pyg.edge_weight = weights[key]
            clocks[key] = clock
        return clocks

    def _root_time(self, seed: Any, seed_time: Any) -> Tensor:
        """Each seed position's time: as given (``input_time``), else its node's."""
        if not isinstance(seed, dict):
            seed, seed_time = {None: seed}, None if seed_time is None else {None: seed_time}
        node_time = self.node_time if self.is_hetero else {None: self.node_time}
        root = None
        for node_type, nodes in seed.items():
            if seed_time is not None and node_type in seed_time:
                times = seed_time[node_type]
            elif node_time is not None and node_time.get(node_type) is not None:
                times = node_time[node_type].index_select(0, nodes.long())
            else:
                raise ValueError(
                    "edge-level time_attr needs each seed's time: input_time (NeighborLoader) "
                    "or edge_label_time (LinkNeighborLoader)"
                )
            if root is None or root.numel() < times.numel():
                grown = times.new_empty(times.numel())
                if root is not None:
                    grown[: root.numel()] = root
                root = grown
            root[: times.numel()] = times  # one position, one time, whichever seed type holds it
        assert root is not None
        return root

    def _draw(self, seed: Any, seed_time: Any = None, **kwargs: Any) -> Any:
        if not self.vectorized or self.subgraph_type == SubgraphType.induced:
            return self.pyg_sample_seeds(seed, seed_time, **kwargs)
        timed: dict[str, Any] = {"rule": self.rule}
        if self.clock is not None:
            timed["root_time"] = self._root_time(seed, seed_time)
        if not isinstance(seed, dict):
            out = sample_hops(
                self.colptr,
                self.row,
                seed,
                list(self.num_neighbors.get_mapped_values()),
                self.replace,
                self.num_nodes if self.disjoint else None,
                clock=None if self.clock is None else self.clock.get(0),
                weight=self.edge_weight,
                appended=self.appended.get(0),
                **timed,
            )
            if self.appended:  # global positions to edge ids
                out.edge = take(self.perm, self.colptr, self.appended[0], "edge_id", out.edge)
            if self.sample_direction == "backward":
                out.row, out.col = out.col, out.row
            return out
        ends = {key: (t[0], t[-1]) for t, key in self.to_rel_type.items()}
        typed = sample_typed_hops(
            self.colptr_dict,
            self.row_dict,
            ends,
            seed,
            self.num_neighbors.get_mapped_values(self.edge_types),
            self.replace,
            self.num_nodes if self.disjoint else None,
            clock=self.clock,
            weight=self.edge_weight,
            appended=self.appended or None,
            **timed,
        )
        if self.appended:  # global positions to edge ids
            perm = self.perm or {}
            for key, edge in typed.edge.items():
                mapped = perm.get(self.to_edge_type[key])
                parts = self.appended[key]
                typed.edge[key] = take(mapped, self.colptr_dict[key], parts, "edge_id", edge)
        row, col = typed.row, typed.col
        if self.sample_direction == "backward":
            row, col = col, row
        # PyG's: rel strings back to edge types, and backward ones to the input's
        keyed = [self.to_edge_type]
        if self.sample_direction == "backward":
            keyed.append(self.to_restored_edge_type)

        def remap(d: dict[Any, Any]) -> dict[Any, Any]:
            for mapping in keyed:
                d = {mapping.get(k, k): v for k, v in d.items()}
            return d

        return HeteroSamplerOutput(
            node=typed.node,
            row=remap(row),
            col=remap(col),
            edge=remap(typed.edge),
            batch=typed.batch,
            num_sampled_nodes=typed.num_sampled_nodes,
            num_sampled_edges=remap(typed.num_sampled_edges),
        )


def _check_appended(
    vectorized: bool, weight_attr: str | None, sample_direction: str, subgraph_type: Any
) -> None:
    """Refuse what a folder that took appends cannot sample: its CSC is in parts."""
    refused = [
        ("vectorized=False", not vectorized),
        (f"weight_attr={weight_attr!r}", weight_attr is not None),
        ("sample_direction='backward'", sample_direction == "backward"),
        ("subgraph_type='induced'", SubgraphType(subgraph_type) == SubgraphType.induced),
    ]
    asked = [name for name, given in refused if given]
    if asked:
        raise ValueError(
            f"{', '.join(asked)}: this prepared folder took appends, which gnnscale's sampler "
            "alone reads (forward, unweighted); prepare the whole graph again to use them"
        )


def _held_time(stores: Any, time_attr: str) -> dict[Any, Tensor] | None:
    """A prepared folder's edge times (``time_attr="edge_time"``); ``None`` for node times.

    Node times (a node file such as ``time``) go to PyG's constructor, which reads them from
    the feature store; either is refused in one line where the folder does not hold it.
    """
    features, graph = stores
    if time_attr == "edge_time":
        if not graph.edge_time:
            raise ValueError(
                "time_attr='edge_time': this prepared folder holds no edge times; prepare it "
                "from edges with times (edge_time.npy, a time column: docs/stores.md)"
            )
        return dict(graph.edge_time)
    if not any(a.attr_name == time_attr for a in features.get_all_tensor_attrs()):
        kept = " (its edge times are time_attr='edge_time')" if graph.edge_time else ""
        raise ValueError(
            f"time_attr={time_attr!r}: this prepared folder holds no node file {time_attr!r}"
            f"{kept}; node times are prepared from time.npy beside x.npy (docs/stores.md)"
        )
    return None


def _check_backend(
    time_attr: str | None, weight_attr: str | None, strict: bool, window: float | None
) -> None:
    """Refuse what PyG's backend on this install would not sample as asked."""
    if strict or window is not None:
        raise ValueError(
            "strict and window are gnnscale's sampler's: sample with vectorized=True "
            "(PyG's backends compare time with <= and have no window)"
        )
    given = [("time_attr", time_attr), ("weight_attr", weight_attr)]
    asked = [f"{name}={value!r}" for name, value in given if value is not None]
    if asked and not torch_geometric.typing.WITH_PYG_LIB:
        raise ValueError(
            f"{' and '.join(asked)} need gnnscale's sampler (vectorized=True) or pyg-lib: "
            f"PyG's {sampling_backend()} would sample without them"
        )
