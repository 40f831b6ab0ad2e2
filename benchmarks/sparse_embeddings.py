"""Sparse against dense embedding tables: step time and memory (the recipe README's ``memory``).

Written by ``python benchmarks/figures.py sparse_embeddings``. For each table size, one graph
with that many nodes; trains ``steps`` micro-batches of the recipe's model
(``gnnscale.EmbeddingSAGE``) with a sparse table + SparseAdam, then a dense table + Adam, and
reports the peak memory during training and the median time of one training step (forward,
backward, both optimizer steps).
"""

import argparse
import gc
import statistics
import time
from functools import partial
from pathlib import Path

import lightning as L
import torch
from blocks import Block, Section

from gnnscale import EmbeddingSAGE, EvalArgs, NeighborDataModule, SyntheticGraph
from gnnscale.measure import peak_rss_mb, reset_peak_rss, rss_mb

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "sparse_embeddings"


class StepTimer(L.Callback):
    """Wall time of each training step, data loading excluded."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def _sync(self, pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        """Start the step clock."""
        self._sync(pl_module)
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """Record the step's seconds."""
        self._sync(pl_module)
        self.seconds.append(time.perf_counter() - self._start)


def _mib(num_bytes: float) -> float:
    return num_bytes / 2**20


def bench_one(dm: NeighborDataModule, variant: str, args: argparse.Namespace) -> dict[str, float]:
    """Train ``args.steps`` micro-batches with one table variant; its step time and memory."""
    sparse = variant.startswith("sparse")
    model = EmbeddingSAGE(
        in_channels=1,
        num_classes=dm.num_classes,
        num_nodes=dm.num_nodes,
        embedding_dim=args.dim,
        sparse=sparse,
        embedding_device="cpu" if variant == "sparse, table on CPU" else "model",
        embedding_optimizer=partial(
            torch.optim.SparseAdam if sparse else torch.optim.Adam, lr=0.01
        ),
        hidden_channels=128,
        dropout=0.2,
        optimizer=partial(torch.optim.Adam, lr=0.003),
    )
    timer = StepTimer()
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=1,
        precision=args.precision,
        max_epochs=1,
        limit_train_batches=args.steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
    )
    gc.collect()
    cuda = args.accelerator == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    reset_peak_rss()
    rss0 = rss_mb()
    trainer.fit(model, datamodule=dm)
    table = model.embedding.weight
    (opt,) = [o for o in trainer.optimizers if any(p is table for p in o.param_groups[0]["params"])]
    state = sum(t.nbytes for t in opt.state[table].values() if torch.is_tensor(t))
    result = {
        "step_ms": 1000 * statistics.median(timer.seconds[args.warmup :]),
        "train_rss_mib": peak_rss_mb() - rss0,
        "peak_rss_mib": peak_rss_mb(),
        "state_mib": _mib(table.nbytes + state),
    }
    if cuda:
        result["peak_cuda_mib"] = _mib(torch.cuda.max_memory_allocated())
    dm.trainer = None  # the DataModule would keep this run's model and optimizers alive
    return result


def bench(args: argparse.Namespace, rows: int) -> list[str]:
    """Markdown lines: sparse against dense (and, on a GPU, a CPU-resident table) at ``rows``."""
    dm = NeighborDataModule(
        dataset="synthetic",
        num_neighbors=[10, 10],
        batch_size=1024,
        synthetic=SyntheticGraph(
            num_nodes=rows, avg_degree=10, num_features=1, homophily=0.9, train_fraction=0.3
        ),
        eval=EvalArgs(mode="sampled"),
    )
    _ = dm.data  # generate the graph once, outside the measured window
    variants = ["sparse", "dense"] + (
        ["sparse, table on CPU"] if args.accelerator == "cuda" else []
    )
    results = {}
    for variant in variants:
        L.seed_everything(0, verbose=False)
        results[variant] = bench_one(dm, variant, args)
    device = torch.cuda.get_device_name() if args.accelerator == "cuda" else "CPU"
    cuda = " peak CUDA (MiB) |" if args.accelerator == "cuda" else ""
    lines = [
        f"{rows:,} × {args.dim} table ({_mib(rows * args.dim * 4):,.0f} MiB fp32), {device}, "
        f"{torch.get_num_threads()} threads, median of {args.steps - args.warmup} steps of 1024 "
        f"seeds, fan-out [10, 10], precision {args.precision}:",
        "",
        "| table + optimizer | step (ms) | peak RSS in training (MiB) | RSS growth in training "
        f"(MiB) |{cuda} table + optimizer state (MiB) |",
        "|---|---:|---:|---:|" + ("---:|" if cuda else "") + "---:|",
    ]
    for variant, r in results.items():
        name = {"sparse": "sparse + SparseAdam", "dense": "dense + Adam"}.get(variant, variant)
        cuda_cell = f" {r['peak_cuda_mib']:,.0f} |" if cuda else ""
        lines.append(
            f"| {name} | {r['step_ms']:,.1f} | {r['peak_rss_mib']:,.0f} | "
            f"{r['train_rss_mib']:,.0f} |{cuda_cell} {r['state_mib']:,.0f} |"
        )
    s, d = results["sparse"], results["dense"]
    lines += [
        "",
        f"Dense / sparse: step time ×{d['step_ms'] / s['step_ms']:.1f}, RSS growth in training "
        f"×{d['train_rss_mib'] / s['train_rss_mib']:.2f}"
        + (f", peak CUDA ×{d['peak_cuda_mib'] / s['peak_cuda_mib']:.2f}" if cuda else "")
        + ".",
        "",
    ]
    return lines


def main(argv: list[str] | None = None) -> str:
    """Measure every ``--rows`` size; return the markdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows", type=int, nargs="+", default=[200_000, 2_000_000], help="table rows (nodes)"
    )
    parser.add_argument("--dim", type=int, default=64, help="embedding width")
    parser.add_argument("--steps", type=int, default=15, help="training steps per variant")
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the median")
    parser.add_argument("--accelerator", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", default="32", help="32 on CPU; bf16-mixed on a GPU")
    args = parser.parse_args(argv)
    return "\n".join(line for rows in args.rows for line in bench(args, rows))


TINY = ["--rows", "5000", "--steps", "4", "--warmup", "1"]


def blocks(tiny: bool) -> list[Block]:
    """The recipe README's ``memory`` block (``tiny``: a check of the pipeline, in seconds)."""
    text = main(TINY if tiny else [])
    if tiny:
        text = "**Tiny settings: a check of the pipeline, not figures.**\n\n" + text
    return [Block(RECIPE / "README.md", "memory", text)]


if __name__ == "__main__":
    print(main())


SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about=(
        "a sparse embedding table with SparseAdam against a dense one with Adam: step time "
        "and memory"
    ),
    writes="memory in sparse_embeddings' README",
    threads=f"{torch.get_num_threads()} torch threads",
    formerly=("sparse",),
)
