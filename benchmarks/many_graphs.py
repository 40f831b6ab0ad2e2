"""many_graphs_on_disk's figures: the two stores, memory per rank, worker memory, training.

Written by ``python benchmarks/figures.py many_graphs``, which runs this file in a new process; fits
run in further processes (their DDP ranks fork from them):

- ``stores``: LMDB and PyG's SQLiteDatabase, the same graphs: write time, size, graphs/s read
  through the training loader (0 and 2 workers), workers' private memory after epochs 1 and 5.
- ``memory``: each rank's resident and private memory at the end of a short fit, 1 and 2
  ranks, the store on disk against the dataset read into every rank (PyG ``InMemoryDataset``).
- ``training``: the recipe's config with 2 CPU ranks: graphs/s trained, test MAE, and the MAE of
  the edge-blind rule (least squares on atom-type counts) on the same split.

    python benchmarks/many_graphs.py --json --num-graphs 100000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness
import lightning as L
from blocks import Block, Section

from gnnscale._compat import worker_processes
from gnnscale.cli import main
from gnnscale.data.args import GraphSplit, LoaderArgs
from gnnscale.data.many_graphs import AtomGraphs, GraphDataModule, features_only_mae, prepare_graphs
from gnnscale.measure import anon_mb, peak_rss_mb, rss_mb

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "many_graphs_on_disk"


class RankMemory(L.Callback):
    """Write each rank's resident, peak and private (``RssAnon``) memory at the end of training."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Record this process's memory."""
        record = {"rss": rss_mb(), "peak": peak_rss_mb(), "anon": anon_mb()}
        Path(self.out_dir, f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


def _du(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.iterdir()) / 2**20


def stores(workdir: Path, num_graphs: int, epochs: int) -> dict:
    """Write the same graphs to both stores; read them back through the training loader."""
    spec = AtomGraphs(num_graphs=num_graphs)
    out = {}
    for backend in ("lmdb", "sqlite"):
        start = time.perf_counter()
        folder = prepare_graphs(out=workdir / backend, backend=backend, atoms=spec)
        row: dict = {"write_s": time.perf_counter() - start, "mib": _du(folder)}
        for workers in (0, 2):
            args = LoaderArgs(num_workers=workers, persistent_workers=workers > 0)
            dm = GraphDataModule(folder, batch_size=128, loader=args)
            loader = dm.train_dataloader()
            rates, memory = [], {}
            for epoch in range(1, (epochs if workers else 1) + 1):
                loader.sampler.set_epoch(epoch)  # type: ignore[union-attr]
                start, count = time.perf_counter(), 0
                for batch in loader:
                    count += batch.num_graphs
                rates.append(count / (time.perf_counter() - start))
                if workers:
                    batches = loader.batches  # the ResumableLoader's DataLoader
                    pids = [w.pid for w in worker_processes(batches)]
                    memory[epoch] = [anon_mb(pid) for pid in pids]
            row[f"read_{workers}"] = max(rates)
            if workers:
                row["worker_mib"] = memory
            del loader
        out[backend] = row
    return out


def fit(workdir: Path, name: str, args: list[str]) -> dict:
    """One ``gnnscale fit`` of the recipe in a new process; its ranks' memory and metrics."""
    run = workdir / name
    run.mkdir()
    done = harness.run([sys.executable, __file__, "--fit", str(run), *args], logs=run)
    ranks = [json.loads(p.read_text()) for p in sorted(run.glob("rank*.json"))]
    return {"ranks": ranks, "metrics": done.metrics}


def _fit_child(run: str, args: list[str]) -> None:
    main(
        [
            "fit",
            "--config",
            str(RECIPE / "config.yaml"),
            "--trainer.accelerator=cpu",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.logger.init_args.save_dir={run}",
            "--trainer.callbacks+=__main__.RankMemory",
            f"--trainer.callbacks.out_dir={run}",
            *args,
        ]
    )


