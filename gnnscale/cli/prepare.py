"""The subcommands that write data: ``gnnscale prepare`` and ``gnnscale prepare-graphs``.

Neither needs a model or a trainer: each is a function, parsed by jsonargparse on its own
(``gnnscale.cli.SUBCOMMANDS`` maps the names). ``prepare`` writes one graph to a folder every
process maps (``gnnscale.stores``); ``prepare-graphs`` many small graphs to a store
(``gnnscale.stores.graph_db``).

What ``prepare`` reads is one typed choice, ``--source``, as ``fit``'s ``--data`` is: a class per
source (:class:`Dataset`, :class:`Synthetic`, :class:`Npy`, :class:`Ogb`, :class:`Recommender`),
whose fields are the options that source takes and nothing else. Each writes the folder from its
own settings (:meth:`Source.write`); nothing here asks which one it was given.
"""

from __future__ import annotations

import re
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

import torch
from jsonargparse import ArgumentError, ArgumentParser
from torch_geometric.data import Data

from gnnscale.cli import argerrors
from gnnscale.data.args import NodeSplit, Preprocess
from gnnscale.data.datasets import check_root, check_size
from gnnscale.data.many_graphs import prepare_graphs
from gnnscale.data.neighbor import NeighborDataModule
from gnnscale.data.stream import read_interaction_stream
from gnnscale.data.synthetic import (
    SyntheticGraph,
    SyntheticRecommender,
    make_item_class_graph,
    write_streamed_synthetic,
)
from gnnscale.errors import ConfigError, GroupSettingError
from gnnscale.stores.append import append_npy
from gnnscale.stores.manifest import FeatureDtype
from gnnscale.stores.npy import prepare_data, prepare_npy
from gnnscale.stores.ogb import OGB, prepare_ogb
from gnnscale.stores.writing import write_graph

__all__ = [
    "Dataset",
    "Interactions",
    "Npy",
    "Ogb",
    "Recommender",
    "Source",
    "Synthetic",
    "append",
    "append_main",
    "prepare",
    "prepare_graphs_main",
    "prepare_main",
]


class Source(ABC):
    """Where ``gnnscale prepare`` reads its graph: ``--source CLASS`` and the class's options.

    ``Dataset``: a dataset ``gnnscale fit`` loads by name (``synthetic``, ``Cora``, ...),
    loaded whole and written; ``Synthetic``: the generated graph drawn chunk by chunk straight to
    disk (any size); ``Npy``: a folder of ``.npy`` arrays (edges also as Parquet); ``Ogb``: OGB's
    download, read as it unpacks; ``Recommender``: the generated users-items-categories graph;
    ``Interactions``: a stream of timestamped interactions (CSV or Parquet).
    """

    @abstractmethod
    def write(self, out: Path, feature_dtype: FeatureDtype | None) -> Path:
        """Write the graph to ``out`` (atomically), features as ``feature_dtype``."""


class Dataset(Source):
    """A dataset ``gnnscale fit`` loads by name (``--data.dataset``), loaded whole, then written.

    ``synthetic`` is the very graph ``fit --data.dataset synthetic`` draws from the same
    ``--data.synthetic`` settings. OGB's datasets: ``--source Ogb``; another graph: write its
    arrays as ``.npy`` (``--source Npy``, docs/stores.md).

    Args:
        name: The dataset, as ``--data.dataset`` of ``gnnscale fit``.
        root: Folder of its files (downloaded there if missing), as ``--data.root``.
        synthetic: Size and difficulty of the generated graph (``name: synthetic``), as
            ``--data.synthetic``.
        preprocess: Preprocessing applied before writing, as ``--data.preprocess``.
        chunk_nodes: Nodes written per step (bounds the temporary memory of a dtype cast).
    """

    def __init__(
        self,
        name: Literal["synthetic", "Cora", "CiteSeer", "PubMed", "Reddit", "Flickr"] = "synthetic",
        root: Path = Path("data"),
        synthetic: SyntheticGraph = SyntheticGraph(),  # noqa: B008 (frozen dataclass)
        preprocess: Preprocess = Preprocess(),  # noqa: B008
        chunk_nodes: int = 1 << 20,
    ) -> None:
        self.name, self.root, self.synthetic = name, Path(root), synthetic
        self.preprocess, self.chunk_nodes = preprocess, chunk_nodes

    def write(self, out: Path, feature_dtype: FeatureDtype | None) -> Path:
        """Load the dataset as ``fit`` does and write it: refused first if it cannot fit."""
        if self.name == "synthetic":
            self.synthetic.check_fits("--source.synthetic")
        else:
            check_root(self.name, self.root, "--source.root")
            check_size(self.name, self.root, "--source.name")
        dm = NeighborDataModule(
            self.name, self.root, synthetic=self.synthetic, preprocess=self.preprocess
        )
        source: dict[str, Any] = {"dataset": self.name, "preprocess": asdict(self.preprocess)}
        if self.name == "synthetic":
            source["synthetic"] = asdict(self.synthetic)
        else:
            source["root"] = str(self.root)
        return write_graph(dm.data, out, source, feature_dtype or "float32", self.chunk_nodes)


