"""Regenerate the multi_gpu_ddp README figures: per-process memory under DDP, and accuracy.

Runs the recipe's config in-process with 2 CPU processes (fork) and records, in every rank, how
much of its resident memory is its own (USS) and how much it shares with the others, next to
the size of the graph the launching process built. Then tests the best checkpoint again in one
process: the DDP test accuracy, reduced from per-rank counts, must match it.

    python recipes/multi_gpu_ddp/measure.py --readme              # 200k nodes, ~5 min on 2 cores
    python recipes/multi_gpu_ddp/measure.py --num-nodes 20000     # quick
    python recipes/multi_gpu_ddp/measure.py --json --data.init_args.batch_size=128   # CLI overrides
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import tempfile
from pathlib import Path

import lightning as L
import psutil

from gnnscale.cli import main

CONFIG = Path(__file__).with_name("config.yaml")


class RankMemory(L.Callback):
    """Write each rank's resident, unique (USS) and shared memory at the end of training."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Record this process's memory."""
        info = psutil.Process().memory_full_info()
        record = {"rank": trainer.global_rank, "rss": info.rss, "uss": info.uss, "pss": info.pss}
        Path(self.out_dir, f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


def _column(run_dir: Path, key: str) -> list[float]:
    (path,) = run_dir.rglob("metrics.csv")
    return [float(r[key]) for r in csv.DictReader(path.open()) if r.get(key)]


def measure(num_nodes: int, max_epochs: int, workdir: Path, extra: list[str]) -> dict:
    """Fit with 2 processes, then test the best checkpoint in 1; return the figures."""
    common = [
        "--config", str(CONFIG), "--trainer.accelerator=cpu", f"--data.init_args.root={workdir}",
        f"--data.init_args.synthetic.num_nodes={num_nodes}", "--trainer.enable_progress_bar=false",
        *extra,
    ]  # fmt: skip
    ddp_dir, single_dir = workdir / "ddp", workdir / "single"
    cli = main(
        [
            "fit", *common, f"--trainer.max_epochs={max_epochs}",
            f"--trainer.logger.init_args.save_dir={ddp_dir}",
            "--trainer.callbacks+=__main__.RankMemory" if __name__ == "__main__" else
            f"--trainer.callbacks+={__name__}.RankMemory",
            f"--trainer.callbacks.out_dir={workdir}",
        ]
    )  # fmt: skip
    graph = cli.datamodule.data
    graph_bytes = sum(v.numel() * v.element_size() for _, v in graph if hasattr(v, "numel"))
    ranks = [json.loads(p.read_text()) for p in sorted(workdir.glob("rank*.json"))]
    ckpt = cli.trainer.checkpoint_callback.best_model_path
    main(
        [
            "test", *common, "--trainer.devices=1", "--trainer.strategy=auto",
            f"--trainer.logger.init_args.save_dir={single_dir}", f"--ckpt_path={ckpt}",
        ]
    )  # fmt: skip
    return {
        "graph_mib": graph_bytes / 2**20,
        "ranks": ranks,
        "train_loss": _column(ddp_dir / "multi_gpu_ddp" / "version_0", "train/loss_epoch"),
        "ddp_test_acc": _column(ddp_dir / "multi_gpu_ddp" / "version_1", "test/acc")[-1],
        "single_test_acc": _column(single_dir, "test/acc")[-1],
        "launcher_pid": os.getpid(),
    }


def main_cli() -> None:
    """Print the README table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-nodes", type=int, default=200_000)
    parser.add_argument("--max-epochs", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    parser.add_argument("--readme", action="store_true", help="write the table into README.md")
    args, cli_overrides = parser.parse_known_args()  # the rest goes to `gnnscale fit`/`test`
    with tempfile.TemporaryDirectory() as tmp:
        r = measure(args.num_nodes, args.max_epochs, Path(tmp), cli_overrides)
    if args.json:
        print(json.dumps(r))
        return
    lines = [
        f"Measured by `python recipes/multi_gpu_ddp/measure.py --num-nodes {args.num_nodes}` "
        f"(2 processes on CPU, fork, gloo; {os.cpu_count()} cores). The graph, built once in "
        f"the launching process, holds {r['graph_mib']:,.0f} MiB of tensors.",
        "",
        "| rank | resident (MiB) | unique to the process, USS (MiB) | shared (MiB) |",
        "|---:|---:|---:|---:|",
    ]
    for k in r["ranks"]:
        shared = (k["rss"] - k["uss"]) / 2**20
        lines.append(
            f"| {k['rank']} | {k['rss'] / 2**20:,.0f} | {k['uss'] / 2**20:,.0f} | {shared:,.0f} |"
        )
    lines += [
        "",
        f"Test accuracy with 2 processes (reduced from counts): {r['ddp_test_acc']:.4f}; the same "
        f"checkpoint tested in 1 process: {r['single_test_acc']:.4f}.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.readme:
        readme = Path(__file__).with_name("README.md")
        begin, end = "<!-- results:begin -->", "<!-- results:end -->"
        content = readme.read_text()
        head, rest = content.split(begin)
        readme.write_text(f"{head}{begin}\n{text}\n{end}{rest.split(end)[1]}")


if __name__ == "__main__":
    main_cli()
