"""The recipes on one GPU: what a user waits for, and the planner's CUDA peak against the fit's.

Written by ``python benchmarks/figures.py gpu`` (the ``gpu`` block of benchmarks/README.md) on a
machine with CUDA; without one it writes nothing. This section has not yet run on a GPU: its
first run is its test. For each recipe below, ``gnnscale plan`` and then ``gnnscale fit`` run
in fresh processes with ``--trainer.accelerator=gpu --trainer.devices=1`` (and the recipe's
``figure_args``), each config otherwise as shipped (bf16 autocast; the loader workers of the
config sample on the host). Meant to take under 10 minutes on one H100.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import harness
import torch
from blocks import Block, Section
from harness import number
from registry import REPO, recipe

from gnnscale.measure import read_metrics
from recipes import HEADER, measure, validation_per_epoch

RECIPES = (
    "neighbor_sage",
    "cluster_gcn",
    "graphsaint",
    "hetero_node_classification",
    "link_prediction_pinsage",
)
GPU = ["--trainer.accelerator=gpu", "--trainer.devices=1"]


def _row(name: str, tiny: bool, workdir: Path) -> str:
    entry = recipe(name)
    extra = [*GPU, *(entry.tiny if tiny else entry.figure_args)]
    args = [f"--data.init_args.root={workdir / 'data'}", *extra]
    report = harness.run(entry.argv("plan", *args, "--num_batches=3"), cwd=workdir).output
    planned = number("expected CUDA peak", report)
    result = measure(entry, extra, workdir, False, 0, tiny)
    cuda = max(
        v
        for p in result.save_dir.rglob("metrics.csv")
        for v in read_metrics(p)["perf/peak_cuda_mb"]
    )
    metric = f"{result.acc:.3f}" + (f" ({result.baseline:.3f})" if result.baseline else "")
    val = "– | –"
    if result.val_runs:
        per_epoch, share = validation_per_epoch(result)
        val = f"{per_epoch:.2f} | {share:.0%}"
    return (
        f"| {name} | {metric} | {result.epoch_s:.2f} | {val} | {result.fit_s:,.0f} | "
        f"{cuda:,.0f} | {planned:,.0f} ({planned / cuda:.2f}x) | {result.peak_mb:,.0f} |"
    )


def blocks(tiny: bool) -> list[Block]:
    """benchmarks/README.md's ``gpu`` block; none without a CUDA device."""
    if not torch.cuda.is_available():
        print("gpu: no CUDA device here; nothing measured, nothing written", flush=True)
        return []
    device = torch.cuda.get_device_name(0)
    lines = [
        "| recipe | test metric | s/epoch, training | s/epoch, validation | validation share | "
        "whole fit (s) | CUDA peak, allocated (MiB) | planned CUDA peak (MiB) | host peak RSS "
        "(MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(prefix="gnnscale-gpu-") as tmp:
        for name in RECIPES:
            lines.append(_row(name, tiny, Path(tmp)))
            print(lines[-1], flush=True)
    headers = {HEADER[recipe(n).task] for n in RECIPES}
    lines += [
        "",
        f"On {device}. Each recipe's config.yaml with `{' '.join(GPU)}`"
        + (" and its tiny settings" if tiny else "")
        + f"; test metric: {', '.join(sorted(headers))} (link: popularity's in brackets). "
        "s/epoch, training: median after one warm-up epoch; s/epoch, validation: every "
        "validation's seconds over the epochs trained, and its share of an epoch; whole fit: "
        "the `fit` command's wall time. CUDA peak: "
        "`torch.cuda.max_memory_allocated` over the fit (`perf/peak_cuda_mb`); planned: "
        "`gnnscale plan --num_batches=3` on the same settings, before the fit (goal: within "
        "25%). Host peak RSS: the largest process's `VmHWM`.",
    ]
    return [Block(REPO / "benchmarks" / "README.md", "gpu", "\n".join(lines))]


SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about=(
        "the sampler, hetero and link recipes on one GPU, and the planner's CUDA peak "
        "against the fit's (under 10 minutes on one H100; without CUDA it measures and "
        "writes nothing)"
    ),
    writes="gpu in benchmarks/README.md",
    threads=f"one GPU; {torch.get_num_threads()} torch threads on the host",
)
