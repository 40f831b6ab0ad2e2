"""The DDP recipe on CPU: 2 forked processes (gloo), accuracy reduced from counts across ranks."""

import json
import math
import subprocess
import sys
from pathlib import Path

from gnnscale.testing import requires_sampler

MEASURE = Path(__file__).resolve().parents[2] / "recipes" / "multi_gpu_ddp" / "measure.py"
TINY = [
    "--data.init_args.synthetic.num_features=32",
    "--data.init_args.synthetic.num_classes=5",
    "--data.init_args.synthetic.train_fraction=0.3",
    "--data.init_args.synthetic.val_fraction=0.1",  # 1,800 test nodes: 900 per rank, no padding
    "--data.init_args.batch_size=128",
    "--model.init_args.hidden_channels=64",
    "--model.init_args.optimizer.init_args.lr=0.02",
]


@requires_sampler
def test_ddp_two_processes_on_cpu(tmp_path):
    # A subprocess, so that the DDP fork does not copy the pytest process.
    out = subprocess.run(
        [sys.executable, str(MEASURE), "--num-nodes=3000", "--max-epochs=6", "--json", *TINY],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert [r["rank"] for r in figures["ranks"]] == [0, 1]  # two processes trained
    losses = figures["train_loss"]
    assert len(losses) == 6 and all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]
    # Accuracy over 2 ranks, each scoring half of the test nodes, reduced from correct/total
    # counts, equals the single-process accuracy of the same checkpoint.
    assert math.isclose(figures["ddp_test_acc"], figures["single_test_acc"], abs_tol=1e-6)
    assert figures["single_test_acc"] > 0.4  # 2x chance on 5 classes
