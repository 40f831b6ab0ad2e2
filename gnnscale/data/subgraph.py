"""Cluster-GCN and GraphSAINT: batches are whole subgraphs, sampled by PyG's loaders."""

from __future__ import annotations

import copy
import hashlib
import math
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.loader import ClusterLoader

from gnnscale._compat import ClusterData
from gnnscale.data.args import EvalArgs, LoaderArgs, Preprocess, check_positive
from gnnscale.data.node import NodeDataModule
from gnnscale.data.resume import ResumableLoader
from gnnscale.data.synthetic import SyntheticGraph
from gnnscale.errors import ConfigError
from gnnscale.measure import trim_heap
from gnnscale.memory import proportional_batches
from gnnscale.saint import SAINTLoader
from gnnscale.stores.cache import cached_folder, check_writable


def _graph_key(data: Data, *params: Any) -> str:
    """Fingerprint of the graph structure and parameters, for on-disk caches."""
    h = hashlib.blake2b(digest_size=8)
    h.update(repr((data.num_nodes, *params)).encode())
    h.update(memoryview(data.edge_index.contiguous().numpy()).cast("B"))
    return h.hexdigest()


class _ClusterData(ClusterData):
    """PyG's ClusterData, with pymetis when neither pyg-lib nor torch-sparse has METIS."""

    partitioner = "none (partition read from the cache)"

    def cluster_nodes(self, edge_index: Tensor, num_nodes: int) -> Tensor:
        try:
            cluster = super().cluster_nodes(edge_index, num_nodes)
            self.partitioner = "METIS (torch-sparse or pyg-lib)"
            return cluster
        except ImportError:
            pass
        try:
            import pymetis
        except ImportError as err:
            raise ImportError(
                "Cluster-GCN needs METIS: install pyg-lib, torch-sparse built with METIS, or "
                "pymetis (pip install pymetis)"
            ) from err
        from torch_geometric.utils import index_sort, remove_self_loops, to_undirected

        # METIS wants a symmetric graph without self-loops, in CSR form.
        ei, _ = remove_self_loops(to_undirected(edge_index, num_nodes=num_nodes))
        row, perm = index_sort(ei[0], max_value=num_nodes)
        indptr = torch.zeros(num_nodes + 1, dtype=torch.long)
        indptr[1:] = torch.bincount(row, minlength=num_nodes).cumsum(0)
        _, membership = pymetis.part_graph(
            self.num_parts,
            xadj=indptr.numpy(),
            adjncy=ei[1, perm].numpy(),
            recursive=self.recursive,
        )
        self.partitioner = "pymetis"
        return torch.as_tensor(membership, dtype=torch.long)


