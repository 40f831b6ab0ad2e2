"""gnnscale._compat: each private name of torch, PyG and Lightning is still where it was read.

A release that moves one fails here, naming it, rather than somewhere deep in a fit.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader
from torch_geometric.data import Data
from torch_geometric.datasets import FakeDataset
from torch_geometric.sampler import NodeSamplerInput, SamplerOutput
from torch_geometric.testing import MyGraphStore

from gnnscale import _compat
from gnnscale.testing import quiet_trainer

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("owner", "name", "params"),
    _compat.OVERRIDDEN,
    ids=[f"{owner.__name__}.{name}" for owner, name, _ in _compat.OVERRIDDEN],
)
def test_each_private_method_handed_on_is_where_it_was_read(owner, name, params):
    method = getattr(owner, name, None)
    assert method is not None, f"{owner.__qualname__}.{name} is gone"
    assert tuple(inspect.signature(method).parameters)[1:] == params


@pytest.mark.filterwarnings("ignore:Using '.*' without a 'pyg-lib' installation")
def test_pygs_public_calls_reach_the_names_handed_on():
    called = []

    class Sampler(_compat.NeighborSampler):
        def sample_seeds(self, seed, seed_time=None, **kwargs):
            called.append("sample_seeds")
            return super().sample_seeds(seed, seed_time, **kwargs)

        def pyg_sample_seeds(self, seed, seed_time=None, **kwargs):
            called.append("pyg_sample_seeds")  # PyG's backend may be absent here
            empty = torch.empty(0, dtype=torch.long)
            return SamplerOutput(node=seed, row=empty, col=empty, edge=None)

    data = Data(edge_index=torch.tensor([[0, 1, 2], [1, 2, 0]]), num_nodes=3)
    sampler = Sampler(data, [2])
    out = sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=torch.tensor([0])))
    assert out.node.tolist() == [0]
    assert called == ["sample_seeds", "pyg_sample_seeds"]

    class Clusters(_compat.ClusterData):
        def cluster_nodes(self, edge_index, num_nodes):
            called.append("cluster_nodes")
            return torch.arange(num_nodes) % 2

    Clusters(data, num_parts=2, log=False)
    assert called[-1] == "cluster_nodes"

    class Store(_compat.GraphStore, MyGraphStore):
        def edge_layout(self, attr, layout, store=False):
            called.append("edge_layout")
            return super().edge_layout(attr, layout, store)

    graph = Store()
    graph.put_edge_index(data.edge_index, edge_type=None, layout="coo", size=(3, 3))
    row, colptr, _ = graph.csc()  # PyG orders it so
    assert called[-1] == "edge_layout"
    assert colptr.tolist() == [0, 1, 2, 3] and sorted(row.tolist()) == [0, 1, 2]


def test_lightnings_cli_runs_its_subcommand_through_the_names_handed_on(tmp_path):
    called = []

    class CLI(_compat.LightningCLI):
        def subcommand_kwargs(self, subcommand):
            called.append(("subcommand_kwargs", subcommand))
            return super().subcommand_kwargs(subcommand)

        def run_subcommand(self, subcommand):
            called.append(("run_subcommand", subcommand))
            super().run_subcommand(subcommand)

    args = ["fit", "--trainer.fast_dev_run=1", "--trainer.logger=false"]
    args += ["--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}"]
    CLI(BoringModel, BoringDataModule, args=args, save_config_kwargs={"overwrite": True})
    assert called == [("run_subcommand", "fit"), ("subcommand_kwargs", "fit")]


def test_lightnings_step_count_and_logger_state_read_as_they_are(tmp_path):
    logger = CSVLogger(tmp_path)
    assert not _compat.logger_opened(logger)
    trainer = quiet_trainer(
        max_epochs=1, limit_train_batches=3, limit_val_batches=0, logger=logger, log_every_n_steps=1
    )
    trainer.fit(BoringModel())
    assert _compat.batches_that_stepped(trainer) == 3
    assert _compat.logger_opened(logger)
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert _compat.saved_batches_that_stepped(saved) == 3
    assert _compat.saved_batches_that_stepped({}) is None
    spawned = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False)
    assert isinstance(spawned.strategy.launcher, _compat.MultiProcessingLauncher)


def test_torchs_private_tensor_and_module_helpers_work_as_read():
    indices, values = torch.tensor([[1, 0, 1]]), torch.tensor([1.0, 2.0, 3.0])
    coo = torch.sparse_coo_tensor(indices, values, (2,), check_invariants=False)
    indices, values = _compat.coo_parts(coo)  # uncoalesced: as stored, duplicates kept
    assert indices.tolist() == [[1, 0, 1]] and values.tolist() == [1.0, 2.0, 3.0]

    assert _compat.shared_storage(torch.zeros(1), 16).is_shared()

    module = torch.nn.Linear(2, 2)
    module.register_forward_hook(lambda m, args, out: None)
    module.register_forward_hook(lambda m, args, kwargs, out: None, with_kwargs=True)
    assert [with_kwargs for _, with_kwargs in _compat.forward_hooks(module)] == [False, True]

    seen = []

    class Sub(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(func)
            with _compat.disable_torch_function_subclass():
                return func(*args, **(kwargs or {}))

    out = torch.ones(2).as_subclass(Sub) + 1
    assert seen and type(out) is torch.Tensor  # called, and the result left plain

    ops = []

    class Ops(_compat.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(func)
            return func(*args, **(kwargs or {}))

    with Ops():
        torch.ones(2) + 1
    assert ops


def test_a_persistent_loaders_workers_and_a_datasets_collated_graphs():
    loader = DataLoader(range(4), num_workers=1, persistent_workers=True)
    assert _compat.worker_processes(loader) == []
    list(loader)
    (worker,) = _compat.worker_processes(loader)
    assert worker.is_alive()
    del loader

    dataset = FakeDataset(num_graphs=3, avg_num_nodes=5)
    collated = _compat.in_memory_data(dataset)
    assert collated.num_nodes == sum(graph.num_nodes for graph in dataset)


# What would touch a private name of torch, PyG or Lightning directly.
PRIVATE = re.compile(
    r"\._sample\(|\._metis\b|\._edge_to_layout\b|\._run_subcommand\b|\._prepare_subcommand_kwargs"
    r"|\b_batches_that_stepped|\b_experiment\b|\._forward_hooks|\._indices\(\)|\._values\(\)"
    r"|_new_shared|torch\._C\b|_MultiProcessingLauncher|_python_dispatch|\._iterator\b|\._data\b"
    r"|\b_PATH\b|\._key\b|\._get\("
)


def test_no_module_but_compat_touches_those_names():
    own = {ROOT / "gnnscale" / "_compat.py", Path(__file__).resolve()}
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for folder in ("gnnscale", "tests", "benchmarks", "recipes", "notebooks")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path not in own
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if PRIVATE.search(line)
    ]
    assert not found, "\n".join(found)
