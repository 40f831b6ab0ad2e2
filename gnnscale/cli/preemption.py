"""A SIGTERM, which schedulers (SLURM, Kubernetes) send before they stop a job, saves the run.

Lightning 2.6 notes the signal and ends ``fit`` after the current batch with an exception that
exits with status 0, so a scheduler sees a finished job, and nothing is saved. Under DDP its
handler broadcasts from inside the signal handler, which can meet another rank in a different
collective and hang both; a signal to the launching process of forked ranks kills it alone.

Here every process of the run notes the signal in a flag (:class:`Preemption`, from the start of
training); after each training batch the ranks agree on it (one all-reduce, so a signal to any
rank stops them all at the same batch) and save ``last.ckpt`` there, where ``ModelCheckpoint``
saves; before the next batch, once Lightning has logged that batch's metrics, they say how to
resume and exit with :data:`PREEMPTED_EXIT`. A process that launched forked ranks passes the
signal on to them (:func:`forwarded`). A signal during validation takes effect after the next
training batch; one after the last training batch lets the run finish.

A launching process killed outright (SIGKILL, the OOM killer) can pass nothing on. torchrun's
agent starts its ranks in sessions of their own and asks nothing for them: they would wait in a
collective for ranks that never come. torch's forked ranks ask for a SIGINT, which stops them
unsaved. So each rank asks the kernel for a SIGTERM when its launcher dies
(:func:`die_with_parent`, Linux): torchrun's as the command starts (``gnnscale.cli``), and every
rank again as training starts (a forked rank's SIGINT replaced); they then stop as on a SIGTERM.

Lightning's own ``ddp`` launcher is rank 0: the ranks it starts (``LOCAL_RANK`` set) ask for the
same SIGTERM, but with rank 0 gone they can neither agree nor save (rank 0 writes the
checkpoints), and their next collective fails. :func:`launcher_gone` tells the command that this
failure was the launcher's death: it stops in one line with :data:`PREEMPTED_EXIT`, and the run
resumes from the last checkpoint saved before it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info

from gnnscale._compat import MultiProcessingLauncher

__all__ = [
    "PREEMPTED_EXIT",
    "Preemption",
    "die_with_parent",
    "forwarded",
    "launched_by",
    "launcher_gone",
]

PREEMPTED_EXIT = 143  # 128 + SIGTERM: what a shell reports for a process the signal ended
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
# The process that launched this rank: torchrun's agent, or the process that forked it (which
# set it while forwarded() launched its ranks: forked ranks inherit it). None: not a rank.
_launcher: int | None = None
# The same for ranks started with the spawn method (``ddp_spawn``), which inherit no module
# state: the launching process's pid in the environment while forwarded() launches them.
LAUNCHER_ENV = "GNNSCALE_LAUNCHER_PID"


def die_with_parent(parent: int | None = None) -> bool:
    """Ask the kernel to send this process SIGTERM when its parent exits (Linux ``prctl``).

    Args:
        parent: The parent's pid, if known before this call (a forked rank's launcher); else
            the parent now. If it is no longer the parent once asked (it died first, which the
            kernel would not report), SIGTERM is sent now.

    Returns:
        Whether the request was made (``False`` off Linux, or without ``prctl``).
    """
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid() if parent is None else parent
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    if prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)
    return True


def launched_by(parent: int) -> None:
    """Note that this process is a rank that ``parent`` launched, and die with it from now on.

    Args:
        parent: The launching process's pid (torchrun's agent); the rank's parent.
    """
    global _launcher
    _launcher = parent
    die_with_parent(parent)


def _launcher_pid() -> int | None:
    """The process that launched this rank (this process itself, if it forked ranks); or None."""
    return _launcher or int(os.environ.get(LAUNCHER_ENV, 0)) or None


def launcher_gone() -> bool:
    """Whether this process is a rank whose launching process has died (its parent changed)."""
    launcher = _launcher_pid()
    return launcher is not None and launcher != os.getpid() and os.getppid() != launcher


class Preemption(L.Callback):
    """On SIGTERM, save ``last.ckpt`` after the current training batch and exit 143 before the next.

    The checkpoint goes where ``--ckpt_path last`` looks: the folder of the run's
    ``ModelCheckpoint``, else its ``checkpoints`` folder.
    """

    def __init__(self) -> None:
        self.requested = False
        self.previous: Any = None
        self.saved: Path | None = None
        self.step = 0

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Take SIGTERM over from Lightning's handler (and its broadcast inside the handler).

        A rank also asks for a SIGTERM when its launcher dies, replacing torch's SIGINT.
        """
        self.previous = signal.signal(signal.SIGTERM, self._note)
        launcher = _launcher_pid()
        if launcher is not None and launcher != os.getpid():
            die_with_parent(launcher)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Give SIGTERM back."""
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
            self.previous = None

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Take SIGTERM over for prediction too: it stops after the current batch."""
        self.previous = signal.signal(signal.SIGTERM, self._note)

    on_predict_end = on_train_end

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """Give SIGTERM back when a run stops early (its own exit too)."""
        self.on_train_end(trainer, pl_module)

    def on_predict_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        """Stop a signalled prediction with :data:`PREEMPTED_EXIT`; its writer keeps no file."""
        if self.requested:
            rank_zero_info("gnnscale: predict stopped by SIGTERM; no predictions were written")
            raise SystemExit(PREEMPTED_EXIT)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        """If any rank was signalled: save where the run stands (as ``ModelCheckpoint`` does)."""
        requested = self.requested
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            flag = torch.tensor([int(requested)], device=trainer.strategy.root_device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank, at the same batch
            requested = bool(flag.item())
        if not requested or self.saved is not None:
            return
        callback = trainer.checkpoint_callback
        folder = callback.dirpath if isinstance(callback, ModelCheckpoint) else None
        if folder is None:
            folder = str(Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints")
        self.saved = Path(folder) / (
            ModelCheckpoint.CHECKPOINT_NAME_LAST + ModelCheckpoint.FILE_EXTENSION
        )
        trainer.save_checkpoint(self.saved)  # every rank: it synchronises them; rank 0 writes
        self.step = trainer.global_step

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        """Exit before the next batch: the saved one's metrics are logged by now."""
        if self.saved is None:
            return
        rank_zero_info(
            f"gnnscale: stopped by SIGTERM after step {self.step}; saved {self.saved}. "
            "Resume: the same command with --ckpt_path last"
        )
        raise SystemExit(PREEMPTED_EXIT)


@contextlib.contextmanager
def forwarded(trainer: L.Trainer) -> Iterator[None]:
    """While inside, a SIGTERM to this process goes on to the ranks it forked, if any.

    Lightning's multiprocessing launcher leaves this process with the default action (die at
    once), which orphans the ranks; passed on, each rank saves and exits, and so does this one.
    Ranks forked or spawned meanwhile know this process as their launcher (see
    :func:`die_with_parent`).
    """
    global _launcher
    launcher = trainer.strategy.launcher
    if not isinstance(launcher, MultiProcessingLauncher):
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: launcher.kill(signum))
    _launcher = os.getpid()
    os.environ[LAUNCHER_ENV] = str(_launcher)  # spawned ranks
    try:
        yield
    finally:
        _launcher = None
        os.environ.pop(LAUNCHER_ENV, None)
        signal.signal(signal.SIGTERM, previous)
