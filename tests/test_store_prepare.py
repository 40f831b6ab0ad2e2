"""Preparing a folder: .npy and Parquet inputs, damaged or refused ones, the checks it records."""

import copy
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch

from gnnscale import (
    HeteroNeighborDataModule,
    NeighborDataModule,
    make_synthetic_graph,
    stores,
)
from gnnscale.data import datasets
from gnnscale.data.args import EvalArgs
from gnnscale.errors import ConfigError
from gnnscale.stores.manifest import PreparedGraphError, split_labels
from gnnscale.stores.prepared import PreparedGraph
from gnnscale.stores.writing import write_graph
from gnnscale.testing import MAG_COUNTS, TINY


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        ("truncated", r"x\.npy is not a readable \.npy array"),
        ("past_the_nodes", r"edge_index\.npy: destination 500 at position 17 is outside 0\.\.499"),
        ("labels_short", r"y\.npy has 499 rows where the node type has 500 nodes"),
        ("split_past_the_nodes", r"val\.npy: node index 500 at position 2"),
    ],
)
def test_a_damaged_input_is_refused_naming_its_file_and_leaves_nothing(
    tmp_path, homogeneous, damage, match
):
    folder, _ = homogeneous
    if damage == "truncated":
        raw = (folder / "x.npy").read_bytes()
        (folder / "x.npy").write_bytes(raw[: len(raw) // 2])
    elif damage == "past_the_nodes":
        edges = np.load(folder / "edge_index.npy")
        edges[1, 17] = 500
        np.save(folder / "edge_index.npy", edges)
    elif damage == "labels_short":
        np.save(folder / "y.npy", np.load(folder / "y.npy")[:-1])
    else:
        split = np.load(folder / "val.npy")
        split[2] = 500
        np.save(folder / "val.npy", split)
    with pytest.raises(PreparedGraphError, match=match):
        stores.prepare_npy(folder, tmp_path / "store")
    assert not (tmp_path / "store").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".store.partial")] == []


def test_a_heterogeneous_folder_missing_a_relation_or_a_count_is_refused(tmp_path, heterogeneous):
    folder, _, _ = heterogeneous
    (folder / "edges" / "paper__cites__paper" / "edge_index.npy").unlink()
    with pytest.raises(PreparedGraphError, match=r"paper__cites__paper/edge_index\.npy is missing"):
        stores.prepare_npy(folder, tmp_path / "store")
    (folder / "edges" / "paper__cites__paper").rmdir()
    (folder / "num_nodes.json").unlink()
    with pytest.raises(PreparedGraphError, match="names node type 'inst', which has no inputs"):
        stores.prepare_npy(folder, tmp_path / "store")

    (folder / "num_nodes.json").write_text(json.dumps({"inst": -5}))
    with pytest.raises(PreparedGraphError, match=r"num_nodes\.json: a node count is at least 0"):
        stores.prepare_npy(folder, tmp_path / "store")  # it blamed the edges: "outside 0..-6"
    (folder / "num_nodes.json").write_text(json.dumps({"inst": 0}))
    with pytest.raises(PreparedGraphError, match=r"node type 'inst' has no nodes \(.*num_nodes"):
        stores.prepare_npy(folder, tmp_path / "store")
    assert not (tmp_path / "store").exists()


def test_a_big_endian_folder_prepares_the_store_its_native_twin_does(tmp_path, homogeneous):
    """Every array in the other byte order (a traceback from torch before, for features)."""
    folder, _ = homogeneous
    twin = tmp_path / "big"
    twin.mkdir()
    for path in folder.glob("*.npy"):
        a = np.load(path)
        np.save(twin / path.name, a.astype(a.dtype.newbyteorder(">")))
    assert np.load(twin / "x.npy", mmap_mode="r").dtype.str == ">f4"
    native = PreparedGraph(stores.prepare_npy(folder, tmp_path / "native", chunk_bytes=4096))
    big = PreparedGraph(stores.prepare_npy(twin, tmp_path / "big_store", chunk_bytes=4096))
    assert native.manifest.files.keys() == big.manifest.files.keys()
    assert native.manifest.files["x"].path is not None  # used in place; the other copied, natively
    assert big.manifest.files["x"].path is None
    for name in native.manifest.files:
        assert torch.equal(native.tensor(name), big.tensor(name)), name


