"""Where a DataModule's graph comes from: the source chosen once, in memory or a prepared folder.

:func:`open_source` is the one place that tells a graph in memory (:class:`MemorySource`) from a
prepared folder (:class:`PreparedSource`, read through ``stores.open``'s ``(FeatureStore,
GraphStore)`` pair, which carries the reads, the feature cache and the id checks). DataModules ask
the source for types, sizes, masks, their loaders' input and sampler; never which one it is.
Settings that hold for one kind only are refused here too (:func:`check_cache`: a feature cache
is for a prepared folder; :func:`refuse_for_prepared`: what a prepared folder cannot honour), and
a checkpoint records a folder's contents (:func:`folder_digest`).

Which datasets there are, and what a graph must hold, is ``gnnscale.data.datasets``: a source
reads a graph however it was named and loaded.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, TypeAlias

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor
from torch_geometric.data import Data, HeteroData
from torch_geometric.typing import EdgeType

from gnnscale.data.datasets import SPLIT_MASKS, check_root, validate_graph
from gnnscale.errors import ConfigError
from gnnscale.memory import MiB, store_tensors, tensor_mb
from gnnscale.sampling import HopSampler
from gnnscale.stores.manifest import Manifest, PreparedGraphError
from gnnscale.stores.mapped import (
    MappedFeatureStore,
    MappedGraphStore,
    edge_type,
    fill_cache,
    stores_of,
)
from gnnscale.stores.prepared import PreparedGraph


def check_cache(feature_cache_gib: float, dataset: str) -> None:
    """Refuse a feature cache of negative size, or for a graph that is not read from disk."""
    if feature_cache_gib < 0 or (feature_cache_gib and dataset != "prepared"):
        raise ConfigError(
            f"--data.feature_cache_gib must be >= 0, and applies to --data.dataset prepared "
            f"only: other graphs' features are in memory already (got {feature_cache_gib} "
            f"with --data.dataset {dataset})"
        )


def folder_digest(dataset: str, root: Path) -> str | None:
    """A prepared folder's contents, as a checkpoint records them.

    A digest of its manifest's files (``Manifest.digest``: each one's dtype, shape and block
    checksums). ``None`` for other datasets, or for a folder without a readable manifest
    (opening it says why).
    """
    if dataset != "prepared":
        return None
    try:
        return Manifest.read(Path(root)).digest()
    except PreparedGraphError:
        return None


def refuse_for_prepared(dataset: str, *refusals: tuple[bool, str]) -> None:
    """With ``--data.dataset prepared``, refuse the first setting it cannot honour.

    Before anything is opened: each refusal is (whether the setting was asked, what to say).
    """
    if dataset != "prepared":
        return
    for asked, message in refusals:
        if asked:
            raise ConfigError(message)


Graph: TypeAlias = Data | HeteroData
Stores: TypeAlias = tuple[MappedFeatureStore, MappedGraphStore]


class MemorySource:
    """A graph in memory (``Data`` or ``HeteroData``): PyG's loaders read it as it is."""

    features_in_memory = True  # a transform may read feature rows in place
    threads = 1  # threads that gather a batch's rows
    mapped_mb = 0.0  # mapped files, MiB
    checked: tuple[str, ...] = ()  # what was checked as it was written: nothing

    def __init__(self, load: Callable[[], Graph], name: str) -> None:
        self._load, self.name = load, name

    @cached_property
    def data(self) -> Graph:
        """The graph, loaded (and checked by ``load``) on first use."""
        return self._load()

    @property
    def hetero(self) -> bool:
        """Whether the graph has node and edge types."""
        return isinstance(self.data, HeteroData)

    @property
    def graph_mb(self) -> float:
        """The graph's tensors in memory, MiB."""
        return tensor_mb(*store_tensors(self.data))

    @property
    def labelled(self) -> list[str]:
        """Node types with labels and split masks (heterogeneous)."""
        data = self.data
        return [t for t in data.node_types if all(k in data[t] for k in ("y", *SPLIT_MASKS))]

    def loader_input(self, data: Graph | None = None) -> Graph:
        """What PyG's loaders take: the graph, or ``data`` (a view of it: fewer attributes)."""
        return self.data if data is None else data

    def sampler(self, num_neighbors: Any, **kwargs: Any) -> HopSampler:
        """A sampler over the graph (``kwargs``: ``HopSampler``'s)."""
        return HopSampler(self.data, num_neighbors, **kwargs)

    def count_held(self, then: Callable | None = None) -> Callable | None:
        """The loaders' transform: ``then``, as there is no feature cache to count."""
        return then

    @property
    def num_edge_features(self) -> int:
        """Features per edge (``edge_attr``'s width; 0: none) of a homogeneous graph."""
        attr = self.data.get("edge_attr")
        return 0 if attr is None else int(attr[:1].numel())

    def gather_edges(self, then: Callable | None = None) -> Callable | None:
        """The loaders' transform: ``then``; PyG's loaders slice ``edge_attr`` in memory."""
        return then

    @property
    def metadata(self) -> tuple[list[str], list[EdgeType]]:
        """Node and edge types (heterogeneous)."""
        assert isinstance(self.data, HeteroData)
        return self.data.metadata()

    @property
    def num_nodes(self) -> dict[str, int]:
        """Nodes per type (heterogeneous)."""
        return {t: int(self.data[t].num_nodes) for t in self.metadata[0]}

    @property
    def feature_dims(self) -> dict[str, int]:
        """Feature width per node type; 0 for a featureless type (heterogeneous)."""
        data = self.data
        return {t: int(data[t].x.size(-1)) if "x" in data[t] else 0 for t in self.metadata[0]}

    def tensor(self, node_type: str, key: str) -> Tensor:
        """A node type's tensor (``y``, a mask)."""
        return self.data[node_type][key]

    def num_classes(self, node_type: str | None = None) -> int:
        """Classes of a labelled node type (homogeneous: of the nodes in a split)."""
        if node_type is not None:
            return int(self.data[node_type].y.max()) + 1
        data = self.data
        return int(data.y[data.train_mask | data.val_mask | data.test_mask].max()) + 1

    def split_labels(self, node_type: str | None = None) -> list[int] | None:
        """None: a graph in memory has no record; its labels are read to be checked."""
        return None

    def hold(self, *args: Any, **kwargs: Any) -> None:
        """No cache: every feature is in memory already (``check_cache`` refuses a size)."""


