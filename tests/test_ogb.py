"""OGB's node-property downloads (their raw layouts, written here small) prepared by streaming."""

import errno
import gzip
import io
import json
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
import torch
from torch_geometric.data import Data, HeteroData
from torch_geometric.loader import NeighborLoader

from gnnscale import HeteroNeighborDataModule, HeteroSAGE, stores
from gnnscale.cli.prepare import prepare_main
from gnnscale.errors import ConfigError
from gnnscale.sampling import HopSampler
from gnnscale.stores.manifest import PreparedGraphError
from gnnscale.stores.ogb import prepare_ogb
from gnnscale.stores.prepared import PreparedGraph
from gnnscale.testing import quiet_trainer

SPLITS = {"train": "train", "val": "valid", "test": "test"}  # ours: OGB's file
SCHEME = {"ogbn-arxiv": "time", "ogbn-products": "sales_ranking", "ogbn-papers100M": "time"}
MAG_EDGES = {  # (src, rel, dst): edges, as in ogbn-mag
    ("author", "affiliated_with", "institution"): 300,
    ("author", "writes", "paper"): 1500,
    ("paper", "cites", "paper"): 2000,
    ("paper", "has_topic", "field_of_study"): 800,
}
MAG_NODES = {"author": 250, "field_of_study": 40, "institution": 20, "paper": 400}


def by_destination(edge_index):
    """The edges in the store's order: stably sorted by destination (PyG's CSC with pyg-lib)."""
    return edge_index[:, edge_index[1].sort(stable=True).indices]


def _csv(path, rows, fmt="%d"):
    """A headerless .csv.gz, as OGB's files are."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savetxt(path, np.asarray(rows).reshape(len(rows), -1), fmt=fmt, delimiter=",")


def _headed(path, row):
    """A .csv.gz of a header of node types and one row (num-node-dict, nodetype-has-*)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write(",".join(row) + "\n" + ",".join(str(v) for v in row.values()) + "\n")


def _graph(seed, n=300, m=2000, f=8, classes=5):
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    return {
        "x": rng.standard_normal((n, f), dtype=np.float32),
        "y": rng.integers(0, classes, n),
        "edges": rng.integers(0, n, (2, m)),
        "splits": {"train": perm[:150], "val": perm[150:220], "test": perm[220:]},
    }


def _masks(n, splits):
    return {
        f"{k}_mask": torch.zeros(n, dtype=torch.bool).index_fill_(0, torch.from_numpy(v), True)
        for k, v in splits.items()
    }


def _split_files(folder, splits):
    for ours, theirs in SPLITS.items():
        _csv(folder / f"{theirs}.csv.gz", splits[ours])


def csv_download(root, name, g):
    """``g`` as OGB's arxiv/products zip unpacks (renamed ogbn_<name>); the graph OGB loads."""
    folder = root / name.replace("-", "_")
    n, m = len(g["x"]), g["edges"].shape[1]
    _csv(folder / "raw" / "edge.csv.gz", g["edges"].T)
    _csv(folder / "raw" / "node-feat.csv.gz", g["x"], "%.9g")
    _csv(folder / "raw" / "node-label.csv.gz", g["y"][:, None])
    _csv(folder / "raw" / "num-node-list.csv.gz", [n])
    _csv(folder / "raw" / "num-edge-list.csv.gz", [m])
    _csv(folder / "raw" / "node_year.csv.gz", np.full(n, 2020))  # read by OGB, not by us
    _split_files(folder / "split" / SCHEME[name], g["splits"])
    (folder / "RELEASE_v1.txt").write_text("")
    edge_index = torch.from_numpy(g["edges"])
    if name == "ogbn-products":  # each edge followed by its reverse, as OGB's loader does
        edge_index = torch.stack([edge_index, edge_index.flip(0)], 2).view(2, -1)
    x, y = torch.from_numpy(g["x"]), torch.from_numpy(g["y"])
    return Data(x=x, y=y, edge_index=by_destination(edge_index), **_masks(n, g["splits"]))


