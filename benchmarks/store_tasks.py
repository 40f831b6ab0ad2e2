"""The hetero and link recipes trained from a prepared store against the same graph in memory.

Written by ``python benchmarks/figures.py store_tasks`` (the ``from_disk`` block of
hetero_node_classification's and link_prediction_pinsage's READMEs). Each recipe's graph is
prepared once by ``gnnscale prepare --config recipes/<name>/prepare.yaml`` (the draw its
``config.yaml`` makes in memory, same settings), then its ``config.yaml`` fits four ways: in
memory and from the folder, one process and two ranks under ``torchrun``. The link recipe runs
with uniform neighbours throughout (from a folder PinSAGE's walks are not available), and its
split from a folder is streamed once beside it: another draw of the same proportions than the
in-memory ``RandomLinkSplit``'s, so its metrics are compared, not its batches.

Memory is sampled every 0.5 s over the run's process tree (``on_disk.fit``).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import harness
from blocks import Block, Section
from on_disk import fit
from registry import REPO, recipe

MiB = 2**20
TINY_GRAPH = {"num_users": 2000, "num_items": 800, "num_categories": 60, "num_communities": 8}
# Tiny batches: every rank of a 2-process run gets a whole accumulation of 2 an epoch.
TINY_BATCH = {"hetero_node_classification": 64, "link_prediction_pinsage": 256}
TASKS = {  # recipe: (its test metric, flags every run of it takes)
    "hetero_node_classification": ("test/acc", ()),
    "link_prediction_pinsage": ("test/recall@20", ("--data.init_args.neighbors=uniform",)),
}
BASE = ("--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false")


def measure(name: str, tiny: bool, workdir: Path) -> dict:
    """Prepare the recipe's graph, then fit it four ways; every run's figures."""
    folder, config = recipe(name).folder, recipe(name).folder / "config.yaml"
    store = workdir / name
    prepare = [sys.executable, "-m", "gnnscale.cli", "prepare"]
    prepare += ["--config", str(folder / "prepare.yaml"), f"--out={store}"]
    flags = [*BASE, *TASKS[name][1]]
    if tiny:
        prepare += [f"--source.synthetic.{k}={v}" for k, v in TINY_GRAPH.items()]
        flags += [f"--data.init_args.synthetic.{k}={v}" for k, v in TINY_GRAPH.items()]
        flags += ["--trainer.max_epochs=2", f"--data.init_args.batch_size={TINY_BATCH[name]}"]
    start = time.perf_counter()
    harness.run(prepare, cwd=workdir)
    r: dict = {"prepare_s": time.perf_counter() - start}
    r["disk_mib"] = sum(p.stat().st_size for p in store.rglob("*") if p.is_file()) / MiB
    disk = ["--data.init_args.dataset=prepared", f"--data.init_args.root={store}"]
    for ddp in (False, True):
        for where, data in (("memory", []), ("disk", disk)):
            key = f"{where}{'_ddp' if ddp else ''}"
            r[key] = fit(workdir, f"{name}-{key}", data, ddp, config, tuple(flags))
    return r


def _metric(name: str, m: dict) -> str:
    key = TASKS[name][0]
    value = f"{m['metrics'][key][-1]:.3f}"
    if name == "link_prediction_pinsage":
        value += f" ({m['metrics']['test/recall@20_popularity'][-1]:.3f})"
    return value


def block(name: str, tiny: bool, r: dict) -> Block:
    """One recipe README's ``from_disk`` block."""
    header = "test acc" if TASKS[name][0] == "test/acc" else "test recall@20 (popularity's)"
    lines = [
        f"| run | {header} | s/epoch, training | private peak per rank (MiB) | total PSS peak "
        "(MiB) | whole fit (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key, label in (
        ("memory", "in memory, one process"),
        ("disk", "from the folder, one process"),
        ("memory_ddp", "in memory, two ranks"),
        ("disk_ddp", "from the folder, two ranks"),
    ):
        m = r[key]
        private = " / ".join(f"{v:,.0f}" for v in m["private_mb"])
        lines.append(
            f"| {label} | {_metric(name, m)} | {m['epoch_s']:.2f} | {private} | "
            f"{m['pss_mb']:,.0f} | {m['run_s']:.0f} |"
        )
    where = recipe(name).folder.relative_to(REPO)
    extra = " ".join(TASKS[name][1])
    lines += [
        "",
        f"- Prepared once: `gnnscale prepare --config {where}/prepare.yaml`, "
        f"{r['prepare_s']:.0f} s (process start included), {r['disk_mib']:,.0f} MiB on disk.",
        f"- From the folder / in memory, s/epoch: one process "
        f"**{r['disk']['epoch_s'] / r['memory']['epoch_s']:.2f}x**, two ranks "
        f"{r['disk_ddp']['epoch_s'] / r['memory_ddp']['epoch_s']:.2f}x; total PSS, two ranks: "
        f"{r['disk_ddp']['pss_mb'] / r['memory_ddp']['pss_mb']:.2f}x.",
        "",
        f"Runs: `gnnscale fit --config {where}/config.yaml {' '.join(BASE)}"
        f"{' ' + extra if extra else ''}`, as shipped otherwise (one loader worker per process), "
        "with `--data.dataset=prepared --data.root=<the folder>` from the folder; two ranks: "
        "`torchrun --standalone --nproc_per_node=2 -m gnnscale.cli fit ... --trainer.devices=2 "
        "--trainer.strategy=ddp` (gloo; torchrun gives each rank 1 thread). s/epoch: median "
        "after one warm-up epoch (training only). Private: `RssAnon` of each training process, "
        "without its loader worker or mapped files; total PSS: summed over every rank and loader "
        "worker (the mapped files' pages count once in all); both sampled every 0.5 s.",
    ]
    text = "\n".join(lines)
    if tiny:
        text = "**Tiny settings: a check of the pipeline, not figures.**\n\n" + text
    return Block(recipe(name).folder / "README.md", "from_disk", text)


def blocks(tiny: bool) -> list[Block]:
    """The ``from_disk`` block of each recipe (``tiny``: a check of the pipeline)."""
    out = []
    for name in TASKS:
        with tempfile.TemporaryDirectory(prefix="gnnscale-store-tasks-") as tmp:
            out.append(block(name, tiny, measure(name, tiny, Path(tmp))))
    return out


SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about=(
        "the hetero and link recipes from a folder prepared by gnnscale prepare --source "
        "Recommender against the same graph in memory, one process and two ranks (about 15 "
        "minutes)"
    ),
    writes="from_disk in each of those recipes' README",
    threads="1 process with torch's default threads, or 2 ranks with 1 thread each",
    formerly=("store-tasks",),
)
