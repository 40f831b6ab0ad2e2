"""``python -m gnnscale``: the ``gnnscale`` command (``gnnscale.cli.run``)."""

from gnnscale.cli import run

run()
