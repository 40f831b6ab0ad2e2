"""Link prediction on homogeneous and heterogeneous graphs: ``LinkDataModule``.

Training batches come from PyG's ``LinkNeighborLoader``: supervision edges (positives, and
negatives drawn for them) with the sampled neighbourhoods of their endpoints, every edge type
with its own fan-out. The splits come from PyG's ``RandomLinkSplit`` and do not leak:

- validation and test edges (and their reverses) are absent from the training graph;
- with ``split.disjoint_train_ratio > 0``, the training edges a batch supervises are absent
  from the graph it passes messages on (else a model learns to find the edge it is asked about);
- validation passes messages over training edges only, test over training and validation ones.

Evaluation ranks candidates for every evaluated source node (recall@k, MRR@k with PyG's
link-prediction metrics, AUC with torchmetrics): exact over every destination node by default,
or over a random sample of them (``eval.candidates``; the metric names then say so). Already
known edges are never counted as hits (they are masked out of the ranking). Under DDP each
rank ranks its share of the sources; the metrics are reduced from counts across ranks.

A homogeneous graph (``dataset: Cora``...) becomes one node type ``node`` and one edge type
``node__to__node``, so one code path serves both.

A prepared heterogeneous folder (``dataset: prepared``) trains in place: its relation is split
once into a folder beside it by streaming (``gnnscale.stores.link_split``: the same parts as
``RandomLinkSplit``, another draw), and PyG's loaders sample each stage's graph through a
``(FeatureStore, GraphStore)`` pair whose target relation (and reverse) is that stage's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch_geometric.data import HeteroData
from torch_geometric.loader import LinkNeighborLoader, NeighborLoader
from torch_geometric.sampler import NegativeSampling
from torch_geometric.typing import EdgeType

from gnnscale.batch import LinkEval, supervise
from gnnscale.data.args import LoaderArgs, check_dataset, check_positive
from gnnscale.data.datasets import DATASETS, load_dataset
from gnnscale.data.hetero import HeteroGraphData, edge_key
from gnnscale.data.link_graphs import (
    STAGES,
    Links,
    LinkSplit,
    LinkTask,
    distinct,
    open_links,
    popularity,
)
from gnnscale.data.loaders import rank_own, resumable
from gnnscale.data.pinsage import (
    HardNegatives,
    PinSAGENeighbors,
)
from gnnscale.data.resume import ResumableLoader, SeededSampling
from gnnscale.data.sources import (
    check_cache,
    open_source,
    refuse_for_prepared,
)
from gnnscale.data.synthetic import SyntheticRecommender, make_recommender_graph
from gnnscale.errors import ConfigError
from gnnscale.handshake import GraphSpec
from gnnscale.memory import MemoryProfile, proportional_batches
from gnnscale.sampling import HopSampler, describe, log_backend_once, vectorized

_HOMOGENEOUS: EdgeType = ("node", "to", "node")


@dataclass(frozen=True)
class LinkEvalArgs:
    """How validation and test rank candidates.

    Args:
        k: Cut-off of recall@k and MRR@k.
        candidates: ``None``: rank every destination node (exact). A number: rank that many
            destination nodes drawn at random (once per evaluation, shared by all sources) plus
            each source's true ones; only those, the sources and the ends of the pairs AUC
            scores are embedded, so it is cheaper on large graphs; optimistic (metric names
            gain ``_of<candidates>``).
        batch_size: Nodes per batch when computing the nodes' embeddings, and sources per
            ranking chunk.
        num_neighbors: Fan-out per layer for the embeddings (every edge type); default: the
            training fan-out.
    """

    k: int = 20
    candidates: int | None = None
    batch_size: int = 4096
    num_neighbors: list[int] | None = None

    def __post_init__(self) -> None:
        """Refuse non-positive sizes."""
        if (
            self.k < 1
            or self.batch_size < 1
            or (self.candidates is not None and self.candidates < 1)
        ):
            raise ConfigError(
                "--data.eval.k, --data.eval.batch_size and --data.eval.candidates must be >= 1 "
                f"(got {self.k}, {self.batch_size}, {self.candidates})"
            )


def _as_hetero(data: Any) -> HeteroData:
    """A homogeneous ``Data`` as one node type and one edge type; ``HeteroData`` as it is."""
    if isinstance(data, HeteroData):
        return data
    out = HeteroData()
    out["node"].x = data.x
    out["node"].num_nodes = data.num_nodes
    out[_HOMOGENEOUS].edge_index = data.edge_index
    return out


class LinkDataModule(HeteroGraphData):
    """Link prediction batches from ``LinkNeighborLoader``, on one or several node and edge types.

    Args:
        dataset: ``synthetic`` (the generated recommender graph: users, items, categories), or
            a homogeneous dataset of ``gnnscale.DATASETS`` (``Cora``...), whose edges become
            ``node__to__node``; ``prepared``: the heterogeneous folder ``root`` written by
            ``gnnscale prepare``, trained in place (its split streamed once into
            ``<root>.link_split-<key>`` beside it; ``edge_type`` required).
        root: Folder of the dataset files.
        edge_type: The relation to predict, ``[src, rel, dst]``; default: ``user rates item``
            on ``synthetic``, ``node to node`` on a homogeneous graph.
        num_neighbors: Fan-out per layer: one list for every edge type, or one per edge type
            keyed ``src__rel__dst`` (every edge type of the graph, and no other).
        batch_size: Positive supervision edges per batch.
        num_negatives: Uniform negatives per positive (random destination nodes).
        num_hard_negatives: Hard negatives per positive: destination nodes from the batch's
            sampled neighbourhood that are not known edges of the source. A recommender's: on
            a citation graph they are mostly the papers a paper would cite, and rank worse
            than none (recipes/link_prediction_pinsage/README.md).
        neighbors: ``uniform``: the graph's own edges, sampled uniformly. ``pinsage``: adds
            each destination node's random-walk importance neighbours (see ``pinsage``) as a
            relation ``dst__similar__dst``.
        pinsage: Random walks of ``neighbors: pinsage``.
        synthetic: Size and structure of the generated graph (``dataset: synthetic``).
        split: Validation and test fractions, and supervision edges kept out of message passing.
        loader: DataLoader workers and memory pinning.
        eval: Ranking cut-off, candidates and batch size of validation and test.
        verify: ``dataset: prepared`` only: ``full`` checks every block's checksum when the
            folder is opened; ``size`` only the files' sizes.
        read_threads: ``dataset: prepared`` only: threads that read a batch's rows at once
            (default: 32 where the folder is larger than the page cache can keep, else 1).
        feature_cache_gib: ``dataset: prepared`` only: feature rows held in memory, of every
            node type within one budget: those a sampling pass around the training edges'
            endpoints on the training graph draws most often (``gnnscale.stores.fill_cache``).
    """

    def __init__(
        self,
        dataset: str = "synthetic",
        root: Path = Path("data"),
        edge_type: list[str] | None = None,
        num_neighbors: list[int] | dict[str, list[int]] = [10, 5],  # noqa: B006 (never mutated)
        batch_size: int = 1024,
        num_negatives: int = 1,
        num_hard_negatives: int = 0,
        neighbors: Literal["uniform", "pinsage"] = "uniform",
        pinsage: PinSAGENeighbors = PinSAGENeighbors(),  # noqa: B008 (frozen dataclass)
        synthetic: SyntheticRecommender = SyntheticRecommender(),  # noqa: B008
        split: LinkSplit = LinkSplit(),  # noqa: B008
        loader: LoaderArgs = LoaderArgs(),  # noqa: B008
        eval: LinkEvalArgs = LinkEvalArgs(),  # noqa: B008
        verify: Literal["full", "size"] = "full",
        read_threads: int | None = None,
        feature_cache_gib: float = 0.0,
    ) -> None:
        super().__init__()
        check_dataset(dataset, DATASETS)
        check_positive(read_threads=read_threads)
        check_cache(feature_cache_gib, dataset)
        self.feature_cache_gib = feature_cache_gib
        if batch_size < 1 or num_negatives < 0 or num_hard_negatives < 0:
            raise ConfigError(
                "--data.batch_size must be >= 1 and --data.num_negatives, "
                f"--data.num_hard_negatives >= 0 (got {batch_size}, {num_negatives}, "
                f"{num_hard_negatives})"
            )
        if num_negatives + num_hard_negatives == 0:
            raise ConfigError(
                "--data.num_negatives and --data.num_hard_negatives are both 0: a model trained "
                "on positives only learns to call every pair an edge; set one of them >= 1"
            )
        if edge_type is not None and len(edge_type) != 3:
            raise ConfigError(f"--data.edge_type must be [src, relation, dst] (got {edge_type})")
        refuse_for_prepared(
            dataset,
            (edge_type is None, "--data.dataset prepared needs --data.edge_type [src, rel, dst]"),
            (
                neighbors == "pinsage",
                "--data.neighbors pinsage walks the training graph in memory; with "
                "--data.dataset prepared use --data.neighbors uniform",
            ),
        )
        self.dataset, self.root = dataset, Path(root)
        self._opened = open_source(dataset, self.root, self._load, verify, read_threads)
        self._edge_type = edge_type
        self._num_neighbors = num_neighbors
        self.batch_size = batch_size
        self.num_negatives, self.num_hard_negatives = num_negatives, num_hard_negatives
        self.neighbors, self.pinsage = neighbors, pinsage
        self.synthetic, self.split, self.loader, self.eval = synthetic, split, loader, eval

    def __repr__(self) -> str:
        # Lightning's own would build every loader (jsonargparse prints it for links it skips).
        return f"{type(self).__name__}(dataset={self.dataset!r}, target={self._edge_type})"

    __str__ = __repr__

    # -- the graph and its splits -------------------------------------------------------------

    @property
    def _types(self) -> tuple[list[str], list[EdgeType]]:
        """The whole graph's node and edge types."""
        if not self._opened.hetero:
            raise ConfigError(
                f"{self._opened.name} holds a homogeneous graph: prepare it in the heterogeneous "
                "layout (one node type, one edge type) to predict its links"
            )
        return self._opened.metadata

    @property
    def data(self) -> HeteroData:
        """The whole graph in memory (a prepared one is read through its stores, never whole)."""
        data = self._opened.data
        assert isinstance(data, HeteroData)
        return data

    def _load(self) -> HeteroData:
        """The whole graph, heterogeneous (one node and edge type if the dataset is not)."""
        if self.dataset == "synthetic":
            data = make_recommender_graph(self.synthetic)
            for store in data.node_stores:  # the planted answer is not an input
                store.pop("community", None)
            return data
        return _as_hetero(load_dataset(self.dataset, self.root))

    @cached_property
    def links(self) -> Links:
        """The target relation's split into training, validation and test (per source kind)."""
        target = self.target
        pinsage = self.pinsage if self.neighbors == "pinsage" else None
        task = LinkTask(
            target, self._reverse.get(target), self.undirected, self.split, self.num_nodes, pinsage
        )
        return open_links(self._opened, task)

    @property
    def target(self) -> EdgeType:
        """The relation to predict."""
        if self._edge_type is not None:
            target = tuple(self._edge_type)
            node_types, edge_types = self._types
            for node_type in (target[0], target[2]):
                if node_type not in node_types:
                    raise ConfigError(
                        f"--data.edge_type names node type {node_type!r}, which {self.dataset} "
                        f"does not have; its node types are {', '.join(node_types)}"
                    )
            if target not in edge_types:
                known = ", ".join(edge_key(t) for t in edge_types)
                raise ConfigError(
                    f"--data.edge_type {edge_key(target)} is not an edge type of "
                    f"{self.dataset}; choose one of {known}"
                )
            return target  # type: ignore[return-value]
        return ("user", "rates", "item") if self.dataset == "synthetic" else _HOMOGENEOUS

    @property
    def ranking_suffix(self) -> str:
        """What the ranking metrics' names carry after ``@`` (``val/recall@20``).

        ``k``, and ``_of<n>`` where ``n`` candidates are ranked instead of every destination.
        """
        c, num_dst = self.eval.candidates, self.num_nodes[self.target[2]]
        return f"{self.eval.k}" + ("" if c is None or c >= num_dst else f"_of{c}")

    @property
    def undirected(self) -> bool:
        """A homogeneous graph's edges are both ways: an edge and its reverse are one pair."""
        src, _, dst = self.target
        return src == dst and self.target not in self._reverse

    @property
    def _reverse(self) -> dict[EdgeType, EdgeType]:
        """The reverse relation ``ToUndirected`` added, per relation."""
        edge_types = self._types[1]
        return {
            t: (t[2], f"rev_{t[1]}", t[0])
            for t in edge_types
            if (t[2], f"rev_{t[1]}", t[0]) in edge_types
        }

    @property
    def metadata(self) -> tuple[list[str], list[EdgeType]]:
        """Node and edge types of the graphs the model sees (PyG's ``metadata()``).

        The graph's, and with PinSAGE neighbours the destination type's ``similar`` relation.
        """
        node_types, edge_types = self._types
        if self.neighbors == "pinsage":
            dst = self.target[2]
            edge_types = [*edge_types, (dst, "similar", dst)]
        return node_types, edge_types

    @property
    def graph_spec(self) -> GraphSpec:
        """The graph the model is built for (linked to ``model.graph``: ``gnnscale.handshake``).

        Its target is the relation to predict, its ``k`` the ranking cut-off.
        """
        return self._spec(self.target, self.eval.k)

    # -- loaders ------------------------------------------------------------------------------

    def prepare_data(self) -> None:
        """Download (if needed) and load the dataset; a prepared one's split, written once."""
        self.links.prepare()

    def setup(self, stage: str) -> None:
        """Split, check the fan-outs against the model."""
        log_backend_once(describe(self.loader.sampler))
        self._configure_from_trainer()

    def memory_profile(self) -> MemoryProfile:
        """What ``gnnscale plan`` cannot measure from training batches (``gnnscale.memory``)."""
        graph_mb, mapped_mb = self.links.memory_mb()
        return MemoryProfile(
            graph_mb=graph_mb,
            mapped_mb=mapped_mb,
            eval_mode="ranking",
            smaller_batches=proportional_batches(self.batch_size),
            eval_fix="rank a sample of the destinations (--data.eval.candidates) or embed and "
            "rank fewer at a time (a lower --data.eval.batch_size)",
        )

    def train_dataloader(self) -> ResumableLoader:
        """Shuffled batches of supervision edges with negatives and sampled neighbourhoods."""
        target = self.target
        label_index, label = self.links.labels("train")
        self.links.hold(self.fanout(), self.batch_size, self.feature_cache_gib)
        transform = None
        if self.num_hard_negatives:
            if target[0] == target[2]:
                rank_zero_warn(
                    f"gnnscale: --data.num_hard_negatives={self.num_hard_negatives} within one "
                    f"node type ({edge_key(target)}): those negatives are mostly nodes it would "
                    "link to, and rank below popularity "
                    "(recipes/link_prediction_pinsage/README.md); set 0"
                )
            transform = HardNegatives(
                target,
                self.links.known("train"),
                self.num_nodes[target[2]],
                self.num_hard_negatives,
            )
        graph = self.links.input("train")
        loader = LinkNeighborLoader(
            graph,  # type: ignore[arg-type]
            num_neighbors=self.fanout(),  # type: ignore[arg-type]
            edge_label_index=(target, label_index),
            edge_label=label,
            neg_sampling=NegativeSampling("binary", self.num_negatives)
            if self.num_negatives
            else None,
            batch_size=self.batch_size,
            neighbor_sampler=self._sampler(graph, self.fanout()),
            transform=self._opened.count_held(),
            generator=torch.Generator(),
            **self.loader.kwargs(),
        )
        # PyG's EdgeSamplerInput clones the pairs (16 bytes a training edge, a rank: 1.6 GB at
        # 100M); the clone is dropped here, and batches index the split's mapped pairs (or the
        # graph's own) instead.
        loader.input_data.row, loader.input_data.col = label_index[0], label_index[1]
        return resumable(self.trainer, loader, shuffle=True, transform=transform)

    def _sampler(self, graph: Any, fanout: dict[EdgeType, list[int]]) -> HopSampler:
        """A sampler over ``graph`` as ``--data.loader.sampler`` says."""
        return HopSampler(
            graph,
            fanout,
            share_memory=self.loader.workers > 0,
            vectorized=vectorized(self.loader.sampler),
        )

    def _eval(self, stage: Literal["val", "test", "predict"]) -> Any:
        """The one evaluation step of ``stage``.

        ``predict`` ranks every destination for every source, embedded on the test's graph,
        every known edge (training, validation, test) left out.
        """
        graph = self.links.input("test" if stage == "predict" else stage)
        target = self.target
        src_type, _, dst_type = target
        if stage == "predict":  # no labels: the sources are every node of the source type
            label_index, label = torch.empty(2, 0, dtype=torch.long), torch.empty(0)
        else:
            label_index, label = self.links.labels(stage)
        positives = label_index[:, label == 1]
        if self.undirected:
            positives = torch.cat([positives, positives.flip(0)], 1)
        if stage == "predict":  # each source once, its destination unused
            sources = torch.arange(self.num_nodes[src_type])
            positives = torch.stack([sources, torch.full_like(sources, -1)])
        # Under DDP each rank ranks its share of the sources (id modulo the ranks) and scores its
        # share of the labelled pairs; recall and MRR add up sums and counts across ranks and AUC
        # gathers the scores, so the metrics are one process's.
        rank, world = (
            (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)
        )
        positives = positives[:, positives[0] % world == rank]
        label_index, label = label_index[:, rank::world], label[rank::world]
        known = self.links.known(*STAGES[: {"val": 1, "test": 2, "predict": 3}[stage]])
        num_dst = self.num_nodes[dst_type]
        counts = popularity(known, num_dst)
        candidates, embedded = None, None
        if (
            stage != "predict"
            and self.eval.candidates is not None
            and self.eval.candidates < num_dst
        ):
            candidates = distinct(num_dst, self.eval.candidates, torch.Generator().manual_seed(1))
            # Only the nodes ranked or scored are embedded, not every node of the two types.
            ends: dict[str, list[Tensor]] = {src_type: [], dst_type: []}
            ends[src_type] += [positives[0], label_index[0]]
            ends[dst_type] += [candidates, positives[1], label_index[1]]
            embedded = {t: torch.unique(torch.cat(parts)) for t, parts in ends.items()}
        fanout = self.fanout()
        if self.eval.num_neighbors is not None:
            fanout = {t: list(self.eval.num_neighbors) for t in fanout}
        sampler = self._sampler(graph, fanout)
        loaders = {
            t: NeighborLoader(
                graph,
                num_neighbors=fanout,  # type: ignore[arg-type]
                input_nodes=t if embedded is None else (t, embedded[t]),
                batch_size=self.eval.batch_size,
                neighbor_sampler=sampler,
                **self.loader.kwargs(),
            )
            for t in dict.fromkeys((src_type, dst_type))
        }
        for i, loader in enumerate(loaders.values()):  # the same draw at every evaluation
            loader.collate_fn = SeededSampling(loader.collate_fn, seed=i)
        return rank_own(
            self.trainer,
            LinkEval(
                {t: self.num_nodes[t] for t in loaders},
                target,
                loaders,
                positives,
                known,
                label_index,
                label,
                counts,
                candidates,
                self.eval.k,
                self.eval.batch_size,
                embedded,
            ),
        )

    def val_dataloader(self) -> Any:
        """One step that ranks candidates for every validation source (this rank's share)."""
        return self._eval("val")

    def test_dataloader(self) -> Any:
        """One step that ranks candidates for every test source (this rank's share)."""
        return self._eval("test")

    def predict_dataloader(self) -> Any:
        """One step that ranks every destination for every source (this rank's share)."""
        return self._eval("predict")

    @cached_property
    def _train_popularity(self) -> Tensor:
        """Each destination's degree in the training edges (validation's popularity)."""
        return popularity(self.links.known("train"), self.num_nodes[self.target[2]])

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Weight each labelled pair of a training batch: 1 / (expected pairs per batch).

        Under DDP, a batch repeated to even out the ranks' counts (``padding``) weighs 0: every
        supervision edge is trained once per epoch across ranks. Each pair also carries its
        destination's degree in the training edges, its own edge left out
        (``edge_label_popularity``: what evaluation's popularity counts for an unseen edge).
        """
        if self.trainer is not None and self.trainer.training and isinstance(batch, HeteroData):
            store = batch[self.target]
            per_batch = self.batch_size * (1 + self.num_negatives + self.num_hard_negatives)
            pairs = store.edge_label.numel()
            supervise(batch, torch.full((pairs,), 1.0 / per_batch), pairs, on=store)
            dst = batch[self.target[2]].n_id[store.edge_label_index[1]]
            store.edge_label_popularity = (
                self._train_popularity[dst] - store.edge_label.float()
            ).clamp_(min=0)
        return batch
