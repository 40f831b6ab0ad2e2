"""Appends: a prepared folder grown by new nodes and edges is the folder of the whole stream.

A stream is cut in three; the first part is prepared, the others appended. Every check draws
the same batches, under the same seeds, from the grown folder and from a folder prepared from
the whole stream at once, and compares them: nodes, edges, edge ids, features. A grown folder
that lost, reordered or misnumbered one edge draws another batch somewhere here.
"""

import json
import os

import numpy as np
import pytest
import torch
from torch_geometric.data import Data, HeteroData
from torch_geometric.loader import NeighborLoader
from torch_geometric.sampler import NodeSamplerInput

from gnnscale import stores
from gnnscale.cli.prepare import append_main
from gnnscale.sampling import HopSampler
from gnnscale.stores import PreparedGraphError, save_npy
from gnnscale.stores import atomic as atomic_module
from gnnscale.stores.append import append_npy
from gnnscale.stores.manifest import Manifest
from gnnscale.stores.npy import read_data
from gnnscale.stores.prepared import PreparedGraph
from gnnscale.stores.streaming import write

CUTS = (0.6, 0.85)  # the stream's parts: prepared, first append, second append


def _stream(seed, num_edges=900, timed=True):
    """Edges in time order between nodes that arrive over time: 20 at first, 70 in the end."""
    g = torch.Generator().manual_seed(seed)
    time = torch.sort(torch.randint(0, 300, (num_edges,), generator=g)).values
    last = int(CUTS[1] * num_edges)  # the last part out of time order: an append sorts it
    time[last:] = time[last:][torch.randperm(num_edges - last, generator=g)]
    arrived = 20 + (torch.arange(num_edges) * 50) // num_edges  # nodes present at edge i
    arrived[last:] = 70
    ends = (torch.rand(2, num_edges, generator=g) * arrived).long()
    ends[1, torch.rand(num_edges, generator=g) < 0.3] = 0  # a hub across every part
    data = Data(edge_index=ends, num_nodes=70)
    data.x = torch.randn(70, 3, generator=g)
    data.edge_attr = torch.randn(num_edges, 2, generator=g)
    if timed:
        data.edge_time = time
    return data, arrived


def _part(data, arrived, a, b, first_node):
    """Edges ``a:b`` of the stream and the nodes that arrived with them (ids from first_node)."""
    upto = int(arrived[b - 1]) if b < arrived.numel() else data.num_nodes
    part = Data(edge_index=data.edge_index[:, a:b], num_nodes=upto - first_node)
    part.x = data.x[first_node:upto]
    part.edge_attr = data.edge_attr[a:b]
    if "edge_time" in data:
        part.edge_time = data.edge_time[a:b]
    return part, upto


def _prepared(data, path):
    return write(path, {"test": str(path)}, *read_data(data), chunk_bytes=1 << 10)


def _grown(data, arrived, tmp_path):
    """The stream's first part prepared, the two others appended; the folder."""
    cuts = [0, *(int(c * data.edge_index.size(1)) for c in CUTS), data.edge_index.size(1)]
    base, nodes = _part(data, arrived, cuts[0], cuts[1], 0)
    folder = _prepared(base, tmp_path / "grown")
    for i, (a, b) in enumerate(zip(cuts[1:-1], cuts[2:], strict=True)):
        part, upto = _part(data, arrived, a, b, nodes)
        save_npy(part, tmp_path / f"part{i}")
        if part.num_nodes == 0:
            (tmp_path / f"part{i}" / "x.npy").unlink()
        append_npy(folder, tmp_path / f"part{i}")
        nodes = upto
    return folder


def _draw(sampler, seeds, seed_time, seed, input_type=None):
    torch.manual_seed(seed)
    out = sampler.sample_from_nodes(
        NodeSamplerInput(None, seeds, time=seed_time, input_type=input_type)
    )
    perm = sampler.edge_permutation
    if isinstance(out.edge, dict):
        ids = {t: e if not perm or perm.get(t) is None else perm[t][e] for t, e in out.edge.items()}
    else:
        ids = out.edge if perm is None else perm[out.edge]
    return out, ids


