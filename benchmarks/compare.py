"""gnnscale against hand-written PyG loops, the memory-bandwidth limit, and scaling to 10^7 nodes.

Run through ``benchmarks/figures.py compare`` (which writes the README block); ``--size tiny``
checks the pipeline in a minute.

On the same generated graph and in the same run it trains each sampler recipe (neighbour
sampling, Cluster-GCN, GraphSAINT) through the real ``gnnscale`` CLI, as shipped and with the
hand loop's settings (no gradient accumulation; bf16 autocast and fp32), and as a plain PyG
loop (``handwritten.py``) in both precisions, repetitions interleaved (gnnscale, hand,
gnnscale, hand, ...) with medians reported. Then it measures the feature matrix's
random-gather and copy bandwidth, the bytes gnnscale's GATv2 saves for backward against an
O(E * heads * F) bound and the dense formulation, and s/epoch and peak memory of neighbour
sampling at 10^5, 10^6 and 10^7 nodes.
Each configuration runs in a fresh process (``jobs.py`` through ``harness.run``), so every peak
resident memory is that configuration's own.
What each row runs, and the sizes, are ``compare_rows.py``; the medians, ratios and targets
drawn from the runs are ``compare_results.py``.

Writes ``results.json`` (every raw figure and the machine), ``comparison.png`` and
``scaling.png`` to its output folder and returns the README block, with PASS/FAIL for each
target. A missed target does not fail the command: tiny runs make targets meaningless.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
import psutil
import torch
from blocks import Block, Section
from compare_results import WARMUP_EPOCHS, check_targets, summarise_rows
from compare_rows import (
    RECIPES,
    SIZES,
    Row,
    Size,
    cli_flags,
    comparison_rows,
    hand_spec,
    load_config,
    merge,
    row_config,
    yaml_layout,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MEMORY_HEADROOM = 0.85  # use at most this share of the memory available now (a shared machine)
BYTES_PER_EDGE = 100  # peak bytes per edge of graph generation + sampler, measured at 10^6 nodes


# --- running jobs ------------------------------------------------------------------------------


class Runner:
    """Runs each job in a fresh process (``python jobs.py SPEC RESULT`` through ``harness.run``).

    Args:
        workdir: Folder for job specs, results, logs, run logs and caches.
        timeout_s: A job running longer is stopped and reported as failed.
        threads: torch intra-op threads of every job (0: torch's default).
    """

    def __init__(self, workdir: Path, timeout_s: float, threads: int) -> None:
        self.workdir = workdir
        self.timeout_s = timeout_s
        self.threads = threads
        self.count = 0

    def __call__(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        """Run ``spec`` as job ``name`` in a new process; return its result dict."""
        self.count += 1
        slug = f"{self.count:03d}_{name.replace('/', '_')}"
        given = self.workdir / f"{slug}.spec.json"
        result, log = self.workdir / f"{slug}.json", self.workdir / f"{slug}.log"
        spec = {"name": slug, "workdir": str(self.workdir), "threads": self.threads, **spec}
        given.write_text(json.dumps(spec))
        done = harness.run(
            [sys.executable, str(HERE / "jobs.py"), str(given), str(result)],
            # Rows labelled bf16 run bf16 on both sides, also on a CPU without bf16 kernels,
            # where gnnscale would otherwise train its bf16-mixed configs in fp32 (gnnscale.cli).
            env={"GNNSCALE_CPU_BF16": "1"},
            check=False,
            timeout_s=self.timeout_s,
        )
        log.write_text(done.output)  # Lightning's logging stays out of the benchmark's own
        if done.timed_out:
            out = {"error": f"stopped after the {self.timeout_s:.0f} s time limit"}
        elif result.exists():
            out = json.loads(result.read_text())
        else:  # killed (e.g. out of memory) before it could write a result
            out = {"error": f"the job process exited with code {done.returncode} and no result"}
        status = "FAILED" if "error" in out else "ok"
        print(f"  {name:34s} {done.wall_s:7.1f} s  {status}", flush=True)
        if "error" in out:
            last = out["error"].strip().splitlines()[-1]
            print(f"    {last}\n    log: {log}\n{done.output[-3000:]}", flush=True)
        return out


# --- sections ----------------------------------------------------------------------------------


def run_comparisons(runner: Runner, size: Size, rows: list[Row]) -> None:
    """Every row once per repetition, repetitions interleaved so machine noise hits all rows.

    Both sides evaluate once, after the last epoch, and only in the first ``eval_reps``
    repetitions: gnnscale with per-epoch validation (and Lightning's sanity check, a whole
    layer-wise pass) turned off, so ``fit`` ends with one ``test`` pass on the last weights.
    """
    for rep in range(size.reps):
        evaluate = rep < size.eval_reps
        what = "train and evaluate" if evaluate else "train only"
        print(f"comparison, repetition {rep + 1} of {size.reps} ({what})", flush=True)
        for row in rows:
            overrides, cfg = row_config(row, size)
            if row.impl == "hand":
                spec = hand_spec(row.sampler, cfg, rep, size.epochs, runner.workdir)
                spec.update(row.hand, evaluate=evaluate)
            else:
                config = REPO / "recipes" / RECIPES[row.sampler] / "config.yaml"
                trainer = {"max_epochs": size.epochs, "limit_val_batches": 0}
                if not evaluate:
                    trainer["limit_test_batches"] = 0
                args = cli_flags(merge(overrides, {"trainer": trainer}))
                spec = {
                    "kind": "gnnscale",
                    "config": str(config),
                    "seed": rep,
                    "args": args,
                    "env": row.env,
                }
            row.runs.append({"seed": rep, "evaluated": evaluate, **runner(row.key, spec)})


def run_bandwidth(runner: Runner, size: Size, rows: list[Row]) -> dict[str, Any]:
    """Random-gather and copy bandwidth of the neighbour recipe's feature matrix."""
    print("physical limit: memory bandwidth", flush=True)
    _, cfg = row_config(rows[0], size)
    graph = cfg["data"]["init_args"]["synthetic"]
    hand = [r for r in rows if r.key == "neighbor/hand"][0].runs
    per_batch = [
        n / b
        for r in hand
        if "error" not in r
        for n, b in zip(r["rows"], r["batches"], strict=True)
    ]
    spec = {
        "kind": "bandwidth",
        "num_nodes": graph["num_nodes"],
        "num_features": graph["num_features"],
        # a neighbour batch's worth of rows (measured above), at most the whole graph
        "rows": min(int(statistics.median(per_batch)) if per_batch else 1024, graph["num_nodes"]),
        "repeats": size.bandwidth_repeats,
    }
    return runner("bandwidth", spec)


def run_gat_memory(runner: Runner, size: Size) -> dict[str, Any]:
    """Bytes gnnscale.GATv2 saves for backward on the GAT recipe's graph and model (once: exact)."""
    print("GATv2 activation memory", flush=True)
    cfg = merge(load_config("gat_attention_memory"), yaml_layout(size.gat_overrides))
    model = cfg["model"]["init_args"]
    spec = {
        "kind": "gat_memory",
        "graph": cfg["data"]["init_args"]["synthetic"],
        "model": {
            "hidden_channels": model["hidden_channels"],
            "heads": model["heads"],
            "out_heads": model.get("out_heads", 1),
            "dropout": model["dropout"],
        },
    }
    return {"settings": spec, **runner("gat_memory", spec)}


def run_scaling(runner: Runner, size: Size, max_nodes: int) -> list[dict[str, Any]]:
    """s/epoch and peak memory of the neighbour recipe at growing graph sizes.

    Each size trains ``scale_batches`` batches as a warm-up epoch, then ``scale_batches``
    batches timed; s/epoch = s/batch x batches per epoch (extrapolated when an epoch is longer).
    No evaluation: it would dominate at 10^7 nodes.
    """
    print("scaling: neighbour sampling", flush=True)
    cfg = load_config("neighbor_sage")
    data = cfg["data"]["init_args"]
    config = REPO / "recipes" / "neighbor_sage" / "config.yaml"
    points: list[dict[str, Any]] = []
    for n in [n for n in size.scale_nodes if n <= max_nodes]:
        graph = {**data["synthetic"], "num_nodes": n, "num_features": size.scale_features}
        num_train = max(1, int(graph.get("train_fraction", 0.3) * n))
        per_epoch = math.ceil(num_train / data["batch_size"])
        batches = min(size.scale_batches, per_epoch)
        point: dict[str, Any] = {
            "num_nodes": n,
            "avg_degree": graph["avg_degree"],
            "num_features": graph["num_features"],
            "batches_per_epoch": per_epoch,
            "batches_timed": batches,
            "extrapolated": batches < per_epoch,
        }
        need_mb = _predict_peak_mb(points, n, graph["avg_degree"])
        free_mb = psutil.virtual_memory().available / 2**20
        point["predicted_peak_mb"], point["available_mb"] = need_mb, free_mb
        if need_mb > MEMORY_HEADROOM * free_mb:
            point["skipped"] = (
                f"skipped: {n:,} nodes would need about {need_mb:,.0f} MiB, more than "
                f"{MEMORY_HEADROOM:.0%} of the {free_mb:,.0f} MiB available now"
            )
            print(f"  {point['skipped']}", flush=True)
            points.append(point)
            continue
        accumulate = cfg["trainer"].get("accumulate_grad_batches", 1)
        overrides = {
            "data": {"synthetic": graph},
            "trainer": {
                # an epoch shorter than the recipe's accumulation would be refused
                "accumulate_grad_batches": min(accumulate, batches),
                "max_epochs": 1 + WARMUP_EPOCHS,
                "limit_train_batches": batches,
                "limit_val_batches": 0,
                "limit_test_batches": 0,
            },
        }
        spec = {"kind": "gnnscale", "config": str(config), "seed": 0, "args": cli_flags(overrides)}
        run = runner(f"scaling/{n:.0e}", spec)
        point["run"] = run
        if "error" not in run and len(run.get("epoch_s", [])) > WARMUP_EPOCHS:
            point["s_per_batch"] = run["epoch_s"][-1] / batches
            point["epoch_s"] = point["s_per_batch"] * per_epoch
            point["peak_rss_mb"] = run["peak_rss_mb"]
            point["end_rss_mb"] = run["end_rss_mb"]
            point["start_rss_mb"] = run["start_rss_mb"]
        points.append(point)
    return points


def _predict_peak_mb(points: list[dict[str, Any]], n: int, avg_degree: float) -> float:
    """Peak RSS of a scaling point, from the largest point measured so far (memory is ~linear)."""
    done = [p for p in points if "peak_rss_mb" in p]
    if done:
        p = done[-1]
        return p["start_rss_mb"] + (p["peak_rss_mb"] - p["start_rss_mb"]) * n / p["num_nodes"]
    return 1024 + BYTES_PER_EDGE * n * avg_degree / 2**20


# --- main --------------------------------------------------------------------------------------


def blocks(
    size_name: str,
    threads: int,
    sections: set[str] | None = None,
    out: Path = HERE / "results",
    workdir: Path | None = None,
) -> list[Block]:
    """Run the comparison and return the README's ``benchmarks`` block.

    Args:
        size_name: ``full`` (the recipe graphs) or ``tiny`` (a check of the pipeline).
        threads: torch threads per measured process (0: torch's default). On a shared machine,
            more than one lets OpenMP threads wait at barriers for a descheduled sibling.
        sections: Subset of compare, bandwidth, gat, scaling (default: all).
        out: Folder for ``results.json`` and the plots (inside the repository for the README).
        workdir: Keep job logs and caches here (default: a temporary folder).
    """
    size = SIZES[size_name]
    if size_name == "tiny" and out.resolve().is_relative_to(REPO):
        out = Path(tempfile.mkdtemp(prefix="gnnscale-tiny-results-"))  # tiny writes nothing here
        atexit.register(shutil.rmtree, out, ignore_errors=True)  # nor leaves it behind
    sections = sections or {"compare", "bandwidth", "gat", "scaling"}
    max_nodes = max(size.scale_nodes)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gnnscale-bench-") as tmp:
        folder = workdir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        runner = Runner(folder, size.timeout_s, threads)
        results: dict[str, Any] = {
            "size": size_name,
            "settings": {**size.__dict__, "warmup_epochs": WARMUP_EPOCHS, "threads": threads},
            "machine": runner("machine", {"kind": "machine"}),
            "load_avg_start": os.getloadavg(),
        }
        rows = comparison_rows()
        if "compare" in sections:
            run_comparisons(runner, size, rows)
        if "bandwidth" in sections:
            results["bandwidth"] = run_bandwidth(runner, size, rows)
        if "compare" in sections:
            results["comparison"] = summarise_rows(rows, results.get("bandwidth"))
        if "gat" in sections:
            results["gat_memory"] = run_gat_memory(runner, size)
        if "scaling" in sections:
            results["scaling"] = run_scaling(runner, size, max_nodes)
    results["targets"] = check_targets(results.get("comparison", {}), results.get("gat_memory"))
    results["wall_s"] = time.perf_counter() - started
    results["load_avg_end"] = os.getloadavg()

    import report  # matplotlib: imported only here, not in every job process

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    report.plots(results, out)
    for t in results["targets"]:
        print(f"{t['result']:4s}  {t['target']}: {t['measured']}", flush=True)
    markdown = report.markdown(results)
    if out.resolve().is_relative_to(REPO):
        plots = "\n".join(
            f"![{name}]({(out / f'{name}.png').resolve().relative_to(REPO)})"
            for name in ("comparison", "scaling")
        )
        markdown += f"\n\n{plots}"
    if size_name == "tiny":
        markdown = "**Tiny settings: a check of the pipeline, not figures.**\n\n" + markdown
    return [Block(Path("benchmarks/README.md"), "benchmarks", markdown)]


SECTION = Section(
    run=lambda tiny, o: blocks("tiny" if tiny else "full", o.threads),
    about=(
        "gnnscale against hand-written PyG loops, memory bandwidth, GATv2 against its O(E) "
        "bound, scaling to 10^7 nodes"
    ),
    writes="benchmarks in benchmarks/README.md; benchmarks/results/",
    threads=lambda o: f"{o.threads or torch.get_num_threads()} torch thread(s) per process",
)
