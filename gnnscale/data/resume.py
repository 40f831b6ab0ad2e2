"""Training batches that a run killed mid-epoch draws again, exactly, when it resumes.

PyG's loaders draw their order and their samples from the global random stream, which the
model's dropout shares: a run resumed from a checkpoint taken mid-epoch restarts the epoch from
batch 0 with other batches (Lightning warns that the loader is "not resumable"). ``ResumableLoader``
wraps one of them so that:

- batch ``i`` of epoch ``e`` is a function of ``(seed, e, i)``: the epoch's order is a
  permutation seeded by ``(seed, e)``, and each batch is sampled (neighbours, GraphSAINT
  subgraphs) under its own seed, in whichever process samples it. The same batches come out
  with 0 or 8 workers, and they no longer move the model's random stream;
- it is stateful (``state_dict`` / ``load_state_dict``, which Lightning saves in every
  checkpoint): the epoch, the batches already trained, and the random state the training steps
  draw from, so a resumed run skips what was trained and draws the same dropout masks.

Under DDP each rank takes every ``world_size``-th batch of the epoch's order (the last ones
repeated so every rank has as many, each repeat marked ``padding = True`` so that a DataModule
can weigh it 0); Lightning's ``DistributedSampler`` is not used.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from torch_geometric.loader import LinkLoader, NodeLoader

__all__ = ["ResumableLoader", "SeededSampling"]


def _seed(*key: int) -> int:
    """A seed for ``key`` (numpy's SeedSequence: nearby keys give unrelated streams)."""
    return int(np.random.SeedSequence(list(key)).generate_state(1)[0])


def _seed_cpu(seed: int) -> None:
    """Seed the CPU's global stream, the one samplers draw from (and ``fork_rng`` restores).

    ``torch.manual_seed`` would seed every GPU's stream too, which ``fork_rng(devices=[])`` does
    not restore; it also queued a stack trace per call for CUDA's lazy start (0.9 ms a batch).
    """
    torch.default_generator.manual_seed(seed)


class SeededSampling:
    """A loader's ``collate_fn``, each batch sampled under a seed of its position in the loader.

    For evaluation loaders, whose batches keep their order: sampled evaluation becomes a
    function of the weights alone, with the same neighbourhoods at every epoch, in a resumed
    run and with any number of workers, and the model's random stream is left as it was.
    """

    def __init__(self, collate: Callable[[Any], Any], seed: int = 0) -> None:
        self.collate, self.seed = collate, seed

    def __call__(self, index: Any) -> Any:
        """Sample the batch of dataset positions ``index`` under its own seed."""
        with torch.random.fork_rng(devices=[]):
            _seed_cpu(_seed(self.seed, int(index[0])))
            return self.collate(index)


class _SeededBatches(Dataset):
    """Builds one whole batch per item, ``(seed, indices, padding)``, as the loader would."""

    def __init__(self, loader: DataLoader, transform: Callable[[Any], Any] | None) -> None:
        self.dataset, self.collate_fn, self.transform = loader.dataset, loader.collate_fn, transform
        # A Node- or LinkLoader turns sampler output into Data in the main process unless told to in
        # its workers; done here, it runs wherever the batch is sampled.
        self.filter_fn = None
        if isinstance(loader, NodeLoader | LinkLoader) and not loader.filter_per_worker:
            self.filter_fn = loader.filter_fn

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, item: tuple[int, list[int], bool]) -> Any:
        seed, indices, padding = item
        with torch.random.fork_rng(devices=[]):
            _seed_cpu(seed)
            batch = self.collate_fn([self.dataset[i] for i in indices])
            batch = batch if self.filter_fn is None else self.filter_fn(batch)
            batch = batch if self.transform is None else self.transform(batch)
        if padding:  # a repeat that evens out the ranks' batch counts
            batch.padding = True
        return batch


class _Order(Sampler):
    """The ``(seed, indices, padding)`` of each batch this process draws, from ``start`` on."""

    def __init__(self, owner: ResumableLoader) -> None:
        self.owner = owner

    def __len__(self) -> int:
        return len(self.owner)

    def __iter__(self) -> Iterator[tuple[int, list[int], bool]]:
        o = self.owner
        return o._batches(o.epoch, o._start)


