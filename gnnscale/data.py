"""LightningDataModules for PyG's samplers, each constructible from YAML alone.

Every training batch, whatever sampled it, carries ``x``, ``edge_index``, ``y`` and a per-node
``loss_weight`` (plus ``num_loss_nodes`` for logging). The weights are scaled so that their
*expected* sum per micro-batch is 1: the model's loss is ``sum(weight * cross_entropy)``, every
training node counts the same however many of them a batch holds, and gradient accumulation
(which averages micro-batch losses) stays an unbiased mean over training nodes.

Neighbour batches for a model that takes it (GraphSAGE: ``first_layer_aggr``) also carry
``x_aggr``, the first layer's neighbour aggregate, computed in the loader's worker; their ``x``
and ``edge_index`` then hold only what the later layers read (:func:`aggregate_first_layer`).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import lightning as L
import psutil
import torch
import torch_geometric.transforms as T
import torch_geometric.typing
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader
from torch_geometric.data import Data
from torch_geometric.index import index2ptr
from torch_geometric.loader import (
    ClusterData,
    ClusterLoader,
    GraphSAINTEdgeSampler,
    GraphSAINTNodeSampler,
    GraphSAINTRandomWalkSampler,
    NeighborLoader,
)
from torch_geometric.sampler import NeighborSampler
from torch_geometric.typing import SparseTensor
from torch_geometric.utils import spmm

from gnnscale.cache import cached_folder, check_writable
from gnnscale.errors import ConfigError
from gnnscale.measure import trim_heap
from gnnscale.ondisk import PreparedGraph
from gnnscale.resume import ResumableLoader
from gnnscale.synthetic import SyntheticGraph, make_synthetic_graph

__all__ = [
    "DATASETS",
    "ClusterDataModule",
    "EvalArgs",
    "FullBatchDataModule",
    "LayerwiseBatch",
    "LoaderArgs",
    "NeighborDataModule",
    "Preprocess",
    "SAINTDataModule",
    "load_dataset",
    "sampling_backend",
]

DATASETS = (
    "synthetic",
    "prepared",
    "Cora",
    "CiteSeer",
    "PubMed",
    "Reddit",
    "Flickr",
    "ogbn-arxiv",
    "ogbn-products",
)
# PyG's sparse-dense product goes through torch.sparse CSR tensors, which warn on first use.
warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta", UserWarning)
warnings.filterwarnings("ignore", "Sparse invariant checks are implicitly disabled", UserWarning)

_SPLITS = ("train_mask", "val_mask", "test_mask")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


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


@dataclass
class LayerwiseBatch:
    """One evaluation step that runs exact layer-wise inference over the whole graph.

    Args:
        loader: Loader of full one-hop neighbourhoods of all nodes.
        y: Labels of all nodes.
        mask: Nodes to score; ``None`` for all (predict).
    """

    loader: NeighborLoader
    y: Tensor
    mask: Tensor | None


def sampling_backend() -> str:
    """Name the library that PyG's neighbour sampling runs on."""
    if torch_geometric.typing.WITH_PYG_LIB:
        return "pyg-lib"
    if torch_geometric.typing.WITH_TORCH_SPARSE:
        return "torch-sparse"
    return "none"


@functools.cache
def _log_backend_once() -> None:
    rank_zero_info(f"gnnscale: neighbour sampling backend is {sampling_backend()}")


def _check_positive(**values: int | float) -> None:
    for key, value in values.items():
        if value <= 0:
            raise ConfigError(f"--data.{key} must be > 0 (got {value})")


def _check_root(dataset: str, root: Path) -> None:
    if dataset == "synthetic":
        return  # the root only holds caches, created on first use
    if dataset == "prepared":
        PreparedGraph.read_manifest(root)  # a clear error now if it is not a prepared folder
        return
    if not root.is_dir():
        raise ConfigError(
            f"--data.root {str(root)!r} does not exist or is not a folder: create it "
            f"(mkdir -p {root}) to download {dataset} into it, or point --data.root at the "
            f"folder that holds {dataset}"
        )
    if not os.access(root, os.R_OK | os.X_OK):
        raise ConfigError(f"--data.root {str(root)!r} cannot be read: fix its permissions")


