"""Neighbour sampling a hop at a time in tensor operations: PyG's ``NeighborSampler``, faster.

PyG's ``NeighborSampler`` hands homogeneous sampling to pyg-lib or, where pyg-lib is not
installed (it is not on PyPI), to torch-sparse. torch-sparse draws every sampled neighbour with a
``torch::randint`` call of its own, which allocates a one-element tensor: a [15, 10] batch of 1,024
seeds makes about 160,000 of them, most of the batch's time (``benchmarks/peers.py``).

:class:`HopSampler` is PyG's sampler with one method replaced: ``_sample``, for uniform, untimed
sampling of homogeneous and heterogeneous graphs, joint or disjoint, draws each hop's neighbours
for all of its nodes at once (a uniform subset of each node's in-edges, Floyd's algorithm run
across the nodes) and relabels them in one pass per node type (a table over the id range, or a
sort). Everything else (time, weights, induced subgraphs) goes to PyG's own ``_sample``. The
output is PyG's ``SamplerOutput``, plus the nodes and edges each hop added: seeds first, then each
hop's new nodes; edges grouped by target, in target order; ``edge`` the edges' positions in the
CSC (PyG maps them back to the input's edge ids). Draws come from torch's global generator, so a
batch sampled under a seed is the same batch every time.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
import torch_geometric.typing
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch_geometric.sampler import HeteroSamplerOutput, NodeSamplerInput, SamplerOutput
from torch_geometric.sampler.base import SubgraphType

from gnnscale._compat import NeighborSampler

__all__ = [
    "HopSampler",
    "ReadsAhead",
    "describe",
    "sample_hops",
    "sample_typed_hops",
    "vectorized",
]


@runtime_checkable
class ReadsAhead(Protocol):
    """A graph store that reads a batch's neighbour lists ahead and checks the ids drawn.

    A prepared folder's (``gnnscale.stores.MappedGraphStore``): :class:`HopSampler` asks it
    before and after each batch, so the sampler needs nothing from the stores.
    """

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


def _uniform_subsets(degree: Tensor, k: int) -> Tensor:
    """Row ``i``: ``k`` distinct positions in ``[0, degree[i])``, uniformly (each ``> k``).

    Floyd's algorithm (Bentley and Floyd, 1987), step ``t`` for every row at once: draw ``r`` in
    ``[0, j]`` for ``j = degree - k + t``; keep ``r`` unless this row holds it already, else ``j``.
    """
    # float64: exact below 2**53 neighbours
    draws = torch.rand(degree.numel(), k, dtype=torch.float64, device=degree.device)
    picks = torch.empty(degree.numel(), k, dtype=degree.dtype, device=degree.device)
    for t in range(k):
        j = degree - k + t
        r = (draws[:, t] * (j + 1)).to(degree.dtype).clamp_(max=j)
        if t:
            r = torch.where((picks[:, :t] == r.unsqueeze(1)).any(1), j, r)
        picks[:, t] = r
    return picks


def _sample_edges(colptr: Tensor, frontier: Tensor, k: int, replace: bool) -> tuple[Tensor, Tensor]:
    """The CSC positions of ``k`` in-edges of each ``frontier`` node (all: ``k < 0`` or fewer).

    Returns the positions, grouped by node in ``frontier``'s order, and each one's node index.
    (Gathers here are ``index_select`` and ``index_copy_``: indexing with ``[ids]`` took up to
    4x as long on the CPU, and the sampler about 15% longer.)
    """
    start = colptr.index_select(0, frontier).long()
    degree = colptr.index_select(0, frontier + 1).long() - start
    if k < 0:
        counts = degree
    elif replace:
        counts = torch.where(degree > 0, k, 0)
    else:
        counts = degree.clamp(max=k)
    owner = torch.repeat_interleave(torch.arange(frontier.numel(), device=start.device), counts)
    if k >= 0 and replace:
        draws = torch.rand(owner.numel(), dtype=torch.float64, device=start.device)
        return start.index_select(0, owner) + (draws * degree.index_select(0, owner)).long(), owner
    first = counts.cumsum(0) - counts  # each node's first slot
    position = (start - first).index_select(0, owner)
    position += torch.arange(owner.numel(), device=start.device)
    if k >= 0 and (many := (degree > k).nonzero().view(-1)).numel():  # k drawn; others: all
        slots = first.index_select(0, many).unsqueeze(1) + torch.arange(k, device=start.device)
        drawn = start.index_select(0, many).unsqueeze(1)
        drawn = drawn + _uniform_subsets(degree.index_select(0, many), k)
        position.index_copy_(0, slots.view(-1), drawn.view(-1))
    return position, owner


# Relabel with a table over the id range where it is at most this many times the ids relabelled:
# a few passes over the range cost less than a sort of the ids (13x less on a heterogeneous
# batch's 23,000 item ids in 10,000: 0.15 ms against 2.1), at most 9 bytes an id.
DENSE_RANGE = 32


def _add_new(known: Tensor, found: Tensor) -> tuple[Tensor, Tensor]:
    """Local ids of ``found`` among ``known``, and the ids not known yet (in id order).

    Known ids keep their positions; new ones take the next, in the order of their values: one
    table over the id range where it is small (:data:`DENSE_RANGE`), else one sort of both.
    """
    count = known.numel()
    if not found.numel():
        return found, found
    size = int(found.max()) + 1
    if count:
        size = max(size, int(known.max()) + 1)
    if found.device.type == "cpu" and size <= DENSE_RANGE * (count + found.numel()):
        return _add_new_by_table(known, found, size)
    unique, inverse = torch.unique(torch.cat([known, found]), return_inverse=True)
    local = torch.full_like(unique, -1)
    local.index_copy_(0, inverse[:count], torch.arange(count, device=known.device))
    new = local < 0
    added = unique.masked_select(new)
    local[new] = torch.arange(count, count + added.numel(), device=known.device)
    return local.index_select(0, inverse[count:]), added


def _add_new_by_table(known: Tensor, found: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """:func:`_add_new` through a local id for every id below ``size`` (numpy: fewer calls)."""
    seen, ids = known.numpy(), found.numpy()
    local = np.full(size, -1, dtype=np.int64)
    local[seen] = np.arange(seen.size)
    new = np.zeros(size, dtype=bool)
    new[ids] = True
    new[seen] = False
    added = np.flatnonzero(new)  # in id order
    local[added] = np.arange(seen.size, seen.size + added.size)
    return torch.from_numpy(local[ids]), torch.from_numpy(added)


def sample_typed_hops(
    colptr: dict[Any, Tensor],
    row: dict[Any, Tensor],
    ends: dict[Any, tuple[Any, Any]],
    seeds: dict[Any, Tensor],
    fanouts: dict[Any, list[int]],
    replace: bool = False,
    num_nodes: dict[Any, int] | None = None,
) -> HeteroSamplerOutput:
    """Sample each edge type's ``fanouts[key][h]`` in-edges of the nodes hop ``h`` reached.

    Hop ``h``, for every edge type whose destination type the last hop reached (hop 0: the
    seeds), draws a uniform subset of each such node's in-edges; the sources found, across
    every edge type into a node type, are relabelled once per node type. Edge types
    draw in the order of their keys, so a graph and its store give the same batch.

    Args:
        colptr: Each edge type's CSC pointer (``key``: any name, as PyG's rel strings).
        row: Each edge type's CSC source nodes.
        ends: Each edge type's (source, destination) node types.
        seeds: Seed nodes by node type (distinct, unless ``num_nodes`` is given).
        fanouts: In-edges per node at each hop, by edge type; ``-1``: all, ``0``: none.
        replace: Draw with replacement.
        num_nodes: Disjoint subgraphs, one per seed (PyG's ``disjoint=True``): every node type's
            count. A node is then (its seed's position, its id), and ``batch`` says which seed.

    Returns:
        PyG's ``HeteroSamplerOutput`` keyed as the input: ``node`` by node type (seeds first,
        then each hop's new nodes), ``row``/``col``/``edge`` by edge type (sources and targets
        as positions in their type's ``node``; edges as CSC positions, grouped by target),
        ``num_sampled_nodes`` and ``num_sampled_edges`` per hop; ``batch`` when disjoint.
    """
    types = list(dict.fromkeys([*seeds, *(t for pair in ends.values() for t in pair)]))
    some = next(iter(seeds.values()))
    empty = some.new_empty(0, dtype=torch.long)
    # A node is a key: its id, or (disjoint) seed position * its type's count + its id.
    known = {t: seeds[t].long() if t in seeds else empty for t in types}
    if num_nodes is not None:
        known = {t: torch.arange(k.numel()) * num_nodes[t] + k for t, k in known.items()}
    first = dict.fromkeys(types, 0)  # where the last hop's nodes begin
    counts = {t: [known[t].numel()] for t in types}
    rows: dict[Any, list[Tensor]] = {key: [] for key in ends}
    cols: dict[Any, list[Tensor]] = {key: [] for key in ends}
    edges: dict[Any, list[Tensor]] = {key: [] for key in ends}
    num_edges: dict[Any, list[int]] = {key: [] for key in ends}
    num_hops = len(next(iter(fanouts.values()), []))
    for h in range(num_hops):
        found: dict[Any, list[tuple[Any, Tensor]]] = {}
        for key in sorted(ends):  # draws in one order, however the graph lists its types
            src, dst = ends[key]
            frontier = known[dst][first[dst] :]
            k = fanouts[key][h]
            if k == 0 or not frontier.numel():
                position = owner = empty
            else:
                at = frontier if num_nodes is None else frontier % num_nodes[dst]
                position, owner = _sample_edges(colptr[key], at, k, replace)
            source = row[key].index_select(0, position).long()
            if num_nodes is not None:  # the source joins its target's subgraph
                source = frontier.index_select(0, owner) // num_nodes[dst] * num_nodes[src] + source
            cols[key].append(owner + first[dst])
            edges[key].append(position)
            num_edges[key].append(position.numel())
            found.setdefault(src, []).append((key, source))
        for t in types:
            first[t] = known[t].numel()
            parts = found.get(t, [])
            if not parts:
                counts[t].append(0)
                continue
            local, added = _add_new(known[t], torch.cat([source for _, source in parts]))
            sizes = [source.numel() for _, source in parts]
            for (key, _), ids in zip(parts, local.split(sizes), strict=True):
                rows[key].append(ids)
            known[t] = torch.cat([known[t], added])
            counts[t].append(added.numel())

    def joined(parts: dict[Any, list[Tensor]]) -> dict[Any, Tensor]:
        return {key: torch.cat(p) if p else empty for key, p in parts.items()}

    node, batch = known, None
    if num_nodes is not None:
        node = {t: k % num_nodes[t] for t, k in known.items()}
        batch = {t: k // num_nodes[t] for t, k in known.items()}
    return HeteroSamplerOutput(
        node=node,
        row=joined(rows),
        col=joined(cols),
        edge=joined(edges),
        batch=batch,
        num_sampled_nodes=counts,
        num_sampled_edges=num_edges,
    )


def sample_hops(
    colptr: Tensor,
    row: Tensor,
    seeds: Tensor,
    fanouts: list[int],
    replace: bool = False,
    num_nodes: int | None = None,
) -> SamplerOutput:
    """Sample ``fanouts[h]`` in-neighbours of each node hop ``h`` reached (hop 0: ``seeds``).

    :func:`sample_typed_hops` on a graph of one node and one edge type.

    Args:
        colptr: The graph's CSC pointer: node ``v``'s in-edges are ``colptr[v]:colptr[v + 1]``.
        row: The CSC's source nodes.
        seeds: The batch's seed nodes (distinct, unless ``num_nodes`` is given).
        fanouts: Neighbours per node at each hop; ``-1``: all of them.
        replace: Draw with replacement.
        num_nodes: Disjoint subgraphs, one per seed: the graph's node count.

    Returns:
        PyG's ``SamplerOutput``: ``node`` (seeds first, then each hop's new nodes), ``row`` and
        ``col`` (each edge's source and target, as positions in ``node``), ``edge`` (positions
        in the CSC), ``num_sampled_nodes`` and ``num_sampled_edges`` per hop; ``batch`` (each
        node's seed) when disjoint.
    """
    out = sample_typed_hops(
        {0: colptr},
        {0: row},
        {0: (0, 0)},
        {0: seeds},
        {0: fanouts},
        replace,
        None if num_nodes is None else {0: num_nodes},
    )
    return SamplerOutput(
        node=out.node[0],
        row=out.row[0],
        col=out.col[0],
        edge=out.edge[0],
        batch=None if out.batch is None else out.batch[0],
        num_sampled_nodes=out.num_sampled_nodes[0],
        num_sampled_edges=out.num_sampled_edges[0],
    )


def describe(sampler: str) -> str:
    """Who samples neighbours under ``--data.loader.sampler`` ``sampler``, in a few words."""
    if vectorized(sampler):
        return "gnnscale's vectorized sampler"
    return sampling_backend()


class HopSampler(NeighborSampler):
    """PyG's ``NeighborSampler``, sampling uniformly by :func:`sample_typed_hops`.

    Homogeneous and heterogeneous graphs, joint or disjoint subgraphs, node and edge seeds
    (``NeighborLoader``, ``LinkNeighborLoader`` with PyG's negatives). Takes PyG's arguments;
    what it does not cover (time, edge weights, induced subgraphs) goes to PyG's backend, as
    does everything with ``vectorized`` set to false.
    Over a prepared folder's store pair (``gnnscale.stores.open``) it reads each batch's
    neighbour lists ahead with the folder's threads and checks the ids it drew
    (``MappedGraphStore.read_ahead``, ``check_sampled``). There a batch's ``e_id`` costs a read
    of the folder's ``perm`` file per sampled edge (random, and from the disk when the graph is
    larger than memory): ``edge_ids = False`` leaves it out, for batches whose model reads no
    edge features.
    """

    vectorized = True
    edge_ids = True

    def __init__(self, data: Any, *args: Any, **kwargs: Any) -> None:
        with warnings.catch_warnings():  # its advice to install pyg-lib, needless here
            warnings.filterwarnings("ignore", "Using '.*' without a 'pyg-lib' installation")
            super().__init__(data, *args, **kwargs)
        mapped = isinstance(data, tuple) and isinstance(data[1], ReadsAhead)
        self.store: ReadsAhead | None = data[1] if mapped else None

    def sample_from_nodes(self, inputs: NodeSamplerInput) -> Any:
        """PyG's; without edge ids over a prepared folder if ``edge_ids`` is false."""
        return self._without_edge_ids(super().sample_from_nodes(inputs))

    def sample_from_edges(self, inputs: Any, neg_sampling: Any = None) -> Any:
        """PyG's; without edge ids over a prepared folder if ``edge_ids`` is false."""
        return self._without_edge_ids(super().sample_from_edges(inputs, neg_sampling))

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

    def _draw(self, seed: Any, seed_time: Any = None, **kwargs: Any) -> Any:
        simple = (
            self.vectorized
            and seed_time is None
            and self.node_time is None
            and getattr(self, "edge_time", None) is None
            and getattr(self, "edge_weight", None) is None
            and self.subgraph_type == SubgraphType.directional
        )
        if not simple:
            return self.pyg_sample_seeds(seed, seed_time, **kwargs)
        if not isinstance(seed, dict):
            out = sample_hops(
                self.colptr,
                self.row,
                seed,
                list(self.num_neighbors.get_mapped_values()),
                self.replace,
                self.num_nodes if self.disjoint else None,
            )
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
        )
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
