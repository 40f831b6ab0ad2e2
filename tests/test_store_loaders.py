"""PyG's loaders over a prepared folder's stores give the batches of the graph in memory."""

import ast
import copy
import dataclasses
import json
import pickle
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from torch_geometric.data import Data, HeteroData, TensorAttr
from torch_geometric.index import index2ptr
from torch_geometric.loader import LinkNeighborLoader, NeighborLoader

from gnnscale import (
    NeighborDataModule,
    make_synthetic_graph,
    stores,
)
from gnnscale.data.args import EvalArgs
from gnnscale.data.synthetic import write_streamed_synthetic
from gnnscale.errors import ConfigError
from gnnscale.handshake import BatchRequest
from gnnscale.sampling import HopSampler
from gnnscale.stores import reads
from gnnscale.stores.manifest import PreparedGraphError
from gnnscale.stores.prepared import MappedTensor, PreparedGraph
from gnnscale.stores.writing import write_graph
from gnnscale.testing import (
    MAG_COUNTS,
    MAG_RELATIONS,
    TINY,
    by_destination,
    quiet_trainer,
)

# threads, and a feature cache's budget in bytes (0: none)
READS = [(1, 0), (4, 0), (4, 4000)]
READ_IDS = ["one gather", "threaded reads", "threaded reads and a feature cache"]


def _batches(data, seed, **kwargs):
    torch.manual_seed(seed)
    is_sorted = isinstance(data, (Data, HeteroData))  # in memory: edges already by destination
    if "neighbor_sampler" not in kwargs:
        kwargs["neighbor_sampler"] = HopSampler(data, kwargs["num_neighbors"], is_sorted=is_sorted)
    return list(NeighborLoader(data, shuffle=True, is_sorted=is_sorted, **kwargs))


def _check_cache(fs, budget):
    """The cache keeps to its budget and held some of the batches' rows (none without one)."""
    held = fs.count_held(Data())
    if not budget:
        assert not fs.cache and held.feature_reads.total == 0
        return
    rows = sum(c.ids.numel() for c in fs.cache.values())
    assert 0 < sum(c.nbytes for c in fs.cache.values()) <= budget and rows > 0
    reads = held.feature_reads
    assert 0 < reads.cached < reads.total, reads


