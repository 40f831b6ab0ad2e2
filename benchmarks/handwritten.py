"""The plain PyG training loops that gnnscale is measured against, written as PyG's examples are.

Each ``train_*`` function is the loop a PyG user would write without gnnscale: a loader, a model
from ``torch_geometric.nn``, Adam, a ``for`` loop. They follow PyG's examples
(``examples/reddit.py`` for neighbour sampling, ``examples/cluster_gcn_reddit.py`` and
``examples/graph_saint.py``) and take every setting (width, depth, dropout, learning rate, fan-out,
batch size, loader workers, epochs, and precision: fp32, or bf16 autocast as the recipes'
``bf16-mixed``) from the spec that ``benchmarks/compare.py`` derives from the
recipe's ``config.yaml``, on the same generated graph (``gnnscale.make_synthetic_graph``).

Evaluation (when ``spec["evaluate"]``) is layer-wise exact inference over full neighbourhoods
after the last epoch (the recipes' ``eval.mode: layerwise``, batch size ``eval_batch_size``), as
``gnnscale fit``'s final ``test`` is when ``compare.py`` turns per-epoch validation off: one pass
over the graph costs about as much as an epoch here, so both sides evaluate once. An epoch's time
runs from the start of the loader loop to the end of its last optimizer step, like
``gnnscale.ThroughputMonitor``: sampling included, evaluation not.

The loaders sample with PyG's own backend (pyg-lib, else torch-sparse) where one is installed.
On an install from PyPI alone PyG has none, and a PyG user passes the sampler that runs there:
gnnscale's ``HopSampler`` to ``NeighborLoader``, ``SAINTLoader`` for GraphSAINT
(:func:`sampled_by`).
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.loader import ClusterLoader, GraphSAINTRandomWalkSampler, NeighborLoader
from torch_geometric.nn import GraphConv, GraphSAGE
from torch_geometric.utils import degree

from gnnscale import SyntheticGraph, make_synthetic_graph
from gnnscale.measure import saved_tensor_bytes
from gnnscale.saint import SAINTLoader
from gnnscale.sampling import HopSampler, sampling_backend

__all__ = ["sampled_by", "train_cluster", "train_neighbor", "train_saint"]


def sampled_by() -> str:
    """Who samples the loops' batches on this install."""
    backend = sampling_backend()
    return f"PyG's {backend}" if backend != "none" else "gnnscale's HopSampler and SAINTLoader"


def _neighbors(data: Data, num_neighbors: list[int], **kwargs: Any) -> NeighborLoader:
    """PyG's ``NeighborLoader``; given ``HopSampler`` where PyG has no sampling backend."""
    sampler = HopSampler(data, num_neighbors) if sampling_backend() == "none" else None
    return NeighborLoader(data, num_neighbors=num_neighbors, neighbor_sampler=sampler, **kwargs)


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _autocast(spec: dict[str, Any], device: torch.device) -> Any:
    """bf16 autocast when the spec asks for it (the recipes' ``bf16-mixed``), else nothing."""
    return torch.autocast(device.type, torch.bfloat16, enabled=spec.get("precision") == "bf16")


def _graph(spec: dict[str, Any]) -> Data:
    return make_synthetic_graph(SyntheticGraph(**spec["graph"]))


def _accuracy(out: Tensor, data: Data) -> tuple[float, float]:
    pred = out.argmax(dim=-1)
    return tuple(  # type: ignore[return-value]
        float((pred[m] == data.y[m]).float().mean()) for m in (data.val_mask, data.test_mask)
    )


def _run_epochs(
    spec: dict[str, Any],
    train_epoch: Callable[[], tuple[float, int, int, int]],
    evaluate: Callable[[], tuple[float, float]],
    device: torch.device,
) -> dict[str, Any]:
    """Train ``spec["epochs"]`` epochs, timing each; evaluate after the last if asked to.

    ``train_epoch`` returns the epoch's summed loss (times loss nodes), loss nodes, gathered
    feature rows and batches.
    """
    keys = ("epoch_s", "loss", "loss_nodes", "rows", "batches")
    out: dict[str, Any] = {k: [] for k in keys}
    for _ in range(spec["epochs"]):
        start = time.perf_counter()
        total_loss, loss_nodes, rows, batches = train_epoch()
        _sync(device)
        out["epoch_s"].append(time.perf_counter() - start)
        out["loss"].append(total_loss / max(loss_nodes, 1))
        out["loss_nodes"].append(loss_nodes)
        out["rows"].append(rows)
        out["batches"].append(batches)
    out["val_acc"], out["acc"] = evaluate() if spec["evaluate"] else (None, None)
    return {**out, "device": str(device)}


