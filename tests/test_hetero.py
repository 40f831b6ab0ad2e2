"""Node classification on a heterogeneous graph: HeteroNeighborDataModule and HeteroSAGE."""

import dataclasses
import functools
import json
import sys

import lightning as L
import pytest
import torch
from registry import recipe

from gnnscale import HeteroNeighborDataModule, HeteroSAGE, SyntheticRecommender
from gnnscale.cli import main
from gnnscale.data.args import EvalArgs, NodeSplit
from gnnscale.data.resume import ResumableLoader
from gnnscale.errors import ConfigError
from gnnscale.handshake import BatchRequest
from gnnscale.measure import read_metrics
from gnnscale.testing import centroid_accuracy, quiet_trainer, run_or_show_stacks

# 8 classes; features alone reach about 0.4 (the nearest centroid), the graph much more.
TINY = SyntheticRecommender(
    num_users=2000,
    num_items=1000,
    num_categories=40,
    num_communities=8,
    interactions_per_user=10,
    feature_noise=4.0,
)
RATES, REV_RATES = ("user", "rates", "item"), ("item", "rev_rates", "user")
IN, REV_IN = ("item", "in", "category"), ("category", "rev_in", "item")


def _dm(**kwargs):
    kwargs.setdefault("synthetic", TINY)
    kwargs.setdefault("batch_size", 128)
    return HeteroNeighborDataModule(**kwargs)


def _model(dm, **kwargs):
    """A HeteroSAGE built for ``dm``'s graph (what the CLI links)."""
    return HeteroSAGE(dm.num_classes, dm.graph_spec, **kwargs)


def _in_degree(dm, edge_type):
    dst_type = edge_type[2]
    return torch.bincount(dm.data[edge_type].edge_index[1], minlength=dm.num_nodes[dst_type])


def test_per_edge_type_fanouts_are_respected():
    # Different numbers per edge type and per hop: a loader giving every type one list fails.
    fanout = {
        "user__rates__item": [4, 1],
        "category__rev_in__item": [2, 1],
        "item__rev_rates__user": [9, 3],
        "item__in__category": [9, 5],
    }
    dm = _dm(num_neighbors=fanout, batch_size=64)
    batch = next(iter(dm.train_dataloader()))
    # Seeds are items, expanded at hop 0 over the relations into items; users and categories
    # are reached only at hop 1 and expanded there. Without replacement, each node gets
    # min(fan-out, its in-degree) edges of each relation into it.
    for edge_type, hop, nodes in (
        (RATES, 0, slice(0, batch["item"].batch_size)),
        (REV_IN, 0, slice(0, batch["item"].batch_size)),
        (REV_RATES, 1, slice(None)),
        (IN, 1, slice(None)),
    ):
        dst_type = edge_type[2]
        n_id = batch[dst_type].n_id[nodes]
        assert n_id.numel() > 10, edge_type
        got = torch.bincount(batch[edge_type].edge_index[1], minlength=batch[dst_type].num_nodes)
        want = _in_degree(dm, edge_type)[n_id].clamp(max=fanout["__".join(edge_type)][hop])
        assert torch.equal(got[nodes], want), edge_type


@pytest.mark.parametrize(
    ("eval_args", "flag"),
    [
        (EvalArgs(mode="layerwise"), "mode 'layerwise'"),
        (EvalArgs(mode="sampled", val_mode="full"), "val_mode 'full'"),
    ],
)
def test_evaluation_that_is_not_sampled_is_refused(eval_args, flag):
    with pytest.raises(ConfigError, match=rf"--data.eval.{flag}: heterogeneous graphs are eval"):
        HeteroNeighborDataModule(synthetic=TINY, eval=eval_args)


