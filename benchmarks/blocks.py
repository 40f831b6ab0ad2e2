"""The one writer of measured figures into READMEs: blocks between markers, each stamped.

A block is the text between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` in a markdown file.
Only ``benchmarks/figures.py`` writes them; every block ends with a stamp that names the command
that wrote it, the commit, the machine and the threads, so a reader can rerun it. Each file of
figures.py's sections declares itself as a :class:`Section` (its ``SECTION``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from gnnscale.measure import cpu_bf16_native

REPO = Path(__file__).resolve().parents[1]
# The threads of a section whose runs are fresh processes with torch's defaults, for its stamp.
PER_PROCESS = f"{torch.get_num_threads()} torch threads per process (torch's default)"


@dataclass
class Block:
    """Text for one marked block of one file.

    Args:
        path: The markdown file (relative paths are taken from the repository root).
        name: The marker name: ``<!-- name:begin -->`` ... ``<!-- name:end -->``.
        text: The block's content, without the stamp.
    """

    path: Path
    name: str
    text: str


@dataclass(frozen=True)
class Section:
    """A section of ``benchmarks/figures.py``, declared by its file as ``SECTION``.

    The section is named as its file (``store_large_links`` is ``store_large_links.py``).

    Args:
        run: Measures and returns the blocks; ``run(tiny, options)``, options being figures.py's
            arguments (``--recipes``, ``--seeds``, ``--threads``).
        about: What it measures, in a sentence (``figures.py --help``).
        writes: The blocks it writes, where.
        threads: How many threads and processes it measures with, for the stamp; or a function
            of the options that says so.
        on_request: Runs only when named (it takes long, a large disk, or a second environment).
        formerly: Names it had before, which older stamps give; still accepted.
    """

    run: Callable[[bool, argparse.Namespace], list[Block]]
    about: str
    writes: str
    threads: str | Callable[[argparse.Namespace], str]
    on_request: bool = False
    formerly: tuple[str, ...] = ()

    def threads_for(self, options: argparse.Namespace) -> str:
        """The stamp's words on threads, for a run with ``options``."""
        return self.threads if isinstance(self.threads, str) else self.threads(options)


def _git(*args: str) -> str:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    return ""


def dirty() -> bool:
    """Whether tracked code the figures depend on differs from the checked-out commit."""
    # Blocks are written to *.md, compare's JSON and plots to benchmarks/results: outputs.
    code = ["gnnscale", "recipes", "benchmarks", ":(exclude)*.md", ":(exclude)benchmarks/results"]
    return bool(_git("status", "--porcelain", "--untracked-files=no", "--", *code))


def commit() -> str:
    """The checked-out commit, marked ``+ uncommitted changes`` when the tree is dirty."""
    sha = _git("rev-parse", "--short", "HEAD") or "unknown commit"
    return f"{sha} + uncommitted changes" if dirty() else sha


def machine() -> str:
    """CPU model (or GPU), cores and memory, in a few words."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    import psutil

    memory = psutil.virtual_memory().total / 2**30
    text = f"{cpu}, {os.cpu_count()} cores, {memory:.0f} GiB"
    if torch.cuda.is_available():
        text += f", {torch.cuda.get_device_name()}"
    else:  # without them, bf16-mixed recipes train in fp32 (gnnscale.cli.runtime.cpu_precision)
        text += f", CPU bf16 kernels: {'yes' if cpu_bf16_native() else 'no'}"
    return text


def stamp(command: str, threads: str) -> str:
    """The line that ends every block: command, commit, machine, threads, versions, date."""
    import lightning
    import torch_geometric

    from gnnscale.sampling import describe

    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    return (
        f"<sub>Written by `{command}` at commit {commit()} on {machine()}; {threads}; torch "
        f"{torch.__version__}, PyG {torch_geometric.__version__}, Lightning "
        f"{lightning.__version__}, neighbour sampling by {describe('auto')}; load average "
        f"{load} when written; {datetime.date.today().isoformat()}.</sub>"
    )


def write(block: Block, command: str, threads: str) -> None:
    """Replace ``block``'s marked section of its file with its text and a stamp."""
    path = block.path if block.path.is_absolute() else REPO / block.path
    begin, end = f"<!-- {block.name}:begin -->", f"<!-- {block.name}:end -->"
    content = path.read_text()
    if content.count(begin) != 1 or content.count(end) != 1:
        raise SystemExit(f"{path} needs exactly one {begin} ... {end} pair")
    body = f"{begin}\n{block.text.strip()}\n\n{stamp(command, threads)}\n{end}"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    path.write_text(pattern.sub(lambda _: body, content))
