"""Neighbour sampling for node classification (GraphSAGE's): ``NeighborDataModule``.

Seeds and their sampled fan-out per layer, from a graph in memory or a prepared folder (the
shared loading, checks and evaluation loaders are ``NodeDataModule``'s, in ``node``).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.sampler import NodeSamplerInput

from gnnscale.data.args import EvalArgs, LoaderArgs, Preprocess, SamplingArgs, check_positive
from gnnscale.data.node import NodeDataModule
from gnnscale.data.resume import ResumableLoader
from gnnscale.data.sources import check_cache
from gnnscale.data.synthetic import SyntheticGraph
from gnnscale.errors import ConfigError
from gnnscale.handshake import BatchRequest

__all__ = ["NeighborDataModule"]


class NeighborDataModule(NodeDataModule):
    """Neighbour sampling (GraphSAGE): each batch is seed nodes plus a sampled fan-out per layer.

    Args:
        dataset: Dataset name, one of ``synthetic``, ``Cora``, ``CiteSeer``, ``PubMed``,
            ``Reddit``, ``Flickr``, ``ogbn-arxiv``, ``ogbn-products``.
        root: Folder of the dataset files and of gnnscale's caches.
        num_neighbors: Neighbours sampled per node, one entry per GNN layer (``-1``: all).
        batch_size: Seed (training) nodes per batch.
        synthetic: Size and difficulty of the generated graph (``dataset: synthetic``).
        preprocess: Preprocessing applied once after loading.
        loader: DataLoader workers and memory pinning.
        eval: How validation and test are computed.
        verify: ``dataset: prepared`` only: ``full`` checks every block's checksum when the
            folder is opened (one read of every file per process), ``size`` only the sizes
            (for a large folder verified once already).
        read_threads: ``dataset: prepared`` only: threads that read a batch's rows at once
            (default: 32 where the folder is larger than the page cache can keep, else 1).
        feature_cache_gib: ``dataset: prepared`` only: feature rows held in memory.
        sampling: Neighbours by time (each seed sees only nodes no newer than itself) or by
            weight; evaluation is then ``sampled`` (layer-wise and full evaluation compute each
            node once, whatever its seed's time).

    With ``dataset: prepared`` and ``root`` a folder written by ``gnnscale prepare``, the graph
    is memory-mapped (``gnnscale.stores.prepared``): the sampler walks the mapped CSC and batches
    gather their feature rows from the mapped file, so nothing but the batch enters private memory
    and processes on one machine share the pages. Evaluation must then be ``sampled``.
    """

    _not_on_disk = None

    def __init__(
        self,
        dataset: str = "synthetic",
        root: Path = Path("data"),
        num_neighbors: list[int] = [15, 10],  # noqa: B006 (never mutated)
        batch_size: int = 1024,
        synthetic: SyntheticGraph = SyntheticGraph(),  # noqa: B008
        preprocess: Preprocess = Preprocess(),  # noqa: B008
        loader: LoaderArgs = LoaderArgs(),  # noqa: B008
        eval: EvalArgs = EvalArgs(),  # noqa: B008
        verify: Literal["full", "size"] = "full",
        read_threads: int | None = None,
        feature_cache_gib: float = 0.0,
        sampling: SamplingArgs = SamplingArgs(),  # noqa: B008
    ) -> None:
        modes = eval.set_to("layerwise") + eval.set_to("full")
        if sampling.time_attr is not None and modes:
            raise ConfigError(
                f"--data.sampling.time_attr samples each seed's neighbours by its own time; "
                f"--data.eval.{modes[0]} computes each node once, for every seed: set "
                f"--data.eval.{modes[0]}=sampled"
            )
        super().__init__(dataset, root, synthetic, preprocess, loader, eval, verify, read_threads)
        self.sampling = sampling
        check_positive(batch_size=batch_size, read_threads=read_threads)
        check_cache(feature_cache_gib, dataset)
        self.feature_cache_gib = feature_cache_gib
        if not num_neighbors or any(k == 0 or k < -1 for k in num_neighbors):
            raise ConfigError(
                f"--data.num_neighbors must list one fan-out per layer, each > 0 or -1 for all "
                f"neighbours (got {num_neighbors})"
            )
        self.num_neighbors = list(num_neighbors)
        self.batch_size = batch_size

    def configure_batches(self, request: BatchRequest) -> None:
        """As the base's, and refuse a depth that differs from ``num_neighbors``' length.

        Args:
            request: What the model's batches must carry.
        """
        if request.num_layers and len(self.num_neighbors) != request.num_layers:
            raise ConfigError(
                f"--data.num_neighbors has {len(self.num_neighbors)} entries "
                f"({self.num_neighbors}) but --model.num_layers is {request.num_layers}: give "
                "one fan-out per layer"
            )
        super().configure_batches(request)

    def _eval_fanout(self) -> list[int]:
        return self.eval.num_neighbors or self.num_neighbors

    def _train_fanout(self) -> list[int]:
        return self.num_neighbors

    def _train_batch_size(self) -> int:
        return self.batch_size

    def train_dataloader(self) -> ResumableLoader:
        """Shuffled batches of ``batch_size`` training seeds with their sampled neighbourhoods."""
        loader = self._hop_loader(
            self.num_neighbors, input_nodes=self.data.train_mask, batch_size=self.batch_size
        )
        return self._resumable(loader, shuffle=True)

    def _smaller_batches(self, max_nodes: float, mean_nodes: float) -> str | None:
        """The largest batch size (then with halved fan-outs) whose batches fit ``max_nodes``."""
        for fanout in (self.num_neighbors, [max(1, k // 2) for k in self.num_neighbors]):
            size = self.batch_size
            while size >= 16:
                if self._mean_nodes(size, fanout) <= max_nodes:
                    return f"--data.batch_size={size} --data.num_neighbors={fanout}"
                size //= 2
        return "no batch size down to 16 fits: use a machine with more memory"

    def _mean_nodes(self, batch_size: int, fanout: list[int]) -> float:
        """Mean nodes of three batches of training seeds sampled with other settings.

        The DataModule's own sampler (a prepared graph's too), under a fixed seed that leaves
        the run's random stream where it was; sampling only.
        """
        sampler = self._csc_sampler.with_fanout(fanout)
        seeds = self.data.train_mask.nonzero().view(-1)
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(0)
            batches = seeds[torch.randperm(seeds.numel())][: 3 * batch_size].split(batch_size)
            sizes = [
                sampler.sample_from_nodes(NodeSamplerInput(None, b)).node.numel() for b in batches
            ]
        return statistics.mean(sizes)

    def _loss_weight(self, batch: Data) -> tuple[Tensor, int]:
        # Seeds come first; a short last batch keeps weight 1/batch_size per seed, so every
        # training node weighs the same.
        weight = torch.zeros(batch.num_nodes)
        weight[: batch.batch_size] = 1.0 / self.batch_size
        return weight, batch.batch_size
