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
# # Why does GAT run out of memory, and why can a Transformer take long inputs?
#
# A graph attention layer and a Transformer's self-attention both score pairs of nodes (or
# tokens). Written one way, a GAT layer runs out of memory on a few thousand nodes; written
# another way, it scales with the number of edges; and a Transformer, which really does score
# all N² pairs, still takes long sequences. This notebook measures the three formulations side
# by side as N grows, on this machine, and extrapolates to an 80 GB GPU.
#
# The recipe that trains the edge-wise model is
# [`recipes/gat_attention_memory`](../recipes/gat_attention_memory/README.md);
# `benchmarks/gat_memory.py` measures full training steps at the recipe's sizes.
#
# All sizes are in the next cell, set for a CPU run of under a minute. On a GPU, set
# `NODES` up to `2**16` or more and `CAP_BYTES` to a large part of the GPU's memory; the
# measurement then also reports the true peak from `torch.cuda.max_memory_allocated`. On a CPU
# of your own, raise `THREADS` to the number of free cores.

# %%
import math
import time
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm, imported by PyG

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from IPython.display import Markdown, display
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch_geometric.nn import GATv2Conv

from gnnscale import SyntheticGraph, make_synthetic_graph

B = 4  # graphs (or sequences) per batch
FEATURES = 128  # F: channels per node after the layer's linear map; a pair holds 2F
HEADS = 8  # attention heads for GATv2Conv and SDPA, FEATURES // HEADS channels each
AVG_DEGREE = 10  # edge-wise memory scales with edges, so the degree stays fixed as N grows
NODES = [2**k for k in range(6, 14)]  # N: 64 .. 8192 nodes (or tokens) per graph
CAP_BYTES = 2 * 2**30  # skip a size whose saved tensors could pass this (2 GiB on a CPU box)
GPU_BYTES = 80e9  # the budget line: an 80 GB GPU
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
THREADS = 1  # CPU threads; raise to your free cores (on a busy shared box, more threads spin)
torch.set_num_threads(THREADS)
_ = torch.manual_seed(0)

# %% [markdown]
# ## Three ways to compute attention
#
# **Dense pairs (GAT as often written).** The original GAT score is
# $e_{ij} = \mathrm{LeakyReLU}(a^\top [W h_i \,\|\, W h_j])$. Many tutorials compute it for every
# pair at once: repeat $Wh$ along a new axis, concatenate, and apply $a$. That builds a
# `[B, N, N, 2F]` tensor, masks non-edges afterwards, and autograd keeps the tensor for the
# backward pass. Memory is $O(B N^2 F)$, whatever the number of edges.
#
# **Edge-wise (PyG's `GATv2Conv`).** Scores are computed only for the E pairs that are edges:
# gather source and target features per edge (`[E, heads, F/heads]`), score, and normalise with a
# scatter-softmax over each node's incoming edges. Memory is $O(E F)$; at a fixed average degree
# that is $O(N F)$. (For GAT v1 even a dense layer needs no pair tensor:
# $a^\top[Wh_i \| Wh_j] = a_1^\top Wh_i + a_2^\top Wh_j$, two length-N vectors broadcast to N×N
# scores. GATv2 applies the LeakyReLU before $a$, so it does need pair features, and computing
# them per edge is what keeps it affordable.)
#
# **Scaled dot-product attention (Transformers).** `softmax(QKᵀ/√d)·V` scores all N² pairs, but a
# score is one number per pair and head, not a 2F-vector: the largest tensor is `[B, heads, N,
# N]`. With the plain ("math") kernel that matrix is kept for backward. Flash and
# memory-efficient kernels compute it tile by tile, keep only Q, K, V, the output and one
# log-sum-exp per row, and recompute the tiles in the backward pass: memory $O(N d)$, compute
# still $O(N^2 d)$. That is why a Transformer takes long inputs: its memory, not its compute,
# became linear in N.

# %% [markdown]
# ## The arithmetic first
#
# The pair tensor of a dense layer holds `B · N · N · 2F` numbers. For 4 graphs of 500 nodes in
# float32, with 2F = 256 (F = 128 hidden channels), and with 2F = 3200 (an output layer into
# F = 1600 classes, the case of the recipe):


# %%
def pair_tensor_bytes(b: int, n: int, two_f: int, bytes_per_number: int = 4) -> int:
    return b * n * n * two_f * bytes_per_number


for two_f in (256, 3200):
    nbytes = pair_tensor_bytes(4, 500, two_f)
    print(f"4 x 500 x 500 x {two_f} x 4 B = {nbytes / 1e9:5.2f} GB = {nbytes / 2**30:5.2f} GiB")

# %% [markdown]
# That is one tensor, in one layer, before the backward pass, which then allocates the
# gradient of the pair tensor, as large again.
#
# ## How memory is measured here
#
# On a CPU there is no `max_memory_allocated`, and `tracemalloc` does not see PyTorch's
# allocations. What a training step must hold between forward and backward is the set of
# tensors autograd saves for the backward pass, so we count those: a
# `torch.autograd.graph.saved_tensors_hooks` pack hook records every saved tensor's storage
# during one forward pass, deduplicated by storage address (views share a storage), and we sum
# the storage sizes, plus the output's (the next layer's input). The same function measures all
# formulations. It is a lower bound on a step's peak: the backward pass adds gradients, and the
# forward pass may hold temporaries for a moment. On a GPU the cell also records
# `torch.cuda.max_memory_allocated` for the forward.


