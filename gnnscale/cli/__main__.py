"""``python -m gnnscale.cli``: the ``gnnscale`` command."""

from gnnscale.cli.command import run

if __name__ == "__main__":
    run()
