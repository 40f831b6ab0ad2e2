"""The reads a disk device completes: so far, each second, each training epoch.

From ``/sys/dev/block``: every process's reads of the device that holds a path, served past the
page cache. The store benchmarks measure the disk with them, and a fit's epochs through
:class:`EpochReads` (a callback, on ``PYTHONPATH`` with this folder).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import lightning as L


def disk_reads(folder: Path) -> tuple[int, int]:
    """Reads completed and bytes read so far by the device that holds ``folder``."""
    dev = os.stat(folder).st_dev
    fields = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat").read_text().split()
    return int(fields[0]), int(fields[2]) * 512


class DiskReads(threading.Thread):
    """Samples the device's reads completed once a second: the rate of each second."""

    def __init__(self, folder: Path) -> None:
        super().__init__(daemon=True)
        self.folder, self.rates, self.done = folder, [], threading.Event()

    def run(self) -> None:
        """Sample until :attr:`done` is set."""
        last = disk_reads(self.folder)[0]
        while not self.done.wait(1.0):
            now = disk_reads(self.folder)[0]
            self.rates.append(now - last)
            last = now


class EpochReads(L.Callback):
    """Logs ``perf/device_reads``: the reads the device holding ``path`` completed each epoch.

    Counted over the span of ``ThroughputMonitor``'s ``perf/epoch_s`` (the epoch's start to the
    end of its last training batch), by every process reading that device: the loader workers'
    and anything else on the machine. What a cache saves in a second epoch shows here whatever
    rate the disk ran at meanwhile.
    """

    def __init__(self, path: str) -> None:
        self.path, self._start, self._end = Path(path), 0, 0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Note the device's reads so far."""
        self._start = self._end = disk_reads(self.path)[0]

    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        """Note the device's reads at the end of each batch: the last one ends the span."""
        self._end = disk_reads(self.path)[0]

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Log the span's reads."""
        pl_module.log("perf/device_reads", float(self._end - self._start))