def _row_bytes(data: Data) -> int:
    """Bytes of one row of the feature matrix: what a sampler gathers per node of a batch."""
    return data.num_features * data.x.element_size()


def _loader_only_s(loader: Iterable[Data]) -> float:
    """Seconds for one pass over the training loader with no model: the sampling floor."""
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def train_neighbor(spec: dict[str, Any]) -> dict[str, Any]:
    """Neighbour sampling with GraphSAGE, as PyG's ``examples/reddit.py``."""
    torch.manual_seed(spec["seed"])
    device, m, d = _device(), spec["model"], spec["data"]
    data = _graph(spec)
    kwargs = spec["loader"]
    train_loader = _neighbors(
        data,
        d["num_neighbors"],
        input_nodes=data.train_mask,
        batch_size=d["batch_size"],
        shuffle=True,
        **kwargs,
    )
    subgraph_loader = _neighbors(
        copy.copy(data), [-1], batch_size=spec["eval_batch_size"], **kwargs
    )
    model = GraphSAGE(
        data.num_features,
        m["hidden_channels"],
        m["num_layers"],
        out_channels=int(data.y.max()) + 1,
        dropout=m["dropout"],
        norm=m["norm"],
    ).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=m["lr"])

    def train_epoch() -> tuple[float, int, int, int]:
        model.train()
        total_loss = loss_nodes = rows = batches = 0
        for batch in train_loader:
            batch = batch.to(device)
            optimizer.zero_grad()
            with _autocast(spec, device):
                out = model(batch.x, batch.edge_index)[: batch.batch_size]
            loss = F.cross_entropy(out.float(), batch.y[: batch.batch_size])
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * batch.batch_size
            loss_nodes += batch.batch_size
            rows += batch.num_nodes
            batches += 1
        return total_loss, loss_nodes, rows, batches

    @torch.no_grad()
    def evaluate() -> tuple[float, float]:
        model.eval()
        with _autocast(spec, device):
            return _accuracy(model.inference(subgraph_loader, device).cpu(), data)

    result = _run_epochs(spec, train_epoch, evaluate, device)
    result["row_bytes"] = _row_bytes(data)
    result["loader_only_s"] = _loader_only_s(train_loader)
    return result


