"""A batch's rows gathered from a mapped file with many reads in flight.

A gather from a memory-mapped file that is not in the page cache waits on one page fault at a
time: each row is a 4-KiB read, and the disk sits at its queue-depth-1 rate (here about 17k
random reads per second against 72-80k at depth 32). :func:`gather` splits a batch's rows
between threads that gather their share at once; each blocks on its own faults, so as many reads
are in flight as there are threads. No buffer of our own, no read path beside the mapping: the
rows land in the page cache as before, and a gather from pages already cached costs the same
as one plain ``index_select`` plus the threads' hand-off.

Measured here on a 4 GiB file, its pages evicted, 40,000 random 256-byte rows: one
``index_select`` 26k rows/s; 8 threads 60k, 32 threads 85k, 64 threads 92k. on_disk_graph's
README (its ``reads`` block, ``python benchmarks/figures.py store_reads``) measures the epoch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gnnscale._compat import shared_storage

__all__ = ["RowCache", "gather", "read_ahead"]

MIN_ROWS = 256  # rows per thread below which a thread's hand-off costs more than it saves
PAGE = 4096

_pools: dict[tuple[int, int], ThreadPoolExecutor] = {}


def _pool(threads: int) -> ThreadPoolExecutor:
    """This process's pool of ``threads`` threads (a forked loader worker makes its own)."""
    key = (os.getpid(), threads)
    if key not in _pools:
        _pools[key] = ThreadPoolExecutor(threads, thread_name_prefix="gnnscale-read")
    return _pools[key]


def _private(tensor: Tensor, rows: int) -> Tensor:
    return tensor.new_empty((rows, *tensor.shape[1:]))


def _output(tensor: Tensor, rows: int) -> Tensor:
    """The gather's output; in shared memory inside a loader worker, as PyG's own gathers."""
    shape = (rows, *tensor.shape[1:])
    if torch.utils.data.get_worker_info() is None:
        return _private(tensor, rows)
    storage = shared_storage(tensor, math.prod(shape) * tensor.itemsize)
    return tensor.new_empty(0).set_(storage).view(shape)


def _select(tensor: Tensor, index: Tensor, out: Tensor, inference: bool) -> None:
    with torch.inference_mode(inference):
        torch.index_select(tensor, 0, index, out=out)