def test_refusals_name_the_type():
    with pytest.raises(ConfigError, match="target_type 'paper' is not a node type.*user, item"):
        _ = _dm(target_type="paper").data
    with pytest.raises(ConfigError, match="target_type 'user' has no labels.*have them: item$"):
        _ = _dm(target_type="user").data
    every = dict.fromkeys(map("__".join, _dm().metadata[1]), [2, 2])
    with pytest.raises(ConfigError, match="names user__likes__item, not an edge type"):
        _dm(num_neighbors={**every, "user__likes__item": [2, 2]}).fanout()
    with pytest.raises(ConfigError, match="no fan-out for category__rev_in__item, item__in__cat"):
        _dm(num_neighbors={"user__rates__item": [5, 5], "item__rev_rates__user": [5, 5]}).fanout()
    with pytest.raises(ConfigError, match="has 1 layers but --model.num_layers is 2"):
        _dm(num_neighbors=[5]).configure_batches(BatchRequest.of(_model(_dm())))
    with pytest.raises(ConfigError, match="sum to less than 1"):
        _dm(split=NodeSplit(0.7, 0.3))
    with pytest.raises(ConfigError, match="val_mask of --data.target_type 'item' is empty"):
        _ = _dm(split=NodeSplit(0.3, 0.0005)).data


def test_the_model_is_built_for_the_graph_spec_and_reads_an_older_checkpoints():
    dm = _dm()
    spec = dm.graph_spec
    assert spec.target == "item" and spec.k == 0
    assert spec.num_features == {"user": 0, "item": dm.data["item"].x.size(1), "category": 0}
    assert spec.num_nodes == {"user": 2000, "item": 1000, "category": 40}
    model = HeteroSAGE(dm.num_classes, spec, hidden_channels=8)
    assert set(model.tables) == {"user", "category"} and set(model.inputs) == {"item"}
    assert model.tables["user"].num_embeddings == 2000
    # Saved before the spec had a ranking cut-off: a plain dictionary without ``k``.
    saved = {k: v for k, v in model.hparams["graph"].items() if k != "k"}
    assert HeteroSAGE(dm.num_classes, saved, hidden_channels=8).hparams["graph"] == spec.as_dict()
    with pytest.raises(ConfigError, match="classifies one node type"):
        HeteroSAGE(dm.num_classes, dataclasses.replace(spec, target=RATES))


def test_half_precision_features_enter_autocast_without_a_float32_copy():
    # A store's float16 rows: under bf16 autocast the input layer gets them as bf16 (a float32
    # copy first is a batch's features at twice their stored size, cast again by autocast),
    # and the output is what the float32 route gives, bit for bit.
    dm = _dm(batch_size=64)
    model = _model(dm, hidden_channels=16, dropout=0.0)
    batch = next(iter(dm.train_dataloader()))
    seen = []
    model.inputs["item"].register_forward_pre_hook(lambda _, args: seen.append(args[0].dtype))
    half = batch["item"].x.half()
    size = {"item": batch["item"].batch_size}
    with torch.autocast("cpu", torch.bfloat16):
        batch["item"].x = half
        out, trimmed = model._encode(batch)["item"], model._encode(batch, size)["item"]
        batch["item"].x = half.float()
        want, trimmed_want = model._encode(batch)["item"], model._encode(batch, size)["item"]
    assert set(seen) == {torch.bfloat16}
    assert out.dtype == torch.bfloat16 and torch.equal(out, want)
    # Target-only layers average the float16 rows as stored (the float32 route averages their
    # bf16 copies): the same seeds' rows within bf16's rounding.
    assert trimmed.dtype == torch.bfloat16 and trimmed.size(0) == size["item"]
    torch.testing.assert_close(trimmed, trimmed_want, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(trimmed, out[: size["item"]], rtol=2e-2, atol=2e-2)
    model._encode(batch)  # without autocast: the parameters' dtype
    assert seen[-1] == torch.float32


@pytest.mark.parametrize("project_after_mean", [True, False])
@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_layers_on_the_rows_read_next_give_the_seeds_what_every_row_gives(
    num_layers, project_after_mean
):
    dm = _dm(batch_size=64, num_neighbors=[5, 3, 2][:num_layers])
    torch.manual_seed(0)
    trimmed = _model(
        dm, hidden_channels=16, num_layers=num_layers, project_after_mean=project_after_mean
    )
    full = _model(dm, hidden_channels=16, num_layers=num_layers, target_only_layers=False)
    full.load_state_dict(trimmed.state_dict())
    batch = next(iter(dm._loader(dm._mask("train_mask"), 64)))
    (out, _, _), (ref, _, _) = trimmed._seeds(batch), full._seeds(batch)
    torch.testing.assert_close(out, ref)  # eval and training compute the same seeds
    projected: list[int] = []  # rows the items' input layer ran on
    trimmed.inputs["item"].register_forward_pre_hook(lambda _, a: projected.append(a[0].size(0)))
    rows = trimmed._encode(batch, {"item": 64})
    assert rows["item"].size(0) == 64 and all(rows[t].size(0) == 0 for t in ("user", "category"))
    items = batch["item"].num_nodes
    if project_after_mean:  # the items the first layer outputs, then the averages of the
        # items next to each user and each category it outputs. With two layers the items two
        # hops out are averaged, never projected; with one every item is a seed, with three
        # every item lies within two hops.
        assert len(projected) == 3 and (projected[0] < items or num_layers != 2)
    else:
        assert projected == [items]  # every sampled item
    grads = []
    for model in (trimmed, full):
        model.head(model._encode(batch, model._only({"item": 64}))["item"][:64]).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name].to_dense(), grads[1][name].to_dense())