class Synthetic(Source):
    """The generated graph drawn chunk by chunk straight to disk: memory of one chunk, any size.

    The model of ``--data.dataset synthetic`` (``gnnscale.data.synthetic``), arranged so that no
    step needs the whole graph: a different draw from the same settings (for that very graph:
    ``--source Dataset``).

    Args:
        synthetic: Size and difficulty (``num_nodes`` may exceed what fits in memory).
        chunk_nodes: Nodes generated per step; part of the graph's identity with its seed.
    """

    def __init__(
        self,
        synthetic: SyntheticGraph = SyntheticGraph(),  # noqa: B008 (frozen dataclass)
        chunk_nodes: int = 1 << 20,
    ) -> None:
        self.synthetic, self.chunk_nodes = synthetic, chunk_nodes

    def write(self, out: Path, feature_dtype: FeatureDtype | None) -> Path:
        """Draw the graph into ``out``, chunk after chunk."""
        dtype = feature_dtype or "float32"
        return write_streamed_synthetic(self.synthetic, out, dtype, self.chunk_nodes)


class Npy(Source):
    """A folder of ``.npy`` arrays, read chunk by chunk: any size (``gnnscale.stores.npy``).

    Homogeneous (``x.npy``, ``y.npy``, ``edge_index.npy`` or ``edges.parquet``, ``train.npy``,
    ...) or heterogeneous (``nodes/<type>/``, ``edges/<src>__<rel>__<dst>/``): docs/stores.md.

    Args:
        root: The folder of arrays.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def write(self, out: Path, feature_dtype: FeatureDtype | None) -> Path:
        """Stream the arrays into ``out``; features as stored by default (float64 as float32).

        A C-order ``x.npy`` of the stored dtype is used where it lies, not copied.
        """
        return prepare_npy(self.root, out, feature_dtype)


class Ogb(Source):
    """OGB's node-property download, read chunk by chunk as it unpacks (``gnnscale.stores.ogb``).

    Args:
        name: The dataset.
        root: The folder holding OGB's zip unpacked as ``ogbn_<name>/`` (docs/stores.md).
    """

    def __init__(
        self,
        name: Literal["ogbn-arxiv", "ogbn-products", "ogbn-papers100M", "ogbn-mag"],
        root: Path = Path("data"),
    ) -> None:
        self.name, self.root = name, Path(root)

    def write(self, out: Path, feature_dtype: FeatureDtype | None) -> Path:
        """Stream the download into ``out``; features as stored by default.

        That is float32, or papers100M's as its ``data.npz`` holds them.
        """
        return prepare_ogb(self.name, self.root, out, feature_dtype)


class Recommender(Source):
    """The generated recommender graph (users, items, categories), for training from disk.

    The graph ``HeteroNeighborDataModule`` and ``LinkDataModule`` draw for ``--data.dataset
    synthetic`` from the same settings; items labelled by community and split, so either trains
    from the folder.

    Args:
        synthetic: Its size and structure, as ``--data.synthetic`` of the hetero and link
            DataModules.
        split: How its items are split, as ``--data.split`` of ``HeteroNeighborDataModule``.
    """

    def __init__(
        self,
        synthetic: SyntheticRecommender = SyntheticRecommender(),  # noqa: B008 (frozen)
        split: NodeSplit = NodeSplit(),  # noqa: B008
    ) -> None:
        self.synthetic, self.split = synthetic, split

    def write(self, out: Path, feature_dtype: FeatureDtype | None) -> Path:
        """Draw the graph in memory and write it; features as drawn (float32) by default."""
        split = self.split
        data = make_item_class_graph(self.synthetic, split.train_fraction, split.val_fraction)
        source = {
            "dataset": "recommender",
            "recommender": asdict(self.synthetic),
            "split": asdict(split),
        }
        return prepare_data(data, out, source, feature_dtype)


class Interactions(Source):
    """A stream of timestamped interactions: a ``.csv`` in JODIE's layout or a ``.parquet``.

    Read as ``TemporalLinkDataModule`` reads it (``gnnscale.data.stream``: columns ``src``,
    ``dst``, ``time`` and numeric features; sources and destinations two id spaces, the
    folder's nodes the sources, then the destinations), and written with each edge's time
    (``edge_time``), every neighbourhood sorted by it: sample it with ``HopSampler(...,
    time_attr="edge_time")``. Held in memory while it is written (a stream of 100M
    interactions: about 5 GB); larger: write ``edge_index.npy`` and ``edge_time.npy`` and
    prepare them with ``--source Npy``, which streams.

    Args:
        path: The stream.
        both_ways: Each interaction as two edges, source to destination and back (edge ids
            ``e`` and ``e + E``), so that both ends sample it; false: as given.
    """

    def __init__(self, path: Path, both_ways: bool = True) -> None:
        self.path, self.both_ways = Path(path), both_ways

    def write(self, out: Path, feature_dtype: FeatureDtype | None) -> Path:
        """Read the stream and write it; features as float32 by default."""
        stream = read_interaction_stream(self.path, "--source.path")
        edge_index, edge_time, edge_attr = stream.edge_index, stream.time, stream.edge_attr
        if self.both_ways:
            edge_index = torch.cat([edge_index, edge_index.flip(0)], 1)
            edge_time, edge_attr = edge_time.repeat(2), edge_attr.repeat(2, 1)
        data = Data(edge_index=edge_index, edge_time=edge_time, num_nodes=stream.num_nodes)
        if edge_attr.size(1):
            data.edge_attr = edge_attr
        stat = self.path.stat()
        source = {
            "interactions": str(self.path.resolve()),
            "inputs": [stat.st_size, stat.st_mtime_ns],
            "both_ways": self.both_ways,
        }
        return prepare_data(data, out, source, feature_dtype)


def prepare(
    *,
    out: Path,
    source: Source,
    feature_dtype: FeatureDtype | None = None,
) -> Path:
    """Write a graph to a folder once, for ``--data.dataset prepared --data.root OUT``.

    The folder also opens as PyG's ``(FeatureStore, GraphStore)`` pair:
    ``gnnscale.stores.open(OUT)``. A folder already prepared from the same settings is kept.

    Args:
        out: Folder to create (atomically: it appears complete or not at all).
        source: What to write: ``Dataset`` (a dataset ``fit`` loads by name, the generated
            ``synthetic`` included), ``Synthetic`` (generated chunk by chunk, any size), ``Npy``
            (a folder of ``.npy`` arrays), ``Ogb`` (OGB's download), ``Recommender`` (the
            generated heterogeneous graph) or ``Interactions`` (a stream of timestamped
            interactions); ``--source.help CLASS`` lists a source's options.
        feature_dtype: Dtype of the stored features: ``float32``, ``bfloat16``, ``float16``;
            default: as stored for ``Npy``, ``Ogb`` and ``Recommender``, else ``float32``.
    """
    return source.write(out, feature_dtype)


class _Parser(ArgumentParser):
    """jsonargparse's parser, which takes an option only as spelled in full.

    ``--sour`` is not ``--source``; nor in the parsers it builds from this class for a source.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})


