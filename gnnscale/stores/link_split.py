"""A link-prediction split of a prepared folder's relation, streamed into a folder of its own.

``LinkDataModule`` splits a graph in memory with PyG's ``RandomLinkSplit``. A prepared graph may
not fit, so here the split is streamed: each edge of the supervised relation, in its CSC order,
draws its part from a seeded generator, a chunk at a time (:func:`parts`), and the split folder
holds what each stage reads, in the prepared format (``gnnscale.stores.manifest``):

- ``train/``, ``val/``, ``test/``: the relation's CSC (and its reverse relation's) as that stage
  passes messages on: training edges less the supervision-only ones; all training edges;
  training and validation edges. Other edge types are the prepared folder's own.
- ``<stage>/label_index`` ``(2, L)`` and ``<stage>/label`` ``(L,)``: the stage's supervision
  pairs; for validation and test, their true edges then as many uniform random pairs (labels 0),
  as ``RandomLinkSplit(neg_sampling_ratio=1.0)`` gives them.
- ``<stage>/known`` ``(K,)``: the keys ``src * num_dst + dst`` of the edges a stage knows (its
  graph's and its true supervision pairs), sorted, each once: masked out of its rankings
  (:func:`write_known`).

The parts mirror ``RandomLinkSplit``'s: a fraction of the edges for validation, one for test,
and of the rest, ``disjoint_train_ratio`` supervise training without being passed messages on.
The draw is not ``RandomLinkSplit``'s (it cannot be, without the whole edge list in memory); it
is the same in every process and every run of the same folder and settings.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from gnnscale.stores.manifest import FileEntry, FileWriter, Manifest, PreparedGraphError
from gnnscale.stores.prepared import PreparedGraph, map_file
from gnnscale.stores.streaming import Edges, write_csc
from gnnscale.stores.writing import prepare

__all__ = ["STAGES", "parts", "write_known", "write_pairs", "write_split"]

STAGES = ("train", "val", "test")
# Each edge's part: passed messages on and supervising training (when no training edge is kept
# out of message passing), supervising training only, validation, test.
TRAIN, TRAIN_SUPERVISION, VAL, TEST = 0, 1, 2, 3
MESSAGES = {
    "train": (TRAIN,),
    "val": (TRAIN, TRAIN_SUPERVISION),
    "test": (TRAIN, TRAIN_SUPERVISION, VAL),
}
KEY_CHUNK = 1 << 24  # edges whose keys are computed, or written, at once


def _key(edge_type: tuple[str, str, str]) -> str:
    return "__".join(edge_type)


def parts(
    num_edges: int, fractions: tuple[float, float, float], seed: int, chunk: int
) -> Iterator[np.ndarray]:
    """Each edge's part, in chunks of ``chunk`` edges (the same draw for the same arguments).

    Args:
        num_edges: Edges of the relation.
        fractions: Validation, test, and the training edges' supervision-only fraction.
        seed: The draw's seed.
        chunk: Edges per chunk (each chunk has a seed of its own, so any chunk can be redrawn).
    """
    val, test, disjoint = fractions
    for index, a in enumerate(range(0, num_edges, chunk)):
        rng = np.random.default_rng([seed, index])
        u, v = rng.random(min(chunk, num_edges - a)), None
        part = np.full(u.size, TRAIN, dtype=np.uint8)
        part[u < val + test] = TEST
        part[u < val] = VAL
        if disjoint:
            v = rng.random(u.size)
            part[(u >= val + test) & (v < disjoint)] = TRAIN_SUPERVISION
        yield part


def _relation(
    graph: PreparedGraph, key: str, chunk: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The relation's edges ``(src, dst)`` in CSC order, a chunk at a time.

    ``key`` ``""``: the homogeneous graph's edges.
    """
    if graph.manifest.appends:
        raise PreparedGraphError(
            f"{graph.folder} took appends: link splits and seed edges read one CSC, not its "
            "appended parts; prepare the whole graph again (gnnscale prepare) to split it"
        )
    prefix = f"{key}/" if key else ""
    colptr, row = graph.tensor(f"{prefix}colptr"), graph.tensor(f"{prefix}row")
    num_dst = colptr.numel() - 1
    for a in range(0, row.numel(), chunk):
        b = min(a + chunk, row.numel())
        # Each edge's destination: the last column whose start is at or before it.
        dst = torch.searchsorted(colptr, torch.arange(a, b), right=True) - 1
        yield row[a:b].numpy(), dst.clamp_(max=num_dst - 1).numpy()