def npz_download(root, g, compressed, features=np.float16, column_major=False):
    """``g`` as OGB's papers100M-bin zip unpacks; a third of the nodes unlabelled (NaN)."""
    raw = root / "ogbn_papers100M" / "raw"
    raw.mkdir(parents=True)
    n, m = len(g["x"]), g["edges"].shape[1]
    labels = g["y"].astype(np.float64)
    unlabelled = np.random.default_rng(7).random(n) < 0.3
    labels[unlabelled] = np.nan
    save = np.savez_compressed if compressed else np.savez
    x = g["x"].astype(features)
    save(
        raw / "data.npz",
        edge_index=np.asfortranarray(g["edges"]) if column_major else g["edges"],
        node_feat=x,
        node_year=np.full((n, 1), 2020),
        num_nodes_list=np.array([n]),
        num_edges_list=np.array([m]),
    )
    save(raw / "node-label.npz", node_label=labels[:, None])
    _split_files(raw.parent / "split" / "time", g["splits"])
    (raw.parent / "RELEASE_v1.txt").write_text("")
    y = torch.from_numpy(np.where(unlabelled, -1, g["y"]))
    edge_index = by_destination(torch.from_numpy(g["edges"]))
    return Data(x=torch.from_numpy(x), y=y, edge_index=edge_index, **_masks(n, g["splits"]))


def mag_download(root):
    """A small graph as OGB's mag zip unpacks (ogbn_mag); the same graph in memory."""
    rng = np.random.default_rng(3)
    folder, data = root / "ogbn_mag", HeteroData()
    raw, split = folder / "raw", folder / "split" / "time"
    _headed(raw / "num-node-dict.csv.gz", MAG_NODES)
    for t, n in MAG_NODES.items():
        data[t].num_nodes = n
    triplets = list(MAG_EDGES)
    rng.shuffle(triplets)  # listed in any order: OGB sorts them
    _csv(raw / "triplet-type-list.csv.gz", np.array(triplets), "%s")
    for (src, rel, dst), m in MAG_EDGES.items():
        edges = np.stack([rng.integers(0, MAG_NODES[src], m), rng.integers(0, MAG_NODES[dst], m)])
        relation = raw / "relations" / f"{src}___{rel}___{dst}"
        _csv(relation / "edge.csv.gz", edges.T)
        _csv(relation / "num-edge-list.csv.gz", [m])
        _csv(relation / "edge_reltype.csv.gz", np.zeros(m, int))
        data[src, rel, dst].edge_index = by_destination(torch.from_numpy(edges))
    x = rng.standard_normal((MAG_NODES["paper"], 6), dtype=np.float32)
    y = rng.integers(0, 7, MAG_NODES["paper"])
    _csv(raw / "node-feat" / "paper" / "node-feat.csv.gz", x, "%.9g")
    _csv(raw / "node-feat" / "paper" / "node_year.csv.gz", np.full(len(x), 2019))
    has = {t: t == "paper" for t in MAG_NODES}
    _headed(raw / "nodetype-has-label.csv.gz", has)
    _csv(raw / "node-label" / "paper" / "node-label.csv.gz", y[:, None])
    _headed(split / "nodetype-has-split.csv.gz", has)
    perm = rng.permutation(MAG_NODES["paper"])
    splits = {"train": perm[:200], "val": perm[200:300], "test": perm[300:]}
    _split_files(split / "paper", splits)
    (folder / "RELEASE_v2.txt").write_text("")
    data["paper"].x, data["paper"].y = torch.from_numpy(x), torch.from_numpy(y)
    for key, mask in _masks(MAG_NODES["paper"], splits).items():
        data["paper"][key] = mask
    return data


