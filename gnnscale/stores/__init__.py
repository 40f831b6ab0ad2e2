"""Graphs on disk: prepared graphs (memory-mapped), many-graph stores, caches.

- ``prepared``: one large graph written once and memory-mapped by every process;
- ``graphs``: many small graphs in an LMDB or SQLite store, read one graph at a time;
- ``cache``: folders of derived data (partitions, normalisations) built once, checked on reuse;
- ``atomic``: what their writers share: the lock, the partial folder beside the target, the
  manifest written last, the rename into place.
"""