def partition_fingerprint(node_perm: Tensor, partptr: Tensor) -> str:
    """A short hash of a Cluster-GCN partition, to check two runs trained on the same clusters."""
    h = hashlib.blake2b(digest_size=8)
    for t in (node_perm, partptr):
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def train_cluster(spec: dict[str, Any]) -> dict[str, Any]:
    """Cluster-GCN with GraphSAGE, as PyG's ``examples/cluster_gcn_reddit.py``.

    torch-sparse built from PyPI has no METIS, so PyG's ``ClusterData`` cannot partition here.
    The loop uses ``gnnscale.data.subgraph._ClusterData``: PyG's ``ClusterData`` whose only
    change is the pymetis fallback for METIS. pymetis is deterministic, so this loop trains on
    exactly the clusters gnnscale's ``ClusterDataModule`` trains on (``compare.py``
    compares fingerprints).
    """
    from gnnscale.data.subgraph import _ClusterData  # the partitioner only; see the docstring

    torch.manual_seed(spec["seed"])
    device, m, d = _device(), spec["model"], spec["data"]
    data = _graph(spec)
    kwargs = spec["loader"]
    cluster_data = _ClusterData(
        data, num_parts=d["num_parts"], recursive=d["recursive"], save_dir=spec["cache_dir"]
    )
    train_loader = ClusterLoader(
        cluster_data, batch_size=d["clusters_per_batch"], shuffle=True, **kwargs
    )
    subgraph_loader = _neighbors(data, [-1], batch_size=spec["eval_batch_size"], **kwargs)

    def build(num_layers: int) -> GraphSAGE:
        return GraphSAGE(
            data.num_features,
            m["hidden_channels"],
            num_layers,
            out_channels=int(data.y.max()) + 1,
            dropout=m["dropout"],
            norm=m["norm"],
        ).to(device)

    model = build(m["num_layers"])
    optimizer = torch.optim.Adam(model.parameters(), lr=m["lr"])

    def train_epoch() -> tuple[float, int, int, int]:
        model.train()
        total_loss = loss_nodes = rows = batches = 0
        for batch in train_loader:
            batch = batch.to(device)
            optimizer.zero_grad()
            with _autocast(spec, device):
                out = model(batch.x, batch.edge_index).float()
            loss = F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])
            loss.backward()
            optimizer.step()
            num_train = int(batch.train_mask.sum())
            total_loss += loss.item() * num_train
            loss_nodes += num_train
            rows += batch.num_nodes
            batches += 1
        return total_loss, loss_nodes, rows, batches

    @torch.no_grad()
    def evaluate() -> tuple[float, float]:
        model.eval()
        with _autocast(spec, device):
            return _accuracy(model.inference(subgraph_loader, device).cpu(), data)

    result = _run_epochs(spec, train_epoch, evaluate, device)
    result["row_bytes"] = _row_bytes(data)
    result["loader_only_s"] = _loader_only_s(train_loader)
    result["partition"] = partition_fingerprint(
        cluster_data.partition.node_perm, cluster_data.partition.partptr
    )
    # Activation memory of one training step at 2 and 4 layers, on the same cluster batch:
    # the part of Cluster-GCN's memory that depth changes.
    batch = next(iter(train_loader)).to(device)
    result["saved_mb_by_layers"] = {}
    for num_layers in (2, 4):
        net = build(num_layers).train()

        def step(net: GraphSAGE = net) -> Tensor:
            out = net(batch.x, batch.edge_index)
            return F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])

        result["saved_mb_by_layers"][num_layers] = saved_tensor_bytes(step) / 2**20
    return result


class SAINTNet(torch.nn.Module):
    """PyG's ``examples/graph_saint.py`` network at the recipe's width and depth.

    ``GraphConv`` layers with ``aggr="add"`` take GraphSAINT's ``edge_norm`` times the in-degree
    normalisation as edge weights, so a sampled subgraph's aggregation estimates the full
    graph's mean. (The example switches ``conv.aggr`` to ``"mean"`` for testing; since PyG 2.3
    that attribute no longer changes the aggregation, so evaluation here keeps ``"add"`` with
    in-degree weights ``1 / deg``, which on full neighbourhoods is exactly the mean.)

    Args:
        in_channels: Node feature dimension.
        hidden_channels: Width of the hidden layers.
        out_channels: Number of classes.
        num_layers: Number of ``GraphConv`` layers.
        dropout: Dropout probability between layers.
    """

    def __init__(
        self,
        in_channels: int,
        hidden_channels: int,
        out_channels: int,
        num_layers: int,
        dropout: float,
    ) -> None:
        super().__init__()
        sizes = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.convs = torch.nn.ModuleList(
            GraphConv(a, b, aggr="add") for a, b in zip(sizes[:-1], sizes[1:], strict=True)
        )
        self.dropout = dropout

    def forward(self, x: Tensor, edge_index: Tensor, edge_weight: Tensor) -> Tensor:
        """Class logits of every node of the (sub)graph."""
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index, edge_weight)
            if i < len(self.convs) - 1:
                x = F.dropout(F.relu(x), p=self.dropout, training=self.training)
        return x

    @torch.no_grad()
    def inference(self, x_all: Tensor, loader: NeighborLoader, device: torch.device) -> Tensor:
        """Layer-wise exact inference over full neighbourhoods (PyG's ``reddit.py`` pattern)."""
        for i, conv in enumerate(self.convs):
            xs = []
            for batch in loader:
                x = x_all[batch.n_id].to(device)
                w = batch.edge_weight.to(device)
                x = conv(x, batch.edge_index.to(device), w)[: batch.batch_size]
                xs.append((F.relu(x) if i < len(self.convs) - 1 else x).cpu())
            x_all = torch.cat(xs, dim=0)
        return x_all


