"""A graph of ogbn-papers100M's size, larger than this machine's memory, prepared and trained.

Written by ``python benchmarks/figures.py on_disk_large`` (on_disk_graph's ``large`` block): the
recipe's ``prepare.yaml`` at 111M nodes and 1.6B edges (128 bfloat16 features: a 28 GB feature
file, 45 GB in all), timed; then one epoch of the recipe's ``fit`` from the folder, its pages
evicted first (a cold start), while a sampler outside the run records every training process's
private memory (``RssAnon``: not the mapped files' pages). The folder goes to
``$GNNSCALE_LARGE_DIR/gnnscale-large-full`` (default: beside the checkout) and stays there with
the time its prepare took: a rerun reuses it (and reports that time); delete it to re-prepare.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import harness
import psutil
import torch
from blocks import REPO, Block, Section
from on_disk import evict
from registry import recipe
from workers import shipped_workers

from gnnscale.measure import ProcessTreeMemory
from gnnscale.stores.manifest import Manifest

ENTRY = recipe("on_disk_graph")
# ogbn-papers100M: 111,059,956 nodes, 1,615,685,872 edges, 128 features, 172 classes. Its
# training split is 1.1% of the nodes; one epoch here trains on 0.1% (111k seeds), so that a cold
# epoch takes minutes and the section about an hour; validation and test score 2 batches of
# 1,024 seeds each.
GRAPH = {
    "full": {
        "num_nodes": 111_059_956,
        "avg_degree": 14.55,
        "num_classes": 172,
        "train_fraction": 0.001,
        "val_fraction": 0.0002,
    },
    # tiny: 2,500 training nodes, 3 batches: a whole accumulation of 2
    "tiny": {"num_nodes": 50_000, "num_classes": 10, "train_fraction": 0.05, "val_fraction": 0.01},
}
FIT_ARGS = [
    "--data.init_args.verify=size",  # checksums verified once, timed on their own, just before
    "--trainer.max_epochs=1",
    # Cold evaluation batches of 4,096 seeds over a two-hop fan-out took minutes each here.
    "--data.init_args.eval.mode=sampled",  # exact layer-wise: every node's activations in memory
    "--data.init_args.eval.batch_size=1024",
    "--trainer.limit_val_batches=2",
    "--trainer.limit_test_batches=2",
    "--trainer.enable_progress_bar=false",
]


def trainer_and_worker(memory: ProcessTreeMemory) -> tuple[float, float]:
    """Peak private memory (MiB) of a run's trainer (its root) and of its largest other process.

    0 for a process it did not see.
    """
    trainer = memory.processes.get(memory.root)
    others = [p.anon_mb for p in memory.processes.values() if p.pid != memory.root]
    return trainer.anon_mb if trainer else 0.0, max(others, default=0.0)


def prepare_graph(folder: Path, size: str) -> float:
    """Prepare the graph into ``folder`` unless an earlier run did; its prepare time in s."""
    record = folder.parent / f"{folder.name}.prepare_s"
    if folder.exists() and record.exists():
        return float(record.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    graph = [f"--source.synthetic.{k}={v}" for k, v in GRAPH[size].items()]
    seconds = harness.run(ENTRY.prepare_argv(f"--out={folder}", *graph)).wall_s
    record.write_text(f"{seconds:.1f}")
    return seconds


GATHER = """
import mmap, sys, time
import numpy as np, torch
path, rows, advice, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
with open(path, "rb") as f:
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
if advice == "random":
    m.madvise(mmap.MADV_RANDOM)
