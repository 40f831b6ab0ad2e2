"""A generated interaction stream shaped like JODIE's Wikipedia and Reddit, for temporal links.

Users interact with items over time: most interactions repeat one of the user's recent items,
the rest find a new item in the user's current interest (a hidden community, which drifts),
drawn by popularity among the items that exist by then. Users act in bursts; new users and
items keep arriving; each interaction carries features (its item's community centroid, noisy).
Remembering who interacted with whom (EdgeBank) gets the repeats; ranking a user's recent items
above its older ones, and finding new items in its interest, takes a model.

:func:`read_interaction_stream` reads a user's own stream into the same layout: JODIE's CSV
(Wikipedia, Reddit, MOOC, LastFM as published: a header line, then per interaction the user,
the item, the time, a state label and the features, by position) or Parquet (columns ``src``,
``dst``, ``time``; every other numeric column a feature).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch_geometric.data import Data

from gnnscale.errors import ConfigError, GroupSettingError

__all__ = ["InteractionStream", "make_interaction_stream", "read_interaction_stream"]


@dataclass(frozen=True)
class InteractionStream:
    """Size and habits of the generated stream (``TemporalLinkDataModule``'s default).

    Args:
        num_users: Users.
        num_items: Items.
        num_events: Interactions, in time order.
        num_communities: Hidden interests that users' new items follow.
        repeat: Probability that an interaction repeats one of the user's recent items.
        burst: Probability that the next interaction is by the same user as the last one.
        drift: Probability, per interaction, that a user's interest moves to another community.
        affinity: Probability that a new item is from the user's interest, not anywhere.
        arriving: Fraction of users and of items that arrive during the stream, not at its start.
        num_features: Features per interaction.
        feature_noise: Standard deviation of the noise on the interactions' community centroids.
        seed: Random seed; the same settings and seed give the same stream.
    """

    num_users: int = 2_000
    num_items: int = 1_000
    num_events: int = 60_000
    num_communities: int = 20
    repeat: float = 0.7
    burst: float = 0.5
    drift: float = 0.01
    affinity: float = 0.9
    arriving: float = 0.3
    num_features: int = 8
    feature_noise: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        """Refuse settings that cannot make a stream."""
        rules = {  # key: (holds, what it must be)
            "num_users": (self.num_users >= 2, ">= 2"),
            "num_items": (self.num_items >= self.num_communities, ">= num_communities"),
            "num_events": (self.num_events >= 10, ">= 10"),
            "num_communities": (self.num_communities >= 1, ">= 1"),
            "num_features": (self.num_features >= 1, ">= 1"),
            "feature_noise": (self.feature_noise >= 0, ">= 0"),
        }
        for key in ("repeat", "burst", "drift", "affinity", "arriving"):
            rules[key] = (0.0 <= getattr(self, key) <= 1.0, "between 0 and 1")
        for key, (holds, rule) in rules.items():
            if not holds:
                said = f"{{group}}.{key} must be {rule} (got {getattr(self, key)!r})"
                raise GroupSettingError(said, "stream")


def make_interaction_stream(cfg: InteractionStream) -> Data:
    """Generate the stream ``cfg`` describes, in time order.

    Returns a ``Data`` of ``num_users + num_items`` nodes (users first): ``edge_index`` (user,
    item) per interaction, ``time`` (int64, ascending), ``edge_attr`` (float32 features),
    ``num_users``, and ``community`` per item (for analysis, never fed to a model).
    """
    rng = np.random.default_rng(cfg.seed)
    k, span = cfg.num_communities, cfg.num_events * 10
    user_arrival = np.where(rng.random(cfg.num_users) < cfg.arriving, rng.random(cfg.num_users), 0)
    item_arrival = np.where(rng.random(cfg.num_items) < cfg.arriving, rng.random(cfg.num_items), 0)
    user_arrival, item_arrival = (
        (user_arrival * 0.8 * span).astype(np.int64),
        (item_arrival * 0.8 * span).astype(np.int64),
    )
    item_community = np.arange(cfg.num_items) % k
    popularity = rng.pareto(1.5, cfg.num_items) + 1
    activity = rng.pareto(1.5, cfg.num_users) + 1
    interest = rng.integers(0, k, cfg.num_users)

    # Items of each community (and all of them) by arrival: the arrived ones are a prefix.
    def by_arrival(items: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        items = items[np.argsort(item_arrival[items], kind="stable")]
        return items, item_arrival[items], np.cumsum(popularity[items])

    pools = [by_arrival(np.flatnonzero(item_community == c)) for c in range(k)]
    everything = by_arrival(np.arange(cfg.num_items))
    users_order = np.argsort(user_arrival, kind="stable")
    users_cum = np.cumsum(activity[users_order])

    def draw(pool: tuple[np.ndarray, np.ndarray, np.ndarray], now: int) -> int:
        items, arrival, cum = pool
        n = max(int(np.searchsorted(arrival, now, side="right")), 1)
        return int(items[np.searchsorted(cum[:n], rng.random() * cum[n - 1], side="right")])

    gaps = rng.exponential(span / cfg.num_events, cfg.num_events)
    times = np.cumsum(gaps).astype(np.int64)
    src = np.empty(cfg.num_events, dtype=np.int64)
    dst = np.empty(cfg.num_events, dtype=np.int64)
    history: dict[int, list[int]] = {}
    user = -1
    for e, now in enumerate(times):
        if user < 0 or rng.random() >= cfg.burst:
            n = max(int(np.searchsorted(user_arrival[users_order], now, side="right")), 1)
            at = int(np.searchsorted(users_cum[:n], rng.random() * users_cum[n - 1], side="right"))
            user = int(users_order[min(at, n - 1)])
        if rng.random() < cfg.drift:
            interest[user] = rng.integers(0, k)
        past = history.setdefault(user, [])
        if past and rng.random() < cfg.repeat:
            back = min(int(rng.geometric(0.3)), len(past))  # recent items far more often
            item = past[-back]
        elif rng.random() < cfg.affinity:
            item = draw(pools[interest[user]], now)
        else:
            item = draw(everything, now)
        if item in past:
            past.remove(item)
        past.append(item)
        src[e], dst[e] = user, item

    centroids = rng.normal(size=(k, cfg.num_features))
    features = centroids[item_community[dst]] + cfg.feature_noise * rng.normal(
        size=(cfg.num_events, cfg.num_features)
    )
    return Data(
        edge_index=torch.from_numpy(np.stack([src, dst + cfg.num_users])),
        time=torch.from_numpy(times),
        edge_attr=torch.from_numpy(features.astype(np.float32)),
        num_nodes=cfg.num_users + cfg.num_items,
        num_users=cfg.num_users,
        community=torch.from_numpy(item_community),
    )


def read_interaction_stream(path: Path, flag: str = "--data.dataset") -> Data:
    """A stream of ``(source, destination, time, features)`` from ``path``, in time order.

    ``.csv``: JODIE's layout, by position after one header line (user, item, timestamp, state
    label, then features); ``.parquet``: columns ``src``, ``dst`` and ``time``, every other
    numeric column a feature (in the file's order). Sources and destinations are two id spaces
    (users and items, as in JODIE's and TGB's streams), each renumbered densely in id order:
    the result's nodes are the sources, then the destinations. Interactions of one time keep
    the file's order. The same layout as :func:`make_interaction_stream`'s. ``flag``: the
    option that named the file, for its errors.
    """
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{flag}: {path} is not a file (a .csv or .parquet stream)")
    try:
        if path.suffix == ".csv":
            table = pa_csv.read_csv(
                path, pa_csv.ReadOptions(skip_rows=1, autogenerate_column_names=True)
            )
            if table.num_columns < 3:
                raise ConfigError(
                    f"{path}: {table.num_columns} columns; JODIE's layout has user, item, "
                    "timestamp, state label, then features"
                )
            names = table.column_names
            src, dst, when = (table.column(n) for n in names[:3])
            features = names[4:]
        elif path.suffix == ".parquet":
            table = pq.read_table(path)
            missing = {"src", "dst", "time"} - set(table.column_names)
            if missing:
                raise ConfigError(
                    f"{path}: no column {', '.join(sorted(missing))} (needs src, dst, time)"
                )
            src, dst, when = (table.column(n) for n in ("src", "dst", "time"))
            features = [
                n
                for n in table.column_names
                if n not in ("src", "dst", "time")
                and (
                    pa.types.is_floating(table.schema.field(n).type)
                    or pa.types.is_integer(table.schema.field(n).type)
                )
            ]
        else:
            raise ConfigError(f"{flag}: {path} is neither .csv nor .parquet")
    except (pa.ArrowInvalid, OSError) as err:
        raise ConfigError(f"{path} is not a readable stream: {str(err).splitlines()[0]}") from err
    time = np.asarray(when.to_numpy(zero_copy_only=False))
    if time.size == 0 or not np.isfinite(time.astype(np.float64)).all():
        raise ConfigError(f"{path}: no interactions, or a time that is not a finite number")
    users, source = np.unique(np.asarray(src.to_numpy(zero_copy_only=False)), return_inverse=True)
    items, target = np.unique(np.asarray(dst.to_numpy(zero_copy_only=False)), return_inverse=True)
    order = np.argsort(time, kind="stable")
    if features:
        x = np.stack(
            [
                np.asarray(table.column(n).to_numpy(zero_copy_only=False), dtype=np.float32)
                for n in features
            ],
            1,
        )
    else:
        x = np.zeros((time.size, 0), dtype=np.float32)
    if not np.isfinite(x).all():
        raise ConfigError(f"{path}: a feature that is not a finite number")
    integral = np.issubdtype(time.dtype, np.integer) or bool((time == np.round(time)).all())
    time = time.astype(np.int64 if integral else np.float64)
    return Data(
        edge_index=torch.from_numpy(
            np.stack([source[order], target[order] + users.size]).astype(np.int64)
        ),
        time=torch.from_numpy(time[order]),
        edge_attr=torch.from_numpy(np.ascontiguousarray(x[order])),
        num_nodes=int(users.size + items.size),
        num_users=int(users.size),
    )
