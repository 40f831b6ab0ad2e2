import csv
import importlib.util
import math
from pathlib import Path

import pytest

from gnnscale.cli import main

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "gat_attention_memory"


def _load_measure():
    spec = importlib.util.spec_from_file_location(
        "gat_attention_memory_measure", RECIPE / "measure.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recipe_trains_through_the_cli(tmp_path):
    main(
        [
            "fit",
            "--config",
            str(RECIPE / "config.yaml"),
            "--trainer.accelerator=cpu",
            "--trainer.max_epochs=2",
            "--trainer.enable_progress_bar=false",
            "--data.init_args.synthetic.num_nodes=300",
            "--model.init_args.hidden_channels=64",
            f"--trainer.default_root_dir={tmp_path}",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            f"--data.root={tmp_path}",
        ]
    )
    (path,) = tmp_path.rglob("metrics.csv")
    with path.open() as f:
        losses = [float(r["train/loss_epoch"]) for r in csv.DictReader(f) if r["train/loss_epoch"]]
    assert len(losses) == 2
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0]


@pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="peak RSS reset needs Linux /proc"
)
def test_dense_grows_with_n_squared_edgewise_with_edges_and_cheap_heads_cost_less():
    measure = _load_measure()
    shape = {"graphs": 2, "classes": 128, "hidden": 64}
    dense = [{"kind": "dense", "nodes": n, "avg_degree": 4, **shape} for n in (40, 80)]
    edge = {"kind": "edge", "nodes": 200, "features": 6, "heads": 8, **shape}
    edgewise = [{**edge, "avg_degree": d, "model": {"out_heads": 8}} for d in (4, 16)]
    cheap = [
        {**edge, "avg_degree": 16, "model": m} for m in ({"out_heads": 1}, {"linear_head": True})
    ]
    d40, d80, e4, e16, heads1, linear = measure.measure(dense + edgewise + cheap)

    assert 3.0 < d80 / d40 < 5.0  # N doubled: ~4x, the [B, N, N, 2F] pairs
    edges = [measure.batch_of_graphs(2, 200, d, 6, 128).num_edges + 400 for d in (4, 16)]
    assert 0.6 < (e16 / e4) / (edges[1] / edges[0]) < 1.2  # ~E (plus a small O(N) part)
    assert heads1 < 0.5 * e16
    assert linear < 0.5 * e16
