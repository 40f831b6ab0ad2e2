"""Per-epoch validation as shipped against exact, every epoch: what it costs a fit, what it changes.

Written by ``python benchmarks/figures.py validation`` (the ``validation`` block of
benchmarks/README.md).

The sampler recipes validate after every epoch on sampled neighbourhoods of a fixed subset of
the validation nodes (``eval.val_mode: sampled``, ``eval.val_nodes``) and test once, exactly
(``eval.mode: layerwise``). Each runs ``gnnscale fit`` twice in fresh processes, as shipped and
with exact per-epoch validation of every validation node (``val_mode: layerwise``,
``val_nodes: null``, given as a second config file); then the shipped run's best checkpoint is
validated both ways (``gnnscale validate``), so the two validation accuracies are those of one
set of weights.

The full-graph recipes validate exactly, one forward pass over the whole graph, after every
epoch: that pass costs about 40% of a full-batch training step, a quarter of the epoch. Each
runs as shipped, validating every other epoch (over the same seeds, paired: the checkpoint each
chose, tested), and with validation restricted to what the validation nodes reach (the
neighbourhood sampler at full fan-out: exact, ``eval.val_mode: sampled``).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import harness
from blocks import PER_PROCESS, Block, Section
from registry import REPO, offline_cora, recipe

from gnnscale.measure import read_metrics
from recipes import Result, measure, validation_per_epoch

SAMPLED = ("neighbor_sage", "cluster_gcn", "graphsaint")
FULL_GRAPH = ("planetoid", "gat_attention_memory")
FULL_GRAPH_SEEDS = 5
# A file: jsonargparse reads null for an optional field of a nested dataclass from YAML only.
EXACT = "data:\n  init_args:\n    eval: {val_mode: layerwise, val_nodes: null}\n"
# The full-graph recipes' variants: label, arguments, whether over every seed (else seed 0).
FULL_GRAPH_VARIANTS = (
    ("exact, whole graph, every epoch (config.yaml)", [], True),
    ("exact, whole graph, every other epoch", ["--trainer.check_val_every_n_epoch=2"], True),
    (
        "exact, the validation nodes' neighbourhoods",
        ["--data.init_args.eval.val_mode=sampled"],
        False,
    ),
)


def _validate(name: str, ckpt: Path, save_dir: Path, args: list[str], *extra: str) -> float:
    """``gnnscale validate`` of ``ckpt`` in a fresh process: its validation accuracy."""
    before = set(save_dir.rglob("metrics.csv"))
    argv = recipe(name).argv("validate", *args, f"--ckpt_path={ckpt}", *extra)
    harness.run(argv)
    (new,) = set(save_dir.rglob("metrics.csv")) - before
    return read_metrics(new)["val/acc"][-1]


def _row(name: str, label: str, results: list[Result]) -> str:
    """One table row: medians over the runs, the test accuracy's mean (± std over seeds)."""
    for result in results:
        assert result.val_runs, f"{name} did not validate"
    per_epoch = [validation_per_epoch(r) for r in results]
    accs = [r.acc for r in results]
    acc = f"{accs[0]:.3f}"
    if len(accs) > 1:
        acc = f"{statistics.mean(accs):.3f} ± {statistics.stdev(accs):.3f}"
    median = statistics.median
    validations = median(len(r.val_runs) for r in results)
    return (
        f"| {name} | {label} | {median(r.val_s or 0.0 for r in results):.3f} | "
        f"{median(v for v, _ in per_epoch):.3f} | {median(r.epoch_s for r in results):.2f} | "
        f"{median(s for _, s in per_epoch):.0%} | {median(r.fit_s for r in results):,.0f} | "
        f"{median(sum(r.val_runs) / r.fit_s for r in results):.0%} ({validations:.0f} "
        f"validations) | {acc} |"
    )