def test_stores_never_import_the_data_package():
    """Data reads stores (a DataModule maps a prepared folder), never the reverse: a generator
    of data lives in ``gnnscale.data`` and hands its chunks to a writer here."""
    for path in Path(stores.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            assert not any(n.startswith("gnnscale.data") for n in names), (path.name, names)
            assert "gnnscale" not in names, path.name  # the package's __init__ imports data


@pytest.mark.parametrize(("read_threads", "cache_bytes"), READS, ids=READ_IDS)
def test_pygs_neighbor_loader_on_the_store_gives_the_batches_of_the_graph_in_memory(
    tmp_path, homogeneous, read_threads, cache_bytes, monkeypatch
):
    monkeypatch.setattr(reads, "MIN_ROWS", 8)  # threads share even a small batch's rows
    folder, data = homogeneous
    out = stores.prepare_npy(folder, tmp_path / "store", chunk_bytes=4096)
    kwargs = {
        "num_neighbors": [5, 3],
        "input_nodes": data.train_mask.nonzero().view(-1),
        "batch_size": 64,
    }
    cache = {"feature_cache_gib": cache_bytes / 2**30, "num_neighbors": [5, 3], "batch_size": 64}
    fs, gs = stores.open(out, read_threads=read_threads, **cache)
    memory, disk = _batches(data, 1, **kwargs), _batches((fs, gs), 1, **kwargs)
    assert len(memory) == len(disk) == 5
    edge_index = torch.from_numpy(np.load(folder / "edge_index.npy")).long()
    by_dst = edge_index[1].sort(stable=True).indices  # memory's edges, as the input's ids
    for a, b in zip(memory, disk, strict=True):
        for key in ("x", "y", "edge_index", "n_id", "train_mask", "val_mask", "test_mask"):
            assert torch.equal(a[key], b[key]), key
        assert a.batch_size == b.batch_size
        # Edge ids are positions in the input's edge list (edge attributes kept beside it
        # are indexed by them), not in the store's CSC.
        assert torch.equal(by_dst[a.e_id], b.e_id)
        assert torch.equal(edge_index[:, b.e_id], b.n_id[b.edge_index])
    _check_cache(fs, cache_bytes)


def test_edge_ids_are_the_inputs_and_a_sorted_input_keeps_no_map(tmp_path):
    """A graph written from memory with its edges in no order: a batch's ``e_id`` indexes its
    ``edge_index`` as PyG's loaders in memory do. Edges already by destination (the generated
    graph) store no map: their CSC is the input's order."""
    data = make_synthetic_graph(TINY)
    shuffled = copy.copy(data)
    shuffled.edge_index = data.edge_index[:, torch.randperm(data.num_edges)]
    folder = write_graph(shuffled, tmp_path / "shuffled", {"test": "e_id"})
    assert "perm" in PreparedGraph(folder).manifest.files
    fs, gs = stores.open(folder)
    torch.manual_seed(0)
    loader = NeighborLoader(
        (fs, gs),
        num_neighbors=[4, 2],
        input_nodes=torch.arange(300),
        neighbor_sampler=HopSampler((fs, gs), [4, 2]),
    )
    for batch in loader:
        ends = batch.n_id[batch.edge_index]
        assert torch.equal(shuffled.edge_index[:, batch.e_id], ends)
    streamed = write_streamed_synthetic(TINY, tmp_path / "streamed")
    assert "perm" not in PreparedGraph(streamed).manifest.files


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["used in place", "copied"])
def test_edge_features_from_the_store_are_the_in_memory_loaders(tmp_path, homogeneous, dtype):
    """``edge_attr.npy`` beside the edges, gathered by each batch's ``e_id``: what PyG's loader
    slices from ``data.edge_attr`` in memory (a store held no edge features before)."""
    folder, data = homogeneous
    edge_index = torch.from_numpy(np.load(folder / "edge_index.npy")).long()
    attr = torch.randn(edge_index.shape[1], 3, dtype=torch.float64)
    np.save(folder / "edge_attr.npy", attr.numpy().astype(dtype))
    out = stores.prepare_npy(folder, tmp_path / "store", chunk_bytes=4096)
    graph = PreparedGraph(out)
    assert graph.manifest.num_edge_features == 3
    assert (graph.manifest.files["edge_attr"].path is not None) == (dtype == np.float32)
    data.edge_attr = attr.float()[edge_index[1].sort(stable=True).indices]  # memory's order
    fs, gs = stores.open(out)
    kwargs = {"num_neighbors": [5, 3], "input_nodes": data.train_mask, "batch_size": 64}
    memory = _batches(data, 1, **kwargs)
    disk = _batches((fs, gs), 1, transform=fs.add_edge_attr, **kwargs)
    assert len(memory) == len(disk) == 5
    for a, b in zip(memory, disk, strict=True):
        assert b.edge_attr.dtype == torch.float32 and b.edge_attr.shape == (b.num_edges, 3)
        assert torch.equal(a.edge_attr, b.edge_attr)
    assert "edge_attr" not in _batches((fs, gs), 1, **kwargs)[0]  # PyG's loader alone: none


def test_heterogeneous_edge_features_from_the_store_are_the_in_memory_link_loaders(
    tmp_path, heterogeneous
):
    """One relation with features, one without; a link loader's batches as in memory."""
    folder, data, _ = heterogeneous
    writes = ("author", "writes", "paper")
    edges = folder / "edges" / "__".join(writes)
    edge_index = torch.from_numpy(np.load(edges / "edge_index.npy")).long()
    attr = torch.randn(edge_index.shape[1], 2)
    np.save(edges / "edge_attr.npy", attr.numpy())
    data[writes].edge_attr = attr[edge_index[1].sort(stable=True).indices]
    out = stores.prepare_npy(folder, tmp_path / "store", chunk_bytes=4096)
    assert PreparedGraph(out).manifest.num_edge_features == {"author__writes__paper": 2}
    fs, gs = stores.open(out)
    fanout = {t: [4, 2] for t in data.edge_types}

    def batches(source, transform=None):
        torch.manual_seed(3)
        labelled = (writes, data[writes].edge_index[:, :120])
        loader = LinkNeighborLoader(
            source,
            fanout,
            edge_label_index=labelled,
            batch_size=40,
            shuffle=True,
            transform=transform,
            is_sorted=source is data,
            neighbor_sampler=HopSampler(source, fanout, is_sorted=source is data),
        )
        return list(loader)

    memory, disk = batches(data), batches((fs, gs), fs.add_edge_attr)
    assert len(memory) == len(disk) == 3
    for a, b in zip(memory, disk, strict=True):
        assert torch.equal(a[writes].edge_attr, b[writes].edge_attr)
        assert "edge_attr" not in b["paper", "cites", "paper"]


