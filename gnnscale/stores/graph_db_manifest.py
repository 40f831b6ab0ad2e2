"""A graph store's format: its manifest, read and written here only (``gnnscale.stores.graph_db``).

``gnnscale prepare-graphs`` writes many small graphs into one database file (LMDB or SQLite)
and, last, ``manifest.json``: what the graphs are (``source``, part of the resume key), how many,
the first graph's tensors' dtypes, the counts a model is sized by, and the file's size and
CRC-32. :class:`StoreManifest` is that manifest; it is apart from the store because a fit reads
it without opening the database.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gnnscale.errors import ConfigError
from gnnscale.stores import atomic

__all__ = ["BACKENDS", "Backend", "GraphStoreError", "StoreManifest"]

FORMAT = "gnnscale.graph_store/1"
BACKENDS = ("lmdb", "sqlite")
Backend = Literal["lmdb", "sqlite"]


class GraphStoreError(ConfigError):
    """A graph store that is missing, half-written or damaged; the message says what to rerun."""


@dataclass(frozen=True)
class StoreManifest:
    """A graph store's ``manifest.json`` (:meth:`read`, :meth:`from_json`, :meth:`to_json`).

    Args:
        source: What the graphs are (part of the resume key).
        backend: ``lmdb`` or ``sqlite``.
        num_graphs: Graphs it holds.
        schema: Graph 0's tensors' dtypes, by key.
        num_features: Features per node (0: none).
        num_edge_features: Features per edge (0: none).
        num_classes: Classes of an integer graph label (0: a regression target).
        file_name: The database file's name.
        file_bytes: Its size.
        file_crc32: Its CRC-32.
        extra: Keys this gnnscale does not read, kept as they were.
    """

    source: Any
    backend: Backend
    num_graphs: int
    schema: dict[str, str]
    num_features: int
    num_edge_features: int
    num_classes: int
    file_name: str
    file_bytes: int
    file_crc32: int
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, folder: Path) -> StoreManifest:
        """A store's manifest, or one error saying why there is none and what to run."""
        folder = Path(folder)
        if not folder.is_dir():
            for partial in atomic.leftovers(folder):
                raise GraphStoreError(
                    f"{folder} is a half-finished prepare (its writes are in {partial.name}, no "
                    f"completion marker): rerun `gnnscale prepare-graphs --out {folder}` with "
                    "the same settings to finish it"
                )
            raise GraphStoreError(
                f"--data.root {str(folder)!r} is not a folder: run `gnnscale prepare-graphs "
                f"--out {folder}` first, or point --data.root at a prepared store"
            )
        command = f"gnnscale prepare-graphs --out {folder}"
        data = atomic.read_manifest(folder, FORMAT, "graph store", command, GraphStoreError)
        return cls.from_json(data, str(folder / atomic.MANIFEST))

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = atomic.MANIFEST) -> StoreManifest:
        """The manifest :meth:`to_json` wrote; one error naming ``where`` if a key is damaged."""
        try:
            file = data["file"]
            manifest = cls(
                source=data["source"],
                backend=data["backend"],
                num_graphs=int(data["num_graphs"]),
                schema=dict(data["schema"]),
                num_features=int(data["num_features"]),
                num_edge_features=int(data["num_edge_features"]),
                num_classes=int(data["num_classes"]),
                file_name=str(file["name"]),
                file_bytes=int(file["bytes"]),
                file_crc32=int(file["crc32"]),
                extra={k: v for k, v in data.items() if k not in _KEYS},
            )
        except KeyError as err:
            raise GraphStoreError(
                f"{where} cannot be read ({err} is missing); prepare it again (gnnscale "
                "prepare-graphs)"
            ) from None
        except (TypeError, ValueError) as err:  # a value of the wrong kind
            raise GraphStoreError(
                f"{where} cannot be read ({err}); prepare it again (gnnscale prepare-graphs)"
            ) from None
        if manifest.backend not in BACKENDS:
            raise GraphStoreError(
                f"{where} names backend {manifest.backend!r}, not one of {BACKENDS}; prepare it "
                "again (gnnscale prepare-graphs)"
            )
        return manifest

    def to_json(self) -> dict[str, Any]:
        """The manifest as ``manifest.json`` holds it."""
        file = {"name": self.file_name, "bytes": self.file_bytes, "crc32": self.file_crc32}
        data = {"format": FORMAT, "source": self.source, "backend": self.backend}
        data |= {"num_graphs": self.num_graphs, "schema": self.schema}
        data |= {"num_features": self.num_features, "num_edge_features": self.num_edge_features}
        return data | {"num_classes": self.num_classes, "file": file} | self.extra


_KEYS = {"format", "source", "backend", "num_graphs", "schema", "num_features"}
_KEYS |= {"num_edge_features", "num_classes", "file"}
