"""A graph prepared on disk: trained in place, shared, and refused when it is not whole."""

import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from functools import partial

import lightning as L
import numpy as np
import psutil
import pytest
import torch
from registry import REPO
from torch_geometric.loader import NeighborLoader

from gnnscale import (
    GraphSAGE,
    NeighborDataModule,
    SyntheticGraph,
    make_synthetic_graph,
    stores,
)
from gnnscale.cli import main
from gnnscale.data.args import EvalArgs, LoaderArgs
from gnnscale.data.subgraph import ClusterDataModule
from gnnscale.data.synthetic import write_streamed_synthetic
from gnnscale.errors import ConfigError
from gnnscale.handshake import BatchRequest
from gnnscale.measure import anon_mb, read_metrics, trim_heap
from gnnscale.sampling import HopSampler
from gnnscale.stores import atomic, reads, writing
from gnnscale.stores.manifest import PreparedGraphError
from gnnscale.stores.prepared import PreparedGraph
from gnnscale.stores.writing import write_graph
from gnnscale.testing import TINY, centroid_accuracy, cli_args, quiet_trainer

SAMPLED = ["--data.eval.mode=sampled", "--data.eval.num_neighbors=[-1,-1]"]


@pytest.fixture
def tiny_prepared(tmp_path):
    return write_graph(make_synthetic_graph(TINY), tmp_path / "tiny", {"test": "tiny"})


def _fit(folder, *extra):
    config = REPO / "recipes" / "neighbor_sage" / "config.yaml"
    main(["fit", "--config", str(config), *cli_args(folder), *extra])
    return read_metrics(folder / "runs")


def test_prepared_graph_trains_exactly_like_the_same_graph_in_memory(tmp_path, tiny_prepared):
    """Same seed, same batches, same losses: the mapped CSC and features are PyG's own."""
    args = [
        *SAMPLED,
        "--trainer.max_epochs=2",
        "--trainer.precision=32",
        "--model.hidden_channels=32",
        "--data.batch_size=256",  # 4 batches an epoch, 2 steps of the recipe's accumulation
        "--data.loader.num_workers=0",
        "--data.loader.persistent_workers=false",
        # A prepared graph's model aggregates its first layer; so does this one in memory.
        "--model.speed.aggregate_in_loader=false",
        *(f"--data.synthetic.{k}={v}" for k, v in dataclasses.asdict(TINY).items()),
    ]
    memory = _fit(tmp_path / "memory", *args)
    prepared = ["--data.dataset=prepared", f"--data.root={tiny_prepared}"]
    disk = _fit(tmp_path / "disk", *args, *prepared)
    # Features read by threads in a worker, 1,580 of the 3,000 rows held by a cache (its
    # budget: a row is 128 bytes and its id 8): the sampling pass that fills it moves no draw.
    cached = ["--data.read_threads=4", "--data.feature_cache_gib=0.0002"]
    workers = ["--data.loader.num_workers=1", "--data.loader.persistent_workers=true"]
    cache = _fit(tmp_path / "cache", *args, *prepared, *cached, *workers)
    assert len(memory["train/loss_epoch"]) == 2
    for key in ("train/loss_epoch", "val/acc", "test/acc"):
        assert disk[key] == memory[key], key
        assert cache[key] == memory[key], key
    assert all(0.3 < rate < 1 for rate in cache["perf/cache_hit_rate"]), cache[
        "perf/cache_hit_rate"
    ]
    assert "perf/cache_hit_rate" not in disk


def test_threaded_reads_give_the_batches_of_one_mapped_gather(tiny_prepared, monkeypatch):
    """Features read by many threads (in the loader's worker) are those PyG's gather reads."""
    monkeypatch.setattr(reads, "MIN_ROWS", 8)

    def batches(read_threads):
        loader = LoaderArgs(num_workers=1, persistent_workers=False)
        dm = NeighborDataModule(
            "prepared",
            tiny_prepared,
            [5, 3],
            256,
            loader=loader,
            eval=EvalArgs(mode="sampled"),
            read_threads=read_threads,
        )
        dm.configure_batches(BatchRequest(num_layers=2))
        dm.setup("fit")
        torch.manual_seed(0)
        return list(dm.train_dataloader()), list(dm.val_dataloader())

    plain, threaded = batches(1), batches(4)
    assert len(plain[0]) == len(threaded[0]) > 1 and len(plain[1]) == len(threaded[1]) > 0
    for a, b in zip(plain[0] + plain[1], threaded[0] + threaded[1], strict=True):
        assert a.x.dtype == b.x.dtype and set(a.keys()) == set(b.keys())
        for key in a.keys():
            if isinstance(a[key], torch.Tensor):
                assert torch.equal(a[key], b[key]), key
    assert PreparedGraph(tiny_prepared).threads == 1  # by default: a graph the cache keeps


