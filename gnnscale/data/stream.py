"""A generated interaction stream shaped like JODIE's Wikipedia and Reddit, for temporal links.

Users interact with items over time: most interactions repeat one of the user's recent items,
the rest find a new item in the user's current interest (a hidden community, which drifts),
drawn by popularity among the items that exist by then. Users act in bursts; new users and
items keep arriving; each interaction carries features (its item's community centroid, noisy).
Remembering who interacted with whom (EdgeBank) gets the repeats; ranking a user's recent items
above its older ones, and finding new items in its interest, takes a model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch_geometric.data import Data

from gnnscale.errors import GroupSettingError

__all__ = ["InteractionStream", "make_interaction_stream"]


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
