"""GraphSAGE and GATv2 node classifiers as LightningModules, on PyG's own layers.

Both take any batch of the gnnscale contract (``x``, ``edge_index``, ``y``, ``loss_weight``) and
never ask which sampler made it. GATv2 attention is computed per edge (PyG's ``GATv2Conv``), so
its memory is O(E * heads), never a dense N x N tensor.

What gnnscale adds to PyG's models, for speed (measured in ``benchmarks/roofline.py``):

- On neighbour batches each layer computes only the rows the next layer (or the loss) reads,
  as GraphSAGE is defined (``conv((x, x[:num_targets]), edges)``): :func:`target_only`.
- GraphSAGE aggregates with a sparse-dense product on a CSR adjacency the loader's worker
  built (``gnnscale.data.csr_layout``), not a scatter: neighbour, Cluster-GCN and SAINT batches.
- On neighbour batches GraphSAGE's first layer takes its aggregation of the raw features from
  the loader's worker (``gnnscale.data.aggregate_first_layer``): one matrix product in the step.
- GraphSAGE's sparse mean (or sum) takes its backward from the adjacency's transpose, which
  the loader's worker sorts (``gnnscale.data.csc_layout``), not torch's backward, which sorts
  the edges again on every step: :class:`_SparseMean`.
- :class:`Dropout` draws its CPU mask from 1, 8 or 16 random bits an element, in one pass with
  the ReLU before it.
- Cluster-GCN and GraphSAINT batches are padded to a few row counts (``bucket_rows``), each
  norm taking its statistics from the real rows only: :func:`padded_forward`.
- The targets' rows of a layer's input get their two gradients (as sources and as the root
  term) added in place, not through a zero-filled slice gradient.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor
from torch_geometric import nn as pyg_nn
from torch_geometric.data import Data
from torchmetrics.classification import MulticlassAccuracy

from gnnscale.data import LayerwiseBatch, csr_adjacency
from gnnscale.errors import ConfigError, TrainingDiverged
from gnnscale.measure import trim_heap

__all__ = [
    "Dropout",
    "GATv2",
    "GraphSAGE",
    "NodeClassifier",
    "layerwise_inference",
    "padded_forward",
    "target_only",
]


# The default optimizer (``optimizer: null``): Adam with the GAT paper's learning rate and weight
# decay. torch's Adam defaults (lr 1e-3, no decay) left both models 1-2 points short on Cora.
_ADAM_LR = 0.005
_ADAM_WEIGHT_DECAY = 5e-4


def _hops(
    batch: Data,
) -> tuple[
    list[int] | None, list[int] | None, Tensor | None, Tensor | None, tuple[Tensor, Tensor] | None
]:
    """A batch's layout, first-layer aggregate and transposed adjacency (``gnnscale.data``)."""
    csc = (batch.colptr, batch.csc_row) if "colptr" in batch else None
    return (
        batch.get("num_sampled_nodes"),
        batch.get("num_sampled_edges"),
        batch.get("rowptr"),
        batch.get("x_aggr"),
        csc,
    )


def _check_probabilities(**values: float) -> None:
    """Refuse a dropout rate outside [0, 1], naming its flag (before PyG builds anything)."""
    for name, p in values.items():
        if not 0 <= p <= 1:
            raise ConfigError(f"--model.{name} must be in [0, 1] (got {p})")


class Dropout(torch.nn.Module):
    """``torch.nn.Dropout`` with a cheaper mask on the CPU; ``F.dropout`` elsewhere.

    PyTorch's CPU dropout draws one Bernoulli variate per element (``bernoulli_``), which took
    longer than the layer's matrix product. Here an element's mask comes from 1, 8 or 16 random
    bits: for p = 0.5 one bit is the mask (``numpy.unpackbits``); else an element is kept when
    8 bits (if ``(1 - p) * 2**8`` is a whole number) or 16 fall below
    ``k = round((1 - p) * 2**bits)``. Kept values are scaled by ``2**bits / k``. The output is
    unbiased exactly; the rate is ``p`` exactly with 1 or 8 bits and within ``2**-17`` of it
    with 16. The comparison writes bytes (or the input's dtype) straight away: a boolean mask
    multiplied into bfloat16 took longer than the multiply.

    ``forward(x, relu=True)`` applies a ReLU in the same pass and saves only its output, which
    the next layer saves anyway: ReLU's backward (``output > 0``) then also covers the mask.

    Args:
        p: Probability of zeroing an element.
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        _check_probabilities(dropout=p)
        self.p = p

    def forward(self, x: Tensor, relu: bool = False) -> Tensor:
        """Zero elements of ``x`` (after a ReLU if ``relu``) at rate ``p``, scale the rest."""
        bits = next(b for b in (1, 8, 16) if ((1 - self.p) * 2**b).is_integer() or b == 16)
        keep = round((1 - self.p) * 2**bits)
        if not self.training or keep == 2**bits:
            return F.relu(x) if relu else x
        if x.device.type != "cpu" or keep == 0:
            return F.dropout(F.relu(x) if relu else x, self.p, training=True)
        scale = 2**bits / keep
        if relu:
            return _ReluMaskedScale.apply(x, _keep_mask(x.shape, bits, keep, x.dtype), scale)
        return _MaskedScale.apply(x, _keep_mask(x.shape, bits, keep, torch.uint8), scale)

    def extra_repr(self) -> str:
        """Shown in the model's printout."""
        return f"p={self.p}"


