"""PyG's own tests of temporal and weighted sampling, with gnnscale's sampler passed in.

PyG 2.8's ``test/loader/test_neighbor_loader.py``, ``test/loader/test_link_neighbor_loader.py``
and ``test/sampler/test_sampler_neighbor_sampler.py``: every case that samples by time or weight.
PyG runs them only with pyg-lib installed; here each loader gets ``neighbor_sampler=HopSampler(
...)`` with the arguments PyG's ``NeighborSampler`` takes (the loaders' own), or a test builds
``HopSampler`` where PyG's builds ``NeighborSampler``. Graphs and assertions are PyG's.
"""

import pytest
import torch
from torch_geometric.data import Data, HeteroData
from torch_geometric.datasets import KarateClub
from torch_geometric.loader import LinkNeighborLoader, NeighborLoader
from torch_geometric.sampler import NodeSamplerInput
from torch_geometric.testing import MyFeatureStore, MyGraphStore, get_random_edge_index

from gnnscale.sampling import HopSampler

# test_neighbor_loader.py


def test_temporal_hetero_neighbor_loader_on_karate():
    data = KarateClub()[0]

    hetero_data = HeteroData()
    hetero_data["v"].x = data.x
    hetero_data["v"].time = torch.arange(data.num_nodes, 0, -1)
    hetero_data["v", "v"].edge_index = data.edge_index

    loader = NeighborLoader(
        hetero_data,
        num_neighbors=[-1, -1],
        input_nodes="v",
        time_attr="time",
        batch_size=1,
        neighbor_sampler=HopSampler(hetero_data, [-1, -1], time_attr="time"),
    )

    for batch in loader:
        mask = batch["v"].time[0] >= batch["v"].time[1:]
        assert torch.all(mask)


def test_temporal_custom_neighbor_loader_on_karate():
    data = KarateClub()[0]
    data.time = torch.arange(data.num_nodes, 0, -1)

    feature_store = MyFeatureStore()
    graph_store = MyGraphStore()
    hetero_data = HeteroData()

    feature_store.put_tensor(data.x, group_name="v", attr_name="x", index=None)
    hetero_data["v"].x = data.x

    feature_store.put_tensor(data.time, group_name="v", attr_name="time", index=None)
    hetero_data["v"].time = data.time

    # Sort according to time in local neighborhoods:
    row, col = data.edge_index
    perm = ((col * (data.num_nodes + 1)) + data.time[row]).argsort()
    edge_index = data.edge_index[:, perm]

    graph_store.put_edge_index(
        edge_index,
        edge_type=("v", "to", "v"),
        layout="coo",
        is_sorted=True,
        size=(data.num_nodes, data.num_nodes),
    )
    hetero_data["v", "to", "v"].edge_index = data.edge_index

    loader1 = NeighborLoader(
        hetero_data,
        num_neighbors=[-1, -1],
        input_nodes="v",
        time_attr="time",
        batch_size=128,
        neighbor_sampler=HopSampler(hetero_data, [-1, -1], time_attr="time"),
    )

    stores = (feature_store, graph_store)
    loader2 = NeighborLoader(
        stores,
        num_neighbors=[-1, -1],
        input_nodes="v",
        time_attr="time",
        batch_size=128,
        neighbor_sampler=HopSampler(stores, [-1, -1], time_attr="time"),
    )

    for batch1, batch2 in zip(loader1, loader2, strict=True):
        assert torch.equal(batch1["v"].time, batch2["v"].time)


def test_weighted_homo_neighbor_loader():
    edge_index = torch.tensor([[1, 3, 0, 4], [2, 2, 1, 3]])
    edge_weight = torch.tensor([0.0, 1.0, 0.0, 1.0])

    data = Data(num_nodes=5, edge_index=edge_index, edge_weight=edge_weight)

    loader = NeighborLoader(
        data,
        input_nodes=torch.tensor([2]),
        num_neighbors=[1] * 2,
        batch_size=1,
        weight_attr="edge_weight",
        neighbor_sampler=HopSampler(data, [1] * 2, weight_attr="edge_weight"),
    )
    assert len(loader) == 1

    batch = next(iter(loader))

    assert batch.num_nodes == 3
    assert batch.n_id.tolist() == [2, 3, 4]
    assert batch.num_edges == 2
    assert batch.n_id[batch.edge_index].tolist() == [[3, 4], [2, 3]]


