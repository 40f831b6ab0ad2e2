"""The one figure command, at tiny size: every README block is produced, complete and stamped.

Timings at this size mean nothing (and targets may fail); the test checks that the pipeline runs
end to end, fills every marked block that the READMEs carry, and writes nothing at tiny size.
"""

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from registry import RECIPES, REPO, recipe

from gnnscale import SpeedTricks
from gnnscale.cli import main
from gnnscale.testing import cli_args

MARKERS = re.compile(r"<!-- (\w+):begin -->")


def _blocks_in_readmes() -> set[tuple[str, str]]:
    readmes = [REPO / "README.md", REPO / "benchmarks" / "README.md"]
    readmes += [r.folder / "README.md" for r in RECIPES]
    return {
        (str(path.relative_to(REPO)), name)
        for path in readmes
        for name in MARKERS.findall(path.read_text())
    }


SECTION_TIMEOUT_S = 600  # the longest section (recipes) takes about 4 minutes here


def _tail(path: Path, chars: int = 2000) -> str:
    return f"--- {path.name}:\n{path.read_text(errors='replace')[-chars:]}"


def _run_section(name: str, folder: Path) -> tuple[str, str | None]:
    """One section of the figure command at tiny size: its output, and what went wrong if not ok.

    Each section in a process group of its own, its output to files: one that hangs is named,
    with the processes it left running, and killed with all of them at its timeout.
    """
    out, err = folder / f"{name}.out", folder / f"{name}.err"
    argv = [sys.executable, str(REPO / "benchmarks" / "figures.py"), name, "--size", "tiny"]
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            argv,
            stdout=stdout,
            stderr=stderr,
            cwd=folder,
            start_new_session=True,
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # a crash prints every thread's stack
        )
        try:
            code = proc.wait(timeout=SECTION_TIMEOUT_S)
            problem = None if code == 0 else f"section {name} exited with {code}"
        except subprocess.TimeoutExpired:
            left = subprocess.run(
                ["ps", "-o", "pid,etimes,args", "-s", str(proc.pid)], capture_output=True, text=True
            )
            problem = (
                f"section {name} ran past {SECTION_TIMEOUT_S} s; its processes:\n{left.stdout}"
            )
        with contextlib.suppress(ProcessLookupError):  # a hung section's, or strays of any
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if problem:
        problem = "\n".join([problem, _tail(out), _tail(err)])
    return out.read_text(), problem


@pytest.mark.slow
def test_figure_command_fills_every_block_and_writes_nothing_at_tiny_size(tmp_path):
    import figures

    written = [*REPO.rglob("README.md"), *(REPO / "benchmarks" / "results").iterdir()]
    before = {p: p.read_bytes() for p in written if ".venv" not in p.parts}
    outputs, problems = [], []
    for name in figures.FILES:  # every section, one at a time
        output, problem = _run_section(name, tmp_path)
        if problem and "(SIGSEGV)" in problem:
            # A torchrun rank training from a store dies of a segmentation fault in native code,
            # very rarely (seen twice in the slow tier, never reproduced; test_store_tasks'
            # two-rank link test does the same): run once more, keeping the first run's stacks
            # as a warning.
            warnings.warn(f"section {name} crashed; run once more:\n{problem}", stacklevel=1)
            (tmp_path / "again").mkdir(exist_ok=True)
            output, problem = _run_section(name, tmp_path / "again")
        outputs.append(output)
        problems += [problem] if problem else []
    assert not problems, "\n\n".join(problems)
    stdout = "".join(outputs)
    printed = re.findall(r"^--- (\S+) \[(\w+)\]\n(.*?)(?=^--- |^== )", stdout, re.S | re.M)
    produced = {(str((REPO / path).resolve().relative_to(REPO)), name) for path, name, _ in printed}
    expected = _blocks_in_readmes()
    if not torch.cuda.is_available():  # the gpu section measures nothing without one
        expected.remove(("benchmarks/README.md", "gpu"))
    assert produced == expected
    for path, name, text in printed:
        stamp = r"Written by `python benchmarks/figures\.py \w[\w-]* --size tiny` at commit"
        assert re.search(stamp, text), name
        assert "|---" in text, (path, name)  # a table
        body = text.split("<sub>")[0]
        assert not re.search(r"\bfailed\b|\bnan\b", body, re.I), (path, name)
    for target in ("(i)", "(ii)", "(iii)"):
        assert re.search(rf"^(PASS|FAIL)\s+{re.escape(target)}", stdout, re.M), target
    after = {p: p.read_bytes() for p in before}
    assert after == before  # tiny figures are printed, never written (READMEs, results, plots)


