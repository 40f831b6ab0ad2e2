"""A link task's three graphs (training, validation, test), split once: ``LinkDataModule``'s.

In memory, PyG's ``RandomLinkSplit`` splits the graph (PinSAGE's neighbours added after, from
the training edges); a prepared folder's relation is split once by streaming into a folder beside
it (``gnnscale.stores.link_split``: the same parts, another draw). Either gives each stage's
loader input, its supervision pairs and the edges already known. Apart from the DataModule: this
changes with how a split is made and kept, the DataModule with its loaders and evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
import torch_geometric.transforms as T
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch_geometric.data import HeteroData
from torch_geometric.typing import EdgeType

from gnnscale.data.hetero import edge_key
from gnnscale.data.pinsage import PinSAGENeighbors, pair_keys, pinsage_neighbors
from gnnscale.data.sources import GraphSource, MemorySource, PreparedSource
from gnnscale.errors import ConfigError
from gnnscale.memory import MiB, store_tensors, tensor_mb
from gnnscale.stores import link_split
from gnnscale.stores.mapped import MappedFeatureStore, MappedGraphStore, fill_cache
from gnnscale.stores.prepared import PreparedGraph

__all__ = [
    "STAGES",
    "LinkSplit",
    "LinkTask",
    "Links",
    "MemoryLinks",
    "PreparedLinks",
    "distinct",
    "open_links",
    "popularity",
]

STAGES = ("train", "val", "test")


@dataclass(frozen=True)
class LinkSplit:
    """How ``RandomLinkSplit`` divides the supervised relation's edges.

    Args:
        val_fraction: Fraction of edges held out for validation.
        test_fraction: Fraction of edges held out for test.
        disjoint_train_ratio: Fraction of the training edges used only as supervision, never
            for message passing (0: every training edge is both, and a batch's model sees the
            edges it must predict). Default: 0 for a relation within one node type, both ways
            (a citation graph: the graph auto-encoder's training, which ranks far better
            there), 0.3 for one between two types (a recommender's users and items).
    """

    val_fraction: float = 0.05
    test_fraction: float = 0.1
    disjoint_train_ratio: float | None = None

    def __post_init__(self) -> None:
        """Refuse fractions that leave no training edges."""
        for key in ("val_fraction", "test_fraction"):
            if not 0 < getattr(self, key) < 1:
                raise ConfigError(
                    f"--data.split.{key} must be between 0 and 1 (got {getattr(self, key)})"
                )
        if self.val_fraction + self.test_fraction >= 1:
            raise ConfigError(
                "--data.split.val_fraction + --data.split.test_fraction must be below 1 (got "
                f"{self.val_fraction + self.test_fraction:g}): no edges would be left to train on"
            )
        if self.disjoint_train_ratio is not None and not 0 <= self.disjoint_train_ratio < 1:
            raise ConfigError(
                "--data.split.disjoint_train_ratio must be >= 0 and < 1 "
                f"(got {self.disjoint_train_ratio})"
            )


@dataclass(frozen=True)
class LinkTask:
    """What a split needs to know of its DataModule's task.

    Args:
        target: The relation to predict.
        reverse: Its reverse relation, where the graph has one (split with it).
        undirected: An edge and its reverse are one pair (a homogeneous graph).
        split: The fractions held out.
        num_nodes: Nodes per type.
        pinsage: PinSAGE's neighbours to add from the training edges; none: uniform neighbours.
    """

    target: EdgeType
    reverse: EdgeType | None
    undirected: bool
    split: LinkSplit
    num_nodes: Mapping[str, int]
    pinsage: PinSAGENeighbors | None = None

    @property
    def disjoint(self) -> float:
        """The split's ``disjoint_train_ratio``; its default for this relation (``LinkSplit``)."""
        if self.split.disjoint_train_ratio is not None:
            return self.split.disjoint_train_ratio
        return 0.0 if self.undirected else 0.3


class MemoryLinks:
    """A graph in memory, split by PyG's ``RandomLinkSplit`` (PinSAGE's edges added)."""

    def __init__(self, source: MemorySource, task: LinkTask) -> None:
        self.source, self.task = source, task

    @property
    def data(self) -> HeteroData:
        """The whole graph."""
        data = self.source.data
        assert isinstance(data, HeteroData)
        return data

    def prepare(self) -> None:
        """Download (if needed) and load the graph."""
        _ = self.data

    @cached_property
    def splits(self) -> tuple[HeteroData, HeteroData, HeteroData]:
        """Training, validation and test graphs (``RandomLinkSplit``), PinSAGE edges added."""
        task = self.task
        target, rev = task.target, task.reverse
        split = T.RandomLinkSplit(
            num_val=task.split.val_fraction,
            num_test=task.split.test_fraction,
            is_undirected=task.undirected,
            disjoint_train_ratio=task.disjoint,
            neg_sampling_ratio=1.0,  # validation and test negatives, for AUC
            add_negative_train_samples=False,  # drawn per batch instead
            edge_types=[target],
            rev_edge_types=[rev] if rev is not None else None,
        )
        with torch.random.fork_rng(devices=[]):  # the same split in every process and run
            torch.manual_seed(0)
            train, val, test = split(self.data)
        if task.pinsage is not None:
            src, _, dst = target
            similar = pinsage_neighbors(
                train[target].edge_index,  # message-passing edges of training only
                task.num_nodes[src],
                task.num_nodes[dst],
                task.pinsage,
            )
            for graph in (train, val, test):
                graph[dst, "similar", dst].edge_index = similar
        return train, val, test

    def input(self, stage: str) -> HeteroData:
        """What a stage's loaders sample: its graph."""
        return self.splits[STAGES.index(stage)]

    def labels(self, stage: str) -> tuple[Tensor, Tensor]:
        """A stage's supervision pairs and their labels (1: an edge)."""
        store = self.input(stage)[self.task.target]
        return store.edge_label_index, store.edge_label

    def known(self, *stages: str) -> Tensor:
        """Sorted keys of the target edges (message passing and supervision) of ``stages``."""
        target, num_dst = self.task.target, self.task.num_nodes[self.task.target[2]]
        parts = []
        for stage in stages:
            store = self.input(stage)[target]
            parts.append(store.edge_index)
            if "edge_label_index" in store:
                parts.append(store.edge_label_index[:, store.edge_label == 1])
        edges = torch.cat(parts, 1)
        keys = pair_keys(edges, num_dst)
        if self.task.undirected:
            keys = torch.cat([keys, pair_keys(edges.flip(0), num_dst)])
        return torch.unique(keys)

    def hold(self, *args: Any) -> None:
        """No feature cache: every feature is in memory already."""

    def memory_mb(self) -> tuple[float, float]:
        """The graph and its three splits (which share features) in memory; nothing mapped."""
        return tensor_mb(*store_tensors(self.data, *self.splits)), 0.0


class PreparedLinks:
    """A prepared folder's relation, split once into a folder beside it (``link_split``)."""

    def __init__(self, source: PreparedSource, task: LinkTask) -> None:
        self.source, self.task = source, task

    def prepare(self) -> None:
        """Write the split (once), refusing a relation stored without its reverse."""
        if self.task.undirected:
            t = self.task.target
            raise ConfigError(
                f"--data.edge_type {edge_key(t)} has no reverse relation "
                f"({t[2]}__rev_{t[1]}__{t[0]}): from a prepared "
                "folder, links are predicted on a relation stored with its reverse"
            )
        _ = self.folder

    @cached_property
    def folder(self) -> Path:
        """The streamed split, written once beside the prepared folder."""
        task, root = self.task, self.source.root
        fractions = (
            task.split.val_fraction,
            task.split.test_fraction,
            task.disjoint,
        )
        out = root.parent / f"{root.name}.link_split-{edge_key(task.target)}"
        return link_split.write_split(
            self.source.graph,
            task.target,
            task.reverse,
            fractions,
            out,
            verify=self.source.verify,
        )

    @cached_property
    def split_graph(self) -> PreparedGraph:
        """The split folder, mapped once (its sizes checked)."""
        return PreparedGraph(self.folder, "size")

    def input(self, stage: str) -> tuple[MappedFeatureStore, MappedGraphStore]:
        """The store pair a stage samples, its target relation (and reverse) the stage's."""
        fs, gs = self.source.stores
        split = self.split_graph
        csc = dict(gs.csc_by_type)
        target, reverse = self.task.target, self.task.reverse
        for t in (target, reverse):
            if t is not None:
                key, (_, _, size) = edge_key(t), csc[t]
                csc[t] = (
                    split.tensor(f"{stage}/{key}/row"),
                    split.tensor(f"{stage}/{key}/colptr"),
                    size,
                )
        # The stage's own relations' CSCs are the split's, in no input's order: no edge id map.
        perm = {t: p for t, p in gs.perm_by_type.items() if t not in (target, reverse)}
        return fs, MappedGraphStore(csc, self.source.graph, perm)

    def labels(self, stage: str) -> tuple[Tensor, Tensor]:
        """A stage's supervision pairs and their labels (1: an edge)."""
        split = self.split_graph
        return split.tensor(f"{stage}/label_index"), split.tensor(f"{stage}/label")

    def known(self, *stages: str) -> Tensor:
        """Sorted keys of the target edges of the last stage's graph and its own labels, mapped.

        Each stage's graph holds the edges of the stages before it. Written with the split
        (``link_split.write_known``), shared by every process that maps it.
        """
        return self.split_graph.tensor(f"{stages[-1]}/known")

    def hold(self, fanout: dict[EdgeType, list[int]], batch_size: int, gib: float) -> None:
        """Fill the feature cache (once) from a sampling pass on the training graph.

        Seeded at the training edges' endpoints, each as often as it ends an edge, ``batch_size``
        a time.
        """
        if not gib or self.source.stores[0].cache:
            return
        (src, _, dst), (index, label) = self.task.target, self.labels("train")
        ends = index[:, label == 1]
        seeds = {src: ends.reshape(-1)} if src == dst else {src: ends[0], dst: ends[1]}
        held = fill_cache(self.input("train"), fanout, batch_size, gib, seeds)
        rank_zero_info(f"gnnscale: {held}")

    def memory_mb(self) -> tuple[float, float]:
        """Nothing in memory; the folder and its split mapped."""
        mapped = self.source.graph.nbytes + self.split_graph.nbytes
        return 0.0, mapped / MiB


Links = MemoryLinks | PreparedLinks


POPULARITY_CHUNK = 1 << 20  # keys counted at once: 8 MiB of destinations


def popularity(known: Tensor, num_dst: int) -> Tensor:
    """Each destination's count among the ``known`` keys (the popularity baseline's ranking).

    A chunk of keys at a time (a prepared folder's are mapped, and as many as its edges), added
    into the float32 counts it returns: nothing else as long as the destinations is made (a
    ``bincount`` per chunk was, in int64). Counts are exact up to 2**24 a destination.
    """
    counts = torch.zeros(num_dst)
    ones = torch.ones(min(known.numel(), POPULARITY_CHUNK))
    for a in range(0, known.numel(), POPULARITY_CHUNK):
        dst = known[a : a + POPULARITY_CHUNK] % num_dst
        counts.index_add_(0, dst, ones[: dst.numel()])
    return counts


def distinct(n: int, k: int, generator: torch.Generator) -> Tensor:
    """``k`` distinct ids of ``range(n)``, every set of ``k`` equally likely, sorted.

    Without permuting all ``n`` when ``k`` is small beside it (a ``randperm`` of MAG240M's
    papers is 2 GB): ids are drawn with replacement until ``k`` distinct ones are in hand, and
    ``k`` of those kept at random; whichever ids came up, every one of them was equally likely
    to, so the set kept is uniform.
    """
    if 2 * k > n:
        return torch.randperm(n, generator=generator)[:k].sort().values
    drawn = torch.empty(0, dtype=torch.long)
    while drawn.numel() < k:
        more = torch.randint(n, (k,), generator=generator)
        drawn = torch.unique(torch.cat([drawn, more]))
    keep = torch.randperm(drawn.numel(), generator=generator)[:k]
    return drawn[keep].sort().values


def open_links(source: GraphSource, task: LinkTask) -> Links:
    """The split of ``task``'s relation that ``source`` (in memory or a prepared folder) takes."""
    if isinstance(source, PreparedSource):
        return PreparedLinks(source, task)
    assert isinstance(source, MemorySource)
    return MemoryLinks(source, task)
