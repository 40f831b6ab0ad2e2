"""Node classification on one graph: the shared base and full batch.

Each DataModule is constructible from YAML alone (neighbour sampling: ``neighbor``; Cluster-GCN
and GraphSAINT: ``subgraph``).

Every training batch, whatever sampled it, carries ``x``, ``edge_index``, ``y`` and a per-node
``loss_weight`` (plus ``num_loss_nodes`` for logging). The weights are scaled so that their
*expected* sum per micro-batch is 1: the model's loss is ``sum(weight * cross_entropy)``, every
training node counts the same however many of them a batch holds, and gradient accumulation
(which averages micro-batch losses) stays an unbiased mean over training nodes.

How a batch is laid out (``batch.layout``) follows the model's ``BatchRequest``, which the
DataModule takes in ``configure_batches`` (``gnnscale.handshake``).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import lightning as L
import psutil
import torch
import torch_geometric.transforms as T
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader
from torch_geometric.data import Data
from torch_geometric.loader import (
    NeighborLoader,
)

from gnnscale.batch import LayerwiseBatch, WholeGraph, supervise
from gnnscale.data.args import (
    EvalArgs,
    LoaderArgs,
    Preprocess,
    SamplingArgs,
    check_dataset,
)
from gnnscale.data.datasets import DATASETS, load_dataset, validate_graph
from gnnscale.data.layout import hop_layout, subgraph_layout
from gnnscale.data.loaders import rank_block, rank_own, rank_share, resumable, single
from gnnscale.data.resume import ResumableLoader, SeededSampling
from gnnscale.data.sources import GraphSource, open_source, refuse_for_prepared
from gnnscale.data.synthetic import SyntheticGraph
from gnnscale.errors import ConfigError
from gnnscale.handshake import BatchRequest
from gnnscale.memory import MemoryProfile, tensor_mb
from gnnscale.sampling import HopSampler, describe, log_backend_once, vectorized

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class NodeDataModule(L.LightningDataModule):
    """What every gnnscale DataModule shares: loading, checks, evaluation loaders."""

    # Why this module cannot train from a prepared (memory-mapped) graph; None: it can.
    _not_on_disk: str | None = "it needs the whole graph in memory"
    feature_cache_gib = 0.0  # feature rows held in memory (NeighborDataModule)
    sampling = SamplingArgs()  # by time or weight (NeighborDataModule)
    # What the model asked batches to carry (``configure_batches``); until then, nothing extra.
    request: BatchRequest = BatchRequest()

    def __init__(
        self,
        dataset: str,
        root: Path,
        synthetic: SyntheticGraph,
        preprocess: Preprocess,
        loader: LoaderArgs,
        eval: EvalArgs,
        verify: Literal["full", "size"] = "full",
        read_threads: int | None = None,
    ) -> None:
        super().__init__()
        check_dataset(dataset, DATASETS)
        full = eval.set_to("full")  # the flags set to full
        flag = full[0] if full else ""
        refuse_for_prepared(
            dataset,
            (
                self._not_on_disk is not None,
                f"{type(self).__name__} cannot train from --data.dataset prepared: "
                f"{self._not_on_disk}; use gnnscale.NeighborDataModule",
            ),
            (
                preprocess != Preprocess(),
                "--data.preprocess does not apply to --data.dataset prepared (the files are "
                "mapped as written): preprocess before `gnnscale prepare`, or drop it",
            ),
            (
                bool(full),
                f"--data.eval.{flag} full loads the whole graph into memory; with "
                f"--data.dataset prepared use --data.eval.{flag}=sampled "
                "(or layerwise: exact, every node's activations in memory)",
            ),
        )
        self.dataset, self.root = dataset, Path(root)
        # After the checks of the settings alone: a root that cannot serve is refused now.
        self._opened = open_source(dataset, self.root, self._load, verify, read_threads)
        self.synthetic = synthetic
        self.preprocess = preprocess
        self.loader = loader
        self.eval = eval

    def __repr__(self) -> str:
        # Lightning's own would build every loader (jsonargparse prints it for links it skips).
        return f"{type(self).__name__}(dataset={self.dataset!r}, root={str(self.root)!r})"

    __str__ = __repr__

    @cached_property
    def source(self) -> GraphSource:
        """The graph in memory, or a prepared folder (``root``) read through its store pair.

        A prepared folder's feature cache (``feature_cache_gib``) is filled here, before any
        loader's workers start (forked, they share it).
        """
        source = self._opened
        if self.feature_cache_gib:
            seeds = source.data.train_mask.nonzero().view(-1)
            fanout, size = self._train_fanout(), self._train_batch_size()
            sampling = vectorized(self.loader.sampler)
            source.hold(fanout, seeds, size, self.feature_cache_gib, sampling)
        return source

    def _train_fanout(self) -> list[int]:
        raise NotImplementedError

    def _train_batch_size(self) -> int:
        raise NotImplementedError

    @property
    def data(self) -> Data:
        """The preprocessed graph, loaded on first use (mapped, for ``dataset: prepared``)."""
        data = self.source.data
        assert isinstance(data, Data)
        return data

    def _load(self) -> Data:
        """The dataset, preprocessed and checked (``MemorySource`` loads it on first use)."""
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
        validate_graph(data, self.dataset)
        return data

    @property
    def num_features(self) -> int:
        """Node feature dimension (linked to ``model.in_channels``)."""
        return self.data.num_features

    @property
    def num_nodes(self) -> int:
        """Nodes of the graph (linked to ``model.num_nodes``: ``EmbeddingSAGE``'s table)."""
        return self.data.num_nodes

    @property
    def num_classes(self) -> int:
        """Number of classes (linked to ``model.num_classes``)."""
        return self.source.num_classes()

    @property
    def cache_dir(self) -> Path:
        """Folder for partitions and normalisation statistics."""
        return self.root / "gnnscale_cache"

    def prepare_data(self) -> None:
        """Download (if needed) and load the dataset."""
        _ = self.data

    def configure_batches(self, request: BatchRequest) -> None:
        """Take the model's request (``gnnscale.handshake``); refuse a depth the fan-outs miss.

        ``gnnscale``'s CLI calls this before any data loads; ``setup`` with each fit's model
        (a DataModule may serve several).

        Args:
            request: What the model's batches must carry: its depth, the first layer's
                aggregation in the workers, the adjacency's transpose.
        """
        if (full := self.eval.set_to("full")) and not request.reads_x:
            raise ConfigError(
                f"--data.eval.{full[0]} full feeds node features, which the model does not read: "
                "use sampled or layerwise (whose first layer reads the model's own input, such "
                "as EmbeddingSAGE's table)"
            )
        if request.edge_dim and (flags := self.eval.set_to("layerwise")):
            raise ConfigError(
                f"--model.edge_dim: exact layer-wise evaluation reads no edge features; use "
                f"{' and '.join(f'--data.eval.{flag}=sampled' for flag in flags)}"
            )
        fanout = self.eval.num_neighbors
        if fanout is not None and request.num_layers and len(fanout) != request.num_layers:
            raise ConfigError(
                f"--data.eval.num_neighbors has {len(fanout)} entries but --model.num_layers is "
                f"{request.num_layers}: give one fan-out per layer"
            )
        self.request = request

    def _hop_loader(self, fanout: list[int], **kwargs: Any) -> NeighborLoader:
        """A loader of neighbour batches laid out hop by hop (``hop_layout``, in its workers).

        Where the model asks for its first layer aggregated in the loader and the features are
        float32 or float64 in memory, PyG gathers no ``x``: the layout aggregates from the
        feature matrix in place and gathers the first layer's targets' rows only
        (``aggregate_first_layer``). Elsewhere the model aggregates: once every row is gathered
        (a prepared graph's reads, half-precision features cast), the product in the loader
        bought nothing (on_disk_graph: 8.6 s/epoch against 7.9).
        """
        data, features, aggr = self.data, None, self.request.first_layer_aggr
        x = data.get("x")
        in_place = x is not None and x.dtype in (torch.float32, torch.float64)
        if aggr and self.source.features_in_memory and in_place:
            data, features = copy.copy(data), x
            del data.x
            data.num_nodes = x.size(0)
        else:
            aggr = None
        layout = functools.partial(
            hop_layout, num_layers=len(fanout), first_layer_aggr=aggr, features=features
        )
        return self._neighbor_loader(data, fanout, transform=layout, **kwargs)

    def _subgraph_layout(self) -> Callable[[Data], Data]:
        """Cluster-GCN and GraphSAINT training batches' transform, run in the workers."""
        return subgraph_layout

    def setup(self, stage: str) -> None:
        """Check the model agrees with the loaders, then build the training loader."""
        log_backend_once(describe(self.loader.sampler))
        if self.trainer is not None:  # each fit's model: a DataModule may serve several
            self.configure_batches(BatchRequest.of(self.trainer.lightning_module))
        self._check_edge_features()
        self._check_layerwise_fits()
        if stage == "fit":
            self._setup_train()

    def _check_edge_features(self) -> None:
        """Refuse a model reading edge features the graph does not have, or not as many."""
        edge_dim, have = self.request.edge_dim, self.source.num_edge_features
        if edge_dim and edge_dim != have:
            raise ConfigError(
                f"--model.edge_dim is {edge_dim} but the edges of {self.source.name} have "
                f"{have} feature(s) (edge_attr): set --model.edge_dim {have or 'null'}"
            )

    def _check_layerwise_fits(self) -> None:
        """Refuse exact layer-wise evaluation whose activations would not fit in memory.

        It holds every node's input and output of a layer (float32: a bound under mixed
        precision, whose layers pass on half), in each process of the machine (each DDP rank
        computes a block of the nodes, but holds every node's input and output). Refused before
        training, not when the final test runs out of memory after it.
        """
        flags = [f"--data.eval.{flag}=sampled" for flag in self.eval.set_to("layerwise")]
        if not flags or not self.request.layerwise_channels:
            return
        nodes, channels = self.data.num_nodes, self.request.layerwise_channels
        processes = self.trainer.num_devices if self.trainer is not None else 1
        need, available = processes * nodes * channels * 4, psutil.virtual_memory().available
        if need > available:
            each = f"{processes} processes x " if processes > 1 else ""
            raise ConfigError(
                f"exact layer-wise evaluation would hold {need / 2**30:.1f} GiB of activations "
                f"({each}{nodes:,} nodes x {channels} values x 4 bytes), more than the "
                f"{available / 2**30:.1f} GiB available: use {' and '.join(flags)}"
            )

    def _setup_train(self) -> None:
        """Precompute what the training loader needs (partitions, statistics); none by default."""

    def _resumable(
        self, loader: DataLoader, shuffle: bool, transform: Any = None
    ) -> ResumableLoader:
        """``loader``'s batches, seeded per epoch and batch, resumable mid-epoch (``resume``).

        Every rank uses rank 0's seed, drawn from the global stream (``seed_everything`` fixes
        it), and takes its own share of each epoch's batches.
        """
        return resumable(self.trainer, loader, shuffle, transform)

    def _eval_fanout(self) -> list[int]:
        return self.eval.num_neighbors or [-1] * max(self.request.num_layers, 1)

    @cached_property
    def _csc_sampler(self) -> HopSampler:
        try:
            return self.source.sampler(
                [-1],
                share_memory=self.loader.workers > 0,
                vectorized=vectorized(self.loader.sampler),
                **self.sampling.kwargs(),
            )
        except (ValueError, NotImplementedError) as err:  # the sampler's, about these options
            if not self.sampling.kwargs():
                raise
            raise ConfigError(f"--data.sampling: {err}") from None

    def _neighbor_loader(
        self, data: Data, fanout: list[int], node_files: bool = True, **kwargs: Any
    ) -> NeighborLoader:
        """PyG's ``NeighborLoader`` over one CSC copy of the graph, shared by every loader.

        Each ``NeighborLoader`` would build its own sampler, and with it a CSC copy of the graph
        (``colptr``, ``row`` and ``perm``: about 16 bytes per edge). Training, validation and
        test loaders held three copies at once, 319 MiB each on sparse_embeddings' 2M-node graph.
        Here every loader gets a shallow copy of one sampler, with its own fan-out.
        ``node_files``: batches read their rows of the node files through the source (a
        prepared folder's store pair, with its cache's counts); else they hold ``data``'s.
        """
        # edge features are gathered by e_id
        sampler = self._csc_sampler.with_fanout(fanout, edge_ids=bool(self.request.edge_dim))
        if kwargs.get("input_nodes") is None:  # PyG's default for a Data, not for a store
            kwargs["input_nodes"] = torch.arange(data.num_nodes)
        if node_files:
            data = self.source.loader_input(data)
            kwargs["transform"] = self.source.count_held(kwargs.get("transform"))
            if self.request.edge_dim:  # before the layout, which orders edges by target
                kwargs["transform"] = self.source.gather_edges(kwargs["transform"])
        return NeighborLoader(
            data,  # type: ignore[arg-type]
            num_neighbors=fanout,
            neighbor_sampler=sampler,
            # Workers' seeds from a generator of its own: starting workers must not move the
            # global stream the model's dropout draws from (see gnnscale.data.resume).
            generator=torch.Generator(),
            **self.loader.kwargs(),
            **kwargs,
        )

    def _eval_loader(self, mask_key: str | None, mode: str) -> Any:
        data = self.data
        mask = None if mask_key is None else data[mask_key]
        if mask is not None and mask_key == "val_mask":
            mask = self.eval.validated(mask)
        if mode == "sampled":
            fanout = self._eval_fanout()

            def sampled(seeds: Tensor | None) -> DataLoader:
                loader = self._hop_loader(
                    fanout, input_nodes=seeds, batch_size=self.eval.batch_size
                )
                loader.collate_fn = SeededSampling(loader.collate_fn)  # the same draw each time
                return loader

            return rank_share(self.trainer, mask, data.num_nodes, sampled)
        block = rank_block(self.trainer, data.num_nodes)  # under DDP: this rank's nodes
        if block is not None:  # each rank scores (or predicts) its block's nodes once
            mine = torch.zeros(data.num_nodes, dtype=torch.bool).index_fill_(0, block, True)
            mask = mine if mask is None else mine & mask
        if mode == "full":  # every rank computes the whole graph
            data = copy.copy(data)
            data.layout = WholeGraph(mask)
            return rank_own(self.trainer, data)
        # Ids and edges only, as PyG's inference examples: each layer gathers its own input;
        # under DDP each rank computes its block (summed into every rank's copy).
        structure = Data(edge_index=data.edge_index, num_nodes=data.num_nodes)
        loader = self._neighbor_loader(
            structure,
            [-1],
            batch_size=self.eval.batch_size,
            node_files=False,
            input_nodes=block,
        )
        threads = self.source.threads
        batch = LayerwiseBatch(loader, data.x, data.y, mask, threads, block is not None)
        return rank_own(self.trainer, batch)

    def memory_profile(self) -> MemoryProfile:
        """What ``gnnscale plan`` cannot measure from training batches (``gnnscale.memory``)."""
        layerwise, modes = None, {self.eval.validation, self.eval.mode}
        if "layerwise" in modes:  # its whole-graph buffers are computed, not measured
            layerwise = next(iter(self._eval_loader("test_mask", "layerwise")))
        if self.source.features_in_memory:
            graph_mb = tensor_mb(*[v for _, v in self.data("x", "edge_index", "y")])
            data_fix = (
                "prune the graph (--data.preprocess.largest_component=true), store features as "
                "bfloat16 (--data.preprocess.feature_dtype=bfloat16) or use a larger machine"
            )
        else:  # mapped (mapped_mb), and the settings above do not apply to a prepared folder
            graph_mb = 0.0
            data_fix = (
                "prepare the folder with bfloat16 features (gnnscale prepare --feature_dtype "
                "bfloat16), or use a larger machine"
            )
        return MemoryProfile(
            graph_mb=graph_mb,
            eval_mode=self.eval.mode
            if len(modes) == 1
            else f"{self.eval.validation} validation, {self.eval.mode} test",
            smaller_batches=self._smaller_batches,
            mapped_mb=self.source.mapped_mb,
            layerwise=layerwise,
            data_fix=data_fix,
            eval_fix=self._eval_fix(),
        )

    def _eval_fix(self) -> str:
        """What lowers evaluation's memory, among the settings not already so."""
        exact = [
            f"--data.eval.{flag}=sampled"
            for flag in ("mode", "val_mode")
            if getattr(self.eval, flag) not in (None, "sampled")
        ]
        if exact:
            return f"use {' and '.join(exact)} (memory of a training batch, without gradients)"
        return (
            f"lower --data.eval.batch_size (now {self.eval.batch_size:,}) or the evaluation's "
            f"fan-out (--data.eval.num_neighbors, now {self._eval_fanout()})"
        )

    def _smaller_batches(self, max_nodes: float, mean_nodes: float) -> str | None:
        """Settings whose batches hold at most ``max_nodes`` nodes on average (none here)."""
        return None

    def val_dataloader(self) -> Any:
        """Validation nodes, evaluated as ``eval.val_mode`` (else ``eval.mode``) says."""
        return self._eval_loader("val_mask", self.eval.validation)

    def test_dataloader(self) -> Any:
        """Test nodes, evaluated as ``eval.mode`` says."""
        return self._eval_loader("test_mask", self.eval.mode)

    def predict_dataloader(self) -> Any:
        """All nodes, evaluated as ``eval.mode`` says."""
        return self._eval_loader(None, self.eval.mode)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Attach the per-node loss weights to training batches (on the CPU, before transfer).

        Under DDP, a batch repeated to even out the ranks' counts (``padding``) weighs 0.
        """
        if self.trainer is not None and self.trainer.training and isinstance(batch, Data):
            supervise(batch, *self._loss_weight(batch))
        return batch

    def _loss_weight(self, batch: Data) -> tuple[Tensor, int]:
        raise NotImplementedError


class FullBatchDataModule(NodeDataModule):
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
        return single(self.data)

    def _loss_weight(self, batch: Data) -> tuple[Tensor, int]:
        return batch.train_mask / self._num_train, self._num_train
