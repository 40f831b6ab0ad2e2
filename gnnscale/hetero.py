"""Node classification on heterogeneous graphs: ``HeteroNeighborDataModule``, ``HeteroSAGE``.

Batches come from PyG's ``NeighborLoader`` with seeds of one node type (``target_type``) and a
fan-out per edge type; the model is ``LinkPredictor``'s encoder (GraphSAGE made heterogeneous
by ``to_hetero``, embedding tables for featureless types) with a linear head on the target type.

A sibling of ``NeighborDataModule`` rather than a mode of it: that module's layer-wise and full
evaluation, prepared (memory-mapped) graphs, preprocessing and target-only layers all assume one
node type; none of them is needed here, and each would need a heterogeneous twin.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn
from torch_geometric.data import HeteroData
from torch_geometric.loader import NeighborLoader
from torchmetrics.classification import MulticlassAccuracy

from gnnscale.data import (
    LoaderArgs,
    _check_positive,
    _check_root,
    _log_backend_once,
    rank_share,
    resumable,
)
from gnnscale.errors import ConfigError, TrainingDiverged
from gnnscale.link import _HeteroGraphData
from gnnscale.link_model import _HeteroGNN
from gnnscale.models import _check_probabilities
from gnnscale.resume import ResumableLoader
from gnnscale.synthetic import SyntheticRecommender, make_item_class_graph

__all__ = ["HeteroNeighborDataModule", "HeteroSAGE"]

_SPLITS = ("train_mask", "val_mask", "test_mask")
_LABELLED = {"synthetic": "item", "DBLP": "author", "IMDB": "movie"}  # each dataset's labels


class HeteroNeighborDataModule(_HeteroGraphData):
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
            their public splits, downloaded into ``root/<name>`` on first use.
        root: Folder of dataset files (unused by ``synthetic``).
        target_type: The node type to classify; it needs ``y`` and split masks. ``None``: the
            labelled type of the dataset (``item``, ``author``, ``movie``).
        num_neighbors: Fan-out per layer: one list for every edge type, or one per edge type
            keyed ``src__rel__dst`` (every edge type of the graph, and no other).
        batch_size: Seed nodes (of ``target_type``) per training batch.
        train_fraction: Fraction of the target nodes in the training split (``synthetic``).
        val_fraction: Fraction of the target nodes in the validation split; the rest is test.
        synthetic: Size and structure of the generated graph (``dataset: synthetic``).
        loader: DataLoader workers and memory pinning.
        eval_batch_size: Seed nodes per validation and test batch.
    """

    def __init__(
        self,
        dataset: Literal["synthetic", "DBLP", "IMDB"] = "synthetic",
        root: Path = Path("data"),
        target_type: str | None = None,
        num_neighbors: list[int] | dict[str, list[int]] = [10, 5],  # noqa: B006 (never mutated)
        batch_size: int = 1024,
        train_fraction: float = 0.3,
        val_fraction: float = 0.1,
        synthetic: SyntheticRecommender = SyntheticRecommender(),  # noqa: B008 (frozen)
        loader: LoaderArgs = LoaderArgs(),  # noqa: B008
        eval_batch_size: int = 4096,
    ) -> None:
        super().__init__()
        _check_positive(batch_size=batch_size, eval_batch_size=eval_batch_size)
        if not (train_fraction > 0 and val_fraction > 0 and train_fraction + val_fraction < 1):
            raise ConfigError(
                "--data.train_fraction and --data.val_fraction must be > 0 and sum to less than "
                f"1, the rest being the test split (got {train_fraction}, {val_fraction})"
            )
        self.dataset, self.root = dataset, Path(root)
        self.target_type = target_type or _LABELLED[dataset]
        self._num_neighbors = num_neighbors
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.train_fraction, self.val_fraction = train_fraction, val_fraction
        self.synthetic, self.loader = synthetic, loader

    def __repr__(self) -> str:
        # Lightning's own would build every loader (jsonargparse prints it for links it skips).
        return f"{type(self).__name__}(dataset={self.dataset!r}, target={self.target_type!r})"

    __str__ = __repr__

    @cached_property
    def data(self) -> HeteroData:
        """The whole graph; refuses a target type it lacks or that has no labels and splits."""
        if self.dataset == "synthetic":
            data = make_item_class_graph(self.synthetic, self.train_fraction, self.val_fraction)
        else:  # PyG's, with their public splits
            from torch_geometric import datasets

            _check_root(self.dataset, self.root)
            data = getattr(datasets, self.dataset)(str(self.root / self.dataset))[0]
        t = self.target_type
        if t not in data.node_types:
            raise ConfigError(
                f"--data.target_type {t!r} is not a node type of {self.dataset}; its node types "
                f"are {', '.join(data.node_types)}"
            )
        labelled = [s for s in data.node_types if all(k in data[s] for k in ("y", *_SPLITS))]
        if t not in labelled:
            raise ConfigError(
                f"--data.target_type {t!r} has no labels (y) and split masks ("
                f"{', '.join(_SPLITS)}) in {self.dataset}; node types that have them: "
                f"{', '.join(labelled) or 'none'}"
            )
        for split in _SPLITS:
            if not bool(data[t][split].any()):
                raise ConfigError(
                    f"the {split} of --data.target_type {t!r} is empty: give the target type "
                    "more nodes or change --data.train_fraction and --data.val_fraction"
                )
        return data

    @property
    def num_classes(self) -> int:
        """Classes of the target type (linked to ``model.num_classes``)."""
        return int(self.data[self.target_type].y.max()) + 1

    def prepare_data(self) -> None:
        """Generate (and check) the graph."""
        _ = self.data

    def setup(self, stage: str) -> None:
        """Check the fan-outs against the graph's edge types and the model's depth."""
        _log_backend_once()
        model = self.trainer.lightning_module if self.trainer is not None else None
        self.check_model(model)
        self.fanout(int(getattr(model, "num_layers", 0)))

    def _loader(self, seeds: Tensor | None, batch_size: int) -> NeighborLoader:
        return NeighborLoader(
            self.data,
            num_neighbors=self.fanout(),  # type: ignore[arg-type]
            input_nodes=(self.target_type, seeds),
            batch_size=batch_size,
            # Its own generator: starting workers must not move the model's random stream.
            generator=torch.Generator(),
            **self.loader.kwargs(),
        )

    def _eval_loader(self, split: str) -> Any:
        store = self.data[self.target_type]
        return rank_share(
            self.trainer,
            store[split],
            store.num_nodes,
            lambda seeds: self._loader(seeds, self.eval_batch_size),
        )

    def train_dataloader(self) -> ResumableLoader:
        """Shuffled batches of training seeds, seeded per batch and resumable mid-epoch."""
        train = self._loader(self.data[self.target_type].train_mask, self.batch_size)
        return resumable(self.trainer, train, shuffle=True)

    def val_dataloader(self) -> Any:
        """Validation nodes of the target type, sampled (under DDP: this rank's share)."""
        return self._eval_loader("val_mask")

    def test_dataloader(self) -> Any:
        """Test nodes of the target type, sampled (under DDP: this rank's share)."""
        return self._eval_loader("test_mask")

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Weight a training batch's seeds 1 / batch_size each (every training node the same).

        Under DDP, a batch repeated to even out the ranks' counts (``padding``) weighs 0.
        """
        if self.trainer is not None and self.trainer.training and isinstance(batch, HeteroData):
            store = batch[self.target_type]
            padding = bool(batch.get("padding", False))
            store.loss_weight = torch.zeros(store.num_nodes)
            store.loss_weight[: store.batch_size] = 0.0 if padding else 1.0 / self.batch_size
            batch.num_loss_nodes = 0 if padding else store.batch_size  # for ThroughputMonitor
        return batch


class HeteroSAGE(_HeteroGNN):
    """Heterogeneous GraphSAGE classifying one node type's nodes (``HeteroNeighborDataModule``).

    Node types with features enter through a linear layer, featureless ones through a learned
    embedding table (sparse gradients, ``SparseAdam``); ``to_hetero`` gives every edge type its
    own ``SAGEConv`` per layer and averages the relations into each node type; a linear head
    turns the target type's last layer into class logits. Loss and accuracy cover the batch's
    seeds only. Built in ``setup`` from the DataModule's types and sizes, which it saves in its
    hyperparameters, so checkpoints reload without the data.

    Args:
        num_classes: Classes of the target type (linked from the DataModule).
        hidden_channels: Width of the embeddings and of every layer.
        num_layers: Message-passing layers; one fan-out per layer in ``data.num_neighbors``.
        dropout: Dropout between layers.
        sparse: Sparse gradients for the featureless types' tables (only looked-up rows);
            they then get ``embedding_optimizer`` (``SparseAdam``).
        embedding_device: ``cpu`` keeps the tables and their optimizer state in host memory;
            ``model``: they live with the GNN.
        accumulate_grad_batches: Micro-batches per optimizer step (Lightning refuses
            ``--trainer.accumulate_grad_batches`` with two optimizers, so the model accumulates).
        optimizer: Optimizer of the dense weights.
        embedding_optimizer: Optimizer of the tables.
        graph: Node and edge types, sizes and target type; ``None`` takes them from the
            DataModule (saved in checkpoints).
    """

    def __init__(
        self,
        num_classes: int,
        hidden_channels: int = 64,
        num_layers: int = 2,
        dropout: float = 0.0,
        sparse: bool = True,
        embedding_device: Literal["model", "cpu"] = "model",
        accumulate_grad_batches: int = 1,
        optimizer: OptimizerCallable = torch.optim.Adam,
        embedding_optimizer: OptimizerCallable = torch.optim.SparseAdam,
        graph: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        _check_probabilities(dropout=dropout)
        if min(num_layers, hidden_channels, accumulate_grad_batches) < 1 or num_classes < 2:
            raise ConfigError(
                "--model.num_layers, --model.hidden_channels and --model.accumulate_grad_batches "
                f"must be >= 1 and --model.num_classes >= 2 (got {num_layers}, "
                f"{hidden_channels}, {accumulate_grad_batches}, {num_classes})"
            )
        self.save_hyperparameters(ignore=["optimizer", "embedding_optimizer"])
        self.automatic_optimization = False  # up to two optimizers: Lightning steps neither
        self.num_layers = num_layers
        self.optimizer, self.embedding_optimizer = optimizer, embedding_optimizer
        # torchmetrics accumulates correct/total counts, so DDP reduces counts, not ratios.
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        self.encoder: nn.Module | None = None
        if graph is not None:
            self._build(graph)

    def _build(self, graph: dict[str, Any]) -> None:
        """Input layers per node type, the heterogeneous encoder, the head."""
        self._build_encoder(graph)
        self.head = nn.Linear(self.hparams["hidden_channels"], self.hparams["num_classes"])
        self.target = str(graph["target"])
        self.hparams["graph"] = graph

    def setup(self, stage: str) -> None:
        """Build from the DataModule's types and sizes (unless a checkpoint gave them)."""
        if self.encoder is not None:
            return
        dm: Any = self.trainer.datamodule  # type: ignore[attr-defined]
        node_types, edge_types = dm.metadata
        self._build(
            {
                "node_types": node_types,
                "edge_types": [list(e) for e in edge_types],
                "num_features": dm.feature_dims,
                "num_nodes": dm.num_nodes,
                "target": dm.target_type,
            }
        )

    def forward(self, batch: HeteroData) -> Tensor:
        """Class logits of every target-type node of the (sub)graph, seeds first."""
        return self.head(self._encode(batch)[self.target])

    def _seeds(self, batch: HeteroData) -> tuple[Tensor, Tensor, Any]:
        """Logits and labels of the batch's seeds, and the store they come from."""
        store = batch[self.target]
        size = store.batch_size
        return self(batch)[:size].float(), store.y[:size], store

    def training_step(self, batch: HeteroData, batch_idx: int) -> Tensor:
        """Weighted cross-entropy on the seeds; steps every ``accumulate_grad_batches``."""
        h = self._encode(batch)
        store = batch[self.target]
        size = store.batch_size
        out, y = self.head(h[self.target][:size]).float(), store.y[:size]
        loss = (F.cross_entropy(out, y, reduction="none") * store.loss_weight[:size]).sum()
        if not torch.isfinite(loss):
            raise TrainingDiverged(
                f"the training loss is {loss.item()} at step {self.global_step}: the run "
                "stopped; lower the learning rate (--model.optimizer)"
            )
        self._backward_and_step(loss + self._unused(h, (self.target,)), batch_idx)
        self.log("train/loss", loss, prog_bar=True, on_epoch=True, batch_size=size)
        return loss

    def validation_step(self, batch: HeteroData, batch_idx: int) -> None:
        """Accuracy on the target type's validation nodes."""
        out, y, _ = self._seeds(batch)
        self.val_acc(out, y)
        self.log("val/loss", F.cross_entropy(out, y), batch_size=y.numel())
        self.log("val/acc", self.val_acc, prog_bar=True, batch_size=y.numel())

    def test_step(self, batch: HeteroData, batch_idx: int) -> None:
        """Accuracy on the target type's test nodes."""
        out, y, _ = self._seeds(batch)
        self.test_acc(out, y)
        self.log("test/acc", self.test_acc, batch_size=y.numel())
