import dataclasses
import pickle
import time
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.utils import degree, homophily, is_undirected

import gnnscale.data.node as gdata
from gnnscale import (
    ClusterDataModule,
    EvalArgs,
    FullBatchDataModule,
    GATv2,
    GraphSAGE,
    HeteroNeighborDataModule,
    LinkDataModule,
    LoaderArgs,
    NeighborDataModule,
    NodeSplit,
    Preprocess,
    SAINTDataModule,
    SpeedTricks,
    SyntheticGraph,
    load_dataset,
    make_synthetic_graph,
)
from gnnscale.data.datasets import SPLIT_MASKS
from gnnscale.data.loaders import RankShare
from gnnscale.errors import ConfigError, GroupSettingError
from gnnscale.handshake import BatchRequest
from gnnscale.stores.manifest import split_labels
from gnnscale.testing import TINY, quiet_trainer


def test_synthetic_is_deterministic_homophilous_and_skewed():
    a, b = make_synthetic_graph(TINY), make_synthetic_graph(TINY)
    assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.x, b.x)
    assert not torch.equal(a.y, make_synthetic_graph(SyntheticGraph(num_nodes=3000, seed=1)).y)
    assert is_undirected(a.edge_index) and not a.has_self_loops()
    assert 0.75 < homophily(a.edge_index, a.y) < 0.9
    deg = degree(a.edge_index[0], a.num_nodes)
    assert 10 < deg.mean() < 13
    assert deg.max() > 8 * deg.median()  # power-law-like tail, not Poisson
    masks = torch.stack([a.train_mask, a.val_mask, a.test_mask])
    assert torch.equal(masks.sum(0), torch.ones(a.num_nodes, dtype=torch.long))


@pytest.mark.parametrize("key,value", [("homophily", 1.5), ("num_nodes", 1), ("train_fraction", 0)])
def test_synthetic_refuses_bad_settings(key, value):
    with pytest.raises(ValueError, match=f"--data.synthetic.{key}"):
        SyntheticGraph(**{key: value})


def test_a_group_refusal_is_named_where_the_group_is_taken_and_survives_pickling():
    """A generator's settings are ``--data.synthetic`` in ``fit``, ``--source.synthetic`` in
    ``gnnscale prepare``: the refusal is written once, named by who takes the group."""
    with pytest.raises(GroupSettingError) as refused:
        dataclasses.replace(TINY, num_classes=1)
    assert str(refused.value) == (
        "--data.synthetic.num_classes must be between 2 and --data.synthetic.num_nodes (3000) "
        "(got 1)"
    )
    under = refused.value.under("--source")
    assert str(under).startswith("--source.synthetic.num_classes must be between 2 and --source.")
    assert str(pickle.loads(pickle.dumps(under))) == str(under)  # as a worker's error travels
    with pytest.raises(GroupSettingError, match=r"^--data\.split\.train_fraction and"):
        NodeSplit(train_fraction=0.95)


def test_synthetic_scales():
    # 10^6 nodes / 10^7 edges here; the 2M / 40M figure is in the benchmark notes.
    start = time.perf_counter()
    data = make_synthetic_graph(SyntheticGraph(num_nodes=1_000_000, avg_degree=10))
    assert time.perf_counter() - start < 60
    assert data.edge_index.size(1) > 9_000_000


def test_cora_loads_offline(cora_root):
    data = load_dataset("Cora", cora_root)
    assert (data.num_nodes, data.num_edges, data.num_features) == (2708, 10556, 1433)
    assert (int(data.train_mask.sum()), int(data.val_mask.sum()), int(data.test_mask.sum())) == (
        140,
        500,
        1000,
    )


def test_preprocess_largest_component_and_dtype(cora_root, caplog):
    dm = FullBatchDataModule(
        "Cora",
        cora_root,
        preprocess=Preprocess(largest_component=True, feature_dtype="bfloat16"),
    )
    with caplog.at_level("INFO"):
        data = dm.data
    assert data.num_nodes == 2485  # Cora's largest component
    assert "dropped 223" in caplog.text
    assert data.x.dtype == torch.bfloat16
    assert dm.num_features == 1433 and dm.num_classes == 7