def test_features_used_in_place_are_checked_as_copied_ones_are(tmp_path, homogeneous):
    """A float32 x.npy is not copied, so it was never read: its NaN prepared without a word."""
    folder, _ = homogeneous
    x = np.load(folder / "x.npy")
    x[[11, 400], 3] = [np.nan, -np.inf]
    np.save(folder / "x.npy", x)
    with pytest.raises(
        PreparedGraphError, match=r"x\.npy: 2 row.s. hold a NaN or infinite feature, row 11 first"
    ):
        stores.prepare_npy(folder, tmp_path / "store", chunk_bytes=4096)
    assert not (tmp_path / "store").exists()


# Run in a fresh process whose private memory (RLIMIT_DATA: heap and anonymous mappings, not
# the shared file mappings the store writes through) is capped a few MiB above its start.
_BOUNDED = """
import resource, sys
import numpy as np
from gnnscale import stores
def private_kib():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmData")).split()[1])
cap = private_kib() * 1024 + int(sys.argv[3]) * 2**20
resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
stores.prepare_npy(sys.argv[1], sys.argv[2], feature_dtype="float16", chunk_bytes=2 << 20)
"""


def test_preparing_an_input_larger_than_the_memory_bound_stays_under_it(tmp_path):
    """90 MiB of input (features cast, so copied; 2M edges) under a 24 MiB bound."""
    n, f, e = 100_000, 160, 2_000_000
    folder = tmp_path / "npy"
    folder.mkdir()
    rng = np.random.default_rng(0)
    np.save(folder / "x.npy", rng.standard_normal((n, f), dtype=np.float32))
    np.save(folder / "edge_index.npy", rng.integers(0, n, (2, e), dtype=np.int64))
    np.save(folder / "y.npy", rng.integers(0, 10, n))
    size = sum(p.stat().st_size for p in folder.iterdir())
    assert size > 3 * (24 << 20)
    run = [sys.executable, "-c", textwrap.dedent(_BOUNDED), str(folder)]
    bounded = subprocess.run(
        [*run, str(tmp_path / "store"), "24"], capture_output=True, text=True, timeout=300
    )
    assert bounded.returncode == 0, bounded.stderr[-2000:]
    graph = PreparedGraph(tmp_path / "store", verify="size")
    assert graph.tensor("row").numel() == e and graph.tensor("x").dtype == torch.float16
    # The bound binds: the same prepare under 4 MiB fails for want of memory.
    starved = subprocess.run(
        [*run, str(tmp_path / "starved"), "4"], capture_output=True, text=True, timeout=300
    )
    assert starved.returncode != 0 and "MemoryError" in starved.stderr + starved.stdout, (
        starved.stderr[-2000:]
    )


