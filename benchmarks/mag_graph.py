"""The MAG240M-shaped heterogeneous graph of ``store_large``, written as a ``.npy`` folder.

Papers in 153 classes, each a centroid in noise that the features alone resolve about half the
time; citations and authorship homophilous; the reverse of every relation. Every paper cites 5
others, and how often a paper is cited has a heavy tail, as in MAG240M: within its field, a
paper's share of the citations follows a power law (counts fall as ``k^-2.5``, the exponent of
``gnnscale.data.synthetic``'s degrees), so that a cache of the most sampled papers' features
has a skew to exploit. Authors get 32 float16 features from their field (MAG240M's have none;
its baselines average their papers'), institutions none. Written chunk by chunk, so that the
paper features may exceed memory.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

CLASSES, PAPER_FEATURES, AUTHOR_FEATURES = 153, 768, 32
CITES, WRITES, AFFILIATED, HOMOPHILY = 5, 3, 1, 0.7
CITED_EXPONENT = 2.5  # P(a paper is cited k times) ~ k^-2.5 in the tail
SCATTER = 2_147_483_647  # a prime above any class's paper count: r -> r * SCATTER mod n is 1:1
# Nearest-centroid error between two classes is Q(sqrt(768 / 2) / noise): at 8, about 0.7% a
# pair, so the features alone place a paper in its class about half the time of 153.
PAPER_NOISE = 8.0
CHUNK = 1 << 18


def _same_class(rng: np.random.Generator, classes: np.ndarray, n: int) -> np.ndarray:
    """A random paper of each given class (paper ``i`` has class ``i % CLASSES``)."""
    per_class = (n - classes + CLASSES - 1) // CLASSES
    return classes + CLASSES * (rng.random(classes.size) * per_class).astype(np.int64)


def _cited(rng: np.random.Generator, classes: np.ndarray, n: int) -> np.ndarray:
    """A paper of each given class, drawn by popularity: heavy-tailed citation counts.

    Within a class, the paper of popularity rank ``r`` (of ``n // CLASSES``) is drawn with
    probability about ``r^(-1 / (CITED_EXPONENT - 1))``, so that the counts' tail falls as
    ``k^-CITED_EXPONENT``. Ranks are scattered over the class's papers by a fixed bijection, so
    that popular papers lie all over the feature file, not at its start.
    """
    per_class = n // CLASSES
    power = (CITED_EXPONENT - 1) / (CITED_EXPONENT - 2)  # inverse CDF of the rank density
    rank = (per_class * rng.random(classes.size) ** power).astype(np.int64)
    return classes + CLASSES * (rank * SCATTER % per_class)


def _edges(folder: Path, name: str, num_edges: int) -> np.ndarray:
    path = folder / "edges" / name
    path.mkdir(parents=True)
    return np.lib.format.open_memmap(path / "edge_index.npy", "w+", np.int64, (2, num_edges))


def write_graph(folder: Path, shape: dict[str, int], seed: int = 0) -> None:
    """The MAG240M-shaped graph as a ``.npy`` folder (gnnscale.stores.npy's layout)."""
    rng = np.random.default_rng(seed)
    n_p, n_a, n_i = shape["papers"], shape["authors"], shape["institutions"]
    for t in ("paper", "author"):
        (folder / "nodes" / t).mkdir(parents=True)
    centroids = rng.standard_normal((CLASSES, PAPER_FEATURES), dtype=np.float32)
    author_centroids = rng.standard_normal((CLASSES, AUTHOR_FEATURES), dtype=np.float32)
    x = np.lib.format.open_memmap(
        folder / "nodes" / "paper" / "x.npy", "w+", np.float16, (n_p, PAPER_FEATURES)
    )
    cites = _edges(folder, "paper__cites__paper", n_p * CITES)
    cited = _edges(folder, "paper__rev_cites__paper", n_p * CITES)
    for a in range(0, n_p, CHUNK):
        b = min(a + CHUNK, n_p)
        classes = np.arange(a, b) % CLASSES
        noise = rng.standard_normal((b - a, PAPER_FEATURES), dtype=np.float32)
        x[a:b] = centroids[classes] + PAPER_NOISE * noise
        citing = np.repeat(np.arange(a, b), CITES)
        field = np.where(
            rng.random(citing.size) < HOMOPHILY,
            citing % CLASSES,
            rng.integers(0, CLASSES, citing.size),
        )
        target = _cited(rng, field, n_p)
        cites[:, a * CITES : b * CITES] = citing, target
        cited[:, a * CITES : b * CITES] = target, citing
    np.save(folder / "nodes" / "paper" / "y.npy", np.arange(n_p) % CLASSES)
    ax = np.lib.format.open_memmap(
        folder / "nodes" / "author" / "x.npy", "w+", np.float16, (n_a, AUTHOR_FEATURES)
    )
    writes = _edges(folder, "author__writes__paper", n_a * WRITES)
    written = _edges(folder, "paper__rev_writes__author", n_a * WRITES)
    affiliated = _edges(folder, "author__affiliated_with__institution", n_a * AFFILIATED)
    members = _edges(folder, "institution__rev_affiliated_with__author", n_a * AFFILIATED)
    for a in range(0, n_a, CHUNK):
        b = min(a + CHUNK, n_a)
        classes = np.arange(a, b) % CLASSES  # an author's field
        noise = rng.standard_normal((b - a, AUTHOR_FEATURES), dtype=np.float32)
        ax[a:b] = author_centroids[classes] + 3.0 * noise
        src = np.repeat(np.arange(a, b), WRITES)
        same = _same_class(rng, src % CLASSES, n_p)
        dst = np.where(rng.random(src.size) < HOMOPHILY, same, rng.integers(0, n_p, src.size))
        writes[:, a * WRITES : b * WRITES] = src, dst
        written[:, a * WRITES : b * WRITES] = dst, src
        inst = rng.integers(0, n_i, b - a)
        affiliated[:, a:b] = np.arange(a, b), inst
        members[:, a:b] = inst, np.arange(a, b)
    for array in (x, ax, cites, cited, writes, written, affiliated, members):
        array.flush()
    perm = rng.permutation(n_p)  # MAG240M labels 0.6% of its papers: train 1%, 0.1% each
    train, val, test = np.split(
        perm[: n_p // 100 + n_p // 500], [n_p // 100, n_p // 100 + n_p // 1000]
    )
    for name, part in (("train", train), ("val", val), ("test", test)):
        np.save(folder / "nodes" / "paper" / f"{name}.npy", np.sort(part))
    (folder / "num_nodes.json").write_text(json.dumps({"institution": n_i}))


def features_alone(folder: Path) -> float:
    """Test accuracy of the nearest class centroid of the training papers' features."""
    x = np.load(folder / "nodes" / "paper" / "x.npy", mmap_mode="r")
    y = np.load(folder / "nodes" / "paper" / "y.npy", mmap_mode="r")
    train = np.load(folder / "nodes" / "paper" / "train.npy")
    test = np.load(folder / "nodes" / "paper" / "test.npy")
    sums = np.zeros((CLASSES, PAPER_FEATURES))
    np.add.at(sums, y[train], x[train].astype(np.float64))
    centroids = sums / np.maximum(np.bincount(y[train], minlength=CLASSES), 1)[:, None]
    xt = x[test].astype(np.float64)
    distance = (xt**2).sum(1)[:, None] - 2 * xt @ centroids.T + (centroids**2).sum(1)[None]
    return float((distance.argmin(1) == y[test]).mean())
