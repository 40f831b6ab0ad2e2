"""Time-respecting neighbourhoods: which in-edges of a node a seed at time ``t`` may sample.

Each edge has a time (its own, or its source node's), and each neighbourhood is sorted by it
once (:func:`time_order`), so the in-edges a seed may sample are one run of that order: those
at or before ``t`` (before it, ``strict``), and not before ``t - window``. One binary search per
node and bound finds the run, for every node of a hop at once (:func:`first_after`).

Every hop compares with the *root seed's* time, as PyG (pyg-lib) and GraphBolt do: a
two-hop neighbour may be newer than the one-hop neighbour that led to it, as long as it is not
newer than the seed. A causal path (each hop no newer than the last) is a stricter rule that
none of them samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["TimeRule", "eligible", "first_after", "time_order"]

STRATEGIES = ("uniform", "last")


@dataclass(frozen=True)
class TimeRule:
    """Which in-edges a seed at time ``t`` may sample, and how to pick among them.

    Args:
        strict: Only edges before ``t`` (``<``); else at or before it (``<=``, PyG's rule).
        strategy: ``uniform``: a uniform subset of the eligible edges; ``last``: the newest.
        window: Only edges not before ``t - window`` (the time column's units); ``None``: all.
    """

    strict: bool = False
    strategy: str = "uniform"
    window: float | None = None

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"temporal_strategy must be one of {', '.join(STRATEGIES)} (got {self.strategy!r})"
            )
        if self.window is not None and not self.window >= 0:
            raise ValueError(f"window must be >= 0 or None (got {self.window})")


def first_after(values: Tensor, lo: Tensor, hi: Tensor, bound: Tensor, inclusive: bool) -> Tensor:
    """For each ``i``: the first position in ``[lo[i], hi[i])`` past ``bound[i]``, else ``hi[i]``.

    ``values`` ascends within each range. Past: greater than ``bound`` (``inclusive``: values
    equal to it are not past), else at least ``bound``. All ranges are searched together, one
    halving a step, so a hop costs about log2(its largest degree) tensor passes.
    """
    lo, hi = lo.clone(), hi.clone()
    last = max(values.numel() - 1, 0)
    while bool((active := lo < hi).any()):
        mid = (lo + hi) // 2
        at = values.index_select(0, mid.clamp(max=last))
        before = (at <= bound) if inclusive else (at < bound)
        lo = torch.where(active & before, mid + 1, lo)
        hi = torch.where(active & ~before, mid, hi)
    return lo


def eligible(
    clock: Tensor, start: Tensor, end: Tensor, when: Tensor, rule: TimeRule, k: int
) -> tuple[Tensor, Tensor]:
    """Narrow each node's in-edge range ``[start, end)`` to the edges a seed at ``when`` may sample.

    ``clock``: each edge's time, ascending within every neighbourhood; ``k``: the hop's fan-out
    (``last`` keeps the newest ``k``; ``-1``: all).
    """
    end = first_after(clock, start, end, when, inclusive=not rule.strict)
    if rule.window is not None:
        start = first_after(clock, start, end, when - rule.window, inclusive=False)
    if rule.strategy == "last" and k >= 0:
        start = torch.maximum(start, end - k)
    return start, end


def time_order(colptr: Tensor, clock: Tensor) -> Tensor | None:
    """The order that sorts each neighbourhood of a CSC by ``clock``; ``None`` if it is sorted.

    Stable: edges of one time keep their order.
    """
    if clock.numel() < 2:
        return None
    target = torch.repeat_interleave(
        torch.arange(colptr.numel() - 1, device=clock.device), colptr.diff().long()
    )
    if not bool(((clock[1:] < clock[:-1]) & (target[1:] == target[:-1])).any()):
        return None
    order = torch.sort(clock, stable=True).indices
    return order.index_select(0, torch.sort(target.index_select(0, order), stable=True).indices)
