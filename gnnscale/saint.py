"""GraphSAINT's subgraph samplers in tensor operations: PyG's, without torch-sparse.

PyG's ``GraphSAINTNodeSampler``, ``GraphSAINTEdgeSampler`` and ``GraphSAINTRandomWalkSampler``
(Zeng et al., 2020, "GraphSAINT: Graph Sampling Based Inductive Learning Method") hold the graph
as a torch-sparse ``SparseTensor``: random walks and induced subgraphs are its kernels, and the
package is not on PyPI as a wheel. :class:`SAINTLoader` draws the same subgraphs with the same
normalisation from a CSR of plain tensors: every walk advances a step at once, the induced
subgraph is the sampled nodes' out-edges whose target was sampled too.

The batches are PyG's: ``Data`` with every node and edge attribute of the sampled nodes and
edges, and ``node_norm``/``edge_norm`` when ``sample_coverage > 0``, computed as PyG computes
them: ``node_norm = steps / (times sampled) / N``, ``edge_norm = (times its source was sampled)
/ (times it was sampled)`` (clamped to ``1e4``; never sampled: ``0.1``). The edge sampler draws
edge ``(u, v)`` with probability proportional to ``in_degree(u) + out_degree(v)``, as PyG's does
(the paper writes ``1 / deg(u) + 1 / deg(v)``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor
from torch.utils.data import DataLoader
from torch_geometric.data import Data

__all__ = ["NORM_FILE", "SAINTLoader", "induced_subgraph", "random_walks"]

NORM_FILE = "norm.pt"  # node_norm and edge_norm, tensors alone (read with weights_only)


def random_walks(rowptr: Tensor, col: Tensor, start: Tensor, walk_length: int) -> Tensor:
    """``(len(start), walk_length + 1)`` uniform random walks along out-edges of a CSR.

    A walk at a node without out-edges stays there (as torch-sparse's ``random_walk``).
    """
    walks = torch.empty(start.numel(), walk_length + 1, dtype=torch.long)
    at = walks[:, 0] = start.long()
    for step in range(1, walk_length + 1):
        begin = rowptr.index_select(0, at)
        degree = rowptr.index_select(0, at + 1) - begin
        pick = (torch.rand(at.numel(), dtype=torch.float64) * degree).long()
        moved = col.index_select(0, (begin + pick).clamp_(max=max(col.numel() - 1, 0)))
        at = walks[:, step] = torch.where(degree > 0, moved, at)
    return walks


def induced_subgraph(rowptr: Tensor, col: Tensor, nodes: Tensor) -> tuple[Tensor, Tensor]:
    """The edges among sorted, distinct ``nodes``: ``(2, e)`` local ids and their CSR positions.

    Sources in ``nodes``' order, each one's targets in the CSR's order.
    """
    begin = rowptr.index_select(0, nodes)
    degree = rowptr.index_select(0, nodes + 1) - begin
    owner = torch.repeat_interleave(torch.arange(nodes.numel()), degree)
    first = degree.cumsum(0) - degree
    position = (begin - first).index_select(0, owner) + torch.arange(owner.numel())
    local = torch.full((rowptr.numel() - 1,), -1, dtype=torch.long)
    local[nodes] = torch.arange(nodes.numel())
    target = local.index_select(0, col.index_select(0, position))
    kept = target >= 0
    edge_index = torch.stack([owner[kept], target[kept]])
    return edge_index, position[kept]


class SAINTLoader(DataLoader):
    """``num_steps`` GraphSAINT subgraphs an epoch, as PyG's ``GraphSAINT*Sampler`` loaders.

    Args:
        data: The graph (``edge_index`` on the CPU).
        batch_size: Nodes (``node``: sources of uniformly drawn edges), edges (``edge``) or
            walk roots (``random_walk``) per subgraph.
        sampler: ``node``, ``edge`` or ``random_walk``.
        walk_length: Steps of each random walk (``random_walk``).
        num_steps: Subgraphs per epoch.
        sample_coverage: Subgraphs per node to sample up front for the normalisation; 0: none.
        save_dir: A folder to read the normalisation from (:data:`NORM_FILE`) if it holds one,
            else to write it into.
        **kwargs: ``DataLoader``'s (workers, pinning).
    """

    def __init__(
        self,
        data: Data,
        batch_size: int,
        sampler: Literal["node", "edge", "random_walk"] = "random_walk",
        walk_length: int = 2,
        num_steps: int = 1,
        sample_coverage: int = 0,
        save_dir: str | Path | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("dataset", None)
        kwargs.pop("collate_fn", None)
        if data.edge_index is None or data.edge_index.is_cuda:
            raise ValueError("SAINTLoader needs a graph with edge_index on the CPU")
        if "node_norm" in data or "edge_norm" in data:
            raise ValueError("the graph already has node_norm or edge_norm attributes")
        self.data, self.method = data, sampler
        self.subgraph_size, self.walk_length = batch_size, walk_length
        self.num_steps, self.sample_coverage = num_steps, sample_coverage
        self.N, self.E = int(data.num_nodes), int(data.edge_index.size(1))
        row, col = data.edge_index
        self.edge_id = torch.argsort(row, stable=True)  # CSR position -> edge id
        self.row, self.col = row[self.edge_id], col[self.edge_id]
        out_degree = torch.bincount(row, minlength=self.N)
        self.rowptr = torch.cat([out_degree.new_zeros(1), out_degree.cumsum(0)])
        if sampler == "edge":  # PyG's weights; its draw, a [batch, E] matrix, by inverse CDF
            in_degree = torch.bincount(col, minlength=self.N)
            weight = (in_degree[self.row] + out_degree[self.col]).double()
            self.cdf = weight.cumsum(0)
        super().__init__(self, batch_size=1, collate_fn=self._collate, **kwargs)  # type: ignore[arg-type]
        if sample_coverage > 0:
            path = None if save_dir is None else Path(save_dir) / NORM_FILE
            if path is not None and path.exists():
                norm = torch.load(path, weights_only=True)
                self.node_norm, self.edge_norm = norm["node_norm"], norm["edge_norm"]
            else:
                self.node_norm, self.edge_norm = self._compute_norm()
                if path is not None:
                    torch.save({"node_norm": self.node_norm, "edge_norm": self.edge_norm}, path)

    def __len__(self) -> int:
        return self.num_steps

    def _sample_nodes(self) -> Tensor:
        k = self.subgraph_size
        if self.method == "node":
            return self.row[torch.randint(0, self.E, (k,))]
        if self.method == "edge":
            u = torch.rand(k, dtype=torch.float64) * self.cdf[-1]
            edge = torch.searchsorted(self.cdf, u, right=True).clamp_(max=self.E - 1)
            return torch.cat([self.col[edge], self.row[edge]])
        start = torch.randint(0, self.N, (k,))
        return random_walks(self.rowptr, self.col, start, self.walk_length).view(-1)

    def __getitem__(self, idx: int) -> tuple[Tensor, Tensor, Tensor]:
        nodes = self._sample_nodes().unique()
        edge_index, position = induced_subgraph(self.rowptr, self.col, nodes)
        return nodes, edge_index, self.edge_id[position]

    def _collate(self, items: list[tuple[Tensor, Tensor, Tensor]]) -> Data:
        (nodes, edge_index, edge_id) = items[0]
        data = self.data.__class__()
        data.num_nodes = nodes.numel()
        data.edge_index = edge_index
        for key, item in self.data:
            if key in ("edge_index", "num_nodes"):
                continue
            if isinstance(item, Tensor) and item.size(0) == self.N:
                data[key] = item[nodes]
            elif isinstance(item, Tensor) and item.size(0) == self.E:
                data[key] = item[edge_id]
            else:
                data[key] = item
        if self.sample_coverage > 0:
            data.node_norm = self.node_norm[nodes]
            data.edge_norm = self.edge_norm[edge_id]
        return data

    def _compute_norm(self) -> tuple[Tensor, Tensor]:
        """PyG's estimate: epochs of subgraphs until nodes were drawn ``coverage`` times each."""
        node_count = torch.zeros(self.N)
        edge_count = torch.zeros(self.E)
        num_samples = drawn = 0
        while drawn < self.N * self.sample_coverage:
            for i in range(self.num_steps):
                nodes, _, edge_id = self[i]
                node_count.index_add_(0, nodes, torch.ones(nodes.numel()))
                edge_count.index_add_(0, edge_id, torch.ones(edge_id.numel()))
                drawn += nodes.numel()
            num_samples += self.num_steps
        source_count = node_count[self.data.edge_index[0]]
        edge_norm = (source_count / edge_count).clamp_(0, 1e4)
        edge_norm[torch.isnan(edge_norm)] = 0.1
        node_count[node_count == 0] = 0.1
        return num_samples / node_count / self.N, edge_norm
