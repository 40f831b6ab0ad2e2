# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     name: python3
# ---

# %% [markdown]
# # Which sampler should I use?
#
# gnnscale trains the same GraphSAGE model four ways: on the whole graph at once (full batch),
# on sampled neighbourhoods of seed nodes
# ([`recipes/neighbor_sage`](../recipes/neighbor_sage/README.md)), on METIS clusters
# ([`recipes/cluster_gcn`](../recipes/cluster_gcn/README.md)) and on
# random-walk subgraphs ([`recipes/graphsaint`](../recipes/graphsaint/README.md)). This notebook
# runs all four on one generated graph, through the recipes' own configs, and compares test
# accuracy, training time and peak memory.
#
# Every run is `gnnscale fit --config recipes/<name>/config.yaml` with overrides that (1) shrink
# the graph to a CPU size, (2) give all four the same model and the same number of optimizer
# steps, and (3) switch off what the recipes add on top of their sampler (gradient accumulation,
# bf16 autocast and a data-loading worker), so that the four runs differ only in how they batch
# the graph. Full batch has no recipe of its own; it reuses the neighbour-sampling config with
# `--data=gnnscale.FullBatchDataModule`.
#
# All sizes are in the next cell, set for a CPU run of about two minutes. On a GPU, raise
# `NUM_NODES` to `200_000` (the recipes' graph) or more, `HIDDEN` to 256 and `STEPS` to a few
# hundred, and drop the `--trainer.precision=32` override to get the recipes' bf16; the table
# then adds each run's peak CUDA memory. On a CPU that nothing else is using, set `THREADS` to
# its number of cores.

# %%
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
from IPython.display import Markdown, display

from gnnscale.measure import read_metrics

NUM_NODES = 20_000  # the generated graph; the recipes use 200_000
AVG_DEGREE = 15
HIDDEN = 128  # GraphSAGE width, the same for all four
STEPS = 24  # optimizer steps for every sampler: an epoch means different work for each
SEEDS, FANOUT = 512, [15, 10]  # neighbour sampling: seed nodes per batch, fan-out per layer
CLUSTER = ["--data.init_args.num_parts=40", "--data.init_args.clusters_per_batch=4"]
SAINT = ["--data.init_args.batch_size=1000", "--data.init_args.num_steps=10"]
THREADS = 1  # CPU threads per run: on a shared machine more threads wait on each other

# The recipes sit beside the package in a source checkout (pip install -e .); found without
# importing gnnscale here, since every run imports it in its own process.
RECIPES = Path(importlib.util.find_spec("gnnscale").origin).parents[1] / "recipes"
RUNS = Path("runs/which_sampler")

# %% [markdown]
# ## The four runs
#
# The overrides below are the whole difference between this notebook and the recipes. The
# sampler sizes are scaled down with the graph so that the three sampled loaders take a similar
# number of steps per epoch (the *epochs* column of the table shows how many `STEPS` bought);
# full batch takes one step per epoch.

# %%
GRAPH = [
    f"--data.init_args.synthetic.num_nodes={NUM_NODES}",
    f"--data.init_args.synthetic.avg_degree={AVG_DEGREE}",
    "--data.init_args.synthetic.num_features=64",
    "--data.init_args.synthetic.num_classes=10",
    "--data.init_args.synthetic.train_fraction=0.3",
    "--data.init_args.root=data",
]
COMMON = [
    *GRAPH,
    f"--model.init_args.hidden_channels={HIDDEN}",
    "--model.init_args.num_layers=2",
    "--model.init_args.norm=null",  # cluster_gcn's batch norm is for its 4-layer variant
    f"--trainer.max_steps={STEPS}",
    "--trainer.max_epochs=-1",
    "--trainer.accumulate_grad_batches=1",
    "--trainer.precision=32",
    "--data.init_args.loader.num_workers=0",  # sampling in the measured process (see below)
    "--data.init_args.loader.persistent_workers=false",
    "--trainer.num_sanity_val_steps=0",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]
RUNS_TO_DO = {
    "full batch": ("neighbor_sage", ["--data=gnnscale.FullBatchDataModule",
                                     "--data.init_args.eval.mode=full"]),
    "neighbour sampling": ("neighbor_sage", [f"--data.init_args.batch_size={SEEDS}",
                                             f"--data.init_args.num_neighbors={FANOUT}"]),
    "Cluster-GCN": ("cluster_gcn", CLUSTER),
    "GraphSAINT (random walk)": ("graphsaint", SAINT),
}  # fmt: skip

