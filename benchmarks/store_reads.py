"""Reads from disk on the papers100M-sized graph: one at a time against many, and a feature cache.

Written by ``python benchmarks/figures.py store_reads`` (on_disk_graph's ``reads`` block; about 40
minutes; run at full size only when named). The graph is ``ondisk-large``'s, reused where it
lies (``$GNNSCALE_LARGE_DIR/gnnscale-large-full``), else prepared (40 GiB, minutes). In one run:

- the disk's own random-read rates: 4-KiB reads at random offsets of the feature file, direct
  (past the page cache), by 1 thread, and by 32 before the first fit and after each (the
  device's rate drifted between 43k and 80k reads/s within an hour here: each fit's reads are
  set against the probes on either side of it, the cold gathers against their median);
- cold gathers of random feature rows: one ``index_select`` against 32 threads
  (``gnnscale.stores.reads``);
- which rows a cache should hold: two sampling passes over the training seeds; the share of the
  second pass's rows held by as many rows chosen from the first pass (most drawn), by in-degree,
  or at random;
- ``gnnscale fit`` of the recipe from the evicted folder: with the reads of before
  (``read_threads: 1``, one page fault at a time, one loader worker; one epoch), with 32 threads
  and the sampler's pages prefetched in one loader worker, with the default (the same in each of
  two workers), and with feature caches of 10% and 25% of the feature file (two epochs each: the
  first cold, the second with what the caches kept); the device's reads per second while each
  ran, its private memory, the cache's hit rate;
- a user's own loop (docs/stores.md): PyG's ``NeighborLoader`` over ``gnnscale.stores.open(folder,
  read_threads=32)`` with gnnscale's sampler, one loader worker, one cold epoch, training and
  then the loader alone; and the loader alone over the store with a 10% feature cache and two
  workers, two epochs: the store's reads against the DataModule's.
"""

from __future__ import annotations

import json
import mmap
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import harness
import numpy as np
import psutil
import torch
from blocks import Block, Section
from device_reads import DiskReads, disk_reads
from on_disk import evict
from on_disk_large import (
    ENTRY,
    FIT_ARGS,
    GRAPH,
    large_workdir,
    prepare_graph,
    trainer_and_worker,
)
from torch_geometric.data import Data
from torch_geometric.sampler import NodeSamplerInput

from gnnscale.sampling import HopSampler
from gnnscale.stores import reads
from gnnscale.stores.prepared import PreparedGraph

DEPTH = 32  # the deep queue the disk is measured at: gnnscale's reading threads
_LOOP = (
    "`NeighborLoader((fs, gs), neighbor_sampler=HopSampler((fs, gs), [15, 10]))` over "
    "`gnnscale.stores.open(folder, read_threads=32)`, one loader worker"
)
PYG_LABELS = {
    "train": f"your own PyG loop: {_LOOP}, PyG's `GraphSAGE`",
    "load": f"the same loader alone (no training step): {_LOOP}",
}


def disk_rate(path: Path, depth: int, seconds: float) -> float:
    """Random 4-KiB direct reads per second of ``path`` by ``depth`` threads."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    pages = path.stat().st_size // 4096
    counts = [0] * depth
    stop = time.perf_counter() + seconds

    def work(k: int) -> None:
        buffer = mmap.mmap(-1, 4096)  # page-aligned, as direct reads need
        offsets = np.random.default_rng(k).integers(0, pages, 1 << 20) * 4096
        done = 0
        while time.perf_counter() < stop:
            os.preadv(fd, [buffer], int(offsets[done % len(offsets)]))
            done += 1
        counts[k] = done

    start = time.perf_counter()
    workers = [threading.Thread(target=work, args=(k,)) for k in range(depth)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    os.close(fd)
    return sum(counts) / (time.perf_counter() - start)


GATHER = """
import sys, time, torch
from gnnscale.stores.prepared import PreparedGraph
from gnnscale.stores import reads
folder, threads, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
x = PreparedGraph(folder, "size", threads).tensor("x")
index = torch.randint(0, x.size(0), (rows,), generator=torch.Generator().manual_seed(0))
start = time.perf_counter()
reads.gather(x, index, threads)
print(rows / (time.perf_counter() - start))
"""


def gather_rate(folder: Path, threads: int, rows: int) -> float:
    """Random feature rows per second gathered from the evicted folder, in a fresh process."""
    evict(folder)
    argv = [sys.executable, "-c", GATHER, str(folder), str(threads), str(rows)]
    return float(harness.run(argv).stdout)


def policies(folder: Path, fractions: tuple[float, ...]) -> dict[str, list[float]]:
    """Share of a sampling pass's rows held by caches chosen from another pass, by policy."""
    graph = PreparedGraph(folder, "size")
    colptr, row = graph.csc
    n = graph.manifest.node_count()
    empty = Data(edge_index=torch.empty(2, 0, dtype=torch.long), num_nodes=1)
    sampler = HopSampler(empty, [15, 10])  # the recipe's fan-out, as the DataModule samples
    sampler.num_nodes, sampler.colptr, sampler.row, sampler.perm = n, colptr, row, None
    train = graph.data.train_mask.nonzero().view(-1)

    def drawn(seed: int) -> torch.Tensor:
        counts = torch.zeros(n, dtype=torch.int32)
        torch.manual_seed(seed)
        for seeds in train[torch.randperm(train.numel())].split(1024):
            reads.read_ahead(colptr, row, seeds, [15, 10], 32)
            node = sampler.sample_from_nodes(NodeSamplerInput(None, seeds)).node
            counts.index_add_(0, node, torch.ones(node.numel(), dtype=torch.int32))
        return counts

    first, second = drawn(1), drawn(2)
    scores = {
        "drawn most often in another pass": first.float(),
        "highest in-degree": (colptr[1:] - colptr[:-1]).float(),
        "at random": torch.rand(n, generator=torch.Generator().manual_seed(0)),
    }
    total = float(second.sum())
    jitter = torch.rand(n, generator=torch.Generator().manual_seed(1)) * 0.5  # ties at random
    return {
        name: [
            float(second[(score + jitter).topk(int(f * n)).indices].sum()) / total
            for f in fractions
        ]
        for name, score in scores.items()
    }


