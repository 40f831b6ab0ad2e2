import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger

from gnnscale import FullBatchDataModule, GradActivationMonitor, GraphSAGE, NeighborDataModule
from gnnscale._compat import forward_hooks
from gnnscale.callbacks import ThroughputMonitor
from gnnscale.cli import main
from gnnscale.measure import peak_rss_mb
from gnnscale.testing import TINY, TINY_ARGS, cli_args, quiet_trainer


def _rows(log_dir: Path, key: str) -> list[dict[str, str]]:
    (path,) = log_dir.rglob("metrics.csv")
    with path.open() as f:
        return [r for r in csv.DictReader(f) if r.get(key)]


def _fit(tmp_path: Path, model: GraphSAGE, max_steps: int, every: int) -> GradActivationMonitor:
    monitor = GradActivationMonitor(log_every_n_steps=every)
    trainer = quiet_trainer(
        max_steps=max_steps,
        logger=CSVLogger(tmp_path / "runs"),
        callbacks=[monitor],
        limit_val_batches=0,
    )
    trainer.fit(model, FullBatchDataModule(root=tmp_path / "data", synthetic=TINY))
    return monitor


def _model() -> GraphSAGE:
    torch.manual_seed(0)
    return GraphSAGE(TINY.num_features, TINY.num_classes, hidden_channels=16, dropout=0.0)


def test_logged_grad_norms_match_a_manual_backward(tmp_path):
    model = _model()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    _fit(tmp_path, model, max_steps=1, every=1)
    (row,) = _rows(tmp_path / "runs", "monitor/grad_norm_total")

    # The same first step by hand: mean cross-entropy over the training nodes of the full graph.
    model.load_state_dict(initial)
    model.zero_grad()
    data = FullBatchDataModule(synthetic=TINY).data
    out = model(data.x, data.edge_index)
    F.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
    for layer in ("gnn.convs.0", "gnn.convs.1"):
        grads = [p.grad for n, p in model.named_parameters() if n.startswith(f"{layer}.")]
        expected = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads])).item()
        assert float(row[f"monitor/grad_norm/{layer}"]) == pytest.approx(expected, rel=1e-4)
    total = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()]))
    total = total.item()
    assert total > 0
    assert float(row["monitor/grad_norm_total"]) == pytest.approx(total, rel=1e-4)
    # Hooks are gone after fit: a later forward pass runs untouched.
    assert all(not list(forward_hooks(conv)) for conv in model.gnn.convs)


def test_dead_fraction_flags_a_broken_layer(tmp_path):
    healthy = _model()
    _fit(tmp_path / "healthy", healthy, max_steps=4, every=2)
    broken = _model()
    with torch.no_grad():  # every output of the first layer <= 0: its ReLU passes nothing
        broken.gnn.convs[0].lin_l.bias.fill_(-1e3)
    _fit(tmp_path / "broken", broken, max_steps=4, every=2)

    zero, dead = "monitor/act_zero/gnn.convs.0", "monitor/act_dead/gnn.convs.0"
    ok, bad = _rows(tmp_path / "healthy", dead), _rows(tmp_path / "broken", dead)
    assert [int(r["step"]) for r in ok] == [0, 2]  # every 2nd optimizer step, step 0 included
    assert all(0.2 < float(r[zero]) < 0.8 and float(r[dead]) < 0.2 for r in ok)
    assert all(float(r[zero]) == 1.0 and float(r[dead]) == 1.0 for r in bad)
    for r in ok + bad:
        assert math.isfinite(float(r["monitor/act_std/gnn.convs.1"]))


def test_counts_optimizer_steps_through_yaml_with_accumulation(tmp_path):
    cli = main(
        [
            "fit",
            "--data=gnnscale.NeighborDataModule",
            "--model=gnnscale.GraphSAGE",
            f"--data.root={tmp_path / 'data'}",
            "--data.batch_size=256",  # 900 training nodes: 4 micro-batches, 2 steps per epoch
            "--data.num_neighbors=[5, 5]",
            "--trainer.accelerator=cpu",
            "--trainer.max_epochs=2",
            "--trainer.accumulate_grad_batches=2",
            "--trainer.precision=bf16-mixed",
            "--trainer.limit_val_batches=0",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path}",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
            "--trainer.callbacks+=gnnscale.GradActivationMonitor",
            "--trainer.callbacks.log_every_n_steps=2",
            *TINY_ARGS,
        ]
    )
    assert cli.trainer.global_step == 4
    rows = _rows(tmp_path / "runs", "monitor/grad_norm_total")
    assert [int(r["step"]) for r in rows] == [0, 2]  # optimizer steps, not micro-batches
    assert all(math.isfinite(float(r["monitor/grad_norm_total"])) for r in rows)
    assert all(float(r["monitor/act_std/gnn.convs.0"]) > 0 for r in rows)


