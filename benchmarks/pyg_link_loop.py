"""The link job as a plain PyG loop: ``LinkNeighborLoader`` and ``to_hetero``, as PyG's examples.

A row of ``figures.py peers`` (benchmarks/peers_tasks.py): the loop a PyG user writes for
link_prediction_pinsage's job without gnnscale, on the graph and split ``peers_tasks.dump``
wrote, with the same model and settings as ``peer_dgl_tasks.py``'s (inputs per node type,
sparse tables with SparseAdam, ``to_hetero`` of two ``SAGEConv`` layers with relations
averaged, dot products over sqrt(width), BCE, one binary negative a positive, 2 micro-batches a
step). The loader samples with PyG's backend where one is installed, else with gnnscale's
``HopSampler`` (PyG's loaders cannot sample without one). Training alone, no evaluation; one
``PYG_RESULT {json}`` line::

    python benchmarks/pyg_link_loop.py --graph link.npz --epochs 3 [--bf16]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.data import HeteroData
from torch_geometric.loader import LinkNeighborLoader
from torch_geometric.nn import SAGEConv, to_hetero
from torch_geometric.sampler import NegativeSampling

from gnnscale.sampling import HopSampler, sampling_backend

TARGET = ("user", "rates", "item")


class GNN(nn.Module):
    """Two SAGE layers, ReLU between (``to_hetero`` makes it one per relation)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv1, self.conv2 = SAGEConv(width, width), SAGEConv(width, width)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        """Both layers."""
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


class Model(nn.Module):
    """Inputs per node type (linear layers, sparse tables), the encoder, dot-product scores."""

    def __init__(self, data: HeteroData, width: int = 64) -> None:
        super().__init__()
        self.width = width
        self.inputs = nn.ModuleDict(
            {t: nn.Linear(data[t].x.size(1), width) for t in data.node_types if "x" in data[t]}
        )
        self.tables = nn.ModuleDict(
            {
                t: nn.Embedding(data[t].num_nodes, width, sparse=True)
                for t in data.node_types
                if "x" not in data[t]
            }
        )
        self.encoder = to_hetero(GNN(width), data.metadata(), aggr="mean")

    def forward(self, batch: HeteroData) -> Tensor:
        """The scores of the batch's labelled pairs."""
        x = {t: self.inputs[t](batch[t].x) for t in self.inputs}
        x |= {t: self.tables[t](batch[t].n_id) for t in self.tables}
        h = self.encoder(x, batch.edge_index_dict)
        src, dst = batch[TARGET].edge_label_index
        return (h["user"][src] * h["item"][dst]).sum(-1) * self.width**-0.5


def load(path: str) -> tuple[HeteroData, Tensor, dict[tuple[str, str, str], list[int]], int]:
    """The training graph, its supervision pairs, the fan-outs and the batch size."""
    files = np.load(path)
    data = HeteroData()
    for key, value in files.items():
        if key.startswith("num/"):
            data[key[4:]].num_nodes = int(value)
        elif key.startswith("x/"):
            data[key[2:]].x = torch.from_numpy(value)
        elif key.startswith("edge/train/"):
            data[tuple(key.split("/")[2].split("__"))].edge_index = torch.from_numpy(value)
    fanout = {tuple(k.split("__")): v for k, v in json.loads(str(files["fanout_json"])).items()}
    return data, torch.from_numpy(files["sup"]), fanout, int(files["batch_size"])  # type: ignore[return-value]


def main() -> None:
    """Train, print the one PYG_RESULT line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    data, sup, fanout, batch_size = load(args.graph)
    sampler = HopSampler(data, fanout) if sampling_backend() == "none" else None
    loader = LinkNeighborLoader(
        data,
        num_neighbors=fanout,  # type: ignore[arg-type]
        edge_label_index=(TARGET, sup),
        neg_sampling=NegativeSampling("binary", 1),
        batch_size=batch_size,
        shuffle=True,
        neighbor_sampler=sampler,
    )
    model = Model(data)
    dense = [p for name, p in model.named_parameters() if not name.startswith("tables.")]
    opts = [
        torch.optim.Adam(dense, lr=0.01),
        torch.optim.SparseAdam(list(model.tables.parameters()), lr=0.01),
    ]
    train_s = []
    for _ in range(args.epochs):
        start, pending = time.perf_counter(), 0
        for batch in loader:
            with torch.autocast("cpu", torch.bfloat16, enabled=args.bf16):
                score = model(batch).float()
            loss = F.binary_cross_entropy_with_logits(score, batch[TARGET].edge_label)
            (loss / 2).backward()
            pending += 1
            if pending == 2:
                for opt in opts:
                    opt.step()
                    opt.zero_grad()
                pending = 0
        if pending:
            for opt in opts:
                opt.step()
                opt.zero_grad()
        train_s.append(time.perf_counter() - start)
    backend = sampling_backend()
    result = {"train_s": train_s, "sampler": "HopSampler" if backend == "none" else backend}
    print("PYG_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
