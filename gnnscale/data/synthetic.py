"""A generated, learnable node-classification graph for tests, CPU smoke runs and scale studies.

PyG's ``FakeDataset`` draws labels at random and has no split masks, so nothing learns on it.
The graph here is a degree-corrected stochastic block model: every node gets a class and a
power-law degree propensity; an edge joins two nodes of the same class with probability
``homophily``; features are a class centroid buried in Gaussian noise. Features alone are a weak
signal (an MLP stays well below a GNN), neighbourhoods average the noise away.
:func:`write_streamed_synthetic` draws the same model chunk by chunk straight to a prepared folder
(``gnnscale.stores.writing``), for graphs larger than memory. The recommender graph
(:func:`make_recommender_graph`) is heterogeneous: users, items and categories.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor
from torch_geometric.data import Data, HeteroData
from torch_geometric.transforms import ToUndirected
from torch_geometric.utils import coalesce, remove_self_loops
from tqdm import tqdm

from gnnscale.errors import GroupSettingError
from gnnscale.memory import check_fits, graph_nbytes
from gnnscale.stores.manifest import CHECKS, FeatureDtype
from gnnscale.stores.writing import NodeChunk, write_node_chunks

__all__ = [
    "SyntheticGraph",
    "SyntheticRecommender",
    "make_item_class_graph",
    "make_recommender_graph",
    "make_synthetic_graph",
    "write_streamed_synthetic",
]


@dataclass(frozen=True)
class SyntheticGraph:
    """Size and difficulty of the generated graph (used when ``dataset: synthetic``).

    Args:
        num_nodes: Number of nodes.
        avg_degree: Mean number of (directed) edges per node after symmetrisation.
        num_features: Feature dimension.
        num_classes: Number of classes.
        homophily: Probability that an edge is drawn inside the source node's class.
        feature_noise: Standard deviation of the Gaussian noise added to unit class centroids;
            higher makes features alone less informative.
        degree_exponent: Power-law exponent of the degree propensities (> 2; smaller is more
            skewed).
        train_fraction: Fraction of nodes in the training split.
        val_fraction: Fraction of nodes in the validation split; the rest is the test split.
        seed: Random seed; the same settings and seed give the same graph.
    """

    num_nodes: int = 100_000
    avg_degree: float = 20.0
    num_features: int = 64
    num_classes: int = 10
    homophily: float = 0.8
    feature_noise: float = 6.0
    degree_exponent: float = 2.5
    train_fraction: float = 0.3
    val_fraction: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        """Refuse settings that cannot make a graph."""
        rules = {  # key: (holds, what it must be)
            "num_nodes": (self.num_nodes >= 2, ">= 2"),
            "avg_degree": (self.avg_degree > 0, "> 0"),
            "num_features": (self.num_features >= 1, ">= 1"),
            "num_classes": (
                2 <= self.num_classes <= self.num_nodes,
                f"between 2 and {{group}}.num_nodes ({self.num_nodes})",
            ),
            "homophily": (0.0 <= self.homophily <= 1.0, "between 0 and 1"),
            "feature_noise": (self.feature_noise >= 0, ">= 0"),
            "degree_exponent": (self.degree_exponent > 2, "> 2 (a finite mean degree)"),
            "train_fraction": (0 < self.train_fraction < 1, "between 0 and 1, exclusive"),
            "val_fraction": (
                0 <= self.val_fraction < 1 - self.train_fraction,
                f">= 0 and below 1 - train_fraction ({1 - self.train_fraction:g})",
            ),
        }
        for key, (holds, rule) in rules.items():
            if not holds:
                said = f"{{group}}.{key} must be {rule} (got {getattr(self, key)!r})"
                raise GroupSettingError(said, "synthetic")

    @property
    def nbytes(self) -> int:
        """Bytes of the generated graph in memory.

        A lower bound of what generating it takes (the edges are drawn, then coalesced).
        """
        num_edges = int(self.num_nodes * self.avg_degree)
        return graph_nbytes(self.num_nodes, num_edges, self.num_features)

    def check_fits(self, flag: str = "--data.synthetic") -> None:
        """Refuse, from the settings alone, a graph larger than this machine's memory.

        Args:
            flag: Where these settings were given (``--source.synthetic`` in a prepare).
        """
        check_fits(
            self.nbytes,
            "the generated graph",
            f"{flag}: {self.num_nodes:,} nodes x {self.num_features} float32 features, "
            f"about {int(self.num_nodes * self.avg_degree):,} edges",
            "generate it on disk (`gnnscale prepare --source Synthetic --out DIR`, the same "
            "settings as --source.synthetic.*) and train or plan with --data.dataset prepared "
            "--data.root DIR",
        )


def _sample_proportional(cdf: Tensor, low: Tensor, width: Tensor, g: torch.Generator) -> Tensor:
    # Inverse-CDF sampling: O(log N) per draw, much faster than torch.multinomial at 10^7 draws.
    r = low + torch.rand(low.shape, generator=g, dtype=cdf.dtype) * width
    return torch.searchsorted(cdf, r, right=True).clamp_(max=cdf.numel() - 1)


def make_synthetic_graph(cfg: SyntheticGraph) -> Data:
    """Generate the graph described by ``cfg``, with ``train_mask``, ``val_mask``, ``test_mask``."""
    g = torch.Generator().manual_seed(cfg.seed)
    n, c = cfg.num_nodes, cfg.num_classes
    y = torch.randint(c, (n,), generator=g)

    # Pareto propensities, capped so that one hub cannot hold a large share of all edges.
    theta = torch.rand(n, generator=g, dtype=torch.float64).pow_(-1 / (cfg.degree_exponent - 1))
    theta.clamp_(max=n**0.5)

    num_pairs = int(n * cfg.avg_degree / 2)
    cdf = theta.cumsum(0)
    total = cdf[-1]
    src = _sample_proportional(cdf, torch.zeros(num_pairs, dtype=cdf.dtype), total, g)

    # Same-class partner: sample within the source's class block of the class-sorted order.
    order = torch.argsort(y, stable=True)
    cdf_sorted = theta[order].cumsum(0)
    class_total = torch.zeros(c, dtype=cdf.dtype).index_add_(0, y, theta)
    class_start = class_total.cumsum(0) - class_total
    cls = y[src]
    same = _sample_proportional(cdf_sorted, class_start[cls], class_total[cls], g)
    same = order[same]
    other = _sample_proportional(cdf, torch.zeros(num_pairs, dtype=cdf.dtype), total, g)
    dst = torch.where(torch.rand(num_pairs, generator=g) < cfg.homophily, same, other)

    edge_index = torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
    edge_index, _ = remove_self_loops(edge_index)
    edge_index = coalesce(edge_index, num_nodes=n)

    centroids = torch.randn(c, cfg.num_features, generator=g)
    x = centroids[y].add_(torch.randn(n, cfg.num_features, generator=g), alpha=cfg.feature_noise)

    perm = torch.randperm(n, generator=g)
    num_train = max(1, int(cfg.train_fraction * n))
    num_val = int(cfg.val_fraction * n)
    masks = torch.zeros(3, n, dtype=torch.bool)
    masks[0, perm[:num_train]] = True
    masks[1, perm[num_train : num_train + num_val]] = True
    masks[2, perm[num_train + num_val :]] = True
    return Data(
        x=x, edge_index=edge_index, y=y, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2]
    )


def write_streamed_synthetic(
    cfg: SyntheticGraph,
    out: Path,
    feature_dtype: FeatureDtype = "bfloat16",
    chunk_nodes: int = 1 << 20,
) -> Path:
    """Generate a graph chunk by chunk straight to ``out``: memory bounded by one chunk.

    The same model as :func:`make_synthetic_graph` (homophilous edges, power-law degrees, class
    centroids in Gaussian noise), arranged so that no step needs the whole graph: node ``i`` has
    class ``i % num_classes``, so a same-class node is drawn without an index; each node draws
    its own in-neighbours (a power-law in-degree), so the CSC comes out in order. It is not the
    graph ``make_synthetic_graph`` draws from the same settings.

    Args:
        cfg: Size and difficulty (``num_nodes`` may exceed what fits in memory).
        out: The folder to create.
        feature_dtype: Dtype of the stored features (``bfloat16`` halves the file).
        chunk_nodes: Nodes generated per step; part of the graph's identity with ``cfg.seed``.
    """
    source = {
        "generator": "write_streamed_synthetic",
        "synthetic": asdict(cfg),
        "chunk_nodes": chunk_nodes,
    }
    n = cfg.num_nodes
    # The edges are drawn while writing: their expected count (capped Pareto in-degrees, at
    # least 1) is about avg_degree per node.
    return write_node_chunks(
        _streamed_chunks(cfg, chunk_nodes),
        out,
        source,
        n,
        cfg.num_features,
        cfg.num_classes,
        math.ceil(n * max(cfg.avg_degree, 1.0)),
        feature_dtype,
        checked=CHECKS,  # as drawn: ids in range, finite features, one split per node
    )


def _streamed_chunks(cfg: SyntheticGraph, chunk_nodes: int) -> Iterator[NodeChunk]:
    """:func:`write_streamed_synthetic`'s graph, ``chunk_nodes`` nodes at a time."""
    n, c = cfg.num_nodes, cfg.num_classes
    g = torch.Generator().manual_seed(cfg.seed)
    centroids = torch.randn(c, cfg.num_features, generator=g)
    # Mean of the capped Pareto propensity, to scale in-degrees to avg_degree on average.
    probe = torch.rand(1 << 20, generator=g, dtype=torch.float64)
    probe = probe.pow_(-1 / (cfg.degree_exponent - 1)).clamp_(max=n**0.5)
    scale = cfg.avg_degree / float(probe.mean())
    per_class = torch.tensor([(n - k + c - 1) // c for k in range(c)])  # nodes of class k
    num_train = max(1, int(cfg.train_fraction * n))
    num_val = int(cfg.val_fraction * n)
    starts = tqdm(range(0, n, chunk_nodes), desc="nodes", unit="chunk", mininterval=2)
    for index, a in enumerate(starts):
        b = min(a + chunk_nodes, n)
        gc = torch.Generator().manual_seed(cfg.seed * 1_000_003 + index + 1)
        ids = torch.arange(a, b)
        y = ids % c
        x = centroids[y].add_(
            torch.randn(b - a, cfg.num_features, generator=gc), alpha=cfg.feature_noise
        )
        theta = torch.rand(b - a, generator=gc, dtype=torch.float64)
        theta = theta.pow_(-1 / (cfg.degree_exponent - 1)).clamp_(max=n**0.5)
        degree = torch.poisson(theta * scale, generator=gc).long().clamp_(min=1)
        dst = torch.repeat_interleave(ids, degree)
        k = y[dst - a]
        same = k + c * (torch.rand(dst.numel(), generator=gc) * per_class[k]).long()
        other = torch.randint(n, (dst.numel(),), generator=gc)
        src = torch.where(torch.rand(dst.numel(), generator=gc) < cfg.homophily, same, other)
        src = torch.where(src == dst, (src + c) % n, src)  # no self-loops; same class
        u = torch.rand(b - a, generator=gc)  # splits by a uniform draw per node
        masks = (
            u < num_train / n,
            (u >= num_train / n) & (u < (num_train + num_val) / n),
            u >= (num_train + num_val) / n,
        )
        yield NodeChunk(x, y, masks, degree, src)


@dataclass(frozen=True)
class SyntheticRecommender:
    """Size and structure of the generated recommender graph (``LinkDataModule``'s default).

    Users, items and categories; every user and item belongs to one of ``num_communities``
    hidden communities, and a user's interactions fall inside its community with probability
    ``affinity`` (items drawn by a power-law popularity), else anywhere. Items carry noisy
    features (their community's centroid plus noise); users and categories have none. Each
    item is in one category, and categories nest in communities. Recommending the most popular
    items ignores the communities; a model must find them through the graph.

    Args:
        num_users: Users (featureless).
        num_items: Items (with ``num_features`` features).
        num_categories: Categories (featureless); at least ``num_communities``.
        num_communities: Hidden communities that users' interactions follow.
        interactions_per_user: Mean interactions (``user rates item`` edges) per user.
        affinity: Probability that an interaction stays in the user's community.
        num_features: Item feature dimension.
        feature_noise: Standard deviation of the noise on the items' unit community centroids.
        popularity_exponent: Power-law exponent of item popularity (> 2; smaller: more skewed).
        seed: Random seed; the same settings and seed give the same graph.
    """

    num_users: int = 20_000
    num_items: int = 10_000
    num_categories: int = 200
    num_communities: int = 50
    interactions_per_user: float = 20.0
    affinity: float = 0.8
    num_features: int = 32
    feature_noise: float = 3.0
    popularity_exponent: float = 2.5
    seed: int = 0

    def __post_init__(self) -> None:
        """Refuse settings that cannot make a graph."""
        rules = {  # key: (holds, what it must be)
            "num_users": (self.num_users >= 2, ">= 2"),
            "num_items": (self.num_items >= 2, ">= 2"),
            "num_communities": (
                1 <= self.num_communities <= min(self.num_users, self.num_items),
                "between 1 and the number of users and of items",
            ),
            "num_categories": (
                self.num_communities <= self.num_categories <= self.num_items,
                f"between {{group}}.num_communities ({self.num_communities}) and "
                f"{{group}}.num_items ({self.num_items})",
            ),
            "interactions_per_user": (self.interactions_per_user >= 2, ">= 2"),
            "affinity": (0.0 <= self.affinity <= 1.0, "between 0 and 1"),
            "num_features": (self.num_features >= 1, ">= 1"),
            "feature_noise": (self.feature_noise >= 0, ">= 0"),
            "popularity_exponent": (self.popularity_exponent > 2, "> 2 (a finite mean)"),
        }
        for key, (holds, rule) in rules.items():
            if not holds:
                said = f"{{group}}.{key} must be {rule} (got {getattr(self, key)!r})"
                raise GroupSettingError(said, "synthetic")


def make_recommender_graph(cfg: SyntheticRecommender) -> HeteroData:
    """Generate the graph ``cfg`` describes: ``user rates item`` and ``item in category`` edges.

    Both relations come with their reverses (``rev_rates``, ``rev_in``) so that messages flow
    both ways; ``data[t].community`` holds the planted communities (for analysis, never fed to a
    model).
    """
    g = torch.Generator().manual_seed(cfg.seed)
    k = cfg.num_communities
    user_c = torch.randint(k, (cfg.num_users,), generator=g)
    item_c = torch.randint(k, (cfg.num_items,), generator=g)
    pop = torch.rand(cfg.num_items, generator=g, dtype=torch.float64)
    pop = pop.pow_(-1 / (cfg.popularity_exponent - 1)).clamp_(max=cfg.num_items**0.5)

    counts = (
        1
        + torch.poisson(
            torch.full((cfg.num_users,), cfg.interactions_per_user - 1.0), generator=g
        ).long()
    )
    user = torch.repeat_interleave(torch.arange(cfg.num_users), counts)
    # In-community partner: sample within the user's community block of the sorted items.
    order = torch.argsort(item_c, stable=True)
    cdf_sorted = pop[order].cumsum(0)
    block = torch.zeros(k, dtype=pop.dtype).index_add_(0, item_c, pop)
    start = block.cumsum(0) - block
    c = user_c[user]
    inside = order[_sample_proportional(cdf_sorted, start[c], block[c], g)]
    cdf = pop.cumsum(0)
    anywhere = _sample_proportional(cdf, torch.zeros(user.numel(), dtype=cdf.dtype), cdf[-1], g)
    item = torch.where(torch.rand(user.numel(), generator=g) < cfg.affinity, inside, anywhere)
    rates = coalesce(torch.stack([user, item]))  # repeated interactions count once

    per_community = cfg.num_categories // k  # category j is in community j % k
    category = item_c + k * torch.randint(per_community, (cfg.num_items,), generator=g)

    centroids = torch.randn(k, cfg.num_features, generator=g)
    x = centroids[item_c].add_(
        torch.randn(cfg.num_items, cfg.num_features, generator=g), alpha=cfg.feature_noise
    )

    data = HeteroData()
    data["user"].num_nodes = cfg.num_users
    data["user"].community = user_c
    data["item"].x = x
    data["item"].community = item_c
    data["category"].num_nodes = cfg.num_categories
    data["user", "rates", "item"].edge_index = rates
    data["item", "in", "category"].edge_index = torch.stack([torch.arange(cfg.num_items), category])
    return ToUndirected()(data)


def make_item_class_graph(
    cfg: SyntheticRecommender, train_fraction: float = 0.3, val_fraction: float = 0.1
) -> HeteroData:
    """The recommender graph as node classification: each item's class is its community.

    An item's features are its community's centroid in noise (a weak signal alone); most of its
    raters rate items of its community, and its category lies in it, so its neighbourhood
    reveals the class. Items get ``y`` and ``train_mask``, ``val_mask``, ``test_mask`` (a random
    split by ``train_fraction`` and ``val_fraction``, the rest test); no other type is labelled.
    """
    data = make_recommender_graph(cfg)
    y = data["item"].community
    for store in data.node_stores:  # the planted answer is the label, not an input
        store.pop("community", None)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    perm = torch.randperm(cfg.num_items, generator=g)
    num_train = max(1, int(train_fraction * cfg.num_items))
    num_val = int(val_fraction * cfg.num_items)
    masks = torch.zeros(3, cfg.num_items, dtype=torch.bool)
    masks[0, perm[:num_train]] = True
    masks[1, perm[num_train : num_train + num_val]] = True
    masks[2, perm[num_train + num_val :]] = True
    item = data["item"]
    item.y, item.train_mask, item.val_mask, item.test_mask = y, *masks
    return data
