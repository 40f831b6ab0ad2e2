import os
import shutil
from pathlib import Path

import pytest
import torch
from registry import CORA_RAW

from gnnscale.testing import BACKEND_MISSING

# One thread: on a shared 2-core machine, two OpenMP threads wait at barriers for a descheduled
# sibling, which made small fits here 10-30x slower. Child processes inherit the variable.
torch.set_num_threads(1)
os.environ["OMP_NUM_THREADS"] = "1"


@pytest.fixture
def cora_root(tmp_path: Path) -> Path:
    """A writable copy of the offline Cora raw files (PyG writes processed/ beside raw/)."""
    if not CORA_RAW.is_dir():
        pytest.skip(f"Cora raw files not found at {CORA_RAW}")
    shutil.copytree(CORA_RAW, tmp_path / "Cora" / "raw")
    return tmp_path


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true, a test skipped for a missing sampling backend fails instead."""
    outcome = yield
    report = outcome.get_result()
    if (
        os.environ.get("CI") == "true"
        and report.skipped
        and BACKEND_MISSING in str(report.longrepr)
    ):
        report.outcome = "failed"
        report.longrepr = f"CI=true and the {BACKEND_MISSING}: the build is broken"
