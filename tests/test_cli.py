import csv
import errno
import math
import os
import re
import runpy
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
from jsonargparse import Namespace
from registry import recipe

import gnnscale.cli
import gnnscale.cli.command
import gnnscale.cli.runtime
import gnnscale.data.node
from gnnscale import FullBatchDataModule, make_synthetic_graph
from gnnscale.cli import main
from gnnscale.cli.prepare import prepare_graphs_main, prepare_main
from gnnscale.errors import ConfigError, GnnscaleError, TrainingDiverged
from gnnscale.measure import read_metrics
from gnnscale.stores.manifest import PreparedGraphError
from gnnscale.testing import (
    TINY,
    centroid_accuracy,
    cli_args,
)

REPO = Path(__file__).resolve().parents[1]
# The committed configs, not a run's dump (LightningCLI writes `config.yaml` where it runs).
_TRACKED = subprocess.run(["git", "ls-files", "*.yaml"], cwd=REPO, capture_output=True, text=True)
YAMLS = sorted(REPO / p for p in _TRACKED.stdout.split())


def _metrics(log_dir: Path) -> list[dict[str, str]]:
    (path,) = log_dir.rglob("metrics.csv")
    with path.open() as f:
        return list(csv.DictReader(f))


def _column(rows, key) -> list[float]:
    return [float(r[key]) for r in rows if r.get(key)]


def _fit(tmp_path: Path, *args: str):
    # The classes first: their init_args (--data.root in cli_args) are parsed against them.
    classes = [a for a in args if a.startswith(("--data=", "--model="))]
    rest = [a for a in args if a not in classes]
    return main(["fit", *classes, *cli_args(tmp_path), *rest])


def _fit_planetoid(tmp_path: Path, *args: str):
    """The planetoid recipe on the tiny generated graph (its config first, then overrides)."""
    config = ["--config", str(recipe("planetoid").config), "--data.dataset=synthetic"]
    return main(["fit", *config, *cli_args(tmp_path), *args])


def test_repo_has_yaml_configs():
    assert any("recipes" in p.parts for p in YAMLS)


@pytest.mark.parametrize("path", YAMLS, ids=[str(p.relative_to(REPO)) for p in YAMLS])
def test_every_yaml_parses_through_the_cli(path, capsys, monkeypatch):
    script = path.parent / "train.py"
    argv = ["fit", "--config", str(path), "--print_config"]
    if path.name == "prepare.yaml":  # `gnnscale prepare --config`: no model, no trainer
        graphs = recipe(path.parent.name).prepare_command == "prepare-graphs"
        with pytest.raises(SystemExit) as exit:
            (prepare_graphs_main if graphs else prepare_main)(
                ["--config", str(path), "--print_config"]
            )
        assert exit.value.code in (0, None)
        assert ("atoms:" if graphs else "synthetic:") in capsys.readouterr().out
        return
    with pytest.raises(SystemExit) as exit:
        if script.exists():  # run the way its users do: the recipe script defines the model
            monkeypatch.setattr(sys, "argv", [str(script), *argv])
            runpy.run_path(str(script), run_name="__main__")
        else:
            main(argv)
    assert exit.value.code in (0, None)
    assert "class_path" in capsys.readouterr().out