@torch.compiler.disable  # numpy's bits, not a graph to trace
def _keep_mask(shape: torch.Size, bits: int, keep: int, dtype: torch.dtype) -> Tensor:
    """1 where an element is kept, else 0, in ``dtype``: see :class:`Dropout`."""
    numel = shape.numel()
    words = _random_words((numel * bits + 63) // 64)
    if bits == 1:  # each bit is an element's mask: 1/8 of the random words, no comparison
        unpacked = np.unpackbits(words.numpy().view(np.uint8), count=numel)
        return torch.from_numpy(unpacked).view(shape).to(dtype)
    if bits == 8:
        draws, below = words.view(torch.uint8), keep
    else:  # torch compares int16, not uint16: shift the threshold
        draws, below = words.view(torch.int16), keep - 2**15
    return torch.lt(draws[:numel].view(shape), below, out=torch.empty(shape, dtype=dtype))


def _random_words(count: int) -> Tensor:
    """``count`` random 64-bit words from numpy's PCG64, seeded from torch's generator.

    PCG64 drew them twice as fast as torch's CPU generator (``random_``) here; the seed comes
    from torch, so ``seed_everything`` still decides every mask.
    """
    seed = int(torch.randint(2**62, ()).item())
    return torch.from_numpy(np.random.PCG64(seed).random_raw(count).view(np.int64))


class _MaskedScale(torch.autograd.Function):
    """``x * mask * scale``, saving only the byte mask for backward (as ``F.dropout`` does)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, mask: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return (x * mask.to(x.dtype)).mul_(scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (mask,) = ctx.saved_tensors
        return (grad * mask.to(grad.dtype)).mul_(ctx.scale), None, None


class _ReluMaskedScale(torch.autograd.Function):
    """``relu(x) * mask * scale``, saving only the output: its zeros are ReLU's and the mask's."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, mask: Tensor, scale: float) -> Tensor:
        out = torch.addcmul(x.new_zeros(()), torch.relu(x), mask, value=scale)  # one pass
        ctx.save_for_backward(out)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (out,) = ctx.saved_tensors
        return torch.ops.aten.threshold_backward(grad, out, 0).mul_(ctx.scale), None, None


def _round_up(count: int, multiple: int) -> int:
    return -(-count // multiple) * multiple


def _with_empty_rows(rowptr: Tensor, count: int) -> Tensor:
    """A CSR row pointer with ``count`` rows without edges appended."""
    return torch.cat([rowptr, rowptr[-1:].expand(count)])


def _pad_rows(x: Tensor, rowptr: Tensor, multiple: int) -> tuple[Tensor, Tensor]:
    """``x`` and its CSR row pointer with zero rows without edges, up to a multiple of rows.

    Every layer of a subgraph batch then has a few row counts, so bf16 products on CPU reuse
    a few oneDNN primitives instead of building one for every batch's node count. The added
    rows read nothing and nothing reads them; their outputs are cut off.
    """
    extra = _round_up(x.size(0), multiple) - x.size(0)
    if not extra:
        return x, rowptr
    return F.pad(x, (0, 0, 0, extra)), _with_empty_rows(rowptr, extra)


class _SourcesAndTargets(torch.autograd.Function):
    """``(x, x[:num_targets])`` whose backward adds the targets' gradient into the sources'.

    Autograd's own slice would materialise a zero ``x``-sized gradient for ``x[:num_targets]``
    and add it to the sources' gradient: two passes over the widest tensor of the backward.
    The sources' gradient arrives fresh from the aggregation's backward (a sparse product or
    scatter, which the conv alone reads), so it takes the targets' rows in place.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, num_targets: int) -> tuple[Tensor, Tensor]:
        ctx.num_targets, ctx.like = num_targets, (x.shape, x.dtype, x.device)
        return x.view_as(x), x[:num_targets]

    @staticmethod
    def backward(ctx: Any, grad_src: Tensor | None, grad_dst: Tensor | None) -> tuple[Any, None]:
        if grad_src is None:
            shape, dtype, device = ctx.like
            grad_src = torch.zeros(shape, dtype=dtype, device=device)
        if grad_dst is not None:
            grad_src[: ctx.num_targets] += grad_dst
        return grad_src, None


def target_only(
    gnn: pyg_nn.models.basic_gnn.BasicGNN,
    x: Tensor,
    edge_index: Tensor,
    num_sampled_nodes: list[int],
    num_sampled_edges: list[int],
    rowptr: Tensor | None = None,
    bucket_rows: int = 0,
    x_aggr: Tensor | None = None,
    csc: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """``gnn``'s forward on a neighbour batch, each layer computing only what is read next.

    Layer ``i`` of ``L`` reads the nodes of hops ``0..L-i`` and the edges into hops
    ``0..L-i-1``, and outputs rows for hops ``0..L-i-1`` only (a bipartite conv, sources and
    targets). The last layer outputs the seeds' rows. PyG's ``trim_to_layer`` drops rows only
    after a layer computed them: on a [15, 10] batch of 1,024 seeds the first layer then
    produced (and dropped out) 62,850 rows where the second reads 10,800.

    Args:
        gnn: A PyG ``BasicGNN`` whose convs accept ``(x_src, x_dst)`` pairs.
        x: Node features, hop by hop (seeds first).
        edge_index: Edges sorted by target (``gnnscale.data.hop_layout``).
        num_sampled_nodes: Nodes per hop, seeds first.
        num_sampled_edges: Edges per hop.
        rowptr: The CSR row pointer of ``edge_index``'s targets: given, layers aggregate with a
            sparse-dense product, else with PyG's scatter over ``edge_index``.
        bucket_rows: Round each hidden layer's rows up to a multiple of this (0: off), as rows
            without edges whose outputs nothing reads: matrix products then see a few shapes,
            and oneDNN (bf16 on CPU) reuses a primitive per shape instead of building one for
            every batch.
        x_aggr: The first layer's aggregated neighbour features, computed by the loader
            (``gnnscale.data.aggregate_first_layer``; ``gnn`` a GraphSAGE): ``x`` then holds
            the first layer's targets only, and the layer is one matrix product.
        csc: The transpose of ``edge_index``'s adjacency (``gnnscale.data.csc_layout``): a
            GraphSAGE layer that reads every edge of the batch takes its aggregation's backward
            from it (:class:`_SparseMean`).
    """
    num_layers, xs = len(gnn.convs), []
    for i, (conv, norm) in enumerate(zip(gnn.convs, gnn.norms, strict=True)):
        num_dst = sum(num_sampled_nodes[: num_layers - i])
        num_edges = sum(num_sampled_edges[: num_layers - i])
        layer_rowptr = None if rowptr is None else rowptr[: num_dst + 1]
        aggregated = i == 0 and x_aggr is not None
        if bucket_rows and i < num_layers - 1:  # the last layer's rows are the loss's seeds
            padded = _round_up(num_dst, bucket_rows)
            if not aggregated:  # rows of x past the targets, never beyond them
                padded = min(padded, x.size(0))
            if layer_rowptr is not None:  # the added rows have no edges
                layer_rowptr = _with_empty_rows(layer_rowptr, padded - num_dst)
            num_dst = padded
        if aggregated:
            assert x_aggr is not None
            x = _sage_on_aggregated(conv, x_aggr, x, num_dst)
        else:
            pair = _SourcesAndTargets.apply(x, num_dst)
            if layer_rowptr is None:
                x = conv(pair, edge_index[:, :num_edges])
            elif csc is not None and num_edges == edge_index.size(1) and _takes_csc(conv, x):
                x = _sage_conv(conv, pair, layer_rowptr, edge_index[0], csc)
            else:
                x = conv(pair, csr_adjacency(x, edge_index, layer_rowptr, num_dst, num_edges))
        if i < num_layers - 1 or gnn.jk_mode is not None:  # as BasicGNN.forward
            x = _between_layers(gnn, norm, x, x.size(0))
            xs.append(x)
    if hasattr(gnn, "jk"):  # PyG's "last" needs none
        x = gnn.jk(xs)
    return gnn.lin(x) if hasattr(gnn, "lin") else x


def _between_layers(
    gnn: pyg_nn.models.basic_gnn.BasicGNN, norm: torch.nn.Module, x: Tensor, num_rows: int
) -> Tensor:
    """Activation, norm and dropout after a hidden layer, as ``BasicGNN.forward``.

    A norm sees only the first ``num_rows`` rows (the rest are padding, left as they are):
    its batch statistics and running averages are those of the real rows. ReLU then
    gnnscale's Dropout with no norm between them run in one pass (see Dropout's forward).
    """
    no_norm = isinstance(norm, torch.nn.Identity)
    if no_norm and isinstance(gnn.act, torch.nn.ReLU) and isinstance(gnn.dropout, Dropout):
        return gnn.dropout(x, relu=True)
    if gnn.act is not None and gnn.act_first:
        x = gnn.act(x)
    if not no_norm:
        padding = x.size(0) - num_rows
        x = F.pad(norm(x[:num_rows]), (0, 0, 0, padding)) if padding else norm(x)
    if gnn.act is not None and not gnn.act_first:
        x = gnn.act(x)
    return gnn.dropout(x)


def padded_forward(
    gnn: pyg_nn.models.basic_gnn.BasicGNN,
    x: Tensor,
    adj: Any,
    num_rows: int,
    csc: tuple[Tensor, Tensor, Tensor, Tensor] | None = None,
) -> Tensor:
    """``gnn``'s forward on a subgraph whose rows past ``num_rows`` are padding.

    The padded rows have no edges, so no real row reads them; each norm sees only the real
    rows (:func:`_between_layers`). Cluster-GCN and GraphSAINT batches are padded to a few row
    counts so that bf16 products on CPU reuse their oneDNN primitives (``bucket_rows``).
    Given ``csc`` (``rowptr``, ``col``, and the transpose's ``colptr``, ``csc_row``), GraphSAGE
    layers take their aggregation's backward from the transpose (:class:`_SparseMean`).
    """
    xs = []
    for i, (conv, norm) in enumerate(zip(gnn.convs, gnn.norms, strict=True)):
        if csc is not None and _takes_csc(conv, x):
            x = _sage_conv(conv, (x, x), csc[0], csc[1], csc[2:])
        else:
            x = conv(x, adj)
        if i < gnn.num_layers - 1 or gnn.jk_mode is not None:  # as BasicGNN.forward
            x = _between_layers(gnn, norm, x, num_rows)
            xs.append(x)
    if hasattr(gnn, "jk"):  # PyG's "last" needs none
        x = gnn.jk(xs)
    return gnn.lin(x) if hasattr(gnn, "lin") else x


def _sage_on_aggregated(conv: Any, x_aggr: Tensor, x: Tensor, rows: int) -> Tensor:
    """A ``SAGEConv`` given its aggregate: ``lin_l(x_aggr) + lin_r(x)`` as one matrix product.

    The two inputs go side by side into one buffer of ``rows`` rows (rows past ``x``'s are
    zeros, as :func:`_pad_rows`), in the product's dtype (bfloat16 under autocast: the copy is
    the cast autocast would make), against the two weights side by side.
    """
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    width = x_aggr.size(1)
    inputs = torch.empty((rows, width + x.size(1)), dtype=dtype, device=x.device)
    inputs[: x.size(0), :width] = x_aggr
    inputs[: x.size(0), width:] = x
    inputs[x.size(0) :] = 0
    weight = torch.cat([conv.lin_l.weight, conv.lin_r.weight], dim=1)
    out = F.linear(inputs, weight, conv.lin_l.bias)
    _call_forward_hooks(conv, (x_aggr, x), out[: x.size(0)])
    return out


def _takes_csc(conv: Any, x: Tensor) -> bool:
    """Whether :func:`_sage_conv` computes ``conv``: a CPU ``SAGEConv`` with mean or sum.

    Measured on CPUs only; on GPUs PyG's path runs.
    """
    return (
        x.device.type == "cpu"
        and isinstance(conv, pyg_nn.SAGEConv)
        and conv.aggr in ("mean", "sum")
        and not conv.project
    )


def _sage_conv(
    conv: Any, x: tuple[Tensor, Tensor], rowptr: Tensor, col: Tensor, csc: tuple[Tensor, Tensor]
) -> Tensor:
    """``conv(x, adj)`` for a ``SAGEConv``, as PyG computes it, with :class:`_SparseMean`.

    The aggregation's backward multiplies by the batch's transposed adjacency ``csc``.
    ``rowptr`` and ``col`` are the adjacency's CSR, every edge of the batch (``col``: the
    sources); rows of ``x[0]`` past ``colptr``'s are padding, without edges.
    """
    colptr, csc_row = csc
    src, dst = x
    extra = src.size(0) + 1 - colptr.numel()  # padded source rows have no edges
    if extra:
        colptr = _with_empty_rows(colptr, extra)
    aggr = _SparseMean.apply(src, rowptr, col, colptr, csc_row, conv.aggr)
    out = conv.lin_l(aggr)
    if conv.root_weight:
        out = out + conv.lin_r(dst)
    if conv.normalize:
        out = F.normalize(out, p=2.0, dim=-1)
    _call_forward_hooks(conv, (x, None), out)
    return out


class _SparseMean(torch.autograd.Function):
    """Each target's mean (or sum) of its sources' rows: ``torch.sparse.mm`` on the batch's CSR.

    Forward as PyG's ``spmm``. The backward multiplies the output's gradient (divided by each
    target's degree, for the mean) by the transposed adjacency (``colptr``, ``csc_row``) that the
    loader's worker built (``gnnscale.data.csc_layout``); torch's own backward of the product
    sorts the edges by source again on every step (README's ``roofline`` block times the step
    both ways).
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        rowptr: Tensor,
        col: Tensor,
        colptr: Tensor,
        csc_row: Tensor,
        reduce: str,
    ) -> Tensor:
        ones = torch.ones(col.numel(), dtype=x.dtype, device=x.device)
        adj = torch.sparse_csr_tensor(rowptr, col, ones, size=(rowptr.numel() - 1, x.size(0)))
        ctx.save_for_backward(rowptr, colptr, csc_row)
        ctx.reduce = reduce
        return torch.sparse.mm(adj, x, reduce)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None, None
        rowptr, colptr, csc_row = ctx.saved_tensors
        if ctx.reduce == "mean":
            grad = grad / rowptr.diff().clamp(min=1).unsqueeze(1)
        ones = torch.ones(csc_row.numel(), dtype=grad.dtype, device=grad.device)
        size = (colptr.numel() - 1, rowptr.numel() - 1)
        adj_t = torch.sparse_csr_tensor(colptr, csc_row, ones, size=size)
        return torch.sparse.mm(adj_t, grad.contiguous(), "sum"), None, None, None, None, None


