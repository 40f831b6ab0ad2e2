"""The datasets ``--data.dataset`` names: which there are, how large, loaded and checked.

:func:`load_dataset` loads one by name (downloading it into ``--data.root`` if needed);
:func:`check_root` and :func:`check_size` refuse a root that cannot hold it or a graph too large
for the machine before anything is downloaded; :func:`validate_graph` checks a loaded graph's
splits, labels and features. Apart from ``gnnscale.data.sources`` (how a DataModule reads the
graph, in memory or from a prepared folder): a new dataset, or a new rule for what a graph must
hold, changes this module only.
"""

from __future__ import annotations

import contextlib
import os
import socket
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor
from torch_geometric.data import Data

from gnnscale.data.synthetic import SyntheticGraph, make_synthetic_graph
from gnnscale.errors import ConfigError, cause
from gnnscale.memory import check_fits, graph_nbytes
from gnnscale.stores.manifest import split_labels
from gnnscale.stores.ogb import OGB

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

SPLIT_MASKS = ("train_mask", "val_mask", "test_mask")  # every graph's three splits


def check_root(dataset: str, root: Path, flag: str = "--data.root") -> None:
    """Refuse a ``--data.root`` (``flag``) that cannot hold or does not hold ``dataset``.

    A graph loaded into memory; a prepared folder's root is checked by opening it
    (``gnnscale.data.sources.open_source``).
    """
    if dataset == "synthetic":
        return  # the root only holds caches, created on first use
    if not root.is_dir():
        raise ConfigError(
            f"{flag} {str(root)!r} does not exist or is not a folder: create it "
            f"(mkdir -p {root}) to download {dataset} into it, or point {flag} at the "
            f"folder that holds {dataset}"
        )
    if not os.access(root, os.R_OK | os.X_OK):
        raise ConfigError(f"{flag} {str(root)!r} cannot be read: fix its permissions")


def check_size(dataset: str, root: Path, flag: str = "--data.dataset") -> None:
    """Refuse, from its known sizes alone, a dataset larger than this machine's memory.

    Before anything is downloaded or loaded. A prepared folder is mapped, not loaded: never
    refused here. ``flag`` names where the dataset was chosen (``--source.name`` in a prepare).
    """
    if dataset not in SIZES:
        return
    nodes, edges, features = SIZES[dataset]
    if dataset in OGB:
        fix = (
            f"prepare it on disk (`gnnscale prepare --source Ogb --source.name {dataset} "
            f"--source.root {root} --out DIR`, from OGB's download unpacked there: "
            "docs/stores.md) and train or plan with --data.dataset prepared --data.root DIR"
        )
    else:
        fix = (
            "write its arrays on a larger machine (gnnscale.stores.save_npy), prepare them on "
            "disk (`gnnscale prepare --source Npy --source.root ARRAYS --out DIR`) and train or "
            "plan with --data.dataset prepared --data.root DIR"
        )
    check_fits(
        graph_nbytes(nodes, edges, features),
        f"{flag} {dataset}",
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
        name: One of :data:`DATASETS` but ``prepared`` (mapped: ``gnnscale.data.sources``).
        root: Folder of the dataset files (Planetoid reads ``root/<name>/raw`` without network).
        synthetic: Settings of the generated graph when ``name == "synthetic"``.
    """
    if name == "synthetic":
        return make_synthetic_graph(synthetic or SyntheticGraph())
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
        for key, idx in zip(SPLIT_MASKS, ("train", "valid", "test"), strict=True):
            data[key] = torch.zeros(data.num_nodes, dtype=torch.bool)
            data[key][split[idx]] = True
        return data
    raise ConfigError(f"--data.dataset {name!r} is not known; choose one of {', '.join(DATASETS)}")


def validate_graph(
    data: Data,
    dataset: str,
    features: bool = True,
    overlaps: bool = True,
    counted: list[int] | None = None,
) -> int:
    """Check splits and labels; with ``features``, every feature; with ``overlaps``, the splits.

    Features must be finite; no node may be in two splits. ``counted``: the split labels as a
    prepare recorded them (:func:`check_labels`).

    Returns:
        The number of classes.
    """
    for key in SPLIT_MASKS:
        if data.get(key) is None:
            raise ConfigError(
                f"--data.dataset {dataset!r} has no {key!r}: gnnscale needs train, val and test "
                "masks; choose a dataset with a public split or add the masks to the Data object"
            )
    if data.x is not None and data.x.dim() == 2 and data.x.size(1) == 0:
        raise ConfigError(
            f"--data.dataset {dataset!r} has node features of width 0 (x of shape "
            f"{tuple(data.x.shape)}): give at least one feature per node, or learn an embedding "
            "per node instead (gnnscale.EmbeddingSAGE)"
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
    masks = {k: data[k] for k in SPLIT_MASKS}
    return check_labels(data.y, masks, dataset, overlaps=overlaps, counted=counted)


def check_labels(
    y: Tensor,
    masks: dict[str, Tensor],
    dataset: str,
    target_type: str | None = None,
    overlaps: bool = True,
    counted: list[int] | None = None,
) -> int:
    """Check the labels of the split nodes, and with ``overlaps`` that no node is in two splits.

    Labels must be class ids 0..num_classes-1 with at least two classes among the split nodes
    (a node outside every split may hold anything, such as -1 for unlabelled). The messages
    name ``dataset`` and, in a heterogeneous graph, the node type that holds ``y``.

    ``counted``: the split labels' lowest, highest and number of distinct values, as a prepare
    recorded them (``split_labels`` in its manifest): checked without reading ``y``, unless
    ``overlaps`` needs the masks read anyway.

    Returns:
        The number of classes: the largest split label + 1.
    """
    shared: dict[tuple[str, str], int] = {}
    if counted and not overlaps:
        low, high, present = counted
    else:
        classes, shared = split_labels(y, masks)
        low, high, present = int(classes[0]), int(classes[-1]), classes.numel()
    of = "" if target_type is None else f" (--data.target_type {target_type!r})"
    if low < 0:
        raise ConfigError(
            f"labels out of range in --data.dataset {dataset!r}{of}: found {low} among "
            "split nodes; class ids must be 0..num_classes-1 (leave unlabelled nodes out of masks)"
        )
    num_classes = high + 1
    if present < 2:
        raise ConfigError(
            f"--data.dataset {dataset!r}{of} has one class ({high}) among its split nodes: "
            "classification needs at least two; check y and the split files"
        )
    if present < num_classes / 2:
        raise ConfigError(
            f"labels of --data.dataset {dataset!r}{of} are not 0..num_classes-1: the largest is "
            f"{num_classes - 1} but only {present} distinct classes occur, so the model would "
            f"have {num_classes} outputs; remap them (torch.unique(y, return_inverse=True))"
        )
    for (a, b), count in shared.items() if overlaps else ():
        if count:
            raise ConfigError(
                f"--data.dataset {dataset!r}{of}: {count:,} node(s) are in both {a} and {b}; "
                "a node belongs to one split: remove it from one"
            )
    return num_classes
