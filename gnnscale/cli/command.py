"""The ``gnnscale`` command: LightningCLI with the data properties linked to the model.

    gnnscale fit --config recipes/neighbor_sage/config.yaml
    gnnscale fit --config recipes/neighbor_sage/config.yaml --print_config
    gnnscale plan --config recipes/neighbor_sage/config.yaml --budget_gb 2   # peak memory, before
    gnnscale prepare --config recipes/on_disk_graph/prepare.yaml             # a graph to disk
    gnnscale prepare-graphs --config recipes/many_graphs_on_disk/prepare.yaml  # many graphs

``plan`` is a subcommand like ``fit``: :class:`Trainer` adds the method it runs, so LightningCLI
builds its parser (``gnnscale plan --help``) from the method's signature. ``prepare`` and
``prepare-graphs`` need no model or trainer: they are functions (``gnnscale.cli.prepare``), each
parsed by jsonargparse on its own; :data:`SUBCOMMANDS` maps them.
"""

from __future__ import annotations

import argparse
import csv
import errno
import inspect
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import lightning as L
from jsonargparse import ArgumentError, DefaultHelpFormatter, Namespace
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_info
from torch.multiprocessing import ProcessExitedException

from gnnscale._compat import LightningCLI, logger_opened, saved_batches_that_stepped
from gnnscale.callbacks import PredictionWriter
from gnnscale.checkpoint import StreamingCheckpointIO, start_from
from gnnscale.checkpoint import load as load_checkpoint
from gnnscale.cli import argerrors, checks, resume, runtime
from gnnscale.cli.preemption import (
    PREEMPTED_EXIT,
    Preemption,
    forwarded,
    launched_by,
    launcher_gone,
)
from gnnscale.cli.prepare import append_main, prepare_graphs_main, prepare_main
from gnnscale.data.datasets import check_size
from gnnscale.data.synthetic import SyntheticGraph
from gnnscale.errors import NO_ROOM, ConfigError, GnnscaleError, MemoryLimitError
from gnnscale.handshake import BatchRequest, ConfiguresBatches, GraphSpec
from gnnscale.memory import Plannable
from gnnscale.plan import MemoryPlan, format_plan, plan

__all__ = ["SUBCOMMANDS", "GnnscaleCLI", "Trainer", "main", "run"]

TRAINER_DEFAULTS = {
    "logger": {
        "class_path": "lightning.pytorch.loggers.CSVLogger",
        "init_args": {"save_dir": "runs"},
    },
}


class Trainer(L.Trainer):
    """Lightning's Trainer with one more entry point, :meth:`plan`, which ``gnnscale plan`` runs."""

    memory_plan: MemoryPlan | None = None

    def plan(
        self,
        model: L.LightningModule,
        datamodule: L.LightningDataModule,
        budget_gb: float | None = None,
        num_batches: int = 6,
    ) -> MemoryPlan:
        """Predict the run's peak memory from a few batches, before the run (see gnnscale.plan).

        Trains ``num_batches`` batches with this Trainer's precision and accumulation, then
        prints the expected peak resident memory of one training process and what it is made
        of. Nothing is logged or checkpointed.

        Args:
            model: The run's model.
            datamodule: The run's DataModule.
            budget_gb: Memory budget in GiB; if the run needs more, suggest a batch size and
                fan-out (for neighbour sampling) that fit.
            num_batches: Training batches to sample and train on (more: a steadier estimate).
        """
        if not isinstance(datamodule, Plannable):
            raise ConfigError(
                "gnnscale plan models the batches of gnnscale's node, link and graph DataModules; "
                f"{type(datamodule).__name__} is not one of them (measure a short fit instead)"
            )
        if budget_gb is not None and budget_gb <= 0:
            raise ConfigError(f"--budget_gb must be > 0 GiB (got {budget_gb})")
        if num_batches < 1:
            raise ConfigError(f"--num_batches must be >= 1 (got {num_batches})")
        on_gpu = self.strategy.root_device.type == "cuda"
        self.memory_plan = plan(
            datamodule,
            model,
            {
                "accelerator": "gpu" if on_gpu else "cpu",
                "precision": self.precision,
                "accumulate_grad_batches": self.accumulate_grad_batches,
                "plugins": [self.strategy.checkpoint_io],
            },
            num_batches=num_batches,
            budget_gb=budget_gb,
            run_epochs=self.max_epochs or 1,
            world_size=self.num_devices * self.num_nodes,
            limit_train_batches=self.limit_train_batches,
            checkpoint=self.checkpoint_callback is not None,
        )
        rank_zero_info(format_plan(self.memory_plan))
        return self.memory_plan


