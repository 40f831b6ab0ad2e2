"""Prepared folders with a time column: sorted once at prepare, sampled by time as they lie.

Every check reads a batch back to the input (a CSC position through ``perm`` to the input's edge
id, then its time), so a folder whose neighbourhoods were sorted wrong, or whose ids were not
carried with the sort, fails here however its output looked.
"""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch_geometric.data import Data, HeteroData
from torch_geometric.sampler import NodeSamplerInput

from gnnscale import stores
from gnnscale.cli.prepare import prepare_main
from gnnscale.errors import ConfigError
from gnnscale.sampling import HopSampler
from gnnscale.stores import PreparedGraphError, prepare_npy, save_npy
from gnnscale.stores.npy import read_data
from gnnscale.stores.streaming import write

TYPES = {("user", "clicks", "item"): (30, 40), ("item", "seen_by", "user"): (40, 30)}
COUNTS = {"user": 30, "item": 40}


def _graph(seed, num_nodes=50, num_edges=600, span=40, floats=False):
    """Edges in no order at all, each with a time (many ties) and a feature: its own id.

    Node 0 has a quarter of the in-edges: more than a block of the prepare's sort.
    """
    g = torch.Generator().manual_seed(seed)
    time = torch.randint(0, span, (num_edges,), generator=g)
    edge_index = torch.randint(0, num_nodes, (2, num_edges), generator=g)
    edge_index[1, torch.randperm(num_edges, generator=g)[: num_edges // 4]] = 0
    return Data(
        edge_index=edge_index,
        edge_time=time.double() / 4 if floats else time,
        edge_attr=torch.arange(num_edges, dtype=torch.float32).view(-1, 1),
        num_nodes=num_nodes,
    )


def _typed_graph(seed, span=40):
    g = torch.Generator().manual_seed(seed)
    data = HeteroData()
    for node_type, count in COUNTS.items():
        data[node_type].num_nodes = count
    for edge_type, (n_src, n_dst) in TYPES.items():
        data[edge_type].edge_index = torch.stack(
            [
                torch.randint(0, n_src, (300,), generator=g),
                torch.randint(0, n_dst, (300,), generator=g),
            ]
        )
        data[edge_type].edge_time = torch.randint(0, span, (300,), generator=g)
    return data


def _folder(data, path):
    """``data`` prepared in chunks of 64 edges (placed and sorted a block at a time), opened."""
    return stores.open(write(path, {"test": str(path)}, *read_data(data), chunk_bytes=1 << 10))


def _draw(sampler, seeds, seed_time, seed=0, input_type=None):
    torch.manual_seed(seed)
    return sampler.sample_from_nodes(
        NodeSamplerInput(None, seeds, time=seed_time, input_type=input_type)
    )


def _edge_ids(sampler, edge, edge_type=None):
    perm = sampler.perm if edge_type is None else sampler.perm.get(edge_type)
    return edge if perm is None else perm[edge]


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("floats", [False, True])
def test_a_folder_samples_no_edge_newer_than_its_seed_at_any_hop(tmp_path, strict, floats):
    for seed in range(4):
        data = _graph(seed, floats=floats)
        sampler = HopSampler(
            _folder(data, tmp_path / str(seed)), [5, 4, 3], time_attr="edge_time", strict=strict
        )
        seed_time = data.edge_time[torch.randperm(600)[:16]]
        out = _draw(sampler, torch.randperm(50)[:16], seed_time, seed)
        times = data.edge_time[_edge_ids(sampler, out.edge)]
        root = seed_time[out.batch[out.col]]
        assert times.numel() > 16
        assert bool((times < root).all() if strict else (times <= root).all())


@pytest.mark.parametrize("strategy", ["uniform", "last"])
def test_a_folder_draws_the_batches_the_graph_in_memory_draws(tmp_path, strategy):
    for seed in range(4):
        data = _graph(seed)
        args = dict(time_attr="edge_time", temporal_strategy=strategy, strict=True)
        memory = HopSampler(data, [6, 3], **args)
        folder = HopSampler(_folder(data, tmp_path / str(seed)), [6, 3], **args)
        seeds, seed_time = torch.arange(50), torch.randint(5, 40, (50,))
        a, b = _draw(memory, seeds, seed_time, seed), _draw(folder, seeds, seed_time, seed)
        for key in ("node", "row", "col", "batch"):
            assert torch.equal(getattr(a, key), getattr(b, key)), key
        assert torch.equal(_edge_ids(memory, a.edge), _edge_ids(folder, b.edge))


def test_each_prepared_neighbourhood_is_sorted_by_time_with_its_edge_ids(tmp_path):
    data = _graph(0)
    fs, gs = _folder(data, tmp_path / "g")
    row, colptr, _ = gs.csc_by_type[None]
    clock, perm = gs.edge_time[None], gs.perm_by_type[None]
    target = torch.repeat_interleave(torch.arange(50), colptr.diff())
    assert torch.equal(data.edge_time[perm], clock)  # each slot's time is its edge's
    assert torch.equal(data.edge_index[0, perm], row)
    assert torch.equal(data.edge_index[1, perm], target)
    same = target[1:] == target[:-1]
    assert bool((clock[1:] >= clock[:-1])[same].all())
    ties = same & (clock[1:] == clock[:-1])  # one time: the input's order kept
    assert bool((perm[1:] > perm[:-1])[ties].all())
    assert torch.equal(torch.sort(perm).values, torch.arange(600))


def test_a_stream_in_time_order_keeps_its_edge_ids_without_a_map(tmp_path):
    data = _graph(1)
    order = torch.sort(data.edge_index[1] * 100 + data.edge_time, stable=True).indices
    data.edge_index, data.edge_time = data.edge_index[:, order], data.edge_time[order]
    del data.edge_attr
    fs, gs = _folder(data, tmp_path / "g")
    assert None not in gs.perm_by_type  # already in the CSC's order: no perm.bin
    assert torch.equal(gs.edge_time[None], data.edge_time)


def test_a_typed_folder_samples_by_time_in_every_edge_type(tmp_path):
    for seed in range(3):
        data = _typed_graph(seed)
        fanout = {t: [6, 4] for t in TYPES}
        args = dict(time_attr="edge_time", strict=True)
        memory = HopSampler(data, fanout, **args)
        folder = HopSampler(_folder(data, tmp_path / str(seed)), fanout, **args)
        seeds, seed_time = torch.arange(10), torch.randint(5, 40, (10,))
        a = _draw(memory, seeds, seed_time, seed, "user")
        b = _draw(folder, seeds, seed_time, seed, "user")
        for edge_type in TYPES:
            ids = _edge_ids(folder, b.edge[edge_type], edge_type)
            assert torch.equal(_edge_ids(memory, a.edge[edge_type], edge_type), ids)
            times = data[edge_type].edge_time[ids]
            root = seed_time[b.batch[edge_type[-1]][b.col[edge_type]]]
            assert times.numel() and bool((times < root).all())


def test_npy_and_parquet_with_a_time_column_prepare_the_same_folder(tmp_path):
    data = _graph(2, floats=True)
    save_npy(data, tmp_path / "npy")
    assert (tmp_path / "npy" / "edge_time.npy").is_file()
    src, dst = data.edge_index.numpy()
    (tmp_path / "pq").mkdir()
    np.save(tmp_path / "pq" / "x.npy", np.zeros((50, 1), np.float32))
    np.save(tmp_path / "npy" / "x.npy", np.zeros((50, 1), np.float32))
    table = {
        "src": src,
        "dst": dst,
        "time": data.edge_time.numpy(),
        "w": data.edge_attr[:, 0].numpy(),
    }
    pq.write_table(pa.table(table), tmp_path / "pq" / "edges.parquet", row_group_size=97)
    a = stores.open(prepare_npy(tmp_path / "npy", tmp_path / "a", chunk_bytes=1 << 10))
    b = stores.open(prepare_npy(tmp_path / "pq", tmp_path / "b", chunk_bytes=1 << 10))
    assert torch.equal(a[1].edge_time[None], b[1].edge_time[None])
    assert torch.equal(a[1].perm_by_type[None], b[1].perm_by_type[None])
    assert torch.equal(a[0].edge_attr[None], b[0].edge_attr[None])  # time is not a feature
    assert a[1].edge_time[None].dtype == torch.float64


def test_times_of_a_folder_are_refused_where_they_cannot_be_sampled(tmp_path):
    timed = _folder(_graph(0), tmp_path / "timed")
    with pytest.raises(ValueError, match="time_attr='edge_time'"):
        HopSampler(timed, [4], time_attr="time")
    untimed = _graph(0)
    del untimed.edge_time
    with pytest.raises(ValueError, match="holds no edge times"):
        HopSampler(_folder(untimed, tmp_path / "untimed"), [4], time_attr="edge_time")
    bad = _graph(0, floats=True)
    bad.edge_time[7] = float("nan")
    with pytest.raises(PreparedGraphError, match="time of edge 7 is NaN"):
        _folder(bad, tmp_path / "nan")
    short = _graph(0)
    short.edge_time = short.edge_time[:-1]
    with pytest.raises(PreparedGraphError, match="one time per edge"):
        _folder(short, tmp_path / "short")


def test_prepare_reads_a_stream_of_interactions_into_a_timed_folder(tmp_path):
    rows = [(u % 7, 100 + u % 5, 10 * (u // 3), 0, 0.5 * u, -1.0) for u in range(60)]
    with open(tmp_path / "wiki.csv", "w") as f:
        f.write("user_id,item_id,timestamp,state_label,features\n")
        f.writelines(",".join(map(str, r)) + "\n" for r in rows)
    out = prepare_main(
        [
            "--source",
            "Interactions",
            "--source.path",
            str(tmp_path / "wiki.csv"),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    fs, gs = stores.open(out)
    row, colptr, size = gs.csc_by_type[None]
    perm, clock = gs.perm_by_type[None], gs.edge_time[None]
    assert size == (12, 12) and row.numel() == 120  # 7 users, 5 items; each interaction twice
    ids = perm % 60  # edge e and e + 60: the interaction and its reverse
    assert torch.equal(clock, torch.tensor([r[2] for r in rows])[ids])
    assert torch.equal(fs.edge_attr[None][perm, 0], torch.tensor([r[4] for r in rows])[ids].float())
    users, items = torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows]) - 93
    forward = perm < 60
    assert torch.equal(row[forward], users[ids[forward]])
    assert torch.equal(row[~forward], items[ids[~forward]])
    sampler = HopSampler((fs, gs), [3, 3], time_attr="edge_time", strict=True)
    out = _draw(sampler, torch.arange(12), torch.full((12,), 300))
    assert bool((clock[out.edge] < 300).all()) and out.edge.numel()


def test_neighbor_data_module_samples_a_folder_by_its_node_times(tmp_path):
    from gnnscale import NeighborDataModule, SamplingArgs, make_synthetic_graph
    from gnnscale.data.args import EvalArgs
    from gnnscale.testing import TINY

    data = make_synthetic_graph(TINY)
    data.time = torch.randint(0, 50, (data.num_nodes,), generator=torch.Generator().manual_seed(0))
    folder = write(tmp_path / "g", {"test": "node time"}, *read_data(data), chunk_bytes=1 << 12)
    sampled = EvalArgs(mode="sampled")
    timed = SamplingArgs(time_attr="time", temporal_strategy="last", strict=True)
    dm = NeighborDataModule("prepared", folder, [5, 3], sampling=timed, eval=sampled)
    sampler = dm._csc_sampler.with_fanout([5, 3])
    assert sampler.is_temporal and sampler.rule.strict and sampler.rule.strategy == "last"
    seeds = torch.arange(400)
    torch.manual_seed(0)
    out = sampler.sample_from_nodes(NodeSamplerInput(None, seeds))
    root = data.time[seeds][out.batch]  # each sampled node's seed's time
    later = out.node.numel() > seeds.numel()
    assert later and bool((data.time[out.node[400:]] < root[400:]).all())
    with pytest.raises(ConfigError, match="eval.mode computes each node once"):
        NeighborDataModule("prepared", folder, sampling=timed)  # layer-wise by default
    with pytest.raises(ConfigError, match="give --data.sampling.time_attr"):
        SamplingArgs(strict=True)
    untimed = write(tmp_path / "u", {"test": "no time"}, *read_data(make_synthetic_graph(TINY)))
    dm = NeighborDataModule("prepared", untimed, sampling=timed, eval=sampled)
    with pytest.raises(
        ConfigError, match="--data.sampling: time_attr='time': this prepared folder"
    ):
        dm._csc_sampler  # noqa: B018


def test_a_training_run_samples_by_node_time_from_a_folder(tmp_path):
    from gnnscale import make_synthetic_graph
    from gnnscale.cli import main
    from gnnscale.testing import TINY

    data = make_synthetic_graph(TINY)
    data.time = torch.randint(0, 50, (data.num_nodes,), generator=torch.Generator().manual_seed(1))
    folder = write(tmp_path / "g", {"test": "node time"}, *read_data(data))
    config = Path(__file__).parents[1] / "recipes" / "neighbor_sage" / "config.yaml"
    cli = main(
        [
            "fit",
            "--config",
            str(config),
            "--data.dataset=prepared",
            f"--data.root={folder}",
            "--data.sampling.time_attr=time",
            "--data.sampling.strict=true",
            "--data.batch_size=128",
            "--data.eval.mode=sampled",
            "--trainer.max_epochs=1",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path}",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        ]
    )
    assert cli.datamodule._csc_sampler.is_temporal
    assert cli.trainer.callback_metrics["test/acc"] > 0.3  # 5 classes: it learned something


def test_hetero_data_module_samples_by_the_times_of_the_types_that_have_them(tmp_path):
    from gnnscale import HeteroNeighborDataModule, SamplingArgs
    from gnnscale.data.synthetic import SyntheticRecommender, make_item_class_graph

    cfg = SyntheticRecommender(num_users=300, num_items=200, num_categories=10, num_communities=5)
    data = make_item_class_graph(cfg)
    for store in data.node_stores:
        store.pop("community", None)
    g = torch.Generator().manual_seed(0)
    for t in ("user", "item"):
        data[t].time = torch.randint(0, 40, (data[t].num_nodes,), generator=g)
    folder = write(tmp_path / "h", {"test": "hetero time"}, *read_data(data))
    timed = SamplingArgs(time_attr="time", strict=True)
    dm = HeteroNeighborDataModule("prepared", folder, "item", [4, 3], sampling=timed)
    seeds = torch.arange(100)
    sampler = dm._loader(seeds, 100).node_sampler
    torch.manual_seed(0)
    out = sampler.sample_from_nodes(NodeSamplerInput(None, seeds, input_type="item"))
    checked = 0
    for edge_type, col in out.col.items():
        src, _, dst = edge_type
        if src not in ("user", "item") or not col.numel():
            continue  # categories have no time: their edges are untimed
        source_time = data[src].time[out.node[src][out.row[edge_type]]]
        root = data["item"].time[seeds][out.batch[dst][col]]
        assert bool((source_time < root).all()), edge_type
        checked += col.numel()
    assert checked > 100
