"""recipes/sparse_embeddings: gnnscale.EmbeddingSAGE through the real CLI on a tiny graph."""

import csv
import math
from pathlib import Path

import lightning as L
import pytest
import torch

from gnnscale import EmbeddingSAGE, NeighborDataModule, SyntheticGraph
from gnnscale.cli import main
from gnnscale.data import EvalArgs

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "sparse_embeddings"
TINY = [
    "--trainer.accelerator=cpu",
    "--trainer.max_epochs=3",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--data.synthetic.num_nodes=2000",
    "--data.synthetic.num_classes=5",
    "--data.synthetic.train_fraction=0.1",
    "--data.batch_size=48",  # 200 training nodes: 5 micro-batches per epoch, the last short
    "--data.num_neighbors=[3, 2]",  # small fan-out, so some rows are never looked up
    "--data.loader.num_workers=0",
    "--data.loader.persistent_workers=false",
    "--model.init_args.embedding_dim=16",
    "--model.init_args.hidden_channels=32",
]


class Probe(L.Callback):
    """Records optimizer steps, the embedding's gradient layout and the rows each step changed."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, int, str]] = []
        self.sparse_grads: list[bool] = []
        self.stray_rows: list[int] = []  # per step: changed rows that no micro-batch looked up
        self.looked_up: list[torch.Tensor] = []
        self.before: torch.Tensor | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.looked_up.append(batch.n_id.cpu())
        self.batch_idx = batch_idx

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        name = type(optimizer).__name__
        self.steps.append((trainer.current_epoch, self.batch_idx, name))
        if name == "SparseAdam":
            self.sparse_grads.append(pl_module.embedding.weight.grad.is_sparse)
            self.before = pl_module.embedding.weight.detach().clone()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.before is None:  # no step on this micro-batch
            return
        changed = (pl_module.embedding.weight.detach() != self.before).any(dim=1)
        changed[torch.cat(self.looked_up)] = False
        self.stray_rows.append(int(changed.sum()))
        self.looked_up, self.before = [], None


def _metrics(log_dir: Path) -> list[dict[str, str]]:
    (path,) = log_dir.rglob("metrics.csv")
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("embedding_device", ["model", "cpu"])
def test_sparse_embeddings_recipe(tmp_path, embedding_device):
    cli = main(
        [
            "fit",
            f"--config={RECIPE / 'config.yaml'}",
            *TINY,
            f"--data.root={tmp_path / 'data'}",
            f"--trainer.default_root_dir={tmp_path}",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
            f"--trainer.callbacks+={__name__}.Probe",
            f"--model.init_args.embedding_device={embedding_device}",
        ]
    )
    probe = next(c for c in cli.trainer.callbacks if isinstance(c, Probe))
    model = cli.model
    assert model.embedding.weight.shape == (2000, 16)  # rows from the data, never typed

    # Finite training loss that went down; metrics CSV written; the test ran.
    rows = _metrics(tmp_path / "runs")
    losses = [float(r["train/loss_epoch"]) for r in rows if r.get("train/loss_epoch")]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]
    assert any(r.get("test/acc") for r in rows)

    # Accumulation: both optimizers step on micro-batches 2 and 4 and on the short last one.
    k = model.hparams.accumulate_grad_batches
    assert k == 2
    for name in ("Adam", "SparseAdam"):
        steps = [(epoch, idx) for epoch, idx, n in probe.steps if n == name]
        assert steps == [(epoch, idx) for epoch in range(3) for idx in (1, 3, 4)]

    # Sparse gradient; each SparseAdam step changed only rows its micro-batches looked up (dense
    # Adam would keep moving every row seen before, through its momentum).
    assert len(probe.sparse_grads) == 9 and all(probe.sparse_grads)
    assert probe.stray_rows == [0] * 9

    # The checkpoint reloads on its own: the table size travels in its hyperparameters.
    best = cli.trainer.checkpoint_callback.best_model_path
    reloaded = EmbeddingSAGE.load_from_checkpoint(best)
    torch.testing.assert_close(reloaded.embedding.weight, model.embedding.weight)


def test_cpu_table_stays_on_host_when_the_model_moves():
    # No GPU here: moving to the meta device stands in for .to("cuda").
    model = EmbeddingSAGE(1, 5, embedding_dim=8, num_nodes=100, embedding_device="cpu")
    model.to("meta")
    assert model.embedding.weight.device.type == "cpu"
    assert all(p.device.type == "meta" for p in model.gnn.parameters())


def test_layerwise_evaluation_reads_the_table_as_sampling_at_full_fanout_does(tmp_path):
    # The table, not x, is the first layer's input: exact layer-wise logits of the test nodes
    # equal those of sampled evaluation over their whole two-hop neighbourhoods.
    graph = SyntheticGraph(num_nodes=600, num_features=1, num_classes=5, avg_degree=6)
    torch.manual_seed(0)
    model = EmbeddingSAGE(1, 5, embedding_dim=8, num_nodes=600, hidden_channels=16).eval()
    logits = []
    for eval_args in (EvalArgs("layerwise"), EvalArgs("sampled", num_neighbors=[-1, -1])):
        dm = NeighborDataModule(
            root=tmp_path, num_neighbors=[3, 2], synthetic=graph, eval=eval_args
        )
        dm.configure_batches(model.batch_request())
        dm.setup("test")
        with torch.no_grad():
            out = [model._logits(batch) for batch in dm.test_dataloader()]
        logits.append(torch.cat([o for o, _ in out]))
    assert logits[0].shape == (int(dm.data.test_mask.sum()), 5)
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-5)