def _batches(data, seed, **kwargs):
    torch.manual_seed(seed)
    is_sorted = isinstance(data, (Data, HeteroData))  # in memory: edges already by destination
    sampler = HopSampler(data, kwargs["num_neighbors"], is_sorted=is_sorted)
    return list(NeighborLoader(data, shuffle=True, neighbor_sampler=sampler, **kwargs))


def _same_batches(out, data, edges):
    """The store's batches are memory's (whose edges are sorted by destination); their edge
    ids are positions in ``edges``, the edge list OGB's loader gives."""
    fs, gs = stores.open(out)
    kwargs = {"num_neighbors": [5, 3], "input_nodes": data.train_mask, "batch_size": 64}
    memory, disk = _batches(data, 1, **kwargs), _batches((fs, gs), 1, **kwargs)
    assert len(memory) == len(disk) == 3
    for a, b in zip(memory, disk, strict=True):
        for key in ("x", "y", "edge_index", "n_id", "train_mask", "val_mask", "test_mask"):
            assert torch.equal(a[key], b[key]), key
            assert a[key].dtype == b[key].dtype, key
        assert b.e_id.dtype == torch.long
        assert torch.equal(edges[:, b.e_id], b.n_id[b.edge_index])


def _prefix(key):
    return "" if key is None else f"{'__'.join(key) if isinstance(key, tuple) else key}/"


def stored_edges(out, key=None):
    """An edge type's prepared CSC as an edge list (sorted by destination, as the CSC holds it)."""
    graph = PreparedGraph(out)
    colptr, row = graph.tensor(f"{_prefix(key)}colptr"), graph.tensor(f"{_prefix(key)}row")
    return torch.stack([row, torch.arange(len(colptr) - 1).repeat_interleave(colptr.diff())])


def stored_nodes(out, key=None):
    """A node type's prepared files: features, labels, masks."""
    graph = PreparedGraph(out)
    names = [f"{_prefix(key)}{k}" for k in ("x", "y", "train_mask", "val_mask", "test_mask")]
    return {n.split("/")[-1]: graph.tensor(n) for n in names if n in graph.manifest.files}


def _same_graph(out, data):
    assert torch.equal(stored_edges(out), data.edge_index)
    tensors = stored_nodes(out)
    assert len(tensors) == 5
    for key, tensor in tensors.items():
        assert torch.equal(tensor, data[key]) and tensor.dtype == data[key].dtype, key


@pytest.mark.parametrize("name", ["ogbn-arxiv", "ogbn-products"])
def test_a_csv_download_prepares_to_the_graph_in_memory(tmp_path, name):
    """Small chunks (64 edges, 128 rows): boundaries fall inside pyarrow's blocks and across."""
    g = _graph(0)
    data = csv_download(tmp_path, name, g)
    edges = torch.from_numpy(g["edges"])
    if name == "ogbn-products":  # OGB's loader: each edge followed by its reverse
        edges = torch.stack([edges, edges.flip(0)], 2).view(2, -1)
    out = prepare_ogb(name, tmp_path, tmp_path / "store", chunk_bytes=4096)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["num_edges"] == data.num_edges == (4000 if name == "ogbn-products" else 2000)
    assert manifest["num_classes"] == 5 and manifest["files"]["x"]["dtype"] == "float32"
    _same_graph(out, data)
    _same_batches(out, data, edges)


@pytest.mark.parametrize(
    ("compressed", "column_major"),
    [(False, False), (True, False), (False, True), (True, True)],
    ids=["savez", "savez_compressed", "savez_column_major", "savez_compressed_column_major"],
)
def test_a_papers100m_npz_download_prepares_to_the_graph_in_memory(
    tmp_path, compressed, column_major
):
    """Stored members are mapped, deflated ones streamed (an edge_index in either order: two
    rows read side by side, or pairs); NaN labels become -1."""
    g = _graph(1)
    data = npz_download(tmp_path, g, compressed, column_major=column_major)
    out = prepare_ogb("ogbn-papers100M", tmp_path, tmp_path / "store", chunk_bytes=4096)
    assert json.loads((out / "manifest.json").read_text())["files"]["x"]["dtype"] == "float16"
    assert int((data.y == -1).sum()) > 50
    _same_graph(out, data)
    _same_batches(out, data, torch.from_numpy(g["edges"]))