def test_preprocess_normalize_features(cora_root):
    raw = FullBatchDataModule("Cora", cora_root).data.x
    x = FullBatchDataModule(
        "Cora", cora_root, preprocess=Preprocess(normalize_features=True)
    ).data.x
    assert set(raw.unique().tolist()) == {0.0, 1.0}  # word counts as Planetoid stores them
    assert torch.allclose(x.sum(-1), torch.ones(len(x)))  # every Cora paper has a word
    assert torch.equal(x > 0, raw > 0)  # scaled per row, nothing added or dropped


def test_preprocess_to_undirected(monkeypatch):
    directed = Data(
        x=torch.randn(4, 2),
        edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]),
        y=torch.tensor([0, 1, 0, 1]),
        train_mask=torch.tensor([True, True, False, False]),
        val_mask=torch.tensor([False, False, True, False]),
        test_mask=torch.tensor([False, False, False, True]),
    )
    monkeypatch.setattr(gdata, "load_dataset", lambda *a: directed.clone())
    assert FullBatchDataModule(preprocess=Preprocess(to_undirected=True)).data.num_edges == 6


# --- bad input: one clear error naming the key, raised before any long work -------------------


def test_unknown_dataset():
    with pytest.raises(ValueError, match="--data.dataset 'Corra' is not known; choose one of"):
        NeighborDataModule(dataset="Corra")


@pytest.mark.parametrize("dataset", ["ogbn-papers100M", "ogbn-mag"])
def test_an_ogb_graph_read_only_from_disk_is_refused_with_its_prepare_command(dataset):
    expected = f"gnnscale prepare --source Ogb --source.name {dataset} --source.root ROOT --out DIR"
    with pytest.raises(ConfigError, match=expected) as refused:
        NeighborDataModule(dataset=dataset)
    assert "--data.dataset prepared --data.root DIR" in str(refused.value)
    with pytest.raises(ConfigError, match=expected):
        HeteroNeighborDataModule(dataset=dataset)


ON_BUILD = {  # each kind of DataModule, built on a root: a dataset in memory, a prepared folder
    "node": lambda dataset, root: NeighborDataModule(dataset, root),
    "full graph": lambda dataset, root: FullBatchDataModule(dataset, root),
    "hetero": lambda dataset, root: HeteroNeighborDataModule(
        "DBLP" if dataset == "Cora" else dataset, root
    ),
    "link": lambda dataset, root: LinkDataModule(dataset, root, edge_type=["n", "to", "n"]),
}


@pytest.mark.parametrize("kind", ON_BUILD)
def test_a_root_that_cannot_serve_is_refused_when_the_datamodule_is_built(tmp_path, kind):
    # Refused by opening the source, before any load or download: a graph in memory whose
    # root is missing or a file, a prepared folder without its manifest (the hetero one
    # checked a PyG dataset's root only when it loaded it).
    build = ON_BUILD[kind]
    if kind != "full graph":  # it cannot read a prepared folder, and says so first
        (tmp_path / "empty").mkdir()
        with pytest.raises(ConfigError, match=r"manifest\.json is missing: .*`gnnscale prepare"):
            build("prepared", tmp_path / "empty")
    with pytest.raises(ValueError, match="--data.root .* does not exist.*mkdir -p"):
        build("Cora", tmp_path / "nowhere")
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is not a folder"):
        build("Cora", tmp_path / "file")


@pytest.mark.parametrize(
    "make,key",
    [
        (lambda: NeighborDataModule(batch_size=0), "--data.batch_size"),
        (lambda: NeighborDataModule(num_neighbors=[10, 0]), "--data.num_neighbors"),
        (lambda: NeighborDataModule(num_neighbors=[]), "--data.num_neighbors"),
        (lambda: ClusterDataModule(num_parts=-1), "--data.num_parts"),
        (lambda: ClusterDataModule(num_parts=10, clusters_per_batch=20), "--data.clusters_per"),
        (lambda: SAINTDataModule(walk_length=0), "--data.walk_length"),
        (lambda: SAINTDataModule(sample_coverage=-1), "--data.sample_coverage"),
        (lambda: EvalArgs(batch_size=0), "--data.eval.batch_size"),
        (lambda: LoaderArgs(num_workers=0, persistent_workers=True), "persistent_workers"),
    ],
)
def test_non_positive_sizes(make, key):
    with pytest.raises(ValueError, match=key):
        make()


