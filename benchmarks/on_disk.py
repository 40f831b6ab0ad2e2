"""The same graph trained from disk and from memory (the ``on_disk_graph`` recipe's ``memory``).

Written by ``python benchmarks/figures.py on_disk``. The graph is prepared once with ``gnnscale
prepare --source Dataset`` (not the streamed ``Synthetic``), which writes the draw that
``--data.dataset=synthetic`` makes from the same settings; the recipe's config then fits on the
folder and, as a baseline, on that graph built in memory:

1. One process: peak private memory, peak RSS, total PSS and s/epoch.
2. Two ranks under ``torchrun``: each rank's peak private memory and the peak of the PSS summed
   over every rank and loader worker (a page shared by k processes counts 1/k in each).
3. From disk with a cold page cache (the folder's pages evicted just before the run) and a warm
   one.

Memory is sampled every 0.5 s from this process, over the process tree of the run
(``harness.run``).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

import harness
from blocks import Block, Section
from registry import REPO, recipe
from workers import shipped_workers

MiB = 2**20
RECIPE = recipe("on_disk_graph")
GRAPH = {
    "num_nodes": 1_000_000,
    "avg_degree": 15,
    "num_features": 128,
    "num_classes": 47,
    "train_fraction": 0.01,  # 10 batches an epoch: at 0.05, 74 s/epoch here (2 loaded cores)
    "val_fraction": 0.01,
}
# The test split is 94% of the nodes; a few batches of it are enough (accuracy is not the point).
# The test sampled: this block measures training's memory (the recipe's exact test holds every
# node's activations, as its README says).
FIT = [
    "--trainer.accelerator=cpu",
    "--data.init_args.eval.mode=sampled",
    "--trainer.limit_test_batches=4",
]
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
DDP = ["--trainer.devices=2", "--trainer.strategy=ddp"]


def evict_file(path: Path) -> None:
    """Drop a file from the page cache (its clean pages that no process maps; no root)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def evict(folder: Path) -> None:
    """Drop the folder's files from the page cache."""
    for path in folder.iterdir():
        evict_file(path)


def fit(
    workdir: Path,
    name: str,
    data: list[str],
    ddp: bool = False,
    config: Path = RECIPE.folder / "config.yaml",
    flags: tuple[str, ...] = tuple(FIT),
) -> dict:
    """One ``gnnscale fit`` of a recipe in a fresh process (or ``torchrun``); its figures.

    ``config`` and ``flags`` default to this recipe's; the figures include every metric logged.
    """
    save_dir = workdir / "runs" / name
    cli = ["-m", "gnnscale.cli", "fit", "--config", str(config), *flags]
    cli += [f"--trainer.logger.init_args.save_dir={save_dir}", *data, *(DDP if ddp else [])]
    # Under torchrun the ranks are its children: theirs is the private memory, and the PSS is
    # summed over them and their loader workers (torchrun's own left out).
    training = 1 if ddp else 0
    argv = [sys.executable, *(TORCHRUN if ddp else []), *cli]
    done = harness.run(argv, cwd=workdir, logs=save_dir, sample_s=0.5, pss_depth=training)
    assert done.memory is not None
    epoch_s = done.metrics.get("perf/epoch_s", [])
    return {
        "metrics": done.metrics,
        "run_s": done.wall_s,
        "epoch_s": statistics.median(epoch_s[1:] or epoch_s),  # the first epoch is warm-up
        "private_mb": sorted(p.anon_mb for p in done.memory.at_depth(training)),
        "pss_mb": done.memory.pss_mb,
        "rss_mb": done.peak_mb,  # VmHWM of the largest process
    }


def measure(
    graph: dict[str, int | float], epochs: int, workdir: Path, extra: tuple[str, ...] = ()
) -> dict:
    """Prepare the graph, then fit from disk (warm, cold) and in memory, 1 and 2 processes.

    ``extra``: flags for every fit (the tiny size's smaller batches).
    """
    folder = workdir / "graph"
    flags = ["--source=Dataset", *(f"--source.synthetic.{k}={v}" for k, v in graph.items())]
    harness.run([sys.executable, "-m", "gnnscale.cli", "prepare", f"--out={folder}", *flags,
                 "--feature_dtype=bfloat16"], cwd=workdir)  # fmt: skip
    common = [f"--trainer.max_epochs={epochs}", *extra]
    disk = [*common, "--data.init_args.dataset=prepared", f"--data.init_args.root={folder}"]
    memory = [
        *common, "--data.init_args.dataset=synthetic", f"--data.init_args.root={workdir}",
        "--data.init_args.preprocess.feature_dtype=bfloat16",
        *[f"--data.init_args.synthetic.{k}={v}" for k, v in graph.items()],
    ]  # fmt: skip
    r = {"disk_mib": sum(p.stat().st_size for p in folder.iterdir()) / MiB}
    r["warm"] = fit(workdir, "warm", disk)  # prepare has just written (and cached) the files
    evict(folder)
    # Sizes only: the checksum check would read every file back into the cache before epoch 1.
    r["cold"] = fit(workdir, "cold", [*disk, "--data.init_args.verify=size"])
    r["memory"] = fit(workdir, "memory", memory)
    r["ddp_disk"] = fit(workdir, "ddp_disk", disk, ddp=True)
    r["ddp_memory"] = fit(workdir, "ddp_memory", memory, ddp=True)
    return r