class ResumableLoader:
    """A training loader (PyG's or any map-style ``DataLoader``) that can resume mid-epoch.

    Args:
        loader: The loader to draw batches like: its dataset, ``collate_fn``, batch size,
            ``drop_last`` and worker options are used; its sampler is not.
        shuffle: Draw each epoch's order at random (seeded), or keep the dataset's order.
        seed: Seed of every epoch's order and every batch's sampling; default: one drawn from
            the global stream (so ``seed_everything`` fixes it), kept in the checkpoint.
        rank: This process's rank, of ``world_size`` data-parallel processes.
        world_size: Data-parallel processes; each draws ``1 / world_size`` of the batches.
        transform: Applied to each batch where it is built (in the workers, if any).
    """

    def __init__(
        self,
        loader: DataLoader,
        shuffle: bool,
        seed: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        transform: Callable[[Any], Any] | None = None,
    ) -> None:
        self.loader, self.shuffle, self.rank, self.world_size = loader, shuffle, rank, world_size
        if seed is None:
            seed = int(torch.randint(0, 2**31 - 1, ()).item())
        self.seed = seed
        self.batch_size = loader.batch_size or 1
        self.drop_last = loader.drop_last
        self.epoch = 0
        self._start = 0  # the batch of this epoch to start from (set by a resumed run)
        self._drawn = 0  # batches of this epoch handed out
        self._rng: dict[str, torch.Tensor] | None = None  # random state to restore on resume
        kwargs = {
            "num_workers": loader.num_workers,
            "pin_memory": loader.pin_memory,
            "persistent_workers": loader.persistent_workers,
        }
        self.batches = DataLoader(
            _SeededBatches(loader, transform),
            sampler=_Order(self),
            batch_size=None,
            collate_fn=_identity,
            # Its own generator: worker seeds (unused: every batch is seeded) must not be drawn
            # from the global stream the model's dropout uses.
            generator=torch.Generator(),
            **kwargs,  # type: ignore[arg-type]
        )
        self.sampler = self  # Lightning calls ``loader.sampler.set_epoch`` before each epoch

    def set_epoch(self, epoch: int) -> None:
        """Draw epoch ``epoch``'s batches next (Lightning calls it before every epoch)."""
        self.epoch = epoch

    def _batches(self, epoch: int, start: int = 0) -> Iterator[tuple[int, list[int], bool]]:
        """This process's batches of ``epoch`` from ``start``: (seed, dataset indices, padding).

        Each batch's indices are listed as it is drawn; the order stays one tensor (listed whole,
        10M training edges took 460 MiB of Python integers in every rank, 100M about 4.5 GiB).
        """
        order = self._order(epoch)
        size, count, seed = self.batch_size, self._all_ranks_batches(), self.seed
        rank, world = self.rank, self.world_size

        def draw(k: int) -> tuple[int, list[int], bool]:
            i = rank + world * k  # past the last batch: a repeat (padding)
            j = i % count
            return _seed(seed, epoch, j), order[j * size : (j + 1) * size].tolist(), i >= count

        return map(draw, range(start, len(self)))

    def _order(self, epoch: int) -> torch.Tensor:
        """Every rank's dataset indices of ``epoch``, in the order batches take them.

        4-byte integers where they suffice: half the memory of torch's default (at 100M training
        edges 0.4 GB a rank instead of 0.8), the same permutation.
        """
        n = len(self.loader.dataset)  # type: ignore[arg-type]
        dtype = torch.int32 if n <= torch.iinfo(torch.int32).max else torch.long
        if not self.shuffle:
            return torch.arange(n, dtype=dtype)
        gen = torch.Generator().manual_seed(_seed(self.seed, epoch))
        return torch.randperm(n, generator=gen, dtype=dtype)

    def _all_ranks_batches(self) -> int:
        n = len(self.loader.dataset)  # type: ignore[arg-type]
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __len__(self) -> int:
        return math.ceil(self._all_ranks_batches() / self.world_size)

    def __iter__(self) -> Iterator[Any]:
        if self._rng is not None:  # resuming: the training steps draw what they drew before
            _set_rng(self._rng)
            self._rng = None
        self._drawn = self._start
        batches = iter(self.batches)  # takes this epoch's order from self._start on
        self._start = 0
        for batch in batches:
            self._drawn += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """Where the run stands: saved by Lightning in every checkpoint."""
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "batches_done": self._drawn,  # Lightning fetches no batch ahead of a sized loader
            "rng": _get_rng(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration starts at the first batch not trained."""
        self.seed, self.epoch, self._rng = state["seed"], state["epoch"], state["rng"]
        self._start = state["batches_done"]
        if self._start >= len(self):  # saved at the end of an epoch: the next one starts
            self.epoch, self._start = self.epoch + 1, 0


def _get_rng() -> dict[str, torch.Tensor]:
    """The random streams a training step draws from (dropout): the CPU's and this GPU's."""
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_initialized():  # never initialises CUDA (a forked rank could not)
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _identity(batch: Any) -> Any:
    return batch