def load_dataset(name: str, root: Path, synthetic: SyntheticGraph | None = None) -> Data:
    """Load a node-classification graph by name, downloading into ``root`` if needed.

    Args:
        name: One of :data:`DATASETS`.
        root: Folder of the dataset files (Planetoid reads ``root/<name>/raw`` without network).
        synthetic: Settings of the generated graph when ``name == "synthetic"``.
    """
    if name == "synthetic":
        return make_synthetic_graph(synthetic or SyntheticGraph())
    if name == "prepared":
        return PreparedGraph(root).data
    if name in ("Cora", "CiteSeer", "PubMed"):
        from torch_geometric.datasets import Planetoid

        return Planetoid(str(root), name)[0]
    if name in ("Reddit", "Flickr"):
        from torch_geometric import datasets

        return getattr(datasets, name)(str(root / name))[0]
    if name.startswith("ogbn-"):
        try:
            from ogb.nodeproppred import PygNodePropPredDataset
        except ImportError as err:
            raise ImportError(f"{name} needs the ogb package: pip install 'gnnscale[ogb]'") from err
        ds = PygNodePropPredDataset(name, str(root))
        data, split = ds[0], ds.get_idx_split()
        data.y = data.y.view(-1)
        for key, idx in zip(_SPLITS, ("train", "valid", "test"), strict=True):
            data[key] = torch.zeros(data.num_nodes, dtype=torch.bool)
            data[key][split[idx]] = True
        return data
    raise ConfigError(f"--data.dataset {name!r} is not known; choose one of {', '.join(DATASETS)}")


def _validate_graph(data: Data, dataset: str) -> int:
    """Check splits and labels; return the number of classes."""
    for key in _SPLITS:
        if data.get(key) is None:
            raise ConfigError(
                f"--data.dataset {dataset!r} has no {key!r}: gnnscale needs train, val and test "
                "masks; choose a dataset with a public split or add the masks to the Data object"
            )
    if int(data.train_mask.sum()) == 0:
        raise ConfigError(
            f"the training split of --data.dataset {dataset!r} is empty (after preprocessing); "
            "check --data.preprocess.largest_component and the split fractions"
        )
    if data.y is None or data.y.dim() != 1 or data.y.is_floating_point():
        raise ConfigError(
            f"--data.dataset {dataset!r} needs one integer class id per node in y (got shape "
            f"{None if data.y is None else tuple(data.y.shape)}); convert one-hot labels with "
            "y.argmax(-1)"
        )
    if data.x is not None and data.x.is_floating_point():
        bad = int((~torch.isfinite(data.x)).any(-1).sum()) if data.x.dim() > 1 else 0
        if bad:
            raise ConfigError(
                f"--data.dataset {dataset!r}: {bad} node(s) have NaN or infinite features; "
                "fix or drop them (or impute) before training"
            )
    for key, name in (("val_mask", "validation"), ("test_mask", "test")):
        if not bool(data[key].any()):
            raise ConfigError(
                f"the {name} split of --data.dataset {dataset!r} is empty: gnnscale validates and "
                "tests on it (for a generated graph, raise --data.synthetic.val_fraction, or "
                "lower train_fraction + val_fraction below 1)"
            )
    labelled = data.train_mask | data.val_mask | data.test_mask
    y = data.y[labelled]
    if int(y.min()) < 0:
        raise ConfigError(
            f"labels out of range in --data.dataset {dataset!r}: found {int(y.min())} among "
            "split nodes; class ids must be 0..num_classes-1 (leave unlabelled nodes out of masks)"
        )
    num_classes, present = int(y.max()) + 1, int(torch.unique(y).numel())
    if present < num_classes / 2:
        raise ConfigError(
            f"labels of --data.dataset {dataset!r} are not 0..num_classes-1: the largest is "
            f"{num_classes - 1} but only {present} distinct classes occur, so the model would "
            f"have {num_classes} outputs; remap them (torch.unique(y, return_inverse=True))"
        )
    return num_classes


def _single(item: Any) -> DataLoader:
    """A loader that yields ``item`` once, uncollated."""
    return DataLoader([item], batch_size=None, collate_fn=_identity)  # type: ignore[arg-type]


def _identity(item: Any) -> Any:
    return item


def csr_layout(batch: Data) -> Data:
    """Sort a batch's edges by target node and add ``rowptr``, their CSR row pointer.

    GraphSAGE then aggregates with a sparse-dense product instead of a scatter
    (``gnnscale.models``). The loaders run this in their workers, off the training step's path;
    edges already in target order (as neighbour samplers list them) are not moved.

    Args:
        batch: Any batch with ``edge_index``; edge attributes follow their edges.
    """
    dst = batch.edge_index[1]
    if dst.numel() and not bool((dst[1:] >= dst[:-1]).all()):
        perm = torch.argsort(dst, stable=True)
        for key, value in batch.items():
            if isinstance(value, Tensor) and batch.is_edge_attr(key):
                batch[key] = value[:, perm] if key == "edge_index" else value[perm]
    batch.rowptr = index2ptr(batch.edge_index[1], batch.num_nodes)
    return batch