def test_the_feature_cache_keeps_to_its_budget_and_holds_rows_the_sampler_draws(tmp_path):
    """Measured: the cache's tensors and the process's growth while filling it stay within the
    budget (plus the pass's counts, one int32 per node); its rows are far more of a training
    epoch's than their share of the file."""
    cfg = SyntheticGraph(
        num_nodes=100_000, avg_degree=5, num_features=64, train_fraction=0.01, seed=1
    )
    folder = write_streamed_synthetic(cfg, tmp_path / "g", feature_dtype="float32")
    budget = 2 << 20
    loader = LoaderArgs(num_workers=1, persistent_workers=False)
    dm = NeighborDataModule(
        "prepared",
        folder,
        [5, 3],
        128,
        loader=loader,
        eval=EvalArgs(mode="sampled"),
        feature_cache_gib=budget / 2**30,
    )
    dm.configure_batches(BatchRequest(num_layers=2))
    dm.setup("fit")
    _ = dm.data  # mapped before measuring
    # Private memory (the mapped files' pages are the page cache's) with the heap's free pages
    # given back: what the process holds, whether or not its allocator keeps freed memory
    # (gnnscale's CLI, run earlier in this process by other tests, sets it to keep it).
    trim_heap()
    before = anon_mb()
    cache = dm.source.stores[0].cache[None]
    trim_heap()
    grown = (anon_mb() - before) * 2**20
    assert cache.nbytes <= budget and cache.ids.numel() == budget // (64 * 4 + 8)
    assert grown <= budget + 4 * cfg.num_nodes + (1 << 20), grown
    held = read = 0
    for batch in dm.train_dataloader():
        held, read = held + batch.feature_reads.cached, read + batch.feature_reads.total
    share = cache.ids.numel() / cfg.num_nodes  # 8%: what as many rows at random would hold
    assert held / read > 4 * share, (held / read, share)


def _mapped_file(address: int) -> str:
    """The file mapped at ``address`` in this process (``/proc/self/maps``), or ''."""
    for line in open("/proc/self/maps"):
        fields = line.split()
        start, end = (int(a, 16) for a in fields[0].split("-"))
        if start <= address < end:
            return fields[5] if len(fields) > 5 else ""
    return ""


def test_the_prepared_tensors_are_mapped_not_copied(tiny_prepared):
    graph = PreparedGraph(tiny_prepared)
    data, memory = graph.data, make_synthetic_graph(TINY)
    assert torch.equal(data.x, memory.x) and torch.equal(data.y, memory.y)
    for t, name in ((data.x, "x.bin"), (graph.csc[1], "row.bin")):
        assert _mapped_file(t.data_ptr()).endswith(name)  # the file's pages, not a private copy
    colptr, row = graph.csc
    assert colptr[-1] == row.numel() == memory.num_edges


