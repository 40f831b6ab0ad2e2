"""pyproject.toml's floors are the releases scripts/oldest_deps.txt pins, which the fast tier
was run on (torch aside: install.sh installs its own)."""

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later

ROOT = Path(__file__).resolve().parent.parent


def test_every_floor_is_the_release_the_oldest_deps_pin():
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
