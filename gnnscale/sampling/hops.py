"""Neighbour sampling a hop at a time in tensor operations.

Each hop draws the in-edges of all of its nodes at once, within each node's eligible range (all
of its in-edges, or those its seed's time allows: ``time.py``): a uniform subset (Floyd's
algorithm run across the nodes), the newest, or a draw by weight (``weights.py``). The sources
found are relabelled in one pass per node type (a table over the id range, or a sort). The output
is PyG's ``SamplerOutput``, plus the nodes and edges each hop added: seeds first, then each hop's
new nodes; edges grouped by target, in target order; ``edge`` the edges' positions in the CSC
(PyG maps them back to the input's edge ids). Draws come from torch's global generator, so a
batch sampled under a seed is the same batch every time.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch_geometric.sampler import HeteroSamplerOutput, SamplerOutput

from gnnscale.sampling.segments import Appended, sample_appended, take
from gnnscale.sampling.time import TimeRule, eligible
from gnnscale.sampling.weights import weighted_picks

__all__ = ["sample_hops", "sample_typed_hops"]

UNTIMED = TimeRule()  # PyG's rule; used only where a clock is given


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


def _sample_edges(
    start: Tensor, degree: Tensor, k: int, replace: bool, weight: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The CSC positions of ``k`` in-edges of each node (all: ``k < 0`` or fewer).

    Node ``i``'s eligible in-edges are ``start[i]:start[i] + degree[i]``; ``weight``: draw by
    each edge's weight, else uniformly. Returns the positions, grouped by node in order, and
    each one's node index. (Gathers here are ``index_select`` and ``index_copy_``: indexing
    with ``[ids]`` took up to 4x as long on the CPU, and the sampler about 15% longer.)
    """
    if k < 0:
        counts = degree
    elif replace:
        counts = torch.where(degree > 0, k, 0)
    else:
        counts = degree.clamp(max=k)
    owner = torch.repeat_interleave(torch.arange(degree.numel(), device=start.device), counts)
    if k >= 0 and replace and weight is None:
        draws = torch.rand(owner.numel(), dtype=torch.float64, device=start.device)
        return start.index_select(0, owner) + (draws * degree.index_select(0, owner)).long(), owner
    first = counts.cumsum(0) - counts  # each node's first slot
    position = (start - first).index_select(0, owner)
    position += torch.arange(owner.numel(), device=start.device)
    drawing = degree > (0 if replace else k)  # k drawn; others: all
    if k >= 0 and (many := drawing.nonzero().view(-1)).numel():
        slots = first.index_select(0, many).unsqueeze(1) + torch.arange(k, device=start.device)
        if weight is None:
            drawn = start.index_select(0, many).unsqueeze(1)
            drawn = drawn + _uniform_subsets(degree.index_select(0, many), k)
        else:
            drawn = weighted_picks(
                weight, start.index_select(0, many), degree.index_select(0, many), k, replace
            )
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
    *,
    clock: dict[Any, Tensor] | None = None,
    root_time: Tensor | None = None,
    rule: TimeRule = UNTIMED,
    weight: dict[Any, Tensor] | None = None,
    appended: dict[Any, list[Appended]] | None = None,
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
        clock: Sample by time (disjoint only): each edge type's edge times, in CSC order and
            ascending within each neighbourhood. An edge type without one is not timed.
        root_time: Each seed position's time, which every hop of its subgraph compares with.
        rule: Which edges a seed's time allows, and how to pick among them.
        weight: Draw each edge type's in-edges by these weights (CSC order), else uniformly.
        appended: Edges appended to each edge type's CSC (``segments.py``): a node's in-edges
            are its CSC's, then each append's; ``edge`` positions are then global.

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
            grown = None if appended is None else appended.get(key)
            if k == 0 or not frontier.numel():
                position = owner = empty
            else:
                at = frontier if num_nodes is None else frontier % num_nodes[dst]
                timed, when = clock is not None and key in clock, None
                if timed:
                    assert num_nodes is not None and root_time is not None
                    when = root_time.index_select(0, frontier // num_nodes[dst])
                if grown is not None:
                    times = clock[key] if clock is not None and timed else None
                    position, owner = sample_appended(
                        colptr[key], times, grown, at, when, rule, k, replace
                    )
                else:
                    start = colptr[key].index_select(0, at).long()
                    end = colptr[key].index_select(0, at + 1).long()
                    if timed:
                        assert clock is not None and when is not None
                        start, end = eligible(clock[key], start, end, when, rule, k)
                    drawn_by = None if weight is None else weight.get(key)
                    position, owner = _sample_edges(start, end - start, k, replace, drawn_by)
            if grown is not None:
                source = take(row[key], colptr[key], grown, "row", position).long()
            else:
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
    *,
    clock: Tensor | None = None,
    root_time: Tensor | None = None,
    rule: TimeRule = UNTIMED,
    weight: Tensor | None = None,
    appended: list[Appended] | None = None,
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
        clock: Sample by time (disjoint only): each edge's time, in CSC order.
        root_time: Each seed's time.
        rule: Which edges a seed's time allows, and how to pick among them.
        weight: Draw by these edge weights (CSC order), else uniformly.
        appended: Edges appended to the CSC (``segments.py``).

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
        clock=None if clock is None else {0: clock},
        root_time=root_time,
        rule=rule,
        weight=None if weight is None else {0: weight},
        appended=None if appended is None else {0: appended},
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