def csc_layout(batch: Data) -> Data:
    """Add the transpose of a batch's CSR adjacency: ``colptr`` and ``csc_row``.

    ``colptr`` points, for each source node, into ``csc_row``, the targets of its edges. A
    sparse mean's backward is a product with this transpose; torch's own backward of
    ``torch.sparse.mm`` sorts the edges by source again on every training step, here the
    loaders' workers sort them once (GraphSAGE asks for it: ``csc_backward``).

    Args:
        batch: A batch laid out by :func:`csr_layout` (or :func:`hop_layout`).
    """
    src, dst = batch.edge_index
    perm = torch.argsort(src, stable=True)
    batch.colptr = index2ptr(src[perm], batch.num_nodes)
    batch.csc_row = dst[perm]
    return batch


def subgraph_layout(batch: Data, csc: bool = False) -> Data:
    """Cluster-GCN and GraphSAINT batches' transform: :func:`csr_layout`, :func:`csc_layout`."""
    batch = csr_layout(batch)
    return csc_layout(batch) if csc else batch


def csr_adjacency(
    x: Tensor, edge_index: Tensor, rowptr: Tensor, num_dst: int, num_edges: int
) -> Any:
    """The first ``num_dst`` rows of a batch's CSR adjacency (columns: ``x``'s rows), uncopied.

    torch-sparse's ``SparseTensor`` where installed, else a ``torch.sparse`` CSR tensor: the
    ``adj_t`` PyG's convs aggregate with a sparse-dense product.
    """
    num_src = x.size(0)
    rowptr, col = rowptr[: num_dst + 1], edge_index[0, :num_edges]
    if torch_geometric.typing.WITH_TORCH_SPARSE:
        return SparseTensor(
            rowptr=rowptr,
            col=col,
            sparse_sizes=(num_dst, num_src),
            is_sorted=True,
            trust_data=True,
        )
    ones = torch.ones(num_edges, dtype=x.dtype, device=col.device)
    return torch.sparse_csr_tensor(rowptr, col, ones, size=(num_dst, num_src))


def hop_layout(
    batch: Data, num_layers: int, first_layer_aggr: str | None = None, csc: bool = False
) -> Data:
    """Lay a neighbour batch out for target-only layers; the loaders run this in their workers.

    Adds the nodes and edges each hop sampled (pyg-lib reports them, torch-sparse does not) and
    the CSR layout of :func:`csr_layout`. Both backends list a batch's nodes hop by hop, seeds
    first; with the edges sorted by target, the edges into the first ``n`` nodes are the first
    ``rowptr[n]``, and their sources lie one hop further out at most. So each layer reads a
    prefix of the nodes and of the edges, and ``rowptr[: n + 1]`` is its sparse adjacency.

    Args:
        batch: A neighbour-sampled batch (seed nodes first, then each hop's new nodes).
        num_layers: Hops sampled (entries of ``num_neighbors``).
        first_layer_aggr: Also aggregate the first layer's neighbour features here, with this
            reduction (:func:`aggregate_first_layer`); none: the model does.
        csc: Also add the transpose of the edges left (:func:`csc_layout`), for a model whose
            sparse aggregation takes its backward from it.
    """
    batch = csr_layout(batch)
    if "num_sampled_nodes" not in batch:
        src, dst = batch.edge_index
        hop = torch.full((batch.num_nodes,), num_layers + 1, dtype=torch.long)
        hop[: batch.batch_size] = 0
        for k in range(1, num_layers + 1):
            reached = src[hop[dst] == k - 1]
            hop[reached[hop[reached] > k]] = k
        batch.num_sampled_nodes = torch.bincount(hop, minlength=num_layers + 1).tolist()
        batch.num_sampled_edges = torch.bincount(hop[dst], minlength=num_layers).tolist()[
            :num_layers
        ]
    if first_layer_aggr is not None:
        batch = aggregate_first_layer(batch, first_layer_aggr)
    return csc_layout(batch) if csc else batch