def test_a_parquet_edge_list_prepares_the_store_its_npy_twin_does(tmp_path, homogeneous):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder, _ = homogeneous
    edges = np.load(folder / "edge_index.npy")
    twin = tmp_path / "parquet"
    twin.mkdir()
    for name in ("x.npy", "y.npy", "train.npy", "val.npy", "test.npy"):
        (twin / name).write_bytes((folder / name).read_bytes())
    table = pa.table({"dst": edges[1], "src": edges[0], "weight": np.ones(edges.shape[1])})
    pq.write_table(table, twin / "edges.parquet", row_group_size=700)  # batches across groups
    npy = PreparedGraph(stores.prepare_npy(folder, tmp_path / "npy_store", chunk_bytes=4096))
    parquet = PreparedGraph(stores.prepare_npy(twin, tmp_path / "pq_store", chunk_bytes=4096))
    for a, b in zip(npy.csc, parquet.csc, strict=True):
        assert torch.equal(a, b)
    pq.write_table(pa.table({"source": edges[0], "dst": edges[1]}), twin / "edges.parquet")
    with pytest.raises(
        PreparedGraphError, match=r"edges\.parquet needs integer columns src and dst"
    ):
        stores.prepare_npy(twin, tmp_path / "bad")
    src = pa.array([*edges[0, :-1].tolist(), None])
    pq.write_table(pa.table({"src": src, "dst": edges[1]}), twin / "edges.parquet")
    with pytest.raises(PreparedGraphError, match=r"column src must be integers without nulls"):
        stores.prepare_npy(twin, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_a_parquet_edge_lists_float_columns_are_its_edge_features(tmp_path, homogeneous):
    """Float columns beside ``src`` and ``dst`` (across parts and row groups) are stored as an
    ``edge_attr.npy`` twin's are; integer columns are not features; the features given twice, a
    part whose columns differ or a null feature is refused (Parquet columns were not read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder, _ = homogeneous
    edges = np.load(folder / "edge_index.npy")
    attr = np.random.default_rng(0).standard_normal((edges.shape[1], 2)).astype(np.float32)
    np.save(folder / "edge_attr.npy", attr)
    twin = tmp_path / "parquet"
    parts = twin / "edges.parquet"
    parts.mkdir(parents=True)
    for name in ("x.npy", "y.npy", "train.npy", "val.npy", "test.npy"):
        (twin / name).write_bytes((folder / name).read_bytes())
    bounds = [0, 1500, edges.shape[1]]
    for i in range(2):
        a, b = bounds[i], bounds[i + 1]
        columns = {"src": edges[0, a:b], "weight": attr[a:b, 0], "dst": edges[1, a:b]}
        columns |= {"day": np.arange(a, b), "score": attr[a:b, 1].astype(np.float64)}
        pq.write_table(pa.table(columns), parts / f"part-{i}.parquet", row_group_size=700)
    npy = PreparedGraph(stores.prepare_npy(folder, tmp_path / "npy_store", chunk_bytes=4096))
    parquet = PreparedGraph(stores.prepare_npy(twin, tmp_path / "pq_store", chunk_bytes=4096))
    assert parquet.manifest.num_edge_features == 2
    for name in ("colptr", "row", "perm", "edge_attr"):
        assert torch.equal(npy.tensor(name), parquet.tensor(name)), name
    (fs, _), (fs_npy, _) = stores.open(parquet.folder), stores.open(npy.folder)
    assert torch.equal(fs.edge_attr[None], fs_npy.edge_attr[None])
    (twin / "edge_attr.npy").write_bytes((folder / "edge_attr.npy").read_bytes())
    with pytest.raises(PreparedGraphError, match=r"gives edge features twice.*keep one"):
        stores.prepare_npy(twin, tmp_path / "bad")
    (twin / "edge_attr.npy").unlink()
    columns = {"src": edges[0, 1500:], "dst": edges[1, 1500:], "weight": attr[1500:, 0]}
    pq.write_table(pa.table(columns), parts / "part-1.parquet")
    with pytest.raises(PreparedGraphError, match=r"part-1.parquet has the float columns .edge "):
        stores.prepare_npy(twin, tmp_path / "bad")
    weight = pa.array([*attr[:1499, 0].tolist(), None])
    pq.write_table(
        pa.table({"src": edges[0, :1500], "dst": edges[1, :1500], "weight": weight}),
        parts / "part-0.parquet",
    )
    with pytest.raises(PreparedGraphError, match=r"edge feature column weight has nulls"):
        stores.prepare_npy(twin, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_a_spark_folder_of_parquet_parts_prepares_the_store_its_npy_twin_does(
    tmp_path, homogeneous
):
    """Read in the parts' name order, skipping ``_SUCCESS`` and ``.crc`` files (it was not read,
    and the message did not say that a folder can be one)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder, _ = homogeneous
    edges = np.load(folder / "edge_index.npy")
    twin = tmp_path / "spark"
    parts = twin / "edges.parquet"
    parts.mkdir(parents=True)
    for name in ("x.npy", "y.npy", "train.npy", "val.npy", "test.npy"):
        (twin / name).write_bytes((folder / name).read_bytes())
    bounds = [0, 1000, 1001, 2500, edges.shape[1]]
    for i in reversed(range(4)):  # written last to first: the names give the order
        table = pa.table(
            {"src": edges[0, bounds[i] : bounds[i + 1]], "dst": edges[1, bounds[i] : bounds[i + 1]]}
        )
        pq.write_table(table, parts / f"part-{i:05d}-4f2e.snappy.parquet", row_group_size=300)
    (parts / "_SUCCESS").write_text("")
    (parts / ".part-00000-4f2e.snappy.parquet.crc").write_bytes(b"\x00crc")
    npy = PreparedGraph(stores.prepare_npy(folder, tmp_path / "npy_store", chunk_bytes=4096))
    spark = PreparedGraph(stores.prepare_npy(twin, tmp_path / "spark_store", chunk_bytes=4096))
    assert spark.manifest.num_edges == edges.shape[1]
    for name in ("colptr", "row", "perm"):  # perm: edge ids are positions in the parts, in order
        assert torch.equal(npy.tensor(name), spark.tensor(name)), name
    for part in parts.glob("part-*"):
        part.unlink()
    with pytest.raises(
        PreparedGraphError, match=r"edges\.parquet is a folder without Parquet part"
    ):
        stores.prepare_npy(twin, tmp_path / "bad")


