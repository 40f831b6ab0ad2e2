"""Execute the notebooks and write them, with outputs and plots, as ``notebooks/*.ipynb``.

The sources are ``notebooks/NN_topic.py`` (jupytext percent format); the ``.ipynb`` files are
generated and never edited by hand.

    python scripts/build_notebooks.py                  # all notebooks
    python scripts/build_notebooks.py notebooks/01_gat_memory.py
"""

from __future__ import annotations

import sys
import sysconfig
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
REPO = NOTEBOOKS.parent


def without_machine_paths(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The outputs, with this machine's folders named for what they are.

    A warning names its file: ``<site-packages>/...`` (and ``.`` for the checkout), not the
    folders of the machine that built the notebook.
    """
    folders = {sysconfig.get_paths()["purelib"]: "<site-packages>", str(REPO): "."}
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                for folder, name in folders.items():
                    output["text"] = output["text"].replace(folder, name)
    return notebook


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
        notebook = without_machine_paths(execute(source))
        target = source.with_suffix(".ipynb")
        nbformat.write(notebook, target)
        print(f"{target.relative_to(Path.cwd())}: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