@pytest.mark.parametrize("relation", [None, ("author", "writes", "paper")], ids=["homo", "hetero"])
def test_seed_edges_are_mapped_pairs_that_give_pygs_link_batches(tmp_path, request, relation):
    """PyG's loader given an edge type stacks the whole COO in memory; ``seed_edges`` maps the
    same pairs from a file written once beside the folder, and the batches are the same."""
    from test_ondisk import _mapped_file

    folder = request.getfixturevalue("homogeneous" if relation is None else "heterogeneous")[0]
    out = stores.prepare_npy(folder, tmp_path / "store")
    fs, gs = stores.open(out)
    edge_type, pairs = stores.seed_edges(gs, relation)
    name = "edges" if relation is None else "__".join(relation)
    written = tmp_path / f"store.edges-{name}"
    assert edge_type == relation and pairs.shape == (2, gs.csc_by_type[relation][0].numel())
    assert _mapped_file(pairs.data_ptr()).startswith(str(written))  # not a private copy
    mtime = (written / "edge_label_index.bin").stat().st_mtime_ns
    assert torch.equal(stores.seed_edges(gs, relation)[1], pairs)  # written once
    assert (written / "edge_label_index.bin").stat().st_mtime_ns == mtime
    fanout = [4, 2] if relation is None else {t: [4, 2] for t in gs.csc_by_type}

    def batches(edge_label_index, share=False):
        torch.manual_seed(5)
        loader = LinkNeighborLoader(
            (fs, gs),
            fanout,
            edge_label_index=edge_label_index,
            batch_size=512,
            shuffle=True,
            neighbor_sampler=HopSampler((fs, gs), fanout),
        )
        if share:  # docs/stores.md: the loader's clone of the pairs dropped for the mapped ones
            loader.input_data.row, loader.input_data.col = pairs[0], pairs[1]
            assert _mapped_file(loader.input_data.col.data_ptr()).startswith(str(written))
        return list(loader)

    if relation is None:  # PyG's own COO of a homogeneous store fails in torch's sparse code
        row, colptr, _ = gs.csc_by_type[None]
        col = torch.arange(colptr.numel() - 1).repeat_interleave(colptr.diff())
        stacked = batches((None, torch.stack([row, col])))
    else:
        stacked = batches(relation)  # PyG's own: the store's COO, stacked in memory
    mapped, shared = batches((edge_type, pairs)), batches((edge_type, pairs), share=True)
    assert len(stacked) == len(mapped) == len(shared) > 1
    for a, b in [*zip(stacked, mapped, strict=True), *zip(stacked, shared, strict=True)]:
        for x, y in zip(a.node_stores, b.node_stores, strict=True):
            assert torch.equal(x.n_id, y.n_id)
        for x, y in zip(a.edge_stores, b.edge_stores, strict=True):
            assert sorted(x.keys()) == sorted(y.keys())
            for key in ("edge_index", "edge_label_index", "edge_label"):
                assert key not in x or torch.equal(x[key], y[key]), key


class _WithEdges(NeighborDataModule):
    """The generated graph with three features an edge, each edge once: of two copies of an
    edge, PyG's in-memory sampler (its unstable sort without pyg-lib) and the store (the
    input's order) may list either first, and their features differ."""

    def _load(self):
        from torch_geometric.utils import coalesce

        data = super()._load()
        data.edge_index = coalesce(data.edge_index, num_nodes=data.num_nodes)
        g = torch.Generator().manual_seed(7)
        data.edge_attr = torch.randn(data.num_edges, 3, generator=g)
        return data


@pytest.fixture
def edge_featured(tmp_path):
    """The tiny graph with 3 features an edge, in memory and prepared; the loaders' settings."""
    from gnnscale.data.args import LoaderArgs
    from gnnscale.stores.npy import prepare_data

    kwargs = {
        "num_neighbors": [5, 3],
        "batch_size": 200,
        "loader": LoaderArgs(num_workers=0),
        "eval": EvalArgs(mode="sampled", num_neighbors=[5, 3]),
    }
    memory = _WithEdges(synthetic=TINY, **kwargs)
    out = prepare_data(memory.data, tmp_path / "store", {"test": "edges"})
    return memory, out, kwargs


