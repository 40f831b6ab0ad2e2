"""Many small graphs on disk: bit-identical read-back, refusals, exactly-once sharding, memory."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler
from torch_geometric.data import Batch, Data

from gnnscale import GraphDataModule, GraphGINE
from gnnscale._compat import worker_processes
from gnnscale.cli.prepare import prepare_graphs_main
from gnnscale.data.args import GraphSplit, LoaderArgs
from gnnscale.data.many_graphs import (
    AtomGraphDataset,
    AtomGraphs,
    features_only_mae,
    prepare_graphs,
)
from gnnscale.errors import ConfigError
from gnnscale.handshake import BatchRequest
from gnnscale.measure import anon_mb
from gnnscale.stores import atomic
from gnnscale.stores import graph_db as graph_stores
from gnnscale.stores.graph_db import (
    GraphStore,
    GraphStoreError,
    decode,
    encode,
    verify,
    write_graphs,
)
from gnnscale.stores.graph_db_manifest import StoreManifest
from gnnscale.testing import quiet_trainer, run_or_show_stacks

SMALL = AtomGraphs(num_graphs=300, seed=3)


def _equal(a: Data, b: Data) -> None:
    assert sorted(a.keys()) == sorted(b.keys())
    for key in a.keys():
        assert a[key].dtype == b[key].dtype, key
        assert a[key].shape == b[key].shape, key
        if a[key].numel() == 0:  # an edgeless graph's edges: dtype and shape are all there is
            continue
        # bit for bit: compare the bytes, so NaNs and signed zeros count too
        assert a[key].contiguous().view(torch.uint8).equal(b[key].contiguous().view(torch.uint8))


@pytest.fixture(scope="module", params=["lmdb", "sqlite"])
def store(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param) / "atoms"
    prepare_graphs(out=out, backend=request.param, atoms=SMALL, chunk_graphs=64)
    return out


def test_atom_graphs_are_radius_graphs_with_a_pair_energy():
    g = AtomGraphDataset(SMALL)[7]
    assert SMALL.min_atoms <= g.num_nodes <= SMALL.max_atoms
    assert g.x.dtype == torch.uint8 and bool((g.x.sum(-1) == 1).all())  # one type per atom
    src, dst = g.edge_index
    length = (g.pos[src] - g.pos[dst]).norm(dim=-1)
    assert torch.allclose(length, g.edge_attr.view(-1), atol=1e-5)
    assert bool((length < SMALL.cutoff).all())
    full = torch.cdist(g.pos, g.pos)
    full.fill_diagonal_(float("inf"))
    assert int((full < SMALL.cutoff).sum()) == g.num_edges  # every pair within the cutoff
    assert AtomGraphDataset(SMALL)[7].y.equal(g.y)  # a function of (seed, index)


def test_prepared_graphs_read_back_bit_identical(store):
    graphs, generated = GraphStore(store), AtomGraphDataset(SMALL)
    assert len(graphs) == SMALL.num_graphs
    for i in range(len(graphs)):
        _equal(graphs[i], generated[i])
    verify(store)  # the file's CRC-32 and every record's


def test_any_tensor_dtype_round_trips_bit_identical(tmp_path):
    graphs = [
        Data(
            x=torch.randn(5, 3, dtype=torch.bfloat16),
            h=torch.tensor([float("nan"), -0.0, 1e-40], dtype=torch.float32),
            edge_index=torch.tensor([[0, 1, 4], [1, 4, 0]]),
            big=torch.tensor([2**40, -(2**40)]),
            mask=torch.tensor([True, False]),
            y=torch.tensor([i]),
        )
        for i in range(10)
    ]
    for g in graphs:
        _equal(decode(encode(g)), g)
    out = write_graphs(graphs, tmp_path / "mixed", {"dataset": "list"}, "sqlite", num_classes=10)
    store = GraphStore(out)
    for i, g in enumerate(graphs):
        _equal(store[i], g)
    with pytest.raises(ConfigError, match="'name' is a str"):
        encode(Data(x=torch.ones(2, 1), name="water"))


def test_a_truncated_store_is_refused(store, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in store.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    data = copy / StoreManifest.read(copy).file_name
    os.truncate(data, data.stat().st_size // 2)
    with pytest.raises(GraphStoreError, match="is truncated or was changed; prepare it again"):
        GraphDataModule(copy)


def test_a_damaged_record_is_refused(tmp_path):
    out = prepare_graphs(out=tmp_path / "s", backend="lmdb", atoms=SMALL, chunk_graphs=64)
    path = out / "data.mdb"
    raw = bytearray(path.read_bytes())
    record = encode(AtomGraphDataset(SMALL)[5])
    at = raw.find(record)
    assert at > 0
    raw[at + len(record) // 2] ^= 0xFF  # one bit flipped inside graph 5: same size
    path.write_bytes(bytes(raw))
    graphs = GraphStore(out)  # the size is right, so this opens
    graphs[4]
    with pytest.raises(GraphStoreError, match="graph 5 fails its CRC-32 check"):
        graphs[5]
    with pytest.raises(GraphStoreError, match="fails its CRC-32 check"):
        verify(out)


def test_a_store_without_manifest_is_refused(store, tmp_path):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "data.mdb").write_bytes(b"")
    with pytest.raises(GraphStoreError, match="manifest.json is missing"):
        GraphDataModule(tmp_path / "half")
    with pytest.raises(GraphStoreError, match="run `gnnscale prepare-graphs --out"):
        GraphDataModule(tmp_path / "nothing")


KILLED = """
import os, signal, sys
from pathlib import Path
from gnnscale.data.many_graphs import AtomGraphDataset, AtomGraphs, write_graphs
from gnnscale.stores import graph_db as graphs
from dataclasses import asdict

