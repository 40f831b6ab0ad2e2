import itertools
import math

import pytest
import torch
from torch_geometric.data import Data, HeteroData
from torch_geometric.loader import LinkNeighborLoader, NeighborLoader
from torch_geometric.sampler import NeighborSampler

import gnnscale.sampling.hops as hops
import gnnscale.sampling.sampler as gsampler
from gnnscale import LoaderArgs, NeighborDataModule, make_synthetic_graph
from gnnscale.handshake import BatchRequest
from gnnscale.sampling import HopSampler, sample_hops
from gnnscale.testing import TINY, requires_torch_sparse, users_items_tags


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


@pytest.mark.parametrize("id_range", [50, 5_000, 200_000])
def test_relabelling_by_a_table_equals_relabelling_by_a_sort(monkeypatch, id_range):
    # Known ids keep their places, new ones follow in id order, repeats share one local id.
    g = torch.Generator().manual_seed(id_range)
    for known_size, found_size in [(0, 40), (30, 0), (30, 400), (300, 2_000)]:
        known = torch.randperm(id_range, generator=g)[:known_size]
        drawn = torch.randint(0, id_range, (found_size,), generator=g)
        found = torch.cat([known[: known_size // 2], drawn])
        by = {}
        for name, dense in [("table", 10**12), ("sort", 0)]:
            monkeypatch.setattr(hops, "DENSE_RANGE", dense)
            by[name] = hops._add_new(known, found)
        (local, added), (local_s, added_s) = by["table"], by["sort"]
        assert torch.equal(local, local_s) and torch.equal(added, added_s)
        assert torch.equal(torch.cat([known, added])[local], found)
        assert bool((added[1:] > added[:-1]).all()) and not bool(torch.isin(added, known).any())


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


@requires_torch_sparse
def test_switched_off_it_leaves_sampling_to_pygs_backend(graph, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("sample_hops was called")

    monkeypatch.setattr(gsampler, "sample_typed_hops", refuse)
    off = HopSampler(graph, [3], vectorized=False)
    batch = next(iter(NeighborLoader(graph, [3], batch_size=8, neighbor_sampler=off)))
    assert batch.batch_size == 8


@pytest.mark.parametrize(
    "choice,used",
    [("auto", True), ("vectorized", True), pytest.param("pyg", False, marks=requires_torch_sparse)],
)
def test_the_loader_switch(tmp_path, monkeypatch, choice, used):
    calls = []
    real = gsampler.sample_hops
    monkeypatch.setattr(gsampler, "sample_hops", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(gsampler.torch_geometric.typing, "WITH_PYG_LIB", False)
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


def _typed_graph(seed: int = 0) -> HeteroData:
    """Users, items, tags: every node type reached two ways, degrees from 0 to dozens."""
    return users_items_tags((300, 200, 20), 3000, 150, 600, features=3, seed=seed)


TYPED_FANOUT = {
    ("user", "buys", "item"): [4, 2],
    ("item", "bought_by", "user"): [3, -1],
    ("item", "has", "tag"): [5, 0],
    ("tag", "of", "item"): [2, 3],
}


def _check_typed_batch(data, out, seeds, fanout, replace=False):
    """What every heterogeneous batch holds: PyG's contract, fan-outs, real edges, hops."""
    node, counts = out.node, out.num_sampled_nodes
    for t, seed in seeds.items():
        assert torch.equal(node[t][: seed.numel()], seed)
    for t, ids in node.items():
        assert ids.unique().numel() == ids.numel(), t  # every node once, per type
        assert sum(counts[t]) == ids.numel()
    bounds = {t: [0, *itertools.accumulate(c)] for t, c in counts.items()}
    for edge_type, k in fanout.items():
        src_t, _, dst_t = edge_type
        row, col, edge = out.row[edge_type], out.col[edge_type], out.edge[edge_type]
        # In-edges of their target: the sampler's CSC positions, mapped through perm by PyG.
        sampler = NeighborSampler(data, {edge_type: [-1] for edge_type in fanout})
        key = sampler.to_rel_type[edge_type]
        colptr, csc_row = sampler.colptr_dict[key], sampler.row_dict[key]
        assert torch.equal(csc_row[edge], node[src_t][row])
        dst = node[dst_t][col]
        assert bool(((edge >= colptr[dst]) & (edge < colptr[dst + 1])).all())
        assert sum(out.num_sampled_edges[edge_type]) == edge.numel()
        first = 0
        for h, count in enumerate(out.num_sampled_edges[edge_type]):
            c = col[first : first + count]
            lo, hi = bounds[dst_t][h], bounds[dst_t][h + 1]  # targets: the last hop's nodes
            assert bool(((c >= lo) & (c < hi)).all())
            assert bool((row[first : first + count] < bounds[src_t][h + 2]).all())
            degree = (colptr[1:] - colptr[:-1])[node[dst_t][lo:hi]]
            drawn = torch.bincount(c - lo, minlength=hi - lo)
            want = degree if k[h] < 0 else degree.clamp(max=k[h])
            if replace and k[h] > 0:
                want = torch.where(degree > 0, k[h], 0)
            assert torch.equal(drawn, want), (edge_type, h)
            if not replace:
                pairs = c * (edge.max() + 1) + edge[first : first + count]
                assert pairs.unique().numel() == count
            first += count


@pytest.mark.parametrize("replace", [False, True])
def test_typed_hops_draw_each_edge_types_fanout_from_the_last_hops_nodes(replace):
    data = _typed_graph()
    sampler = HopSampler(data, TYPED_FANOUT, replace=replace)
    seeds = {"user": torch.randperm(300)[:40], "tag": torch.tensor([3, 7])}
    out = sampler.sample_seeds(seeds)
    _check_typed_batch(data, out, seeds, TYPED_FANOUT, replace)
    assert set(out.node) == {"user", "item", "tag"}
    assert out.num_sampled_nodes["item"][0] == 0 and out.num_sampled_nodes["item"][1] > 0


def test_typed_hops_through_pygs_loader_give_the_input_graphs_edges():
    data = _typed_graph()
    buys = ("user", "buys", "item")
    data[buys].edge_attr = torch.arange(data[buys].num_edges)
    loader = NeighborLoader(
        data,
        TYPED_FANOUT,
        input_nodes="user",
        batch_size=16,
        neighbor_sampler=HopSampler(data, TYPED_FANOUT),
    )
    batch = next(iter(loader))
    assert batch["user"].batch_size == 16
    for edge_type in TYPED_FANOUT:
        store = batch[edge_type]
        src, dst = (
            batch[edge_type[0]].n_id[store.edge_index[0]],
            batch[edge_type[2]].n_id[store.edge_index[1]],
        )
        assert torch.equal(torch.stack([src, dst]), data[edge_type].edge_index[:, store.e_id])
    assert torch.equal(batch[buys].edge_attr, batch[buys].e_id)
    assert torch.equal(batch["item"].x, data["item"].x[batch["item"].n_id])


def test_link_batches_carry_their_pairs_and_negatives():
    data = _typed_graph()
    buys = ("user", "buys", "item")
    pairs = data[buys].edge_index[:, :200]
    loader = LinkNeighborLoader(
        data,
        TYPED_FANOUT,
        edge_label_index=(buys, pairs),
        neg_sampling="binary",
        batch_size=32,
        neighbor_sampler=HopSampler(data, TYPED_FANOUT),
    )
    batch = next(iter(loader))
    store = batch[buys]
    assert store.edge_label.tolist() == [1.0] * 32 + [0.0] * 32
    users, items = batch["user"].n_id, batch["item"].n_id
    label_pairs = torch.stack([users[store.edge_label_index[0]], items[store.edge_label_index[1]]])
    assert torch.equal(label_pairs[:, :32], pairs[:, store.input_id])
    # Each pair's ends are seeds: both have their neighbourhoods sampled.
    for t, ends in (("user", store.edge_label_index[0]), ("item", store.edge_label_index[1])):
        assert bool((ends < batch[t].num_sampled_nodes[0]).all())


def test_disjoint_subgraphs_are_each_seeds_own():
    data = _typed_graph()
    sampler = HopSampler(data, TYPED_FANOUT, disjoint=True)
    seeds = {"user": torch.tensor([5, 5, 9])}  # a seed twice: two subgraphs
    out = sampler.sample_seeds(seeds)
    for t in out.node:  # a node once per subgraph, in as many subgraphs as reach it
        key = out.batch[t] * 1000 + out.node[t]
        assert key.unique().numel() == key.numel()
    for edge_type in TYPED_FANOUT:  # an edge stays within its seed's subgraph
        src_t, _, dst_t = edge_type
        row, col = out.row[edge_type], out.col[edge_type]
        assert torch.equal(out.batch[src_t][row], out.batch[dst_t][col])
    users = out.node["user"][out.batch["user"] == 0]
    again = out.node["user"][out.batch["user"] == 1]
    assert users[0] == again[0] == 5
    # A seed's subgraph is what the joint sampler would draw from it alone.
    torch.manual_seed(0)
    alone = HopSampler(data, TYPED_FANOUT).sample_seeds({"user": torch.tensor([9])})
    torch.manual_seed(0)
    both = HopSampler(data, TYPED_FANOUT, disjoint=True).sample_seeds({"user": torch.tensor([9])})
    for t in alone.node:
        assert torch.equal(alone.node[t].sort().values, both.node[t].sort().values)


def test_what_it_does_not_cover_goes_to_pygs_sampler(monkeypatch):
    data = _typed_graph()
    calls = []
    monkeypatch.setattr(
        NeighborSampler, "_sample", lambda self, seed, *a, **k: calls.append(seed) or 1 / 0
    )
    monkeypatch.setattr(gsampler.torch_geometric.typing, "WITH_TORCH_SPARSE", True)
    induced = HopSampler(data, TYPED_FANOUT, subgraph_type="induced")
    with pytest.raises(ZeroDivisionError):
        induced.sample_seeds({"user": torch.tensor([1])})
    assert len(calls) == 1
    HopSampler(data, TYPED_FANOUT).sample_seeds({"user": torch.tensor([1])})
    assert len(calls) == 1


def test_what_no_backend_here_would_sample_is_refused_at_construction(monkeypatch):
    monkeypatch.setattr(gsampler.torch_geometric.typing, "WITH_PYG_LIB", False)
    monkeypatch.setattr(gsampler.torch_geometric.typing, "WITH_TORCH_SPARSE", False)
    data = _typed_graph()
    with pytest.raises(ValueError, match="induced.*needs PyG's pyg-lib or torch-sparse"):
        HopSampler(data, TYPED_FANOUT, subgraph_type="induced")
    # torch-sparse would sample untimed and unweighted without a word
    monkeypatch.setattr(gsampler.torch_geometric.typing, "WITH_TORCH_SPARSE", True)
    data["user"].time = torch.arange(data["user"].num_nodes)
    with pytest.raises(ValueError, match="time_attr='time' need gnnscale's sampler"):
        HopSampler(data, TYPED_FANOUT, time_attr="time", vectorized=False)
    with pytest.raises(ValueError, match="strict and window"):
        HopSampler(data, TYPED_FANOUT, strict=True, vectorized=False)
