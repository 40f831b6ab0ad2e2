"""The exceptions ``gnnscale`` prints as one line: refused input, and a run that diverged."""

from __future__ import annotations

__all__ = ["ConfigError", "GnnscaleError", "TrainingDiverged"]


class GnnscaleError(Exception):
    """An error whose message says what happened and what to change.

    ``gnnscale`` prints it as one line, without a traceback (``GNNSCALE_DEBUG=1`` shows it).
    """


class ConfigError(GnnscaleError, ValueError):
    """A setting or an input that gnnscale refuses; the message names the key and the fix."""


class TrainingDiverged(GnnscaleError, RuntimeError):
    """The training loss became NaN or infinite: the run stops instead of reporting a result."""
