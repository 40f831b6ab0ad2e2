import pytest
import torch
from torch_geometric.data import Data

from gnnscale import make_synthetic_graph
from gnnscale.saint import NORM_FILE, SAINTLoader, induced_subgraph, random_walks
from gnnscale.testing import TINY


@pytest.fixture(scope="module")
def graph() -> Data:
    data = make_synthetic_graph(TINY)
    data.edge_weight = torch.arange(data.num_edges, dtype=torch.float)
    return data


def _csr(data):
    loader = SAINTLoader(data, 10)
    return loader.rowptr, loader.col


def test_walks_step_along_out_edges_uniformly_and_stay_where_there_are_none():
    # 0 -> {1, 2, 3}; 1 -> 0; 2, 3: no out-edges.
    data = Data(edge_index=torch.tensor([[0, 0, 0, 1], [1, 2, 3, 0]]), num_nodes=4)
    rowptr, col = _csr(data)
    torch.manual_seed(0)
    walks = random_walks(rowptr, col, torch.zeros(30_000, dtype=torch.long), 2)
    assert bool((walks[:, 0] == 0).all())
    counts = torch.bincount(walks[:, 1], minlength=4)
    assert counts[0] == 0 and bool((counts[1:] - 10_000).abs().lt(500).all()), counts
    # From 1 the walk returns to 0; from 2 or 3 it stays.
    second = walks[:, 2]
    assert torch.equal(second[walks[:, 1] == 1], torch.zeros_like(second[walks[:, 1] == 1]))
    stuck = walks[:, 1] >= 2
    assert torch.equal(second[stuck], walks[stuck, 1])


def test_the_induced_subgraph_is_every_edge_among_the_nodes(graph):
    rowptr, col = _csr(graph)
    nodes = torch.randperm(graph.num_nodes)[:700].sort().values
    edge_index, position = induced_subgraph(rowptr, col, nodes)
    src, dst = graph.edge_index
    inside = torch.zeros(graph.num_nodes, dtype=torch.bool)
    inside[nodes] = True
    want = {tuple(e) for e in graph.edge_index[:, inside[src] & inside[dst]].t().tolist()}
    got = nodes[edge_index]
    assert {tuple(e) for e in got.t().tolist()} == want
    assert got.size(1) == len(want)  # each edge once
    assert torch.equal(col[position], got[1])


@pytest.mark.parametrize("sampler", ["node", "edge", "random_walk"])
def test_batches_are_induced_subgraphs_with_their_attributes(graph, sampler):
    loader = SAINTLoader(graph, 200, sampler, num_steps=3, sample_coverage=2)
    batches = list(loader)
    assert len(batches) == 3
    for batch in batches:
        assert batch.x.size(0) == batch.num_nodes == batch.y.size(0) == batch.node_norm.numel()
        e_id = batch.edge_weight.long()  # the edge attribute is the edge's id
        assert torch.equal(batch.edge_norm, loader.edge_norm[e_id])
        # Each edge is the input's edge e_id, between the batch's copies of its endpoints.
        src, dst = graph.edge_index[:, e_id]
        assert torch.equal(batch.x[batch.edge_index[0]], graph.x[src])
        assert torch.equal(batch.x[batch.edge_index[1]], graph.x[dst])
        assert bool((batch.node_norm > 0).all()) and bool((batch.edge_norm >= 0).all())


def test_the_edge_sampler_needs_no_batch_by_edges_matrix(graph):
    # PyG's draws a [batch_size, num_edges] matrix: 300k x 36k floats (43 GB) here.
    loader = SAINTLoader(graph, 300_000, "edge")
    batch = next(iter(loader))
    assert batch.num_nodes > 0.9 * graph.num_nodes


def test_edge_draws_follow_pygs_weights():
    # 0 -> 1, 1 -> 2, 2 -> 0, 3 -> 0: weight in_degree(source) + out_degree(target).
    data = Data(edge_index=torch.tensor([[0, 1, 2, 3], [1, 2, 0, 0]]), num_nodes=4)
    loader = SAINTLoader(data, 1, "edge")
    weight = torch.tensor([2 + 1, 1 + 1, 1 + 1, 0 + 1], dtype=torch.float64)
    torch.manual_seed(0)
    u = torch.rand(40_000, dtype=torch.float64) * loader.cdf[-1]
    edge = torch.searchsorted(loader.cdf, u, right=True)
    share = torch.bincount(edge, minlength=4).double() / 40_000
    torch.testing.assert_close(share, weight / weight.sum(), atol=0.01, rtol=0)


def test_the_normalisation_is_saved_as_tensors_and_read_back(graph, tmp_path, monkeypatch):
    first = SAINTLoader(graph, 200, num_steps=5, sample_coverage=3, save_dir=tmp_path)
    saved = torch.load(tmp_path / NORM_FILE, weights_only=True)
    assert torch.equal(saved["node_norm"], first.node_norm)
    monkeypatch.setattr(SAINTLoader, "_compute_norm", lambda self: 1 / 0)
    second = SAINTLoader(graph, 200, num_steps=5, sample_coverage=3, save_dir=tmp_path)
    assert torch.equal(second.edge_norm, first.edge_norm)


def test_node_norm_is_the_inverse_of_how_often_a_node_is_drawn():
    # Node sampler on a star's leaves: each batch draws the source of one random edge.
    data = Data(edge_index=torch.tensor([[0, 0, 1, 2], [1, 2, 0, 0]]), num_nodes=3)
    torch.manual_seed(0)
    loader = SAINTLoader(data, 1, "node", num_steps=100, sample_coverage=2000)
    # Node 0 is the source of half the edges: drawn in half the batches, 1 and 2 a quarter each.
    want = torch.tensor([2.0, 4.0, 4.0]) / 3
    torch.testing.assert_close(loader.node_norm, want, rtol=0.1, atol=0)
