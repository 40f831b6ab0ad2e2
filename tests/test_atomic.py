"""Write beside, rename into place: a killed writer leaves nothing under the name; one at a time."""

import json
import multiprocessing
import os
import re
import shutil
import signal
import time
import zlib

import pytest

from gnnscale.errors import ConfigError
from gnnscale.stores import atomic

FORK = multiprocessing.get_context("fork")  # the child has gnnscale imported already: no restart


class DamagedError(Exception):
    pass


def _write(target, payload, stage="none"):
    """Write ``payload`` to ``target`` as a store would; die by SIGKILL at ``stage``."""
    with atomic.locked(target), atomic.writing(target) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "part.bin").write_bytes(payload)
        if stage == "filling":
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, as a kill -9 or an OOM kill
        if stage == "manifest":
            json.dumps = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
        if stage == "renaming":  # the manifest written and flushed, the folder not yet renamed
            os.rename = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
        atomic.commit(tmp, target, {"format": "test/1", "bytes": len(payload)})


def _read(target):
    return atomic.read_manifest(target, "test/1", "test folder", f"write {target}", DamagedError)


@pytest.mark.parametrize("stage", ["filling", "manifest", "renaming"])
def test_a_killed_writer_is_never_visible_under_the_name_and_is_redone(tmp_path, stage):
    target = tmp_path / "t"
    child = FORK.Process(target=_write, args=(target, b"half", stage))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    assert not target.exists()
    (partial,) = atomic.leftovers(target)  # its writes, under a hidden name of its own
    assert partial.name == f".t.partial-{child.pid}"
    assert (partial / "sub" / "part.bin").read_bytes() == b"half"
    with pytest.raises(DamagedError, match="is not a folder"):
        _read(target)

    _write(target, b"whole")  # the next writer removes the dead one's folder
    assert atomic.leftovers(target) == []
    assert (target / "sub" / "part.bin").read_bytes() == b"whole"
    assert _read(target) == {"format": "test/1", "bytes": 5}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]  # no lock file left beside it


def test_a_writer_that_raises_leaves_nothing(tmp_path):
    target = tmp_path / "t"
    with pytest.raises(KeyboardInterrupt), atomic.locked(target), atomic.writing(target) as tmp:
        (tmp / "part.bin").write_bytes(b"half")
        raise KeyboardInterrupt  # as a user's Ctrl-C midway
    assert not target.exists()
    assert atomic.leftovers(target) == []


def test_a_dead_writers_folder_is_resumed_only_when_accepted(tmp_path):
    target = tmp_path / "t"
    for pid, settings in [(999_999_001, "other"), (999_999_002, "same")]:
        dead = tmp_path / f".t.partial-{pid}"
        dead.mkdir()
        (dead / "settings").write_text(settings)
    asked = []

    def same(partial):
        asked.append(partial.name)
        return (partial / "settings").read_text() == "same"

    with pytest.raises(ValueError), atomic.locked(target), atomic.writing(target, same) as tmp:
        assert (tmp / "settings").read_text() == "same"  # continued under its own name
        (tmp / "more").write_text("written before the error")
        raise ValueError("the input ran out")
    assert asked == [".t.partial-999999001", ".t.partial-999999002"]
    (kept,) = atomic.leftovers(target)  # the other settings' folder removed; this one kept
    assert kept.name == f".t.partial-{os.getpid()}"
    assert (kept / "more").read_text() == "written before the error"

    with atomic.locked(target), atomic.writing(target) as tmp:  # no resume: started afresh
        assert list(tmp.iterdir()) == []
        atomic.commit(tmp, target, {"format": "test/1"})
    assert atomic.leftovers(target) == []


def _hold(target, ready, seconds, done=None):
    with atomic.locked(target):
        ready.set()
        time.sleep(seconds)
        if done is not None:
            done.write_text("done")


