"""One training step of each sampler recipe against what the machine can do (the roofline).

Written by ``python benchmarks/figures.py roofline`` (its block in benchmarks/README.md);
``--size tiny`` checks the pipeline in seconds.

For each sampler recipe (``neighbor_sage``, ``cluster_gcn``, ``graphsaint``), its ``config.yaml``
as shipped (generated graph, model, precision) builds the DataModule and model through the real
CLI; a few training batches are drawn once, and on the same batches, in one process:

* **step**: forward, weighted loss, backward and Adam step, as ``NodeClassifier.training_step``
  computes them (the Lightning loop is not in it); median ms per batch over interleaved passes.
* **GEMMs alone**: every dense matrix product the step ran (forward and backward: ``aten::mm``,
  ``addmm``, ``bmm``, seen with their shapes, strides and dtype by a ``TorchDispatchMode``),
  each replayed on its own (the median of a few runs after a first), summed. *GEMM share* =
  GEMMs / step; *headroom* = step / GEMMs, how much faster the step would be if it did
  nothing but its matrix products.
* **gather**: a batch's feature bytes over the machine's random-row gather bandwidth
  (``x.index_select`` of as many random rows of the same matrix): the time the loader's worker
  spends gathering features, against the step.
* **first layer's aggregation** (GraphSAGE's default on neighbour batches,
  ``--model.speed.aggregate_in_loader``): the worker's ``aggregate_first_layer`` (reading the
  features in place, gathering the targets' rows) timed on the same batches (each batch's
  first call: its output is fresh memory, as in a worker); that variant's step then gets the
  cut batches. The recipe's own row is the step aggregating every layer itself
  (``--model.speed.aggregate_in_loader=false``).
* **top operators**: ``torch.profiler``'s self CPU time per operator over the batches, of
  the step as shipped (rows as ``auto`` makes them; the neighbour recipe's first layer
  aggregated in the loader).

Each recipe's step runs with its rows as sampled (``--model.speed.bucket_rows=0``), and with
them rounded up to 1,024s (``bucket_rows=1024``: the default, ``auto``, where they train in
bf16 on a CPU), held to the unpadded products; the neighbour recipe's also as shipped (the
first layer aggregated in the loader, rows as ``auto`` makes them; held to its unpadded
products too), as it was before target-only layers (PyG's ``BasicGNN.forward`` with
``trim_to_layer``, ``torch.nn.Dropout``, scatter aggregation) and as the hand loop's
(``reddit.py``: no trimming, loss on ``out[:batch_size]``), and under
``torch.compile(dynamic=True)``.
"""

from __future__ import annotations

import copy
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from blocks import Block, Section
from registry import REPO, recipe

from gnnscale._compat import TorchDispatchMode
from gnnscale.batch import HopLayout
from gnnscale.handshake import BatchRequest

SAMPLERS = {"neighbor_sage": "neighbour", "cluster_gcn": "Cluster-GCN", "graphsaint": "GraphSAINT"}
GEMMS = {"mm", "addmm", "bmm"}
TINY = [
    "--data.init_args.synthetic.num_nodes=3000",
    "--data.init_args.synthetic.num_features=32",
    "--data.init_args.synthetic.num_classes=5",
]