@pytest.mark.parametrize("model", ["GraphSAGE", "GATv2"])
@pytest.mark.parametrize(
    "data,extra",
    [
        # One batch per epoch: accumulating 2 would step on half the gradient (refused).
        ("FullBatchDataModule", ["--trainer.max_epochs=40", "--trainer.accumulate_grad_batches=1"]),
        pytest.param(
            "NeighborDataModule",
            ["--data.batch_size=256", "--data.num_neighbors=[10, 5]"],
        ),
        pytest.param(
            "ClusterDataModule",
            ["--data.num_parts=20", "--data.clusters_per_batch=4"],
        ),
        pytest.param(
            "SAINTDataModule",
            ["--data.batch_size=300", "--data.num_steps=5"],
        ),
    ],
)
def test_fit_trains_and_tests_through_the_cli(tmp_path, data, extra, model):
    cli = _fit(
        tmp_path,
        f"--data=gnnscale.{data}",
        f"--model=gnnscale.{model}",
        "--model.optimizer=torch.optim.Adam",
        "--model.optimizer.lr=0.01",
        "--trainer.max_epochs=6",
        "--model.dropout=0.2",  # the defaults (0.5, 0.6) are for long runs; this one is short
        "--trainer.accumulate_grad_batches=2",
        "--trainer.precision=bf16-mixed",
        *extra,
    )
    # Linked from the data, never typed: in_channels and num_classes.
    assert cli.model.hparams.in_channels == 32 and cli.model.hparams.num_classes == 5
    rows = _metrics(tmp_path / "runs")
    losses = _column(rows, "train/loss_epoch") or _column(rows, "train/loss")
    assert losses and all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]
    # The best checkpoint is tested after fit; it must read the edges, not the features alone.
    bar = centroid_accuracy(cli.datamodule.data)
    assert _column(rows, "test/acc")[-1] > bar + 0.1, bar
    assert list((tmp_path / "runs").rglob("config.yaml"))  # resolved config saved with the run


def test_fanout_must_match_layers_and_is_refused_before_training(tmp_path):
    with pytest.raises(
        ValueError, match=r"--data.num_neighbors has 3 entries .* --model.num_layers is 2"
    ):
        _fit(
            tmp_path,
            "--data=gnnscale.NeighborDataModule",
            "--model=gnnscale.GraphSAGE",
            "--data.num_neighbors=[5, 5, 5]",
            "--trainer.max_epochs=1",
        )
    # Refused once model and data exist, before the Trainer starts: no run folder, no logs.
    assert not (tmp_path / "runs").exists()


def test_resumed_run_continues_where_it_stopped(tmp_path):
    common = [
        "--data=gnnscale.FullBatchDataModule",
        "--model=gnnscale.GraphSAGE",
        "--model.optimizer=torch.optim.Adam",
        "--model.optimizer.lr=0.01",
    ]
    first = _fit(tmp_path, *common, "--trainer.max_epochs=4")
    assert first.trainer.global_step == 4
    (ckpt,) = (tmp_path / "runs").rglob("*.ckpt")
    second = _fit(tmp_path, *common, "--trainer.max_epochs=7", f"--ckpt_path={ckpt}")
    assert second.trainer.global_step == 7  # 3 more steps, not 7 from scratch
    rows = _metrics(tmp_path / "runs" / "lightning_logs" / "version_1")
    epochs = sorted({int(r["epoch"]) for r in rows if r.get("train/loss_epoch")})
    assert epochs == [4, 5, 6]


def test_plan_is_a_subcommand_with_its_own_options(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert re.search(r"^\s+plan\s+Predict the run's peak memory", capsys.readouterr().out, re.M)
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = capsys.readouterr().out
    assert "--budget_gb BUDGET_GB" in out and "--num_batches NUM_BATCHES" in out
    assert "--trainer.precision" in out  # and every option of the run it plans


@pytest.mark.parametrize(
    "config,bad,message",
    [
        ("neighbor_sage", "--data.batch_size=0", "--data.batch_size must be > 0 (got 0)"),
        pytest.param(
            "cluster_gcn",  # refused in setup, once the graph is loaded
            "--data.num_parts=5000",
            "--data.num_parts (5000) is larger than the graph (1000 nodes)",
            marks=pytest.mark.slow,  # each case starts the command twice
        ),
    ],
)
def test_refused_input_is_one_line_without_traceback(tmp_path, config, bad, message):
    argv = [sys.executable, "-m", "gnnscale.cli", "fit", "--config", str(recipe(config).config)]
    argv += ["--data.synthetic.num_nodes=1000", "--trainer.max_epochs=1", bad]
    env = {**os.environ, "GNNSCALE_DEBUG": ""}
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(f"gnnscale: error: {message}")
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.rglob("version_*"))  # a failed run leaves no empty log folder
    env["GNNSCALE_DEBUG"] = "1"
    debug = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert debug.returncode != 0 and "Traceback" in debug.stderr and message in debug.stderr