def _conv_rows(model) -> list[int]:
    """Rows every conv of ``model``'s encoder outputs, appended as they run."""
    rows: list[int] = []
    for layer in model.encoder.convs:
        for conv in layer.values():
            conv.register_forward_hook(lambda _, args, out: rows.append(out.size(0)))
    return rows


def test_rows_rounded_up_change_no_seed_output_or_gradient():
    # Rows added up to a multiple of m have no edges into them and no later layer reads them.
    dm = _dm(batch_size=64, num_neighbors=[5, 3])
    batch = next(iter(dm._loader(dm._mask("train_mask"), 64)))
    results, computed = [], []
    m = 7
    for bucket in (0, m):
        torch.manual_seed(0)
        model = _model(dm, hidden_channels=16, bucket_rows=bucket)
        computed.append(_conv_rows(model))
        out = model._encode(batch, {"item": 64})["item"]
        model.head(out).sum().backward()
        grads = {n: p.grad.to_dense() for n, p in model.named_parameters() if p.grad is not None}
        results.append((out, grads))
    assert all(r % m == 0 for r in computed[1]) and computed[1] != computed[0]
    assert [-(-r // m) * m for r in computed[0]] == computed[1]  # the same rows, rounded up
    assert results[1][0].size(0) == 64
    torch.testing.assert_close(results[1][0], results[0][0])
    assert results[1][1].keys() == results[0][1].keys()
    for name, grad in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], grad, msg=name)


