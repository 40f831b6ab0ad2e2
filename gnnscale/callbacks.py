"""Callbacks the recipes share."""

from __future__ import annotations

import resource
import statistics
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

__all__ = ["ThroughputMonitor", "peak_rss_mb"]


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class ThroughputMonitor(L.Callback):
    """Seconds per training epoch, training nodes per second and peak memory, after warm-up.

    Unlike Lightning's per-step ``ThroughputMonitor``, this counts graph work: the loss nodes of
    each batch (seed nodes for neighbour sampling) and whole epochs, whose median is robust to a
    noisy machine. An epoch's time runs from its start to the end of its last training batch, so
    it includes sampling and data loading but not validation. Logs ``perf/epoch_s``,
    ``perf/nodes_per_s``, ``perf/peak_rss_mb`` and, on a GPU, ``perf/peak_cuda_mb``, and prints
    one summary block at the end of ``fit``.

    Args:
        warmup_epochs: Epochs left out of the median (allocator and worker start-up).
    """

    def __init__(self, warmup_epochs: int = 1) -> None:
        self.warmup_epochs = warmup_epochs
        self.epoch_s: list[float] = []
        self.nodes_per_s: list[float] = []

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the epoch clock."""
        self._nodes = 0
        self._start = self._end = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        """Count the batch's loss nodes and note when the last batch ended."""
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        self._nodes += int(getattr(batch, "num_loss_nodes", 0))
        self._end = time.perf_counter()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Log the epoch's time, throughput and peak memory."""
        seconds = self._end - self._start
        metrics = {"perf/epoch_s": seconds, "perf/nodes_per_s": self._nodes / seconds}
        metrics["perf/peak_rss_mb"] = peak_rss_mb()
        if pl_module.device.type == "cuda":
            metrics["perf/peak_cuda_mb"] = torch.cuda.max_memory_allocated(pl_module.device) / 2**20
        pl_module.log_dict(metrics)
        if trainer.current_epoch >= self.warmup_epochs:
            self.epoch_s.append(seconds)
            self.nodes_per_s.append(metrics["perf/nodes_per_s"])
        self._peak = metrics

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Print the summary block."""
        if not self.epoch_s:
            return
        lines = [
            f"median s/epoch     {statistics.median(self.epoch_s):.3f}"
            f"  (over {len(self.epoch_s)} epochs after {self.warmup_epochs} warm-up)",
            f"median nodes/s     {statistics.median(self.nodes_per_s):,.0f}",
            f"peak RSS           {self._peak['perf/peak_rss_mb']:,.0f} MiB",
        ]
        if "perf/peak_cuda_mb" in self._peak:
            lines.append(f"peak CUDA alloc    {self._peak['perf/peak_cuda_mb']:,.0f} MiB")
        rank_zero_info("\n".join(["gnnscale throughput", *lines]))
