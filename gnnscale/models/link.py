"""``LinkPredictor``: GraphSAGE over any node and edge types, scoring pairs by dot product.

Node types with features enter through a linear layer; featureless ones (users, categories)
through a learned embedding table, sparse and optionally in host memory as in
``EmbeddingSAGE``. The encoder is one GraphSAGE stack made heterogeneous by PyG's
``to_hetero`` (one ``SAGEConv`` per edge type and layer, summed per node type). It is built for
the graph ``LinkDataModule.graph_spec`` describes and saves it in its hyperparameters, so
checkpoints reload without the data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, cast

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn
from torch_geometric.data import HeteroData
from torch_geometric.metrics import LinkPredMRR, LinkPredRecall
from torchmetrics import Metric
from torchmetrics.classification import BinaryAUROC

from gnnscale.batch import LinkEval
from gnnscale.errors import ConfigError, TrainingDiverged, check_probabilities
from gnnscale.handshake import GraphSpec
from gnnscale.models.hetero import HeteroGNN
from gnnscale.optim import SparseAdam

__all__ = ["LinkPredictor", "top_destinations"]


class LinkPredictor(HeteroGNN):
    """Link prediction on ``LinkDataModule`` batches: embeddings, dot-product scores, softmax.

    Args:
        graph: Node and edge types, feature widths, node counts, the relation to predict and
            the ranking cut-off (linked from ``LinkDataModule.graph_spec``; in Python, pass
            ``dm.graph_spec``).
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
        embedding_optimizer: Optimizer of the sparse tables.
        target_only_layers: In training, compute each layer only for the rows the next one
            reads (``gnnscale.models.fast_hetero.target_only``; the pairs' scores are the same);
            false: PyG's forward over every sampled node at every layer.
        conv: ``sage``: GraphSAGE layers (a mean of the neighbours beside the node's own row).
            ``gcn``: GCN layers (self-loops, symmetric degree normalisation: the graph
            auto-encoder's encoder, Kipf and Welling 2016), for graphs whose relations each
            join one node type (a citation graph); its layers compute every sampled node
            (``target_only_layers`` is GraphSAGE's).
        project_after_mean: With target-only layers on a CPU, the first layer averages each
            relation's raw features and the input layers project the averages, not every
            sampled row (``gnnscale.models.fast_hetero.target_only``'s ``inputs``; the same
            outputs). On a MAG240M-shaped graph's citations (2M papers, batches of 1,024): a
            training step 1.32x as fast and the trainer 640 MiB against 775; the recipe's
            epoch the same.
        popularity_prior: Add ``w * log(1 + d)`` to every pair's score, ``d`` the
            destination's degree in the known edges (in training, the pair's own edge left
            out) and ``w`` learnt from 1 (scores that start as the degree's odds): how often
            a node is linked to, which mean aggregation and a dot product do not see. Where
            a relation's degrees have a heavy tail (a large citation graph's), the most
            linked nodes are a strong ranking on their own; on Cora it does not help.
        loss: ``softmax``: each positive against every negative destination of the batch (a
            sampled softmax: the positive's score among its own and the ``batch_size *
            num_negatives`` shared negatives' scores, a negative that is the positive's own
            destination left out). Uniform negatives sample every destination alike, so the
            scores estimate a full softmax's without a correction; hard negatives, drawn from
            the neighbourhood, join them uncorrected. ``bce``: binary cross-entropy over every
            labelled pair, each negative on its own. Against ``bce``, over the same batches:
            the citation recipe's (mean of 3 seeds) test AUC 0.915 -> 0.919 and recall@20 0.311 ->
            0.349; the PinSAGE recipe's recall@20 0.181 -> 0.214; on a 500,000-paper
            MAG-shaped citation graph after 100 batches, recall@20 of 1,000 candidates 0.021
            -> 0.237 (the most cited papers: 0.258).
        bucket_rows: With target-only layers, round each layer's rows of every node type up
            to a multiple of this (0: off), with rows no edge reaches and no later layer reads
            (``gnnscale.models.fast_hetero.target_only``): bf16 products on a CPU then reuse a
            few oneDNN primitives instead of building one for every batch's row counts.
            ``auto`` (the default): 1024 where the products run in bf16 on a CPU, else off
            (``gnnscale.models.fast.bucket_size``; the ``speed_defaults`` table).
    """

    def __init__(
        self,
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
        conv: Literal["sage", "gcn"] = "sage",
        project_after_mean: bool = True,
        popularity_prior: bool = False,
        loss: Literal["softmax", "bce"] = "softmax",
        bucket_rows: int | Literal["auto"] = "auto",
    ) -> None:
        super().__init__()
        check_probabilities(dropout=dropout)
        self.target_only_layers = target_only_layers and conv == "sage"
        self.project_after_mean = project_after_mean
        self._set_bucket_rows(bucket_rows)
        if num_layers < 1 or hidden_channels < 1 or accumulate_grad_batches < 1:
            raise ConfigError(
                "--model.num_layers, --model.hidden_channels and --model.accumulate_grad_batches "
                f"must be >= 1 (got {num_layers}, {hidden_channels}, {accumulate_grad_batches})"
            )
        self.save_hyperparameters(ignore=["optimizer", "embedding_optimizer"])
        self.automatic_optimization = False  # up to two optimizers: Lightning steps neither
        self.num_layers = num_layers
        self.optimizer, self.embedding_optimizer = optimizer, embedding_optimizer
        spec = graph if isinstance(graph, GraphSpec) else GraphSpec(**graph)  # a checkpoint's
        if isinstance(spec.target, str) or spec.k < 1:
            raise ConfigError(
                "LinkPredictor predicts an edge type's links, ranked to a cut-off k >= 1: its "
                f"graph is LinkDataModule's graph_spec (got target {spec.target!r}, k {spec.k})"
            )
        across = [e for e in spec.edge_types if e[0] != e[2]]
        if conv == "gcn" and across:
            raise ConfigError(
                f"--model.conv gcn normalises by the degrees of one node type; the relation "
                f"{'__'.join(across[0])} joins two: use --model.conv sage"
            )
        self._build_encoder(spec)
        self.prior_weight = nn.Parameter(torch.ones(())) if popularity_prior else None
        self.target = spec.target
        self.metrics = nn.ModuleDict(
            {
                f"{stage}_{name}": metric
                for stage in ("val", "test")
                for name, metric in (
                    ("recall", LinkPredRecall(spec.k)),
                    ("mrr", LinkPredMRR(spec.k)),
                    ("popularity", LinkPredRecall(spec.k)),
                    ("auc", BinaryAUROC()),
                )
            }
        )

    def forward(self, batch: HeteroData) -> dict[str, Tensor]:
        """Embeddings of every node of the (sub)graph, per node type."""
        return self._encode(batch)

    def _encode_ends(self, batch: HeteroData, pairs: Tensor) -> tuple[dict[str, Tensor], Tensor]:
        """Embeddings the pairs' scores read, and the pairs as their rows.

        With target-only layers, only the rows of the pairs' ends (each type's, sorted); else
        every sampled node's, the pairs as they are.
        """
        if not self.target_only_layers:
            return self._encode(batch), pairs
        src, _, dst = self.target
        ends = {src: pairs[0].unique()}
        ends[dst] = torch.cat([ends[dst], pairs[1]]).unique() if dst in ends else pairs[1].unique()
        rows = torch.stack(
            [torch.searchsorted(ends[src], pairs[0]), torch.searchsorted(ends[dst], pairs[1])]
        )
        return self._encode(batch, ends), rows

    @property
    def _scale(self) -> float:
        """Scores are dot products over the square root of the width."""
        return self.hparams["hidden_channels"] ** -0.5

    def _score(self, h: dict[str, Tensor], pairs: Tensor) -> Tensor:
        src, _, dst = self.target
        return (h[src][pairs[0]] * h[dst][pairs[1]]).sum(-1) * self._scale

    def _prior(self, degrees: Tensor) -> Tensor | float:
        """The popularity prior of destinations of these degrees (0 without one)."""
        if self.prior_weight is None:
            return 0.0
        return self.prior_weight * torch.log1p(degrees.float())

    def training_step(self, batch: HeteroData, batch_idx: int) -> Tensor:
        """``loss`` over the batch's labelled pairs; steps every ``accumulate`` batches."""
        store = batch[self.target]
        h, pairs = self._encode_ends(batch, store.edge_label_index)
        softmax = self.hparams.get("loss", "bce") == "softmax"  # older checkpoints: bce
        loss = (self._sampled_softmax if softmax else self._binary_cross_entropy)(batch, h, pairs)
        loss = loss + self._unused(h, (self.target[0], self.target[2]))  # categories: DDP
        if not torch.isfinite(loss):
            raise TrainingDiverged(
                f"the training loss is {loss.item()} at step {self.global_step}: the run "
                "stopped; lower the learning rate (--model.optimizer)"
            )
        self._backward_and_step(loss, batch_idx)
        self.log(
            "train/loss", loss, prog_bar=True, on_epoch=True, batch_size=store.edge_label.numel()
        )
        return loss

    def _binary_cross_entropy(
        self, batch: HeteroData, h: dict[str, Tensor], pairs: Tensor
    ) -> Tensor:
        """Each labelled pair's binary cross-entropy, weighted by its ``loss_weight``."""
        store = batch[self.target]
        score = self._score(h, pairs).float() + self._prior(store.edge_label_popularity)
        loss = F.binary_cross_entropy_with_logits(score, store.edge_label.float(), reduction="none")
        return (loss * store.loss_weight).sum()

    def _sampled_softmax(self, batch: HeteroData, h: dict[str, Tensor], pairs: Tensor) -> Tensor:
        """Cross-entropy of each positive's score among the batch's negative destinations'.

        Weighted by the positives' ``loss_weight``, normalised to a mean over the batch's
        positives (a DDP padding batch, all weights 0, adds 0).
        """
        store = batch[self.target]
        src, _, dst = self.target
        positive = store.edge_label == 1
        pos, neg = pairs[:, positive], pairs[1, ~positive]
        if not neg.numel():
            raise ConfigError(
                "--model.loss softmax ranks each positive among the batch's negatives: set "
                "--data.num_negatives >= 1"
            )
        popularity = store.edge_label_popularity
        prior = torch.as_tensor(self._prior(popularity)).expand(popularity.shape)
        ids = batch[dst].n_id[store.edge_label_index[1]]  # global: a negative may be the positive
        hit = ids[positive].unsqueeze(1) == ids[~positive].unsqueeze(0)
        negatives = (h[src][pos[0]] @ h[dst][neg].T).float() * self._scale + prior[~positive]
        own = self._score(h, pos).float() + prior[positive]
        logits = torch.cat([own.unsqueeze(1), negatives.masked_fill_(hit, float("-inf"))], dim=1)
        target = torch.zeros(pos.size(1), dtype=torch.long, device=logits.device)
        weight = store.loss_weight[positive]
        loss = F.cross_entropy(logits, target, reduction="none")
        return (loss * weight).sum() / weight.sum().clamp(min=torch.finfo(weight.dtype).tiny)

    @torch.no_grad()
    def embed_all(self, evaluation: LinkEval) -> dict[str, Tensor]:
        """The embeddings of the target's two types, one sampled batch at a time.

        Every node's, by id; or, where the evaluation names the nodes it reads
        (``evaluation.embedded``), theirs, at ``evaluation.rows(type, ids)``.
        """
        out = {}
        for t, loader in evaluation.loaders.items():
            h = torch.empty(evaluation.count(t), self.hparams["hidden_channels"])
            for batch in loader:
                batch = batch.to(self.device)
                size = batch[t].batch_size
                rows = evaluation.rows(t, batch[t].n_id[:size].cpu())
                h[rows] = self(batch)[t][:size].float().cpu()
            out[t] = h
        return out

    def _ranking(self, h: dict[str, Tensor], evaluation: LinkEval) -> Callable[..., Tensor]:
        """``scores(sources, dsts)``: every pair's score, as training scores it (global ids)."""
        src, _, dst = self.target

        def scores(sources: Tensor, dsts: Tensor) -> Tensor:
            dot = h[src][evaluation.rows(src, sources)] @ h[dst][evaluation.rows(dst, dsts)].T
            return dot * self._scale + self._prior(evaluation.popularity[dsts])

        return scores

    def _evaluate(self, evaluation: LinkEval, stage: str) -> None:
        h = self.embed_all(evaluation)
        src, _, dst = self.target
        k, suffix = evaluation.k, evaluation.suffix
        scores = self._ranking(h, evaluation)

        def popular(sources: Tensor, dsts: Tensor) -> Tensor:
            return evaluation.popularity[dsts].expand(sources.numel(), -1).clone()

        top, truth = top_destinations(evaluation, scores)
        num_sources = top.size(0)
        for name, ranked in (
            ("recall", top),
            ("mrr", top),
            ("popularity", top_destinations(evaluation, popular)[0]),
        ):
            metric = cast(Metric, self.metrics[f"{stage}_{name}"])
            metric.update(ranked, truth)
            label = (
                f"{stage}/recall@{k}{suffix}_popularity"
                if name == "popularity"
                else f"{stage}/{name}@{k}{suffix}"
            )
            self.log(label, metric, batch_size=num_sources, prog_bar=name == "recall")
        auc = cast(Metric, self.metrics[f"{stage}_auc"])
        pairs = evaluation.label_index
        pairs = torch.stack([evaluation.rows(src, pairs[0]), evaluation.rows(dst, pairs[1])])
        prior = self._prior(evaluation.popularity[evaluation.label_index[1]])
        auc.update(self._score(h, pairs) + prior, evaluation.label.long())
        self.log(f"{stage}/auc", auc, batch_size=evaluation.label.numel())

    def validation_step(self, batch: LinkEval, batch_idx: int) -> None:
        """Recall@k, MRR@k and AUC on validation edges, and the popularity baseline's recall."""
        self._evaluate(batch, "val")

    def test_step(self, batch: LinkEval, batch_idx: int) -> None:
        """Recall@k, MRR@k and AUC on test edges, and the popularity baseline's recall."""
        self._evaluate(batch, "test")

    def predict_step(self, batch: LinkEval, batch_idx: int) -> dict[str, Tensor]:
        """The top ``eval.k`` destinations of every source, known edges left out.

        ``gnnscale predict`` writes them, a row per source and rank: ``source`` and ``target``
        (ids among the relation's source and destination types), ``rank``, ``score``. A source
        with fewer than ``k`` unknown destinations gets only those.
        """
        h = self.embed_all(batch)
        src, _, dst = self.target
        top, _ = top_destinations(batch, self._ranking(h, batch))
        sources = torch.unique(batch.positives[0])  # rank's rows, in its order
        pair = sources.unsqueeze(1) * batch.popularity.numel() + top  # as batch.known's keys
        # A known edge is ranked (last) only when nothing else is: left out.
        row, rank = (~_in_sorted(pair, batch.known)).nonzero(as_tuple=True)
        target = top[row, rank]
        return {
            "source": sources[row],
            "rank": rank,
            "target": target,
            "score": self._score(h, torch.stack([sources[row], target]))
            + self._prior(batch.popularity[target]),
        }


def top_destinations(
    evaluation: LinkEval, scores: Callable[[Tensor, Tensor], Tensor]
) -> tuple[Tensor, Tensor]:
    """Top-``k`` destinations of every source with positives, scored by ``scores``.

    Known edges are never ranked; with ``candidates``, only they and each source's own
    positives are.

    Args:
        evaluation: The evaluation step: positives, known edges, candidates, ``k``.
        scores: ``scores(sources, dsts) -> (len(sources), len(dsts))``.

    Returns:
        ``(S, k)`` top destinations (global ids), and the positives as ``(row, dst)``: what
        PyG's ``LinkPredMetric.update`` takes.
    """
    sources, row = torch.unique(evaluation.positives[0], return_inverse=True)
    if not sources.numel():  # a DDP rank whose share holds no source (a tiny graph)
        return torch.empty(0, evaluation.k, dtype=torch.long), evaluation.positives
    num_dst = evaluation.popularity.numel()
    # Columns are found in the sorted ``cols`` by search: with candidates, nothing as long as
    # the destinations is made (a map from each to its column was 2 GB for MAG240M's papers).
    candidates = None if evaluation.candidates is None else evaluation.candidates.sort().values
    tops = []
    for chunk in torch.split(torch.arange(sources.numel()), evaluation.batch_size):
        mine = (row >= chunk[0]) & (row <= chunk[-1])
        r, d = row[mine] - chunk[0], evaluation.positives[1, mine]
        if candidates is None:
            cols = torch.arange(num_dst)
        else:  # the sample, and this chunk's own positives
            cols = torch.unique(torch.cat([candidates, d]))
        s = scores(sources[chunk], cols).float()
        if candidates is not None:  # another source's positive is not a candidate
            at = torch.searchsorted(cols, d)
            own = s[r, at]
            s[:, ~_in_sorted(cols, candidates)] = float("-inf")
            s[r, at] = own
        known_r, known_d = _known(evaluation, sources[chunk], num_dst)
        ranked, at = _find(known_d, cols)
        s[known_r[ranked], at[ranked]] = float("-inf")
        tops.append(cols[s.topk(min(evaluation.k, cols.numel()), dim=1).indices])
    return torch.cat(tops), torch.stack([row, evaluation.positives[1]])


def _in_sorted(values: Tensor, keys: Tensor) -> Tensor:
    """Whether each of ``values`` is among the sorted ``keys``."""
    return _find(values, keys)[0]


def _find(values: Tensor, keys: Tensor) -> tuple[Tensor, Tensor]:
    """Whether each of ``values`` is among the sorted ``keys``, and where it is if so.

    A search: ``torch.isin`` would sort a copy of the keys, as many as the known edges.
    """
    if not keys.numel():
        return torch.zeros_like(values, dtype=torch.bool), torch.zeros_like(values)
    at = torch.searchsorted(keys, values).clamp_(max=keys.numel() - 1)
    return keys[at] == values, at


def _known(evaluation: LinkEval, sources: Tensor, num_dst: int) -> tuple[Tensor, Tensor]:
    """Known edges of ``sources``: ``(row in sources, dst)``."""
    lo = torch.searchsorted(evaluation.known, sources * num_dst)
    hi = torch.searchsorted(evaluation.known, (sources + 1) * num_dst)
    counts = hi - lo
    row = torch.arange(sources.numel()).repeat_interleave(counts)
    offset = torch.arange(int(counts.sum())) - (counts.cumsum(0) - counts).repeat_interleave(counts)
    return row, evaluation.known[lo.repeat_interleave(counts) + offset] % num_dst
