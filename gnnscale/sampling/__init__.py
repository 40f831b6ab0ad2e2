"""Neighbour sampling on a PyPI install: uniform, by time and by weight, behind PyG's interface.

- ``hops.py``: a hop's draws for all of its nodes at once, and the relabelling.
- ``time.py``: which in-edges a seed's time allows (strict or not, a window, the newest).
- ``weights.py``: draws by edge weight.
- ``sampler.py``: :class:`HopSampler`, PyG's ``NeighborSampler`` drawing by the three above, and
  the protocol a prepared folder's store speaks to read a batch's neighbour lists ahead.
"""

from gnnscale.sampling.hops import sample_hops, sample_typed_hops
from gnnscale.sampling.sampler import (
    HopSampler,
    ReadsAhead,
    describe,
    log_backend_once,
    sampling_backend,
    vectorized,
)
from gnnscale.sampling.time import TimeRule

__all__ = [
    "HopSampler",
    "ReadsAhead",
    "TimeRule",
    "describe",
    "log_backend_once",
    "sample_hops",
    "sample_typed_hops",
    "sampling_backend",
    "vectorized",
]
