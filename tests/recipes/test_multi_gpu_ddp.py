"""Under DDP, accuracy is reduced from counts across ranks that score unequal numbers of nodes.

With equal shards, averaging each rank's accuracy equals reducing correct/total counts, so a test
on equal shards cannot tell the two apart. Here two CPU processes (gloo) score shards of 10 and
150 nodes, chosen from the (untrained, identical) model's own predictions so that rank 0 is
right on all of its nodes and rank 1 on a third of its: the count-reduced accuracy is 60 / 160 =
0.375, the mean of the ranks' accuracies 0.667.
"""

import json
import subprocess
import sys

import pytest
from registry import recipe

from gnnscale.testing import run_or_show_stacks

SCRIPT = """
import json, sys
import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from gnnscale import GraphSAGE, make_synthetic_graph
from gnnscale.batch import WholeGraph
from gnnscale.data.loaders import single
from gnnscale.testing import TINY

class Shards(L.LightningDataModule):
    def test_dataloader(self):
        data = make_synthetic_graph(TINY)
        model = self.trainer.lightning_module.eval()  # no dropout: the predictions test_step makes
        with torch.no_grad():
            right = model(data.x, data.edge_index).argmax(-1) == data.y
        hit, miss = right.nonzero().view(-1), (~right).nonzero().view(-1)
        if self.trainer.global_rank == 0:
            nodes = hit[:10]                               # 10 of 10 right
        else:
            nodes = torch.cat([hit[10:60], miss[:100]])    # 50 of 150 right
        score = torch.zeros(data.num_nodes, dtype=torch.bool)
        score[nodes] = True
        data.layout = WholeGraph(score)
        return single(data)

L.seed_everything(0)
model = GraphSAGE(TINY.num_features, TINY.num_classes, hidden_channels=16)
trainer = L.Trainer(
    accelerator="cpu", devices=2, logger=False, enable_progress_bar=False,
    strategy=DDPStrategy(start_method="fork", process_group_backend="gloo"),
    use_distributed_sampler=False,
)
(result,) = trainer.test(model, datamodule=Shards(), verbose=False)
print(json.dumps(result))
"""


@pytest.mark.slow
def test_accuracy_is_reduced_from_counts_over_unequal_shards(tmp_path):
    done = run_or_show_stacks([sys.executable, "-c", SCRIPT], 600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    counts, mean_of_ranks = 60 / 160, (10 / 10 + 50 / 150) / 2
    assert result["test/acc"] == pytest.approx(counts, abs=1e-6), (result, mean_of_ranks)


@pytest.mark.slow
def test_predict_under_ddp_writes_each_node_once_with_one_process_classes(tmp_path):
    """The recipe's ranks each predict their block of nodes (exact, layer-wise) into a file of
    their own: together every node once, with the classes one process predicts."""
    import pyarrow.parquet as pq

    ddp = recipe("multi_gpu_ddp")
    common = [
        "--config", str(ddp.config), "--trainer.accelerator=cpu",
        "--trainer.enable_progress_bar=false", *ddp.tiny,
        f"--data.init_args.root={tmp_path / 'data'}",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
    ]  # fmt: skip

    def gnnscale(*args: str) -> str:
        argv = [sys.executable, "-m", "gnnscale.cli", *args]
        done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stderr

    printed = gnnscale("fit", *common, "--trainer.max_epochs=1")
    # Lightning's advice to reduce gnnscale's own per-rank figures: nothing a user can do.
    assert "It is recommended to use `self.log(" not in printed, printed[-3000:]
    (ckpt,) = (tmp_path / "runs").rglob("last.ckpt")
    gnnscale("predict", *common, f"--ckpt_path={ckpt}")
    gnnscale("predict", *common, f"--ckpt_path={ckpt}", "--trainer.devices=1")
    two, one = sorted((tmp_path / "runs").rglob("predictions"))
    assert sorted(p.name for p in two.iterdir()) == ["part-0.parquet", "part-1.parquet"]
    parts = [pq.read_table(two / f"part-{r}.parquet") for r in (0, 1)]
    nodes = [p.column("node").to_pylist() for p in parts]
    assert nodes[0] and nodes[1] and sorted(nodes[0] + nodes[1]) == list(range(3000))
    alone = pq.read_table(one)
    ids, classes = alone.column("node").to_pylist(), alone.column("class").to_pylist()
    by_node = dict(zip(ids, classes, strict=True))
    assert len(by_node) == 3000
    for part, ids in zip(parts, nodes, strict=True):
        assert part.column("class").to_pylist() == [by_node[n] for n in ids]