def test_a_file_larger_than_memory_maps(tiny_prepared):
    """A private writable mapping (``torch.from_file``) of a file larger than RAM is refused by
    the kernel's overcommit check; the read-only shared one is not."""
    size = 2 * psutil.virtual_memory().total // 4 * 4  # float32 rows of one value, sparse file
    os.truncate(tiny_prepared / "x.bin", size)
    manifest = json.loads((tiny_prepared / "manifest.json").read_text())
    manifest["files"]["x"] |= {"shape": [size // 4, 1], "bytes": size}
    (tiny_prepared / "manifest.json").write_text(json.dumps(manifest))
    x = PreparedGraph(tiny_prepared, verify="size").tensor("x")
    assert x.shape == (size // 4, 1) and x[-1, 0] == 0  # read from the hole at the very end


def test_streamed_synthetic_is_a_learnable_graph_built_chunk_by_chunk(tmp_path):
    cfg = SyntheticGraph(num_nodes=5000, avg_degree=12, num_features=32, num_classes=5, seed=3)
    graph = PreparedGraph(write_streamed_synthetic(cfg, tmp_path / "g", "bfloat16", 1024))
    data, (colptr, row) = graph.data, graph.csc
    assert data.x.dtype == torch.bfloat16 and data.x.shape == (5000, 32)
    assert (colptr[1:] >= colptr[:-1]).all() and colptr[-1] == row.numel()
    assert 10 < row.numel() / 5000 < 14  # avg_degree, in-edges per node
    dst = torch.repeat_interleave(torch.arange(5000), colptr.diff())
    assert not (row == dst).any()  # no self-loops
    same = (data.y[row] == data.y[dst]).float().mean()
    assert abs(same - (cfg.homophily + (1 - cfg.homophily) / 5)) < 0.02
    masks = torch.stack([data.train_mask, data.val_mask, data.test_mask]).long()
    assert (masks.sum(0) == 1).all()
    # The same settings and chunk size give the same bytes; another seed does not.
    again = PreparedGraph(write_streamed_synthetic(cfg, tmp_path / "h", "bfloat16", 1024))
    assert torch.equal(again.data.x, data.x) and torch.equal(again.csc[1], row)


def test_streamed_synthetic_needs_the_edges(tmp_path):
    cfg = SyntheticGraph(
        num_nodes=4000, avg_degree=12, num_features=32, num_classes=5, feature_noise=4.0
    )
    folder = write_streamed_synthetic(cfg, tmp_path / "g", "float32", 1000)
    L.seed_everything(0)
    dm = NeighborDataModule(
        "prepared", folder, [10, 10], 128, eval=EvalArgs(mode="sampled", num_neighbors=[-1, -1])
    )
    model = GraphSAGE(32, 5, hidden_channels=64)
    trainer = quiet_trainer(max_epochs=4)
    trainer.fit(model, dm)
    acc = trainer.test(model, dm, verbose=False)[0]["test/acc"]
    bar = centroid_accuracy(dm.data)
    assert acc > bar + 0.1, (acc, bar)


# --- a folder that is not whole is refused, naming the file ----------------------------------


def test_corrupted_file_is_refused_naming_it(tiny_prepared):
    with (tiny_prepared / "x.bin").open("r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0x01]))  # one bit: a value still looks like a float
    with pytest.raises(PreparedGraphError, match=r"x\.bin is corrupted: bytes 0 to"):
        PreparedGraph(tiny_prepared)
    PreparedGraph(tiny_prepared, verify="size")  # the cheap check cannot see it; full is default


@pytest.mark.parametrize(
    ("entry", "value", "problem"),
    [
        (0, 3, "it starts at 3, not 0"),
        (100, 10**12, "entry 101 is smaller than the one before it"),  # was a segfault
        (100, -1, "entry 100 is smaller than the one before it"),  # trained on wrong edges
        (-1, 10**9, "it ends at 1,000,000,000 where row has"),
    ],
)
def test_a_damaged_colptr_is_refused_even_when_only_sizes_are_checked(
    tiny_prepared, entry, value, problem
):
    colptr = np.memmap(tiny_prepared / "colptr.bin", dtype=np.int64, mode="r+")
    colptr[entry] = value
    colptr.flush()
    del colptr
    with pytest.raises(PreparedGraphError, match=rf"colptr\.bin is damaged \({problem}"):
        PreparedGraph(tiny_prepared, verify="size")


@pytest.mark.parametrize("bad", [10**9, -1])
def test_a_damaged_row_is_refused_when_a_batch_gathers_it(tiny_prepared, bad):
    """A neighbour id out of range in ``row.bin`` (its sizes are right: ``verify: size`` opens
    it) is one error naming the file, from PyG's loader with gnnscale's sampler on the store and
    from the DataModule, which check the ids each batch drew. A gather of such an id from the
    feature store itself (PyG's own sampler, one hop) is refused too: the store cannot tell a
    sampler's ids from its caller's, and names both."""
    row = np.memmap(tiny_prepared / "row.bin", dtype=np.int64, mode="r+")
    row[5] = bad  # an in-neighbour of node 0
    row.flush()
    del row
    message = rf"holds node {bad:,}, outside 0..2,999 .*{tiny_prepared / 'row.bin'} holds a damaged"
    fs, gs = stores.open(tiny_prepared, verify="size")
    sampler = HopSampler((fs, gs), [-1])
    loader = NeighborLoader((fs, gs), [-1], input_nodes=torch.arange(10), neighbor_sampler=sampler)
    with pytest.raises(PreparedGraphError, match=message):
        next(iter(loader))
    with pytest.raises(IndexError, match=rf"an index given to the store .*{message}"):
        fs.get_tensor(None, "x", torch.tensor([0, bad]))
    dm = NeighborDataModule(
        "prepared", tiny_prepared, [-1, -1], 16, eval=EvalArgs(mode="sampled"), verify="size"
    )
    dm.configure_batches(BatchRequest(num_layers=2))
    dm.setup("fit")
    with pytest.raises(PreparedGraphError, match=message):
        for _ in dm.predict_dataloader():  # every node, in order: node 0 first
            pass


def test_truncated_file_is_refused_naming_it(tiny_prepared):
    path = tiny_prepared / "row.bin"
    os.truncate(path, path.stat().st_size - 8)
    with pytest.raises(PreparedGraphError, match=r"row\.bin has .* bytes where the manifest says"):
        PreparedGraph(tiny_prepared, verify="size")


def test_folder_without_manifest_is_refused_before_any_work(tiny_prepared):
    (tiny_prepared / "manifest.json").unlink()
    with pytest.raises(PreparedGraphError, match="manifest.json is missing"):
        NeighborDataModule("prepared", tiny_prepared, eval=EvalArgs(mode="sampled"))


def test_prepared_graph_is_refused_where_it_would_be_copied(tiny_prepared):
    with pytest.raises(ValueError, match="ClusterData partitions and reorders the whole graph"):
        ClusterDataModule("prepared", tiny_prepared, num_parts=4, clusters_per_batch=2)
    with pytest.raises(ValueError, match="full loads the whole graph.*use --data.eval.mode=sampl"):
        NeighborDataModule("prepared", tiny_prepared, eval=EvalArgs(mode="full"))
    with pytest.raises(ValueError, match="use --data.eval.val_mode=sampled"):
        NeighborDataModule("prepared", tiny_prepared, eval=EvalArgs("sampled", val_mode="full"))


def test_layerwise_evaluation_of_a_prepared_graph_is_the_in_memory_graphs(
    tmp_path, tiny_prepared, monkeypatch
):
    """Exact evaluation from the mapped files, the first layer's rows read by threads."""
    from gnnscale.models.inference import layerwise_inference

    monkeypatch.setattr(reads, "MIN_ROWS", 8)  # tiny batches still read by several threads
    threads = []  # of each gather of feature rows (the sampler's read-ahead gathers ids)
    gather = reads.gather

    def counted(tensor, index, read_threads=1, out=None):
        if tensor.dim() == 2:
            threads.append(read_threads)
        return gather(tensor, index, read_threads, out)

    monkeypatch.setattr(reads, "gather", counted)
    torch.manual_seed(0)
    model = GraphSAGE(in_channels=TINY.num_features, num_classes=5, num_layers=2).eval()
    layerwise = EvalArgs(mode="layerwise", batch_size=500)
    memory = NeighborDataModule(root=tmp_path, num_neighbors=[5, 3], synthetic=TINY, eval=layerwise)
    disk = NeighborDataModule("prepared", tiny_prepared, [5, 3], eval=layerwise, read_threads=4)
    outs = []
    for dm in (memory, disk):
        dm.configure_batches(model.batch_request())
        dm.setup("test")
        batch = next(iter(dm.test_dataloader()))
        assert "x" not in next(iter(batch.loader))  # ids and edges only, every layer
        outs.append(layerwise_inference(model.gnn, batch))
    assert threads == [1] * 6 + [4] * 6  # the first layer's 6 batches, each run
    assert torch.equal(outs[0], outs[1])


def test_layerwise_evaluation_is_refused_where_its_activations_would_not_fit(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from gnnscale.data import node

    sage = partial(GraphSAGE, TINY.num_features, num_classes=5, hidden_channels=64)
    assert sage(num_layers=1).batch_request().layerwise_channels == 5  # the output alone
    assert sage(num_layers=2).batch_request().layerwise_channels == 64 + 5
    request = sage(num_layers=3).batch_request()
    assert request.layerwise_channels == 128  # the middle layer's input and output
    need = TINY.num_nodes * 128 * 4
    for available, mode, val_mode, refused in [
        (need + 1, "layerwise", None, None),
        (need - 1, "layerwise", None, "use --data.eval.mode=sampled$"),
        (need - 1, "sampled", "layerwise", "use --data.eval.val_mode=sampled$"),
        (need - 1, "layerwise", "layerwise", "mode=sampled and --data.eval.val_mode=sampled$"),
        (need - 1, "sampled", None, None),
    ]:
        memory = SimpleNamespace(available=available)
        monkeypatch.setattr(node.psutil, "virtual_memory", lambda m=memory: m)
        dm = NeighborDataModule(
            root=tmp_path,
            num_neighbors=[5, 3, 2],
            synthetic=TINY,
            eval=EvalArgs(mode, val_mode=val_mode),
        )
        dm.configure_batches(request)
        if refused is None:
            dm.setup("fit")
        else:
            with pytest.raises(
                ConfigError, match=rf"hold 0\.0 GiB .*3,000 nodes x 128 .*{refused}"
            ):
                dm.setup("fit")
    # Each process of the machine computes every node: two DDP ranks hold twice as much.
    dm = NeighborDataModule(root=tmp_path, num_neighbors=[5, 3, 2], synthetic=TINY)
    dm.configure_batches(request)
    dm.trainer = SimpleNamespace(num_devices=2, lightning_module=sage(num_layers=3))
    monkeypatch.setattr(node.psutil, "virtual_memory", lambda: SimpleNamespace(available=need + 1))
    with pytest.raises(ConfigError, match=r"\(2 processes x 3,000 nodes x 128 values"):
        dm.setup("test")


def test_prepare_refuses_to_overwrite_another_graph(tmp_path, tiny_prepared):
    same = write_graph(make_synthetic_graph(TINY), tiny_prepared, {"test": "tiny"})
    assert same == tiny_prepared  # already prepared from these settings: kept
    with pytest.raises(PreparedGraphError, match="prepared from other settings"):
        write_graph(make_synthetic_graph(TINY), tiny_prepared, {"test": "other"})


def test_a_second_prepare_is_refused_while_one_runs(tmp_path):
    out = tmp_path / "g"
    with atomic.locked(out):  # as a prepare of the same folder, running in another process
        with pytest.raises(ConfigError, match=f"g is being written by process {os.getpid()}"):
            write_graph(make_synthetic_graph(TINY), out, {"test": "tiny"})
    assert not out.exists() and atomic.leftovers(out) == []


def test_killed_prepare_leaves_nothing_prepared_and_is_redone(tmp_path):
    out = tmp_path / "g"
    argv = [
        sys.executable, "-m", "gnnscale.cli", "prepare", f"--out={out}", "--source=Synthetic",
        "--source.synthetic.num_nodes=3000000", "--source.synthetic.num_features=16",
        "--source.chunk_nodes=20000",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not any((tmp_path / p.name / "x.bin").exists() for p in tmp_path.glob(".g.partial-*")):
        assert proc.poll() is None and time.monotonic() < deadline, "prepare did not start"
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()  # nothing that looks prepared
    with pytest.raises(PreparedGraphError, match="not a folder"):
        PreparedGraph(out)
    cfg = SyntheticGraph(num_nodes=3000, num_features=16)
    PreparedGraph(write_streamed_synthetic(cfg, out, chunk_nodes=1000))  # redone, verified
    assert not list(tmp_path.glob(".g.partial-*"))  # the dead prepare's leftovers removed


# --- memory: the batch, not the graph --------------------------------------------------------


@pytest.mark.slow  # writes a 1 GiB feature file
def test_training_from_a_large_prepared_file_stays_out_of_private_memory(tmp_path):
    cfg = SyntheticGraph(num_nodes=2_000_000, avg_degree=5, num_features=128, train_fraction=0.01)
    folder = write_streamed_synthetic(cfg, tmp_path / "g", "float32", 1 << 18)
    file_mb = (folder / "x.bin").stat().st_size / 2**20
    assert file_mb >= 976  # 1e9 bytes
    code = f"""
import lightning as L
from gnnscale import GraphSAGE, NeighborDataModule
from gnnscale.data import EvalArgs
from gnnscale.measure import PeakRSS, anon_mb
start = anon_mb()
with PeakRSS(0.01, anon_mb) as peak:
    dm = NeighborDataModule(
        "prepared", {str(folder)!r}, [10, 5], 512, eval=EvalArgs(mode="sampled")
    )
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, limit_val_batches=5, limit_train_batches=20)
    trainer.fit(GraphSAGE(128, 10, hidden_channels=64), dm)
print("PRIVATE_MB", peak.peak_mb - start)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    private = float(done.stdout.split("PRIVATE_MB")[-1])
    assert private < file_mb / 3, (private, file_mb)


# --- processes and machines: torchrun ranks map one prepared folder ----------------------------

TORCHRUN_SCRIPT = """
import json, os, sys
import lightning as L
import torch
from gnnscale import GraphSAGE, NeighborDataModule
from gnnscale.data import EvalArgs

class UnequalShards(NeighborDataModule):
    # Test shards of 10 and 150 nodes, chosen from the trained model's own predictions so that
    # rank 0 is right on all of its nodes and rank 1 on a third of its: counts give 60 / 160.
    def test_dataloader(self):
        model, data = self.trainer.lightning_module.eval(), self.data
        loader = self._neighbor_loader(data, [-1, -1], input_nodes=data.test_mask, batch_size=4096)
        right, nodes = [], []
        with torch.no_grad():
            for b in loader:
                out = model(b.x, b.edge_index)[: b.batch_size].argmax(-1)
                right.append(out == b.y[: b.batch_size])
                nodes.append(b.n_id[: b.batch_size])
        right, nodes = torch.cat(right), torch.cat(nodes)
        hit, miss = nodes[right], nodes[~right]
        mine = hit[:10] if self.trainer.global_rank == 0 else torch.cat([hit[10:60], miss[:100]])
        return self._neighbor_loader(data, [-1, -1], input_nodes=mine, batch_size=4096)

folder, nodes = sys.argv[1], int(sys.argv[2])
L.seed_everything(0)
dm = UnequalShards("prepared", folder, [10, 10], 128, eval=EvalArgs(mode="sampled"))
model = GraphSAGE(32, 5, hidden_channels=32)
common = dict(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]), num_nodes=nodes,
              strategy="ddp", logger=False, enable_progress_bar=False, enable_model_summary=False)
trainer = L.Trainer(max_epochs=3, enable_checkpointing=False, **common)
trainer.fit(model, dm)
steps = trainer.global_step
# Testing on the shards as given: no DistributedSampler splitting them again.
(result,) = L.Trainer(use_distributed_sampler=False, **common).test(model, dm, verbose=False)
if trainer.global_rank == 0:
    print("RESULT", json.dumps({**result, "steps": steps, "world": trainer.world_size}))
# Every rank done with every collective before any tears its process group down (one CI run's
# rank 0 aborted at exit, "terminate called without an active exception", after testing).
torch.distributed.barrier()
torch.distributed.destroy_process_group()
"""


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


@pytest.mark.slow
@pytest.mark.parametrize("machines", [1, 2], ids=["2 ranks on one machine", "2 machines"])
def test_torchrun_ranks_train_from_one_prepared_folder(tmp_path, tiny_prepared, machines):
    """``torchrun`` (no fork: each rank opens the folder itself) on one machine, or as two
    launchers rendezvousing on 127.0.0.1 as two machines would; accuracy from counts."""
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SCRIPT)
    port = str(29400 + os.getpid() % 500 + machines)
    if machines == 1:
        launches = [_torchrun("--nproc_per_node=2", f"--master_port={port}", str(script))]
    else:
        launches = [
            _torchrun(
                "--nnodes=2", f"--node_rank={rank}", "--nproc_per_node=1",
                "--master_addr=127.0.0.1", f"--master_port={port}", str(script),
            )
            for rank in (0, 1)
        ]  # fmt: skip
    procs = [
        subprocess.Popen(
            [*argv, str(tiny_prepared), str(machines)],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # a crash prints every thread's stack
        )
        for argv in launches
    ]  # fmt: skip
    outputs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err[-3000:]
    lines = [line for out, _ in outputs for line in out.splitlines()]
    line = next(line for line in lines if line.startswith("RESULT"))
    result = json.loads(line.removeprefix("RESULT"))
    assert result["world"] == 2
    # Trained: 3 epochs of 900 training nodes in batches of 128, split over 2 ranks.
    assert result["steps"] == 3 * math.ceil(math.ceil(900 / 2) / 128)
    counts, mean_of_ranks = 60 / 160, (10 / 10 + 50 / 150) / 2
    assert result["test/acc"] == pytest.approx(counts, abs=1e-6), (result, mean_of_ranks)


ROOMY = SyntheticGraph(num_nodes=5000, avg_degree=12, num_features=32, num_classes=5)


def test_prepare_refuses_a_disk_without_room_before_writing(tmp_path, monkeypatch):
    written = PreparedGraph(write_streamed_synthetic(ROOMY, tmp_path / "g", "bfloat16"))
    expected = writing._size(5000, math.ceil(5000 * 12.0), 32, "bfloat16")
    assert abs(expected / written.nbytes - 1) < 0.1  # the arithmetic the check relies on
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(atomic.shutil, "disk_usage", lambda path: usage._replace(free=1 << 26))
    with pytest.raises(PreparedGraphError, match=r"--out .*h: the prepared graph needs about "):
        write_streamed_synthetic(ROOMY, tmp_path / "h", "bfloat16")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g"]  # nothing written, no lock file


FULL_DISK = """
import resource, signal, sys
from pathlib import Path
import torch
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
from gnnscale import SyntheticGraph
from gnnscale.checkpoint import StreamingCheckpointIO
from gnnscale.errors import GnnscaleError
from gnnscale.data.synthetic import write_streamed_synthetic
folder = Path(sys.argv[1])
StreamingCheckpointIO().save_checkpoint({"w": torch.ones(10)}, folder / "last.ckpt")
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))  # as a disk that fills
for write in (
    lambda: write_streamed_synthetic(
        SyntheticGraph(num_nodes=5000, avg_degree=12, num_features=32, num_classes=5),
        folder / "g",
    ),
    lambda: StreamingCheckpointIO().save_checkpoint({"w": torch.ones(10**5)}, folder / "last.ckpt"),
):
    try:
        write()
    except GnnscaleError as err:
        print(err)
"""


def test_a_disk_that_fills_leaves_one_line_and_nothing_half_written(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    prepare, save = done.stdout.splitlines()
    assert prepare == (
        f"--out {tmp_path / 'g'}: the disk filled while preparing (File too large); nothing was "
        "left behind: free space there or choose another --out"
    )
    assert save.startswith(f"no room to save the checkpoint {tmp_path / 'last.ckpt'} (File too")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    assert torch.load(tmp_path / "last.ckpt")["w"].shape == (10,)  # the earlier one, intact


def test_the_planners_batch_size_advice_samples_a_prepared_graph_as_it_trains(tiny_prepared):
    """The mean batch that ``gnnscale plan``'s advice sizes is sampled by the DataModule's own
    sampler: from a prepared folder, the same batches as in memory (it sampled seeds alone,
    the folder's ``edge_index`` being empty), and the run's random stream is left alone."""

    def mean_nodes(dataset, root):
        dm = NeighborDataModule(
            dataset, root, [5, 3], 64, synthetic=TINY, eval=EvalArgs(mode="sampled")
        )
        dm.configure_batches(BatchRequest(num_layers=2))
        torch.manual_seed(1)
        mean = dm._mean_nodes(64, [5, 3])
        return mean, torch.rand(1)

    (disk, after_disk), (memory, after_memory) = (
        mean_nodes("prepared", tiny_prepared),
        mean_nodes("synthetic", tiny_prepared.parent),
    )
    assert disk == memory > 64 * 4
    assert torch.equal(after_disk, after_memory)
    torch.manual_seed(1)
    assert torch.equal(after_disk, torch.rand(1))
