"""The exceptions ``gnnscale`` prints as one line: refused input, too much memory, divergence."""

from __future__ import annotations

import errno
from collections.abc import Callable

__all__ = [
    "NO_ROOM",
    "ConfigError",
    "GnnscaleError",
    "GroupSettingError",
    "MemoryLimitError",
    "TrainingDiverged",
    "cause",
    "check_probabilities",
]

NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a write's errno: disk full, quota, size limit


class GnnscaleError(Exception):
    """An error whose message says what happened and what to change.

    ``gnnscale`` prints it as one line, without a traceback (``GNNSCALE_DEBUG=1`` shows it).
    """


class ConfigError(GnnscaleError, ValueError):
    """A setting or an input that gnnscale refuses; the message names the key and the fix."""


class GroupSettingError(ConfigError):
    """A refused setting of an option group (``SyntheticGraph``, ``NodeSplit``), named by its flag.

    A group's flag depends on who takes it: the DataModules as ``--data.synthetic``,
    ``gnnscale prepare``'s sources as ``--source.synthetic``. The message is written with
    ``{group}`` for the group's flag, so the command that knows where its groups live names them
    (:meth:`under`) instead of rewriting the text.

    Args:
        template: The message, ``{group}`` standing for the group's flag.
        name: The group's key (``synthetic``, ``split``).
        parent: The flag of what takes the group (``--data``).
    """

    def __init__(self, template: str, name: str, parent: str = "--data") -> None:
        self.template, self.name, self.parent = template, name, parent
        super().__init__(template.format(group=f"{parent}.{name}"))

    def under(self, parent: str) -> GroupSettingError:
        """The same refusal, the group taken by ``parent`` (``--source``)."""
        return GroupSettingError(self.template, self.name, parent)

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        """Pickled with its three arguments (a DataLoader worker's error crosses processes)."""
        return type(self), (self.template, self.name, self.parent)


class MemoryLimitError(GnnscaleError, MemoryError):
    """The run needed more memory than its process may take (``GNNSCALE_MEMORY_LIMIT``)."""


class TrainingDiverged(GnnscaleError, RuntimeError):
    """The training loss became NaN or infinite: the run stops instead of reporting a result."""


def cause(
    err: BaseException | None, match: Callable[[BaseException], bool]
) -> BaseException | None:
    """The first exception of ``err``'s chain that ``match``es, ``err`` itself first.

    The chain: what each was raised from or during. Libraries often re-raise an ``OSError``.
    """
    while err is not None:
        if match(err):
            return err
        err = err.__cause__ or err.__context__
    return None


def check_probabilities(**values: float) -> None:
    """Refuse a dropout rate outside [0, 1], naming its flag (before PyG builds anything)."""
    for name, p in values.items():
        if not 0 <= p <= 1:
            raise ConfigError(f"--model.{name} must be in [0, 1] (got {p})")
