"""Link prediction on an interaction stream, by time: ``TemporalLinkDataModule``.

The stream's interactions are split by time: the first 70% train, the next 15% validate, the last
15% test. Every interaction ``(s, d, t)`` is a question: which destination did ``s`` pick at time
``t``? A batch asks it of a run of interactions, each with candidates: the true destination and
negatives. Evaluation's negatives are fixed with the split, as TGB's are: half are past
destinations of ``s`` (before ``t``, other than ``d``), half random; training draws its own the
same way. Metrics: MRR over the candidates (ties counted half, as TGB's evaluator does) and AP.

Each candidate and source is embedded at time ``t`` from its sampled neighbourhood in the one
graph of every interaction, both ways, by time (``HopSampler``): only interactions *before*
``t`` (``strict``), the newest first (``last``), so no interaction at or after the one asked
about is ever a message, in any split, and one graph serves all three. A batch also carries, for
each candidate, how often and how recently it appears among its source's sampled neighbours
(what EdgeBank remembers, given to the model as numbers to weigh).

``temporal: false`` trains the same model without time, as a static GNN would: neighbours drawn
uniformly from a graph of the interactions before the split (training: before its last 20%,
which it supervises), no edge ages.

The baselines every temporal paper is held to are computed on the same candidates
(:func:`baselines`): EdgeBank (a candidate scores 1 if ``s`` ever interacted with it, or within
a time window: the length of the test split), and popularity (the candidate's interactions so far).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader
from torch_geometric.data import Data
from torch_geometric.sampler import NodeSamplerInput

from gnnscale.batch import TemporalBatch
from gnnscale.data.args import LoaderArgs, check_positive
from gnnscale.data.loaders import resumable
from gnnscale.data.resume import SeededSampling
from gnnscale.data.stream import (
    InteractionStream,
    make_interaction_stream,
    read_interaction_stream,
)
from gnnscale.errors import ConfigError
from gnnscale.sampling import HopSampler

__all__ = ["TemporalLinkDataModule", "TemporalSplit", "baseline_scores"]


@dataclass(frozen=True)
class TemporalSplit:
    """How the stream is split by time, and how many candidates each question gets.

    Args:
        val_fraction: Share of the interactions (after the training ones) that validate.
        test_fraction: Share of the interactions (the last ones) that test.
        num_negatives: Fixed negatives per validation and test interaction (half past
            destinations of its source, half random), as TGB stores them with its splits.
        train_negatives: Negatives per training interaction, drawn the same way each epoch.
        seed: Seed of the fixed negatives.
        train_from: Train on the interactions from this share of the stream on (0: the first):
            a model fine-tuned on a new interval (``gnnscale fit --weights_from``) trains on
            that interval alone, its messages still every interaction before each question.
        train_until: ... up to this share (``None``: up to the validation interactions).
    """

    val_fraction: float = 0.15
    test_fraction: float = 0.15
    num_negatives: int = 20
    train_negatives: int = 10
    seed: int = 0
    train_from: float = 0.0
    train_until: float | None = None

    def __post_init__(self) -> None:
        """Refuse a split that leaves a part empty."""
        if not (0 < self.val_fraction and 0 < self.test_fraction):
            raise ConfigError("--data.split.val_fraction and test_fraction must be > 0")
        if self.val_fraction + self.test_fraction >= 0.9:
            raise ConfigError(
                "--data.split.val_fraction + test_fraction must be < 0.9 "
                f"(got {self.val_fraction + self.test_fraction:g}): training needs the rest"
            )
        check_positive(
            **{"split.num_negatives": self.num_negatives},
            **{"split.train_negatives": self.train_negatives},
        )
        validated = 1 - self.val_fraction - self.test_fraction
        until = validated if self.train_until is None else self.train_until
        if not 0 <= self.train_from < until <= validated:
            raise ConfigError(
                "--data.split.train_from and train_until must satisfy 0 <= train_from < "
                f"train_until <= {validated:g} (where validation starts); got "
                f"{self.train_from:g}, {until:g}"
            )


class _Stream:
    """The stream, its split and everything derived from it once."""

    def __init__(self, data: Data, split: TemporalSplit) -> None:
        self.data = data
        events = data.time.numel()
        self.val_start = int(events * (1 - split.val_fraction - split.test_fraction))
        self.test_start = int(events * (1 - split.test_fraction))
        self.train_start = int(events * split.train_from)
        until = split.train_until
        self.train_end = (
            self.val_start if until is None else min(int(events * until), self.val_start)
        )
        src, dst = data.edge_index
        self.src, self.dst, self.time = src, dst, data.time
        self.num_users = int(data.num_users)
        self.num_nodes = int(data.num_nodes)
        # each source's interactions in time order (CSR), and each interaction's place there
        order = torch.sort(src, stable=True).indices
        self.by_source = order
        counts = torch.bincount(src, minlength=self.num_nodes)
        self.first = counts.cumsum(0) - counts
        place = torch.empty_like(order)
        place[order] = torch.arange(events)
        self.before = place - self.first[src]  # the source's interactions before this one
        g = torch.Generator().manual_seed(split.seed)
        self.fixed = self._fixed_negatives(split.num_negatives, g)

    def stage(self, stage: str) -> Tensor:
        """The interactions of ``stage`` (``train``, ``val``, ``test``), in time order."""
        bounds = {
            "train": (self.train_start, self.train_end),
            "val": (self.val_start, self.test_start),
            "test": (self.test_start, self.time.numel()),
        }
        return torch.arange(*bounds[stage])

    def random_items(self, shape: tuple[int, ...], g: torch.Generator | None = None) -> Tensor:
        """Uniform destination nodes (the items: ids from ``num_users`` on)."""
        return torch.randint(self.num_users, self.num_nodes, shape, generator=g)

    def past_destinations(self, events: Tensor, k: int, g: torch.Generator | None = None) -> Tensor:
        """``k`` destinations per interaction drawn from its source's earlier interactions.

        Uniform over those interactions (a destination met often is drawn often); where there
        are none, random items.
        """
        before = self.before[events]
        pick = (torch.rand(events.numel(), k, generator=g) * before.unsqueeze(1)).long()
        earlier = self.by_source[self.first[self.src[events]].unsqueeze(1) + pick]
        return torch.where(
            before.unsqueeze(1) > 0, self.dst[earlier], self.random_items((events.numel(), k), g)
        )

    def _fixed_negatives(self, q: int, g: torch.Generator) -> Tensor:
        """Each validation and test interaction's negatives: distinct, none its destination.

        Half its source's distinct past destinations (as many as it has, up to ``q // 2``),
        the rest random items.
        """
        events = torch.arange(self.val_start, self.time.numel())
        out = torch.empty(events.numel(), q, dtype=torch.long)
        past: dict[int, dict[int, None]] = {}
        for e in range(self.val_start):
            past.setdefault(int(self.src[e]), {})[int(self.dst[e])] = None
        for row, e in enumerate(events.tolist()):
            s, d = int(self.src[e]), int(self.dst[e])
            mine = [x for x in past.get(s, {}) if x != d]
            if len(mine) > q // 2:
                mine = [mine[i] for i in torch.randperm(len(mine), generator=g)[: q // 2].tolist()]
            chosen = set(mine) | {d}
            while len(mine) < q:
                x = int(self.random_items((1,), g))
                if x not in chosen:
                    chosen.add(x)
                    mine.append(x)
            out[row] = torch.tensor(mine)
            past.setdefault(s, {})[d] = None
        return out

    def negatives(self, stage: str, events: Tensor) -> Tensor:
        """The fixed negatives of validation or test interactions ``events``."""
        return self.fixed[events - self.val_start]


def baseline_scores(stream: Any, stage: str, window: float) -> dict[str, Tensor]:
    """``[questions, candidates]`` scores of EdgeBank, EdgeBank with a window, and popularity.

    On the same fixed candidates as the model; each remembers every interaction before the
    one asked about (of every split), as the model's neighbourhoods do.
    """
    events = stream.stage(stage)
    candidates = torch.cat([stream.dst[events].unsqueeze(1), stream.negatives(stage, events)], 1)
    last: dict[tuple[int, int], int] = {}
    degree = torch.zeros(stream.num_nodes)
    scores = {
        name: torch.empty(candidates.shape) for name in ("edgebank", "edgebank_tw", "popularity")
    }
    upto = 0
    src, dst, time = stream.src.tolist(), stream.dst.tolist(), stream.time.tolist()
    for row, e in enumerate(events.tolist()):
        while upto < e:  # remember everything before e
            last[(src[upto], dst[upto])] = time[upto]
            degree[dst[upto]] += 1
            upto += 1
        at = [last.get((src[e], c)) for c in candidates[row].tolist()]
        scores["edgebank"][row] = torch.tensor([t is not None for t in at], dtype=torch.float)
        scores["edgebank_tw"][row] = torch.tensor(
            [t is not None and time[e] - t <= window for t in at], dtype=torch.float
        )
        scores["popularity"][row] = degree[candidates[row]]
    return scores


class TemporalLinkDataModule(L.LightningDataModule):
    """Batches of questions ``(source, candidates, time)`` over a generated interaction stream.

    Args:
        dataset: ``generated`` (the stream ``stream`` describes), or a stream of your own: a
            ``.csv`` in JODIE's layout (Wikipedia, Reddit as published) or a ``.parquet`` with
            columns ``src``, ``dst``, ``time`` and features (``read_interaction_stream``).
        root: Data folder (unused by the generated stream; kept for the CLI's common flags).
        stream: The generated stream's size and habits.
        split: The split by time and the candidates per question.
        num_neighbors: In-edges sampled per seed (one hop: the model reads each seed's own
            neighbours); default ``[20]``.
        temporal_strategy: ``last``: each node's newest in-edges before the question's time;
            ``uniform``: a uniform subset of them.
        strict: Only interactions before the question's time are messages (``<``); false:
            at or before it (PyG's rule: an interaction at the label's own time leaks).
        window: Only interactions not older than this (the stream's time units); ``None``: all.
        temporal: Sample by time (the recipe); false: the same model as a static GNN.
        batch_size: Training questions per batch.
        eval_batch_size: Validation and test questions per batch.
        loader: Loader workers.
    """

    def __init__(
        self,
        dataset: str = "generated",
        root: Path = Path("data"),
        stream: InteractionStream = InteractionStream(),  # noqa: B008
        split: TemporalSplit = TemporalSplit(),
        num_neighbors: list[int] | None = None,
        temporal_strategy: Literal["last", "uniform"] = "last",
        strict: bool = True,
        window: float | None = None,
        temporal: bool = True,
        batch_size: int = 200,
        eval_batch_size: int = 500,
        loader: LoaderArgs = LoaderArgs(),  # noqa: B008
    ) -> None:
        super().__init__()
        num_neighbors = [20] if num_neighbors is None else list(num_neighbors)
        if len(num_neighbors) != 1:
            raise ConfigError(
                f"--data.num_neighbors takes one hop (got {num_neighbors}): the temporal "
                "model reads each seed's own neighbours"
            )
        check_positive(batch_size=batch_size, eval_batch_size=eval_batch_size)
        if not temporal and (split.train_from or split.train_until is not None):
            raise ConfigError(
                "--data.split.train_from and train_until choose the questions a temporal model "
                "trains on; the static model (--data.temporal=false) trains on the last 20% "
                "before validation: leave them out"
            )
        self.dataset, self.root, self.stream_args, self.split = dataset, Path(root), stream, split
        self.num_neighbors = num_neighbors
        self.temporal_strategy, self.strict, self.window = temporal_strategy, strict, window
        self.temporal = temporal
        self.batch_size, self.eval_batch_size, self.loader = batch_size, eval_batch_size, loader

    def __repr__(self) -> str:
        # Lightning's own would build every loader (jsonargparse prints it for links it skips).
        return f"{type(self).__name__}(dataset={self.dataset!r}, temporal={self.temporal})"

    __str__ = __repr__

    # What the CLI links to the model (``num_nodes``, ``in_channels``): known before setup.
    @property
    def num_nodes(self) -> int:
        """Users and items."""
        if self.dataset == "generated":
            return self.stream_args.num_users + self.stream_args.num_items
        return int(self._interactions.num_nodes)

    @property
    def num_features(self) -> int:
        """Features per interaction."""
        if self.dataset == "generated":
            return self.stream_args.num_features
        return int(self._interactions.edge_attr.size(1))

    @cached_property
    def _interactions(self) -> Data:
        if self.dataset == "generated":
            return make_interaction_stream(self.stream_args)
        return read_interaction_stream(Path(self.dataset))

    @cached_property
    def stream(self) -> _Stream:
        """The stream, split, with its fixed negatives."""
        return _Stream(self._interactions, self.split)

    def setup(self, stage: str | None = None) -> None:
        """Generate and split the stream, and score the baselines (once)."""
        self._baselines  # noqa: B018

    def _sampler(self, upto: int) -> HopSampler:
        """A sampler over the interactions before ``upto`` (every one, by time), both ways."""
        s = self.stream
        edge_index = s.data.edge_index[:, :upto]
        graph = Data(
            edge_index=torch.cat([edge_index, edge_index.flip(0)], 1),
            time=s.time[:upto].repeat(2),
            num_nodes=s.num_nodes,
        )
        if not self.temporal:
            return HopSampler(graph, self.num_neighbors, disjoint=True)
        return HopSampler(
            graph,
            self.num_neighbors,
            time_attr="time",
            temporal_strategy=self.temporal_strategy,
            strict=self.strict,
            window=self.window,
        )

    @cached_property
    def _samplers(self) -> dict[str, tuple[HopSampler, int]]:
        """Each stage's sampler, and how many interactions its graph holds (each both ways)."""
        s = self.stream
        if self.temporal:
            every = s.time.numel()
            return dict.fromkeys(("train", "val", "test"), (self._sampler(every), every))
        supervised = s.val_start - s.val_start // 5  # train: messages before its last 20%
        return {
            stage: (self._sampler(upto), upto)
            for stage, upto in [("train", supervised), ("val", s.val_start), ("test", s.test_start)]
        }

    def _training_events(self) -> Tensor:
        events = self.stream.stage("train")
        if not self.temporal:
            return events[self.stream.val_start - self.stream.val_start // 5 :]
        return events

    def batch(self, stage: str, events: Tensor) -> TemporalBatch:
        """The batch of interactions ``events``: candidates drawn (training) or fixed."""
        s = self.stream
        if stage == "train":
            k = self.split.train_negatives
            negatives = torch.cat(
                [s.past_destinations(events, k // 2), s.random_items((events.numel(), k - k // 2))],
                1,
            )
        else:
            negatives = s.negatives(stage, events)
        candidates = torch.cat([s.dst[events].unsqueeze(1), negatives], 1)
        batch = self._draw_batch(stage, s.src[events], candidates, s.time[events])
        if stage != "train":
            rows = events - s.stage(stage)[0]
            batch.baselines = {k: v[rows] for k, v in self._baselines[stage].items()}
        return batch

    def _draw_batch(
        self, stage: str, source: Tensor, candidates: Tensor, time: Tensor
    ) -> TemporalBatch:
        s, (sampler, upto) = self.stream, self._samplers[stage]
        b, c = candidates.shape
        seeds = torch.cat([source, candidates.reshape(-1)])
        seed_time = torch.cat([time, time.repeat_interleave(c)])
        out = sampler.sample_from_nodes(NodeSamplerInput(None, seeds, time=seed_time))
        edge = out.edge if sampler.perm is None else sampler.perm[out.edge]
        event = torch.where(edge < upto, edge, edge - upto)  # a reverse: its interaction
        age = (seed_time[out.col] - s.time[event]).float() if self.temporal else None
        neighbour = out.node[out.row]
        pair = _appearances(out.col, neighbour, s.time[event], seed_time, b, candidates)
        if not self.temporal:
            pair[:, 1:] = 0.0  # no time: how often, not how recently
        return TemporalBatch(
            source=source,
            candidates=candidates,
            time=time,
            node=out.node,
            row=out.row,
            col=out.col,
            event=event,
            edge_attr=s.data.edge_attr[event],
            edge_age=age if age is not None else torch.zeros(edge.numel()),
            pair=pair,
        )

    def _loader(self, stage: str, events: Tensor, batch_size: int) -> DataLoader:
        return DataLoader(
            events,  # type: ignore[arg-type]
            batch_size=batch_size,
            collate_fn=lambda items: self.batch(stage, torch.stack(list(items))),
            num_workers=int(self.loader.num_workers) if self.loader.num_workers != "auto" else 0,
        )

    def train_dataloader(self) -> Any:
        """Training questions, in a seeded random order (resumable mid-epoch)."""
        loader = self._loader("train", self._training_events(), self.batch_size)
        return resumable(self.trainer, loader, shuffle=True)

    def _eval_loader(self, stage: str) -> DataLoader:
        loader = self._loader(stage, self.stream.stage(stage), self.eval_batch_size)
        loader.collate_fn = SeededSampling(loader.collate_fn)  # the same neighbourhoods each time
        return loader

    def val_dataloader(self) -> DataLoader:
        """Validation questions in time order, each with its fixed negatives."""
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        """Test questions in time order, each with its fixed negatives."""
        return self._eval_loader("test")

    @cached_property
    def _baselines(self) -> dict[str, dict[str, Tensor]]:
        """The baselines' scores of every validation and test question's candidates.

        EdgeBank's window: the test split's length in time, as TGB's EdgeBank takes it.
        """
        s = self.stream
        test = s.stage("test")
        window = (s.time[test[-1]] - s.time[test[0]]).item()
        return {stage: baseline_scores(s, stage, window) for stage in ("val", "test")}


def _appearances(
    target: Tensor, neighbour: Tensor, when: Tensor, seed_time: Tensor, b: int, candidates: Tensor
) -> Tensor:
    """Per candidate: how often, and how long ago last and first, its source met it.

    ``target``: each sampled edge's seed position (the sources are the seeds below ``b``).
    """
    c = candidates.size(1)
    mine = target < b
    n = int(max(int(neighbour.max()) if neighbour.numel() else 0, int(candidates.max())) + 1)
    key = target[mine] * n + neighbour[mine]
    times = when[mine]
    order = torch.argsort(key, stable=True)
    key, times = key[order], times[order]
    wanted = (torch.arange(b).unsqueeze(1) * n + candidates).reshape(-1)
    lo = torch.searchsorted(key, wanted)
    hi = torch.searchsorted(key, wanted, right=True)
    count = (hi - lo).float()
    pair = torch.full((wanted.numel(), 3), float("inf"))
    pair[:, 0] = count
    if key.numel():
        unique, inverse = torch.unique_consecutive(key, return_inverse=True)
        newest = torch.zeros(unique.numel(), dtype=times.dtype).scatter_reduce_(
            0, inverse, times, "amax", include_self=False
        )
        oldest = torch.zeros(unique.numel(), dtype=times.dtype).scatter_reduce_(
            0, inverse, times, "amin", include_self=False
        )
        at = torch.searchsorted(unique, wanted).clamp(max=unique.numel() - 1)
        now = seed_time[:b].repeat_interleave(c)
        has = count > 0
        pair[has, 1] = (now - newest[at])[has].float()
        pair[has, 2] = (now - oldest[at])[has].float()
    return pair
