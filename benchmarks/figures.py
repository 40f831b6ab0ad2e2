"""Regenerate every measured figure in every README: the one command.

    python benchmarks/figures.py                        # every section, full size (about 2 h here)
    python benchmarks/figures.py recipes gat_memory     # some sections
    python benchmarks/figures.py --size tiny            # check the pipeline; prints, writes nothing
    python benchmarks/figures.py --help                 # the sections: what each measures, writes

Each section is a file of ``benchmarks/`` that declares itself (its ``SECTION``, a
``blocks.Section``) and is named as the file; :data:`FILES` lists them in the order they run.
Every block ends with a stamp: this command, the commit, the machine, the threads.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
import textwrap
import time

import blocks as block_io
from blocks import Section

# The sections, in the order they run; the last seven only when named.
FILES = (
    "recipes",
    "roofline",
    "allocator",
    "validation",
    "workers",
    "temporal_sampling",
    "temporal_finetune",
    "speed_defaults",
    "compare",
    "gat_memory",
    "sparse_embeddings",
    "ddp_memory",
    "on_disk",
    "many_graphs",
    "store_prepare",
    "store_tasks",
    "gpu",
    "on_disk_large",
    "store_append",
    "store_reads",
    "store_large",
    "store_large_links",
    "peers",
    "peers_temporal",
)


def sections() -> dict[str, Section]:
    """Every section by name, in :data:`FILES`' order."""
    return {name: importlib.import_module(name).SECTION for name in FILES}


def _listing(found: dict[str, Section]) -> str:
    """The sections for ``--help``: name, what it measures, what it writes."""
    lines = []
    for name, section in found.items():
        when = "; only when named" if section.on_request else ""
        text = f"{name}: {section.about} (writes {section.writes}{when})"
        lines += textwrap.wrap(text, 96, initial_indent="  ", subsequent_indent="      ")
    return "sections:\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the sections asked for and write (or, tiny, print) their blocks."""
    found = sections()
    formerly = {old: name for name, sec in found.items() for old in sec.formerly}
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=_listing(found),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "sections", nargs="*", help="sections to run (default: all but those run only when named)"
    )
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
    if unknown := set(args.sections) - set(found) - set(formerly):
        parser.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(found)}")
    tiny = args.size == "tiny"
    if not tiny and block_io.dirty():  # a stamp names the commit that measured: it must exist
        print(
            "figures.py: gnnscale/, recipes/ or benchmarks/ has uncommitted changes: commit "
            "them first, so each stamp names the code that measured (--size tiny writes nothing)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    command = shlex.join(["python", "benchmarks/figures.py", *(argv or sys.argv[1:])])
    # At tiny size every section runs, those run only when named too: the check covers every
    # README block.
    names = [formerly.get(n, n) for n in args.sections]
    names = names or [n for n, sec in found.items() if tiny or not sec.on_request]
    for name in names:
        start = time.perf_counter()
        print(f"== {name}", flush=True)
        section = found[name]
        written, threads = section.run(tiny, args), section.threads_for(args)
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
