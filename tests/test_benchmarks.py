"""benchmarks/run.py at tiny size: every figure, row and target is produced, positive and finite.

Timings at this size mean nothing (and targets may fail); the test checks that the command runs
end to end and writes complete outputs.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

from gnnscale.testing import requires_sampler

REPO = Path(__file__).resolve().parents[1]
ROWS = [
    "neighbor/shipped",
    "neighbor/matched",
    "neighbor/hand",
    "cluster/shipped",
    "cluster/hand",
    "cluster/shipped_4_layers",
    "saint/shipped",
    "saint/hand",
    "saint/hand_example",
]
SAMPLERS = {"neighbor": "neighbour", "cluster": "Cluster-GCN", "saint": "GraphSAINT"}
MEDIAN_KEYS = ["epoch_s", "nodes_per_s", "peak_rss_mb", "acc", "gather_GBps", "gather_fraction"]


def _positive(value: float) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


@requires_sampler
def test_benchmark_command_writes_complete_outputs(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "run.py"), "--size", "tiny", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())

    for key in ["cpu_count", "torch", "torch_geometric", "lightning", "sampling_backend"]:
        assert results["machine"][key], key
    assert _positive(results["wall_s"])

    table = results["comparison"]
    assert list(table) == ROWS
    for key, entry in table.items():
        assert all("error" not in r for r in entry["runs"]), (key, entry["runs"])
        for name in MEDIAN_KEYS:
            assert _positive(entry["median"][name]), (key, name)
        if entry["impl"] == "gnnscale":
            ratios = entry["ratio_vs_hand"]
            assert all(_positive(ratios[k]) for k in ("epoch_s", "nodes_per_s", "peak_rss_mb"))
    assert table["cluster/hand"]["same_partition"] is True  # both trained on one partition

    bandwidth = results["bandwidth"]
    assert _positive(bandwidth["gather_GBps"]) and _positive(bandwidth["copy_GBps"])

    gat = results["gat_memory"]
    for impl in ("gnnscale", "pyg"):
        assert _positive(gat[f"{impl}_median"]["saved_mb"]), impl

    scaling = results["scaling"]
    assert [p["num_nodes"] for p in scaling] == [1_000, 10_000]
    for point in scaling:
        assert _positive(point["epoch_s"]) and _positive(point["peak_rss_mb"]), point

    targets = results["targets"]
    assert len(targets) == 3
    for target in targets:
        assert target["result"] in ("PASS", "FAIL") and _positive(target["ratio"]), target
        assert f"{target['result']}  {target['target']}" in proc.stdout

    markdown = (out / "results.md").read_text()
    for entry in table.values():
        row = f"| {SAMPLERS[entry['sampler']]} | {entry['label']} | "
        assert row in markdown and "failed" not in markdown.split(row)[1].split("\n")[0], row
    for target in targets:
        assert f"| {target['target']} |" in markdown
    overhead = results["overhead"]
    assert set(overhead["step_ms"]) == {"plain", "trimmed", "weighted_loss", "lightning"}
    assert all(_positive(v) for v in [overhead["sample_ms"], *overhead["step_ms"].values()])
    sections = ["#### Physical limit", "#### Where gnnscale's time goes", "#### GATv2 activation"]
    for line in [*sections, "| 10,000 | 16 |"]:
        assert line in markdown
    for png in ("comparison.png", "scaling.png"):
        assert (out / png).stat().st_size > 1000