graphs._estimated_bytes = lambda *args: 0  # it reads a sample: only the writer's reads here

class DiesAt(AtomGraphDataset):
    def __getitem__(self, i):
        if i == int(sys.argv[3]):
            os.kill(os.getpid(), signal.SIGKILL)   # no cleanup, as a kill -9 or an OOM kill
        return super().__getitem__(i)

spec = AtomGraphs(num_graphs=300, seed=3)
source = {"dataset": "atoms", "atoms": asdict(spec)}
write_graphs(DiesAt(spec), Path(sys.argv[1]), source, sys.argv[2], chunk_graphs=64)
"""


@pytest.mark.parametrize("backend", ["lmdb", "sqlite"])
def test_a_killed_prepare_is_refused_then_resumes_from_its_last_chunk(
    tmp_path, backend, monkeypatch
):
    out = tmp_path / "atoms"
    done = subprocess.run([sys.executable, "-c", KILLED, str(out), backend, "150"], check=False)
    assert done.returncode == -signal.SIGKILL
    assert not out.exists()  # nothing looks prepared under the name
    with pytest.raises(GraphStoreError, match="half-finished prepare.*rerun `gnnscale prepare"):
        GraphDataModule(out)

    asked = []

    class Counting(AtomGraphDataset):
        def __getitem__(self, i):
            asked.append(i)
            return super().__getitem__(i)

    source = {"dataset": "atoms", "atoms": SMALL.__dict__}
    monkeypatch.setattr(graph_stores, "_estimated_bytes", lambda *args: 0)  # reads a sample
    write_graphs(Counting(SMALL), out, source, backend, chunk_graphs=64)
    assert min(asked) == 128  # two chunks of 64 were committed before the kill at 150
    graphs, generated = GraphStore(out), AtomGraphDataset(SMALL)
    for i in range(len(graphs)):
        _equal(graphs[i], generated[i])
    assert not list(tmp_path.glob(".atoms.partial*"))


def test_a_second_prepare_is_refused_while_one_runs(tmp_path):
    out = tmp_path / "atoms"
    with atomic.locked(out):  # as a prepare of the same folder, running in another process
        with pytest.raises(ConfigError, match=f"atoms is being written by process {os.getpid()}"):
            prepare_graphs(out=out, backend="lmdb", atoms=SMALL, chunk_graphs=64)
    assert not out.exists() and atomic.leftovers(out) == []


def test_prepare_graphs_refuses_a_disk_without_room_before_writing(store, tmp_path, monkeypatch):
    estimate = graph_stores._estimated_bytes(AtomGraphDataset(SMALL), SMALL.num_graphs)
    written = GraphStore(store).path.stat().st_size
    assert 0.9 < estimate / written < 1.2  # the arithmetic the check relies on, either backend
    usage = shutil.disk_usage(tmp_path)
    free = usage._replace(free=1 << 30)
    monkeypatch.setattr(atomic.shutil, "disk_usage", lambda path: free)
    out = tmp_path / "atoms"
    refused = r"--out .*atoms: the graph store needs about 2\.\d\d GiB, and 2\.\d\d GiB free with"
    refused += r" the margin kept \(5% and 64 MiB\); its disk has 1\.00 GiB free"
    with pytest.raises(GraphStoreError, match=refused):
        prepare_graphs_main(["--out", str(out), "--atoms.num_graphs=1000000"])  # as shipped
    assert list(tmp_path.iterdir()) == []  # nothing written, not even the lock
    # A killed prepare's partial folder is continued or removed: its bytes count as room.
    monkeypatch.setattr(atomic.shutil, "disk_usage", lambda path: usage._replace(free=0))
    with pytest.raises(GraphStoreError, match=r"needs about 0.00 GiB, and 0.06 GiB free with"):
        prepare_graphs(out=out, atoms=SMALL)
    partial = tmp_path / ".atoms.partial-999999"  # a dead writer's, of other settings
    partial.mkdir()
    with (partial / "data.mdb").open("wb") as f:
        f.truncate(estimate + (64 << 20))  # sparse: its size, not its blocks
    prepare_graphs(out=out, atoms=SMALL)
    assert len(GraphStore(out)) == SMALL.num_graphs and not partial.exists()


def test_a_store_whose_first_graph_has_no_edge_is_finished_and_read(tmp_path):
    # Legal settings: few atoms, a short cutoff; this seed's first graph has no edge.
    atoms = AtomGraphs(num_graphs=12, min_atoms=2, max_atoms=4, cutoff=1.1, seed=3)
    graphs = [AtomGraphDataset(atoms)[i] for i in range(12)]
    assert graphs[0].num_edges == 0 and any(g.num_edges for g in graphs)
    out = prepare_graphs(out=tmp_path / "atoms", atoms=atoms, chunk_graphs=4)
    assert StoreManifest.read(out).num_edge_features == 1
    for i, graph in enumerate(graphs):
        _equal(GraphStore(out)[i], graph)
    model = GraphGINE(in_channels=atoms.num_types, num_classes=0, hidden_channels=8)
    batch = Batch.from_data_list([GraphStore(out)[0]])
    assert model(batch).shape == (1,)  # a batch of edgeless graphs goes through the model


def test_prepare_keeps_a_complete_store_and_refuses_other_settings(store):
    manifest = StoreManifest.read(store)
    prepare_graphs(out=store, backend=manifest.backend, atoms=SMALL, chunk_graphs=64)
    with pytest.raises(GraphStoreError, match="prepared from other settings"):
        prepare_graphs(out=store, backend=manifest.backend, atoms=AtomGraphs(num_graphs=20))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (lambda: {"backend": "rocksdb"}, "--data.backend 'rocksdb' is not known"),
        (lambda: {"split": GraphSplit(0.0)}, r"--data.split.val_fraction must be in \(0, 1\)"),
        (lambda: {"split": GraphSplit(0.5, 0.5)}, "must be < 1, leaving graphs to train"),
        (lambda: {"batch_size": 0}, "--data.batch_size must be >= 1"),
    ],
)
def test_settings_are_refused_naming_the_flag(store, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        GraphDataModule(store, **kwargs())


def test_the_backend_setting_must_match_the_store(store):
    other = {"lmdb": "sqlite", "sqlite": "lmdb"}[StoreManifest.read(store).backend]
    with pytest.raises(ConfigError, match=f"--data.backend {other} but"):
        GraphDataModule(store, backend=other)


def test_a_model_that_does_not_fit_the_graphs_is_refused(store):
    dm = GraphDataModule(store)
    with pytest.raises(ConfigError, match="--model.edge_dim is 3 but"):
        dm.configure_batches(BatchRequest.of(GraphGINE(dm.num_features, 0, edge_dim=3)))
    with pytest.raises(ConfigError, match="is a node model"):
        dm.configure_batches(BatchRequest.of(L.LightningModule()))


def _epoch(dm: GraphDataModule, rank: int, epoch: int) -> list[tuple[np.ndarray, np.ndarray]]:
    # What DDP's ranks see; every rank takes rank 0's seed.
    strategy = SimpleNamespace(broadcast=lambda seed: 7)
    dm.trainer = SimpleNamespace(world_size=2, global_rank=rank, strategy=strategy, training=True)
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(epoch)  # as Lightning does each epoch
    batches = (dm.on_before_batch_transfer(b, 0) for b in loader)  # as Lightning does
    return [(b.idx.numpy(), b.loss_weight.numpy()) for b in batches]


def _trained_once(batches_per_rank, expected) -> None:
    """Across ranks, every graph of the split has weight once per epoch; padding weighs 0."""
    assert len({len(b) for b in batches_per_rank}) == 1  # same batch count: DDP cannot hang
    weighted = np.concatenate([i[w > 0] for b in batches_per_rank for i, w in b])
    assert np.array_equal(np.sort(weighted), np.sort(expected))  # each once, none missing


def test_two_ranks_train_every_graph_exactly_once_per_epoch(store):
    # 300 graphs, 243 to train on: 13 batches of 20, the last one short; rank 1 repeats a batch.
    dm = GraphDataModule(store, batch_size=20, split=GraphSplit(0.1, 0.09))
    train = dm.splits["train"]
    assert len(train) == 243
    orders = []
    for epoch in range(2):
        per_rank = [_epoch(dm, rank, epoch) for rank in range(2)]
        _trained_once(per_rank, train)
        orders.append(np.concatenate([i for i, _ in per_rank[0]]))
        weights = [w for b in per_rank for _, w in b]
        assert [int((w == 0).sum()) for w in weights if (w == 0).any()] == [20]  # one repeat
        assert all(np.allclose(w[w > 0], 1 / 20) for w in weights)  # a graph weighs 1/batch
    assert not np.array_equal(orders[0], orders[1])  # reshuffled each epoch


def test_the_exactly_once_check_fails_a_broken_sampler(store):
    """The check above fails a plain DistributedSampler (its padding trains a graph twice)."""
    dm = GraphDataModule(store, batch_size=16, split=GraphSplit(0.1, 0.09))
    from gnnscale.data.many_graphs import _Split

    split = _Split(dm.graphs, dm.splits["train"])
    per_rank = []
    for rank in range(2):
        sampler = DistributedSampler(split, num_replicas=2, rank=rank, shuffle=True)
        batches = np.array_split(np.array(list(sampler)), 8)
        per_rank.append([(dm.splits["train"][b], np.ones(len(b))) for b in batches])
    with pytest.raises(AssertionError):
        _trained_once(per_rank, dm.splits["train"])
    # every rank reading every graph fails too
    whole = [[(dm.splits["train"], np.ones(len(dm.splits["train"])))]] * 2
    with pytest.raises(AssertionError):
        _trained_once(whole, dm.splits["train"])


def test_evaluation_scores_every_graph_once_across_ranks(store):
    dm = GraphDataModule(store, batch_size=16, split=GraphSplit(0.1, 0.09))
    seen = []
    for rank in range(2):
        dm.trainer = SimpleNamespace(world_size=2, global_rank=rank)
        seen += [b.idx[b.loss_weight > 0].numpy() for b in dm.test_dataloader()]
    assert np.array_equal(np.sort(np.concatenate(seen)), dm.splits["test"])


def test_workers_memory_stays_flat_over_epochs(tmp_path):
    """Two workers read the store for 5 epochs; their private memory grows under 5% (or 2 MiB).

    Each worker holds the store's path and the split's ids as one numpy array; no Python
    object per graph whose reference count would dirty copy-on-write pages every epoch.
    """
    out = prepare_graphs(out=tmp_path / "s", atoms=AtomGraphs(num_graphs=3000), chunk_graphs=1000)
    loader_args = LoaderArgs(num_workers=2, persistent_workers=True)
    dm = GraphDataModule(out, batch_size=64, loader=loader_args)
    loader = dm.train_dataloader()
    after = {}
    for epoch in range(1, 6):
        loader.sampler.set_epoch(epoch)
        for _ in loader:
            pass
        workers = worker_processes(loader.batches)  # the ResumableLoader's DataLoader
        after[epoch] = [anon_mb(w.pid) for w in workers]
    del loader
    for first, last in zip(after[1], after[5], strict=True):
        assert last - first < max(0.05 * first, 2.0), after


def test_the_gnn_beats_the_edge_blind_rule_by_far(tmp_path):
    """Edges matter: least squares on atom-type counts leaves most of the energy unexplained."""
    out = prepare_graphs(out=tmp_path / "s", atoms=AtomGraphs(num_graphs=1500), chunk_graphs=500)
    dm = GraphDataModule(out, batch_size=16, split=GraphSplit(0.1, 0.2))
    store = dm.store
    bar = features_only_mae(
        [store[int(i)] for i in dm.splits["train"]], [store[int(i)] for i in dm.splits["test"]]
    )
    L.seed_everything(0)
    model = GraphGINE(
        dm.num_features,
        0,
        dm.num_edge_features,
        hidden_channels=64,
        num_rbf=16,
        optimizer=lambda p: torch.optim.Adam(p, lr=5e-3),
    )
    trainer = quiet_trainer(max_epochs=15, limit_val_batches=0)
    start = time.perf_counter()
    trainer.fit(model, dm)
    (result,) = trainer.test(model, dm, verbose=False)
    assert result["test/mae"] < bar / 2, (result, bar, time.perf_counter() - start)


DDP = """
import json, sys
from pathlib import Path
import lightning as L
from lightning.pytorch.strategies import DDPStrategy
from gnnscale import GraphDataModule, GraphGINE, GraphSplit

