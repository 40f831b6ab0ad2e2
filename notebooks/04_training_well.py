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
# # Is my model training well?
#
# Accuracy is the last thing to move when training goes wrong. This notebook trains GraphSAGE
# with neighbour sampling (the [`recipes/neighbor_sage`](../recipes/neighbor_sage/README.md)
# setup, on a small generated graph) and runs four checks on it:
#
# 1. **Gradients and activations during training**, logged by `gnnscale.GradActivationMonitor`,
#    for a healthy run and for one with a learning rate that is too high.
# 2. **Sampled against exact evaluation** of the same checkpoint.
# 3. **Embeddings**: does the hidden layer separate the classes?
# 4. **One prediction explained** with PyG's `GNNExplainer`: which edges and features did it
#    rely on?
#
# The monitor is a plain Lightning callback, so any recipe gets it from the command line:
#
# ```bash
# gnnscale fit --config recipes/neighbor_sage/config.yaml \
#     --trainer.callbacks+=gnnscale.GradActivationMonitor --trainer.callbacks.log_every_n_steps=10
# ```
#
# All sizes are in the next cell, set for a CPU run of about a minute. On a GPU, set
# `ACCELERATOR = "gpu"` and raise the graph's `num_nodes` to a few hundred thousand, `HIDDEN`
# to 256, `EPOCHS` to 10 or more and `LOG_EVERY` to 10 or more (every logged step synchronises
# the GPU with the host). `TSNE_NODES` is bounded by t-SNE's CPU time, not by the GPU.

# %%
import csv
import logging
import statistics
import time
import warnings
from functools import partial

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm, imported by PyG
warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*'NeighborSampler' without a 'pyg-lib'.*")
warnings.filterwarnings("ignore", ".*isinstance.treespec, LeafSpec.*")  # Lightning vs torch 2.13
warnings.filterwarnings("ignore", ".*callbacks used to create the checkpoint.*")

import lightning as L
import matplotlib.pyplot as plt
import networkx as nx
import torch
from IPython.display import Markdown, display
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from sklearn.manifold import TSNE
from torch_geometric.explain import Explainer, GNNExplainer
from torch_geometric.utils import k_hop_subgraph

from gnnscale import EvalArgs, GradActivationMonitor, GraphSAGE, NeighborDataModule, SyntheticGraph

for lib in ("lightning.pytorch", "lightning.fabric"):  # only what we print
    logging.getLogger(lib).setLevel(logging.ERROR)

GRAPH = SyntheticGraph(
    num_nodes=5_000, avg_degree=12, num_features=32, num_classes=6, feature_noise=4.0
)
HIDDEN = 64
FANOUT = [10, 10]  # training fan-out per layer
BATCH_SIZE = 128  # seed nodes per step: 1,500 training nodes give 12 steps per epoch
EPOCHS = 8
LEARNING_RATES = {"healthy (lr 0.01)": 0.01, "too high (lr 0.5)": 0.5}
LOG_EVERY = 2  # optimizer steps between monitor readings
EVAL_FANOUTS = [[2, 2], FANOUT]  # fan-outs for sampled evaluation; the first deliberately small
EVAL_REPEATS = 3  # sampled evaluation is random: repeat it to see the spread
TSNE_NODES = 1_500
EXPLAIN_EPOCHS = 200  # GNNExplainer optimisation steps
TOP_EDGES = 12
ACCELERATOR = "cpu"
torch.set_num_threads(1)  # small graph: more threads mostly wait on each other


# %% [markdown]
# ## 1. Gradients and activations during training
#
# `GradActivationMonitor` reads, every `LOG_EVERY` optimizer steps, the gradient norm of the
# whole model and of each message-passing layer (in `on_before_optimizer_step`, so after
# gradient accumulation and fp16 unscaling), and the mean, standard deviation and zero fraction
# of each layer's output on that step's training batch (forward hooks, removed when `fit`
# ends). Two fractions tell dead ReLUs apart from healthy sparsity: *zero* is the share of
# outputs a ReLU sets to zero (around half is normal), *dead* the share of channels that are
# zero for every node in the batch, which therefore pass no gradient at all.


