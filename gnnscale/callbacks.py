"""Callbacks the recipes share."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities import grad_norm, rank_zero_info
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer
from torch.utils.hooks import RemovableHandle
from torch_geometric.nn import MessagePassing

from gnnscale._compat import batches_that_stepped
from gnnscale.batch import feature_reads, loss_count
from gnnscale.errors import NO_ROOM, GnnscaleError
from gnnscale.measure import peak_rss_mb

__all__ = ["GradActivationMonitor", "PredictionWriter", "ThroughputMonitor"]


class ThroughputMonitor(L.Callback):
    """Seconds per training epoch, training nodes per second and peak memory, after warm-up.

    Unlike Lightning's per-step ``ThroughputMonitor``, this counts graph work: the loss nodes of
    each batch (``num_loss_nodes``: seed nodes for neighbour sampling, labelled pairs for link
    prediction, graphs for graph-level batches) and whole epochs, whose median is robust to a
    noisy machine. An epoch's time runs from its start to the end of its last training batch, so
    it includes sampling and data loading but not validation, which is timed on its own (from
    its start to its end, the sanity check left out). Logs ``perf/epoch_s``, ``perf/val_s``,
    ``perf/nodes_per_s``, ``perf/peak_rss_mb``, with a feature cache ``perf/cache_hit_rate``
    (the share of a batch's feature rows it held), on a GPU ``perf/peak_cuda_mb``, and for an
    epoch cut short (``limit_train_batches``) ``perf/epoch_fraction``, the share of the loader's
    batches it ran; prints one summary block at the end of ``fit``.

    Args:
        warmup_epochs: Epochs left out of the median (allocator and worker start-up).
    """

    def __init__(self, warmup_epochs: int = 1) -> None:
        self.warmup_epochs = warmup_epochs
        self.epoch_s: list[float] = []
        self.nodes_per_s: list[float] = []
        self.val_s: list[float] = []
        self._nodes, self._start, self._end, self._val_start = 0, 0.0, 0.0, 0.0
        self._batches = 0
        self._cached = [0, 0]  # feature rows a cache held, rows read, in this epoch
        self._whole = False  # a run resumed mid-epoch starts with part of one: not timed

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the epoch clock."""
        self._nodes, self._batches, self._whole, self._cached = 0, 0, True, [0, 0]
        self._start = self._end = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        """Count the batch's loss nodes and note when the last batch ended."""
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        self._nodes += loss_count(batch)
        self._batches += 1
        if (reads := feature_reads(batch)) is not None:  # a feature cache's hits
            self._cached[0] += reads.cached
            self._cached[1] += reads.total
        self._end = time.perf_counter()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Log the epoch's time, throughput and peak memory."""
        if not self._whole:
            return
        seconds = self._end - self._start
        metrics = {"perf/epoch_s": seconds, "perf/nodes_per_s": self._nodes / seconds}
        metrics["perf/peak_rss_mb"] = peak_rss_mb()
        if self._cached[1]:
            metrics["perf/cache_hit_rate"] = self._cached[0] / self._cached[1]
        whole = _loader_batches(trainer)
        if whole and self._batches < whole:
            metrics["perf/epoch_fraction"] = self._batches / whole
        if pl_module.device.type == "cuda":
            metrics["perf/peak_cuda_mb"] = torch.cuda.max_memory_allocated(pl_module.device) / 2**20
        pl_module.log_dict(metrics)
        if trainer.current_epoch >= self.warmup_epochs:
            self.epoch_s.append(seconds)
            self.nodes_per_s.append(metrics["perf/nodes_per_s"])
        self._peak = metrics

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the validation clock."""
        self._val_start = time.perf_counter()

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Log how long validation took (not the sanity check's)."""
        if trainer.sanity_checking or trainer.state.fn != "fit":  # not `gnnscale validate`
            return
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        seconds = time.perf_counter() - self._val_start
        pl_module.log("perf/val_s", seconds)
        self.val_s.append(seconds)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Print the summary block."""
        if not self.epoch_s:
            return
        lines = [
            f"median s/epoch     {statistics.median(self.epoch_s):.3f}"
            f"  (over {len(self.epoch_s)} epochs after {self.warmup_epochs} warm-up)",
            f"median nodes/s     {statistics.median(self.nodes_per_s):,.0f}",
            *([f"median val s       {statistics.median(self.val_s):.3f}"] if self.val_s else []),
            f"peak RSS           {self._peak['perf/peak_rss_mb']:,.0f} MiB",
        ]
        if "perf/peak_cuda_mb" in self._peak:
            lines.append(f"peak CUDA alloc    {self._peak['perf/peak_cuda_mb']:,.0f} MiB")
        rank_zero_info("\n".join(["gnnscale throughput", *lines]))


def _loader_batches(trainer: L.Trainer) -> int | None:
    """Batches in a whole epoch of the training loader (limits not applied), if it has a length."""
    try:
        return len(trainer.train_dataloader)  # type: ignore[arg-type]
    except TypeError:
        return None


class GradActivationMonitor(L.Callback):
    """Gradient norms and message-passing activation statistics, every few optimizer steps.

    Gradient norms are read in ``on_before_optimizer_step``, after gradient accumulation and
    after Lightning has unscaled fp16 gradients, so they are the gradients the optimizer applies.
    Activations are the outputs of every ``MessagePassing`` layer, seen by forward hooks during
    training batches only (the last micro-batch of a logged step). Logs
    ``monitor/grad_norm_total``, ``monitor/grad_norm/<layer>`` (one per conv layer, plus
    ``other`` for the remaining parameters), and per conv layer ``monitor/act_mean/<layer>``,
    ``monitor/act_std/<layer>``, ``monitor/act_zero/<layer>`` (the fraction of outputs <= 0, which
    a ReLU right after the layer sets to zero) and ``monitor/act_dead/<layer>`` (the fraction of
    channels <= 0 for every node of the batch: dead ReLUs, which pass no gradient). With a norm
    layer between conv and ReLU, the last two describe the conv, not what the ReLU sees.

    Rows sit at the x-axis of the model's own training rows (Lightning's count of batches that
    stepped). A step of a model with two optimizers (they step together) counts once and is
    logged once, before its first optimizer steps, with every parameter's gradient.

    Args:
        log_every_n_steps: Log every this many optimizer steps (step 0 included). Independent
            of ``trainer.log_every_n_steps``.
    """

    def __init__(self, log_every_n_steps: int = 10) -> None:
        if log_every_n_steps < 1:
            raise ValueError(f"log_every_n_steps must be >= 1 (got {log_every_n_steps})")
        self.log_every_n_steps = log_every_n_steps
        self._convs: list[str] = []
        self._handles: list[RemovableHandle] = []
        self._acts: dict[str, Tensor] = {}
        self._armed = False

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Attach a forward hook to every message-passing layer."""
        convs = [(n, m) for n, m in pl_module.named_modules() if isinstance(m, MessagePassing)]
        self._convs = [name for name, _ in convs]
        self._handles = [m.register_forward_hook(self._hook(name)) for name, m in convs]

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Remove the hooks, so that later predict or test calls run untouched."""
        for handle in self._handles:
            handle.remove()
        self._handles, self._acts = [], {}

    def _hook(self, name: str) -> Callable[[Module, Any, Any], None]:
        def hook(module: Module, inputs: Any, output: Any) -> None:
            if not (self._armed and module.training):
                return
            out = (output[0] if isinstance(output, tuple) else output).detach().float()
            off = out <= 0
            stats = [out.mean(), out.std(), off.float().mean(), off.all(0).float().mean()]
            self._acts[name] = torch.stack(stats)

        return hook

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int
    ) -> None:
        """Measure activations only in batches whose optimizer step is logged."""
        self._armed = _optimizer_steps(trainer) % self.log_every_n_steps == 0

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        """Stop measuring before validation runs."""
        self._armed = False

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Optimizer
    ) -> None:
        """Log the gradient norms and the activation statistics of this step."""
        if optimizer is not trainer.optimizers[0] or not trainer.loggers:
            return  # the step's later optimizers: logged with its first
        if _optimizer_steps(trainer) % self.log_every_n_steps:
            return
        # Lightning annotates the values as float; they are 0-d tensors.
        norms: dict[str, Tensor] = dict(grad_norm(pl_module, norm_type=2))  # type: ignore[arg-type]
        if not norms:
            return
        metrics = {"monitor/grad_norm_total": norms.pop("grad_2.0_norm_total")}
        layers: dict[str, list[Tensor]] = {}
        for key, norm in norms.items():
            param = key.split("/", 1)[1]
            layer = next((c for c in self._convs if param.startswith(f"{c}.")), "other")
            layers.setdefault(layer, []).append(norm)
        for layer, parts in layers.items():
            metrics[f"monitor/grad_norm/{layer}"] = torch.stack(parts).norm()
        for name, stats in self._acts.items():
            for stat, value in zip(("mean", "std", "zero", "dead"), stats, strict=True):
                metrics[f"monitor/act_{stat}/{name}"] = value
        self._acts = {}
        values = torch.stack([v.to(pl_module.device) for v in metrics.values()]).tolist()
        step = batches_that_stepped(trainer)  # the x-axis of self.log's rows
        for logger in trainer.loggers:
            logger.log_metrics(dict(zip(metrics, values, strict=True)), step=step)


def _optimizer_steps(trainer: L.Trainer) -> int:
    """Optimizer steps taken so far, a step of several optimizers counted once.

    ``global_step`` counts every optimizer's step: under the manual optimization of the
    two-optimizer models, both step together and each adds one.
    """
    return trainer.global_step // max(len(trainer.optimizers), 1)


class PredictionWriter(BasePredictionWriter):
    """Writes what ``predict_step`` returns to Parquet as it comes: ``part-<rank>.parquet``.

    ``gnnscale predict`` adds it (unless the config names another prediction writer), writing
    into the run's folder, ``runs/<name>/version_<n>/predictions``: one file per process, which
    Parquet readers take as one table (``pyarrow.parquet.read_table(folder)``). ``predict_step``
    returns a dict of 1-d tensors of equal length, ids first (node models: ``node``, ``class``;
    graph-level models: ``graph``, ``class`` or ``value``; link prediction: ``source``,
    ``rank``, ``target``, ``score``).
    A file appears under its name once complete: written beside it, flushed and renamed.

    Args:
        folder: Where the files go (default: the logger's folder, else the Trainer's root
            folder, and ``predictions`` in it).
    """

    def __init__(self, folder: str | Path | None = None) -> None:
        super().__init__(write_interval="batch")
        self.folder = Path(folder) if folder is not None else None
        self._writer: Any = None  # a pyarrow.parquet.ParquetWriter once the first batch comes
        # None until a prediction starts: a failure before it has no file to discard (unlinking
        # Path() raised IsADirectoryError and hid the failure itself).
        self._partial: Path | None = None
        self._target = Path()

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Choose the folder in rank 0 (the logger's version) and tell the other ranks."""
        folder = self.folder
        if folder is None and trainer.global_rank == 0:
            logger = trainer.logger
            root = logger.log_dir if logger is not None and logger.log_dir else None
            folder = Path(root or trainer.default_root_dir) / "predictions"
        folder = Path(trainer.strategy.broadcast(str(folder)))
        self._target = folder / f"part-{trainer.global_rank}.parquet"
        self._partial = folder / f".{self._target.name}.partial"
        self._writer = None
        with self._writing():
            folder.mkdir(parents=True, exist_ok=True)

    def write_on_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        prediction: Any,
        batch_indices: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        """Append the batch's rows."""
        import pyarrow as pa  # here: a tenth of a second that no other command pays
        import pyarrow.parquet as pq

        table = pa.table({k: v.detach().cpu().numpy() for k, v in prediction.items()})
        with self._writing():
            if self._writer is None:
                self._writer = pq.ParquetWriter(self._partial, table.schema)
            self._writer.write_table(table)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """A write the folder refuses (no room, no permission) is one line; nothing is left."""
        try:
            yield
        except OSError as err:
            self._discard()
            room = err.errno in NO_ROOM
            why = "free space there" if room else "make it writable"
            raise GnnscaleError(
                f"writing predictions into {self._target.parent} failed ({err.strerror or err}); "
                f"nothing was left there: {why}, or write them elsewhere "
                "(--trainer.default_root_dir)"
            ) from None

    def _discard(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):  # a full disk may refuse the close too
                self._writer.close()
            self._writer = None
        if self._partial is not None:
            self._partial.unlink(missing_ok=True)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """A prediction that stopped (a SIGTERM, an error, a full disk) leaves no file."""
        self._discard()

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Close the file, flush it to disk and give it its name."""
        if self._writer is None or self._partial is None:
            return
        with self._writing():
            self._writer.close()
            with self._partial.open("rb") as f:
                os.fsync(f.fileno())
            self._partial.rename(self._target)
        rank_zero_info(f"gnnscale: predictions in {self._target.parent}")