def test_the_mag_download_prepares_to_the_heterogeneous_graph_in_memory(tmp_path):
    """With each relation between two types reversed (``rev_<rel>``), as ToUndirected adds."""
    data = mag_download(tmp_path)
    relations = tmp_path / "ogbn_mag" / "raw" / "relations"
    for src, rel, dst in MAG_EDGES:
        if src != dst:  # by destination, each's sources in input order (as the store's CSC)
            given = np.loadtxt(
                relations / f"{src}___{rel}___{dst}" / "edge.csv.gz", np.int64, delimiter=","
            )
            reverse = torch.from_numpy(given.T).flip(0)
            data[dst, f"rev_{rel}", src].edge_index = by_destination(reverse)
    out = prepare_ogb("ogbn-mag", tmp_path, tmp_path / "store", chunk_bytes=4096)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["num_nodes"] == MAG_NODES
    assert manifest["num_edges"] == {"__".join(k): data[k].num_edges for k in data.edge_types}
    assert len(data.edge_types) == len(MAG_EDGES) + 3  # cites stays one way
    assert manifest["num_features"] == {"paper": 6} and manifest["num_classes"] == {"paper": 7}
    fs, gs = stores.open(out)
    train = data["paper"].train_mask.nonzero().view(-1)
    kwargs = {"num_neighbors": [4, 2], "input_nodes": ("paper", train), "batch_size": 50}
    memory, disk = _batches(data, 3, **kwargs), _batches((fs, gs), 3, **kwargs)
    assert len(memory) == len(disk) == 4
    for a, b in zip(memory, disk, strict=True):
        for node_type in MAG_NODES:  # featureless types too: sampled by their count
            assert torch.equal(a[node_type].n_id, b[node_type].n_id), node_type
        for key in ("x", "y", "train_mask", "val_mask", "test_mask"):
            assert torch.equal(a["paper"][key], b["paper"][key]), key
        for edge_type in data.edge_types:
            assert torch.equal(a[edge_type].edge_index, b[edge_type].edge_index), edge_type


def test_the_mag_download_trains_its_papers_from_the_folder(tmp_path):
    """Every node type receives messages (authors through rev_writes): the hetero model trains
    (to_hetero failed on authors, never a destination, before reverses were written)."""
    mag_download(tmp_path)
    out = prepare_ogb("ogbn-mag", tmp_path, tmp_path / "store")
    dm = HeteroNeighborDataModule("prepared", out, batch_size=16, num_neighbors=[3, 3])
    model = HeteroSAGE(dm.num_classes, dm.graph_spec, hidden_channels=16)
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(model, dm)
    assert dm.target_type == "paper" and trainer.global_step > 0


