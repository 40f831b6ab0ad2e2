"""LightningModules on PyG's layers, by task.

- ``node``: GraphSAGE and GATv2 node classifiers (``NodeClassifier``, their shared base);
  ``embedding``: GraphSAGE over a learned embedding per node; ``inference``: exact layer-wise
  inference; ``fast``: the CPU fast paths the node models call, isolated, and their switches
  (``SpeedTricks``, ``LayerSpeedTricks``: the node models' ``speed`` option group).
- ``hetero``: heterogeneous encoders and HeteroSAGE; ``link``: link prediction;
  ``graph``: graph-level regression and classification (GINE); ``temporal``: link prediction
  on an interaction stream, by time.
"""

from gnnscale.models.embedding import EmbeddingSAGE
from gnnscale.models.fast import LayerSpeedTricks, SpeedTricks
from gnnscale.models.graph_level import GraphGINE
from gnnscale.models.hetero import HeteroSAGE
from gnnscale.models.link import LinkPredictor
from gnnscale.models.node import GATv2, GraphSAGE, NodeClassifier
from gnnscale.models.temporal import TemporalLinkPredictor

__all__ = [
    "EmbeddingSAGE",
    "GATv2",
    "GraphGINE",
    "GraphSAGE",
    "HeteroSAGE",
    "LayerSpeedTricks",
    "LinkPredictor",
    "NodeClassifier",
    "SpeedTricks",
    "TemporalLinkPredictor",
]