def measure(num_graphs: int, epochs: int, train_epochs: int, workdir: Path) -> dict:
    """Every figure of the recipe's README, as raw numbers."""
    result: dict = {"num_graphs": num_graphs, "stores": stores(workdir, num_graphs, epochs)}
    # A store 3x larger (LMDB only): per-rank memory must not follow the dataset's size.
    large = prepare_graphs(out=workdir / "lmdb-3x", atoms=AtomGraphs(num_graphs=3 * num_graphs))
    short = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=20",
             "--trainer.limit_val_batches=2", "--trainer.limit_test_batches=2",
             "--data.init_args.loader.num_workers=0",
             "--data.init_args.loader.persistent_workers=false"]  # fmt: skip
    result["memory"] = {
        f"{storage}-{devices}-{size}": fit(
            workdir,
            f"{storage}-{devices}-{size}",
            [
                *short,
                f"--data.init_args.root={folder}",
                f"--trainer.devices={devices}",
                f"--data.init_args.storage={storage}",
            ],
        )["ranks"]
        for size, folder in ((1, workdir / "lmdb"), (3, large))
        for storage in ("disk", "memory")
        for devices in (1, 2)
    }
    trained = fit(
        workdir,
        "train",
        [
            f"--data.init_args.root={workdir / 'lmdb'}",
            f"--trainer.max_epochs={train_epochs}",
            "--data.init_args.loader.num_workers=0",
            "--data.init_args.loader.persistent_workers=false",
        ],  # fmt: skip
    )
    m = trained["metrics"]
    dm = GraphDataModule(workdir / "lmdb", split=GraphSplit(0.02, 0.02))
    train = [dm.store[int(i)] for i in dm.splits["train"][:20000]]
    test = [dm.store[int(i)] for i in dm.splits["test"]]
    result["training"] = {
        "epoch_s": statistics.median(m["perf/epoch_s"]),
        "epochs": train_epochs,
        "graphs_per_epoch": len(dm.splits["train"]),
        "test_mae": m["test/mae"][-1],
        "baseline_mae": features_only_mae(train, test),
        "num_test": len(test),
    }
    return result