def test_ogbs_own_loader_reads_these_layouts_as_the_store_holds_them(tmp_path, monkeypatch):
    """The layouts written here are those OGB's loader reads, and it reads the same graph."""
    pytest.importorskip("ogb")
    # ogb 1.3.6 reloads its own processed file with torch.load's default (weights only).
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    from ogb.nodeproppred import PygNodePropPredDataset

    downloads = {
        "ogbn-arxiv": csv_download(tmp_path, "ogbn-arxiv", _graph(0)),
        "ogbn-products": csv_download(tmp_path, "ogbn-products", _graph(0)),
        "ogbn-papers100M": npz_download(tmp_path, _graph(1), True, np.float32),
    }
    for name in downloads:
        out = prepare_ogb(name, tmp_path, tmp_path / name)
        ds = PygNodePropPredDataset(name, str(tmp_path))
        theirs, split = ds[0], ds.get_idx_split()
        ours = stored_nodes(out)
        assert torch.equal(ours["x"], theirs.x.to(ours["x"].dtype)), name
        y = theirs.y.view(-1)
        y = torch.where(y.isnan(), -1, y).long() if y.is_floating_point() else y
        assert torch.equal(ours["y"], y), name
        assert torch.equal(stored_edges(out), by_destination(theirs.edge_index)), name
        for key, theirs_key in SPLITS.items():
            index = ours[f"{key}_mask"].nonzero().view(-1)
            assert torch.equal(index, split[theirs_key].sort().values), (name, key)
    mag_download(tmp_path)
    out = prepare_ogb("ogbn-mag", tmp_path, tmp_path / "mag")
    ds = PygNodePropPredDataset("ogbn-mag", str(tmp_path))
    theirs, split = ds[0], ds.get_idx_split()
    assert theirs.num_nodes_dict == MAG_NODES
    assert json.loads((out / "manifest.json").read_text())["num_nodes"] == MAG_NODES
    paper = stored_nodes(out, "paper")
    assert torch.equal(paper["x"], theirs.x_dict["paper"])
    assert torch.equal(paper["y"], theirs.y_dict["paper"].view(-1))
    assert sorted(theirs.edge_index_dict) == sorted(MAG_EDGES)
    for edge_type, edge_index in theirs.edge_index_dict.items():
        assert torch.equal(stored_edges(out, edge_type), by_destination(edge_index)), edge_type
    for key, theirs_key in SPLITS.items():
        index = paper[f"{key}_mask"].nonzero().view(-1)
        assert torch.equal(index, split[theirs_key]["paper"].sort().values), key


def test_the_cli_streams_the_download_and_says_where_it_belongs(tmp_path):
    data = csv_download(tmp_path / "data", "ogbn-arxiv", _graph(2))
    args = ["--source=Ogb", "--source.name=ogbn-arxiv", f"--source.root={tmp_path / 'data'}"]
    out = prepare_main([*args, f"--out={tmp_path / 'store'}"])
    _same_graph(out, data)
    with pytest.raises(ConfigError, match="--source.chunk_nodes is not an option of .*Ogb"):
        prepare_main([*args, f"--out={tmp_path / 'other'}", "--source.chunk_nodes=10"])
    mag = ["--source=Ogb", "--source.name=ogbn-mag", f"--source.root={tmp_path}"]
    with pytest.raises(PreparedGraphError, match=r"ogbn_mag/raw is missing; download \S+mag\.zip"):
        prepare_main([*mag, f"--out={tmp_path / 'mag'}"])


