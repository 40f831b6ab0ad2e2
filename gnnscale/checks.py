"""Settings Lightning accepts without a word that change what a run or a metric means: refused.

Each is refused in one line (``ConfigError``) before any training step:

- validation that never runs (``--trainer.check_val_every_n_epoch`` above ``max_epochs``): no
  best checkpoint is kept, and the test after ``fit`` reads the last weights;
- a checkpoint or early stop whose ``mode`` runs against its metric (Lightning's default
  ``min`` with ``val/acc``): the "best" checkpoint would be the worst;
- ``--trainer.accumulate_grad_batches`` for a model that steps its own optimizers (Lightning
  refuses it with a traceback; the model has its own setting).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from gnnscale.errors import ConfigError

__all__ = ["check_monitors", "check_own_accumulation", "check_validation"]

# The metrics gnnscale logs, by the part of their name before "@" (val/recall@20 -> recall).
_BETTER = {"acc": "max", "recall": "max", "mrr": "max", "auc": "max", "loss": "min", "mae": "min"}


def check_validation(trainer: Any) -> None:
    """Refuse a ``fit`` whose validation never runs (``trainer``: the config's trainer keys)."""
    every, epochs = trainer.get("check_val_every_n_epoch"), trainer.get("max_epochs")
    if trainer.get("limit_val_batches") == 0:
        return  # validation turned off on purpose
    if isinstance(every, int) and isinstance(epochs, int) and 0 < epochs < every:
        raise ConfigError(
            f"--trainer.check_val_every_n_epoch ({every}) is larger than --trainer.max_epochs "
            f"({epochs}): validation would never run, so no best checkpoint is kept and the test "
            f"after fit reads the last weights; set it to at most {epochs}"
        )


def check_monitors(callbacks: Iterable[L.Callback]) -> None:
    """Refuse a ``ModelCheckpoint`` or ``EarlyStopping`` whose mode takes the worst value."""
    for callback in callbacks:
        if not isinstance(callback, ModelCheckpoint | EarlyStopping):
            continue
        monitor = callback.monitor
        better = _BETTER.get(str(monitor).rsplit("/", 1)[-1].split("@")[0])
        if better is not None and callback.mode != better:
            default = " (Lightning's default)" if callback.mode == "min" else ""
            raise ConfigError(
                f"{type(callback).__name__}(monitor={monitor!r}) has mode {callback.mode!r}"
                f"{default}, but {monitor} is better when it is "
                f"{'higher' if better == 'max' else 'lower'}: its best would be the worst "
                f"epoch; set its mode: {better}"
            )


def check_own_accumulation(model: L.LightningModule, accumulate: int) -> None:
    """Refuse ``--trainer.accumulate_grad_batches`` for a model that steps its own optimizers."""
    if accumulate > 1 and not model.automatic_optimization:
        raise ConfigError(
            f"--trainer.accumulate_grad_batches is {accumulate}, but {type(model).__name__} "
            "steps its optimizers itself: set --model.init_args.accumulate_grad_batches="
            f"{accumulate} and --trainer.accumulate_grad_batches=1"
        )