# %%
def train(lr: float) -> tuple[GraphSAGE, str, str]:
    """Train GraphSAGE with the monitor; return the model, best checkpoint and metrics file."""
    L.seed_everything(0, verbose=False)
    data = NeighborDataModule(
        root="data", synthetic=GRAPH, num_neighbors=FANOUT, batch_size=BATCH_SIZE
    )
    model = GraphSAGE(
        GRAPH.num_features,
        GRAPH.num_classes,
        hidden_channels=HIDDEN,
        dropout=0.3,
        optimizer=partial(torch.optim.Adam, lr=lr),
    )
    checkpoint = ModelCheckpoint(monitor="val/acc", mode="max")
    trainer = L.Trainer(
        accelerator=ACCELERATOR,
        max_epochs=EPOCHS,
        logger=CSVLogger("runs", name=f"training_well_lr{lr}"),
        log_every_n_steps=LOG_EVERY,  # train/loss at the monitor's steps
        callbacks=[GradActivationMonitor(log_every_n_steps=LOG_EVERY), checkpoint],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, data)
    return model, checkpoint.best_model_path, f"{trainer.logger.log_dir}/metrics.csv"


def series(path: str) -> dict[str, tuple[list[int], list[float]]]:
    """Every logged metric as (steps, values), from a CSVLogger file."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for row in csv.DictReader(open(path)):
        for key, value in row.items():
            if value and key not in ("step", "epoch"):
                steps, values = out.setdefault(key, ([], []))
                steps.append(int(row["step"]))
                values.append(float(value))
    return out


runs = {}
for name, lr in LEARNING_RATES.items():
    start = time.perf_counter()
    model, best, metrics = train(lr)
    runs[name] = {"model": model, "best": best, "log": series(metrics)}
    print(f"{name}: trained in {time.perf_counter() - start:.1f} s")

# %%
layers = ["gnn.convs.0", "gnn.convs.1"]
panels = [
    ("train/loss_step", "training loss", "log"),
    ("monitor/grad_norm/{}", "gradient norm per layer", "log"),
    ("monitor/act_std/{}", "output std per layer", "log"),
    ("monitor/act_zero/gnn.convs.0", "convs.0: zeroed by ReLU", "linear"),
]
colors = dict(zip(runs, ["tab:blue", "tab:red"], strict=True))
styles = dict(zip(layers, ["-", "--"], strict=True))
fig, axes = plt.subplots(1, 4, figsize=(15, 3.4))
for ax, (key, title, yscale) in zip(axes, panels, strict=True):
    for name, run in runs.items():
        for layer in layers if "{}" in key else [None]:
            steps, values = run["log"][key.format(layer)]
            label = name if layer is None else f"{name}, {layer.removeprefix('gnn.')}"
            ax.plot(steps, values, styles.get(layer, "-"), color=colors[name], label=label, lw=1)
    ax.set(title=title, xlabel="optimizer step", yscale=yscale)
axes[3].set_ylim(0, 1)
axes[1].legend(fontsize=7)
fig.tight_layout()

# %%
for name, run in runs.items():
    log = run["log"]
    std0 = log["monitor/act_std/gnn.convs.0"][1]
    print(
        f"{name:18s} median grad norm {statistics.median(log['monitor/grad_norm_total'][1]):6.2f}"
        f"  output std of convs.0: first {std0[0]:.2f}, last {std0[-1]:.2f}"
        f" (x{std0[-1] / std0[0]:.1f})"
        f"  zeroed by ReLU: first {log['monitor/act_zero/gnn.convs.0'][1][0]:.2f},"
        f" last {log['monitor/act_zero/gnn.convs.0'][1][-1]:.2f}"
        f"  max dead channels {max(log['monitor/act_dead/gnn.convs.0'][1]):.2f}"
        f"  best val acc {max(log['val/acc'][1]):.3f}"
    )

# %% [markdown]
# How to read it. In the healthy run the gradient norm falls with the loss and then levels off,
# the layer outputs keep roughly the scale they started with, and the ReLU zeroes about half of
# the first layer's outputs throughout. With too high a learning rate the gradient norm jumps
# within the first steps and stays far higher, the outputs of both layers grow step after step
# (the second layer's are the logits, hence the large, noisy loss), and the share that the ReLU
# zeroes creeps up. No channel died in either run (the printed maximum), but that is where this
# drift leads: a channel that is negative for every node gets no gradient and cannot recover.
# Now compare the best validation accuracies: much closer than the curves. That is the point of
# monitoring: the curves show the problem before the metric does, and they show which layer it
# starts in. The usual fixes are a lower learning rate, a warm-up, gradient clipping
# (`--trainer.gradient_clip_val`) or a norm layer (`--model.init_args.norm=layer_norm`).
#
# ## 2. Sampled against exact evaluation
#
# The healthy run's best checkpoint is evaluated on the test nodes in three modes
# (`EvalArgs(mode=...)`, `--data.init_args.eval.mode` in YAML). `sampled` evaluates each test
# node on a sampled neighbourhood, as training does, so the result is random and depends on the
# fan-out. `layerwise` and `full` are exact and should agree to floating point. `full` is one
# forward pass over the whole graph, with every layer's activations for every node;
# `layerwise` computes one layer at a time for all nodes, in batches with full one-hop
# neighbourhoods, so it needs one layer's output for the graph, never all layers' at once.

# %%
healthy = runs[next(iter(runs))]
tester = L.Trainer(
    accelerator=ACCELERATOR, logger=False, enable_progress_bar=False, enable_model_summary=False
)


def evaluate(mode: str, fanout: list[int] | None, seed: int = 0) -> tuple[float, float]:
    """Test accuracy of the healthy run's best checkpoint, and seconds taken."""
    L.seed_everything(seed, verbose=False)
    data = NeighborDataModule(
        root="data",
        synthetic=GRAPH,
        num_neighbors=FANOUT,
        eval=EvalArgs(mode=mode, num_neighbors=fanout, batch_size=1024),
    )
    _ = data.data  # generate the graph before the clock starts
    start = time.perf_counter()
    (result,) = tester.test(healthy["model"], data, ckpt_path=healthy["best"], verbose=False)
    return result["test/acc"], time.perf_counter() - start


