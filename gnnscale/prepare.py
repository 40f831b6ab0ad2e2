"""The subcommands that write data: ``gnnscale prepare`` and ``gnnscale prepare-graphs``.

Neither needs a model or a trainer: each is a function, parsed by jsonargparse on its own
(``gnnscale.cli.SUBCOMMANDS`` maps the names). ``prepare`` writes one graph to a folder every
process maps (``gnnscale.stores``); ``prepare-graphs`` many small graphs to a store
(``gnnscale.stores.graphs``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from jsonargparse import ArgumentError

from gnnscale import argerrors
from gnnscale.data.args import NodeSplit, Preprocess
from gnnscale.data.datasets import DATASETS
from gnnscale.data.graphs import prepare_graphs
from gnnscale.data.neighbor import NeighborDataModule
from gnnscale.data.synthetic import (
    SyntheticGraph,
    SyntheticRecommender,
    make_item_class_graph,
    write_streamed_synthetic,
)
from gnnscale.errors import ConfigError
from gnnscale.stores.manifest import FeatureDtype
from gnnscale.stores.npy import prepare_data, prepare_npy
from gnnscale.stores.ogb import OGB, prepare_ogb
from gnnscale.stores.writing import write_graph

__all__ = ["prepare", "prepare_graphs_main", "prepare_main"]


def prepare(
    *,
    out: Path,
    dataset: str = "synthetic",
    root: Path = Path("data"),
    synthetic: SyntheticGraph = SyntheticGraph(),  # noqa: B008 (frozen dataclass)
    preprocess: Preprocess = Preprocess(),  # noqa: B008
    recommender: SyntheticRecommender = SyntheticRecommender(),  # noqa: B008
    split: NodeSplit = NodeSplit(),  # noqa: B008
    feature_dtype: FeatureDtype | None = None,
    stream: bool = False,
    chunk_nodes: int = 1 << 20,
) -> Path:
    """Write a graph to a folder once, for ``--data.dataset prepared --data.root OUT``.

    The folder also opens as PyG's ``(FeatureStore, GraphStore)`` pair:
    ``gnnscale.stores.open(OUT)``.

    Args:
        out: Folder to create (atomically: it appears complete or not at all).
        dataset: Dataset to load and write, as ``--data.dataset`` of ``gnnscale fit``; or
            ``npy``: the folder of ``.npy`` arrays at ``root`` (layout in
            ``gnnscale.stores.npy``; homogeneous or heterogeneous), read chunk by chunk; or
            ``ogbn-arxiv``, ``ogbn-products``, ``ogbn-papers100M``, ``ogbn-mag``: OGB's
            download unpacked in ``root/ogbn_<name>/``, read chunk by chunk as it unpacks
            (``gnnscale.stores.ogb``); or ``recommender``: the generated heterogeneous graph
            that ``HeteroNeighborDataModule`` and ``LinkDataModule`` draw for ``--data.dataset
            synthetic`` (users, items, categories; items labelled by community and split), for
            either to train from the folder.
        root: Folder of the dataset's files.
        synthetic: Size and difficulty of the generated graph (``dataset: synthetic``).
        preprocess: Preprocessing applied before writing, as ``--data.preprocess``.
        recommender: Size and structure of the generated recommender graph (``dataset:
            recommender``), as ``--data.synthetic`` of the hetero and link DataModules.
        split: How its items are split (``dataset: recommender``), as ``--data.split`` of
            ``HeteroNeighborDataModule``.
        feature_dtype: Dtype of the stored features: ``float32``, ``bfloat16``, ``float16``;
            default: as stored for ``npy`` (float64 as float32; a C-order ``x.npy`` of the
            stored dtype is then used where it lies) and
            OGB's downloads (float32, papers100M's as its ``data.npz`` holds them), else
            ``float32``.
        stream: Generate the synthetic graph chunk by chunk (memory of one chunk, any size; a
            different draw from the in-memory generator) instead of loading it whole.
        chunk_nodes: Nodes per written (or generated) chunk.
    """
    known = ["npy", "recommender", *OGB, *(d for d in DATASETS if d != "prepared")]
    if dataset not in known:
        raise ConfigError(
            f"--dataset {dataset!r} is not one gnnscale prepare reads; choose one of "
            f"{', '.join(dict.fromkeys(known))} (another graph: write its arrays as .npy, "
            "docs/stores.md)"
        )
    if dataset == "npy" or dataset in OGB or dataset == "recommender":
        if preprocess != Preprocess() or stream:
            raise ConfigError(
                f"--dataset {dataset} is read as it is: drop --preprocess and --stream"
            )
        if dataset == "recommender":
            data = make_item_class_graph(recommender, split.train_fraction, split.val_fraction)
            made = {"dataset": dataset, "recommender": asdict(recommender), "split": asdict(split)}
            return prepare_data(data, out, made, feature_dtype)
        if dataset in OGB:
            return prepare_ogb(dataset, root, out, feature_dtype)
        return prepare_npy(root, out, feature_dtype)
    feature_dtype = feature_dtype or "float32"
    if stream:
        if dataset != "synthetic" or preprocess != Preprocess():
            raise ConfigError("--stream generates --dataset synthetic, without --preprocess")
        return write_streamed_synthetic(synthetic, out, feature_dtype, chunk_nodes)
    dm = NeighborDataModule(dataset, root, synthetic=synthetic, preprocess=preprocess)
    source: dict[str, Any] = {"dataset": dataset, "preprocess": asdict(preprocess)}
    source |= {"synthetic": asdict(synthetic)} if dataset == "synthetic" else {"root": str(root)}
    return write_graph(dm.data, out, source, feature_dtype, chunk_nodes)


def _function_main(function: Callable[..., Path], command: str, args: list[str] | None) -> Path:
    """Parse ``args`` (default ``sys.argv`` after the subcommand) into ``function`` and run it."""
    from jsonargparse import CLI

    try:
        return CLI(  # type: ignore[no-any-return]
            function,
            args=sys.argv[2:] if args is None else args,
            exit_on_error=False,
            prog=command,
        )
    except ArgumentError as err:
        raise ConfigError(argerrors.one_line(str(err), command)) from err


def prepare_main(args: list[str] | None = None) -> Path:
    """``gnnscale prepare``: one graph to a folder (``gnnscale.stores.writing``)."""
    given = sys.argv[2:] if args is None else args
    try:
        return _function_main(prepare, "gnnscale prepare", args)
    except ConfigError as err:  # the generators' checks name fit's flags: name prepare's
        said = " ".join(given)
        for i, arg in enumerate(given[:-1]):
            if arg == "--config" and Path(given[i + 1]).is_file():
                said += Path(given[i + 1]).read_text()
        flag = "--recommender." if "recommender" in said else "--synthetic."
        raise ConfigError(str(err).replace("--data.synthetic.", flag)) from None


def prepare_graphs_main(args: list[str] | None = None) -> Path:
    """``gnnscale prepare-graphs``: many small graphs to a store (``gnnscale.stores.graphs``)."""
    return _function_main(prepare_graphs, "gnnscale prepare-graphs", args)