def test_auto_bucket_rows_round_up_where_products_run_in_bf16_on_a_cpu():
    dm = _dm(batch_size=64, num_neighbors=[5, 3])
    batch = next(iter(dm._loader(dm._mask("train_mask"), 64)))
    model = _model(dm, hidden_channels=16).eval()
    assert model.bucket_rows == "auto"
    rows = _conv_rows(model)

    def computed(bf16: bool) -> list[int]:
        rows.clear()
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            model._encode(batch, {"item": 64})
        return list(rows)

    fp32 = computed(bf16=False)
    assert computed(bf16=True) == [-(-r // 1024) * 1024 for r in fp32]
    assert min(fp32) < 1024  # so something was added
    with pytest.raises(ConfigError, match="bucket_rows must be >= 0"):
        _model(dm, bucket_rows=-1)


def test_training_loader_is_seeded_and_resumable():
    dm = _dm()

    def first_seeds():
        loader = dm.train_dataloader()
        assert isinstance(loader, ResumableLoader)
        batch = next(iter(loader))
        return batch["item"].n_id[: batch["item"].batch_size]

    torch.manual_seed(0)
    a = first_seeds()
    torch.manual_seed(0)
    assert torch.equal(a, first_seeds())
    torch.manual_seed(1)
    assert not torch.equal(a, first_seeds())
    assert bool(dm.data["item"].train_mask[a].all())  # seeds are training items


def test_seed_logits_depend_on_neighbours_of_other_types():
    """Changing one user's or one category's embedding moves the logits of the items it links.

    A model that ignored a relation (or every edge) would leave them unchanged.
    """
    torch.manual_seed(0)
    dm = _dm()
    model = _model(dm).eval()
    batch = next(iter(dm.train_dataloader()))
    size = batch["item"].batch_size
    with torch.no_grad():
        before = model(batch)[:size]
        for edge_type, table in ((RATES, "user"), (REV_IN, "category")):
            weight = model.tables[table].weight
            saved = weight.clone()
            src, dst = batch[edge_type].edge_index
            linked = dst < size
            neighbour, seed = batch[table].n_id[src[linked][0]], int(dst[linked][0])
            weight[neighbour] += 5.0
            assert not torch.allclose(model(batch)[seed], before[seed]), table
            # A node of that type outside the batch changes nothing.
            weight.copy_(saved)
            outside = torch.ones(dm.num_nodes[table], dtype=torch.bool)
            outside[batch[table].n_id] = False
            weight[outside.nonzero()[0]] += 5.0
            assert torch.equal(model(batch)[:size], before), table
            weight.copy_(saved)


def _fit_and_test(model, dm, epochs):
    trainer = quiet_trainer(max_epochs=epochs)
    trainer.fit(model, dm)
    (result,) = trainer.test(model, dm, verbose=False)
    return result["test/acc"]


def test_learns_from_the_graph_beyond_the_features():
    L.seed_everything(0)
    dm = _dm()
    bar = centroid_accuracy(dm.data["item"])  # features alone, about the best they allow
    lr = {"optimizer": functools.partial(torch.optim.Adam, lr=0.01)}
    lr["embedding_optimizer"] = functools.partial(torch.optim.SparseAdam, lr=0.01)
    acc = _fit_and_test(
        HeteroSAGE(dm.num_classes, dm.graph_spec, hidden_channels=32, **lr), dm, epochs=5
    )
    assert bar < 0.5
    assert acc > bar + 0.3, f"GNN {acc:.3f}, features alone {bar:.3f}"


def test_gnnscale_fit_runs_the_recipe_and_its_checkpoint_reloads(tmp_path, monkeypatch):
    entry = recipe("hetero_node_classification")
    monkeypatch.chdir(tmp_path)
    main(
        [
            "fit",
            "--config",
            str(entry.config),
            "--trainer.accelerator=cpu",
            "--trainer.enable_progress_bar=false",
            *entry.tiny,
            "--trainer.max_epochs=2",
        ]
    )
    assert read_metrics(tmp_path / "runs")["test/acc"]
    (ckpt,) = [p for p in (tmp_path / "runs").rglob("*.ckpt") if p.name != "last.ckpt"]  # the best
    model = HeteroSAGE.load_from_checkpoint(ckpt).eval()  # no DataModule: the graph is saved
    dm = _dm(batch_size=64)
    batch = next(iter(dm.val_dataloader()))
    assert model(batch).shape == (batch["item"].num_nodes, dm.num_classes)


def _dblp_like(num=60):
    """A small graph with the schema of PyG's DBLP (conferences have no features)."""
    from torch_geometric.data import HeteroData

    g = torch.Generator().manual_seed(0)
    data = HeteroData()
    sizes = {"author": num, "paper": 2 * num, "term": 20, "conference": 5}
    for t, n in sizes.items():
        if t == "conference":
            data[t].num_nodes = n
        else:
            data[t].x = torch.randn(n, 8, generator=g)
    data["author"].y = torch.randint(0, 4, (num,), generator=g)
    split = torch.arange(num) % 5
    data["author"].train_mask, data["author"].val_mask = split < 3, split == 3
    data["author"].test_mask = split == 4
    for src, dst in (("author", "paper"), ("paper", "term"), ("paper", "conference")):
        edges = torch.stack(
            [torch.randint(0, sizes[s], (4 * num,), generator=g) for s in (src, dst)]
        )
        data[src, "to", dst].edge_index = edges
        data[dst, "to", src].edge_index = edges.flip(0)
    return data


def test_a_real_dataset_by_name_loads_from_its_folder(tmp_path, monkeypatch):
    # No network here: PyG's DBLP class is replaced by a stand-in with its schema; what is
    # tested is the wiring (name, folder, labelled type, featureless type), not the download.
    import torch_geometric.datasets

    folders = []

    class DBLP:
        def __init__(self, root):
            folders.append(root)

        def __getitem__(self, i):
            return _dblp_like()

    monkeypatch.setattr(torch_geometric.datasets, "DBLP", DBLP)
    with pytest.raises(ConfigError, match="does not exist"):
        _ = HeteroNeighborDataModule(dataset="DBLP", root=tmp_path / "missing").data
    dm = HeteroNeighborDataModule(
        dataset="DBLP",
        root=tmp_path,
        num_neighbors=[3, 2],
        batch_size=16,
        eval=EvalArgs(mode="sampled", batch_size=16),
    )
    assert dm.target_type == "author"  # the dataset's labelled type by default
    assert dm.feature_dims["conference"] == 0  # embedded by the model
    assert folders == [str(tmp_path / "DBLP")]
    batch = next(iter(dm.train_dataloader()))
    assert batch["author"].batch_size == 16
    model = _model(dm, hidden_channels=16)
    assert list(model.tables) == ["conference"]
    assert model(batch).shape == (batch["author"].num_nodes, 4)


DDP = """
import json, sys
from pathlib import Path
import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from gnnscale import EvalArgs, HeteroNeighborDataModule, HeteroSAGE, SyntheticRecommender

out = Path(sys.argv[1])

class Record(L.Callback):
    # The seeds each rank trains (weight > 0) and tests, in global item ids.
    def _add(self, trainer, name, seeds):
        path = out / f"{name}-{trainer.world_size}-rank{trainer.global_rank}.json"
        old = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps(old + [seeds]))

    def on_train_batch_start(self, trainer, module, batch, idx):
        store = batch["item"]
        size = store.batch_size
        seeds = store.n_id[:size][store.loss_weight[:size] > 0].tolist()
        self._add(trainer, f"train{trainer.current_epoch}", seeds)

    def on_test_batch_start(self, trainer, module, batch, idx):
        self._add(trainer, "test", batch["item"].n_id[: batch["item"].batch_size].tolist())

tiny = SyntheticRecommender(
    num_users=2000, num_items=1000, num_categories=40, num_communities=8,
    interactions_per_user=10, feature_noise=4.0,
)
L.seed_everything(0)
# Every neighbour (fan-out -1): evaluation draws nothing at random, so a rank's share of the test
# items gets the predictions one process gives them.
dm = HeteroNeighborDataModule(
    synthetic=tiny, num_neighbors=[-1, -1], batch_size=128, eval=EvalArgs("sampled", 64)
)
items = dm.data["item"]
items.test_mask[items.test_mask.nonzero()[0]] = False  # 599: an odd count, unequal shares
model = HeteroSAGE(
    dm.num_classes, dm.graph_spec, hidden_channels=16,
    optimizer=lambda p: torch.optim.Adam(p, lr=0.02),
)
quiet = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
ddp = DDPStrategy(start_method="fork", process_group_backend="gloo")
trainer = L.Trainer(
    devices=2, max_epochs=5, strategy=ddp, callbacks=[Record(), ModelCheckpoint(dirpath=out)],
    **quiet,
)
trainer.fit(model, dm)
(ckpt,) = out.glob("*.ckpt")
(ddp,) = trainer.test(model, dm, ckpt_path=ckpt, verbose=False)
(single,) = L.Trainer(devices=1, callbacks=[Record()], **quiet).test(
    model, dm, ckpt_path=ckpt, verbose=False
)
split = {k: items[k].nonzero().view(-1).tolist() for k in ("train_mask", "test_mask")}
(out / "result.json").write_text(json.dumps({"ddp": ddp, "single": single, **split}))
"""


@pytest.mark.slow
def test_ddp_on_two_processes_trains_and_tests_every_item_once(tmp_path):
    """Two CPU ranks (gloo, forked). 300 training items in batches of 128 make 3 batches: rank
    1 repeats one to draw as many as rank 0, and that repeat weighs 0, so every item trains once
    an epoch. 599 test items: each rank tests its share once (Lightning's DistributedSampler
    would repeat one), and the accuracy is one process's on the same checkpoint."""
    done = run_or_show_stacks([sys.executable, "-c", DDP, str(tmp_path)], 600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())

    def seeds(name, world, rank):
        return json.loads((tmp_path / f"{name}-{world}-rank{rank}.json").read_text())

    for epoch in range(5):
        ranks = [seeds(f"train{epoch}", 2, r) for r in (0, 1)]
        assert len(ranks[0]) == len(ranks[1])  # as many steps: no rank waits for the other
        assert ranks[1][-1] == []  # the repeat, weighed 0
        assert sorted(s for rank in ranks for batch in rank for s in batch) == result["train_mask"]
    tested = [s for r in (0, 1) for batch in seeds("test", 2, r) for s in batch]
    assert sorted(tested) == result["test_mask"] == sorted(sum(seeds("test", 1, 0), []))
    assert result["ddp"]["test/acc"] == pytest.approx(result["single"]["test/acc"], abs=1e-6)
    assert result["single"]["test/acc"] > 0.6  # trained: features alone reach about 0.4


def _same_batches(first, second):
    assert len(first) == len(second) > 1
    for a, b in zip(first, second, strict=True):
        for t in a.node_types:
            assert torch.equal(a[t].n_id, b[t].n_id), t
        for t in a.edge_types:
            assert torch.equal(a[t].edge_index, b[t].edge_index), t


def test_two_validation_passes_sample_the_same_batches():
    """Sampled validation is a function of the weights alone: the same neighbourhoods at every
    epoch, whatever the global random stream did in between (``SeededSampling``)."""
    dm = _dm(eval=EvalArgs(mode="sampled", num_neighbors=[2, 2], batch_size=64))
    first = list(dm.val_dataloader())
    torch.rand(10)  # training moves the global stream between validations
    _same_batches(first, list(dm.val_dataloader()))


def test_predict_writes_each_target_nodes_class_once(tmp_path):
    """Every item once, under its id; at full fan-out (exact) the test items' rows give the
    test accuracy."""
    import pyarrow.parquet as pq

    from gnnscale.callbacks import PredictionWriter

    L.seed_everything(0)
    dm = _dm(eval=EvalArgs(mode="sampled", num_neighbors=[-1, -1], batch_size=700))
    model = _model(dm, hidden_channels=16)
    trainer = quiet_trainer(max_epochs=2, callbacks=[PredictionWriter(tmp_path / "predictions")])
    trainer.fit(model, dm)
    trainer.predict(model, dm, return_predictions=False)
    table = pq.read_table(tmp_path / "predictions")
    items = table.column("node").to_pylist()
    assert items == list(range(dm.num_nodes["item"]))
    predicted = torch.tensor(table.column("class").to_pylist())
    assert predicted.unique().numel() > 4  # trained: not one class for all (8 classes)
    test = dm.data["item"].test_mask
    accuracy = (predicted[test] == dm.data["item"].y[test]).float().mean().item()
    (result,) = trainer.test(model, dm, verbose=False)
    assert accuracy == pytest.approx(result["test/acc"], abs=1e-6)
