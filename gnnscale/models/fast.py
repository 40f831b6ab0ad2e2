"""The fast paths the node models call, kept apart from the models (which read like PyG's).

What gnnscale adds to PyG's models for speed, each switched by a field of :class:`SpeedTricks`
(the models' ``speed`` option group, whose docstring says what each does and what it bought):
target-only layers (:func:`target_only`), the CPU dropout (``gnnscale.models.dropout``), sparse
aggregation on the CSR adjacency the loader's worker laid out (``gnnscale.sparse``), rows
rounded up to multiples (:func:`pad_rows`, :func:`padded_forward`) and the first layer
aggregated in the loader (``gnnscale.data.layout.aggregate_first_layer``).

Each earns its place at the epoch level: ``python benchmarks/figures.py speed_defaults``
measures every one switched in turn on the sampler recipes (benchmarks/README.md). Tricks that
bought less than 3% there are gone (the backward from the adjacency's transpose, the in-place
gradient of the targets' rows) or apply only where they paid (``bucket_rows: auto``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
import torch_geometric.typing
from torch import Tensor
from torch_geometric import nn as pyg_nn
from torch_geometric.index import index2ptr

from gnnscale._compat import forward_hooks
from gnnscale.batch import HopLayout, SubgraphLayout
from gnnscale.errors import ConfigError
from gnnscale.models.dropout import Dropout
from gnnscale.sparse import csr_adjacency, valued_as

# The reductions a sparse-dense product computes (PyG's ``spmm``); others scatter. (Without
# torch-sparse, a CPU product is torch.sparse's, which has no bf16 "sum": there, sums scatter.)
SPARSE_AGGRS: tuple[str, ...] = ("mean", "max", "min", "sum")
if not torch_geometric.typing.WITH_TORCH_SPARSE:
    SPARSE_AGGRS = ("mean", "max", "min")


@dataclass(frozen=True)
class LayerSpeedTricks:
    """The speed tricks that any node model's layers take (GATv2's ``speed`` option group).

    Each is on by default and changes speed, not results: outputs and gradients are those of
    PyG's forward (``tests/test_models.py``; the CPU dropout draws other masks, at the same
    rate). s/epoch ratios are the ``speed_defaults`` table's (benchmarks/README.md): the run
    with the trick off against the run with it on.

    Args:
        target_only_layers: On neighbour batches each layer computes only the rows the next
            layer (or the loss) reads (:func:`target_only`), where PyG's ``trim_to_layer`` drops
            rows after a layer computed them (2.72x neighbor_sage's s/epoch without it). A model
            with a ``norm`` keeps PyG's forward in training (batch statistics span a layer's
            rows); in evaluation, where every norm is row-wise (none, or ``batch_norm``'s
            running statistics), it is target-only too. Off: PyG's forward, in training and
            evaluation.
        cpu_dropout: Dropout draws its CPU mask from 1, 8 or 16 random bits an element, in one
            pass with the ReLU before it (:class:`Dropout`; 1.47x cluster_gcn's and 1.31x
            graphsaint's s/epoch without it, 1.00x neighbor_sage's). Off: PyG's
            ``torch.nn.Dropout``, after a separate ReLU.
    """

    target_only_layers: bool = True
    cpu_dropout: bool = True


@dataclass(frozen=True)
class SpeedTricks(LayerSpeedTricks):
    """Every speed trick of a GraphSAGE model (its ``speed`` option group).

    Those of :class:`LayerSpeedTricks` (``target_only_layers``, ``cpu_dropout``), and the ones
    of GraphSAGE's aggregation, measured the same way.

    Args:
        sparse_aggregation: Aggregate with a sparse-dense product on the CSR adjacency the
            loader laid out (``gnnscale.sparse.csr_adjacency``: torch-sparse's
            ``SparseTensor``, else ``torch.sparse``) instead of PyG's scatter, on Cluster-GCN
            and GraphSAINT batches, on neighbour batches with target-only layers (PyG's forward
            scatters) and in layer-wise evaluation (1.04x neighbor_sage's, 1.74x cluster_gcn's,
            1.73x graphsaint's s/epoch without it). An ``aggr`` other than mean, max, min or
            sum always scatters.
        bucket_rows: Round rows up to a multiple of this (0: off): on neighbour batches each
            hidden layer's (:func:`target_only`), on Cluster-GCN and GraphSAINT batches the
            batch's (a ``norm`` sees the real rows only: :func:`padded_forward`). bf16 products
            on CPU then reuse a few oneDNN primitives instead of building one a batch (a build
            costs several times the product). ``auto`` (the default): 1024 where the batch's
            products run in bf16 on a CPU, else off (:func:`bucket_size`); in fp32 it was
            within 3%, or 5% slower. Each recipe's gain is in benchmarks/README.md's
            ``speed_defaults`` table (1024 is the size measured).
        aggregate_in_loader: Let neighbour batches' loaders aggregate the first layer's raw
            features (the same sparse product, which has no parameters) where they are held in
            memory in float32 or float64, reading them in place: only the first layer's
            targets' rows are gathered, and the training step runs that layer as one matrix
            product on them (``gnnscale.data.layout.aggregate_first_layer``; 0.91x
            neighbor_sage's fp32 epoch). Needs ``target_only_layers``, ``sparse_aggregation``
            and no ``norm``; sampled evaluation batches get it too. Elsewhere (a prepared
            graph, half-precision features, a model without features) the model aggregates.
    """

    sparse_aggregation: bool = True
    bucket_rows: int | Literal["auto"] = "auto"
    aggregate_in_loader: bool = True

    def __post_init__(self) -> None:
        """Refuse a negative row multiple."""
        if self.bucket_rows != "auto" and self.bucket_rows < 0:
            raise ConfigError(f"--model.speed.bucket_rows must be >= 0 (got {self.bucket_rows})")


# Models save their ``speed`` group in their checkpoints' hyper-parameters: plain values, which
# ``torch.load``'s default (``weights_only``) may then rebuild, as Lightning's loading does.
torch.serialization.add_safe_globals([LayerSpeedTricks, SpeedTricks])


def _round_up(count: int, multiple: int) -> int:
    return -(-count // multiple) * multiple


def _with_empty_rows(rowptr: Tensor, count: int) -> Tensor:
    """A CSR row pointer with ``count`` rows without edges appended."""
    return torch.cat([rowptr, rowptr[-1:].expand(count)])


def pad_rows(x: Tensor, rowptr: Tensor, multiple: int) -> tuple[Tensor, Tensor]:
    """``x`` and its CSR row pointer with zero rows without edges, up to a multiple of rows.

    Every layer of a subgraph batch then has a few row counts, so bf16 products on CPU reuse
    a few oneDNN primitives instead of building one for every batch's node count. The added
    rows read nothing and nothing reads them; their outputs are cut off.
    """
    extra = _round_up(x.size(0), multiple) - x.size(0)
    if not extra:
        return x, rowptr
    return F.pad(x, (0, 0, 0, extra)), _with_empty_rows(rowptr, extra)


def hops_forward(
    gnn: pyg_nn.models.basic_gnn.BasicGNN,
    x: Tensor,
    edge_index: Tensor,
    layout: HopLayout,
    *,
    target_only_layers: bool,
    sparse_aggregation: bool,
    bucket_rows: int,
    edge_attr: Tensor | None = None,
) -> Tensor:
    """``gnn``'s forward on a neighbour batch: logits for its seeds (first) and maybe more rows.

    With ``target_only_layers`` each layer computes only the rows the next one reads
    (:func:`target_only`); else (models with a norm, whose statistics span a layer's rows) PyG's
    ``trim_to_layer`` drops unread rows after each layer: logits for the seeds and their first
    hop.

    Args:
        gnn: A PyG ``BasicGNN``.
        x: Node features, hop by hop, seeds first (the first layer's targets only, given
            ``layout.x_aggr``).
        edge_index: Edges sorted by target.
        layout: The batch's :class:`HopLayout`.
        target_only_layers: Whether ``gnn``'s convs accept ``(x_src, x_dst)`` pairs and no norm
            spans a layer's rows.
        sparse_aggregation: Aggregate with a sparse-dense product on ``layout.rowptr``.
        bucket_rows: Round hidden layers' rows up to a multiple of this (0: off).
        edge_attr: Edge features, in ``edge_index``'s order (convs with an ``edge_dim``).
    """
    if not target_only_layers:
        return gnn(
            x,
            edge_index,
            edge_attr=edge_attr,
            num_sampled_nodes_per_hop=layout.num_sampled_nodes,
            num_sampled_edges_per_hop=layout.num_sampled_edges,
        )
    return target_only(
        gnn,
        x,
        edge_index,
        layout.num_sampled_nodes,
        layout.num_sampled_edges,
        layout.rowptr if sparse_aggregation else None,
        bucket_rows,
        None if layout.x_aggr is None else layout.x_aggr.to(x.dtype),
        edge_attr,
    )


def subgraph_forward(
    gnn: pyg_nn.models.basic_gnn.BasicGNN,
    x: Tensor,
    edge_index: Tensor,
    layout: SubgraphLayout,
    bucket_rows: int,
) -> Tensor:
    """``gnn``'s forward on a Cluster-GCN or GraphSAINT subgraph, with a sparse aggregation.

    Args:
        gnn: A PyG ``BasicGNN`` whose convs take a sparse adjacency.
        x: Node features of every node of the subgraph.
        edge_index: Edges sorted by target.
        layout: The batch's :class:`SubgraphLayout`.
        bucket_rows: Pad the rows to a multiple of this (0: off; :func:`pad_rows`).
    """
    num_nodes, rowptr = x.size(0), layout.rowptr
    if bucket_rows:
        x, rowptr = pad_rows(x, rowptr, bucket_rows)
    adj = csr_adjacency(x, edge_index, rowptr, x.size(0), edge_index.size(1))
    return padded_forward(gnn, x, adj, num_nodes)[:num_nodes]


def seeds_adjacency(x: Tensor, edge_index: Tensor, num_seeds: int) -> Any:
    """A one-hop batch's edges as its seeds' sparse adjacency (CSR; columns: ``x``'s rows).

    Exact layer-wise inference then aggregates each layer with a sparse-dense product, as the
    training step does, instead of PyG's scatter, which first copies a row of ``x`` per edge: on
    the neighbour recipe's 200k-node test, 3.8M rows of 100 and then 256 values a layer.
    Edges not in target order (other samplers) are sorted first.

    Args:
        x: The batch's input rows, seeds first.
        edge_index: Its edges, every target a seed.
        num_seeds: The seeds: the adjacency's rows.
    """
    dst = edge_index[1]
    if dst.numel() and not bool((dst[1:] >= dst[:-1]).all()):
        edge_index = edge_index[:, torch.argsort(dst, stable=True)]
    rowptr = index2ptr(edge_index[1], num_seeds)
    return csr_adjacency(x, edge_index, rowptr, num_seeds, edge_index.size(1))


def rowwise_in_eval(gnn: pyg_nn.models.basic_gnn.BasicGNN) -> bool:
    """Whether each of ``gnn``'s norms treats every row on its own in eval mode.

    None, or PyG's ``BatchNorm`` with running statistics: evaluation may then compute only the
    rows the next layer reads (:func:`target_only`), as models without a norm always do.
    Training may not: batch statistics span a layer's rows.
    """
    return all(
        isinstance(norm, torch.nn.Identity)
        or (isinstance(norm, pyg_nn.norm.BatchNorm) and norm.module.track_running_stats)
        for norm in gnn.norms
    )


def target_only(
    gnn: pyg_nn.models.basic_gnn.BasicGNN,
    x: Tensor,
    edge_index: Tensor,
    num_sampled_nodes: list[int],
    num_sampled_edges: list[int],
    rowptr: Tensor | None = None,
    bucket_rows: int = 0,
    x_aggr: Tensor | None = None,
    edge_attr: Tensor | None = None,
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
        edge_index: Edges sorted by target (``gnnscale.data.layout.hop_layout``).
        num_sampled_nodes: Nodes per hop, seeds first.
        num_sampled_edges: Edges per hop.
        rowptr: The CSR row pointer of ``edge_index``'s targets: given, layers aggregate with a
            sparse-dense product, else with PyG's scatter over ``edge_index``.
        bucket_rows: Round each hidden layer's rows up to a multiple of this (0: off), as rows
            without edges whose outputs nothing reads: matrix products then see a few shapes,
            and oneDNN (bf16 on CPU) reuses a primitive per shape instead of building one for
            every batch.
        x_aggr: The first layer's aggregated neighbour features, computed by the loader
            (``gnnscale.data.layout.aggregate_first_layer``; ``gnn`` a GraphSAGE): ``x`` then holds
            the first layer's targets only, and the layer is one matrix product.
        edge_attr: Edge features in ``edge_index``'s order, each layer reading its edges' rows
            (convs with an ``edge_dim``; scatter aggregation only).
    """
    if edge_attr is not None and rowptr is not None:
        raise ValueError("edge features need the convs' scatter aggregation, not a rowptr")
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
            pair = (x, x[:num_dst])
            if edge_attr is not None:
                x = conv(pair, edge_index[:, :num_edges], edge_attr[:num_edges])
            elif layer_rowptr is None:
                x = conv(pair, edge_index[:, :num_edges])
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
) -> Tensor:
    """``gnn``'s forward on a subgraph whose rows past ``num_rows`` are padding.

    The padded rows have no edges, so no real row reads them; each norm sees only the real
    rows (:func:`_between_layers`). Cluster-GCN and GraphSAINT batches are padded to a few row
    counts so that bf16 products on CPU reuse their oneDNN primitives (``bucket_rows``).
    """
    xs = []
    for i, (conv, norm) in enumerate(zip(gnn.convs, gnn.norms, strict=True)):
        x = conv(x, valued_as(adj, x))
        if i < gnn.num_layers - 1 or gnn.jk_mode is not None:  # as BasicGNN.forward
            x = _between_layers(gnn, norm, x, num_rows)
            xs.append(x)
    if hasattr(gnn, "jk"):  # PyG's "last" needs none
        x = gnn.jk(xs)
    return gnn.lin(x) if hasattr(gnn, "lin") else x


BUCKET_ROWS = 1024  # ``bucket_rows: auto``'s multiple, where it applies: the size measured


def bucket_size(setting: int | Literal["auto"], device: torch.device) -> int:
    """The row multiple of a batch's products: ``setting``, or for ``auto`` where it paid.

    ``auto``: :data:`BUCKET_ROWS` where the products run in bf16 on a CPU (autocast), else 0:
    in fp32 it was within 3%, or 5% slower; on a GPU it is not measured.
    """
    if setting != "auto":
        return setting
    bf16 = product_dtype(device, torch.float32) == torch.bfloat16
    return BUCKET_ROWS if device.type == "cpu" and bf16 else 0


def product_dtype(device: torch.device, default: torch.dtype) -> torch.dtype:
    """The dtype a matrix product on ``device`` runs in: autocast's if it is on, else ``default``.

    An input cast to it once is one that autocast leaves as it is.
    """
    on = torch.is_autocast_enabled(device.type)
    return torch.get_autocast_dtype(device.type) if on else default


def _sage_on_aggregated(conv: Any, x_aggr: Tensor, x: Tensor, rows: int) -> Tensor:
    """A ``SAGEConv`` given its aggregate: ``lin_l(x_aggr) + lin_r(x)`` as one matrix product.

    The two inputs go side by side into one buffer of ``rows`` rows (rows past ``x``'s are
    zeros, as :func:`pad_rows`), in the product's dtype (bfloat16 under autocast: the copy is
    the cast autocast would make), against the two weights side by side.
    """
    dtype = product_dtype(x.device, x.dtype)
    width = x_aggr.size(1)
    inputs = torch.empty((rows, width + x.size(1)), dtype=dtype, device=x.device)
    inputs[: x.size(0), :width] = x_aggr
    inputs[: x.size(0), width:] = x
    inputs[x.size(0) :] = 0
    weight = torch.cat([conv.lin_l.weight, conv.lin_r.weight], dim=1)
    out = F.linear(inputs, weight, conv.lin_l.bias)
    _call_forward_hooks(conv, (x_aggr, x), out[: x.size(0)])
    return out


def _call_forward_hooks(module: torch.nn.Module, args: tuple, out: Tensor) -> None:
    """Show ``module``'s forward hooks an output computed without calling it.

    Monitoring (``gnnscale.MonitorCallback``) and explanation tools hook the convs; their
    hooks see the layer's output rows as if the conv had run (what they return is ignored).
    """
    for hook, with_kwargs in forward_hooks(module):
        if with_kwargs:
            hook(module, args, {}, out)
        else:
            hook(module, args, out)
