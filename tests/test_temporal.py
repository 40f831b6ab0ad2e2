"""Temporal link prediction: the split by time, the fixed candidates, no leak, the baselines."""

import lightning as L
import pytest
import torch
from registry import REPO, recipe

from gnnscale import (
    InteractionStream,
    TemporalLinkDataModule,
    TemporalLinkPredictor,
    TemporalSplit,
    make_interaction_stream,
)
from gnnscale.batch import mrr
from gnnscale.checkpoint import start_from
from gnnscale.cli import command, main
from gnnscale.data.stream import read_interaction_stream
from gnnscale.data.temporal import baseline_scores
from gnnscale.errors import ConfigError

SMALL = InteractionStream(num_users=120, num_items=60, num_events=3000, num_communities=6)


@pytest.fixture(scope="module")
def dm():
    module = TemporalLinkDataModule(stream=SMALL, batch_size=64)
    module.setup("fit")
    return module


def test_the_split_is_by_time_70_15_15(dm):
    s = dm.stream
    parts = [s.stage(stage) for stage in ("train", "val", "test")]
    assert [p.numel() for p in parts] == [2100, 450, 450]
    assert torch.equal(torch.cat(parts), torch.arange(3000))
    assert bool((s.time[1:] >= s.time[:-1]).all())


def test_fixed_negatives_are_distinct_items_half_of_them_past_destinations(dm):
    s = dm.stream
    for stage in ("val", "test"):
        events = s.stage(stage)
        negatives = s.negatives(stage, events)
        assert negatives.shape == (events.numel(), 20)
        assert bool((negatives >= s.num_users).all() and (negatives < s.num_nodes).all())
        assert not bool((negatives == s.dst[events].unsqueeze(1)).any())
        for row, e in enumerate(events.tolist()):
            assert negatives[row].unique().numel() == 20
            earlier = s.dst[:e][s.src[:e] == s.src[e]]
            past = set(earlier.tolist()) - {int(s.dst[e])}
            from_past = sum(int(x) in past for x in negatives[row])
            assert from_past >= min(len(past), 10)
    again = TemporalLinkDataModule(stream=SMALL)
    assert torch.equal(again.stream.fixed, s.fixed)  # fixed with the split, not drawn per run


@pytest.mark.parametrize("stage", ["train", "val", "test"])
def test_no_message_at_or_after_its_questions_time(dm, stage):
    s = dm.stream
    events = s.stage(stage)[-128:]
    batch = dm.batch(stage, events)
    b, c = batch.candidates.shape
    seed_time = torch.cat([batch.time, batch.time.repeat_interleave(c)])
    assert batch.edge_age.numel() > 0
    asked = seed_time[batch.col]
    assert bool((s.time[batch.event] < asked).all())  # strictly before, every edge, every seed
    assert torch.equal(batch.edge_age, (asked - s.time[batch.event]).float())
    # the interaction asked about is never a message, nor any later one of its source
    own = batch.col < b
    assert bool((batch.event[own] < events[batch.col[own]]).all())