class _Parser(LightningArgumentParser):
    """Lightning's parser, which takes an option only as spelled in full.

    argparse would take a prefix (``--model.init_args.speed.target_only`` for
    ``target_only_layers``), which a later option could make ambiguous. jsonargparse builds the
    parsers of the classes in a config (the model's, the data's) from this class too.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})


class GnnscaleCLI(LightningCLI):
    """LightningCLI that links what the data tells the model, and tests after ``fit``."""

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Lightning's subcommands, and ``plan`` (peak memory before a run)."""
        return {**LightningCLI.subcommands(), "plan": {"model", "datamodule"}}

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Never type what the data knows: feature, class and node counts, the graph's types.

        A link applies where the DataModule has the attribute and the model the argument
        (``graph_spec``: ``gnnscale.handshake``).
        """
        for source, target in (
            ("num_features", "in_channels"),
            ("num_classes", "num_classes"),
            ("num_nodes", "num_nodes"),
        ):
            parser.link_arguments(
                f"data.{source}", f"model.init_args.{target}", apply_on="instantiate"
            )
        # As a dictionary: jsonargparse builds the model's dataclass argument from one.
        parser.link_arguments(
            "data.graph_spec", "model.init_args.graph", GraphSpec.as_dict, apply_on="instantiate"
        )
        parser.add_argument(
            "--weights_from",
            type=Path | None,
            default=None,
            help="fit: start from this checkpoint's weights, a new run (fine-tuning: its "
            "optimizer, epochs and data settings are this config's; --ckpt_path continues a "
            "run instead). A node table grown since keeps its rows, new nodes get fresh ones.",
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse, and check ``--ckpt_path`` against the config before anything is written.

        A key or value jsonargparse refuses becomes one line (``ConfigError``); so does a
        checkpoint of a run with other settings (``gnnscale.cli.resume``). ``last`` is resolved
        here.
        """
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as err:  # raised, not printed: main() sets exit_on_error=False
            given = sys.argv[1:] if args is None else args
            command = next((f"gnnscale {a}" for a in given if a in self.subcommands()), "gnnscale")
            raise ConfigError(argerrors.one_line(str(err), command)) from err
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        self.settings = resume.settings(config)  # what its checkpoints will say they continue
        # Before Lightning replaces the model's settings with the checkpoint's, silently.
        ckpt_path = config.get("ckpt_path")
        if ckpt_path == "last":
            config.ckpt_path = str(resume.resolve_last(config, self.settings, subcommand))
        elif ckpt_path and ckpt_path not in ("best", "hpc", "registry"):  # Lightning's names
            resume.check(Path(ckpt_path), self.settings, subcommand)

    def before_instantiate_classes(self) -> None:
        """Refuse a precision the device cannot run, or a graph too large to load or generate.

        Before any data is loaded or downloaded: ``plan`` answers from the config's arithmetic.
        """
        config = self.config[self.subcommand] if self.subcommand else self.config
        trainer = config.trainer
        runtime.check_precision(str(trainer.precision), str(trainer.accelerator), trainer.strategy)
        checks.check_trainer_counts(config.trainer, config.get("model"), self.subcommand)
        if self.subcommand == "fit":
            checks.check_validation(config.trainer)
        data = getattr(config.get("data"), "init_args", None)
        synthetic = data.get("synthetic") if data is not None else None
        if isinstance(synthetic, Namespace) and data is not None and data.dataset == "synthetic":
            settings = synthetic.as_dict()
            if settings.keys() <= {f.name for f in fields(SyntheticGraph)}:  # a node graph's
                SyntheticGraph(**settings).check_fits()
        elif data is not None and isinstance(data.get("dataset"), str):
            check_size(data.dataset, Path(data.get("root") or "data"))
        precision = str(config.trainer.precision)
        if runtime.cpu_precision(precision, str(config.trainer.accelerator)) != precision:
            config.trainer.precision = "32-true"

    def instantiate_classes(self) -> None:
        """Build model, data and Trainer; refuse a model the loaders cannot feed, before loading."""
        try:
            super().instantiate_classes()
        except ValueError as err:
            # jsonargparse wraps a class's refusal in a "Union subtypes" report, among its other
            # attempts (``Expected a <class 'NoneType'>``): keep the class's own sentence.
            reasons = [
                line.strip()[2:]
                for line in str(err).splitlines()
                if line.startswith("  - ") and "Expected a" not in line
            ]
            if not reasons:
                raise
            raise ConfigError(reasons[0]) from err
        # jsonargparse counts a link as applied even where the model has no such argument
        # (``num_nodes`` for GraphSAGE), and Lightning saves it with the model's
        # hyperparameters: a checkpoint the CLI could not build the model from again.
        accepted = inspect.signature(type(self.model).__init__).parameters
        for key in [k for k in self.model.hparams if k[0] != "_" and k not in accepted]:
            del self.model.hparams[key]
        if isinstance(self.datamodule, ConfiguresBatches):  # gnnscale's DataModules
            self.datamodule.configure_batches(BatchRequest.of(self.model))

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        """The Trainer, saving and loading checkpoints with ``StreamingCheckpointIO``.

        Unless ``--trainer.plugins`` names another ``CheckpointIO``: Lightning's own holds a
        second copy of every checkpoint in memory while it saves (see ``gnnscale.checkpoint``).
        Settings that would change what the run means are refused (``gnnscale.cli.checks``).
        """
        trainer = self.config_init.get(str(self.subcommand), self.config_init).get("trainer", {})
        accumulate = trainer.get("accumulate_grad_batches", 1)
        if accumulate is not None and accumulate < 1:
            raise ConfigError(f"--trainer.accumulate_grad_batches must be >= 1 (got {accumulate})")
        checks.check_own_accumulation(self.model, accumulate or 1)
        plugins = kwargs.get("plugins", trainer.get("plugins")) or []
        plugins = list(plugins) if isinstance(plugins, list | tuple) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            kwargs["plugins"] = [*plugins, StreamingCheckpointIO()]
        callbacks = kwargs.get("callbacks", trainer.get("callbacks")) or []
        callbacks = list(callbacks) if isinstance(callbacks, list | tuple) else [callbacks]
        if self.subcommand == "predict" and not any(
            isinstance(c, BasePredictionWriter) for c in callbacks
        ):
            callbacks.append(PredictionWriter())  # else predictions are computed and lost
        # A SIGTERM saves the run and exits 143; every checkpoint says what it continues.
        kwargs["callbacks"] = [
            *callbacks,
            Preemption(),
            resume.SavedSettings(self.settings),
            checks.AccumulationCheck(),
            runtime.SameStepMemory(),
        ]
        built = super().instantiate_trainer(**kwargs)
        if self.subcommand == "fit":
            monitors = [*built.checkpoint_callbacks, *built.early_stopping_callbacks]
            checks.check_monitors(monitors)
            checks.check_ranked_monitors(monitors, self.datamodule)
        return built

    def subcommand_kwargs(self, subcommand: str) -> dict[str, Any]:
        """As Lightning's; ``predict`` keeps no predictions in memory (its writer has them)."""
        kwargs = super().subcommand_kwargs(subcommand)
        if subcommand == "predict" and kwargs.get("return_predictions") is None:
            kwargs["return_predictions"] = False
        return kwargs

    def run_subcommand(self, subcommand: str) -> None:
        """Run it; if it fails before logging anything, remove the empty version folder it made."""
        try:
            with forwarded(self.trainer):  # a SIGTERM reaches forked ranks too
                super().run_subcommand(subcommand)
        except BaseException as err:
            # The logger's own folder: Trainer.log_dir is a collective call under DDP, which
            # would wait forever for ranks that did not fail.
            logger = self.trainer.logger
            log_dir = Path(logger.log_dir) if logger is not None and logger.log_dir else None
            if self.trainer.global_rank == 0 and log_dir is not None and log_dir.is_dir():
                disposable = ("config.yaml", "hparams.yaml")  # written before any step
                kept = [p for p in log_dir.rglob("*") if p.is_file() and p.name not in disposable]
                if not kept:  # nothing but the saved configs: no metrics, no checkpoint
                    shutil.rmtree(log_dir, ignore_errors=True)
            if isinstance(err, ProcessExitedException) and err.exit_code == PREEMPTED_EXIT:
                raise SystemExit(PREEMPTED_EXIT) from None  # forked ranks saved and stopped
            raise

    def before_fit(self) -> None:
        """Fix the run's folder; resuming into it, keep the rows logged before the checkpoint."""
        # Loggers pick their version (version_N) when first asked. Asked here, in the process
        # that also runs the test after fit, so processes forked for DDP use the same one.
        for each in self.trainer.loggers:
            _ = each.version
        config = self.config_init[self.subcommand]
        ckpt_path, weights_from = config.get("ckpt_path"), config.get("weights_from")
        if weights_from is not None and not ckpt_path:  # a resume takes the checkpoint's own
            rank_zero_info(start_from(self.model, Path(weights_from)))
        if ckpt_path and self.trainer.global_rank == 0:
            saved = load_checkpoint(Path(ckpt_path))
            last = _last_logged_step(saved)
            # What was logged after the checkpoint is trained, and logged, again.
            kept = _keep_csv_rows(self.trainer.logger, lambda row: row <= last)
            if kept is not None:
                rank_zero_info(f"gnnscale: resuming in its folder, {kept} earlier rows kept")

    def after_fit(self) -> None:
        """Report test accuracy of the best checkpoint (the last weights if none was saved)."""
        if self.trainer.interrupted:
            return
        # Under DDP with forked processes, the training rows were written by rank 0's process,
        # not this one: keep them beside the test's.
        if self.trainer.global_rank == 0:
            _keep_csv_rows(self.trainer.logger, lambda step: True)
        # The path itself, not "best": Lightning would warn that the recipes keep two
        # ModelCheckpoint callbacks (the best by val/acc, and the last for resuming).
        best = _best_that_exists(self.trainer.checkpoint_callback)
        self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best)