@pytest.mark.parametrize("cuda", [False, True])
def test_auto_workers_are_one_with_a_gpu_and_none_without(monkeypatch, cuda):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    kwargs = LoaderArgs(num_workers="auto", persistent_workers=True).kwargs()
    assert kwargs["num_workers"] == int(cuda)
    assert kwargs["persistent_workers"] == cuda  # DataLoader refuses it without a worker
    assert LoaderArgs(num_workers=2).workers == 2


def _fake(monkeypatch, **changes):
    data = make_synthetic_graph(SyntheticGraph(num_nodes=200, avg_degree=4))
    for key, value in changes.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    monkeypatch.setattr(gdata, "load_dataset", lambda *a: data)


def test_missing_split(monkeypatch):
    _fake(monkeypatch, val_mask=None)
    with pytest.raises(ValueError, match="has no 'val_mask'"):
        _ = FullBatchDataModule().data


def test_empty_training_split(monkeypatch):
    _fake(monkeypatch, train_mask=torch.zeros(200, dtype=torch.bool))
    with pytest.raises(ValueError, match="training split .* is empty"):
        _ = FullBatchDataModule().num_features


def test_labels_out_of_range(monkeypatch):
    y = torch.zeros(200, dtype=torch.long)
    y[5] = -1
    _fake(monkeypatch, y=y, train_mask=torch.ones(200, dtype=torch.bool))
    with pytest.raises(ValueError, match="labels out of range.*found -1"):
        _ = FullBatchDataModule().num_classes


def test_splits_that_share_nodes_are_refused(monkeypatch):
    data = make_synthetic_graph(SyntheticGraph(num_nodes=200, avg_degree=4))
    test = data.test_mask.clone()
    test[data.train_mask.nonzero()[:3].view(-1)] = True  # three training nodes tested too
    _fake(monkeypatch, test_mask=test)
    with pytest.raises(ValueError, match="3 node.s. are in both train_mask and test_mask"):
        _ = FullBatchDataModule().data


@pytest.mark.parametrize("chunk", [7, 64, 1 << 22])
def test_labels_and_overlaps_are_read_in_chunks_as_whole(chunk):
    # A prepared graph's labels and masks are read a chunk of nodes at a time (a copy of the
    # split nodes' labels and their sort took 3.4 GiB on papers100M's size): the classes and
    # shared nodes must be those of the whole graph, whatever falls across a chunk's edge.
    data = make_synthetic_graph(SyntheticGraph(num_nodes=200, avg_degree=4))
    data.y[data.train_mask.nonzero()[-1]] = 40  # a class on one node only
    data.y[~(data.train_mask | data.val_mask | data.test_mask)] = 99  # never counted
    data.test_mask[data.val_mask.nonzero()[::3].view(-1)] = True
    classes, shared = split_labels(data.y, {k: data[k] for k in SPLIT_MASKS}, chunk)
    labelled = data.train_mask | data.val_mask | data.test_mask
    assert torch.equal(classes, torch.unique(data.y[labelled]))
    assert 40 in classes.tolist() and 99 not in classes.tolist()
    want = int((data.val_mask & data.test_mask).sum())
    assert want > 0
    assert shared == {
        ("train_mask", "val_mask"): 0,
        ("train_mask", "test_mask"): 0,
        ("val_mask", "test_mask"): want,
    }


def test_empty_validation_split(monkeypatch):
    _fake(monkeypatch, val_mask=torch.zeros(200, dtype=torch.bool))
    with pytest.raises(ValueError, match="validation split .* is empty.*val_fraction"):
        _ = FullBatchDataModule().num_classes


def test_a_stray_label_does_not_make_a_huge_model(monkeypatch):
    y = make_synthetic_graph(SyntheticGraph(num_nodes=200, avg_degree=4)).y
    y[0] = 200_000  # one mistyped id: 200,001 outputs
    _fake(monkeypatch, y=y, train_mask=torch.ones(200, dtype=torch.bool))
    with pytest.raises(ValueError, match="the largest is 200000 but only 11 distinct classes"):
        _ = FullBatchDataModule().num_classes


def test_unlabelled_nodes_outside_the_splits_train(monkeypatch, tmp_path):
    """y = -1 on nodes in no split, as the label check's message recommends: they are sampled as
    neighbours, never scored."""
    data = make_synthetic_graph(TINY)
    outside = torch.arange(data.num_nodes) % 4 == 0
    data.y[outside] = -1
    for key in ("train_mask", "val_mask", "test_mask"):
        data[key] &= ~outside
    monkeypatch.setattr(gdata, "load_dataset", lambda *a: data)
    dm = NeighborDataModule(root=tmp_path, num_neighbors=[5, 5], batch_size=256)
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(GraphSAGE(32, 5, hidden_channels=16), dm)
    assert torch.isfinite(trainer.callback_metrics["train/loss_epoch"])