@pytest.mark.parametrize("stage", ["train", "val", "test"])
def test_without_time_the_graph_holds_only_interactions_before_the_stage(stage):
    dm = TemporalLinkDataModule(stream=SMALL, temporal=False)
    s = dm.stream
    sampler, upto = dm._samplers[stage]
    first = {"train": s.val_start - s.val_start // 5, "val": s.val_start, "test": s.test_start}
    assert upto == first[stage]
    asked = dm._training_events() if stage == "train" else s.stage(stage)
    assert int(asked[0]) >= upto  # every question comes after the graph it is answered on
    batch = dm.batch(stage, asked[:64])
    assert bool((batch.edge_age == 0).all())  # no time reaches the model
    assert sampler.row.numel() == 2 * upto


def test_a_batch_counts_each_candidates_meetings_with_its_source(dm):
    batch = dm.batch("val", dm.stream.stage("val")[:50])
    b, c = batch.candidates.shape
    for i in range(b):
        met = batch.node[batch.row[batch.col == i]]
        ages = batch.edge_age[batch.col == i]
        for j in range(c):
            cand = batch.candidates[i, j]
            hits = met == cand
            count, newest, oldest = batch.pair[i * c + j].tolist()
            assert count == int(hits.sum())
            if count:
                assert newest == float(ages[hits].min()) and oldest == float(ages[hits].max())
            else:
                assert newest == float("inf")


def test_baselines_score_every_candidate_from_the_interactions_before_it(dm):
    s = dm.stream
    window = 500
    scores = baseline_scores(s, "test", window)
    events = s.stage("test")
    candidates = torch.cat([s.dst[events].unsqueeze(1), s.negatives("test", events)], 1)
    for row in range(0, events.numel(), 37):
        e = int(events[row])
        for j, cand in enumerate(candidates[row].tolist()):
            before = (s.src[:e] == s.src[e]) & (s.dst[:e] == cand)
            assert scores["edgebank"][row, j] == float(before.any())
            recent = before & (s.time[:e] >= s.time[e] - window)
            assert scores["edgebank_tw"][row, j] == float(recent.any())
            assert scores["popularity"][row, j] == float((s.dst[:e] == cand).sum())


def test_mrr_counts_ties_half_as_tgb_does():
    positive = torch.tensor([1.0, 1.0, 0.5])
    negative = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    assert torch.allclose(mrr(positive, negative), torch.tensor([1.0, 1 / 1.5, 1 / 3]))


def test_the_model_learns_to_rank_above_edgebank_with_a_window():
    L.seed_everything(0)
    dm = TemporalLinkDataModule(stream=SMALL, batch_size=64)
    model = TemporalLinkPredictor(dm.num_nodes, dm.num_features, hidden_channels=32)
    trainer = L.Trainer(
        max_epochs=3,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, dm)
    (result,) = trainer.test(model, dm, verbose=False)
    assert result["test/mrr"] > result["test/mrr_edgebank_tw"] + 0.03, result
    assert result["test/mrr"] > result["test/mrr_popularity"], result


def test_bad_settings_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="num_neighbors takes one hop"):
        TemporalLinkDataModule(num_neighbors=[10, 5])
    with pytest.raises(ConfigError, match="val_fraction \\+ test_fraction must be < 0.9"):
        TemporalSplit(val_fraction=0.5, test_fraction=0.45)
    with pytest.raises(ConfigError, match="repeat must be between 0 and 1"):
        InteractionStream(repeat=1.5)


