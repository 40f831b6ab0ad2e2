"""Each sampler recipe runs as copied through the real CLI, on tiny settings."""

import csv
import math
import re
import shlex
import shutil
from pathlib import Path

import pytest

from gnnscale.cli import main
from gnnscale.testing import requires_sampler, requires_torch_sparse

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "--trainer.accelerator=cpu",
    "--trainer.enable_progress_bar=false",
    "--data.init_args.synthetic.num_nodes=3000",
    "--data.init_args.synthetic.num_features=32",
    "--data.init_args.synthetic.num_classes=5",
    "--data.init_args.loader.num_workers=0",
    "--data.init_args.loader.persistent_workers=false",
    "--data.init_args.synthetic.train_fraction=0.3",
    "--model.init_args.hidden_channels=64",
    "--model.init_args.optimizer.init_args.lr=0.01",
    "--trainer.max_epochs=4",
]
RECIPES = [
    pytest.param("neighbor_sage", [], marks=requires_sampler),
    pytest.param("cluster_gcn", ["--data.init_args.num_parts=20"], marks=requires_sampler),
    pytest.param(
        "graphsaint",
        ["--data.init_args.batch_size=300", "--data.init_args.num_steps=6"],
        marks=requires_torch_sparse,
    ),
]


def _column(run_dir: Path, key: str) -> list[float]:
    (path,) = run_dir.rglob("metrics.csv")
    with path.open() as f:
        return [float(r[key]) for r in csv.DictReader(f) if r.get(key)]


@pytest.mark.parametrize("recipe,extra", RECIPES)
def test_recipe_runs_as_copied(tmp_path, monkeypatch, recipe, extra):
    # A copied folder, run from elsewhere, with only gnnscale installed.
    copy = shutil.copytree(REPO / "recipes" / recipe, tmp_path / "my_recipe")
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(copy / "config.yaml"), *TINY, *extra])
    runs = tmp_path / "runs"
    losses = _column(runs, "train/loss_epoch")
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]
    assert _column(runs, "test/acc")[-1] > 0.4  # 2x chance on 5 classes
    assert _column(runs, "perf/epoch_s")  # ThroughputMonitor wrote its figures


@requires_sampler
def test_readme_quick_start_command(tmp_path, monkeypatch):
    """The README's main command, with tiny settings appended, trains and tests."""
    readme = (REPO / "README.md").read_text()
    command = re.search(r"\.venv/bin/gnnscale (fit --config \S+)", readme).group(1)
    args = shlex.split(command)
    args[2] = str(REPO / args[2])
    monkeypatch.chdir(tmp_path)
    main([*args, *TINY, "--trainer.max_epochs=1"])
    assert _column(tmp_path / "runs", "test/acc")
