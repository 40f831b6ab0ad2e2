"""Checkpoints that do not hold a second copy of the model in memory.

Lightning 2.6 (``TorchCheckpointIO``, through ``cloud_io._atomic_save``) serialises every
checkpoint into an ``io.BytesIO`` and then writes the bytes out, so each save holds the whole
checkpoint in memory twice: the live tensors and their serialised copy. Loading one
(``trainer.test(ckpt_path="best")``, a resumed run) reads the whole file into memory next to the
model it is loaded into. With a 2M x 64 embedding table and its SparseAdam moments (1.4 GiB),
each save raised the sparse_embeddings recipe's peak from 3.2 to 4.5 GiB. Lightning has merged
streaming saves to local disk (Lightning-AI/pytorch-lightning#21823, PR #21824); no release
carries it yet (2.6.6 does not). Remove this module once the oldest supported Lightning does.

Nothing in a checkpoint runs code: every load (:func:`load`, and Lightning's through
:class:`StreamingCheckpointIO`) is ``torch.load(weights_only=True)``, which rebuilds tensors and
plain values only, whatever torch's default; a checkpoint holding anything else (a pickled
object, which unpickling would call) is refused in one line naming it.

Damage is found before a checkpoint is used (:func:`damage`): ``torch.save`` writes a CRC-32 of
every record of its zip archive, and ``torch.load`` never checks them, so a flipped byte in a
weight loaded silently and showed up later as a NaN loss. Checking every record of a 768 MiB
checkpoint takes about 0.3 s from the page cache.
"""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from gnnscale.errors import NO_ROOM, ConfigError, GnnscaleError, cause

__all__ = [
    "StreamingCheckpointIO",
    "damage",
    "load",
    "newest_whole",
    "refuse_damaged",
    "start_from",
]


class StreamingCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` that streams local checkpoints to and from disk.

    Saving to a local path runs ``torch.save`` straight into a temporary file beside the target
    and renames it into place, so a save is atomic, as Lightning's is, without the in-memory
    copy. Loading a local file memory-maps it (``torch.load(mmap=True)``): a tensor's bytes are
    read from the page cache when they are copied into the model, and what is never used (the
    optimizer state, when testing) is never read. Remote paths (``s3://``, ``gs://``, ...) go
    through Lightning unchanged.

    ``gnnscale fit`` uses it unless ``--trainer.plugins`` names another ``CheckpointIO``.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None
    ) -> None:
        """Write ``checkpoint`` to ``path``; a reader never sees a half-written file."""
        target = _local(path)
        if storage_options is not None or target is None:
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        # Beside the target, so the rename stays on one filesystem; opened as any file is, so
        # the checkpoint gets the usual permissions (``mkstemp`` would make it private).
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            with tmp.open("wb") as f:
                torch.save(checkpoint, f)
            os.replace(tmp, target)
        except BaseException as err:
            tmp.unlink(missing_ok=True)
            full = cause(err, lambda e: isinstance(e, OSError) and e.errno in NO_ROOM)
            if full is not None:  # torch's zip writer re-raises it as a RuntimeError
                reason = getattr(full, "strerror", full)
                raise GnnscaleError(
                    f"no room to save the checkpoint {target} ({reason}); the checkpoints "
                    "saved before it are intact: free space, then resume with --ckpt_path last"
                ) from None
            raise

    def load_checkpoint(
        self,
        path: str | Path,
        map_location: Callable | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Load ``path``, memory-mapped when it is a local file; tensors and plain values only.

        ``weights_only=False``, asked for explicitly, loads anything (a checkpoint you trust).
        """
        safe = weights_only is None or weights_only
        local = _local(path)
        if local is None or not local.is_file():
            with _refusing_code(path):
                return super().load_checkpoint(path, map_location, safe)
        refuse_damaged(local)
        if not safe:
            return torch.load(local, map_location=map_location, weights_only=False, mmap=True)
        return load(local, map_location)


def load(path: Path, map_location: Any = "cpu") -> Any:
    """``path``'s tensors and plain values, memory-mapped; refused if it holds anything else."""
    with _refusing_code(path):
        return torch.load(path, map_location=map_location, weights_only=True, mmap=True)


def start_from(model: torch.nn.Module, path: Path) -> str:
    """Load a checkpoint's weights into ``model`` to start a new run from them (fine-tuning).

    Not a resume: no optimizer state, step or epoch is taken. A table that has more rows in
    ``model`` than in the checkpoint (an embedding of a graph's nodes, the graph grown since)
    keeps the checkpoint's rows for the nodes it had and ``model``'s own initial rows for the
    new ones. Anything else that differs is refused in one line.

    Returns:
        What it loaded, in a sentence.
    """
    refuse_damaged(path)
    saved = load(path)
    weights = saved.get("state_dict", saved) if isinstance(saved, dict) else None
    if not isinstance(weights, dict):
        raise ConfigError(
            f"--weights_from {path} holds no state_dict: give a checkpoint a fit saved"
        )
    own = model.state_dict()
    differ = sorted(own.keys() ^ weights.keys())
    if differ:
        raise ConfigError(
            f"--weights_from {path} is not this model's: {len(differ)} weight(s) differ by name "
            f"({differ[0]} first); give a checkpoint of the same --model"
        )
    grown = []
    for name, mine in own.items():
        theirs = weights[name]
        if theirs.shape == mine.shape:
            own[name] = theirs
        elif (
            theirs.dim() == mine.dim() >= 1
            and theirs.shape[1:] == mine.shape[1:]
            and (theirs.shape[0] < mine.shape[0])
        ):
            own[name] = torch.cat([theirs, mine[theirs.shape[0] :]])
            grown.append(f"{name} ({theirs.shape[0]:,} -> {mine.shape[0]:,} rows)")
        else:
            raise ConfigError(
                f"--weights_from {path}: its {name} is of shape {tuple(theirs.shape)}, this "
                f"model's {tuple(mine.shape)}; give a checkpoint of the same --model settings"
            )
    model.load_state_dict(own)
    rows = f"; new rows for {', '.join(grown)}" if grown else ""
    return f"gnnscale: starting from the weights of {path}{rows}"


class _refusing_code:
    """Turns torch's refusal of a global in a ``weights_only`` load into one line."""

    def __init__(self, path: str | Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, err: BaseException | None, tb: Any) -> None:
        if isinstance(err, pickle.UnpicklingError) and "Weights only load failed" in str(err):
            found = re.search(r"GLOBAL ([\w.]+)", str(err))  # "unsupported GLOBAL posix.system"
            what = found.group(1) if found else "an object that is not a tensor or plain value"
            raise ConfigError(
                f"the checkpoint {self.path} holds {what}, which loading would run as code: "
                "gnnscale loads checkpoints as tensors and plain values only; give a checkpoint "
                "gnnscale saved, or load one you trust yourself (torch.load(weights_only=False))"
            ) from None


def _local(path: str | Path) -> Path | None:
    """``path`` on the local filesystem (``file://`` stripped), or ``None`` if it is remote."""
    fs, stripped = fsspec.core.url_to_fs(str(path))
    return Path(stripped) if "file" in fs.protocol else None


_WHOLE: set[tuple[str, int, int]] = set()  # (path, size, mtime) found whole: checked once


def damage(path: Path) -> str | None:
    """What is wrong with the checkpoint at ``path``; ``None`` when every record's CRC-32 holds.

    A file saved with ``torch.serialization.set_crc32_options(False)`` has nothing to check.
    """
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key in _WHOLE:
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
            checked = any(r.CRC for r in records)
            bad = archive.testzip() if checked else None
    except (zipfile.BadZipFile, EOFError, OSError) as err:  # truncated, or not torch.save's
        return f"not a whole checkpoint: {err}"
    if bad is not None:
        return f"its record {bad} fails its CRC-32 check"
    _WHOLE.add(key)
    return None


def newest_whole(folder: Path, besides: Path) -> Path | None:
    """The newest undamaged ``.ckpt`` in ``folder`` other than ``besides``, if any."""
    found = [p for p in folder.glob("*.ckpt") if p.is_file() and p != besides]
    for path in sorted(found, key=lambda p: p.stat().st_mtime_ns, reverse=True):
        if damage(path) is None:
            return path
    return None


def refuse_damaged(path: Path) -> None:
    """Refuse a damaged ``path`` in one line, naming the newest whole checkpoint beside it."""
    problem = damage(path)
    if problem is None:
        return
    other = newest_whole(path.parent, path)
    if other is None:
        raise ConfigError(
            f"the checkpoint {path} is damaged ({problem}); no whole checkpoint lies beside it"
        )
    raise ConfigError(
        f"the checkpoint {path} is damaged ({problem}); the newest whole one beside it is "
        f"{other} (--ckpt_path={other})"
    )