def write_known(row: Tensor, colptr: Tensor, pairs: Tensor, path: Path) -> FileEntry:
    """Write the sorted keys of a CSC's edges and of the ``(2, P)`` ``pairs``, each once.

    A key is ``src * num_dst + dst``. Keyed a chunk of destinations at a time into one array,
    sorted in place, then written a chunk at a time without repeats: about 8 bytes a key (an
    edge or a pair) at the peak, in the one process that writes the split. Every rank computed
    them at every evaluation before (at 100M edges 0.8 GB of keys in each, a few times that at
    the peak).

    Returns:
        The file's manifest entry.
    """
    num_edges, num_dst = row.numel(), colptr.numel() - 1
    keys = torch.empty(num_edges + pairs.size(1), dtype=torch.long)
    cuts = torch.searchsorted(colptr, torch.arange(0, num_edges, KEY_CHUNK)).tolist()
    for d0, d1 in pairwise([*cuts, num_dst]):  # destinations d0 .. d1 - 1
        a, b = int(colptr[d0]), int(colptr[d1])
        torch.mul(row[a:b], num_dst, out=keys[a:b])
        keys[a:b] += torch.arange(d0, d1).repeat_interleave(colptr[d0 : d1 + 1].diff())
    for a in range(0, pairs.size(1), KEY_CHUNK):
        part = keys[num_edges + a : num_edges + a + KEY_CHUNK]
        torch.mul(pairs[0, a : a + KEY_CHUNK], num_dst, out=part)
        part += pairs[1, a : a + KEY_CHUNK]
    keys.numpy().sort()  # in place: torch.unique would sort into new arrays
    writer = FileWriter(path, "int64")
    for a in range(0, keys.numel(), KEY_CHUNK):
        chunk = keys[a : a + KEY_CHUNK]
        new = torch.ones(chunk.numel(), dtype=torch.bool)
        torch.ne(chunk[1:], chunk[:-1], out=new[1:])
        new[0] = a == 0 or bool(chunk[0] != keys[a - 1])
        writer.write(chunk[new])
    return writer.close()


def write_split(
    graph: PreparedGraph,
    target: tuple[str, str, str],
    reverse: tuple[str, str, str] | None,
    fractions: tuple[float, float, float],
    out: Path,
    seed: int = 0,
    chunk_edges: int = 1 << 22,
    verify: Literal["full", "size"] = "full",
) -> Path:
    """Split ``target`` of ``graph`` into ``out`` (atomically; kept if already written).

    A split already written is checked as its graph is (``verify``), and every node id it holds
    (supervision pairs, each stage's neighbours) against the node counts: PyG's sampler trusts
    them, and a damaged one was a segmentation fault. One read of the split, about as long as
    its checksums'. A damaged split is written again.

    Args:
        graph: The prepared (heterogeneous) folder.
        target: The supervised relation.
        reverse: Its reverse relation, whose edges are the target's reversed (rebuilt from the
            split target edges); ``None`` if the graph has none.
        fractions: Validation, test, and the training edges' supervision-only fraction.
        out: The split folder.
        seed: The draw's seed.
        chunk_edges: Edges per chunk.
        verify: ``full`` checks an existing split's every block's checksum; ``size`` its sizes.
    """
    split = _Split(graph, target, reverse, fractions, seed, chunk_edges)
    return prepare(
        out,
        split.source(),
        split.fill,
        split.size(),
        derived=True,
        verify=verify,
        check=split.check,
    )


