"""Execute the notebooks and write them, with outputs and plots, as ``notebooks/*.ipynb``.

The sources are ``notebooks/NN_topic.py`` (jupytext percent format); the ``.ipynb`` files are
generated and never edited by hand.

    python scripts/build_notebooks.py                  # all notebooks
    python scripts/build_notebooks.py notebooks/01_gat_memory.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def execute(source: Path, cwd: Path | None = None, timeout_s: int = 900) -> nbformat.NotebookNode:
    """Run every cell of ``source`` in a fresh kernel started in ``cwd``; raise on a failing cell.

    ``cwd`` defaults to the notebook's folder, where its data and run folders go (git-ignored).
    """
    notebook = jupytext.read(source)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    client = NotebookClient(
        notebook,
        timeout=timeout_s,
        kernel_name="python3",
        resources={"metadata": {"path": str(cwd or source.parent)}},
    )
    client.execute()
    return notebook


def main(paths: list[str]) -> None:
    """Build the given notebooks, or all of them."""
    sources = [Path(p).resolve() for p in paths] or sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))
    for source in sources:
        start = time.perf_counter()
        notebook = execute(source)
        target = source.with_suffix(".ipynb")
        nbformat.write(notebook, target)
        print(f"{target.relative_to(Path.cwd())}: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
