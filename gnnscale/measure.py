"""Measurement helpers, written once: the planner, the benchmarks and the notebooks import them.

- :func:`peak_rss_mb`, :func:`rss_mb`, :func:`reset_peak_rss` and :class:`PeakRSS`: resident
  memory of this process, its high-water mark, and a sampler for windows the mark cannot bound.
- :class:`ProcessTreeMemory`: the peaks of another process and of every process it starts.
- :class:`SavedTensors` and :func:`saved_tensor_bytes`: the activation memory of a training
  step, deterministic.
- :func:`read_metrics`: the columns of a run's ``metrics.csv`` (Lightning's ``CSVLogger``).
- :func:`set_mmap_threshold`: glibc's fixed mmap threshold (why: ``gnnscale.cli``).
- :func:`keep_freed_memory`: every allocation from glibc's heap, kept there once freed.
- :func:`cpu_bf16_native`: whether this CPU runs bf16 matrix products natively (oneDNN).
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch
from torch import Tensor

from gnnscale._compat import coo_parts

__all__ = [
    "PeakRSS",
    "ProcessPeaks",
    "ProcessTreeMemory",
    "anon_mb",
    "cpu_bf16_native",
    "data_mb",
    "SavedTensors",
    "peak_rss_mb",
    "read_metrics",
    "reset_peak_rss",
    "rss_mb",
    "saved_tensor_bytes",
    "keep_freed_memory",
    "set_mmap_threshold",
]

MiB = 2**20
_STATUS = Path("/proc/self/status")


def _status_mb(field: str) -> float | None:
    if not _STATUS.exists():
        return None
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return None


def data_mb() -> float:
    """This process's data in MiB (``VmData``, what ``RLIMIT_DATA`` counts; 0 off Linux)."""
    return _status_mb("VmData") or 0.0


def rss_mb() -> float:
    """Resident memory of this process now, in MiB."""
    return psutil.Process().memory_info().rss / MiB