class Record(L.Callback):
    def on_train_batch_start(self, trainer, module, batch, idx):
        seen = batch.idx[batch.loss_weight > 0].tolist()
        path = Path(sys.argv[2]) / f"rank{trainer.global_rank}-epoch{trainer.current_epoch}.json"
        old = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps(old + [seen]))

dm = GraphDataModule(sys.argv[1], batch_size=16, split=GraphSplit(0.1, 0.09))
model = GraphGINE(dm.num_features, dm.num_classes, dm.num_edge_features, hidden_channels=8)
trainer = L.Trainer(
    accelerator="cpu", devices=2, max_epochs=2, logger=False, enable_progress_bar=False,
    enable_checkpointing=False, enable_model_summary=False, limit_val_batches=0,
    strategy=DDPStrategy(start_method="fork", process_group_backend="gloo"),
    accumulate_grad_batches=3, callbacks=[Record()],
)
trainer.fit(model, dm)
Path(sys.argv[2], "train.json").write_text(json.dumps(dm.splits["train"].tolist()))
"""


@pytest.mark.slow
def test_ddp_on_two_processes_trains_every_graph_exactly_once(store, tmp_path):
    done = run_or_show_stacks([sys.executable, "-c", DDP, str(store), str(tmp_path)], 600)
    assert done.returncode == 0, done.stderr[-3000:]
    train = json.loads((tmp_path / "train.json").read_text())
    for epoch in range(2):
        ranks = [json.loads((tmp_path / f"rank{r}-epoch{epoch}.json").read_text()) for r in (0, 1)]
        assert len(ranks[0]) == len(ranks[1])
        seen = sorted(i for rank in ranks for batch in rank for i in batch)
        assert seen == sorted(train)


def test_predict_writes_each_graphs_value_once(store, tmp_path):
    """Every graph of the store once, under its index: the test split's rows give the test MAE."""
    import pyarrow.parquet as pq

    from gnnscale.callbacks import PredictionWriter

    L.seed_everything(0)
    dm = GraphDataModule(store, batch_size=16, split=GraphSplit(0.1, 0.2))
    model = GraphGINE(dm.num_features, dm.num_classes, dm.num_edge_features, hidden_channels=8)
    trainer = quiet_trainer(callbacks=[PredictionWriter(tmp_path / "predictions")])
    trainer.predict(model, dm, return_predictions=False)
    table = pq.read_table(tmp_path / "predictions")
    graphs, values = table.column("graph").to_numpy(), table.column("value").to_numpy()
    assert sorted(graphs.tolist()) == list(range(len(dm.store)))
    energy = np.array([dm.store[int(i)].y.item() for i in graphs])
    test = np.isin(graphs, dm.splits["test"])
    (result,) = trainer.test(model, dm, verbose=False)
    assert np.abs(values[test] - energy[test]).mean() == pytest.approx(result["test/mae"], 1e-5)