def test_weighted_hetero_neighbor_loader():
    edge_index = torch.tensor([[1, 3, 0, 4], [2, 2, 1, 3]])
    edge_weight = torch.tensor([0.0, 1.0, 0.0, 1.0])

    data = HeteroData()
    data["paper"].num_nodes = 5
    data["paper", "to", "paper"].edge_index = edge_index
    data["paper", "to", "paper"].edge_weight = edge_weight

    loader = NeighborLoader(
        data,
        input_nodes=("paper", torch.tensor([2])),
        num_neighbors=[1] * 2,
        batch_size=1,
        weight_attr="edge_weight",
        neighbor_sampler=HopSampler(data, [1] * 2, weight_attr="edge_weight"),
    )
    assert len(loader) == 1

    batch = next(iter(loader))

    assert batch["paper"].num_nodes == 3
    assert batch["paper"].n_id.tolist() == [2, 3, 4]
    assert batch["paper", "paper"].num_edges == 2
    global_edge_index = batch["paper"].n_id[batch["paper", "paper"].edge_index]
    assert global_edge_index.tolist() == [[3, 4], [2, 3]]


def test_edge_level_temporal_homo_neighbor_loader():
    edge_index = torch.tensor([[0, 1, 1, 2, 2, 3, 3, 4], [1, 0, 2, 1, 3, 2, 4, 3]])
    edge_time = torch.arange(edge_index.size(1))

    data = Data(edge_index=edge_index, edge_time=edge_time, num_nodes=5)

    loader = NeighborLoader(
        data,
        num_neighbors=[-1, -1],
        input_time=torch.tensor([4, 4, 4, 4, 4]),
        time_attr="edge_time",
        batch_size=1,
        neighbor_sampler=HopSampler(data, [-1, -1], time_attr="edge_time"),
    )

    for batch in loader:
        assert batch.edge_time.numel() == batch.num_edges
        if batch.edge_time.numel() > 0:
            assert batch.edge_time.max() <= 4


def test_edge_level_temporal_hetero_neighbor_loader():
    edge_index = torch.tensor([[0, 1, 1, 2, 2, 3, 3, 4], [1, 0, 2, 1, 3, 2, 4, 3]])
    edge_time = torch.arange(edge_index.size(1))

    data = HeteroData()
    data["A"].num_nodes = 5
    data["A", "A"].edge_index = edge_index
    data["A", "A"].edge_time = edge_time

    loader = NeighborLoader(
        data,
        num_neighbors=[-1, -1],
        input_nodes="A",
        input_time=torch.tensor([4, 4, 4, 4, 4]),
        time_attr="edge_time",
        batch_size=1,
        neighbor_sampler=HopSampler(data, [-1, -1], time_attr="edge_time"),
    )

    for batch in loader:
        assert batch["A", "A"].edge_time.numel() == batch["A", "A"].num_edges
        if batch["A", "A"].edge_time.numel() > 0:
            assert batch["A", "A"].edge_time.max() <= 4


# test_link_neighbor_loader.py


@pytest.mark.parametrize("batch_size", [1])
def test_temporal_homo_link_neighbor_loader(batch_size):
    data = Data(
        x=torch.randn(10, 5),
        edge_index=torch.randint(0, 10, (2, 123)),
        time=torch.arange(10),
    )

    # Ensure that nodes exist at the time of the `edge_label_time`:
    edge_label_time = torch.max(data.time[data.edge_index[0]], data.time[data.edge_index[1]])

    loader = LinkNeighborLoader(
        data,
        num_neighbors=[-1],
        time_attr="time",
        edge_label=torch.ones(data.num_edges),
        edge_label_time=edge_label_time,
        batch_size=batch_size,
        shuffle=True,
        neighbor_sampler=HopSampler(data, [-1], time_attr="time"),
    )

    for batch in loader:
        assert batch.edge_label_index.size() == (2, batch_size)
        assert batch.edge_label_time.size() == (batch_size,)
        assert batch.edge_label.size() == (batch_size,)
        assert torch.all(batch.time <= batch.edge_label_time)


