"""Regenerate every measured figure in every README: the one command.

    python benchmarks/figures.py                    # every section, full size (about 2 h here)
    python benchmarks/figures.py recipes gat        # some sections
    python benchmarks/figures.py --size tiny        # check the pipeline; prints, writes nothing

Sections, and the README blocks they write (``<!-- NAME:begin/end -->``):

- ``recipes``: every recipe of ``gnnscale.registry`` through ``gnnscale fit``, and ``gnnscale
  plan`` on the same config (``recipes`` in README.md, ``results`` in each recipe's README).
- ``compare``: gnnscale against hand-written PyG loops, memory bandwidth, where the time goes,
  GATv2 against its O(E) bound, scaling to 10^7 nodes (``benchmarks`` in README.md;
  ``benchmarks/results/``).
- ``gat``, ``sparse``, ``ddp``: the memory studies of ``gat_attention_memory``,
  ``sparse_embeddings`` and ``multi_gpu_ddp`` (``memory`` in each recipe's README).

Every block ends with a stamp: this command, the commit, the machine, the threads.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

import blocks as block_io
import torch

from gnnscale.registry import RECIPES

SECTIONS = ("recipes", "compare", "gat", "sparse", "ddp")


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
    module = {"gat": "gat_memory", "sparse": "sparse_embeddings", "ddp": "ddp_memory"}[name]
    threads = {
        "gat": "1 torch thread per measurement",
        "sparse": f"{torch.get_num_threads()} torch threads",
        "ddp": "2 processes, torch's default threads each",
    }[name]
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
        "--threads", type=int, default=1, help="compare section: torch threads per process"
    )
    args = parser.parse_args(argv)
    if unknown := set(args.sections) - set(SECTIONS):
        parser.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    tiny = args.size == "tiny"
    command = shlex.join(["python", "benchmarks/figures.py", *(argv or sys.argv[1:])])
    for name in args.sections or SECTIONS:
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
