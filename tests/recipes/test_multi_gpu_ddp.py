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

SCRIPT = """
import json, sys
import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from gnnscale import GraphSAGE, make_synthetic_graph
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
        data.eval_mask = torch.zeros(data.num_nodes, dtype=torch.bool)
        data.eval_mask[nodes] = True
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
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=tmp_path, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    counts, mean_of_ranks = 60 / 160, (10 / 10 + 50 / 150) / 2
    assert result["test/acc"] == pytest.approx(counts, abs=1e-6), (result, mean_of_ranks)
