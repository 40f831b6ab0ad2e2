"""A prepared folder as PyG's ``(FeatureStore, GraphStore)`` pair, every tensor memory-mapped.

    fs, gs = gnnscale.stores.open("data/my_graph")
    loader = NeighborLoader((fs, gs), num_neighbors=[10, 5], input_nodes=train, batch_size=1024)

PyG's ``NeighborLoader`` and ``LinkNeighborLoader`` take any such pair (cuGraph-PyG and other
out-of-memory backends implement the same two interfaces). Here the graph store hands the
sampler each edge type's destination-sorted CSC (``colptr``, ``row``) as it lies on disk, so
nothing is sorted or copied when a loader starts; the feature store gathers a batch's rows from
the mapped files. Processes that open one folder share its pages.

What the feature store holds, per node type (``None`` in a homogeneous graph): the prepared
files (``x``, ``y``, ``train_mask``, ``val_mask``, ``test_mask``, those that exist) and ``n_id``,
each node's own index, computed rather than stored. PyG's samplers learn a graph's node types
from the feature store, so ``n_id`` makes a node type without features (MAG's authors) visible;
batches carry it as PyG's in-memory loaders do. Both stores are read-only.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor
from torch_geometric.data import EdgeAttr, FeatureStore, GraphStore, TensorAttr
from torch_geometric.data.graph_store import EdgeLayout
from torch_geometric.typing import EdgeTensorType, EdgeType, NodeType

from gnnscale.errors import ConfigError
from gnnscale.stores.prepared import PreparedGraph
from gnnscale.stores.reads import gather

__all__ = ["MappedFeatureStore", "MappedGraphStore", "open", "stores_of"]

_READ_ONLY = "a prepared store is read-only: prepare a new folder to change it"


class MappedFeatureStore(FeatureStore):
    """Node tensors of a prepared folder, by ``(node type, name)``; ``n_id`` computed.

    ``check_ids``, if given, sees every gathered index first (:meth:`PreparedGraph.check_ids`);
    ``read_threads`` threads gather a batch's rows at once (:mod:`gnnscale.stores.reads`).
    """

    def __init__(
        self,
        tensors: dict[tuple[NodeType | None, str], Tensor],
        num_nodes: dict,
        check_ids: Callable[[Tensor, NodeType | None], None] | None = None,
        read_threads: int = 1,
    ) -> None:
        super().__init__()
        self.tensors = tensors
        self.num_nodes: dict[NodeType | None, int] = num_nodes
        self.check_ids = check_ids
        self.read_threads = read_threads

    def _get_tensor(self, attr: TensorAttr) -> Tensor | None:
        index = attr.index
        if self.check_ids is not None and isinstance(index, Tensor) and index.dtype != torch.bool:
            self.check_ids(index, attr.group_name)
        if attr.attr_name == "n_id" and attr.group_name in self.num_nodes:
            every = torch.arange(self.num_nodes[attr.group_name])
            return every if index is None else every[index]
        tensor = self.tensors.get((attr.group_name, attr.attr_name))
        if tensor is None or index is None:
            return tensor
        if isinstance(index, Tensor) and index.dtype != torch.bool:
            return gather(tensor, index, self.read_threads)  # from the page cache or disk
        return tensor[index]

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...] | None:
        if attr.attr_name == "n_id" and attr.group_name in self.num_nodes:
            return (self.num_nodes[attr.group_name],)
        tensor = self.tensors.get((attr.group_name, attr.attr_name))
        return None if tensor is None else tuple(tensor.shape)

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        """Every tensor, ``n_id`` of each node type last."""
        stored = [TensorAttr(group, name) for group, name in self.tensors]
        return stored + [TensorAttr(group, "n_id") for group in self.num_nodes]

    def _put_tensor(self, tensor: Tensor, attr: TensorAttr) -> bool:
        raise ConfigError(_READ_ONLY)

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        raise ConfigError(_READ_ONLY)


class MappedGraphStore(GraphStore):
    """Each edge type's CSC (``row``, ``colptr``), destination-sorted, as PyG's samplers read it."""

    def __init__(self, csc: dict[EdgeType | None, tuple[Tensor, Tensor, tuple[int, int]]]) -> None:
        super().__init__()
        self.csc_by_type = csc

    def _get_edge_index(self, edge_attr: EdgeAttr) -> EdgeTensorType | None:
        found = self.csc_by_type.get(edge_attr.edge_type)
        if found is None or edge_attr.layout != EdgeLayout.CSC:
            return None  # PyG's csc() asks for the layout each edge type is stored in
        row, colptr, _ = found
        return row, colptr

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        """One CSC attribute per edge type, with its (source, destination) node counts."""
        return [
            EdgeAttr(edge_type, EdgeLayout.CSC, size=size)
            for edge_type, (_, _, size) in self.csc_by_type.items()
        ]

    def _put_edge_index(self, edge_index: EdgeTensorType, edge_attr: EdgeAttr) -> bool:
        raise ConfigError(_READ_ONLY)

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        raise ConfigError(_READ_ONLY)


def edge_type(key: str) -> EdgeType:
    """``"paper__cites__paper"`` (a prepared folder's name for an edge type) as PyG's tuple."""
    src, rel, dst = key.split("__")
    return src, rel, dst


def open(  # noqa: A001 (gnnscale.stores.open, as the builtin opens a file)
    folder: Path | str, verify: Literal["full", "size"] = "full", read_threads: int | None = None
) -> tuple[MappedFeatureStore, MappedGraphStore]:
    """A prepared folder (``gnnscale prepare``) as PyG's ``(FeatureStore, GraphStore)`` pair.

    Args:
        folder: The prepared folder.
        verify: ``full`` checks every block's checksum first; ``size`` only the files' sizes.
        read_threads: Threads that gather a batch's rows at once; ``None``: as
            :class:`PreparedGraph` chooses (many where the graph is read from disk).
    """
    return stores_of(PreparedGraph(Path(folder), verify, read_threads))


def stores_of(graph: PreparedGraph) -> tuple[MappedFeatureStore, MappedGraphStore]:
    """An opened prepared folder's ``(FeatureStore, GraphStore)`` pair (see :func:`open`)."""
    manifest = graph.manifest
    if isinstance(manifest["num_nodes"], dict):  # heterogeneous: "type/name" files
        num_nodes: dict[NodeType | None, int] = dict(manifest["num_nodes"])
        groups: dict[str, NodeType | None] = {k: k for k in manifest["num_nodes"]}
        edge_types = {key: edge_type(key) for key in manifest["num_edges"]}
    else:
        num_nodes, groups = {None: int(manifest["num_nodes"])}, {"": None}
        edge_types = {"": None}  # type: ignore[dict-item]
    tensors = {}
    for name in manifest["files"]:
        group, _, attr = name.rpartition("/")
        if group in groups and attr not in ("colptr", "row"):
            tensors[groups[group], attr] = graph.tensor(name)
    csc = {}
    for key, et in edge_types.items():
        prefix = f"{key}/" if key else ""
        src, dst = (None, None) if et is None else (et[0], et[-1])
        size = (num_nodes[src], num_nodes[dst])
        csc[et] = (graph.tensor(f"{prefix}row"), graph.tensor(f"{prefix}colptr"), size)
    features = MappedFeatureStore(tensors, num_nodes, graph.check_ids, graph.threads)
    return features, MappedGraphStore(csc)