def anon_mb(pid: int | str = "self") -> float:
    """Private (anonymous) resident memory of a process now, in MiB: ``RssAnon``, Linux only.

    Unlike the resident set, it leaves out pages of mapped files, which live in the page cache,
    are shared by every process that maps them, and can be dropped under pressure. A process
    that trains from a memory-mapped graph should hold little of it.
    """
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise OSError("RssAnon not in /proc/<pid>/status (Linux only)")


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (or since :func:`reset_peak_rss`), in MiB.

    On Linux this is ``VmHWM`` from ``/proc/self/status``, not ``ru_maxrss``: a process started
    with ``subprocess`` inherits in ``ru_maxrss`` the peak of the process that started it (the
    kernel carries the old address space's high-water mark across ``exec``), so a small run
    launched from a large pytest or notebook process would report the parent's peak.
    """
    peak = _status_mb("VmHWM")
    if peak is not None:
        return peak
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / MiB if sys.platform == "darwin" else maxrss / 1024  # bytes on macOS, KiB else


def reset_peak_rss() -> bool:
    """Set the high-water mark of :func:`peak_rss_mb` to the current resident memory.

    Linux only (``/proc/self/clear_refs``); returns whether it could. Elsewhere, sample with
    :class:`PeakRSS` instead.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class PeakRSS:
    """Samples resident memory every few milliseconds inside a ``with`` block: ``.peak_mb``.

    For windows that :func:`reset_peak_rss` cannot bound (off Linux, or when an earlier peak of
    the same process must be kept). Brief spikes between samples can be missed.

    Args:
        interval_s: Seconds between samples.
        measure: What to sample, in MiB (default :func:`rss_mb`; :func:`anon_mb` for private).
    """

    def __init__(self, interval_s: float = 0.002, measure: Callable[[], float] = rss_mb) -> None:
        self.interval_s = interval_s
        self.measure = measure
        self.peak_mb = measure()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_mb = max(self.peak_mb, self.measure())
            time.sleep(self.interval_s)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_mb = max(self.peak_mb, self.measure())


@dataclass
class ProcessPeaks:
    """What :class:`ProcessTreeMemory` saw of one process, in MiB.

    Args:
        pid: The process.
        depth: Its place in the tree: 0 the root, 1 a child of the root (a loader worker, or a
            rank that ``torchrun`` started), 2 a grandchild...
        anon_mb: Peak private resident memory (``RssAnon``): no mapped file's pages, no shared
            memory.
        rss_mb: Peak resident memory (``VmRSS``).
        hwm_mb: The kernel's high-water mark of the resident memory (``VmHWM``), last read.
    """

    pid: int
    depth: int
    anon_mb: float = 0.0
    rss_mb: float = 0.0
    hwm_mb: float = 0.0


def _status_fields(pid: int) -> dict[str, float]:
    """``RssAnon``, ``VmRSS`` and ``VmHWM`` of a process in MiB (none for a zombie)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


class ProcessTreeMemory:
    """Samples a process and every process under it, in a thread, inside a ``with`` block.

    Every ``interval_s`` it lists the tree of ``root`` (children, grandchildren, ...) and
    keeps, for each process it saw, its peaks (:class:`ProcessPeaks` in :attr:`processes`, by
    pid). Linux only (``/proc/<pid>/status``). Processes that live and die between two samples
    are missed, and so are peaks between samples; ``VmHWM`` is the kernel's own mark, so only
    the rise after the last sample of a process that exits is.

    Args:
        root: The process whose tree is sampled (a ``subprocess.Popen``'s ``pid``).
        interval_s: Seconds between samples.
        pss_depth: Also keep :attr:`pss_mb`, the peak of the proportional set size summed over
            the processes at this depth and deeper (a page shared by k of them counts 1/k in
            each, so shared and mapped pages count once in all). ``None``: not read (it costs a
            walk of each process's page tables).
    """

    def __init__(self, root: int, interval_s: float = 0.5, pss_depth: int | None = None) -> None:
        self.root, self.interval_s, self.pss_depth = root, interval_s, pss_depth
        self.processes: dict[int, ProcessPeaks] = {}
        self.pss_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _tree(self) -> list[tuple[psutil.Process, int]]:
        tree, level, depth = [], [psutil.Process(self.root)], 0
        while level:
            tree += [(p, depth) for p in level]
            children = []
            for p in level:
                with contextlib.suppress(psutil.Error):  # processes come and go between calls
                    children += p.children()
            level, depth = children, depth + 1
        return tree

    def sample(self) -> None:
        """Read the tree once (the thread does it every ``interval_s``)."""
        pss = 0.0
        for process, depth in self._tree():
            with contextlib.suppress(psutil.Error, OSError):
                fields = _status_fields(process.pid)
                if not fields:
                    continue  # a zombie: nothing resident left
                peaks = self.processes.setdefault(process.pid, ProcessPeaks(process.pid, depth))
                peaks.anon_mb = max(peaks.anon_mb, fields["RssAnon"])
                peaks.rss_mb = max(peaks.rss_mb, fields["VmRSS"])
                peaks.hwm_mb = max(peaks.hwm_mb, fields["VmHWM"])
                if self.pss_depth is not None and depth >= self.pss_depth:
                    pss += process.memory_full_info().pss / MiB
        self.pss_mb = max(self.pss_mb, pss)

    def at_depth(self, depth: int) -> list[ProcessPeaks]:
        """The processes seen at ``depth`` (0: the root), in the order first seen."""
        return [p for p in self.processes.values() if p.depth == depth]

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(psutil.NoSuchProcess):  # the root has gone: nothing to see
                self.sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> ProcessTreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class SavedTensors:
    """Counts the bytes autograd saves for backward inside a ``with`` block: ``.nbytes``.

    Each storage is counted once, however many saved tensors view it. Deterministic, unlike a
    resident-memory peak: it is the activation memory a training step holds between forward and
    backward, whatever the allocator does.

    Args:
        exclude: Tensors whose storages are not counted (a model's parameters, say).
    """

    def __init__(self, exclude: Iterable[Tensor] = ()) -> None:
        self._exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self._storages: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def _pack(self, t: Tensor) -> Tensor:
        parts: tuple[Tensor, ...]
        if t.layout in (torch.sparse_csr, torch.sparse_csc):  # no storage: its three parts
            parts = (t.crow_indices(), t.col_indices(), t.values())
        elif t.layout == torch.sparse_coo:
            parts = coo_parts(t)
        else:
            parts = (t,)
        for part in parts:
            storage = part.untyped_storage()
            if storage.data_ptr() not in self._exclude:
                self._storages[storage.data_ptr()] = storage.nbytes()
        return t

    @property
    def nbytes(self) -> int:
        """Bytes saved so far."""
        return sum(self._storages.values())

    def __enter__(self) -> SavedTensors:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(None, None, None)


def _unpack(t: Tensor) -> Tensor:
    return t


def saved_tensor_bytes(step: Callable[[], Tensor], backward: bool = True) -> int:
    """Bytes autograd saves for backward while ``step()`` computes a loss (:class:`SavedTensors`).

    Args:
        step: Computes and returns a scalar loss.
        backward: Also run ``loss.backward()`` (frees the saved tensors).
    """
    with SavedTensors() as saved:
        loss = step()
    if backward:
        loss.backward()
    return saved.nbytes


def read_metrics(path: Path | str) -> dict[str, list[float]]:
    """Every non-empty column of a run's ``metrics.csv``, as floats in logged order.

    Args:
        path: The ``metrics.csv`` file, or a folder holding exactly one (searched recursively).
    """
    path = Path(path)
    if path.is_dir():
        found = sorted(path.rglob("metrics.csv"))
        if len(found) != 1:
            raise FileNotFoundError(f"expected one metrics.csv under {path}, found {len(found)}")
        path = found[0]
    with path.open() as f:
        rows = list(csv.DictReader(f))
    keys = sorted({k for row in rows for k, v in row.items() if v})
    return {k: [float(row[k]) for row in rows if row.get(k)] for k in keys}


def set_mmap_threshold(num_bytes: int) -> bool:
    """Serve allocations of ``num_bytes`` or more by ``mmap``, fixed (glibc's ``M_MMAP_THRESHOLD``).

    Freed large tensors then leave the resident set at once instead of staying in the heap. On
    glibc, once; returns whether it was set (not on musl, macOS or Windows).
    """
    if sys.platform != "linux":
        return False
    with contextlib.suppress(OSError, AttributeError):
        m_mmap_threshold = -3  # from malloc.h
        return bool(ctypes.CDLL("libc.so.6").mallopt(m_mmap_threshold, num_bytes))
    return False


def keep_freed_memory() -> bool:
    """Serve every allocation from the heap and keep freed memory there for the next (glibc).

    ``M_MMAP_MAX`` 0: no allocation gets a mapping of its own, so none is unmapped when freed;
    ``M_TRIM_THRESHOLD`` -1: the heap's top is never given back on its own (:func:`trim_heap`
    still gives it back where gnnscale calls it). A step that frees and allocates the same large
    tensors again then reuses resident pages instead of faulting in fresh, zeroed ones. Returns
    whether both were set (glibc only).
    """
    if sys.platform != "linux":
        return False
    with contextlib.suppress(OSError, AttributeError):
        mallopt = ctypes.CDLL("libc.so.6").mallopt
        m_trim_threshold, m_mmap_max = -1, -4  # from malloc.h
        return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, -1))
    return False


def trim_heap() -> bool:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim(0)``).

    Under glibc's dynamic mmap threshold, tensors of a few MB come from the heap and their
    pages stay resident once freed, for the next allocation to reuse; a pass whose tensors vary
    in size (layer-wise evaluation) cuts the heap into blocks it cannot reuse and grows it.
    Returns whether it ran (glibc only).
    """
    if sys.platform != "linux":
        return False
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        return True
    return False


def cpu_bf16_native() -> bool:
    """Whether bf16 matrix products on this CPU run on oneDNN's bf16 kernels.

    oneDNN has them on CPUs with AVX-512 (bf16 converted to fp32 in registers) or AVX512-BF16
    / AMX (native). Elsewhere (AVX2 alone) PyTorch falls back to a reference kernel: a [10000,
    100] x [100, 256] product took 370 ms in bf16 against 4-6 ms in fp32 on such a CPU, and a
    neighbour training step 245 ms against 37. Unknown (an older torch): assumed fast.
    """
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    if check is None:
        return True
    try:
        return bool(check())
    except RuntimeError:
        return True
