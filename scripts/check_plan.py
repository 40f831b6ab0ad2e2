"""Check ``gnnscale plan`` against the measured peak memory of each recipe, as shipped.

For every recipe: run ``plan`` in one fresh process, then ``fit`` (with its test) in another,
and compare the predicted peak with the fit process's peak resident memory. Writes the table
between the ``<!-- plan:begin/end -->`` markers of the README.

    python scripts/check_plan.py                   # every recipe (about 90 minutes on 2 cores)
    python scripts/check_plan.py neighbor_sage --no-readme -- --trainer.max_epochs=1
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPES = [
    "neighbor_sage",
    "cluster_gcn",
    "graphsaint",
    "gat_attention_memory",
    "sparse_embeddings",
    "multi_gpu_ddp",
]
# Runs the command as its recipe would (train.py where the recipe has one) and prints the peak
# resident memory of the largest process: this one, or a child that trained in it (the ranks of
# a DDP run started with fork; DataLoader workers count too). Both figures are printed.
RUNNER = """
import resource, runpy, sys
from gnnscale.callbacks import peak_rss_mb
script, *sys.argv[1:] = sys.argv[1:]
sys.argv[0] = script
if script.endswith(".py"):
    runpy.run_path(script, run_name="__main__")
else:
    runpy.run_module(script, run_name="__main__")
children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print("PEAK_SELF_MB", peak_rss_mb(), "PEAK_CHILDREN_MB", children)
print("PEAK_RSS_MB", max(peak_rss_mb(), children), flush=True)
"""


def _run(recipe: str, subcommand: str, extra: list[str]) -> str:
    folder = ROOT / "recipes" / recipe
    script = str(folder / "train.py") if (folder / "train.py").exists() else "gnnscale.cli"
    config = str(folder / "config.yaml")
    cmd = [sys.executable, "-c", RUNNER, script, subcommand, "--config", config]
    done = subprocess.run(
        [*cmd, *extra], cwd=ROOT, capture_output=True, text=True, check=False, timeout=4 * 3600
    )
    if done.returncode != 0:
        raise RuntimeError(f"{recipe} {subcommand} failed:\n{done.stderr[-3000:]}")
    return done.stdout + done.stderr


def _number(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    if match is None:
        raise RuntimeError(f"{pattern!r} not found in the output:\n{text[-2000:]}")
    return float(match.group(1).replace(",", ""))


# The figures of a plan report, by the label they are printed under.
PARTS = {
    "predicted_mb": "expected peak",
    "base_mb": "base after setup",
    "train_mb": "training step",
    "resident_mb": "resident after steps",
    "eval_mb": "evaluation",
    "checkpoint_mb": "checkpoint save\\+load",
}


def check(recipe: str, extra: list[str]) -> dict[str, float]:
    """Predicted and measured peak (MiB) of one recipe, with the parts of the plan."""
    report = _run(recipe, "plan", extra)
    result = {key: _number(label + r"\s+([\d,.]+) MiB", report) for key, label in PARTS.items()}
    result["measured_mb"] = _number(r"PEAK_RSS_MB ([\d.]+)", _run(recipe, "fit", extra))
    result["ratio"] = result["predicted_mb"] / result["measured_mb"]
    return result


def main() -> None:
    """Check the given recipes, or all of them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipes", nargs="*", default=RECIPES)
    parser.add_argument("--no-readme", action="store_true", help="print only")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser.parse_args(argv[:cut]), argv[cut + 1 :]  # after "--": for plan and fit
    rows = {}
    for recipe in args.recipes:
        r = check(recipe, extra)
        rows[recipe] = (
            f"| {recipe} | {r['predicted_mb']:,.0f} | {r['measured_mb']:,.0f} | {r['ratio']:.2f} |"
        )
        print(rows[recipe], flush=True)
    if not args.no_readme:
        write_readme(rows)


def write_readme(rows: dict[str, str]) -> None:
    """Replace the given recipes' rows of the README's plan table; keep the others."""
    readme = ROOT / "README.md"
    text = readme.read_text()
    begin, end = "<!-- plan:begin -->\n", "\n<!-- plan:end -->"
    old = text[text.index(begin) + len(begin) : text.index(end)].splitlines()
    kept = {line.split("|")[1].strip(): line for line in old[2:] if line.startswith("| ")}
    kept.update(rows)
    lines = [
        "| recipe | planned peak (MiB) | measured peak (MiB) | planned / measured |",
        "|---|---|---|---|",
        *(kept[r] for r in RECIPES if r in kept),
    ]
    block = begin + "\n".join(lines) + end
    text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    readme.write_text(text)


if __name__ == "__main__":
    main()