def test_gatv2_reading_edge_features_trains_from_a_folder_as_in_memory(edge_featured):
    """``--model.edge_dim``: the loaders give each batch its edges' features, sliced by PyG in
    memory and gathered by ``e_id`` from a folder; the same weights after an epoch, and the
    edge weights trained (a model that ignored them would leave them as initialised)."""
    from gnnscale import GATv2

    memory, out, kwargs = edge_featured
    disk = NeighborDataModule("prepared", out, **kwargs)
    trained = {}
    for name, dm in (("memory", memory), ("disk", disk)):
        L.seed_everything(0)
        model = GATv2(TINY.num_features, TINY.num_classes, hidden_channels=16, heads=2, edge_dim=3)
        before = model.gnn.convs[0].lin_edge.weight.detach().clone()
        trainer = quiet_trainer(max_epochs=1)
        trainer.fit(model, dm)
        assert not torch.equal(model.gnn.convs[0].lin_edge.weight, before)
        trained[name] = model.state_dict()
    for key, value in trained["memory"].items():
        assert torch.equal(value, trained["disk"][key]), key
    L.seed_everything(0)
    wrong = GATv2(TINY.num_features, TINY.num_classes, hidden_channels=16, heads=2, edge_dim=4)
    with pytest.raises(ConfigError, match=r"edge_dim is 4 but the edges of \S+store have 3 f"):
        fresh = NeighborDataModule("prepared", out, **kwargs)
        L.Trainer(accelerator="cpu", logger=False, max_epochs=1).fit(wrong, fresh)
    exact = NeighborDataModule("prepared", out, eval=EvalArgs(mode="layerwise"))
    with pytest.raises(ConfigError, match="layer-wise evaluation reads no edge features; use --d"):
        exact.configure_batches(BatchRequest(2, edge_dim=3))
    plain = NeighborDataModule(synthetic=TINY, **kwargs)  # a graph without edge features
    plain.configure_batches(BatchRequest(2, edge_dim=3))
    with pytest.raises(ConfigError, match="edges of synthetic have 0 feature.s. .edge_attr.: set"):
        plain.setup("fit")


def test_a_folders_batches_carry_edge_ids_only_for_a_model_that_reads_edge_features(
    edge_featured,
):
    """A batch's ``e_id`` reads the folder's ``perm`` once per sampled edge (from the disk, cold):
    read for GATv2 with ``edge_dim`` (its features are gathered by them), not for GraphSAGE."""
    _, out, kwargs = edge_featured
    assert (out / "perm.bin").exists()  # the input's edges are not in the CSC's order
    batches = {}
    for edge_dim in (None, 3):
        dm = NeighborDataModule("prepared", out, **kwargs)
        dm.configure_batches(BatchRequest(2, edge_dim=edge_dim))
        dm.setup("fit")
        batches[edge_dim] = next(iter(dm.train_dataloader()))
    assert "e_id" not in batches[None] and "edge_attr" not in batches[None]
    assert batches[3].e_id.numel() == batches[3].edge_attr.size(0) > 0


def test_edge_features_are_checked_as_node_features_are(tmp_path, homogeneous):
    folder, _ = homogeneous
    m = np.load(folder / "edge_index.npy").shape[1]
    for bad, message in [
        (np.ones((m - 1, 2), np.float32), r"edge_attr\.npy must hold one row of features per edge"),
        (np.ones((m, 2), np.int64), r"edge_attr\.npy must be a float array .* it is int64"),
    ]:
        np.save(folder / "edge_attr.npy", bad)
        with pytest.raises(PreparedGraphError, match=message):
            stores.prepare_npy(folder, tmp_path / "store")
    attr = np.ones((m, 2), np.float32)
    attr[17, 1] = np.nan
    np.save(folder / "edge_attr.npy", attr)
    with pytest.raises(PreparedGraphError, match=r"edge_attr\.npy: 1 row.s. hold a NaN .* row 17"):
        stores.prepare_npy(folder, tmp_path / "store")
    assert not (tmp_path / "store").exists()


