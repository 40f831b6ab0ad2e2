"""Node classification on heterogeneous graphs: ``HeteroNeighborDataModule``, ``HeteroSAGE``.

Batches come from PyG's ``NeighborLoader`` with seeds of one node type (``target_type``) and a
fan-out per edge type; the model is ``LinkPredictor``'s encoder (GraphSAGE made heterogeneous
by ``to_hetero``, embedding tables for featureless types) with a linear head on the target type.

A sibling of ``NeighborDataModule`` rather than a mode of it: that module's layer-wise and full
evaluation, preprocessing and target-only layers all assume one node type; none of them is
needed here, and each would need a heterogeneous twin. A prepared heterogeneous folder
(``gnnscale prepare --source Npy``) trains in place: PyG's loader samples it through its
``(FeatureStore, GraphStore)`` pair (``gnnscale.stores.mapped``).
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from torch import Tensor
from torch_geometric.data import HeteroData
from torch_geometric.loader import NeighborLoader
from torch_geometric.typing import EdgeType

from gnnscale.batch import supervise
from gnnscale.data.args import (
    EvalArgs,
    LoaderArgs,
    NodeSplit,
    SamplingArgs,
    check_dataset,
    check_positive,
)
from gnnscale.data.datasets import SPLIT_MASKS, check_labels
from gnnscale.data.loaders import rank_share, resumable
from gnnscale.data.resume import ResumableLoader, SeededSampling
from gnnscale.data.sources import GraphSource, check_cache, open_source
from gnnscale.data.synthetic import SyntheticRecommender, make_item_class_graph
from gnnscale.errors import ConfigError
from gnnscale.handshake import BatchRequest, GraphSpec
from gnnscale.memory import MemoryProfile, proportional_batches
from gnnscale.sampling import describe, log_backend_once, vectorized

_HOMOGENEOUS: EdgeType = ("node", "to", "node")


def edge_key(edge_type: EdgeType) -> str:
    """``("user", "rates", "item")`` as written in YAML keys: ``user__rates__item``."""
    return "__".join(edge_type)


def per_edge_type_fanout(
    given: list[int] | dict[str, list[int]], edge_types: list[EdgeType], num_layers: int = 0
) -> dict[EdgeType, list[int]]:
    """Fan-out per edge type from ``--data.num_neighbors``; unknown or missing types by name.

    Shared by ``LinkDataModule`` and ``HeteroNeighborDataModule``.

    Args:
        given: One list for every edge type, or one per edge type keyed ``src__rel__dst``.
        edge_types: The graph's edge types.
        num_layers: The model's depth (0: not checked).
    """
    if isinstance(given, dict):
        known = {edge_key(t): t for t in edge_types}
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise ConfigError(
                f"--data.num_neighbors names {', '.join(unknown)}, not an edge type of this "
                f"graph; its edge types are {', '.join(known)}"
            )
        missing = sorted(set(known) - set(given))
        if missing:
            raise ConfigError(
                f"--data.num_neighbors has no fan-out for {', '.join(missing)}; give every "
                "edge type one (or one list for all)"
            )
        fanout = {known[k]: list(v) for k, v in given.items()}
    else:
        fanout = {t: list(given) for t in edge_types}
    lengths = {len(v) for v in fanout.values()}
    if len(lengths) != 1 or any(k == 0 or k < -1 for v in fanout.values() for k in v):
        raise ConfigError(
            "--data.num_neighbors: every edge type needs one fan-out per layer, the same "
            f"number of layers for all, each > 0 or -1 for all (got {given})"
        )
    if num_layers and lengths != {num_layers}:
        raise ConfigError(
            f"--data.num_neighbors has {lengths.pop()} layers but --model.num_layers is "
            f"{num_layers}: give one fan-out per layer"
        )
    return fanout


class HeteroGraphData(L.LightningDataModule):
    """What the heterogeneous DataModules share: types, sizes and fan-outs of ``self.data``.

    Subclasses set ``self.data`` (a ``HeteroData``) and ``self._num_neighbors``.
    """

    _opened: GraphSource  # the graph as opened, before the subclass's checks
    _num_neighbors: list[int] | dict[str, list[int]]
    # What the model asked batches to carry (``configure_batches``): here, its depth.
    request: BatchRequest = BatchRequest()

    @property
    def metadata(self) -> tuple[list[str], list[EdgeType]]:
        """Node and edge types (PyG's ``metadata()``; a prepared folder's from its manifest)."""
        return self._opened.metadata

    @property
    def feature_dims(self) -> dict[str, int]:
        """Feature dimension per node type; 0 for a featureless type (the model embeds it)."""
        return self._opened.feature_dims

    @property
    def num_nodes(self) -> dict[str, int]:
        """Nodes per type."""
        return self._opened.num_nodes

    def _spec(self, target: str | EdgeType, k: int = 0) -> GraphSpec:
        """The graph a model is built for: this DataModule's types and sizes, and ``target``."""
        node_types, edge_types = self.metadata
        return GraphSpec(
            tuple(node_types), tuple(edge_types), self.feature_dims, self.num_nodes, target, k
        )

    def fanout(self, num_layers: int = 0) -> dict[EdgeType, list[int]]:
        """Fan-out per edge type (see :func:`per_edge_type_fanout`)."""
        return per_edge_type_fanout(self._num_neighbors, self.metadata[1], num_layers)

    def configure_batches(self, request: BatchRequest) -> None:
        """Take the model's request; refuse a depth the fan-outs do not fit (before data loads).

        ``gnnscale``'s CLI calls this before any data loads; ``setup`` with each fit's model
        (a DataModule may serve several).

        Args:
            request: What the model's batches must carry (``gnnscale.handshake``): its depth.
        """
        num_layers = request.num_layers
        if isinstance(self._num_neighbors, list) and num_layers:
            if len(self._num_neighbors) != num_layers:
                raise ConfigError(
                    f"--data.num_neighbors has {len(self._num_neighbors)} layers but "
                    f"--model.num_layers is {num_layers}: give one fan-out per layer"
                )
        self.request = request

    def _configure_from_trainer(self) -> None:
        """``setup``'s part: the request of the trainer's model (each fit's, the CLI's again)."""
        if self.trainer is not None:
            self.configure_batches(BatchRequest.of(self.trainer.lightning_module))
        self.fanout(self.request.num_layers)  # every edge type named, one depth