def test_a_second_writer_is_refused_while_the_first_lives_and_proceeds_once_it_died(tmp_path):
    target = tmp_path / "t"
    ready = FORK.Event()
    first = FORK.Process(target=_hold, args=(target, ready, 60))  # killed long before
    first.start()
    try:
        assert ready.wait(30)
        busy = f"{re.escape(str(target))} is being written by process {first.pid}; wait for it"
        with pytest.raises(ConfigError, match=busy), atomic.locked(target):
            pytest.fail("a second writer got the lock")
        with pytest.raises(ConfigError, match=busy):
            _write(target, b"second")
        assert not target.exists() and atomic.leftovers(target) == []
    finally:
        first.kill()  # SIGKILL: it never releases the lock itself
        first.join(30)
    _write(target, b"second")  # the kernel freed the dead writer's lock
    assert (target / "sub" / "part.bin").read_bytes() == b"second"


def _take_turns(target, log, rounds):
    for _ in range(rounds):
        with atomic.locked(target, wait=True):
            with log.open("a") as f:
                f.write(f"in {os.getpid()}\n")
            time.sleep(0.002)
            with log.open("a") as f:
                f.write(f"out {os.getpid()}\n")


def test_the_lock_file_removed_by_each_holder_still_admits_one_holder_at_a_time(tmp_path):
    """Each holder removes the lock file as it lets go; a waiter that got the removed file's
    lock must open the path again, or two processes would hold two files' locks at once."""
    target, log = tmp_path / "t", tmp_path / "log"
    workers = [FORK.Process(target=_take_turns, args=(target, log, 30)) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    lines = log.read_text().split("\n")[:-1]
    assert len(lines) == 4 * 30 * 2
    for entered, left in zip(lines[::2], lines[1::2], strict=True):  # never two inside
        assert entered.startswith("in ") and left == f"out {entered[3:]}", (entered, left)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log"]


def test_a_waiting_writer_proceeds_when_the_first_is_done(tmp_path):
    target = tmp_path / "t"
    ready = FORK.Event()
    done = tmp_path / "done"
    first = FORK.Process(target=_hold, args=(target, ready, 1, done))
    first.start()
    assert ready.wait(30)
    with atomic.locked(target, wait=True):
        assert done.read_text() == "done"  # got the lock only once the first had let it go
    first.join(30)
    assert first.exitcode == 0


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("truncated", r"manifest\.json cannot be read \(.*\); run `write .*` again"),
        ("not json", r"manifest\.json cannot be read \(.*\); run `write .*` again"),
        ("other format", r"manifest\.json is not a test/1 manifest; run `write .*` again"),
        ("a list", r"manifest\.json is not a test/1 manifest"),
        ("missing", r"manifest\.json is missing: .* is not a complete test folder \(a prepare "),
        ("a file", r"t is not a folder: run `write .*` first"),
    ],
)
def test_a_damaged_manifest_is_one_clear_error(tmp_path, damage, message):
    target = tmp_path / "t"
    _write(target, b"whole")
    manifest = target / "manifest.json"
    text = manifest.read_text()
    if damage == "truncated":
        manifest.write_text(text[: len(text) // 2])
    elif damage == "not json":
        manifest.write_bytes(b"\xff\x00")
    elif damage == "other format":
        manifest.write_text(json.dumps({**json.loads(text), "format": "test/0"}))
    elif damage == "a list":
        manifest.write_text("[1, 2]")
    elif damage == "missing":
        manifest.unlink()
    else:
        shutil.rmtree(target)
        target.write_text("not a folder")
    with pytest.raises(DamagedError, match=message) as refused:
        _read(target)
    assert "\n" not in str(refused.value) and refused.value.__cause__ is None


def test_crc32_is_the_whole_files(tmp_path):
    data = os.urandom(100_000)
    (tmp_path / "f").write_bytes(data)
    assert atomic.crc32(tmp_path / "f") == zlib.crc32(data) != 0