def _call_forward_hooks(module: torch.nn.Module, args: tuple, out: Tensor) -> None:
    """Show ``module``'s forward hooks an output computed without calling it.

    Monitoring (``gnnscale.MonitorCallback``) and explanation tools hook the convs; their
    hooks see the layer's output rows as if the conv had run (what they return is ignored).
    """
    for key, hook in module._forward_hooks.items():
        if key in module._forward_hooks_with_kwargs:
            hook(module, args, {}, out)
        else:
            hook(module, args, out)


@torch.no_grad()
def layerwise_inference(
    gnn: pyg_nn.models.basic_gnn.BasicGNN, loader: Any, device: torch.device | None = None
) -> Tensor:
    """Every node's output, one layer at a time over the whole graph (PyG's ``inference``).

    ``loader`` yields every node's full one-hop neighbourhood, seeds first. As PyG's
    ``BasicGNN.inference``, but each layer computes only the batch's seeds (``conv((x,
    x[:seeds]), edges)``, as :func:`target_only`; PyG's computes every node of the batch and keeps
    the seeds) and writes them into one tensor for the layer; PyG's keeps a list of the batches'
    outputs and concatenates it, so two copies of the layer's output at the end and the heap
    cut into batch-sized blocks meanwhile. After each batch the heap's free pages go back to
    the system (:func:`gnnscale.measure.trim_heap`): batches of varying size would otherwise
    grow it above what the speed-first allocator setting keeps for training.
    """
    x_all = loader.data.x
    for i in range(gnn.num_layers):
        out: Tensor | None = None
        for batch in loader:
            x = x_all[batch.n_id].to(device)
            h = seeds_layer(gnn, i, x, batch.edge_index.to(device), batch.batch_size)
            if out is None:
                out = torch.empty(x_all.size(0), h.size(-1), dtype=h.dtype)
            out[batch.n_id[: batch.batch_size]] = h.to(out.device)
            del x, h
            trim_heap()  # the batch's blocks back to the system, not cut into the heap
        assert out is not None, "the loader yielded no batch"
        x_all = out
    return x_all


