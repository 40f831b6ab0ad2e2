import os
import shutil
from pathlib import Path

import pytest
import torch
import torch_geometric.typing
from registry import CORA_RAW

from gnnscale.testing import TORCH_SPARSE_MISSING, npy_homogeneous, npy_mag

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


def pytest_collection_modifyitems(config, items):
    """Tests marked ``torch_sparse`` skip where it does not import; with
    GNNSCALE_REQUIRE_TORCH_SPARSE=1 the run stops instead (CI's torch-sparse run)."""
    if torch_geometric.typing.WITH_TORCH_SPARSE:
        return
    if os.environ.get("GNNSCALE_REQUIRE_TORCH_SPARSE") == "1":
        raise pytest.UsageError(f"GNNSCALE_REQUIRE_TORCH_SPARSE=1, but {TORCH_SPARSE_MISSING}")
    for item in items:
        if item.get_closest_marker("torch_sparse") is not None:
            item.add_marker(pytest.mark.skip(reason=TORCH_SPARSE_MISSING))


@pytest.fixture
def homogeneous(tmp_path):
    """A random graph as a .npy folder (int32 edges), and the same graph in memory."""
    folder = tmp_path / "npy"
    return folder, npy_homogeneous(folder)


@pytest.fixture
def heterogeneous(tmp_path):
    """A MAG-shaped graph (papers with labels, authors with float16 features, featureless
    institutions) as a .npy folder, the same graph in memory, and its training papers."""
    folder = tmp_path / "npy"
    return folder, *npy_mag(folder)
