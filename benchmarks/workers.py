"""Loader workers: s/epoch and peak memory of each sampler recipe with 0, 1 and 2 workers.

Written by ``python benchmarks/figures.py workers`` (the ``workers`` block of benchmarks/README.md).

A loader worker samples the next batch while the main process trains on this one, at the cost
of a process, of moving each batch to the main process through shared memory, and of the cores
it takes from the training step's threads. Each setting runs ``neighbor_sage``, ``cluster_gcn``,
``graphsaint`` and ``on_disk_graph`` (its graph prepared, in the page cache) through ``gnnscale
fit`` as shipped but for ``data.loader.num_workers``, in a fresh process, settings interleaved;
the shipped setting is marked.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

import yaml
from blocks import PER_PROCESS, Block, Section
from registry import REPO, recipe

from gnnscale.data.args import LoaderArgs
from recipes import measure

RECIPES = ("neighbor_sage", "cluster_gcn", "graphsaint", "on_disk_graph")
WORKERS = (0, 1, 2)


def shipped_workers(name: str) -> int:
    """The workers the recipe's config gives on this machine (``auto`` resolved)."""
    config = yaml.safe_load(recipe(name).config.read_text())
    return LoaderArgs(config["data"]["init_args"].get("loader", {}).get("num_workers", 0)).workers


def blocks(tiny: bool) -> list[Block]:
    """benchmarks/README.md's ``workers`` block."""
    shipped = {name: shipped_workers(name) for name in RECIPES}
    # tiny: 0, 1 and the shipped count; else all of WORKERS
    counts = {n: sorted({*WORKERS[:2], s}) if tiny else list(WORKERS) for n, s in shipped.items()}
    epochs, reps = (2, 1) if tiny else (4, 1)
    extra = [f"--trainer.max_epochs={epochs}", "--trainer.limit_val_batches=0"]
    runs: dict[tuple[str, int], list] = {}
    with tempfile.TemporaryDirectory(prefix="gnnscale-workers-") as tmp:
        for rep in range(reps):
            for name in RECIPES:
                entry = recipe(name)
                for count in counts[name]:
                    args = [*extra, *(entry.tiny if tiny else entry.figure_args)]
                    result = measure(entry, args, Path(tmp), False, rep, tiny, workers=count)
                    runs.setdefault((name, count), []).append(result)
                    print(
                        f"{name} {count} worker(s): {result.epoch_s:.2f} s/epoch, "
                        f"{result.peak_mb:,.0f} MiB",
                        flush=True,
                    )
    lines = [
        "| recipe | loader workers | s/epoch | ÷ fastest | peak RSS (MiB) | ÷ leanest |",
        "|---|---|---:|---:|---:|---:|",
    ]
    fastest_counts = []
    for name in RECIPES:
        epoch = {n: statistics.median(r.epoch_s for r in runs[name, n]) for n in counts[name]}
        peak = {n: statistics.median(r.peak_mb for r in runs[name, n]) for n in counts[name]}
        fastest, leanest = min(epoch.values()), min(peak.values())
        for count in counts[name]:
            mark = " (config.yaml)" if count == shipped[name] else ""
            lines.append(
                f"| {name} | {count}{mark} | {epoch[count]:.2f} | {epoch[count] / fastest:.2f}x "
                f"| {peak[count]:,.0f} | {peak[count] / leanest:.2f}x |"
            )
        best = min(epoch, key=epoch.__getitem__)
        fastest_counts.append(
            f"{name}: {best} ({epoch[shipped[name]] / epoch[best]:.2f}x as long with config.yaml's "
            f"{shipped[name]})"
        )
    lines += [
        "",
        f"Fastest setting on this machine ({os.cpu_count()} cores): {'; '.join(fastest_counts)}.",
        "",
        f"Each recipe's config.yaml but for `--data.init_args.loader.num_workers` (persistent "
        f"when above 0), {epochs} epochs, no per-epoch validation, one test pass; median over "
        f"{reps} repetition(s), settings interleaved, each run a fresh process. s/epoch: median "
        "after the first (warm-up) epoch (`perf/epoch_s`). Peak RSS: the largest `VmHWM` of the "
        "run's processes (a worker is a process of its own).",
    ]
    return [Block(REPO / "benchmarks" / "README.md", "workers", "\n".join(lines))]


SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about=(
        "s/epoch and peak memory of the sampler recipes with 0, 1 and 2 loader workers, the "
        "shipped setting marked"
    ),
    writes="workers in benchmarks/README.md",
    threads=PER_PROCESS,
)
