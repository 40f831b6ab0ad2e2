"""Every recipe as shipped: test accuracy, s/epoch, a whole fit's time, peak memory, the plan.

For each recipe of ``benchmarks/registry.py`` and each of its variants, ``fit`` runs in a fresh
process exactly as the recipe's README says (``train.py`` where it has one); the figures come
from its ``metrics.csv`` and from the peak resident memory of its largest process (itself, or a
DDP rank it forked). For the shipped variant, ``plan`` runs first in another fresh process, so
the planned and the measured peak in the tables come from one pair of runs. Called by
``benchmarks/figures.py``, which writes the blocks.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import harness
from blocks import PER_PROCESS, Block, Section
from harness import number
from registry import RECIPES, Recipe, offline_cora

SHARE_NOTE = (
    "Validation share of an epoch: validation over itself plus the training epoch (the goal: "
    "at most 20%); ≈: epochs cut short by `limit_train_batches`, the share of a whole epoch, "
    "its training time scaled up from the share of its batches that ran."
)


# The figures of a plan report, by the label they are printed under.
METRIC = {
    "node": "test/acc",
    "hetero_node": "test/acc",
    "graph": "test/mae",
    "link": "test/recall@20",
    "temporal_link": "test/mrr",
}
HEADER = {
    "node": "test acc",
    "hetero_node": "test acc",
    "graph": "test MAE",
    "link": "test recall@20 (popularity's), MRR@20, AUC",
    "temporal_link": "test MRR (EdgeBank with a time window's), AP; EdgeBank, popularity",
}
PLAN_PARTS = {
    "planned_mb": "expected peak",
    "base_mb": "base after setup",
    "train_mb": "training step",
    "resident_mb": "resident after steps",
    "eval_mb": "evaluation",
    "checkpoint_mb": r"checkpoint save\+load",
}


@dataclass
class Result:
    """What one ``fit`` (and, for the shipped variant, one ``plan``) measured."""

    acc: float  # the task's metric (METRIC)
    epoch_s: float  # training alone: sampling, loading and steps
    val_s: float | None  # one validation (none: the recipe does not validate)
    epochs: int  # epochs trained
    epoch_fraction: float  # the share of a whole epoch's batches each ran (limit_train_batches)
    fit_s: float  # the whole `fit` command: start-up, data, every epoch, the test
    peak_mb: float
    save_dir: Path  # the run's logs and checkpoints
    cpu_s: float = 0.0  # user + system time of the fit and every process it waited for
    system_s: float = 0.0
    val_runs: list[float] = field(default_factory=list)  # every validation's seconds
    plan: dict[str, float] | None = None
    baseline: float | None = None  # link recipes: the popularity baseline's recall@20
    mrr: float | None = None  # link recipes: test MRR@20
    auc: float | None = None  # link recipes: test AUC of the labelled pairs
    others: dict[str, float] = field(default_factory=dict)  # temporal: AP, the baselines' MRR


def measure(
    entry: Recipe,
    extra: list[str],
    workdir: Path,
    with_plan: bool,
    seed: int,
    tiny: bool,
    *,
    workers: int | None = None,
    env: dict[str, str] | None = None,
) -> Result:
    """Plan (optionally) and fit one configuration, each in a fresh process (``harness.run``).

    A recipe with a ``prepare.yaml`` first prepares its graph (once per workdir), as its README
    says; its runs then map that folder. ``workers`` and ``env``: as ``harness.run``'s.
    """
    save_dir = workdir / "runs" / f"{entry.name}-{abs(hash(tuple(extra)))}-{seed}"
    root = workdir / "data"
    if entry.prepare_config:
        root = root / entry.name
        if not root.exists():
            harness.run(entry.prepare_argv(f"--out={root}", *(entry.tiny_prepare if tiny else ())))
    args = [
        f"--seed_everything={seed}",
        f"--data.init_args.root={root}",
        f"--trainer.logger.init_args.save_dir={save_dir}",
        *extra,
    ]
    plan = None
    if with_plan and entry.planned:
        report = harness.run(entry.argv("plan", *args), cwd=workdir, env=env).output
        plan = {key: number(label, report) for key, label in PLAN_PARTS.items()}
    fit = harness.run(
        entry.argv("fit", "--trainer.enable_progress_bar=false", *args),
        cwd=workdir,
        logs=save_dir,
        workers=workers,
        env=env,
    )
    metrics = fit.metrics
    epoch_s, val_s = metrics["perf/epoch_s"], metrics.get("perf/val_s")
    others = {}
    if entry.task == "temporal_link":
        names = ("ap", "mrr_edgebank_tw", "mrr_edgebank", "mrr_popularity")
        others = {name: metrics[f"test/{name}"][-1] for name in names}
    return Result(
        acc=metrics[METRIC[entry.task]][-1],
        baseline=metrics["test/recall@20_popularity"][-1] if entry.task == "link" else None,
        mrr=metrics["test/mrr@20"][-1] if entry.task == "link" else None,
        auc=metrics["test/auc"][-1] if entry.task == "link" else None,
        epoch_s=statistics.median(epoch_s[1:] or epoch_s),  # the first epoch is warm-up
        val_s=statistics.median(val_s) if val_s else None,
        val_runs=val_s or [],
        epochs=len(epoch_s),
        epoch_fraction=statistics.median(metrics.get("perf/epoch_fraction") or [1.0]),
        fit_s=fit.wall_s,
        save_dir=save_dir,
        peak_mb=fit.peak_mb,
        cpu_s=fit.cpu_s,
        system_s=fit.system_s,
        plan=plan,
        others=others,
    )


def _fmt(values: list[float], digits: int) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def validation_per_epoch(result: Result) -> tuple[float, float]:
    """Seconds of validation per epoch trained, and its share of an epoch as shipped.

    Every validation's seconds over the epochs trained (a recipe validating every other epoch
    spends half of one validation per epoch). The share: that over itself plus the training
    epoch; for epochs cut short (``limit_train_batches``), the whole epoch's, scaled up from
    the share of its batches that ran.
    """
    per_epoch = sum(result.val_runs) / result.epochs
    return per_epoch, per_epoch / (per_epoch + result.epoch_s / result.epoch_fraction)


def _times(results: list[Result]) -> str:
    """Training s/epoch, validation s/epoch, its share and the whole fit's seconds: cells."""
    epoch_s = statistics.median(r.epoch_s for r in results)
    fit_s = statistics.median(r.fit_s for r in results)
    validated = [validation_per_epoch(r) for r in results if r.val_runs]
    if not validated:
        return f"{epoch_s:.2f} | – | – | {fit_s:,.0f}"
    val = statistics.median(v for v, _ in validated)
    share = statistics.median(s for _, s in validated)
    cut = any(r.epoch_fraction < 1 for r in results)
    return f"{epoch_s:.2f} | {val:.2f} | {'≈' if cut else ''}{share:.0%} | {fit_s:,.0f}"