def test_a_datamodule_serving_two_fits_takes_each_fits_model(tmp_path):
    """The second model is one layer deeper than the fan-outs: refused, as for a fresh
    DataModule (the first fit's request was kept, and a 3-layer model got 2-hop batches)."""
    dm = NeighborDataModule(root=tmp_path, synthetic=TINY, num_neighbors=[5, 5], batch_size=256)

    def fit(num_layers: int) -> None:
        trainer = quiet_trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0)
        trainer.fit(GraphSAGE(TINY.num_features, 5, hidden_channels=16, num_layers=num_layers), dm)

    fit(2)
    with pytest.raises(ConfigError, match=r"num_neighbors has 2 entries .* one fan-out per layer"):
        fit(3)


def test_one_hot_labels(monkeypatch):
    _fake(monkeypatch, y=torch.eye(4)[torch.zeros(200, dtype=torch.long)])
    with pytest.raises(ValueError, match=r"y.argmax\(-1\)"):
        _ = FullBatchDataModule().num_classes


def test_num_parts_larger_than_graph(tmp_path):
    dm = ClusterDataModule(
        root=tmp_path, num_parts=5000, synthetic=SyntheticGraph(num_nodes=300, avg_degree=4)
    )
    with pytest.raises(ValueError, match=r"--data.num_parts \(5000\) is larger than the graph"):
        dm.setup("fit")
    assert not (tmp_path / "gnnscale_cache").exists()  # nothing half-written


# --- the batch contract: weights that make accumulation an unbiased per-node mean --------------


def test_neighbor_weights_are_uniform_per_training_node(tmp_path):
    dm = NeighborDataModule(root=tmp_path, batch_size=128, synthetic=TINY)
    dm.setup("fit")
    per_node = torch.zeros(dm.data.num_nodes)
    for batch in dm.train_dataloader():
        per_node.index_add_(0, batch.n_id, dm._loss_weight(batch)[0])
    train = dm.data.train_mask
    assert torch.allclose(per_node[train], torch.full_like(per_node[train], 1 / 128))
    assert per_node[~train].sum() == 0
    assert per_node.sum() == pytest.approx(int(train.sum()) / 128)  # about 1 per batch


def test_cluster_weights_are_uniform_although_batches_differ(tmp_path):
    dm = ClusterDataModule(root=tmp_path, num_parts=30, clusters_per_batch=4, synthetic=TINY)
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    assert len(batches) == 8
    counts = [dm._loss_weight(b)[1] for b in batches]
    assert len(set(counts)) > 1  # micro-batches hold different numbers of training nodes
    weights = torch.cat([dm._loss_weight(b)[0][b.train_mask] for b in batches])
    num_train = int(dm.data.train_mask.sum())
    assert weights.numel() == num_train  # every training node once per epoch
    # The same weight for every node, whatever its batch holds: accumulating micro-batches
    # averages over nodes, not over batches.
    assert torch.allclose(weights, torch.full_like(weights, 8 / num_train))


# The edge sampler is left out: its node_norm is heavy-tailed (rarely covered nodes weigh up
# to thousands of times the mean), so a 40-batch mean is too noisy to test against 1.
@pytest.mark.parametrize("sampler", ["node", "random_walk"])
def test_saint_weights_estimate_the_training_mean(tmp_path, sampler):
    dm = SAINTDataModule(
        root=tmp_path, sampler=sampler, batch_size=300, num_steps=40, synthetic=TINY
    )
    dm.setup("fit")
    totals = [float(dm._loss_weight(b)[0].sum()) for b in dm.train_dataloader()]
    assert sum(totals) / len(totals) == pytest.approx(1.0, rel=0.25)
    assert list((tmp_path / "gnnscale_cache").glob("saint_*/*.pt"))  # statistics cached


