"""The sparse adjacency that batches are aggregated with: one backend choice, in one place.

The loaders' workers (``gnnscale.data.layout``: the first layer's aggregation) and the models'
fast paths (``gnnscale.models.fast``: the layers' sparse aggregation) build a batch's adjacency
here, and PyG's ``spmm`` (in its convs, or called directly) runs the product on whichever form
:func:`csr_adjacency` chose. Neither side imports the other.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch_geometric.typing
from torch import Tensor
from torch_geometric.typing import SparseTensor

__all__ = ["csr_adjacency", "torch_sparse_runs_on", "valued_as"]

warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta", UserWarning)
warnings.filterwarnings("ignore", "Sparse invariant checks are implicitly disabled", UserWarning)


def torch_sparse_runs_on(device_type: str) -> bool:
    """Whether torch-sparse is installed with kernels for this device type.

    A torch-sparse built without CUDA (``pip install torch-sparse`` where no CUDA compiler is
    found) still samples on the CPU, but its ``SparseTensor`` products raise "Not compiled with
    CUDA support" on a GPU batch: there the adjacency is a ``torch.sparse`` tensor instead.
    """
    if not torch_geometric.typing.WITH_TORCH_SPARSE:
        return False
    if device_type == "cpu":
        return True
    return device_type == "cuda" and int(torch.ops.torch_sparse.cuda_version()) != -1


def csr_adjacency(
    x: Tensor, edge_index: Tensor, rowptr: Tensor, num_dst: int, num_edges: int
) -> Any:
    """The first ``num_dst`` rows of a batch's CSR adjacency (columns: ``x``'s rows), uncopied.

    torch-sparse's ``SparseTensor`` where it runs on ``x``'s device, else on the CPU a
    ``torch.sparse`` CSR tensor: the ``adj_t`` PyG's convs aggregate with a sparse-dense product.
    On a GPU without torch-sparse's CUDA kernels, the edges themselves (PyG's scatter): cuSPARSE
    needs one dtype for both operands, and under autocast a later layer's rows are bf16 or fp16
    while the adjacency's values stay fp32 ("data type combination not supported").

    Args:
        x: The rows the adjacency's columns index (its dtype and device are the values').
        edge_index: Edges sorted by target; row 0 holds the sources (``x``'s rows).
        rowptr: The CSR row pointer of the edges' targets.
        num_dst: The targets: the adjacency's rows, a prefix of ``rowptr``'s.
        num_edges: The edges into those targets, a prefix of ``edge_index``'s.
    """
    num_src = x.size(0)
    rowptr, col = rowptr[: num_dst + 1], edge_index[0, :num_edges]
    if torch_sparse_runs_on(col.device.type):
        return SparseTensor(
            rowptr=rowptr,
            col=col,
            sparse_sizes=(num_dst, num_src),
            is_sorted=True,
            trust_data=True,
        )
    if col.device.type != "cpu":  # PyG's scatter over the edges
        return edge_index[:, :num_edges]
    ones = torch.ones(num_edges, dtype=x.dtype, device=col.device)
    return torch.sparse_csr_tensor(rowptr, col, ones, size=(num_dst, num_src))


def valued_as(adj: Any, x: Tensor) -> Any:
    """``adj`` (from :func:`csr_adjacency`) with values of ``x``'s dtype, for a product with ``x``.

    A ``torch.sparse`` tensor's values are one dtype, and its product needs ``x``'s: under
    autocast a later layer's rows are bf16 where the first layer's were fp32. torch-sparse's
    ``SparseTensor`` and an edge list carry no values and come back as they are.
    """
    if isinstance(adj, Tensor) and adj.layout == torch.sparse_csr and adj.dtype != x.dtype:
        return adj.to(x.dtype)
    return adj
