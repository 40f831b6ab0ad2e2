"""What runs inside each measured process: one configuration per process, so its peak is its own.

``compare.py`` starts every job through ``harness.run`` as a fresh ``python`` process::

    python benchmarks/jobs.py SPEC.json RESULT.json

which reads the job's spec, runs it and writes its result (or its error) as JSON. Each job has
its own address space and its own peak resident memory, like a recipe run.

Jobs:

* ``gnnscale``: the real CLI (``gnnscale.cli.main``, what the ``gnnscale`` command runs) on a
  recipe's ``config.yaml`` plus command-line overrides; figures from its CSV log.
* ``hand``: a plain PyG loop from :mod:`handwritten`.
* ``gat_memory``: what one GATv2 training step saves for backward, against an O(E) bound.
* ``bandwidth``: random row-gather and sequential copy bandwidth of the feature matrix.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import handwritten
import lightning
import torch
import torch.nn.functional as F
import torch_geometric
from torch import Tensor

import gnnscale
from gnnscale.cli import main as gnnscale_main
from gnnscale.measure import peak_rss_mb, read_metrics, rss_mb, saved_tensor_bytes

MIB = 2**20


def machine_info() -> dict[str, Any]:
    """CPU, memory and library versions of the machine the jobs run on."""
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    import psutil

    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu,
        "torch_threads": torch.get_num_threads(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_geometric": torch_geometric.__version__,
        "lightning": lightning.__version__,
        "sampling_backend": gnnscale.sampling_backend(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }
    with contextlib.suppress(ImportError):
        import torch_sparse

        info["torch_sparse"] = torch_sparse.__version__
    return info


# --- gnnscale through its CLI ------------------------------------------------------------------


def run_gnnscale(spec: dict[str, Any]) -> dict[str, Any]:
    """``gnnscale fit --config <recipe>/config.yaml <overrides>`` in this process."""
    os.environ.update(spec.get("env", {}))  # read by gnnscale.cli.main, as in a shell
    save_dir = Path(spec["workdir"]) / "runs" / spec["name"]
    args = [
        "fit",
        "--config",
        spec["config"],
        f"--seed_everything={spec['seed']}",
        "--trainer.enable_progress_bar=false",  # a bar on a pipe is noise; the hand loop has none
        f"--trainer.logger.init_args.save_dir={save_dir}",
        f"--data.init_args.root={Path(spec['workdir']) / 'data'}",
        *spec["args"],
    ]
    cli = gnnscale_main(args)
    cols = read_metrics(Path(cli.trainer.logger.log_dir) / "metrics.csv")
    out: dict[str, Any] = {
        "epoch_s": cols.get("perf/epoch_s", []),
        "nodes_per_s": cols.get("perf/nodes_per_s", []),
        "logged_peak_rss_mb": max(cols.get("perf/peak_rss_mb", [0.0])),
        "val_acc": cols.get("val/acc", []),
        "loss": cols.get("train/loss_epoch", []),
        "acc": (cols.get("test/acc") or [None])[-1],
        "device": str(cli.model.device),
    }
    if "perf/peak_cuda_mb" in cols:
        out["peak_cuda_mb"] = max(cols["perf/peak_cuda_mb"])
    cluster = getattr(cli.datamodule, "_cluster_data", None)
    if cluster is not None:
        p = cluster.partition
        out["partition"] = handwritten.partition_fingerprint(p.node_perm, p.partptr)
    return out


def run_hand(spec: dict[str, Any]) -> dict[str, Any]:
    """A plain PyG loop from :mod:`handwritten`."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = handwritten.TRAINERS[spec["sampler"]](spec)
    if device.type == "cuda":
        out["peak_cuda_mb"] = torch.cuda.max_memory_allocated(device) / MIB
    return out


# --- GATv2 activation memory -------------------------------------------------------------------


def gat_bound_bytes(num_nodes: int, num_edges: int, widths: list[tuple[int, int, int]]) -> int:
    """An O(E * heads * F) bound on what a GATv2 step saves for backward (fp32 bytes).

    Per layer of ``(in_channels, heads, channels per head)``: six tensors of one value per edge
    (self-loops included), head and channel (the source and target rows gathered per edge, their
    sum, its activation, the weighted message and the attention dropout's output) and four node
    tensors of the larger of the input and output widths. A dense formulation's pair tensor
    alone, ``[N, N, 2C]`` per head, is far above it on any graph with ``E << N^2``.
    """
    edges = num_edges + num_nodes
    per_layer = [6 * edges * h * c + 4 * num_nodes * max(i, h * c) for i, h, c in widths]
    return 4 * sum(per_layer)


def dense_pair_bytes(num_nodes: int, widths: list[tuple[int, int, int]]) -> int:
    """The ``[N, N, 2C]`` pair tensor per head and layer of the dense GAT formulation (fp32)."""
    return 4 * sum(num_nodes * num_nodes * 2 * c * h for _, h, c in widths)


