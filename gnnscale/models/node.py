"""GraphSAGE and GATv2 node classifiers as LightningModules, on PyG's own layers."""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor
from torch_geometric import nn as pyg_nn
from torch_geometric.data import Data
from torchmetrics.classification import MulticlassAccuracy

from gnnscale.batch import (
    HopLayout,
    LayerwiseBatch,
    Layout,
    SubgraphLayout,
    WholeGraph,
    layout_of,
)
from gnnscale.errors import ConfigError, TrainingDiverged, check_probabilities
from gnnscale.handshake import BatchRequest
from gnnscale.models import fast
from gnnscale.models.dropout import Dropout
from gnnscale.models.fast import LayerSpeedTricks, SpeedTricks
from gnnscale.models.inference import layerwise_inference

_ADAM_LR = 0.005
_ADAM_WEIGHT_DECAY = 5e-4


def _scored_nodes(batch: Data | LayerwiseBatch) -> Tensor:
    """The ids of the nodes whose outputs ``NodeClassifier._logits`` returns, in its order."""
    if isinstance(batch, LayerwiseBatch):
        mask, num_nodes = batch.mask, batch.y.size(0)
    elif "batch_size" in batch:  # sampled: the seeds come first
        return batch.n_id[: batch.batch_size]
    else:
        mask, num_nodes = _score_mask(batch), batch.num_nodes
    return torch.arange(num_nodes) if mask is None else mask.nonzero().view(-1)


def _score_mask(batch: Data) -> Tensor | None:
    """The nodes a whole-graph batch scores (``WholeGraph``); none: every node."""
    layout = layout_of(batch)
    return layout.score if isinstance(layout, WholeGraph) else None