def _function_main(
    function: Callable[..., Path],
    command: str,
    args: list[str] | None,
    renamed: Callable[[str], str | None] = lambda message: None,
) -> Path:
    """Parse ``args`` (default ``sys.argv`` after the subcommand) into ``function`` and run it.

    A refused key or value is one line (``ConfigError``): ``renamed``'s, if it knows the key.
    """
    from jsonargparse import CLI

    try:
        return CLI(  # type: ignore[no-any-return]
            function,
            args=sys.argv[2:] if args is None else args,
            exit_on_error=False,
            prog=command,
            parser_class=_Parser,
        )
    except ArgumentError as err:
        raise ConfigError(renamed(str(err)) or argerrors.one_line(str(err), command)) from err


# The options of ``gnnscale prepare`` before its sources were typed (before 0.2.0; CHANGELOG.md),
# by their first key: what each became.
_RENAMED = {
    "dataset": "--source CLASS",
    "stream": "--source Synthetic",
    "root": "--source.root",
    "synthetic": "--source.synthetic",
    "recommender": "--source.synthetic",
    "preprocess": "--source.preprocess",
    "split": "--source.split",
    "chunk_nodes": "--source.chunk_nodes",
}


def _as_source(dataset: str) -> str:
    """The ``--source`` that reads what ``--dataset NAME`` read."""
    if dataset in ("npy", "recommender"):
        return f"--source {dataset.capitalize()}"
    if dataset in OGB:
        return f"--source Ogb --source.name {dataset}"
    return f"--source Dataset --source.name {dataset}"


