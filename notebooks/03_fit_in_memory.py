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
# # How do I fit my graph in memory?
#
# Before a GNN trains, the graph has to sit somewhere: features, edges, labels, the compressed
# copies a sampler builds, and each batch's activations. This notebook estimates those bytes
# before anything runs, checks the estimate against real tensors, and then measures the usual
# ways to shrink them: dropping small components, smaller dtypes, sparse features, tensors
# instead of Python objects in DataLoader workers, and memory-mapped features.
#
# Every figure is printed by the cells below on the machine that ran them. All sizes are in the
# next cell, set for a CPU run of about a minute. On a bigger machine raise `NUM_NODES`,
# `NUM_FEATURES`, `LIST_NODES` and `THREADS`; on a GPU, measure a batch's activations with
# `torch.cuda.max_memory_allocated` instead of the saved-tensor count used here.

# %%
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm, imported by PyG
warnings.filterwarnings("ignore", message=".*pyg-lib.*")  # torch-sparse backend notice
warnings.filterwarnings("ignore", message=".*(LeafSpec|CSR tensor support).*")

import functools
import gc
import logging
import math
import time
from pathlib import Path

import lightning as L
import matplotlib.pyplot as plt
import numpy as np
import psutil
import torch
import torch.nn.functional as F
from scipy.sparse.csgraph import connected_components
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler
from torch_geometric.data import Data
from torch_geometric.loader import NeighborLoader
from torch_geometric.nn import GATv2Conv, GCNConv, SAGEConv
from torch_geometric.utils import to_scipy_sparse_matrix

from gnnscale import (
    FullBatchDataModule,
    GraphSAGE,
    Preprocess,
    SyntheticGraph,
    make_synthetic_graph,
)
from gnnscale.sampling import HopSampler

NUM_NODES = 200_000  # the main graph
AVG_DEGREE = 10
NUM_FEATURES = 128
BATCH_SIZE, FANOUTS, HIDDEN = 1024, [15, 10], 256  # one sampled training batch
LCC_AVG_DEGREE = 1.5  # a sparse graph, to have many small components
FIT_NODES, FIT_EPOCHS, FIT_LR = 5_000, 15, 0.01  # the dtype comparison trains on this
SPARSE_NODES, VOCAB, WORDS_PER_NODE = 50_000, 10_000, 32  # bag-of-words features
LIST_NODES, LIST_NEIGHBOURS = 400_000, 10  # 4M Python ints in the DataLoader demo
NUM_WORKERS, EPOCHS, SEED_FRACTION = 2, 8, 0.05  # each epoch visits 5% of the nodes
MMAP_ROWS = [1, 4, 16, 64, 256, 1024]  # rows gathered from the memory-mapped features
THREADS = 1  # CPU threads; raise to your free cores (on a busy shared box, more threads spin)

torch.set_num_threads(THREADS)
MiB = 2**20
logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # the cells print the counts

# %% [markdown]
# ## 1. Estimate before you run
#
# A node-classification graph in PyG holds:
#
# - features `x`: N × F × (bytes per number);
# - `edge_index`: 2 × E × 8 bytes (int64);
# - labels `y`: N × 8 bytes (int64 class ids) and three boolean split masks, N bytes each;
# - the sampler's compressed copy of the edges: `NeighborLoader` sorts the edges by target into
#   CSC form, `colptr` (N + 1), `row` (E) and a permutation back to `edge_index` order (E),
#   all int64. Cluster-GCN and GraphSAINT build copies of their own, and so does every
#   `NeighborLoader` (training, validation and test loaders: three copies) unless they are
#   given one sampler to share, as gnnscale's DataModules do.
#
# Per sampled batch, a layer works on every sampled node: the seeds, plus up to `fanout₁`
# neighbours each, plus up to `fanout₂` of theirs, and so on. That gives an upper bound on the
# node count; a first estimate of the activations is that count × hidden width × layers × 4
# bytes, which the measurement below calibrates.


# %%
def estimate_graph_bytes(num_nodes: int, num_edges: int, num_features: int) -> dict[str, int]:
    return {
        "x": num_nodes * num_features * 4,
        "edge_index": 2 * num_edges * 8,
        "y": num_nodes * 8,
        "split masks": 3 * num_nodes,
        "sampler CSC (colptr, row, perm)": (num_nodes + 1 + 2 * num_edges) * 8,
    }