# %% [markdown]
# ## Measuring peak memory honestly
#
# `ThroughputMonitor` logs `perf/peak_rss_mb`, the process's peak resident memory
# (`VmHWM` on Linux). That is a lifetime maximum: run four trainings in one process and every
# run after the largest reports the largest. (Not `ru_maxrss`: a process started from this
# notebook would inherit in it the notebook kernel's own peak.) So each configuration runs in a
# **fresh process**, and its figure is the peak of that whole run: interpreter and libraries,
# the graph, the sampler, training and evaluation. With `num_workers=0` the sampling happens in
# that process too; with a worker, the worker's memory would be missing from the figure.
#
# The floor that every run pays is measured the same way: a process that imports gnnscale and
# generates the graph, and nothing else. The same process then draws one neighbour-sampling
# batch, to see how much of this graph a single batch touches.

# %%
FLOOR = f"""
from gnnscale import NeighborDataModule, SyntheticGraph
from gnnscale.measure import peak_rss_mb
graph = SyntheticGraph(num_nodes={NUM_NODES}, avg_degree={AVG_DEGREE}, num_features=64,
                       num_classes=10, train_fraction=0.3)
dm = NeighborDataModule(synthetic=graph, num_neighbors={FANOUT}, batch_size={SEEDS})
data = dm.data
floor_mb = peak_rss_mb()
batch = next(iter(dm.train_dataloader()))
print(data.num_nodes, data.num_edges, floor_mb, batch.num_nodes)
"""
ENV = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
out = subprocess.run(
    [sys.executable, "-c", FLOOR], env=ENV, capture_output=True, text=True, check=True
)
num_nodes, num_edges, floor_mb, batch_nodes = map(float, out.stdout.split()[-4:])
print(f"graph: {num_nodes:,.0f} nodes, {num_edges:,.0f} directed edges")
print(f"floor (imports + graph, no training): {floor_mb:,.0f} MiB")
print(
    f"one batch of {SEEDS} seeds, fan-out {FANOUT}: {batch_nodes:,.0f} nodes "
    f"({batch_nodes / num_nodes:.0%} of the graph)"
)


