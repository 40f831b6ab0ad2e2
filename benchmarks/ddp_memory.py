"""Per-process memory under DDP, and accuracy reduced across ranks (multi_gpu_ddp's ``memory``).

Written by ``python benchmarks/figures.py ddp_memory``, which runs this file in a new process
(its DDP ranks fork from it): the recipe's config with 2 CPU processes, recording in every rank
how much of its resident memory is its own (USS) and how much it shares with the others, next to
the size of the graph the launching process built. Then the best checkpoint is tested again in
one process: the DDP test accuracy, reduced from per-rank counts, should match it.

    python benchmarks/ddp_memory.py --num-nodes 20000 --json [CLI overrides]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import harness
import lightning as L
import psutil
from blocks import Block, Section

from gnnscale.cli import main
from gnnscale.measure import read_metrics

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "multi_gpu_ddp"
CONFIG = RECIPE / "config.yaml"


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
    return read_metrics(run_dir).get(key, [])


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
        "ddp_test_acc": _column(ddp_dir / "multi_gpu_ddp" / "version_0", "test/acc")[-1],
        "single_test_acc": _column(single_dir, "test/acc")[-1],
        "launcher_pid": os.getpid(),
    }


def main_cli() -> None:
    """Print the raw figures as JSON (the ranks fork from this process)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-nodes", type=int, default=200_000)
    parser.add_argument("--max-epochs", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    args, cli_overrides = parser.parse_known_args()  # the rest goes to `gnnscale fit`/`test`
    with tempfile.TemporaryDirectory() as tmp:
        r = measure(args.num_nodes, args.max_epochs, Path(tmp), cli_overrides)
    print(json.dumps(r))


TINY = ["--num-nodes=3000", "--max-epochs=2", "--data.init_args.batch_size=128"]


def blocks(tiny: bool) -> list[Block]:
    """The recipe README's ``memory`` block (``tiny``: a check of the pipeline, in seconds)."""
    argv = ["--num-nodes=200000", "--max-epochs=3"] if not tiny else TINY
    done = harness.run([sys.executable, __file__, "--json", *argv])
    r = json.loads(done.stdout.strip().splitlines()[-1])
    nodes = argv[0].split("=")[1]
    lines = [
        f"2 processes on CPU (fork, gloo), {int(nodes):,}-node graph, "
        f"{argv[1].split('=')[1]} epochs. The graph, built once in the launching process, holds "
        f"{r['graph_mib']:,.0f} MiB of tensors. Memory of each rank at the end of training:",
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
    if tiny:
        text = "**Tiny settings: a check of the pipeline, not figures.**\n\n" + text
    return [Block(RECIPE / "README.md", "memory", text)]


if __name__ == "__main__":
    main_cli()


SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about="each DDP rank's resident, unique and shared memory; accuracy reduced across ranks",
    writes="memory in multi_gpu_ddp's README",
    threads="2 processes, torch's default threads each",
    formerly=("ddp",),
)