exact = {mode: evaluate(mode, None) for mode in ("layerwise", "full")}
sampled = {
    str(f): [evaluate("sampled", f, seed) for seed in range(EVAL_REPEATS)] for f in EVAL_FANOUTS
}
rows = ["| evaluation | fan-out | test acc | seconds |", "|---|---|---|---|"]
for fanout, results in sampled.items():
    accs, secs = zip(*results, strict=True)
    rows.append(
        f"| sampled ({EVAL_REPEATS} seeds) | {fanout} | {statistics.mean(accs):.4f} ± "
        f"{statistics.stdev(accs):.4f} | {statistics.mean(secs):.2f} |"
    )
for mode, (acc, sec) in exact.items():
    rows.append(f"| {mode} (exact) | all | {acc:.4f} | {sec:.2f} |")
display(Markdown("\n".join(rows)))
for fanout, results in sampled.items():
    accs = [acc for acc, _ in results]
    gap = exact["layerwise"][0] - statistics.mean(accs)
    print(
        f"sampled {fanout}: {gap:+.4f} below exact, "
        f"{gap / max(statistics.stdev(accs), 1e-9):.0f}x its seed-to-seed spread"
    )

# %% [markdown]
# With a small fan-out the sampled estimate sits below the exact one by many times its own
# seed-to-seed spread: it is biased, not just noisy, and it understates what the model can do.
# With the training fan-out the printed gap is much smaller. Validation accuracy computed this
# way still ranks checkpoints, but only against others measured the same way. On a graph this
# small all four timings are short; on a large graph `layerwise` costs about one
# full-neighbourhood pass per layer, which is why gnnscale uses it by default and keeps
# `sampled` for graphs where even that is too slow.
#
# ## 3. Embeddings
#
# The hidden representation is the input of the last message-passing layer. A forward
# pre-hook on that layer records it during one ordinary forward pass over the whole graph; no
# model code is copied. t-SNE then maps a random sample of test nodes to 2-D, once for the raw
# features and once for the hidden representation, coloured by the true class.

# %%
model = GraphSAGE.load_from_checkpoint(healthy["best"]).eval()  # the same best checkpoint
graph = NeighborDataModule(root="data", synthetic=GRAPH).data
captured = {}
hook = model.gnn.convs[-1].register_forward_pre_hook(
    lambda module, inputs: captured.update(hidden=inputs[0].detach())
)
with torch.no_grad():
    logits = model(graph.x, graph.edge_index)
hook.remove()
pred = logits.argmax(-1)

g = torch.Generator().manual_seed(0)
test_nodes = graph.test_mask.nonzero().view(-1)
sample = test_nodes[torch.randperm(test_nodes.numel(), generator=g)[:TSNE_NODES]]
fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
views = {"input features": graph.x, "hidden layer (input of the last conv)": captured["hidden"]}
for ax, (title, values) in zip(axes, views.items(), strict=True):
    xy = TSNE(init="pca", random_state=0).fit_transform(values[sample].numpy())
    ax.scatter(xy[:, 0], xy[:, 1], c=graph.y[sample], cmap="tab10", s=4, vmax=9)
    ax.set(title=title, xticks=[], yticks=[])
fig.tight_layout()
acc = (pred[sample] == graph.y[sample]).float().mean().item()
print(f"{TSNE_NODES} test nodes; the model classifies {acc:.1%} of them correctly")