def test_edge_ids_are_the_inputs_when_the_edges_fit_one_chunk(tmp_path, homogeneous):
    """A relation read in one chunk (under 4M edges at the default chunk size) was taken for
    one already in CSC order: sorted by destination within the chunk, its slots always ran
    0, 1, 2, ..., so no map was kept and a batch's ``e_id`` were CSC positions."""
    folder, _ = homogeneous
    edge_index = torch.from_numpy(np.load(folder / "edge_index.npy")).long()
    out = stores.prepare_npy(folder, tmp_path / "store")  # the default chunk: one
    assert "perm" in PreparedGraph(out).manifest.files
    fs, gs = stores.open(out)
    torch.manual_seed(0)
    sampler = HopSampler((fs, gs), [4, 2])
    loader = NeighborLoader(
        (fs, gs), [4, 2], input_nodes=torch.arange(100), neighbor_sampler=sampler
    )
    for batch in loader:
        assert torch.equal(edge_index[:, batch.e_id], batch.n_id[batch.edge_index])
    np.save(folder / "edge_index.npy", by_destination(edge_index).numpy())  # in CSC order
    assert "perm" not in PreparedGraph(stores.prepare_npy(folder, tmp_path / "s2")).manifest.files


def test_a_feature_cache_needs_the_fan_out_it_is_drawn_with(tmp_path, homogeneous):
    out = stores.prepare_npy(homogeneous[0], tmp_path / "store")
    with pytest.raises(ConfigError, match="num_neighbors you train with"):
        stores.open(out, feature_cache_gib=0.1)
    with pytest.raises(ConfigError, match="size >= 0"):
        stores.open(out, feature_cache_gib=-1, num_neighbors=[2])


def test_pygs_link_neighbor_loader_on_the_store_gives_the_batches_of_the_graph_in_memory(
    tmp_path, homogeneous
):
    folder, data = homogeneous
    fs, gs = stores.open(stores.prepare_npy(folder, tmp_path / "store"))
    labelled = data.edge_index[:, :200]

    def batches(source, edge_label_index):
        torch.manual_seed(2)
        loader = LinkNeighborLoader(
            source,
            num_neighbors=[5, 3],
            edge_label_index=edge_label_index,
            batch_size=32,
            shuffle=True,
            neg_sampling_ratio=1.0,
            is_sorted=source is data,
            neighbor_sampler=HopSampler(source, [5, 3], is_sorted=source is data),
        )
        return list(loader)

    memory, disk = batches(data, labelled), batches((fs, gs), (None, labelled))
    assert len(memory) == len(disk) == 7
    for a, b in zip(memory, disk, strict=True):
        for key in ("x", "edge_index", "n_id", "edge_label_index", "edge_label"):
            assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize(("read_threads", "cache_bytes"), READS, ids=READ_IDS)
def test_a_heterogeneous_store_gives_the_batches_of_the_graph_in_memory(
    tmp_path, heterogeneous, read_threads, cache_bytes, monkeypatch
):
    monkeypatch.setattr(reads, "MIN_ROWS", 8)
    folder, data, train = heterogeneous
    out = stores.prepare_npy(folder, tmp_path / "store", chunk_bytes=4096)
    cache = {"feature_cache_gib": cache_bytes / 2**30, "num_neighbors": [4, 2], "batch_size": 50}
    fs, gs = stores.open(out, read_threads=read_threads, **cache)
    kwargs = {"num_neighbors": [4, 2], "input_nodes": ("paper", train), "batch_size": 50}
    read_ahead = []  # gnnscale's sampler reads each batch's lists ahead, by edge type
    real = reads.read_ahead_typed
    monkeypatch.setattr(
        reads, "read_ahead_typed", lambda *a, **k: read_ahead.append(a[1]) or real(*a, **k)
    )
    memory = _batches(data, 3, **kwargs)
    disk = _batches((fs, gs), 3, neighbor_sampler=HopSampler((fs, gs), [4, 2]), **kwargs)
    assert len(memory) == len(disk) == 4
    assert [list(seeds) for seeds in read_ahead] == [["paper"]] * 4
    for a, b in zip(memory, disk, strict=True):
        for node_type in MAG_COUNTS:  # "inst" too: it is sampled, though it has no features
            assert torch.equal(a[node_type].n_id, b[node_type].n_id), node_type
        for node_type, key in [
            ("paper", "x"),
            ("paper", "y"),
            ("paper", "train_mask"),
            ("author", "x"),
        ]:
            assert torch.equal(a[node_type][key], b[node_type][key]), (node_type, key)
        assert b["author"].x.dtype == torch.float16
        for edge_type in MAG_RELATIONS:
            assert torch.equal(a[edge_type].edge_index, b[edge_type].edge_index), edge_type
            src, _, dst = edge_type  # edge ids: positions in the input's edge list
            given = np.load(folder / "edges" / "__".join(edge_type) / "edge_index.npy")
            local = b[edge_type].edge_index
            ends = torch.stack([b[src].n_id[local[0]], b[dst].n_id[local[1]]])
            assert torch.equal(torch.from_numpy(given)[:, b[edge_type].e_id], ends), edge_type
    _check_cache(fs, cache_bytes)
    if cache_bytes:  # one budget for both featured types, by how often the pass drew a row
        assert set(fs.cache) == {"paper", "author"}
        assert all(c.ids.numel() for c in fs.cache.values())
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["num_nodes"] == MAG_COUNTS
    assert manifest["num_classes"] == {"paper": int(data["paper"].y.max()) + 1}