class PreparedSource:
    """A prepared folder (``gnnscale prepare``), read through its store pair.

    Mapped on first use (``gnnscale.stores.open``'s pair); its manifest answers types and sizes
    without mapping.
    """

    features_in_memory = False
    graph_mb = 0.0  # in memory: none (mapped_mb)

    def __init__(
        self, root: Path, verify: Literal["full", "size"], read_threads: int | None
    ) -> None:
        self.root, self.verify, self.read_threads = Path(root), verify, read_threads
        self.manifest = Manifest.read(self.root)
        self.name = str(self.root)

    @property
    def hetero(self) -> bool:
        """Whether the folder has node and edge types."""
        return self.manifest.is_hetero

    @property
    def labelled(self) -> list[str]:
        """Node types with labels and split masks (heterogeneous)."""
        if not self.manifest.is_hetero:
            return []
        files = self.manifest.files
        return [
            t
            for t in self.manifest.node_counts
            if all(f"{t}/{k}" in files for k in ("y", *SPLIT_MASKS))
        ]

    @property
    def checked(self) -> tuple[str, ...]:
        """What its prepare checked and recorded (``gnnscale.stores.manifest.CHECKS``)."""
        return self.manifest.checked or ()

    def split_labels(self, node_type: str | None = None) -> list[int] | None:
        """A node type's split labels as its prepare counted them: lowest, highest, distinct.

        None from a folder without the record (an older gnnscale's): the labels are read.
        """
        return (self.manifest.split_labels or {}).get(node_type or "")

    @cached_property
    def graph(self) -> PreparedGraph:
        """The mapped folder, its files checked as ``verify`` says."""
        start = time.perf_counter()
        graph = PreparedGraph(self.root, self.verify, self.read_threads)
        checked = "checksums verified" if self.verify == "full" else "sizes checked"
        rank_zero_info(
            f"gnnscale: mapped {self.root} ({graph.nbytes / 2**30:.2f} GiB, {checked} in "
            f"{time.perf_counter() - start:.1f} s)"
        )
        return graph

    @cached_property
    def stores(self) -> Stores:
        """The folder as PyG's ``(FeatureStore, GraphStore)`` pair."""
        return stores_of(self.graph)

    @cached_property
    def data(self) -> Data:
        """A homogeneous folder's mapped tensors as a ``Data`` (no edges: they are the store's).

        Its splits and labels checked as a graph in memory is (:func:`validate_graph`), but
        for what its prepare checked and recorded (``checked`` in the manifest): its features
        (a check would read them whole; a folder without the record says so), the overlaps;
        its split labels from their counts (``split_labels``), without reading ``y``.
        """
        if self.hetero:
            raise RuntimeError("a heterogeneous prepared graph is read through its stores")
        if missing := [k for k in ("y", *SPLIT_MASKS) if k not in self.manifest.files]:
            raise ConfigError(
                f"{self.root} has no {', '.join(missing)}: node classification needs labels "
                "and train, val and test splits; prepare it with y.npy and train.npy, val.npy, "
                "test.npy (node ids) beside x.npy (docs/stores.md)"
            )
        data, checked = self.graph.data, self.checked
        if "features finite" not in checked:
            rank_zero_warn(
                f"gnnscale: {self.root} was prepared without checking its features for NaN or "
                "infinite values (by an older gnnscale); prepare it again to have them checked"
            )
        overlaps, counted = "splits disjoint" not in checked, self.split_labels()
        validate_graph(data, "prepared", features=False, overlaps=overlaps, counted=counted)
        return data

    def loader_input(self, data: Graph | None = None) -> Stores:
        """What PyG's loaders take: the store pair (whatever view ``data`` of it is given)."""
        return self.stores

    @property
    def threads(self) -> int:
        """Threads that gather a batch's rows."""
        return self.graph.threads

    @property
    def mapped_mb(self) -> float:
        """Bytes of mapped files, in MiB."""
        return self.graph.nbytes / MiB

    def sampler(self, num_neighbors: Any, **kwargs: Any) -> HopSampler:
        """A sampler over the store pair: it reads neighbour lists ahead and checks drawn ids.

        The mapped CSC is used as it lies on disk: nothing is sorted, copied or shared
        (``share_memory`` is moot; every other keyword is ``HopSampler``'s).
        """
        kwargs.pop("share_memory", None)
        return HopSampler(self.stores, num_neighbors, **kwargs)

    def count_held(self, then: Callable | None = None) -> Callable | None:
        """The loaders' transform: the cache's counts on each batch, then ``then``.

        ``feature_reads`` (``MappedFeatureStore.count_held``); with no cache,
        ``then`` alone.
        """
        fs = self.stores[0]
        if not fs.cache:
            return then
        return functools.partial(_then, first=fs.count_held, then=then)

    @property
    def num_edge_features(self) -> int:
        """Features per edge (``edge_attr.npy``'s width; 0: none) of a homogeneous folder."""
        return self.manifest.edge_feature_dim()

    def gather_edges(self, then: Callable | None = None) -> Callable | None:
        """The loaders' transform: each batch's edge features gathered by ``e_id``, then ``then``.

        PyG's loaders read no edge tensors from a feature store (``add_edge_attr``).
        """
        return functools.partial(_then, first=self.stores[0].add_edge_attr, then=then)

    @property
    def metadata(self) -> tuple[list[str], list[EdgeType]]:
        """Node and edge types (heterogeneous)."""
        manifest = self.manifest
        return list(manifest.node_counts), [edge_type(k) for k in manifest.edge_counts]

    @property
    def num_nodes(self) -> dict[str, int]:
        """Nodes per type (heterogeneous)."""
        return self.manifest.node_counts

    @property
    def feature_dims(self) -> dict[str, int]:
        """Feature width per node type; 0 for a featureless type (heterogeneous)."""
        return {t: self.manifest.feature_dim(t) for t in self.metadata[0]}

    def tensor(self, node_type: str, key: str) -> Tensor:
        """A node type's mapped tensor (``y``, a mask)."""
        return self.graph.tensor(f"{node_type}/{key}")

    def num_classes(self, node_type: str | None = None) -> int:
        """Classes of a labelled node type (homogeneous: of the graph), as prepared."""
        return self.manifest.class_count(node_type)

    def hold(
        self,
        num_neighbors: Any,
        seeds: Tensor | dict[Any, Tensor],
        batch_size: int,
        gib: float,
        vectorized: bool = True,
    ) -> None:
        """Fill the feature cache with the rows a sampling pass over ``seeds`` draws most often."""
        if gib:
            held = fill_cache(self.stores, num_neighbors, batch_size, gib, seeds, vectorized)
            rank_zero_info(f"gnnscale: {held}")


def _then(batch: Any, first: Callable[[Any], Any], then: Callable | None) -> Any:
    """``first(batch)``, then ``then`` on it: the loaders' transforms, chained (picklable)."""
    batch = first(batch)
    return batch if then is None else then(batch)


GraphSource: TypeAlias = MemorySource | PreparedSource


def open_source(
    dataset: str,
    root: Path,
    load: Callable[[], Graph],
    verify: Literal["full", "size"] = "full",
    read_threads: int | None = None,
) -> GraphSource:
    """The graph of ``--data.dataset``: a prepared folder at ``root``, else ``load()``'s.

    Refuses now a root that is not a prepared folder, or cannot hold ``dataset``; ``load``
    runs on first use.
    """
    if dataset == "prepared":
        return PreparedSource(root, verify, read_threads)  # reads the manifest
    check_root(dataset, Path(root))
    return MemorySource(load, dataset)
