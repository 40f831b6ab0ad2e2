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
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Literal

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
    key = _key(target)
    manifest = graph.manifest
    n_src, n_dst = manifest.node_count(target[0]), manifest.node_count(target[2])
    num_edges = manifest.edge_count(key)
    disjoint = fractions[2] > 0

    def chosen(codes: tuple[int, ...], swap: bool = False) -> Edges:
        def chunks(size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
            edges = _relation(graph, key, size)
            for (src, dst), part in zip(
                edges, parts(num_edges, fractions, seed, size), strict=True
            ):
                keep = np.isin(part, codes)
                yield (dst[keep], src[keep]) if swap else (src[keep], dst[keep])

        count = sum(
            int(np.isin(p, codes).sum()) for p in parts(num_edges, fractions, seed, chunk_edges)
        )
        return Edges(f"{graph.folder}/{key}", count, lambda size: chunks(chunk_edges))

    def labels(
        folder: Path, stage: str, codes: tuple[int, ...], negatives: bool
    ) -> dict[str, FileEntry]:
        positives = chosen(codes)
        index, label = (
            FileWriter(folder / "label_index.bin", "int64"),
            FileWriter(folder / "label.bin", "float32"),
        )
        count = positives.num_edges
        for row in (0, 1):
            for pair in positives.chunks(chunk_edges):
                index.write(torch.from_numpy(np.ascontiguousarray(pair[row])))
            if negatives:  # as many uniform pairs, drawn by rows so that each row's are its own
                rng = np.random.default_rng([seed, 1 + STAGES.index(stage), row])
                high = n_src if row == 0 else n_dst
                for a in range(0, count, chunk_edges):
                    index.write(
                        torch.from_numpy(rng.integers(0, high, min(chunk_edges, count - a)))
                    )
        label.write(torch.ones(count))
        if negatives:
            label.write(torch.zeros(count))
        label_entry = label.close()  # the pairs: (2, L), sources then destinations
        pairs = replace(index.close(), shape=(2, label_entry.shape[0]))
        return {"label_index": pairs, "label": label_entry}

    def fill(folder: Path) -> Manifest:
        files: dict[str, FileEntry] = {}
        for stage in STAGES:
            messages = chosen(MESSAGES[stage])
            (folder / stage).mkdir()
            for name, e in write_csc(
                messages, n_src, n_dst, folder / stage / key, chunk_edges, ids=False
            ).items():
                files[f"{stage}/{key}/{name}"] = e
            if reverse is not None:
                back = chosen(MESSAGES[stage], swap=True)
                rkey = _key(reverse)
                for name, e in write_csc(
                    back, n_dst, n_src, folder / stage / rkey, chunk_edges, ids=False
                ).items():
                    files[f"{stage}/{rkey}/{name}"] = e
            supervised = {
                "train": (TRAIN_SUPERVISION,) if disjoint else (TRAIN,),
                "val": (VAL,),
                "test": (TEST,),
            }
            for name, e in labels(
                folder / stage, stage, supervised[stage], stage != "train"
            ).items():
                files[f"{stage}/{name}"] = e
            files[f"{stage}/known"] = known(folder, stage, files)
        return Manifest(num_nodes=manifest.num_nodes, num_edges={}, files=files)

    def known(folder: Path, stage: str, files: dict[str, FileEntry]) -> FileEntry:
        def mapped(name: str) -> Tensor:
            shape = files[f"{stage}/{name}"].shape
            if not np.prod(shape):
                return torch.empty(shape, dtype=torch.long)
            path = str(folder / stage / f"{name}.bin")
            return map_file(path, 0, "int64", shape, False)

        index = mapped("label_index")
        true = index.size(1) // (1 if stage == "train" else 2)  # true pairs, then as many random
        row, colptr = mapped(f"{key}/row"), mapped(f"{key}/colptr")
        return write_known(row, colptr, index[:, :true], folder / stage / "known.bin")

    source = {
        "graph": manifest.key,
        "target": list(target),
        "reverse": reverse,
        "fractions": list(fractions),
        "seed": seed,
        "chunk_edges": chunk_edges,
        "known": True,  # a split written before it holds no known keys: written again
    }

    def check(split: PreparedGraph) -> None:  # what the sampler reads and trusts
        for stage in STAGES:
            pairs = f"{stage}/label_index"
            ids = [(pairs, split.tensor(pairs)[0], n_src), (pairs, split.tensor(pairs)[1], n_dst)]
            ids.append((f"{stage}/{key}/row", split.tensor(f"{stage}/{key}/row"), n_src))
            if reverse is not None:
                back = f"{stage}/{_key(reverse)}/row"
                ids.append((back, split.tensor(back), n_dst))
            for name, tensor, count in ids:
                for a in range(0, tensor.numel(), chunk_edges):
                    low, high = (int(v) for v in torch.aminmax(tensor[a : a + chunk_edges]))
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

    size = 3 * 16 * num_edges * (2 if reverse else 1) + 2 * 24 * num_edges + 3 * 8 * num_edges
    return prepare(out, source, fill, size, derived=True, verify=verify, check=check)


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
