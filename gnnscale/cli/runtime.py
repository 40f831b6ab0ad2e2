"""Process policy: the allocator, oneDNN's caches, precision, warnings no user can act on.

Set once per process.

``gnnscale.cli`` applies it at start (:func:`steady_cpu_memory`, :func:`quiet`) and as it builds
a Trainer (:func:`check_precision`, :func:`cpu_precision`, :class:`SameStepMemory`); it lives
here so that the command line holds only the command line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import traceback
import warnings
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

from gnnscale.batch import LayerwiseBatch
from gnnscale.errors import ConfigError, cause
from gnnscale.measure import (
    cpu_bf16_native,
    data_mb,
    keep_freed_memory,
    set_mmap_threshold,
    trim_heap,
)
from gnnscale.memory import visible_memory

try:
    import resource
except ImportError:  # not on Windows
    resource = None  # type: ignore[assignment]

__all__ = [
    "DEFAULT_MMAP_THRESHOLD",
    "UNACTIONABLE",
    "SameStepMemory",
    "check_precision",
    "cpu_precision",
    "forks_ranks",
    "keep_freed_memory_now",
    "limited_memory",
    "memory_limit_setting",
    "mmap_setting",
    "on_gpu",
    "out_of_memory",
    "out_of_memory_line",
    "quiet",
    "steady_cpu_memory",
]


# glibc's mmap threshold as gnnscale sets it at start (GNNSCALE_MMAP_THRESHOLD): "0", glibc's
# dynamic threshold (speed; a full-graph run keeps freed memory, see SameStepMemory); "off",
# every run keeps freed memory; a number of bytes, a fixed threshold (lean).
# benchmarks/allocator.py measures each setting; its README table marks this one.
DEFAULT_MMAP_THRESHOLD = "0"


def mmap_setting() -> str:
    """``GNNSCALE_MMAP_THRESHOLD`` checked; ``""`` where the user set glibc's own variables."""
    value = os.environ.get("GNNSCALE_MMAP_THRESHOLD", DEFAULT_MMAP_THRESHOLD).strip()
    if not (value.isdigit() or value == "off"):
        raise ConfigError(
            "GNNSCALE_MMAP_THRESHOLD must be 0 for glibc's own threshold (the default), off to "
            f"keep freed memory in the heap, or a whole number of bytes (got {value!r}); set it "
            "so or unset it"
        )
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return "" if "MALLOC_MMAP_THRESHOLD_" in os.environ or "glibc.malloc" in tunables else value


def steady_cpu_memory() -> None:
    """Allocator settings for steady CPU memory, on Linux.

    - glibc's mmap threshold: by default glibc's own, which rises each time a large block is
      freed, so later tensors of a few MB come from the heap, fast to reuse but fragmenting it;
      tensors above 32 MiB always get a mapping of their own, unmapped when freed.
      ``GNNSCALE_MMAP_THRESHOLD=<bytes>`` fixes it (as ``MALLOC_MMAP_THRESHOLD_`` would): every
      tensor above it gets its own mapping, returned when freed. Measured (``figures.py
      allocator``) once the training step became target-only: 128 KiB cut the peaks by about
      15% (neighbor_sage 1,224 MiB instead of 1,441, Cluster-GCN 1,442 instead of 1,689) but
      doubled Cluster-GCN's s/epoch (2.73 instead of 1.37; 16 MiB and a 1 GiB trim threshold did
      not help); so speed is the default and the lean setting is opt-in. ``gnnscale plan`` is
      within 25% of both. ``off`` keeps every freed block in the heap
      (:func:`keep_freed_memory`), which full-graph runs get anyway (:class:`SameStepMemory`).
    - bf16 matrix products on CPUs keep a compiled primitive per shape in two caches of 1024,
      oneDNN's (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``) and PyTorch's ideep's
      (``LRU_CACHE_CAPACITY``), and sampled batches bring new shapes every step: bf16 runs grew
      by 75 MB per epoch of 20 batches; fp32 stayed flat. 300 products of new shapes grew the
      process by about 200 MiB with neither set, 27 with both at 32, 11 at 8; at 32
      hetero_node_classification stays flat over its epochs. Each shape not in the caches
      builds its primitive again, several times the product's own time, which rows rounded up
      to 1,024s avoid (``bucket_rows``, by default in bf16 on a CPU): a step then has about 30
      shapes (each product's forward and its two gradients, per row count), which 32 entries
      hold and 8 do not. Measured on an Intel Xeon (AMX): the hetero recipe's bf16 epoch took
      0.15 s with rows rounded up and 8 entries, 0.09 with 32 or 64, 0.19 with rows as
      sampled; GraphSAINT and Cluster-GCN epochs had taken as long with both at 8, 64 or
      1024 (peaks 350-400 MiB lower at 8).
      Both are read at the first bf16 product, so this runs before any.

    Settings the user made in the environment win (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``,
    ``LRU_CACHE_CAPACITY``, ``MALLOC_MMAP_THRESHOLD_``, any ``glibc.malloc`` tunable).
    """
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "32")
    os.environ.setdefault("LRU_CACHE_CAPACITY", "32")
    value = mmap_setting()
    if value == "off":
        keep_freed_memory()
    elif value not in ("", "0"):
        set_mmap_threshold(int(value))


