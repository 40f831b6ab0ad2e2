"""The ``gnnscale`` command: LightningCLI with the data properties linked to the model.

gnnscale fit --config recipes/neighbor_sage/config.yaml
gnnscale fit --config recipes/neighbor_sage/config.yaml --print_config
"""

from __future__ import annotations

import torch
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from gnnscale.data import _GraphDataModule
from gnnscale.models import NodeClassifier

__all__ = ["GnnscaleCLI", "main"]

TRAINER_DEFAULTS = {
    "logger": {
        "class_path": "lightning.pytorch.loggers.CSVLogger",
        "init_args": {"save_dir": "runs"},
    },
}


def _check_precision(precision: str, accelerator: str) -> None:
    """Lightning would quietly swap fp16 for bf16 on CPU; say so instead."""
    on_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    if precision in ("16", "16-mixed") and not on_gpu:
        raise ValueError(
            f"--trainer.precision={precision} needs a CUDA GPU (fp16 autocast with loss scaling); "
            "on CPU use --trainer.precision=bf16-mixed or 32"
        )
    if precision.startswith("bf16") and on_gpu and not torch.cuda.is_bf16_supported():
        raise ValueError(
            f"--trainer.precision={precision}: this GPU has no bf16; use "
            "--trainer.precision=16-mixed"
        )


class GnnscaleCLI(LightningCLI):
    """LightningCLI that links ``num_features``/``num_classes`` and tests after ``fit``."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Never type the feature or class count twice: they come from the data."""
        parser.link_arguments(
            "data.num_features", "model.init_args.in_channels", apply_on="instantiate"
        )
        parser.link_arguments(
            "data.num_classes", "model.init_args.num_classes", apply_on="instantiate"
        )

    def before_instantiate_classes(self) -> None:
        """Refuse a precision the device cannot run, before any data is loaded."""
        trainer = self.config[self.subcommand].trainer if self.subcommand else self.config.trainer
        _check_precision(str(trainer.precision), str(trainer.accelerator))

    def after_fit(self) -> None:
        """Report test accuracy of the best checkpoint (the last weights if none was saved)."""
        if self.trainer.interrupted:
            return
        best = getattr(self.trainer.checkpoint_callback, "best_model_path", "")
        ckpt = "best" if best else None
        self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=ckpt)


def main(args: list[str] | None = None) -> GnnscaleCLI:
    """Run the CLI (``args`` as on the command line; ``None`` reads ``sys.argv``)."""
    return GnnscaleCLI(
        NodeClassifier,
        _GraphDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        trainer_defaults=TRAINER_DEFAULTS,
        save_config_kwargs={"overwrite": True},
        args=args,
    )


if __name__ == "__main__":
    main()