def test_partition_cache_is_keyed_to_the_graph(tmp_path, caplog):
    small = SyntheticGraph(num_nodes=1000, avg_degree=6)
    ClusterDataModule(root=tmp_path, num_parts=10, clusters_per_batch=2, synthetic=small).setup(
        "fit"
    )
    first = sorted(p.parent.parent.name for p in (tmp_path / "gnnscale_cache").rglob("*.pt"))
    # Same graph and parameters: reused, not recomputed.
    ClusterDataModule(root=tmp_path, num_parts=10, clusters_per_batch=2, synthetic=small).setup(
        "fit"
    )
    assert (
        sorted(p.parent.parent.name for p in (tmp_path / "gnnscale_cache").rglob("*.pt")) == first
    )
    # A changed graph gets its own partition.
    other = SyntheticGraph(num_nodes=1000, avg_degree=6, seed=1)
    ClusterDataModule(root=tmp_path, num_parts=10, clusters_per_batch=2, synthetic=other).setup(
        "fit"
    )
    assert len(list((tmp_path / "gnnscale_cache").rglob("*.pt"))) == 2


def test_pymetis_partition_is_balanced(tmp_path):
    dm = ClusterDataModule(root=tmp_path, num_parts=8, clusters_per_batch=2, synthetic=TINY)
    dm.setup("fit")
    partptr = dm.train_dataloader().loader.cluster_data.partition.partptr
    sizes = partptr.diff()
    assert len(sizes) == 8 and sizes.min() > 0.7 * sizes.float().mean()


def test_root_for_synthetic_may_be_absent(tmp_path):
    dm = FullBatchDataModule(root=Path(tmp_path / "later"), synthetic=TINY)
    assert dm.num_classes == 5


def test_neighbour_batches_come_hop_by_hop_with_a_csr_row_pointer(tmp_path):
    dm = NeighborDataModule(root=tmp_path, synthetic=TINY, num_neighbors=[5, 4, 3], batch_size=64)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    nodes, edges = batch.layout.num_sampled_nodes, batch.layout.num_sampled_edges
    assert nodes[0] == 64 and len(nodes) == 4 and len(edges) == 3
    assert sum(nodes) == batch.num_nodes and sum(edges) == batch.num_edges
    # Target-only layers read prefixes: nodes and edges must come hop by hop.
    hop_of_node = torch.repeat_interleave(torch.arange(4), torch.tensor(nodes))
    dst_hop = hop_of_node[batch.edge_index[1]]
    assert torch.equal(dst_hop, torch.repeat_interleave(torch.arange(3), torch.tensor(edges)))
    assert torch.equal(
        batch.layout.rowptr.diff(), degree(batch.edge_index[1], batch.num_nodes).long()
    )


def test_hop_layout_sorts_edges_it_is_given_out_of_order():
    from gnnscale.data.layout import hop_layout

    # Seeds 0, 1; hop 1: 2, 3; hop 2: 4. Edges (src -> dst) listed out of target order.
    edge_index = torch.tensor([[4, 2, 3, 2], [2, 0, 1, 1]])
    batch = Data(x=torch.zeros(5, 1), edge_index=edge_index, e_id=torch.arange(4), batch_size=2)
    batch = hop_layout(batch, num_layers=2)
    assert batch.edge_index.tolist() == [[2, 3, 2, 4], [0, 1, 1, 2]]
    assert batch.e_id.tolist() == [1, 2, 3, 0]  # edge attributes follow their edges
    assert batch.layout.rowptr.tolist() == [0, 1, 3, 4, 4, 4]
    assert batch.layout.num_sampled_nodes == [2, 2, 1]
    assert batch.layout.num_sampled_edges == [3, 1]