# %%
def measure(forward) -> tuple[float, float, float]:
    """Bytes saved for backward by ``forward()``, plus its output; CUDA peak (or nan); seconds."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    peak = math.nan
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    seconds = time.perf_counter() - start
    storages[out.untyped_storage().data_ptr()] = out.untyped_storage().nbytes()
    return sum(storages.values()), peak, seconds


# %% [markdown]
# The dense layer below follows the tutorial formulation. Tutorials build the pairs with
# `repeat`, which allocates two more `N × N × F` copies for a moment; `expand` makes views
# instead. The saved tensor, the concatenation, is the same either way.


# %%
class DenseGATLayer(nn.Module):
    """GAT attention over all N² pairs of each graph: builds a [B, N, N, 2F] tensor."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.lin = nn.Linear(channels, channels, bias=False)
        self.att = nn.Parameter(torch.randn(2 * channels) / channels**0.5)

    def forward(self, h: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        wh = self.lin(h)  # [B, N, F]
        b, n, f = wh.shape
        pairs = torch.cat(
            [wh.unsqueeze(2).expand(b, n, n, f), wh.unsqueeze(1).expand(b, n, n, f)], dim=-1
        )
        scores = F.leaky_relu(pairs @ self.att, 0.2)  # [B, N, N]
        alpha = torch.softmax(scores.masked_fill(~adj, float("-inf")), dim=-1)
        return alpha @ wh


def dense_gat(n: int):
    layer = DenseGATLayer(FEATURES).to(DEVICE)
    h = torch.randn(B, n, FEATURES, device=DEVICE)
    adj = torch.rand(B, n, n, device=DEVICE) < AVG_DEGREE / n
    adj |= torch.eye(n, dtype=torch.bool, device=DEVICE)  # self-loops keep every row finite
    return lambda: layer(h, adj)


def edgewise_gat(n: int):
    # B graphs of n nodes batched are one graph of B*n nodes to PyG; only E matters here.
    data = make_synthetic_graph(
        SyntheticGraph(num_nodes=B * n, avg_degree=AVG_DEGREE, num_features=FEATURES)
    ).to(DEVICE)
    conv = GATv2Conv(FEATURES, FEATURES // HEADS, heads=HEADS).to(DEVICE)
    return lambda: conv(data.x, data.edge_index)


def sdpa(backend: SDPBackend):
    def build(n: int):
        qkv = nn.Linear(FEATURES, 3 * FEATURES).to(DEVICE)
        x = torch.randn(B, n, FEATURES, device=DEVICE)

        def forward():
            q, k, v = qkv(x).view(B, n, 3, HEADS, FEATURES // HEADS).permute(2, 0, 3, 1, 4)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v)

        return forward

    return build


flash = SDPBackend.FLASH_ATTENTION if DEVICE.type == "cpu" else SDPBackend.EFFICIENT_ATTENTION
METHODS = {
    "dense pairs [B,N,N,2F]": dense_gat,
    "SDPA, math kernel": sdpa(SDPBackend.MATH),
    f"SDPA, {flash.name.lower()} kernel": sdpa(flash),
    f"GATv2Conv edge-wise (degree {AVG_DEGREE})": edgewise_gat,
}

# %% [markdown]
# ## The sweep
#
# Each formulation runs at N = 64, 128, … until the next size could pass `CAP_BYTES`. The
# guard assumes the worst case (bytes grow as N²) from the last measured size, so it never
# starts a forward pass that could exhaust this machine.

# %%
results: dict[str, list[tuple[int, float, float, float]]] = {}
for name, build in METHODS.items():
    rows = results[name] = []
    for n in NODES:
        if rows and rows[-1][1] * (n / rows[-1][0]) ** 2 > CAP_BYTES:
            break
        saved, peak, seconds = measure(build(n))
        rows.append((n, saved, peak, seconds))

cuda = DEVICE.type == "cuda"
print(f"{'method':<40}{'N':>6}{'saved MiB':>11}{'forward s':>11}" + ("  CUDA peak MiB" * cuda))
for name, rows in results.items():
    for n, saved, peak, seconds in rows:
        peak_column = f"{peak / 2**20:>15,.1f}" if cuda else ""
        print(f"{name:<40}{n:>6}{saved / 2**20:>11,.1f}{seconds:>11.3f}{peak_column}")

# %% [markdown]
# Forward times are from a shared CPU and only indicate the trend: the flash kernel's memory is
# linear in N but its time is not.
#
# The example from the arithmetic above, measured with the same hook (one dense layer,
# 4 graphs of 500 nodes, 2F = 2 · `FEATURES`):

# %%
EXAMPLE_N = 500
saved, _, _ = measure(dense_gat(EXAMPLE_N))
expected = pair_tensor_bytes(B, EXAMPLE_N, 2 * FEATURES)
print(f"pair tensor (arithmetic): {expected / 2**30:.3f} GiB")
print(f"saved for backward + output (measured): {saved / 2**30:.3f} GiB ({saved / expected:.3f} x)")

# %% [markdown]
# ## Slopes and where each formulation stops fitting
#
# On a log-log plot, bytes ∝ N^s is a line of slope s. We fit s on the three largest sizes of
# each formulation (small sizes are dominated by constant costs) and extrapolate to the N at
# which the saved tensors alone reach `GPU_BYTES`.


# %%
def fit_loglog(rows) -> tuple[float, float]:
    """Least-squares slope and intercept of log(bytes) against log(N)."""
    x = torch.tensor([math.log(r[0]) for r in rows], dtype=torch.float64)
    y = torch.tensor([math.log(r[1]) for r in rows], dtype=torch.float64)
    slope = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    return float(slope), float(y.mean() - slope * x.mean())


fits = {name: fit_loglog(rows[-3:]) for name, rows in results.items()}
lines = [
    f"| formulation | slope | N at which {B} graphs/sequences reach {GPU_BYTES / 1e9:.0f} GB |",
    "|---|---:|---:|",
]
for name, (slope, intercept) in fits.items():
    n_full = math.exp((math.log(GPU_BYTES) - intercept) / slope)
    lines.append(f"| {name} | {slope:.2f} | {n_full:,.0f} |")
dense, math_kernel = ({n: s for n, s, _, _ in results[k]} for k in list(METHODS)[:2])
n_both = max(dense.keys() & math_kernel.keys())
lines.append(
    f"\nAt N = {n_both} the dense pairs save {dense[n_both] / math_kernel[n_both]:.0f}x the "
    f"bytes of the SDPA math kernel; 2F / heads = {2 * FEATURES // HEADS}."
)
display(Markdown("\n".join(lines)))

# %%
fig, ax = plt.subplots(figsize=(7, 4.5))
n_max = 2**24
for name, rows in results.items():
    n, kept = [r[0] for r in rows], [r[1] for r in rows]
    (line,) = ax.loglog(n, kept, "o-", label=name)
    slope, intercept = fits[name]
    n_end = min(n_max, math.exp((math.log(GPU_BYTES * 2) - intercept) / slope))
    ax.loglog(
        [n[-1], n_end],
        [kept[-1], math.exp(intercept) * n_end**slope],
        "--",
        color=line.get_color(),
    )
ax.axhline(GPU_BYTES, color="black", lw=1)
ax.text(NODES[0], GPU_BYTES * 1.3, f"{GPU_BYTES / 1e9:.0f} GB GPU", fontsize=9)
ax.axhline(CAP_BYTES, color="grey", lw=0.8, ls=":")
ax.text(NODES[0], CAP_BYTES * 1.3, "sweep cap on this machine", fontsize=8, color="grey")
ax.set_xlabel(f"N: nodes per graph / tokens per sequence (batch of {B})")
ax.set_ylabel("bytes saved for backward + output")
ax.set_title("Attention memory: measured (solid), extrapolated (dashed)")
ax.legend(fontsize=8, loc="lower right")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Reading the plot
#
# - The **dense pair tensor** grows as N² with 2F numbers per pair; it is the first to hit any
#   budget, and the edge count does not help it, since non-edges are masked only after the
#   tensor exists.
# - **SDPA with the math kernel** also grows as N², but with `heads` numbers per pair instead of
#   2F, so its line sits lower by about 2F / heads (the ratio is printed under the table). Its
#   fitted slope approaches 2 from below, because the linear terms (Q, K, V) still count at
#   these sizes.
# - **SDPA with a flash kernel** never stores the N × N matrix: its saved tensors are linear in N.
#   Its time, in the table above, is not.
# - **Edge-wise GATv2Conv** is linear in N at a fixed degree, with a large constant (several
#   E × F tensors per layer): at small N it costs more than the math kernel, and at large N far
#   less than either quadratic formulation.
#
# So a GAT runs out of memory when it is written densely over node pairs; a Transformer takes long
# inputs because the fused kernels make attention memory linear in sequence length. GNN
# attention gets the same effect from sparsity instead: it scores only the edges, and for a
# graph E ≪ N².
#
# ## What to change on a GPU
#
# - `NODES`: extend to `2**16`–`2**20`; `CAP_BYTES`: most of the GPU's memory.
# - The table's "CUDA peak" column then reports `torch.cuda.max_memory_allocated` of the forward
#   pass, which includes temporaries the saved-tensor count misses. For a training step, call
#   `loss.backward()` inside the measured region; `benchmarks/gat_memory.py` does exactly that
#   (`--device cuda --dense-nodes 100 200 300 400 500`).
# - On CUDA the memory-efficient kernel stands in for the CPU flash kernel above; the flash
#   kernel needs fp16/bf16 inputs.
#
# To train the edge-wise model, see
# [`recipes/gat_attention_memory/README.md`](../recipes/gat_attention_memory/README.md): its knobs
# (output heads, a linear head, bf16) trade memory for accuracy on a real training step.