class ClusterDataModule(NodeDataModule):
    """Cluster-GCN: METIS splits the graph into parts; each batch is a few parts and their links.

    Not from a prepared graph: PyG's ``ClusterData`` partitions and reorders the whole graph,
    features included, in memory.

    The partition is computed once and cached under ``root/gnnscale_cache``, keyed to the graph
    structure and the parameters, so a changed graph never reuses a stale partition.

    Args:
        dataset: Dataset name, one of ``synthetic``, ``Cora``, ``CiteSeer``, ``PubMed``,
            ``Reddit``, ``Flickr``, ``ogbn-arxiv``, ``ogbn-products``.
        root: Folder of the dataset files and of gnnscale's caches.
        num_parts: Number of METIS parts (clusters) the graph is split into.
        clusters_per_batch: Parts merged into one batch (their between-part edges are kept).
        recursive: Use METIS recursive bisection instead of k-way partitioning.
        synthetic: Size and difficulty of the generated graph (``dataset: synthetic``).
        preprocess: Preprocessing applied once after loading.
        loader: DataLoader workers and memory pinning.
        eval: How validation and test are computed.
    """

    _not_on_disk = "PyG's ClusterData partitions and reorders the whole graph in memory"

    def __init__(
        self,
        dataset: str = "synthetic",
        root: Path = Path("data"),
        num_parts: int = 1000,
        clusters_per_batch: int = 20,
        recursive: bool = False,
        synthetic: SyntheticGraph = SyntheticGraph(),  # noqa: B008
        preprocess: Preprocess = Preprocess(),  # noqa: B008
        loader: LoaderArgs = LoaderArgs(),  # noqa: B008
        eval: EvalArgs = EvalArgs(),  # noqa: B008
    ) -> None:
        super().__init__(dataset, root, synthetic, preprocess, loader, eval)
        check_positive(num_parts=num_parts, clusters_per_batch=clusters_per_batch)
        if clusters_per_batch > num_parts:
            raise ConfigError(
                f"--data.clusters_per_batch must be <= --data.num_parts (got "
                f"{clusters_per_batch} > {num_parts})"
            )
        self.num_parts = num_parts
        self.clusters_per_batch = clusters_per_batch
        self.recursive = recursive

    def _setup_train(self) -> None:
        data = self.data
        if self.num_parts > data.num_nodes:
            raise ConfigError(
                f"--data.num_parts ({self.num_parts}) is larger than the graph "
                f"({data.num_nodes} nodes): choose at most {data.num_nodes}, usually "
                "num_nodes / 1000 or fewer"
            )
        train = data.train_mask
        num_batches = math.ceil(self.num_parts / self.clusters_per_batch)
        # A node attribute, so ClusterData permutes and slices it along with x and y.
        data = copy.copy(data)
        data.loss_weight = train * (num_batches / int(train.sum()))
        check_writable(self.cache_dir, "--data.root")  # before METIS, not after
        key = _graph_key(data, "cluster", self.num_parts, self.recursive)
        folder = self.cache_dir / f"cluster_{key}"

        def partition(save_dir: Path) -> _ClusterData:
            return _ClusterData(
                data,
                num_parts=self.num_parts,
                recursive=self.recursive,
                save_dir=str(save_dir),
                log=False,
            )

        built: list[_ClusterData] = []
        cached_folder(folder, lambda tmp: built.append(partition(tmp)), "Cluster-GCN partition")
        if built:  # partitioning freed its CSR copies and METIS's arrays: give the pages back
            trim_heap()
        self._cluster_data = built[0] if built else partition(folder)
        perm = self._cluster_data.partition.node_perm
        if not torch.equal(perm.sort().values, torch.arange(data.num_nodes)):
            raise ConfigError(
                f"the Cluster-GCN partition in {folder} does not permute this graph's "
                f"{data.num_nodes} nodes; delete the folder to rebuild it"
            )
        rank_zero_info(f"gnnscale: Cluster-GCN partitioner is {self._cluster_data.partitioner}")

    def train_dataloader(self) -> ResumableLoader:
        """Shuffled batches of ``clusters_per_batch`` parts."""
        loader = ClusterLoader(
            self._cluster_data, batch_size=self.clusters_per_batch, **self.loader.kwargs()
        )
        return self._resumable(loader, shuffle=True, transform=self._subgraph_layout())

    def _smaller_batches(self, max_nodes: float, mean_nodes: float) -> str | None:
        size = int(self.clusters_per_batch * max_nodes / mean_nodes)
        return f"--data.clusters_per_batch={size} (nodes per batch grow with it)" if size else None

    def _loss_weight(self, batch: Data) -> tuple[Tensor, int]:
        return batch.loss_weight, int(batch.train_mask.sum())


