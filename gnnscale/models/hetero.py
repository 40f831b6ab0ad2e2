"""Heterogeneous GNNs: the shared encoder base and HeteroSAGE for node classification."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, cast, get_type_hints

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn
from torch_geometric.data import HeteroData
from torch_geometric.nn import GCNConv, SAGEConv, to_hetero
from torchmetrics.classification import MulticlassAccuracy

from gnnscale.errors import ConfigError, TrainingDiverged, check_probabilities
from gnnscale.handshake import BatchRequest, GraphSpec
from gnnscale.models.embedding import HostEmbedding
from gnnscale.models.fast import bucket_size, product_dtype
from gnnscale.models.fast_hetero import target_only
from gnnscale.optim import SparseAdam


class _SAGE(nn.Module):
    """GraphSAGE layers of one width (``to_hetero`` traces it once per edge type).

    ``conv="gcn"``: GCN layers instead (``GCNConv``: self-loops, symmetric degree
    normalisation), the graph auto-encoder's encoder; for relations within one node type.
    """

    def __init__(self, channels: int, num_layers: int, dropout: float, conv: str = "sage") -> None:
        super().__init__()
        layer = SAGEConv if conv == "sage" else GCNConv
        self.convs = nn.ModuleList(layer(channels, channels) for _ in range(num_layers))
        # A module, not F.dropout(training=self.training): tracing would freeze the flag.
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = self.dropout(x.relu())
        return x


# Resolved, not strings (``from __future__ import annotations``): torch.fx before torch 2.6
# cannot write a string annotation into the code ``to_hetero`` generates.
_SAGE.forward.__annotations__ = get_type_hints(_SAGE.forward)


def _converting(layer: nn.Module, dtype: torch.dtype) -> Callable[[Tensor], Tensor]:
    """``layer`` on rows converted to ``dtype`` first."""
    return lambda rows: layer(rows.to(dtype))


class HeteroGNN(L.LightningModule):
    """What ``LinkPredictor`` and ``gnnscale.HeteroSAGE`` share: inputs, encoder, optimizers.

    Node types with features enter through a linear layer, featureless ones through an
    embedding table (sparse gradients and ``SparseAdam``, optionally in host memory); the
    encoder is ``_SAGE`` made heterogeneous by ``to_hetero`` (relations averaged). Two
    optimizers, so manual optimization with the model's own ``accumulate_grad_batches``.
    Subclasses save ``hidden_channels``, ``num_layers``, ``dropout``, ``sparse``,
    ``embedding_device`` and ``accumulate_grad_batches`` as hyperparameters.
    """

    optimizer: OptimizerCallable
    embedding_optimizer: OptimizerCallable
    encoder: nn.Module
    target_only_layers = True
    project_after_mean = True  # with target-only layers: see target_only's inputs
    bucket_rows: int | Literal["auto"] = "auto"  # with target-only layers: see target_only's

    def _set_bucket_rows(self, bucket_rows: int | Literal["auto"]) -> None:
        if bucket_rows != "auto" and bucket_rows < 0:
            raise ConfigError(f"--model.bucket_rows must be >= 0 or auto (got {bucket_rows})")
        self.bucket_rows = bucket_rows

    def _only(self, seeds: dict[str, int]) -> dict[str, int] | None:
        """``seeds`` for :meth:`_encode` where layers compute the rows read next, else none."""
        return seeds if self.target_only_layers else None

    def batch_request(self) -> BatchRequest:
        """What this model's batches must carry (``gnnscale.handshake``): one fan-out per layer."""
        return BatchRequest(int(self.hparams["num_layers"]))

    def _build_encoder(self, graph: GraphSpec) -> None:
        """Input layers per node type and the heterogeneous encoder, for ``graph``'s types."""
        hp = self.hparams
        channels = hp["hidden_channels"]
        table = HostEmbedding if hp["embedding_device"] == "cpu" else nn.Embedding
        self.inputs = nn.ModuleDict()
        self.tables = nn.ModuleDict()
        for t in graph.node_types:
            if graph.num_features[t]:
                self.inputs[t] = nn.Linear(graph.num_features[t], channels)
            else:
                self.tables[t] = table(graph.num_nodes[t], channels, sparse=hp["sparse"])
        metadata = (list(graph.node_types), list(graph.edge_types))
        self.encoder = to_hetero(
            _SAGE(channels, hp["num_layers"], hp["dropout"], hp.get("conv", "sage")),
            metadata,
            aggr="mean",
        )
        hp["graph"] = graph.as_dict()  # plain values: a checkpoint reloads without the data

    def _encode(
        self, batch: HeteroData, seeds: Mapping[str, int | Tensor] | None = None
    ) -> dict[str, Tensor]:
        """Embeddings of the (sub)graph's nodes, per node type.

        Every node's; given ``seeds``, of each type's ``seeds`` rows only (a count of first rows,
        or sorted ids), each layer computing only the rows the next one reads
        (:func:`target_only`).
        """
        # Under autocast, features go to its dtype at once: float16 or bfloat16 rows (a
        # store's) make no float32 copy for the input layer to cast again; the same values.
        x, dtype = {}, product_dtype(self.device, cast(torch.dtype, self.dtype))
        # The first layer averages raw features before the input layer (target_only's inputs).
        # 16-bit rows stay as they are when the products run in 16 bits: averaged as stored,
        # only the averages and the first layer's own rows converted.
        raw = seeds is not None and self.project_after_mean and self.device.type == "cpu"
        inputs: dict[str, Callable[[Tensor], Tensor]] = {}
        for t in batch.node_types:
            if t in self.inputs and raw:
                features = batch[t].x
                same = features.dtype.itemsize == dtype.itemsize and features.is_floating_point()
                x[t] = features if same else features.to(dtype)
                inputs[t] = _converting(self.inputs[t], dtype)
            elif t in self.inputs:
                x[t] = self.inputs[t](batch[t].x.to(dtype))
            else:
                table = cast(nn.Embedding, self.tables[t])
                ids = batch[t].n_id if "n_id" in batch[t] else torch.arange(batch[t].num_nodes)
                x[t] = table(ids.to(table.weight.device)).to(self.device)
        if seeds is not None:
            bucket = bucket_size(self.bucket_rows, self.device)
            return target_only(self.encoder, x, batch.edge_index_dict, seeds, inputs, bucket)
        return self.encoder(x, batch.edge_index_dict)

    @staticmethod
    def _unused(h: dict[str, Tensor], used: tuple[str, ...]) -> Tensor | float:
        """0 times the last layer's outputs of the node types the loss does not read.

        Added to the loss, they keep that layer's weights in the graph: DDP needs a gradient
        for every parameter (else it stops, or, with ``find_unused_parameters``, searches the
        graph every step).
        """
        return sum((h[t].sum() * 0.0 for t in h if t not in used), 0.0)

    def _backward_and_step(self, loss: Tensor, batch_idx: int) -> None:
        """Backward; step both optimizers every ``accumulate_grad_batches`` micro-batches."""
        k = self.hparams["accumulate_grad_batches"]
        self.manual_backward(loss / k)  # weights sum to ~1 per batch: a mean over k batches
        if (batch_idx + 1) % k == 0 or self.trainer.is_last_batch:
            optimizers = self.optimizers()
            for opt in optimizers if isinstance(optimizers, list) else [optimizers]:
                opt.step()
                opt.zero_grad()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Flush the loggers: what was logged before a checkpoint is on disk beside it."""
        for logger in self.loggers:
            logger.save()

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:  # type: ignore[override]
        """The dense optimizer; the sparse one for the tables when they have sparse gradients."""
        dense = [p for name, p in self.named_parameters() if not name.startswith("tables.")]
        optimizers = [self.optimizer(dense)]
        if len(self.tables):
            tables = list(self.tables.parameters())
            optimizers.append(
                self.embedding_optimizer(tables)
                if self.hparams["sparse"]
                else self.optimizer(tables)
            )
        return optimizers


class HeteroSAGE(HeteroGNN):
    """Heterogeneous GraphSAGE classifying one node type's nodes (``HeteroNeighborDataModule``).

    Node types with features enter through a linear layer, featureless ones through a learned
    embedding table (sparse gradients, ``SparseAdam``); ``to_hetero`` gives every edge type its
    own ``SAGEConv`` per layer and averages the relations into each node type; a linear head
    turns the target type's last layer into class logits. Loss and accuracy cover the batch's
    seeds only. Built from the graph its DataModule describes (``graph``), which it saves in its
    hyperparameters, so checkpoints reload without the data.

    Args:
        num_classes: Classes of the target type (linked from the DataModule).
        graph: Node and edge types, feature widths, node counts and the target type (linked
            from ``HeteroNeighborDataModule.graph_spec``; in Python, pass ``dm.graph_spec``).
        hidden_channels: Width of the embeddings and of every layer.
        num_layers: Message-passing layers; one fan-out per layer in ``data.num_neighbors``.
        dropout: Dropout between layers.
        sparse: Sparse gradients for the featureless types' tables (only looked-up rows);
            they then get ``embedding_optimizer`` (``gnnscale.optim.SparseAdam``).
        embedding_device: ``cpu`` keeps the tables and their optimizer state in host memory;
            ``model``: they live with the GNN.
        accumulate_grad_batches: Micro-batches per optimizer step (Lightning refuses
            ``--trainer.accumulate_grad_batches`` with two optimizers, so the model accumulates).
        optimizer: Optimizer of the dense weights.
        embedding_optimizer: Optimizer of the tables.
        target_only_layers: In training and evaluation, compute each layer only for the rows
            the next one reads (:func:`target_only`; the seeds' outputs are the same); false:
            PyG's forward over every sampled node at every layer.
        project_after_mean: With target-only layers on a CPU, the first layer averages each
            relation's raw features and the input layers project the averages, not every
            sampled row (``gnnscale.models.fast_hetero.target_only``'s ``inputs``; the same
            outputs); false: every sampled row is projected first.
        bucket_rows: With target-only layers, round each layer's rows of every node type up
            to a multiple of this (0: off), with rows no edge reaches and no later layer reads
            (``gnnscale.models.fast_hetero.target_only``): bf16 products on a CPU then reuse a
            few oneDNN primitives instead of building one for every batch's row counts.
            ``auto`` (the default): 1024 where the products run in bf16 on a CPU, else off
            (``gnnscale.models.fast.bucket_size``; the ``speed_defaults`` table).
    """

    def __init__(
        self,
        num_classes: int,
        graph: GraphSpec,
        hidden_channels: int = 64,
        num_layers: int = 2,
        dropout: float = 0.0,
        sparse: bool = True,
        embedding_device: Literal["model", "cpu"] = "model",
        accumulate_grad_batches: int = 1,
        optimizer: OptimizerCallable = torch.optim.Adam,
        embedding_optimizer: OptimizerCallable = SparseAdam,
        target_only_layers: bool = True,
        project_after_mean: bool = True,
        bucket_rows: int | Literal["auto"] = "auto",
    ) -> None:
        super().__init__()
        check_probabilities(dropout=dropout)
        self.target_only_layers = target_only_layers
        self.project_after_mean = project_after_mean
        self._set_bucket_rows(bucket_rows)
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
        spec = graph if isinstance(graph, GraphSpec) else GraphSpec(**graph)  # a checkpoint's
        if not isinstance(spec.target, str):
            raise ConfigError(
                "HeteroSAGE classifies one node type's nodes: its graph is "
                f"HeteroNeighborDataModule's graph_spec (got target {spec.target!r})"
            )
        self._build_encoder(spec)
        self.head = nn.Linear(hidden_channels, num_classes)
        self.target = str(spec.target)

    def forward(self, batch: HeteroData) -> Tensor:
        """Class logits of every target-type node of the (sub)graph, seeds first."""
        return self.head(self._encode(batch)[self.target])

    def _seeds(self, batch: HeteroData) -> tuple[Tensor, Tensor, Any]:
        """Logits and labels of the batch's seeds, and the store they come from."""
        store = batch[self.target]
        size = store.batch_size
        h = self._encode(batch, self._only({self.target: size}))[self.target]
        return self.head(h[:size]).float(), store.y[:size], store

    def training_step(self, batch: HeteroData, batch_idx: int) -> Tensor:
        """Weighted cross-entropy on the seeds; steps every ``accumulate_grad_batches``."""
        store = batch[self.target]
        size = store.batch_size
        h = self._encode(batch, self._only({self.target: size}))
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
        self.log("val/loss", F.cross_entropy(out, y), batch_size=y.numel(), sync_dist=True)
        self.log("val/acc", self.val_acc, prog_bar=True, batch_size=y.numel())

    def test_step(self, batch: HeteroData, batch_idx: int) -> None:
        """Accuracy on the target type's test nodes."""
        out, y, _ = self._seeds(batch)
        self.test_acc(out, y)
        self.log("test/acc", self.test_acc, batch_size=y.numel())

    def predict_step(self, batch: HeteroData, batch_idx: int) -> dict[str, Tensor]:
        """Each seed's id among the target type's nodes and its class; ``gnnscale predict``."""
        out, _, store = self._seeds(batch)
        return {"node": store.n_id[: store.batch_size], "class": out.argmax(-1)}