def seeds_layer(
    gnn: pyg_nn.models.basic_gnn.BasicGNN, i: int, x: Tensor, edge_index: Tensor, num_seeds: int
) -> Tensor:
    """Layer ``i`` of ``gnn`` on a one-hop batch, for its first ``num_seeds`` nodes only.

    PyG's ``BasicGNN.inference_per_layer``, with a bipartite conv instead of a slice after it.
    """
    h = gnn.convs[i]((x, x[:num_seeds]), edge_index)
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


class NodeClassifier(L.LightningModule):
    """Training, evaluation and optimisation shared by the gnnscale models.

    Subclass it for a model of your own (set ``self.gnn`` to a PyG ``BasicGNN``, or override
    ``forward``); ``gnnscale fit`` accepts any subclass as ``model.class_path``.
    """

    gnn: pyg_nn.models.basic_gnn.BasicGNN

    def __init__(
        self,
        num_classes: int,
        num_layers: int,
        optimizer: OptimizerCallable | None = None,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ConfigError(f"--model.num_layers must be >= 1 (got {num_layers})")
        self.num_layers = num_layers
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        # torchmetrics accumulates correct/total counts, so DDP reduces counts, not ratios.
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")

    # Set by the models whose layers take (source, target) pairs; see :func:`target_only`.
    target_only_layers = False
    sparse_aggregation = False
    bucket_rows = 0  # see target_only
    # The first layer's neighbour reduction, if the loader may compute it on the raw features
    # (gnnscale.data.aggregate_first_layer); None: the model aggregates every layer itself.
    first_layer_aggr: str | None = None
    # Whether training batches should carry their adjacency's transpose
    # (gnnscale.data.csc_layout), from which the sparse aggregation takes its backward.
    csc_backward = False

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        num_sampled_nodes: list[int] | None = None,
        num_sampled_edges: list[int] | None = None,
        rowptr: Tensor | None = None,
        x_aggr: Tensor | None = None,
        csc: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """Class logits for every node of the (sub)graph, or for a neighbour batch's seeds.

        Given ``rowptr`` (``gnnscale.data.csr_layout``: edges sorted by target), a model with
        ``sparse_aggregation`` aggregates with a sparse-dense product.

        Given a neighbour batch's layout (``gnnscale.data.hop_layout``), each layer computes
        only the rows the next one reads (:func:`target_only`) and the logits cover the
        seeds. Models without ``target_only_layers`` (and any with a ``norm``, whose statistics
        span a layer's rows) drop unread rows after each layer instead, with PyG's
        ``trim_to_layer``: logits for the seeds and their first hop, seeds first. Features are
        cast to the parameters' dtype (float32 under mixed precision; bfloat16, float16 or
        float64 under ``*-true``).

        Given ``x_aggr`` too (``gnnscale.data.aggregate_first_layer``, for a model with
        ``first_layer_aggr``), the first layer takes its aggregation from the loader and ``x``
        holds its targets only. Given ``csc`` too (``gnnscale.data.csc_layout``, for a model
        with ``csc_backward``), the sparse aggregation's backward multiplies by it.
        """
        if x_aggr is not None and self.first_layer_aggr is None:
            raise ValueError(
                f"{type(self).__name__} computes its first layer's aggregation itself: give "
                "it batches without x_aggr (gnnscale.data.hop_layout, first_layer_aggr=None)"
            )
        x = x.to(self.dtype)
        if num_sampled_nodes is None or num_sampled_edges is None:  # every node is computed
            if rowptr is not None and self.sparse_aggregation:  # a Cluster-GCN or SAINT batch
                num_nodes = x.size(0)
                if self.bucket_rows:
                    x, rowptr = _pad_rows(x, rowptr, self.bucket_rows)
                adj = csr_adjacency(x, edge_index, rowptr, x.size(0), edge_index.size(1))
                layout = None if csc is None else (rowptr, edge_index[0], *csc)
                return padded_forward(self.gnn, x, adj, num_nodes, layout)[:num_nodes]
            return self.gnn(x, edge_index)
        if not self.target_only_layers:
            return self.gnn(
                x,
                edge_index,
                num_sampled_nodes_per_hop=num_sampled_nodes,
                num_sampled_edges_per_hop=num_sampled_edges,
            )
        if x_aggr is not None:
            x_aggr = x_aggr.to(self.dtype)
        if not self.sparse_aggregation:
            rowptr = None
        return target_only(
            self.gnn,
            x,
            edge_index,
            num_sampled_nodes,
            num_sampled_edges,
            rowptr,
            self.bucket_rows,
            x_aggr,
            csc,
        )

    def training_step(self, batch: Data, batch_idx: int) -> Tensor:
        """Weighted cross-entropy; the DataModule's weights sum to 1 per batch in expectation."""
        out = self(batch.x, batch.edge_index, *_hops(batch))
        y, weight = batch.y[: out.size(0)], batch.loss_weight[: out.size(0)]  # seeds only
        # Nodes outside every split may be unlabelled (y = -1): they weigh 0 and are ignored.
        loss = (F.cross_entropy(out.float(), y, reduction="none", ignore_index=-1) * weight).sum()
        if not torch.isfinite(loss):
            raise TrainingDiverged(
                f"the training loss is {loss.item()} at step {self.global_step} (epoch "
                f"{self.current_epoch}, batch {batch_idx}): the run stopped. Likely causes: a "
                "learning rate too high for the optimizer (--model.optimizer), or NaN/inf in the "
                "inputs; fp16 without loss scaling can overflow too"
            )
        self.log("train/loss", loss, prog_bar=True, on_epoch=True, batch_size=batch.num_loss_nodes)
        return loss

    def _logits(self, batch: Data | LayerwiseBatch) -> tuple[Tensor, Tensor]:
        if isinstance(batch, LayerwiseBatch):
            out = layerwise_inference(self.gnn, batch.loader, self.device)
            y = batch.y
            if batch.mask is not None:
                out, y = out[batch.mask], y[batch.mask]
            return out.to(self.device), y.to(self.device)
        out, y = self(batch.x, batch.edge_index, *_hops(batch)), batch.y
        if "batch_size" in batch:  # sampled: the evaluated seed nodes come first
            return out[: batch.batch_size], y[: batch.batch_size]
        mask = batch.get("eval_mask")  # the whole graph
        return (out, y) if mask is None else (out[mask], y[mask])

    def validation_step(self, batch: Data | LayerwiseBatch, batch_idx: int) -> None:
        """Accuracy on validation nodes."""
        out, y = self._logits(batch)
        self.val_acc(out, y)
        self.log("val/loss", F.cross_entropy(out.float(), y), batch_size=y.numel())
        self.log("val/acc", self.val_acc, prog_bar=True, batch_size=y.numel())

    def test_step(self, batch: Data | LayerwiseBatch, batch_idx: int) -> None:
        """Accuracy on test nodes."""
        out, y = self._logits(batch)
        self.test_acc(out, y)
        self.log("test/acc", self.test_acc, batch_size=y.numel())

    def predict_step(self, batch: Data | LayerwiseBatch, batch_idx: int) -> Tensor:
        """Predicted class of each node (in node order for layer-wise evaluation)."""
        return self._logits(batch)[0].argmax(-1)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Flush the loggers: what was logged before a checkpoint is on disk beside it."""
        for logger in self.loggers:
            logger.save()

    def configure_optimizers(self) -> Any:
        """The optimizer (and schedule) chosen in the config; none: Adam, as the GAT paper.

        The default Adam is fused: one kernel updates every parameter (0.5-0.8 ms less per
        neighbour step on this project's CPU machine).
        """
        if self.optimizer is None:
            optimizer: torch.optim.Optimizer = torch.optim.Adam(
                self.parameters(), lr=_ADAM_LR, weight_decay=_ADAM_WEIGHT_DECAY, fused=True
            )
        else:
            optimizer = self.optimizer(self.parameters())
        if self.lr_scheduler is None:
            return optimizer
        scheduler = self.lr_scheduler(optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "monitor": "val/acc"},
        }


class GraphSAGE(NodeClassifier):
    """GraphSAGE (Hamilton et al., 2017) on PyG's ``SAGEConv``.

    Args:
        in_channels: Node feature dimension (linked from the DataModule).
        num_classes: Number of classes (linked from the DataModule).
        hidden_channels: Width of the hidden layers.
        num_layers: Message-passing layers; neighbour sampling needs one fan-out per layer.
        dropout: Dropout probability between layers.
        norm: Normalisation between layers (``batch_norm``, ``layer_norm``, ...) or none.
        aggr: Neighbourhood aggregation: ``mean``, ``max``, ``sum``.
        sparse_aggregation: Aggregate neighbour batches with a sparse-dense product on the CSR
            adjacency the loader built (torch-sparse's ``SparseTensor``, else ``torch.sparse``)
            instead of PyG's scatter; ``aggr`` other than mean/max/min/sum always scatters.
        bucket_rows: On neighbour batches, round each hidden layer's rows up to a multiple of
            this (0: off; see :func:`target_only`); on Cluster-GCN and GraphSAINT batches,
            the batch's rows (a ``norm`` sees the real rows only: :func:`padded_forward`). bf16
            products on CPU then reuse a few oneDNN primitives instead of building one a batch
            (README's ``roofline`` block: the default step against rows as sampled); on GPUs
            the added rows cost next to nothing.
        aggregate_in_loader: Let neighbour batches' workers aggregate the first layer's raw
            features (the same sparse product, which has no parameters): the training step
            then runs that layer as one matrix product on its targets' rows, and only those
            travel to the model (``gnnscale.data.aggregate_first_layer``). Needs
            ``sparse_aggregation`` and no ``norm``; evaluation batches get it too.
        optimizer: Optimizer, with its arguments (``class_path`` and ``init_args``); none:
            ``Adam`` with lr 0.005 and weight decay 5e-4 (the GAT paper's settings).
        lr_scheduler: Learning-rate schedule, or none; ``ReduceLROnPlateau`` watches ``val/acc``.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        hidden_channels: int = 256,
        num_layers: int = 2,
        dropout: float = 0.5,
        norm: str | None = None,
        aggr: str = "mean",
        sparse_aggregation: bool = True,
        bucket_rows: int = 1024,
        aggregate_in_loader: bool = True,
        optimizer: OptimizerCallable | None = None,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(num_classes, num_layers, optimizer, lr_scheduler)
        _check_probabilities(dropout=dropout)
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.gnn = pyg_nn.GraphSAGE(
            in_channels,
            hidden_channels,
            num_layers,
            out_channels=num_classes,
            dropout=dropout,
            norm=norm,
            aggr=aggr,
        )
        self.gnn.dropout = Dropout(dropout)
        self.target_only_layers = norm is None
        self.sparse_aggregation = sparse_aggregation and aggr in {"mean", "max", "min", "sum"}
        if bucket_rows < 0:
            raise ConfigError(f"--model.bucket_rows must be >= 0 (got {bucket_rows})")
        self.bucket_rows = bucket_rows
        if aggregate_in_loader and self.target_only_layers and self.sparse_aggregation:
            self.first_layer_aggr = aggr
        self.csc_backward = self.sparse_aggregation and aggr in ("mean", "sum")


class GATv2(NodeClassifier):
    """GATv2 (Brody et al., 2022) on PyG's edge-wise ``GATv2Conv``: memory O(E), not O(N^2).

    Args:
        in_channels: Node feature dimension (linked from the DataModule).
        num_classes: Number of classes (linked from the DataModule).
        hidden_channels: Width of the hidden layers, all heads together (must divide by heads).
        num_layers: Attention layers; neighbour sampling needs one fan-out per layer.
        heads: Attention heads per hidden layer (concatenated).
        out_heads: Heads of the output attention layer, averaged; each costs E x num_classes
            activations, so fewer heads here is the cheapest memory cut with many classes.
        linear_head: End with a linear classifier on the last attention layer's output instead
            of an attention layer into ``num_classes`` (``num_layers`` attention layers remain).
        dropout: Dropout probability on each layer's input features.
        attention_dropout: Dropout probability on attention coefficients. The GAT paper uses
            0.6 on Cora (``recipes/planetoid`` does); with neighbour sampling, which already
            drops edges, it stopped GATv2 training on the recipes' graphs, hence 0 by default.
        norm: Normalisation between layers (``batch_norm``, ``layer_norm``, ...) or none.
        optimizer: Optimizer, with its arguments (``class_path`` and ``init_args``); none:
            ``Adam`` with lr 0.005 and weight decay 5e-4 (the GAT paper's settings).
        lr_scheduler: Learning-rate schedule, or none; ``ReduceLROnPlateau`` watches ``val/acc``.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        hidden_channels: int = 64,
        num_layers: int = 2,
        heads: int = 8,
        out_heads: int = 1,
        linear_head: bool = False,
        dropout: float = 0.6,
        attention_dropout: float = 0.0,
        norm: str | None = None,
        optimizer: OptimizerCallable | None = None,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(num_classes, num_layers, optimizer, lr_scheduler)
        _check_probabilities(dropout=dropout, attention_dropout=attention_dropout)
        if hidden_channels % heads:
            raise ConfigError(
                f"--model.hidden_channels ({hidden_channels}) must be divisible by "
                f"--model.heads ({heads})"
            )
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.gnn = pyg_nn.GAT(
            in_channels,
            hidden_channels,
            num_layers,
            out_channels=num_classes,
            dropout=dropout,
            norm=norm,
            jk="last" if linear_head else None,  # PyG then adds a Linear after the convs
            v2=True,
            heads=heads,
        )
        if not linear_head and out_heads != heads:
            last = self.gnn.convs[-1]
            self.gnn.convs[-1] = pyg_nn.GATv2Conv(
                last.in_channels, num_classes, heads=out_heads, concat=False
            )
        for conv in self.gnn.convs:  # PyG's GAT gives every conv the feature dropout
            conv.dropout = attention_dropout
        self.gnn.dropout = Dropout(dropout)
        self.target_only_layers = norm is None