class _GemmRecorder(TorchDispatchMode):
    """Records every dense matrix product (op, shapes, strides, dtype) run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, list[tuple[tuple[int, ...], tuple[int, ...]]], Any]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func.overloadpacket.__name__ in GEMMS:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            if not any(t.is_sparse or t.layout != torch.strided for t in tensors):
                layout = [(tuple(t.shape), tuple(t.stride())) for t in tensors]
                self.calls.append((func, layout, tensors[0].dtype))
        return func(*args, **(kwargs or {}))


def _replay_ms(calls: list, repeats: int) -> float:
    """Ms of the recorded products on random inputs of their layout: each call's median, summed.

    Each product runs ``repeats`` times in a row after a first run, so its oneDNN primitive
    is built once and reused; replaying the step's products in order instead made the figure
    swing from run to run (9-15 ms for the same step) as shapes evicted each other's
    primitives from the cache.
    """
    total = 0.0
    for func, layout, dtype in calls:
        args = [torch.empty_strided(s, st, dtype=dtype).normal_() for s, st in layout]
        func(*args)  # builds the primitive
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            func(*args)
            times.append((time.perf_counter() - start) * 1e3)
        total += statistics.median(times)
    return total


def build(name: str, tiny: bool, extra: list[str] | None = None) -> tuple[Any, Any, str]:
    """The recipe's model and DataModule (set up, batches in this process) and precision.

    ``extra``: more command-line overrides.
    """
    from gnnscale.cli import main

    args = [
        "--config",
        str(recipe(name).config),
        "--data.init_args.loader.num_workers=0",
        "--data.init_args.loader.persistent_workers=false",
        *(TINY if tiny else []),
        *(extra or []),
    ]
    torch.manual_seed(0)
    cli = main(args, run=False)
    cli.datamodule.setup("fit")
    return cli.model, cli.datamodule, cli.config["trainer"]["precision"]


def _batches(dm: Any, count: int) -> list[Any]:
    """Training batches as sampled, without the worker's work for the model (timed apart).

    That work (the first layer aggregated, where asked) is added by :func:`_worker`.
    """
    saved = dm.request
    dm.request = BatchRequest(saved.num_layers)  # batches as sampled
    batches = []
    for batch in dm.train_dataloader():
        batch.loss_weight, batch.num_loss_nodes = dm._loss_weight(batch)
        batches.append(batch)
        if len(batches) == count:
            break
    dm.request = saved
    return batches


def _worker(batches: list[Any], step: Callable[[Any], Any]) -> tuple[list[Any], float]:
    """The batches after ``step`` (work of the loader's worker), and its median ms a batch.

    Each batch's first call is timed: its output is fresh memory, as in a worker.
    """
    out, times = [], []
    for batch in batches:
        start = time.perf_counter()
        done = step(copy.copy(batch))
        times.append((time.perf_counter() - start) * 1e3)
        out.append(done)  # loss_weight, a node attribute, cut with the rest
    return out, statistics.median(times)


def step_fn(model: Any, precision: str, forward: Callable | None = None) -> Callable:
    """One optimizer step on a batch, as ``training_step`` computes it (``forward``: another)."""
    optimizer = model.configure_optimizers()
    optimizer = optimizer["optimizer"] if isinstance(optimizer, dict) else optimizer
    bf16 = precision.startswith("bf16")
    model.train()

    def step(batch: Any) -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            if forward is None:
                loss = model.training_step(batch, 0)
            else:
                out = forward(batch)[: batch.batch_size]
                loss = torch.nn.functional.cross_entropy(out.float(), batch.y[: batch.batch_size])
        loss.backward()
        optimizer.step()

    return step


def _time_ms(steps: dict[str, tuple[Callable, list[Any]]], passes: int) -> dict[str, float]:
    """Median ms per batch of each step on its batches, passes interleaved, after a warm-up.

    Each timed pass of a step starts after one untimed batch: the step before it (another
    variant, some with other shapes and a working set larger than the cache) evicted its
    oneDNN primitives (8 kept) and cache lines, which a training run's steps do not pay.
    """
    runs: dict[str, list[float]] = {name: [] for name in steps}
    for p in range(passes + 1):
        for name, (step, batches) in steps.items():
            step(batches[-1])
            start = time.perf_counter()
            for batch in batches:
                step(batch)
            if p:
                runs[name].append((time.perf_counter() - start) * 1e3 / len(batches))
    return {name: statistics.median(v) for name, v in runs.items()}


def _gemm_ms(step: Callable, batches: list[Any], repeats: int) -> float:
    """Milliseconds per batch of the step's dense matrix products alone."""
    total = 0.0
    for batch in batches:
        with _GemmRecorder() as recorder:
            step(batch)
        total += _replay_ms(recorder.calls, repeats)
    return total / len(batches)


def _gather_gbps(x: torch.Tensor, rows: int, repeats: int) -> float:
    """Random-row gather bandwidth of ``x``, GB/s of gathered bytes."""
    times = []
    for _ in range(repeats + 1):
        idx = torch.randint(0, x.size(0), (rows,))
        start = time.perf_counter()
        x.index_select(0, idx)
        times.append(time.perf_counter() - start)
    return rows * x[0].numel() * x.element_size() / statistics.median(times[1:]) / 1e9


def _top_ops(step: Callable, batches: list[Any], limit: int) -> list[tuple[str, float, float]]:
    """(operator, share of self CPU time, ms per batch) of the most expensive operators."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches:
            step(batch)
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return [
        (e.key, e.self_cpu_time_total / total, e.self_cpu_time_total / 1e3 / len(batches))
        for e in events[:limit]
    ]


def _pyg_trim_forward(model: Any) -> Callable:
    """The forward gnnscale ran before target-only layers: PyG's trim_to_layer, torch dropout."""
    gnn = model.gnn
    dropout = torch.nn.Dropout(gnn.dropout.p)

    def forward(batch: Any) -> torch.Tensor:
        saved, gnn.dropout = gnn.dropout, dropout
        try:
            return gnn(
                batch.x.float(),
                batch.edge_index,
                num_sampled_nodes_per_hop=batch.layout.num_sampled_nodes,
                num_sampled_edges_per_hop=batch.layout.num_sampled_edges,
            )
        finally:
            gnn.dropout = saved

    return forward


PADDED = ("bucketed", "in_loader")  # steps whose rows may be rounded up (in bf16 on a CPU)


def measure(name: str, tiny: bool) -> dict[str, Any]:
    """Every figure of one recipe's step."""
    from gnnscale.data.layout import aggregate_first_layer

    model, dm, precision = build(name, tiny)
    batches = _batches(dm, 2 if tiny else 8)  # as sampled: the default model's input
    passes, repeats = (1, 1) if tiny else (5, 5)
    model.bucket_rows = 0  # rows as sampled: the GEMMs every variant is held to
    steps = {"gnnscale": (step_fn(model, precision), batches)}
    bucketed = copy.deepcopy(model)
    bucketed.bucket_rows = 1024  # as --model.speed.bucket_rows=1024: rows rounded up
    steps["bucketed"] = (step_fn(bucketed, precision), batches)
    aggregate_ms, shipped, shipped_batches = None, model, batches
    if isinstance(batches[0].layout, HopLayout) and model.sparse_aggregation:  # GraphSAGE
        aggr = model.gnn.convs[0].aggr
        features = dm.data.x

        def in_place(batch: Any) -> Any:  # as the loader: no x gathered, read from features
            del batch.x
            return aggregate_first_layer(batch, aggr, features)

        aggregated, aggregate_ms = _worker(batches, in_place)
        in_loader = copy.deepcopy(model)
        in_loader.first_layer_aggr = aggr  # the loader aggregated: its GEMMs, rows as sampled
        shipped, shipped_batches = in_loader, aggregated
    shipped = copy.deepcopy(shipped)
    shipped.bucket_rows = "auto"  # as shipped: rows rounded up where products run in bf16
    as_shipped = (step_fn(shipped, precision), shipped_batches)
    if aggregate_ms is not None:
        steps["in_loader"] = as_shipped
    if name == "neighbor_sage":
        before, hand = copy.deepcopy(model), copy.deepcopy(model)
        steps["before"] = (step_fn(before, precision, _pyg_trim_forward(before)), batches)
        hand.gnn.dropout = torch.nn.Dropout(hand.gnn.dropout.p)
        hand_step = step_fn(hand, precision, lambda b: hand.gnn(b.x.float(), b.edge_index))
        steps["hand"] = (hand_step, batches)
    result: dict[str, Any] = {"precision": precision, "step_ms": _time_ms(steps, passes)}
    result["aggregate_ms"] = aggregate_ms
    gemm = {k: _gemm_ms(*s, repeats) for k, s in steps.items() if k not in PADDED}
    # Rows rounded up compute nothing that is read: those steps are held to the unpadded products.
    gemm["bucketed"] = gemm["gnnscale"]
    if "in_loader" in steps:
        gemm["in_loader"] = _gemm_ms(step_fn(in_loader, precision), aggregated, repeats)
    result["gemm_ms"] = gemm
    result["top_ops"] = _top_ops(*as_shipped, 6)
    x = dm.data.x
    nodes = statistics.mean(b.num_nodes for b in batches)
    result["nodes"] = nodes
    # Feature rows the step receives: x, and x_aggr where the loader aggregated.
    result["rows"] = {
        k: statistics.mean(b.x.size(0) + _aggregated_rows(b.layout) for b in bs)
        for k, (_, bs) in steps.items()
    }
    result["seeds"] = statistics.mean(b.num_loss_nodes for b in batches)
    result["gather_bytes"] = nodes * x[0].numel() * x.element_size()
    result["gather_gbps"] = _gather_gbps(x, int(nodes), 5 if tiny else 20)
    if name == "neighbor_sage":
        result["compile"] = _compiled(model, precision, batches, passes)
    return result


def _aggregated_rows(layout: Any) -> int:
    """Rows of the first layer's aggregate a batch carries (0: none)."""
    x_aggr = getattr(layout, "x_aggr", None)
    return 0 if x_aggr is None else x_aggr.size(0)


def _compiled(model: Any, precision: str, batches: list, passes: int) -> dict:
    """torch.compile(dynamic=True) on the model's forward: compile time and step, or why not."""
    compiled = copy.deepcopy(model)
    forward = torch.compile(compiled.forward, dynamic=True)
    step = step_fn(compiled, precision, lambda b: forward(b.x, b.edge_index, b.layout))
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for batch in batches:  # a batch of each shape compiles (dynamic: once or twice)
                step(batch)
    except Exception as err:  # noqa: BLE001 - reported, not hidden: the figure says why
        return {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"}
    compile_s = time.perf_counter() - start
    return {"compile_s": compile_s, "step_ms": _time_ms({"c": (step, batches)}, passes)["c"]}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def blocks(tiny: bool) -> list[Block]:
    """benchmarks/README.md's ``roofline`` block."""
    results = {name: measure(name, tiny) for name in SAMPLERS}
    lines = [
        "| recipe | step (ms) | GEMMs alone (ms) | GEMM share | headroom | nodes per batch "
        "| feature rows into the step | feature gather in the worker (ms) "
        "| first layer's aggregation in the worker (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    labels = {
        "gnnscale": "{}, rows as sampled",
        "bucketed": "{}, rows rounded up to 1,024s (`--model.speed.bucket_rows=1024`, "
        "the default in bf16 on a CPU; held to the unpadded GEMMs)",
        "in_loader": "{}, first layer aggregated in the loader (as shipped: rows rounded up in "
        "bf16 on a CPU; held to the unpadded GEMMs)",
        "before": "{}, before target-only layers (PyG trim_to_layer, torch dropout, scatter)",
        "hand": "{}, the hand loop's forward (no trimming)",
    }
    for name, r in results.items():
        gather_ms = r["gather_bytes"] / r["gather_gbps"] / 1e6
        for variant, step_ms in r["step_ms"].items():
            gemm = r["gemm_ms"][variant]
            aggregate = r["aggregate_ms"] if variant == "in_loader" else None
            label = labels[variant]
            if variant == "gnnscale" and "in_loader" in r["step_ms"]:  # not as shipped
                label += (
                    ", every layer aggregated in the step "
                    "(`--model.speed.aggregate_in_loader=false`)"
                )
            lines.append(
                f"| {label.format(SAMPLERS[name])} | {step_ms:,.1f} | {gemm:,.1f} "
                f"| **{gemm / step_ms:.0%}** | {step_ms / gemm:.1f}x | {r['nodes']:,.0f} "
                f"| {r['rows'][variant]:,.0f} | {gather_ms:,.1f} "
                f"| {_ms(aggregate)} |"
            )
    neighbour = results["neighbor_sage"]
    c = neighbour["compile"]
    if "error" in c:
        compiled = f"failed here ({c['error']})"
    else:
        ratio = c["step_ms"] / neighbour["step_ms"]["gnnscale"]
        compiled = (
            f"{c['step_ms']:,.1f} ms per step ({ratio:.2f}x eager) after {c['compile_s']:,.0f} s "
            "of compiling"
        )
    share = {k: neighbour["gemm_ms"][k] / neighbour["step_ms"][k] for k in neighbour["step_ms"]}
    lines += [
        "",
        f"GEMM share of a neighbour step as shipped (the first layer aggregated in the "
        f"loader): **{share['in_loader']:.0%}** (aggregated in the step: "
        f"{share['gnnscale']:.0%}; before target-only layers: "
        f"{share['before']:.0%}; rows rounded up: {share['bucketed']:.0%}; goal: at least "
        "40%). "
        f"`torch.compile(dynamic=True)` on gnnscale's neighbour forward: {compiled}.",
        "",
        "Top operators of gnnscale's steps as shipped (self CPU time, torch.profiler):",
        "",
        "| recipe | operator | share | ms per step |",
        "|---|---|---:|---:|",
    ]
    for name, r in results.items():
        for op, share, ms in r["top_ops"]:
            lines.append(f"| {SAMPLERS[name]} | `{op}` | {share:.0%} | {ms:,.1f} |")
    gbps = statistics.mean(r["gather_gbps"] for r in results.values())
    precisions = ", ".join(sorted({r["precision"] for r in results.values()}))
    lines += [
        "",
        f"Each recipe's config.yaml ({precisions}, "
        "the generated graph at recipe size), batches drawn once in the main process, one "
        "process. Step: forward, weighted loss, backward, Adam; median over interleaved passes "
        "of the same batches. GEMMs alone: the step's dense matrix products (forward and "
        "backward, as recorded by a TorchDispatchMode, with their shapes, strides and dtype) "
        "each replayed on its own (median of a few runs after a first, which builds its oneDNN "
        "primitive), summed. Headroom: step / GEMMs. Feature gather: a batch's feature bytes "
        f"at the measured random-row gather bandwidth ({gbps:.2f} GB/s), which the loader's "
        "worker spends beside the step; the first layer's aggregation (GraphSAGE on neighbour "
        "batches, `gnnscale.data.layout.aggregate_first_layer`) is the worker's too, "
        "timed on the same batches. Each timed pass of a step follows one untimed batch "
        "(the variant before it evicted its cached primitives). Rows marked before / hand "
        "loop: the same model and batches through PyG's own forward (`benchmarks/roofline.py` "
        "says how).",
    ]
    return [Block(REPO / "benchmarks" / "README.md", "roofline", "\n".join(lines))]


if __name__ == "__main__":
    import sys

    for block in blocks("--size" in sys.argv and "tiny" in sys.argv):
        print(block.text)


SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about=(
        "one training step of each sampler recipe against its matrix products alone, the "
        "gather bandwidth, and its top operators"
    ),
    writes="roofline in benchmarks/README.md",
    threads=f"{torch.get_num_threads()} torch threads, one process",
)
