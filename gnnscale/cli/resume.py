"""Which run a ``--ckpt_path`` continues, and whether this config may continue it.

Every checkpoint ``gnnscale`` saves carries the settings that give its position a meaning
(:func:`settings`: the model, the data but for where it lies and how it is loaded, the seed and
the gradient accumulation), written by :class:`SavedSettings`. Before anything is built or
written, :func:`check` compares them with the config: a resume that would continue another run
(other weights' shapes, other batches, another step count per batch) is refused in one line
naming what differs, and leaves the run's folder, metrics and config as they were.
``--ckpt_path last`` (:func:`resolve_last`) takes the newest run whose checkpoint this config
may continue, and says which.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from gnnscale import checkpoint
from gnnscale.data.sources import folder_digest
from gnnscale.errors import ConfigError

__all__ = ["KEY", "SavedSettings", "check", "resolve_last", "settings"]

KEY = "gnnscale_settings"  # where a checkpoint carries them
# Settings a resumed run may change: where the data lies, how it is loaded, checked and
# batched for evaluation; every other data and model setting, the seed and the accumulation
# fix what a saved step means.
MAY_CHANGE = (
    "data.init_args.root",
    "data.init_args.loader.",
    "data.init_args.verify",
    "data.init_args.eval.batch_size",
)
TRAINER_KEYS = ("accumulate_grad_batches",)
# Set from the data when the model is built (the CLI's links): compared as the data's settings.
LINKED = ("model.init_args.in_channels", "model.init_args.num_classes")


def _flat(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out |= _flat(item, f"{prefix}.{key}" if prefix else str(key))
        return out
    return {prefix: value}


def settings(config: Any) -> dict[str, Any]:
    """The settings of ``config`` (a subcommand's parsed namespace) that a checkpoint fixes.

    Flat (``model.init_args.hidden_channels``) and JSON-plain (paths as strings).
    """
    plain = json.loads(json.dumps(config.as_dict(), default=str))
    chosen = {"model": plain.get("model"), "data": plain.get("data")}
    chosen["seed_everything"] = plain.get("seed_everything")
    trainer = plain.get("trainer") or {}
    chosen["trainer"] = {key: trainer.get(key) for key in TRAINER_KEYS}
    flat = _flat(chosen, "")
    data = flat.get("data.init_args.dataset"), flat.get("data.init_args.root") or "data"
    if (digest := folder_digest(str(data[0]), Path(data[1]))) is not None:  # moved: the same
        flat["data.prepared_files"] = digest  # graph; prepared again: another one
    return {k: v for k, v in flat.items() if not k.startswith(MAY_CHANGE) and k not in LINKED}


class SavedSettings(L.Callback):
    """Writes :func:`settings` into every checkpoint, for :func:`check` to read back."""

    def __init__(self, saved: dict[str, Any]) -> None:
        self.saved = saved

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Add them under :data:`KEY`."""
        checkpoint[KEY] = self.saved


def _load(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"--ckpt_path {path} does not exist; give a saved .ckpt file or `last`")
    checkpoint.refuse_damaged(path)  # every record against its CRC-32
    try:  # memory-mapped: only what is read below comes from disk
        loaded = checkpoint.load(path)
    except ConfigError:  # it holds code
        raise
    except Exception as err:  # a truncated or damaged file
        raise ConfigError(
            f"--ckpt_path {path} cannot be read ({type(err).__name__}: {err}); it is damaged "
            "or not a checkpoint: give another one (checkpoints/ beside it holds the others)"
        ) from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"--ckpt_path {path} is not a Lightning checkpoint")
    return loaded


def _differences(saved: dict[str, Any], wanted: dict[str, Any], model_only: bool) -> list[str]:
    keys = [k for k in saved if k in wanted and saved[k] != wanted[k]]
    if model_only:
        keys = [k for k in keys if k.startswith("model.")]
    return [f"{k}={saved[k]!r} there, {wanted[k]!r} here" for k in keys]