def test_a_prepared_folder_is_checked_for_splits_and_labels_as_a_graph_in_memory(tmp_path):
    """Split files are optional to prepare, but node classification needs them (a KeyError
    traceback at fit before); an empty split or a label out of range among split nodes is
    refused as in memory."""
    n, rng = 300, np.random.default_rng(0)
    arrays = tmp_path / "npy"
    arrays.mkdir()
    np.save(arrays / "x.npy", rng.random((n, 4), dtype=np.float32))
    np.save(arrays / "y.npy", rng.integers(0, 3, n))
    np.save(arrays / "edge_index.npy", rng.integers(0, n, (2, 2000)))

    def module(name, **splits):
        for split, ids in splits.items():
            np.save(arrays / f"{split}.npy", np.asarray(ids, dtype=np.int64))
        out = stores.prepare_npy(arrays, tmp_path / name)
        return NeighborDataModule("prepared", out, eval=EvalArgs(mode="sampled"))

    with pytest.raises(ConfigError, match="has no train_mask, val_mask, test_mask: node class"):
        module("none").prepare_data()
    with pytest.raises(ConfigError, match="the validation split of --data.dataset 'prepared'"):
        module("empty", train=range(100), val=[], test=range(200, 300)).prepare_data()
    y = np.load(arrays / "y.npy")
    y[5] = -1  # a training node without a label
    np.save(arrays / "y.npy", y)
    with pytest.raises(ConfigError, match="labels out of range .* found -1 among split nodes"):
        module("unlabelled", train=range(100), val=range(100, 200)).prepare_data()
    np.save(arrays / "y.npy", np.full(n, 2))  # every node in one class
    with pytest.raises(ConfigError, match=r"has one class \(2\) among its split nodes"):
        module("one_class").prepare_data()  # it trained a one-output classifier
    y[5] = 0
    np.save(arrays / "y.npy", y)
    dm = module("good")
    dm.prepare_data()
    assert dm.num_classes == 3 and int(dm.data.train_mask.sum()) == 100
    # A boolean mask is a mask (it was read as node ids 0 and 1: two training nodes)
    mask = module("masks", train=range(100)).data.train_mask.numpy()
    (arrays / "train.npy").unlink()
    np.save(arrays / "train.npy", mask)
    masked = module("as_mask")
    assert torch.equal(masked.data.train_mask, torch.from_numpy(mask))
    np.save(arrays / "train.npy", mask[:-1])
    with pytest.raises(PreparedGraphError, match="is a boolean mask of 299 entries where the node"):
        module("short_mask")
    np.save(arrays / "train.npy", np.arange(100) + 0.5)  # truncated to ids before
    with pytest.raises(PreparedGraphError, match=r"train\.npy must hold a split's node ids"):
        module("float_ids")


