"""Every private name of torch, PyG and Lightning that gnnscale uses, in this one module.

gnnscale reaches into a library only where no public hook does the job, and only here. Each
name below was read on torch 2.13, torch-geometric 2.8.1 and lightning 2.6.6, and is used on the
floors pyproject.toml names (the fast tier passes on them); ``tests/test_compat.py`` checks every
one and fails naming the one a release moved. Where gnnscale overrides a library's private
method, the class is subclassed here once and the method handed on under a public name of ours
(``NeighborSampler.sample_seeds``, ...): gnnscale's own classes override those.

The ``_put_*``/``_get_*``/``_remove_*`` methods of PyG's ``FeatureStore`` and ``GraphStore`` are
not here: they are PyG's documented interface for writing a store.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch_geometric.data
import torch_geometric.loader
import torch_geometric.sampler
import torch_geometric.typing
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningCLI as _LightningCLI
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader
from torch_geometric.data.graph_store import EdgeAttr, EdgeLayout

__all__ = [
    "ClusterData",
    "GraphStore",
    "LightningCLI",
    "MultiProcessingLauncher",
    "NeighborSampler",
    "OVERRIDDEN",
    "TorchDispatchMode",
    "backend_checks_lifted",
    "batches_that_stepped",
    "coo_parts",
    "disable_torch_function_subclass",
    "forward_hooks",
    "in_memory_data",
    "logger_opened",
    "saved_batches_that_stepped",
    "shared_storage",
    "worker_processes",
]

# torch

#: Runs ``__torch_function__``'s call as on a plain ``Tensor`` (``gnnscale.stores.MappedTensor``).
disable_torch_function_subclass = torch._C.DisableTorchFunctionSubclass


def coo_parts(t: Tensor) -> tuple[Tensor, Tensor]:
    """A sparse COO tensor's indices and values as stored (``indices()`` wants it coalesced)."""
    return t._indices(), t._values()


def shared_storage(like: Tensor, nbytes: int) -> torch.UntypedStorage:
    """``nbytes`` of shared memory on ``like``'s device, as PyG's collate allocates them."""
    return like.untyped_storage()._new_shared(nbytes)


def forward_hooks(module: torch.nn.Module) -> Iterator[tuple[Callable[..., Any], bool]]:
    """``module``'s forward hooks, each with whether it takes the call's keyword arguments."""
    for key, hook in module._forward_hooks.items():
        yield hook, key in module._forward_hooks_with_kwargs


def worker_processes(loader: DataLoader) -> list[Any]:
    """The worker processes of a loader's persistent iterator (none before its first epoch)."""
    iterator = loader._iterator
    return list(getattr(iterator, "_workers", []))


# PyG


class NeighborSampler(torch_geometric.sampler.NeighborSampler):
    """PyG's ``NeighborSampler``, its private draw of one batch overridable as ``sample_seeds``."""

    def _sample(self, seed: Any, seed_time: Any = None, **kwargs: Any) -> Any:
        return self.sample_seeds(seed, seed_time, **kwargs)

    def sample_seeds(self, seed: Any, seed_time: Any = None, **kwargs: Any) -> Any:
        """One batch's ``SamplerOutput`` (``HeteroSamplerOutput``) around ``seed``; PyG's."""
        return self.pyg_sample_seeds(seed, seed_time, **kwargs)

    def pyg_sample_seeds(self, seed: Any, seed_time: Any = None, **kwargs: Any) -> Any:
        """PyG's own draw, by its backend (pyg-lib or torch-sparse)."""
        return super()._sample(seed, seed_time, **kwargs)


#: pyg-lib's features that PyG's ``NeighborSampler.__init__`` refuses without (``ImportError``).
BACKEND_FEATURES = ("WITH_EDGE_TIME_NEIGHBOR_SAMPLE", "WITH_WEIGHTED_NEIGHBOR_SAMPLE")


