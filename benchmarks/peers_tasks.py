"""gnnscale against DGL on the heterogeneous node and link recipes' jobs; where a batch goes.

Part of ``python benchmarks/figures.py peers`` (benchmarks/peers.py builds the peers'
environment and writes the homogeneous rows); ``--size tiny`` checks the pipeline on the
recipes' tiny graphs.

- **The jobs**: ``hetero_node_classification`` as shipped (item classes on 20k users, 10k items,
  200 categories; fan-outs per relation, 512 seed items a batch, 4 epochs here) and
  ``link_prediction_pinsage`` with uniform neighbours, no hard negatives and the binary
  cross-entropy (DGL has no PinSAGE neighbours for a heterogeneous link sampler, and its
  examples, as PyG's, train the binary cross-entropy: ``--data.init_args.neighbors=uniform
  --data.init_args.num_hard_negatives=0 --model.init_args.loss=bce``; 1,024 positives a batch,
  one uniform negative each, 2 epochs here, 3 shipped: an epoch takes about 20 s, and the
  second is the one reported).
  Each graph and split is built by the recipe's own DataModule and dumped to one ``.npz`` that
  ``peer_dgl_tasks.py`` reads: the peer trains the identical job.
- **The runs**, alternated, each a fresh process: ``gnnscale fit`` and the DGL peer, fp32 and
  bf16 autocast (gnnscale's ``bf16-mixed``), at 0 loader workers and at the recipe's 1.
- **Where an epoch goes**: two epochs of each tool's training loop in one process (loader in
  the main process, fp32), each step timed (gnnscale: between Lightning's batch hooks; the step
  includes Lightning's own work); the loader's share is what the steps leave, split into the
  sampler (``HopSampler.sample_seeds``), PyG's gather of the batch (``filter_hetero_data``) and the
  rest (collation, negatives, ``ResumableLoader``). DGL's sampling and gather are timed apart on
  the same seed batches.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import harness
import numpy as np
import torch
from registry import recipe

from recipes import Result, measure

PEER_SCRIPT = Path(__file__).with_name("peer_dgl_tasks.py")
PYG_LOOP = Path(__file__).with_name("pyg_link_loop.py")
RECIPE = {"hetero": "hetero_node_classification", "link": "link_prediction_pinsage"}
# DGL's heterogeneous link sampler has no PinSAGE neighbours, and hard negatives from the
# sampled neighbourhood are gnnscale's: both jobs sample uniformly. The peers train the binary
# cross-entropy of every labelled pair, as DGL's and PyG's examples do; so does gnnscale here
# (the recipe ships the sampled softmax, which ranks better and takes longer).
JOB = {
    "hetero": ("--trainer.max_epochs=4",),
    "link": (
        "--data.init_args.neighbors=uniform",
        "--data.init_args.num_hard_negatives=0",
        "--model.init_args.loss=bce",
        "--trainer.max_epochs=2",
    ),
}
FP32, BF16 = "--trainer.precision=32-true", "--trainer.precision=bf16-mixed"
RUNS = [("fp32", 0), ("bf16", 0), ("fp32", 1)]


def _args(task: str, tiny: bool) -> list[str]:
    entry = recipe(RECIPE[task])
    return [*(entry.tiny if tiny else ()), *JOB[task]]


def _edges(out: dict[str, np.ndarray], stage: str, graph: Any) -> None:
    for etype in graph.edge_types:
        out[f"edge/{stage}/{'__'.join(etype)}"] = graph[etype].edge_index.numpy()


def dump(task: str, path: Path, tiny: bool) -> dict[str, Any]:
    """The job's graph and split, built by the recipe's DataModule, as ``peer_dgl_tasks`` reads."""
    from gnnscale.cli import main

    cli = main(["--config", str(recipe(RECIPE[task]).config), *_args(task, tiny)], run=False)
    dm = cli.datamodule
    out: dict[str, np.ndarray] = {
        "fanout_json": np.array(json.dumps({"__".join(k): v for k, v in dm.fanout().items()})),
        "batch_size": np.array(dm.batch_size),
        "eval_batch_size": np.array(dm.eval.batch_size),
        "epochs": np.array(cli.config["trainer"]["max_epochs"]),
    }
    if task == "hetero":
        data, t = dm.data, dm.target_type
        _edges(out, "all", data)
        ids = {s: dm._mask(f"{s}_mask").nonzero().view(-1) for s in ("train", "val", "test")}
        ids["val"] = dm.eval.validated(dm._mask("val_mask")).nonzero().view(-1)
        out |= {f"{s}_idx": v.numpy() for s, v in ids.items()}
        out |= {"y": data[t].y.numpy(), "target": np.array(t)}
        sizes = {"train": len(ids["train"]), "val": len(ids["val"]), "test": len(ids["test"])}
    else:
        links = dm.links
        train, val, test = links.splits
        for stage, graph in (("train", train), ("val", val), ("test", test)):
            _edges(out, stage, graph)
        label_index, label = links.labels("train")
        out["sup"] = label_index[:, label == 1].numpy()
        for stage in ("val", "test"):
            label_index, label = links.labels(stage)
            out[f"{stage}_label_index"], out[f"{stage}_label"] = label_index.numpy(), label.numpy()
        out["val_known"] = links.known("train").numpy()
        out["test_known"] = links.known("train", "val").numpy()
        data = dm.data
        sizes = {"supervision": out["sup"].shape[1], "test": int(out["test_label"].sum())}
    for t in data.node_types:
        out[f"num/{t}"] = np.array(data[t].num_nodes)
        if "x" in data[t]:
            out[f"x/{t}"] = data[t].x.float().numpy()
    np.savez(path, **out)
    sizes["nodes"] = sum(int(data[t].num_nodes) for t in data.node_types)
    sizes["edges"] = sum(int(data[e].edge_index.size(1)) for e in data.edge_types)
    sizes["epochs"] = int(out["epochs"])
    return sizes


def _gnnscale(task: str, precision: str, workers: int, workdir: Path, tiny: bool) -> dict:
    """One ``gnnscale fit`` of the job in a fresh process (``recipes.measure``)."""
    extra = [
        *_args(task, tiny),
        f"--data.init_args.loader.num_workers={workers}",
        f"--data.init_args.loader.persistent_workers={'true' if workers else 'false'}",
        FP32 if precision == "fp32" else BF16,
    ]
    result: Result = measure(recipe(RECIPE[task]), extra, workdir, False, 0, tiny)
    return {
        "epoch_s": result.epoch_s,
        "wall_s": result.fit_s,
        "metric": result.acc,
        "peak_mib": result.peak_mb,
    }


def _peer(
    python: Path, task: str, graph: Path, precision: str, workers: int, epochs: int, profile: bool
) -> dict[str, Any]:
    """One run of ``peer_dgl_tasks.py`` in a fresh process; its figures."""
    argv = [str(python), str(PEER_SCRIPT), "--task", task, "--graph", str(graph)]
    argv += ["--workers", str(workers), "--epochs", str(epochs)]
    argv += ["--threads", str(torch.get_num_threads())]
    argv += [*(["--bf16"] if precision == "bf16" else []), *(["--profile"] if profile else [])]
    done = harness.run(argv, timeout_s=3600)
    line = next(x for x in done.stdout.splitlines() if x.startswith("PEER_RESULT "))
    out = json.loads(line.removeprefix("PEER_RESULT "))
    if profile:
        return out
    train = out["train_s"]
    return {
        "epoch_s": statistics.median(train[1:] or train),
        "wall_s": done.wall_s,
        "metric": out["test"],
        "peak_mib": max(out["peak_rss_mib"], out.get("children_peak_rss_mib") or 0),
        "versions": out["versions"],
    }


def _pyg_loop(graph: Path, precision: str, epochs: int) -> dict[str, Any]:
    """One run of ``pyg_link_loop.py`` (the link job as a plain PyG loop) in a fresh process."""
    argv = [sys.executable, str(PYG_LOOP), "--graph", str(graph), "--epochs", str(epochs)]
    done = harness.run([*argv, *(["--bf16"] if precision == "bf16" else [])], timeout_s=3600)
    line = next(x for x in done.stdout.splitlines() if x.startswith("PYG_RESULT "))
    out = json.loads(line.removeprefix("PYG_RESULT "))
    train = out["train_s"]
    return {"epoch_s": statistics.median(train[1:] or train), "peak_mib": done.peak_mb}


def profile_gnnscale(task: str, tiny: bool) -> dict[str, Any]:
    """Where the second of two training epochs goes, in this process (module docstring)."""
    import lightning as L
    import torch_geometric.loader.link_loader as link_loader
    import torch_geometric.loader.node_loader as node_loader
    from peers import _Timed

    from gnnscale.cli import main
    from gnnscale.sampling import HopSampler

    class Steps(L.Callback):
        def on_train_epoch_start(self, *_: Any) -> None:
            self.start, self.steps, self.sizes = time.perf_counter(), [], []
            timed.seconds.clear()

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, *_: Any) -> None:
            self.step_start = time.perf_counter()
            self.sizes.append((batch.num_nodes, batch.num_edges))

        def on_train_batch_end(self, *_: Any) -> None:
            self.steps.append(time.perf_counter() - self.step_start)

        def on_train_epoch_end(self, *_: Any) -> None:
            self.epoch_s = time.perf_counter() - self.start

    timed, steps = _Timed(), Steps()
    patches = [
        (HopSampler, "_sample", "sample"),
        (node_loader, "filter_hetero_data", "gather"),
        (link_loader, "filter_hetero_data", "gather"),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, label in patches:
            setattr(owner, name, timed.wrap(label, getattr(owner, name)))
        argv = ["--config", str(recipe(RECIPE[task]).config), *_args(task, tiny), FP32]
        argv += ["--data.init_args.loader.num_workers=0"]
        argv += ["--data.init_args.loader.persistent_workers=false"]
        torch.manual_seed(0)
        cli = main(argv, run=False)
        trainer = L.Trainer(
            max_epochs=2,
            precision="32-true",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
            num_sanity_val_steps=0,
            callbacks=[steps],
        )
        trainer.fit(cli.model, cli.datamodule)
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)
    parts = dict(timed.seconds)
    loader_s = steps.epoch_s - sum(steps.steps)
    parts["rest"] = loader_s - sum(parts.values())
    return {
        "epoch_s": steps.epoch_s,
        "loader_s": loader_s,
        "parts": parts,
        "step_s": sum(steps.steps),
        "batches": len(steps.steps),
        "nodes": statistics.mean(n for n, _ in steps.sizes),
        "edges": statistics.mean(e for _, e in steps.sizes),
    }


def _tools(task: str, workers: int) -> tuple[str, ...]:
    """The runs of a round: the plain PyG loop for the link job, in the main process."""
    return ("gnnscale", "dgl", "pyg") if task == "link" and not workers else ("gnnscale", "dgl")


def measure_task(task: str, python: Path, tiny: bool, workdir: Path) -> dict[str, Any]:
    """Every run of ``task``, alternated over rounds, and both profiles."""
    graph = workdir / f"{task}.npz"
    sizes = dump(task, graph, tiny)
    results: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in range(1 if tiny else 3):
        for precision, workers in RUNS:
            for tool in _tools(task, workers):
                print(f"peers: {task}, round {r + 1}, {tool}, {precision}, {workers} workers")
                if tool == "gnnscale":
                    out = _gnnscale(task, precision, workers, workdir, tiny)
                elif tool == "dgl":
                    out = _peer(python, task, graph, precision, workers, sizes["epochs"], False)
                else:
                    out = _pyg_loop(graph, precision, sizes["epochs"])
                results[(tool, precision, workers)].append(out)
    profiles = {
        "gnnscale": profile_gnnscale(task, tiny),
        "dgl": _peer(python, task, graph, "fp32", 0, sizes["epochs"], True),
    }
    return {"sizes": sizes, "results": results, "profiles": profiles}


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _cells(runs: list[dict[str, Any]], key: str, digits: int) -> str:
    each = " / ".join(f"{r[key]:.{digits}f}" for r in runs)
    return f"{_median(runs, key):.{digits}f} ({each})" if len(runs) > 1 else each


def _table(task: str, m: dict[str, Any], metric: str) -> list[str]:
    res = m["results"]
    rows = [
        f"| tool | precision | loader workers | s/epoch, training | whole run, s | {metric} "
        "| peak RSS (MiB) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    label = {"gnnscale": "gnnscale `fit`", "dgl": "DGL 2.1.0", "pyg": "plain PyG loop"}
    for precision, workers in RUNS:
        for tool in _tools(task, workers):
            runs = res[(tool, precision, workers)]
            whole, metrics = "–", "–"  # the plain loop trains alone
            if tool != "pyg":
                whole = _cells(runs, "wall_s", 0)
                metrics = " / ".join(f"{r['metric']:.3f}" for r in runs)
            rows.append(
                f"| {label[tool]} | {precision} | {workers} | {_cells(runs, 'epoch_s', 2)} | "
                f"{whole} | {metrics} | {_median(runs, 'peak_mib'):,.0f} |"
            )
    return rows


def _profile_rows(profiles: dict[str, Any]) -> list[str]:
    g, d = profiles["gnnscale"], profiles["dgl"]
    p = g["parts"]
    dgl_rest = max(d["loader_s"] - d["sample_s"] - d["gather_s"], 0.0)
    return [
        "| seconds, the second epoch (loader in the main process, fp32) | batches | nodes / "
        "edges a batch | sampling | gather of rows | rest of the loader | loader | steps "
        "| epoch |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| gnnscale | {g['batches']} | {g['nodes']:,.0f} / {g['edges']:,.0f} | "
        f"{p.get('sample', 0):.2f} | {p.get('gather', 0):.2f} | {p['rest']:.2f} | "
        f"{g['loader_s']:.2f} | {g['step_s']:.2f} | {g['epoch_s']:.2f} |",
        f"| DGL 2.1.0 | {d['batches']} | {d['batch_nodes_mean']:,.0f} / "
        f"{d['batch_edges_mean']:,.0f} | {d['sample_s']:.2f} | {d['gather_s']:.2f} | "
        f"{dgl_rest:.2f} | {d['loader_s']:.2f} | {d['step_s']:.2f} | {d['epoch_s']:.2f} |",
    ]


def ratios(m: dict[str, Any]) -> dict[str, float]:
    """The training s/epoch of gnnscale over DGL's, per precision and workers."""
    res = m["results"]
    return {
        f"{precision}, {workers} workers": _median(res[("gnnscale", precision, workers)], "epoch_s")
        / _median(res[("dgl", precision, workers)], "epoch_s")
        for precision, workers in RUNS
    }


