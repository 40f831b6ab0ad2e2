"""DataModules by task, the graphs they load and what their loaders add to batches.

- ``node``: node classification on one graph: the shared base, full batch; ``neighbor``:
  neighbour sampling (also from a prepared folder); ``subgraph``: Cluster-GCN and GraphSAINT.
- ``hetero``: node classification on a heterogeneous graph; ``link``: link prediction, its
  three graphs split in ``link_graphs``, with ``pinsage`` for PinSAGE neighbours and hard
  negatives; ``graphs``: many small graphs; ``temporal``: link prediction on an interaction
  stream by time (``stream``: the generated stream).
- ``datasets``: datasets by name, loaded and checked; ``sources``: the graph as a DataModule
  reads it, in memory or from a prepared folder; ``synthetic``: the generated graphs (one also
  drawn chunk by chunk straight to disk); ``args``: the option groups every DataModule takes;
  ``layout``: what workers add to batches; ``loaders`` and ``resume``: resumable, per-rank
  loaders.
"""

from gnnscale.data.args import (
    EvalArgs,
    GraphSplit,
    LoaderArgs,
    NodeSplit,
    Preprocess,
    SamplingArgs,
)
from gnnscale.data.datasets import DATASETS, load_dataset
from gnnscale.data.hetero import HeteroNeighborDataModule
from gnnscale.data.link import LinkDataModule, LinkEvalArgs
from gnnscale.data.link_graphs import LinkSplit
from gnnscale.data.many_graphs import AtomGraphs, GraphDataModule
from gnnscale.data.neighbor import NeighborDataModule
from gnnscale.data.node import FullBatchDataModule, NodeDataModule
from gnnscale.data.pinsage import PinSAGENeighbors
from gnnscale.data.stream import InteractionStream, make_interaction_stream
from gnnscale.data.subgraph import ClusterDataModule, SAINTDataModule
from gnnscale.data.synthetic import (
    SyntheticGraph,
    SyntheticRecommender,
    make_item_class_graph,
    make_recommender_graph,
    make_synthetic_graph,
    write_streamed_synthetic,
)
from gnnscale.data.temporal import TemporalLinkDataModule, TemporalSplit
from gnnscale.sampling import sampling_backend

__all__ = [
    "DATASETS",
    "AtomGraphs",
    "ClusterDataModule",
    "EvalArgs",
    "FullBatchDataModule",
    "GraphDataModule",
    "GraphSplit",
    "HeteroNeighborDataModule",
    "InteractionStream",
    "LinkDataModule",
    "LinkEvalArgs",
    "LinkSplit",
    "LoaderArgs",
    "NeighborDataModule",
    "NodeSplit",
    "NodeDataModule",
    "PinSAGENeighbors",
    "Preprocess",
    "SamplingArgs",
    "SAINTDataModule",
    "SyntheticGraph",
    "SyntheticRecommender",
    "TemporalLinkDataModule",
    "TemporalSplit",
    "load_dataset",
    "make_interaction_stream",
    "make_item_class_graph",
    "make_recommender_graph",
    "make_synthetic_graph",
    "sampling_backend",
    "write_streamed_synthetic",
]
