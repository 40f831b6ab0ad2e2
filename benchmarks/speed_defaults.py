"""The CPU speed tricks: s/epoch of each sampler recipe with each trick on and off.

    python benchmarks/speed_defaults.py                 # full size: prints the table
    python benchmarks/speed_defaults.py --size tiny     # check the pipeline (seconds a run)
    python benchmarks/speed_defaults.py --rounds 5 --recipes neighbor_sage --tricks cpu_dropout

Each trick of ``gnnscale.models.fast`` is measured where a user sees it: ``gnnscale fit`` on
``neighbor_sage``, ``cluster_gcn``, ``graphsaint`` (GraphSAGE), ``hetero_node_classification``
(HeteroSAGE) and ``link_prediction_pinsage`` (LinkPredictor) as shipped (4 epochs, no
per-epoch validation), against the same run with that one trick switched: off for a default,
on for an opt-in. The two arms alternate (A B, then B A, ...), each run a fresh process with
the same seed as its partner; s/epoch is the median of ``perf/epoch_s`` after the first
(warm-up) epoch.
A trick is a default when the run without it takes at least 3% longer than the run with it on
some recipe (the median of the pairs' ratios); else it is opt-in, or it goes.

Each trick is switched by its setting in the model's ``speed`` group
(``--model.init_args.speed.sparse_aggregation=false``, ``speed.cpu_dropout=false``,
``speed.target_only_layers=false``, ``speed.bucket_rows=0`` (``auto`` pads where the
products run in bf16 on a CPU), ``speed.aggregate_in_loader=false``;
``gnnscale.models.fast.SpeedTricks``), fused Adam by
``--model.init_args.optimizer.init_args.fused=true``: off, each puts back what PyG or PyTorch
does in its place.

Not every trick is on every recipe's path: Cluster-GCN and GraphSAINT batches are subgraphs
(``fast.subgraph_forward``), which never take the neighbour-only paths (target-only layers,
aggregation in the loader).

``hetero_node_classification`` (``HeteroSAGE``) has switches of its own:
``--model.init_args.target_only_layers=false``, ``--model.init_args.project_after_mean=false``
and ``--model.init_args.bucket_rows=0`` (``gnnscale.models.fast_hetero.target_only``); the
link recipe (``LinkPredictor``) is measured for the last only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import harness
from blocks import PER_PROCESS, REPO, Block, Section
from registry import recipe

RECIPES = (
    "neighbor_sage",
    "cluster_gcn",
    "graphsaint",
    "hetero_node_classification",
    "link_prediction_pinsage",
)
NEIGHBOUR = ("neighbor_sage",)
SUBGRAPH = ("cluster_gcn", "graphsaint")
HETERO = ("hetero_node_classification",)  # HeteroSAGE: switches of its own
LINK = ("link_prediction_pinsage",)  # LinkPredictor: HeteroSAGE's rows rounded up alone
GRAPHSAGE = NEIGHBOUR + SUBGRAPH
THRESHOLD = 1.03  # without ÷ with at or above this: the trick earns a default


@dataclass(frozen=True)
class Trick:
    """One speed trick and how to switch it.

    Args:
        key: Short name (the model's ``speed`` field that switches it, where one does).
        label: What the table calls it.
        args: CLI overrides that switch it (off for a default, on for an opt-in).
        recipes: The recipes whose training step takes its path.
        opt_in: Off as shipped: the measured arm runs with it.
    """

    key: str
    label: str
    args: tuple[str, ...]
    recipes: tuple[str, ...] = GRAPHSAGE
    opt_in: bool = False


TRICKS = (
    Trick(
        "sparse_aggregation",
        "sparse aggregation (CSR product, not scatter)",
        args=("--model.init_args.speed.sparse_aggregation=false",),
    ),
    Trick(
        "cpu_dropout",
        "bit-mask Dropout (fused with ReLU)",
        args=("--model.init_args.speed.cpu_dropout=false",),
    ),
    Trick(
        "target_only_layers",
        "target-only layers",
        args=("--model.init_args.speed.target_only_layers=false",),
        recipes=NEIGHBOUR,
    ),
    Trick(  # auto: 1024 where the batches' products run in bf16 on a CPU (gnnscale.SpeedTricks)
        "bucket_rows",
        "rows rounded up to 1,024s (`bucket_rows: auto`; bf16 on a CPU)",
        args=("--model.init_args.speed.bucket_rows=0",),
    ),
    Trick(
        "aggregate_in_loader",
        "first layer aggregated in the loader",
        args=("--model.init_args.speed.aggregate_in_loader=false",),
        recipes=NEIGHBOUR,
    ),
    Trick(
        "fused_adam",
        "fused Adam",
        args=("--model.init_args.optimizer.init_args.fused=true",),
        opt_in=True,
    ),
    Trick(
        "hetero_target_only_layers",
        "target-only layers",
        args=("--model.init_args.target_only_layers=false",),
        recipes=HETERO,
    ),
    Trick(
        "project_after_mean",
        "raw features averaged, then projected (first layer)",
        args=("--model.init_args.project_after_mean=false",),
        recipes=HETERO,
    ),
    Trick(
        "hetero_bucket_rows",
        "rows rounded up to 1,024s (`bucket_rows: auto`; bf16 on a CPU)",
        args=("--model.init_args.bucket_rows=0",),
        recipes=HETERO + LINK,
    ),
)


@dataclass
class Run:
    """One ``fit``: which arm, and what it measured."""

    recipe: str
    trick: str  # "default" for the shipped arm
    round: int
    epochs_s: list[float]  # perf/epoch_s of every epoch, the first (warm-up) included
    peak_mb: float
    wall_s: float
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]

    @property
    def epoch_s(self) -> float:
        """Median s/epoch after the first (warm-up) epoch."""
        return statistics.median(self.epochs_s[1:] or self.epochs_s)


def fit(name: str, args: list[str], workdir: Path, label: str) -> Run:
    """``gnnscale fit`` on recipe ``name`` in a fresh process (``harness.run``).

    Every epoch's ``perf/epoch_s`` is kept (``recipes.measure`` keeps their median only).
    """
    entry = recipe(name)
    assert not entry.prepare_config, "the sampler recipes generate their graph"
    save_dir = workdir / "runs" / label
    argv = entry.argv(
        "fit",
        "--trainer.enable_progress_bar=false",
        "--seed_everything=0",  # every arm trains on the same batches
        f"--data.init_args.root={workdir / 'data'}",
        f"--trainer.logger.init_args.save_dir={save_dir}",
        *args,
    )
    load_before = os.getloadavg()
    done = harness.run(argv, cwd=workdir, logs=save_dir)
    epochs = done.metrics["perf/epoch_s"]
    return Run(name, "", -1, epochs, done.peak_mb, done.wall_s, load_before, os.getloadavg())


def measure_all(
    names: list[str],
    tricks: list[Trick],
    rounds: int,
    tiny: bool,
    log: Path | None = None,
    workdir: Path | None = None,
) -> list[Run]:
    """Each recipe as shipped against each applicable trick off, ``rounds`` times.

    The runs of a recipe go ``D T1 .. Tk D Tk .. T1 D T1 ..``: every trick-off run lies
    between two shipped runs (``D``), which :func:`table` pairs it with. Each recipe first runs
    once unmeasured (it generates its graph and partition caches). ``log``: each run appended
    as a JSON line as soon as it ends.
    """
    epochs = 2 if tiny else 4
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="gnnscale-speed-defaults-") as tmp:
        folder = workdir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            entry = recipe(name)
            base = [
                "--trainer.limit_val_batches=0",
                "--trainer.limit_test_batches=0",  # no test pass: s/epoch is the figure
                *(entry.tiny if tiny else entry.figure_args),
                f"--trainer.max_epochs={epochs}",  # after tiny's own
            ]
            stamp = time.strftime("%H%M%S")
            fit(name, [*base, "--trainer.max_epochs=1"], folder, f"{name}-{stamp}-warm")
            applicable = [t for t in tricks if name in t.recipes]
            order: list[tuple[int, Trick | None]] = [(0, None)]
            for r in range(rounds):
                order += [(r, t) for t in (applicable if r % 2 == 0 else applicable[::-1])]
                order.append((r + 1, None))
            for i, (r, trick) in enumerate(order):
                key = trick.key if trick is not None else "default"
                args = [*base, *(trick.args if trick is not None else ())]
                run_ = fit(name, args, folder, f"{name}-{stamp}-{i:03d}-{key}")
                run_.trick, run_.round = key, r
                runs.append(run_)
                print(
                    f"{name} {key} round {r}: {run_.epoch_s:.3f} s/epoch (epochs "
                    f"{', '.join(f'{e:.2f}' for e in run_.epochs_s)}), {run_.peak_mb:,.0f} MiB, "
                    f"{run_.wall_s:.0f} s, load {run_.load_before[0]:.1f}"
                    + (f", {' '.join(trick.args)}" if trick is not None else ""),
                    flush=True,
                )
                if log is not None:
                    with log.open("a") as file:
                        file.write(json.dumps(asdict(run_)) + "\n")
    return runs


def pairs(runs: list[Run], name: str, key: str) -> list[tuple[Run, float]]:
    """Each of ``key``'s runs on ``name`` with the mean s/epoch of its two shipped neighbours."""
    default = {r.round: r.epoch_s for r in runs if (r.recipe, r.trick) == (name, "default")}
    out = []
    for r in runs:
        if (r.recipe, r.trick) == (name, key):
            around = [default[i] for i in (r.round, r.round + 1) if i in default]
            if around:
                out.append((r, statistics.mean(around)))
    return out


def table(runs: list[Run], tricks: tuple[Trick, ...] = TRICKS) -> str:
    """The markdown table of ``runs``: each (recipe, trick) measured, with and without it."""
    lines = [
        "| recipe | trick | shipped | s/epoch with | s/epoch without | without ÷ with (pair "
        "min / median / max) | peak RSS with / without (MiB) | verdict |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for name in dict.fromkeys(r.recipe for r in runs):
        shipped = [r for r in runs if (r.recipe, r.trick) == (name, "default")]
        for trick in tricks:
            matched = pairs(runs, name, trick.key)
            if not matched or not shipped:
                continue
            arm = statistics.median(r.epoch_s for r, _ in matched)
            default = statistics.median(r.epoch_s for r in shipped)
            peak_arm = statistics.median(r.peak_mb for r, _ in matched)
            peak_default = statistics.median(r.peak_mb for r in shipped)
            if trick.opt_in:  # the arm runs with it
                ratios = sorted(d / r.epoch_s for r, d in matched)
                (w, wo), (pw, pwo) = (arm, default), (peak_arm, peak_default)
            else:
                ratios = sorted(r.epoch_s / d for r, d in matched)
                (w, wo), (pw, pwo) = (default, arm), (peak_default, peak_arm)
            middle = statistics.median(ratios)
            earns = middle >= THRESHOLD
            verdict = {
                (False, True): "default: earns its place (>= 3%)",
                (False, False): "default, below 3%: make it opt-in",
                (True, True): "opt-in, >= 3%: make it a default",
                (True, False): "opt-in: below 3%",
            }[trick.opt_in, earns]
            lines.append(
                f"| {name} | {trick.label} | {'off' if trick.opt_in else 'on'} | {w:.2f} "
                f"| {wo:.2f} | {wo / w:.3f} ({ratios[0]:.2f} / {middle:.2f} / "
                f"{ratios[-1]:.2f}; {len(ratios)} pairs) | {pw:,.0f} / {pwo:,.0f} | {verdict} |"
            )
    return "\n".join(lines)


def blocks(tiny: bool, rounds: int | None = None) -> list[Block]:
    """The table as a block (benchmarks/README.md's ``speed_defaults``)."""
    rounds = rounds or (1 if tiny else 3)
    names = list(NEIGHBOUR if tiny else RECIPES)  # tiny checks the pipeline: one recipe
    runs = measure_all(names, list(TRICKS), rounds, tiny)
    text = table(runs) + (
        "\n\nEach recipe's config.yaml, 4 epochs (tiny: 2), no per-epoch validation, no test "
        f"pass, seed 0 for every run; {rounds} round(s), each run a fresh process: the shipped "
        "run (D) and each trick's run switched (off, or on for an opt-in) go D T1 .. Tk D Tk .. T1 "
        "D .., and each "
        "trick's run is paired with the mean of the two shipped runs around it. s/epoch: "
        "median after the first (warm-up) epoch (`perf/epoch_s`); the s/epoch columns: medians "
        f"over each arm's runs. Verdict: the median of the pairs' ratios against {THRESHOLD}. "
        "Peak RSS: the largest `VmHWM` of a run's processes."
    )
    return [Block(REPO / "benchmarks" / "README.md", "speed_defaults", text)]


def main(argv: list[str] | None = None) -> None:
    """Measure and print the table (and each run as it ends)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=["full", "tiny"], default="full")
    parser.add_argument("--rounds", type=int, default=0, help="runs per trick (3; tiny 1)")
    parser.add_argument("--recipes", nargs="+", choices=RECIPES, default=list(RECIPES))
    parser.add_argument("--tricks", nargs="+", choices=[t.key for t in TRICKS])
    parser.add_argument("--log", type=Path, help="append each run here as a JSON line")
    parser.add_argument("--workdir", type=Path, help="runs and data (default: a temporary one)")
    args = parser.parse_args(argv)
    tiny = args.size == "tiny"
    tricks = [t for t in TRICKS if args.tricks is None or t.key in args.tricks]
    rounds = args.rounds or (1 if tiny else 3)
    runs = measure_all(args.recipes, tricks, rounds, tiny, args.log, args.workdir)
    print(table(runs, tuple(tricks)))


if __name__ == "__main__":
    main()


SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about=(
        "each of GraphSAGE's CPU speed tricks switched off in turn on the three sampler "
        "recipes, HeteroSAGE's on the hetero recipe and rows rounded up on the link recipe, "
        "interleaved with the shipped runs (about 30 minutes)"
    ),
    writes="speed_defaults in benchmarks/README.md",
    threads=PER_PROCESS,
    formerly=("speed",),
)