def test_each_edge_types_colptr_is_range_checked(tmp_path, heterogeneous):
    out = stores.prepare_npy(heterogeneous[0], tmp_path / "store")
    (src, rel, dst), _ = next(iter(MAG_RELATIONS.items()))
    path = out / f"{src}__{rel}__{dst}" / "colptr.bin"
    colptr = np.memmap(path, dtype=np.int64, mode="r+")
    colptr[-1] += 1  # one edge more than its row holds
    colptr.flush()
    del colptr
    with pytest.raises(PreparedGraphError, match=rf"{path} is damaged \(it ends at"):
        stores.open(out, verify="size")


def test_features_already_in_the_stored_layout_are_used_where_they_lie(tmp_path, homogeneous):
    folder, data = homogeneous
    in_place = stores.prepare_npy(folder, tmp_path / "in_place")
    assert not (in_place / "x.bin").exists()
    entry = json.loads((in_place / "manifest.json").read_text())["files"]["x"]
    assert entry["path"] == str((folder / "x.npy").resolve())
    fs, _ = stores.open(in_place)
    assert torch.equal(fs.get_tensor(None, "x", torch.tensor([3, 1])), data.x[[3, 1]])
    ids = torch.tensor([0, 1, 250, 499])  # read in one pass from behind the .npy header
    assert torch.equal(PreparedGraph(in_place).read_rows("x", ids, chunk_bytes=100), data.x[ids])
    cast = stores.prepare_npy(folder, tmp_path / "cast", feature_dtype="bfloat16")
    fs, _ = stores.open(cast)
    assert (cast / "x.bin").stat().st_size == data.x.numel() * 2
    assert torch.equal(fs.get_tensor(None, "x", torch.tensor([3, 1])), data.x[[3, 1]].bfloat16())
    # A changed input is refused by the store that maps it, naming it.
    np.save(folder / "x.npy", data.x.numpy() + 1)
    with pytest.raises(PreparedGraphError, match=r"x\.npy changed since"):
        stores.open(in_place)


def test_the_streamed_csc_is_the_one_pyg_builds_with_a_stable_sort(tmp_path, homogeneous):
    """Chunk boundaries anywhere (a chunk of 256 edges) give PyG's CSC of the whole list."""
    folder, data = homogeneous
    graph = PreparedGraph(stores.prepare_npy(folder, tmp_path / "store", chunk_bytes=4096))
    edge_index = torch.from_numpy(np.load(folder / "edge_index.npy")).long()
    order = edge_index[1].sort(stable=True).indices
    colptr, row = graph.csc
    assert torch.equal(row, edge_index[0, order])
    assert torch.equal(colptr, index2ptr(edge_index[1, order], 500))
    assert torch.equal(graph.data.train_mask, data.train_mask)


