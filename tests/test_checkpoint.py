import subprocess
import sys

import pytest
import torch
from lightning.fabric.plugins import TorchCheckpointIO

from gnnscale.checkpoint import StreamingCheckpointIO, damage, load
from gnnscale.cli import main, resume
from gnnscale.errors import ConfigError
from gnnscale.testing import cli_args, damage_a_weight

# Saves (or saves and loads back) a 768 MiB checkpoint in a fresh process and prints how far that
# raised the process's peak resident memory above the live tensors, in MiB.
SAVE = """
import sys, torch
from lightning.fabric.plugins import TorchCheckpointIO
from gnnscale.measure import peak_rss_mb
from gnnscale.checkpoint import StreamingCheckpointIO
io = {"streaming": StreamingCheckpointIO, "lightning": TorchCheckpointIO}[sys.argv[1]]()
state = {"table": torch.ones(2**20, 128), "exp_avg": torch.ones(2**20, 64)}
before = peak_rss_mb()
io.save_checkpoint({"state_dict": state}, sys.argv[2])
if sys.argv[3] == "load":
    loaded = io.load_checkpoint(sys.argv[2])
    state["table"].copy_(loaded["state_dict"]["table"])  # as load_state_dict; exp_avg unread
    del loaded
print(peak_rss_mb() - before)
"""


def _raise_mb(tmp_path, io: str, load: bool = False) -> float:
    args = [io, str(tmp_path / "big.ckpt"), "load" if load else "save"]
    done = subprocess.run(
        [sys.executable, "-c", SAVE, *args], capture_output=True, text=True, check=True
    )
    return float(done.stdout)


@pytest.mark.slow
def test_saving_and_loading_a_checkpoint_holds_no_second_copy_in_memory(tmp_path):
    # A 512 MiB table and 256 MiB of optimizer state. Lightning 2.6 serialises into memory
    # first (+768 MiB) and loads the whole file (+768); streamed, a save costs the serialiser's
    # buffers, and a memory-mapped load reads only what is copied out of it: the table.
    assert _raise_mb(tmp_path, "streaming") < 64
    assert _raise_mb(tmp_path, "streaming", load=True) < 512 + 64
    loaded = StreamingCheckpointIO().load_checkpoint(tmp_path / "big.ckpt")
    assert torch.equal(loaded["state_dict"]["exp_avg"], torch.ones(2**20, 64))


def test_a_failed_save_leaves_the_previous_checkpoint_whole(tmp_path):
    io = StreamingCheckpointIO()
    path = tmp_path / "sub" / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.arange(3)}, path)
    with pytest.raises(Exception, match="pickle|local object"):  # Python 3.13: the latter
        io.save_checkpoint({"step": 2, "w": torch.arange(3), "bad": lambda: 0}, path)
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    assert path.stat().st_mode == plain.stat().st_mode  # not private, as a mkstemp file is
    assert io.load_checkpoint(path)["step"] == 1
    with pytest.raises(FileNotFoundError, match="missing.ckpt"):
        io.load_checkpoint(tmp_path / "missing.ckpt")


@pytest.mark.parametrize(
    ("plugin", "expected"),
    [
        (None, StreamingCheckpointIO),
        ("lightning.fabric.plugins.TorchCheckpointIO", TorchCheckpointIO),
    ],
)
def test_fit_streams_checkpoints_unless_told_otherwise(tmp_path, plugin, expected):
    args = ["--data=gnnscale.FullBatchDataModule", "--model=gnnscale.GraphSAGE"]
    args += ["--trainer.max_epochs=2"]
    plugins = [f"--trainer.plugins={plugin}"] if plugin else []
    cli = main(["fit", *args, *cli_args(tmp_path), *plugins])  # the classes before their args
    assert type(cli.trainer.strategy.checkpoint_io) is expected
    (ckpt,) = (tmp_path / "runs").rglob("*.ckpt")  # saved, and loaded back for the test
    assert cli.trainer.checkpoint_callback.best_model_path == str(ckpt)


def test_a_damaged_checkpoint_is_refused_naming_the_whole_one_beside_it(tmp_path):
    io = StreamingCheckpointIO()
    older, last = tmp_path / "epoch=0.ckpt", tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.ones(1000)}, older)
    io.save_checkpoint({"step": 2, "w": torch.ones(1000)}, last)
    assert damage(last) is None and io.load_checkpoint(last)["step"] == 2

    record = damage_a_weight(last)
    loaded = torch.load(last, weights_only=True)["w"]  # torch alone loads it, damaged
    assert not torch.equal(loaded, torch.ones(1000))
    assert damage(last) == f"its record {record} fails its CRC-32 check"
    whole = rf"the newest whole one beside it is {older} \(--ckpt_path={older}\)"
    with pytest.raises(ConfigError, match=rf"checkpoint {last} is damaged \(.*\); {whole}"):
        io.load_checkpoint(last)

    older.write_bytes(older.read_bytes()[:-100])  # truncated: its zip directory is gone
    assert damage(older).startswith("not a whole checkpoint")
    with pytest.raises(ConfigError, match="no whole checkpoint lies beside it"):
        io.load_checkpoint(last)

    if not hasattr(torch.serialization, "set_crc32_options"):  # torch before 2.6
        return
    torch.serialization.set_crc32_options(False)  # saved without checksums: nothing to check
    try:
        io.save_checkpoint({"w": torch.ones(10)}, tmp_path / "unchecked.ckpt")
    finally:
        torch.serialization.set_crc32_options(True)
    assert damage(tmp_path / "unchecked.ckpt") is None


class _Runs:
    """Unpickled, it runs ``command``: what a checkpoint from elsewhere may hold."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        import os

        return (os.system, (self.command,))


def test_a_checkpoint_that_would_run_code_is_refused_by_every_load(tmp_path):
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "x": _Runs(f"touch {marker}")}, evil)
    # What broken code would do: load it as Lightning 2.6 on torch 2.5 and gnnscale's own reads
    # did (weights_only=False), which runs the command.
    torch.load(evil, weights_only=False)
    assert marker.exists()
    marker.unlink()

    refused = rf"the checkpoint {evil} holds (posix|os)\.system, which loading would run as code"
    io = StreamingCheckpointIO()
    with pytest.raises(ConfigError, match=refused):
        io.load_checkpoint(evil)  # Lightning's loads (fit, test, predict with --ckpt_path)
    with pytest.raises(ConfigError, match=refused):
        io.load_checkpoint(evil, weights_only=None)  # torch 2.5's default would be False
    with pytest.raises(ConfigError, match=refused):
        resume._load(evil)  # gnnscale's check of a resumed run's settings
    with pytest.raises(ConfigError, match=refused):
        load(evil)
    assert not marker.exists()
    # Asked for explicitly, a trusted checkpoint loads whatever it holds.
    io.load_checkpoint(evil, weights_only=False)
    assert marker.exists()


def test_fit_refuses_a_checkpoint_that_would_run_code_in_one_line(tmp_path):
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "x": _Runs(f"touch {marker}")}, evil)
    args = ["fit", "--data=gnnscale.FullBatchDataModule", "--model=gnnscale.GraphSAGE"]
    done = subprocess.run(
        [sys.executable, "-m", "gnnscale.cli", *args, *cli_args(tmp_path), f"--ckpt_path={evil}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if "which loading would run" in line]
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert not marker.exists()