# %%
def fit(name: str, recipe: str, extra: list[str]) -> dict[str, float]:
    """Run `gnnscale fit` in a fresh process and read its metrics.csv."""
    save_dir = RUNS / name.split()[0].lower()
    shutil.rmtree(save_dir, ignore_errors=True)
    cmd = [
        sys.executable, "-m", "gnnscale.cli", "fit",
        "--config", str(RECIPES / recipe / "config.yaml"),
        *COMMON, *extra, f"--trainer.logger.init_args.save_dir={save_dir}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    col = read_metrics(save_dir)
    epoch_s = col["perf/epoch_s"]
    result = {
        "test acc": col["test/acc"][-1],
        "epochs": len(epoch_s),
        "s/epoch": statistics.median(epoch_s[1:] or epoch_s),  # after one warm-up epoch
        "train s": sum(epoch_s),  # all training epochs, warm-up included; no evaluation
        "peak MiB": max(col["perf/peak_rss_mb"]),
    }
    if cuda := col.get("perf/peak_cuda_mb"):  # on a GPU, the peak that decides what fits
        result["CUDA MiB"] = max(cuda)
    return result


results = {}
for name, (recipe, extra) in RUNS_TO_DO.items():
    results[name] = fit(name, recipe, extra)
    print(f"{name:26s} " + "  ".join(f"{k} {v:,.3g}" for k, v in results[name].items()))

# %% [markdown]
# ## Results
#
# One seed and a short budget: the accuracy column says how far each loader gets in `STEPS`
# optimizer steps, not where it would end up (the recipe READMEs train longer, on a larger
# graph), and small differences say little. Times depend on the machine and its load; the table
# is rebuilt every time the notebook runs. Test accuracy is that of the best validation
# checkpoint, evaluated exactly for all four (full neighbourhoods), so differences come from
# training, not from evaluation. *Train s* sums the training epochs only (sampling included,
# validation excluded); *above floor* is the peak minus the floor measured above.

# %%
on_gpu = all("CUDA MiB" in r for r in results.values())
header = "| loader | test acc | epochs | s/epoch | train s | peak RSS (MiB) | above floor |"
lines = [header + (" peak CUDA (MiB) |" if on_gpu else ""), "|---" * (8 if on_gpu else 7) + "|"]
for name, r in results.items():
    lines.append(
        f"| {name} | {r['test acc']:.3f} | {r['epochs']:.0f} | {r['s/epoch']:.2f} "
        f"| {r['train s']:.1f} | {r['peak MiB']:,.0f} | {r['peak MiB'] - floor_mb:,.0f} |"
        + (f" {r['CUDA MiB']:,.0f} |" if on_gpu else "")
    )
display(Markdown("\n".join(lines)))

# %%
names = list(results)
colors = ["0.4", "tab:blue", "tab:orange", "tab:green"]
fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
panels = {
    "test accuracy": [r["test acc"] for r in results.values()],
    f"training seconds ({STEPS} steps)": [r["train s"] for r in results.values()],
    f"peak RSS above the {floor_mb:.0f} MiB floor (MiB)": [
        r["peak MiB"] - floor_mb for r in results.values()
    ],
}
for ax, (title, values) in zip(axes, panels.items(), strict=True):
    ax.barh(names, values, color=colors)
    ax.set_title(title, fontsize=10)
    ax.invert_yaxis()
axes[0].set_xlim(0, 1)
for ax in axes[1:]:
    ax.set_yticklabels([])
fig.tight_layout()

# %% [markdown]
# What the measurements say, computed rather than read off by eye:

# %%
full = results["full batch"]
print("accuracy, best first:", ", ".join(sorted(results, key=lambda n: -results[n]["test acc"])))
print(f"{'':26s} {'s/step':>7s} {'vs full':>8s} {'memory above floor vs full':>27s}")
for name, r in results.items():
    step_s, mem = r["train s"] / STEPS, r["peak MiB"] - floor_mb
    print(
        f"{name:26s} {step_s:7.3f} {step_s / (full['train s'] / STEPS):7.2f}x "
        f"{mem / (full['peak MiB'] - floor_mb):26.0%}"
    )

# %% [markdown]
# ## A decision guide
#
# The figures above come from one small graph and one seed; what carries over to large graphs
# are the properties behind them, listed here with what each method costs.
#
# - **The graph and its activations fit in memory: full batch.** Gradients are exact, there is
#   no sampler to tune, and one step uses every edge once. It is the only one of the four whose
#   peak memory grows with the whole graph (nodes × width per layer, plus edges × width for the
#   messages), which is why it sits highest above the floor. It takes one step per epoch, so
#   compare it by steps or by time, never by s/epoch.
# - **A large graph, 2–3 layers: neighbour sampling**
#   ([`recipes/neighbor_sage`](../recipes/neighbor_sage/README.md)). Each seed sees a sample of
#   its real neighbourhood, memory is set by `batch_size × Π fan-out` rather than by the graph,
#   and batches are made of labelled seeds only, which suits graphs where few nodes carry labels.
#   The same product is its weakness: every added layer multiplies the work, and the printed
#   share of the graph that one batch touches shows how much a batch recomputes when the graph
#   is small; that is what its cost per step above reflects.
# - **Deep models: Cluster-GCN** ([`recipes/cluster_gcn`](../recipes/cluster_gcn/README.md)).
#   Every layer runs on the same cluster subgraph, so memory grows linearly with depth instead of
#   with a product of fan-outs; the recipe README measures 2 and 4 layers. The costs: a one-off
#   METIS partition (cached), the edges cut between clusters, and batches that are not uniform
#   samples of the training nodes (on a homophilous graph a cluster is dominated by a few
#   classes), so consecutive gradients disagree more. Merging several clusters per batch
#   (`clusters_per_batch`) restores cut edges and mixes classes.
# - **Subgraphs without a partitioner: GraphSAINT**
#   ([`recipes/graphsaint`](../recipes/graphsaint/README.md)). Random-walk subgraphs are dense,
#   `node_norm` keeps the loss an unbiased estimate of the full-graph loss, and the only set-up
#   is a few sampled subgraphs per node (`sample_coverage`, cached). As with Cluster-GCN, a
#   step's cost is set by the subgraph and grows linearly with depth.
#
# Whatever trains the model, evaluate exactly when you can: `eval.mode: layerwise` gives every
# node its full neighbourhood, one layer at a time over the whole graph, and it is what the
# three sampled runs used (full batch used `full`, which computes the same in one pass).
# Notebook [04](04_training_well.ipynb) compares it with sampled evaluation.
