"""Sampling by time and by weight, held to its rules over many random graphs and seeds.

Each check reads a batch back to the input graph (an edge's CSC position through ``perm`` to its
id, then to its time) and compares with the rule, so a sampler that broke the rule for any edge,
hop or edge type fails here whatever its output looked like.
"""

import pytest
import torch
from torch_geometric.data import Data, HeteroData
from torch_geometric.loader import NeighborLoader
from torch_geometric.sampler import NodeSamplerInput
from torch_geometric.testing import MyFeatureStore, MyGraphStore

from gnnscale.sampling import HopSampler
from gnnscale.sampling.time import first_after, time_order

TYPES = {("user", "clicks", "item"): (30, 40), ("item", "seen_by", "user"): (40, 30)}
COUNTS = {"user": 30, "item": 40}


def _graph(seed, level, num_nodes=50, num_edges=400, span=30):
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, num_nodes, (2, num_edges), generator=g)
    edge_index = edge_index[:, torch.sort(edge_index[1], stable=True).indices]  # as a store holds
    data = Data(edge_index=edge_index, num_nodes=num_nodes)
    if level == "node":
        data.time = torch.randint(0, span, (num_nodes,), generator=g)
    else:
        data.time = torch.randint(0, span, (num_edges,), generator=g)
    return data


def _typed_graph(seed, level, span=30):
    g = torch.Generator().manual_seed(seed)
    data = HeteroData()
    for node_type, count in COUNTS.items():
        data[node_type].num_nodes = count
        if level == "node":
            data[node_type].time = torch.randint(0, span, (count,), generator=g)
    for edge_type, (n_src, n_dst) in TYPES.items():
        data[edge_type].edge_index = torch.stack(
            [
                torch.randint(0, n_src, (300,), generator=g),
                torch.randint(0, n_dst, (300,), generator=g),
            ]
        )
        if level == "edge":
            data[edge_type].time = torch.randint(0, span, (300,), generator=g)
    return data


def _stores(data):
    """``data`` as a (FeatureStore, GraphStore) pair: sorted by destination, not by time."""
    fs, gs = MyFeatureStore(), MyGraphStore()
    fs.put_tensor(data.time, group_name="default", attr_name="time", index=None)
    gs.put_edge_index(
        data.edge_index,
        edge_type=None,
        layout="coo",
        is_sorted=True,  # by destination; the sampler sorts each neighbourhood by time itself
        size=(data.num_nodes, data.num_nodes),
    )
    return fs, gs


def _sampled_times(sampler, data, out, seed_time, level):
    """Per edge type: each sampled edge's time and its root seed's time."""
    if isinstance(data, Data):
        parts = {None: (out.edge, out.col, out.batch, sampler.perm)}
        stores = {None: data}
    else:
        parts = {t: (out.edge[t], out.col[t], out.batch[t[-1]], sampler.perm.get(t)) for t in TYPES}
        stores = {t: data[t] for t in TYPES}
    found = {}
    for edge_type, (edge, col, batch, perm) in parts.items():
        ids = edge if perm is None else perm[edge]
        store = stores[edge_type]
        if level == "edge":
            times = store.time[ids]
        else:
            source = data if edge_type is None else data[edge_type[0]]
            times = source.time[store.edge_index[0, ids]]
        found[edge_type] = (times, seed_time[batch[col]])
    return found


@pytest.mark.parametrize("level", ["node", "edge"])
@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("where", ["memory", "stores"])
def test_no_edge_newer_than_its_seed_at_any_hop(level, strict, where):
    for seed in range(8):
        data = _graph(seed, level)
        source = data if where == "memory" else _stores(data)
        if where == "stores" and level == "edge":
            continue  # PyG reads a store's "time" as node time
        sampler = HopSampler(source, [5, 4, 3], time_attr="time", strict=strict)
        torch.manual_seed(seed)
        seeds = torch.randperm(data.num_nodes)[:16]
        seed_time = torch.randint(0, 30, (16,))
        out = sampler.sample_from_nodes(NodeSamplerInput(None, seeds, time=seed_time))
        (times, root), *_ = _sampled_times(sampler, data, out, seed_time, level).values()
        assert times.numel() > 0
        assert bool((times < root).all() if strict else (times <= root).all())


@pytest.mark.parametrize("level", ["node", "edge"])
@pytest.mark.parametrize("strict", [False, True])
def test_no_edge_newer_than_its_seed_in_any_edge_type(level, strict):
    for seed in range(6):
        data = _typed_graph(seed, level)
        sampler = HopSampler(data, {t: [6, 4] for t in TYPES}, time_attr="time", strict=strict)
        torch.manual_seed(seed)
        seeds = torch.randperm(COUNTS["user"])[:10]
        seed_time = torch.randint(0, 30, (10,))
        out = sampler.sample_from_nodes(
            NodeSamplerInput(None, seeds, time=seed_time, input_type="user")
        )
        found = _sampled_times(sampler, data, out, seed_time, level)
        assert all(times.numel() for times, _ in found.values())
        for times, root in found.values():
            assert bool((times < root).all() if strict else (times <= root).all())


