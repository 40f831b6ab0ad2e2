"""GraphSAGE over a learned embedding per node: for nodes without features.

The table is one row per node, trained with sparse gradients (only the rows a batch looked up)
and its own optimizer (``SparseAdam``), and can stay in host memory while the GNN runs on an
accelerator (``embedding_device: cpu``). Usable from YAML (``model.class_path:
gnnscale.EmbeddingSAGE``), so ``gnnscale fit`` and ``gnnscale plan`` load it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, cast

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn
from torch_geometric import nn as pyg_nn
from torch_geometric.data import Data

from gnnscale.batch import LayerwiseBatch, layout_of
from gnnscale.errors import ConfigError, check_probabilities
from gnnscale.handshake import BatchRequest
from gnnscale.models.dropout import Dropout
from gnnscale.models.fast import SpeedTricks
from gnnscale.models.node import NodeClassifier
from gnnscale.optim import SparseAdam

__all__ = ["EmbeddingSAGE"]


class HostEmbedding(nn.Embedding):
    """An embedding table that ``.to(device)`` leaves on the CPU (with its optimizer state)."""

    def _apply(self, fn: Any, recurse: bool = True) -> HostEmbedding:
        return self


class EmbeddingSAGE(NodeClassifier):
    """GraphSAGE over a learned embedding table, one row per node, trained with two optimizers.

    Args:
        in_channels: Feature dimension of the data (linked; unused: nodes are their embeddings).
        num_classes: Number of classes (linked from the DataModule).
        num_nodes: Rows of the table: the graph's node count (linked from the DataModule; saved
            in checkpoints, so they reload without the data).
        embedding_dim: Width of each node's embedding.
        sparse: Sparse gradients (only looked-up rows); needs a sparse optimizer (``SparseAdam``).
        embedding_device: ``cpu`` keeps the table and its optimizer state in host memory; only
            looked-up rows travel to the accelerator. ``model``: the table lives with the GNN.
        embedding_optimizer: Optimizer of the table (``gnnscale.optim.SparseAdam`` if sparse,
            else e.g. ``Adam``).
        accumulate_grad_batches: Micro-batches per optimizer step (Lightning refuses
            ``--trainer.accumulate_grad_batches`` with two optimizers, so the model accumulates).
        hidden_channels: Width of the hidden layers.
        num_layers: Message-passing layers; neighbour sampling needs one fan-out per layer.
        dropout: Dropout probability between layers.
        speed: GraphSAGE's speed tricks, each a switch
            (:class:`~gnnscale.models.fast.SpeedTricks`); the loader's first-layer aggregation
            does not apply (the input is the table, not features): the model aggregates.
        optimizer: Optimizer of the dense GNN weights.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        num_nodes: int,
        embedding_dim: int = 64,
        sparse: bool = True,
        embedding_device: Literal["model", "cpu"] = "model",
        embedding_optimizer: OptimizerCallable = SparseAdam,
        accumulate_grad_batches: int = 1,
        hidden_channels: int = 256,
        num_layers: int = 2,
        dropout: float = 0.5,
        speed: SpeedTricks = SpeedTricks(),  # noqa: B008 (frozen dataclass)
        optimizer: OptimizerCallable = torch.optim.Adam,
    ) -> None:
        super().__init__(num_classes, num_layers, optimizer, None)
        check_probabilities(dropout=dropout)
        if accumulate_grad_batches < 1:
            raise ConfigError(
                f"--model.accumulate_grad_batches must be >= 1 (got {accumulate_grad_batches})"
            )
        self.save_hyperparameters(ignore=["optimizer", "embedding_optimizer"])
        self.automatic_optimization = False  # two optimizers: Lightning steps neither
        self.embedding_optimizer = embedding_optimizer
        table = HostEmbedding if embedding_device == "cpu" else nn.Embedding
        self.embedding = table(num_nodes, embedding_dim, sparse=sparse)
        self.gnn = pyg_nn.GraphSAGE(
            embedding_dim, hidden_channels, num_layers, out_channels=num_classes, dropout=dropout
        )
        if speed.cpu_dropout:  # else PyG's torch.nn.Dropout
            self.gnn.dropout = Dropout(dropout)
        self.target_only_layers = self.target_only_in_eval = speed.target_only_layers
        self.sparse_aggregation = speed.sparse_aggregation  # its aggregation is the mean
        self.bucket_rows = speed.bucket_rows

    def batch_request(self) -> BatchRequest:
        """As GraphSAGE's, without features: the model reads node ids (``gnnscale.handshake``)."""
        return dataclasses.replace(super().batch_request(), reads_x=False)

    def embed(self, n_id: Tensor) -> Tensor:
        """The embedding rows of the nodes ``n_id`` (global ids), on the GNN's device."""
        return self.embedding(n_id.to(self.embedding.weight.device)).to(self.device)

    def training_step(self, batch: Data, batch_idx: int) -> Tensor:
        """Weighted loss; step both optimizers every ``accumulate_grad_batches`` micro-batches."""
        k = self.hparams["accumulate_grad_batches"]
        out = self(self.embed(batch.n_id), batch.edge_index, layout_of(batch))
        y, weight = batch.y[: out.size(0)], batch.loss_weight[: out.size(0)]  # seeds only
        loss = (F.cross_entropy(out.float(), y, reduction="none") * weight).sum()
        self.manual_backward(loss / k)  # loss_weight sums to ~1 per micro-batch: mean over k
        if (batch_idx + 1) % k == 0 or self.trainer.is_last_batch:
            for opt in cast(list, self.optimizers()):  # two: the table's and the GNN's
                opt.step()
                opt.zero_grad()
        self.log("train/loss", loss, prog_bar=True, on_epoch=True, batch_size=batch.num_loss_nodes)
        return loss

    def layerwise_input(self, batch: LayerwiseBatch) -> LayerwiseBatch:
        """``batch`` with the table as every node's input (the model never reads ``x``)."""
        return dataclasses.replace(batch, x=self.embedding.weight, read_threads=1)

    def _logits(self, batch: Data | LayerwiseBatch) -> tuple[Tensor, Tensor]:
        if isinstance(batch, LayerwiseBatch):
            return super()._logits(batch)
        out = self(self.embed(batch.n_id), batch.edge_index, layout_of(batch))  # sampled: seeds
        return out[: batch.batch_size], batch.y[: batch.batch_size]

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:  # type: ignore[override]
        """Dense optimizer for the GNN, sparse one for the table."""
        assert self.optimizer is not None and self.embedding is not None
        return [
            self.optimizer(self.gnn.parameters()),
            self.embedding_optimizer(self.embedding.parameters()),
        ]
