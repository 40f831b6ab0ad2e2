"""``gnnscale plan``: a run's peak memory, predicted from a few sampled batches before the run.

    gnnscale plan --config recipes/neighbor_sage/config.yaml
    gnnscale plan --config recipes/neighbor_sage/config.yaml --budget_gb 1.5

The planner loads the graph and builds the loaders exactly as ``fit`` would, trains on a few
batches through a real Trainer (same precision and accumulation) while a thread samples the
process's resident memory, and counts what each batch holds: nodes and edges per hop, feature
bytes and the bytes autograd saves for backward. It then scales the measured step to the
largest batch an epoch is expected to draw and adds evaluation: for layer-wise inference, its
whole-graph buffers (``N x hidden`` per layer) computed from the model's widths plus its largest
one-hop batch measured; for sampled or full-graph evaluation, a few validation batches run
through a Trainer with their own batch size and fan-out. If the run keeps checkpoints, saving
one and loading it back (as the test after ``fit`` does) is measured with the run's
``CheckpointIO``: for a large embedding table this, not a batch, can set the peak. Evaluation
and checkpoints come on top of what training left resident (optimizer state, the allocator's
cache). The prediction is the peak resident memory of one training process (the figure that
``ThroughputMonitor`` logs as ``perf/peak_rss_mb``); DataLoader workers are separate processes,
and in a data-parallel run each rank draws its share of the batches.

The same measurements serve every DataModule that answers ``memory_profile()``
(``gnnscale.memory``; gnnscale's node, heterogeneous, link and many-graph DataModules do): it
says which graph tensors it holds and which files it maps, how it evaluates (its layer-wise
inference batch, whose buffers are computed; otherwise a few evaluation batches are measured,
a link evaluation as one whole step) and which settings shrink its batches. The planner never
asks which DataModule it holds.
"""

from __future__ import annotations

import math
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import lightning as L
import torch

from gnnscale.batch import HopLayout, LayerwiseBatch, LinkEval
from gnnscale.handshake import EvaluatesLayerwise
from gnnscale.measure import PeakRSS, SavedTensors, rss_mb
from gnnscale.memory import MemoryProfile, MiB, Plannable, tensor_mb
from gnnscale.models import fast
from gnnscale.models.inference import seeds_layer

__all__ = ["BatchStats", "MemoryPlan", "format_plan", "plan"]


@dataclass
class BatchStats:
    """What one sampled training batch holds.

    Args:
        nodes: Nodes in the batch (seeds and sampled neighbours, or the subgraph's nodes), of
            every node type, or of every graph of a batch of graphs.
        edges: Edges in the batch, counted the same way.
        hop_nodes: Seeds, then the new nodes of each hop (homogeneous neighbour sampling only).
        feature_mb: Bytes of the feature rows the training step receives (``x`` of every node
            type, and ``x_aggr``, the first layer's aggregate, where the loader computed it).
        saved_mb: Bytes autograd saved for backward (activations), parameters excluded.
    """

    nodes: int
    edges: int
    hop_nodes: list[int]
    feature_mb: float
    saved_mb: float


@dataclass
class MemoryPlan:
    """The expected peak resident memory of a run and what it is made of (MiB).

    Args:
        base_mb: Process, graph and sampler structures, measured once the loaders exist.
        graph_mb: Bytes of the graph's tensors (part of ``base_mb``).
        model_mb: Parameters, gradients and optimizer state.
        train_mb: Largest training step of an epoch, above ``base_mb``.
        resident_mb: Resident once training has run a few steps: ``base_mb`` plus optimizer
            state (allocated at the first step) and what the allocator keeps.
        eval_mb: Evaluation, above ``resident_mb``.
        checkpoint_mb: Saving a checkpoint and loading it back, above ``resident_mb`` (0 if the
            run keeps no checkpoints).
        growth_mb: Memory retained batch after batch, extrapolated over the run's epochs up to
            one step's transient memory, where it levels off.
        mapped_mb: Files of a prepared graph (``dataset: prepared``) or an LMDB graph store
            (``GraphDataModule``, ``storage: disk``): page cache, shared by every process that
            maps them and dropped under pressure, but counted in the resident set once
            touched, and an epoch touches nearly all of them. Part of ``peak_mb``.
        peak_mb: ``growth_mb + mapped_mb + max(base_mb + train_mb, resident_mb + max(eval_mb,
            checkpoint_mb))``.
        private_mb: ``peak_mb`` without ``mapped_mb``: the process's own memory, which the
            kernel cannot drop; a budget is checked against it.
        batches: The sampled training batches.
        batches_per_epoch: Training batches in one epoch.
        eval_mode: How evaluation runs (``layerwise``, ``sampled`` or ``full`` for node
            batches, ``ranking`` for link batches, ``batches`` for many graphs).
        suggestions: Settings that fit the budget, if one was given and the run does not fit.
        cuda_peak_mb: Expected peak of CUDA memory allocated by tensors, on a GPU run.
    """

    base_mb: float
    graph_mb: float
    model_mb: float
    train_mb: float
    resident_mb: float
    eval_mb: float
    checkpoint_mb: float
    peak_mb: float
    growth_mb: float
    mapped_mb: float
    batches: list[BatchStats]
    batches_per_epoch: int
    eval_mode: str
    suggestions: list[str] = field(default_factory=list)
    cuda_peak_mb: float | None = None

    @property
    def private_mb(self) -> float:
        """The expected peak without the mapped files' pages."""
        return self.peak_mb - self.mapped_mb