def _saved(state: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's settings; for one saved without them, its model's hyper-parameters."""
    if KEY in state:
        return dict(state[KEY])
    hparams = dict(state.get("hyper_parameters") or {})
    if "_class_path" not in hparams:
        return {}  # not saved by a CLI: nothing to compare
    out = {"model.class_path": hparams.pop("_class_path")}
    out |= {f"model.init_args.{k}": v for k, v in hparams.items() if not k.startswith("_")}
    return out


def _refuse_old_arguments(
    path: Path, state: dict[str, Any], class_path: Any, subcommand: str
) -> None:
    """Refuse a checkpoint whose model's saved arguments its class no longer takes.

    Lightning builds the model from them before it loads the weights; an argument renamed since
    (an older gnnscale's) would stop it with a traceback.
    """
    hparams = state.get("hyper_parameters") or {}
    class_path = hparams.get("_class_path", class_path)
    module, _, name = str(class_path).rpartition(".")
    try:
        params = inspect.signature(getattr(importlib.import_module(module), name)).parameters
    except (ImportError, AttributeError, ValueError):
        return  # not a class this process can name: Lightning's own message stands
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    old = sorted(k for k in hparams if k[0] != "_" and k not in params)
    if old:
        raise ConfigError(
            f"--ckpt_path {path} was saved with arguments {name} no longer takes "
            f"({', '.join(old)}; CHANGELOG.md says what they became): {subcommand} it with the "
            "gnnscale that saved it, or drop --ckpt_path to start a new run"
        )


def check(path: Path, wanted: dict[str, Any], subcommand: str) -> None:
    """Refuse ``path`` unless its run had ``wanted``'s settings (for ``fit``; else its model).

    ``validate``, ``test`` and ``predict`` may read other data with the same model.
    """
    state = _load(path)
    _refuse_old_arguments(path, state, wanted.get("model.class_path"), subcommand)
    differ = _differences(_saved(state), wanted, model_only=subcommand != "fit")
    if differ:
        advice = (
            "resume with that run's settings, or drop --ckpt_path to start a new run"
            if subcommand == "fit"
            else f"{subcommand} with that run's model settings"
        )
        raise ConfigError(
            f"--ckpt_path {path} was saved by a run with other settings ({'; '.join(differ)}): "
            + advice
        )


def resolve_last(config: Any, wanted: dict[str, Any], subcommand: str) -> Path:
    """``--ckpt_path last``: the ``last.ckpt`` of the newest run that this config may continue.

    Runs are ``<save_dir>/<name>/version_N`` (the logger's), checkpoints in their
    ``checkpoints`` folder; ``--trainer.logger.init_args.version`` names one. ``fit`` resumes
    in the run's own folder (the logger's version is set to it); the other subcommands only read.
    """
    args = getattr(config.trainer.logger, "init_args", None)
    if args is None or not args.get("save_dir"):
        raise ConfigError(
            "--ckpt_path last looks for the newest run under the logger's save_dir; this "
            "config's logger has none: pass --ckpt_path PATH/TO/last.ckpt"
        )
    root = Path(args.save_dir) / (args.get("name") or "lightning_logs")
    version = args.get("version")
    pattern = "version_*" if version is None else f"version_{version}"
    runs = [p.parent.parent for p in root.glob(f"{pattern}/checkpoints/last.ckpt")]
    runs = [p for p in runs if p.name.removeprefix("version_").isdigit()]
    if not runs:
        raise ConfigError(
            f"--ckpt_path last: no run under {root} has saved checkpoints/last.ckpt. A run "
            "saves one with a ModelCheckpoint(save_last=true), as the recipes do; or pass "
            "--ckpt_path PATH/TO/file.ckpt"
        )
    runs.sort(key=lambda p: int(p.name.removeprefix("version_")), reverse=True)
    refusals = []
    for run in runs:
        path = run / "checkpoints" / "last.ckpt"
        if (problem := checkpoint.damage(path)) is not None:
            whole = checkpoint.newest_whole(path.parent, path)
            if whole is None:
                refusals.append(f"{path} is damaged ({problem}), with no whole one beside it")
                continue
            rank_zero_info(f"gnnscale: {path} is damaged ({problem}); taking {whole} instead")
            path = whole
        try:
            check(path, wanted, subcommand)
        except ConfigError as err:
            refusals.append(str(err))
            continue
        if subcommand == "fit":
            args.version = int(run.name.removeprefix("version_"))
        skipped = (
            f" (newer runs have other settings: {', '.join(r.name for r in runs[: len(refusals)])})"
        )
        rank_zero_info(
            f"gnnscale: --ckpt_path last {'resumes' if subcommand == 'fit' else 'reads'} {path}"
            + (skipped if refusals else "")
        )
        return path
    raise ConfigError(f"--ckpt_path last: no run under {root} matches this config; {refusals[0]}")
