import math
import re
import subprocess
import sys
from dataclasses import replace

import lightning as L
import numpy as np
import psutil
import pytest
import torch
from registry import recipe

from gnnscale import GraphSAGE, HeteroNeighborDataModule, make_synthetic_graph, stores
from gnnscale._compat import in_memory_data
from gnnscale.cli import Trainer, main
from gnnscale.data.many_graphs import AtomGraphs, prepare_graphs
from gnnscale.errors import ConfigError
from gnnscale.plan import _suggest, format_plan
from gnnscale.stores.writing import write_graph
from gnnscale.testing import TINY, TINY_ARGS

NEIGHBOR = ["--config", str(recipe("neighbor_sage").config)]
# Runs a recipe command (Recipe.argv) and prints the peak resident memory of its process.
RUNNER = """
import runpy, sys
from gnnscale.measure import peak_rss_mb
entry, *sys.argv[1:] = sys.argv[1:]
if entry == "-m":
    module, *sys.argv[1:] = sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
else:
    sys.argv[0] = entry
    runpy.run_path(entry, run_name="__main__")
print("PEAK", peak_rss_mb())
"""


def _plan(tmp_path, *extra):
    args = ["plan", *NEIGHBOR, *TINY_ARGS, f"--data.root={tmp_path}", "--num_batches=3", *extra]
    cli = main([*args, "--data.loader.num_workers=0", "--data.loader.persistent_workers=false"])
    return cli.trainer.memory_plan


def _mib(label, report):
    return float(re.search(label + r"\s+([\d,.]+)", report).group(1).replace(",", ""))