def test_a_prepared_folder_records_its_checks_and_a_fit_does_not_redo_them(tmp_path, homogeneous):
    """The overlap of splits is checked once, at prepare; a folder without the record (an older
    gnnscale's) is checked at fit, and says that its features never were."""
    out = stores.prepare_npy(homogeneous[0], tmp_path / "store")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["checked"] == ["node ids in range", "features finite", "splits disjoint"]
    # The val split made the train split's, behind the record (sizes kept: verify="size")
    (out / "val_mask.bin").write_bytes((out / "train_mask.bin").read_bytes())

    def module():
        return NeighborDataModule("prepared", out, verify="size", eval=EvalArgs(mode="sampled"))

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the record is trusted: no word
        assert int(module().data.val_mask.sum()) == 300
    (out / "manifest.json").write_text(
        json.dumps({k: v for k, v in manifest.items() if k != "checked"})
    )
    with (
        pytest.warns(UserWarning, match="prepared without checking its features for NaN"),
        pytest.raises(ConfigError, match="300 node.s. are in both train_mask and val_mask"),
    ):
        module().prepare_data()
    data = make_synthetic_graph(TINY)  # an in-memory graph's writer records what it passed
    assert PreparedGraph(write_graph(data, tmp_path / "g", {"t": 1})).manifest.checked == (
        "node ids in range",
        "features finite",
        "splits disjoint",
    )
    data.x[3, 0], data.test_mask[data.val_mask.nonzero()[0]] = float("nan"), True
    written = PreparedGraph(write_graph(data, tmp_path / "bad", {"t": 1}))
    assert written.manifest.checked == ("node ids in range",)