def test_figures_are_not_written_from_uncommitted_code(monkeypatch, capsys):
    # A stamp names a commit: code changed since it would be measured under the wrong name.
    import blocks
    import figures

    monkeypatch.setattr(blocks, "dirty", lambda: True)
    ran = []
    section = blocks.Section(lambda *a: ran.append(a) or [], "it", "nothing", "1 thread")
    monkeypatch.setattr(figures, "sections", lambda: {"recipes": section})
    with pytest.raises(SystemExit) as refused:
        figures.main(["recipes"])
    assert refused.value.code == 2 and not ran
    assert "uncommitted changes" in capsys.readouterr().err
    figures.main(["recipes", "--size", "tiny"])  # tiny prints, writes nothing: allowed
    assert ran


def test_each_section_is_a_file_that_declares_itself_under_its_files_name(monkeypatch, capsys):
    # Every file of benchmarks/ with a SECTION is run by figures.py, named as the file; a name
    # older stamps give still runs its section; the README's table lists every section.
    import figures

    files = (REPO / "benchmarks").glob("*.py")
    assert set(figures.FILES) == {p.stem for p in files if "\nSECTION = " in p.read_text()}
    found = figures.sections()
    formerly = [old for section in found.values() for old in section.formerly]
    assert len(set(formerly)) == len(formerly) and not set(formerly) & set(found)
    table = (REPO / "benchmarks" / "README.md").read_text()
    assert [name for name in found if f"| `{name}` |" not in table] == []
    ran = []
    for name, section in found.items():
        found[name] = dataclasses.replace(section, run=lambda *_, n=name: ran.append(n) or [])
    monkeypatch.setattr(figures, "sections", lambda: found)
    figures.main(["gat", "store-large-links", "peers", "--size", "tiny"])
    figures.main(["--size", "tiny"])
    assert ran[:3] == ["gat_memory", "store_large_links", "peers"]
    assert ran[3:] == list(figures.FILES)  # at tiny size, those run only when named too
    with pytest.raises(SystemExit):
        figures.main(["gat_attention"])
    assert "unknown sections ['gat_attention']" in capsys.readouterr().err


SPEED_FIELDS = [f.name for f in dataclasses.fields(SpeedTricks)]


@pytest.mark.parametrize("key", SPEED_FIELDS)
def test_each_speed_trick_is_switched_by_its_setting_alone(tmp_path, key):
    """``speed_defaults``' arms: each trick's arguments, through the CLI on every recipe it is
    measured on, change that one field of the model's ``speed`` group and nothing else."""
    import speed_defaults

    (trick,) = [t for t in speed_defaults.TRICKS if t.key == key]  # every switch is measured
    for name in trick.recipes:
        config = ["--config", str(recipe(name).config), *cli_args(tmp_path)]
        shipped = dict(main(config, run=False).model.hparams)  # as the CLI gave them
        switched = dict(main([*config, *trick.args], run=False).model.hparams)
        assert SpeedTricks(**shipped.pop("speed")) == SpeedTricks(), name  # shipped: defaults
        speed = SpeedTricks(**switched.pop("speed"))
        assert speed == dataclasses.replace(SpeedTricks(), **{key: getattr(speed, key)}), name
        assert speed != SpeedTricks() and switched == shipped, name


def test_each_heterogeneous_models_trick_is_switched_by_its_argument_alone():
    """``speed_defaults``' HeteroSAGE and LinkPredictor arms: each trick's arguments change
    that one hyperparameter of the model, from its default, and nothing else."""
    import speed_defaults

    tricks = [
        t
        for t in speed_defaults.TRICKS
        if set(t.recipes) <= {"hetero_node_classification", "link_prediction_pinsage"}
    ]
    assert {t.key for t in tricks} >= {"hetero_target_only_layers", "hetero_bucket_rows"}
    for trick in tricks:
        (flag,) = trick.args
        field, value = flag.removeprefix("--model.init_args.").split("=")
        for name in trick.recipes:
            config = ["--config", str(recipe(name).config), *recipe(name).tiny]
            shipped = dict(main(config, run=False).model.hparams)
            switched = dict(main([*config, *trick.args], run=False).model.hparams)
            assert str(switched.pop(field)).lower() == value and shipped.pop(field) != value
            assert switched == shipped, (name, field)