def test_temporal_hetero_link_neighbor_loader():
    data = HeteroData()

    data["paper"].x = torch.arange(100)
    data["paper"].time = torch.arange(data["paper"].num_nodes) - 200
    data["author"].x = torch.arange(100, 300)
    data["author"].time = torch.arange(data["author"].num_nodes)

    data["paper", "paper"].edge_index = get_random_edge_index(100, 100, 500)
    data["paper", "author"].edge_index = get_random_edge_index(100, 200, 1000)
    data["author", "paper"].edge_index = get_random_edge_index(200, 100, 1000)

    with pytest.raises(ValueError, match=r"'edge_label_time' is not set"):
        loader = LinkNeighborLoader(
            data,
            num_neighbors=[-1] * 2,
            edge_label_index=("paper", "paper"),
            batch_size=32,
            time_attr="time",
            neighbor_sampler=HopSampler(data, [-1] * 2, time_attr="time"),
        )

    # With edge_time:
    edge_time = torch.arange(data["paper", "paper"].edge_index.size(1))
    loader = LinkNeighborLoader(
        data,
        num_neighbors=[-1] * 2,
        edge_label_index=("paper", "paper"),
        edge_label_time=edge_time,
        batch_size=32,
        time_attr="time",
        neg_sampling_ratio=0.5,
        drop_last=True,
        neighbor_sampler=HopSampler(data, [-1] * 2, time_attr="time"),
    )
    for batch in loader:
        # Check if each seed edge has a different batch:
        assert int(batch["paper"].batch.max()) + 1 == 32

        author_max = batch["author"].time.max()
        edge_max = batch["paper", "paper"].edge_label_time.max()
        assert edge_max >= author_max
        author_min = batch["author"].time.min()
        edge_min = batch["paper", "paper"].edge_label_time.min()
        assert edge_min >= author_min


@pytest.mark.parametrize("disjoint", [False, True])
@pytest.mark.parametrize("temporal", [False, True])
@pytest.mark.parametrize("amount", [1, 2])
def test_homo_link_neighbor_loader_triplet(disjoint, temporal, amount):
    if not disjoint and temporal:
        return

    data = Data()
    data.x = torch.arange(100)
    data.edge_index = get_random_edge_index(100, 100, 400)
    data.edge_label_index = get_random_edge_index(100, 100, 500)
    data.edge_attr = torch.arange(data.num_edges)

    time_attr = edge_label_time = None
    if temporal:
        time_attr = "time"
        data.time = torch.arange(data.num_nodes)

        edge_label_time = torch.max(
            data.time[data.edge_label_index[0]], data.time[data.edge_label_index[1]]
        )
        edge_label_time = edge_label_time + 50

    batch_size = 20
    loader = LinkNeighborLoader(
        data,
        num_neighbors=[-1] * 2,
        batch_size=batch_size,
        edge_label_index=data.edge_label_index,
        edge_label_time=edge_label_time,
        time_attr=time_attr,
        disjoint=disjoint,
        neg_sampling=dict(mode="triplet", amount=amount),
        shuffle=True,
        neighbor_sampler=HopSampler(data, [-1] * 2, disjoint=disjoint, time_attr=time_attr),
    )

    assert str(loader) == "LinkNeighborLoader()"
    assert len(loader) == 500 / batch_size

    for batch in loader:
        assert isinstance(batch, Data)

        # Check that `src_index` and `dst_pos_index` point to valid edges:
        assert torch.equal(batch.x[batch.src_index], data.edge_label_index[0, batch.input_id])
        assert torch.equal(batch.x[batch.dst_pos_index], data.edge_label_index[1, batch.input_id])

        # Check that `dst_neg_index` points to valid nodes in the batch:
        if amount == 1:
            assert batch.dst_neg_index.size() == (batch_size,)
        else:
            assert batch.dst_neg_index.size() == (batch_size, amount)
        assert batch.dst_neg_index.min() >= 0
        assert batch.dst_neg_index.max() < batch.num_nodes

        if disjoint:
            # In disjoint mode, seed nodes should always be placed first:
            assert batch.src_index.min() == 0
            assert batch.src_index.max() == batch_size - 1

            assert batch.dst_pos_index.min() == batch_size
            assert batch.dst_pos_index.max() == 2 * batch_size - 1

            assert batch.dst_neg_index.min() == 2 * batch_size
            max_seed_nodes = 2 * batch_size + batch_size * amount
            assert batch.dst_neg_index.max() == max_seed_nodes - 1

            assert batch.batch.min() == 0
            assert batch.batch.max() == batch_size - 1

            # Check that `batch` is always increasing:
            for i in range(0, max_seed_nodes, batch_size):
                batch_vector = batch.batch[i : i + batch_size]
                assert torch.equal(batch_vector, torch.arange(batch_size))

        if temporal:
            for i in range(batch_size):
                assert batch.time[batch.batch == i].max() <= batch.seed_time[i]


