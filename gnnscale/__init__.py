"""gnnscale: PyTorch Geometric scaling recipes on a small, tested core.

The package, by concern: ``data/`` (DataModules by task, graph sources, what loaders add to
batches), ``models/`` (LightningModules by task; ``models/fast.py`` holds the CPU fast paths
and their switches, ``models/dropout.py`` the CPU dropout), ``sparse.py`` (the sparse
adjacency that data and models both build), ``stores/`` (graphs on disk: prepared graphs,
many-graph stores, caches), ``batch.py`` (what batches carry between DataModules and models),
``handshake.py`` (what a DataModule and its model tell each other when the run is built), and
beside them the command line (``cli/``: what only the command uses, from its subcommand table
to process policy, resume and pre-emption), the memory planner (``plan.py``), callbacks,
checkpointing, measurement helpers and test helpers.
"""

from gnnscale.callbacks import GradActivationMonitor, ThroughputMonitor
from gnnscale.checkpoint import StreamingCheckpointIO
from gnnscale.data import (
    DATASETS,
    AtomGraphs,
    ClusterDataModule,
    EvalArgs,
    FullBatchDataModule,
    GraphDataModule,
    GraphSplit,
    HeteroNeighborDataModule,
    LinkDataModule,
    LinkEvalArgs,
    LinkSplit,
    LoaderArgs,
    NeighborDataModule,
    NodeSplit,
    PinSAGENeighbors,
    Preprocess,
    SAINTDataModule,
    SyntheticGraph,
    SyntheticRecommender,
    load_dataset,
    make_item_class_graph,
    make_recommender_graph,
    make_synthetic_graph,
    sampling_backend,
)
from gnnscale.models import (
    EmbeddingSAGE,
    GATv2,
    GraphGINE,
    GraphSAGE,
    HeteroSAGE,
    LayerSpeedTricks,
    LinkPredictor,
    NodeClassifier,
    SpeedTricks,
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
    "GraphSplit",
    "GraphGINE",
    "GraphSAGE",
    "HeteroNeighborDataModule",
    "HeteroSAGE",
    "LayerSpeedTricks",
    "LinkDataModule",
    "LinkEvalArgs",
    "LinkPredictor",
    "LinkSplit",
    "LoaderArgs",
    "NeighborDataModule",
    "NodeSplit",
    "NodeClassifier",
    "PinSAGENeighbors",
    "Preprocess",
    "SAINTDataModule",
    "SpeedTricks",
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
