import math
import re
import subprocess
import sys

import pytest

from gnnscale.cli import main
from gnnscale.errors import ConfigError
from gnnscale.registry import recipe
from gnnscale.testing import TINY_ARGS, requires_sampler

NEIGHBOR = ["--config", str(recipe("neighbor_sage").config)]
# Runs a recipe command (Recipe.argv) and prints the peak resident memory of its process.
RUNNER = """
import runpy, sys
from gnnscale.measure import peak_rss_mb
entry, *sys.argv[1:] = sys.argv[1:]
if entry == "-m":
    module, *sys.argv[1:] = sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
else:
    sys.argv[0] = entry
    runpy.run_path(entry, run_name="__main__")
print("PEAK", peak_rss_mb())
"""


def _plan(tmp_path, *extra):
    args = ["plan", *NEIGHBOR, *TINY_ARGS, f"--data.root={tmp_path}", "--num_batches=3", *extra]
    cli = main([*args, "--data.loader.num_workers=0", "--data.loader.persistent_workers=false"])
    return cli.trainer.memory_plan


def _mib(label, report):
    return float(re.search(label + r"\s+([\d,.]+)", report).group(1).replace(",", ""))


def _plan_and_fit(tmp_path, name, *args):
    """The printed plan and the measured peak of ``fit``, each in a fresh process."""
    out = {}
    for command in ("plan", "fit"):
        python, *rest = recipe(name).argv(command, *args)
        done = subprocess.run(
            [python, "-c", RUNNER, *rest], capture_output=True, text=True, cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr[-3000:]
        out[command] = done.stdout + done.stderr
    return out["plan"], _mib("PEAK", out["fit"])


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
    assert "args parameter is intended" not in report  # the command passes no args to the CLI

    def mib(label):
        return float(re.search(label + r"\s+([\d,]+) MiB", report).group(1).replace(",", ""))

    tips = re.findall(r"to fit the budget: (.*)", report)
    return {"base": mib("base after setup"), "train": mib("training step"), "tips": tips}


@pytest.mark.slow
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


def test_plan_refuses_an_unknown_option(tmp_path):
    with pytest.raises(ConfigError, match="batch_sise is not an option .* did you mean"):
        main(["plan", *NEIGHBOR, "--data.batch_sise=64"])


# Large enough that the step, not the Python process, makes up a good part of the peak (layers
# compute only the rows the next one reads, so it takes wide layers and large batches).
STEP_DOMINATES = ["--data.batch_size=4096", "--data.num_neighbors=[25, 15]"]
# Small training batches, evaluation over full two-hop neighbourhoods of 8,192 seeds each.
EVAL_DOMINATES = [
    "--data.batch_size=256",
    "--data.num_neighbors=[10, 5]",
    "--data.eval.num_neighbors=[-1, -1]",
    "--data.eval.batch_size=8192",
]


@pytest.mark.slow
@requires_sampler
@pytest.mark.parametrize("dominant", ["training", "evaluation"])
def test_plan_predicts_the_measured_peak_within_25_percent(tmp_path, dominant):
    args = [
        *TINY_ARGS,
        "--data.synthetic.num_nodes=40000",
        "--data.synthetic.train_fraction=0.3",
        "--model.init_args.hidden_channels=2048",
        "--data.eval.mode=sampled",
        *(STEP_DOMINATES if dominant == "training" else EVAL_DOMINATES),
        f"--data.root={tmp_path}",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--trainer.max_epochs=1",
    ]
    report, measured = _plan_and_fit(tmp_path, "neighbor_sage", *args)
    planned, base = _mib("expected peak", report), _mib("base after setup", report)
    train, evaluation = _mib("training step", report), _mib("evaluation", report)
    assert (train > evaluation) == (dominant == "training"), (train, evaluation)
    assert planned - base > 0.3 * measured, "the test graph should make the step matter"
    assert abs(planned / measured - 1) <= 0.25, (planned, measured)


@pytest.mark.slow
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
    report, measured = _plan_and_fit(tmp_path, "sparse_embeddings", *extra)
    part = {k: _mib(k, report) for k in ("base after setup", "training step", "expected peak")}
    resident, checkpoint = (
        _mib("resident after steps", report),
        _mib(r"checkpoint save\+load", report),
    )
    table_mb = 500_000 * 128 * 4 / 2**20
    if checkpoint_io == "lightning":
        assert checkpoint > 2.5 * table_mb, report
        after_training = resident + checkpoint
        assert after_training > part["base after setup"] + part["training step"], "save sets peak"
    else:
        assert checkpoint < 1.5 * table_mb, report
    assert abs(part["expected peak"] / measured - 1) <= 0.25, (part, measured)