@pytest.mark.parametrize("disjoint", [False, True])
@pytest.mark.parametrize("temporal", [False, True])
@pytest.mark.parametrize("amount", [1, 2])
def test_hetero_link_neighbor_loader_triplet(disjoint, temporal, amount):
    if not disjoint and temporal:
        return

    data = HeteroData()

    data["paper"].x = torch.arange(100)
    data["author"].x = torch.arange(100, 300)

    data["paper", "paper"].edge_index = get_random_edge_index(100, 100, 400)
    edge_label_index = get_random_edge_index(100, 100, 500)
    data["paper", "paper"].edge_label_index = edge_label_index
    data["paper", "author"].edge_index = get_random_edge_index(100, 200, 1000)
    data["author", "paper"].edge_index = get_random_edge_index(200, 100, 1000)

    time_attr = edge_label_time = None
    if temporal:
        time_attr = "time"
        data["paper"].time = torch.arange(data["paper"].num_nodes)
        data["author"].time = torch.arange(data["author"].num_nodes)

        edge_label_time = torch.max(
            data["paper"].time[data["paper", "paper"].edge_label_index[0]],
            data["paper"].time[data["paper", "paper"].edge_label_index[1]],
        )
        edge_label_time = edge_label_time + 50

    weight = torch.rand(data["paper"].num_nodes) if not temporal else None

    batch_size = 20
    index = (("paper", "paper"), data["paper", "paper"].edge_label_index)
    loader = LinkNeighborLoader(
        data,
        num_neighbors=[-1] * 2,
        batch_size=batch_size,
        edge_label_index=index,
        edge_label_time=edge_label_time,
        time_attr=time_attr,
        disjoint=disjoint,
        neg_sampling=dict(
            mode="triplet",
            amount=amount,
            src_weight=weight,
            dst_weight=weight,
        ),
        shuffle=True,
        neighbor_sampler=HopSampler(data, [-1] * 2, disjoint=disjoint, time_attr=time_attr),
    )

    assert str(loader) == "LinkNeighborLoader()"
    assert len(loader) == 500 / batch_size

    for batch in loader:
        assert isinstance(batch, HeteroData)

        node_store = batch["paper"]
        edge_store = batch["paper", "paper"]

        # Check that `src_index` and `dst_pos_index` point to valid edges:
        assert torch.equal(
            node_store.x[node_store.src_index],
            data["paper", "paper"].edge_label_index[0, edge_store.input_id],
        )
        assert torch.equal(
            node_store.x[node_store.dst_pos_index],
            data["paper", "paper"].edge_label_index[1, edge_store.input_id],
        )

        # Check that `dst_neg_index` points to valid nodes in the batch:
        if amount == 1:
            assert node_store.dst_neg_index.size() == (batch_size,)
        else:
            assert node_store.dst_neg_index.size() == (batch_size, amount)
        assert node_store.dst_neg_index.min() >= 0
        assert node_store.dst_neg_index.max() < node_store.num_nodes

        if disjoint:
            # In disjoint mode, seed nodes should always be placed first:
            assert node_store.src_index.min() == 0
            assert node_store.src_index.max() == batch_size - 1

            assert node_store.dst_pos_index.min() == batch_size
            assert node_store.dst_pos_index.max() == 2 * batch_size - 1

            assert node_store.dst_neg_index.min() == 2 * batch_size
            max_seed_nodes = 2 * batch_size + batch_size * amount
            assert node_store.dst_neg_index.max() == max_seed_nodes - 1

            assert node_store.batch.min() == 0
            assert node_store.batch.max() == batch_size - 1

            # Check that `batch` is always increasing:
            for i in range(0, max_seed_nodes, batch_size):
                batch_vector = node_store.batch[i : i + batch_size]
                assert torch.equal(batch_vector, torch.arange(batch_size))

        if temporal:
            for i in range(batch_size):
                assert node_store.time[node_store.batch == i].max() <= node_store.seed_time[i]


# test_sampler_neighbor_sampler.py: Alice (0) -> Bob (1), Alice -> Carol (2), Carol -> Dave (3)


def _people(input_type, reverse=False):
    x = torch.tensor([[0], [1], [2], [3]])
    edge_attr = torch.tensor([[1], [2], [3]])
    edge_index = torch.tensor([[0, 0, 2], [1, 2, 3]])
    if reverse:
        edge_index = edge_index.flip(0)
    if input_type == "data":
        return Data(edge_index=edge_index, x=x, time=x.squeeze(-1), edge_attr=edge_attr.squeeze(-1))
    graph_store = MyGraphStore()
    graph_store.put_edge_index(
        edge_index, edge_type=None, layout="coo", is_sorted=True, size=(4, 4)
    )
    feature_store = MyFeatureStore()
    feature_store.put_tensor(x, group_name="default", attr_name="x", index=None)
    # temporal node sampling on (fs, gs) needs 'time' attr
    feature_store.put_tensor(x.squeeze(-1), group_name="default", attr_name="time", index=None)
    feature_store.put_tensor(
        edge_attr.squeeze(-1), group_name="default", attr_name="edge_attr", index=None
    )
    return (feature_store, graph_store)