@dataclass(frozen=True)
class _Split:
    """One relation's split: what :func:`write_split` writes, a method for each part."""

    graph: PreparedGraph
    target: tuple[str, str, str]
    reverse: tuple[str, str, str] | None
    fractions: tuple[float, float, float]
    seed: int
    chunk_edges: int

    @property
    def key(self) -> str:
        return _key(self.target)

    @property
    def n_src(self) -> int:
        return self.graph.manifest.node_count(self.target[0])

    @property
    def n_dst(self) -> int:
        return self.graph.manifest.node_count(self.target[2])

    @property
    def num_edges(self) -> int:
        return self.graph.manifest.edge_count(self.key)

    def source(self) -> dict[str, Any]:
        """What the split is made from: another value writes it again."""
        return {
            "graph": self.graph.manifest.key,
            "target": list(self.target),
            "reverse": self.reverse,
            "fractions": list(self.fractions),
            "seed": self.seed,
            "chunk_edges": self.chunk_edges,
            "known": True,  # a split written before it holds no known keys: written again
        }

    def size(self) -> int:
        """Bytes it writes, about: each stage's CSCs, its pairs and its known keys."""
        num_edges = self.num_edges
        csc = 3 * 16 * num_edges * (2 if self.reverse else 1)
        return csc + 2 * 24 * num_edges + 3 * 8 * num_edges

    def edges(self, codes: tuple[int, ...], swap: bool = False) -> Edges:
        """The relation's edges whose part is one of ``codes`` (``swap``: reversed)."""

        def chunks() -> Iterator[tuple[np.ndarray, np.ndarray]]:
            edges = _relation(self.graph, self.key, self.chunk_edges)
            drawn = parts(self.num_edges, self.fractions, self.seed, self.chunk_edges)
            for (src, dst), part in zip(edges, drawn, strict=True):
                keep = np.isin(part, codes)
                yield (dst[keep], src[keep]) if swap else (src[keep], dst[keep])

        drawn = parts(self.num_edges, self.fractions, self.seed, self.chunk_edges)
        count = sum(int(np.isin(p, codes).sum()) for p in drawn)
        return Edges(f"{self.graph.folder}/{self.key}", count, lambda size: chunks())

    def fill(self, folder: Path) -> Manifest:
        """Write every stage's message CSCs, supervision pairs and known keys into ``folder``."""
        disjoint = self.fractions[2] > 0
        supervised = {
            "train": (TRAIN_SUPERVISION,) if disjoint else (TRAIN,),
            "val": (VAL,),
            "test": (TEST,),
        }
        files: dict[str, FileEntry] = {}
        for stage in STAGES:
            (folder / stage).mkdir()
            files |= self.messages(folder, stage)
            pairs = self.labels(folder / stage, stage, supervised[stage], stage != "train")
            files |= {f"{stage}/{name}": entry for name, entry in pairs.items()}
            files[f"{stage}/known"] = self.known(folder, stage, files)
        return Manifest(num_nodes=self.graph.manifest.num_nodes, num_edges={}, files=files)

    def messages(self, folder: Path, stage: str) -> dict[str, FileEntry]:
        """The CSCs ``stage`` passes messages on: the relation's, and its reverse's."""
        relations = [(self.key, False, self.n_src, self.n_dst)]
        if self.reverse is not None:
            relations.append((_key(self.reverse), True, self.n_dst, self.n_src))
        files: dict[str, FileEntry] = {}
        for key, swap, n_src, n_dst in relations:
            edges = self.edges(MESSAGES[stage], swap=swap)
            written, _ = write_csc(
                edges, n_src, n_dst, folder / stage / key, self.chunk_edges, ids=False
            )
            files |= {f"{stage}/{key}/{name}": entry for name, entry in written.items()}
        return files

    def labels(
        self, folder: Path, stage: str, codes: tuple[int, ...], negatives: bool
    ) -> dict[str, FileEntry]:
        """The stage's supervision pairs and labels; ``negatives``: as many uniform pairs."""
        positives = self.edges(codes)
        index = FileWriter(folder / "label_index.bin", "int64")
        label = FileWriter(folder / "label.bin", "float32")
        count, chunk = positives.num_edges, self.chunk_edges
        for row in (0, 1):
            for pair in positives.chunks(chunk):
                index.write(torch.from_numpy(np.ascontiguousarray(pair[row])))
            if negatives:  # as many uniform pairs, drawn by rows so that each row's are its own
                rng = np.random.default_rng([self.seed, 1 + STAGES.index(stage), row])
                high = self.n_src if row == 0 else self.n_dst
                for a in range(0, count, chunk):
                    index.write(torch.from_numpy(rng.integers(0, high, min(chunk, count - a))))
        label.write(torch.ones(count))
        if negatives:
            label.write(torch.zeros(count))
        label_entry = label.close()  # the pairs: (2, L), sources then destinations
        pairs = replace(index.close(), shape=(2, label_entry.shape[0]))
        return {"label_index": pairs, "label": label_entry}

    def known(self, folder: Path, stage: str, files: dict[str, FileEntry]) -> FileEntry:
        """The keys the stage knows: its graph's edges and its true pairs (:func:`write_known`)."""

        def mapped(name: str) -> Tensor:
            shape = files[f"{stage}/{name}"].shape
            if not np.prod(shape):
                return torch.empty(shape, dtype=torch.long)
            return map_file(str(folder / stage / f"{name}.bin"), 0, "int64", shape, False)

        index = mapped("label_index")
        true = index.size(1) // (1 if stage == "train" else 2)  # true pairs, then as many random
        row, colptr = mapped(f"{self.key}/row"), mapped(f"{self.key}/colptr")
        return write_known(row, colptr, index[:, :true], folder / stage / "known.bin")

    def check(self, split: PreparedGraph) -> None:
        """Refuse a split holding a node id the sampler would trust out of range."""
        n_src, n_dst, chunk = self.n_src, self.n_dst, self.chunk_edges
        for stage in STAGES:
            pairs = split.tensor(f"{stage}/label_index")
            row = f"{stage}/{self.key}/row"
            ids = [
                (f"{stage}/label_index", pairs[0], n_src),
                (f"{stage}/label_index", pairs[1], n_dst),
                (row, split.tensor(row), n_src),
            ]
            if self.reverse is not None:
                back = f"{stage}/{_key(self.reverse)}/row"
                ids.append((back, split.tensor(back), n_dst))
            for name, tensor, count in ids:
                for a in range(0, tensor.numel(), chunk):
                    low, high = (int(v) for v in torch.aminmax(tensor[a : a + chunk]))
                    if low < 0 or high >= count:
                        raise PreparedGraphError(
                            f"{split.path(name)} holds node {low if low < 0 else high:,}, "
                            f"outside 0..{count - 1:,}"
                        )
            known = split.tensor(f"{stage}/known")  # sorted: its ends bound it
            if known.numel() and (int(known[0]) < 0 or int(known[-1]) >= n_src * n_dst):
                raise PreparedGraphError(
                    f"{split.path(f'{stage}/known')} holds a key outside 0..{n_src * n_dst - 1:,}"
                )


