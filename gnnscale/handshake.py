"""What a DataModule and its model tell each other before any batch is drawn.

Two typed handshakes, one each way, both made once when the CLI builds the run (or by the
caller, in Python):

- model -> data: :class:`BatchRequest`, what the model's batches must carry (its depth, the
  first layer's aggregation, edge features...). The model returns it (``batch_request()``), the
  DataModule receives it (``configure_batches``) and checks it against its loaders' settings.
- data -> model: :class:`GraphSpec`, the graph a heterogeneous model is built for (node and edge
  types, feature widths, node counts, what to predict, the ranking cut-off). The DataModule
  gives it (``graph_spec``), ``gnnscale``'s CLI links it to the model's ``graph`` argument, as it
  links ``num_features`` and ``num_classes``. Models never read ``trainer.datamodule``.

And one the memory planner asks of a model that evaluates layer by layer
(:class:`EvaluatesLayerwise`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from torch_geometric.nn.models.basic_gnn import BasicGNN
from torch_geometric.typing import EdgeType

from gnnscale.batch import LayerwiseBatch

__all__ = [
    "BatchRequest",
    "ConfiguresBatches",
    "EvaluatesLayerwise",
    "GraphSpec",
    "RequestsBatches",
]


@dataclass(frozen=True)
class BatchRequest:
    """What a model asks its DataModule's loaders to add to batches (``configure``).

    Args:
        num_layers: The model's depth (0: any), checked against the fan-outs.
        first_layer_aggr: Reduction the workers may apply to the raw features for the first
            layer of neighbour batches (``HopLayout.x_aggr``); none: the model aggregates.
        edge_dim: Edge feature dimension the model reads (``edge_attr``; none: it reads none).
        graph_level: The model classifies whole graphs (``GraphGINE``), not nodes.
        layerwise_channels: Values per node that exact layer-wise inference holds at once (a
            layer's input and output); 0: unknown, not checked against the memory.
        reads_x: Whether the model reads the nodes' features; one that does not (EmbeddingSAGE
            reads node ids and its own table) cannot be evaluated on the whole graph at once.
    """

    num_layers: int = 0
    first_layer_aggr: str | None = None
    edge_dim: int | None = None
    layerwise_channels: int = 0
    reads_x: bool = True
    graph_level: bool = False

    @staticmethod
    def of(model: Any) -> BatchRequest:
        """``model``'s request (``batch_request()``); the default for any other model."""
        return model.batch_request() if isinstance(model, RequestsBatches) else BatchRequest()


@runtime_checkable
class RequestsBatches(Protocol):
    """A model that says what its batches must carry (gnnscale's models all do)."""

    def batch_request(self) -> BatchRequest:
        """What this model needs its DataModule's loaders to add to batches."""
        ...


@runtime_checkable
class ConfiguresBatches(Protocol):
    """A DataModule that takes a model's :class:`BatchRequest` (gnnscale's all do)."""

    def configure_batches(self, request: BatchRequest) -> None:
        """Check ``request`` against the loaders' settings and lay batches out as it asks."""
        ...


@dataclass(frozen=True)
class GraphSpec:
    """The graph a heterogeneous model is built for, as its DataModule describes it.

    ``HeteroNeighborDataModule.graph_spec`` and ``LinkDataModule.graph_spec`` give it; the
    models (``HeteroSAGE``, ``LinkPredictor``) build their input layers, tables and encoder from
    it and save it in their hyperparameters (``as_dict``), so a checkpoint reloads without the
    data.

    Args:
        node_types: Node types, in the graph's order.
        edge_types: Edge types ``(src, relation, dst)`` the model passes messages along.
        num_features: Feature width per node type; 0: featureless (the model embeds its nodes).
        num_nodes: Nodes per type (the rows of a featureless type's table).
        target: What the model predicts: a node type's classes, or an edge type's links.
        k: The ranking cut-off of link evaluation (``recall@k``); 0 for node classification.
    """

    # Defaults only so that jsonargparse, which shows a model's ``graph`` as a group of these
    # fields, requires none of them on the command line: the CLI links the whole spec.
    node_types: tuple[str, ...] = ()
    edge_types: tuple[EdgeType, ...] = ()
    num_features: Mapping[str, int] = field(default_factory=dict)
    num_nodes: Mapping[str, int] = field(default_factory=dict)
    target: str | EdgeType = ""
    k: int = 0

    def __post_init__(self) -> None:
        # Lists (a checkpoint's hyperparameters, the CLI's link) as the tuples PyG compares.
        object.__setattr__(self, "node_types", tuple(self.node_types))
        object.__setattr__(self, "edge_types", tuple(tuple(e) for e in self.edge_types))
        if not isinstance(self.target, str):
            object.__setattr__(self, "target", tuple(self.target))

    def as_dict(self) -> dict[str, Any]:
        """Plain lists, dictionaries and numbers: what a checkpoint's hyperparameters hold."""
        spec = asdict(self)
        spec["node_types"] = list(self.node_types)
        spec["edge_types"] = [list(e) for e in self.edge_types]
        spec["target"] = self.target if isinstance(self.target, str) else list(self.target)
        spec["num_features"], spec["num_nodes"] = dict(self.num_features), dict(self.num_nodes)
        return spec


@runtime_checkable
class EvaluatesLayerwise(Protocol):
    """A model that exact layer-wise inference can evaluate (``gnnscale.NodeClassifier``).

    ``gnnscale plan`` computes that evaluation's whole-graph buffers from ``gnn``'s widths and
    runs its layers on one batch of the input ``layerwise_input`` gives.
    """

    gnn: BasicGNN
    sparse_aggregation: bool

    def layerwise_input(self, batch: LayerwiseBatch) -> LayerwiseBatch:
        """``batch`` as the model reads it (its own table, for a model without features)."""
        ...
