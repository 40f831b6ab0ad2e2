"""Option groups shared by the DataModules: preprocessing, loader workers, evaluation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from gnnscale.errors import ConfigError, GroupSettingError


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
            the main process). ``auto``: 1 where a CUDA GPU is present, to overlap sampling
            with the GPU's step; 0 without one, where a worker competes with the step's own
            threads (the neighbour recipe's epochs took 1.2-1.5x as long with one, here).
        pin_memory: Page-lock batches so host-to-GPU copies are faster and asynchronous.
        persistent_workers: Keep workers alive between epochs instead of forking them again
            (with ``auto``: where it gives a worker).
        sampler: Who samples neighbours. ``vectorized``: gnnscale's ``HopSampler``, a hop's
            draws for all its nodes (of every edge type) in a few tensor operations. ``pyg``:
            PyG's backend (pyg-lib, else torch-sparse, which makes a tensor of every random
            draw: several times slower; neither is on PyPI). ``auto``: PyG's with pyg-lib
            installed, else ``vectorized``.
    """

    num_workers: int | Literal["auto"] = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    sampler: Literal["auto", "vectorized", "pyg"] = "auto"

    def __post_init__(self) -> None:
        """Refuse a worker setup that DataLoader would reject later."""
        if self.num_workers == "auto":
            return
        if self.num_workers < 0:
            raise ConfigError(f"--data.loader.num_workers must be >= 0 (got {self.num_workers})")
        if self.persistent_workers and self.num_workers == 0:
            raise ConfigError(
                "--data.loader.persistent_workers needs --data.loader.num_workers > 0: to load "
                "in the training process, also set --data.loader.persistent_workers=false"
            )

    @property
    def workers(self) -> int:
        """Worker processes, ``auto`` resolved."""
        if self.num_workers == "auto":
            return 1 if torch.cuda.is_available() else 0
        return self.num_workers

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for a DataLoader."""
        return {
            "num_workers": self.workers,
            "pin_memory": self.pin_memory,
            "persistent_workers": self.persistent_workers and self.workers > 0,
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
        val_mode: How the validation at every epoch's end computes its outputs; none: as
            ``mode``. ``sampled`` costs about a forward pass per batch of validation nodes,
            where layer-wise inference computes every node of the graph at every epoch; test
            and predict still run as ``mode`` says, so the reported test metric stays exact.
        val_nodes: Validate on this many of the validation nodes, a random subset drawn once
            (seed 0: the same every epoch, every run, every rank count); none: all of them.
            Sampled validation costs in proportion to the nodes it scores; the test is unchanged.
    """

    mode: Literal["layerwise", "sampled", "full"] = "layerwise"
    batch_size: int = 4096
    num_neighbors: list[int] | None = None
    val_mode: Literal["layerwise", "sampled", "full"] | None = None
    val_nodes: int | None = None

    @property
    def validation(self) -> str:
        """How validation runs: ``val_mode``, else ``mode``."""
        return self.val_mode or self.mode

    def set_to(self, mode: str) -> list[str]:
        """The flags (``mode``, ``val_mode``) set to ``mode``: what a refusal names."""
        return [flag for flag in ("mode", "val_mode") if getattr(self, flag) == mode]

    def __post_init__(self) -> None:
        """Refuse non-positive sizes."""
        if self.batch_size < 1:
            raise ConfigError(f"--data.eval.batch_size must be >= 1 (got {self.batch_size})")
        if self.val_nodes is not None and self.val_nodes < 1:
            raise ConfigError(
                f"--data.eval.val_nodes must be >= 1, or null for every validation node "
                f"(got {self.val_nodes})"
            )

    def validated(self, mask: Tensor) -> Tensor:
        """The validation ``mask`` cut to ``val_nodes`` of its nodes (drawn once, seed 0)."""
        nodes = mask.nonzero().view(-1)
        if self.val_nodes is None or self.val_nodes >= nodes.numel():
            return mask
        order = torch.randperm(nodes.numel(), generator=torch.Generator().manual_seed(0))
        kept = torch.zeros(mask.numel(), dtype=torch.bool)
        kept[nodes[order[: self.val_nodes]]] = True
        return kept