def estimate_batch(batch_size: int, fanouts: list[int], hidden: int) -> tuple[int, int]:
    """Upper bound on sampled nodes, and activation bytes nodes x hidden x layers x 4."""
    nodes = batch_size * sum(math.prod(fanouts[:k]) for k in range(len(fanouts) + 1))
    return nodes, nodes * hidden * len(fanouts) * 4


# %% [markdown]
# Now the real thing: generate the graph, build the loader, and read the sizes off the tensors.
# The number of edges is all the estimate needs from the data.

# %%
data = make_synthetic_graph(
    SyntheticGraph(num_nodes=NUM_NODES, avg_degree=AVG_DEGREE, num_features=NUM_FEATURES)
)
loader = NeighborLoader(
    data,
    num_neighbors=FANOUTS,
    batch_size=BATCH_SIZE,
    input_nodes=data.train_mask,
    shuffle=True,
    neighbor_sampler=HopSampler(data, FANOUTS),  # PyG's sampler, no pyg-lib or torch-sparse
)
sampler_tensors = [v for v in vars(loader.node_sampler).values() if torch.is_tensor(v)]
actual = {
    "x": data.x.nbytes,
    "edge_index": data.edge_index.nbytes,
    "y": data.y.nbytes,
    "split masks": sum(data[k].nbytes for k in ("train_mask", "val_mask", "test_mask")),
    "sampler CSC (colptr, row, perm)": sum(t.nbytes for t in sampler_tensors),
}
estimate = estimate_graph_bytes(data.num_nodes, data.num_edges, data.num_features)
print(f"{data.num_nodes:,} nodes, {data.num_edges:,} edges, {data.num_features} features\n")
print(f"{'':<34}{'estimate MiB':>13}{'actual MiB':>12}")
for key in estimate:
    print(f"{key:<34}{estimate[key] / MiB:>13,.1f}{actual[key] / MiB:>12,.1f}")
print(f"{'total':<34}{sum(estimate.values()) / MiB:>13,.1f}{sum(actual.values()) / MiB:>12,.1f}")

# %% [markdown]
# For the batch, we count what autograd keeps for the backward pass during one forward pass of
# `gnnscale.GraphSAGE` (a `saved_tensors_hooks` pack hook, deduplicated by storage; notebook 01
# explains the method). That is the memory a training step holds between forward and backward.