def _run_cold(folder: Path, argv: list[str], **kwargs: object) -> tuple[harness.Run, dict]:
    """Run ``argv`` from the evicted folder; the run and the device's reads while it ran."""
    evict(folder)
    before = disk_reads(folder)
    disk = DiskReads(folder)
    disk.start()
    try:
        done = harness.run(argv, sample_s=0.5, **kwargs)  # type: ignore[arg-type]
    finally:
        disk.done.set()
        disk.join()
    after = disk_reads(folder)
    assert done.memory is not None
    trainer, worker = trainer_and_worker(done.memory)
    busy = [r for r in disk.rates if r > 1000] or [0]
    return done, {
        "fit_s": done.wall_s,
        "reads_per_s": (after[0] - before[0]) / done.wall_s,
        "busy_reads_per_s": statistics.median(busy),
        "mb_per_s": (after[1] - before[1]) / done.wall_s / 2**20,
        "private_mb": trainer,
        "worker_mb": worker,
    }


def fit(folder: Path, workdir: Path, name: str, *flags: str) -> dict[str, float | list[float]]:
    """One ``gnnscale fit`` of the recipe from the evicted folder; its figures."""
    save_dir = workdir / "runs" / name
    argv = ENTRY.argv(
        "fit",
        f"--data.init_args.root={folder}",
        f"--trainer.logger.init_args.save_dir={save_dir}",
        *FIT_ARGS,
        *flags,
    )
    done, figures = _run_cold(folder, argv, cwd=workdir, logs=save_dir)
    metrics = done.metrics
    return {
        **figures,
        "epoch_s": metrics["perf/epoch_s"],
        "hit_rate": metrics.get("perf/cache_hit_rate", []),
        "val_acc": metrics["val/acc"][-1],
        "test_acc": metrics["test/acc"][-1],
    }


# A user's own loop as docs/stores.md writes it: PyG's loader and GraphSAGE over the store pair,
# gnnscale's sampler for the neighbour lists' reads; the recipe's model size, fan-out, batch,
# optimizer and precision. ``train``: one epoch, one loader worker, training alone; ``load``: the
# same loader alone; ``cached``: the loader alone with the store's feature cache and the
# DataModule's two workers, two epochs, and the share of the second's rows the cache held.
PYG_LOOP = """
import json, sys, time, torch
from torch_geometric.loader import NeighborLoader
from torch_geometric.nn import GraphSAGE
import gnnscale.stores
from gnnscale.sampling import HopSampler
folder, mode, cache_gib = sys.argv[1], sys.argv[2], float(sys.argv[3])
cache = {"feature_cache_gib": cache_gib, "num_neighbors": [15, 10], "batch_size": 1024}
fs, gs = gnnscale.stores.open(folder, verify="size", read_threads=32, **cache)
classes = gs.graph.num_classes  # the folder's manifest
train = fs.get_tensor(None, "train_mask", None).nonzero().view(-1)
sampler = HopSampler((fs, gs), [15, 10], edge_ids=False)  # GraphSAGE reads no edge features
torch.manual_seed(0)
workers = 2 if mode == "cached" else 1
loader = NeighborLoader((fs, gs), num_neighbors=[15, 10], input_nodes=train, batch_size=1024,
                        shuffle=True, num_workers=workers, persistent_workers=True,
                        neighbor_sampler=sampler, transform=fs.count_held if cache_gib else None)
features = fs.get_tensor_size(None, "x", None)[1]
model = GraphSAGE(features, 256, num_layers=2, out_channels=classes, dropout=0.5)
optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
epochs = []
for epoch in range(2 if mode == "cached" else 1):
    start, held = time.perf_counter(), [0, 0]  # the rows the cache held of those gathered
    for batch in loader:
        if cache_gib:
            held = [held[0] + batch.feature_reads.cached, held[1] + batch.feature_reads.total]
        if mode != "train":  # the loader alone: sampled, its rows read by the store
            continue
        optimizer.zero_grad()
        with torch.autocast("cpu", torch.bfloat16):
            out = model(batch.x, batch.edge_index)[: batch.batch_size]
        loss = torch.nn.functional.cross_entropy(out.float(), batch.y[: batch.batch_size])
        loss.backward()
        optimizer.step()
    epochs.append(time.perf_counter() - start)
hit_rate = [held[0] / held[1]] if held[1] else []
print(json.dumps({"epoch_s": epochs, "hit_rate": hit_rate}))
"""