def aggregate_first_layer(batch: Data, aggr: str) -> Data:
    """Aggregate a neighbour batch's raw features for the first layer, and keep what is read.

    A GraphSAGE layer computes ``lin_l(aggr(x_j for j in N(i))) + lin_r(x_i)``. On the raw
    features the aggregation has no parameters and needs no gradient, so the loader's worker
    can compute it (the same sparse-dense product the layer would run, as ``x_aggr``) for the
    first layer's targets, hops ``0..L-1``. The training step then reads only those rows: the
    batch keeps their features and labels and the edges into hops ``0..L-2``, which the later
    layers read; the outermost hop's rows and edges stay in the worker. On a [15, 10] batch of
    1,024 seeds, 2 x 10,800 rows travel to the model instead of 62,850.

    ``num_sampled_nodes`` and ``num_sampled_edges`` still describe the whole sample. Features
    stored in half precision are aggregated in float32, as the model would after its cast.

    Args:
        batch: A batch laid out by :func:`hop_layout`.
        aggr: The first layer's reduction: ``mean``, ``sum``, ``max`` or ``min``.
    """
    nodes, edges = batch.num_sampled_nodes, batch.num_sampled_edges
    num_dst, num_edges = sum(nodes[:-1]), sum(edges)
    x = batch.x if batch.x.dtype in (torch.float32, torch.float64) else batch.x.float()
    adj = csr_adjacency(x, batch.edge_index, batch.rowptr, num_dst, num_edges)
    x_aggr = spmm(adj, x, reduce=aggr)
    kept_nodes, kept_edges = sum(nodes[:-2]), sum(edges[:-1])  # what layers 2..L read
    tensors = {k: v for k, v in batch.items() if isinstance(v, Tensor) and k != "rowptr"}
    on_edges = {k for k in tensors if batch.is_edge_attr(k)}  # before any is cut
    on_nodes = {k for k in tensors if batch.is_node_attr(k)}
    for key, value in tensors.items():
        if key == "edge_index":
            batch[key] = value[:, :kept_edges]
        elif key in on_edges:
            batch[key] = value[:kept_edges]
        elif key in on_nodes:
            batch[key] = value[:num_dst]
    batch.rowptr = batch.rowptr[: kept_nodes + 1]
    batch.num_nodes = num_dst
    batch.x_aggr = x_aggr
    return batch


def _graph_key(data: Data, *params: Any) -> str:
    """Fingerprint of the graph structure and parameters, for on-disk caches."""
    h = hashlib.blake2b(digest_size=8)
    h.update(repr((data.num_nodes, *params)).encode())
    h.update(memoryview(data.edge_index.contiguous().numpy()).cast("B"))
    return h.hexdigest()


def resumable(
    trainer: L.Trainer | None, loader: DataLoader, shuffle: bool, transform: Any = None
) -> ResumableLoader:
    """``loader`` wrapped in a ``ResumableLoader``, seeded and sharded for ``trainer``'s ranks.

    Every rank uses rank 0's seed, drawn from the global stream (``seed_everything`` fixes it),
    and takes its own share of each epoch's batches.
    """
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    if trainer is None:
        return ResumableLoader(loader, shuffle, seed, transform=transform)
    seed = trainer.strategy.broadcast(seed)
    rank, world_size = trainer.global_rank, trainer.world_size
    return ResumableLoader(loader, shuffle, seed, rank, world_size, transform)


class RankShare:
    """An evaluation loader over this rank's share of the seeds: every seed scored once.

    Given a ``DataLoader``, Lightning's DDP gives it a ``DistributedSampler``, which repeats
    seeds until the ranks have as many, and the repeats would count twice in the metrics. This
    wraps the loader of ``seeds[rank::world_size]`` in no ``DataLoader``, so Lightning keeps it
    as it is; the metrics then add up the ranks' counts.
    """

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)


def rank_share(
    trainer: L.Trainer | None,
    mask: Tensor | None,
    num_nodes: int,
    loader_of: Callable[[Tensor | None], DataLoader],
) -> Any:
    """The evaluation loader ``loader_of`` builds on the seeds of ``mask`` (``None``: all).

    Under DDP, the loader of this rank's share of those seeds, in a ``RankShare``.
    """
    if trainer is None or trainer.world_size == 1:
        return loader_of(mask)
    nodes = torch.arange(num_nodes) if mask is None else mask.nonzero().view(-1)
    return RankShare(loader_of(nodes[trainer.global_rank :: trainer.world_size]))


