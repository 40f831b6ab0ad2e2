import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_ARGS

from gnnscale.cli import main
from gnnscale.testing import requires_sampler

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from check_plan import check  # noqa: E402

NEIGHBOR = ["--config", str(ROOT / "recipes/neighbor_sage/config.yaml")]


def _plan(tmp_path, *extra):
    args = ["plan", *NEIGHBOR, *TINY_ARGS, f"--data.root={tmp_path}", "--num_batches=3", *extra]
    return main([*args, "--data.loader.num_workers=0", "--data.loader.persistent_workers=false"])


@requires_sampler
def test_plan_counts_each_hop_and_adds_up(tmp_path):
    plan = _plan(tmp_path, "--data.batch_size=64")
    assert len(plan.batches) == 3
    for batch in plan.batches:
        # seeds, then the new nodes of each of the two hops; together every node of the batch
        assert len(batch.hop_nodes) == 3
        assert batch.hop_nodes[0] == 64
        assert batch.hop_nodes[1] <= 64 * 15
        assert sum(batch.hop_nodes) == batch.nodes
        assert batch.saved_mb > batch.feature_mb > 0
    assert plan.base_mb > plan.graph_mb > 0
    after_training = plan.resident_mb + max(plan.eval_mb, plan.checkpoint_mb)
    assert plan.peak_mb == pytest.approx(
        plan.growth_mb + max(plan.base_mb + plan.train_mb, after_training)
    )
    assert not plan.suggestions  # no budget given


@requires_sampler
def test_plan_counts_the_batches_each_process_draws(tmp_path):
    whole = _plan(tmp_path, "--data.batch_size=64").batches_per_epoch
    assert whole > 4
    # Data-parallel: each of the two processes draws half of the epoch's batches.
    ddp = _plan(tmp_path, "--data.batch_size=64", "--trainer.devices=2")
    assert ddp.batches_per_epoch == math.ceil(whole / 2)
    limited = _plan(tmp_path, "--data.batch_size=64", "--trainer.limit_train_batches=3")
    assert limited.batches_per_epoch == 3
    half = _plan(tmp_path, "--data.batch_size=64", "--trainer.limit_train_batches=0.5")
    assert half.batches_per_epoch == whole // 2