@pytest.mark.parametrize("strategy", ["uniform", "last"])
def test_a_grown_timed_folder_draws_the_batches_of_the_whole_stream(tmp_path, strategy):
    for seed in range(3):
        data, arrived = _stream(seed)
        whole = stores.open(_prepared(data, tmp_path / f"whole{seed}"))
        grown = stores.open(_grown(data, arrived, tmp_path / str(seed)))
        assert grown[1].appended[None] and len(grown[1].appended[None]) == 2
        args = dict(time_attr="edge_time", temporal_strategy=strategy, strict=True)
        a, b = HopSampler(whole, [5, 3], **args), HopSampler(grown, [5, 3], **args)
        seeds, seed_time = torch.arange(70), torch.randint(100, 320, (70,))
        (x, x_ids), (y, y_ids) = _draw(a, seeds, seed_time, seed), _draw(b, seeds, seed_time, seed)
        for key in ("node", "row", "col", "batch"):
            assert torch.equal(getattr(x, key), getattr(y, key)), key
        assert torch.equal(x_ids, y_ids)
        assert bool((data.edge_time[y_ids] < seed_time[y.batch[y.col]]).all())
        assert (y_ids >= int(CUTS[1] * 900)).any()  # the last append's edges are drawn


def test_a_grown_folder_loads_the_batches_of_the_whole_graph_with_features(tmp_path):
    data, arrived = _stream(4, timed=False)
    whole = stores.open(_prepared(data, tmp_path / "whole"))
    grown = stores.open(_grown(data, arrived, tmp_path))
    batches = []
    for fs, gs in (whole, grown):
        sampler = HopSampler((fs, gs), [4, 4])
        loader = NeighborLoader(
            (fs, gs),
            [4, 4],
            input_nodes=torch.arange(70),
            batch_size=16,
            neighbor_sampler=sampler,
            transform=fs.add_edge_attr,
        )
        torch.manual_seed(0)
        batches.append(list(loader))
    for x, y in zip(*batches, strict=True):
        for key in ("n_id", "x", "edge_index", "e_id", "edge_attr"):
            assert torch.equal(x[key], y[key]), key
    assert torch.equal(grown[0].tensors[None, "x"], data.x)


def test_a_grown_typed_folder_draws_the_batches_of_the_whole_graph(tmp_path):
    g = torch.Generator().manual_seed(0)
    data, parts = HeteroData(), []
    data["user"].num_nodes, data["item"].num_nodes = 30, 40
    for edge_type, n_src, n_dst in (
        (("user", "clicks", "item"), 30, 40),
        (("item", "seen_by", "user"), 40, 30),
    ):
        data[edge_type].edge_index = torch.stack(
            [
                torch.randint(0, n_src, (300,), generator=g),
                torch.randint(0, n_dst, (300,), generator=g),
            ]
        )
        data[edge_type].edge_time = torch.sort(torch.randint(0, 90, (300,), generator=g)).values
    for a, b in ((0, 200), (200, 300)):
        part = HeteroData()
        part["user"].num_nodes, part["item"].num_nodes = 30, 40
        for t in data.edge_types:
            part[t].edge_index = data[t].edge_index[:, a:b]
            part[t].edge_time = data[t].edge_time[a:b]
        parts.append(part)
    whole = stores.open(_prepared(data, tmp_path / "whole"))
    folder = _prepared(parts[0], tmp_path / "grown")
    save_npy(parts[1], tmp_path / "part")
    (tmp_path / "part" / "num_nodes.json").write_text(json.dumps({"user": 0, "item": 0}))
    append_npy(folder, tmp_path / "part")
    grown = stores.open(folder)
    fanout = {t: [5, 3] for t in data.edge_types}
    a = HopSampler(whole, fanout, time_attr="edge_time", strict=True)
    b = HopSampler(grown, fanout, time_attr="edge_time", strict=True)
    seeds, seed_time = torch.arange(30), torch.randint(30, 95, (30,))
    (x, x_ids), (y, y_ids) = (_draw(s, seeds, seed_time, 1, "user") for s in (a, b))
    for t in data.edge_types:
        assert torch.equal(x_ids[t], y_ids[t]) and torch.equal(x.col[t], y.col[t])
        assert bool((data[t].edge_time[y_ids[t]] < seed_time[y.batch[t[-1]][y.col[t]]]).all())
    assert all(torch.equal(x.node[t], y.node[t]) for t in ("user", "item"))


