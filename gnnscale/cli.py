"""The ``gnnscale`` command: LightningCLI with the data properties linked to the model.

gnnscale fit --config recipes/neighbor_sage/config.yaml
gnnscale fit --config recipes/neighbor_sage/config.yaml --print_config
"""

from __future__ import annotations

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from gnnscale.data import _GraphDataModule
from gnnscale.models import _NodeClassifier

__all__ = ["GnnscaleCLI", "main"]

TRAINER_DEFAULTS = {
    "logger": {
        "class_path": "lightning.pytorch.loggers.CSVLogger",
        "init_args": {"save_dir": "runs"},
    },
}


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

    def after_fit(self) -> None:
        """Report test accuracy of the best checkpoint (the last weights if none was saved)."""
        if self.trainer.interrupted:
            return
        ckpt = (
            "best"
            if self.trainer.checkpoint_callback and self.trainer.checkpoint_callback.best_model_path
            else None
        )
        self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=ckpt)


def main(args: list[str] | None = None) -> GnnscaleCLI:
    """Run the CLI (``args`` as on the command line; ``None`` reads ``sys.argv``)."""
    return GnnscaleCLI(
        _NodeClassifier,
        _GraphDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        trainer_defaults=TRAINER_DEFAULTS,
        save_config_kwargs={"overwrite": True},
        args=args,
    )


if __name__ == "__main__":
    main()
