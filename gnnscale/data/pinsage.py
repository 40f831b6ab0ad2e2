"""PinSAGE's neighbours (random-walk visit counts) and hard negatives for link batches."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.data import HeteroData
from torch_geometric.typing import EdgeType

from gnnscale.errors import ConfigError


@dataclass(frozen=True)
class PinSAGENeighbors:
    """PinSAGE's importance neighbours: the destination nodes most visited by random walks.

    From every destination node (an item), ``num_walks`` walks of ``walk_length`` round trips
    over the training graph (item -> user -> item) count visits; each item's ``top_k`` most
    visited other items become its neighbours through a new relation
    ``item__similar__item``. Walks read training message-passing edges only (no leakage).

    Args:
        num_walks: Walks started from every item.
        walk_length: Round trips (item -> user -> item) per walk.
        top_k: Importance neighbours kept per item.
    """

    num_walks: int = 50
    walk_length: int = 2
    top_k: int = 10

    def __post_init__(self) -> None:
        """Refuse non-positive sizes."""
        if min(self.num_walks, self.walk_length, self.top_k) < 1:
            raise ConfigError(
                "--data.pinsage.num_walks, walk_length and top_k must be >= 1 (got "
                f"{self.num_walks}, {self.walk_length}, {self.top_k})"
            )


def pair_keys(index: Tensor, num_dst: int) -> Tensor:
    """Each (src, dst) pair as one sortable integer."""
    return index[0] * num_dst + index[1]


def _random_walk_step(rowptr: Tensor, col: Tensor, at: Tensor, gen: torch.Generator) -> Tensor:
    """One uniform step from every node in ``at`` (nodes without edges stay where they are)."""
    deg = rowptr[at + 1] - rowptr[at]
    offset = (torch.rand(at.numel(), generator=gen) * deg).long()
    step = col[(rowptr[at] + offset).clamp_(max=max(col.numel() - 1, 0))]
    return torch.where(deg > 0, step, at)


def pinsage_neighbors(
    edge_index: Tensor, num_src: int, num_dst: int, args: PinSAGENeighbors, seed: int = 0
) -> Tensor:
    """``(2, E)`` importance edges ``neighbour -> item`` between destination nodes (items).

    Args:
        edge_index: ``src -> dst`` edges (users rate items) to walk on, both ways.
        num_src: Source nodes (users).
        num_dst: Destination nodes (items).
        args: Walks per item, their length, neighbours kept.
        seed: Seed of the walks.
    """
    gen = torch.Generator().manual_seed(seed)
    src, dst = edge_index
    # item -> user adjacency (CSR by item) and user -> item (CSR by user).
    by_item = torch.argsort(dst, stable=True)
    item_ptr = torch.zeros(num_dst + 1, dtype=torch.long)
    item_ptr[1:] = torch.bincount(dst, minlength=num_dst).cumsum(0)
    by_user = torch.argsort(src, stable=True)
    user_ptr = torch.zeros(num_src + 1, dtype=torch.long)
    user_ptr[1:] = torch.bincount(src, minlength=num_src).cumsum(0)
    start = torch.arange(num_dst).repeat_interleave(args.num_walks)
    at, visits = start, []
    for _ in range(args.walk_length):
        user = _random_walk_step(item_ptr, src[by_item], at, gen)
        has_user = item_ptr[at + 1] > item_ptr[at]
        at = torch.where(has_user, _random_walk_step(user_ptr, dst[by_user], user, gen), at)
        visits.append(torch.stack([start, at]))
    pairs = torch.cat(visits, dim=1)
    pairs = pairs[:, pairs[0] != pairs[1]]
    keys, counts = torch.unique(pair_keys(pairs, num_dst), return_counts=True)
    item, other = keys // num_dst, keys % num_dst
    # Most visited first within each item: sort by (item, -count), keep the first top_k.
    order = torch.argsort(item * (counts.max() + 1) - counts, stable=True)
    item, other = item[order], other[order]
    first = torch.zeros(num_dst + 1, dtype=torch.long)
    first[1:] = torch.bincount(item, minlength=num_dst).cumsum(0)
    rank = torch.arange(item.numel()) - first[item]
    keep = rank < args.top_k
    return torch.stack([other[keep], item[keep]])  # messages flow neighbour -> item


class HardNegatives:
    """Adds ``per_positive`` hard negatives per positive, in the loader's workers.

    Hard: destination nodes of the batch's own sampled neighbourhood (near the source in the
    graph, unlike uniform ones) that are not known edges of the source.
    """

    def __init__(self, target: EdgeType, known: Tensor, num_dst: int, per_positive: int) -> None:
        self.target, self.known = target, known
        self.num_dst, self.per_positive = num_dst, per_positive

    def __call__(self, batch: HeteroData) -> HeteroData:
        """Add ``per_positive`` hard negatives per positive link to the batch's labels."""
        store = batch[self.target]
        src_type, _, dst_type = self.target
        positive = store.edge_label_index[:, store.edge_label == 1]
        src = positive[0].repeat(self.per_positive)
        dst = torch.randint(batch[dst_type].num_nodes, (src.numel(),))
        pairs = torch.stack([batch[src_type].n_id[src], batch[dst_type].n_id[dst]])
        keys = pair_keys(pairs, self.num_dst)
        at = torch.searchsorted(self.known, keys).clamp_(max=max(self.known.numel() - 1, 0))
        fresh = (
            self.known[at] != keys
            if self.known.numel()
            else torch.ones_like(keys, dtype=torch.bool)
        )
        store.edge_label_index = torch.cat(
            [store.edge_label_index, torch.stack([src, dst])[:, fresh]], 1
        )
        store.edge_label = torch.cat([store.edge_label, torch.zeros(int(fresh.sum()))])
        return batch
