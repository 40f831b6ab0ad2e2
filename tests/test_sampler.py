import itertools
import math

import pytest
import torch
from torch_geometric.data import Data, HeteroData
from torch_geometric.loader import NeighborLoader
from torch_geometric.sampler import NeighborSampler

import gnnscale.sampler as gsampler
from gnnscale import LoaderArgs, NeighborDataModule, make_synthetic_graph
from gnnscale.handshake import BatchRequest
from gnnscale.sampler import HopSampler, sample_hops
from gnnscale.testing import TINY, requires_sampler


def _csc(data: Data) -> tuple[torch.Tensor, torch.Tensor]:
    sampler = NeighborSampler(data, [-1])
    return sampler.colptr, sampler.row


@pytest.fixture(scope="module")
def graph() -> Data:
    return make_synthetic_graph(TINY)


@pytest.mark.parametrize("fanouts", [[5, 4, 3], [-1, 2], [1000]])
@pytest.mark.parametrize("replace", [False, True])
def test_each_hop_draws_fanout_distinct_in_edges_of_the_last_hops_nodes(graph, fanouts, replace):
    colptr, row = _csc(graph)
    degree = colptr[1:] - colptr[:-1]
    seeds = torch.randperm(graph.num_nodes)[:64]
    out = sample_hops(colptr, row, seeds, fanouts, replace)
    node, src, dst, edge = out.node, out.row, out.col, out.edge
    assert torch.equal(node[:64], seeds) and node.unique().numel() == node.numel()
    assert sum(out.num_sampled_nodes) == node.numel()
    assert sum(out.num_sampled_edges) == edge.numel() and len(out.num_sampled_edges) == len(fanouts)
    # Every edge is a real in-edge of its target, its source the CSC's row, in target order.
    assert torch.equal(row[edge], node[src])
    assert bool(((edge >= colptr[node[dst]]) & (edge < colptr[node[dst] + 1])).all())
    assert bool((dst[1:] >= dst[:-1]).all())
    # Hop h's edges go into hop h-1's new nodes and come from nodes reached by hop h.
    bounds = [0, *itertools.accumulate(out.num_sampled_nodes)]
    first = 0
    for h, (k, count) in enumerate(zip(fanouts, out.num_sampled_edges, strict=True)):
        d, s = dst[first : first + count], src[first : first + count]
        assert bool(((d >= bounds[h]) & (d < bounds[h + 1])).all())
        assert bool((s < bounds[h + 2]).all())
        # Each target drew min(degree, k) edges (k with replacement), distinct without.
        targets = torch.arange(bounds[h], bounds[h + 1])
        drawn = torch.bincount(d - bounds[h], minlength=targets.numel())
        deg = degree[node[targets]]
        want = deg if k < 0 else (torch.where(deg > 0, k, 0) if replace else deg.clamp(max=k))
        assert torch.equal(drawn, want)
        if not replace:
            key = d * (edge.max() + 1) + edge[first : first + count]
            assert key.unique().numel() == count
        first += count
    # A node first reached at hop h is at distance h: each hop's new nodes are the BFS's.
    hop = torch.full((node.numel(),), len(fanouts) + 1)
    hop[:64] = 0
    for h in range(1, len(fanouts) + 1):
        reached = src[hop[dst] == h - 1]
        hop[reached[hop[reached] > h]] = h
    assert torch.bincount(hop).tolist()[: len(fanouts) + 1] == out.num_sampled_nodes


@pytest.mark.parametrize("replace", [False, True])
def test_draws_are_uniform(replace):
    # One node with 6 in-edges, 2 drawn 12,000 times: each pair (or ordered pair, with
    # replacement) as often as the others, within 5 standard deviations.
    colptr, row = torch.tensor([0, 6, 6, 6, 6, 6, 6, 6]), torch.arange(1, 7)
    draws = 12_000
    seen: dict[tuple[int, ...], int] = {}
    torch.manual_seed(0)
    for _ in range(draws):
        edges = sample_hops(colptr, row, torch.tensor([0]), [2], replace).edge.tolist()
        key = tuple(edges) if replace else tuple(sorted(edges))
        seen[key] = seen.get(key, 0) + 1
    outcomes = 36 if replace else 15
    assert len(seen) == outcomes
    p = 1 / outcomes
    sd = math.sqrt(draws * p * (1 - p))
    assert all(abs(n - draws * p) < 5 * sd for n in seen.values()), seen


def test_a_seed_gives_the_same_batch_and_another_seed_another():
    data = make_synthetic_graph(TINY)
    colptr, row = _csc(data)
    seeds = torch.arange(100)
    torch.manual_seed(3)
    a = sample_hops(colptr, row, seeds, [5, 5])
    torch.manual_seed(3)
    b = sample_hops(colptr, row, seeds, [5, 5])
    torch.manual_seed(4)
    c = sample_hops(colptr, row, seeds, [5, 5])
    assert torch.equal(a.node, b.node) and torch.equal(a.edge, b.edge)
    assert not torch.equal(a.edge, c.edge)


def test_pygs_loader_gets_the_input_graphs_edge_ids(graph):
    # e_id indexes the input's edge list (PyG maps CSC positions back), as with PyG's backends.
    data = graph.clone()
    data.edge_attr = torch.arange(data.num_edges)
    sampler = HopSampler(data, [4, 3])
    loader = NeighborLoader(data, [4, 3], batch_size=32, neighbor_sampler=sampler)
    batch = next(iter(loader))
    assert torch.equal(batch.edge_attr, batch.e_id)
    src, dst = batch.n_id[batch.edge_index]
    assert torch.equal(torch.stack([src, dst]), data.edge_index[:, batch.e_id])
    assert batch.num_sampled_nodes[0] == 32


@requires_sampler
def test_what_it_does_not_cover_goes_to_pygs_backend(graph, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("sample_hops was called")

    monkeypatch.setattr(gsampler, "sample_hops", refuse)
    hetero = HeteroData()
    hetero["a"].num_nodes = graph.num_nodes
    hetero["a", "to", "a"].edge_index = graph.edge_index
    batch = next(iter(NeighborLoader(hetero, [3], input_nodes="a", batch_size=8)))
    assert batch["a"].batch_size == 8
    off = HopSampler(graph, [3])
    off.vectorized = False
    batch = next(iter(NeighborLoader(graph, [3], batch_size=8, neighbor_sampler=off)))
    assert batch.batch_size == 8


@pytest.mark.parametrize("choice,used", [("auto", True), ("vectorized", True), ("pyg", False)])
def test_the_loader_switch(tmp_path, monkeypatch, choice, used):
    calls = []
    real = gsampler.sample_hops
    monkeypatch.setattr(gsampler, "sample_hops", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(gsampler.torch_geometric.typing, "WITH_PYG_LIB", False)
    if not used and not gsampler.torch_geometric.typing.WITH_TORCH_SPARSE:
        pytest.skip("PyG's sampling needs torch-sparse or pyg-lib")
    dm = NeighborDataModule(
        root=tmp_path,
        synthetic=TINY,
        num_neighbors=[5, 5],
        batch_size=64,
        loader=LoaderArgs(sampler=choice),
    )
    dm.configure_batches(BatchRequest(2))
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch.layout.num_sampled_nodes[0] == 64
    assert bool(calls) == used