@pytest.mark.parametrize("strict", [False, True])
def test_an_edge_at_exactly_the_seed_time_is_a_message_only_if_not_strict(strict):
    data = Data(edge_index=torch.tensor([[1, 2, 3], [0, 0, 0]]), time=torch.tensor([4, 5, 6]))
    sampler = HopSampler(data, [-1], time_attr="time", strict=strict)
    out = sampler.sample_from_nodes(
        NodeSamplerInput(None, torch.tensor([0]), time=torch.tensor([5]))
    )
    assert sorted(data.time[sampler.perm[out.edge]].tolist()) == ([4] if strict else [4, 5])


def test_a_node_time_seed_defaults_to_its_own_time():
    data = _graph(0, "node")
    sampler = HopSampler(data, [-1, -1], time_attr="time")
    seeds = torch.arange(20)
    out = sampler.sample_from_nodes(NodeSamplerInput(None, seeds))
    (times, root), *_ = _sampled_times(sampler, data, out, data.time[seeds], "node").values()
    assert bool((times <= root).all()) and bool((times == root).any())


def test_edge_time_without_a_seed_time_is_refused_in_one_line():
    data = _graph(0, "edge")
    sampler = HopSampler(data, [3], time_attr="time")
    with pytest.raises(ValueError, match="needs each seed's time: input_time"):
        sampler.sample_from_nodes(NodeSamplerInput(None, torch.arange(4)))


@pytest.mark.parametrize("level", ["node", "edge"])
def test_last_takes_exactly_the_newest_eligible_edges(level):
    for seed in range(6):
        data = _graph(seed, level, num_edges=600)
        k = 4
        sampler = HopSampler(data, [k], time_attr="time", temporal_strategy="last")
        seeds = torch.arange(data.num_nodes)
        seed_time = torch.randint(
            5, 30, (seeds.numel(),), generator=torch.Generator().manual_seed(seed)
        )
        out = sampler.sample_from_nodes(NodeSamplerInput(None, seeds, time=seed_time))
        (times, _), *_ = _sampled_times(sampler, data, out, seed_time, level).values()
        source, target = data.edge_index
        edge_times = data.time if level == "edge" else data.time[source]
        for i, node in enumerate(seeds.tolist()):
            eligible = edge_times[(target == node) & (edge_times <= seed_time[i])]
            newest = eligible.sort().values[-k:] if eligible.numel() else eligible
            mine = times[out.batch[out.col] == i].sort().values
            assert torch.equal(mine, newest), (seed, node)


@pytest.mark.parametrize("strict", [False, True])
def test_a_window_keeps_only_edges_not_older_than_the_seed_time_less_the_window(strict):
    for seed in range(6):
        data = _graph(seed, "edge")
        sampler = HopSampler(data, [-1, 3], time_attr="time", strict=strict, window=6)
        seed_time = torch.randint(0, 30, (25,), generator=torch.Generator().manual_seed(seed))
        out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.arange(25), time=seed_time))
        (times, root), *_ = _sampled_times(sampler, data, out, seed_time, "edge").values()
        assert times.numel() > 0
        assert bool((times >= root - 6).all())
        assert bool((times < root).all() if strict else (times <= root).all())
        # the first hop takes every in-edge in the window: as many as the graph has
        source, target = data.edge_index
        hop1 = out.num_sampled_edges[0]
        expected = sum(
            int(
                (
                    (target == i)
                    & (data.time >= t - 6)
                    & ((data.time < t) if strict else (data.time <= t))
                ).sum()
            )
            for i, t in enumerate(seed_time.tolist())
        )
        assert hop1 == expected


def test_uniform_includes_each_eligible_edge_at_fanout_over_eligible_degree():
    # node 0 has 20 in-edges at times 0..19; a seed at time 11 may sample the 12 at 0..11
    data = Data(
        edge_index=torch.stack([torch.arange(1, 21), torch.zeros(20, dtype=torch.long)]),
        time=torch.arange(20),
        num_nodes=21,
    )
    sampler = HopSampler(data, [4], time_attr="time")
    torch.manual_seed(0)
    draws = 3000
    out = sampler.sample_from_nodes(
        NodeSamplerInput(None, torch.zeros(draws, dtype=torch.long), time=torch.full((draws,), 11))
    )
    counts = torch.bincount(data.time[sampler.perm[out.edge]], minlength=20).double() / draws
    assert counts[12:].sum() == 0
    # each of the 12 at 4/12; five standard deviations of 3,000 draws: 0.043
    assert torch.allclose(counts[:12], torch.full((12,), 4 / 12, dtype=torch.float64), atol=0.043)