def _batch_nodes(batch: Any) -> int:
    """Nodes of a batch; a link evaluation step embeds every node of its graph, or those named."""
    if isinstance(batch, LinkEval):
        return sum(batch.count(t) for t in batch.num_nodes)
    return int(batch.num_nodes)


class _Probe(L.Callback):
    """Records each training batch and samples resident memory over the training steps."""

    def __init__(self) -> None:
        self.batches: list[BatchStats] = []
        self.after_mb: list[float] = []  # resident memory after each batch
        self.base_mb = 0.0
        self.model_mb = 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.base_mb = rss_mb()
        self.cuda_mb: tuple[float, float] | None = None
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)
            self.cuda_mb = (torch.cuda.memory_allocated(pl_module.device) / MiB, 0.0)
        self._peak = PeakRSS().__enter__()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int
    ) -> None:
        self._saved = SavedTensors(exclude=pl_module.parameters()).__enter__()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        self._saved.__exit__()
        layout = batch.get("layout")
        features = [s.x for s in batch.node_stores if "x" in s]
        hops: list[int] = []
        if isinstance(layout, HopLayout):  # homogeneous neighbour batches
            # As sampled: a batch whose first layer the loader aggregated reaches the step cut.
            hops = list(layout.num_sampled_nodes)
            features += [] if layout.x_aggr is None else [layout.x_aggr]
        self.batches.append(
            BatchStats(
                sum(hops) if hops else batch.num_nodes,
                sum(layout.num_sampled_edges) if hops else batch.num_edges,
                hops,
                tensor_mb(*features),
                self._saved.nbytes / MiB,
            )
        )
        self.after_mb.append(rss_mb())

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._peak.__exit__()
        self.peak_mb = self._peak.peak_mb
        if self.cuda_mb is not None:
            peak = torch.cuda.max_memory_allocated(pl_module.device) / MiB
            self.cuda_mb = (self.cuda_mb[0], peak)
        state = [t for o in trainer.optimizers for s in o.state.values() for t in s.values()]
        params = list(pl_module.parameters())
        grads = [p.grad for p in params if p.grad is not None and not p.grad.is_sparse]
        self.model_mb = tensor_mb(*params, *grads, *[t for t in state if torch.is_tensor(t)])


def _quiet_trainer(trainer_kwargs: dict[str, Any], probe: L.Callback, **limits: Any) -> L.Trainer:
    """One process with the run's precision and accumulation: no logs, checkpoints or bars."""
    return L.Trainer(
        **trainer_kwargs,
        **limits,
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[probe],
    )


class _EvalProbe(L.Callback):
    """Samples resident memory over validation and test batches and records their sizes."""

    def __init__(self) -> None:
        self.nodes: list[int] = []
        self.used_mb = 0.0  # the larger rise above the start, validation or test

    def _start(self, *args: Any) -> None:
        self.before_mb = rss_mb()
        self._peak = PeakRSS().__enter__()

    def _batch(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *args: Any
    ) -> None:
        self.nodes.append(_batch_nodes(batch))

    def _end(self, *args: Any) -> None:
        self._peak.__exit__()
        self.used_mb = max(self.used_mb, self._peak.peak_mb - self.before_mb)

    # the same three hooks for validation and test (aliases would not match Callback's signatures)
    on_validation_start = on_test_start = _start  # type: ignore[assignment]
    on_validation_batch_end = on_test_batch_end = _batch  # type: ignore[assignment]
    on_validation_end = on_test_end = _end  # type: ignore[assignment]


