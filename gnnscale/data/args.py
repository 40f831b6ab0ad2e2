"""Option groups shared by the DataModules: preprocessing, loader workers, evaluation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gnnscale.errors import ConfigError


@dataclass(frozen=True)
class Preprocess:
    """Optional preprocessing, applied once after loading.

    Args:
        largest_component: Keep only the largest connected component (the number of dropped
            nodes is logged). Isolated nodes cost memory and add nothing to message passing.
        to_undirected: Add reverse edges so that messages flow both ways.
        normalize_features: Shift features to be non-negative and scale each node's to sum to 1
            (PyG's ``NormalizeFeatures``), as the GCN and GAT papers do for the bag-of-words
            citation graphs.
        feature_dtype: Store node features in this dtype; ``bfloat16`` halves feature memory.
    """

    largest_component: bool = False
    to_undirected: bool = False
    normalize_features: bool = False
    feature_dtype: Literal["float32", "float16", "bfloat16"] = "float32"


@dataclass(frozen=True)
class LoaderArgs:
    """Options of the ``torch.utils.data.DataLoader`` behind every loader.

    Args:
        num_workers: Worker processes that sample batches while the model trains (0: sample in
            the main process).
        pin_memory: Page-lock batches so host-to-GPU copies are faster and asynchronous.
        persistent_workers: Keep workers alive between epochs instead of forking them again.
    """

    num_workers: int = 0
    pin_memory: bool = False
    persistent_workers: bool = False

    def __post_init__(self) -> None:
        """Refuse a worker setup that DataLoader would reject later."""
        if self.num_workers < 0:
            raise ConfigError(f"--data.loader.num_workers must be >= 0 (got {self.num_workers})")
        if self.persistent_workers and self.num_workers == 0:
            raise ConfigError(
                "--data.loader.persistent_workers needs --data.loader.num_workers > 0"
            )

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for a DataLoader."""
        return {
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
            "persistent_workers": self.persistent_workers,
        }


@dataclass(frozen=True)
class EvalArgs:
    """How validation, test and predict compute their outputs.

    Args:
        mode: ``layerwise``: exact, every node sees its full neighbourhood, computed one layer
            at a time over the whole graph (PyG's ``inference`` pattern). ``sampled``: neighbour
            sampling around the evaluated nodes; cheaper on huge graphs, slightly noisy.
            ``full``: exact, one forward pass over the whole graph; needs full-batch memory.
        batch_size: Nodes per evaluation batch.
        num_neighbors: Fan-out per layer for ``sampled`` mode; defaults to the training fan-out
            (neighbour sampling) or full neighbourhoods (other samplers).
    """

    mode: Literal["layerwise", "sampled", "full"] = "layerwise"
    batch_size: int = 4096
    num_neighbors: list[int] | None = None

    def __post_init__(self) -> None:
        """Refuse non-positive sizes."""
        if self.batch_size < 1:
            raise ConfigError(f"--data.eval.batch_size must be >= 1 (got {self.batch_size})")


def check_positive(**values: int | float) -> None:
    """Refuse a size or count that is not positive, naming its ``--data`` flag."""
    for key, value in values.items():
        if value <= 0:
            raise ConfigError(f"--data.{key} must be > 0 (got {value})")
