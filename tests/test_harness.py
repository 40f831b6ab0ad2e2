"""The benchmarks' one way to run a measured command (``benchmarks/harness.py``)."""

import sys

import harness
import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")

# Holds 64 MiB of touched memory in a child it waits for, prints, and logs one metric.
CHILD = "b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096])"
CODE = f"""
import pathlib, subprocess, sys
subprocess.run([sys.executable, "-c", {CHILD!r}], check=True)
print("argv", sys.argv[1:])
log = pathlib.Path(sys.argv[1], "version_0")
log.mkdir(parents=True)
(log / "metrics.csv").write_text("epoch,perf/epoch_s\\n0,1.5\\n1,2.5\\n")
"""


def test_run_measures_the_largest_process_and_reads_the_metrics(tmp_path):
    done = harness.run([sys.executable, "-c", CODE, str(tmp_path)], logs=tmp_path, sample_s=0.01)
    assert done.returncode == 0
    assert done.stdout.splitlines()[-1] == f"argv [{str(tmp_path)!r}]"  # its own lines only
    assert done.peak_mb >= 64  # the child's, which it waited for
    assert done.cpu_s >= done.system_s > 0
    assert done.metrics == {"epoch": [0.0, 1.0], "perf/epoch_s": [1.5, 2.5]}
    assert done.memory is not None and done.memory.at_depth(0)[0].pid == done.memory.root


def test_run_passes_workers_precision_and_threads_to_the_command():
    code = "import os, sys; print(sys.argv[1:], os.environ['OMP_NUM_THREADS'])"
    done = harness.run([sys.executable, "-c", code], workers=2, precision="bf16-mixed", threads=1)
    flags = [
        "--data.init_args.loader.num_workers=2",
        "--data.init_args.loader.persistent_workers=true",
        "--trainer.precision=bf16-mixed",
    ]
    assert done.stdout.strip() == f"{flags} 1"


def test_a_failed_run_raises_with_its_error_output_or_is_returned():
    code = "import sys; sys.exit('went wrong')"
    with pytest.raises(RuntimeError, match="went wrong"):
        harness.run([sys.executable, "-c", code])
    done = harness.run([sys.executable, "-c", code], check=False)
    assert done.returncode == 1 and done.peak_mb == 0


def test_a_run_past_its_time_limit_is_killed_and_says_so():
    done = harness.run(
        [sys.executable, "-c", "import time; time.sleep(60)"], check=False, timeout_s=1
    )
    assert done.timed_out and done.returncode != 0 and done.wall_s < 30
    assert not harness.run([sys.executable, "-c", "pass"]).timed_out


def test_a_script_imports_its_neighbours_as_under_python_itself(tmp_path):
    (tmp_path / "neighbour.py").write_text("NAME = 'beside'\n")
    (tmp_path / "script.py").write_text("import neighbour\nprint(neighbour.NAME)\n")
    assert harness.run([sys.executable, str(tmp_path / "script.py")]).stdout == "beside\n"
