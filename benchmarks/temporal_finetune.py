"""Fine-tuning on each new interval against retraining from scratch, on temporal_links' job.

Written by ``python benchmarks/figures.py temporal_finetune`` (temporal_links' ``finetune``
block). The recipe's stream arrives in three parts: a model is trained on the questions of its
first half, then two intervals follow (50-60% and 60-70% of the interactions). After each, one
run fine-tunes the last model on the new interval's questions alone (``gnnscale fit
--weights_from``, one epoch, ``--data.split.train_from``/``train_until``), and another
retrains from scratch on every question so far (the recipe's three epochs). Every model samples
its messages from every interaction before each question and is tested on the stream's last 15%
(the recipe's test split). Each run is a fresh process; seeds alternate the two.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

import harness
from blocks import PER_PROCESS, Block, Section
from registry import recipe

ENTRY = recipe("temporal_links")
BASE, INTERVALS = 0.5, ((0.5, 0.6), (0.6, 0.7))


def fit(workdir: Path, name: str, args: list[str], tiny: bool) -> dict[str, float | str]:
    """One fit of the recipe in a fresh process: test MRR, wall, training s, best checkpoint."""
    save_dir = workdir / name
    argv = ENTRY.argv(
        "fit",
        f"--trainer.logger.init_args.save_dir={save_dir}",
        f"--trainer.default_root_dir={save_dir}",
        "--trainer.enable_progress_bar=false",
        *(ENTRY.tiny if tiny else ()),
        *args,
    )
    done = harness.run(argv, cwd=workdir, logs=save_dir)
    best = [p for p in save_dir.rglob("*.ckpt") if p.name != "last.ckpt"]
    return {
        "mrr": done.metrics["test/mrr"][-1],
        "wall_s": done.wall_s,
        "train_s": sum(done.metrics["perf/epoch_s"]),
        "ckpt": str(max(best, key=lambda p: p.stat().st_mtime_ns)),
    }


def split(start: float, end: float) -> list[str]:
    """The options that train on the questions between these shares of the stream."""
    key = "--data.init_args.split"
    return [f"{key}.train_from={start}", f"{key}.train_until={end}"]


def one_seed(workdir: Path, seed: int, tiny: bool) -> list[dict[str, dict]]:
    """The base model, then per interval: the fine-tuned run and the retrained one."""
    seeded = [f"--seed_everything={seed}"]
    last = fit(workdir, f"base-{seed}", [*seeded, *split(0.0, BASE)], tiny)
    steps = []
    for i, (start, end) in enumerate(INTERVALS):
        tuned = fit(
            workdir,
            f"tuned{i}-{seed}",
            [*seeded, f"--weights_from={last['ckpt']}", "--trainer.max_epochs=1"]
            + split(start, end),
            tiny,
        )
        retrained = fit(workdir, f"retrained{i}-{seed}", [*seeded, *split(0.0, end)], tiny)
        steps.append({"tuned": tuned, "retrained": retrained})
        last = tuned
    return steps


def _fmt(values: list[float], digits: int) -> str:
    spread = f" ± {statistics.stdev(values):.{digits}f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.{digits}f}{spread}"


def blocks(tiny: bool, seeds: int = 3) -> list[Block]:
    """temporal_links' README ``finetune`` block."""
    seeds = 1 if tiny else seeds
    with tempfile.TemporaryDirectory() as workdir:
        runs = [one_seed(Path(workdir), seed, tiny) for seed in range(seeds)]
    lines = [
        "| after the interval | trained on | test MRR | `fit`, whole run (s) | training (s) |",
        "|---|---|---:|---:|---:|",
    ]
    for i, (start, end) in enumerate(INTERVALS):
        for kind, what in (
            ("tuned", f"{start:.0%}-{end:.0%} only, 1 epoch, from the last model"),
            ("retrained", f"0-{end:.0%}, 3 epochs, from scratch"),
        ):
            found = [run[i][kind] for run in runs]
            lines.append(
                f"| {start:.0%}-{end:.0%} | {what} | {_fmt([r['mrr'] for r in found], 3)} | "
                f"{_fmt([r['wall_s'] for r in found], 1)} | "
                f"{_fmt([r['train_s'] for r in found], 1)} |"
            )
    ratios = []
    for i, (start, end) in enumerate(INTERVALS):
        tuned = [run[i]["tuned"] for run in runs]
        retrained = [run[i]["retrained"] for run in runs]
        wall = statistics.mean(r["wall_s"] for r in tuned) / statistics.mean(
            r["wall_s"] for r in retrained
        )
        train = statistics.mean(r["train_s"] for r in tuned) / statistics.mean(
            r["train_s"] for r in retrained
        )
        gap = statistics.mean(r["mrr"] for r in tuned) - statistics.mean(
            r["mrr"] for r in retrained
        )
        ratios.append(
            f"after {start:.0%}-{end:.0%}: MRR {gap:+.3f}, the whole run {wall:.0%} and its "
            f"training {train:.0%} of a retrain's"
        )
    text = "\n".join(
        [
            *lines,
            "",
            "Fine-tuned against retrained: " + "; ".join(ratios) + ".",
            "",
            f"Mean ± std over {seeds} seed(s) (`--seed_everything`). The whole run is the "
            "command a user waits for (the process's start, the stream's generation, every "
            "epoch's validation, the test after it); training is the epochs alone "
            "(`perf/epoch_s`). The base model (trained on the first 50%) is not counted; a "
            "fine-tune starts from the best checkpoint of the model before it (by val MRR).",
        ]
    )
    if tiny:
        text = "**Tiny settings: a check of the pipeline, not figures.**\n\n" + text
    return [Block(ENTRY.folder / "README.md", "finetune", text)]


if __name__ == "__main__":
    print(blocks(tiny="--tiny" in sys.argv)[0].text)


SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about="temporal_links fine-tuned on each new interval against retrained from scratch",
    writes="finetune in temporal_links' README",
    threads=PER_PROCESS,
)