def _row(label: str, m: dict, one: bool) -> str:
    private = " / ".join(f"{v:,.0f}" for v in m["private_mb"])
    rss = f" {m['rss_mb']:,.0f} |" if one else ""
    return (
        f"| {label} | {private} |{rss} {m['pss_mb']:,.0f} | {m['epoch_s']:.2f} | {m['run_s']:.0f} |"
    )


def blocks(tiny: bool) -> list[Block]:
    """The recipe README's ``memory`` block (``tiny``: a check of the pipeline, in seconds)."""
    graph, epochs = ({**GRAPH, "num_nodes": 5_000}, 2) if tiny else (GRAPH, 3)
    with tempfile.TemporaryDirectory(prefix="gnnscale-ondisk-") as tmp:
        # tiny: 50 training nodes, 25 a rank; batches of 8 give every rank a whole accumulation
        r = measure(graph, epochs, Path(tmp), ("--data.init_args.batch_size=8",) if tiny else ())
    one, two = r["warm"]["pss_mb"], r["ddp_disk"]["pss_mb"]
    mem_s = r["memory"]["epoch_s"]
    workers = shipped_workers(RECIPE.name)
    settings = " ".join(f"--source.synthetic.{k}={v}" for k, v in graph.items())
    lines = [
        "| one process | private peak (MiB) | peak RSS (MiB) | total PSS peak (MiB) | s/epoch "
        "| whole run (s) |",
        "|---|---:|---:|---:|---:|---:|",
        _row("in memory", r["memory"], True),
        _row("from disk, warm page cache", r["warm"], True),
        _row("from disk, cold page cache", r["cold"], True),
        "",
        "| two ranks (torchrun) | private peak per rank (MiB) | total PSS peak (MiB) | s/epoch "
        "| whole run (s) |",
        "|---|---:|---:|---:|---:|",
        _row("in memory", r["ddp_memory"], False),
        _row("from disk", r["ddp_disk"], False),
        "",
        f"- Total PSS, two ranks / one process: from disk **{two / one:.2f}x** (goal: below "
        f"1.2x), in memory {r['ddp_memory']['pss_mb'] / r['memory']['pss_mb']:.2f}x.",
        f"- s/epoch from disk / in memory: warm page cache **{r['warm']['epoch_s'] / mem_s:.2f}x**"
        f" (goal: within 1.1x), cold {r['cold']['epoch_s'] / mem_s:.2f}x.",
        "",
        f"One graph both ways: `gnnscale prepare --out g --source Dataset {settings} "
        f"--feature_dtype=bfloat16` ({r['disk_mib']:,.0f} MiB on disk; `Dataset`, not the "
        "streamed `Synthetic`, so it is the draw of `--data.dataset=synthetic` with the same "
        "`--data.synthetic.*`). Runs: `gnnscale fit "
        f"--config {RECIPE.folder.relative_to(REPO)}/config.yaml "
        f"{' '.join(FIT)} --trainer.max_epochs={epochs}` ({workers} loader workers per "
        "process, the recipe's) with `--data.dataset=prepared --data.root=g` (from disk) or "
        "`--data.dataset=synthetic` and those settings, `--data.preprocess.feature_dtype=bfloat16`"
        f" (in memory); two ranks: `torchrun {' '.join(TORCHRUN[2:])} -m gnnscale.cli fit ... "
        f"{' '.join(DDP)}` (gloo; torchrun gives each rank 1 thread). Private: `RssAnon` of the "
        "training process (each rank), without its loader workers, mapped files or shared memory. "
        "Total PSS: summed over every rank and loader worker, so the pages of the mapped files "
        "count once in all. Both sampled every 0.5 s; peak RSS is the largest process's "
        "`VmHWM`. s/epoch: median after one warm-up epoch. Cold: every file of the folder "
        "evicted from the page cache (`posix_fadvise(POSIX_FADV_DONTNEED)`) just before the run, "
        "which checks sizes only (`--data.verify=size`: the checksum check would read every file "
        "back into the cache first); the other runs from disk verify every checksum at start-up, "
        "part of their whole-run time.",
    ]
    text = "\n".join(lines)
    if tiny:
        text = "**Tiny settings: a check of the pipeline, not figures.**\n\n" + text
    return [Block(RECIPE.folder / "README.md", "memory", text)]


SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about=(
        "on_disk_graph from its prepared folder against the same graph in memory, one "
        "process and two ranks, warm and cold page cache"
    ),
    writes="memory in on_disk_graph's README",
    threads="1 process with torch's default threads, or 2 ranks with 1 thread each",
    formerly=("ondisk",),
)
