"""Peak memory of GAT attention, dense [B, N, N, 2F] against edge-wise GATv2, and what it buys.

The figures of the ``gat_attention_memory`` recipe's README (its ``memory`` block), written by
``python benchmarks/figures.py gat_memory``.

1. A dense GAT output layer (every node pair repeated and concatenated into [B, N, N, 2F]) at
   sizes that fit, fitted as a + b * N^2 and extrapolated to the case (N = 500).
2. Edge-wise GATv2 (gnnscale.GATv2) at the full case: one training step (forward + backward) on a
   batch of B graphs of N nodes with F output classes, for each variant.
3. Each variant's test accuracy after training on the recipe graph (config.yaml), at the class
   count the config sets: memory is measured at the case's class count, accuracy where it can be
   learned.

Every peak comes from a fresh subprocess. On CPU it is the rise of the resident set (VmHWM, reset
just before the step) over the resident set after inputs and model are built and one warm-up step
has run; large allocations are forced to mmap so that freed memory goes back to the OS and is not
silently reused. On CUDA it is ``torch.cuda.max_memory_allocated`` over the allocated baseline.
On a GPU, raise the sizes: ``--device cuda --dense-nodes 100 200 300 400 500``.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import harness
import torch
import torch.nn.functional as F
import yaml
from blocks import Block, Section
from torch import Tensor, nn
from torch_geometric.data import Batch
from torch_geometric.utils import to_dense_adj

from gnnscale import GATv2, SyntheticGraph, make_synthetic_graph
from gnnscale.measure import peak_rss_mb, reset_peak_rss, rss_mb, set_mmap_threshold

HERE = Path(__file__).resolve().parent
CONFIG = HERE.parent / "recipes" / "gat_attention_memory" / "config.yaml"
MIB = 2**20

# Variants of the edge-wise model: (label, model overrides, precision).
VARIANTS = [
    ("out_heads=8 (8 heads averaged, the case)", {"out_heads": 8}, "32"),
    ("out_heads=8 + bf16 autocast", {"out_heads": 8}, "bf16"),
    ("out_heads=1", {"out_heads": 1}, "32"),
    ("out_heads=1 + bf16 autocast (config.yaml)", {"out_heads": 1}, "bf16"),
    ("linear_head (Linear 1024 -> classes)", {"linear_head": True}, "32"),
]


class DenseGATLayer(nn.Module):
    """The dense GAT layer (Velickovic et al., 2018, as often written): all N^2 pairs at once.

    ``cat([Wh_i, Wh_j])`` for every pair (i, j) materialises a [B, N, N, 2F] tensor, so memory is
    O(B * N^2 * F) whatever the graph's edge count.
    """

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.att = nn.Parameter(torch.randn(2 * out_channels) / out_channels**0.5)

    def forward(self, h: Tensor, adj: Tensor) -> Tensor:
        """Output features of every node, attention over all pairs of each graph."""
        wh = self.lin(h)  # [B, N, F]
        b, n, f = wh.shape
        pairs = torch.cat([wh.repeat_interleave(n, dim=1), wh.repeat(1, n, 1)], dim=-1)
        e = F.leaky_relu(pairs.view(b, n, n, 2 * f) @ self.att, 0.2)  # [B, N, N]
        alpha = torch.softmax(e.masked_fill(~adj, float("-inf")), dim=-1)
        return alpha @ wh  # [B, N, F]


def batch_of_graphs(num_graphs: int, nodes: int, avg_degree: float, features: int, classes: int):
    """``num_graphs`` disjoint synthetic graphs of ``nodes`` nodes, batched as PyG does."""
    graphs = [
        make_synthetic_graph(
            SyntheticGraph(
                num_nodes=nodes,
                avg_degree=min(avg_degree, nodes - 1),
                num_features=features,
                num_classes=2,  # structure only: many classes on few nodes drop same-class edges
                seed=seed,
            )
        )
        for seed in range(num_graphs)
    ]
    batch = Batch.from_data_list(graphs)
    batch.y = torch.randint(classes, (batch.num_nodes,))  # only the output's shape matters
    return batch


def _build(spec: dict[str, Any], device: torch.device) -> tuple[nn.Module, Callable[[], Tensor]]:
    """Model and a closure computing the loss of one forward pass, for a measurement spec."""
    g = spec
    torch.manual_seed(0)
    if g["kind"] == "dense":
        batch = batch_of_graphs(g["graphs"], g["nodes"], g["avg_degree"], 1, 2)
        adj = to_dense_adj(batch.edge_index, batch.batch, max_num_nodes=g["nodes"]).bool()
        adj |= torch.eye(g["nodes"], dtype=torch.bool)  # self-loops, as GAT adds them
        h = torch.randn(g["graphs"], g["nodes"], g["hidden"], device=device)  # last hidden layer
        adj = adj.to(device)
        y = torch.randint(g["classes"], (g["graphs"] * g["nodes"],), device=device)
        model = DenseGATLayer(g["hidden"], g["classes"]).to(device)
        return model, lambda: F.cross_entropy(model(h, adj).flatten(0, 1).float(), y)
    batch = batch_of_graphs(g["graphs"], g["nodes"], g["avg_degree"], g["features"], g["classes"])
    batch = batch.to(device)
    model = GATv2(
        g["features"],
        g["classes"],
        hidden_channels=g["hidden"],
        num_layers=2,
        heads=g["heads"],
        dropout=g.get("dropout", 0.0),
        **g.get("model", {}),
    ).to(device)
    return model, lambda: F.cross_entropy(model(batch.x, batch.edge_index).float(), batch.y)


def _autocast(precision: str, device: torch.device):
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def peak_step_mib(spec: dict[str, Any], device: str = "cpu") -> float:
    """Peak memory (MiB) of one training step (forward + backward) above the built baseline.

    Linux CPU: VmHWM is reset (``/proc/self/clear_refs``) after a warm-up step, so the peak is the
    step's own. CUDA: ``max_memory_allocated``. Call :func:`measure` for a fresh process.
    """
    dev = torch.device(device)
    set_mmap_threshold(64 * 1024)  # freed tensors leave the resident set at once
    model, loss_fn = _build(spec, dev)
    for _ in range(2):  # warm-up (lazy init, thread pools), then the measured step
        model.zero_grad(set_to_none=True)
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            base = torch.cuda.memory_allocated(dev)
        else:
            base = rss_mb() * MIB
            reset_peak_rss()
        with _autocast(spec.get("precision", "32"), dev):
            loss = loss_fn()
        loss.backward()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            peak = torch.cuda.max_memory_allocated(dev)
        else:
            peak = peak_rss_mb() * MIB
        del loss
    return (peak - base) / MIB


def measure(specs: list[dict[str, Any]], device: str = "cpu", threads: int = 1) -> list[float]:
    """:func:`peak_step_mib` of each spec, in one fresh process (one spec each: fully isolated)."""
    argv = [sys.executable, __file__, "--worker", json.dumps(specs), "--device", device]
    done = harness.run(argv, threads=threads)
    return json.loads(done.stdout.strip().splitlines()[-1])


def fit_quadratic(nodes: list[int], peaks: list[float]) -> tuple[float, float]:
    """Least-squares a, b of peak = a + b * N^2."""
    x = torch.tensor([n * n for n in nodes], dtype=torch.float64)
    design = torch.stack([torch.ones_like(x), x], 1)
    sol = torch.linalg.lstsq(design, torch.tensor(peaks, dtype=torch.float64)[:, None]).solution
    return float(sol[0]), float(sol[1])


def train_accuracy(
    config: dict[str, Any], overrides: dict[str, Any], precision: str, epochs: int
) -> tuple[float, float]:
    """Test accuracy at the best validation epoch (as the CLI's checkpoint), and s/epoch."""
    data_args = config["data"]["init_args"]
    data = make_synthetic_graph(SyntheticGraph(**data_args["synthetic"]))
    margs = dict(config["model"]["init_args"])
    opt_args = margs.pop("optimizer")["init_args"]
    margs.update(overrides)
    torch.manual_seed(config.get("seed_everything", 0))
    model = GATv2(data.num_features, int(data.y.max()) + 1, **margs)
    opt = torch.optim.Adam(model.parameters(), **opt_args)
    best_val, test_at_best, start = -1.0, 0.0, time.perf_counter()
    dev = torch.device("cpu")
    for _ in range(epochs):
        model.train()
        opt.zero_grad()
        with _autocast(precision, dev):
            out = model(data.x, data.edge_index)
        F.cross_entropy(out[data.train_mask].float(), data.y[data.train_mask]).backward()
        opt.step()
        model.eval()
        with torch.no_grad(), _autocast(precision, dev):
            pred = model(data.x, data.edge_index).argmax(-1)
        val = (pred == data.y)[data.val_mask].float().mean().item()
        if val > best_val:
            best_val = val
            test_at_best = (pred == data.y)[data.test_mask].float().mean().item()
    return test_at_best, (time.perf_counter() - start) / epochs


TINY = ["--nodes=60", "--classes=50", "--hidden=64", "--dense-nodes", "20", "30", "--epochs=2"]


def blocks(tiny: bool) -> list[Block]:
    """The recipe README's ``memory`` block (``tiny``: a check of the pipeline, in seconds)."""
    text = main(TINY if tiny else [])
    if tiny:
        text = "**Tiny settings: a check of the pipeline, not figures.**\n\n" + text
    return [Block(HERE.parent / "recipes" / "gat_attention_memory" / "README.md", "memory", text)]


def main(argv: list[str] | None = None) -> str:
    """Measure; return the markdown (or, as ``--worker``, print one worker's peaks)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", type=Path, default=CONFIG, help="recipe config")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--graphs", type=int, default=4, help="B: graphs per batch")
    p.add_argument("--nodes", type=int, default=500, help="N: nodes per graph")
    p.add_argument("--features", type=int, default=6, help="input features")
    p.add_argument("--classes", type=int, default=1600, help="F: output classes")
    p.add_argument("--hidden", type=int, default=1024, help="hidden width, all heads together")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--avg-degree", type=float, help="edges per node; default: the config's")
    p.add_argument(
        "--dense-nodes", type=int, nargs="+", default=[40, 60, 80, 100],
        help="N per graph at which the dense layer is measured",
    )  # fmt: skip
    p.add_argument("--epochs", type=int, default=None, help="default: config's max_epochs")
    p.add_argument("--threads", type=int, default=1, help="CPU threads per measurement")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        torch.set_num_threads(args.threads)
        print(json.dumps([peak_step_mib(spec, args.device) for spec in json.loads(args.worker)]))
        return ""
    lines: list[str] = []
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    config = yaml.safe_load(args.config.read_text())
    data_args = config["data"]["init_args"]["synthetic"]
    args.avg_degree = args.avg_degree or data_args["avg_degree"]
    shape = {"graphs": args.graphs, "classes": args.classes, "hidden": args.hidden}
    b, n, c, where = args.graphs, args.nodes, args.classes, args.device

    def pairs_mib(nodes: int) -> float:  # the [B, N, N, 2F] fp32 tensor alone
        return b * nodes * nodes * 2 * c * 4 / MIB

    lines.append(f"#### Dense GAT output layer: [B, N, N, 2F] pairs, B={b}, F={c}, one step\n")
    lines.append("| N per graph | [B, N, N, 2F] fp32 (arithmetic) | measured peak | peak / pairs |")
    lines.append("|---:|---:|---:|---:|")
    peaks = []
    for nodes in args.dense_nodes:
        spec = {"kind": "dense", "nodes": nodes, "avg_degree": args.avg_degree, **shape}
        peaks += measure([spec], where, args.threads)
        ratio = peaks[-1] / pairs_mib(nodes)
        lines.append(
            f"| {nodes} | {pairs_mib(nodes):,.0f} MiB | {peaks[-1]:,.0f} MiB | {ratio:.2f} |"
        )
    a, slope = fit_quadratic(args.dense_nodes, peaks)
    fitted = a + slope * n * n
    lines.append(
        f"| **{n}** (fit {a:,.0f} + {slope:.4f}·N² MiB) | **{pairs_mib(n) / 1024:.1f} GiB** | "
        f"**{fitted / 1024:.1f} GiB** (extrapolated) | {fitted / pairs_mib(n):.2f} |\n"
    )

    edge = {"kind": "edge", "nodes": n, "avg_degree": args.avg_degree, "features": args.features}
    edge |= {"heads": args.heads, "dropout": config["model"]["init_args"]["dropout"], **shape}
    train_classes = data_args["num_classes"]
    epochs = args.epochs or config["trainer"]["max_epochs"]
    num_edges = batch_of_graphs(b, n, args.avg_degree, args.features, c).num_edges
    lines.append(
        f"#### Edge-wise GATv2 (gnnscale.GATv2), hidden {args.hidden} = {args.heads} heads x "
        f"{args.hidden // args.heads}\n\nMemory: one training step on {b} graphs x {n} nodes "
        f"({b * n} nodes, {num_edges:,} edges + self-loops), {args.features} features, {c} "
        f"classes. Accuracy: test accuracy at the best validation epoch after {epochs} "
        f"full-batch epochs on the recipe graph ({data_args['num_nodes']} nodes, "
        f"{train_classes} classes, chance {100 / train_classes:.0f}%).\n"
    )
    lines.append(f"| variant | peak step memory | vs. dense at N={n} | test acc | s/epoch |")
    lines.append("|---|---:|---:|---:|---:|")
    for label, overrides, precision in VARIANTS:
        spec = {**edge, "model": overrides, "precision": precision}
        (peak,) = measure([spec], where, args.threads)
        acc, s_epoch = train_accuracy(config, overrides, precision, epochs)
        lines.append(
            f"| {label} | {peak:,.0f} MiB | {fitted / peak:,.0f}x less | {100 * acc:.1f}% | "
            f"{s_epoch:.2f} |"
        )
    device_name = torch.cuda.get_device_name() if where == "cuda" else "CPU"
    lines.append(
        f"\n{device_name}, {args.threads} thread(s) per measurement, each peak in a fresh "
        f"process; {time.perf_counter() - start:.0f} s in all."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    print(main())


SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about="dense [B, N, N, 2F] attention against edge-wise GATv2: peak memory and what it buys",
    writes="memory in gat_attention_memory's README",
    threads="1 torch thread per measurement",
    formerly=("gat",),
)