def test_a_folder_written_from_memory_opens_as_a_store_too(tmp_path):
    data = make_synthetic_graph(TINY)
    fs, gs = stores.open(write_graph(data, tmp_path / "tiny", {"test": "tiny"}))
    assert torch.equal(fs.get_tensor(None, "x", torch.arange(4)), data.x[:4])
    assert {a.attr_name for a in fs.get_all_tensor_attrs()} == {
        "x",
        "y",
        "train_mask",
        "val_mask",
        "test_mask",
        "n_id",
    }
    (attr,) = gs.get_all_edge_attrs()
    assert attr.size == (data.num_nodes, data.num_nodes)
    with pytest.raises(ConfigError, match="read-only"):
        fs.put_tensor(data.x, None, "x", None)


def test_the_stores_tensors_are_read_only_and_a_callers_bad_index_is_named(tmp_path):
    """A write into a tensor the stores hand out, or into a view of it, is an error (the pages
    are mapped read-only: it was a segmentation fault); the file is unchanged. An index past
    the node count, or negative, is named as the caller's; a float one is refused, a boolean
    one is a mask, as in memory."""
    folder = write_graph(make_synthetic_graph(TINY), tmp_path / "g", {"test": "read-only"})
    fs, gs = stores.open(folder)
    x = fs.get_tensor(TensorAttr(None, "x", None))
    row, colptr, _ = gs.csc()
    before = x.clone()
    writes = [
        lambda: x.add_(1),
        lambda: x.__setitem__(0, 1.0),
        lambda: x[:2].zero_(),
        lambda: torch.add(x, 1, out=x),
        lambda: row.fill_(0),
        lambda: colptr.__iadd__(1),
    ]
    for write in writes:
        with pytest.raises(PreparedGraphError, match="is read-only; write into a copy"):
            write()
    assert torch.equal(x, before) and torch.equal(x.clone().add_(1), before + 1)
    assert (
        type(x + 1) is torch.Tensor and type(x.index_select(0, torch.tensor([1]))) is torch.Tensor
    )
    for bad in (3000, -1):
        with pytest.raises(IndexError, match=f"an index given to the store holds node {bad:,}"):
            fs.get_tensor(TensorAttr(None, "x", torch.tensor([0, bad])))
    with pytest.raises(IndexError, match="is torch.float32: give integer node ids"):
        fs.get_tensor(TensorAttr(None, "x", torch.tensor([0.7, 2.2])))  # read rows 0 and 2
    mask = torch.zeros(3000, dtype=torch.bool).index_fill_(0, torch.tensor([4, 9]), True)
    assert torch.equal(fs.get_tensor(TensorAttr(None, "x", mask)), before[[4, 9]])


def _spawned_batches(folder, context):
    fs, gs = stores.open(folder, verify="size")
    loader = NeighborLoader(
        (fs, gs),
        num_neighbors=[5, 3],
        input_nodes=torch.arange(200),
        batch_size=50,
        num_workers=1,
        multiprocessing_context=context,
        neighbor_sampler=HopSampler((fs, gs), [5, 3]),
    )
    torch.manual_seed(0)  # the workers' seeds (a generator of its own would not pickle)
    return list(loader)


def test_the_stores_pickle_as_their_files_so_a_spawned_worker_maps_them(tmp_path):
    """Pickled, the store pair is its files' names, not their contents (a worker or a DDP rank
    started with ``spawn`` maps the files again and shares the page cache's copy), and a
    spawned loader worker gives the batches a forked one does."""
    cfg = dataclasses.replace(TINY, num_nodes=20_000, num_features=64)
    folder = write_graph(make_synthetic_graph(cfg), tmp_path / "g", {"test": "pickle"})
    fs, gs = stores.open(folder)
    files = PreparedGraph(folder).nbytes  # 5 MiB of features, 2 of edges
    assert len(pickle.dumps((fs, gs))) < files / 200
    again, _ = pickle.loads(pickle.dumps((fs, gs)))
    x = again.get_tensor(TensorAttr(None, "x", None))
    assert isinstance(x, MappedTensor) and torch.equal(
        x, fs.get_tensor(TensorAttr(None, "x", None))
    )
    rows = pickle.loads(pickle.dumps(x[10:12]))  # a view travels as its own values
    assert type(rows) is torch.Tensor and torch.equal(rows, x[10:12])
    forked, spawned = _spawned_batches(folder, "fork"), _spawned_batches(folder, "spawn")
    assert len(forked) == len(spawned) == 4
    for a, b in zip(forked, spawned, strict=True):
        for key in ("x", "y", "edge_index", "n_id"):
            assert torch.equal(a[key], b[key]), key
