"""Markdown tables and matplotlib plots of ``results.json`` (see ``compare.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SAMPLERS = {"neighbor": "neighbour", "cluster": "Cluster-GCN", "saint": "GraphSAINT"}


def _num(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _ratio(entry: dict[str, Any], key: str) -> str:
    ratio = entry.get("ratio_vs_hand", {}).get(key)
    return "" if ratio is None else f"{ratio:.2f}×"


def comparison_table(table: dict[str, Any]) -> list[str]:
    """One line per measured configuration, medians over repetitions."""
    train_only = any("peak_rss_train_mb" in e.get("median", {}) for e in table.values())
    floors = any("epoch_over_floor" in e.get("median", {}) for e in table.values())
    head = "| sampler | run | s/epoch | ÷ hand "
    rule = "|---|---|---:|---:|"
    if floors:
        head += "| ÷ sampling floor "
        rule += "---:|"
    head += "| seed nodes/s | peak RSS (MiB) | ÷ hand "
    rule += "---:|---:|---:|"
    if train_only:
        head += "| peak RSS, training only (MiB) | ÷ hand "
        rule += "---:|---:|"
    lines = [head + "| test acc | feature gather GB/s (% of limit) |", rule + "---:|---:|"]
    for entry in table.values():
        med = entry.get("median", {})
        cells = [SAMPLERS[entry["sampler"]], entry["label"]]
        if "epoch_s" not in med:
            lines.append("| " + " | ".join(cells + ["failed"]) + " |")
            continue
        gather = ""
        if "gather_GBps" in med:
            gather = f"{med['gather_GBps']:.3f}"
            if "gather_fraction" in med:
                gather += f" ({100 * med['gather_fraction']:.1f}%)"
        cuda = f" (CUDA {med['peak_cuda_mb']:,.0f})" if "peak_cuda_mb" in med else ""
        cells += [_num(med["epoch_s"]), _ratio(entry, "epoch_s")]
        if floors:
            over = med.get("epoch_over_floor")
            cells.append("" if over is None else f"{over:.2f}×")
        cells += [
            _num(med["nodes_per_s"], 0),
            _num(med.get("peak_rss_mb"), 0) + cuda,
            _ratio(entry, "peak_rss_mb"),
        ]
        if train_only:
            cells += [_num(med.get("peak_rss_train_mb"), 0), _ratio(entry, "peak_rss_train_mb")]
        cells += [_num(med.get("acc"), 3), gather]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def bandwidth_lines(bw: dict[str, Any]) -> list[str]:
    """The random-gather and copy bandwidth, by thread count."""
    if "error" in bw:
        return ["Bandwidth measurement failed."]
    per = ", ".join(
        f"{t} thread(s): gather {v['gather_GBps']:.2f}, copy {v['copy_GBps']:.2f}"
        for t, v in bw["by_threads"].items()
    )
    return [
        f"Random row gather `x.index_select(0, idx)` of {bw['rows']:,} random rows of a "
        f"{bw['num_nodes']:,} × {bw['num_features']} fp32 feature matrix: "
        f"**{bw['gather_GBps']:.2f} GB/s** of gathered bytes; sequential copy `dst.copy_(x)`: "
        f"**{bw['copy_GBps']:.2f} GB/s** ({per}; GB/s). The last column above is each epoch's "
        "feature bytes gathered by the sampler (Σ batch nodes × F × 4 bytes, counted in the hand "
        "loop, which runs the same loader) over its seconds, as a share of the random-gather "
        "bandwidth.",
    ]


def gat_lines(gat: dict[str, Any]) -> list[str]:
    """Bytes gnnscale.GATv2 saves for backward, the O(E) bound and the dense formulation."""
    if "error" in gat:
        return ["The GATv2 measurement failed."]
    s = gat["settings"]
    m = s["model"]
    return [
        f"One fp32 training step on the GAT recipe's graph ({gat['num_nodes']:,} nodes, "
        f"{gat['num_edges']:,} edges), hidden {m['hidden_channels']} = {m['heads']} heads, "
        f"{m['out_heads']} output head(s); bytes autograd saves for backward, parameters "
        "excluded (exact, from `gnnscale.measure.saved_tensor_bytes`).",
        "",
        "| | MiB |",
        "|---|---:|",
        f"| gnnscale.GATv2, saved for backward | {gat['saved_mb']:,.1f} |",
        f"| O(E · heads · F) bound: 6 tensors per edge, head and channel, 4 per node and "
        f"width, per layer | {gat['bound_mb']:,.1f} |",
        f"| dense formulation: the [N, N, 2C] pair tensor per head and layer alone "
        f"| {gat['dense_pairs_mb']:,.0f} |",
    ]


def scaling_lines(points: list[dict[str, Any]]) -> list[str]:
    """Seconds per epoch and peak memory by graph size."""
    lines = [
        "| nodes | features | s/batch | s/epoch | batches/epoch | peak RSS (MiB) "
        "| RSS at end (MiB) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        head = f"| {p['num_nodes']:,} | {p['num_features']} "
        if "epoch_s" not in p:
            why = (
                p.get("skipped") or p.get("run", {}).get("error", "failed").strip().splitlines()[-1]
            )
            lines.append(head + f"| {why} | | | | |")
            continue
        how = f"{p['epoch_s']:,.1f}" + (
            f" (extrapolated from {p['batches_timed']} batches)" if p["extrapolated"] else ""
        )
        lines.append(
            head + f"| {p['s_per_batch']:.3f} | {how} | {p['batches_per_epoch']:,} "
            f"| {p['peak_rss_mb']:,.0f} | {p['end_rss_mb']:,.0f} |"
        )
    return lines


def markdown(results: dict[str, Any]) -> str:
    """Every table of the results, ready to paste between README markers."""
    m = results["machine"]
    hardware = m.get("cuda") or f"{m.get('cpu_model')}, {m.get('cpu_count')} CPUs"
    out: list[str] = []
    if "comparison" in results:
        out += [
            "#### gnnscale against a hand-written PyG loop",
            "",
            *comparison_table(results["comparison"]),
            "",
            "Same generated graph, model and loader as each recipe's config.yaml, "
            f"{results['settings']['epochs']} epochs on both sides (the configs ship 4), "
            f"{results['settings']['threads'] or 'default'} torch thread(s) per "
            "process. s/epoch and seed nodes/s: median "
            f"over epochs after {results['settings']['warmup_epochs']} warm-up epoch, then over "
            f"{results['settings']['reps']} interleaved repetitions. Peak RSS: the main "
            "process's peak over the whole run (data, sampler, training, one layer-wise exact "
            "evaluation), from the first "
            f"{results['settings']['eval_reps']} repetition(s), which also give the test "
            "accuracy after the last epoch; the other repetitions train only. "
            "÷ hand: gnnscale / hand-written. "
            "The hand loops are written as PyG's examples are (reddit.py, cluster_gcn_reddit.py, "
            "graph_saint.py), in bf16 autocast (as the recipes' bf16-mixed) and in fp32; each "
            "gnnscale row is divided by the hand loop of its precision. gnnscale's neighbour "
            "layers compute only the rows the next layer reads; the hand loop's compute every "
            "sampled node, as in reddit.py. The Cluster-GCN runs train on one identical "
            "pymetis partition. GraphSAINT by hand: GraphSAGE with node_norm, as gnnscale "
            "(the ÷ hand reference), and graph_saint.py's --use_normalization network "
            "(GraphConv, edge_norm × 1/in-degree). Rows marked (= hand loop) run gnnscale with "
            "the hand loop's precision and optimizer steps: no gradient accumulation, so "
            "twice the optimizer steps of config.yaml in the same epochs. ÷ sampling floor: "
            "s/epoch over one pass of the hand loop's training loader with no model (the same "
            "PyG sampler and workers; gnnscale's loaders also lay batches out for its layers): "
            "near 1×, sampling bounds the epoch, not the step. Where each step's time "
            "goes: the `roofline` block above.",
            "",
        ]
    if "bandwidth" in results:
        out += ["#### Physical limit: memory bandwidth", "", *bandwidth_lines(results["bandwidth"])]
        out.append("")
    if "gat_memory" in results:
        out += ["#### GATv2 activation memory", "", *gat_lines(results["gat_memory"]), ""]
    if "scaling" in results:
        points = results["scaling"]
        out += [
            "#### Scaling: neighbour sampling, GraphSAGE (recipe fan-out and batch size)",
            "",
            *scaling_lines(points),
            "",
            f"Average degree {points[0]['avg_degree'] if points else '–'}; features reduced to "
            f"{results['settings']['scale_features']} so that 10^7 nodes fit in memory. s/epoch is "
            "s/batch (one timed epoch of that many batches after a warm-up one) × batches per "
            "epoch: **extrapolated** where marked. No evaluation. Peak RSS includes generating "
            "the graph, which dominates it at large sizes; RSS at end is what training holds.",
            "",
        ]
    out += ["#### Targets", "", "| target | ratio | limit | result |", "|---|---:|---:|---|"]
    for t in results["targets"]:
        ratio = "–" if t["ratio"] is None else f"{t['ratio']:.3f}"
        out.append(f"| {t['target']} | {ratio} | {t['limit']} | {t['result']} |")
    out += [
        "",
        *[f"- {t['target'].split(' ')[0]} {t['measured']}" for t in results["targets"]],
        "",
        f"{results['wall_s'] / 60:.1f} min wall time; load average "
        f"{results['load_avg_start'][0]:.1f} at start, {results['load_avg_end'][0]:.1f} at end "
        f"(a shared machine: other work adds noise). Hardware: {hardware}.",
    ]
    return "\n".join(out) + "\n"


def plots(results: dict[str, Any], out: Path) -> None:
    """``comparison.png`` (s/epoch and peak RSS per run) and ``scaling.png`` (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = results.get("comparison", {})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    entries = [e for e in table.values() if e.get("median")]
    labels = [f"{SAMPLERS[e['sampler']]}\n{e['label']}" for e in entries]
    colours = ["tab:orange" if e["impl"] == "hand" else "tab:blue" for e in entries]
    for ax, key, title in (
        (axes[0], "epoch_s", "seconds per epoch (median)"),
        (axes[1], "peak_rss_mb", "peak RSS of the run (MiB)"),
    ):
        ax.barh(range(len(entries)), [e["median"][key] for e in entries], color=colours)
        ax.set_yticks(range(len(entries)), labels if ax is axes[0] else [""] * len(entries))
        ax.invert_yaxis()
        ax.set_title(title)
    axes[0].tick_params(axis="y", labelsize=7)
    fig.suptitle("gnnscale (blue) against hand-written PyG (orange)")
    fig.tight_layout()
    fig.savefig(out / "comparison.png", dpi=120)
    plt.close(fig)

    points = [p for p in results.get("scaling", []) if "epoch_s" in p]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    if points:
        n = [p["num_nodes"] for p in points]
        ax.loglog(n, [p["epoch_s"] for p in points], "o-", color="tab:blue", label="s/epoch")
        for p in points:
            if p["extrapolated"]:
                ax.annotate("extrapolated", (p["num_nodes"], p["epoch_s"]), fontsize=7)
        ax.set_xlabel("nodes (average degree 20)")
        ax.set_ylabel("seconds per epoch", color="tab:blue")
        ax2 = ax.twinx()
        ax2.loglog(n, [p["peak_rss_mb"] for p in points], "s--", color="tab:red", label="peak RSS")
        ax2.loglog(n, [p["end_rss_mb"] for p in points], "^:", color="tab:red", label="RSS at end")
        ax2.set_ylabel("resident memory (MiB)", color="tab:red")
        handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
        ax.legend(handles=handles, loc="upper left")
    ax.set_title("neighbour sampling: time and memory by graph size")
    fig.tight_layout()
    fig.savefig(out / "scaling.png", dpi=120)
    plt.close(fig)