@pytest.mark.parametrize("aggr", ["mean", "max"])
def test_the_loader_aggregates_the_first_layer_and_keeps_what_later_layers_read(tmp_path, aggr):
    import copy

    from torch_geometric.utils import scatter

    from gnnscale.data.layout import aggregate_first_layer

    dm = NeighborDataModule(root=tmp_path, synthetic=TINY, num_neighbors=[5, 4, 3], batch_size=64)
    dm.setup("fit")
    whole = next(iter(dm.train_dataloader()))
    nodes, edges = whole.layout.num_sampled_nodes, whole.layout.num_sampled_edges
    batch = aggregate_first_layer(copy.copy(whole), aggr)
    targets = sum(nodes[:3])  # the first layer's: hops 0-2
    # Each target's neighbours' features reduced, as the layer would (targets without
    # neighbours: zeros).
    src, dst = whole.edge_index
    expected = scatter(whole.x[src], dst, dim=0, dim_size=whole.num_nodes, reduce=aggr)
    x_aggr = batch.layout.x_aggr
    torch.testing.assert_close(x_aggr, expected[:targets])
    assert x_aggr.abs().sum(1).gt(0).sum() > targets // 2  # most targets have neighbours
    # Only the targets' rows travel on, and the edges into hops 0-1 (sources within them).
    assert batch.num_nodes == targets and targets < whole.num_nodes
    for key in ("x", "y", "n_id", "train_mask"):
        assert torch.equal(batch[key], whole[key][:targets]), key
    kept = sum(edges[:2])
    assert torch.equal(batch.edge_index, whole.edge_index[:, :kept])
    assert torch.equal(batch.e_id, whole.e_id[:kept])
    assert int(batch.edge_index.max()) < targets
    assert torch.equal(batch.layout.rowptr, whole.layout.rowptr[: sum(nodes[:2]) + 1])
    assert batch.layout.num_sampled_nodes == nodes
    assert batch.layout.num_sampled_edges == edges


@pytest.mark.parametrize("aggr", ["mean", "max"])
def test_features_in_memory_are_aggregated_in_place_as_if_gathered_first(tmp_path, aggr):
    import copy

    from gnnscale.data.layout import aggregate_first_layer

    batches, loaders = [], []
    for request in (BatchRequest(3), BatchRequest(3, first_layer_aggr=aggr)):
        dm = NeighborDataModule(
            root=tmp_path, synthetic=TINY, num_neighbors=[5, 4, 3], batch_size=64
        )
        dm.configure_batches(request)
        dm.setup("fit")
        torch.manual_seed(0)  # the same seed for both loaders: the same sample
        loaders.append(dm.train_dataloader())
        batches.append(next(iter(loaders[-1])))
    # PyG gathers no features where the loader aggregates them in place.
    assert "x" in loaders[0].loader.data and "x" not in loaders[1].loader.data
    assert "x" in dm.data  # the DataModule's graph keeps them
    whole, in_place = batches
    expected = aggregate_first_layer(copy.copy(whole), aggr)
    assert sorted(in_place.keys()) == sorted(expected.keys())
    for key in expected.keys():
        if key == "layout":
            torch.testing.assert_close(in_place.layout.x_aggr, expected.layout.x_aggr)
            assert torch.equal(in_place.layout.rowptr, expected.layout.rowptr)
            assert in_place.layout[:2] == expected.layout[:2]
        elif isinstance(expected[key], torch.Tensor):
            assert torch.equal(in_place[key], expected[key]), key
        else:
            assert in_place[key] == expected[key], key
    assert in_place.num_nodes == expected.num_nodes < whole.num_nodes


@pytest.mark.parametrize("source", ["prepared", "bfloat16"])
def test_features_not_read_in_place_reach_the_model_whole(tmp_path, source):
    """Where the loader would gather every row first, the model aggregates its first layer."""
    from gnnscale.data.synthetic import make_synthetic_graph
    from gnnscale.stores.writing import write_graph

    if source == "prepared":
        folder = write_graph(make_synthetic_graph(TINY), tmp_path / "tiny", {"test": "tiny"})
        dm = NeighborDataModule("prepared", folder, [5, 4], 64)
    else:
        half = Preprocess(feature_dtype="bfloat16")
        dm = NeighborDataModule(
            root=tmp_path, synthetic=TINY, num_neighbors=[5, 4], batch_size=64, preprocess=half
        )
    dm.configure_batches(BatchRequest(2, first_layer_aggr="mean"))
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch.layout.x_aggr is None
    assert batch.x.size(0) == sum(batch.layout.num_sampled_nodes)


def _sage(norm=None, aggr="mean", **speed):
    """A GraphSAGE of this size, built when called."""
    return lambda: GraphSAGE(TINY.num_features, 5, norm=norm, aggr=aggr, speed=SpeedTricks(**speed))


