"""What the repository ships: pyproject.toml's floors are the releases scripts/oldest_deps.txt
pins, which the fast tier was run on (torch aside: install.sh installs its own); and its text
speaks of versions and commits, not of the work periods that made them."""

import re
import subprocess
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
# History told as a diary: a work period by its number, or by "this", "last" and the like
# before the word. The operating system's meaning (process groups of their own) passes.
WORD = "ses" + "sion"  # spelled apart, so that this file holds no mention itself
DIARY = re.compile(rf"(?i)\b{WORD}s?\s+\d|\b(this|that|last|next|previous|earlier)\s+{WORD}")


def diary_mentions(files: dict[str, str]) -> list[str]:
    """``path:line: text`` for each line of ``files`` (path -> text) that reads as a diary."""
    return [
        f"{path}:{number}: {line.strip()}"
        for path, text in files.items()
        for number, line in enumerate(text.splitlines(), 1)
        if DIARY.search(line)
    ]


def tracked_text_files() -> dict[str, str]:
    """Every file git tracks here that is text (binary files, with a NUL byte, left out)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    files = {}
    for path in listed.stdout.decode().split("\0"):
        if path and (ROOT / path).is_file():
            data = (ROOT / path).read_bytes()
            if b"\0" not in data:
                files[path] = data.decode("utf-8", errors="replace")
    return files


def test_no_file_tells_history_as_a_diary():
    files = tracked_text_files()
    assert "CHANGELOG.md" in files and "gnnscale/cli/command.py" in files
    assert diary_mentions(files) == []


def test_the_diary_check_catches_what_it_is_for():
    n = 49
    found = diary_mentions(
        {
            "CHANGELOG.md": f"## {WORD.title()} {n}\n- a figure (1.05 in {WORD}s {n}, 40 and 38)\n",
            "a.py": f"# Measured at {WORD} {n}\nx = 1  # this {WORD}'s run\n",
            "b.py": f"Popen(cmd, start_new_{WORD}=True)  # ranks in {WORD}s of their own\n",
        }
    )
    where = [mention.split(": ")[0] for mention in found]
    assert where == ["CHANGELOG.md:1", "CHANGELOG.md:2", "a.py:1", "a.py:2"]


def test_every_floor_is_the_release_the_oldest_deps_pin():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    floors = {}
    for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        requirement = Requirement(line)
        (specifier,) = requirement.specifier  # one bound: a floor
        assert specifier.operator == ">=", line
        floors[canonicalize_name(requirement.name)] = Version(specifier.version)
    del floors["torch"]
    pins = {}
    for line in (ROOT / "scripts" / "oldest_deps.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = Version(version)
    assert floors == pins
