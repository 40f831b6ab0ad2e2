"""Heterogeneous layers computed only for the rows the next layer reads: :func:`target_only`.

``HeteroSAGE``'s and ``LinkPredictor``'s default; the homogeneous fast paths are in
``gnnscale.models.fast``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.index import index2ptr
from torch_geometric.nn import SAGEConv
from torch_geometric.typing import EdgeType

__all__ = ["target_only"]


def target_only(
    encoder: nn.Module,
    x: dict[str, Tensor],
    edge_index: dict[EdgeType, Tensor],
    seeds: Mapping[str, int | Tensor],
    inputs: dict[str, Callable[[Tensor], Tensor]] | None = None,
    bucket_rows: int = 0,
) -> dict[str, Tensor]:
    """``encoder``'s output for each type's ``seeds`` rows, each layer on the rows read next.

    ``encoder`` is ``_SAGE`` made heterogeneous by ``to_hetero``; this runs its modules (its
    weights, a checkpoint's) as its own forward does, relations averaged per node type, but
    computes at each layer only the rows the next one reads, as gnnscale's homogeneous
    ``target_only`` does: the last layer the seeds, the layer before them and the sources of
    the seeds' edges, and so on. PyG's forward computes every sampled node at every layer,
    though a loss reads the seeds alone. Samplers list the nodes hop by hop, so a node
    classifier's rows are each a prefix of its type's, sliced; a link batch's hard negatives
    lie anywhere in it, so its rows are gathered, not every row up to the last one read.

    Args:
        encoder: The ``to_hetero`` module (``convs[i][src__rel__dst]``, ``dropout[type]``).
        x: Input rows per node type, every sampled node.
        edge_index: Local edges per relation.
        seeds: Output rows per node type: a count (the first rows; 0: none) or the rows'
            ids, sorted and unique; the output's rows are in that order.
        inputs: The input layers of the types whose ``x`` are raw features (on the CPU). The
            first layer then averages each relation's raw rows and projects the averages: a
            linear layer commutes with a mean, so the input layer runs on the rows the first
            layer outputs and on those averages, not on every sampled row (on a graph shaped
            like MAG240M, most rows of a batch are read by the first layer alone).
        bucket_rows: Round each layer's rows of every type up to a multiple of this (0: off)
            with zero rows that no edge reaches and no later layer reads, so that every
            product sees a few row counts (bf16 products on a CPU then reuse their oneDNN
            primitives: ``gnnscale.models.fast.bucket_size``).
    """
    convs = cast(list[nn.ModuleDict], encoder.convs)
    into: dict[str, int] = {}
    for _, _, dst in edge_index:
        into[dst] = into.get(dst, 0) + 1
    # Each layer's output rows and edges, last layer first: the seeds, then the rows the
    # edges into them read, and so on.
    rows = {
        t: torch.arange(s, device=x[t].device) if isinstance(s, int) else s
        for t, s in seeds.items()
    }
    layers = []
    for _ in convs:
        kept = {
            e: index[:, _member(index[1], rows.get(e[2]), x[e[2]])]
            for e, index in edge_index.items()
        }
        layers.append((rows, kept))
        rows = _with_sources(rows, kept, x)
    read: dict[str, Tensor] | None = None  # the rows this layer's input holds (None: all)
    for i, (conv, (rows, kept)) in enumerate(zip(convs, reversed(layers), strict=True)):
        first: dict[str, Callable[[Tensor], Tensor]] = (inputs or {}) if i == 0 else {}
        root = {t: _take(h, rows.get(t), None if read is None else read[t]) for t, h in x.items()}
        real = {t: h.size(0) for t, h in root.items()}
        if bucket_rows:
            root = {t: _padded(h, bucket_rows) for t, h in root.items()}
        root.update({t: project(root[t]) for t, project in first.items()})
        out: dict[str, Tensor] = {}
        for (src, rel, dst), index in kept.items():
            sage = cast(SAGEConv, conv["__".join((src, rel, dst))])
            local = (
                torch.stack(
                    [_at(None if read is None else read[src], index[0]), _at(rows[dst], index[1])]
                )
                if index.numel()
                else index
            )
            if src in first:  # SAGEConv's forward on the projected mean of the raw rows
                mean, any_edge = _mean_rows(x[src], local, root[dst].size(0))
                neighbours = first[src](mean) * any_edge.unsqueeze(1)  # no edge: PyG's zero
                h = sage.lin_l(neighbours) + sage.lin_r(root[dst])
            else:
                h = sage((x[src], root[dst]), local)
            out[dst] = h if dst not in out else out[dst] + h
        x = {t: h[: real[t]] / into[t] for t, h in out.items()}
        read = {t: rows.get(t, _none(h)) for t, h in x.items()}
        if i < len(convs) - 1:
            dropout = cast(nn.ModuleDict, encoder.dropout)
            x = {t: dropout[t](h.relu()) for t, h in x.items()}
    return x


def _none(like: Tensor) -> Tensor:
    return torch.zeros(0, dtype=torch.long, device=like.device)


def _padded(h: Tensor, multiple: int) -> Tensor:
    """``h`` with zero rows appended, up to a multiple of ``multiple`` rows."""
    extra = -h.size(0) % multiple
    return F.pad(h, (0, 0, 0, extra)) if extra else h


def _prefix(rows: Tensor) -> bool:
    """Whether sorted, unique ``rows`` are ``0, 1, ..., len - 1``."""
    return not rows.numel() or int(rows[-1]) == rows.numel() - 1


def _at(rows: Tensor | None, ids: Tensor) -> Tensor:
    """Where ``ids`` lie in sorted, unique ``rows`` (``None``: every row; ``ids`` are places)."""
    return ids if rows is None or _prefix(rows) else torch.searchsorted(rows, ids)


def _take(h: Tensor, rows: Tensor | None, read: Tensor | None) -> Tensor:
    """The ``rows`` of ``h``, whose own rows are ``read`` (``None``: every row)."""
    if rows is None:
        return h[:0]
    return h[: rows.numel()] if _prefix(rows) else h[_at(read, rows)]


def _member(ids: Tensor, rows: Tensor | None, x: Tensor) -> Tensor:
    """Which ``ids`` are among ``rows`` (of a type with ``x``'s rows)."""
    if rows is None:
        return torch.zeros_like(ids, dtype=torch.bool)
    if _prefix(rows):
        return ids < rows.numel()
    return _marked(x, [rows])[ids]


def _marked(x: Tensor, parts: list[Tensor]) -> Tensor:
    """A flag per row of ``x``, set at the ids in ``parts``."""
    flags = torch.zeros(x.size(0), dtype=torch.bool, device=x.device)
    for ids in parts:
        flags[ids] = True
    return flags


def _with_sources(
    rows: dict[str, Tensor], kept: dict[EdgeType, Tensor], x: dict[str, Tensor]
) -> dict[str, Tensor]:
    """``rows`` and the sources of the ``kept`` edges, per type: the layer before's outputs."""
    out = dict(rows)
    for t in {src for src, _, _ in kept}:
        sources = [index[0] for (src, _, _), index in kept.items() if src == t and index.numel()]
        if sources:
            out[t] = _marked(x[t], [rows[t], *sources] if t in rows else sources).nonzero().view(-1)
    return out


def _mean_rows(x: Tensor, index: Tensor, rows: int) -> tuple[Tensor, Tensor]:
    """Each of the first ``rows`` targets' mean of ``x`` over its edges, and whether it has any.

    A sparse product (no copy of a row per edge); ``index`` holds sources, then targets.
    """
    src, dst = index
    if dst.numel() and not bool((dst[1:] >= dst[:-1]).all()):
        order = torch.argsort(dst, stable=True)
        src, dst = src[order], dst[order]
    rowptr = index2ptr(dst, rows)
    ones = torch.ones(src.numel(), dtype=x.dtype)
    adjacency = torch.sparse_csr_tensor(rowptr, src, ones, size=(rows, x.size(0)))
    return torch.sparse.mm(adjacency, x, reduce="mean"), rowptr.diff() > 0
