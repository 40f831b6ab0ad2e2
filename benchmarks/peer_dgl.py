"""DGL / GraphBolt peer of gnnscale's neighbor_sage recipe, for the side-by-side benchmark.

Trains the job gnnscale's default recipe trains, in fp32: 2-layer GraphSAGE-mean (256 hidden,
dropout 0.5), fan-out 15 then 10, 1,024 seeds a batch, Adam 0.003, 2 micro-batches a step,
4 epochs; validation on the fixed ``val_nodes`` with sampled neighbourhoods each epoch, then
the test by exact layer-wise inference over all nodes with the best validated epoch's weights
(as gnnscale's recipe tests its best checkpoint). It runs in an environment with DGL 2.1
(never gnnscale's, and it imports neither gnnscale nor PyG); benchmarks/peers.py builds that
environment, runs this as a subprocess and reads the one ``PEER_RESULT {json}`` line it prints::

    $GNNSCALE_PEERS_VENV/bin/python benchmarks/peer_dgl.py --graph g.npz --loader dgl --workers 0
    $GNNSCALE_PEERS_VENV/bin/python benchmarks/peer_dgl.py --graph g.npz --loader graphbolt \
        --profile

``--profile`` trains two epochs (no validation, no test) and times the steps inside the
loop: the loader's share of an epoch is what the steps leave; then sampling and feature gather
of the same seed batches, apart.
``--init pyg`` starts from PyG's weight initialisation instead of SAGEConv's (see
``SAGE.pyg_init``): the one setting that moves accuracy between the two tools.
"""

# ruff: noqa: E402  (the clock starts before the heavy imports, which count in wall_s)
import time

START = time.perf_counter()

import argparse
import copy
import json
import math
import resource
import sys
import threading
from collections.abc import Callable, Iterable, Iterator

import dgl
import dgl.graphbolt as gb
import numpy as np
import psutil
import torch
import torch.nn.functional as F
from dgl.nn import SAGEConv
from torch import nn

IMPORT_S = time.perf_counter() - START

# Both DGL and GraphBolt order fan-outs from the input layer to the output layer (they sample
# the seeds with fanouts[-1]), the reverse of PyG's num_neighbors=[15, 10]: this is 15
# neighbours of each seed, then 10 of each of those.
FANOUTS = [10, 15]
BATCH = 1024
INFER_BATCH = 4096
ACCUMULATE = 2

Batch = tuple[list, torch.Tensor, torch.Tensor]  # blocks, input features, seed labels


class SAGE(nn.Module):
    """2-layer GraphSAGE-mean, as gnnscale.GraphSAGE with its recipe's settings."""

    def __init__(self, in_size: int, hidden: int, out_size: int):
        super().__init__()
        self.layers = nn.ModuleList(
            [SAGEConv(in_size, hidden, "mean"), SAGEConv(hidden, out_size, "mean")]
        )
        self.dropout = nn.Dropout(0.5)

    def pyg_init(self) -> None:
        """PyG's initialisation (torch.nn.Linear's) in place of DGL's xavier_uniform(gain relu).

        DGL's larger initial weights train slower: 40 steps reach ~0.94 test accuracy on the
        200k-node benchmark graph, against ~0.98 from this one (DGL's loader either way).
        """
        for layer in self.layers:
            for lin in (layer.fc_self, layer.fc_neigh):
                nn.init.kaiming_uniform_(lin.weight, a=math.sqrt(5))
            bound = 1 / math.sqrt(layer.fc_self.in_features)  # DGL keeps the bias in fc_self
            nn.init.uniform_(layer.fc_self.bias, -bound, bound)

    def forward(self, blocks: list, x: torch.Tensor) -> torch.Tensor:
        """Logits of the last block's destination nodes."""
        for i, (layer, block) in enumerate(zip(self.layers, blocks, strict=True)):
            x = layer(block, x)
            if i < len(self.layers) - 1:
                x = self.dropout(F.relu(x))
        return x

    @torch.no_grad()
    def inference(self, x: torch.Tensor, layer_batches: Callable) -> torch.Tensor:
        """Exact logits of every node, a layer at a time over all nodes (DGL's idiom)."""
        for i, layer in enumerate(self.layers):
            out = torch.empty(x.shape[0], layer.fc_neigh.out_features)
            for block, h, seeds in layer_batches(x):
                h = layer(block, h)
                out[seeds] = F.relu(h) if i < len(self.layers) - 1 else h
            x = out
        return x


