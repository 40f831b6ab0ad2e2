"""Past the memory a process can see, an allocation fails and the command says so in one line.

Without it, the kernel (a memory cgroup's limit, or the machine's) killed the run without a word:
a fan-out of [-1, -1] on a 200,000-node graph of degree 200 in 2 GiB, 17 s in.
"""

import re
import subprocess
import sys

import harness
import pytest
from registry import recipe

from gnnscale.cli.runtime import limited_memory, memory_limit_setting, out_of_memory
from gnnscale.errors import ConfigError
from gnnscale.memory import visible_memory
from gnnscale.testing import cli_args

GIB = 2**30


def test_the_limit_is_a_size_off_or_what_the_process_can_see(monkeypatch):
    for value, expected in [("1.5GiB", 1.5 * GIB), ("800MiB", 800 * 2**20), ("2g", 2 * GIB)]:
        monkeypatch.setenv("GNNSCALE_MEMORY_LIMIT", value)
        assert memory_limit_setting() == (int(expected), "GNNSCALE_MEMORY_LIMIT")
    monkeypatch.setenv("GNNSCALE_MEMORY_LIMIT", "off")
    assert memory_limit_setting() is None
    monkeypatch.delenv("GNNSCALE_MEMORY_LIMIT")
    limit, where = memory_limit_setting()
    seen = visible_memory()
    assert 0 < limit <= seen.limit and where in (
        "this machine's memory",
        "its memory cgroup's limit",
    )
    for bad in ("lots", "-1GiB", "0"):
        monkeypatch.setenv("GNNSCALE_MEMORY_LIMIT", bad)
        with pytest.raises(ConfigError, match="GNNSCALE_MEMORY_LIMIT must be auto"):
            memory_limit_setting()


def test_the_memory_a_process_can_see_is_its_cgroups_limit_where_it_has_one():
    code = "from gnnscale.memory import visible_memory as v; s = v(); print(s.limit, s.where)"
    with harness.memory_limit(1.0) as group:
        if group is None:
            pytest.skip("no memory cgroup this process may make")
        done = harness.run([sys.executable, "-c", code], cgroup=group)
    assert done.stdout.split() == [str(GIB), "cgroup"]
    seen = visible_memory()  # this process's: the machine's, or its own cgroup's
    assert 0 < seen.available <= seen.limit


# Inside the limit an allocation past it is an error of the process's own; after, it is lifted.
_ALLOCATE = """
import os, resource
import numpy as np, torch
from gnnscale.cli.runtime import limited_memory, out_of_memory
from gnnscale.measure import data_mb
os.environ["GNNSCALE_MEMORY_LIMIT"] = f"{data_mb() + 200:.0f}MiB"
refused = []
with limited_memory() as limit:
    assert limit is not None and resource.getrlimit(resource.RLIMIT_DATA)[0] == limit[0]
    small = torch.ones(50 * 2**20 // 4)  # within it
    for allocate in (lambda: torch.ones(300 * 2**20 // 4), lambda: np.ones(300 * 2**20 // 8),
                     lambda: bytearray(300 * 2**20)):
        try:
            allocate()
        except Exception as err:
            refused.append(out_of_memory(err))
assert resource.getrlimit(resource.RLIMIT_DATA)[0] == resource.RLIM_INFINITY
torch.ones(300 * 2**20 // 4)
print(refused)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA is Linux's")
def test_an_allocation_past_the_limit_is_an_error_the_process_can_report():
    done = subprocess.run(
        [sys.executable, "-c", _ALLOCATE], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[True, True, True]"  # torch's, numpy's and Python's refusal
    with limited_memory():  # this process's own limit is what it was before, after
        pass
    assert not out_of_memory(ValueError("a value"))
    # A forked DDP rank's MemoryError reaches the launcher as its traceback's text.
    assert out_of_memory(RuntimeError("-- Process 1 terminated...\nnumpy...MemoryError: ..."))


# A fit whose batches need far more than the graph: every neighbour of every node, wide layers.
# The limit is set above what the process holds once its modules are loaded: 600 MiB more, where
# loading the graph took under 400 and a training step over 900 (the step's, not the graph's).
_FIT = """
import os, sys
import gnnscale.cli
from gnnscale.measure import data_mb
os.environ["GNNSCALE_MEMORY_LIMIT"] = f"{data_mb() + int(sys.argv[1]):.0f}MiB"
sys.argv = ["gnnscale", *sys.argv[2:]]
gnnscale.cli.run()
"""


def _wide_fit(tmp_path, name, room_mib):
    """``name``'s recipe fitted with wide batches, ``room_mib`` above its start: it must stop
    with status 2 and one line, no traceback; that line."""
    args = ["fit", "--config", str(recipe(name).config), *cli_args(tmp_path)]
    args += [
        "--data.synthetic.num_nodes=30000",
        "--data.synthetic.avg_degree=100",
        "--data.synthetic.num_features=256",
        "--data.num_neighbors=[-1,-1]",
        "--data.batch_size=1024",
        "--trainer.accumulate_grad_batches=1",
        "--model.hidden_channels=4096",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.max_epochs=1",
    ]
    done = subprocess.run(
        [sys.executable, "-c", _FIT, str(room_mib), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in done.stderr.splitlines() if line.startswith("gnnscale: error:")]
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr[-3000:]
    return lines[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA is Linux's")
def test_a_fit_whose_batches_pass_its_memory_limit_stops_in_one_line(tmp_path):
    line = _wide_fit(tmp_path, "neighbor_sage", 600)
    assert re.search(
        r"the run needed more memory than the [\d.]+ GiB this process may take "
        r"\(GNNSCALE_MEMORY_LIMIT\), training: lower --data.batch_size or the fan-out "
        r"\(--data.num_neighbors\) \(gnnscale plan with the same arguments and --budget_gb",
        line,
    ), line
    assert not list((tmp_path / "runs").rglob("*.ckpt"))  # nothing trained, nothing kept


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA is Linux's")
def test_forked_ddp_ranks_past_the_memory_limit_stop_in_one_line(tmp_path):
    """The ranks inherit the limit; the one that fails reaches the launcher as a
    ``ProcessRaisedException`` whose message is its traceback (a status 1 traceback before)."""
    line = _wide_fit(tmp_path, "multi_gpu_ddp", 700)
    assert "training: lower --data.batch_size or the fan-out" in line, line


@pytest.mark.slow
def test_a_graph_larger_than_its_memory_cgroup_stops_in_one_line_not_a_kill(tmp_path):
    """The same fit in a memory cgroup: the kernel killed it (status -9); it now stops, saying
    what did not fit, with the limit read from the cgroup."""
    args = ["fit", "--config", str(recipe("neighbor_sage").config), *cli_args(tmp_path)]
    # The recipe's own graph, 200,000 nodes, at degree 200 (the tests' small graph is not).
    args += ["--data.synthetic.num_nodes=200000", "--data.synthetic.num_features=100"]
    args += ["--data.synthetic.avg_degree=200", "--data.num_neighbors=[-1,-1]"]
    with harness.memory_limit(2.0) as group:
        if group is None:
            pytest.skip("no memory cgroup this process may make")
        argv = [sys.executable, "-m", "gnnscale.cli", *args]
        done = harness.run(argv, cwd=tmp_path, cgroup=group, check=False, timeout_s=600)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "(its memory cgroup's limit), loading the data: prepare the graph on disk" in done.stderr