def _plan_in_new_process(tmp_path, *extra):
    """The printed report of ``gnnscale plan``, run as a user would: RSS starts afresh."""
    args = [*NEIGHBOR, *TINY_ARGS, f"--data.root={tmp_path}", "--num_batches=3", *extra]
    args += ["--data.loader.num_workers=0", "--data.loader.persistent_workers=false"]
    done = subprocess.run(
        [sys.executable, "-m", "gnnscale.cli", "plan", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    report = done.stdout + done.stderr

    def mib(label):
        return float(re.search(label + r"\s+([\d,]+) MiB", report).group(1).replace(",", ""))

    tips = re.findall(r"to fit the budget: (.*)", report)
    return {"base": mib("base after setup"), "train": mib("training step"), "tips": tips}


@requires_sampler
def test_budget_suggestion_fits_when_planned_again(tmp_path):
    big = ("--data.batch_size=256", "--model.init_args.hidden_channels=1024")
    sampled = "--data.eval.mode=sampled"
    plan = _plan_in_new_process(tmp_path, *big, sampled)
    budget_mb = plan["base"] + plan["train"] / 3
    tight = _plan_in_new_process(tmp_path, *big, sampled, f"--budget_gb={budget_mb / 1024}")
    (tip,) = [t for t in tight["tips"] if t.startswith("--data.batch_size")]
    assert int(re.search(r"batch_size=(\d+)", tip).group(1)) < 256
    # The suggested settings, planned again in a new process, fit the budget.
    args = [a for a in tip.replace(", ", ",").split(" ")]
    smaller = _plan_in_new_process(tmp_path, *big, sampled, *args)
    assert smaller["base"] + smaller["train"] <= budget_mb * 1.1


def test_plan_refuses_an_unknown_option(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["plan", *NEIGHBOR, "--data.batch_sise=64"])
    assert "batch_sise" in capsys.readouterr().err


# Large enough that the step, not the Python process, makes up a good part of the peak.
STEP_DOMINATES = ["--data.batch_size=2048", "--data.num_neighbors=[25, 15]"]
# Small training batches, evaluation over full two-hop neighbourhoods of 4,096 seeds each.
EVAL_DOMINATES = [
    "--data.batch_size=256",
    "--data.num_neighbors=[10, 5]",
    "--data.eval.num_neighbors=[-1, -1]",
]


@requires_sampler
@pytest.mark.parametrize("dominant", ["training", "evaluation"])
def test_plan_predicts_the_measured_peak_within_25_percent(tmp_path, dominant):
    args = [
        *NEIGHBOR,
        *TINY_ARGS,
        "--data.synthetic.num_nodes=40000",
        "--data.synthetic.train_fraction=0.3",
        "--model.init_args.hidden_channels=1024",
        "--data.eval.mode=sampled",
        *(STEP_DOMINATES if dominant == "training" else EVAL_DOMINATES),
        f"--data.root={tmp_path}",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--trainer.max_epochs=1",
    ]
    runner = (
        "import sys; from gnnscale.callbacks import peak_rss_mb; from gnnscale.cli import main; "
        "main(sys.argv[1:]); print('PEAK', peak_rss_mb())"
    )
    out = {}
    for command in ("plan", "fit"):
        done = subprocess.run(
            [sys.executable, "-c", runner, command, *args],
            capture_output=True,
            text=True,
            check=True,
            cwd=tmp_path,
        )
        out[command] = done.stdout + done.stderr

    def mib(label):
        return float(re.search(label + r"\s+([\d,]+)", out["plan"]).group(1).replace(",", ""))

    planned, base = mib("expected peak"), mib("base after setup")
    train, evaluation = mib("training step"), mib("evaluation")
    measured = float(re.search(r"PEAK ([\d.]+)", out["fit"]).group(1))
    assert (train > evaluation) == (dominant == "training"), (train, evaluation)
    assert planned - base > 0.3 * measured, "the test graph should make the step matter"
    assert abs(planned / measured - 1) <= 0.25, (planned, measured)


@requires_sampler
@pytest.mark.parametrize("checkpoint_io", ["streaming", "lightning"])
def test_plan_counts_saving_and_loading_a_large_embedding_table(tmp_path, checkpoint_io):
    # sparse_embeddings with a 500k x 128 table: 244 MiB, 732 MiB with its SparseAdam moments.
    # Lightning's own CheckpointIO holds a second copy of all of it while it saves; gnnscale's
    # streams it to disk and, loading the best checkpoint for the test, reads only the table.
    extra = [
        "--data.synthetic.num_nodes=500000",
        "--model.init_args.embedding_dim=128",
        "--data.batch_size=512",
        "--data.num_neighbors=[5, 5]",
        "--data.eval.batch_size=1024",
        "--trainer.precision=32",
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=20",
        "--trainer.limit_val_batches=3",
        "--trainer.limit_test_batches=3",
        "--data.loader.num_workers=0",
        "--data.loader.persistent_workers=false",
        f"--data.root={tmp_path / 'data'}",
        f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
    ]
    if checkpoint_io == "lightning":
        extra.append("--trainer.plugins=lightning.fabric.plugins.TorchCheckpointIO")
    result = check("sparse_embeddings", extra)
    table_mb = 500_000 * 128 * 4 / 2**20
    if checkpoint_io == "lightning":
        assert result["checkpoint_mb"] > 2.5 * table_mb, result
        after_training = result["resident_mb"] + result["checkpoint_mb"]
        assert after_training > result["base_mb"] + result["train_mb"], "the save sets the peak"
    else:
        assert result["checkpoint_mb"] < 1.5 * table_mb, result
    assert abs(result["ratio"] - 1) <= 0.25, result