def test_an_append_writes_beside_the_folder_and_rewrites_none_of_it(tmp_path):
    data, arrived = _stream(5)
    base, nodes = _part(data, arrived, 0, 540, 0)
    folder = _prepared(base, tmp_path / "g")
    before = {p.name: (p.stat().st_size, atomic_module.crc32(p)) for p in folder.glob("*.bin")}
    part, _ = _part(data, arrived, 540, 900, nodes)
    save_npy(part, tmp_path / "part")
    append_npy(folder, tmp_path / "part")
    for name in ("colptr.bin", "row.bin", "perm.bin", "edge_time.bin"):
        assert (folder / name).stat().st_size, atomic_module.crc32(folder / name) == before[name]
    # grown at their end only: the old bytes as they were
    with open(folder / "x.bin", "rb") as f:
        assert atomic_module.zlib.crc32(f.read(before["x.bin"][0])) == before["x.bin"][1]
    PreparedGraph(folder, "full")  # every checksum, the grown files' included


def test_a_killed_append_leaves_the_folder_as_it_was_and_a_rerun_finishes_it(tmp_path, monkeypatch):
    data, arrived = _stream(6)
    base, nodes = _part(data, arrived, 0, 540, 0)
    folder = _prepared(base, tmp_path / "g")
    snapshot = stores.open(folder)  # a fit that opened the folder before
    seeds, seed_time = torch.arange(nodes), torch.full((nodes,), 400)
    sampler = HopSampler(snapshot, [5, 3], time_attr="edge_time")
    first = _draw(sampler, seeds, seed_time, 0)
    part, _ = _part(data, arrived, 540, 900, nodes)
    save_npy(part, tmp_path / "part")
    manifest = (folder / "manifest.json").read_text()

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # after every file was written, before the manifest

    monkeypatch.setattr(atomic_module, "replace_manifest", killed)
    with pytest.raises(KeyboardInterrupt):
        append_npy(folder, tmp_path / "part")
    assert (folder / "manifest.json").read_text() == manifest
    assert (folder / "x.bin").stat().st_size > nodes * 3 * 4  # its tail, which nothing reads
    PreparedGraph(folder, "full")
    again = HopSampler(stores.open(folder), [5, 3], time_attr="edge_time")
    for x, y in zip(first, _draw(again, seeds, seed_time, 0), strict=True):
        assert torch.equal(x.node if hasattr(x, "node") else x, y.node if hasattr(y, "node") else y)
    monkeypatch.undo()
    append_npy(folder, tmp_path / "part")
    whole = HopSampler(
        stores.open(_prepared(data, tmp_path / "whole")), [5, 3], time_attr="edge_time"
    )
    grown = HopSampler(stores.open(folder), [5, 3], time_attr="edge_time")
    seeds, seed_time = torch.arange(70), torch.full((70,), 400)
    (x, x_ids), (y, y_ids) = _draw(whole, seeds, seed_time, 2), _draw(grown, seeds, seed_time, 2)
    assert torch.equal(x.node, y.node) and torch.equal(x_ids, y_ids)
    # the snapshot opened before still draws its own graph
    assert torch.equal(_draw(sampler, seeds[:nodes], seed_time[:nodes], 0)[1], first[1])


def test_appends_that_would_break_the_folder_are_refused_in_one_line(tmp_path):
    data, arrived = _stream(7)
    base, nodes = _part(data, arrived, 0, 540, 0)
    folder = _prepared(base, tmp_path / "g")
    part, _ = _part(data, arrived, 540, 900, nodes)
    sizes = {p.name: p.stat().st_size for p in folder.glob("*.bin")}

    def refused(change, message):
        where = tmp_path / f"p{len(list(tmp_path.glob('p*')))}"
        save_npy(part, where)
        change(where)
        with pytest.raises(PreparedGraphError, match=message):
            append_npy(folder, where)

    def older(where):
        time = np.load(where / "edge_time.npy")
        time[5] = -1
        np.save(where / "edge_time.npy", time)

    refused(older, r"edge 5 is at time -1, before the folder's newest edge")

    def counted_without_features(where):
        (where / "x.npy").unlink()
        (where / "num_nodes.json").write_text(json.dumps({"": part.num_nodes}))

    refused(counted_without_features, f"give the {part.num_nodes} new nodes' x.npy")
    refused(lambda w: (w / "edge_time.npy").unlink(), "give the new edges' edge_time.npy")
    refused(lambda w: (w / "edge_attr.npy").unlink(), "give the new edges' edge_attr.npy")

    def outside(where):
        index = np.load(where / "edge_index.npy")
        index[0, 3] = 70
        np.save(where / "edge_index.npy", index)

    refused(outside, r"source 70 at position 3 is outside 0..69")
    PreparedGraph(folder, "full")  # none of them touched it: checked before any write
    assert {p.name: p.stat().st_size for p in folder.glob("*.bin")} == sizes
    assert not list(folder.glob("append*"))
    assert json.loads((folder / "manifest.json").read_text()).get("appends") is None