def _args_note(args: tuple[str, ...]) -> str:
    return ", ".join(f"`{a}`" for a in args)


def blocks(names: list[str], tiny: bool, seeds: int, workdir: Path | None = None) -> list[Block]:
    """Measure the recipes ``names`` and return their README blocks.

    Args:
        names: Registry names.
        tiny: Add each recipe's ``tiny`` overrides (a check of the pipeline, not figures).
        seeds: Runs per variant (a recipe may ask for more: its ``seeds``); accuracy is then
            mean ± std, s/epoch and peak the median.
        workdir: Where runs and data go (default: a temporary folder).
    """
    with tempfile.TemporaryDirectory(prefix="gnnscale-recipes-") as tmp:
        folder = workdir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        offline_cora(folder / "data")
        rows, short, out = [], [], []
        for entry in [e for e in RECIPES if e.name in names]:
            base = [*entry.figure_args, *(entry.tiny if tiny else ())]
            lines = [
                f"| variant | {HEADER[entry.task]} | s/epoch, training | s/epoch, validation | "
                "validation share of an epoch | whole fit (s) | peak RSS (MiB) |",
                "|---|---:|---:|---:|---:|---:|---:|",
            ]
            shipped: tuple[list[Result], str] | None = None
            runs = 1 if tiny else max(seeds, entry.seeds)
            for i, (label, variant) in enumerate(entry.variants):
                results = [
                    measure(entry, [*base, *variant], folder, i == 0, seed, tiny)
                    for seed in range(runs)
                ]
                acc = _fmt([r.acc for r in results], 3)
                if entry.task == "graph":  # a regression: its test MAE, in the same column
                    acc = f"MAE {acc}"
                if entry.task == "link":  # a ranking: recall@20, and the popularity baseline's
                    popular = _fmt([r.baseline for r in results if r.baseline is not None], 3)
                    mrr = _fmt([r.mrr for r in results if r.mrr is not None], 3)
                    auc = _fmt([r.auc for r in results if r.auc is not None], 3)
                    acc = f"recall@20 {acc} ({popular}), MRR@20 {mrr}, AUC {auc}"
                if entry.task == "temporal_link":  # a ranking beside the baselines'
                    o = {k: _fmt([r.others[k] for r in results], 3) for k in results[0].others}
                    acc = (
                        f"MRR {acc} ({o['mrr_edgebank_tw']}), AP {o['ap']}; EdgeBank "
                        f"{o['mrr_edgebank']}, popularity {o['mrr_popularity']}"
                    )
                times = _times(results)
                peak = statistics.median(r.peak_mb for r in results)
                lines.append(f"| {label} | {acc} | {times} | {peak:,.0f} |")
                print(f"{entry.name:22s} {label:36s} acc {acc} s {times} peak {peak:,.0f}")
                if i == 0:
                    shipped = (results, acc)
            assert shipped is not None
            results, acc = shipped
            peak = statistics.median(r.peak_mb for r in results)
            plan_cells = "– | –"
            if entry.planned:
                assert results[0].plan is not None  # the shipped variant is planned
                planned = results[0].plan["planned_mb"]
                plan_cells = f"{planned:,.0f} | {planned / peak:.2f}"
                print(f"{entry.name:22s} planned peak {planned:,.0f} MiB, measured {peak:,.0f}")
            link = f"[{entry.name}](recipes/{entry.name})"
            settings = _args_note(entry.figure_args) or "as shipped"
            cpu = statistics.median(r.cpu_s for r in results)
            system = statistics.median(r.system_s / r.cpu_s for r in results)
            rows.append(
                f"| {link} | {entry.technique} | {settings} | {acc} | {_times(results)} | "
                f"{cpu:,.0f} ({system:.0%}) | {peak:,.0f} | {plan_cells} |"
            )
            epoch_s = statistics.median(r.epoch_s for r in results)
            fit_s = statistics.median(r.fit_s for r in results)
            metric = acc.split(", MRR")[0].split(", AP")[0]  # a ranking: its figure (baseline's)
            short.append(
                f"| {link} | {entry.technique} | {metric} | {epoch_s:.2f} | {fit_s:,.0f} | "
                f"{peak:,.0f} |"
            )
            note = f"Runs: `{' '.join(['fit', '--config', f'recipes/{entry.name}/config.yaml'])}`"
            note += f" with {_args_note(base)}" if base else ", as shipped"
            note += (
                f"; {runs} seed(s). s/epoch, training: median after one warm-up epoch "
                "(sampling, loading, steps; no validation). s/epoch, validation: every "
                f"validation's seconds over the epochs trained. {SHARE_NOTE} Whole fit: the "
                "`fit` command's wall time (start-up, data, every epoch and validation, "
                "checkpoints, the final test). Peak RSS: the whole run's (data, sampler, "
                "training, evaluation, checkpoints)"
            )
            note += ", largest process (a DDP rank)." if entry.processes > 1 else "."
            out.append(Block(entry.folder / "README.md", "results", "\n".join([*lines, "", note])))
        table = [
            "| recipe | technique | settings | test metric (acc unless named) | s/epoch, "
            "training | s/epoch, validation | validation share of an epoch | whole fit (s) | "
            "CPU s (system share) | peak RSS (MiB) | planned peak (MiB) | planned / measured |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
        ]
        text = "\n".join(table) + (
            "\n\nEach recipe's `fit` runs in a fresh process, as its README says; `gnnscale plan` "
            "runs on the same config in another fresh process just before it. Peak RSS: the "
            "largest process's `VmHWM` over the whole run (a training rank for DDP, not the "
            "launcher). s/epoch, training: median after one warm-up epoch, sampling and loading "
            "included, validation not; s/epoch, validation: every validation's seconds over the "
            f"epochs trained. {SHARE_NOTE} Whole fit: the `fit` command's wall time, from "
            "start-up to the final test. CPU s: user and system time of the fit and of every "
            "process it waited for (loader workers, forked DDP ranks); system share: the "
            "kernel's part of it (page faults, shared memory, I/O)."
        )
        if tiny:
            text += " **Tiny settings: a check of the pipeline, not figures.**"
        brief = "\n".join(
            [
                "| recipe | technique | test metric (acc unless named) | s/epoch | whole fit (s) "
                "| peak RSS (MiB) |",
                "|---|---|---:|---:|---:|---:|",
                *short,
            ]
        ) + (
            "\n\ns/epoch: training alone, sampling and loading included (median after a "
            "warm-up epoch); whole fit: the `fit` command's wall time, start-up to the printed "
            "test metric; peak RSS: the largest process's. Every column, the settings and the "
            "planner's prediction: [benchmarks/README.md](benchmarks/README.md#the-recipe-table)."
        )
        if tiny:
            brief += " **Tiny settings: a check of the pipeline, not figures.**"
        if {e.name for e in RECIPES} <= set(names):
            out.append(Block(Path("README.md"), "recipes", brief))
            out.append(Block(Path("benchmarks/README.md"), "recipes", text))
    return out


SECTION = Section(
    run=lambda tiny, o: blocks(o.recipes or [r.name for r in RECIPES], tiny, o.seeds),
    about=(
        "every recipe of benchmarks/registry.py through gnnscale fit in a fresh process "
        "(test metric, s/epoch, whole run, peak of its largest process), and gnnscale plan "
        "on the same config"
    ),
    writes="recipes in README.md, results in each recipe's README",
    threads=PER_PROCESS,
)