def _validate_mb(
    dm: L.LightningDataModule,
    model: L.LightningModule,
    trainer_kwargs: dict[str, Any],
    num_batches: int,
    world_size: int,
) -> float:
    """Evaluation, measured: a few validation and test batches.

    Evaluation batches have their own size and fan-out (``--data.eval.*``; full neighbourhoods
    by default for samplers other than neighbour sampling), so they are measured rather than
    scaled from training batches, then scaled to the largest of the run's validation and test
    batches. A link DataModule's evaluation is one step per split (embed every node, rank every
    destination): measured whole.
    """
    probe = _EvalProbe()
    trainer = _quiet_trainer(
        trainer_kwargs, probe, limit_val_batches=num_batches, limit_test_batches=num_batches
    )
    # Both splits: their batches differ in size (a validation split smaller than one batch),
    # and layers that compute only the rows read grow with the seeds, not the batch's nodes.
    trainer.validate(model, datamodule=dm, verbose=False)
    trainer.test(model, datamodule=dm, verbose=False)
    loaders = (dm.val_dataloader(), dm.test_dataloader())
    draws = sum(math.ceil(len(loader) / world_size) for loader in loaders)
    scale = _expected_max(probe.nodes, draws) / max(probe.nodes)
    return probe.used_mb * scale


def _expected_max(values: list[int], draws: int) -> float:
    """Largest of ``draws`` batches, from the mean and spread of a few (a normal tail)."""
    if len(values) < 2 or draws <= len(values):
        return float(max(values))
    tail = statistics.mean(values) + statistics.stdev(values) * math.sqrt(2 * math.log(draws))
    return max(tail, float(max(values)))


def _checkpoint_mb(trainer: L.Trainer, model: L.LightningModule) -> float:
    """Saving a checkpoint, then loading it into the model as a test of the best one does."""
    with tempfile.TemporaryDirectory() as folder, PeakRSS() as peak:
        before = rss_mb()
        path = Path(folder) / "plan.ckpt"
        trainer.save_checkpoint(path)
        checkpoint = trainer.strategy.load_checkpoint(path)
        model.load_state_dict(checkpoint["state_dict"])
        del checkpoint
    return max(peak.peak_mb - before, 0.0)  # sampled peaks can read a hair under the start


def _layerwise_mb(batch: LayerwiseBatch, model: EvaluatesLayerwise, precision: str) -> float:
    """Whole-graph buffers of layer-wise inference, plus its largest one-hop batch.

    Per layer, ``gnnscale.models.inference.layerwise_inference`` keeps the layer's input for all
    nodes and writes the seeds' outputs into one ``N x out`` tensor, in the dtype the layer
    computes in (half under ``bf16-mixed`` and ``16-mixed``): exact sizes, computed. A one-hop
    batch's own cost (its gathered rows, one message per edge, the layer's temporaries) is
    measured by running each layer on the largest of a few batches, in the run's precision.
    """
    start = rss_mb()
    biggest = max(
        (b for _, b in zip(range(8), batch.loader, strict=False)), key=lambda b: b.num_edges
    )
    loader_mb = rss_mb() - start  # the loader's own sampler structures (a CSC copy)
    gnn = model.gnn
    widths = [gnn.in_channels] + [gnn.hidden_channels] * (gnn.num_layers - 1) + [gnn.out_channels]
    gnn.eval()
    # In the run's precision: under bf16-mixed the layers compute (and pass on) bf16.
    half = str(precision).startswith("bf16")
    dtype = torch.bfloat16 if half else torch.float32
    rows = batch.x.index_select(0, biggest.n_id)  # the first layer's input rows, as read
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=half), PeakRSS() as peak:
        before = rss_mb()
        for i, d_in in enumerate(widths[:-1]):
            x = rows.float() if i == 0 else torch.randn(biggest.num_nodes, d_in, dtype=dtype)
            edges = biggest.edge_index
            if model.sparse_aggregation:  # as layerwise_inference
                edges = fast.seeds_adjacency(x, edges, biggest.batch_size)
            seeds_layer(gnn, i, x, edges, biggest.batch_size)
            del x
    batch_mb = tensor_mb(rows, *[v for _, v in biggest if torch.is_tensor(v)])
    step_mb = peak.peak_mb - before + batch_mb
    value = {"64": 8, "32": 4}.get(str(precision).split("-")[0], 2) / MiB  # bytes, in MiB
    num = batch.y.numel()
    layers = [
        (num * d_in * value if i else 0) + num * d_out * value + step_mb
        for i, (d_in, d_out) in enumerate(zip(widths, widths[1:], strict=False))
    ]
    return loader_mb + max(layers)