def _jodie_csv(path, rows):
    lines = ["user_id,item_id,timestamp,state_label,comma_separated_list_of_features"]
    lines += [",".join(str(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")


def test_a_stream_in_jodies_csv_layout_reads_as_the_generated_one(tmp_path):
    # user, item, timestamp, state label, two features; out of time order, ids with gaps
    rows = [
        (7, 3, 30.0, 0, 0.5, 1.0),
        (2, 3, 10.0, 0, 0.1, 0.2),
        (7, 9, 20.0, 1, 0.3, 0.4),
        (2, 9, 20.0, 0, 0.7, 0.8),
    ]
    _jodie_csv(tmp_path / "wikipedia.csv", rows)
    data = read_interaction_stream(tmp_path / "wikipedia.csv")
    # users 2, 7 -> 0, 1; items 3, 9 -> 2, 3; by time, ties in the file's order
    assert data.edge_index.tolist() == [[0, 1, 0, 1], [2, 3, 3, 2]]
    assert data.time.tolist() == [10, 20, 20, 30] and data.time.dtype == torch.int64
    assert torch.allclose(
        data.edge_attr, torch.tensor([[0.1, 0.2], [0.3, 0.4], [0.7, 0.8], [0.5, 1.0]])
    )
    assert (data.num_nodes, data.num_users) == (4, 2)


def test_a_parquet_stream_takes_every_other_numeric_column_as_a_feature(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "src": [5, 5, 1],
            "dst": [0, 1, 0],
            "time": [0.5, 0.25, 1.5],
            "note": ["a", "b", "c"],  # not a number: not a feature
            "weight": [1.0, 2.0, 3.0],
        }
    )
    pq.write_table(table, tmp_path / "s.parquet")
    data = read_interaction_stream(tmp_path / "s.parquet")
    assert data.edge_index.tolist() == [[1, 1, 0], [3, 2, 2]]
    assert data.time.tolist() == [0.25, 0.5, 1.5] and data.time.dtype == torch.float64
    assert data.edge_attr.view(-1).tolist() == [2.0, 1.0, 3.0]
    pq.write_table(table.drop(["time"]), tmp_path / "no_time.parquet")
    with pytest.raises(ConfigError, match="no column time"):
        read_interaction_stream(tmp_path / "no_time.parquet")
    with pytest.raises(ConfigError, match="is not a file"):
        read_interaction_stream(tmp_path / "missing.csv")


def test_a_datamodule_trains_on_a_stream_of_its_own(tmp_path):
    stream = make_interaction_stream(SMALL)
    src, dst = stream.edge_index
    rows = [
        (int(s), int(d) - SMALL.num_users, int(t), 0, *map(float, x))
        for s, d, t, x in zip(src, dst, stream.time, stream.edge_attr, strict=True)
    ]
    _jodie_csv(tmp_path / "mine.csv", rows)
    dm = TemporalLinkDataModule(dataset=str(tmp_path / "mine.csv"), batch_size=64)
    assert (dm.num_nodes, dm.num_features) == (
        int(src.unique().numel() + dst.unique().numel()),
        SMALL.num_features,
    )
    dm.setup("fit")
    batch = dm.batch("val", dm.stream.stage("val")[:32])
    assert batch.edge_attr.size(1) == SMALL.num_features and bool((batch.edge_age > 0).all())


def test_the_mean_message_is_the_two_layers_applied_edge_by_edge(dm):
    torch.manual_seed(0)
    model = TemporalLinkPredictor(dm.num_nodes, dm.num_features, hidden_channels=16).eval()
    batch = dm.batch("val", dm.stream.stage("val")[:40])
    edge = torch.cat(
        [model.embedding(batch.node[batch.row]), batch.edge_attr, model.age(batch.edge_age)], 1
    )
    message = model.message(edge)  # the plain way: both layers on every edge
    total = message.new_zeros(batch.num_seeds, 16).index_add_(0, batch.col, message)
    count = torch.bincount(batch.col, minlength=batch.num_seeds).unsqueeze(1)
    assert (count == 0).any()  # some seeds have no in-edge: theirs is 0, not the bias
    assert torch.allclose(model._mean_message(batch), total / count.clamp(min=1), atol=1e-5)


def test_start_from_keeps_a_checkpoints_rows_and_gives_new_nodes_fresh_ones(tmp_path):
    torch.manual_seed(0)
    before = TemporalLinkPredictor(num_nodes=10, in_channels=4)
    torch.save({"state_dict": before.state_dict()}, tmp_path / "before.ckpt")
    torch.manual_seed(1)
    grown = TemporalLinkPredictor(num_nodes=15, in_channels=4)
    fresh = grown.embedding.weight[10:].clone()
    message = start_from(grown, tmp_path / "before.ckpt")
    assert "embedding.weight (10 -> 15 rows)" in message
    assert torch.equal(grown.embedding.weight[:10], before.embedding.weight)
    assert torch.equal(grown.embedding.weight[10:], fresh)
    for name, weight in before.state_dict().items():
        if name != "embedding.weight":
            assert torch.equal(grown.state_dict()[name], weight), name
    with pytest.raises(ConfigError, match="its embedding.weight is of shape .* this model's"):
        start_from(TemporalLinkPredictor(num_nodes=8, in_channels=4), tmp_path / "before.ckpt")
    wider = TemporalLinkPredictor(num_nodes=10, in_channels=4, hidden_channels=32)
    with pytest.raises(ConfigError, match="give a checkpoint of the same --model settings"):
        start_from(wider, tmp_path / "before.ckpt")


def test_a_fit_fine_tunes_from_weights_on_a_new_interval_alone(tmp_path, monkeypatch):
    tiny = [a.replace("--data.init_args.", "--data.") for a in recipe("temporal_links").tiny]

    def fit(*args):
        config = REPO / "recipes" / "temporal_links" / "config.yaml"
        return main(
            [
                "fit",
                "--config",
                str(config),
                "--trainer.max_epochs=1",
                *tiny,
                *args,
                "--trainer.enable_progress_bar=false",
                f"--trainer.default_root_dir={tmp_path}",
            ]
        )

    first = fit(f"--trainer.logger.init_args.save_dir={tmp_path / 'a'}")
    loaded, real = {}, command.start_from

    def recorded(model, path):
        said = real(model, path)
        loaded.update({k: v.clone() for k, v in model.state_dict().items()})
        return said

    monkeypatch.setattr(command, "start_from", recorded)
    saved = first.trainer.checkpoint_callback.best_model_path
    second = fit(
        f"--weights_from={saved}",
        "--data.split.train_from=0.6",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'b'}",
    )
    weights = first.model.state_dict()  # the best checkpoint's: the test after fit loaded it
    assert loaded.keys() == weights.keys()
    assert all(torch.equal(loaded[k], v) for k, v in weights.items())
    assert not all(torch.equal(second.model.state_dict()[k], v) for k, v in weights.items())
    events = second.datamodule._training_events()
    assert torch.equal(events, torch.arange(2400, second.datamodule.stream.val_start))
    assert first.datamodule._training_events()[0] == 0
    with pytest.raises(ConfigError, match="train_from and train_until must satisfy"):
        TemporalSplit(train_from=0.8)
    with pytest.raises(ConfigError, match="static model"):
        TemporalLinkDataModule(temporal=False, split=TemporalSplit(train_from=0.2))
