"""Regenerate the measured figures in the recipe READMEs and the top-level recipe table.

Runs each recipe (and its variants) through the real ``gnnscale fit`` in a fresh process, reads
the run's ``metrics.csv`` and rewrites the block between ``<!-- results:begin -->`` and
``<!-- results:end -->`` in ``recipes/<name>/README.md`` and ``<!-- recipes:begin/end -->`` in
``README.md``. Figures: test accuracy of the best-validation checkpoint (mean ± std over seeds),
median seconds per training epoch after one warm-up epoch, and the run's peak resident memory.

    python scripts/recipe_figures.py                      # all recipes, 1 seed
    python scripts/recipe_figures.py --seeds 3 cluster_gcn
"""

from __future__ import annotations

import argparse
import csv
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from check_plan import RUNNER  # runs a command, prints its largest process's peak

REPO = Path(__file__).resolve().parents[1]

# recipe -> [(variant, extra CLI arguments)]
VARIANTS: dict[str, list[tuple[str, list[str]]]] = {
    "neighbor_sage": [("GraphSAGE, fan-out [15, 10]", [])],
    "cluster_gcn": [
        ("2 layers", []),
        ("4 layers", ["--model.init_args.num_layers=4"]),
    ],
    "graphsaint": [
        ("random walk (roots 3000, length 2)", []),
        (
            "node (6000 nodes)",
            ["--data.init_args.sampler=node", "--data.init_args.batch_size=6000"],
        ),
        # No edge variant at this size: PyG's edge sampler needs batch_size x num_edges floats
        # per subgraph (60 GB for 4000 edges here); see the recipe README.
    ],
}
# Recipes whose own measure.py writes their figures (memory comparisons, not a single run).
OTHERS = {
    "gat_attention_memory": "edge-wise attention vs dense [B, N, N, 2F]",
    "sparse_embeddings": "nn.Embedding(sparse) + SparseAdam",
    "multi_gpu_ddp": "DDP, fork-shared graph",
}
TECHNIQUE = {
    "neighbor_sage": ("neighbour sampling", "NeighborLoader"),
    "cluster_gcn": ("Cluster-GCN", "ClusterLoader"),
    "graphsaint": ("GraphSAINT", "GraphSAINT*Sampler"),
}


def _run(recipe: str, extra: list[str], seed: int, workdir: Path) -> dict[str, float]:
    config = REPO / "recipes" / recipe / "config.yaml"
    save_dir = workdir / f"{recipe}-{abs(hash(tuple(extra)))}-{seed}"
    cmd = [
        sys.executable, "-c", RUNNER, "gnnscale.cli", "fit", "--config", str(config),
        f"--seed_everything={seed}", "--trainer.enable_progress_bar=false",
        f"--trainer.logger.init_args.save_dir={save_dir}", f"--data.init_args.root={workdir}",
        *extra,
    ]  # fmt: skip
    done = subprocess.run(cmd, check=True, cwd=workdir, capture_output=True, text=True)
    peak = re.search(r"PEAK_RSS_MB ([\d.]+)", done.stdout)
    if peak is None:
        raise RuntimeError(f"no peak memory in the output of {recipe}:\n{done.stdout[-2000:]}")
    (metrics,) = save_dir.rglob("metrics.csv")
    rows = list(csv.DictReader(metrics.open()))

    def col(key: str) -> list[float]:
        return [float(r[key]) for r in rows if r.get(key)]

    epoch_s = col("perf/epoch_s")
    return {
        "acc": col("test/acc")[-1],
        "epoch_s": statistics.median(epoch_s[1:] or epoch_s),
        # The whole run's, final validation and test included (the log has training epochs').
        "peak_mb": float(peak.group(1)),
    }


def _fmt(values: list[float], digits: int = 3) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def _replace_block(path: Path, tag: str, text: str) -> None:
    begin, end = f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"
    content = path.read_text()
    if begin not in content:
        raise SystemExit(f"{path} has no {begin} ... {end} block to fill")
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    path.write_text(pattern.sub(lambda _: f"{begin}\n{text}\n{end}", content))


def main() -> None:
    """Run the recipes and rewrite the README blocks."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipes", nargs="*", help=f"any of {', '.join(VARIANTS)} (default: all)")
    parser.add_argument("--seeds", type=int, default=1, help="runs per variant (mean ± std)")
    args = parser.parse_args()
    args.recipes = args.recipes or list(VARIANTS)
    if unknown := set(args.recipes) - set(VARIANTS):
        parser.error(f"unknown recipes {sorted(unknown)}; choose from {', '.join(VARIANTS)}")

    hardware = (
        torch.cuda.get_device_name()
        if torch.cuda.is_available()
        else f"CPU, {torch.get_num_threads()} threads"
    )
    note = (
        f"Measured by `python scripts/recipe_figures.py --seeds {args.seeds}` on {hardware} "
        f"({platform.machine()}), torch {torch.__version__}; peak memory is the peak resident "
        "memory of the whole run (data, sampler, model, evaluation)."
    )
    summary: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in args.recipes:
            lines = ["| variant | test acc | s/epoch | peak RSS (MiB) |", "|---|---|---|---|"]
            for name, extra in VARIANTS[recipe]:
                runs = [_run(recipe, extra, seed, Path(tmp)) for seed in range(args.seeds)]
                acc = _fmt([r["acc"] for r in runs])
                epoch_s = _fmt([r["epoch_s"] for r in runs], 2)
                peak = f"{max(r['peak_mb'] for r in runs):,.0f}"
                lines.append(f"| {name} | {acc} | {epoch_s} | {peak} |")
                print(f"{recipe:14s} {name:36s} acc {acc}  s/epoch {epoch_s}  peak {peak} MiB")
                summary.setdefault(recipe, [acc, epoch_s, peak])
            _replace_block(
                REPO / "recipes" / recipe / "README.md", "results", "\n".join([*lines, "", note])
            )

    table = REPO / "README.md"
    rows = [
        "| recipe | technique | loader | test acc | s/epoch | peak RSS (MiB) |",
        "|---|---|---|---|---|---|",
    ]
    for recipe, (acc, epoch_s, peak) in summary.items():
        technique, loader = TECHNIQUE[recipe]
        link = f"[{recipe}](recipes/{recipe})"
        rows.append(f"| {link} | {technique} | {loader} | {acc} | {epoch_s} | {peak} |")
    for recipe, technique in OTHERS.items():
        link = f"[{recipe}](recipes/{recipe})"
        rows.append(
            f"| {link} | {technique} | | measured by its `measure.py`: see its README | | |"
        )
    if set(summary) == set(VARIANTS):
        _replace_block(table, "recipes", "\n".join([*rows, "", note]))


if __name__ == "__main__":
    main()