def test_a_refusal_from_a_loader_worker_is_one_line_too(monkeypatch, capsys):
    """torch re-raises a worker's exception with the worker's traceback as its message."""

    def sample(_):
        raise PreparedGraphError("row.bin holds a damaged neighbour id")

    loader = torch.utils.data.DataLoader(range(4), num_workers=1, collate_fn=sample)
    monkeypatch.setattr(gnnscale.cli.command, "main", lambda: next(iter(loader)))
    monkeypatch.setattr(sys, "argv", ["gnnscale", "fit"])
    monkeypatch.delenv("GNNSCALE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as done:
        gnnscale.cli.run()
    assert done.value.code == 2
    assert capsys.readouterr().err == "gnnscale: error: row.bin holds a damaged neighbour id\n"


def test_an_error_once_the_trainer_started_leaves_no_run_folder(tmp_path, monkeypatch):
    def refuse(self):
        raise ConfigError("refused while the fit loop starts")

    monkeypatch.setattr(FullBatchDataModule, "train_dataloader", refuse)
    with pytest.raises(ConfigError, match="refused while the fit loop starts"):
        _fit_planetoid(tmp_path, "--trainer.max_epochs=1")
    assert not list((tmp_path / "runs").rglob("version_*"))  # config.yaml, hparams.yaml: gone


def test_a_diverging_run_stops_and_reports_no_result(tmp_path):
    huge_lr = ["--model.optimizer=torch.optim.SGD", "--model.optimizer.init_args.lr=1e12"]
    with pytest.raises(TrainingDiverged, match=r"the training loss is (nan|inf) at step \d+"):
        _fit_planetoid(tmp_path, *huge_lr, "--trainer.max_epochs=20")
    for path in tmp_path.rglob("metrics.csv"):  # no accuracy from a broken model
        assert "test/acc" not in read_metrics(path)


def test_non_finite_features_are_refused_with_a_count(monkeypatch):
    data = make_synthetic_graph(TINY)
    data.x[[3, 7]] = float("nan")
    data.x[11, 0] = float("inf")
    monkeypatch.setattr(gnnscale.data.node, "load_dataset", lambda *a: data)
    with pytest.raises(ConfigError, match="3 node\\(s\\) have NaN or infinite features"):
        _ = FullBatchDataModule().data


@pytest.mark.parametrize("precision", ["bf16-true", "64-true"])
def test_true_precisions_train(tmp_path, precision):
    """The parameters' dtype, not float32, is what the features are cast to."""
    _fit_planetoid(tmp_path, "--trainer.max_epochs=2", f"--trainer.precision={precision}")
    metrics = read_metrics(tmp_path / "runs")
    assert all(math.isfinite(v) for v in metrics["train/loss_epoch"]) and metrics["test/acc"]


@pytest.mark.parametrize(
    ("native", "keep", "asked", "runs"),
    [
        (False, None, "bf16-mixed", "32-true"),  # reference kernels: 6x slower, so fp32
        (False, "1", "bf16-mixed", "bf16-mixed"),  # GNNSCALE_CPU_BF16=1: bf16 for its memory
        (True, None, "bf16-mixed", "bf16-mixed"),  # oneDNN's bf16 kernels: as asked
        (False, None, "bf16-true", "bf16-true"),  # bf16 parameters: as asked
    ],
)
def test_cpu_bf16_autocast_falls_back_to_fp32_without_bf16_kernels(
    tmp_path, monkeypatch, native, keep, asked, runs
):
    monkeypatch.setattr(gnnscale.cli.runtime, "cpu_bf16_native", lambda: native)
    if keep is None:
        monkeypatch.delenv("GNNSCALE_CPU_BF16", raising=False)
    else:
        monkeypatch.setenv("GNNSCALE_CPU_BF16", keep)
    config = ["--config", str(recipe("planetoid").config), "--data.dataset=synthetic"]
    args = [*config, *cli_args(tmp_path), f"--trainer.precision={asked}"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = main(args, run=False)
    assert cli.trainer.precision == runs
    said = [str(w.message) for w in caught if "GNNSCALE_CPU_BF16" in str(w.message)]
    assert len(said) == (runs != asked)  # the switch is said once, and only when made


def test_a_key_given_twice_in_a_config_is_refused(tmp_path):
    """YAML keeps the last of two equal keys without a word; a config's typo can hide that way
    (two ``max_epochs``, the first the one the user meant)."""
    base = recipe("neighbor_sage").config.read_text()
    doubled = base.replace("  max_epochs: 4\n", "  max_epochs: 4\n  max_epochs: 40\n", 1)
    assert doubled != base
    config = tmp_path / "config.yaml"
    config.write_text(doubled)
    line = doubled.splitlines().index("  max_epochs: 4") + 1
    message = f"{config}: key 'max_epochs' is given twice (lines {line} and {line + 1})"
    with pytest.raises(ConfigError, match=re.escape(message)):
        main(["fit", "--config", str(config), *cli_args(tmp_path)])
    assert not (tmp_path / "runs").exists()
    # merge keys repeat by design, and equal keys in different mappings are not a repeat
    config.write_text("a: &x {k: 1}\nb:\n  <<: *x\n  k: 2\nc: {k: 3}\n")
    gnnscale.cli.checks.check_config_keys([f"--config={config}"])


def _ddp(start_method):
    return Namespace(
        class_path="lightning.pytorch.strategies.DDPStrategy",
        init_args=Namespace(start_method=start_method),
    )


@pytest.mark.parametrize(
    ("strategy", "asks"),
    [
        ("auto", True),
        ("ddp_spawn", True),
        (_ddp("spawn"), True),
        ("ddp_fork", False),
        ("ddp_notebook", False),
        (_ddp("fork"), False),  # the multi_gpu_ddp recipe's
    ],
)
def test_a_forking_strategy_leaves_cuda_uninitialised(monkeypatch, strategy, asks):
    """``torch.cuda.is_bf16_supported`` initialises CUDA, and a forked rank then cannot use
    it ("Cannot re-initialize CUDA in forked subprocess", seen on the first GPU run)."""
    asked = []
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: asked.append(1) or False)
    if asks:
        with pytest.raises(ConfigError, match="this GPU has no bf16"):
            gnnscale.cli.runtime.check_precision("bf16-mixed", "gpu", strategy)
    else:
        gnnscale.cli.runtime.check_precision("bf16-mixed", "gpu", strategy)
    assert len(asked) == asks


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("GNNSCALE_MMAP_THRESHOLD", "64k", "GNNSCALE_MMAP_THRESHOLD must be 0 for glibc"),
        ("GNNSCALE_CPU_BF16", "yes", r"GNNSCALE_CPU_BF16 must be 1 or 0 \(got 'yes'\)"),
        ("GNNSCALE_MEMORY_LIMIT", "2 gallons", "GNNSCALE_MEMORY_LIMIT must be auto .* or a size"),
    ],
)
def test_a_malformed_environment_variable_is_one_line(tmp_path, monkeypatch, name, value, message):
    monkeypatch.setattr(gnnscale.cli.runtime, "cpu_bf16_native", lambda: False)
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        _fit_planetoid(tmp_path, "--trainer.precision=bf16-mixed")
    assert not (tmp_path / "runs").exists()


