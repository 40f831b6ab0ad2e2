"""gnnscale: PyTorch Geometric scaling recipes on a small, tested core."""

from gnnscale.callbacks import GradActivationMonitor, ThroughputMonitor
from gnnscale.checkpoint import StreamingCheckpointIO
from gnnscale.data import (
    DATASETS,
    ClusterDataModule,
    EvalArgs,
    FullBatchDataModule,
    LoaderArgs,
    NeighborDataModule,
    Preprocess,
    SAINTDataModule,
    load_dataset,
    sampling_backend,
)
from gnnscale.embedding import EmbeddingSAGE
from gnnscale.graph_models import GraphGINE
from gnnscale.graphs import AtomGraphs, GraphDataModule
from gnnscale.hetero import HeteroNeighborDataModule, HeteroSAGE
from gnnscale.link import LinkDataModule, LinkEvalArgs, LinkSplit, PinSAGENeighbors
from gnnscale.link_model import LinkPredictor
from gnnscale.models import GATv2, GraphSAGE, NodeClassifier
from gnnscale.synthetic import (
    SyntheticGraph,
    SyntheticRecommender,
    make_item_class_graph,
    make_recommender_graph,
    make_synthetic_graph,
)

__all__ = [
    "DATASETS",
    "AtomGraphs",
    "ClusterDataModule",
    "EmbeddingSAGE",
    "EvalArgs",
    "FullBatchDataModule",
    "GATv2",
    "GradActivationMonitor",
    "GraphDataModule",
    "GraphGINE",
    "GraphSAGE",
    "HeteroNeighborDataModule",
    "HeteroSAGE",
    "LinkDataModule",
    "LinkEvalArgs",
    "LinkPredictor",
    "LinkSplit",
    "LoaderArgs",
    "NeighborDataModule",
    "NodeClassifier",
    "PinSAGENeighbors",
    "Preprocess",
    "SAINTDataModule",
    "StreamingCheckpointIO",
    "SyntheticGraph",
    "SyntheticRecommender",
    "ThroughputMonitor",
    "load_dataset",
    "make_item_class_graph",
    "make_recommender_graph",
    "make_synthetic_graph",
    "sampling_backend",
]
