"""The manifests as typed dataclasses: read, written back key for key, a damaged key one line."""

import dataclasses
import hashlib
import json
import re

import pytest

from gnnscale.data.many_graphs import AtomGraphDataset, AtomGraphs
from gnnscale.data.sources import folder_digest
from gnnscale.data.synthetic import (
    SyntheticRecommender,
    make_item_class_graph,
    make_synthetic_graph,
)
from gnnscale.stores import link_split, prepare_npy, save_npy, write_graph
from gnnscale.stores.graph_db import GraphStore, write_graphs
from gnnscale.stores.graph_db_manifest import GraphStoreError, StoreManifest
from gnnscale.stores.manifest import CHECKS, Manifest, PreparedGraphError
from gnnscale.stores.prepared import PreparedGraph
from gnnscale.testing import TINY

RECOMMENDER = SyntheticRecommender(
    num_users=300, num_items=200, num_categories=20, num_communities=5
)


@pytest.fixture
def folders(tmp_path):
    """A homogeneous folder, a heterogeneous one (streamed from .npy), and a link split of it."""
    homogeneous = write_graph(make_synthetic_graph(TINY), tmp_path / "homogeneous", {"t": 1})
    arrays = save_npy(make_item_class_graph(RECOMMENDER), tmp_path / "npy")
    hetero = prepare_npy(arrays, tmp_path / "hetero")
    rates, back = ("user", "rates", "item"), ("item", "rev_rates", "user")
    split = link_split.write_split(
        PreparedGraph(hetero), rates, back, (0.1, 0.1, 0.3), tmp_path / "split", chunk_edges=500
    )
    return {"homogeneous": homogeneous, "hetero": hetero, "split": split}


def test_a_manifest_round_trips_through_json_key_for_key(folders):
    for name, folder in folders.items():
        raw = json.loads((folder / "manifest.json").read_text())
        manifest = Manifest.read(folder)
        assert manifest.to_json() == raw and list(manifest.to_json()) == list(raw), name
        assert Manifest.from_json(json.loads(json.dumps(manifest.to_json()))) == manifest, name
        files = json.dumps(raw["files"], sort_keys=True).encode()  # what checkpoints recorded
        assert manifest.digest() == hashlib.blake2b(files, digest_size=8).hexdigest(), name
        assert folder_digest("prepared", folder) == manifest.digest()

    homogeneous = Manifest.read(folders["homogeneous"])
    assert not homogeneous.is_hetero and homogeneous.checked == CHECKS
    assert homogeneous.node_count() == TINY.num_nodes == homogeneous.node_counts[""]
    assert homogeneous.class_count() == TINY.num_classes and homogeneous.edge_feature_dim() == 0
    assert homogeneous.num_edge_features is None  # absent on disk, as written
    hetero = Manifest.read(folders["hetero"])
    assert hetero.is_hetero and hetero.node_count("user") == RECOMMENDER.num_users
    assert hetero.edge_count("user__rates__item") == hetero.edge_counts["user__rates__item"] > 0
    assert hetero.class_count("item") == hetero.num_classes["item"]
    assert hetero.feature_dim("user") == 0 and hetero.feature_dim("item") > 0
    # Every key a heterogeneous prepare writes is read: none left as "not recorded" but those
    # of a graph with edge times and of a folder that took appends (test_append.py).
    unread = [f.name for f in dataclasses.fields(hetero) if getattr(hetero, f.name) is None]
    assert unread == ["newest_time", "appends"] and hetero.extra == {}
    split = Manifest.read(folders["split"])
    assert split.is_hetero and split.edge_counts == {} and split.num_classes is None

    # A key a later gnnscale adds is kept, not dropped.
    raw = json.loads((folders["hetero"] / "manifest.json").read_text())
    raw["files"]["item/x"]["later"] = 1
    later = Manifest.from_json(raw | {"later": [1, 2]})
    assert later.extra == {"later": [1, 2]} and later.to_json() == raw | {"later": [1, 2]}


DAMAGES = {  # what is done to the manifest, what the error says of it
    "no num_nodes": (lambda m: m.pop("num_nodes"), "'num_nodes' is missing"),
    "no files": (lambda m: m.pop("files"), "'files' is missing"),
    "no block_bytes": (lambda m: m.pop("block_bytes"), "'block_bytes' is missing"),
    "a word for a count": (
        lambda m: m.update(num_edges="many"),
        "'num_edges' is not a count, or counts by type",
    ),
    "a shape as text": (
        lambda m: m["files"]["x"].update(shape="500"),
        "'shape' of file 'x' is not a list of numbers",
    ),
    "an unknown dtype": (
        lambda m: m["files"]["x"].update(dtype="float8"),
        "'dtype' of file 'x' is not a dtype gnnscale stores",
    ),
    "a copied file without checksums": (
        lambda m: m["files"]["x"].pop("crc32"),
        "'crc32' of file 'x' is missing",
    ),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_missing_or_damaged_key_is_one_line_naming_the_file(folders, damage):
    change, said = DAMAGES[damage]
    path = folders["homogeneous"] / "manifest.json"
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))
    with pytest.raises(PreparedGraphError) as refused:
        PreparedGraph(folders["homogeneous"])
    expected = (
        rf"{re.escape(str(path))} cannot be read \({re.escape(said)}.*\); prepare the graph again"
    )
    assert re.fullmatch(expected, str(refused.value)), str(refused.value)


def test_a_graph_stores_manifest_round_trips_and_a_missing_key_is_one_line(tmp_path):
    out = write_graphs(AtomGraphDataset(AtomGraphs(num_graphs=8)), tmp_path / "s", {"n": 8})
    path = out / "manifest.json"
    raw = json.loads(path.read_text())
    manifest = StoreManifest.read(out)
    assert manifest.to_json() == raw and list(manifest.to_json()) == list(raw)
    assert manifest.num_graphs == len(GraphStore(out)) == 8 and manifest.file_bytes > 0
    path.write_text(json.dumps({k: v for k, v in raw.items() if k != "num_classes"}))
    with pytest.raises(GraphStoreError, match=r"cannot be read \('num_classes' is missing\)"):
        GraphStore(out)
