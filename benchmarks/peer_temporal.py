"""A temporal batch's sampling by gnnscale and by GraphBolt, on the same dumped jobs.

Run by ``benchmarks/peers.py`` (its ``peers-temporal`` block), once per tool and round, each in a
fresh process: ``--tool gnnscale`` in the project's environment, ``--tool graphbolt`` in the peers'
(DGL 2.1.0, torch 2.2.1). Both read one ``.npz`` per job (``peers.dump_temporal``): a CSC with
each slot's time, and batches of seeds with their times. Both draw uniformly among the in-edges
strictly before each seed's time, every hop compared with the root seed's time (GraphBolt's only
rule; it has no ``last``). Sampling alone: no features, no step. Prints ``PEER_RESULT {json}``:
per job, the median milliseconds a batch after one warm-up, and the edges a batch drew.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch


def _batches(job: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
    count = int(job["batches"])
    return [
        (torch.from_numpy(job[f"seeds{i}"]), torch.from_numpy(job[f"times{i}"]))
        for i in range(count)
    ]


def gnnscale_sampler(job: dict):  # noqa: ANN201 (the project's types are not the peers')
    """``HopSampler`` by time over the job's graph: a function of one batch."""
    from torch_geometric.data import Data
    from torch_geometric.sampler import NodeSamplerInput

    from gnnscale.sampling import HopSampler

    colptr, row = torch.from_numpy(job["colptr"]), torch.from_numpy(job["row"])
    target = torch.repeat_interleave(torch.arange(colptr.numel() - 1), colptr.diff())
    graph = Data(
        edge_index=torch.stack([row, target]),
        time=torch.from_numpy(job["time"]),
        num_nodes=colptr.numel() - 1,
    )
    fanout = [int(k) for k in job["fanout"]]
    sampler = HopSampler(graph, fanout, time_attr="time", strict=True, is_sorted=True)

    def draw(seeds: torch.Tensor, times: torch.Tensor) -> int:
        out = sampler.sample_from_nodes(NodeSamplerInput(None, seeds, time=times))
        return int(out.row.numel())

    return draw


def graphbolt_sampler(job: dict):  # noqa: ANN201
    """GraphBolt's ``TemporalNeighborSampler`` over the job's graph: a function of one batch."""
    import dgl.graphbolt as gb
    from dgl.graphbolt.impl.temporal_neighbor_sampler import TemporalNeighborSampler
    from torchdata.datapipes.iter import IterableWrapper

    graph = gb.fused_csc_sampling_graph(
        torch.from_numpy(job["colptr"]),
        torch.from_numpy(job["row"]),
        edge_attributes={"timestamp": torch.from_numpy(job["time"])},
    )
    # GraphBolt lists fan-outs from the outermost hop in: the reverse of PyG's order.
    fanout = [int(k) for k in job["fanout"]][::-1]
    sampler = TemporalNeighborSampler(
        IterableWrapper([]), graph, fanout, edge_timestamp_attr_name="timestamp"
    )

    def draw(seeds: torch.Tensor, times: torch.Tensor) -> int:
        _, subgraphs = sampler.sample_subgraphs(seeds, times)
        return sum(int(s.sampled_csc.indices.numel()) for s in subgraphs)

    return draw


def main() -> None:
    """Time each job's batches with one tool; print the figures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--tool", choices=("gnnscale", "graphbolt"), required=True)
    parser.add_argument("--jobs", type=Path, nargs="+", required=True)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    result = {}
    for path in args.jobs:
        job = dict(np.load(path))
        batches = _batches(job)
        draw = (gnnscale_sampler if args.tool == "gnnscale" else graphbolt_sampler)(job)
        draw(*batches[0])  # warm-up
        times, edges = [], []
        for seeds, when in batches[1:]:
            start = time.perf_counter()
            edges.append(draw(seeds, when))
            times.append(time.perf_counter() - start)
        result[path.stem] = {
            "ms": statistics.median(times) * 1000,
            "edges": statistics.mean(edges),
        }
    print("PEER_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