def _best_that_exists(callback: Any) -> str | None:
    """The best checkpoint ``callback`` kept, as a file that exists (``None``: there is none).

    A resumed run restores the callback's record from ``last.ckpt``, written before the last
    validation: a better checkpoint may have replaced the one it names since (the run had
    finished, or was killed in its final test). The best of those still on disk then, by the
    callback's scores, else the newest one it saved.
    """
    best = getattr(callback, "best_model_path", "")
    if not best or Path(best).is_file():
        return best or None
    kept = {p: s for p, s in callback.best_k_models.items() if Path(p).is_file()}
    if kept:
        pick = max if callback.mode == "max" else min
        found = pick(kept, key=lambda p: float(kept[p]))
    else:
        last = f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}"
        saved = [
            p for p in Path(callback.dirpath).glob(f"*{callback.FILE_EXTENSION}") if p.name != last
        ]
        if not saved:
            rank_zero_info(
                f"gnnscale: the best checkpoint {best} is gone; testing the last weights"
            )
            return None
        found = str(max(saved, key=lambda p: p.stat().st_mtime))
    rank_zero_info(f"gnnscale: the best checkpoint {best} was replaced since; testing {found}")
    callback.best_model_path = found
    return found


def _last_logged_step(checkpoint: dict[str, Any]) -> int:
    """The logging step of the last training batch in ``checkpoint``.

    Loggers number rows by Lightning's count of batches that stepped, which is not
    ``global_step``: under manual optimization every batch counts and every optimizer's step
    adds to ``global_step`` (two per step for the embedding models). A checkpoint saved after a
    training batch holds the count that batch's row is logged at, right after the save; one
    saved after validation holds the next batch's, which has no row yet.
    """
    saved = saved_batches_that_stepped(checkpoint)
    return checkpoint["global_step"] - 1 if saved is None else int(saved)


