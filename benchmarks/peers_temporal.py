"""A temporal batch's sampling by gnnscale and by GraphBolt's ``TemporalNeighborSampler``.

Written by ``python benchmarks/figures.py peers_temporal`` (``peers-temporal`` in
benchmarks/README.md; named only: it runs in the peers' environment that ``peers`` builds).
The two jobs of ``temporal_sampling`` (temporal_links' stream with its training batches at
[20]; a 4M-edge graph of random times at [15, 10]), dumped once as a CSC with each slot's time
and the batches' seeds and times. GraphBolt 2.1 samples uniformly among the in-edges strictly
before the seed's time (it has no ``last``), so both tools do that: ``HopSampler(...,
strict=True)``, its default strategy. Each tool in a fresh process (``peer_temporal.py``),
alternated over five rounds; fp32, no loader, torch's default threads.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

import harness
import numpy as np
import torch
from blocks import REPO, Block, Section
from peers import peers_python
from temporal_sampling import large_job, recipe_job

from gnnscale.sampling import HopSampler

SCRIPT = REPO / "benchmarks" / "peer_temporal.py"
ROUNDS = 5


def dump(job: str, tiny: bool, folder: Path) -> tuple[Path, str]:
    """One job as ``peer_temporal.py`` reads it; its path and what it is."""
    graph, batches, about = (recipe_job if job == "recipe" else large_job)(tiny)
    fanout = [20] if job == "recipe" else [15, 10]
    csc = HopSampler(graph, fanout, time_attr="time")  # the CSC, each neighbourhood by time
    arrays = {
        "colptr": csc.colptr.numpy(),
        "row": csc.row.numpy(),
        "time": csc.clock[0].numpy(),  # type: ignore[index]
        "fanout": np.array(fanout),
        "batches": np.array(len(batches)),
    }
    for i, (seeds, when) in enumerate(batches):
        arrays[f"seeds{i}"], arrays[f"times{i}"] = seeds.numpy(), when.numpy()
    path = folder / f"{job}.npz"
    np.savez(path, **arrays)
    return path, f"{about}, uniform)" if job == "recipe" else f"{about}, uniform"


def _run(python: Path | str, tool: str, jobs: list[Path]) -> dict:
    argv = [str(python), str(SCRIPT), "--tool", tool, "--jobs", *map(str, jobs)]
    done = harness.run([*argv, "--threads", str(torch.get_num_threads())])
    line = next(x for x in done.stdout.splitlines() if x.startswith("PEER_RESULT "))
    return json.loads(line.removeprefix("PEER_RESULT "))


def blocks(tiny: bool) -> list[Block]:
    """benchmarks/README.md's ``peers-temporal`` block."""
    python = peers_python()
    runs: dict[str, list[dict]] = {"gnnscale": [], "graphbolt": []}
    with tempfile.TemporaryDirectory(prefix="gnnscale-peers-temporal-") as tmp:
        dumped = {job: dump(job, tiny, Path(tmp)) for job in ("recipe", "large")}
        jobs = [path for path, _ in dumped.values()]
        for r in range(1 if tiny else ROUNDS):
            for tool, exe in (("gnnscale", sys.executable), ("graphbolt", python)):
                print(f"peers_temporal: round {r + 1}, {tool}", flush=True)
                runs[tool].append(_run(exe, tool, jobs))
    lines = [
        "| job | sampler | ms a batch | edges a batch | ÷ GraphBolt |",
        "|---|---|---:|---:|---:|",
    ]
    verdicts = []
    for job, (_, about) in dumped.items():
        ms = {t: statistics.median(r[job]["ms"] for r in runs[t]) for t in runs}
        for tool, name in (("gnnscale", "gnnscale `HopSampler`"), ("graphbolt", "GraphBolt")):
            each = " / ".join(f"{r[job]['ms']:.1f}" for r in runs[tool])
            edges = statistics.mean(r[job]["edges"] for r in runs[tool])
            lines.append(
                f"| {about} | {name}, by time (strict, uniform) | {ms[tool]:.1f} ({each}) | "
                f"{edges:,.0f} | {ms[tool] / ms['graphbolt']:.2f}x |"
            )
        verdicts.append(f"{about.split(' (')[0]}: {ms['gnnscale'] / ms['graphbolt']:.2f}x")
    lines += [
        "",
        "gnnscale's timed batch against GraphBolt's: " + "; ".join(verdicts) + ".",
        "",
        "Sampling alone (no features, no step): the median milliseconds a batch after one "
        "warm-up, each tool in a fresh process, alternated; cells: the median, then each round. "
        "Both draw uniformly among the in-edges strictly before each seed's time, every hop "
        "against the root seed's time; GraphBolt 2.1 has no `last` (the recipe's strategy: "
        "temporal_sampling's block times it). Edges a batch: the mean over the batches, a check "
        "that both draw alike: equal at one hop; at two, GraphBolt's second hop samples the "
        "seeds again (each DGL layer's destinations include the layer's before it), so it "
        "draws a few percent more. GraphBolt: DGL 2.1.0 with torch 2.2.1 in the peers' "
        "environment.",
    ]
    if tiny:
        lines.insert(0, "**Tiny settings: a check of the pipeline, not figures.**\n")
    return [Block(REPO / "benchmarks" / "README.md", "peers-temporal", "\n".join(lines))]


SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about=(
        "a temporal batch's sampling by gnnscale and by GraphBolt's TemporalNeighborSampler on "
        "temporal_sampling's two jobs (the peers' environment, which peers builds)"
    ),
    writes="peers-temporal in benchmarks/README.md",
    threads=f"{torch.get_num_threads()} torch threads per process (torch's default), no loader",
    on_request=True,
)
