"""The allocator default: s/epoch and peak memory of three recipes under each glibc mmap setting.

Written by ``python benchmarks/figures.py allocator`` (its block in benchmarks/README.md).

``gnnscale`` sets glibc's mmap threshold at start (``GNNSCALE_MMAP_THRESHOLD``, see
``gnnscale.cli.runtime.steady_cpu_memory``): ``0`` (the default) leaves glibc's dynamic threshold,
except that a run of one batch an epoch (a full graph) keeps freed memory in the heap once
training starts; ``off`` serves every tensor from the heap and keeps freed memory there, fast to
reuse; a number of bytes fixes it: tensors above it get their own mapping, returned to the
system when freed, so resident memory stays flat over batches of varying size. Each setting
runs ``neighbor_sage``, ``cluster_gcn`` and ``gat_attention_memory`` (full-graph, large per-step
tensors) through
``gnnscale fit`` as shipped, in a fresh process, settings interleaved; the default should be
within 1.05x of the fastest s/epoch, and its peak is set against the leanest.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from blocks import PER_PROCESS, Block, Section
from registry import REPO, recipe

from gnnscale.cli.runtime import DEFAULT_MMAP_THRESHOLD
from recipes import measure

SETTINGS = {  # label: GNNSCALE_MMAP_THRESHOLD
    "glibc's dynamic threshold; a full graph keeps freed memory": "0",
    "off: every run keeps freed memory": "off",
    "128 KiB": str(128 * 1024),
    "16 MiB": str(16 * 2**20),
}
RECIPES = ("neighbor_sage", "cluster_gcn", "gat_attention_memory")


def blocks(tiny: bool) -> list[Block]:
    """benchmarks/README.md's ``allocator`` block."""
    settings = dict(list(SETTINGS.items())[:2]) if tiny else SETTINGS
    epochs, reps = (2, 1) if tiny else (4, 3)
    extra = [f"--trainer.max_epochs={epochs}", "--trainer.limit_val_batches=0"]
    runs: dict[tuple[str, str], list] = {}
    with tempfile.TemporaryDirectory(prefix="gnnscale-allocator-") as tmp:
        for rep in range(reps):
            for name in RECIPES:
                entry = recipe(name)
                args = [*extra, *(entry.tiny if tiny else entry.figure_args)]
                for label, threshold in settings.items():
                    env = {"GNNSCALE_MMAP_THRESHOLD": threshold}
                    result = measure(entry, args, Path(tmp), False, rep, tiny, env=env)
                    runs.setdefault((name, label), []).append(result)
                    print(
                        f"{name} {label}: {result.epoch_s:.2f} s/epoch, {result.peak_mb:,.0f} MiB,"
                        f" {result.system_s:.1f} s system of {result.cpu_s:.1f} s CPU",
                        flush=True,
                    )
    lines = [
        "| recipe | mmap setting | s/epoch | ÷ fastest | fit s | system share of CPU "
        "| peak RSS (MiB) | ÷ leanest |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    verdicts, spreads = [], []
    for name in RECIPES:
        epoch = {lb: statistics.median(r.epoch_s for r in runs[name, lb]) for lb in settings}
        peak = {lb: statistics.median(r.peak_mb for r in runs[name, lb]) for lb in settings}
        fit = {lb: statistics.median(r.fit_s for r in runs[name, lb]) for lb in settings}
        system = {
            lb: statistics.median(r.system_s / r.cpu_s for r in runs[name, lb]) for lb in settings
        }
        fastest, leanest = min(epoch.values()), min(peak.values())
        for label, threshold in settings.items():
            mark = " (default)" if threshold == DEFAULT_MMAP_THRESHOLD else ""
            lines.append(
                f"| {name} | {label}{mark} | {epoch[label]:.2f} | {epoch[label] / fastest:.2f}x "
                f"| {fit[label]:.1f} | {system[label]:.0%} | {peak[label]:,.0f} "
                f"| {peak[label] / leanest:.2f}x |"
            )
        default = next(lb for lb, t in settings.items() if t == DEFAULT_MMAP_THRESHOLD)
        peaks = [r.peak_mb for r in runs[name, default]]
        spreads.append(f"{name} {min(peaks):,.0f}-{max(peaks):,.0f} MiB")
        ok = epoch[default] / fastest <= 1.05
        verdicts.append(
            f"{name}: {epoch[default] / fastest:.2f}x the fastest, {peak[default] / leanest:.2f}x "
            f"the leanest ({'PASS' if ok else 'FAIL'})"
        )
    lines += [
        "",
        "The default against the goal (within 1.05x of the fastest s/epoch; the peak is what it "
        f"costs, the lean settings are opt-in): {'; '.join(verdicts)}.",
        "",
        f"The default's peak over the repetitions: {'; '.join(spreads)}. A run's peak depends on "
        "how its heap happened to be cut, so single runs of "
        "the same config in other blocks (`workers`, the recipe table) land anywhere in such a "
        "range.",
        "",
        f"Each recipe's config.yaml as shipped, {epochs} epochs, no per-epoch validation, one "
        f"test pass; median over {reps} repetition(s), settings interleaved, each run a fresh "
        "process. s/epoch: median after the first (warm-up) epoch (`perf/epoch_s`). Peak RSS: "
        "the largest `VmHWM` of the run's processes. Set with `GNNSCALE_MMAP_THRESHOLD=<bytes>`"
        " (0, the default: glibc's dynamic threshold; off: none); `MALLOC_MMAP_THRESHOLD_` or "
        "a `glibc.malloc` tunable, if set, wins.",
    ]
    return [Block(REPO / "benchmarks" / "README.md", "allocator", "\n".join(lines))]


SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about=(
        "s/epoch and peak memory of three recipes under each glibc mmap setting, the default marked"
    ),
    writes="allocator in benchmarks/README.md",
    threads=PER_PROCESS,
)