def task_lines(task: str, m: dict[str, Any]) -> list[str]:
    """The block's text for one task: what was run, the table, the ratios, the breakdown."""
    s = m["sizes"]
    if task == "hetero":
        intro = (
            f"hetero_node_classification's job ({s['nodes']:,} nodes, {s['edges']:,} edges; "
            f"{s['train']:,} training items, fan-outs per relation as shipped, 512 seeds a batch, "
            f"{s['epochs']} epochs; DGL: `HeteroGraphConv` of `SAGEConv` mean, the same fan-out "
            "per relation). Test: accuracy on every test item, sampled neighbourhoods."
        )
        metric = "test acc"
    else:
        intro = (
            "link_prediction_pinsage's job with uniform neighbours, no hard negatives and the "
            f"binary cross-entropy ({s['nodes']:,} nodes, {s['edges']:,} edges; "
            f"{s['supervision']:,} supervision pairs, 1,024 a batch with one uniform negative "
            "each, fan-out [10, 5] per relation, "
            f"{s['epochs']} epochs; DGL: `as_edge_prediction_sampler` over the training graph, "
            "the supervision pairs a relation of their own with fan-out 0). Test: recall@20 over "
            "every item, known edges left out."
        )
        metric = "test recall@20"
    ratio = ", ".join(f"{v:.2f}x ({k})" for k, v in ratios(m).items())
    return [
        intro,
        "",
        *_table(task, m, metric),
        "",
        f"gnnscale's training epoch against DGL's: {ratio}.",
        "",
        *_profile_rows(m["profiles"]),
    ]