@pytest.mark.parametrize(
    ("model", "aggregated"),
    [
        (_sage(), True),  # the default
        (_sage(aggregate_in_loader=False), False),
        (_sage(sparse_aggregation=False), False),  # needs the sparse product
        (_sage(target_only_layers=False), False),  # needs target-only layers
        (_sage(norm="batch_norm"), False),
        (_sage(aggr="lstm"), False),
        (lambda: GATv2(TINY.num_features, 5, num_layers=2, hidden_channels=16, heads=2), False),
    ],
    ids=[
        "sage",
        "sage-not-in-loader",
        "sage-scatter",
        "sage-not-target-only",
        "sage-batch-norm",
        "sage-lstm",
        "gatv2",
    ],
)
def test_only_a_model_that_takes_it_gets_its_first_layer_from_the_loader(
    tmp_path, model, aggregated
):
    eval_args = EvalArgs(mode="sampled", batch_size=256)
    dm = NeighborDataModule(
        root=tmp_path, synthetic=TINY, num_neighbors=[5, 4], batch_size=64, eval=eval_args
    )
    dm.configure_batches(BatchRequest.of(model()))
    dm.setup("fit")
    for loader in (dm.train_dataloader(), dm.val_dataloader()):
        layout = next(iter(loader)).layout
        assert (layout.x_aggr is not None) == aggregated
        batch = next(iter(loader))
        assert (batch.num_nodes < sum(batch.layout.num_sampled_nodes)) == aggregated


@pytest.mark.parametrize("mode", ["sampled", "layerwise"])
def test_loaders_share_one_copy_of_the_graph_and_keep_their_fanouts(tmp_path, mode):
    eval_args = EvalArgs(
        mode=mode, batch_size=512, num_neighbors=[4, 2] if mode == "sampled" else None
    )
    dm = NeighborDataModule(
        root=tmp_path, batch_size=64, num_neighbors=[10, 5], synthetic=TINY, eval=eval_args
    )
    dm.setup("fit")
    train = dm.train_dataloader().loader
    val, test = dm.val_dataloader(), dm.test_dataloader()
    if mode == "layerwise":  # each yields one LayerwiseBatch wrapping a one-hop loader
        val, test = (next(iter(loader)).loader for loader in (val, test))
    samplers = [loader.node_sampler for loader in (train, val, test)]
    for name in ("colptr", "row", "perm"):
        tensors = [getattr(s, name) for s in samplers if getattr(s, name) is not None]
        assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1, name
    fanouts = [s.num_neighbors.values for s in samplers]
    assert fanouts == [[10, 5], *([[4, 2]] * 2 if mode == "sampled" else [[-1]] * 2)]
    # Each loader still samples with its own fan-out: at most 10 then 50 new nodes per seed.
    batch = next(iter(train))
    assert batch.layout.num_sampled_nodes[1] <= 64 * 10


def test_sampled_evaluation_under_ddp_scores_every_node_once(tmp_path):
    # 299 validation nodes over 2 ranks: Lightning's DistributedSampler would repeat one to give
    # both ranks 150; each rank's RankShare loader takes its own share, which Lightning keeps.
    from types import SimpleNamespace

    eval_args = EvalArgs(mode="sampled", batch_size=64, num_neighbors=[4, 2])
    dm = NeighborDataModule(root=tmp_path, batch_size=64, num_neighbors=[4, 2], synthetic=TINY)
    dm.eval = eval_args
    mask = dm.data.val_mask
    mask[mask.nonzero().view(-1)[299:]] = False
    scored = []
    for rank in (0, 1):
        dm.trainer = SimpleNamespace(world_size=2, global_rank=rank, lightning_module=None)
        loader = dm.val_dataloader()
        assert isinstance(loader, RankShare)  # not a DataLoader: Lightning leaves it
        scored.append([n for batch in loader for n in batch.n_id[: batch.batch_size].tolist()])
    assert abs(len(scored[0]) - len(scored[1])) == 1
    assert sorted(scored[0] + scored[1]) == mask.nonzero().view(-1).tolist()
    dm.trainer = None
    assert not isinstance(dm.val_dataloader(), RankShare)  # one process: PyG's loader


def test_a_dataset_that_cannot_be_downloaded_is_one_line(tmp_path, monkeypatch):
    import re
    import socket

    import torch_geometric.io

    from gnnscale.data.datasets import load_dataset

    def offline(*args, **kwargs):  # what fsspec's HTTP client meets without a network
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(torch_geometric.io.fs, "cp", offline)
    raw = re.escape(str(tmp_path / "Cora" / "raw"))
    message = rf"--data.dataset Cora: its files are not in {raw} and downloading them failed \("
    with pytest.raises(ConfigError, match=message + r".*Name or service not known"):
        load_dataset("Cora", tmp_path)


