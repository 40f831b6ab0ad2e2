"""The ``gnnscale`` command: everything only the command line uses.

- ``command``: the subcommand table and the Lightning CLI (``fit``, ``validate``, ``test``,
  ``predict``, ``plan``), the entry point :func:`run`.
- ``prepare``: ``gnnscale prepare`` and ``prepare-graphs``, and their typed sources (``Npy``,
  ``Ogb``, ``Synthetic``...), also callable from Python (:func:`gnnscale.cli.prepare.prepare`).
- ``argerrors``: jsonargparse's refusals condensed to one line.
- ``checks``: settings refused before any long work (counts, monitors, accumulation, keys).
- ``resume``: what a checkpoint says it continues, and ``--ckpt_path last``.
- ``runtime``: process policy (the allocator, precision, the memory limit, warnings).
- ``preemption``: a SIGTERM saves the run; ranks stop with their launcher.
"""

from gnnscale.cli.command import SUBCOMMANDS, GnnscaleCLI, Trainer, main, run

__all__ = ["SUBCOMMANDS", "GnnscaleCLI", "Trainer", "main", "run"]