def plan(
    dm: Plannable,
    model: L.LightningModule,
    trainer_kwargs: dict[str, Any],
    num_batches: int = 6,
    budget_gb: float | None = None,
    run_epochs: int = 1,
    world_size: int = 1,
    limit_train_batches: int | float | None = None,
    checkpoint: bool = False,
) -> MemoryPlan:
    """Train on ``num_batches`` batches and predict the run's peak resident memory.

    Args:
        dm: The run's DataModule.
        model: The run's model.
        trainer_kwargs: ``accelerator``, ``precision`` and ``accumulate_grad_batches`` of the run.
        num_batches: Training batches to sample and train on.
        budget_gb: Memory budget; if the run exceeds it, suggest settings that fit.
        run_epochs: Epochs of the planned run, over which memory retained per batch adds up.
        world_size: Processes of a data-parallel run; each draws its share of the batches, and
            the plan is that of one of them.
        limit_train_batches: The run's ``Trainer(limit_train_batches=...)``: a count, or a
            fraction of each epoch.
        checkpoint: Whether the run saves checkpoints (and tests the best one after ``fit``).
            ``trainer_kwargs["plugins"]`` may carry its ``CheckpointIO``.
    """
    probe = _Probe()
    trainer = _quiet_trainer(
        trainer_kwargs,
        probe,
        max_epochs=1,
        limit_train_batches=num_batches,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    datamodule = cast(L.LightningDataModule, dm)
    trainer.fit(model, datamodule=datamodule)
    profile = dm.memory_profile()
    per_epoch = math.ceil(len(datamodule.train_dataloader()) / world_size)
    # As the Trainer reads it: an int (or a float above 1, as the CLI may parse "3") is a count
    # of batches, a float up to 1 a fraction of the epoch.
    limit = limit_train_batches
    if isinstance(limit, int) or (limit is not None and limit > 1):
        per_epoch = min(per_epoch, int(limit))
    elif limit is not None:
        per_epoch = max(1, int(per_epoch * limit))
    nodes = [b.nodes for b in probe.batches]
    scale = _expected_max(nodes, per_epoch) / max(nodes)
    train_mb = (probe.peak_mb - probe.base_mb) * scale
    # What each batch leaves behind: freed blocks the allocator keeps and library caches. It
    # levels off once the kept blocks can serve a whole step, so it is extrapolated over the run
    # but no further than one step's transient memory. Measured on sparse_embeddings: +2 MiB
    # per batch for 150 batches, then flat for two more epochs, +230 MiB in all against a 219
    # MiB step. The rate comes from the probe's second half: its first steps also grow the heap
    # while glibc's dynamic mmap threshold rises, which a longer run does not repeat (a small
    # many-graph run in fp32: 356-363 MiB extrapolated over its 10 batches from steps 2-6, a
    # plan 1.14-1.27x the peak; 0.97-1.02x from steps 3-6). The rate is the least growth of
    # any of those steps: memory retained batch after batch shows in every one, while a single
    # step that extends the heap once would be extrapolated over the whole run (the same
    # many-graph run in bf16: 0-183 MiB from the mean step in four reports, plans up to 1.31x
    # the peak; 0 MiB and 0.95-1.01x from the least). A leak would grow on: the plan does not
    # predict one.
    after = probe.after_mb
    resident_mb = after[-1]
    half = len(after) // 2
    steps = [b - a for a, b in zip(after[half:-1], after[half + 1 :], strict=True)]
    per_batch = max(0.0, min(steps)) if half > 1 and steps else 0.0
    step_mb = max(0.0, probe.peak_mb - resident_mb) * scale
    growth_mb = min(per_batch * run_epochs * per_epoch, step_mb)
    checkpoint_mb = _checkpoint_mb(trainer, model) if checkpoint else 0.0
    if profile.layerwise is not None and isinstance(model, EvaluatesLayerwise):
        # As the model reads it (EmbeddingSAGE's first input is its table).
        batch = model.layerwise_input(profile.layerwise)
        eval_mb = _layerwise_mb(batch, model, trainer_kwargs["precision"])
    else:
        eval_mb = _validate_mb(datamodule, model, trainer_kwargs, num_batches, world_size)
    mapped_mb = profile.mapped_mb
    result = MemoryPlan(
        base_mb=probe.base_mb,
        graph_mb=profile.graph_mb,
        model_mb=probe.model_mb,
        train_mb=train_mb,
        resident_mb=resident_mb,
        eval_mb=eval_mb,
        checkpoint_mb=checkpoint_mb,
        peak_mb=growth_mb
        + mapped_mb
        + max(probe.base_mb + train_mb, resident_mb + max(eval_mb, checkpoint_mb)),
        growth_mb=growth_mb,
        mapped_mb=mapped_mb,
        batches=probe.batches,
        batches_per_epoch=per_epoch,
        eval_mode=profile.eval_mode,
    )
    if probe.cuda_mb is not None:  # layer-wise inference keeps its whole-graph buffers on the host
        before, peak = probe.cuda_mb
        result.cuda_peak_mb = before + (peak - before) * scale
    if budget_gb is not None and result.private_mb > budget_gb * 1024:
        result.suggestions = _suggest(profile, result, budget_gb * 1024)
    return result


def _suggest(profile: MemoryProfile, result: MemoryPlan, budget_mb: float) -> list[str]:
    """Settings whose batches (and evaluation) fit the budget, from the measured step."""
    room = budget_mb - result.base_mb - result.growth_mb
    after_training = budget_mb - result.resident_mb - result.growth_mb
    if room <= 0:
        return [f"the data and process alone take {result.base_mb:,.0f} MiB: {profile.data_fix}"]
    tips = []
    if result.train_mb > room:  # the training step first: what training leaves grows with it
        # MiB per node of an average batch, with the epoch's tail batch folded in.
        mean_nodes = statistics.mean(b.nodes for b in result.batches)
        tip = profile.smaller_batches(room / (result.train_mb / mean_nodes), mean_nodes)
        tips += [tip] if tip else []
    if after_training <= 0:  # the steps' own leftovers exceed it: evaluation is not the cause
        return tips
    if result.eval_mb > after_training and profile.eval_fix is not None:
        tips.append(
            f"evaluation ({result.eval_mode}) needs {result.eval_mb:,.0f} MiB: {profile.eval_fix}"
        )
    if result.checkpoint_mb > after_training:
        tips.append(
            f"saving and loading a checkpoint needs {result.checkpoint_mb:,.0f} MiB: keep "
            "gnnscale's StreamingCheckpointIO (no CheckpointIO in --trainer.plugins) or "
            "--trainer.enable_checkpointing=false"
        )
    return tips


def format_plan(result: MemoryPlan) -> str:
    """The plan as a short text report."""
    hops = [b.hop_nodes for b in result.batches if b.hop_nodes]
    lines = [
        "gnnscale memory plan (resident memory of the training process)",
        f"  graph tensors        {result.graph_mb:10,.0f} MiB",
        f"  base after setup     {result.base_mb:10,.0f} MiB  (process + graph + samplers)",
        f"  model + optimizer    {result.model_mb:10,.0f} MiB",
        f"  training step        {result.train_mb:10,.0f} MiB  (largest of "
        f"{result.batches_per_epoch} batches per epoch)",
        f"  resident after steps {result.resident_mb:10,.0f} MiB  (base + optimizer state + "
        "allocator cache)",
        f"  evaluation           {result.eval_mb:10,.0f} MiB  ({result.eval_mode}, above resident)",
        f"  checkpoint save+load {result.checkpoint_mb:10,.0f} MiB  (above resident)",
        f"  retained over run    {result.growth_mb:10,.0f} MiB  (growth per batch x batches, "
        "at most one step)",
        f"  mapped graph files   {result.mapped_mb:10,.0f} MiB  (page cache the files want, shared "
        "by processes)",
        f"  expected peak        {result.peak_mb:10,.0f} MiB  (resident, mapped pages included)",
    ]
    if result.mapped_mb:  # the kernel may drop mapped pages: a store larger than memory trains
        lines.append(
            f"  private peak         {result.private_mb:10,.0f} MiB  (the process's own; the "
            "budget applies to it)"
        )
    if result.cuda_peak_mb is not None:
        lines.append(f"  expected CUDA peak   {result.cuda_peak_mb:10,.0f} MiB  (allocated)")
    lines.append("  sampled batches (nodes / edges / features MiB / saved activations MiB):")
    for b in result.batches:
        lines.append(f"    {b.nodes:9,} {b.edges:11,} {b.feature_mb:9.1f} {b.saved_mb:9.1f}")
    if hops:
        mean = [statistics.mean(h[i] for h in hops if len(h) > i) for i in range(len(hops[0]))]
        lines.append("  nodes per hop (mean): " + " / ".join(f"{m:,.0f}" for m in mean))
    for tip in result.suggestions:
        lines.append(f"  to fit the budget: {tip}")
    return "\n".join(lines)
