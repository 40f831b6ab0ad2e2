"""A run killed mid-epoch resumes with ``--ckpt_path last`` and ends exactly as an unkilled one."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from registry import recipe

from gnnscale import NeighborDataModule
from gnnscale.cli import main
from gnnscale.data.args import LoaderArgs
from gnnscale.data.resume import ResumableLoader
from gnnscale.errors import ConfigError
from gnnscale.testing import TINY, cli_args, requires_sampler, requires_torch_sparse

# Each recipe as shipped (workers, precision, accumulation of 2), on the tiny graph, with 13
# training batches per epoch: 7 optimizer steps, so step 10 (a saved last.ckpt) is mid-epoch 1.
SIZES = {
    "neighbor_sage": ["--data.batch_size=24"],
    "cluster_gcn": ["--data.num_parts=26", "--data.clusters_per_batch=2"],
    "graphsaint": ["--data.batch_size=200", "--data.num_steps=13", "--data.sample_coverage=5"],
}
EXACT = ("train/loss_step", "val/acc", "val/loss", "test/acc")


def _fit(folder: Path, name: str, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "gnnscale.cli", "fit", "--config", str(recipe(name).config)]
    argv += [*cli_args(folder), *SIZES[name], "--trainer.max_epochs=3"]
    argv += ["--trainer.log_every_n_steps=1", *args]
    return subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=600)


def _rows(run: Path) -> list[dict[str, str]]:
    with (run / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def _values(rows: list[dict[str, str]], key: str) -> list[tuple[str, str, str]]:
    return [(r["epoch"], r["step"], r[key]) for r in rows if r.get(key)]


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("neighbor_sage", marks=requires_sampler),
        pytest.param("cluster_gcn", marks=[requires_sampler, pytest.mark.slow]),
        pytest.param("graphsaint", marks=[requires_torch_sparse, pytest.mark.slow]),
    ],
)
def test_killed_run_resumes_mid_epoch_and_ends_as_an_unkilled_one(tmp_path, name):
    whole, crashed = tmp_path / "whole", tmp_path / "crashed"
    whole.mkdir(), crashed.mkdir()
    done = _fit(whole, name)
    assert done.returncode == 0, done.stderr[-3000:]
    kill = ["--trainer.callbacks+=gnnscale.testing.KillAtStep", "--trainer.callbacks.step=12"]
    killed = _fit(crashed, name, *kill)
    assert killed.returncode == -9, killed.stderr[-3000:]  # SIGKILL: nothing flushed or saved
    runs = crashed / "runs" / name
    state = torch.load(runs / "version_0" / "checkpoints" / "last.ckpt", weights_only=False)
    (loader,) = state["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert (loader["epoch"], loader["batches_done"]) == (1, 6)  # step 10: mid-epoch 1

    resumed = _fit(crashed, name, "--ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "--ckpt_path last resumes" in resumed.stderr + resumed.stdout
    assert sorted(p.name for p in runs.iterdir()) == ["version_0"]  # the same run, continued

    expected, got = _rows(whole / "runs" / name / "version_0"), _rows(runs / "version_0")
    for key in EXACT:  # the same batches and dropout masks: equal to the last bit
        assert _values(got, key) == _values(expected, key), key
    steps = [r["step"] for r in got if r.get("train/loss_step")]
    assert len(steps) == len(set(steps)) == 21  # each step logged once: earlier rows kept
    # Lightning does not checkpoint its running epoch means: the interrupted epoch's
    # train/loss_epoch averages the batches trained after the resume; the others are exact.
    epoch_loss = _values(got, "train/loss_epoch")
    assert [e for e, _, _ in epoch_loss] == ["0", "1", "2"]
    assert [v for e, _, v in epoch_loss if e != "1"] == [
        v for e, _, v in _values(expected, "train/loss_epoch") if e != "1"
    ]


def test_ckpt_path_last_without_a_saved_run_is_refused(tmp_path):
    args = ["fit", "--config", str(recipe("neighbor_sage").config), *cli_args(tmp_path)]
    with pytest.raises(ConfigError, match=r"--ckpt_path last: no run under .*neighbor_sage"):
        main([*args, "--ckpt_path=last"])


@requires_sampler
def test_each_rank_draws_its_share_of_the_same_epoch_and_resumes_at_a_batch(tmp_path):
    dm = NeighborDataModule(root=tmp_path, batch_size=64, num_neighbors=[5, 5], synthetic=TINY)
    dm.setup("fit")
    loader = dm.train_dataloader().loader  # PyG's NeighborLoader, the batches' recipe

    def seeds(rank: int = 0, world: int = 1, epoch: int = 0, start: int = 0) -> list[list[int]]:
        batches = ResumableLoader(loader, shuffle=True, seed=7, rank=rank, world_size=world)
        batches.set_epoch(epoch)
        batches._start = start
        return [b.n_id[: b.batch_size].tolist() for b in batches]

    whole = seeds()
    train = int(dm.data.train_mask.sum())
    assert len(whole) == -(-train // 64) and len({n for b in whole for n in b}) == train
    assert seeds(epoch=1) != whole  # a new order each epoch...
    assert seeds() == whole  # ...the same one each time an epoch is drawn
    assert seeds(start=3) == whole[3:]  # a resumed epoch starts at its first untrained batch
    ranks = [seeds(rank, 2) for rank in range(2)]
    assert len(whole) % 2 == 1  # so rank 1 repeats rank 0's first batch, to draw as many
    assert ranks[0] == whole[0::2] and ranks[1] == [*whole[1::2], whole[0]]
    # The repeat, and only it, is marked: the DataModules weigh it 0.
    padding = [
        [b.get("padding", False) for b in ResumableLoader(loader, True, 7, rank, 2)]
        for rank in range(2)
    ]
    assert padding == [[False] * len(ranks[0]), [False] * (len(ranks[1]) - 1) + [True]]


@requires_sampler
def test_batches_are_the_same_whichever_process_samples_them(tmp_path):
    def sampled(workers: int) -> list[list[int]]:
        dm = NeighborDataModule(
            root=tmp_path,
            batch_size=64,
            num_neighbors=[5, 5],
            synthetic=TINY,
            loader=LoaderArgs(num_workers=workers),
        )
        dm.setup("fit")
        torch.manual_seed(0)  # the loader's seed is drawn from the global stream
        return [b.n_id.tolist() for b in dm.train_dataloader()]

    in_main = sampled(0)
    assert sampled(2) == in_main  # each batch sampled under its own seed