def test_a_recipe_fit_prints_no_warning_a_user_cannot_act_on_and_one_test_table(
    tmp_path, capsys, caplog
):
    # The messages gnnscale silences, each alone: any other warning still reaches the user.
    from gnnscale.cli.runtime import UNACTIONABLE

    config = ["--config", str(recipe("neighbor_sage").config)]
    args = ["--trainer.max_epochs=2", "--trainer.limit_train_batches=2", "--data.batch_size=256"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(["fit", *config, *cli_args(tmp_path), *args])
        warnings.warn("a warning gnnscale does not know", UserWarning, stacklevel=1)
    messages = [str(w.message) for w in caught]
    assert "a warning gnnscale does not know" in messages  # not silenced wholesale
    for silenced in UNACTIONABLE:
        assert not [m for m in messages if silenced in m], silenced
    # `.test(ckpt_path="best")` with the recipe's two ModelCheckpoints: Lightning's warning.
    assert not [m for m in messages if "multiple `ModelCheckpoint`" in m]
    printed = capsys.readouterr()
    assert "litlogger" not in printed.out + printed.err + caplog.text
    assert (printed.out + printed.err).count("test/acc") == 1


NEIGHBOUR_BATCHES = ["--data=gnnscale.NeighborDataModule", "--data.batch_size=256"]  # 4 an epoch


class AllocatorStages(L.Callback):
    """Counts ``runtime.keep_freed_memory``'s calls (``CALLS``) at the end of each stage."""

    CALLS: list[bool] = []
    stages: list[tuple[str, int]] = []

    def on_train_end(self, trainer, pl_module):
        self.stages.append(("fit", len(self.CALLS)))

    def on_test_end(self, trainer, pl_module):
        self.stages.append(("test", len(self.CALLS)))


@pytest.mark.parametrize(
    ("args", "env", "switched"),
    [
        # layer-wise validation every epoch, then the test: switched for the test alone
        ([*NEIGHBOUR_BATCHES, "--data.eval.mode=layerwise"], None, ["test"]),
        ([*NEIGHBOUR_BATCHES, "--data.eval.mode=sampled"], None, []),
        (["--data=gnnscale.FullBatchDataModule"], None, ["fit"]),  # one batch an epoch
        ([*NEIGHBOUR_BATCHES, "--data.eval.mode=layerwise"], "131072", []),  # the user's
    ],
)
def test_freed_memory_is_kept_where_steps_repeat_and_nothing_trains_after(
    tmp_path, monkeypatch, args, env, switched
):
    calls, stages = [], []
    monkeypatch.setattr(AllocatorStages, "CALLS", calls)
    monkeypatch.setattr(AllocatorStages, "stages", stages)
    monkeypatch.setattr(gnnscale.cli.runtime, "keep_freed_memory", lambda: calls.append(True))
    monkeypatch.setattr(gnnscale.cli.runtime, "trim_heap", lambda: None)
    if env is not None:  # a fixed threshold the user chose: left alone
        monkeypatch.setenv("GNNSCALE_MMAP_THRESHOLD", env)
    callback = f"--trainer.callbacks+={__name__}.AllocatorStages"
    _fit(tmp_path, *args, "--model=gnnscale.GraphSAGE", "--trainer.max_epochs=2", callback)
    assert [stage for stage, _ in stages] == ["fit", "test"]
    made = {stage: n - before for (stage, n), before in zip(stages, [0, stages[0][1]], strict=True)}
    assert made == {stage: int(stage in switched) for stage in ("fit", "test")}, stages


def test_null_for_a_nested_key_on_the_command_line_is_one_line_naming_the_flag_that_works(
    capsys,
):
    # jsonargparse does not read `--data.init_args.eval.val_nodes=null`; its mapping form works.
    config = ["fit", "--config", str(REPO / "recipes" / "neighbor_sage" / "config.yaml")]
    flag = "--data.init_args.eval='{val_nodes: null}'"
    with pytest.raises(ConfigError, match=re.escape(f"{flag} (the group's other settings")):
        main([*config, "--data.init_args.eval.val_nodes=null", "--print_config"])
    with pytest.raises(SystemExit):
        main([*config, "--data.init_args.eval={val_nodes: null}", "--print_config"])
    printed = capsys.readouterr().out
    assert "val_nodes: null" in printed and "val_mode: sampled" in printed  # the rest kept
    # A key that takes no null is not sent to the mapping form: its own types, the value null.
    with pytest.raises(ConfigError, match=r"loader.num_workers: Expected a int.* got 'null'$"):
        main([*config, "--data.init_args.loader.num_workers=null", "--print_config"])


def test_predict_stops_on_sigterm_with_143_and_leaves_no_file(tmp_path):
    """As fit does: a scheduler's SIGTERM stops it (it ran on and exited 0), and its writer
    leaves no half file."""
    common = ["--data=gnnscale.NeighborDataModule", "--model=gnnscale.GraphSAGE"]
    common += ["--data.num_neighbors=[5, 5]", "--data.eval.mode=sampled"]
    common += ["--data.eval.batch_size=700"]  # five batches
    _fit(tmp_path, *common, "--trainer.max_epochs=1")
    (ckpt,) = (tmp_path / "runs").rglob("*.ckpt")
    args = ["predict", *common[:2], *cli_args(tmp_path), *common[2:], f"--ckpt_path={ckpt}"]
    args += ["--trainer.callbacks+=gnnscale.testing.KillAtPredictBatch"]
    args += ["--trainer.callbacks.batch=1"]  # after the second of five batches
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped:
        main(args)
    assert stopped.value.code == 143
    runs = (tmp_path / "runs").rglob("*")
    assert [p for p in runs if "predictions" in p.parts and p.is_file()] == []
    assert signal.getsignal(signal.SIGTERM) == before  # given back


def test_predict_into_a_full_disk_is_one_line_and_leaves_no_file(tmp_path, monkeypatch):
    import errno

    import pyarrow.parquet as pq

    common = ["--data=gnnscale.NeighborDataModule", "--model=gnnscale.GraphSAGE"]
    common += ["--data.num_neighbors=[5, 5]", "--data.eval.mode=sampled"]
    common += ["--data.eval.batch_size=700"]  # five batches
    _fit(tmp_path, *common, "--trainer.max_epochs=1")
    (ckpt,) = (tmp_path / "runs").rglob("*.ckpt")
    real, writes = pq.ParquetWriter.write_table, []

    def filling(self, table, *args, **kwargs):
        writes.append(1)
        if len(writes) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, table, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", filling)
    args = ["predict", *common[:2], *cli_args(tmp_path), *common[2:], f"--ckpt_path={ckpt}"]
    with pytest.raises(GnnscaleError, match=r"writing predictions into .* failed \(No space "):
        main(args)
    runs = (tmp_path / "runs").rglob("*")
    assert [p for p in runs if "predictions" in p.parts and p.is_file()] == []


def test_a_predict_that_fails_before_its_first_write_leaves_the_failure_its_own_line():
    from gnnscale.callbacks import PredictionWriter

    # A full disk may fail the run before the writer has a file (its logger's folder): the
    # cleanup then has nothing to remove (it unlinked Path(), '.', and raised IsADirectoryError).
    PredictionWriter().on_exception(None, None, OSError(28, "No space left on device"))


@pytest.mark.parametrize("mode", ["layerwise", "sampled"])
def test_predict_writes_each_nodes_class_to_parquet(tmp_path, mode):
    import pyarrow.parquet as pq

    common = [
        "--data=gnnscale.NeighborDataModule",
        "--model=gnnscale.GraphSAGE",
        "--data.num_neighbors=[5, 5]",
        f"--data.eval.mode={mode}",
        "--data.eval.num_neighbors=[-1, -1]",  # sampled at full fan-out: exact too
        "--data.eval.batch_size=700",  # several batches, one file
    ]
    _fit(tmp_path, *common, "--trainer.max_epochs=1")
    (ckpt,) = (tmp_path / "runs").rglob("*.ckpt")
    classes = [a for a in common if a.startswith(("--data=", "--model="))]
    rest = [a for a in common if a not in classes]
    cli = main(["predict", *classes, *cli_args(tmp_path), *rest, f"--ckpt_path={ckpt}"])
    folder = Path(cli.trainer.logger.log_dir) / "predictions"
    assert sorted(p.name for p in folder.iterdir()) == ["part-0.parquet"]  # no partial left
    table = pq.read_table(folder)
    data = cli.datamodule.data
    assert table.column("node").to_pylist() == list(range(data.num_nodes))
    model = cli.model.eval()  # the checkpoint's weights, loaded by predict
    with torch.no_grad():
        expected = model.gnn(data.x, data.edge_index).argmax(-1)
    assert table.column("class").to_pylist() == expected.tolist()


def test_help_names_every_subcommand_and_each_its_own(capsys, monkeypatch):
    """``gnnscale --help`` read "Lightning Trainer command line tool" and left out the two
    writers; ``gnnscale prepare --help`` said ``usage: gnnscale``."""
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    assert "Lightning Trainer command line tool" not in shown
    for name in ("fit", "validate", "test", "predict", "plan"):
        assert re.search(rf"^    {name} ", shown, re.M), name
    for name in gnnscale.cli.SUBCOMMANDS:
        assert re.search(rf"^  gnnscale {name} +\S", shown, re.M), name
    for name, command in (("prepare", prepare_main), ("prepare-graphs", prepare_graphs_main)):
        with pytest.raises(SystemExit):
            command(["--help"])
        assert capsys.readouterr().out.startswith(f"usage: gnnscale {name} ")
        monkeypatch.setattr(sys, "argv", ["gnnscale", name, "--help"])
        with pytest.raises(SystemExit):
            gnnscale.cli.run()  # the table dispatches it
        assert capsys.readouterr().out.startswith(f"usage: gnnscale {name} ")


@pytest.mark.parametrize("subcommand", ["fit", "plan"])
def test_an_option_is_taken_only_as_spelled_in_full(subcommand):
    """argparse would take a prefix: ``speed.target_only`` meant ``target_only_layers``."""
    config = [subcommand, "--config", str(REPO / "recipes" / "neighbor_sage" / "config.yaml")]
    for flag in ("--model.init_args.speed.target_only=false", "--trainer.max_epo=1"):
        with pytest.raises(ConfigError, match=re.escape(flag.split("=")[0].split(".")[-1])):
            main([*config, flag, "--print_config"])


@pytest.mark.parametrize("command", [prepare_main, prepare_graphs_main])
def test_a_writers_option_is_taken_only_as_spelled_in_full(tmp_path, command):
    flags = [f"--ou={tmp_path / 'out'}", "--source=Dataset", "--atoms.num_graphs=10"]
    with pytest.raises(ConfigError, match="--ou="):
        command(flags[:2] if command is prepare_main else flags[::2])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("code", "status", "line"),
    [
        (errno.EROFS, 2, "cannot write /mnt/runs/x (Read-only file system): make that folder"),
        (errno.ENOSPC, 1, "no room to write /mnt/runs/x (No space left on device); what was"),
    ],
)
def test_a_folder_that_cannot_be_written_is_one_line(monkeypatch, capsys, code, status, line):
    import gnnscale.cli.command as cli

    def failing(*args, **kwargs):  # as Lightning's logger or a checkpoint save fails there
        raise OSError(code, os.strerror(code), "/mnt/runs/x")

    monkeypatch.setattr(cli, "main", failing)
    monkeypatch.setattr(sys, "argv", ["gnnscale", "fit"])
    monkeypatch.delenv("GNNSCALE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as stopped:
        cli.run()
    err = capsys.readouterr().err
    assert stopped.value.code == status and err.startswith(f"gnnscale: error: {line}")
    assert err.count("\n") == 1


def test_python_dash_m_gnnscale_is_the_command():
    done = subprocess.run(
        [sys.executable, "-m", "gnnscale", "prepare", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: gnnscale prepare ")