class DGLPipeline:
    """``dgl.dataloading``: a DGLGraph, NeighborSampler and DataLoader."""

    def __init__(self, data: dict, workers: int):
        self.g = dgl.graph((data["src"], data["dst"]), num_nodes=data["x"].shape[0])
        self.g.create_formats_()  # the CSC it samples from, built here rather than in epoch 0
        # DGL's example idiom: the sampler gathers the features and labels of each batch
        # (g.ndata holds the tensors themselves, no copy), in the worker when there is one.
        self.g.ndata["feat"], self.g.ndata["label"] = data["x"], data["y"]
        self.data = data
        sampler = dgl.dataloading.NeighborSampler(
            FANOUTS, prefetch_node_feats=["feat"], prefetch_labels=["label"]
        )
        # Built once, so that persistent workers serve every epoch.
        self.train_loader, self.val_loader = (
            dgl.dataloading.DataLoader(
                self.g,
                nodes,
                sampler,
                batch_size=BATCH,
                shuffle=shuffle,
                drop_last=False,
                num_workers=workers,
                persistent_workers=workers > 0,
            )
            for nodes, shuffle in ((data["train_idx"], True), (data["val_nodes"], False))
        )

    @staticmethod
    def _batches(loader: dgl.dataloading.DataLoader) -> Iterator[Batch]:
        for _, _, blocks in loader:
            yield blocks, blocks[0].srcdata["feat"], blocks[-1].dstdata["label"]

    def train(self) -> Iterable[Batch]:
        """The training loader (a fresh shuffle each call)."""
        return self._batches(self.train_loader)

    def val(self) -> Iterable[Batch]:
        """Sampled neighbourhoods of the fixed validation nodes."""
        return self._batches(self.val_loader)

    def layer_batches(self, x: torch.Tensor) -> Iterator[tuple]:
        """One full-neighbourhood block a batch over all nodes, with its inputs from ``x``."""
        sampler = dgl.dataloading.MultiLayerFullNeighborSampler(1)
        nodes = torch.arange(self.g.num_nodes())
        loader = dgl.dataloading.DataLoader(self.g, nodes, sampler, batch_size=INFER_BATCH)
        for input_nodes, seeds, blocks in loader:
            yield blocks[0], x[input_nodes], seeds

    def split(self, seeds: list[torch.Tensor]) -> tuple[float, float]:
        """Seconds sampling the given seed batches, and gathering their features and labels."""
        sampler = dgl.dataloading.NeighborSampler(FANOUTS)
        t = time.perf_counter()
        sampled = [sampler.sample(self.g, s) for s in seeds]
        sample_s = time.perf_counter() - t
        t = time.perf_counter()
        for input_nodes, output_nodes, _ in sampled:
            _ = self.data["x"][input_nodes], self.data["y"][output_nodes]
        return sample_s, time.perf_counter() - t


class GraphBoltPipeline:
    """``dgl.graphbolt``: a fused CSC graph, an ItemSampler datapipe and gb.DataLoader."""

    def __init__(self, data: dict, workers: int):
        n = data["x"].shape[0]
        # CSC by destination: for each node, the sources of its incoming edges.
        order = torch.argsort(data["dst"], stable=True)
        indptr = torch.zeros(n + 1, dtype=torch.int64)
        indptr[1:] = torch.cumsum(torch.bincount(data["dst"], minlength=n), 0)
        self.graph = gb.fused_csc_sampling_graph(indptr, data["src"][order])
        self.features = gb.BasicFeatureStore(
            {("node", None, "feat"): gb.TorchBasedFeature(data["x"])}
        )
        # Labels travel with the seeds through the ItemSet, as in DGL's GraphBolt examples.
        self.train_set = gb.ItemSet(
            (data["train_idx"], data["y"][data["train_idx"]]), names=("seed_nodes", "labels")
        )
        self.val_set = gb.ItemSet(
            (data["val_nodes"], data["y"][data["val_nodes"]]), names=("seed_nodes", "labels")
        )
        self.workers = workers
        # Built once: gb.DataLoader's workers persist, and a new loader would start new ones.
        self.train_loader = self._loader(self.train_set, True)
        self.val_loader = self._loader(self.val_set, False)

    def _loader(self, items: gb.ItemSet, shuffle: bool) -> gb.DataLoader:
        pipe = gb.ItemSampler(items, batch_size=BATCH, shuffle=shuffle)
        pipe = pipe.sample_neighbor(self.graph, FANOUTS).fetch_feature(self.features, ["feat"])
        return gb.DataLoader(pipe, num_workers=self.workers)

    @staticmethod
    def _batches(loader: gb.DataLoader) -> Iterator[Batch]:
        for mb in loader:
            yield mb.blocks, mb.node_features["feat"], mb.labels

    def train(self) -> Iterable[Batch]:
        """The training loader (a fresh shuffle each call)."""
        return self._batches(self.train_loader)

    def val(self) -> Iterable[Batch]:
        """Sampled neighbourhoods of the fixed validation nodes."""
        return self._batches(self.val_loader)

    def layer_batches(self, x: torch.Tensor) -> Iterator[tuple]:
        """One full-neighbourhood block a batch over all nodes, with its inputs from ``x``."""
        store = gb.BasicFeatureStore({("node", None, "feat"): gb.TorchBasedFeature(x)})
        pipe = gb.ItemSampler(gb.ItemSet(x.shape[0], names="seed_nodes"), batch_size=INFER_BATCH)
        pipe = pipe.sample_neighbor(self.graph, [-1]).fetch_feature(store, ["feat"])
        for mb in gb.DataLoader(pipe):
            yield mb.blocks[0], mb.node_features["feat"], mb.seed_nodes

    def split(self, seeds: list[torch.Tensor]) -> tuple[float, float]:
        """Seconds sampling the given seed batches (blocks made), and gathering their features."""
        items = gb.ItemSet(torch.cat(seeds), names="seed_nodes")  # same batches, same order
        pipe = gb.ItemSampler(items, batch_size=BATCH).sample_neighbor(self.graph, FANOUTS)
        t = time.perf_counter()
        sampled = [(mb.blocks, mb.input_nodes) for mb in gb.DataLoader(pipe)]
        sample_s = time.perf_counter() - t
        t = time.perf_counter()
        for _, input_nodes in sampled:
            self.features.read("node", None, "feat", input_nodes)
        return sample_s, time.perf_counter() - t