class SameStepMemory(L.Callback):
    """Keep freed memory in the heap where every step allocates the same large tensors.

    Under glibc's own threshold those above 32 MiB are mapped and unmapped each step, faulted
    in afresh page by page. Only under the default ``GNNSCALE_MMAP_THRESHOLD``; the heap's
    free pages go back first. glibc cannot go back to its dynamic threshold afterwards.

    - A run with one training batch an epoch (a full graph), from the start of training.
      Measured at c64b9d2 on the full-graph GATv2 recipe: 0.23-0.29 s/epoch with 42% of its
      CPU time in the kernel; with freed memory kept, 0.08 s and 7%, its peak about 10% higher.
      Runs of sampled batches keep glibc's threshold: their tensors vary in size, and a heap
      that never gives back grew the neighbour recipe's peak by up to 38%.
    - Exact layer-wise evaluation once nothing trains after it (test, predict, ``gnnscale
      validate``): its one-hop batches are alike. On on_disk_graph's 2M-node test, 978 batches
      of 4,096 seeds: 9.4M page faults, 22 s of system time and 39 s, against 0.4M, 0.8 s and
      24 s with freed memory kept, the same peak (2,484 / 2,479 MiB). Layer-wise validation
      during ``fit`` keeps glibc's threshold for the training that follows.
    """

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Switch the allocator over if an epoch is one batch."""
        if trainer.num_training_batches == 1:
            keep_freed_memory_now()

    def on_test_batch_start(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """Switch the allocator over for a layer-wise pass that no training follows."""
        if isinstance(batch, LayerwiseBatch) and trainer.state.fn != "fit":
            keep_freed_memory_now()

    on_validation_batch_start = on_predict_batch_start = on_test_batch_start


def keep_freed_memory_now() -> None:
    """Free pages back to the system, then keep freed memory (under the default setting)."""
    if mmap_setting() == DEFAULT_MMAP_THRESHOLD:
        trim_heap()
        keep_freed_memory()


def on_gpu(accelerator: str) -> bool:
    """Whether ``--trainer.accelerator`` runs on a CUDA GPU."""
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


def forks_ranks(strategy: Any) -> bool:
    """Whether the strategy forks its ranks from this process, which needs CUDA uninitialised.

    ``ddp_fork``, ``ddp_notebook`` or ``DDPStrategy(start_method="fork")``.
    """
    if isinstance(strategy, str):
        return "fork" in strategy or "notebook" in strategy
    init_args = getattr(strategy, "init_args", None)
    return init_args is not None and init_args.get("start_method") == "fork"


def check_precision(precision: str, accelerator: str, strategy: Any = None) -> None:
    """Lightning would quietly swap fp16 for bf16 on CPU; say so instead.

    Asking whether a GPU has bf16 initialises CUDA, after which a forked rank cannot use it:
    under a forking strategy the ranks find out themselves (torch's own error).
    """
    gpu = on_gpu(accelerator)
    if precision in ("16", "16-mixed") and not gpu:
        raise ConfigError(
            f"--trainer.precision={precision} needs a CUDA GPU (fp16 autocast with loss scaling); "
            "on CPU use --trainer.precision=bf16-mixed or 32"
        )
    if (
        precision.startswith("bf16")
        and gpu
        and not forks_ranks(strategy)
        and not torch.cuda.is_bf16_supported()
    ):
        raise ConfigError(
            f"--trainer.precision={precision}: this GPU has no bf16; use "
            "--trainer.precision=16-mixed"
        )


def cpu_precision(precision: str, accelerator: str) -> str:
    """``32-true`` for ``bf16-mixed`` on a CPU without oneDNN's bf16 kernels, else ``precision``.

    The recipes train in bf16 autocast for its halved activations and, on CPUs with bf16
    kernels (AVX-512, AMX) and GPUs, its speed. On a CPU without them every bf16 product runs
    on a reference kernel: a neighbour step took 245 ms against 37 in fp32 (6.6x), so speed
    wins by default and ``GNNSCALE_CPU_BF16=1`` keeps bf16 for its memory. ``bf16-true`` (the
    parameters themselves in bf16) is left as asked.
    """
    if precision not in ("bf16", "bf16-mixed") or on_gpu(accelerator) or cpu_bf16_native():
        return precision
    keep = os.environ.get("GNNSCALE_CPU_BF16", "0").strip()
    if keep not in ("", "0", "1"):
        raise ConfigError(f"GNNSCALE_CPU_BF16 must be 1 or 0 (got {keep!r}); set it so or unset it")
    if keep == "1":
        return precision
    rank_zero_warn(
        f"gnnscale: --trainer.precision={precision} on a CPU without bf16 matrix kernels (no "
        "AVX-512 or AMX) runs 6x slower than fp32; training in 32-true instead. "
        "GNNSCALE_CPU_BF16=1 keeps bf16-mixed (about half the activation memory)."
    )
    return "32-true"


# Warnings no gnnscale user can act on, each silenced alone (the README explains the first):
# PyG's advice to install pyg-lib, which is not on PyPI (torch-sparse samples instead); a
# deprecation inside Lightning's own pytree helper; Lightning's note that its model summary
# counts no FLOPs under bf16-mixed; its note, with a prediction writer, that a loader's batches
# carry no dataset indices (gnnscale's predictions carry their own ids); its note that the
# node models' own batch transfer (whole-graph tensors stay in host memory) is the one used.
UNACTIONABLE = (
    "Using 'NeighborSampler' without a 'pyg-lib' installation is deprecated",
    "`isinstance(treespec, LeafSpec)` is deprecated",
    "Precision bf16-mixed is not supported by the model summary",
    "Couldn't infer the batch indices fetched from your dataloader",
    "You have overridden `transfer_batch_to_device` in `LightningModule` but have passed in a",
    # Under DDP, for gnnscale's own per-rank figures: each rank's epoch time, throughput and
    # memory, and its mean training loss (a reduction every step would cost a collective).
    "It is recommended to use `self.log('perf/",
    "It is recommended to use `self.log('train/loss'",
)


class _NoAdvert(logging.Filter):
    """Drops Lightning's advertisement for its cloud logger, printed by every run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


def fork_safe_cuda_check() -> None:
    """Ask NVML, not the CUDA driver, whether a GPU is there (``PYTORCH_NVML_BASED_CUDA_CHECK``).

    Otherwise ``torch.cuda.is_available()`` calls ``cudaGetDeviceCount``, which initialises the
    driver (torch's note on poisoned forks), and a DDP rank forked after it fails at its first
    CUDA call ("CUDA error: initialization error", seen on an H200 with the multi_gpu_ddp
    recipe). torch falls back to the driver where NVML cannot answer. A user's setting wins.
    """
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")


def quiet() -> None:
    """Silence :data:`UNACTIONABLE` and Lightning's advertisement; every other warning stays."""
    for message in UNACTIONABLE:
        warnings.filterwarnings("ignore", message=re.escape(message))
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")  # rank_zero_info's
    if not any(isinstance(f, _NoAdvert) for f in logger.filters):
        logger.addFilter(_NoAdvert())


# GNNSCALE_MEMORY_LIMIT: past it, an allocation fails in the process (torch, numpy and Python
# raise, and the command says so in one line) instead of the kernel killing it without a word.
# "auto" (the default): the memory the process can see (its cgroup's limit or the machine's),
# less what other processes hold; "off"; or a size such as 1.5GiB or 800MiB.
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def memory_limit_setting() -> tuple[int, str] | None:
    """``GNNSCALE_MEMORY_LIMIT`` checked: the limit in bytes and what sets it, or ``None``."""
    value = os.environ.get("GNNSCALE_MEMORY_LIMIT", "auto").strip()
    if value.lower() == "off":
        return None
    if value.lower() == "auto":  # what it holds now and what it can still take, a little less
        seen = visible_memory()
        where = "its memory cgroup's limit" if seen.where == "cgroup" else "this machine's memory"
        return min(seen.limit, int(data_mb() * 2**20) + int(0.97 * seen.available)), where
    found = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", value.lower())
    if found is None or float(found[1]) <= 0:
        raise ConfigError(
            "GNNSCALE_MEMORY_LIMIT must be auto (the memory this process can see, the default), "
            f"off, or a size such as 1.5GiB or 800MiB (got {value!r}); set it so or unset it"
        )
    return int(float(found[1]) * _UNITS[found[2]]), "GNNSCALE_MEMORY_LIMIT"


@contextlib.contextmanager
def limited_memory() -> Iterator[tuple[int, str] | None]:
    """While inside, this process's data (heap and private mappings) stays under the limit.

    ``RLIMIT_DATA`` (Linux; a no-op elsewhere, or where the user set a lower one): the kernel
    refuses the allocation that would pass it, so the process gets an error it can report
    where a memory cgroup or the machine would have killed it. It counts what the process
    wrote, not the files it maps (a prepared graph's pages are not counted); processes it
    forks (loader workers, DDP ranks) inherit it and count what they share with it. Yields
    the limit and what sets it, ``None`` when none is set (nor where a GPU is visible: CUDA's
    driver maps host memory of its own, and the limit has not been measured beside it).
    """
    setting = memory_limit_setting()
    rlimit = getattr(resource, "RLIMIT_DATA", None) if resource is not None else None
    # With a GPU, CUDA's driver maps host memory of its own: not limited (not yet measured).
    gpu = torch.cuda.is_available()
    if setting is None or rlimit is None or not sys.platform.startswith("linux") or gpu:
        yield None
        return
    soft, hard = resource.getrlimit(rlimit)
    limit = setting[0] if hard == resource.RLIM_INFINITY else min(setting[0], hard)
    if limit <= int(data_mb() * 2**20):  # already past it: every allocation would fail
        yield None
        return
    if soft != resource.RLIM_INFINITY and soft <= limit:  # the user's own, tighter one stays
        yield None
        return
    resource.setrlimit(rlimit, (limit, hard))
    try:
        yield setting
    finally:
        resource.setrlimit(rlimit, (soft, hard))


def out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` (or what it was raised from) is an allocation the process was refused."""
    # torch's allocator's words, C++'s (a sort's buffers), errno 12's (a fork, an mmap), and a
    # MemoryError raised in a forked DDP rank, which reaches the launcher as its traceback's text
    refused = "can't allocate memory", "std::bad_alloc", "Cannot allocate memory", "MemoryError:"
    return (
        cause(err, lambda e: isinstance(e, MemoryError) or any(r in str(e) for r in refused))
        is not None
    )


def out_of_memory_line(err: BaseException, limit: tuple[int, str]) -> str:
    """What to say when ``err`` was an allocation past ``limit``: where the run was, what to lower.

    Where: the Lightning loop in ``err``'s traceback (a DataLoader worker's or a forked rank's
    is text in its message).
    """
    where = "".join(traceback.format_exception(err))  # every frame of the chain, and messages
    if "evaluation_loop" in where or "prediction_loop" in where:
        doing = "evaluating"
        fix = "lower --data.eval.batch_size or the evaluation's fan-out (--data.eval.num_neighbors)"
    elif "training_epoch_loop" in where or "fit_loop" in where:
        doing = "training"
        fix = "lower --data.batch_size or the fan-out (--data.num_neighbors)"
    else:
        doing = "loading the data"
        fix = (
            "prepare the graph on disk once (gnnscale prepare) and train from its folder "
            "(--data.dataset=prepared), or use a smaller graph"
        )
    gib = limit[0] / 2**30
    if doing != "loading the data":
        fix += f" (gnnscale plan with the same arguments and --budget_gb {gib:.1f} suggests values)"
    return (
        f"the run needed more memory than the {gib:.1f} GiB this process may take ({limit[1]}), "
        f"{doing}: {fix}; GNNSCALE_MEMORY_LIMIT=off leaves the limit to the kernel"
    )