def test_pyg_7794_an_edge_newer_than_input_time_is_never_sampled():
    # PyG's issue 7794: node 1's one in-edge is at time 2; a seed at time 1 sampled it.
    edge_index = torch.tensor([[1, 0, 1, 1, 2], [0, 1, 2, 0, 0]])
    data = Data(edge_index=edge_index, edge_time=torch.tensor([1, 2, 3, 4, 5]), num_nodes=3)
    loader = NeighborLoader(
        data,
        num_neighbors=[-1],
        input_nodes=torch.tensor([1]),
        time_attr="edge_time",
        input_time=torch.tensor([1]),
        neighbor_sampler=HopSampler(data, [-1], time_attr="edge_time"),
    )
    batch = next(iter(loader))
    assert batch.edge_time.numel() == 0 and batch.edge_index.size(1) == 0


def test_a_temporal_batch_under_a_seed_is_the_same_batch_every_time():
    data = _typed_graph(3, "node")
    sampler = HopSampler(data, {t: [3, 2] for t in TYPES}, time_attr="time")
    inputs = NodeSamplerInput(None, torch.arange(12), time=torch.full((12,), 20), input_type="user")
    batches = []
    for _ in range(3):
        torch.manual_seed(7)
        batches.append(sampler.sample_from_nodes(inputs))
    torch.manual_seed(8)
    other = sampler.sample_from_nodes(inputs)
    for out in batches[1:]:
        assert all(torch.equal(out.node[t], batches[0].node[t]) for t in COUNTS)
        assert all(torch.equal(out.edge[t], batches[0].edge[t]) for t in TYPES)
    assert any(not torch.equal(other.edge[t], batches[0].edge[t]) for t in TYPES)


def test_an_unsorted_store_is_sorted_by_time_with_its_edge_ids():
    data = _graph(1, "node")
    fs, gs = _stores(data)
    on_stores = HopSampler((fs, gs), [-1], time_attr="time")
    in_memory = HopSampler(data, [-1], time_attr="time")
    seeds = torch.arange(data.num_nodes)
    got = []
    for sampler in (on_stores, in_memory):
        out = sampler.sample_from_nodes(NodeSamplerInput(None, seeds))
        edge_ids = out.edge if sampler.perm is None else sampler.perm[out.edge]
        got.append(sorted(zip(out.batch[out.col].tolist(), edge_ids.tolist(), strict=True)))
    assert got[0] == got[1] and len(got[0]) > 0


@pytest.mark.parametrize("replace", [False, True])
def test_weighted_draws_follow_the_weights_and_never_a_zero(replace):
    # node 0's in-edges from 1..5 weigh 0, 1, 2, 3, 4: one draw each seed
    data = Data(
        edge_index=torch.stack([torch.arange(1, 6), torch.zeros(5, dtype=torch.long)]),
        weight=torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0]),
        num_nodes=6,
    )
    sampler = HopSampler(data, [1], weight_attr="weight", replace=replace, disjoint=True)
    torch.manual_seed(0)
    draws = 5000
    out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.zeros(draws, dtype=torch.long)))
    freq = torch.bincount(out.edge, minlength=5).double() / draws
    assert freq[0] == 0
    assert torch.allclose(
        freq[1:], torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64), atol=0.03
    )


def test_weights_and_time_together_draw_by_weight_among_the_eligible():
    data = Data(
        edge_index=torch.stack([torch.arange(1, 7), torch.zeros(6, dtype=torch.long)]),
        time=torch.tensor([0, 1, 2, 3, 8, 9]),
        weight=torch.tensor([1.0, 0.0, 3.0, 0.0, 50.0, 50.0]),
        num_nodes=7,
    )
    sampler = HopSampler(data, [1], time_attr="time", weight_attr="weight")
    draws = 3000
    out = sampler.sample_from_nodes(
        NodeSamplerInput(None, torch.zeros(draws, dtype=torch.long), time=torch.full((draws,), 5))
    )
    picked = data.time[sampler.perm[out.edge]]
    assert set(picked.tolist()) == {0, 2}
    assert abs(float((picked == 2).double().mean()) - 0.75) < 0.04


def test_negative_weights_are_refused_in_one_line():
    data = Data(edge_index=torch.tensor([[1, 2], [0, 0]]), w=torch.tensor([1.0, -1.0]), num_nodes=3)
    with pytest.raises(ValueError, match="weight_attr 'w' holds negative"):
        HopSampler(data, [1], weight_attr="w")


def test_the_binary_search_finds_each_ranges_first_edge_past_its_bound():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        degree = torch.randint(0, 12, (30,), generator=g)
        colptr = torch.cat([torch.zeros(1, dtype=torch.long), degree.cumsum(0)])
        values = torch.randint(0, 10, (int(degree.sum()),), generator=g)
        order = time_order(colptr, values)
        values = values if order is None else values[order]
        bound = torch.randint(-1, 11, (30,), generator=g)
        for inclusive in (False, True):
            got = first_after(values, colptr[:-1], colptr[1:], bound, inclusive)
            for i in range(30):
                run = values[colptr[i] : colptr[i + 1]]
                past = (run > bound[i]) if inclusive else (run >= bound[i])
                assert int(got[i] - colptr[i]) == int((~past).sum())
                assert bool((run[:-1] <= run[1:]).all())