class SAINTDataModule(NodeDataModule):
    """GraphSAINT: batches are sampled subgraphs, debiased by the paper's normalisation.

    Not from a prepared graph: the samplers hold the whole adjacency in memory. Subgraphs come
    from :class:`gnnscale.saint.SAINTLoader` (PyG's samplers and normalisation in tensor
    operations, no torch-sparse).

    ``node_norm`` (estimated from ``sample_coverage`` pre-sampled subgraphs and cached under
    ``root/gnnscale_cache``) weights each training node's loss. ``edge_norm`` would rescale
    aggregation, but SAGEConv and GATv2Conv take no edge weights, so it is not used.

    Args:
        dataset: Dataset name, one of ``synthetic``, ``Cora``, ``CiteSeer``, ``PubMed``,
            ``Reddit``, ``Flickr``, ``ogbn-arxiv``, ``ogbn-products``.
        root: Folder of the dataset files and of gnnscale's caches.
        sampler: ``node``, ``edge`` or ``random_walk`` (the paper's best).
        batch_size: Nodes (``node``), edges (``edge``) or walk roots (``random_walk``) per batch.
        walk_length: Length of each random walk (``random_walk`` only).
        num_steps: Batches per epoch.
        sample_coverage: Subgraphs per node sampled up front to estimate the normalisation
            (0 disables it: the training nodes of each batch are averaged).
        synthetic: Size and difficulty of the generated graph (``dataset: synthetic``).
        preprocess: Preprocessing applied once after loading.
        loader: DataLoader workers and memory pinning.
        eval: How validation and test are computed.
    """

    _not_on_disk = "GraphSAINT's samplers hold the whole adjacency in memory"

    def __init__(
        self,
        dataset: str = "synthetic",
        root: Path = Path("data"),
        sampler: Literal["node", "edge", "random_walk"] = "random_walk",
        batch_size: int = 2000,
        walk_length: int = 2,
        num_steps: int = 20,
        sample_coverage: int = 50,
        synthetic: SyntheticGraph = SyntheticGraph(),  # noqa: B008
        preprocess: Preprocess = Preprocess(),  # noqa: B008
        loader: LoaderArgs = LoaderArgs(),  # noqa: B008
        eval: EvalArgs = EvalArgs(),  # noqa: B008
    ) -> None:
        super().__init__(dataset, root, synthetic, preprocess, loader, eval)
        check_positive(batch_size=batch_size, walk_length=walk_length, num_steps=num_steps)
        if sample_coverage < 0:
            raise ConfigError(f"--data.sample_coverage must be >= 0 (got {sample_coverage})")
        self.sampler = sampler
        self.batch_size = batch_size
        self.walk_length = walk_length
        self.num_steps = num_steps
        self.sample_coverage = sample_coverage

    def _setup_train(self) -> None:
        data = self.data
        self._train_fraction = float(data.train_mask.float().mean())
        self._save_dir: Path | None = None
        if self.sample_coverage > 0:
            # num_steps only sets the epoch length, so it stays out of the key.
            # "norm.pt": the normalisation as tensors alone (caches of PyG's pickles differ)
            key = _graph_key(
                data,
                "saint",
                "norm.pt",
                self.sampler,
                self.batch_size,
                self.walk_length,
                self.sample_coverage,
            )
            self._save_dir = self.cache_dir / f"saint_{key}"
            check_writable(self.cache_dir, "--data.root")

    def train_dataloader(self) -> ResumableLoader:
        """``num_steps`` sampled subgraphs (normalisation computed once, then read from cache)."""

        def sampler(save_dir: Path | None) -> SAINTLoader:
            return SAINTLoader(
                self.data,
                self.batch_size,
                self.sampler,
                walk_length=self.walk_length,
                num_steps=self.num_steps,
                sample_coverage=self.sample_coverage,
                save_dir=save_dir,
                **self.loader.kwargs(),
            )

        if self._save_dir is None:
            return self._resumable(sampler(None), shuffle=False, transform=self._subgraph_layout())
        cached_folder(self._save_dir, sampler, "GraphSAINT normalisation")  # type: ignore[arg-type]
        loader = sampler(self._save_dir)  # reads the normalisation back
        bad = int((~torch.isfinite(loader.node_norm)).sum())
        if bad:
            raise ConfigError(
                f"the GraphSAINT normalisation in {self._save_dir} has {bad} non-finite node "
                "weights; delete the folder to rebuild it"
            )
        return self._resumable(loader, shuffle=False, transform=self._subgraph_layout())

    def _smaller_batches(self, max_nodes: float, mean_nodes: float) -> str | None:
        return proportional_batches(self.batch_size)(max_nodes, mean_nodes)

    def _loss_weight(self, batch: Data) -> tuple[Tensor, int]:
        train = batch.train_mask
        num_train = int(train.sum())
        if self.sample_coverage == 0:
            expected = self._train_fraction * batch.num_nodes
            return train / max(expected, 1.0), num_train
        # sum(node_norm * loss) over a subgraph estimates sum(loss) / N over the whole graph;
        # dividing by the training fraction makes it the mean over training nodes.
        return batch.node_norm * train / self._train_fraction, num_train
