"""A CSC and the edges appended to it, sampled as one graph.

A prepared folder that took appends (``gnnscale.stores.append``) holds each append's edges as a
small CSC of its own (:class:`Appended`: the destinations it reaches, their new in-edges). A
node's in-edges are then its slots in the folder's CSC, followed by its slots in each append, in
order. Appended edges are no older than the edges before them, so that sequence is sorted by
time as a whole, and a draw over it (a uniform subset, the newest, all) is the draw a CSC
prepared from every edge at once would make: the draws here run over one virtual range per node
(:func:`sample_appended`), and only the positions found are mapped to a part.

Positions are global: the folder's slots ``0..E0-1``, then each append's, after the ones before
it. :func:`take` reads any per-slot array (sources, edge ids, times) at such positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gnnscale.sampling.time import TimeRule, eligible

__all__ = ["Appended", "sample_appended", "take"]


@dataclass(frozen=True)
class Appended:
    """One append's edges of one edge type: the in-edges of ``nodes`` as a CSC of their own.

    Args:
        nodes: The destinations it reaches, ascending.
        colptr: ``nodes[i]``'s appended in-edges are ``colptr[i]:colptr[i + 1]``.
        row: Each slot's source.
        edge_id: Each slot's edge id (the folder's ids go on: an append's first edge is the
            count of edges before it).
        clock: Each slot's time, ascending within each destination; ``None``: untimed.
    """

    nodes: Tensor
    colptr: Tensor
    row: Tensor
    edge_id: Tensor
    clock: Tensor | None = None


def _ranges(colptr: Tensor, parts: list[Appended], at: Tensor) -> tuple[Tensor, Tensor]:
    """Each node's slots in the CSC and in each part, as local ``[start, end)``: ``[n, parts+1]``.

    Nodes past the CSC's own (added by an append) have none there.
    """
    n0 = colptr.numel() - 1
    inside = at < n0
    a = torch.where(inside, at, 0)
    zero = torch.zeros_like(at)
    starts = [torch.where(inside, colptr.index_select(0, a).long(), zero)]
    ends = [torch.where(inside, colptr.index_select(0, a + 1).long(), zero)]
    for part in parts:
        if not part.nodes.numel():
            starts.append(zero)
            ends.append(zero)
            continue
        i = torch.searchsorted(part.nodes, at).clamp(max=part.nodes.numel() - 1)
        hit = part.nodes.index_select(0, i) == at
        starts.append(torch.where(hit, part.colptr.index_select(0, i), zero))
        ends.append(torch.where(hit, part.colptr.index_select(0, i + 1), zero))
    return torch.stack(starts, 1), torch.stack(ends, 1)


def sample_appended(
    colptr: Tensor,
    clock: Tensor | None,
    parts: list[Appended],
    at: Tensor,
    when: Tensor | None,
    rule: TimeRule,
    k: int,
    replace: bool,
) -> tuple[Tensor, Tensor]:
    """Global positions of ``k`` in-edges of each node of ``at`` (all: ``k < 0``); their owners.

    ``clock`` (the CSC's times) and ``when`` (each node's seed time): draw among the edges the
    rule allows, in the CSC and every part alike.
    """
    from gnnscale.sampling.hops import _sample_edges  # hops imports this module

    start, end = _ranges(colptr, parts, at)
    if when is not None and clock is not None:
        clocks = [clock, *(p.clock for p in parts)]
        for c, times in enumerate(clocks):
            assert times is not None
            start[:, c], end[:, c] = eligible(times, start[:, c], end[:, c], when, rule, -1)
    degree = end - start
    total = degree.sum(1)
    first = torch.zeros_like(total)  # each node's range over its whole sequence: [first, total)
    if when is not None and rule.strategy == "last" and k >= 0:
        first = (total - k).clamp(min=0)
    offset, owner = _sample_edges(first, total - first, k, replace)
    before = degree.cumsum(1) - degree  # each part's first offset in a node's sequence
    mine = before.index_select(0, owner)
    # The last part that starts at or before the offset: never an empty one (an empty part
    # starts where the next does, and no offset reaches past the last).
    which = ((offset.unsqueeze(1) >= mine).sum(1) - 1).unsqueeze(1)
    local = (
        start.index_select(0, owner).gather(1, which) + offset.unsqueeze(1) - mine.gather(1, which)
    )
    return local.squeeze(1) + _firsts(colptr, parts).index_select(0, which.squeeze(1)), owner


def _firsts(colptr: Tensor, parts: list[Appended]) -> Tensor:
    """The global position of each one's first slot: the CSC's (0), then each part's."""
    sizes = torch.tensor(
        [int(colptr[-1]) if colptr.numel() else 0, *(p.row.numel() for p in parts)]
    )
    return sizes.cumsum(0) - sizes


def take(
    base: Tensor | None, colptr: Tensor, parts: list[Appended], field: str, position: Tensor
) -> Tensor:
    """A per-slot array at global positions: ``base`` in the CSC, each part's ``field`` after.

    ``base`` ``None``: the CSC's slots are their own values (edge ids where no ``perm`` maps
    them).
    """
    firsts = _firsts(colptr, parts)
    which = torch.bucketize(position, firsts[1:], right=True)  # 0: the CSC's
    in_csc = (which == 0).nonzero().view(-1)
    found = position.index_select(0, in_csc)
    values = found if base is None else base.index_select(0, found)
    out = values.new_empty(position.shape)
    out.index_copy_(0, in_csc, values)
    for j, part in enumerate(parts, 1):
        mine = (which == j).nonzero().view(-1)
        if mine.numel():
            local = position.index_select(0, mine) - firsts[j]
            out.index_copy_(0, mine, getattr(part, field).index_select(0, local).to(out.dtype))
    return out