_LABELLED = {"synthetic": "item", "DBLP": "author", "IMDB": "movie"}  # each dataset's labels


class HeteroNeighborDataModule(HeteroGraphData):
    """Neighbour-sampled batches of one node type's seeds on a heterogeneous graph.

    Each batch holds ``batch_size`` labelled seeds of ``target_type`` (first in their type's
    node order, ``batch[target_type].batch_size`` of them) and the neighbourhood sampled around
    them, every edge type with its own fan-out. Validation and test sample the same way around
    the target type's validation and test nodes.

    Args:
        dataset: ``synthetic``: the generated recommender graph (users, items, categories) with
            each item labelled by its planted community (``gnnscale.make_item_class_graph``);
            ``DBLP`` (authors, papers, terms, conferences; authors labelled by research area) or
            ``IMDB`` (movies, directors, actors; movies labelled by genre): PyG's datasets with
            their public splits, downloaded into ``root/<name>`` on first use; ``prepared``: the
            heterogeneous folder ``root`` written by ``gnnscale prepare``, trained in place.
        root: Folder of dataset files (unused by ``synthetic``).
        target_type: The node type to classify; it needs ``y`` and split masks. ``None``: the
            labelled type of the dataset (``item``, ``author``, ``movie``; of a prepared folder,
            its one type with labels and splits).
        num_neighbors: Fan-out per layer: one list for every edge type, or one per edge type
            keyed ``src__rel__dst`` (every edge type of the graph, and no other).
        batch_size: Seed nodes (of ``target_type``) per training batch.
        split: How the target nodes of the generated graph are split (``synthetic``; PyG's
            datasets keep their public splits).
        synthetic: Size and structure of the generated graph (``dataset: synthetic``).
        loader: DataLoader workers and memory pinning.
        eval: Validation and test: ``sampled`` around the evaluated seeds, ``batch_size`` seeds
            a batch, ``num_neighbors`` per layer for every edge type (default: the training
            fan-out).
        verify: ``dataset: prepared`` only: ``full`` checks every block's checksum when the
            folder is opened (a read of every file); ``size`` only the files' sizes.
        read_threads: ``dataset: prepared`` only: threads that read a batch's rows at once
            (default: 32 where the folder is larger than the page cache can keep, else 1).
        feature_cache_gib: ``dataset: prepared`` only: feature rows held in memory, of every
            node type within one budget: those a sampling pass over the training seeds draws
            most often (``MappedFeatureStore.hold_drawn_rows``).
        sampling: Neighbours by time (each seed sees only nodes no newer than itself: the
            node types with a time; edge types out of the others are untimed) or by weight.
    """

    def __init__(
        self,
        dataset: str = "synthetic",
        root: Path = Path("data"),
        target_type: str | None = None,
        num_neighbors: list[int] | dict[str, list[int]] = [10, 5],  # noqa: B006 (never mutated)
        batch_size: int = 1024,
        split: NodeSplit = NodeSplit(),  # noqa: B008 (frozen)
        synthetic: SyntheticRecommender = SyntheticRecommender(),  # noqa: B008
        loader: LoaderArgs = LoaderArgs(),  # noqa: B008
        eval: EvalArgs = EvalArgs(mode="sampled"),  # noqa: B008
        verify: Literal["full", "size"] = "full",
        read_threads: int | None = None,
        feature_cache_gib: float = 0.0,
        sampling: SamplingArgs = SamplingArgs(),  # noqa: B008
    ) -> None:
        super().__init__()
        check_dataset(dataset, (*_LABELLED, "prepared"))
        check_positive(batch_size=batch_size, read_threads=read_threads)
        check_cache(feature_cache_gib, dataset)
        if eval.mode != "sampled":
            raise ConfigError(
                f"--data.eval.mode {eval.mode!r}: heterogeneous graphs are evaluated on sampled "
                "neighbourhoods; use --data.eval.mode=sampled"
            )
        if eval.validation != "sampled":
            raise ConfigError(
                f"--data.eval.val_mode {eval.val_mode!r}: heterogeneous graphs are evaluated on "
                "sampled neighbourhoods; use --data.eval.val_mode=sampled or drop it"
            )
        self.dataset, self.root = dataset, Path(root)
        self.feature_cache_gib = feature_cache_gib
        self.target_type = target_type or _LABELLED.get(dataset, "")
        self._opened = open_source(dataset, self.root, self._load, verify, read_threads)
        if not self.target_type and len(labelled := self._opened.labelled) == 1:
            self.target_type = labelled[0]  # a prepared folder's only labelled type
        self._num_neighbors = num_neighbors
        self.batch_size, self.split, self.eval = batch_size, split, eval
        self.synthetic, self.loader, self.sampling = synthetic, loader, sampling

    def __repr__(self) -> str:
        # Lightning's own would build every loader (jsonargparse prints it for links it skips).
        return f"{type(self).__name__}(dataset={self.dataset!r}, target={self.target_type!r})"

    __str__ = __repr__

    @cached_property
    def source(self) -> GraphSource:
        """The graph, checked against the target type, its feature cache filled (prepared)."""
        source = self._opened
        if not source.hetero:
            raise ConfigError(
                f"{source.name} holds a homogeneous graph: train it with "
                "gnnscale.NeighborDataModule"
            )
        self._check_target(source.metadata[0], source.labelled, source.name)
        t = self.target_type
        masks = {k: source.tensor(t, k) for k in SPLIT_MASKS}
        for mask, held in masks.items():
            if not bool(held.any()):
                if self.dataset == "synthetic":
                    raise ConfigError(
                        f"the {mask} of --data.target_type {t!r} is empty: give the target type "
                        "more nodes or change --data.split.train_fraction and val_fraction"
                    )
                raise ConfigError(f"the {mask} of --data.target_type {t!r} is empty")
        overlaps = "splits disjoint" not in source.checked  # else checked as it was prepared
        counted = source.split_labels(t)
        check_labels(source.tensor(t, "y"), masks, self.dataset, t, overlaps, counted)
        fanout = per_edge_type_fanout(self._num_neighbors, self.metadata[1])
        seeds = {t: masks["train_mask"].nonzero().view(-1)}
        source.hold(fanout, seeds, self.batch_size, self.feature_cache_gib)
        return source

    def _check_target(self, node_types: list[str], labelled: list[str], name: str) -> None:
        t = self.target_type
        if t not in node_types:
            raise ConfigError(
                f"--data.target_type {t!r} is not a node type of {name}; its node types "
                f"are {', '.join(node_types)}"
            )
        if t not in labelled:
            raise ConfigError(
                f"--data.target_type {t!r} has no labels (y) and split masks ("
                f"{', '.join(SPLIT_MASKS)}) in {name}; node types that have them: "
                f"{', '.join(labelled) or 'none'}"
            )

    def _mask(self, split: str) -> Tensor:
        """The target type's ``split`` mask (mapped, for ``dataset: prepared``)."""
        return self.source.tensor(self.target_type, split)

    @property
    def data(self) -> HeteroData:
        """The whole graph in memory (a prepared one is read through its stores, never whole)."""
        data = self._opened.data
        assert isinstance(data, HeteroData)
        _ = self.source  # checked
        return data

    def _load(self) -> HeteroData:
        """The generated graph, or PyG's dataset with its public split."""
        if self.dataset == "synthetic":
            fractions = self.split.train_fraction, self.split.val_fraction
            data = make_item_class_graph(self.synthetic, *fractions)
        else:  # PyG's, with their public splits
            from torch_geometric import datasets

            data = getattr(datasets, self.dataset)(str(self.root / self.dataset))[0]
        return data

    @property
    def num_classes(self) -> int:
        """Classes of the target type (linked to ``model.num_classes``)."""
        return self.source.num_classes(self.target_type)

    @property
    def graph_spec(self) -> GraphSpec:
        """The graph the model is built for (linked to ``model.graph``: ``gnnscale.handshake``)."""
        _ = self.source  # the target type checked
        return self._spec(self.target_type)

    def prepare_data(self) -> None:
        """Generate (and check) the graph."""
        _ = self.source

    def setup(self, stage: str) -> None:
        """Check the fan-outs against the graph's edge types and the model's depth."""
        log_backend_once(describe(self.loader.sampler))
        self._configure_from_trainer()

    def _loader(
        self, seeds: Tensor | None, batch_size: int, fanout: list[int] | None = None
    ) -> NeighborLoader:
        given = self._num_neighbors if fanout is None else fanout
        per_type = per_edge_type_fanout(given, self.metadata[1])
        source = self.source  # a prepared folder's sampler checks the ids it draws
        if seeds is None:  # every target node: PyG infers their count from a graph, not a store
            seeds = torch.arange(self.num_nodes[self.target_type])
        try:
            sampler = source.sampler(
                per_type,
                share_memory=self.loader.workers > 0,
                vectorized=vectorized(self.loader.sampler),
                edge_ids=False,  # the heterogeneous models read no edge features
                **self.sampling.kwargs(),
            )
        except (ValueError, NotImplementedError) as err:  # the sampler's, about these options
            if not self.sampling.kwargs():
                raise
            raise ConfigError(f"--data.sampling: {err}") from None
        return NeighborLoader(
            source.loader_input(),  # type: ignore[arg-type]
            num_neighbors=per_type,  # type: ignore[arg-type]
            input_nodes=(self.target_type, seeds),
            batch_size=batch_size,
            neighbor_sampler=sampler,
            transform=source.count_held(),
            # Its own generator: starting workers must not move the model's random stream.
            generator=torch.Generator(),
            **self.loader.kwargs(),
        )

    def _eval_loader(self, split: str | None) -> Any:
        """Seeds of ``split`` (``None``: every target node), sampled the same way each time."""
        mask = None if split is None else self._mask(split)
        mask = self.eval.validated(mask) if split == "val_mask" and mask is not None else mask

        def sampled(seeds: Tensor | None) -> NeighborLoader:
            loader = self._loader(seeds, self.eval.batch_size, self.eval.num_neighbors)
            loader.collate_fn = SeededSampling(loader.collate_fn)  # the same draw each time
            return loader

        return rank_share(self.trainer, mask, self.num_nodes[self.target_type], sampled)

    def memory_profile(self) -> MemoryProfile:
        """What ``gnnscale plan`` cannot measure from training batches (``gnnscale.memory``)."""
        source = self.source
        return MemoryProfile(
            graph_mb=source.graph_mb,
            mapped_mb=source.mapped_mb,
            eval_mode="sampled",
            smaller_batches=proportional_batches(self.batch_size),
            eval_fix="evaluate fewer seeds at a time (a lower --data.eval.batch_size)",
        )

    def train_dataloader(self) -> ResumableLoader:
        """Shuffled batches of training seeds, seeded per batch and resumable mid-epoch."""
        train = self._loader(self._mask("train_mask"), self.batch_size)
        return resumable(self.trainer, train, shuffle=True)

    def val_dataloader(self) -> Any:
        """Validation nodes of the target type, sampled (under DDP: this rank's share)."""
        return self._eval_loader("val_mask")

    def test_dataloader(self) -> Any:
        """Test nodes of the target type, sampled (under DDP: this rank's share)."""
        return self._eval_loader("test_mask")

    def predict_dataloader(self) -> Any:
        """Every node of the target type, sampled (under DDP: this rank's share)."""
        return self._eval_loader(None)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Weight a training batch's seeds 1 / batch_size each (every training node the same).

        Under DDP, a batch repeated to even out the ranks' counts (``padding``) weighs 0.
        """
        if self.trainer is not None and self.trainer.training and isinstance(batch, HeteroData):
            store = batch[self.target_type]
            weight = torch.zeros(store.num_nodes)
            weight[: store.batch_size] = 1.0 / self.batch_size
            supervise(batch, weight, store.batch_size, on=store)
        return batch