def test_two_optimizers_log_once_per_step_at_the_x_axis_of_the_other_rows(tmp_path):
    # EmbeddingSAGE steps its two optimizers together, every 2 batches (manual optimization):
    # global_step counts 2 per step, Lightning's rows count batches.
    main(
        [
            "fit",
            "--data=gnnscale.NeighborDataModule",
            "--model=gnnscale.EmbeddingSAGE",
            "--model.embedding_dim=8",
            "--model.accumulate_grad_batches=2",
            "--data.batch_size=128",  # 900 training nodes: 8 batches, 4 steps per epoch
            "--data.num_neighbors=[5, 5]",
            "--data.eval.mode=sampled",
            "--trainer.max_epochs=1",
            "--trainer.limit_val_batches=0",
            "--trainer.log_every_n_steps=1",
            "--trainer.callbacks+=gnnscale.GradActivationMonitor",
            "--trainer.callbacks.log_every_n_steps=2",
            *cli_args(tmp_path),
        ]
    )
    rows = _rows(tmp_path / "runs", "monitor/grad_norm_total")
    # Optimizer steps 0 and 2 end batches 1 and 5, whose train/loss rows sit at steps 1 and 5.
    assert [int(r["step"]) for r in rows] == [1, 5]
    losses = {int(r["step"]) for r in _rows(tmp_path / "runs", "train/loss_step")}
    assert losses == set(range(8))
    for r in rows:  # both optimizers' gradients, read before either stepped
        assert float(r["monitor/grad_norm/gnn.convs.0"]) > 0
        assert float(r["monitor/grad_norm/other"]) > 0  # the embedding table
        assert float(r["monitor/act_std/gnn.convs.0"]) > 0


def test_peak_rss_of_a_child_process_is_its_own():
    # ru_maxrss would report this (parent) process's peak in the child: the kernel carries the
    # high-water mark across exec. peak_rss_mb reads VmHWM, which starts afresh.
    ballast = bytearray(2 * 2**30)
    ballast[::4096] = b"\x01" * len(range(0, len(ballast), 4096))  # touch every page
    child = "from gnnscale.measure import peak_rss_mb; print(peak_rss_mb())"
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
    assert peak_rss_mb() > 2048
    assert float(done.stdout) < 1024  # the interpreter, torch and Lightning, not the ballast
    del ballast


def test_throughput_monitor_times_each_validation_of_a_fit_apart_from_training(tmp_path):
    monitor = ThroughputMonitor()
    trainer = quiet_trainer(
        max_epochs=3,
        logger=CSVLogger(tmp_path / "runs"),
        callbacks=[monitor],
        num_sanity_val_steps=1,
    )
    model, dm = GraphSAGE(TINY.num_features, 5), FullBatchDataModule(root=tmp_path, synthetic=TINY)
    trainer.fit(model, dm)
    trainer.validate(model, dm, verbose=False)  # not a fit's validation: not counted
    logged = [float(r["perf/val_s"]) for r in _rows(tmp_path / "runs", "perf/val_s")]
    assert len(logged) == len(monitor.val_s) == 3  # one an epoch; the sanity check left out
    assert logged == pytest.approx(monitor.val_s) and all(s > 0 for s in logged)


@pytest.mark.parametrize("limit", [3, None])
def test_throughput_monitor_logs_the_share_of_an_epoch_cut_short(tmp_path, limit):
    dm = NeighborDataModule(root=tmp_path, synthetic=TINY, num_neighbors=[5, 5], batch_size=128)
    trainer = quiet_trainer(
        max_epochs=2,
        limit_train_batches=limit,
        limit_val_batches=0,
        logger=CSVLogger(tmp_path / "runs"),
        callbacks=[ThroughputMonitor()],
    )
    trainer.fit(GraphSAGE(TINY.num_features, 5, hidden_channels=16), dm)
    whole = math.ceil(int(dm.data.train_mask.sum()) / 128)
    assert whole > 3
    rows = _rows(tmp_path / "runs", "perf/epoch_s")
    fractions = [float(r.get("perf/epoch_fraction") or "nan") for r in rows]
    assert len(rows) == 2
    if limit:
        assert fractions == pytest.approx([3 / whole] * 2)
    else:  # a whole epoch: not logged
        assert all(math.isnan(f) for f in fractions)
