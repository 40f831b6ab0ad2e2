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

Writes ``results.json`` (every raw figure and the machine), ``comparison.png`` and
``scaling.png`` to its output folder and returns the README block, with PASS/FAIL for each
target. A missed target does not fail the command: tiny runs make targets meaningless.
"""

from __future__ import annotations

import atexit
import copy
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
import psutil
import yaml
from blocks import Block

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RECIPES = {"neighbor": "neighbor_sage", "cluster": "cluster_gcn", "saint": "graphsaint"}
MATCHED = {"precision": "32-true", "accumulate_grad_batches": 1}  # what a plain PyG loop does
WARMUP_EPOCHS = 1
MEMORY_HEADROOM = 0.85  # use at most this share of the memory available now (a shared machine)
BYTES_PER_EDGE = 100  # peak bytes per edge of graph generation + sampler, measured at 10^6 nodes


@dataclass(frozen=True)
class Size:
    """Settings of one benchmark size; overrides use the recipe YAML's layout."""

    epochs: int
    reps: int
    eval_reps: int  # the first repetitions also evaluate (test accuracy, whole-run peak RSS)
    overrides: dict[str, Any]  # applied to every sampler recipe
    sampler_overrides: dict[str, dict[str, Any]]
    gat_overrides: dict[str, Any]
    scale_nodes: tuple[int, ...]
    scale_features: int
    scale_batches: int
    bandwidth_repeats: int
    timeout_s: float


TINY_GRAPH = {  # tests/conftest.py's TINY, with the smoke tests' training fraction
    "num_nodes": 3000,
    "avg_degree": 12,
    "num_features": 32,
    "num_classes": 5,
    "feature_noise": 4.0,
    "train_fraction": 0.3,
}
SIZES = {
    "tiny": Size(
        epochs=2,
        reps=1,
        eval_reps=1,
        overrides={
            "data": {
                "synthetic": TINY_GRAPH,
                "loader": {"num_workers": 0, "persistent_workers": False},
            },
            "model": {"hidden_channels": 64, "optimizer": {"init_args": {"lr": 0.01}}},
        },
        sampler_overrides={
            "neighbor": {"data": {"batch_size": 256}},
            "cluster": {"data": {"num_parts": 20}},
            "saint": {"data": {"batch_size": 300, "num_steps": 4}},
        },
        gat_overrides={"data": {"synthetic": {"num_nodes": 300}}, "model": {"hidden_channels": 64}},
        scale_nodes=(1_000, 10_000),
        scale_features=16,
        scale_batches=3,
        bandwidth_repeats=10,
        timeout_s=300,
    ),
    "full": Size(
        epochs=3,
        reps=2,
        eval_reps=1,  # one exact evaluation costs about an epoch on 1 core: once per row
        overrides={},
        sampler_overrides={},
        gat_overrides={},
        scale_nodes=(100_000, 1_000_000, 10_000_000),
        scale_features=32,  # 10^7 x 100 fp32 features alone would be 4 GB; the graph is 3.2 GB
        scale_batches=10,
        bandwidth_repeats=30,
        timeout_s=1500,
    ),
}


# --- configs -----------------------------------------------------------------------------------


