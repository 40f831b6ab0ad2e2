import mmap
import subprocess
import sys

import pytest
import torch

from gnnscale.measure import (
    ProcessTreeMemory,
    SavedTensors,
    cpu_bf16_native,
    peak_rss_mb,
    read_metrics,
    reset_peak_rss,
    rss_mb,
    saved_tensor_bytes,
)


@pytest.mark.skipif(sys.platform != "linux", reason="clear_refs is Linux's")
def test_reset_peak_rss_forgets_an_earlier_peak():
    # 256 MiB touched, then unmapped: returned whatever the allocator keeps (gnnscale's CLI
    # keeps freed memory in some runs, and earlier tests may have run it in this process).
    block = mmap.mmap(-1, 256 << 20)
    torch.frombuffer(block, dtype=torch.uint8).fill_(1)
    block.close()
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


# Tensors of 1 MiB from the heap (a fixed 64 MiB mmap threshold), all freed but the last one,
# which keeps glibc from trimming the heap's top by itself: the freed pages stay resident.
HEAP_HOLES = """
import sys, torch
from gnnscale.measure import rss_mb, set_mmap_threshold, trim_heap
assert set_mmap_threshold(64 * 2**20)
blocks = [torch.ones(2**18) for _ in range(300)]  # 300 x 1 MiB, touched
del blocks[:-1]
before = rss_mb()
ran = trim_heap()
print(ran, before - rss_mb())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's malloc_trim")
def test_trim_heap_returns_the_freed_heap_pages():
    done = subprocess.run([sys.executable, "-c", HEAP_HOLES], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    ran, released = done.stdout.split()
    assert ran == "True"
    assert float(released) > 200, f"{released} MiB released of the 299 MiB freed"


# bf16 products of 300 new shapes, after gnnscale's CLI settings (or with both caches at 1024).
PRIMITIVES = """
import os, sys
import torch
from gnnscale.cli.runtime import steady_cpu_memory
from gnnscale.measure import rss_mb, trim_heap
if sys.argv[1] == "large":
    os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = os.environ["LRU_CACHE_CAPACITY"] = "1024"
steady_cpu_memory()
w, x = torch.randn(100, 256).bfloat16(), torch.randn(11000, 100).bfloat16()
before = rss_mb()
for i in range(300):
    y = x[: 10000 + i] @ w
del y
trim_heap()
print(rss_mb() - before)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's malloc_trim")
@pytest.mark.skipif(
    not cpu_bf16_native(),
    reason="no oneDNN bf16 kernels on this CPU (AVX2 alone): bf16 products build no primitives",
)
def test_bf16_products_of_new_shapes_do_not_grow_memory():
    grown = {}
    for caches in ("gnnscale", "large"):
        done = subprocess.run(
            [sys.executable, "-c", PRIMITIVES, caches], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-2000:]
        grown[caches] = float(done.stdout.split()[-1])
    assert grown["gnnscale"] < 40, grown
    assert grown["large"] > 3 * grown["gnnscale"] + 50, grown  # the caches are what grows


@pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")
def test_process_tree_memory_sees_every_process_of_the_tree_with_its_peaks():
    grandchild = (
        "import sys; b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096]); "
        "print('ready', flush=True); sys.stdin.read()"
    )
    child = (
        "import subprocess, sys; b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096]); "
        f"g = subprocess.Popen([sys.executable, '-c', {grandchild!r}], stdin=subprocess.PIPE, "
        "stdout=subprocess.PIPE); g.stdout.readline(); print('ready', flush=True); "
        "sys.stdin.read(); g.stdin.close(); g.wait()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    with ProcessTreeMemory(proc.pid, interval_s=0.05, pss_depth=0) as tree:
        assert proc.stdout.readline() == b"ready\n"  # both hold their memory now
        tree.sample()
        proc.stdin.close()
        proc.wait()
    (root,), (below,) = tree.at_depth(0), tree.at_depth(1)
    assert root.pid == proc.pid
    for peaks in (root, below):
        assert peaks.anon_mb >= 64
        assert peaks.rss_mb >= 64
        assert peaks.hwm_mb >= peaks.rss_mb
    assert tree.pss_mb >= 128  # both, summed
