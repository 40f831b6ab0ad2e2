"""Every row of docs/refused_inputs.md: the input is refused with the documented message.

Rows checked by ``table`` run here, in this process (``gnnscale.cli.main``, which raises what the
command prints as ``gnnscale: error: ...``); the one-line printing itself is tested in
``test_cli.py``. Rows checked by a named test point at that test, which must exist, and their
message must be one gnnscale's code can print.
"""

import os
import re
import shlex
from pathlib import Path

import pytest
from registry import REPO, recipe

from gnnscale.cli import main
from gnnscale.cli.prepare import prepare_main
from gnnscale.errors import GnnscaleError
from gnnscale.testing import cli_args

DOC = REPO / "docs" / "refused_inputs.md"
ROW = re.compile(r"^\| (.+?) \| (.+?) \| `` (.+?) `` \| (\S+) \|$", re.M)
ROWS = ROW.findall(DOC.read_text())
TABLE = [r for r in ROWS if r[3] == "table"]
NAMED = [r for r in ROWS if r[3] != "table"]


def _pattern(message: str) -> str:
    """The documented message as a regex: ``…`` is anything."""
    return ".*".join(re.escape(part) for part in message.split("…"))


def test_the_table_has_every_case_the_issue_lists():
    assert len(ROWS) == DOC.read_text().count("\n| ") - 1 >= 45  # every row parsed (bar header)
    for needed in ("batch_size=0", "num_parts=0", "walk_length=0", "clusters_per_batch", "heads"):
        assert any(needed in r[1] for r in TABLE), needed


@pytest.mark.parametrize("command,args,message", [r[:3] for r in TABLE], ids=[r[1] for r in TABLE])
def test_table_row_is_refused_with_its_message(tmp_path, monkeypatch, command, args, message):
    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "empty").mkdir()
    (tmp_path / "readonly").mkdir(mode=0o555)
    if "{readonly}" in args and os.geteuid() == 0:
        pytest.skip("root writes to read-only folders: permissions cannot refuse it")
    folders = {k: tmp_path / k for k in ("file", "empty", "missing", "readonly")}
    argv = shlex.split(re.findall(r"`([^`]+)`", args)[0].format(**folders))
    monkeypatch.chdir(tmp_path)
    subcommand, *name = command.split()
    with pytest.raises(GnnscaleError) as refused:
        if subcommand == "prepare":
            prepare_main(argv)
        else:
            config = ["--config", str(recipe(name[0]).config), *cli_args(tmp_path)]
            main([subcommand, *config, "--trainer.max_epochs=1", *argv])
    assert re.fullmatch(_pattern(message), str(refused.value)), str(refused.value)
    assert not list((tmp_path / "runs").rglob("version_*"))  # a refused run leaves no folder


def _joined_source(folder: Path) -> str:
    """gnnscale's source with implicitly joined string literals joined: its messages as written."""
    text = "".join(p.read_text() for p in sorted(folder.rglob("*.py")))
    return re.sub(r"\"\s*\n\s*f?\"", "", text)


@pytest.mark.parametrize("command,args,message,test", NAMED, ids=[r[3] for r in NAMED])
def test_named_row_has_its_test_and_is_gnnscales_message(command, args, message, test):
    path, name = test.split("::")
    assert re.search(rf"^def {name}\(", (REPO / path).read_text(), re.M), test
    source = _joined_source(REPO / "gnnscale")
    for part in message.split("…"):  # the literal text between the varying parts
        part = part.strip(" :()")
        # An option group's refusal is written with {group} for its flag (GroupSettingError).
        grouped = re.sub(r"--data\.(synthetic|split|sampling)\b", "{group}", part)
        assert part in source or grouped in source, part
