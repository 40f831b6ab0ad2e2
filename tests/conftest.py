import shutil
from pathlib import Path

import pytest

from gnnscale import SyntheticGraph

CORA_RAW = (
    Path(__file__).resolve().parents[2] / "shared" / "datasets" / "Planetoid" / "Cora" / "raw"
)

# Small enough for a CPU test, hard enough that features alone are weak (see test_models).
TINY = SyntheticGraph(
    num_nodes=3000, avg_degree=12, num_features=32, num_classes=5, feature_noise=4.0, seed=0
)
TINY_ARGS = [
    "--data.synthetic.num_nodes=3000",
    "--data.synthetic.avg_degree=12",
    "--data.synthetic.num_features=32",
    "--data.synthetic.num_classes=5",
    "--data.synthetic.feature_noise=4.0",
]


@pytest.fixture
def cora_root(tmp_path: Path) -> Path:
    """A writable copy of the offline Cora raw files (PyG writes processed/ beside raw/)."""
    if not CORA_RAW.is_dir():
        pytest.skip(f"Cora raw files not found at {CORA_RAW}")
    shutil.copytree(CORA_RAW, tmp_path / "Cora" / "raw")
    return tmp_path