def test_a_fit_checks_a_prepared_folders_labels_from_their_counts(
    tmp_path, homogeneous, monkeypatch
):
    """A prepare counts the split labels (lowest, highest, distinct) into the manifest, and a
    fit checks those, reading no label (on the papers100M-sized graph, mapped for random reads,
    reading them took 12.4 s of a cold fit's start). A folder without the counts (an older
    gnnscale's) has its labels read, as before."""
    from test_hetero import TINY as RECOMMENDER

    folder, data = homogeneous
    out = stores.prepare_npy(folder, tmp_path / "store")
    manifest = json.loads((out / "manifest.json").read_text())
    classes = data.y[data.train_mask | data.val_mask | data.test_mask].unique()
    assert manifest["split_labels"] == {"": [0, int(classes[-1]), classes.numel()]}
    read = []
    monkeypatch.setattr(datasets, "split_labels", lambda *a: read.append(a) or split_labels(*a))

    def module():
        return NeighborDataModule("prepared", out, verify="size", eval=EvalArgs(mode="sampled"))

    checked = module()
    checked.prepare_data()
    assert checked.num_classes == 5 and not read
    counted = manifest | {"split_labels": {"": [-1, 4, 6]}}  # what a -1 label would record
    (out / "manifest.json").write_text(json.dumps(counted))
    with pytest.raises(ConfigError, match="labels out of range .* found -1 among split nodes"):
        module().prepare_data()
    assert not read
    del manifest["split_labels"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    module().prepare_data()
    assert len(read) == 1  # no record: read
    hetero = stores.save_npy(HeteroNeighborDataModule(synthetic=RECOMMENDER).data, tmp_path / "h")
    hetero_out = stores.prepare_npy(hetero, tmp_path / "hetero_store")
    read.clear()
    HeteroNeighborDataModule("prepared", hetero_out).prepare_data()
    assert "item" in PreparedGraph(hetero_out).manifest.split_labels and not read


def test_prepare_refuses_nan_features_and_overlapping_splits_naming_the_file(tmp_path):
    """As they stream: the first bad row (a NaN fit stopped only if a batch drew it), or the
    two splits that share nodes (it passed without a word); nothing is left behind."""
    n, rng = 300, np.random.default_rng(0)
    arrays = tmp_path / "npy"
    arrays.mkdir()
    x = rng.random((n, 4))  # float64: cast to float32, so copied (and checked) chunk by chunk
    x[7, 2] = np.nan
    np.save(arrays / "x.npy", x)
    np.save(arrays / "y.npy", rng.integers(0, 3, n))
    np.save(arrays / "edge_index.npy", rng.integers(0, n, (2, 2000)))
    with pytest.raises(
        PreparedGraphError, match=r"x\.npy: 1 row.s. hold a NaN or infinite feature, row 7 first"
    ):
        stores.prepare_npy(arrays, tmp_path / "nan", chunk_bytes=256)
    x[7, 2] = np.inf
    np.save(arrays / "x.npy", x)
    x[250] = -np.inf
    np.save(arrays / "x.npy", x)
    with pytest.raises(
        PreparedGraphError, match=r"x\.npy: 2 row.s. hold a NaN or infinite feature, row 7 first"
    ):
        stores.prepare_npy(arrays, tmp_path / "inf")
    x[250] = 0.5
    x[7, 2] = 0.5
    np.save(arrays / "x.npy", x)
    np.save(arrays / "train.npy", np.arange(100))
    np.save(arrays / "val.npy", np.arange(90, 200))
    np.save(arrays / "test.npy", np.arange(200, 300))
    with pytest.raises(PreparedGraphError, match="the train and val splits share 10 node.*90"):
        stores.prepare_npy(arrays, tmp_path / "overlap")
    left = [p.name for p in tmp_path.iterdir()]
    assert left == ["npy"]  # nothing left behind
    np.save(arrays / "val.npy", np.arange(100, 200))
    stores.prepare_npy(arrays, tmp_path / "good")


def test_a_manifest_naming_a_file_outside_its_folder_is_refused(tmp_path, homogeneous):
    out = stores.prepare_npy(homogeneous[0], tmp_path / "store")
    manifest = json.loads((out / "manifest.json").read_text())
    (x,) = [name for name, entry in manifest["files"].items() if "path" in entry]  # in place
    PreparedGraph(out)  # the recorded input, used in place: opened

    def edited(change):
        changed = copy.deepcopy(manifest)
        change(changed["files"])
        (out / "manifest.json").write_text(json.dumps(changed))
        with pytest.raises(PreparedGraphError, match="outside the folder and not an input"):
            PreparedGraph(out)

    # Another file of the same bytes and time, not the input: would be read as the features.
    other = tmp_path / "elsewhere.npy"
    shutil.copy2(manifest["files"][x]["path"], other)
    edited(lambda files: files[x].update(path=str(other)))
    # A file of the folder named up and out of it.
    shutil.copy2(out / "y.bin", tmp_path / "y.bin")
    edited(lambda files: files.update({"../y": files.pop("y")}))


def test_a_byte_changed_in_an_input_used_in_place_is_found_by_full_verification(
    tmp_path, homogeneous
):
    out = stores.prepare_npy(homogeneous[0], tmp_path / "store")
    x = homogeneous[0] / "x.npy"
    entry = PreparedGraph(out).manifest.files["x"]
    assert entry.path == str(x.resolve()) and len(entry.crc32) == 1  # used in place
    stat = x.stat()
    with x.open("r+b") as f:  # one feature's byte, the file's size and time kept
        f.seek(stat.st_size - 3)
        byte = f.read(1)
        f.seek(stat.st_size - 3)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(x, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    PreparedGraph(out, verify="size")  # size and time alone: as they were
    with pytest.raises(PreparedGraphError, match=rf"{x.resolve()} is corrupted: bytes"):
        PreparedGraph(out, verify="full")


def test_features_of_width_zero_are_refused_before_anything_is_written(tmp_path, homogeneous):
    folder = homogeneous[0]
    np.save(folder / "x.npy", np.zeros((500, 0), dtype=np.float32))
    with pytest.raises(PreparedGraphError, match=r"x.npy must hold a row of at least one feature"):
        stores.prepare_npy(folder, tmp_path / "store")
    assert not (tmp_path / "store").exists()


def test_an_empty_or_unreachable_node_type_is_refused_naming_the_file(tmp_path, heterogeneous):
    folder = heterogeneous[0]
    counts = folder / "num_nodes.json"
    counts.write_text(json.dumps({"inst": MAG_COUNTS["inst"], "ghost": 0}))
    with pytest.raises(PreparedGraphError, match=rf"node type 'ghost' has no nodes \({counts}\)"):
        stores.prepare_npy(folder, tmp_path / "store")
    counts.write_text(json.dumps({"inst": MAG_COUNTS["inst"], "ghost": 5}))
    unreachable = rf"node type 'ghost' \({counts}\) is the destination of no edge type in"
    with pytest.raises(PreparedGraphError, match=unreachable):
        stores.prepare_npy(folder, tmp_path / "store")
    assert not (tmp_path / "store").exists()
