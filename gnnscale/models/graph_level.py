"""A graph-level model on PyG's layers: one prediction per graph, edge features used.

:class:`GraphGINE` is to ``gnnscale.GraphDataModule`` what ``GraphSAGE`` is to the node
DataModules: ``--model gnnscale.GraphGINE --data gnnscale.GraphDataModule`` in the same
``gnnscale fit``, with ``in_channels`` and ``num_classes`` linked from the data; ``edge_dim``
is given (the DataModule refuses one its graphs do not have).

The batch contract is the node models': a per-graph ``loss_weight`` (``1 / batch_size``, 0 for
DDP padding) multiplies each graph's loss and the weighted sum is the step's loss, so gradient
accumulation and DDP average over graphs, short last batches included.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor
from torch_geometric import nn as pyg_nn
from torch_geometric.data import Batch
from torchmetrics import MeanAbsoluteError, MeanSquaredError
from torchmetrics.classification import MulticlassAccuracy

from gnnscale.errors import ConfigError, TrainingDiverged
from gnnscale.handshake import BatchRequest

__all__ = ["GraphGINE"]


class _RadialBasis(torch.nn.Module):
    """Gaussians on ``[0, max_value]`` of each edge feature (SchNet's expansion of distances)."""

    centers: Tensor

    def __init__(self, num: int, max_value: float) -> None:
        super().__init__()
        self.register_buffer("centers", torch.linspace(0.0, max_value, num))
        self.gamma = 0.5 / (max_value / max(num - 1, 1)) ** 2

    def forward(self, e: Tensor) -> Tensor:
        return torch.exp(-self.gamma * (e.unsqueeze(-1) - self.centers) ** 2).flatten(1)


class GraphGINE(L.LightningModule):
    """GINE message passing (PyG's ``GINEConv``, edge features in every message), pooled per graph.

    Atom types go through a linear embedding, ``num_layers`` residual ``GINEConv`` layers mix
    neighbours with their edge features (each expanded into ``num_rbf`` Gaussians, for
    distances), a per-node MLP scores each node and ``global_add_pool`` (extensive targets such
    as energies) or ``global_mean_pool`` sums them per graph.

    Args:
        in_channels: Node feature dimension (linked from the DataModule).
        num_classes: Classes of a graph label; 0 for regression (linked from the DataModule).
        edge_dim: Edge feature dimension; the DataModule refuses one its graphs do not have.
        hidden_channels: Width of every layer.
        num_layers: Message-passing layers.
        num_rbf: Gaussians per edge feature (0: the raw features).
        rbf_max: The largest edge feature value the Gaussians cover (the radius cutoff).
        pool: ``add`` or ``mean`` over a graph's nodes.
        dropout: Dropout between layers.
        optimizer: Optimizer, with its arguments; none: Adam, lr 1e-3.
        lr_scheduler: Learning-rate schedule, or none; ``ReduceLROnPlateau`` watches ``val/loss``.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        edge_dim: int = 1,
        hidden_channels: int = 128,
        num_layers: int = 3,
        num_rbf: int = 32,
        rbf_max: float = 2.0,
        pool: Literal["add", "mean"] = "add",
        dropout: float = 0.0,
        optimizer: OptimizerCallable | None = None,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ConfigError(f"--model.num_layers must be >= 1 (got {num_layers})")
        if num_classes < 0 or num_classes == 1:
            raise ConfigError(
                f"--model.num_classes must be 0 (regression) or >= 2 (got {num_classes})"
            )
        if edge_dim < 1:
            raise ConfigError(
                f"--model.edge_dim is {edge_dim}: GraphGINE needs edge features (edge_attr)"
            )
        if not 0 <= dropout < 1:
            raise ConfigError(f"--model.dropout must be in [0, 1) (got {dropout})")
        if pool not in ("add", "mean"):
            raise ConfigError(f"--model.pool {pool!r}: choose add or mean")
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.num_classes, self.edge_dim = num_classes, edge_dim
        self.optimizer, self.lr_scheduler = optimizer, lr_scheduler
        self.rbf = _RadialBasis(num_rbf, rbf_max) if num_rbf else torch.nn.Identity()
        edge_in = edge_dim * (num_rbf or 1)
        self.embed = torch.nn.Linear(in_channels, hidden_channels)
        self.convs = torch.nn.ModuleList(
            pyg_nn.GINEConv(
                pyg_nn.MLP([hidden_channels, hidden_channels, hidden_channels], norm=None),
                edge_dim=edge_in,
                train_eps=True,
            )
            for _ in range(num_layers)
        )
        self.dropout = torch.nn.Dropout(dropout)
        self.head = pyg_nn.MLP([hidden_channels, hidden_channels, max(num_classes, 1)], norm=None)
        self.pool = pyg_nn.global_add_pool if pool == "add" else pyg_nn.global_mean_pool
        if num_classes:
            self.val_metric: Any = MulticlassAccuracy(num_classes, average="micro")
            self.test_metric: Any = MulticlassAccuracy(num_classes, average="micro")
            self.val_rmse = None
        else:  # torchmetrics sums errors and counts: DDP reduces sums, not per-rank means
            self.val_metric, self.test_metric = MeanAbsoluteError(), MeanAbsoluteError()
            self.val_rmse = MeanSquaredError(squared=False)

    def batch_request(self) -> BatchRequest:
        """What this model's batches must carry (``gnnscale.handshake``): ``edge_dim`` features."""
        return BatchRequest(edge_dim=self.edge_dim, graph_level=True)

    def forward(self, batch: Batch) -> Tensor:
        """One output per graph: ``[num_graphs]`` (regression) or ``[num_graphs, classes]``."""
        x = self.embed(batch.x.to(self.dtype))
        edge_attr = batch.edge_attr  # [E] or [E, ...]; E may be 0
        e = self.rbf(edge_attr.view(len(edge_attr), math.prod(edge_attr.shape[1:])).to(self.dtype))
        for conv in self.convs:
            x = x + self.dropout(F.silu(conv(x, batch.edge_index, e)))
        out = self.pool(self.head(x), batch.batch, size=batch.num_graphs)
        return out if self.num_classes else out.view(-1)

    def _losses(self, out: Tensor, y: Tensor) -> Tensor:
        if self.num_classes:
            return F.cross_entropy(out.float(), y.view(-1), reduction="none")
        return F.l1_loss(out.float(), y.view(-1).float(), reduction="none")

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        """``sum(loss_weight * loss)`` over graphs (L1 for regression, cross-entropy else)."""
        losses = self._losses(self(batch), batch.y)
        loss = (losses * batch.loss_weight).sum()
        if not torch.isfinite(loss):
            raise TrainingDiverged(
                f"the training loss is {loss.item()} at step {self.global_step} (epoch "
                f"{self.current_epoch}, batch {batch_idx}): the run stopped. Lower the learning "
                "rate (--model.optimizer) or check the graphs for NaN/inf"
            )
        real = batch.loss_weight > 0
        graphs = int(real.sum())
        mean = losses[real].mean() if graphs else loss.detach()  # per graph, for the log
        self.log("train/loss", mean, prog_bar=True, on_epoch=True, batch_size=max(graphs, 1))
        return loss

    def _scored(self, batch: Batch) -> tuple[Tensor, Tensor]:
        real = batch.loss_weight > 0  # DDP padding scores nothing
        out = self(batch)[real]
        return out, batch.y.view(-1)[real]

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        """MAE (regression) or accuracy on validation graphs, reduced from sums across ranks."""
        out, y = self._scored(batch)
        self.val_metric(out, y)
        name = "val/acc" if self.num_classes else "val/mae"
        self.log(name, self.val_metric, prog_bar=True, batch_size=y.numel())
        losses = self._losses(out, y)
        self.log("val/loss", losses.mean(), batch_size=y.numel(), sync_dist=True)
        if self.val_rmse is not None:
            self.val_rmse(out.float(), y.float())
            self.log("val/rmse", self.val_rmse, batch_size=y.numel())

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        """MAE (regression) or accuracy on test graphs."""
        out, y = self._scored(batch)
        self.test_metric(out, y)
        name = "test/acc" if self.num_classes else "test/mae"
        self.log(name, self.test_metric, batch_size=y.numel())

    def predict_step(self, batch: Batch, batch_idx: int) -> dict[str, Tensor]:
        """Each graph's index in the store and its class (or value); ``gnnscale predict``."""
        real = batch.loss_weight > 0  # DDP padding: predicted by its own rank
        out = self(batch)[real]
        if self.num_classes:
            return {"graph": batch.idx[real], "class": out.argmax(-1)}
        return {"graph": batch.idx[real], "value": out.float()}

    def configure_optimizers(self) -> Any:
        """The optimizer (and schedule) chosen in the config; none: Adam with lr 1e-3."""
        if self.optimizer is None:
            optimizer: torch.optim.Optimizer = torch.optim.Adam(self.parameters(), lr=1e-3)
        else:
            optimizer = self.optimizer(self.parameters())
        if self.lr_scheduler is None:
            return optimizer
        scheduler = self.lr_scheduler(optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "monitor": "val/loss"},
        }
