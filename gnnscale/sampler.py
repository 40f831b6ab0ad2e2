"""Neighbour sampling a hop at a time in tensor operations: PyG's ``NeighborSampler``, faster.

PyG's ``NeighborSampler`` hands homogeneous sampling to pyg-lib or, where pyg-lib is not
installed (it is not on PyPI), to torch-sparse. torch-sparse draws every sampled neighbour with a
``torch::randint`` call of its own, which allocates a one-element tensor: a [15, 10] batch of 1,024
seeds makes about 160,000 of them, most of the batch's time (``benchmarks/peers.py``).

:class:`HopSampler` is PyG's sampler with one method replaced: ``_sample``, for the homogeneous,
uniform, untimed case, draws each hop's neighbours for all of its nodes at once (a uniform subset of
each node's in-edges, Floyd's algorithm run across the nodes) and relabels them with one sort.
Everything else (heterogeneous graphs, time, weights, disjoint or induced subgraphs) goes to PyG's
own ``_sample``. The output is what torch-sparse returns, plus the nodes and edges each hop added:
seeds first, then each hop's new nodes; edges grouped by target, in target order; ``edge`` the
edges' positions in the CSC (PyG maps them back to the input's edge ids). Draws come from torch's
global generator, so a batch sampled under a seed is the same batch every time.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Protocol, runtime_checkable

import torch
import torch_geometric.typing
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch_geometric.sampler import NeighborSampler, NodeSamplerInput, SamplerOutput
from torch_geometric.sampler.base import SubgraphType

__all__ = ["HopSampler", "ReadsAhead", "describe", "sample_hops", "vectorized"]


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

    ``auto``: where pyg-lib is not installed (torch-sparse is the slow backend).
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


def sample_hops(
    colptr: Tensor, row: Tensor, seeds: Tensor, fanouts: list[int], replace: bool = False
) -> SamplerOutput:
    """Sample ``fanouts[h]`` in-neighbours of each node hop ``h`` reached (hop 0: ``seeds``).

    Args:
        colptr: The graph's CSC pointer: node ``v``'s in-edges are ``colptr[v]:colptr[v + 1]``.
        row: The CSC's source nodes.
        seeds: The batch's seed nodes (distinct).
        fanouts: Neighbours per node at each hop; ``-1``: all of them.
        replace: Draw with replacement.

    Returns:
        PyG's ``SamplerOutput``: ``node`` (seeds first, then each hop's new nodes), ``row`` and
        ``col`` (each edge's source and target, as positions in ``node``), ``edge`` (positions
        in the CSC), ``num_sampled_nodes`` and ``num_sampled_edges`` per hop.
    """
    seeds = seeds.long()
    rows, cols, edges = [], [], []
    num_nodes, num_edges = [seeds.numel()], []
    known, first_new = seeds, 0  # every node so far, in local order; where the last hop begins
    for k in fanouts:
        frontier = known[first_new:]
        position, owner = _sample_edges(colptr, frontier, k, replace)
        source = row.index_select(0, position).long()
        # Local ids: known nodes keep theirs; new ones follow, in the order of their global ids.
        unique, inverse = torch.unique(torch.cat([known, source]), return_inverse=True)
        local = torch.full_like(unique, -1)
        count = known.numel()
        local.index_copy_(0, inverse[:count], torch.arange(count, device=known.device))
        new = local < 0
        added = unique.masked_select(new)
        ids = torch.arange(count, count + added.numel(), device=known.device)
        local[new] = ids
        rows.append(local.index_select(0, inverse[count:]))
        cols.append(owner + first_new)
        edges.append(position)
        num_nodes.append(added.numel())
        num_edges.append(position.numel())
        first_new, known = known.numel(), torch.cat([known, added])
    return SamplerOutput(
        node=known,
        row=torch.cat(rows) if rows else seeds.new_empty(0),
        col=torch.cat(cols) if cols else seeds.new_empty(0),
        edge=torch.cat(edges) if edges else seeds.new_empty(0),
        num_sampled_nodes=num_nodes,
        num_sampled_edges=num_edges,
    )


def describe(sampler: str) -> str:
    """Who samples neighbours under ``--data.loader.sampler`` ``sampler``, in a few words."""
    backend = sampling_backend()
    if vectorized(sampler):
        return f"gnnscale's vectorized sampler (heterogeneous graphs: {backend})"
    return backend


class HopSampler(NeighborSampler):
    """PyG's ``NeighborSampler``; homogeneous uniform sampling by :func:`sample_hops`.

    Takes PyG's arguments; whatever :func:`sample_hops` does not cover goes to PyG's backend,
    as does everything with ``vectorized`` set to false. Over a prepared folder's store pair
    (``gnnscale.stores.open``) it reads each batch's neighbour lists ahead with the folder's
    threads and checks the ids it drew (``MappedGraphStore.read_ahead``, ``check_sampled``).
    There a batch's ``e_id`` costs a read of the folder's ``perm`` file per sampled edge
    (random, and from the disk when the graph is larger than memory): ``edge_ids = False``
    leaves it out, for batches whose model reads no edge features.
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
        """PyG's, read ahead and checked over a prepared folder's store pair."""
        if self.store is None:
            return super().sample_from_nodes(inputs)
        if self.is_hetero:
            fanout = self.num_neighbors.get_values(self.edge_types)
        else:
            fanout = {None: list(self.num_neighbors.values)}
        self.store.read_ahead({inputs.input_type: inputs.node}, fanout)
        out = super().sample_from_nodes(inputs)
        self.store.check_sampled(out.node)
        if not self.edge_ids:
            out.edge = None  # PyG's loader then maps no edge through perm and sets no e_id
        return out

    def _sample(self, seed: Any, seed_time: Any = None, **kwargs: Any) -> Any:
        simple = (
            self.vectorized
            and isinstance(seed, Tensor)
            and seed_time is None
            and self.node_time is None
            and getattr(self, "edge_time", None) is None
            and getattr(self, "edge_weight", None) is None
            and self.subgraph_type == SubgraphType.directional
            and not self.disjoint
        )
        if not simple:
            return super()._sample(seed, seed_time, **kwargs)
        out = sample_hops(
            self.colptr, self.row, seed, list(self.num_neighbors.get_mapped_values()), self.replace
        )
        if self.sample_direction == "backward":
            out.row, out.col = out.col, out.row
        return out
