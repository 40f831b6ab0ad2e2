"""Per-epoch validation, sampled against exact: what it costs a fit, and what it changes.

Written by ``python benchmarks/figures.py validation`` (the ``validation`` block of
benchmarks/README.md).

The sampler recipes validate after every epoch on sampled neighbourhoods of a fixed subset of
the validation nodes (``eval.val_mode: sampled``, ``eval.val_nodes``) and test once, exactly
(``eval.mode: layerwise``). Each recipe runs ``gnnscale fit`` twice in fresh processes, as
shipped and with exact per-epoch validation of every validation node (``val_mode: layerwise``,
``val_nodes: null``, given as a second config file); then the shipped run's best checkpoint is
validated both ways (``gnnscale validate``), so the two validation accuracies are those of one
set of weights.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from blocks import Block
from registry import REPO, recipe

from gnnscale.measure import read_metrics
from recipes import Result, measure

RECIPES = ("neighbor_sage", "cluster_gcn", "graphsaint")
# A file: jsonargparse reads null for an optional field of a nested dataclass from YAML only.
EXACT = "data:\n  init_args:\n    eval: {val_mode: layerwise, val_nodes: null}\n"


def _validate(name: str, ckpt: Path, save_dir: Path, args: list[str], *extra: str) -> float:
    """``gnnscale validate`` of ``ckpt`` in a fresh process: its validation accuracy."""
    before = set(save_dir.rglob("metrics.csv"))
    argv = recipe(name).argv("validate", *args, f"--ckpt_path={ckpt}", *extra)
    subprocess.run(argv, check=True, capture_output=True, text=True)
    (new,) = set(save_dir.rglob("metrics.csv")) - before
    return read_metrics(new)["val/acc"][-1]


def blocks(tiny: bool) -> list[Block]:
    """benchmarks/README.md's ``validation`` block."""
    lines = [
        "| recipe | per-epoch validation | s, one validation | s/epoch, training | "
        "validation share of an epoch | whole fit (s) | validation share of the fit | test acc |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    gaps = []
    with tempfile.TemporaryDirectory(prefix="gnnscale-validation-") as tmp:
        folder = Path(tmp)
        exact_yaml = folder / "exact.yaml"
        exact_yaml.write_text(EXACT)
        exact = [f"--config={exact_yaml}"]
        for name in RECIPES:
            entry = recipe(name)
            base = [*(entry.tiny if tiny else entry.figure_args)]
            runs: dict[str, Result] = {}
            for label, extra in (("sampled (config.yaml)", []), ("exact, layer-wise", exact)):
                runs[label] = result = measure(entry, [*base, *extra], folder, False, 0, tiny)
                assert result.val_s is not None, f"{name} did not validate"
                epochs = len(result.val_runs)
                share = sum(result.val_runs) / result.fit_s
                lines.append(
                    f"| {name} | {label} | {result.val_s:.2f} | {result.epoch_s:.2f} | "
                    f"{result.val_s / (result.val_s + result.epoch_s):.0%} | "
                    f"{result.fit_s:,.0f} | {share:.0%} ({epochs} validations) | "
                    f"{result.acc:.3f} |"
                )
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
    lines += [
        "",
        "Validation accuracy of the shipped run's best checkpoint, validated both ways (as "
        "shipped: sampled, on its subset of the validation nodes; exact: layer-wise, every "
        "validation node): " + "; ".join(gaps) + ".",
        "",
        "Each recipe's config.yaml"
        + (" with its tiny settings" if tiny else "")
        + ", seed 0, each run a fresh process. One validation: the median of those run after "
        "each epoch (`perf/val_s`, the sanity check left out). s/epoch, training: median after "
        "one warm-up epoch, validation not included (`perf/epoch_s`). Validation share of an "
        "epoch: one validation over itself plus the training epoch (the goal: at most 20%). "
        "Whole fit: the `fit` "
        "command's wall time, start-up and the final (exact) test included; the validation "
        "share: all its validations over that. Test acc: exact in both runs, of the checkpoint "
        "each run's own validation chose.",
    ]
    return [Block(REPO / "benchmarks" / "README.md", "validation", "\n".join(lines))]
