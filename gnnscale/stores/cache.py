"""Caches that cannot poison a run: built aside, renamed into place, checked when read.

PyG writes Cluster-GCN's partition and GraphSAINT's normalisation straight into their final
files; a run killed while writing left a partial file that every later run died on, and a file
changed after it was written was used silently. :func:`cached_folder` builds a cache in a
temporary sibling folder, records each file's size and CRC-32 in ``cache.json``, and renames the
folder into place only when complete. On later runs the folder is checked against that record;
a partial, damaged or unrecorded cache is reported with its path, removed and rebuilt. Processes
that share the cache (DDP ranks) take a file lock: one builds, the others wait, then read.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_warn

from gnnscale.errors import ConfigError
from gnnscale.stores import atomic

__all__ = ["cached_folder", "check_writable"]

RECORD = "cache.json"


def check_writable(folder: Path, key: str) -> None:
    """Refuse, before any expensive work, a cache folder that cannot be created or written.

    Args:
        folder: The cache folder (it and its parents are created if missing).
        key: The config key that sets it, for the message (``--data.root``).
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(
            f"{key}: cannot create the cache folder {folder}: a file is in the way; point {key} "
            "at a folder"
        ) from None
    except PermissionError:
        raise ConfigError(
            f"{key}: cannot create the cache folder {folder} (permission denied); point {key} "
            "at a writable folder"
        ) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}: the cache folder {folder} is read-only; point {key} elsewhere")


def _record(folder: Path) -> dict[str, dict[str, int]]:
    return {
        str(p.relative_to(folder)): {"bytes": p.stat().st_size, "crc32": atomic.crc32(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != RECORD
    }


def _problem(folder: Path) -> str | None:
    """Why ``folder`` is not an intact cache, or ``None`` if it is."""
    try:
        expected = json.loads((folder / RECORD).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"incomplete ({RECORD} is missing or unreadable)"
    for name, entry in expected.items():
        path = folder / name
        if not path.is_file():
            return f"incomplete ({name} is missing)"
        if path.stat().st_size != entry["bytes"]:
            return f"damaged ({name} has {path.stat().st_size:,} bytes, not {entry['bytes']:,})"
        if atomic.crc32(path) != entry["crc32"]:
            return f"damaged ({name} does not match its checksum)"
    return None


def cached_folder(folder: Path, build: Callable[[Path], None], what: str) -> bool:
    """Make ``folder`` an intact cache, building it with ``build`` unless it already is one.

    Args:
        folder: The cache folder.
        build: Writes the cache's files into the folder it is given (a temporary one).
        what: What the cache holds, for messages (``Cluster-GCN partition``).

    Returns:
        Whether it was built now (``False``: an intact cache was found).
    """
    folder = Path(folder)
    with atomic.locked(folder, wait=True):
        if folder.exists():
            problem = _problem(folder)
            if problem is None:
                return False
            rank_zero_warn(f"gnnscale: the {what} cache {folder} is {problem}; rebuilding it")
            shutil.rmtree(folder)
        with atomic.writing(folder) as tmp:
            build(tmp)
            atomic.commit(tmp, folder, {"files": _record(tmp)}, RECORD)
    return True