# %% [markdown]
# The raw features carry the class only as a weak signal under heavy noise, so their t-SNE is a
# blur; after one round of neighbourhood averaging the classes form separate clusters. A hidden
# layer that still looked like the left panel after training would mean the model is not using
# the graph (or not learning at all).
#
# ## 4. One prediction explained
#
# `GNNExplainer` learns a soft mask over edges and over node features that keeps the model's
# prediction for one node while using as little of the graph as it can. A two-layer model sees
# only a node's two-hop neighbourhood, so the explanation runs on that subgraph: the same
# model, the same computation for the target node, far fewer edges.

# %%
target = int(test_nodes[0])
subset, edge_index, mapping, _ = k_hop_subgraph(
    target, model.num_layers, graph.edge_index, relabel_nodes=True, num_nodes=graph.num_nodes
)
explainer = Explainer(
    model=model,
    algorithm=GNNExplainer(epochs=EXPLAIN_EPOCHS),
    explanation_type="model",
    node_mask_type="attributes",
    edge_mask_type="object",
    model_config=dict(mode="multiclass_classification", task_level="node", return_type="raw"),
)
torch.manual_seed(0)
start = time.perf_counter()
explanation = explainer(graph.x[subset], edge_index, index=int(mapping))
print(
    f"node {target}: class {int(graph.y[target])}, predicted {int(pred[target])}; "
    f"{subset.numel()} nodes and {edge_index.size(1)} edges in its {model.num_layers}-hop "
    f"neighbourhood; explained in {time.perf_counter() - start:.1f} s"
)

# %%
edge_mask, node_mask = explanation.edge_mask, explanation.node_mask
top = edge_mask.topk(min(TOP_EDGES, edge_mask.numel())).indices
same = graph.y[subset][edge_index[0]] == graph.y[target]  # source node in the target's class
into = edge_index[1] == int(mapping)  # edges that end at the target itself
print(
    f"edges from a node of the target's class: {same[top].float().mean():.0%} of the top "
    f"{top.numel()}, {same[into].float().mean():.0%} of the {int(into.sum())} edges into the "
    f"target, {same.float().mean():.0%} of all edges in its neighbourhood"
)
print(f"top {top.numel()} edges that end at the target: {into[top].float().mean():.0%}")

fig, (ax_g, ax_f) = plt.subplots(1, 2, figsize=(12, 4.6), width_ratios=[1.3, 1])
g_top = nx.DiGraph()
for e in top.tolist():
    src, dst = edge_index[:, e].tolist()
    g_top.add_edge(int(subset[src]), int(subset[dst]), weight=float(edge_mask[e]))
pos = nx.spring_layout(g_top, seed=0)
nodes = list(g_top.nodes)
nx.draw_networkx_nodes(
    g_top, pos, ax=ax_g, node_color=[int(graph.y[n]) for n in nodes], cmap="tab10", vmin=0,
    vmax=9, node_size=[500 if n == target else 200 for n in nodes], edgecolors="k",
)  # fmt: skip
widths = [4 * d["weight"] / float(edge_mask.max()) for *_, d in g_top.edges(data=True)]
nx.draw_networkx_edges(g_top, pos, ax=ax_g, width=widths, arrowsize=10, node_size=300)
ax_g.set_title(f"top {top.numel()} edges for node {target} (large), colour = class")
ax_g.axis("off")

feature_score = node_mask.sum(0)  # summed over the neighbourhood's nodes
order = feature_score.argsort(descending=True)[:10]
ax_f.barh([f"x[{i}]" for i in order.tolist()], feature_score[order].numpy())
ax_f.invert_yaxis()
ax_f.set_title("feature importance (node mask summed over nodes)")
fig.tight_layout()

# How far the predicted class's mean feature vector sits from the overall mean, per feature:
# a ground truth of sorts for the generated graph, whose features are class centroids + noise.
separation = (graph.x[graph.y == pred[target]].mean(0) - graph.x.mean(0)).abs()
ranks = torch.stack([feature_score.argsort().argsort(), separation.argsort().argsort()]).float()
print(
    f"rank correlation of feature importance with the class's feature separation: "
    f"{torch.corrcoef(ranks)[0, 1]:.2f}"
)

# %% [markdown]
# Read the printed lines before the picture. A two-layer model receives both layers' messages
# through the target's own edges, and the top edges are (nearly) all of that kind, so the fair
# baseline for "does it lean on same-class neighbours" is the target's own edges, not the whole
# neighbourhood. The feature ranking can be checked too, because the generated features are
# class centroids plus noise: the printed rank correlation compares it with how far the
# predicted class's mean sits from the overall mean, feature by feature. `GNNExplainer`'s masks
# are optimised from a random start, so they change with the seed and with `EXPLAIN_EPOCHS`:
# trust the top few edges, not their exact order. On a real dataset, give the feature bars
# their names.