def _table(r: dict, tiny: bool) -> list[Block]:
    n, s = r["num_graphs"], r["stores"]
    note = "**Tiny settings: a check of the pipeline, not figures.**\n\n" if tiny else ""
    faster = max(s, key=lambda b: s[b]["read_2"])
    lines = [
        note + f"{n:,} generated graphs (the recipe ships 1,000,000; this size keeps the section "
        "under 10 minutes here), written by `gnnscale prepare-graphs` in chunks of 10,000, read "
        "back through `GraphDataModule`'s training loader (batches of 128, shuffled).",
        "",
        "| store | write (s) | on disk (MiB) | bytes / graph | read, 0 workers (graphs/s) | "
        "read, 2 workers (graphs/s) | worker private memory, epoch 1 → 5 (MiB) | growth |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for backend, row in s.items():
        mem = row["worker_mib"]
        first, last = mem[min(mem)], mem[max(mem)]
        growth = max((b - a) / a for a, b in zip(first, last, strict=True))
        pair = " / ".join(f"{a:.1f} → {b:.1f}" for a, b in zip(first, last, strict=True))
        label = {"lmdb": "LMDB (`lmdb`)", "sqlite": "SQLite (PyG `SQLiteDatabase`)"}[backend]
        lines.append(
            f"| {label} | {row['write_s']:.0f} | {row['mib']:,.0f} | "
            f"{row['mib'] * 2**20 / n:,.0f} | {row['read_0']:,.0f} | {row['read_2']:,.0f} | "
            f"{pair} | {growth:+.1%} |"
        )
    lines += [
        "",
        f"Faster to read with 2 workers here: **{faster}**; with 0 workers: "
        f"**{max(s, key=lambda b: s[b]['read_0'])}**. The default is `backend: lmdb`. Worker "
        "memory: `RssAnon` of each of the 2 persistent workers after the first and the fifth "
        "epoch (goal: growth under 5%).",
    ]
    out = [Block(RECIPE / "README.md", "stores", "\n".join(lines))]

    mem = r["memory"]
    lines = [
        note + f"A short fit (20 batches of 128 graphs per rank, CPU, no loader workers) on the "
        f"{n:,}- and {3 * n:,}-graph stores; each rank's memory at the end of training. `memory`: "
        "`--data.init_args.storage=memory`, every rank reads the whole dataset into a PyG "
        "`InMemoryDataset` first (the usual way).",
        "",
        "| dataset | graphs | ranks | resident per rank (MiB) | private per rank (MiB) | "
        "resident, all ranks (MiB) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key, ranks in mem.items():
        storage, devices, size = key.split("-")
        rss = " / ".join(f"{k['rss']:,.0f}" for k in ranks)
        anon = " / ".join(f"{k['anon']:,.0f}" for k in ranks)
        total = sum(k["rss"] for k in ranks)
        label = "store on disk" if storage == "disk" else "in memory per rank"
        graphs = f"{int(size) * n:,}"
        lines.append(f"| {label} | {graphs} | {devices} | {rss} | {anon} | {total:,.0f} |")

    def rank_mb(key: str) -> float:
        return max(k["rss"] for k in mem[key])

    disk_growth = rank_mb("disk-2-3") / rank_mb("disk-2-1") - 1
    memory_growth = rank_mb("memory-2-3") / rank_mb("memory-2-1") - 1
    extra = sum(k["anon"] for k in mem["memory-2-1"]) - sum(k["anon"] for k in mem["disk-2-1"])
    lines += [
        "",
        f"Three times the graphs: resident memory per rank (2 ranks) {disk_growth:+.0%} with the "
        f"store, {memory_growth:+.0%} with the dataset in every rank. At {n:,} graphs and 2 "
        f"ranks the in-memory dataset costs {extra:,.0f} MiB more private memory in all than the "
        "store.",
    ]
    out.append(Block(RECIPE / "README.md", "memory", "\n".join(lines)))

    t = r["training"]
    lines = [
        note + "| run | graphs trained | s | graphs/s | test MAE | edge-blind MAE | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
        f"| config.yaml, 2 CPU ranks, {t['epochs']} epochs "
        f"| {t['graphs_per_epoch'] * t['epochs']:,} | {t['epoch_s']:.0f} per epoch | "
        f"{t['graphs_per_epoch'] / t['epoch_s']:,.0f} | "
        f"{t['test_mae']:.3f} | {t['baseline_mae']:.3f} | "
        f"{t['baseline_mae'] / t['test_mae']:.1f}x |",
        "",
        f"Test MAE on the {t['num_test']:,} test graphs of the store. Edge-blind: least squares "
        "on each graph's atom-type counts and their pairwise products (fitted on up to 20,000 "
        "training graphs), the best a model that ignores the edges can do with a quadratic in "
        "the counts.",
    ]
    out.append(Block(RECIPE / "README.md", "training", "\n".join(lines)))
    return out


TINY = ["--num-graphs=3000", "--epochs=2", "--train-epochs=1"]
FULL = ["--num-graphs=100000", "--epochs=5", "--train-epochs=3"]


def blocks(tiny: bool) -> list[Block]:
    """The recipe README's blocks (``tiny``: a check of the pipeline, in a minute)."""
    done = harness.run([sys.executable, __file__, "--json", *(TINY if tiny else FULL)])
    return _table(json.loads(done.stdout.strip().splitlines()[-1]), tiny)


def main_cli() -> None:
    """Print the raw figures as JSON; ``--fit RUN ...``: one fit (the ranks fork from it)."""
    if sys.argv[1:2] == ["--fit"]:
        _fit_child(sys.argv[2], sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-graphs", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--train-epochs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gnnscale-graphs-") as tmp:
        r = measure(args.num_graphs, args.epochs, args.train_epochs, Path(tmp))
    print(json.dumps(r))


if __name__ == "__main__":
    main_cli()


SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about=(
        "many_graphs_on_disk: LMDB against SQLite, memory per rank on disk against in "
        "memory, worker memory over epochs, graphs/s and MAE against the edge-blind rule "
        "(about 10 minutes)"
    ),
    writes="stores, memory, training in many_graphs_on_disk's README",
    threads="torch's default threads per process (fits: 1 or 2 ranks)",
    formerly=("graphs",),
)
