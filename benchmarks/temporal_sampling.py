"""What sampling by time costs: a batch's sampling alone, timed against untimed, two jobs.

Written by ``python benchmarks/figures.py temporal_sampling`` (its block in benchmarks/README.md).

- **temporal_links' job**: the recipe's stream (60,000 interactions, both ways), a training batch
  of 200 questions with 11 candidates each (2,400 seeds), the 20 newest interactions before each
  seed's time (``strict``, ``last``).
- **the default recipe's fan-out**: a generated graph of 200,000 nodes and 4M edges with random
  edge times, 1,024 seeds at [15, 10], uniform among the edges before a time that admits 90%.

Rows: ``HopSampler`` by time; untimed and disjoint (a subgraph per seed, as temporal sampling
is); untimed and joint (the static GNN's batch); and a plain-PyTorch masked sampler, what users
write without a temporal sampler: per seed, the in-edges before its time, then its draw. Sampling
alone (no features, no step), median over the batches after one warm-up, in this process.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from blocks import Block, Section
from registry import REPO, recipe
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.sampler import NodeSamplerInput

from gnnscale import InteractionStream, TemporalLinkDataModule
from gnnscale.sampling import HopSampler


def _median_ms(draw: Callable[[int], object], batches: int) -> float:
    draw(0)  # warm-up
    times = []
    for i in range(1, batches + 1):
        start = time.perf_counter()
        draw(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def _masked(colptr: Tensor, row: Tensor, clock: Tensor, fanout: int, last: bool) -> Callable:
    """A hand-written sampler: per seed, its in-edges before its time, then the newest or a draw."""

    def sample(seeds: Tensor, when: Tensor) -> list[Tensor]:
        picked = []
        for node, t in zip(seeds.tolist(), when.tolist(), strict=True):
            edges = torch.arange(int(colptr[node]), int(colptr[node + 1]))
            edges = edges[clock[edges] < t]
            if edges.numel() > fanout:
                edges = edges[-fanout:] if last else edges[torch.randperm(edges.numel())[:fanout]]
            picked.append(row[edges])
        return picked

    return sample


def _rows(samplers: dict[str, HopSampler], hand: Callable, batches: list, n: int) -> dict:
    """Each way's median ms a batch, one hop (``hand``: the first hop only, per seed)."""
    out = {}
    for name, sampler in samplers.items():
        timed = sampler.is_temporal

        def draw(i: int, sampler: HopSampler = sampler, timed: bool = timed) -> object:
            seeds, when = batches[i % len(batches)]
            return sampler.sample_from_nodes(
                NodeSamplerInput(None, seeds, time=when if timed else None)
            )

        out[name] = _median_ms(draw, n)
    out["plain PyTorch, masked per seed (first hop only)"] = _median_ms(
        lambda i: hand(*batches[i % len(batches)]), max(n // 4, 2)
    )
    return out


def recipe_job(tiny: bool) -> tuple[Data, list[tuple[Tensor, Tensor]], str]:
    """temporal_links' graph (its stream, both ways, with times) and 12 training batches."""
    stream = InteractionStream(num_events=6_000) if tiny else InteractionStream()
    s = TemporalLinkDataModule(stream=stream).stream
    graph = Data(
        edge_index=torch.cat([s.data.edge_index, s.data.edge_index.flip(0)], 1),
        time=s.time.repeat(2),
        num_nodes=s.num_nodes,
    )
    g = torch.Generator().manual_seed(0)
    events = s.stage("train")
    batches = []
    for _ in range(12):
        asked = events[torch.randint(events.numel(), (200,), generator=g)]
        candidates = torch.cat([s.dst[asked].unsqueeze(1), s.random_items((200, 10), g)], 1)
        seeds = torch.cat([s.src[asked], candidates.reshape(-1)])
        batches.append((seeds, torch.cat([s.time[asked], s.time[asked].repeat_interleave(11)])))
    about = f"temporal_links' job ({s.time.numel():,} interactions, 2,400 seeds, [20]"
    return graph, batches, about


def large_job(tiny: bool) -> tuple[Data, list[tuple[Tensor, Tensor]], str]:
    """A graph of random edge times at the default recipe's fan-out, and 12 batches."""
    nodes, edges = (20_000, 400_000) if tiny else (200_000, 4_000_000)
    g = torch.Generator().manual_seed(0)
    graph = Data(
        edge_index=torch.randint(0, nodes, (2, edges), generator=g),
        time=torch.randint(0, 1_000_000, (edges,), generator=g),
        num_nodes=nodes,
    )
    batches = [
        (torch.randperm(nodes, generator=g)[:1024], torch.full((1024,), 900_000)) for _ in range(12)
    ]
    return graph, batches, f"{nodes:,} nodes, {edges:,} edges, 1,024 seeds at [15, 10]"


def _recipe_job(tiny: bool) -> tuple[dict[str, float], str]:
    graph, batches, about = recipe_job(tiny)
    timed = HopSampler(graph, [20], time_attr="time", temporal_strategy="last", strict=True)
    samplers = {
        "gnnscale, by time (strict, last)": timed,
        "gnnscale, untimed, disjoint": HopSampler(graph, [20], disjoint=True),
        "gnnscale, untimed, joint": HopSampler(graph, [20]),
    }
    clock = timed.clock[0]  # type: ignore[index]
    hand = _masked(timed.colptr, timed.row, clock, 20, last=True)
    return _rows(samplers, hand, batches, 4 if tiny else 30), f"{about}, last)"


def _large_job(tiny: bool) -> tuple[dict[str, float], str]:
    graph, batches, about = large_job(tiny)
    timed = HopSampler(graph, [15, 10], time_attr="time", strict=True)
    samplers = {
        "gnnscale, by time (strict, uniform)": timed,
        "gnnscale, untimed, disjoint": HopSampler(graph, [15, 10], disjoint=True),
        "gnnscale, untimed, joint": HopSampler(graph, [15, 10]),
    }
    hand = _masked(timed.colptr, timed.row, timed.clock[0], 15, last=False)  # type: ignore[index]
    return _rows(samplers, hand, batches, 4 if tiny else 30), f"{about}, uniform"


def blocks(tiny: bool) -> list[Block]:
    """benchmarks/README.md's ``temporal_sampling`` block."""
    torch.manual_seed(0)
    lines = [
        "| job | sampler | ms a batch | ÷ untimed, disjoint | ÷ untimed, joint |",
        "|---|---|---:|---:|---:|",
    ]
    verdicts = []
    for job in (_recipe_job, _large_job):
        rows, about = job(tiny)
        disjoint = rows["gnnscale, untimed, disjoint"]
        joint = rows["gnnscale, untimed, joint"]
        for name, ms in rows.items():
            lines.append(
                f"| {about} | {name} | {ms:.1f} | {ms / disjoint:.2f}x | {ms / joint:.2f}x |"
            )
            print(f"{about}: {name} {ms:.1f} ms", flush=True)
        timed = next(ms for name, ms in rows.items() if "by time" in name)
        verdicts.append(
            f"{about.split(' (')[0]}: {timed / disjoint:.2f}x disjoint, {timed / joint:.2f}x joint"
        )
    lines += [
        "",
        "A timed batch against an untimed one: " + "; ".join(verdicts) + ". Temporal sampling "
        "is disjoint (each seed its own subgraph at its own time, as in PyG and GraphBolt), so "
        "the like-for-like row is the disjoint one; the joint row is what a static GNN's batch "
        "costs.",
        "",
        "Sampling alone, in this process (no features gathered, no training step): median "
        "milliseconds a batch after one warm-up batch. The plain-PyTorch row samples the first "
        "hop only, a Python loop over the seeds (what a user writes without a temporal sampler).",
    ]
    if tiny:
        lines.append("**Tiny settings: a check of the pipeline, not figures.**")
    return [Block(REPO / "benchmarks" / "README.md", "temporal_sampling", "\n".join(lines))]


assert recipe("temporal_links")  # the job this section times is that recipe's

SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about=(
        "a batch's sampling by time against untimed (disjoint and joint) and a hand-written "
        "masked sampler, on temporal_links' job and at the default recipe's fan-out"
    ),
    writes="temporal_sampling in benchmarks/README.md",
    threads="2 torch threads (torch's default), one process",
)