@dataclass(frozen=True)
class SamplingArgs:
    """How neighbours are drawn beyond uniformly: by time, by weight (``HopSampler``'s options).

    Args:
        time_attr: Sample by time: the node attribute holding each node's time (``time``; a
            prepared folder's from ``time.npy``). Each seed sees, at every hop, only in-edges
            from nodes no newer than itself (compared with the seed's own time, as PyG and
            GraphBolt do); each seed samples its own subgraph. ``None``: untimed.
        temporal_strategy: ``uniform``: a uniform subset of those in-edges; ``last``: the
            newest.
        strict: Only nodes older than the seed (``<``); else as old or older (``<=``, PyG's).
        window: Only nodes not older than the seed's time minus this; ``None``: all.
        weight_attr: Draw each in-edge with probability proportional to this edge attribute
            (in memory; a prepared folder stores no edge weights). ``None``: uniformly.
    """

    time_attr: str | None = None
    temporal_strategy: Literal["uniform", "last"] = "uniform"
    strict: bool = False
    window: float | None = None
    weight_attr: str | None = None

    def __post_init__(self) -> None:
        """Refuse a window that admits nothing, or time settings without a time."""
        if self.window is not None and not self.window >= 0:
            raise GroupSettingError(
                "{group}.window must be >= 0 (the time column's units) or left out (got "
                f"{self.window})",
                "sampling",
            )
        timed = (self.temporal_strategy != "uniform", self.strict, self.window is not None)
        if self.time_attr is None and any(timed):
            raise GroupSettingError(
                "{group}.temporal_strategy, strict and window sample by time: give "
                "{group}.time_attr (the node attribute holding each node's time)",
                "sampling",
            )

    def kwargs(self) -> dict[str, Any]:
        """``HopSampler``'s keyword arguments (none for what is not set)."""
        out: dict[str, Any] = {}
        if self.time_attr is not None:
            out |= {"time_attr": self.time_attr, "temporal_strategy": self.temporal_strategy}
            out |= {"strict": self.strict, "window": self.window}
        if self.weight_attr is not None:
            out["weight_attr"] = self.weight_attr
        return out


def check_positive(**values: int | float | None) -> None:
    """Refuse a size or count that is not positive (``None``: unset), naming its ``--data`` flag."""
    for key, value in values.items():
        if value is not None and value <= 0:
            raise ConfigError(f"--data.{key} must be > 0 (got {value})")


@dataclass(frozen=True)
class NodeSplit:
    """How a DataModule that splits nodes itself divides the labelled nodes (the rest: test).

    Args:
        train_fraction: Fraction of the labelled nodes in the training split.
        val_fraction: Fraction in the validation split.
    """

    train_fraction: float = 0.3
    val_fraction: float = 0.1

    def __post_init__(self) -> None:
        """Refuse fractions that leave a split empty."""
        train, val = self.train_fraction, self.val_fraction
        if not (train > 0 and val > 0 and train + val < 1):
            raise GroupSettingError(
                "{group}.train_fraction and {group}.val_fraction must be > 0 and sum to less "
                f"than 1, the rest being the test split (got {train}, {val})",
                "split",
            )


@dataclass(frozen=True)
class GraphSplit:
    """How a dataset of many graphs is divided, at random (the rest: training).

    Args:
        val_fraction: Share of the graphs held out for validation.
        test_fraction: Share held out for testing.
        seed: Seed of the random split.
    """

    val_fraction: float = 0.05
    test_fraction: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        """Refuse fractions that leave no graph to train on."""
        for name in ("val_fraction", "test_fraction"):
            value = getattr(self, name)
            if not 0 < value < 1:
                raise GroupSettingError(
                    f"{{group}}.{name} must be in (0, 1) (got {value})", "split"
                )
        if self.val_fraction + self.test_fraction >= 1:
            raise GroupSettingError(
                "{group}.val_fraction + {group}.test_fraction must be < 1, leaving graphs to "
                f"train on (got {self.val_fraction} + {self.test_fraction})",
                "split",
            )


# OGB graphs gnnscale reads only once prepared on disk (gnnscale.stores.ogb prepares them), with
# what the refusal adds.
PREPARED_ONLY = {
    "ogbn-papers100M": "",
    "ogbn-mag": " (heterogeneous: gnnscale.HeteroNeighborDataModule or LinkDataModule)",
}


def check_dataset(dataset: str, known: tuple[str, ...] | list[str]) -> None:
    """Refuse a ``--data.dataset`` the DataModule does not know, listing those it does."""
    if dataset in known:
        return
    if dataset in PREPARED_ONLY:
        raise ConfigError(
            f"--data.dataset {dataset} is read from disk, never loaded whole: prepare it once "
            f"(`gnnscale prepare --source Ogb --source.name {dataset} --source.root ROOT --out "
            "DIR`, from OGB's download unpacked in ROOT: docs/stores.md), then train with "
            f"--data.dataset prepared --data.root DIR{PREPARED_ONLY[dataset]}"
        )
    raise ConfigError(
        f"--data.dataset {dataset!r} is not known; choose one of {', '.join(known)}, or prepare "
        "another graph first (gnnscale prepare --source Npy, Ogb, Dataset or Recommender "
        "--out DIR; see gnnscale prepare --help) and train it with --data.dataset prepared "
        "--data.root DIR"
    )