def test_sampled_evaluation_draws_the_same_neighbourhoods_every_time(tmp_path):
    """Each evaluation batch is sampled under its own seed: the same batches at every epoch,
    with or without workers, and the model's random stream is not moved."""

    def draws(workers: int) -> list[list[int]]:
        dm = NeighborDataModule(
            root=tmp_path,
            batch_size=64,
            num_neighbors=[4, 2],
            synthetic=TINY,
            eval=EvalArgs(mode="sampled", batch_size=100),
            loader=LoaderArgs(num_workers=workers),
        )
        dm.setup("fit")
        state = torch.get_rng_state()
        batches = [b.n_id.tolist() for b in dm.val_dataloader()]
        assert torch.equal(torch.get_rng_state(), state)
        return batches

    first = draws(0)
    assert len(first) > 1 and first == draws(0) == draws(2)


def test_validation_on_a_fixed_subset_of_its_nodes(tmp_path):
    """``eval.val_nodes``: the same random subset of the validation nodes every time, in any
    DataModule; the test scores its whole split; more than there are means all of them."""

    def seeds(val_nodes, split="val"):
        dm = NeighborDataModule(
            root=tmp_path,
            num_neighbors=[4, 2],
            synthetic=TINY,
            eval=EvalArgs(mode="sampled", batch_size=50, val_nodes=val_nodes),
        )
        dm.setup("fit")
        loader = dm.val_dataloader() if split == "val" else dm.test_dataloader()
        found = torch.cat([b.n_id[: b.batch_size] for b in loader])
        return dm, found

    dm, subset = seeds(60)
    val = dm.data.val_mask.nonzero().view(-1)
    assert len(subset) == 60 and len(set(subset.tolist())) == 60
    assert bool(dm.data.val_mask[subset].all())
    assert torch.equal(seeds(60)[1], subset)  # drawn once: the same subset every time
    assert not torch.equal(subset.sort().values, val[:60])  # a random subset, not the first
    assert sorted(seeds(None)[1].tolist()) == sorted(seeds(10**6)[1].tolist()) == val.tolist()
    assert len(seeds(60, "test")[1]) == int(dm.data.test_mask.sum())
    with pytest.raises(ConfigError, match=r"--data.eval.val_nodes must be >= 1"):
        EvalArgs(val_nodes=0)


@pytest.mark.parametrize("mode", ["full", "layerwise"])
def test_whole_graph_evaluation_under_ddp_scores_and_predicts_each_node_once(tmp_path, mode):
    # Each rank's own batch (Lightning's predict sampler would give the one batch to rank 0
    # alone), scoring the test nodes of its block; predicting, its block's nodes.
    from types import SimpleNamespace

    cls = FullBatchDataModule if mode == "full" else NeighborDataModule
    dm = cls(root=tmp_path, synthetic=TINY, eval=EvalArgs(mode=mode))
    dm.setup("test")
    scored: dict[str, list[torch.Tensor]] = {"test": [], "predict": []}
    for rank in (0, 1):
        dm.trainer = SimpleNamespace(world_size=2, global_rank=rank)
        for stage, loader in (("test", dm.test_dataloader()), ("predict", dm.predict_dataloader())):
            assert isinstance(loader, RankShare)  # not a DataLoader: Lightning leaves it
            (batch,) = list(loader)
            scored[stage].append(batch.layout.score if mode == "full" else batch.mask)
    for stage, whole in (
        ("test", dm.data.test_mask),
        ("predict", torch.ones_like(dm.data.test_mask)),
    ):
        first, second = scored[stage]
        assert first.any() and second.any() and not (first & second).any()
        assert torch.equal(first | second, whole)


def test_node_features_of_width_zero_are_refused_naming_what_to_do():
    from gnnscale.data.datasets import validate_graph

    n = 10
    masks = {
        k: torch.zeros(n, dtype=torch.bool).index_fill_(0, torch.tensor([i]), True)
        for i, k in enumerate(("train_mask", "val_mask", "test_mask"))
    }
    data = Data(x=torch.zeros(n, 0), y=torch.zeros(n, dtype=torch.long), **masks)
    refused = r"node features of width 0 .* \(gnnscale.EmbeddingSAGE\)"
    with pytest.raises(ConfigError, match=refused):
        validate_graph(data, "mine")
    y = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1, 0, 1])
    validate_graph(Data(x=torch.zeros(n, 1), y=y, **masks), "mine")  # one feature: fine