def _truncate(path):
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (
            "truncated_csv",
            r"ogbn_arxiv/raw/node-feat\.csv\.gz cannot be read \(.+\); the download is",
        ),
        ("not_gzip", r"num-node-list\.csv\.gz cannot be read \(Not a gzipped file"),
        ("truncated_npz", r"raw/data\.npz is not a readable \.npz archive"),
        ("corrupt_npz", r"raw/data\.npz \(node_feat\) cannot be read \((Bad CRC|Error -3)"),
        (
            "node_count",
            r"node-feat\.csv\.gz has 300 rows where \S+num-node-list\.csv\.gz gives 301",
        ),
        ("edge_count", r"edge\.csv\.gz has 2,000 rows where \S+num-edge-list\.csv\.gz gives 1,999"),
        ("npz_rows", r"data\.npz \(node_feat\) has 300 rows where the node type has 301 nodes"),
        ("inf_label", r"node-label\.npz \(node_label\): row 4 holds inf, not a class id"),
        ("fraction_label", r"node-label\.npz \(node_label\): row 4 holds 2\.5, not a class id"),
        (  # it read on into the next member: "row 294 holds a NaN or infinite feature"
            "short_npz_member",
            r"data\.npz is not a readable \.npz archive \(its header promises 4,800 bytes of "
            r"node_feat, the member holds 4,600\)",
        ),
        ("missing_split", r"split/time/valid\.csv\.gz is missing; unpack OGB's zip"),
        ("mag_missing_split", r"split/time/paper/test\.csv\.gz is missing"),
    ],
)
def test_a_damaged_download_is_refused_naming_its_file_and_leaves_nothing(tmp_path, damage, match):
    if damage.startswith("mag"):
        name = "ogbn-mag"
        mag_download(tmp_path)
    elif "npz" in damage or damage.endswith("label"):
        name = "ogbn-papers100M"
        npz_download(tmp_path, _graph(1), compressed=True)
    else:
        name = "ogbn-arxiv"
        csv_download(tmp_path, name, _graph(0))
    folder = tmp_path / name.replace("-", "_")
    if damage == "truncated_csv":
        _truncate(folder / "raw" / "node-feat.csv.gz")
    elif damage == "not_gzip":  # gzip's BadGzipFile: an OSError without an errno
        (folder / "raw" / "num-node-list.csv.gz").write_text("300\n")
    elif damage == "truncated_npz":
        _truncate(folder / "raw" / "data.npz")
    elif damage == "corrupt_npz":  # a byte changed inside the deflated features
        with zipfile.ZipFile(folder / "raw" / "data.npz") as archive:
            info = archive.getinfo("node_feat.npy")
        raw = bytearray((folder / "raw" / "data.npz").read_bytes())
        raw[info.header_offset + 100 + info.compress_size // 2] ^= 0xFF
        (folder / "raw" / "data.npz").write_bytes(bytes(raw))
    elif damage == "node_count":
        _csv(folder / "raw" / "num-node-list.csv.gz", [301])
    elif damage == "edge_count":
        _csv(folder / "raw" / "num-edge-list.csv.gz", [1999])
    elif damage == "npz_rows":
        with np.load(folder / "raw" / "data.npz") as z:
            arrays = dict(z)
        np.savez_compressed(folder / "raw" / "data.npz", **(arrays | {"num_nodes_list": [301]}))
    elif damage.endswith("label"):
        with np.load(folder / "raw" / "node-label.npz") as z:
            labels = z["node_label"]
        labels[4] = np.inf if damage == "inf_label" else 2.5
        np.savez_compressed(folder / "raw" / "node-label.npz", node_label=labels)
    elif damage == "short_npz_member":  # stored (mappable), its last 200 bytes gone
        with np.load(folder / "raw" / "data.npz") as z:
            arrays = dict(z)
        with zipfile.ZipFile(folder / "raw" / "data.npz", "w", zipfile.ZIP_STORED) as archive:
            for key, value in arrays.items():
                member = io.BytesIO()
                np.save(member, value)
                cut = 200 if key == "node_feat" else 0
                archive.writestr(f"{key}.npy", member.getvalue()[: len(member.getvalue()) - cut])
    elif damage == "missing_split":
        (folder / "split" / "time" / "valid.csv.gz").unlink()
    else:
        (folder / "split" / "time" / "paper" / "test.csv.gz").unlink()
    with pytest.raises(PreparedGraphError, match=match):
        prepare_ogb(name, tmp_path, tmp_path / "store", chunk_bytes=4096)
    assert not (tmp_path / "store").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".store.partial")] == []


def _failing(error):
    def fail(*args, **kwargs):
        raise error

    return fail


