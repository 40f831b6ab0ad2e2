"""Run a gnnscale command with one of GraphSAGE's switchless CPU speed tricks turned off.

    python benchmarks/without.py dropout -m gnnscale.cli fit --config recipes/graphsaint/config.yaml

For ``benchmarks/speed_defaults.py``: the tricks that have no setting of their own are replaced
here, in this process only, by what PyG or PyTorch does without them; the library itself has no
hidden switch. ``TRICK`` is one of :data:`TRICKS`.
"""

from __future__ import annotations

import functools
import runpy
import sys
from collections.abc import Callable
from typing import Any

import torch.nn.functional as F
from torch import Tensor

from gnnscale.models import GraphSAGE, fast


def _after_init(change: Callable[[GraphSAGE], None]) -> None:
    """Apply ``change`` to every GraphSAGE once built (its signature kept for the CLI)."""
    init = GraphSAGE.__init__

    @functools.wraps(init)
    def patched(self: GraphSAGE, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        change(self)

    GraphSAGE.__init__ = patched  # type: ignore[method-assign]


def _no_target_only(model: GraphSAGE) -> None:
    model.target_only_layers = False  # every layer over every sampled node
    model.first_layer_aggr = None  # (aggregation in the loader needs target-only layers)


def _torch_dropout(self: fast.Dropout, x: Tensor, relu: bool = False) -> Tensor:
    return F.dropout(F.relu(x) if relu else x, self.p, training=self.training)


TRICKS: dict[str, Callable[[], None]] = {
    "target_only": lambda: _after_init(_no_target_only),
    "dropout": lambda: setattr(fast.Dropout, "forward", _torch_dropout),
}


def main() -> None:
    """Turn ``sys.argv[1]`` off, then run the rest of the command line as ``python`` would."""
    trick, flag, module, *rest = sys.argv[1:]
    if trick not in TRICKS or flag != "-m":
        raise SystemExit(f"usage: without.py {{{','.join(TRICKS)}}} -m MODULE ARGS...")
    TRICKS[trick]()
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
