"""What the loaders' workers add to a batch before it reaches the model: its ``layout``.

Each transform here sets ``batch.layout`` (``gnnscale.batch``: :class:`HopLayout` for neighbour
batches, :class:`SubgraphLayout` for Cluster-GCN and GraphSAINT) and, asked for it, the first
layer's aggregation and the adjacency's transpose; the DataModules pick them from the model's
``BatchRequest``.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.index import index2ptr
from torch_geometric.utils import spmm

from gnnscale.batch import HopLayout, SubgraphLayout
from gnnscale.sparse import csr_adjacency


def sort_by_target(batch: Data) -> Tensor:
    """Sort a batch's edges by target node in place; return their CSR row pointer.

    Edges already in target order (as neighbour samplers list them) are not moved; edge
    attributes follow their edges.

    Args:
        batch: Any batch with ``edge_index``.
    """
    dst = batch.edge_index[1]
    if dst.numel() and not bool((dst[1:] >= dst[:-1]).all()):
        perm = torch.argsort(dst, stable=True)
        for key, value in batch.items():
            if isinstance(value, Tensor) and batch.is_edge_attr(key):
                batch[key] = value[:, perm] if key == "edge_index" else value[perm]
    return index2ptr(batch.edge_index[1], batch.num_nodes)


def subgraph_layout(batch: Data) -> Data:
    """Cluster-GCN and GraphSAINT batches' transform: a :class:`SubgraphLayout`.

    Args:
        batch: A sampled subgraph.
    """
    batch.layout = SubgraphLayout(sort_by_target(batch))
    return batch


def hop_layout(
    batch: Data,
    num_layers: int,
    first_layer_aggr: str | None = None,
    features: Tensor | None = None,
) -> Data:
    """Lay a neighbour batch out for target-only layers: a :class:`HopLayout` in ``batch.layout``.

    The loaders run this in their workers. The layout holds the nodes and edges each hop
    sampled (pyg-lib reports them, torch-sparse does not) and the CSR row pointer of the edges,
    sorted by target (:func:`sort_by_target`). Both backends list a batch's nodes hop by hop, seeds
    first; with the edges sorted by target, the edges into the first ``n`` nodes are the first
    ``rowptr[n]``, and their sources lie one hop further out at most. So each layer reads a
    prefix of the nodes and of the edges, and ``rowptr[: n + 1]`` is its sparse adjacency.

    Args:
        batch: A neighbour-sampled batch (seed nodes first, then each hop's new nodes).
        num_layers: Hops sampled (entries of ``num_neighbors``).
        first_layer_aggr: Also aggregate the first layer's neighbour features here, with this
            reduction (:func:`aggregate_first_layer`); none: the model does.
        features: With ``first_layer_aggr``, the whole graph's feature matrix, when the loader
            gathered no ``x`` (:func:`aggregate_first_layer`).
    """
    rowptr = sort_by_target(batch)
    nodes, edges = batch.get("num_sampled_nodes"), batch.get("num_sampled_edges")
    if nodes is None or edges is None:  # torch-sparse does not report them: one BFS here
        src, dst = batch.edge_index
        hop = torch.full((batch.num_nodes,), num_layers + 1, dtype=torch.long)
        hop[: batch.batch_size] = 0
        for k in range(1, num_layers + 1):
            reached = src[hop[dst] == k - 1]
            hop[reached[hop[reached] > k]] = k
        nodes = torch.bincount(hop, minlength=num_layers + 1).tolist()
        edges = torch.bincount(hop[dst], minlength=num_layers).tolist()[:num_layers]
    batch.layout = HopLayout(list(nodes), list(edges), rowptr)
    if first_layer_aggr is not None:
        batch = aggregate_first_layer(batch, first_layer_aggr, features)
    return batch


def aggregate_first_layer(batch: Data, aggr: str, features: Tensor | None = None) -> Data:
    """Aggregate a neighbour batch's raw features for the first layer, and keep what is read.

    A GraphSAGE layer computes ``lin_l(aggr(x_j for j in N(i))) + lin_r(x_i)``. On the raw
    features the aggregation has no parameters and needs no gradient, so the loader's worker
    can compute it (the same sparse-dense product the layer would run, as ``x_aggr``) for the
    first layer's targets, hops ``0..L-1``. The training step then reads only those rows: the
    batch keeps their features and labels and the edges into hops ``0..L-2``, which the later
    layers read; the outermost hop's rows and edges stay in the worker. On a [15, 10] batch of
    1,024 seeds, 2 x 10,800 rows travel to the model instead of 62,850.

    Given ``features`` (the whole graph's, in memory, float32 or float64), the loader gathered
    no ``x``: the product reads the neighbours' rows where they lie (the adjacency's columns are
    the nodes' ids, ``batch.n_id``), and only the targets' rows are gathered. Gathering the
    sample's 62,850 rows first (25 MB a batch, read once) made neighbor_sage's fp32 epoch
    1.07x as long.

    The layout's ``num_sampled_nodes`` and ``num_sampled_edges`` still describe the whole
    sample. Features stored in half precision are aggregated in float32, as the model would
    after its cast.

    Args:
        batch: A batch laid out by :func:`hop_layout`.
        aggr: The first layer's reduction: ``mean``, ``sum``, ``max`` or ``min``.
        features: The whole graph's feature matrix, if ``batch`` holds no ``x``.
    """
    layout = batch.layout
    nodes, edges = layout.num_sampled_nodes, layout.num_sampled_edges
    num_dst, num_edges = sum(nodes[:-1]), sum(edges)
    if features is not None:  # columns: node ids; only the targets' rows are gathered
        x, sources = features, batch.n_id.index_select(0, batch.edge_index[0, :num_edges])
        batch.x = features.index_select(0, batch.n_id[:num_dst])  # 4x x[ids] on CPU here
    else:
        x = batch.x if batch.x.dtype in (torch.float32, torch.float64) else batch.x.float()
        sources = batch.edge_index[0, :num_edges]
    adj = csr_adjacency(x, sources.unsqueeze(0), layout.rowptr, num_dst, num_edges)
    x_aggr = spmm(adj, x, reduce=aggr)
    kept_nodes, kept_edges = sum(nodes[:-2]), sum(edges[:-1])  # what layers 2..L read
    tensors = {k: v for k, v in batch.items() if isinstance(v, Tensor)}
    on_edges = {k for k in tensors if batch.is_edge_attr(k)}  # before any is cut
    on_nodes = {k for k in tensors if batch.is_node_attr(k)}
    for key, value in tensors.items():
        if key == "edge_index":
            batch[key] = value[:, :kept_edges]
        elif key in on_edges:
            batch[key] = value[:kept_edges]
        elif key in on_nodes:
            batch[key] = value[:num_dst]
    batch.num_nodes = num_dst
    batch.layout = layout._replace(rowptr=layout.rowptr[: kept_nodes + 1], x_aggr=x_aggr)
    return batch