@pytest.mark.parametrize(
    ("reader", "error"),
    [
        ("open_csv", "thread"),  # pyarrow's UnknownError, seen under a memory cap
        ("open_csv", "arrow_memory"),
        ("open_csv", "io"),
        ("gzip", "permission"),
    ],
)
def test_an_error_that_is_not_about_the_data_is_not_blamed_on_the_download(
    tmp_path, monkeypatch, reader, error
):
    """Only bytes that do not parse or decompress are a damaged download; the rest is raised
    as it is (it said "the download is damaged: unpack OGB's zip again" for any of these)."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.csv

    raised = {
        "thread": pa.ArrowException("Unknown error: Failed to launch worker thread: Resource"),
        "arrow_memory": pa.ArrowMemoryError("malloc of size 65536 failed"),
        "io": OSError(errno.EIO, "Input/output error"),
        "permission": PermissionError(errno.EACCES, "Permission denied"),
    }[error]
    csv_download(tmp_path, "ogbn-arxiv", _graph(0))
    if reader == "open_csv":
        monkeypatch.setattr(pyarrow.csv, "open_csv", _failing(raised))
    else:
        monkeypatch.setattr(gzip, "open", _failing(raised))
    with pytest.raises(type(raised)) as caught:
        prepare_ogb("ogbn-arxiv", tmp_path, tmp_path / "store", chunk_bytes=4096)
    assert caught.value is raised
    assert not (tmp_path / "store").exists()


# A fresh process whose private memory (RLIMIT_DATA) is capped a few MiB above its start, as in
# test_store_prepare.py. A first prepare of a tiny download starts the threads the code uses
# (pyarrow's CSV readers, tqdm's monitor, torch's pool) before the cap: each thread's stack
# counts as private memory, a fixed cost that the cap would otherwise measure instead of the
# chunks. pyarrow's pool of reader threads is held to one, started then: under load it started
# another under the cap ("Failed to launch worker thread").
_BOUNDED = """
import resource, sys
import pyarrow
from gnnscale.stores.ogb import prepare_ogb
pyarrow.set_io_thread_count(1)  # else a busy machine may start another reader thread under the cap
prepare_ogb("ogbn-papers100M", sys.argv[1] + "/tiny", sys.argv[2] + ".tiny")
def cap(mib):
    private = next(l for l in open("/proc/self/status") if l.startswith("VmData"))
    limit = int(private.split()[1]) * 1024 + mib * 2**20
    resource.setrlimit(resource.RLIMIT_DATA, (limit, resource.RLIM_INFINITY))
cap(2)  # the bound binds: too little fails for want of memory
try:
    prepare_ogb("ogbn-papers100M", sys.argv[1], sys.argv[2], chunk_bytes=1 << 20)
    sys.exit("prepared under 2 MiB: the cap does not bind")
except MemoryError:
    print("starved: MemoryError")
cap(int(sys.argv[3]))
prepare_ogb("ogbn-papers100M", sys.argv[1], sys.argv[2], chunk_bytes=1 << 20)
"""


def test_a_compressed_npz_larger_than_the_memory_bound_prepares_under_it(tmp_path):
    """A deflated data.npz of 52 MiB unpacked (44 MiB of features) under a 16 MiB bound.

    (12 MiB failed once, under load, after the starved attempt in the same process.)
    """
    rng = np.random.default_rng(0)
    n, m = 90_000, 500_000
    g = {
        "x": rng.standard_normal((n, 128), dtype=np.float32),
        "y": rng.integers(0, 10, n),
        "edges": rng.integers(0, n, (2, m)),
        "splits": {
            "train": np.arange(0, n, 3),
            "val": np.arange(1, n, 3),
            "test": np.arange(2, n, 3),
        },
    }
    npz_download(tmp_path, g, compressed=True, features=np.float32)
    npz_download(tmp_path / "tiny", _graph(1), compressed=True)
    with zipfile.ZipFile(tmp_path / "ogbn_papers100M" / "raw" / "data.npz") as archive:
        assert sum(i.file_size for i in archive.infolist()) > 3 * (16 << 20)  # unpacked
    tail = torch.from_numpy(g.pop("x")[-5:])
    run = [sys.executable, "-c", textwrap.dedent(_BOUNDED), str(tmp_path), str(tmp_path / "store")]
    bounded = subprocess.run([*run, "16"], capture_output=True, text=True, timeout=300)
    assert bounded.returncode == 0, bounded.stderr[-2000:]
    assert "starved: MemoryError" in bounded.stdout
    graph = PreparedGraph(tmp_path / "store", verify="size")
    assert graph.tensor("row").numel() == m and torch.equal(graph.tensor("x")[-5:], tail)
