"""The one exception type for refused input, so the command can print it in one line."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A setting or an input that gnnscale refuses; the message names the key and the fix.

    ``gnnscale`` prints it as one line, without a traceback (``GNNSCALE_DEBUG=1`` shows it).
    """
