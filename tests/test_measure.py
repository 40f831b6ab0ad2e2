import sys

import pytest
import torch

from gnnscale.measure import (
    SavedTensors,
    peak_rss_mb,
    read_metrics,
    reset_peak_rss,
    rss_mb,
    saved_tensor_bytes,
)


@pytest.mark.skipif(sys.platform != "linux", reason="clear_refs is Linux's")
def test_reset_peak_rss_forgets_an_earlier_peak():
    block = torch.ones(256, 2**20 // 4)  # 256 MiB, touched
    del block
    assert peak_rss_mb() > rss_mb() + 200
    assert reset_peak_rss()
    assert peak_rss_mb() < rss_mb() + 32


def test_saved_tensor_bytes_counts_each_storage_once():
    x = torch.randn(1000, 100, requires_grad=True)
    w = torch.randn(50, 100, requires_grad=True)

    def step():
        # x is saved for w's gradient and w for x's; the views save the same storages again.
        return (x @ w.T).sum() + (x[:, :10] @ w[:, :10].T).sum()

    assert saved_tensor_bytes(step) == x.nbytes + w.nbytes
    with SavedTensors(exclude=[w]) as saved:
        step()
    assert saved.nbytes == x.nbytes


def test_read_metrics_takes_each_column_without_its_gaps(tmp_path):
    run = tmp_path / "version_0"
    run.mkdir()
    (run / "metrics.csv").write_text("epoch,train/loss,val/acc\n0,1.5,\n0,,0.5\n1,0.9,0.75\n")
    assert read_metrics(tmp_path) == {
        "epoch": [0.0, 0.0, 1.0],
        "train/loss": [1.5, 0.9],
        "val/acc": [0.5, 0.75],
    }
    (tmp_path / "version_1").mkdir()
    (tmp_path / "version_1" / "metrics.csv").write_text("epoch\n2\n")
    with pytest.raises(FileNotFoundError, match="expected one metrics.csv"):
        read_metrics(tmp_path)
