"""Where a DataModule's graph comes from: datasets by name, and the source chosen once.

:func:`open_source` is the one place that tells a graph in memory (:class:`MemorySource`) from a
prepared folder (:class:`PreparedSource`, read through ``stores.open``'s ``(FeatureStore,
GraphStore)`` pair, which carries the reads, the feature cache and the id checks). DataModules ask
the source for types, sizes, masks, their loaders' input and sampler; never which one it is.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import os
import socket
import time
import urllib.error
from collections.abc import Callable, Iterator
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, TypeAlias

import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor
from torch_geometric.data import Data, HeteroData
from torch_geometric.typing import EdgeType

from gnnscale.data.sampler import HopSampler
from gnnscale.data.synthetic import SyntheticGraph, make_synthetic_graph
from gnnscale.errors import ConfigError, cause
from gnnscale.memory import MiB, check_fits, graph_nbytes, store_tensors, tensor_mb
from gnnscale.stores.mapped import (
    MappedFeatureStore,
    MappedGraphStore,
    edge_type,
    fill_cache,
    stores_of,
)
from gnnscale.stores.ogb import OGB
from gnnscale.stores.prepared import PreparedGraph

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
# As loaded (ogbn-products with each edge's reverse, which OGB's loader adds): nodes, edges,
# feature width. A graph too large for the machine is refused from these before a download.
SIZES = {
    "Cora": (2_708, 10_556, 1_433),
    "CiteSeer": (3_327, 9_104, 3_703),
    "PubMed": (19_717, 88_648, 500),
    "Reddit": (232_965, 114_615_892, 602),
    "Flickr": (89_250, 899_756, 500),
    "ogbn-arxiv": (169_343, 1_166_243, 128),
    "ogbn-products": (2_449_029, 123_718_280, 100),
}

_SPLITS = ("train_mask", "val_mask", "test_mask")


def check_root(dataset: str, root: Path) -> None:
    """Refuse a ``--data.root`` that cannot hold or does not hold ``dataset``."""
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


def check_size(dataset: str, root: Path) -> None:
    """Refuse, from its known sizes alone, a dataset larger than this machine's memory.

    Before anything is downloaded or loaded. A prepared folder is mapped, not loaded: never
    refused here.
    """
    if dataset not in SIZES:
        return
    nodes, edges, features = SIZES[dataset]
    if dataset in OGB:
        fix = (
            f"prepare it on disk (`gnnscale prepare --dataset {dataset} --root {root} --out DIR`, "
            "from OGB's download unpacked there: docs/stores.md) and train or plan with "
            "--data.dataset prepared --data.root DIR"
        )
    else:
        fix = (
            "write its arrays on a larger machine (gnnscale.stores.save_npy), prepare them on "
            "disk (`gnnscale prepare --dataset npy --root ARRAYS --out DIR`) and train or plan "
            "with --data.dataset prepared --data.root DIR"
        )
    check_fits(
        graph_nbytes(nodes, edges, features),
        f"--data.dataset {dataset}",
        f"{nodes:,} nodes x {features} float32 features, {edges:,} edges",
        fix,
    )


_NETWORK = (urllib.error.URLError, ConnectionError, TimeoutError, socket.gaierror)


@contextlib.contextmanager
def _downloading(name: str, raw: Path) -> Iterator[None]:
    """A download that fails (offline, a blocked host) becomes one line saying where files go."""
    try:
        yield
    except Exception as err:
        # urllib's failure, or that of fsspec's HTTP client (aiohttp)
        failed = cause(
            err, lambda e: isinstance(e, _NETWORK) or type(e).__module__.startswith("aiohttp")
        )
        if failed is None:
            raise
        raise ConfigError(
            f"--data.dataset {name}: its files are not in {raw} and downloading them failed "
            f"({getattr(failed, 'reason', failed)}); offline, put the dataset's raw files there"
        ) from None


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

        with _downloading(name, root / name / "raw"):
            return Planetoid(str(root), name)[0]
    if name in ("Reddit", "Flickr"):
        from torch_geometric import datasets

        with _downloading(name, root / name / "raw"):
            return getattr(datasets, name)(str(root / name))[0]
    if name.startswith("ogbn-"):
        try:
            from ogb.nodeproppred import PygNodePropPredDataset
        except ImportError as err:
            raise ImportError(f"{name} needs the ogb package: pip install 'gnnscale[ogb]'") from err
        with _downloading(name, root / name.replace("-", "_") / "raw"):
            ds = PygNodePropPredDataset(name, str(root))
        data, split = ds[0], ds.get_idx_split()
        data.y = data.y.view(-1)
        for key, idx in zip(_SPLITS, ("train", "valid", "test"), strict=True):
            data[key] = torch.zeros(data.num_nodes, dtype=torch.bool)
            data[key][split[idx]] = True
        return data
    raise ConfigError(f"--data.dataset {name!r} is not known; choose one of {', '.join(DATASETS)}")


def validate_graph(data: Data, dataset: str, features: bool = True, overlaps: bool = True) -> int:
    """Check splits and labels; with ``features``, every feature; with ``overlaps``, the splits.

    Features must be finite; no node may be in two splits.

    Returns:
        The number of classes.
    """
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
    if features and data.x is not None and data.x.is_floating_point():
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
    if present < 2:
        raise ConfigError(
            f"--data.dataset {dataset!r} has one class ({int(y.max())}) among its split nodes: "
            "classification needs at least two; check y and the split files"
        )
    if present < num_classes / 2:
        raise ConfigError(
            f"labels of --data.dataset {dataset!r} are not 0..num_classes-1: the largest is "
            f"{num_classes - 1} but only {present} distinct classes occur, so the model would "
            f"have {num_classes} outputs; remap them (torch.unique(y, return_inverse=True))"
        )
    for a, b in itertools.combinations(_SPLITS, 2) if overlaps else ():
        if shared := int((data[a] & data[b]).sum()):
            raise ConfigError(
                f"--data.dataset {dataset!r}: {shared:,} node(s) are in both {a} and {b}; a node "
                "belongs to one split: remove it from one"
            )
    return num_classes


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

    A digest of its manifest's files (each one's dtype, shape and block checksums). ``None``
    for other datasets, or for a folder without a readable manifest (opening it says why).
    """
    if dataset != "prepared":
        return None
    try:
        files = json.loads((Path(root) / "manifest.json").read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    text = json.dumps(files, sort_keys=True).encode()
    return hashlib.blake2b(text, digest_size=8).hexdigest()


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
        return [t for t in data.node_types if all(k in data[t] for k in ("y", *_SPLITS))]

    def loader_input(self, data: Graph | None = None) -> Graph:
        """What PyG's loaders take: the graph, or ``data`` (a view of it: fewer attributes)."""
        return self.data if data is None else data

    def sampler(self, num_neighbors: Any, **kwargs: Any) -> HopSampler:
        """A sampler over the graph (``kwargs``: PyG's ``NeighborSampler``'s)."""
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
        self.manifest = PreparedGraph.read_manifest(self.root)
        self.name = str(self.root)

    @property
    def hetero(self) -> bool:
        """Whether the folder has node and edge types."""
        return isinstance(self.manifest["num_nodes"], dict)

    @property
    def labelled(self) -> list[str]:
        """Node types with labels and split masks (heterogeneous)."""
        counts, files = self.manifest["num_nodes"], self.manifest["files"]
        if not isinstance(counts, dict):
            return []
        return [t for t in counts if all(f"{t}/{k}" in files for k in ("y", *_SPLITS))]

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
        (a check would read them whole; a folder without the record says so), the overlaps.
        """
        if self.hetero:
            raise RuntimeError("a heterogeneous prepared graph is read through its stores")
        if missing := [k for k in ("y", *_SPLITS) if k not in self.manifest["files"]]:
            raise ConfigError(
                f"{self.root} has no {', '.join(missing)}: node classification needs labels "
                "and train, val and test splits; prepare it with y.npy and train.npy, val.npy, "
                "test.npy (node ids) beside x.npy (docs/stores.md)"
            )
        data, checked = self.graph.data, self.manifest.get("checked", ())
        if "features finite" not in checked:
            rank_zero_warn(
                f"gnnscale: {self.root} was prepared without checking its features for NaN or "
                "infinite values (by an older gnnscale); prepare it again to have them checked"
            )
        validate_graph(data, "prepared", features=False, overlaps="splits disjoint" not in checked)
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

        The mapped CSC is used as it lies on disk: nothing is sorted, copied or shared.
        """
        return HopSampler(self.stores, num_neighbors)

    def count_held(self, then: Callable | None = None) -> Callable | None:
        """The loaders' transform: the cache's counts on each batch, then ``then``.

        ``cached_rows`` and ``feature_rows`` (``MappedFeatureStore.count_held``); with no cache,
        ``then`` alone.
        """
        fs = self.stores[0]
        if not fs.cache:
            return then
        return functools.partial(_then, first=fs.count_held, then=then)

    @property
    def num_edge_features(self) -> int:
        """Features per edge (``edge_attr.npy``'s width; 0: none) of a homogeneous folder."""
        return int(self.manifest.get("num_edge_features", 0))

    def gather_edges(self, then: Callable | None = None) -> Callable | None:
        """The loaders' transform: each batch's edge features gathered by ``e_id``, then ``then``.

        PyG's loaders read no edge tensors from a feature store (``add_edge_attr``).
        """
        return functools.partial(_then, first=self.stores[0].add_edge_attr, then=then)

    @property
    def metadata(self) -> tuple[list[str], list[EdgeType]]:
        """Node and edge types (heterogeneous)."""
        manifest = self.manifest
        return list(manifest["num_nodes"]), [edge_type(k) for k in manifest["num_edges"]]

    @property
    def num_nodes(self) -> dict[str, int]:
        """Nodes per type (heterogeneous)."""
        return dict(self.manifest["num_nodes"])

    @property
    def feature_dims(self) -> dict[str, int]:
        """Feature width per node type; 0 for a featureless type (heterogeneous)."""
        dims = self.manifest["num_features"]
        return {t: int(dims.get(t, 0)) for t in self.metadata[0]}

    def tensor(self, node_type: str, key: str) -> Tensor:
        """A node type's mapped tensor (``y``, a mask)."""
        return self.graph.tensor(f"{node_type}/{key}")

    def num_classes(self, node_type: str | None = None) -> int:
        """Classes of a labelled node type (homogeneous: of the graph), as prepared."""
        classes = self.manifest["num_classes"]
        return int(classes if node_type is None else classes[node_type])

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
    """The graph of ``--data.dataset``: a prepared folder at ``root``, else ``load()``'s."""
    if dataset == "prepared":
        return PreparedSource(root, verify, read_threads)
    return MemorySource(load, dataset)
