"""Many small graphs: generated atom-like graphs, and the DataModule that batches a store."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torch_geometric.data import Batch, Data, InMemoryDataset

from gnnscale._compat import in_memory_data
from gnnscale.batch import supervise
from gnnscale.data.args import GraphSplit, LoaderArgs
from gnnscale.data.loaders import resumable
from gnnscale.data.resume import ResumableLoader
from gnnscale.errors import ConfigError
from gnnscale.handshake import BatchRequest
from gnnscale.memory import MemoryProfile, MiB, proportional_batches, store_tensors, tensor_mb
from gnnscale.stores.graph_db import BACKENDS, Backend, GraphStore, write_graphs

# --- the generated atom-like graphs --------------------------------------------------------


@dataclass(frozen=True)
class AtomGraphs:
    """Atom-like graphs, generated offline: graph ``i`` depends only on ``(seed, i)``.

    Each graph is a 3-D point cloud of ``min_atoms``..``max_atoms`` atoms of ``num_types``
    types on the sites of a jittered cubic lattice, filled at a density drawn per graph. Edges
    join atoms closer than ``cutoff`` (both directions), with their length as ``edge_attr``.
    The target ``y`` is the energy: a Morse pair potential summed over the edges, whose depth
    and equilibrium distance depend on both atoms' types, smoothly cut off at ``cutoff``. Atom
    counts alone cannot give it (how many pairs are close, and how close, varies with the
    packing); a model that reads the edges can.

    Args:
        num_graphs: Graphs in the dataset.
        min_atoms: Fewest atoms in a graph.
        max_atoms: Most atoms in a graph.
        num_types: Atom types (one-hot node features ``x``, stored as uint8).
        cutoff: Radius of the radius graph, in lattice spacings.
        seed: Seed of the whole dataset.
    """

    num_graphs: int = 1_000_000
    min_atoms: int = 10
    max_atoms: int = 60
    num_types: int = 5
    cutoff: float = 1.6
    seed: int = 0

    def __post_init__(self) -> None:
        """Refuse sizes that make no graph."""
        if self.num_graphs < 1:
            raise ConfigError(f"--atoms.num_graphs must be >= 1 (got {self.num_graphs})")
        if not 2 <= self.min_atoms <= self.max_atoms:
            raise ConfigError(
                "--atoms.min_atoms must be >= 2 and <= --atoms.max_atoms "
                f"(got {self.min_atoms}, {self.max_atoms})"
            )
        if not 1 <= self.num_types <= 8:
            raise ConfigError(f"--atoms.num_types must be in 1..8 (got {self.num_types})")
        if self.cutoff <= 0:
            raise ConfigError(f"--atoms.cutoff must be > 0 (got {self.cutoff})")


# Per-type depth and size of the pair potential (types beyond these cycle through them).
_DEPTH = np.array([0.4, 1.0, 0.7, 1.6, 1.2, 0.5, 0.9, 1.3])
_RADIUS = np.array([0.50, 0.55, 0.60, 0.65, 0.70, 0.52, 0.58, 0.62])
_STIFFNESS = 2.0


class AtomGraphDataset(Dataset):
    """:class:`AtomGraphs` as a sequence: ``dataset[i]`` generates graph ``i`` (no storage).

    Args:
        spec: The dataset's settings.
    """

    def __init__(self, spec: AtomGraphs) -> None:
        self.spec = spec

    def __len__(self) -> int:
        return self.spec.num_graphs

    def __getitem__(self, i: int) -> Data:
        s = self.spec
        if not 0 <= i < s.num_graphs:
            raise IndexError(f"graph {i} of {s.num_graphs}")
        rng = np.random.default_rng([s.seed, i])
        n = int(rng.integers(s.min_atoms, s.max_atoms + 1))
        fill = rng.uniform(0.2, 0.8)  # fraction of lattice sites taken: the packing varies
        side = math.ceil((n / fill) ** (1 / 3))
        sites = rng.choice(side**3, size=n, replace=False)
        grid = np.stack(np.unravel_index(sites, (side, side, side)), axis=1)
        pos = (grid + rng.normal(0.0, 0.12, size=(n, 3))).astype(np.float32)
        z = rng.integers(0, s.num_types, size=n)
        diff = pos[:, None, :] - pos[None, :, :]
        dist = np.sqrt((diff**2).sum(-1))
        src, dst = np.nonzero((dist < s.cutoff) & ~np.eye(n, dtype=bool))
        r = dist[src, dst].astype(np.float64)
        depth = np.sqrt(_DEPTH[z[src]] * _DEPTH[z[dst]])
        r0 = _RADIUS[z[src]] + _RADIUS[z[dst]]
        morse = depth * ((1 - np.exp(-_STIFFNESS * (r - r0))) ** 2 - 1)
        smooth = 0.5 * (np.cos(np.pi * r / s.cutoff) + 1)
        energy = 0.5 * float((morse * smooth).sum())  # each pair is two directed edges
        x = np.zeros((n, s.num_types), dtype=np.uint8)
        x[np.arange(n), z] = 1
        return Data(
            x=torch.from_numpy(x),
            pos=torch.from_numpy(pos),
            edge_index=torch.from_numpy(np.stack([src, dst]).astype(np.int64)),
            edge_attr=torch.from_numpy(dist[src, dst].astype(np.float32)).view(-1, 1),
            y=torch.tensor([energy], dtype=torch.float32),
        )


def prepare_graphs(
    *,
    out: Path,
    backend: Backend = "lmdb",
    atoms: AtomGraphs = AtomGraphs(),  # noqa: B008 (frozen dataclass)
    chunk_graphs: int = 10_000,
) -> Path:
    """Write the generated atom-like graphs to a store, for ``--data.root OUT``.

    Your own graphs (an in-memory PyG dataset, a generator):
    ``gnnscale.stores.graph_db.write_graphs``.

    Args:
        out: Folder to create (atomically; a killed prepare rerun with the same settings
            continues from its last committed chunk).
        backend: ``lmdb`` (the default: faster to read, see the recipe's README) or ``sqlite``
            (PyG's ``SQLiteDatabase``, as ``OnDiskDataset`` uses).
        atoms: Size and settings of the generated graphs.
        chunk_graphs: Graphs per committed transaction (and what a killed prepare loses).
    """
    source = {"dataset": "atoms", "atoms": asdict(atoms)}
    return write_graphs(AtomGraphDataset(atoms), out, source, backend, chunk_graphs=chunk_graphs)


# --- splits, exactly-once sharding, batches --------------------------------------


class ExactlyOnceSampler(DistributedSampler):
    """``DistributedSampler`` whose padding is marked: every item trains once per epoch.

    Like PyTorch's sampler (Lightning's default under DDP), each rank takes every
    ``num_replicas``-th position of one seeded permutation, padded with repeated items so every
    rank draws as many (ranks that drew fewer batches would wait forever for the others'
    gradients). Here a padding copy of item ``i`` is yielded as ``-(i + 1)``; the dataset
    returns it with weight 0, so it adds nothing to the loss or the metrics, and across ranks
    each item counts exactly once per epoch. The evaluation loaders use it; training batches
    are drawn by a ``ResumableLoader``, which shards whole batches the same way.
    """

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)  # type: ignore[arg-type]
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=g)
        else:
            order = torch.arange(n)
        pad = self.total_size - n
        if pad > 0:
            repeats = order.repeat(math.ceil(pad / max(n, 1)))[:pad]
            order = torch.cat([order, -(repeats + 1)])
        return iter(order[self.rank : self.total_size : self.num_replicas].tolist())


class _Split(Dataset):
    """The graphs of one split; item ``-(k + 1)`` is graph ``k`` as weight-0 padding."""

    def __init__(self, graphs: Dataset, indices: np.ndarray) -> None:
        self.graphs, self.indices = graphs, indices  # a numpy array: no per-item objects

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int) -> Data:
        pad = k < 0
        i = int(self.indices[-k - 1 if pad else k])
        data = self.graphs[i]
        data.idx = torch.tensor([i])
        data.weight = torch.tensor([0.0 if pad else 1.0])
        return data


class _Collate:
    """PyG's ``Batch`` plus the batch contract: ``loss_weight`` per graph, ``num_loss_nodes``.

    Each graph weighs ``1 / batch_size`` (padding 0), so a micro-batch's weights sum to 1 when
    full and less when short: Lightning's accumulation (which averages micro-batch losses) and
    DDP (which averages ranks) then weigh every graph the same, short last batches included.
    """

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size

    def __call__(self, graphs: list[Data]) -> Batch:
        batch = Batch.from_data_list(graphs)
        batch.loss_weight = batch.weight / self.batch_size
        batch.num_loss_nodes = int(batch.weight.sum())  # graphs, for ThroughputMonitor
        del batch.weight
        return batch


class _InMemory(InMemoryDataset):
    """Every graph read into memory and collated (PyG's ``InMemoryDataset``): the baseline."""

    def __init__(self, store: GraphStore) -> None:
        super().__init__(None, log=False)
        self.data, self.slices = self.collate([store[i] for i in range(len(store))])


class GraphDataModule(L.LightningDataModule):
    """Graph-level batches from a store on disk (``gnnscale prepare-graphs``), read per graph.

    Each process holds the split's graph ids (8 bytes a graph) and the batches in flight; the
    store is read by whichever process builds the batch (a DataLoader worker, or the main
    process). Under DDP every rank opens the same store; each epoch's training batches are
    shared out by a ``ResumableLoader`` (a run killed mid-epoch resumes at its next batch) and
    evaluation graphs by :class:`ExactlyOnceSampler`, so every graph counts once across ranks.

    Batches are PyG ``Batch`` objects with ``x``, ``edge_index``, ``edge_attr``, ``y``,
    ``batch``, and per graph ``idx`` (its index in the store) and ``loss_weight``.

    Args:
        root: The store's folder.
        batch_size: Graphs per batch and process.
        split: How the graphs are divided into training, validation and test, at random.
        backend: The store's backend, checked against the folder (``null``: whichever it is).
        storage: ``disk`` reads each graph when a batch needs it; ``memory`` reads the whole
            dataset into every process first (PyG's ``InMemoryDataset``), the usual way and the
            benchmarks' baseline.
        loader: DataLoader workers and pinned memory.
    """

    def __init__(
        self,
        root: Path,
        batch_size: int = 128,
        split: GraphSplit = GraphSplit(),  # noqa: B008 (frozen dataclass)
        backend: Backend | None = None,
        storage: Literal["disk", "memory"] = "disk",
        loader: LoaderArgs = LoaderArgs(),  # noqa: B008 (frozen dataclass)
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ConfigError(f"--data.batch_size must be >= 1 (got {batch_size})")
        if backend is not None and backend not in BACKENDS:
            raise ConfigError(f"--data.backend {backend!r} is not known; choose one of {BACKENDS}")
        if storage not in ("disk", "memory"):
            raise ConfigError(f"--data.storage {storage!r}: choose disk or memory")
        self.store = GraphStore(Path(root))  # the manifest and the file's size, nothing more
        if backend is not None and backend != self.store.backend:
            raise ConfigError(
                f"--data.backend {backend} but {root} is a {self.store.backend} store: set "
                f"--data.backend {self.store.backend} (or null), or prepare with --backend "
                f"{backend}"
            )
        n = len(self.store)
        num_val, num_test = math.ceil(n * split.val_fraction), math.ceil(n * split.test_fraction)
        if n - num_val - num_test < 1:
            raise ConfigError(
                f"{root} holds {n} graphs: too few for --data.split.val_fraction "
                f"{split.val_fraction} and --data.split.test_fraction {split.test_fraction}"
            )
        order = np.random.default_rng(split.seed).permutation(n)
        self.splits = {
            "test": np.sort(order[:num_test]),
            "val": np.sort(order[num_test : num_test + num_val]),
            "train": np.sort(order[num_test + num_val :]),
        }
        self.root, self.batch_size = Path(root), batch_size
        self.storage, self.loader = storage, loader
        self._graphs: Dataset | None = None

    def __repr__(self) -> str:
        # Lightning's own would build every loader (jsonargparse prints it for links it skips).
        return f"{type(self).__name__}(root={str(self.root)!r})"

    __str__ = __repr__

    @property
    def num_features(self) -> int:
        """Node feature dimension (``model.in_channels``)."""
        return self.store.manifest.num_features

    @property
    def num_classes(self) -> int:
        """Classes of the graph label; 0 for a regression target (``model.num_classes``)."""
        return self.store.manifest.num_classes

    @property
    def num_edge_features(self) -> int:
        """Edge feature dimension (``model.edge_dim``)."""
        return self.store.manifest.num_edge_features

    def configure_batches(self, request: BatchRequest) -> None:
        """Refuse a node-level model, or an ``edge_dim`` the store's edges do not have.

        Args:
            request: What the model's batches must carry (``gnnscale.handshake``): a graph-level
                model (``graph_level``) and the edge features it reads (``edge_dim``).
        """
        edge_dim = request.edge_dim
        if not request.graph_level or edge_dim is None:
            raise ConfigError(
                f"--data {type(self).__name__} makes graph-level batches; the --model is a "
                "node model: use gnnscale.GraphGINE"
            )
        if edge_dim != self.num_edge_features:
            raise ConfigError(
                f"--model.edge_dim is {edge_dim} but the graphs in {self.root} have "
                f"{self.num_edge_features} edge feature(s): set --model.edge_dim "
                f"{self.num_edge_features}"
            )

    @property
    def graphs(self) -> Dataset:
        """Every graph, by index: the store, or (``storage: memory``) all of it read in."""
        if self._graphs is None:
            self._graphs = self.store if self.storage == "disk" else _InMemory(self.store)
        return self._graphs

    def _loader(self, split: str) -> DataLoader:
        indices = np.arange(len(self.store)) if split == "all" else self.splits[split]
        dataset = _Split(self.graphs, indices)
        trainer = self.trainer
        world, rank = (trainer.world_size, trainer.global_rank) if trainer else (1, 0)
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=ExactlyOnceSampler(dataset, world, rank, shuffle=False),
            collate_fn=_Collate(self.batch_size),
            # Its own generator: starting workers must not move the model's random stream.
            generator=torch.Generator(),
            **self.loader.kwargs(),
        )

    def memory_profile(self) -> MemoryProfile:
        """What ``gnnscale plan`` cannot measure from training batches (``gnnscale.memory``).

        Evaluation batches have ``batch_size`` graphs too: the batch-size suggestion covers it.
        """
        graph_mb, mapped_mb = 0.0, 0.0  # on disk, batches read their graphs from the store
        if self.storage == "memory":  # every graph read in and collated (InMemoryDataset)
            graphs: Any = self.graphs
            graph_mb = tensor_mb(*store_tensors(in_memory_data(graphs)), *graphs.slices.values())
        elif self.store.backend == "lmdb":  # LMDB maps its file; SQLite reads, unmapped
            mapped_mb = self.store.path.stat().st_size / MiB
        return MemoryProfile(
            graph_mb=graph_mb,
            eval_mode="batches",
            smaller_batches=proportional_batches(self.batch_size),
            mapped_mb=mapped_mb,
        )

    def train_dataloader(self) -> ResumableLoader:
        """Shuffled batches of training graphs, a share per rank, resumable mid-epoch."""
        return resumable(self.trainer, self._loader("train"), shuffle=True)

    def val_dataloader(self) -> DataLoader:
        """Validation graphs, each scored once across ranks."""
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        """Test graphs, each scored once across ranks."""
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        """Every graph of the store, each predicted once across ranks."""
        return self._loader("all")

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Under DDP, a training batch repeated to even out the ranks' counts weighs 0.

        The collate weighed its graphs (evaluation's padding graphs 0, which the model skips).
        """
        if self.trainer is not None and self.trainer.training:
            supervise(batch, batch.loss_weight, batch.num_loss_nodes)
        return batch


# --- the bar a model must clear ------------------------------------------------------------


def _count_features(graphs: Iterable[Data]) -> tuple[np.ndarray, np.ndarray]:
    rows, ys = [], []
    for g in graphs:
        counts = g.x.double().sum(0).numpy()
        pairs = np.outer(counts, counts)[np.triu_indices(len(counts))]
        rows.append(np.concatenate([[1.0], counts, pairs]))
        ys.append(float(g.y.view(-1)[0]))
    return np.array(rows), np.array(ys)


def features_only_mae(train: Iterable[Data], test: Iterable[Data], ridge: float = 1e-3) -> float:
    """Test MAE of the best edge-blind rule: least squares on atom-type counts and their products.

    The expected energy of a graph, knowing only how many atoms of each type it has, is about
    quadratic in those counts (pairs of types a and b: about n_a * n_b over the volume); the
    fit is exact least squares (a little ridge), so no edge-blind model of the counts does
    much better. A model that reads the edges must clearly beat it.

    Args:
        train: Graphs to fit on.
        test: Graphs to score.
        ridge: L2 penalty of the fit.
    """
    a, y = _count_features(train)
    w = np.linalg.solve(a.T @ a + ridge * np.eye(a.shape[1]), a.T @ y)
    b, t = _count_features(test)
    return float(np.abs(b @ w - t).mean())