def gather(tensor: Tensor, index: Tensor, threads: int = 1, out: Tensor | None = None) -> Tensor:
    """``tensor[index]`` along its first dimension, read by up to ``threads`` threads at once.

    Args:
        tensor: Rows to gather from (a mapped file's tensor).
        index: Row numbers, any integer dtype.
        threads: Threads reading at once; ``1`` is a plain ``index_select``.
        out: Where to write the rows (default: new, in shared memory in a loader worker).
    """
    index = index.long()
    out = _output(tensor, index.numel()) if out is None else out
    parts = min(threads, index.numel() // MIN_ROWS)
    if parts <= 1:
        return torch.index_select(tensor, 0, index, out=out)
    bounds = torch.linspace(0, index.numel(), parts + 1).long().tolist()
    inference = torch.is_inference_mode_enabled()  # thread-local: the caller's, for ``out``
    reads = [
        _pool(threads).submit(_select, tensor, index[a:b], out[a:b], inference)
        for a, b in zip(bounds, bounds[1:], strict=False)
    ]
    for read in reads:
        read.result()  # re-raises a thread's error here
    return out


def read_ahead(
    colptr: Tensor,
    row: Tensor,
    seeds: Tensor,
    fanout: list[int],
    threads: int,
    check: Callable[[Tensor], None] | None = None,
) -> None:
    """Read and check the CSC that sampling ``fanout`` from ``seeds`` walks, before PyG does.

    Each hop reads its frontier's ``colptr`` entries and, with more than one thread, the pages
    of their in-neighbour lists (``row``), ``threads`` at once: the sampler, reading one page at
    a time, then finds them in the page cache. Before the last hop, every entry of those lists,
    any of which the sampler may draw and expand, is given to ``check``: PyG's samplers index
    with them unchecked, and a damaged id far out of range crashed the process. A list the
    sampler takes whole (no longer than the hop's fan-out, or ``-1``) gives the next hop's
    frontier; which neighbours it draws from a longer one is not known before it draws them,
    so those are left to its own reads (and, past two hops, its ids unchecked). At a fan-out
    near the mean degree (15 against 14.6 on the papers100M-sized graph) most lists are taken
    whole. :func:`read_ahead_typed` does the same on a heterogeneous graph.
    """
    typed = None if check is None else (lambda ids, _: check(ids))
    read_ahead_typed({None: (colptr, row)}, {None: seeds}, {None: fanout}, threads, typed)


def read_ahead_typed(
    csc: Mapping[Any, tuple[Tensor, Tensor]],
    seeds: Mapping[Any, Tensor],
    fanout: Mapping[Any, list[int]],
    threads: int,
    check: Callable[[Tensor, Any], None] | None = None,
) -> None:
    """:func:`read_ahead` with node and edge types.

    Each hop reads, for every edge type ``(src, rel, dst)`` in ``csc`` (``colptr``, ``row``),
    the lists of its destination type's frontier; the lists it takes whole give the source
    type's frontier of the next hop. ``check`` gets the ids and their node type. A homogeneous
    graph is the edge type ``None`` between nodes of type ``None``.
    """
    frontier = {t: s.long().unique() for t, s in seeds.items()}
    hops = len(next(iter(fanout.values()), []))
    for hop in range(hops):
        found: dict[Any, list[Tensor]] = {}
        for et, (colptr, row) in csc.items():
            src, dst = (None, None) if et is None else (et[0], et[-1])
            nodes = frontier.get(dst)
            if nodes is not None:  # nodes an append added: their lists are the append's, small
                nodes = nodes[nodes < colptr.numel() - 1]
            if nodes is None or not nodes.numel() or et not in fanout:
                continue
            start, end = gather(colptr, torch.cat([nodes, nodes + 1]), threads).view(2, -1)
            length = end - start
            if threads > 1:  # an entry every page's worth along each list and its last
                step_size = PAGE // row.itemsize
                steps = (length + step_size - 1) // step_size
                step = _ranges(torch.zeros_like(start), steps)  # 0, 1, ... steps - 1 a list
                touch = torch.repeat_interleave(start, steps) + step * step_size
                gather(row, torch.cat([touch, end[length > 0] - 1]).unique(), threads)
            if hop == hops - 1:
                continue
            neighbours = row[_ranges(start, length)]  # from the page cache, with threads
            if check is not None:
                check(neighbours, src)
            k = fanout[et][hop]
            whole = (length <= k) | (k < 0)
            found.setdefault(src, []).append(neighbours[torch.repeat_interleave(whole, length)])
        frontier = {t: torch.cat(parts).unique() for t, parts in found.items()}


def _ranges(start: Tensor, length: Tensor) -> Tensor:
    """``start[i], start[i] + 1, ..., start[i] + length[i] - 1`` for every ``i``, concatenated."""
    begins = torch.repeat_interleave(start - (length.cumsum(0) - length), length)
    return begins + torch.arange(int(length.sum()))


@dataclass
class RowCache:
    """Some rows of a file kept in memory: ``rows[i]`` is row ``ids[i]``, ``ids`` sorted.

    :meth:`gather` takes the rows it holds from memory and reads the others as :func:`gather`
    does. Which rows to keep is the caller's choice (``NeighborDataModule`` keeps those its
    sampler draws most often).
    """

    ids: Tensor
    rows: Tensor

    @property
    def nbytes(self) -> int:
        """Memory it holds: its rows and their ids."""
        return self.rows.nbytes + self.ids.nbytes

    def gather(self, tensor: Tensor, index: Tensor, threads: int = 1) -> tuple[Tensor, int]:
        """``tensor[index]`` (held rows from memory, the others read), and how many were held."""
        index = index.long()
        if not self.ids.numel():
            return gather(tensor, index, threads), 0
        slot = torch.searchsorted(self.ids, index).clamp_(max=self.ids.numel() - 1)
        held = self.ids[slot] == index
        hits, misses = held.nonzero().view(-1), (~held).nonzero().view(-1)
        out = _output(tensor, index.numel())
        out[hits] = self.rows[slot[hits]]
        out[misses] = gather(tensor, index[misses], threads, out=_private(tensor, misses.numel()))
        return out, hits.numel()