def _plan_and_fit(tmp_path, name, *args):
    """The printed plan and the measured peak of ``fit``, each in a fresh process."""
    out = {}
    for command in ("plan", "fit"):
        python, *rest = recipe(name).argv(command, *args)
        done = subprocess.run(
            [python, "-c", RUNNER, *rest], capture_output=True, text=True, cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr[-3000:]
        out[command] = done.stdout + done.stderr
    return out["plan"], _mib("PEAK", out["fit"])


def test_plan_counts_each_hop_and_adds_up(tmp_path):
    plan = _plan(tmp_path, "--data.batch_size=64")
    assert len(plan.batches) == 3
    for batch in plan.batches:
        # seeds, then the new nodes of each of the two hops; together every node of the batch
        assert len(batch.hop_nodes) == 3
        assert batch.hop_nodes[0] == 64
        assert batch.hop_nodes[1] <= 64 * 15
        assert sum(batch.hop_nodes) == batch.nodes
        assert batch.saved_mb > batch.feature_mb > 0
    assert plan.base_mb > plan.graph_mb > 0
    after_training = plan.resident_mb + max(plan.eval_mb, plan.checkpoint_mb)
    assert plan.peak_mb == pytest.approx(
        plan.growth_mb + max(plan.base_mb + plan.train_mb, after_training)
    )
    assert not plan.suggestions  # no budget given


def test_plan_counts_the_batches_each_process_draws(tmp_path):
    whole = _plan(tmp_path, "--data.batch_size=64").batches_per_epoch
    assert whole > 4
    # Data-parallel: each of the two processes draws half of the epoch's batches.
    ddp = _plan(tmp_path, "--data.batch_size=64", "--trainer.devices=2")
    assert ddp.batches_per_epoch == math.ceil(whole / 2)
    limited = _plan(tmp_path, "--data.batch_size=64", "--trainer.limit_train_batches=3")
    assert limited.batches_per_epoch == 3
    half = _plan(tmp_path, "--data.batch_size=64", "--trainer.limit_train_batches=0.5")
    assert half.batches_per_epoch == whole // 2


def _plan_in_new_process(tmp_path, *extra):
    """The printed report of ``gnnscale plan``, run as a user would: RSS starts afresh."""
    args = [*NEIGHBOR, *TINY_ARGS, f"--data.root={tmp_path}", "--num_batches=3", *extra]
    args += ["--data.loader.num_workers=0", "--data.loader.persistent_workers=false"]
    done = subprocess.run(
        [sys.executable, "-m", "gnnscale.cli", "plan", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    report = done.stdout + done.stderr
    assert "args parameter is intended" not in report  # the command passes no args to the CLI

    def mib(label):
        return float(re.search(label + r"\s+([\d,]+) MiB", report).group(1).replace(",", ""))

    tips = re.findall(r"to fit the budget: (.*)", report)
    return {"base": mib("base after setup"), "train": mib("training step"), "tips": tips}


@pytest.mark.slow
def test_budget_suggestion_fits_when_planned_again(tmp_path):
    big = ("--data.batch_size=256", "--model.init_args.hidden_channels=1024")
    sampled = "--data.eval.mode=sampled"
    plan = _plan_in_new_process(tmp_path, *big, sampled)
    budget_mb = plan["base"] + plan["train"] / 3
    tight = _plan_in_new_process(tmp_path, *big, sampled, f"--budget_gb={budget_mb / 1024}")
    (tip,) = [t for t in tight["tips"] if t.startswith("--data.batch_size")]
    assert int(re.search(r"batch_size=(\d+)", tip).group(1)) < 256
    # The suggested settings, planned again in a new process, fit the budget.
    args = [a for a in tip.replace(", ", ",").split(" ")]
    smaller = _plan_in_new_process(tmp_path, *big, sampled, *args)
    assert smaller["base"] + smaller["train"] <= budget_mb * 1.1


def test_plan_refuses_an_unknown_option(tmp_path):
    with pytest.raises(ConfigError, match="batch_sise is not an option .* did you mean"):
        main(["plan", *NEIGHBOR, "--data.batch_sise=64"])


def test_plan_refuses_a_dataset_too_large_for_the_machine_before_downloading_it(
    tmp_path, monkeypatch
):
    machine = psutil.virtual_memory()._replace(total=2**30)  # a 1-GiB machine
    monkeypatch.setattr(psutil, "virtual_memory", lambda: machine)
    root = tmp_path / "data"
    root.mkdir()
    plan = ["plan", *NEIGHBOR, f"--data.root={root}"]
    with pytest.raises(ConfigError) as refused:
        main([*plan, "--data.dataset=ogbn-products"])
    assert str(refused.value) == (
        "--data.dataset ogbn-products alone takes about 2.8 GiB (2,449,029 nodes x 100 float32 "
        "features, 123,718,280 edges) and this machine has 1.0 GiB: prepare it on disk "
        "(`gnnscale prepare --source Ogb --source.name ogbn-products --source.root "
        f"{root} --out DIR`, from OGB's download unpacked there: docs/stores.md) and train or "
        "plan with --data.dataset prepared --data.root DIR"
    )
    with pytest.raises(ConfigError, match=r"Reddit alone takes about 2\.2 GiB .*stores\.save_npy"):
        main([*plan, "--data.dataset=Reddit"])
    assert not any(root.iterdir())  # nothing downloaded
    # The same arithmetic refuses a generated graph; a prepared one is mapped, never refused.
    with pytest.raises(ConfigError, match="the generated graph alone takes about 4.1 GiB"):
        main([*plan, "--data.synthetic.num_nodes=10000000", "--data.synthetic.avg_degree=2"])
    with pytest.raises(ConfigError, match="manifest.json is missing"):
        main([*plan, "--data.dataset=prepared", "--data.eval.mode=sampled"])


# Large enough that the step, not the Python process, makes up a good part of the peak (layers
# compute only the rows the next one reads, so it takes wide layers and large batches).
STEP_DOMINATES = ["--data.batch_size=4096", "--data.num_neighbors=[25, 15]"]
# Small training batches, evaluation over full two-hop neighbourhoods of 8,192 seeds each.
EVAL_DOMINATES = [
    "--data.batch_size=256",
    "--data.num_neighbors=[10, 5]",
    "--data.eval.num_neighbors=[-1, -1]",
    "--data.eval.batch_size=8192",
]

# Layer-wise evaluation: whole-graph buffers of N x 2048 per layer.
LAYERWISE_DOMINATES = ["--data.batch_size=256", "--data.num_neighbors=[10, 5]"]
DOMINANT = {
    "training": ["--data.eval.mode=sampled", *STEP_DOMINATES],
    "evaluation": ["--data.eval.mode=sampled", *EVAL_DOMINATES],
    "layerwise evaluation": ["--data.eval.mode=layerwise", *LAYERWISE_DOMINATES],
}


@pytest.mark.slow
@pytest.mark.parametrize("dominant", list(DOMINANT))
def test_plan_predicts_the_measured_peak_within_25_percent(tmp_path, dominant):
    args = [
        *TINY_ARGS,
        "--data.synthetic.num_nodes=40000",
        "--data.synthetic.train_fraction=0.3",
        "--model.init_args.hidden_channels=2048",
        *DOMINANT[dominant],
        f"--data.root={tmp_path}",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--trainer.max_epochs=1",
    ]
    report, measured = _plan_and_fit(tmp_path, "neighbor_sage", *args)
    planned, base = _mib("expected peak", report), _mib("base after setup", report)
    train, evaluation = _mib("training step", report), _mib("evaluation", report)
    assert (train > evaluation) == (dominant == "training"), (train, evaluation)
    assert planned - base > 0.3 * measured, "the test graph should make the step matter"
    assert abs(planned / measured - 1) <= 0.25, (planned, measured)


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint_io", ["streaming", "lightning"])
def test_plan_counts_saving_and_loading_a_large_embedding_table(tmp_path, checkpoint_io):
    # sparse_embeddings with a 500k x 128 table: 244 MiB, 732 MiB with its SparseAdam moments.
    # Lightning's own CheckpointIO holds a second copy of all of it while it saves; gnnscale's
    # streams it to disk and, loading the best checkpoint for the test, reads only the table.
    extra = [
        "--data.synthetic.num_nodes=500000",
        "--model.init_args.embedding_dim=128",
        "--data.batch_size=512",
        "--data.num_neighbors=[5, 5]",
        "--data.eval.batch_size=1024",
        "--trainer.precision=32",
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=20",
        "--trainer.limit_val_batches=3",
        "--trainer.limit_test_batches=3",
        "--data.loader.num_workers=0",
        "--data.loader.persistent_workers=false",
        f"--data.root={tmp_path / 'data'}",
        f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
    ]
    if checkpoint_io == "lightning":
        extra.append("--trainer.plugins=lightning.fabric.plugins.TorchCheckpointIO")
    report, measured = _plan_and_fit(tmp_path, "sparse_embeddings", *extra)
    part = {k: _mib(k, report) for k in ("base after setup", "training step", "expected peak")}
    resident, checkpoint = (
        _mib("resident after steps", report),
        _mib(r"checkpoint save\+load", report),
    )
    table_mb = 500_000 * 128 * 4 / 2**20
    if checkpoint_io == "lightning":
        assert checkpoint > 2.5 * table_mb, report
        after_training = resident + checkpoint
        assert after_training > part["base after setup"] + part["training step"], "save sets peak"
    else:
        assert checkpoint < 1.5 * table_mb, report
    assert abs(part["expected peak"] / measured - 1) <= 0.25, (part, measured)


def test_plan_refuses_a_datamodule_it_does_not_model():
    trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False)
    with pytest.raises(ConfigError, match="LightningDataModule is not one of them"):
        trainer.plan(GraphSAGE(8, 2), L.LightningDataModule())


def _store(folder, num_graphs):
    """A graph store as ``gnnscale prepare-graphs`` writes it (many_graphs_on_disk's input)."""
    return prepare_graphs(out=folder, atoms=AtomGraphs(num_graphs=num_graphs), chunk_graphs=500)


def _tiny(name, tmp_path):
    """A recipe's tiny settings in ``tmp_path``, its data prepared first if it needs that."""
    args = [*recipe(name).tiny, f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}"]
    if name == "many_graphs_on_disk":
        args.append(f"--data.init_args.root={_store(tmp_path / 'graphs', 300)}")
    return args


@pytest.mark.parametrize(
    "name,eval_mode",
    [
        pytest.param("link_prediction_pinsage", "ranking"),
        pytest.param("hetero_node_classification", "sampled"),
        ("many_graphs_on_disk", "batches"),
    ],
)
def test_plan_measures_link_and_graph_batches_and_their_evaluation(tmp_path, name, eval_mode):
    config = ["--config", str(recipe(name).config), "--trainer.accelerator=cpu"]
    cli = main(["plan", *config, *_tiny(name, tmp_path), "--num_batches=3"])
    plan = cli.trainer.memory_plan
    assert len(plan.batches) == 3
    for batch in plan.batches:
        assert batch.nodes > batch.edges / 20 > 0
        assert batch.saved_mb > 0  # the training step ran, under the saved-tensor probe
        assert not batch.hop_nodes  # hops are counted for homogeneous neighbour batches only
    assert plan.eval_mode == eval_mode
    assert plan.eval_mb > 0 and plan.train_mb > 0 and plan.model_mb > 0
    after_training = plan.resident_mb + max(plan.eval_mb, plan.checkpoint_mb)
    assert plan.peak_mb == pytest.approx(
        plan.growth_mb + plan.mapped_mb + max(plan.base_mb + plan.train_mb, after_training)
    )
    # A budget with room for half the step: a batch size about half as large.
    budget = plan.base_mb + plan.growth_mb + plan.train_mb / 2
    (tip,) = [
        t
        for t in _suggest(cli.datamodule.memory_profile(), plan, budget)
        if t.startswith("--data.batch")
    ]
    size = int(re.search(r"batch_size=(\d+)", tip).group(1))
    assert size <= cli.datamodule.batch_size / 2
    (tip,) = _suggest(cli.datamodule.memory_profile(), plan, plan.base_mb / 2)
    assert "use a larger machine" in tip and "preprocess" not in tip  # no such flag here
    if name != "many_graphs_on_disk":
        # Items carry features (users and categories learn embeddings): x of every node type.
        assert all(b.feature_mb > 0 for b in plan.batches)
        assert plan.base_mb > plan.graph_mb > 0  # the graph (and its splits), in memory
    else:
        # many_graphs_on_disk as shipped: 2 DDP processes, each drawing half of the batches.
        train_batches = len(cli.datamodule.train_dataloader())
        assert plan.batches_per_epoch == math.ceil(train_batches / 2)
        assert plan.graph_mb == 0  # the store stays on disk
        # ... but LMDB maps its file: counted whole, as the on-disk graphs' files are.
        store = cli.datamodule.store.path
        assert store.suffix == ".mdb" and plan.mapped_mb == store.stat().st_size / 2**20 > 0


def test_plan_counts_graphs_read_into_memory(tmp_path):
    config = ["--config", str(recipe("many_graphs_on_disk").config), "--trainer.accelerator=cpu"]
    args = [*_tiny("many_graphs_on_disk", tmp_path), "--num_batches=2"]
    memory = main(["plan", *config, *args, "--data.init_args.storage=memory"])
    held = memory.datamodule.graphs
    nbytes = sum(v.numel() * v.element_size() for v in in_memory_data(held).to_dict().values())
    assert memory.trainer.memory_plan.graph_mb >= nbytes / 2**20 > 0


def _sized_args(name, tmp_path):
    """Small runs where the training step and evaluation are each a good part of the peak."""
    common = [
        "--data.init_args.loader.num_workers=0",
        "--data.init_args.loader.persistent_workers=false",
        "--trainer.max_epochs=1",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    if name == "link_prediction_pinsage":
        # 12k users x 12k items: ranking every item for 4,096 users at a time is 190 MiB of
        # scores per chunk, and training batches of 1,024 edges sample about 22k nodes, nearly
        # every node, so a larger batch barely grows the step: the width does. At 256 channels
        # the step was 213-250 MiB of a 1.2 GiB peak, below the 20% asserted on one CI machine;
        # at 384 it is 390-413 of 1.27-1.37 GiB.
        return [
            *common,
            "--data.init_args.synthetic.num_users=12000",
            "--data.init_args.synthetic.num_items=12000",
            "--data.init_args.synthetic.num_categories=100",
            "--data.init_args.synthetic.num_communities=20",
            "--data.init_args.synthetic.interactions_per_user=10",
            "--data.init_args.batch_size=1024",
            "--model.init_args.hidden_channels=384",
            "--trainer.limit_train_batches=6",
        ]
    if name == "hetero_node_classification":
        # 20k users x 10k items, wide layers: batches of 2,048 items sample about 60k nodes.
        return [
            *common,
            "--data.init_args.synthetic.num_users=20000",
            "--data.init_args.synthetic.num_items=10000",
            "--data.init_args.batch_size=2048",
            "--data.init_args.eval.batch_size=4096",
            # 384: the first layer averages raw features before the input layer, a smaller
            # step than projecting every row (at 256 the step was under 30% of the peak)
            "--model.init_args.hidden_channels=384",
            "--trainer.limit_train_batches=6",
        ]
    # One process (the test measures the process it starts); wide layers over 256 graphs; one
    # epoch: bf16 on CPU keeps memory per batch shape for a few hundred batches, unplanned.
    return [
        *common,
        f"--data.init_args.root={_store(tmp_path / 'graphs', 3000)}",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.strategy=auto",
        "--data.init_args.batch_size=256",
        "--data.init_args.split.val_fraction=0.1",
        "--data.init_args.split.test_fraction=0.1",
        "--model.init_args.hidden_channels=512",
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        pytest.param("link_prediction_pinsage"),
        pytest.param("hetero_node_classification"),
        "many_graphs_on_disk",
    ],
)
def test_plan_predicts_link_and_graph_peaks_within_25_percent(tmp_path, name):
    report, measured = _plan_and_fit(tmp_path, name, *_sized_args(name, tmp_path))
    planned, base = _mib("expected peak", report), _mib("base after setup", report)
    train, evaluation = _mib("training step", report), _mib("evaluation", report)
    # Neither part may be left out where it is a good part of the run's peak: link evaluation
    # embeds every node and ranks every item. Sampled evaluation without autograd mostly fits in
    # the memory the training steps freed (graph-level batches: 37 MiB of 1,033 above it in one
    # CI run, 0 in one of nine runs here; hetero node batches 5 MiB of 752 on a CPU with bf16
    # kernels), so there it only has to be planned: the report has its line (_mib reads it).
    assert train > 0.2 * measured, report
    if name == "link_prediction_pinsage":
        assert evaluation > 0.2 * measured, report
    assert planned - base > 0.3 * measured, "the test should make the step matter"
    print(f"{name}: planned {planned:,.0f} MiB, measured {measured:,.0f} MiB")  # shown with -rA
    assert abs(planned / measured - 1) <= 0.25, (planned, measured)


def test_a_plan_from_a_prepared_folder_advises_only_what_applies_to_one(tmp_path):
    """A prepared folder refuses --data.preprocess: the plan's advice for a budget the data
    alone exceeds names the prepare-time setting instead; its features are mapped, not held."""
    folder = write_graph(make_synthetic_graph(TINY), tmp_path / "g", {"test": "plan"})
    args = [*NEIGHBOR, "--data.dataset=prepared", f"--data.root={folder}", "--num_batches=2"]
    args += ["--data.eval.mode=sampled", "--data.batch_size=256"]
    cli = main(["plan", *args, f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}"])
    plan = cli.trainer.memory_plan
    assert plan.graph_mb == 0 and plan.mapped_mb > 0
    (tip,) = _suggest(cli.datamodule.memory_profile(), plan, plan.base_mb / 2)
    assert "--feature_dtype bfloat16" in tip and "--data.preprocess" not in tip


def test_plan_of_a_prepared_store_reports_private_memory_apart_from_the_mapped_files(tmp_path):
    """The hetero recipe planned on its graph prepared to a store: the store's files are page
    cache the kernel may drop, so the report gives the private peak on its own line."""
    from test_hetero import TINY as RECOMMENDER

    memory = HeteroNeighborDataModule(synthetic=RECOMMENDER)
    items = memory.data["item"]
    items.x = torch.randn(items.num_nodes, 4096)  # 16 MB of mapped features, above the noise
    folder = stores.save_npy(memory.data, tmp_path / "npy")
    store = stores.prepare_npy(folder, tmp_path / "store")
    in_place = np.load(folder / "nodes" / "item" / "x.npy", mmap_mode="r").nbytes  # not copied
    files_mb = (sum(p.stat().st_size for p in store.rglob("*.bin")) + in_place) / 2**20
    config = ["--config", str(recipe("hetero_node_classification").config)]
    config += ["--trainer.accelerator=cpu", "--data.init_args.dataset=prepared"]
    config += [f"--data.init_args.root={store}", "--data.init_args.batch_size=128"]
    config += ["--data.init_args.loader.num_workers=0", "--num_batches=3"]
    config += ["--data.init_args.loader.persistent_workers=false"]

    plan = main(["plan", *config]).trainer.memory_plan
    text = format_plan(plan)
    assert plan.graph_mb == 0 and files_mb > 15
    assert plan.mapped_mb == pytest.approx(files_mb, rel=0.05)
    assert plan.private_mb == pytest.approx(plan.peak_mb - plan.mapped_mb)
    assert _mib("private peak", text) == pytest.approx(plan.private_mb, abs=1)
    assert _mib("mapped graph files", text) == pytest.approx(plan.mapped_mb, abs=1)
    assert "private peak" not in format_plan(replace(plan, mapped_mb=0.0))  # nothing mapped


def test_the_advice_puts_the_step_first_and_names_no_setting_already_made():
    """`gnnscale plan --budget_gb 2` of a fan-out [-1, -1] on a graph of degree 200 (its measured
    figures below) advised evaluation, then a checkpoint of 0 MiB, before the training step
    that set the peak: with the steps' own leftovers over the budget, only the step is named."""
    from gnnscale.memory import MemoryProfile
    from gnnscale.plan import BatchStats, MemoryPlan

    def smaller(max_nodes, mean_nodes):
        return f"--data.batch_size={int(1024 * max_nodes / mean_nodes)}"

    profile = MemoryProfile(100.0, "sampled", smaller, eval_fix="use the evaluation's fix")
    measured = MemoryPlan(
        base_mb=1550, graph_mb=588, model_mb=1, train_mb=2363, resident_mb=2198, eval_mb=360,
        checkpoint_mb=0, peak_mb=4359, growth_mb=447, mapped_mb=0,
        batches=[BatchStats(200_000, 22_500_000, [], 75.0, 434.0)], batches_per_epoch=20,
        eval_mode="sampled",
    )  # fmt: skip
    (tip,) = _suggest(profile, measured, 2048)
    assert tip.startswith("--data.batch_size=")
    # A step that fits, an evaluation that does not: evaluation is named, a free checkpoint not.
    fits = replace(measured, train_mb=500)
    assert _suggest(profile, fits, 2198 + 447 + 100) == [
        "evaluation (sampled) needs 360 MiB: use the evaluation's fix"
    ]


@pytest.mark.parametrize(
    ("mode", "val_mode", "fix"),
    [
        ("layerwise", None, "use --data.eval.mode=sampled "),
        ("layerwise", "sampled", "use --data.eval.mode=sampled "),
        ("sampled", "full", "use --data.eval.val_mode=sampled "),
        ("sampled", None, "lower --data.eval.batch_size (now 4,096) or the evaluation's fan-out"),
    ],
)
def test_the_evaluation_advice_names_a_mode_not_already_set(mode, val_mode, fix):
    from gnnscale import NeighborDataModule
    from gnnscale.data import EvalArgs

    dm = NeighborDataModule("synthetic", eval=EvalArgs(mode=mode, val_mode=val_mode))
    assert dm._eval_fix().startswith(fix)