def run_gat_memory(spec: dict[str, Any]) -> dict[str, Any]:
    """Bytes one fp32 GATv2 training step saves for backward, against the O(E) bound and dense.

    gnnscale.GATv2 on the GAT recipe's graph and model: its saved bytes (deterministic) must
    stay under :func:`gat_bound_bytes` and far below :func:`dense_pair_bytes`; an attention
    that materialised all N^2 pairs would break both.
    """
    torch.manual_seed(0)
    data = gnnscale.make_synthetic_graph(gnnscale.SyntheticGraph(**spec["graph"]))
    m = spec["model"]
    classes = int(data.y.max()) + 1
    model = gnnscale.GATv2(
        data.num_features,
        classes,
        hidden_channels=m["hidden_channels"],
        num_layers=2,
        heads=m["heads"],
        out_heads=m["out_heads"],
        dropout=m["dropout"],
    )
    model.train()

    def step() -> Tensor:
        return F.cross_entropy(model(data.x, data.edge_index), data.y)

    step().backward()  # warm-up: lazy initialisation
    model.zero_grad(set_to_none=True)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    saved = saved_tensor_bytes(step) - params  # parameters are saved too; they are not activations
    per_head = m["hidden_channels"] // m["heads"]
    widths = [
        (data.num_features, m["heads"], per_head),
        (m["hidden_channels"], m["out_heads"], classes),
    ]
    return {
        "saved_mb": saved / MIB,
        "bound_mb": gat_bound_bytes(data.num_nodes, data.num_edges, widths) / MIB,
        "dense_pairs_mb": dense_pair_bytes(data.num_nodes, widths) / MIB,
        "num_nodes": data.num_nodes,
        "num_edges": data.num_edges,
        "params": sum(p.numel() for p in model.parameters()),
    }


# --- memory bandwidth --------------------------------------------------------------------------


def _median_s(fn: Any, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_bandwidth(spec: dict[str, Any]) -> dict[str, Any]:
    """Random row-gather and sequential copy bandwidth of a feature matrix of the recipe's shape.

    GB/s counts the bytes delivered (gathered rows, or the matrix copied), 1 GB = 10^9 bytes.
    Measured with 1 thread (what a DataLoader worker, which gathers in PyG's loaders, uses) and
    with one thread per CPU.
    """
    n, f, rows = spec["num_nodes"], spec["num_features"], spec["rows"]
    torch.manual_seed(0)
    x = torch.randn(n, f)
    idx = torch.randperm(n)[:rows]  # unique rows in random order, like a sampler's n_id
    dst = torch.empty_like(x)
    out: dict[str, Any] = {"num_nodes": n, "num_features": f, "rows": rows, "by_threads": {}}
    default_threads = torch.get_num_threads()
    for threads in sorted({1, os.cpu_count() or 1}):
        torch.set_num_threads(threads)
        gather_s = _median_s(lambda: x.index_select(0, idx), spec["repeats"])
        copy_s = _median_s(lambda: dst.copy_(x), spec["repeats"])
        out["by_threads"][threads] = {
            "gather_GBps": rows * f * x.element_size() / gather_s / 1e9,
            "copy_GBps": x.nbytes / copy_s / 1e9,
        }
    torch.set_num_threads(default_threads)
    out["gather_GBps"] = max(v["gather_GBps"] for v in out["by_threads"].values())
    out["copy_GBps"] = max(v["copy_GBps"] for v in out["by_threads"].values())
    return out


RUNNERS = {
    "gnnscale": run_gnnscale,
    "hand": run_hand,
    "gat_memory": run_gat_memory,
    "bandwidth": run_bandwidth,
    "machine": lambda spec: machine_info(),
}


def run_job(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one job; return its result, or its error under ``"error"``."""
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    start = time.perf_counter()
    result: dict[str, Any] = {"load_avg_start": os.getloadavg()[0], "start_rss_mb": rss_mb()}
    try:
        result.update(RUNNERS[spec["kind"]](spec))
    except Exception:  # a failed configuration is reported in the results, not fatal
        result["error"] = traceback.format_exc()
        traceback.print_exc()
    result["job_s"] = time.perf_counter() - start
    # this process's own high-water mark (VmHWM), not harness.run's peak, which would be a
    # loader worker's when that is larger: the hand loops' figures are their main process's
    result["peak_rss_mb"] = peak_rss_mb()
    result["end_rss_mb"] = rss_mb()
    result["load_avg_end"] = os.getloadavg()[0]
    return result


def main(argv: list[str]) -> None:
    """``jobs.py SPEC.json RESULT.json``: run the job ``SPEC.json`` names, write its result."""
    spec_path, result_path = argv
    result = run_job(json.loads(Path(spec_path).read_text()))
    Path(result_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
