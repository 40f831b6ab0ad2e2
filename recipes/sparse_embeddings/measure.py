"""Regenerate the figures of this recipe's README.

    python recipes/sparse_embeddings/measure.py             # both parts, CPU (about 7 minutes)
    python recipes/sparse_embeddings/measure.py --rows 200000 2000000  # the README's figures

``recipe``: the CPU-tiny command of the README, ``--runs`` seeds, through train.py and its
config; prints test accuracy (mean ± std), median s/epoch and peak RSS from the metrics CSV.
``bench``: for each ``--rows``, one graph with that many nodes; trains ``--steps``
micro-batches of the recipe's model with a sparse table + SparseAdam, then a dense table + Adam;
prints peak memory during training and the median time of one training step (forward, backward,
both optimizer steps).
"""

import argparse
import csv
import gc
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import lightning as L
import torch
from train import EmbeddingSAGE

from gnnscale import EvalArgs, NeighborDataModule, SyntheticGraph

HERE = Path(__file__).resolve().parent
CPU_TINY = [
    "--trainer.accelerator=cpu",
    "--trainer.precision=32",
    "--trainer.max_epochs=5",
    "--data.synthetic.num_nodes=20000",
    "--data.batch_size=512",
    "--data.loader.num_workers=0",
    "--data.loader.persistent_workers=false",
]


def _mib(num_bytes: float) -> float:
    return num_bytes / 2**20


def _proc_status(key: str) -> float:
    """VmRSS or VmHWM of this process in bytes (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return float(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # Linux: VmHWM := VmRSS


class StepTimer(L.Callback):
    """Wall time of each training step, data loading excluded."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def _sync(self, pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._sync(pl_module)
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._sync(pl_module)
        self.seconds.append(time.perf_counter() - self._start)


def bench_one(dm: NeighborDataModule, variant: str, args: argparse.Namespace) -> dict[str, float]:
    sparse = variant.startswith("sparse")
    model = EmbeddingSAGE(
        in_channels=1,
        num_classes=dm.num_classes,
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
    _reset_peak_rss()
    rss0 = _proc_status("VmRSS")
    trainer.fit(model, datamodule=dm)
    table = model.embedding.weight
    (opt,) = [o for o in trainer.optimizers if any(p is table for p in o.param_groups[0]["params"])]
    state = sum(t.nbytes for t in opt.state[table].values() if torch.is_tensor(t))
    result = {
        "step_ms": 1000 * statistics.median(timer.seconds[args.warmup :]),
        "train_rss_mib": _mib(_proc_status("VmHWM") - rss0),
        "peak_rss_mib": _mib(_proc_status("VmHWM")),
        "state_mib": _mib(table.nbytes + state),
    }
    if cuda:
        result["peak_cuda_mib"] = _mib(torch.cuda.max_memory_allocated())
    dm.trainer = None  # the DataModule would keep this run's model and optimizers alive
    return result


def bench(args: argparse.Namespace, rows: int) -> None:
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
    print(
        f"\n{rows:,} x {args.dim} table ({_mib(rows * args.dim * 4):,.0f} MiB fp32), "
        f"{device}, {torch.get_num_threads()} threads, median of {args.steps - args.warmup} steps "
        f"of 1024 seeds, fan-out [10, 10], precision {args.precision}\n"
    )
    cuda = " peak CUDA (MiB) |" if args.accelerator == "cuda" else ""
    print(
        "| table + optimizer | step (ms) | peak RSS in training (MiB) | RSS growth in training "
        f"(MiB) |{cuda} table + optimizer state (MiB) |"
    )
    print("|---|---|---|---|" + ("---|" if cuda else "") + "---|")
    for variant, r in results.items():
        name = {"sparse": "sparse + SparseAdam", "dense": "dense + Adam"}.get(variant, variant)
        cuda_cell = f" {r['peak_cuda_mib']:,.0f} |" if cuda else ""
        print(
            f"| {name} | {r['step_ms']:,.1f} | {r['peak_rss_mib']:,.0f} | "
            f"{r['train_rss_mib']:,.0f} |{cuda_cell} {r['state_mib']:,.0f} |"
        )
    s, d = results["sparse"], results["dense"]
    print(
        f"\ndense / sparse: step time x{d['step_ms'] / s['step_ms']:.1f}, RSS growth in training "
        f"x{d['train_rss_mib'] / s['train_rss_mib']:.2f}"
        + (f", peak CUDA x{d['peak_cuda_mib'] / s['peak_cuda_mib']:.2f}" if cuda else "")
    )


def recipe(args: argparse.Namespace) -> None:
    accs, epoch_s, rss = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.runs):
            save_dir = Path(tmp) / f"seed{seed}"
            cmd = [
                sys.executable,
                str(HERE / "train.py"),
                "fit",
                f"--config={HERE / 'config.yaml'}",
                *CPU_TINY,
                f"--seed_everything={seed}",
                f"--data.root={tmp}",
                f"--trainer.logger.init_args.save_dir={save_dir}",
                f"--trainer.default_root_dir={save_dir}",
                "--trainer.enable_progress_bar=false",
            ]
            subprocess.run(cmd, check=True, capture_output=True)
            (path,) = save_dir.rglob("metrics.csv")
            with path.open() as f:
                rows = list(csv.DictReader(f))
            accs += [float(r["test/acc"]) for r in rows if r.get("test/acc")]
            times = [float(r["perf/epoch_s"]) for r in rows if r.get("perf/epoch_s")]
            epoch_s.append(statistics.median(times[1:]))  # the first epoch is warm-up
            rss.append(max(float(r["perf/peak_rss_mb"]) for r in rows if r.get("perf/peak_rss_mb")))
    print(f"\nCPU-tiny recipe run, {args.runs} seeds, CPU, {torch.get_num_threads()} threads:")
    print("  python recipes/sparse_embeddings/train.py fit \\")
    print("    --config recipes/sparse_embeddings/config.yaml " + " ".join(CPU_TINY) + "\n")
    print("| test acc (mean ± std) | s/epoch (median) | peak RSS (MiB) |")
    print("|---|---|---|")
    std = statistics.stdev(accs) if len(accs) > 1 else 0.0
    print(
        f"| {statistics.mean(accs):.3f} ± {std:.3f} | {statistics.median(epoch_s):.2f} | "
        f"{max(rss):,.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["all", "recipe", "bench"], default="all")
    parser.add_argument("--runs", type=int, default=3, help="seeds of the recipe run")
    parser.add_argument(
        "--rows", type=int, nargs="+", default=[2_000_000], help="table rows (graph nodes)"
    )
    parser.add_argument("--dim", type=int, default=64, help="embedding width")
    parser.add_argument("--steps", type=int, default=15, help="training steps per variant")
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the median")
    parser.add_argument("--accelerator", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", default="32", help="32 on CPU; bf16-mixed on a GPU")
    args = parser.parse_args()
    if args.part in ("all", "recipe"):
        recipe(args)
    if args.part in ("all", "bench"):
        for rows in args.rows:
            bench(args, rows)


if __name__ == "__main__":
    main()
