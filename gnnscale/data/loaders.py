"""Loader wrappers every DataModule uses: resumable training order, per-rank evaluation shares."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from gnnscale.data.resume import ResumableLoader


def single(item: Any) -> DataLoader:
    """A loader that yields ``item`` once, uncollated."""
    return DataLoader([item], batch_size=None, collate_fn=_identity)  # type: ignore[arg-type]


def rank_own(trainer: L.Trainer | None, item: Any) -> Any:
    """:func:`single`; under DDP in a :class:`RankShare`: each rank's own ``item``, once.

    Lightning gives a ``DataLoader`` a distributed sampler, which shares out its one item: to
    every rank for validation and test (repeated), to rank 0 alone for predict.
    """
    loader = single(item)
    return loader if trainer is None or trainer.world_size == 1 else RankShare(loader)


def _identity(item: Any) -> Any:
    return item


def resumable(
    trainer: L.Trainer | None, loader: DataLoader, shuffle: bool, transform: Any = None
) -> ResumableLoader:
    """``loader`` wrapped in a ``ResumableLoader``, seeded and sharded for ``trainer``'s ranks.

    Every rank uses rank 0's seed, drawn from the global stream (``seed_everything`` fixes it),
    and takes its own share of each epoch's batches.
    """
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    if trainer is None:
        return ResumableLoader(loader, shuffle, seed, transform=transform)
    seed = trainer.strategy.broadcast(seed)
    rank, world_size = trainer.global_rank, trainer.world_size
    return ResumableLoader(loader, shuffle, seed, rank, world_size, transform)


class RankShare:
    """An evaluation loader over this rank's share of the seeds: every seed scored once.

    Given a ``DataLoader``, Lightning's DDP gives it a ``DistributedSampler``, which repeats
    seeds until the ranks have as many, and the repeats would count twice in the metrics. This
    wraps the loader of ``seeds[rank::world_size]`` in no ``DataLoader``, so Lightning keeps it
    as it is; the metrics then add up the ranks' counts.
    """

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)


def rank_share(
    trainer: L.Trainer | None,
    mask: Tensor | None,
    num_nodes: int,
    loader_of: Callable[[Tensor | None], DataLoader],
) -> Any:
    """The evaluation loader ``loader_of`` builds on the seeds of ``mask`` (``None``: all).

    Under DDP, the loader of this rank's share of those seeds, in a ``RankShare``.
    """
    if trainer is None or trainer.world_size == 1:
        return loader_of(mask)
    nodes = torch.arange(num_nodes) if mask is None else mask.nonzero().view(-1)
    return RankShare(loader_of(nodes[trainer.global_rank :: trainer.world_size]))


def rank_block(trainer: L.Trainer | None, num_nodes: int) -> Tensor | None:
    """Under DDP, this rank's block of ``num_nodes`` nodes, which its layer-wise inference computes.

    ``None`` in one process, or with fewer nodes than ranks (each then computes every node).
    """
    if trainer is None or trainer.world_size == 1 or num_nodes < trainer.world_size:
        return None
    return torch.arange(num_nodes).tensor_split(trainer.world_size)[trainer.global_rank]