def train_saint(spec: dict[str, Any]) -> dict[str, Any]:
    """GraphSAINT random-walk sampling, as PyG's ``examples/graph_saint.py``.

    ``spec["normalisation"]`` picks the model and the debiasing:

    * ``"node_norm"`` (the like-for-like comparison): GraphSAGE, as gnnscale trains, with the
      example's loss ``(cross_entropy * node_norm)[train_mask].sum()``;
    * ``"example"``: the example's ``--use_normalization`` network as well, ``GraphConv``
      layers with ``aggr="add"`` weighted by ``edge_norm * 1 / in-degree`` (:class:`SAINTNet`).
    """
    torch.manual_seed(spec["seed"])
    device, m, d = _device(), spec["model"], spec["data"]
    example = spec["normalisation"] == "example"
    data = _graph(spec)
    if example:
        col = data.edge_index[1]
        data.edge_weight = 1.0 / degree(col, data.num_nodes)[col]  # in-degree normalisation
    Path(spec["cache_dir"]).mkdir(parents=True, exist_ok=True)  # node_norm/edge_norm, once
    kwargs = spec["loader"]
    saint = dict(
        batch_size=d["batch_size"],
        walk_length=d["walk_length"],
        num_steps=d["num_steps"],
        sample_coverage=d["sample_coverage"],
        save_dir=spec["cache_dir"],
        **kwargs,
    )
    if sampling_backend() == "none":
        loader: Any = SAINTLoader(data, sampler="random_walk", **saint)
    else:
        loader = GraphSAINTRandomWalkSampler(data, log=False, **saint)
    subgraph_loader = _neighbors(
        copy.copy(data), [-1], batch_size=spec["eval_batch_size"], **kwargs
    )
    classes = int(data.y.max()) + 1
    model: torch.nn.Module
    if example:
        width, depth = m["hidden_channels"], m["num_layers"]
        model = SAINTNet(data.num_features, width, classes, depth, m["dropout"])
    else:
        model = GraphSAGE(
            data.num_features,
            m["hidden_channels"],
            m["num_layers"],
            out_channels=classes,
            dropout=m["dropout"],
            norm=m["norm"],
        )
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=m["lr"])

    def train_epoch() -> tuple[float, int, int, int]:
        model.train()
        total_loss = loss_nodes = rows = batches = 0
        for batch in loader:
            batch = batch.to(device)
            optimizer.zero_grad()
            if example:
                with _autocast(spec, device):
                    out = model(batch.x, batch.edge_index, batch.edge_norm * batch.edge_weight)
            else:
                with _autocast(spec, device):
                    out = model(batch.x, batch.edge_index)
            loss = F.cross_entropy(out.float(), batch.y, reduction="none")
            loss = (loss * batch.node_norm)[batch.train_mask].sum()
            loss.backward()
            optimizer.step()
            num_train = int(batch.train_mask.sum())
            total_loss += loss.item() * num_train
            loss_nodes += num_train
            rows += batch.num_nodes
            batches += 1
        return total_loss, loss_nodes, rows, batches

    @torch.no_grad()
    def evaluate() -> tuple[float, float]:
        model.eval()
        if example:
            with _autocast(spec, device):
                return _accuracy(model.inference(data.x, subgraph_loader, device), data)
        with _autocast(spec, device):
            return _accuracy(model.inference(subgraph_loader, device).cpu(), data)

    result = _run_epochs(spec, train_epoch, evaluate, device)
    result["row_bytes"] = _row_bytes(data)
    result["loader_only_s"] = _loader_only_s(loader)
    if example:
        norm = loader.edge_norm
        result["edge_norm"] = {"max": float(norm.max()), "mean": float(norm.mean())}
    return result


TRAINERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "neighbor": train_neighbor,
    "cluster": train_cluster,
    "saint": train_saint,
}