@pytest.mark.parametrize("input_type", ["data", "remote"])
def test_homogeneous_neighbor_sampler_weighted_backwards(input_type):
    graph_to_sample = _people(input_type)
    reverse_graph_to_sample = _people(input_type, reverse=True)

    sampler_kwargs = {
        "data": graph_to_sample,
        "num_neighbors": [1, 1],
        "weight_attr": "weight",
        "sample_direction": "backward",
    }
    reverse_sampler_kwargs = {
        "data": reverse_graph_to_sample,
        "num_neighbors": [1, 1],
        "weight_attr": "weight",
        "sample_direction": "forward",
    }

    if input_type == "remote":
        with pytest.raises(NotImplementedError):
            HopSampler(**sampler_kwargs)
        return

    graph_to_sample["weight"] = torch.tensor([1.0, 0.0, 1.0])
    reverse_graph_to_sample["weight"] = torch.tensor([1.0, 0.0, 1.0])

    node_sampler_input = NodeSamplerInput(input_id=None, node=torch.tensor([0]))

    # Sampling from Alice should yield Bob
    backward_sampler = HopSampler(**sampler_kwargs)
    backward_sampler_output = backward_sampler.sample_from_nodes(node_sampler_input)

    reverse_sampler = HopSampler(**reverse_sampler_kwargs)
    reverse_sampler_output = reverse_sampler.sample_from_nodes(node_sampler_input)

    assert torch.equal(backward_sampler_output.node, reverse_sampler_output.node)
    assert torch.equal(backward_sampler_output.row, reverse_sampler_output.col)
    assert torch.equal(backward_sampler_output.col, reverse_sampler_output.row)
    assert torch.equal(backward_sampler_output.edge, reverse_sampler_output.edge)

    graph_to_sample["weight"] = torch.tensor([0.0, 1.0, 1.0])
    reverse_graph_to_sample["weight"] = torch.tensor([0.0, 1.0, 1.0])

    # Sampling from Alice should yield Carol and Dave
    backward_sampler = HopSampler(**sampler_kwargs)
    backward_sampler_output = backward_sampler.sample_from_nodes(node_sampler_input)

    reverse_sampler = HopSampler(**reverse_sampler_kwargs)
    reverse_sampler_output = reverse_sampler.sample_from_nodes(node_sampler_input)

    assert torch.equal(backward_sampler_output.node, reverse_sampler_output.node)
    assert torch.equal(backward_sampler_output.row, reverse_sampler_output.col)
    assert torch.equal(backward_sampler_output.col, reverse_sampler_output.row)
    assert torch.equal(backward_sampler_output.edge, reverse_sampler_output.edge)


@pytest.mark.parametrize("input_type", ["data", "remote"])
@pytest.mark.parametrize("time_attr", ["time", "edge_attr"])
def test_homogeneous_neighbor_sampler_temporal_backwards(input_type, time_attr):
    graph_to_sample = _people(input_type)
    reverse_graph_to_sample = _people(input_type, reverse=True)

    sampler_kwargs = {"data": graph_to_sample, "num_neighbors": [2, 2], "time_attr": time_attr}
    reverse_sampler_kwargs = {
        "data": reverse_graph_to_sample,
        "num_neighbors": [2, 2],
        "time_attr": time_attr,
    }

    node_sampler_input = NodeSamplerInput(
        input_id=None, node=torch.tensor([1]), time=torch.tensor([1])
    )
    reverse_node_sampler_input = NodeSamplerInput(
        input_id=None, node=torch.tensor([0]), time=torch.tensor([1])
    )

    sampler = HopSampler(**sampler_kwargs)
    sampler_output = sampler.sample_from_nodes(node_sampler_input)

    reverse_sampler = HopSampler(**reverse_sampler_kwargs)
    reverse_sampler_output = reverse_sampler.sample_from_nodes(reverse_node_sampler_input)

    assert torch.equal(sampler_output.node, torch.tensor([1, 0]))
    assert torch.equal(reverse_sampler_output.node, torch.tensor([0, 1]))