# %%
def saved_bytes(forward) -> int:
    """Bytes of the distinct storages autograd saves during ``forward()``, plus its output."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    pack(out)
    return sum(storages.values())


batch = next(iter(loader))
model = GraphSAGE(data.num_features, 10, hidden_channels=HIDDEN, num_layers=len(FANOUTS))
measured = saved_bytes(lambda: model(batch.x, batch.edge_index))
bound_nodes, bound_bytes = estimate_batch(BATCH_SIZE, FANOUTS, HIDDEN)
simple = batch.num_nodes * HIDDEN * len(FANOUTS) * 4
print(f"sampled nodes: bound {bound_nodes:,}, actual {batch.num_nodes:,}")
print(f"activations: estimate {bound_bytes / MiB:,.0f} MiB, measured {measured / MiB:,.0f} MiB")
print(f"measured / (actual nodes x hidden x layers x 4 B) = {measured / simple:.1f}")

# %% [markdown]
# The node bound overshoots: sampled neighbourhoods overlap, and nodes with fewer neighbours than
# the fan-out contribute fewer. Each layer keeps several hidden-sized tensors per node (its
# input, the aggregated messages, the pre-activation, a dropout mask), which the last ratio above
# counts. Measure one batch this way, and scale by batch size; on a GPU,
# `torch.cuda.max_memory_allocated` after one training step gives the full peak.
#
# ## 2. Drop what message passing cannot use: the largest connected component
#
# Sparse real graphs often have many tiny components and isolated nodes. They cost feature rows
# and edges, and a GNN learns nothing from their structure. `Preprocess(largest_component=True)`
# keeps the largest component (PyG's `LargestConnectedComponents`). Here on a sparse version of
# the synthetic graph:

# %%
sparse_graph = SyntheticGraph(num_nodes=NUM_NODES, avg_degree=LCC_AVG_DEGREE)
full = FullBatchDataModule(synthetic=sparse_graph).data
num_parts, part = connected_components(to_scipy_sparse_matrix(full.edge_index, num_nodes=NUM_NODES))
sizes = np.bincount(part)
print(f"{num_parts:,} components; the largest has {sizes.max():,} nodes")
print(f"{(sizes == 1).sum():,} isolated nodes; {(sizes <= 10).sum():,} components of <= 10 nodes")

lcc = FullBatchDataModule(
    synthetic=sparse_graph, preprocess=Preprocess(largest_component=True)
).data


def graph_bytes(d) -> int:
    return sum(v.nbytes for _, v in d if torch.is_tensor(v))


print(f"{'':<12}{'nodes':>10}{'edges':>10}{'MiB':>8}{'train':>9}{'val':>8}{'test':>8}")
for name, d in (("all", full), ("largest CC", lcc)):
    splits = [int(d[k].sum()) for k in ("train_mask", "val_mask", "test_mask")]
    print(
        f"{name:<12}{d.num_nodes:>10,}{d.num_edges:>10,}{graph_bytes(d) / MiB:>8.1f}"
        + "".join(f"{s:>9,}" if i == 0 else f"{s:>8,}" for i, s in enumerate(splits))
    )
print(f"saved: {1 - graph_bytes(lcc) / graph_bytes(full):.0%} of the bytes")

# %% [markdown]
# The catch is in the last three columns: dropped nodes leave the training, validation and test
# sets too, so scores on the pruned graph are not comparable with scores on the whole graph. If
# every node needs a prediction, predict the dropped ones from their features alone (an MLP), or
# keep them: an isolated node costs a feature row and a label, and no edges.
#
# ## 3. Smaller dtypes
#
# **Features.** Storing `x` in bfloat16 or float16 halves it. `gnnscale`'s models cast each batch
# to float32 (`x.float()`), so the arithmetic stays in float32; with full-batch training that
# cast is a full float32 copy during the step, so the saving is in what stays resident and in
# what a sampler gathers per batch. bfloat16 keeps float32's range with fewer mantissa bits;
# float16 has more precision but overflows above 65504. A short full-batch fit on each (one
# seed each, so small differences are noise):

# %%
for dtype in ("float32", "bfloat16", "float16"):
    x_bytes = data.x.to(getattr(torch, dtype)).nbytes
    print(f"x of the main graph as {dtype:<9}{x_bytes / MiB:>7.1f} MiB")

for dtype in ("float32", "bfloat16", "float16"):
    torch.manual_seed(0)
    dm = FullBatchDataModule(
        synthetic=SyntheticGraph(num_nodes=FIT_NODES), preprocess=Preprocess(feature_dtype=dtype)
    )
    adam = functools.partial(torch.optim.Adam, lr=FIT_LR)
    net = GraphSAGE(dm.num_features, dm.num_classes, hidden_channels=64, optimizer=adam)
    trainer = L.Trainer(
        max_epochs=FIT_EPOCHS,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(net, datamodule=dm)
    acc = trainer.test(net, datamodule=dm, verbose=False)[0]["test/acc"]
    print(f"features stored as {dtype:<9} test accuracy after {FIT_EPOCHS} epochs: {acc:.3f}")

# %% [markdown]
# **Edge indices.** int32 would halve `edge_index` and the sampler's copy, but PyG's support is
# uneven. What this installation accepts (a PyG upgrade may change it):


# %%
def try_it(fn, *args) -> str:
    """'ok', or the first line of the error that ``fn(*args)`` raises."""
    try:
        fn(*args)
        return "ok"
    except Exception as err:  # report, don't hide: the message is the answer here
        return f"{type(err).__name__}: {str(err).splitlines()[0].split('. ')[0][:90]}"


small = make_synthetic_graph(SyntheticGraph(num_nodes=1_000, num_features=16))
ei32 = small.edge_index.int()


def first_batch(graph: Data, fanouts: list[int], batch_size: int) -> Data:
    sampler = HopSampler(graph, fanouts)
    return next(
        iter(NeighborLoader(graph, fanouts, batch_size=batch_size, neighbor_sampler=sampler))
    )


for conv in (SAGEConv(16, 8), GCNConv(16, 8), GATv2Conv(16, 8)):
    print(f"int32 edge_index -> {type(conv).__name__:<15}{try_it(conv, small.x, ei32)}")
graph32 = Data(x=small.x, edge_index=ei32)
print(f"int32 edge_index -> {'NeighborLoader':<15}{try_it(first_batch, graph32, [5], 8)}")
int64_mib, int32_mib = data.edge_index.nbytes / MiB, data.edge_index.int().nbytes / MiB
print(f"\nedge_index of the main graph: int64 {int64_mib:.1f} MiB, int32 {int32_mib:.1f} MiB")

# %% [markdown]
# Keep `edge_index` int64 unless every layer and loader in your pipeline accepts int32; the
# savings are usually larger elsewhere.
#
# **Labels.** One-hot labels are N × C floats; class ids are N integers. `F.cross_entropy` takes
# class ids directly, in the dtypes it accepts:

# %%
num_classes = int(data.y.max()) + 1
one_hot = F.one_hot(data.y, num_classes).float()
print(f"one-hot float32 [N, {num_classes}]: {one_hot.nbytes / MiB:6.2f} MiB")
for dtype in (torch.int64, torch.int32, torch.uint8):
    logits, target = torch.randn(4, num_classes), data.y[:4].to(dtype)
    print(
        f"class ids {str(dtype):<12} [N]: {data.y.to(dtype).nbytes / MiB:6.2f} MiB   "
        f"cross_entropy: {try_it(F.cross_entropy, logits, target)}"
    )
del one_hot

# %% [markdown]
# ## 4. Sparse features
#
# Bag-of-words features are mostly zeros. Build the sparse tensor straight from the (row, word)
# pairs, as a file would store them, and never materialise the dense matrix; its size below is
# arithmetic.

# %%
g = torch.Generator().manual_seed(0)
rows = torch.arange(SPARSE_NODES).repeat_interleave(WORDS_PER_NODE)
words = torch.randint(VOCAB, (SPARSE_NODES * WORDS_PER_NODE,), generator=g)
x_coo = torch.sparse_coo_tensor(
    torch.stack([rows, words]),
    torch.ones(rows.numel()),
    (SPARSE_NODES, VOCAB),
    check_invariants=False,
).coalesce()  # duplicate words become counts
x_csr = x_coo.to_sparse_csr()
coo_bytes = x_coo.indices().nbytes + x_coo.values().nbytes
csr_bytes = sum(t.nbytes for t in (x_csr.crow_indices(), x_csr.col_indices(), x_csr.values()))
density = x_coo._nnz() / (SPARSE_NODES * VOCAB)
print(f"[{SPARSE_NODES:,} x {VOCAB:,}], {x_coo._nnz():,} non-zeros ({density:.2%})")
print(f"dense float32: {SPARSE_NODES * VOCAB * 4 / MiB:8,.1f} MiB")
print(f"sparse COO:    {coo_bytes / MiB:8,.1f} MiB")
print(f"sparse CSR:    {csr_bytes / MiB:8,.1f} MiB")

# %% [markdown]
# The first layer multiplies the sparse matrix by a dense weight, without densifying it. Whether a
# loader can slice sparse `x` per batch depends on the layout:

# %%
weight = torch.randn(VOCAB, 64, generator=g)
hidden = torch.sparse.mm(x_csr, weight)  # [SPARSE_NODES, 64], dense
head = x_coo.index_select(0, torch.arange(100)).to_dense()
same = torch.allclose(hidden[:100], head @ weight, atol=1e-4)
print(f"sparse.mm matches the dense product on 100 rows: {same}")
edges = make_synthetic_graph(SyntheticGraph(num_nodes=SPARSE_NODES, num_features=1)).edge_index
for name, x in (("COO", x_coo), ("CSR", x_csr)):
    result = try_it(first_batch, Data(x=x, edge_index=edges), FANOUTS, BATCH_SIZE)
    print(f"NeighborLoader with {name} x: {result}")
del x_coo, x_csr, hidden

# %% [markdown]
# ## 5. Python lists in DataLoader workers: memory that grows every epoch
#
# DataLoader workers are forked, and a forked process shares its parent's memory pages until it
# writes to one. Reading a Python object writes to it: CPython increments the object's reference
# count, which lives in the object. So a worker that reads a list of Python ints copies every
# page it touches, and its private memory grows as it touches more of the list, epoch after
# epoch, in every worker ([pytorch#13246](https://github.com/pytorch/pytorch/issues/13246)). A
# tensor or NumPy array is one object whose data is a flat buffer; reading it writes nothing.
#
# Both datasets below hold the same `LIST_NODES × LIST_NEIGHBOURS` neighbour ids, one as a list
# of lists, one as a tensor. Each epoch visits a random `SEED_FRACTION` of the nodes, like
# training seeds. `persistent_workers=True` keeps the same worker processes across epochs, and
# after each epoch we sum their unique set size (USS: pages private to the process).

# %%
neighbours = torch.randint(LIST_NODES, (LIST_NODES, LIST_NEIGHBOURS), generator=g)


class ListNeighbours(Dataset):
    def __init__(self, ids: torch.Tensor) -> None:
        self.rows = ids.tolist()  # a list of lists of Python ints

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, idx: list[int]) -> torch.Tensor:
        return torch.tensor([self.rows[i] for i in idx])


class TensorNeighbours(Dataset):
    def __init__(self, ids: torch.Tensor) -> None:
        self.rows = ids

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, idx: list[int]) -> torch.Tensor:
        return self.rows[idx]


def worker_uss_per_epoch(dataset: Dataset) -> list[float]:
    before = {p.pid for p in psutil.Process().children()}
    seeds = RandomSampler(dataset, num_samples=int(SEED_FRACTION * len(dataset)))
    loader = DataLoader(
        dataset,
        sampler=BatchSampler(seeds, BATCH_SIZE, drop_last=False),
        batch_size=None,  # the sampler hands each worker a whole list of indices
        num_workers=NUM_WORKERS,
        persistent_workers=True,
    )
    uss = []
    for _ in range(EPOCHS):
        for _ in loader:
            pass
        workers = [p for p in psutil.Process().children() if p.pid not in before]
        uss.append(sum(p.memory_full_info().uss for p in workers) / MiB)
    del loader  # shuts the workers down
    return uss


rss = psutil.Process().memory_info().rss
as_list = ListNeighbours(neighbours)
list_mib = (psutil.Process().memory_info().rss - rss) / MiB
print(f"{neighbours.numel():,} ids: tensor {neighbours.nbytes / MiB:.0f} MiB, ", end="")
print(f"as Python lists {list_mib:.0f} MiB")
start = time.perf_counter()
uss = {
    "tensor": worker_uss_per_epoch(TensorNeighbours(neighbours)),
    "list of lists": worker_uss_per_epoch(as_list),
}
print(f"{'epoch':<16}" + "".join(f"{e:>7}" for e in range(1, EPOCHS + 1)))
for name, values in uss.items():
    print(f"{name:<16}" + "".join(f"{v:>7.0f}" for v in values))
print(
    f"(worker USS in MiB, summed over {NUM_WORKERS} workers; {time.perf_counter() - start:.0f} s)"
)
extra = uss["list of lists"][0] - uss["tensor"][0]
print(
    f"epoch 1: the workers read {SEED_FRACTION:.0%} of the lists "
    f"({SEED_FRACTION * list_mib:.0f} MiB) and hold {extra:.0f} MiB more private memory "
    "than with the tensor"
)

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
for name, values in uss.items():
    ax.plot(range(1, EPOCHS + 1), values, "o-", label=f"dataset holds a {name}")
copies = NUM_WORKERS * list_mib
ax.axhline(copies, color="grey", ls=":", lw=1)
ax.text(1, copies * 1.02, f"{NUM_WORKERS} x the lists' size", fontsize=8, color="grey")
ax.set_xlabel("epoch")
ax.set_ylabel("private memory of the workers (MiB)")
ax.set_ylim(0, copies * 1.12)
ax.legend(loc="center right")
plt.tight_layout()
plt.show()

# %% [markdown]
# The list's workers grow towards a full private copy each, and the growth per epoch shrinks only
# because fewer untouched pages remain. Touching one id copies its whole 4 KiB page, which holds
# many ids, so the first epoch already copies much more than the ids it read. The tensor's
# workers stay flat at the interpreter's own private pages. With W workers a Python-object dataset
# can cost up to (W + 1) times its size. The fixes: keep per-node data in tensors or NumPy
# arrays (CSR `rowptr`/`col` for ragged lists), or serialise items into one byte buffer; PyG's
# loaders already keep the graph as tensors.

# %%
del as_list
_ = gc.collect()

# %% [markdown]
# ## 6. Memory-mapped features
#
# A feature matrix saved with NumPy can be memory-mapped instead of loaded: the array is backed
# by the file, and the kernel reads pages in when a row is touched. `torch.from_numpy` wraps it
# without a copy, so a batch is gathered with ordinary indexing. We gather random rows from fresh
# mappings and track two parts of the resident set (psutil, Linux): file-backed pages mapped
# into the process (`shared`), and private memory (`rss - shared`), the part that cannot be
# dropped without swapping. For comparison, `np.load` without `mmap_mode` reads it all.

# %%
path = Path("data") / "features.npy"
path.parent.mkdir(exist_ok=True)
np.save(path, data.x.numpy())
file_mib = path.stat().st_size / MiB


def resident() -> tuple[float, float]:
    info = psutil.Process().memory_info()
    return info.shared / MiB, (info.rss - info.shared) / MiB


mapped, private = [], []
for num_rows in MMAP_ROWS:
    x_disk = torch.from_numpy(np.load(path, mmap_mode="c"))  # copy-on-write: the file stays as is
    idx = torch.randint(NUM_NODES, (num_rows,), generator=g)
    shared0, private0 = resident()
    rows_batch = x_disk[idx]
    shared1, private1 = resident()
    mapped.append(shared1 - shared0)
    private.append(private1 - private0)
    del x_disk, rows_batch

shared0, private0 = resident()
x_loaded = np.load(path)
loaded_mib = resident()[1] - private0
del x_loaded
print(f"feature file: {file_mib:.1f} MiB; np.load without mmap adds {loaded_mib:.1f} MiB private")
print(f"{'rows':>6}{'touched MiB':>13}{'file-backed MiB':>17}{'private MiB':>13}")
for n, m, p in zip(MMAP_ROWS, mapped, private, strict=True):
    print(f"{n:>6}{n * NUM_FEATURES * 4 / MiB:>13.3f}{m:>17.1f}{p:>13.1f}")
print(f"file-backed MiB mapped per row at {MMAP_ROWS[0]} row(s): {mapped[0] / MMAP_ROWS[0]:.2f}")

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(MMAP_ROWS, mapped, "o-", label="mmap: file-backed pages mapped")
ax.plot(MMAP_ROWS, private, "o-", label="mmap: private memory")
ax.axhline(loaded_mib, color="black", lw=1, label="np.load: private memory")
ax.set_xscale("log")
ax.set_xlabel("random rows gathered")
ax.set_ylabel("resident set increase (MiB)")
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# Private memory grows by at most the gathered batch. The file-backed part grows much faster than
# the rows touched: on each fault the kernel maps more than the one page (fault-around, and whole
# large folios on kernels that cache files in them), so on a file this small random rows soon
# map nearly all of it; the last line of the table gives the granularity on this machine. Those
# pages are clean page cache, shared with every process that maps the file and dropped by the
# kernel under memory pressure, so they do not count against you the way private memory does. A
# file larger than RAM still works, at the price of a disk read for each row not in the cache, so
# random gathers from a cold file are I/O bound. A recipe for on-disk features at scale is
# planned (not written yet).

# %%
path.unlink()

# %% [markdown]
# ## Checklist, in order
#
# 1. **Estimate** with the functions in section 1 (features, edges, sampler copy, one batch) and
#    compare with the memory you have; measure one batch to calibrate.
# 2. **Labels as class ids**, not one-hot; split masks as booleans.
# 3. **Features in bfloat16** (`Preprocess(feature_dtype="bfloat16")`); keep the model in
#    float32 or use `trainer.precision: bf16-mixed`.
# 4. **Sparse features** stay sparse (COO if a PyG loader must slice them).
# 5. **Drop small components** (`Preprocess(largest_component=True)`) when the task allows it,
#    and report on which nodes you evaluate.
# 6. **Tensors, not Python objects**, in anything a DataLoader worker reads.
# 7. **Sample** (neighbour, cluster or GraphSAINT loaders) once the activations of a full batch do
#    not fit; the batch's bytes then scale with batch size × fan-outs, not with N.
# 8. **Memory-map the features** once they do not fit in RAM; keep `edge_index` and the sampler's
#    copy in memory.
# 9. **One sampler copy for all loaders**: pass the same `NeighborSampler` (`neighbor_sampler=`)
#    to the training and evaluation loaders, each with its own fan-out.
# 10. **Count the checkpoint**: it holds the parameters and the optimizer state (3× the table
#     for an embedding trained with Adam or SparseAdam). Lightning 2.6 serialises it in memory
#     before writing, which briefly needs all of it again; `gnnscale fit` streams it to disk
#     (`StreamingCheckpointIO`) and `gnnscale plan` measures a save and a load.