def run_epoch(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    batches: Iterable[Batch],
    step_s: list[float] | None = None,
) -> list:
    """One epoch of steps, each over ``ACCUMULATE`` micro-batches; each batch's (nodes, edges).

    ``step_s``: each batch's seconds of forward, backward and optimizer step, appended.
    """
    model.train()
    sizes, pending = [], 0
    for blocks, x, y in batches:
        start = time.perf_counter()
        loss = F.cross_entropy(model(blocks, x), y) / ACCUMULATE
        loss.backward()
        pending += 1
        if pending == ACCUMULATE:
            opt.step()
            opt.zero_grad()
            pending = 0
        if step_s is not None:
            step_s.append(time.perf_counter() - start)
        sizes.append((blocks[0].num_src_nodes(), sum(b.num_edges() for b in blocks)))
    if pending:  # as Lightning: the epoch's last batch steps whatever it accumulated
        opt.step()
        opt.zero_grad()
    return sizes


@torch.no_grad()
def accuracy(model: nn.Module, batches: Iterable[Batch]) -> float:
    """Accuracy over the seeds of ``batches`` (sampled neighbourhoods)."""
    model.eval()
    hits = total = 0
    for blocks, x, y in batches:
        hits += int((model(blocks, x).argmax(1) == y).sum())
        total += y.numel()
    return hits / total


class TreeRSS(threading.Thread):
    """Peak RSS of the process tree: summed over this process and its children, and per worker."""

    def __init__(self, every: float = 0.25):
        super().__init__(daemon=True)
        self.every, self.me = every, psutil.Process()
        self.peak = self.worker_peak = 0  # bytes

    def poll(self) -> None:
        """Read the tree once."""
        try:
            children = self.me.children(recursive=True)
            rss = self.me.memory_info().rss + sum(c.memory_info().rss for c in children)
            self.peak = max(self.peak, rss)
            for child in children:  # the kernel's high-water mark, so no peak falls between polls
                with open(f"/proc/{child.pid}/status") as status:
                    hwm = next(line for line in status if line.startswith("VmHWM:"))
                self.worker_peak = max(self.worker_peak, int(hwm.split()[1]) * 1024)
        except (psutil.Error, OSError, StopIteration):
            pass  # a worker that exited between listing and reading

    def run(self) -> None:
        """Poll until the process ends."""
        while True:
            self.poll()
            time.sleep(self.every)


def measured(tree: TreeRSS, sizes: list, load_s: float, start: float, import_s: float) -> dict:
    """What every peer run reports beside its own figures: batch sizes, memory, versions, time."""
    tree.poll()  # the workers, still alive: they persist until the process exits
    return {
        "import_s": import_s,
        "load_s": load_s,
        "batch_nodes_mean": float(np.mean([n for n, _ in sizes])),
        "batch_edges_mean": float(np.mean([e for _, e in sizes])),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB
        # Live workers are absent from RUSAGE_CHILDREN (shutting GraphBolt's down stalls 5 s a
        # loader), so this is the largest child's own peak (VmHWM: what it reports once reaped).
        "children_peak_rss_mib": tree.worker_peak / 2**20,
        "versions": {"dgl": dgl.__version__, "torch": torch.__version__, "numpy": np.__version__},
        "wall_s": time.perf_counter() - start,
    }


