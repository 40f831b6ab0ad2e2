"""Every notebook executes top to bottom at its default (CPU) sizes; a failing cell fails CI."""

import importlib.util
from pathlib import Path

import pytest

from gnnscale.testing import requires_sampler

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))


def _builder():
    path = ROOT / "scripts" / "build_notebooks.py"
    spec = importlib.util.spec_from_file_location("build_notebooks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@requires_sampler
@pytest.mark.parametrize("source", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(source, tmp_path):
    # Run in a temporary folder so the data and run folders a notebook writes leave the clone clean.
    notebook = _builder().execute(source, cwd=tmp_path)
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"{source.name} produced no plot"


def test_all_four_guides_exist():
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04"], NOTEBOOKS