def test_a_grown_folder_refuses_what_reads_one_csc(tmp_path):
    data, arrived = _stream(8, timed=False)
    pair = stores.open(_grown(data, arrived, tmp_path))
    with pytest.raises(ValueError, match="vectorized=False: this prepared folder took appends"):
        HopSampler(pair, [4], vectorized=False)
    with pytest.raises(PreparedGraphError, match="took appends: link splits and seed edges"):
        stores.seed_edges(pair[1])


def test_gnnscale_append_adds_a_part_from_the_command_line(tmp_path, capsys):
    data, arrived = _stream(9)
    base, nodes = _part(data, arrived, 0, 540, 0)
    folder = _prepared(base, tmp_path / "g")
    part, _ = _part(data, arrived, 540, 900, nodes)
    save_npy(part, tmp_path / "part")
    append_main(["--out", str(folder), "--root", str(tmp_path / "part")])
    assert f"added {part.num_nodes:,} nodes and 360 edges" in capsys.readouterr().out
    manifest = json.loads((folder / "manifest.json").read_text())
    assert Manifest.read(folder).to_json() == manifest  # every key read, as written
    assert manifest["appends"][0]["edges"] == {"": 360}
    assert manifest["num_nodes"] == 70 and manifest["num_edges"] == 900
    assert manifest["newest_time"][""] == int(data.edge_time.max())
    assert not [p for p in os.listdir(folder) if p.startswith(".")]  # no partial manifest left


def test_a_grown_folder_evaluates_layer_by_layer_as_the_whole_graph(tmp_path):
    """NeighborDataModule over a grown folder: every neighbour, the appended ones included."""
    from gnnscale import GraphSAGE, NeighborDataModule, make_synthetic_graph
    from gnnscale.data.args import EvalArgs
    from gnnscale.models.inference import layerwise_inference
    from gnnscale.testing import TINY

    data, keep = make_synthetic_graph(TINY), 2700
    inside = (data.edge_index < keep).all(0)
    masks = ("train_mask", "val_mask", "test_mask")
    base = Data(x=data.x[:keep], y=data.y[:keep], edge_index=data.edge_index[:, inside])
    for m in masks:
        base[m] = data[m][:keep]
    whole = base.clone()
    whole.x, whole.y, whole.num_nodes = data.x, data.y, data.num_nodes
    whole.edge_index = torch.cat([base.edge_index, data.edge_index[:, ~inside]], 1)
    for m in masks:  # the appended nodes join no split
        whole[m] = torch.cat([base[m], torch.zeros(data.num_nodes - keep, dtype=torch.bool)])
    part = Data(x=data.x[keep:], y=data.y[keep:], edge_index=data.edge_index[:, ~inside])
    assert (part.edge_index[1] < keep).any()  # new edges into old nodes
    grown = _prepared(base, tmp_path / "grown")
    save_npy(part, tmp_path / "part")
    append_npy(grown, tmp_path / "part")
    torch.manual_seed(0)
    model = GraphSAGE(in_channels=TINY.num_features, num_classes=5, num_layers=2).eval()
    layerwise = EvalArgs(mode="layerwise", batch_size=500)
    outs = []
    for folder in (_prepared(whole, tmp_path / "whole"), grown):
        dm = NeighborDataModule("prepared", folder, [5, 3], eval=layerwise)
        dm.configure_batches(model.batch_request())
        dm.setup("test")
        outs.append(layerwise_inference(model.gnn, next(iter(dm.test_dataloader()))))
    assert outs[0].shape == (TINY.num_nodes, 5)
    assert torch.equal(outs[0], outs[1])


def test_an_append_never_writes_into_an_input_the_folder_maps_where_it_lies(tmp_path):
    from gnnscale.stores import prepare_npy

    data, arrived = _stream(10, timed=False)
    base, nodes = _part(data, arrived, 0, 540, 0)
    save_npy(base, tmp_path / "npy")  # x.npy float32, C order: used where it lies
    folder = prepare_npy(tmp_path / "npy", tmp_path / "g")
    assert Manifest.read(folder).files["x"].path is not None
    given = (tmp_path / "npy" / "x.npy").read_bytes()
    part, _ = _part(data, arrived, 540, 900, nodes)
    save_npy(part, tmp_path / "part")
    with pytest.raises(PreparedGraphError, match="used where it lies; an append would write"):
        append_npy(folder, tmp_path / "part")
    assert (tmp_path / "npy" / "x.npy").read_bytes() == given
    assert not list(folder.glob("append*"))