def _old_form(message: str) -> str | None:
    """The line that refuses an option of ``prepare``'s old form, saying what to write instead.

    ``message``: jsonargparse's refusal of an unknown key (``unrecognized arguments: --dataset
    npy`` from the command line, ``Option 'recommender.num_users' is not accepted`` from a
    config file); ``None`` when it names no old option.
    """
    given: list[tuple[str, str | None]] = []
    if match := re.match(r"unrecognized arguments: (.*)", message.strip()):
        words = match[1].split()
        for word, after in zip(words, [*words[1:], "--"], strict=True):
            key, sep, value = word.removeprefix("--").partition("=")
            if word.startswith("--"):
                given.append((key, value if sep else None if after.startswith("--") else after))
    elif match := re.match(r"Option '([\w.]+)' is not accepted", message.strip()):
        given.append((match[1], None))
    old = [(k, v) for k, v in given if k.split(".")[0] in _RENAMED]
    if not old:
        return None
    streams = [str(v).lower() for k, v in old if k == "stream"]
    datasets = [v for k, v in old if k == "dataset"]
    if streams and streams[-1] not in ("false", "0", "no"):
        new = ["--source Synthetic"]  # --stream generated the synthetic graph, whatever --dataset
    elif datasets:
        new = [_as_source(datasets[-1]) if datasets[-1] else _RENAMED["dataset"]]
    else:
        new = ["--source Dataset"] if streams else []
    for key, value in old:
        first, _, rest = key.partition(".")
        if first not in ("dataset", "stream"):
            flag = _RENAMED[first] + (f".{rest}" if rest else "")
            new.append(flag if value is None else f"{flag} {value}")
    sources = ", ".join(source.__name__ for source in Source.__subclasses__())
    return (
        f"{', '.join(f'--{k}' for k, _ in old)}: gnnscale prepare's old form; its graph is one "
        f"typed --source now: write {' '.join(new)} (sources: {sources}; their options: "
        "`gnnscale prepare --source.help CLASS`; in a config file: source: {class_path: CLASS, "
        "init_args: {...}}; renamed in gnnscale 0.2.0: CHANGELOG.md)"
    )


def _no_source(message: str) -> str | None:
    """The line that asks for ``--source`` where none was chosen, naming the classes."""
    sources = ", ".join(source.__name__ for source in Source.__subclasses__())
    if "arguments are required: source" in message:
        return (
            f"say what to read: --source CLASS, one of {sources} (their options: "
            "`gnnscale prepare --source.help CLASS`)"
        )
    if match := re.search(
        r"Not a valid subclass of Source\. Got value: NestedArg\(key='([\w.]+)'", message
    ):
        return (
            f"--source.{match[1]} is given before any --source: write --source CLASS first, one "
            f"of {sources}"
        )
    return None


def prepare_main(args: list[str] | None = None) -> Path:
    """``gnnscale prepare``: one graph to a folder (``gnnscale.stores.writing``)."""
    explain = lambda message: _old_form(message) or _no_source(message)  # noqa: E731
    try:
        return _function_main(prepare, "gnnscale prepare", args, explain)
    except GroupSettingError as err:  # every source takes its generator's settings as its own
        raise err.under("--source") from None  # group: --source.synthetic, --source.split


def append(*, out: Path, root: Path) -> Path:
    """Add new nodes and edges to a prepared folder, in time that grows with them.

    Written beside the folder's files, the manifest replaced last: a fit that opened the folder
    keeps what it saw, a killed append leaves the folder as it was, and running it again
    finishes it (``gnnscale.stores.append``; docs/stores.md, "Appends").

    Args:
        out: The prepared folder (``gnnscale prepare --out``).
        root: A folder of ``.npy`` arrays laid out as ``--source Npy`` reads one, holding only
            what is new: the new nodes' rows (``x.npy``, ``y.npy``; their ids follow the
            folder's), the new edges (``edge_index.npy`` or ``edges.parquet``, with
            ``edge_time.npy`` and ``edge_attr.npy`` where the folder has them).
    """
    start = time.perf_counter()
    manifest = append_npy(out, root)
    added = (manifest.appends or [{}])[-1]
    print(
        f"gnnscale append: added {sum(added.get('nodes', {}).values()):,} nodes and "
        f"{sum(added.get('edges', {}).values()):,} edges to {out} (append "
        f"{len(manifest.appends or [])}) in {time.perf_counter() - start:.1f} s"
    )
    return Path(out)


def append_main(args: list[str] | None = None) -> Path:
    """``gnnscale append``: new nodes and edges into a prepared folder."""
    return _function_main(append, "gnnscale append", args)


def prepare_graphs_main(args: list[str] | None = None) -> Path:
    """``gnnscale prepare-graphs``: many small graphs to a store (``gnnscale.stores.graph_db``)."""
    return _function_main(prepare_graphs, "gnnscale prepare-graphs", args)
