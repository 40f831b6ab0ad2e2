"""What ``compare.py``'s runs say: medians after warm-up, ratios to the hand loop, the targets.

Pure functions of the runs' result dicts (``jobs.py`` writes them); ``report.py`` turns them
into the README's tables and plots.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compare_rows import Row

WARMUP_EPOCHS = 1


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