def pyg_loop(folder: Path, mode: str, cache_gib: float = 0.0) -> dict[str, float | list[float]]:
    """:data:`PYG_LOOP` from the evicted folder (``mode``: ``train``, ``load``, ``cached``)."""
    argv = [sys.executable, "-c", PYG_LOOP, str(folder), mode, str(cache_gib)]
    done, figures = _run_cold(folder, argv)
    return {**figures, **json.loads(done.stdout.strip().splitlines()[-1])}


def measure(size: str, workdir: Path) -> dict:
    """Every figure of the block."""
    tiny = size == "tiny"
    folder = workdir / "graph"
    prepare_graph(folder, size)
    x_bytes = (folder / "x.bin").stat().st_size
    seconds, rows = (1.0, 2_000) if tiny else (15.0, 40_000)
    # The depth-32 rate, probed before the first fit and after each: it drifts by a third within
    # the run, so each fit is set against the probes on either side of it.
    deep: list[float] = []

    def probe() -> None:
        deep.append(disk_rate(folder / "x.bin", DEPTH, seconds))

    r: dict = {
        "x_gib": x_bytes / 2**30,
        "ram_gib": psutil.virtual_memory().total / 2**30,
        "disk": {1: disk_rate(folder / "x.bin", 1, seconds)},
        "gather": {t: gather_rate(folder, t, rows) for t in (1, DEPTH)},
        "policies": policies(folder, (0.10, 0.25)),
    }
    two, one = "--trainer.max_epochs=2", "--data.init_args.loader.num_workers=1"
    runs = {
        "one read at a time (`read_threads: 1`), one loader worker": [
            "--data.init_args.read_threads=1",
            one,
        ],
        "32 threads, sampler's pages prefetched, one loader worker": [two, one],
        "32 threads, sampler's pages prefetched, two loader workers (default)": [two],
    }
    for fraction in (0.10, 0.25):
        gib = fraction * x_bytes / 2**30
        label = f"default + feature cache of {fraction:.0%} (`feature_cache_gib: {gib:.2f}`)"
        runs[label] = [two, f"--data.init_args.feature_cache_gib={gib:.4f}"]
    r["fits"] = {}
    probe()
    for i, (label, flags) in enumerate(runs.items()):
        r["fits"][label] = fit(folder, workdir, f"run{i}", *flags)
        probe()
    for mode, label in PYG_LABELS.items():
        r["fits"][label] = pyg_loop(folder, mode)
        probe()
    gib = 0.10 * x_bytes / 2**30
    label = (
        f"the same loader alone, two workers, with the store's feature cache of 10% "
        f"(`stores.open(..., feature_cache_gib={gib:.2f}, num_neighbors=[15, 10])`)"
    )
    r["fits"][label] = pyg_loop(folder, "cached", gib)
    probe()
    r["deep"] = deep
    return r