x = torch.from_numpy(np.frombuffer(m, dtype=np.uint8).reshape(rows, -1))
idx = torch.randint(0, rows, (n,), generator=torch.Generator().manual_seed(0))
start = time.perf_counter()
x[idx]
print(n / (time.perf_counter() - start))
"""


def gather_rate(folder: Path, advice: str, rows: int = 20_000) -> float:
    """Feature rows per second gathered at random from the evicted ``x.bin``, in a fresh process.

    ``advice``: ``normal`` (the kernel's readahead) or ``random`` (``MADV_RANDOM``, as
    ``PreparedGraph`` maps it).
    """
    evict(folder)
    num_nodes = Manifest.read(folder).files["x"].shape[0]
    argv = [sys.executable, "-c", GATHER, str(folder / "x.bin"), str(num_nodes), advice]
    return float(harness.run([*argv, str(rows)]).stdout)


def large_workdir() -> Path:
    """Where the full-size graph is kept (``$GNNSCALE_LARGE_DIR``), its earlier runs removed."""
    base = Path(os.environ.get("GNNSCALE_LARGE_DIR", REPO.parent))
    workdir = base / "gnnscale-large-full"
    need = 0 if (workdir / "graph").exists() else 50 * 2**30  # a kept graph is reused
    if shutil.disk_usage(base).free < need:
        raise RuntimeError(f"{base} has under 50 GiB free; set GNNSCALE_LARGE_DIR to a larger disk")
    workdir.mkdir(exist_ok=True)
    shutil.rmtree(workdir / "runs", ignore_errors=True)
    return workdir


def measure(size: str, workdir: Path) -> dict[str, float]:
    """Prepare (or reuse), evict, fit one epoch; return the figures."""
    folder = workdir / "graph"
    prepare_s = prepare_graph(folder, size)
    disk = sum(p.stat().st_size for p in folder.iterdir())
    gather = {advice: gather_rate(folder, advice) for advice in ("normal", "random")}
    evict(folder)
    verify = f"from gnnscale.stores.prepared import PreparedGraph; PreparedGraph({str(folder)!r})"
    verify_s = harness.run([sys.executable, "-c", verify]).wall_s
    evict(folder)
    save_dir = workdir / "runs"
    argv = ENTRY.argv(
        "fit",
        f"--data.init_args.root={folder}",
        f"--trainer.logger.init_args.save_dir={save_dir}",
        *FIT_ARGS,
    )
    done = harness.run(argv, cwd=workdir, logs=save_dir, sample_s=0.5)
    assert done.memory is not None
    metrics = done.metrics
    trainer, worker = trainer_and_worker(done.memory)
    return {
        "prepare_s": prepare_s,
        "verify_s": verify_s,
        "disk_gib": disk / 2**30,
        "x_gib": (folder / "x.bin").stat().st_size / 2**30,
        "fit_s": done.wall_s,
        "epoch_s": statistics.median(metrics["perf/epoch_s"]),
        "val_acc": metrics["val/acc"][-1],
        "test_acc": metrics["test/acc"][-1],
        "private_mb": trainer,
        "worker_mb": worker,
        "processes": len(done.memory.processes),
        "ram_gib": psutil.virtual_memory().total / 2**30,
        "gather_normal": gather["normal"],
        "gather_random": gather["random"],
    }


def blocks(tiny: bool) -> list[Block]:
    """The recipe README's ``large`` block (``tiny``: a 50k-node check of the pipeline)."""
    if tiny:  # nothing kept
        with tempfile.TemporaryDirectory() as workdir:
            r = measure("tiny", Path(workdir))
    else:
        r = measure("full", large_workdir())
    size = "tiny" if tiny else "full"
    g = GRAPH[size]
    settings = ", ".join(f"`--source.synthetic.{k}={v}`" for k, v in g.items())
    text = "\n".join(
        [
            "| figure | value |",
            "|---|---:|",
            f"| nodes / edges (average in-degree) | {g['num_nodes']:,} / "
            f"{g.get('avg_degree', 15)} per node |",
            f"| feature file (bfloat16, 128 per node) | {r['x_gib']:.1f} GiB |",
            f"| disk used, all files | {r['disk_gib']:.1f} GiB |",
            f"| this machine's memory | {r['ram_gib']:.1f} GiB |",
            f"| `gnnscale prepare` (streamed, checksummed; kept for reruns) | "
            f"{r['prepare_s']:,.0f} s |",
            f"| checksums of every file verified (cold, one process) | {r['verify_s']:,.0f} s |",
            f"| `gnnscale fit`, whole run (1 epoch, val, test) | {r['fit_s']:,.0f} s |",
            f"| s/epoch (cold page cache) | {r['epoch_s']:,.1f} |",
            "| cold random feature rows per second: readahead (kernel default) / "
            f"`MADV_RANDOM` (as mapped) | {r['gather_normal']:,.0f} / "
            f"{r['gather_random']:,.0f} ({r['gather_random'] / r['gather_normal']:.1f}x) |",
            f"| peak private memory, trainer / largest loader worker | {r['private_mb']:,.0f} / "
            f"{r['worker_mb']:,.0f} MiB |",
            "| val acc / test acc (2 batches of 1,024 seeds each) | "
            f"{r['val_acc']:.3f} / {r['test_acc']:.3f} |",
            "",
            "`gnnscale prepare --config recipes/on_disk_graph/prepare.yaml` with "
            f"{settings}; then `gnnscale fit --config recipes/on_disk_graph/config.yaml` with "
            + ", ".join(f"`{a}`" for a in FIT_ARGS)
            + ", the folder's pages evicted first (`posix_fadvise(DONTNEED)`), before the "
            "verification and again before the fit. Private memory: "
            "`RssAnon` of each process, sampled every 0.5 s from outside the run; the mapped "
            "files' pages are the page cache's, not the process's.",
        ]
    )
    if tiny:
        text = "**Tiny settings: a check of the pipeline, not figures.**\n\n" + text
    return [Block(ENTRY.folder / "README.md", "large", text)]


if __name__ == "__main__":
    print(blocks(tiny="--tiny" in sys.argv)[0].text)


SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about=(
        "a graph of ogbn-papers100M's size, larger than memory, prepared and trained for one"
        " epoch (about an hour, 50 GiB of disk)"
    ),
    writes="large in on_disk_graph's README",
    threads=f"{torch.get_num_threads()} torch threads, {shipped_workers('on_disk_graph')} loader "
    "workers (the recipe's)",
    on_request=True,
    formerly=("ondisk-large",),
)
