"""What a DataModule tells ``gnnscale plan`` about its memory: its one method's answer.

``gnnscale plan`` (``gnnscale.plan``) trains a few batches of any DataModule and measures them;
what it cannot measure that way it asks the DataModule through ``memory_profile()``, which
returns a :class:`MemoryProfile`: the graph it holds, the files it maps, how it evaluates, and
what a user can change when the run does not fit. The planner never asks which class it holds.

The arithmetic that refuses a graph too large for the machine, from its sizes alone and before
anything is built or downloaded, is here too (:func:`graph_nbytes`, :func:`check_fits`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import psutil
import torch
from torch import Tensor

from gnnscale.errors import ConfigError

__all__ = [
    "MemoryProfile",
    "Plannable",
    "check_fits",
    "graph_nbytes",
    "proportional_batches",
    "store_tensors",
    "tensor_mb",
]

MiB = 2**20


def tensor_mb(*tensors: Tensor) -> float:
    """MiB of ``tensors``' elements."""
    return sum(t.numel() * t.element_size() for t in tensors) / MiB


def graph_nbytes(num_nodes: int, num_edges: int, num_features: int) -> int:
    """Bytes of a node-classification graph in memory, from its sizes alone.

    float32 features, an int64 label and three boolean split masks per node, two int64 ids per
    edge: a lower bound of what loading or generating it takes.
    """
    return num_nodes * (num_features * 4 + 8 + 3) + num_edges * 16


def check_fits(nbytes: int, graph: str, sizes: str, fix: str) -> None:
    """Refuse a graph of ``nbytes`` larger than this machine's memory, before building it.

    Args:
        nbytes: Its bytes in memory (:func:`graph_nbytes`).
        graph: What it is, as the message names it.
        sizes: Where the bytes come from (the settings or the dataset's sizes).
        fix: What to do instead.
    """
    memory = psutil.virtual_memory().total
    if nbytes > memory:
        raise ConfigError(
            f"{graph} alone takes about {nbytes / 2**30:,.1f} GiB ({sizes}) and this machine "
            f"has {memory / 2**30:,.1f} GiB: {fix}"
        )


@dataclass(frozen=True)
class Visible:
    """The memory this process can see: the tighter of its memory cgroup and the machine.

    Args:
        limit: Bytes in all (the cgroup's limit, or the machine's memory).
        available: Bytes it may still take: the limit less what is in use, page cache that
            can be dropped not counted as in use.
        where: What sets them: ``"cgroup"`` or ``"machine"``.
    """

    limit: int
    available: int
    where: str


def _cgroup_files() -> tuple[Path, Path, Path] | None:
    """This process's memory cgroup's limit, usage and stat files (v2, else v1)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy
            folder = Path("/sys/fs/cgroup", path.lstrip("/"))
            if (folder / "memory.max").is_file():
                return folder / "memory.max", folder / "memory.current", folder / "memory.stat"
        if "memory" in controllers.split(","):
            folder = Path("/sys/fs/cgroup/memory", path.lstrip("/"))
            if (folder / "memory.limit_in_bytes").is_file():
                limit, usage = folder / "memory.limit_in_bytes", folder / "memory.usage_in_bytes"
                return limit, usage, folder / "memory.stat"
    return None


def visible_memory() -> Visible:
    """The memory this process may still take, and in all (:class:`Visible`)."""
    machine, swap = psutil.virtual_memory(), psutil.swap_memory()  # the kernel swaps first
    seen = Visible(machine.total + swap.total, machine.available + swap.free, "machine")
    files = _cgroup_files()
    if files is None:
        return seen
    try:
        text = files[0].read_text().strip()
        limit = machine.total if text == "max" else int(text)
        used = int(files[1].read_text())
        stat = dict(line.split() for line in files[2].read_text().splitlines() if " " in line)
    except (OSError, ValueError):
        return seen
    if limit >= seen.limit:  # unlimited (v1 says so with a huge number)
        return seen
    # Page cache counts as used in a cgroup; its inactive part is dropped before anyone is killed.
    cache = int(stat.get("inactive_file", stat.get("total_inactive_file", 0)))
    return Visible(limit, min(max(limit - used + cache, 0), seen.available), "cgroup")


def store_tensors(*graphs: Any) -> list[Tensor]:
    """Every tensor of ``graphs`` (``Data`` or ``HeteroData``), each storage counted once."""
    found = {}
    for graph in graphs:
        for store in graph.stores:
            for value in store.values():
                if torch.is_tensor(value):
                    found[(value.data_ptr(), value.numel(), value.dtype)] = value
    return list(found.values())


def proportional_batches(batch_size: int) -> Callable[[float, float], str | None]:
    """The batch-size suggestion for batches whose nodes grow in proportion to ``batch_size``.

    Cluster-GCN, GraphSAINT, link and many-graph batches do.
    """

    def suggest(max_nodes: float, mean_nodes: float) -> str | None:
        size = int(batch_size * max_nodes / mean_nodes)
        return f"--data.batch_size={size} (nodes per batch grow with it)" if size >= 1 else None

    return suggest


@dataclass
class MemoryProfile:
    """What a DataModule's memory is made of, beyond the batches the planner measures.

    Args:
        graph_mb: Graph tensors the DataModule holds in private memory.
        eval_mode: How it evaluates, as the plan reports it (``layerwise``, ``sampled``,
            ``full``, ``ranking``, ``batches``).
        mapped_mb: Files it maps whole (a prepared graph, an LMDB store): page cache, shared by
            every process on the machine.
        layerwise: For exact layer-wise inference, its evaluation batch
            (``gnnscale.batch.LayerwiseBatch``): evaluation's whole-graph buffers are then
            computed from the model's widths; none: a few evaluation batches are measured.
        smaller_batches: Given the most nodes a batch may hold on average to fit and the
            measured batches' mean, the settings that fit (``--data...``), or none.
        data_fix: What to change when the graph and the process alone exceed the budget.
        eval_fix: What lowers evaluation's memory; none: the batch-size suggestion covers it.
    """

    graph_mb: float
    eval_mode: str
    smaller_batches: Callable[[float, float], str | None]
    mapped_mb: float = 0.0
    layerwise: Any = None
    data_fix: str = "use a larger machine"
    eval_fix: str | None = None


@runtime_checkable
class Plannable(Protocol):
    """A DataModule ``gnnscale plan`` can plan: gnnscale's all are."""

    def memory_profile(self) -> MemoryProfile:
        """What the DataModule's memory is made of (called once its data is set up)."""
        ...
