"""Regenerate every measured figure in every README: the one command.

    python benchmarks/figures.py                    # every section, full size (about 2 h here)
    python benchmarks/figures.py recipes gat        # some sections
    python benchmarks/figures.py --size tiny        # check the pipeline; prints, writes nothing

Sections, and the README blocks they write (``<!-- NAME:begin/end -->``):

- ``recipes``: every recipe of ``benchmarks/registry.py`` through ``gnnscale fit``, and ``gnnscale
  plan`` on the same config (``recipes`` in README.md, ``results`` in each recipe's README).
- ``roofline``: one training step of each sampler recipe against its matrix products alone,
  the gather bandwidth, and its top operators (``roofline`` in benchmarks/README.md).
- ``allocator``: s/epoch and peak memory of three recipes under each glibc mmap setting, the
  default marked (``allocator`` in benchmarks/README.md).
- ``validation``: per-epoch validation of the sampler recipes, sampled (as shipped) against
  exact, and of the full-graph recipes, every epoch (as shipped) against every other epoch and
  against the validation nodes' neighbourhoods alone: its seconds, its share of an epoch and of
  a whole fit, the accuracy it reports (``validation`` in benchmarks/README.md).
- ``workers``: s/epoch and peak memory of the sampler recipes with 0, 1 and 2 loader workers,
  the shipped setting marked (``workers`` in benchmarks/README.md).
- ``speed``: each of GraphSAGE's CPU speed tricks switched off in turn on the three sampler
  recipes, and HeteroSAGE's on the hetero recipe, interleaved with the shipped runs
  (``speed_defaults`` in benchmarks/README.md; about 15 minutes).
- ``compare``: gnnscale against hand-written PyG loops, memory bandwidth, GATv2 against its
  O(E) bound, scaling to 10^7 nodes (``benchmarks`` in benchmarks/README.md;
  ``benchmarks/results/``).
- ``gat``, ``sparse``, ``ddp``: the memory studies of ``gat_attention_memory``,
  ``sparse_embeddings`` and ``multi_gpu_ddp`` (``memory`` in each recipe's README).
- ``ondisk-large``: a graph of ogbn-papers100M's size, larger than memory, prepared and trained
  for one epoch (``large`` in on_disk_graph's README; about an hour, 50 GiB of disk; run at full
  size only when named).
- ``reads``: the same graph's cold epoch with one read at a time against many, and with feature
  caches of 10% and 25% of its feature file; the disk's own random-read rates; which rows a
  cache should hold (``reads`` in on_disk_graph's README; about 40 minutes; reuses
  ``ondisk-large``'s graph; run at full size only when named).
- ``graphs``: ``many_graphs_on_disk``: LMDB against SQLite, memory per rank on disk against in
  memory, worker memory over epochs, graphs/s and MAE against the edge-blind rule (``stores``,
  ``memory``, ``training`` in its README; about 10 minutes).
- ``ondisk``: ``on_disk_graph`` from its prepared folder against the same graph in memory, one
  process and two ranks, warm and cold page cache (``memory`` in its README).
- ``store``: a ``.npy`` folder prepared by streaming at two sizes (peak memory, throughput
  against a plain copy), and a plain PyG loop over the store's ``(FeatureStore, GraphStore)``
  against the graph in memory (``store`` in on_disk_graph's README; a few minutes).
- ``store-tasks``: the hetero and link recipes from a folder prepared by ``gnnscale prepare
  --source Recommender`` against the same graph in memory, one process and two ranks
  (``from_disk`` in each recipe's README; about 15 minutes).
- ``gpu``: the sampler, hetero and link recipes on one GPU, and the planner's CUDA peak against
  the fit's (``gpu`` in benchmarks/README.md; under 10 minutes on one H100; without CUDA it
  measures and writes nothing).
- ``peers``: the default recipe's job trained by gnnscale, DGL and GraphBolt on the same graph,
  alternated, at 0 and 1 loader workers, and where an epoch of each one's loader goes (``peers``
  in benchmarks/README.md and README.md; builds DGL's environment once, about 5 GB; about 15
  minutes; run at full size only when named).
- ``store-large``: a heterogeneous graph shaped like MAG240M, its paper features larger than
  memory, written as ``.npy``, prepared by streaming and trained from the store: papers
  classified (``store_large`` in on_disk_graph's README; about an hour, 60 GiB of disk, more
  where the disk reads slowly; run at full size only when named).
- ``store-large-links``: the same graph written again, and its citations predicted by one
  process and two ranks (``store_large_links`` there; about 40 minutes and more, as above).

Every block ends with a stamp: this command, the commit, the machine, the threads.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

import blocks as block_io
import torch
from registry import RECIPES
from workers import shipped_workers

SECTIONS = (
    "recipes",
    "roofline",
    "allocator",
    "validation",
    "workers",
    "speed",
    "compare",
    "gat",
    "sparse",
    "ddp",
    "ondisk",
    "graphs",
    "store",
    "store-tasks",
    "gpu",
)
# run only when named
EXTRA_SECTIONS = ("ondisk-large", "reads", "store-large", "store-large-links", "peers")


def _section(name: str, tiny: bool, args: argparse.Namespace) -> tuple[list[block_io.Block], str]:
    """Run one section; return its blocks and a note on the threads it measured with."""
    if name == "recipes":
        import recipes

        names = args.recipes or [r.name for r in RECIPES]
        threads = f"{torch.get_num_threads()} torch threads per process (torch's default)"
        return recipes.blocks(names, tiny, args.seeds), threads
    if name == "compare":
        import compare

        threads = f"{args.threads or torch.get_num_threads()} torch thread(s) per process"
        return compare.blocks("tiny" if tiny else "full", args.threads), threads
    module = {
        "gat": "gat_memory",
        "sparse": "sparse_embeddings",
        "ddp": "ddp_memory",
        "ondisk": "on_disk",
        "ondisk-large": "on_disk_large",
        "reads": "store_reads",
        "roofline": "roofline",
        "allocator": "allocator",
        "workers": "workers",
        "validation": "validation",
        "speed": "speed_defaults",
        "graphs": "many_graphs",
        "store": "store_prepare",
        "store-tasks": "store_tasks",
        "gpu": "gpu",
        "store-large": "store_large",
        "store-large-links": "store_large",
        "peers": "peers",
    }[name]
    ondisk_workers = shipped_workers("on_disk_graph")
    threads = {
        "gat": "1 torch thread per measurement",
        "sparse": f"{torch.get_num_threads()} torch threads",
        "ddp": "2 processes, torch's default threads each",
        "ondisk": "1 process with torch's default threads, or 2 ranks with 1 thread each",
        "ondisk-large": f"{torch.get_num_threads()} torch threads, {ondisk_workers} loader workers "
        "(the recipe's)",
        "reads": f"{torch.get_num_threads()} torch threads, loader workers as each row says",
        "roofline": f"{torch.get_num_threads()} torch threads, one process",
        "allocator": f"{torch.get_num_threads()} torch threads per process (torch's default)",
        "workers": f"{torch.get_num_threads()} torch threads per process (torch's default)",
        "validation": f"{torch.get_num_threads()} torch threads per process (torch's default)",
        "speed": f"{torch.get_num_threads()} torch threads per process (torch's default)",
        "graphs": "torch's default threads per process (fits: 1 or 2 ranks)",
        "store": f"{torch.get_num_threads()} torch threads, one process at a time",
        "store-tasks": "1 process with torch's default threads, or 2 ranks with 1 thread each",
        "gpu": f"one GPU; {torch.get_num_threads()} torch threads on the host",
        "store-large": f"{torch.get_num_threads()} torch threads, 1 loader worker",
        "store-large-links": f"{torch.get_num_threads()} torch threads, 1 loader worker a rank",
        "peers": f"{torch.get_num_threads()} torch threads per process (torch's default), "
        "loader workers as each row says",
    }[name]
    if name == "store-large-links":
        return __import__(module).link_blocks(tiny), threads
    return __import__(module).blocks(tiny), threads


def main(argv: list[str] | None = None) -> None:
    """Run the sections asked for and write (or, tiny, print) their blocks."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("sections", nargs="*", help=f"any of {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--size", choices=["full", "tiny"], default="full")
    parser.add_argument("--recipes", nargs="+", help="recipes section: only these recipes")
    parser.add_argument("--seeds", type=int, default=1, help="recipes section: runs per variant")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="compare section: torch threads per process (0: torch's default, as the recipes)",
    )
    args = parser.parse_args(argv)
    if unknown := set(args.sections) - set(SECTIONS) - set(EXTRA_SECTIONS):
        known = ", ".join(SECTIONS + EXTRA_SECTIONS)
        parser.error(f"unknown sections {sorted(unknown)}; choose from {known}")
    tiny = args.size == "tiny"
    if not tiny and block_io.dirty():  # a stamp names the commit that measured: it must exist
        print(
            "figures.py: gnnscale/, recipes/ or benchmarks/ has uncommitted changes: commit "
            "them first, so each stamp names the code that measured (--size tiny writes nothing)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    command = shlex.join(["python", "benchmarks/figures.py", *(argv or sys.argv[1:])])
    # At tiny size every section runs, the extra ones too: the check covers every README block.
    for name in args.sections or (SECTIONS + EXTRA_SECTIONS if tiny else SECTIONS):
        start = time.perf_counter()
        print(f"== {name}", flush=True)
        written, threads = _section(name, tiny, args)
        for block in written:
            if tiny:
                stamp = block_io.stamp(command, threads)
                print(f"--- {block.path} [{block.name}]\n{block.text}\n\n{stamp}", flush=True)
            else:
                block_io.write(block, command, threads)
                print(f"wrote {block.path} [{block.name}]", flush=True)
        print(f"== {name}: {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