class _GraphDataModule(L.LightningDataModule):
    """What every gnnscale DataModule shares: loading, checks, evaluation loaders."""

    # Why this module cannot train from a prepared (memory-mapped) graph; None: it can.
    _not_on_disk: str | None = "it needs the whole graph in memory"
    verify: Literal["full", "size"] = "full"
    # The model's first-layer reduction for neighbour batches' workers to compute, if it takes
    # one (``NodeClassifier.first_layer_aggr``, learned in ``check_model``); None: the model's.
    _first_layer_aggr: str | None = None
    # Whether the model's sparse aggregation takes its backward from training batches' CSC
    # layout (``csc_layout``, ``NodeClassifier.csc_backward``), learned in ``check_model`` too.
    _csc_backward: bool = False

    def __init__(
        self,
        dataset: str,
        root: Path,
        synthetic: SyntheticGraph,
        preprocess: Preprocess,
        loader: LoaderArgs,
        eval: EvalArgs,
    ) -> None:
        super().__init__()
        if dataset not in DATASETS:
            raise ConfigError(
                f"--data.dataset {dataset!r} is not known; choose one of {', '.join(DATASETS)}"
            )
        if dataset == "prepared":
            if self._not_on_disk:
                raise ConfigError(
                    f"{type(self).__name__} cannot train from --data.dataset prepared: "
                    f"{self._not_on_disk}; use gnnscale.NeighborDataModule"
                )
            if preprocess != Preprocess():
                raise ConfigError(
                    "--data.preprocess does not apply to --data.dataset prepared (the files are "
                    "mapped as written): preprocess before `gnnscale prepare`, or drop it"
                )
            if eval.mode != "sampled":
                raise ConfigError(
                    f"--data.eval.mode {eval.mode!r} holds every node's activations in memory; "
                    "with --data.dataset prepared use --data.eval.mode=sampled"
                )
        _check_root(dataset, Path(root))  # after the checks of the settings alone
        self.dataset = dataset
        self.root = Path(root)
        self.synthetic = synthetic
        self.preprocess = preprocess
        self.loader = loader
        self.eval = eval
        self._num_classes = 0

    @cached_property
    def prepared(self) -> PreparedGraph:
        """The memory-mapped graph of ``dataset: prepared`` (``root`` is its folder)."""
        start = time.perf_counter()
        graph = PreparedGraph(self.root, self.verify)
        checked = "checksums verified" if self.verify == "full" else "sizes checked"
        rank_zero_info(
            f"gnnscale: mapped {self.root} ({graph.nbytes / 2**30:.2f} GiB, {checked} in "
            f"{time.perf_counter() - start:.1f} s)"
        )
        return graph

    @cached_property
    def data(self) -> Data:
        """The preprocessed graph, loaded on first use (mapped, for ``dataset: prepared``)."""
        if self.dataset == "prepared":
            self._num_classes = self.prepared.num_classes
            return self.prepared.data
        data = load_dataset(self.dataset, self.root, self.synthetic)
        if self.preprocess.to_undirected:
            data = T.ToUndirected()(data)
        if self.preprocess.largest_component:
            before = data.num_nodes
            data = T.LargestConnectedComponents()(data)
            rank_zero_info(
                f"gnnscale: largest connected component kept {data.num_nodes} of {before} nodes "
                f"(dropped {before - data.num_nodes})"
            )
        if self.preprocess.normalize_features:
            data = T.NormalizeFeatures()(data)
        data.x = data.x.to(_DTYPES[self.preprocess.feature_dtype])
        self._num_classes = _validate_graph(data, self.dataset)
        return data

    @property
    def num_features(self) -> int:
        """Node feature dimension (linked to ``model.in_channels``)."""
        return self.data.num_features

    @property
    def num_classes(self) -> int:
        """Number of classes (linked to ``model.num_classes``)."""
        _ = self.data
        return self._num_classes

    @property
    def cache_dir(self) -> Path:
        """Folder for partitions and normalisation statistics."""
        return self.root / "gnnscale_cache"

    def prepare_data(self) -> None:
        """Download (if needed) and load the dataset."""
        _ = self.data

    def check_model(self, model: Any) -> None:
        """Refuse a model whose depth does not match the loaders' fan-outs (before any data loads).

        Also learns whether the model takes its first layer's aggregation from neighbour
        batches' workers (:func:`aggregate_first_layer`), and whether its training batches
        should carry their adjacency's transpose (:func:`csc_layout`).

        Args:
            model: The LightningModule (its ``num_layers``, if it has one, is checked).
        """
        num_layers = int(getattr(model, "num_layers", 0))
        fanout = self.eval.num_neighbors
        if fanout is not None and num_layers and len(fanout) != num_layers:
            raise ConfigError(
                f"--data.eval.num_neighbors has {len(fanout)} entries but --model.num_layers is "
                f"{num_layers}: give one fan-out per layer"
            )
        self._first_layer_aggr = getattr(model, "first_layer_aggr", None)
        # Measured on CPUs only: GPUs keep PyG's path, and their batches no transpose.
        cpu = self.trainer is None or self.trainer.strategy.root_device.type == "cpu"
        self._csc_backward = bool(getattr(model, "csc_backward", False)) and cpu

    def _hop_layout(self, num_layers: int, train: bool = False) -> Callable[[Data], Data]:
        """The neighbour batches' transform, run in the loader's workers."""
        # Only the layers reading every edge of the batch use its transpose: aggregated, the
        # second; else the first, whose input (the features) needs no gradient.
        csc = train and self._csc_backward and self._first_layer_aggr is not None
        return functools.partial(
            hop_layout, num_layers=num_layers, first_layer_aggr=self._first_layer_aggr, csc=csc
        )

    def _subgraph_layout(self) -> Callable[[Data], Data]:
        """Cluster-GCN and GraphSAINT training batches' transform, run in the workers."""
        return functools.partial(subgraph_layout, csc=self._csc_backward)

    def setup(self, stage: str) -> None:
        """Check the model agrees with the loaders, then build the training loader."""
        _log_backend_once()
        if self.trainer is not None:
            self.check_model(self.trainer.lightning_module)
        if stage == "fit":
            self._setup_train()

    def _model_num_layers(self) -> int:
        model = self.trainer.lightning_module if self.trainer is not None else None
        return int(getattr(model, "num_layers", 0))

    def _setup_train(self) -> None:
        """Precompute what the training loader needs (partitions, statistics); none by default."""

    def _resumable(
        self, loader: DataLoader, shuffle: bool, transform: Any = None
    ) -> ResumableLoader:
        """``loader``'s batches, seeded per epoch and batch, resumable mid-epoch (gnnscale.resume).

        Every rank uses rank 0's seed, drawn from the global stream (``seed_everything`` fixes
        it), and takes its own share of each epoch's batches.
        """
        return resumable(self.trainer, loader, shuffle, transform)

    def _eval_fanout(self) -> list[int]:
        return self.eval.num_neighbors or [-1] * max(self._model_num_layers(), 1)

    @cached_property
    def _csc_sampler(self) -> NeighborSampler:
        if self.dataset != "prepared":
            return NeighborSampler(self.data, [-1], share_memory=self.loader.num_workers > 0)
        # The prepared CSC is already in the sampler's layout: map it instead of building one.
        # (PyG builds the CSC in __init__; given a one-node graph that is free, then replaced.)
        sampler = NeighborSampler(
            Data(edge_index=torch.empty(2, 0, dtype=torch.long), num_nodes=1), [-1]
        )
        sampler.num_nodes = self.data.num_nodes
        sampler.colptr, sampler.row = self.prepared.csc
        sampler.perm = None
        return sampler

    def _neighbor_loader(self, data: Data, fanout: list[int], **kwargs: Any) -> NeighborLoader:
        """PyG's ``NeighborLoader`` over one CSC copy of the graph, shared by every loader.

        Each ``NeighborLoader`` would build its own sampler, and with it a CSC copy of the graph
        (``colptr``, ``row`` and ``perm``: about 16 bytes per edge). Training, validation and
        test loaders held three copies at once, 319 MiB each on sparse_embeddings' 2M-node graph.
        Here every loader gets a shallow copy of one sampler, with its own fan-out.
        """
        sampler = copy.copy(self._csc_sampler)
        sampler.num_neighbors = fanout
        return NeighborLoader(
            data,
            num_neighbors=fanout,
            neighbor_sampler=sampler,
            # Workers' seeds from a generator of its own: starting workers must not move the
            # global stream the model's dropout draws from (see gnnscale.resume).
            generator=torch.Generator(),
            **self.loader.kwargs(),
            **kwargs,
        )

    def _eval_loader(self, mask_key: str | None) -> Any:
        data = self.data
        mask = None if mask_key is None else data[mask_key]
        if self.eval.mode == "sampled":
            fanout = self._eval_fanout()
            return rank_share(
                self.trainer,
                mask,
                data.num_nodes,
                lambda seeds: self._neighbor_loader(
                    data,
                    fanout,
                    input_nodes=seeds,
                    batch_size=self.eval.batch_size,
                    transform=self._hop_layout(len(fanout)),
                ),
            )
        if self.eval.mode == "full":
            data = copy.copy(data)
            data.eval_mask = mask
            return _single(data)
        # PyG's layer-wise inference feeds x to the layers as is: in the parameters' dtype.
        model = self.trainer.lightning_module if self.trainer is not None else None
        dtype = model.dtype if isinstance(model, L.LightningModule) else torch.float32
        if data.x.dtype != dtype:
            data = copy.copy(data)
            data.x = data.x.to(dtype)
        loader = self._neighbor_loader(data, [-1], batch_size=self.eval.batch_size)
        return _single(LayerwiseBatch(loader, data.y, mask))

    def val_dataloader(self) -> Any:
        """Validation nodes, evaluated as ``eval.mode`` says."""
        return self._eval_loader("val_mask")

    def test_dataloader(self) -> Any:
        """Test nodes, evaluated as ``eval.mode`` says."""
        return self._eval_loader("test_mask")

    def predict_dataloader(self) -> Any:
        """All nodes, evaluated as ``eval.mode`` says."""
        return self._eval_loader(None)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Attach the per-node loss weights to training batches (on the CPU, before transfer).

        Under DDP, a batch repeated to even out the ranks' counts (``padding``) weighs 0.
        """
        if self.trainer is not None and self.trainer.training and isinstance(batch, Data):
            batch.loss_weight, batch.num_loss_nodes = self._loss_weight(batch)
            if batch.get("padding", False):
                batch.loss_weight, batch.num_loss_nodes = batch.loss_weight * 0, 0
        return batch

    def _loss_weight(self, batch: Data) -> tuple[Tensor, int]:
        raise NotImplementedError


class FullBatchDataModule(_GraphDataModule):
    """The whole graph as one batch: the accuracy reference on graphs that fit in memory.

    Args:
        dataset: Dataset name, one of ``synthetic``, ``Cora``, ``CiteSeer``, ``PubMed``,
            ``Reddit``, ``Flickr``, ``ogbn-arxiv``, ``ogbn-products``.
        root: Folder of the dataset files and of gnnscale's caches.
        synthetic: Size and difficulty of the generated graph (``dataset: synthetic``).
        preprocess: Preprocessing applied once after loading.
        loader: DataLoader workers and memory pinning.
        eval: How validation and test are computed (default: the whole graph at once).
    """

    _not_on_disk = "a full batch is the whole graph in memory"

    def __init__(
        self,
        dataset: str = "synthetic",
        root: Path = Path("data"),
        synthetic: SyntheticGraph = SyntheticGraph(),  # noqa: B008 (frozen dataclass)
        preprocess: Preprocess = Preprocess(),  # noqa: B008
        loader: LoaderArgs = LoaderArgs(),  # noqa: B008
        eval: EvalArgs = EvalArgs(mode="full"),  # noqa: B008
    ) -> None:
        super().__init__(dataset, root, synthetic, preprocess, loader, eval)

    def _setup_train(self) -> None:
        self._num_train = int(self.data.train_mask.sum())

    def train_dataloader(self) -> DataLoader:
        """One batch per epoch: the whole graph."""
        return _single(self.data)

    def _loss_weight(self, batch: Data) -> tuple[Tensor, int]:
        return batch.train_mask / self._num_train, self._num_train


class NeighborDataModule(_GraphDataModule):
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

    With ``dataset: prepared`` and ``root`` a folder written by ``gnnscale prepare``, the graph
    is memory-mapped (``gnnscale.ondisk``): the sampler walks the mapped CSC and batches gather
    their feature rows from the mapped file, so nothing but the batch enters private memory and
    processes on one machine share the pages. Evaluation must then be ``sampled``.
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
    ) -> None:
        super().__init__(dataset, root, synthetic, preprocess, loader, eval)
        _check_positive(batch_size=batch_size)
        if not num_neighbors or any(k == 0 or k < -1 for k in num_neighbors):
            raise ConfigError(
                f"--data.num_neighbors must list one fan-out per layer, each > 0 or -1 for all "
                f"neighbours (got {num_neighbors})"
            )
        self.num_neighbors = list(num_neighbors)
        self.batch_size = batch_size
        self.verify = verify

    def check_model(self, model: Any) -> None:
        """Refuse a model whose depth differs from the fan-out's length (before any data loads).

        Args:
            model: The LightningModule (its ``num_layers``, if it has one, is checked).
        """
        num_layers = int(getattr(model, "num_layers", 0))
        if num_layers and len(self.num_neighbors) != num_layers:
            raise ConfigError(
                f"--data.num_neighbors has {len(self.num_neighbors)} entries "
                f"({self.num_neighbors}) but --model.num_layers is {num_layers}: give one "
                "fan-out per layer"
            )
        super().check_model(model)

    def _eval_fanout(self) -> list[int]:
        return self.eval.num_neighbors or self.num_neighbors

    def train_dataloader(self) -> ResumableLoader:
        """Shuffled batches of ``batch_size`` training seeds with their sampled neighbourhoods."""
        loader = self._neighbor_loader(
            self.data,
            self.num_neighbors,
            input_nodes=self.data.train_mask,
            batch_size=self.batch_size,
            transform=self._hop_layout(len(self.num_neighbors), train=True),
        )
        return self._resumable(loader, shuffle=True)

    def _loss_weight(self, batch: Data) -> tuple[Tensor, int]:
        # Seeds come first; a short last batch keeps weight 1/batch_size per seed, so every
        # training node weighs the same.
        weight = torch.zeros(batch.num_nodes)
        weight[: batch.batch_size] = 1.0 / self.batch_size
        return weight, batch.batch_size


class _ClusterData(ClusterData):
    """PyG's ClusterData, with pymetis when neither pyg-lib nor torch-sparse has METIS."""

    partitioner = "none (partition read from the cache)"

    def _metis(self, edge_index: Tensor, num_nodes: int) -> Tensor:
        try:
            cluster = super()._metis(edge_index, num_nodes)
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


