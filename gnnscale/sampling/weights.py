"""Weighted neighbour draws: each in-edge picked with probability proportional to its weight.

Without replacement, by exponential keys (Efraimidis and Spirakis, 2006): each edge draws
``log(u) / weight`` and every node keeps its ``k`` largest, as pyg-lib does. With replacement,
each draw lands on an edge by the node's cumulative weights. Both read every in-edge of the nodes
that draw (a node with at most ``k`` in-edges takes them all, uniform draws read none), so they
cost the sum of those nodes' degrees. A zero weight is never drawn while a positive one is left.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["check_weights", "weighted_picks"]


def check_weights(weight: Tensor, name: str) -> None:
    """Refuse weights that no draw can use: negative, NaN or infinite."""
    w = weight.double()
    if w.numel() and not bool(((w >= 0) & w.isfinite()).all()):
        raise ValueError(
            f"weight_attr {name!r} holds negative, NaN or infinite weights: "
            "sampling weights must be finite and >= 0"
        )


def weighted_picks(weight: Tensor, start: Tensor, degree: Tensor, k: int, replace: bool) -> Tensor:
    """``[len(start), k]`` edge positions: ``k`` in-edges of each node, drawn by ``weight``.

    Node ``i``'s in-edges are ``start[i]:start[i] + degree[i]``; each ``degree`` is at least 1,
    and above ``k`` unless ``replace``.
    """
    n = degree.numel()
    first = degree.cumsum(0) - degree
    owner = torch.repeat_interleave(torch.arange(n, device=degree.device), degree)
    position = start.index_select(0, owner) + (
        torch.arange(owner.numel(), device=degree.device) - first.index_select(0, owner)
    )
    w = weight.index_select(0, position).double()
    if replace:
        cum = torch.cat([w.new_zeros(1), w.cumsum(0)])
        base = cum.index_select(0, first)
        total = cum.index_select(0, first + degree) - base
        target = base.unsqueeze(1) + torch.rand(n, k, dtype=torch.float64) * total.unsqueeze(1)
        at = torch.searchsorted(cum, target.view(-1), right=True).view(n, k) - 1
        at = torch.minimum(torch.maximum(at, first.unsqueeze(1)), (first + degree - 1).unsqueeze(1))
        return position.index_select(0, at.view(-1)).view(n, k)
    key = torch.rand(owner.numel(), dtype=torch.float64).log_() / w  # weight 0: -inf
    order = torch.sort(key, descending=True, stable=True).indices
    order = order.index_select(0, torch.sort(owner.index_select(0, order), stable=True).indices)
    slots = first.unsqueeze(1) + torch.arange(k, device=degree.device)  # each node's k largest
    return position.index_select(0, order.index_select(0, slots.view(-1))).view(n, k)