def main() -> None:
    """Parse the flags, train (or profile), print the one PEER_RESULT line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", required=True, help="the .npz graph (src, dst, x, y, splits)")
    parser.add_argument("--loader", choices=["dgl", "graphbolt"], default="dgl")
    parser.add_argument("--workers", type=int, default=0, help="loader worker processes")
    parser.add_argument("--threads", type=int, default=2, help="torch (and DGL) threads")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--profile", action="store_true", help="time loader and steps apart")
    parser.add_argument(
        "--init", choices=["dgl", "pyg"], default="dgl", help="weight init: SAGEConv's or PyG's"
    )
    args = parser.parse_args()

    tree = TreeRSS()
    tree.start()
    torch.set_num_threads(args.threads)
    dgl.utils.set_num_threads(args.threads)  # DGL's own OpenMP pool samples the dgl loader
    torch.manual_seed(0)
    dgl.seed(0)
    gb.seed(0)
    log = sys.stderr

    t = time.perf_counter()
    data = {k: torch.from_numpy(v) for k, v in np.load(args.graph).items()}
    pipeline_cls = DGLPipeline if args.loader == "dgl" else GraphBoltPipeline
    pipeline = pipeline_cls(data, args.workers)
    load_s = time.perf_counter() - t
    print(f"loaded {args.graph} and built the {args.loader} graph in {load_s:.1f} s", file=log)

    num_classes = int(data["y"].max()) + 1
    model = SAGE(data["x"].shape[1], 256, num_classes)
    if args.init == "pyg":
        model.pyg_init()
    opt = torch.optim.Adam(model.parameters(), lr=0.003)
    result = {"tool": args.loader, "workers": args.workers, "threads": args.threads}
    result["init"] = args.init
    sizes = []

    if args.profile:
        for _ in range(2):  # the first epoch warms the allocator and oneDNN's primitives
            steps: list[float] = []
            t = time.perf_counter()
            sizes = run_epoch(model, opt, pipeline.train(), steps)
            epoch_s, step_s = time.perf_counter() - t, sum(steps)
        kept = list(pipeline.train())  # the seed batches of one more epoch, for the split
        # Both tools list a batch's seeds first among its input nodes.
        seeds = [b[0].srcdata[dgl.NID][: b[-1].num_dst_nodes()] for b, _, _ in kept]
        sample_s, gather_s = pipeline.split(seeds)
        print(
            f"epoch {epoch_s:.2f} s: steps {step_s:.2f} s; sample {sample_s:.2f} s, "
            f"gather {gather_s:.2f} s (in-process)",
            file=log,
        )
        result |= {"epoch_s": epoch_s, "loader_s": epoch_s - step_s, "step_s": step_s}
        result |= {"sample_s": sample_s, "gather_s": gather_s, "batches": len(steps)}
        result |= {"epochs": 2}
    else:
        train_s, val_s, val_acc = [], [], []
        for epoch in range(args.epochs):
            t = time.perf_counter()
            sizes += run_epoch(model, opt, pipeline.train())
            train_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            val_acc.append(accuracy(model, pipeline.val()))
            if val_acc[-1] > max(val_acc[:-1], default=-1.0):  # as gnnscale's checkpoint
                best = copy.deepcopy(model.state_dict())
            val_s.append(time.perf_counter() - t)
            print(
                f"epoch {epoch}: train {train_s[-1]:.2f} s, val {val_s[-1]:.2f} s, "
                f"val acc {val_acc[-1]:.4f}",
                file=log,
            )
        t = time.perf_counter()
        model.eval()
        model.load_state_dict(best)  # the test of the best validated epoch, as gnnscale's
        logits = model.inference(data["x"], pipeline.layer_batches)
        test = data["test_idx"]
        test_acc = float((logits[test].argmax(1) == data["y"][test]).float().mean())
        test_s = time.perf_counter() - t
        print(f"test acc {test_acc:.4f} in {test_s:.2f} s", file=log)
        result |= {"epochs": args.epochs, "train_s": train_s, "val_s": val_s, "val_acc": val_acc}
        result |= {"test_acc": test_acc, "test_s": test_s}

    result |= measured(tree, sizes, load_s, START, IMPORT_S)
    kib = 1024  # ru_maxrss is in KiB on Linux
    result |= {
        # RUSAGE_CHILDREN as is: numpy's import forks `lscpu` (through DGL's imports) and that
        # child counts the ~380 MiB it shares with this process.
        "rusage_children_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / kib,
        "tree_peak_rss_mib": tree.peak / 2**20,  # counts pages shared with workers twice
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    print("PEER_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