@contextlib.contextmanager
def backend_checks_lifted() -> Iterator[None]:
    """PyG's ``NeighborSampler.__init__`` without its checks for edge time and weights in pyg-lib.

    For a sampler that draws both itself (``gnnscale.sampling.HopSampler``); every other step
    of the constructor (which attribute is time, the CSC sorted by it) stays PyG's.
    """
    saved = {name: getattr(torch_geometric.typing, name) for name in BACKEND_FEATURES}
    try:
        for name in BACKEND_FEATURES:
            setattr(torch_geometric.typing, name, True)
        yield
    finally:
        for name, value in saved.items():
            setattr(torch_geometric.typing, name, value)


class ClusterData(torch_geometric.loader.ClusterData):
    """PyG's ``ClusterData``, its METIS call overridable as ``cluster_nodes``."""

    def _metis(self, edge_index: Tensor, num_nodes: int) -> Tensor:
        return self.cluster_nodes(edge_index, num_nodes)

    def cluster_nodes(self, edge_index: Tensor, num_nodes: int) -> Tensor:
        """Each node's cluster; PyG's (pyg-lib's or torch-sparse's METIS)."""
        return super()._metis(edge_index, num_nodes)


class GraphStore(torch_geometric.data.GraphStore):
    """PyG's ``GraphStore``, its layout conversion overridable as ``edge_layout``."""

    def _edge_to_layout(
        self, attr: EdgeAttr, layout: EdgeLayout, store: bool = False
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        return self.edge_layout(attr, layout, store)

    def edge_layout(
        self, attr: EdgeAttr, layout: EdgeLayout, store: bool = False
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """``attr``'s edges in ``layout``, with the map to the input's order; PyG's."""
        return super()._edge_to_layout(attr, layout, store)


def in_memory_data(dataset: torch_geometric.data.InMemoryDataset) -> Any:
    """An ``InMemoryDataset``'s collated graphs (its ``data`` property warns)."""
    return dataset._data


# Lightning

MultiProcessingLauncher = _MultiProcessingLauncher  # what ``strategy="ddp_spawn"``/fork launch


class LightningCLI(_LightningCLI):
    """Lightning's CLI, the run of a subcommand and its arguments overridable by public names."""

    def _run_subcommand(self, subcommand: str) -> None:
        self.run_subcommand(subcommand)

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict[str, Any]:
        return self.subcommand_kwargs(subcommand)

    def run_subcommand(self, subcommand: str) -> None:
        """Run ``fit``, ``validate``, ``test`` or ``predict``, its hooks around it; Lightning's."""
        super()._run_subcommand(subcommand)

    def subcommand_kwargs(self, subcommand: str) -> dict[str, Any]:
        """The keyword arguments ``Trainer.<subcommand>`` is called with; Lightning's."""
        return super()._prepare_subcommand_kwargs(subcommand)


def batches_that_stepped(trainer: Trainer) -> int:
    """The step ``LightningModule.log`` writes its rows at (``global_step`` counts optimizers)."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def saved_batches_that_stepped(checkpoint: dict[str, Any]) -> int | None:
    """:func:`batches_that_stepped` as a checkpoint holds it (``None``: not there)."""
    loop = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.state_dict", {})
    return loop.get("_batches_that_stepped")


def logger_opened(logger: Logger) -> bool:
    """Whether ``logger`` opened its experiment (its file) in this process already."""
    return getattr(logger, "_experiment", None) is not None


#: The private methods the classes above hand on, with the parameters gnnscale passes.
OVERRIDDEN: tuple[tuple[type, str, tuple[str, ...]], ...] = (
    (torch_geometric.sampler.NeighborSampler, "_sample", ("seed", "seed_time", "kwargs")),
    (torch_geometric.loader.ClusterData, "_metis", ("edge_index", "num_nodes")),
    (torch_geometric.data.GraphStore, "_edge_to_layout", ("attr", "layout", "store")),
    (_LightningCLI, "_run_subcommand", ("subcommand",)),
    (_LightningCLI, "_prepare_subcommand_kwargs", ("subcommand",)),
)