def blocks(tiny: bool) -> list[Block]:
    """benchmarks/README.md's ``validation`` block."""
    lines = [
        "| recipe | per-epoch validation | s, one validation | s/epoch, validation | "
        "s/epoch, training | validation share of an epoch | whole fit (s) | "
        "validation share of the fit | test acc |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    gaps, changes = [], []
    seeds = 1 if tiny else FULL_GRAPH_SEEDS
    with tempfile.TemporaryDirectory(prefix="gnnscale-validation-") as tmp:
        folder = Path(tmp)
        offline_cora(folder / "data")
        exact_yaml = folder / "exact.yaml"
        exact_yaml.write_text(EXACT)
        exact = [f"--config={exact_yaml}"]
        for name in (*SAMPLED, *FULL_GRAPH):
            entry = recipe(name)
            base = [*(entry.tiny if tiny else entry.figure_args)]
            if name in FULL_GRAPH:
                paired: dict[str, list[Result]] = {}
                for label, extra, every_seed in FULL_GRAPH_VARIANTS:
                    paired[label] = [
                        measure(entry, [*base, *extra], folder, False, seed, tiny)
                        for seed in range(seeds if every_seed else 1)
                    ]
                    lines.append(_row(name, label, paired[label]))
                    print(lines[-1], flush=True)
                every, other = (paired[label] for label, _, _ in FULL_GRAPH_VARIANTS[:2])
                diffs = [b.acc - a.acc for a, b in zip(every, other, strict=True)]
                spread = f" ± {statistics.stdev(diffs):.3f}" if len(diffs) > 1 else ""
                changes.append(f"{name} {statistics.mean(diffs):+.3f}{spread}")
                print(changes[-1], flush=True)
                continue
            runs: dict[str, Result] = {}
            for label, extra in (("sampled (config.yaml)", []), ("exact, layer-wise", exact)):
                runs[label] = result = measure(entry, [*base, *extra], folder, False, 0, tiny)
                lines.append(_row(name, label, [result]))
                print(lines[-1], flush=True)
            shipped = runs["sampled (config.yaml)"]
            (ckpt,) = [p for p in shipped.save_dir.rglob("epoch=*.ckpt")]
            args = [
                *base,
                f"--data.init_args.root={folder / 'data'}",
                f"--trainer.logger.init_args.save_dir={shipped.save_dir}",
            ]
            sampled = _validate(name, ckpt, shipped.save_dir, args)
            whole = _validate(name, ckpt, shipped.save_dir, args, *exact)
            gaps.append(f"{name} {sampled:.3f} sampled, {whole:.3f} exact ({sampled - whole:+.3f})")
            print(gaps[-1], flush=True)
    over = "seed 0" if seeds == 1 else f"seeds 0-{seeds - 1}"
    lines += [
        "",
        "Validation accuracy of a sampler recipe's shipped run's best checkpoint, validated both "
        "ways (as shipped: sampled, on its subset of the validation nodes; exact: layer-wise, "
        "every validation node): " + "; ".join(gaps) + ". Test accuracy of a full-graph "
        "recipe validated every other epoch, less validated every epoch (the same seed's run, "
        f"mean ± std over {over}): " + "; ".join(changes) + ".",
        "",
        "Each recipe's config.yaml"
        + (" with its tiny settings" if tiny else "")
        + ", each run a fresh process; seed 0, and for the full-graph recipes' first two rows "
        f"{over} (times: medians; test acc: mean ± std). One validation: the "
        "median of those run (`perf/val_s`, the sanity check left out); s/epoch, validation: "
        "every validation's seconds over the epochs trained. s/epoch, training: median after "
        "one warm-up epoch, validation not included (`perf/epoch_s`). Validation share of an "
        "epoch: validation per epoch over itself plus the training epoch (the goal: at most "
        "20%). Whole fit: the `fit` command's wall time, start-up and the final (exact) test "
        "included; the validation share: all its validations over that. Test acc: exact in "
        "every run, of the checkpoint the run's own validation chose.",
    ]
    return [Block(REPO / "benchmarks" / "README.md", "validation", "\n".join(lines))]


SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about=(
        "per-epoch validation of the sampler recipes, sampled (as shipped) against exact, "
        "and of the full-graph recipes every epoch against every other and against the "
        "validation nodes' neighbourhoods alone"
    ),
    writes="validation in benchmarks/README.md",
    threads=PER_PROCESS,
)