def write_pairs(
    graph: PreparedGraph,
    edge_type: tuple[str, str, str] | None,
    out: Path,
    chunk_edges: int = 1 << 22,
) -> Path:
    """Every edge of ``edge_type`` as one ``(2, E)`` file, ``edge_label_index``, in ``out``.

    Sources, then destinations, in the store's CSC order (by destination; within one, the
    input's order): the pairs PyG's ``LinkNeighborLoader`` seeds from, mapped rather than
    stacked in memory. Written a chunk at a time, once (derived data: a damaged one is written
    again).
    """
    key = "" if edge_type is None else _key(edge_type)
    num_edges = graph.tensor(f"{key}/row" if key else "row").numel()

    def fill(folder: Path) -> Manifest:
        pairs = FileWriter(folder / "edge_label_index.bin", "int64")
        for side in (0, 1):
            for edges in _relation(graph, key, chunk_edges):
                pairs.write(torch.from_numpy(np.ascontiguousarray(edges[side])))
        entry = replace(pairs.close(), shape=(2, num_edges))
        files = {"edge_label_index": entry}
        return Manifest(num_nodes=graph.manifest.num_nodes, num_edges={}, files=files)

    source = {"graph": graph.manifest.key, "edge_type": edge_type and list(edge_type)}
    return prepare(out, source, fill, 16 * num_edges, derived=True)
