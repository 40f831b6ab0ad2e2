"""Exact layer-wise inference over the whole graph, one layer at a time (PyG's ``inference``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric import nn as pyg_nn

from gnnscale.batch import LayerwiseBatch
from gnnscale.measure import trim_heap
from gnnscale.models import fast
from gnnscale.stores import reads


@torch.no_grad()
def layerwise_inference(
    gnn: pyg_nn.models.basic_gnn.BasicGNN,
    batch: LayerwiseBatch,
    device: torch.device | None = None,
    sparse: bool = False,
) -> Tensor:
    """Every node's output, one layer at a time over the whole graph (PyG's ``inference``).

    ``batch.loader`` yields every node's full one-hop neighbourhood, seeds first: ids and edges;
    the first layer gathers its input rows from ``batch.x`` (by the prepared graph's threads), in
    the parameters' dtype, and each later layer from the one before's output. As PyG's
    ``BasicGNN.inference``, but each layer computes only the batch's seeds (``conv((x,
    x[:seeds]), edges)``, as :func:`target_only`; PyG's computes every node of the batch and keeps
    the seeds) and writes them into one tensor for the layer; PyG's keeps a list of the batches'
    outputs and concatenates it, so two copies of the layer's output at the end and the heap
    cut into batch-sized blocks meanwhile. After each layer the heap's free pages go back to
    the system (:func:`gnnscale.measure.trim_heap`). Not after each batch: the next batch
    would fault its pages in afresh (on the neighbour recipe's 200k-node test, 1.9M page
    faults and 5.6 s of system time against 0.7M and 1.6 s), for no lower peak. Under DDP
    (``batch.shared``) each process computes its block of nodes and the processes sum each
    layer's outputs, by gloo (:func:`_cpu_group`), into every process's copy.

    ``sparse``: the convs aggregate a sparse adjacency (``fast.seeds_adjacency``; GraphSAGE's
    ``speed.sparse_aggregation``), not PyG's scatter over the edges, which copies a row per edge.
    Where the layer's input is in memory, on the model's device and in its dtype, the
    adjacency's columns are the graph's node ids: the product reads each batch's rows where
    they are, with no gathered copy of them (the neighbour recipe's 200k-node test: 3.75 s,
    then 2.15 s with the sparse product on gathered rows, 1.5 s in place).
    """
    dtype = next(gnn.parameters()).dtype
    x_all = batch.x
    group = _cpu_group() if batch.shared else None
    try:
        for i in range(gnn.num_layers):
            out: Tensor | None = None
            threads = batch.read_threads if i == 0 else 1
            in_place = sparse and _in_place(x_all, device, dtype if i == 0 else None, threads)
            for hop in batch.loader:
                if in_place:  # the product reads the batch's rows where they are: no copy
                    n_id, edges = hop.n_id.to(x_all.device), hop.edge_index.to(x_all.device)
                    edges = torch.stack([n_id[edges[0]], edges[1]])
                    edges = fast.seeds_adjacency(x_all, edges, hop.batch_size)
                    seeds = x_all.index_select(0, n_id[: hop.batch_size])
                    h = seeds_layer(gnn, i, x_all, edges, hop.batch_size, seeds)
                else:
                    if i == 0:
                        x = reads.gather(x_all, hop.n_id, threads).to(device, dtype)
                    else:
                        x = x_all.index_select(0, hop.n_id).to(device)  # 4x x_all[ids]
                    edges = hop.edge_index.to(device)
                    if sparse:
                        edges = fast.seeds_adjacency(x, edges, hop.batch_size)
                    h = seeds_layer(gnn, i, x, edges, hop.batch_size)
                    del x
                if out is None:
                    new = torch.zeros if batch.shared else torch.empty
                    out = new(x_all.size(0), h.size(-1), dtype=h.dtype)
                out[hop.n_id[: hop.batch_size]] = h.to(out.device)
                del h
            assert out is not None, "the loader yielded no batch"
            if batch.shared:  # each block from its process: one term of each sum is not zero
                dist.all_reduce(out, group=group)
            x_all = out
            trim_heap()  # the layer's blocks back to the system, not kept cut into the heap
    finally:
        if group is not None:
            dist.destroy_process_group(group)
    return x_all


def _in_place(
    x: Tensor, device: torch.device | None, dtype: torch.dtype | None, threads: int
) -> bool:
    """Whether a layer may read ``x``'s rows where they are.

    On ``device``, in ``dtype`` (none: any), and not a prepared graph's file read by threads,
    whose reads go out together rather than one page fault at a time.
    """
    on_device = device is None or torch.device(device).type == x.device.type
    return threads <= 1 and on_device and (dtype is None or x.dtype == dtype)


def _cpu_group() -> dist.ProcessGroup | None:
    """A group that sums CPU tensors: the default group if gloo, else a gloo group of its ranks.

    The layers' outputs stay in host memory (a large graph's would not fit a GPU), which NCCL,
    the default group's backend on GPUs, cannot reduce.
    """
    return None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")


def seeds_layer(
    gnn: pyg_nn.models.basic_gnn.BasicGNN,
    i: int,
    x: Tensor,
    edge_index: Any,
    num_seeds: int,
    x_seeds: Tensor | None = None,
) -> Tensor:
    """Layer ``i`` of ``gnn`` on a one-hop batch, for its first ``num_seeds`` nodes only.

    PyG's ``BasicGNN.inference_per_layer``, with a bipartite conv instead of a slice after it.
    ``x_seeds``: the seeds' rows, where ``x`` does not list them first (the whole input).
    """
    h = gnn.convs[i]((x, x[:num_seeds] if x_seeds is None else x_seeds), edge_index)
    last = gnn.num_layers - 1
    if i < last or gnn.jk_mode is not None:
        if gnn.act is not None and gnn.act_first:
            h = gnn.act(h)
        if gnn.norms is not None:
            h = gnn.norms[i](h)
        if gnn.act is not None and not gnn.act_first:
            h = gnn.act(h)
        if i == last and hasattr(gnn, "lin"):
            h = gnn.lin(h)
    return h