class ClusterDataModule(_GraphDataModule):
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
        _check_positive(num_parts=num_parts, clusters_per_batch=clusters_per_batch)
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

    def _loss_weight(self, batch: Data) -> tuple[Tensor, int]:
        return batch.loss_weight, int(batch.train_mask.sum())


class SAINTDataModule(_GraphDataModule):
    """GraphSAINT: batches are sampled subgraphs, debiased by the paper's normalisation.

    Not from a prepared graph: PyG's GraphSAINT samplers hold the whole adjacency in memory.

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

    _not_on_disk = "PyG's GraphSAINT samplers hold the whole adjacency in memory"

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
        _check_positive(batch_size=batch_size, walk_length=walk_length, num_steps=num_steps)
        if sample_coverage < 0:
            raise ConfigError(f"--data.sample_coverage must be >= 0 (got {sample_coverage})")
        self.sampler = sampler
        self.batch_size = batch_size
        self.walk_length = walk_length
        self.num_steps = num_steps
        self.sample_coverage = sample_coverage

    def _setup_train(self) -> None:
        if not torch_geometric.typing.WITH_TORCH_SPARSE:
            raise ImportError("GraphSAINT samplers need torch-sparse: see the README's install")
        data = self.data
        if self.sampler == "edge":
            # PyG draws each sampled edge with a full pass over a [batch_size, num_edges] random
            # matrix (and its log): memory grows with batch_size * num_edges.
            need = 2 * self.batch_size * data.num_edges * 4
            free = psutil.virtual_memory().available
            if need > free / 2:
                raise ConfigError(
                    f"--data.sampler=edge needs {need / 2**30:.1f} GiB per subgraph here: PyG's "
                    f"GraphSAINTEdgeSampler draws a [batch_size, num_edges] random matrix "
                    f"({self.batch_size} x {data.num_edges:,}). Lower --data.batch_size to at most "
                    f"{int(free / 2 / (8 * data.num_edges))}, or use --data.sampler=random_walk "
                    "or node"
                )
        self._train_fraction = float(data.train_mask.float().mean())
        self._save_dir: Path | None = None
        if self.sample_coverage > 0:
            # num_steps only sets the epoch length, so it stays out of the key.
            key = _graph_key(
                data, "saint", self.sampler, self.batch_size, self.walk_length, self.sample_coverage
            )
            self._save_dir = self.cache_dir / f"saint_{key}"
            check_writable(self.cache_dir, "--data.root")

    def train_dataloader(self) -> ResumableLoader:
        """``num_steps`` sampled subgraphs (normalisation computed once, then read from cache)."""
        params: dict[str, Any] = {"batch_size": self.batch_size, "num_steps": self.num_steps}
        cls: type = GraphSAINTNodeSampler
        if self.sampler == "edge":
            cls = GraphSAINTEdgeSampler
        elif self.sampler == "random_walk":
            cls, params["walk_length"] = GraphSAINTRandomWalkSampler, self.walk_length

        def sampler(save_dir: Path | None) -> Any:
            return cls(
                self.data,
                sample_coverage=self.sample_coverage,
                save_dir=None if save_dir is None else str(save_dir),
                log=False,
                **params,
                **self.loader.kwargs(),
            )

        if self._save_dir is None:
            return self._resumable(sampler(None), shuffle=False, transform=self._subgraph_layout())
        cached_folder(self._save_dir, sampler, "GraphSAINT normalisation")
        loader = sampler(self._save_dir)  # reads the normalisation back
        bad = int((~torch.isfinite(loader.node_norm)).sum())
        if bad:
            raise ConfigError(
                f"the GraphSAINT normalisation in {self._save_dir} has {bad} non-finite node "
                "weights; delete the folder to rebuild it"
            )
        return self._resumable(loader, shuffle=False, transform=self._subgraph_layout())

    def _loss_weight(self, batch: Data) -> tuple[Tensor, int]:
        train = batch.train_mask
        num_train = int(train.sum())
        if self.sample_coverage == 0:
            expected = self._train_fraction * batch.num_nodes
            return train / max(expected, 1.0), num_train
        # sum(node_norm * loss) over a subgraph estimates sum(loss) / N over the whole graph;
        # dividing by the training fraction makes it the mean over training nodes.
        return batch.node_norm * train / self._train_fraction, num_train
