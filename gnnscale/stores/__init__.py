"""Graphs on disk: prepared graphs (memory-mapped), many-graph stores, caches.

- ``prepared``: one large graph written once and memory-mapped by every process (``manifest``:
  the folder's format and the checks of its files; ``writing``: the atomic prepare and the
  writers of a graph in memory or handed over chunk by chunk by a generator); ``open``
  (``mapped``) gives it as PyG's ``(FeatureStore, GraphStore)`` pair; ``streaming`` writes it
  from inputs read chunk by chunk
  (``npy``: a folder of ``.npy`` arrays or Parquet edge lists; ``ogb``: OGB's node-property
  downloads as they unpack); ``link_split`` streams a relation's link-prediction split (or all its
  edges as seed pairs, ``seed_edges``) into a folder of its own;
- ``graph_db``: many small graphs in an LMDB or SQLite store, read one graph at a time
  (``graph_db_manifest``: the store's manifest);
- ``cache``: folders of derived data (partitions, normalisations) built once, checked on reuse;
- ``atomic``: what their writers share: the lock, the partial folder beside the target, the
  manifest written last, the rename into place.
"""

from gnnscale.stores.manifest import PreparedGraphError
from gnnscale.stores.mapped import (  # noqa: A004 (a store, as the builtin opens a file)
    fill_cache,
    open,
    seed_edges,
)
from gnnscale.stores.npy import prepare_npy, save_npy
from gnnscale.stores.ogb import prepare_ogb
from gnnscale.stores.writing import write_graph

__all__ = [
    "PreparedGraphError",
    "fill_cache",
    "open",
    "prepare_npy",
    "prepare_ogb",
    "save_npy",
    "seed_edges",
    "write_graph",
]
