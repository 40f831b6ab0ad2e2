"""What batches carry between the DataModules and the models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import HeteroData
from torch_geometric.loader import (
    NeighborLoader,
)
from torch_geometric.typing import EdgeType


@dataclass
class LayerwiseBatch:
    """One evaluation step that runs exact layer-wise inference over the whole graph.

    Args:
        loader: Loader of full one-hop neighbourhoods of all nodes.
        y: Labels of all nodes.
        mask: Nodes to score; ``None`` for all (predict).
    """

    loader: NeighborLoader
    y: Tensor
    mask: Tensor | None


@dataclass
class LinkEval:
    """One evaluation step: every node's embedding, then a ranking of candidates per source.

    Args:
        graph: The graph evaluation passes messages on.
        target: The supervised relation ``(src, rel, dst)``.
        loaders: Per node type (the target's two), batches that embed each of its nodes.
        positives: ``(2, P)`` true edges to find (global ids); under DDP, this rank's share.
        known: Sorted keys (``pair_keys``) of edges already known: masked out of rankings.
        label_index: ``(2, L)`` labelled pairs for AUC (true edges and sampled non-edges);
            under DDP, this rank's share.
        label: Their labels.
        popularity: Each destination's degree in the known edges (the popularity baseline).
        candidates: Destination nodes ranked (``None``: all).
        k: Cut-off of the ranking metrics.
        batch_size: Sources ranked per chunk.
    """

    graph: HeteroData
    target: EdgeType
    loaders: dict[str, NeighborLoader]
    positives: Tensor
    known: Tensor
    label_index: Tensor
    label: Tensor
    popularity: Tensor
    candidates: Tensor | None
    k: int
    batch_size: int

    @property
    def suffix(self) -> str:
        """How the metrics' names say what was ranked: '' if every destination, else ``_of<n>``."""
        return "" if self.candidates is None else f"_of{self.candidates.numel()}"

    def rank(self, scores: Any) -> tuple[Tensor, Tensor]:
        """Top-``k`` destinations of every source with positives, scored by ``scores``.

        Args:
            scores: ``scores(sources, dsts) -> (len(sources), len(dsts))``.

        Returns:
            ``(S, k)`` top destinations (global ids), and the positives as ``(row, dst)``: what
            PyG's ``LinkPredMetric.update`` takes.
        """
        sources, row = torch.unique(self.positives[0], return_inverse=True)
        if not sources.numel():  # a DDP rank whose share holds no source (a tiny graph)
            return torch.empty(0, self.k, dtype=torch.long), self.positives
        num_dst = self.popularity.numel()
        sampled = torch.zeros(num_dst, dtype=torch.bool)
        if self.candidates is not None:
            sampled[self.candidates] = True
        tops = []
        for chunk in torch.split(torch.arange(sources.numel()), self.batch_size):
            mine = (row >= chunk[0]) & (row <= chunk[-1])
            r, d = row[mine] - chunk[0], self.positives[1, mine]
            if self.candidates is None:
                cols = torch.arange(num_dst)
            else:  # the sample, and this chunk's own positives
                cols = torch.unique(torch.cat([self.candidates, d]))
            local = torch.full((num_dst,), -1, dtype=torch.long)
            local[cols] = torch.arange(cols.numel())
            s = scores(sources[chunk], cols).float()
            if self.candidates is not None:  # another source's positive is not a candidate
                own = s[r, local[d]]
                s[:, ~sampled[cols]] = float("-inf")
                s[r, local[d]] = own
            known_r, known_d = self._known(sources[chunk], num_dst)
            ranked = local[known_d] >= 0
            s[known_r[ranked], local[known_d[ranked]]] = float("-inf")
            tops.append(cols[s.topk(min(self.k, cols.numel()), dim=1).indices])
        return torch.cat(tops), torch.stack([row, self.positives[1]])

    def _known(self, sources: Tensor, num_dst: int) -> tuple[Tensor, Tensor]:
        """Known edges of ``sources``: ``(row in sources, dst)``."""
        lo = torch.searchsorted(self.known, sources * num_dst)
        hi = torch.searchsorted(self.known, (sources + 1) * num_dst)
        counts = hi - lo
        row = torch.arange(sources.numel()).repeat_interleave(counts)
        offset = torch.arange(int(counts.sum())) - (counts.cumsum(0) - counts).repeat_interleave(
            counts
        )
        return row, self.known[lo.repeat_interleave(counts) + offset] % num_dst
