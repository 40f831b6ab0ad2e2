"""``TemporalLinkPredictor``: which destination a source picks at time ``t``, from the past alone.

A node at time ``t`` is its learned embedding plus the mean of messages from its sampled
in-edges before ``t`` (``TemporalLinkDataModule``): each message reads the neighbour's
embedding, the interaction's features and its age, encoded as TGAT encodes time (cosines of
the age at learned frequencies). A candidate's score reads the two nodes and how often and how
recently the source met it among its sampled neighbours. Trained with a softmax over each
question's candidates; evaluated by MRR over the fixed candidates (ties counted half) and AP,
beside the baselines scored on the same candidates (EdgeBank, with and without a time window;
popularity).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from lightning import LightningModule
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import BinaryAveragePrecision

from gnnscale.batch import TemporalBatch, mrr
from gnnscale.errors import ConfigError, check_probabilities

__all__ = ["TemporalLinkPredictor", "TimeEncoding"]

BASELINES = ("edgebank", "edgebank_tw", "popularity")


class TimeEncoding(nn.Module):
    """An age as cosines at ``channels`` learned frequencies (TGAT), spread from 1 to 1e-6."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.frequency = nn.Parameter(10 ** -torch.linspace(0, 6, channels))

    def forward(self, age: Tensor) -> Tensor:
        """``[n] -> [n, channels]``."""
        return torch.cos(age.unsqueeze(1) * self.frequency)


class TemporalLinkPredictor(LightningModule):
    """Scores a question's candidates from the sampled neighbourhoods of a temporal batch.

    Args:
        num_nodes: Rows of the node embedding table (the CLI links ``data.num_nodes``).
        in_channels: Features per interaction (the CLI links ``data.num_features``).
        hidden_channels: Width of embeddings, messages and the scorer.
        time_channels: Width of the age encoding.
        dropout: Dropout on node representations while training.
        optimizer: The optimizer (``torch.optim.Adam`` by default).
    """

    def __init__(
        self,
        num_nodes: int,
        in_channels: int,
        hidden_channels: int = 64,
        time_channels: int = 16,
        dropout: float = 0.1,
        optimizer: OptimizerCallable = torch.optim.Adam,
    ) -> None:
        super().__init__()
        check_probabilities(dropout=dropout)
        if min(num_nodes, hidden_channels, time_channels) < 1 or in_channels < 0:
            raise ConfigError(
                "--model.num_nodes, hidden_channels and time_channels must be >= 1 and "
                f"in_channels >= 0 (got {num_nodes}, {hidden_channels}, {time_channels}, "
                f"{in_channels})"
            )
        self.save_hyperparameters(ignore=["optimizer"])
        self.optimizer = optimizer
        h = hidden_channels
        self.embedding = nn.Embedding(num_nodes, h)
        self.age = TimeEncoding(time_channels)
        self.message = nn.Sequential(
            nn.Linear(h + in_channels + time_channels, h), nn.ReLU(), nn.Linear(h, h)
        )
        self.meeting = nn.Sequential(nn.Linear(4, h), nn.ReLU())  # how often, how recently
        self.score = nn.Sequential(nn.Linear(3 * h, h), nn.ReLU(), nn.Linear(h, 1))
        self.dropout = nn.Dropout(dropout)
        self.metrics = nn.ModuleDict(
            {
                f"{stage}_{name}": MeanMetric()
                for stage in ("val", "test")
                for name in ("mrr", *(f"mrr_{b}" for b in BASELINES))
            }
        )
        self.ap = nn.ModuleDict({s: BinaryAveragePrecision() for s in ("val", "test")})

    def forward(self, batch: TemporalBatch) -> Tensor:
        """``[B, C]`` scores: each question's candidates, the true destination first."""
        seeds = batch.num_seeds
        node = self.dropout(self.embedding(batch.node[:seeds]) + self._mean_message(batch))
        b, c = batch.candidates.shape
        source = node[:b].unsqueeze(1).expand(b, c, -1)
        candidate = node[b:].view(b, c, -1)
        met = batch.pair[:, 0] > 0
        ages = torch.log1p(torch.where(met.unsqueeze(1), batch.pair[:, 1:], 0.0))
        meeting = torch.cat([torch.log1p(batch.pair[:, :1]), met.unsqueeze(1).float(), ages], 1)
        meeting = self.meeting(meeting).view(b, c, -1)
        return self.score(torch.cat([source * candidate, candidate, meeting], -1)).squeeze(-1)

    def _mean_message(self, batch: TemporalBatch) -> Tensor:
        """Each seed's mean message, ``message([neighbour, features, age])`` over its in-edges.

        Computed as the same two layers cost less: the first layer's neighbour part projects
        the embedding table once where it has fewer rows than the batch has edges, and the
        second layer, linear, applies to each seed's mean rather than to every edge (a seed
        without in-edges gets 0, as a mean of none).
        """
        first: Any = self.message[0]
        second: Any = self.message[2]
        h = self.embedding.embedding_dim
        w_node, w_rest = first.weight[:, :h], first.weight[:, h:]
        neighbour = batch.node[batch.row]
        if self.embedding.num_embeddings <= neighbour.numel():
            projected = F.linear(self.embedding.weight, w_node).index_select(0, neighbour)
        else:
            projected = F.linear(self.embedding(neighbour), w_node)
        rest = torch.cat([batch.edge_attr, self.age(batch.edge_age)], 1)
        hidden = torch.relu(projected + F.linear(rest, w_rest, first.bias))
        seeds = batch.num_seeds
        total = hidden.new_zeros(seeds, hidden.size(1)).index_add_(0, batch.col, hidden)
        count = torch.bincount(batch.col, minlength=seeds).unsqueeze(1)
        mean = F.linear(total / count.clamp(min=1), second.weight)
        return mean + second.bias * (count > 0)

    def training_step(self, batch: TemporalBatch, batch_idx: int) -> Tensor:
        """Softmax over each question's candidates (the true one first); padding weighs 0."""
        scores = self(batch)
        loss = F.cross_entropy(scores, scores.new_zeros(scores.size(0), dtype=torch.long))
        if batch.padding:
            loss = loss * 0.0
        self.log("train/loss", loss, prog_bar=True, batch_size=scores.size(0), on_epoch=True)
        return loss

    def _evaluate(self, batch: TemporalBatch, stage: str) -> None:
        scores = self(batch)
        b, c = scores.shape
        label = torch.zeros(b, c, dtype=torch.long, device=scores.device)
        label[:, 0] = 1
        ap: Any = self.ap[stage]
        ap.update(scores.reshape(-1), label.reshape(-1))
        logged: dict[str, Any] = {f"{stage}/ap": ap}
        ranked = {"mrr": scores, **{f"mrr_{k}": v for k, v in (batch.baselines or {}).items()}}
        for name, score in ranked.items():
            metric: Any = self.metrics[f"{stage}_{name}"]
            metric.update(mrr(score[:, 0], score[:, 1:]))
            logged[f"{stage}/{name}"] = metric
        self.log_dict(logged, batch_size=b, prog_bar=stage == "val")

    def validation_step(self, batch: TemporalBatch, batch_idx: int) -> None:
        """MRR and AP over the fixed candidates; the baselines' MRR beside them."""
        self._evaluate(batch, "val")

    def test_step(self, batch: TemporalBatch, batch_idx: int) -> None:
        """MRR and AP over the fixed candidates; the baselines' MRR beside them."""
        self._evaluate(batch, "test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """The configured optimizer over every parameter."""
        return self.optimizer(self.parameters())