def _table(r: dict) -> str:
    disk1, disk32 = r["disk"][1], statistics.median(r["deep"])
    lines = [
        "| reads | first epoch (cold), s | second epoch, s | feature cache hit rate (second) "
        "| device reads/s while busy (% of depth 32 around it) | fit, whole run, s | peak private "
        "memory, trainer / largest worker | val / test acc |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = None
    for i, (label, f) in enumerate(r["fits"].items()):
        around = (r["deep"][i] + r["deep"][i + 1]) / 2  # the probes before and after this row
        first = f["epoch_s"][0]
        base = base or first
        second = f"{f['epoch_s'][1]:,.1f}" if len(f["epoch_s"]) > 1 else "-"
        hits = f"{f['hit_rate'][-1]:.0%}" if f["hit_rate"] else "-"
        lines.append(
            f"| {label} | {first:,.1f} ({base / first:.1f}x) | {second} | {hits} "
            f"| {f['busy_reads_per_s']:,.0f} ({f['busy_reads_per_s'] / around:.0%}) "
            f"| {f['fit_s']:,.0f} | {f['private_mb']:,.0f} / {f['worker_mb']:,.0f} MiB "
            + (f"| {f['val_acc']:.3f} / {f['test_acc']:.3f} |" if "val_acc" in f else "| - |")
        )
    g1, g32 = r["gather"][1], r["gather"][DEPTH]
    lines += [
        "",
        "| the disk and the reads alone | per second |",
        "|---|---:|",
        f"| random 4-KiB direct reads, 1 thread (queue depth 1) | {disk1:,.0f} |",
        f"| random 4-KiB direct reads, {DEPTH} threads (queue depth {DEPTH}): median of "
        f"{len(r['deep'])} probes, before the first fit and after each ({min(r['deep']):,.0f} to "
        f"{max(r['deep']):,.0f}) | {disk32:,.0f} |",
        f"| cold random feature rows, one `index_select` | {g1:,.0f} |",
        f"| cold random feature rows, {DEPTH} threads (`gnnscale.stores.reads.gather`) | "
        f"{g32:,.0f} ({g32 / g1:.1f}x; {g32 / disk32:.0%} of depth {DEPTH}) |",
        "",
        "| rows a cache holds, chosen by | share of another pass's rows, cache of 10% / 25% |",
        "|---|---:|",
        *(f"| {name} | {a:.1%} / {b:.1%} |" for name, (a, b) in r["policies"].items()),
    ]
    return "\n".join(lines)


def blocks(tiny: bool) -> list[Block]:
    """The recipe README's ``reads`` block (``tiny``: a 50k-node check of the pipeline)."""
    if tiny:
        with tempfile.TemporaryDirectory() as workdir:
            r = measure("tiny", Path(workdir))
    else:
        workdir = large_workdir()
        r = measure("full", workdir)
    settings = ", ".join(
        f"`--source.synthetic.{k}={v}`" for k, v in GRAPH["tiny" if tiny else "full"].items()
    )
    text = "\n".join(
        [
            _table(r),
            "",
            f"The graph of the `large` block ({settings}; features {r['x_gib']:.1f} GiB, this "
            f"machine {r['ram_gib']:.1f} GiB), its pages evicted (`posix_fadvise(DONTNEED)`) "
            "before each fit and each cold measurement. Each fit: `gnnscale fit --config "
            "recipes/on_disk_graph/config.yaml` with "
            + ", ".join(f"`{a}`" for a in FIT_ARGS)
            + " and the row's settings; the epochs are training alone (`perf/epoch_s`), the "
            "whole run adds start-up, the cache's sampling pass and its read (before the first "
            "epoch), validation and test. The last three rows are docs/stores.md's own loop "
            "(`PYG_LOOP` in benchmarks/store_reads.py): PyG's `GraphSAGE` with the recipe's "
            "sizes, optimizer and bf16 autocast (PyG's forward computes every sampled node at "
            "every layer), then the loader alone, one cold epoch each; then the loader alone "
            "with the store's cache (filled by `stores.open`, before the first epoch) and the "
            "DataModule's two workers, two epochs, its hit rate counted by `fs.count_held`. "
            "Their whole run is the script's, start-up included, with no validation. Device "
            "reads: the median of the "
            "one-second rates above 1,000 reads/s of the disk that holds the graph "
            f"(`/sys/dev/block`), against the mean of its depth-{DEPTH} rates probed just "
            "before and after the row (the disk's rate drifts within the run). "
            "Policies: two sampling passes over the training seeds at the recipe's fan-out, "
            "without features; each cache holds 10% or 25% of the rows, chosen from the first "
            "pass, and is scored on the second.",
        ]
    )
    if tiny:
        text = "**Tiny settings: a check of the pipeline, not figures.**\n\n" + text
    return [Block(ENTRY.folder / "README.md", "reads", text)]


if __name__ == "__main__":
    print(blocks(tiny="--tiny" in sys.argv)[0].text)


SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about=(
        "on_disk_large's graph: the cold epoch with one read at a time against many, and "
        "with feature caches of 10% and 25% of its feature file; the disk's own random-read "
        "rates; which rows a cache should hold (about 40 minutes)"
    ),
    writes="reads in on_disk_graph's README",
    threads=f"{torch.get_num_threads()} torch threads, loader workers as each row says",
    on_request=True,
    formerly=("reads",),
)