def _keep_csv_rows(logger: Any, keep: Callable[[int], bool]) -> int | None:
    """Have a ``CSVLogger`` append to its ``metrics.csv``, keeping the rows whose step ``keep``s.

    A ``CSVLogger`` deletes ``metrics.csv`` when it first writes in a folder that has one (a
    resumed run's, or one that another process wrote). Returns how many rows were kept (None:
    not a CSVLogger, or no file).
    """
    if not isinstance(logger, CSVLogger):
        return None
    if logger_opened(logger):  # in this process already
        logger.experiment.save()  # what it holds goes to the file first
    metrics = Path(logger.log_dir) / "metrics.csv"
    if not metrics.is_file():
        return None
    with metrics.open(newline="") as f:
        reader = csv.DictReader(f)
        keys = sorted(reader.fieldnames or [])
        rows = [r for r in reader if keep(int(r["step"]))]
    writer = logger.experiment  # opened now, if not before (deleting the file)
    writer.metrics_keys = sorted({*keys, *writer.metrics_keys})  # its columns: it appends
    with metrics.open("w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=writer.metrics_keys)
        out.writeheader()
        out.writerows(rows)
    return len(rows)


def main(args: list[str] | None = None, run: bool = True) -> GnnscaleCLI:
    """Build the CLI and run its subcommand: every entry point (command, recipe script) does.

    Args:
        args: Command-line arguments, subcommand first; ``None`` reads ``sys.argv``.
        run: ``False`` only builds the model, DataModule and Trainer from ``args`` (given
            without a subcommand), as the benchmarks do.
    """
    # A rank started by another process (torchrun's agent; Lightning's ddp launcher, rank 0, sets
    # LOCAL_RANK for the ranks it starts): stop if that process is killed.
    if "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ:
        launched_by(os.getppid())
    checks.check_config_keys(sys.argv[1:] if args is None else args)
    runtime.steady_cpu_memory()
    runtime.fork_safe_cuda_check()
    runtime.quiet()
    # Past the memory it can see, an allocation fails and the command says so in one line.
    with runtime.limited_memory() as limit:
        try:
            return _cli(args, run)
        except BaseException as err:
            if limit is not None and runtime.out_of_memory(err):
                raise MemoryLimitError(runtime.out_of_memory_line(err, limit)) from err
            raise


def _cli(args: list[str] | None, run: bool) -> GnnscaleCLI:
    """The Lightning CLI, built (and, ``run``, its subcommand run) from ``args``."""
    return GnnscaleCLI(
        # Any model and DataModule: node, link and graph-level ones, or a user's own. The class
        # (``--data=...`` or the config's ``class_path``) comes before its ``init_args``.
        L.LightningModule,
        L.LightningDataModule,
        trainer_class=Trainer,
        parser_class=_Parser,
        subclass_mode_model=True,
        subclass_mode_data=True,
        trainer_defaults=TRAINER_DEFAULTS,
        save_config_kwargs={"overwrite": True},
        # Refusals raise ConfigError (one line, exit 2); --help names every subcommand.
        parser_kwargs={
            "exit_on_error": False,
            "description": _DESCRIPTION,
            "formatter_class": _Help,
        },
        args=args,
        run=run,
    )


# Subcommands that are not LightningCLI's (fit, validate, test, predict, plan): what runs each,
# and its line in ``gnnscale --help``.
SUBCOMMANDS: dict[str, tuple[Callable[[], Any], str]] = {
    "prepare": (prepare_main, "write one graph to a folder every process maps (docs/stores.md)"),
    "prepare-graphs": (prepare_graphs_main, "write many small graphs to a store (LMDB, SQLite)"),
    "append": (append_main, "add new nodes and edges to a prepared folder (docs/stores.md)"),
}
_DESCRIPTION = "gnnscale: PyTorch Geometric training recipes for graphs that stop fitting.\n\n" + (
    "The subcommands below run a recipe's --config; these write its data:\n"
    + "".join(f"  gnnscale {name:<16}{line}\n" for name, (_, line) in SUBCOMMANDS.items())
    + "Each subcommand's options: gnnscale SUBCOMMAND --help."
)


class _Help(DefaultHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """jsonargparse's help, the description's lines kept as written (the subcommand table)."""


def run() -> None:
    """Console entry point: ``main`` without a return value (which ``sys.exit`` would print).

    Refused input (:class:`ConfigError`) and a diverged run (:class:`TrainingDiverged`) are
    printed as one line, exit status 2; set ``GNNSCALE_DEBUG=1`` for the traceback.
    """
    name = sys.argv[1] if sys.argv[1:] else ""
    try:
        command, _ = SUBCOMMANDS.get(name, (main, ""))
        command()
    except GnnscaleError as err:
        if os.environ.get("GNNSCALE_DEBUG"):
            raise
        message = str(err)
        if message.startswith("Caught ") and "\nOriginal Traceback" in message:
            # Re-raised from a DataLoader worker: torch's message is the worker's traceback,
            # whose last line is "module.ErrorClass: the message".
            message = message.rstrip().rsplit("\n", 1)[-1].partition(": ")[2]
        print(f"gnnscale: error: {message}", file=sys.stderr)
        sys.exit(2)
    except OSError as err:
        line = _disk_refusal(err, writes_a_store=name in SUBCOMMANDS)
        if line is None or os.environ.get("GNNSCALE_DEBUG"):
            raise
        print(f"gnnscale: error: {line}", file=sys.stderr)
        sys.exit(1 if err.errno in NO_ROOM else 2)
    except Exception:
        if not launcher_gone() or os.environ.get("GNNSCALE_DEBUG"):
            raise
        # Its collectives fail once the launcher, rank 0 under Lightning's ddp, is gone.
        print(
            f"gnnscale: local rank {os.environ.get('LOCAL_RANK', '?')} stopped: the process that "
            "launched it was killed, so nothing more could be saved. Resume from the last "
            "checkpoint saved: the same command with --ckpt_path last",
            file=sys.stderr,
        )
        sys.exit(PREEMPTED_EXIT)


def _disk_refusal(err: OSError, writes_a_store: bool = False) -> str | None:
    """One line for a folder that cannot be written (read-only, no permission, no room).

    ``writes_a_store``: the command is ``prepare`` or ``prepare-graphs``, whose folder is
    ``--out`` (they say a full disk in their own words).
    """
    where = err.filename or "a file"
    if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        fix = (
            "make that folder writable, or write elsewhere (--out)"
            if writes_a_store
            else "make that folder writable, or write elsewhere "
            "(--trainer.logger.init_args.save_dir, --trainer.default_root_dir)"
        )
        return f"cannot write {where} ({err.strerror}): {fix}"
    if err.errno in NO_ROOM:
        return (
            f"no room to write {where} ({err.strerror}); what was saved before is intact: free "
            "space there, then resume with --ckpt_path last"
        )
    return None