def load_config(recipe: str) -> dict[str, Any]:
    """A recipe's ``config.yaml`` as a dict."""
    return yaml.safe_load((REPO / "recipes" / recipe / "config.yaml").read_text())


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` merged in, recursively (neither is modified)."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def yaml_layout(overrides: dict[str, Any]) -> dict[str, Any]:
    """Overrides in the config file's layout: ``data`` and ``model`` keys go under ``init_args``."""
    return {k: v if k == "trainer" else {"init_args": v} for k, v in overrides.items()}


def cli_flags(overrides: dict[str, Any]) -> list[str]:
    """Command-line flags for overrides in YAML layout (``data``/``model`` go to ``init_args``)."""

    def walk(prefix: str, value: Any) -> list[str]:
        if isinstance(value, dict):
            return [f for k, v in value.items() for f in walk(f"{prefix}.{k}", v)]
        text = value if isinstance(value, str) else json.dumps(value)
        return [f"--{prefix}={text}"]

    flags = []
    for section, value in overrides.items():
        prefix = section if section == "trainer" else f"{section}.init_args"
        flags += walk(prefix, value)
    return flags


def hand_spec(sampler: str, cfg: dict[str, Any], seed: int, epochs: int, workdir: Path) -> dict:
    """The plain PyG loop's settings, read from a (merged) recipe config."""
    model, data = cfg["model"]["init_args"], cfg["data"]["init_args"]
    eval_args = data.get("eval", {})
    if eval_args.get("mode", "layerwise") != "layerwise":
        raise ValueError(f"{sampler}: the hand loops evaluate layer-wise only, as the recipes do")
    keys = {
        "neighbor": ("num_neighbors", "batch_size"),
        "cluster": ("num_parts", "clusters_per_batch", "recursive"),
        "saint": ("batch_size", "walk_length", "num_steps", "sample_coverage"),
    }[sampler]
    defaults = {"recursive": False}
    loader = data.get("loader", {})
    return {
        "kind": "hand",
        "sampler": sampler,
        "seed": seed,
        "epochs": epochs,
        "graph": data["synthetic"],
        "model": {
            "hidden_channels": model["hidden_channels"],
            "num_layers": model["num_layers"],
            "dropout": model["dropout"],
            "norm": model.get("norm"),
            "lr": model["optimizer"]["init_args"]["lr"],
        },
        "data": {k: data.get(k, defaults.get(k)) for k in keys},
        "loader": _loader(loader),
        "eval_batch_size": eval_args.get("batch_size", 4096),  # gnnscale.EvalArgs' default
        "cache_dir": str(workdir / "hand_cache" / sampler),
    }


def _loader(loader: dict[str, Any]) -> dict[str, Any]:
    """A config's workers as gnnscale's loaders take them (``auto`` resolved)."""
    from gnnscale.data.args import LoaderArgs

    args = LoaderArgs(loader.get("num_workers", 0), False, loader.get("persistent_workers", False))
    return {k: v for k, v in args.kwargs().items() if k != "pin_memory"}


@dataclass
class Row:
    """One measured configuration of the comparison table."""

    key: str  # e.g. "neighbor/hand"
    sampler: str
    impl: str  # "gnnscale" or "hand"
    label: str
    overrides: dict[str, Any] = field(default_factory=dict)  # gnnscale: config overrides
    hand: dict[str, Any] = field(default_factory=dict)  # hand loop: extra spec entries
    env: dict[str, str] = field(default_factory=dict)  # gnnscale: environment variables
    ref: str = ""  # gnnscale: the hand row its ratios divide by (same precision)
    runs: list[dict[str, Any]] = field(default_factory=list)


def comparison_rows() -> list[Row]:
    """Rows: gnnscale as shipped and with the hand loop's settings; the hand loop, both precisions.

    Each gnnscale row is divided by the hand loop in its own precision (``ref``): the shipped
    bf16 recipe by the bf16 hand loop, the fp32 runs by the fp32 one.
    """
    rows = []
    for sampler, recipe in RECIPES.items():
        trainer = load_config(recipe)["trainer"]
        precision = trainer.get("precision", "32-true")
        ref = f"{sampler}/hand_bf16" if precision.startswith("bf16") else f"{sampler}/hand"
        shipped = (
            f"gnnscale, config.yaml ({precision}, "
            f"accumulate {trainer.get('accumulate_grad_batches', 1)})"
        )
        rows.append(Row(f"{sampler}/shipped", sampler, "gnnscale", shipped, ref=ref))
        if sampler == "neighbor":
            label = "gnnscale, bf16, no accumulation (= hand loop, bf16)"
            bf16 = {"trainer": {**MATCHED, "precision": "bf16-mixed"}}
            rows.append(Row("neighbor/matched_bf16", sampler, "gnnscale", label, bf16, ref=ref))
        label = "gnnscale, fp32, no accumulation (= hand loop, fp32)"
        rows.append(
            Row(
                f"{sampler}/matched",
                sampler,
                "gnnscale",
                label,
                {"trainer": MATCHED},
                ref=f"{sampler}/hand",
            )
        )
        hand = {"precision": "bf16"}
        if sampler == "saint":  # like for like (the ÷ hand reference), and graph_saint.py's own
            like = {"normalisation": "node_norm"}
            label = "PyG by hand, {}, GraphSAGE + node_norm"
            rows.append(
                Row("saint/hand_bf16", sampler, "hand", label.format("bf16"), hand={**like, **hand})
            )
            rows.append(Row("saint/hand", sampler, "hand", label.format("fp32"), hand=like))
            own = {"normalisation": "example"}
            label = "PyG by hand, fp32, graph_saint.py normalisation (GraphConv, edge_norm)"
            rows.append(Row("saint/hand_example", sampler, "hand", label, hand=own))
        else:
            rows.append(
                Row(f"{sampler}/hand_bf16", sampler, "hand", "PyG by hand, bf16", hand=hand)
            )
            rows.append(Row(f"{sampler}/hand", sampler, "hand", "PyG by hand, fp32"))
        if sampler == "cluster":
            rows.append(
                Row(
                    "cluster/shipped_4_layers",
                    sampler,
                    "gnnscale",
                    shipped + ", 4 layers",
                    # the sampled validation's fan-out: one entry per layer
                    {
                        "model": {"num_layers": 4},
                        "data": {"eval": {"num_neighbors": [15, 10, 10, 10]}},
                    },
                    ref=ref,
                )
            )
    return rows


def row_config(row: Row, size: Size) -> tuple[dict[str, Any], dict[str, Any]]:
    """The row's overrides and its merged recipe config."""
    overrides = merge(size.overrides, size.sampler_overrides.get(row.sampler, {}))
    overrides = merge(overrides, row.overrides)
    return overrides, merge(load_config(RECIPES[row.sampler]), yaml_layout(overrides))


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


def _after_warmup(values: list[float]) -> list[float]:
    return values[WARMUP_EPOCHS:] or values


def summarise_run(run: dict[str, Any], impl: str) -> dict[str, Any]:
    """Median s/epoch and nodes/s after warm-up, peak RSS and accuracy of one run."""
    if "error" in run or not run.get("epoch_s"):
        return {"error": run.get("error", "no epochs were timed")}
    epoch_s = _after_warmup(run["epoch_s"])
    if impl == "hand":
        nodes = _after_warmup(run["loss_nodes"])
        nodes_per_s = [n / s for n, s in zip(nodes, epoch_s, strict=True)]
    else:
        nodes_per_s = _after_warmup(run["nodes_per_s"])
    out = {
        "epoch_s": statistics.median(epoch_s),
        "nodes_per_s": statistics.median(nodes_per_s),
        # evaluated runs: the whole run's peak, as the recipe tables report it; others: training
        "peak_rss_mb" if run["evaluated"] else "peak_rss_train_mb": run["peak_rss_mb"],
    }
    if run["evaluated"]:
        out["acc"] = run["acc"]
    if "loader_only_s" in run:  # the hand loop's training loader, passed once with no model
        out["loader_only_s"] = run["loader_only_s"]
    if "peak_cuda_mb" in run:
        out["peak_cuda_mb"] = run["peak_cuda_mb"]
    return out


def summarise_rows(rows: list[Row], bandwidth: dict[str, Any] | None) -> dict[str, Any]:
    """Medians over repetitions, gnnscale/hand ratios and the achieved feature-gather rate."""
    by_key = {r.key: r for r in rows}
    table: dict[str, Any] = {}
    for row in rows:
        runs = [summarise_run(r, row.impl) for r in row.runs]
        ok = [r for r in runs if "error" not in r]
        entry: dict[str, Any] = {
            "sampler": row.sampler,
            "impl": row.impl,
            "label": row.label,
            "overrides": row.overrides,
            "ref": row.ref,
            "runs": row.runs,
            "per_run": runs,
        }
        keys = sorted({k for r in ok for k in r})
        entry["median"] = {k: statistics.median(r[k] for r in ok if k in r) for k in keys}
        table[row.key] = entry

    partitions = {
        r.get("partition") for row in rows if row.sampler == "cluster" for r in row.runs
    } - {None}
    table["cluster/hand"]["same_partition"] = len(partitions) == 1 if partitions else None
    for entry in table.values():
        hand = table.get(entry["ref"], {}).get("median", {}) if entry["impl"] == "gnnscale" else {}
        med = entry.get("median")
        if not med.get("epoch_s"):
            continue
        # Bytes of x rows the sampler gathers per epoch: counted in the hand loop, which runs the
        # same PyG loader with the same settings on the same graph (every Cluster-GCN epoch
        # visits every node once; neighbour and SAINT batches match in expectation).
        hand_runs = by_key[f"{entry['sampler']}/hand"].runs
        rows_per_epoch = [
            n for r in hand_runs if "error" not in r for n in _after_warmup(r["rows"])
        ]
        if rows_per_epoch:
            row_bytes = next(r["row_bytes"] for r in hand_runs if "row_bytes" in r)
            gathered = statistics.median(rows_per_epoch) * row_bytes
            med["gathered_GB_per_epoch"] = gathered / 1e9
            med["gather_GBps"] = gathered / med["epoch_s"] / 1e9
            if bandwidth and "gather_GBps" in bandwidth:
                med["gather_fraction"] = med["gather_GBps"] / bandwidth["gather_GBps"]
        # The sampling floor: the same PyG sampler with the recipe's workers, no model; an epoch
        # of either side cannot be shorter (#14: once the step is fast, sampling bounds it).
        floor = table.get(f"{entry['sampler']}/hand", {}).get("median", {}).get("loader_only_s")
        if floor:
            med["sampling_floor_s"] = floor
            med["epoch_over_floor"] = med["epoch_s"] / floor
        if hand.get("epoch_s") and entry["impl"] == "gnnscale":
            ratios = entry["ratio_vs_hand"] = {}
            for k in ("epoch_s", "nodes_per_s", "peak_rss_mb", "peak_rss_train_mb", "peak_cuda_mb"):
                if k in med and k in hand:
                    ratios[k] = med[k] / hand[k]
            if "acc" in med and "acc" in hand:
                ratios["acc_diff"] = med["acc"] - hand["acc"]
    return table


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


# --- targets -----------------------------------------------------------------------------------


def check_targets(table: dict[str, Any], gat: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The issue's targets, each with its measured ratio and PASS/FAIL."""
    targets: list[dict[str, Any]] = []

    def add(name: str, ratio: float | None, limit: float, ok: bool | None, how: str) -> None:
        verdict = "n/a" if ok is None else ("PASS" if ok else "FAIL")
        targets.append(
            {"target": name, "ratio": ratio, "limit": limit, "result": verdict, "measured": how}
        )

    acc_tolerance = 0.01
    for key, precision in (("neighbor/matched_bf16", "bf16"), ("neighbor/matched", "fp32")):
        matched = table.get(key, {}).get("ratio_vs_hand", {})
        if "epoch_s" in matched and "acc_diff" in matched:
            ratio, diff = matched["epoch_s"], matched["acc_diff"]
            ok = ratio <= 0.5 and abs(diff) <= acc_tolerance
            how = (
                f"neighbour recipe with the hand loop's settings ({precision}, no accumulation, "
                f"same workers and threads): s/epoch gnnscale / hand = {ratio:.3f}; test "
                f"accuracy difference {diff:+.4f} (equal within {acc_tolerance})"
            )
        else:
            ratio, ok, how = None, None, "a run failed"
        add(
            f"(i) neighbour s/epoch <= 0.5x hand loop, {precision}, equal accuracy",
            ratio,
            0.5,
            ok,
            how,
        )
    for sampler, name in (("cluster", "Cluster-GCN"), ("saint", "GraphSAINT")):
        for key in (f"{sampler}/shipped", f"{sampler}/matched"):
            entry = table.get(key, {})
            ratio = entry.get("ratio_vs_hand", {}).get("epoch_s")
            how = f"{entry.get('label', key)}: s/epoch / {entry.get('ref', 'hand')} = " + (
                "a run failed" if ratio is None else f"{ratio:.3f}"
            )
            ok = None if ratio is None else ratio <= 0.7
            add(f"(iv) {name} s/epoch <= 0.7x hand loop ({key.split('/')[1]})", ratio, 0.7, ok, how)

    if gat and "saved_mb" in gat:
        ratio = gat["saved_mb"] / gat["bound_mb"]
        ok = ratio <= 1.0
        how = (
            f"bytes one fp32 training step of gnnscale.GATv2 saves for backward on the GAT "
            f"recipe's graph ({gat['num_nodes']:,} nodes, {gat['num_edges']:,} edges), over the "
            f"O(E · heads · F) bound: {gat['saved_mb']:,.1f} / {gat['bound_mb']:,.1f} MiB = "
            f"{ratio:.3f}; the dense formulation's [N, N, 2C] pair tensors alone would take "
            f"{gat['dense_pairs_mb']:,.0f} MiB ({gat['dense_pairs_mb'] / gat['saved_mb']:,.0f}x)"
        )
    else:
        ratio, ok, how = None, None, "the run failed"
    add("(ii) GATv2 activation memory <= O(E · heads · F) bound", ratio, 1.0, ok, how)

    two = table.get("cluster/shipped", {}).get("median", {})
    four = table.get("cluster/shipped_4_layers", {}).get("median", {})
    if "peak_rss_mb" in two and "peak_rss_mb" in four:
        ratio = four["peak_rss_mb"] / two["peak_rss_mb"]
        ok = ratio <= 1.25
        how = (
            f"peak RSS of the whole recipe run (graph, partition, training, evaluation), "
            f"4 layers / 2 layers = {ratio:.3f}"
        )
        if "peak_rss_train_mb" in two and "peak_rss_train_mb" in four:
            train = four["peak_rss_train_mb"] / two["peak_rss_train_mb"]
            how += f"; peak RSS of training-only runs {train:.3f}"
        saved = [
            r["saved_mb_by_layers"]
            for r in table["cluster/hand"]["runs"]
            if "saved_mb_by_layers" in r
        ]
        if saved:
            s = saved[0]
            how += (
                f"; activation memory of one training step on the same cluster batch, "
                f"4 / 2 layers = {s['4'] / s['2']:.2f}"
            )
    else:
        ratio, ok, how = None, None, "a run failed"
    add("(iii) Cluster-GCN peak memory at 4 layers <= 1.25x 2 layers", ratio, 1.25, ok, how)
    return targets


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
