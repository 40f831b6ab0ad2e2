"""Settings Lightning accepts without a word that change what a run or a metric means: refused.

Each is refused in one line (``ConfigError``) before any training step:

- validation that never runs (``--trainer.check_val_every_n_epoch`` above ``max_epochs``): no
  best checkpoint is kept, and the test after ``fit`` reads the last weights;
- a checkpoint or early stop whose ``mode`` runs against its metric (Lightning's default
  ``min`` with ``val/acc``): the "best" checkpoint would be the worst;
- gradient accumulation over more batches than an epoch has (a full-graph loader has one):
  Lightning steps at the epoch's end on part of the gradient, still divided by the whole count;
- ``--trainer.accumulate_grad_batches`` for a model that steps its own optimizers (Lightning
  refuses it with a traceback; the model has its own setting);
- counts Lightning or torch would refuse with a traceback once the data is loaded (negative
  epochs, steps or devices, a negative learning rate), and a ``fit`` that trains nothing
  (zero epochs, steps or training batches: its test would report untrained weights).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lightning as L
import yaml
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from gnnscale.errors import ConfigError

__all__ = [
    "AccumulationCheck",
    "check_config_keys",
    "check_monitors",
    "check_own_accumulation",
    "check_ranked_monitors",
    "check_trainer_counts",
    "check_validation",
]

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


def check_trainer_counts(trainer: Any, model: Any, subcommand: str | None) -> None:
    """Refuse counts Lightning or torch refuse late, and a ``fit`` that trains nothing.

    ``trainer`` and ``model``: the config's keys (``model`` may be ``None``).
    """
    for key in ("max_epochs", "max_steps"):
        value = trainer.get(key)
        if isinstance(value, int) and value < -1:
            raise ConfigError(f"--trainer.{key} must be -1 (no limit) or >= 0 (got {value})")
        if subcommand == "fit" and value == 0:
            raise ConfigError(
                f"--trainer.{key}=0 trains nothing: the test after fit would score untrained "
                "weights; give a count >= 1, or evaluate a checkpoint with `gnnscale test "
                "--ckpt_path FILE`"
            )
    devices = trainer.get("devices")
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        devices = int(devices)
    if isinstance(devices, int) and (devices == 0 or devices < -1):
        raise ConfigError(
            f"--trainer.devices must be >= 1, -1 (every device) or auto (got {devices})"
        )
    limit = trainer.get("limit_train_batches")
    if subcommand == "fit" and limit is not None and not isinstance(limit, bool) and limit <= 0:
        raise ConfigError(
            f"--trainer.limit_train_batches={limit:g} trains nothing: give a fraction in (0, 1] "
            "or a count >= 1"
        )
    for name, lr in _learning_rates(model):
        if lr < 0:
            raise ConfigError(f"--model.{name}.init_args.lr must be >= 0 (got {lr})")


def _learning_rates(model: Any) -> list[tuple[str, float]]:
    """``(key, lr)`` of each optimizer the model's config names (``init_args.*optimizer``)."""
    args = model.get("init_args") if model is not None and hasattr(model, "get") else None
    if args is None or not hasattr(args, "items"):
        return []
    return [  # a Namespace's items are its flattened keys: optimizer.init_args.lr
        (f"init_args.{key.removesuffix('.init_args.lr')}", float(lr))
        for key, lr in args.items()
        if key.endswith("optimizer.init_args.lr")
        and isinstance(lr, int | float)
        and not isinstance(lr, bool)
    ]


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


def check_ranked_monitors(callbacks: Iterable[L.Callback], datamodule: Any) -> None:
    """Refuse a monitor of a ranking metric (``val/recall@20``) the run logs under another name.

    Lightning would stop after the first validation ("not found in the logged metrics"),
    having trained an epoch. ``datamodule.ranking_suffix`` says what the run logs.
    """
    suffix = getattr(datamodule, "ranking_suffix", None)
    if suffix is None:
        return
    for callback in callbacks:
        if not isinstance(callback, ModelCheckpoint | EarlyStopping):
            continue
        name, at, rest = str(callback.monitor).partition("@")
        if at and rest not in (suffix, f"{suffix}_popularity"):
            logged = f"{name}@{suffix}" + ("_popularity" if rest.endswith("_popularity") else "")
            raise ConfigError(
                f"{type(callback).__name__}(monitor={callback.monitor!r}) is never logged: "
                f"with --data.eval.k={datamodule.eval.k} and --data.eval.candidates="
                f"{datamodule.eval.candidates} the run logs {logged}; monitor that instead "
                "(the callback's init_args.monitor)"
            )


def check_own_accumulation(model: L.LightningModule, accumulate: int) -> None:
    """Refuse ``--trainer.accumulate_grad_batches`` for a model that steps its own optimizers."""
    if accumulate > 1 and not model.automatic_optimization:
        raise ConfigError(
            f"--trainer.accumulate_grad_batches is {accumulate}, but {type(model).__name__} "
            "steps its optimizers itself: set --model.init_args.accumulate_grad_batches="
            f"{accumulate} and --trainer.accumulate_grad_batches=1"
        )


class AccumulationCheck(L.Callback):
    """Refuses, before the first step, an accumulation over more batches than an epoch has.

    Lightning steps on an epoch's last batch whatever it accumulated, with each loss divided
    by the full count: with fewer batches, every step takes that fraction of the gradient.
    Models that step their optimizers themselves accumulate ``accumulate_grad_batches`` of
    their own hyperparameters, the same way.
    """

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Compare the accumulation with the epoch's training batches (limits applied)."""
        if pl_module.automatic_optimization:
            flag, count = "--trainer.accumulate_grad_batches", trainer.accumulate_grad_batches
        else:
            flag = "--model.init_args.accumulate_grad_batches"
            count = int(pl_module.hparams.get("accumulate_grad_batches", 1))
        batches = trainer.num_training_batches
        if math.isfinite(batches) and 0 < batches < count:
            raise ConfigError(
                f"{flag} is {count} but an epoch has {int(batches)} training batch(es): each "
                f"step would take {int(batches)}/{count} of the gradient (Lightning steps at the "
                f"epoch's end, each loss divided by {count}); set {flag}={int(batches)}, or "
                "lower --data.batch_size for more batches"
            )


def check_config_keys(args: list[str]) -> None:
    """Refuse a ``--config`` file that gives a key twice in one mapping (YAML keeps the last).

    Args:
        args: The command line; its ``--config`` (``-c``) files are read, others left to the
            parser.
    """
    paths = [b for a, b in zip(args, args[1:], strict=False) if a in ("--config", "-c")]
    paths += [a.partition("=")[2] for a in args if a.startswith(("--config=", "-c="))]
    for path in map(Path, paths):
        if path.is_file():  # a missing one is the parser's to report
            yaml.load(path.read_text(), Loader=_unique_keys(path))  # noqa: S506 (a SafeLoader)


def _unique_keys(path: Path) -> type[yaml.SafeLoader]:
    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
            lines: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<``: repeats by design
                    continue
                key = self.construct_object(key_node, deep=deep)
                line = key_node.start_mark.line + 1
                if key in lines:
                    raise ConfigError(
                        f"{path}: key {key!r} is given twice (lines {lines[key]} and {line}); "
                        "YAML would keep the last without a word: keep one"
                    )
                lines[key] = line
            return super().construct_mapping(node, deep)

    return UniqueKeys