class NodeClassifier(L.LightningModule):
    """Training, evaluation and optimisation shared by the gnnscale models.

    Subclass it for a model of your own (set ``self.gnn`` to a PyG ``BasicGNN``, or override
    ``forward``); ``gnnscale fit`` accepts any subclass as ``model.class_path``.
    """

    gnn: pyg_nn.models.basic_gnn.BasicGNN

    def __init__(
        self,
        num_classes: int,
        num_layers: int,
        optimizer: OptimizerCallable | None = None,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ConfigError(f"--model.num_layers must be >= 1 (got {num_layers})")
        self.num_layers = num_layers
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        # torchmetrics accumulates correct/total counts, so DDP reduces counts, not ratios.
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")

    # The speed tricks the layers take, set by the subclasses from their ``speed`` option group
    # (gnnscale.models.fast.SpeedTricks): compute only the rows the next layer reads (in
    # training; in evaluation also wherever every norm is row-wise, unless switched off),
    # aggregate with a sparse product, pad rows to multiples.
    target_only_layers = False
    target_only_in_eval = True
    sparse_aggregation = False
    bucket_rows: int | Literal["auto"] = 0
    # The first layer's neighbour reduction, if the loader may compute it on the raw features;
    # None: the model aggregates every layer itself.
    first_layer_aggr: str | None = None
    # Edge features the convs read (``edge_attr``, its width); None: none.
    edge_dim: int | None = None

    def batch_request(self) -> BatchRequest:
        """What this model's batches must carry (``gnnscale.handshake``): its DataModule's input."""
        held = 0  # values per node that layer-wise inference holds: a layer's input and output
        if (gnn := getattr(self, "gnn", None)) is not None:  # a subclass may compute without one
            outputs = [gnn.hidden_channels] * (gnn.num_layers - 1) + [gnn.out_channels]
            held = max([outputs[0], *(a + b for a, b in zip(outputs, outputs[1:], strict=False))])
        return BatchRequest(
            self.num_layers, self.first_layer_aggr, self.edge_dim, layerwise_channels=held
        )

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        layout: Layout | None = None,
        edge_attr: Tensor | None = None,
    ) -> Tensor:
        """Class logits for every node of the (sub)graph, or for a neighbour batch's seeds.

        Features are cast to the parameters' dtype (float32 under mixed precision; bfloat16,
        float16 or float64 under ``*-true``).

        Args:
            x: Node features (with a :class:`HopLayout` carrying ``x_aggr``: the first layer's
                targets only).
            edge_index: Edges; sorted by target when a layout is given.
            layout: How the loader laid the batch out (``gnnscale.batch``). A
                :class:`HopLayout` (neighbour batch): logits for the seeds, each layer
                computing only the rows the next one reads (``fast.hops_forward``). A
                :class:`SubgraphLayout` (Cluster-GCN, GraphSAINT): every node, aggregated with a
                sparse product (``fast.subgraph_forward``). :class:`WholeGraph` or none: PyG's
                forward.
            edge_attr: Edge features, in ``edge_index``'s order, for convs with an ``edge_dim``.
        """
        if (
            isinstance(layout, HopLayout)
            and layout.x_aggr is not None
            and not self.first_layer_aggr
        ):
            raise ValueError(
                f"{type(self).__name__} computes its first layer's aggregation itself: give it "
                "batches without x_aggr (its batch_request() asks for none)"
            )
        x = x.to(self.dtype)
        if edge_attr is not None:
            edge_attr = edge_attr.to(self.dtype)
        if isinstance(layout, HopLayout):
            # In eval mode a BatchNorm is row-wise too: evaluation computes the rows read next.
            rowwise = (
                not self.training and self.target_only_in_eval and fast.rowwise_in_eval(self.gnn)
            )
            return fast.hops_forward(
                self.gnn,
                x,
                edge_index,
                layout,
                target_only_layers=self.target_only_layers or rowwise,
                sparse_aggregation=self.sparse_aggregation,
                bucket_rows=fast.bucket_size(self.bucket_rows, x.device),
                edge_attr=edge_attr,
            )
        if isinstance(layout, SubgraphLayout) and self.sparse_aggregation:
            rows = fast.bucket_size(self.bucket_rows, x.device)
            return fast.subgraph_forward(self.gnn, x, edge_index, layout, rows)
        return self.gnn(x, edge_index, edge_attr=edge_attr)

    def _edges(self, batch: Data) -> Tensor | None:
        """The batch's edge features, where the convs read them (``edge_dim``)."""
        return batch.edge_attr if self.edge_dim else None

    def training_step(self, batch: Data, batch_idx: int) -> Tensor:
        """Weighted cross-entropy; the DataModule's weights sum to 1 per batch in expectation."""
        out = self(batch.x, batch.edge_index, layout_of(batch), self._edges(batch))
        y, weight = batch.y[: out.size(0)], batch.loss_weight[: out.size(0)]  # seeds only
        # Nodes outside every split may be unlabelled (y = -1): they weigh 0 and are ignored.
        loss = (F.cross_entropy(out.float(), y, reduction="none", ignore_index=-1) * weight).sum()
        if not torch.isfinite(loss):
            raise TrainingDiverged(
                f"the training loss is {loss.item()} at step {self.global_step} (epoch "
                f"{self.current_epoch}, batch {batch_idx}): the run stopped. Likely causes: a "
                "learning rate too high for the optimizer (--model.optimizer), or NaN/inf in the "
                "inputs; fp16 without loss scaling can overflow too"
            )
        self.log("train/loss", loss, prog_bar=True, on_epoch=True, batch_size=batch.num_loss_nodes)
        return loss

    def layerwise_input(self, batch: LayerwiseBatch) -> LayerwiseBatch:
        """``batch`` as exact layer-wise inference reads it: the first layer's input is ``x``."""
        return batch

    def transfer_batch_to_device(
        self, batch: Any, device: torch.device, dataloader_idx: int
    ) -> Any:
        """Every batch to ``device``; a layer-wise one's whole-graph tensors stay in host memory.

        Lightning would copy all of ``x`` (a prepared graph's whole feature file) to the GPU;
        :func:`layerwise_inference` moves each one-hop batch's rows there itself, as PyG's
        ``inference`` does.
        """
        if isinstance(batch, LayerwiseBatch):
            return batch
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def _logits(self, batch: Data | LayerwiseBatch) -> tuple[Tensor, Tensor]:
        if isinstance(batch, LayerwiseBatch):
            batch, sparse = self.layerwise_input(batch), self.sparse_aggregation
            out = layerwise_inference(self.gnn, batch, self.device, sparse)
            y = batch.y
            if batch.mask is not None:
                out, y = out[batch.mask], y[batch.mask]
            return out.to(self.device), y.to(self.device)
        out, y = self(batch.x, batch.edge_index, layout_of(batch), self._edges(batch)), batch.y
        if "batch_size" in batch:  # sampled: the evaluated seed nodes come first
            return out[: batch.batch_size], y[: batch.batch_size]
        mask = _score_mask(batch)  # the whole graph
        return (out, y) if mask is None else (out[mask], y[mask])

    def validation_step(self, batch: Data | LayerwiseBatch, batch_idx: int) -> None:
        """Accuracy on validation nodes."""
        out, y = self._logits(batch)
        self.val_acc(out, y)
        loss = F.cross_entropy(out.float(), y)  # the schedule's: averaged over DDP ranks
        self.log("val/loss", loss, batch_size=y.numel(), sync_dist=True)
        self.log("val/acc", self.val_acc, prog_bar=True, batch_size=y.numel())

    def test_step(self, batch: Data | LayerwiseBatch, batch_idx: int) -> None:
        """Accuracy on test nodes."""
        out, y = self._logits(batch)
        self.test_acc(out, y)
        self.log("test/acc", self.test_acc, batch_size=y.numel())

    def predict_step(self, batch: Data | LayerwiseBatch, batch_idx: int) -> dict[str, Tensor]:
        """Each scored node's id and predicted class (``gnnscale predict`` writes them)."""
        return {"node": _scored_nodes(batch), "class": self._logits(batch)[0].argmax(-1)}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Flush the loggers: what was logged before a checkpoint is on disk beside it."""
        for logger in self.loggers:
            logger.save()

    def configure_optimizers(self) -> Any:
        """The optimizer (and schedule) chosen in the config; none: Adam, as the GAT paper."""
        if self.optimizer is None:
            optimizer: torch.optim.Optimizer = torch.optim.Adam(
                self.parameters(), lr=_ADAM_LR, weight_decay=_ADAM_WEIGHT_DECAY
            )
        else:
            optimizer = self.optimizer(self.parameters())
        if self.lr_scheduler is None:
            return optimizer
        scheduler = self.lr_scheduler(optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "monitor": "val/loss"},
        }


class GraphSAGE(NodeClassifier):
    """GraphSAGE (Hamilton et al., 2017) on PyG's ``SAGEConv``.

    Args:
        in_channels: Node feature dimension (linked from the DataModule).
        num_classes: Number of classes (linked from the DataModule).
        hidden_channels: Width of the hidden layers.
        num_layers: Message-passing layers; neighbour sampling needs one fan-out per layer.
        dropout: Dropout probability between layers.
        norm: Normalisation between layers (``batch_norm``, ``layer_norm``, ...) or none.
        aggr: Neighbourhood aggregation: ``mean``, ``max``, ``sum``.
        speed: The speed tricks, each a switch (:class:`~gnnscale.models.fast.SpeedTricks`):
            ``--model.init_args.speed.cpu_dropout=false`` runs without one. All on
            (``bucket_rows`` where it paid: ``auto``); a trick this model's settings cannot
            take (target-only layers and the loader's aggregation with a ``norm``, sparse
            aggregation with another ``aggr``) is off.
        optimizer: Optimizer, with its arguments (``class_path`` and ``init_args``); none:
            ``Adam`` with lr 0.005 and weight decay 5e-4 (the GAT paper's settings).
        lr_scheduler: Learning-rate schedule, or none; ``ReduceLROnPlateau`` watches ``val/loss``.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        hidden_channels: int = 256,
        num_layers: int = 2,
        dropout: float = 0.5,
        norm: str | None = None,
        aggr: str = "mean",
        speed: SpeedTricks = SpeedTricks(),  # noqa: B008 (frozen dataclass)
        optimizer: OptimizerCallable | None = None,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(num_classes, num_layers, optimizer, lr_scheduler)
        check_probabilities(dropout=dropout)
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.gnn = pyg_nn.GraphSAGE(
            in_channels,
            hidden_channels,
            num_layers,
            out_channels=num_classes,
            dropout=dropout,
            norm=norm,
            aggr=aggr,
        )
        if speed.cpu_dropout:  # else PyG's torch.nn.Dropout
            self.gnn.dropout = Dropout(dropout)
        self.target_only_layers = speed.target_only_layers and norm is None
        self.target_only_in_eval = speed.target_only_layers
        self.sparse_aggregation = speed.sparse_aggregation and aggr in fast.SPARSE_AGGRS
        self.bucket_rows = speed.bucket_rows
        if speed.aggregate_in_loader and self.target_only_layers and self.sparse_aggregation:
            self.first_layer_aggr = aggr


class GATv2(NodeClassifier):
    """GATv2 (Brody et al., 2022) on PyG's edge-wise ``GATv2Conv``: memory O(E), not O(N^2).

    Args:
        in_channels: Node feature dimension (linked from the DataModule).
        num_classes: Number of classes (linked from the DataModule).
        hidden_channels: Width of the hidden layers, all heads together (must divide by heads).
        num_layers: Attention layers; neighbour sampling needs one fan-out per layer.
        heads: Attention heads per hidden layer (concatenated).
        out_heads: Heads of the output attention layer, averaged; each costs E x num_classes
            activations, so fewer heads here is the cheapest memory cut with many classes.
        linear_head: End with a linear classifier on the last attention layer's output instead
            of an attention layer into ``num_classes`` (``num_layers`` attention layers remain).
        dropout: Dropout probability on each layer's input features.
        attention_dropout: Dropout probability on attention coefficients. The GAT paper uses
            0.6 on Cora (``recipes/planetoid`` does); with neighbour sampling, which already
            drops edges, it stopped GATv2 training on the recipes' graphs, hence 0 by default.
        norm: Normalisation between layers (``batch_norm``, ``layer_norm``, ...) or none.
        edge_dim: Edge features each attention layer reads (``edge_attr``, of this width: the
            graph's, checked by the DataModule; a prepared folder's ``edge_attr.npy``); none:
            attention on the nodes alone. Evaluation is then sampled or full, not layer-wise.
        speed: The speed tricks GATv2's layers take, each a switch
            (:class:`~gnnscale.models.fast.LayerSpeedTricks`: target-only layers, the CPU
            dropout), both on. GATv2 keeps its edge list: its attention weighs each edge before
            summing, so GraphSAGE's aggregation tricks do not apply.
        optimizer: Optimizer, with its arguments (``class_path`` and ``init_args``); none:
            ``Adam`` with lr 0.005 and weight decay 5e-4 (the GAT paper's settings).
        lr_scheduler: Learning-rate schedule, or none; ``ReduceLROnPlateau`` watches ``val/loss``.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        hidden_channels: int = 64,
        num_layers: int = 2,
        heads: int = 8,
        out_heads: int = 1,
        linear_head: bool = False,
        dropout: float = 0.6,
        attention_dropout: float = 0.0,
        norm: str | None = None,
        edge_dim: int | None = None,
        speed: LayerSpeedTricks = LayerSpeedTricks(),  # noqa: B008 (frozen dataclass)
        optimizer: OptimizerCallable | None = None,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(num_classes, num_layers, optimizer, lr_scheduler)
        check_probabilities(dropout=dropout, attention_dropout=attention_dropout)
        if edge_dim is not None and edge_dim < 1:
            raise ConfigError(f"--model.edge_dim must be >= 1, or none (got {edge_dim})")
        if hidden_channels % heads:
            raise ConfigError(
                f"--model.hidden_channels ({hidden_channels}) must be divisible by "
                f"--model.heads ({heads})"
            )
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.gnn = pyg_nn.GAT(
            in_channels,
            hidden_channels,
            num_layers,
            out_channels=num_classes,
            dropout=dropout,
            norm=norm,
            jk="last" if linear_head else None,  # PyG then adds a Linear after the convs
            v2=True,
            heads=heads,
            edge_dim=edge_dim,
        )
        if not linear_head and out_heads != heads:
            last = self.gnn.convs[-1]
            self.gnn.convs[-1] = pyg_nn.GATv2Conv(
                last.in_channels, num_classes, heads=out_heads, concat=False, edge_dim=edge_dim
            )
        self.edge_dim = edge_dim
        for conv in self.gnn.convs:  # PyG's GAT gives every conv the feature dropout
            conv.dropout = attention_dropout
        if speed.cpu_dropout:  # else PyG's torch.nn.Dropout
            self.gnn.dropout = Dropout(dropout)
        self.target_only_layers = speed.target_only_layers and norm is None
        self.target_only_in_eval = speed.target_only_layers
