"""The batch contract: what batches carry between the loaders' workers and the models.

Every node-classification training batch, whatever sampled it, carries ``x``, ``edge_index``,
``y`` and a per-node ``loss_weight`` (with ``num_loss_nodes`` for logging; the DataModule owns the
weights). How its rows and edges are laid out is one typed field, ``layout``, which the loader's
worker sets (``gnnscale.data.layout``) and the model's ``forward`` reads:

- :class:`HopLayout`: a neighbour batch, hop by hop, its edges sorted by target;
- :class:`SubgraphLayout`: a Cluster-GCN or GraphSAINT subgraph, its edges sorted by target;
- :class:`WholeGraph`: the whole graph evaluated at once, with the nodes it scores;
- none: the whole graph as PyG's loaders give it (a full training batch).

What the workers add is decided once, from the ``BatchRequest`` that the model returns and its
DataModule receives (``gnnscale.handshake``); the DataModule never reads the model's attributes.
Evaluation batches that are not sampled subgraphs are
:class:`LayerwiseBatch` (exact layer-wise inference) and :class:`LinkEval` (link ranking).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch_geometric.data import Data, HeteroData
from torch_geometric.loader import NeighborLoader
from torch_geometric.typing import EdgeType

__all__ = [
    "FeatureReads",
    "HopLayout",
    "LayerwiseBatch",
    "Layout",
    "LinkEval",
    "SubgraphLayout",
    "TemporalBatch",
    "WholeGraph",
    "feature_reads",
    "layout_of",
    "loss_count",
    "mrr",
    "supervise",
]


class HopLayout(NamedTuple):
    """A neighbour batch laid out hop by hop, edges sorted by target (``hop_layout``).

    Both sampling backends list a batch's nodes hop by hop, seeds first; with the edges sorted by
    target, layer ``i`` of ``L`` reads a prefix of the nodes and of the edges.

    Args:
        num_sampled_nodes: Nodes per hop, seeds first (of the whole sample).
        num_sampled_edges: Edges per hop (of the whole sample).
        rowptr: CSR row pointer of the batch's edges by target.
        x_aggr: The first layer's aggregation of the raw features, computed by the worker
            (``aggregate_first_layer``): the batch's ``x`` then holds that layer's targets only.
    """

    num_sampled_nodes: list[int]
    num_sampled_edges: list[int]
    rowptr: Tensor
    x_aggr: Tensor | None = None


class SubgraphLayout(NamedTuple):
    """A Cluster-GCN or GraphSAINT subgraph, edges sorted by target (``subgraph_layout``).

    Args:
        rowptr: CSR row pointer of the batch's edges by target; every node is computed.
    """

    rowptr: Tensor


class WholeGraph(NamedTuple):
    """The whole graph as one evaluation batch: every node computed, the nodes to score named.

    Args:
        score: Mask of the nodes scored (the validation or test nodes, a DDP rank's block);
            none: every node.
    """

    score: Tensor | None = None


Layout = HopLayout | SubgraphLayout | WholeGraph


def layout_of(batch: Data) -> Layout | None:
    """The layout a loader's worker gave ``batch``; ``None``: the whole graph, as PyG's."""
    return batch.get("layout")


class FeatureReads(NamedTuple):
    """A batch's feature rows read from a prepared folder, and how many its cache held.

    A loader's transform sets it (``MappedFeatureStore.count_held``) where a cache is filled.
    """

    cached: int
    total: int


def feature_reads(batch: Any) -> FeatureReads | None:
    """What ``batch``'s feature rows were read from (``FeatureReads``); none: not counted."""
    return getattr(batch, "feature_reads", None)


def loss_count(batch: Any) -> int:
    """How many examples ``batch``'s loss covers (``supervise``): seeds, labelled pairs, graphs.

    0 for a batch that is not a gnnscale DataModule's.
    """
    return int(getattr(batch, "num_loss_nodes", 0))


def supervise(batch: Data | HeteroData, weight: Tensor, count: int, on: Any = None) -> None:
    """Set what a training batch's loss covers; every DataModule's training batches go through it.

    ``loss_weight`` (a weight per node, pair or graph, whose sum per batch is 1 in expectation)
    goes on ``on`` (a node or edge type's store of a heterogeneous batch; default: the batch),
    ``num_loss_nodes`` (what ``ThroughputMonitor`` counts) on the batch. A batch repeated to even
    out the DDP ranks' counts (``padding``, ``gnnscale.data.resume``) weighs nothing, so every
    example trains once per epoch across ranks.
    """
    if batch.get("padding", False):
        weight, count = torch.zeros_like(weight), 0
    (batch if on is None else on).loss_weight = weight
    batch.num_loss_nodes = count


@dataclass
class LayerwiseBatch:
    """One evaluation step that runs exact layer-wise inference over the whole graph.

    Under DDP each process computes its own block of nodes in each layer, and the processes sum
    the layer's outputs (zero outside each block), so that every process holds all of them for
    the next layer; each then scores the nodes of its block.

    Args:
        loader: Loader of full one-hop neighbourhoods of all nodes (under DDP, of this process's
            block), seeds first: their ids (``n_id``) and edges only, features not gathered (as
            in PyG's inference examples).
        x: Every node's input features, in memory or mapped from a prepared graph's file.
        y: Labels of all nodes.
        mask: Nodes to score (under DDP, of this process's block); ``None`` for all (predict).
        read_threads: Threads that gather a batch's rows of ``x`` (a prepared graph's).
        shared: Whether the loader holds one block of the nodes, and the processes of the
            default process group sum each layer's outputs.
    """

    loader: NeighborLoader
    x: Tensor
    y: Tensor
    mask: Tensor | None
    read_threads: int = 1
    shared: bool = False


@dataclass
class LinkEval:
    """One evaluation step: the nodes' embeddings, then a ranking of candidates per source.

    The link model ranks them (``gnnscale.models.link.top_destinations``).

    Args:
        num_nodes: Nodes of each type (the target's two).
        target: The supervised relation ``(src, rel, dst)``.
        loaders: Per node type (the target's two), batches that embed each of its nodes
            (of ``embedded``, if given).
        positives: ``(2, P)`` true edges to find (global ids); under DDP, this rank's share.
        known: Sorted keys (``pair_keys``) of edges already known: masked out of rankings.
        label_index: ``(2, L)`` labelled pairs for AUC (true edges and sampled non-edges);
            under DDP, this rank's share.
        label: Their labels.
        popularity: Each destination's degree in the known edges (the popularity baseline).
        candidates: Destination nodes ranked (``None``: all).
        k: Cut-off of the ranking metrics.
        batch_size: Sources ranked per chunk.
        embedded: Per node type, the sorted ids of the only nodes embedded: those the
            ranking and AUC read when ``candidates`` are sampled. ``None``: every node.
    """

    num_nodes: dict[str, int]
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
    embedded: dict[str, Tensor] | None = None

    def count(self, node_type: str) -> int:
        """Nodes of ``node_type`` embedded: every node, or those of ``embedded``."""
        if self.embedded is None:
            return self.num_nodes[node_type]
        return self.embedded[node_type].numel()

    def rows(self, node_type: str, ids: Tensor) -> Tensor:
        """Where nodes ``ids`` of ``node_type`` lie among its embeddings (``embedded``)."""
        return ids if self.embedded is None else torch.searchsorted(self.embedded[node_type], ids)

    @property
    def suffix(self) -> str:
        """How the metrics' names say what was ranked: '' if every destination, else ``_of<n>``."""
        return "" if self.candidates is None else f"_of{self.candidates.numel()}"


@dataclass
class TemporalBatch:
    """Questions ``(source, candidates, time)`` and the sampled neighbourhoods that answer them.

    Seeds are the sources (``B``) then every candidate (``B * C``, row by row), each at its
    question's time; nodes, edges and ages come from the sampler (``node[:num_seeds]`` are the
    seeds). ``pair``: per candidate, ``(count, age of the newest, age of the oldest)`` of its
    appearances among its source's sampled neighbours (count 0: ages ``inf``). Evaluation
    batches carry the baselines' scores of the same candidates (``TemporalLinkDataModule``).
    """

    source: Tensor  # [B] global ids
    candidates: Tensor  # [B, C]: the true destination first
    time: Tensor  # [B]
    node: Tensor  # sampled nodes' global ids; the seeds first
    row: Tensor  # edges' sources, local
    col: Tensor  # edges' targets, local
    event: Tensor  # [edges]: each edge's interaction (an index into the stream)
    edge_attr: Tensor  # [edges, F]
    edge_age: Tensor  # [edges]: its seed's time less the edge's (0 without time)
    pair: Tensor  # [B * C, 3]
    baselines: dict[str, Tensor] | None = None  # evaluation: each baseline's [B, C] scores
    padding: bool = False

    @property
    def num_seeds(self) -> int:
        """Sources and candidates."""
        return self.source.numel() * (1 + self.candidates.size(1))

    @property
    def num_loss_nodes(self) -> int:
        """Questions the loss covers (:func:`loss_count`)."""
        return 0 if self.padding else self.source.numel()


def mrr(positive: Tensor, negative: Tensor) -> Tensor:
    """Per question: 1 / the positive's rank among its negatives, ties counted half (TGB's)."""
    above = (negative > positive.unsqueeze(1)).sum(1)
    tied = (negative == positive.unsqueeze(1)).sum(1)
    return 1.0 / (above + 0.5 * tied + 1.0)
