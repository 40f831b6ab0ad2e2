"""Write beside, rename into place, once: what every store's writer shares.

A writer holds its target's lock (:func:`locked`), fills a partial folder beside it
(:func:`writing`), and :func:`commit` writes the manifest last, flushes all to disk and renames
the folder into place: under its name a folder is complete or absent, wherever a writer was killed.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import shutil
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gnnscale.errors import ConfigError

__all__ = [
    "commit",
    "crc32",
    "leftovers",
    "locked",
    "read_manifest",
    "replace_manifest",
    "writing",
]

MANIFEST = "manifest.json"


@contextlib.contextmanager
def locked(target: Path, wait: bool = False) -> Iterator[None]:
    """Hold ``target``'s lock: an ``flock`` on ``.<name>.lock`` beside it, naming the holder.

    The kernel frees it when the holder dies, so no pid is checked for being alive (a reused pid,
    or one on another machine sharing the storage, would mislead). The holder removes the file
    as it lets go, so nothing is left beside ``target``; a waiter that then holds the removed
    file's lock opens the path again (the usual ``flock`` protocol for a lock file removed by
    its holder).

    Args:
        target: The folder to be written.
        wait: Wait for the holder (processes sharing a cache: one builds, the others then read)
            instead of raising ``ConfigError``.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    path = target.parent / f".{target.name}.lock"
    while True:
        with path.open("a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                f.seek(0)
                raise ConfigError(
                    f"{target} is being written by process {f.read()}; wait for it"
                ) from None
            try:
                if os.fstat(f.fileno()).st_ino != os.stat(path).st_ino:
                    continue  # its holder removed it while this one waited: lock the new one
            except FileNotFoundError:
                continue
            f.truncate(0)
            f.write(str(os.getpid()))
            f.flush()
            try:
                yield
            finally:
                path.unlink(missing_ok=True)  # while held: a waiter then opens the path again
                fcntl.flock(f, fcntl.LOCK_UN)
            return


def leftovers(target: Path) -> list[Path]:
    """The partial folders of ``target``: while its lock is free, those of dead writers."""
    return sorted(target.parent.glob(f"{glob.escape('.' + target.name)}.partial-*"))


@contextlib.contextmanager
def writing(target: Path, resume: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """This writer's partial folder for ``target``, to fill and :func:`commit`; hold its lock.

    Args:
        target: The folder to be written.
        resume: Which dead writer's partial folder to continue (the others are removed); if
            given, a block that raises keeps its folder for the next writer, else removes it.
    """
    tmp = target.parent / f".{target.name}.partial-{os.getpid()}"
    for old in leftovers(target):
        if resume is not None and not tmp.exists() and resume(old):  # the first it accepts
            old.rename(tmp)
        else:
            shutil.rmtree(old, ignore_errors=True)
    tmp.mkdir(exist_ok=True)
    try:
        yield tmp
    except BaseException:
        if resume is None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def commit(folder: Path, target: Path, manifest: dict[str, Any], name: str = MANIFEST) -> None:
    """Write ``manifest`` (as ``name``) into ``folder`` last, flush all, rename it to ``target``."""
    (folder / name).write_text(json.dumps(manifest, indent=1))
    for path in [*folder.rglob("*"), folder]:  # files, then the folders that name them
        _fsync(path)
    os.rename(folder, target)
    _fsync(target.parent)


def replace_manifest(folder: Path, manifest: dict[str, Any], written: list[Path]) -> None:
    """Flush ``written`` (files an update wrote in ``folder``), then replace its manifest, last.

    The new manifest is written beside the old one and renamed over it: a reader sees one or
    the other whole, and a kill before the rename leaves the folder as it was.
    """
    for path in written:
        _fsync(path)
    for parent in {path.parent for path in written}:
        _fsync(parent)
    partial = folder / f".{MANIFEST}.partial"
    partial.write_text(json.dumps(manifest, indent=1))
    _fsync(partial)
    os.rename(partial, folder / MANIFEST)
    _fsync(folder)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_room(
    target: Path, need: int, what: str, error: Callable[[str], Exception] = ConfigError
) -> None:
    """Refuse, before writing, a disk with less free space than ``need`` bytes (and a margin).

    Args:
        target: What is about to be written (it or its nearest existing parent is measured).
        need: The bytes it will take.
        what: What it is, for the message (``the prepared graph``).
        error: The error to raise.
    """
    existing = next(p for p in [target, *target.parents] if p.exists())
    free = shutil.disk_usage(existing).free
    wanted = need * 1.05 + (64 << 20)  # 5% and 64 MiB for the manifest and the filesystem
    if free < wanted:
        raise error(
            f"--out {target}: {what} needs about {need / 2**30:.2f} GiB, and {wanted / 2**30:.2f} "
            f"GiB free with the margin kept (5% and 64 MiB); its disk has {free / 2**30:.2f} GiB "
            "free: free space there or choose another --out"
        )


def read_manifest(
    folder: Path, fmt: str, what: str, command: str, error: type[Exception] = ConfigError
) -> dict[str, Any]:
    """The manifest :func:`commit` wrote in ``folder``, or one error: why not, and what to run.

    Args:
        folder: A committed folder.
        fmt: The ``format`` its manifest must name.
        what: What a complete folder is (``prepared graph``).
        command: The command that writes one (``gnnscale prepare --source ... --out DIR``).
        error: The exception to raise: the store's own.
    """
    path = Path(folder) / MANIFEST
    if not path.parent.is_dir():
        raise error(f"{folder} is not a folder: run `{command}` first")
    if not path.is_file():
        raise error(
            f"{path} is missing: {folder} is not a complete {what} (a prepare writes the "
            f"manifest last); run `{command}` again"
        )
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise error(f"{path} cannot be read ({err}); run `{command}` again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != fmt:
        raise error(f"{path} is not a {fmt} manifest; run `{command}` again with this gnnscale")
    return manifest


def crc32(path: Path) -> int:
    """CRC-32 of a whole file, read 64 MiB at a time."""
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(64 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc
