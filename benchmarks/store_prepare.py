"""Streaming prepare (a .npy folder, OGB's layout) at two sizes, and PyG's own loop over it.

Written by ``python benchmarks/figures.py store_prepare`` (on_disk_graph's ``store`` block):

- **Prepare**: a homogeneous graph (128 float32 features, 15 edges per node, labels, splits) is
  written as a ``.npy`` folder at two sizes, its pages evicted, then prepared by ``gnnscale
  prepare --source Npy --feature_dtype bfloat16`` in a fresh process (the cast makes it copy
  every feature row: the slow case; a float32 store would use ``x.npy`` where it lies). A
  sampler records the process's peak resident memory, and separately its private part
  (``RssAnon``; the rest are pages of the mapped files, which the kernel writes back and drops).
  Throughput is input bytes per second, against a plain sequential copy of the same files
  (evicted first too). The same graph is also written as OGB's ogbn-papers100M download
  unpacks (``raw/data.npz`` with float16 features and ``raw/node-label.npz``, both deflated as
  OGB saves them; ``split/time/*.csv.gz``) and prepared by ``--source Ogb --source.name
  ogbn-papers100M``, which inflates each member as a stream.
- **A plain PyG loop**: one epoch of PyG's ``GraphSAGE`` over ``NeighborLoader((fs, gs))`` on
  the smaller store, against the same loop on the graph in memory (its edges ordered as the
  store's, ``is_sorted=True``); the two epochs' batches are checked equal, batch by batch.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
import numpy as np
import torch
from blocks import Block, Section
from on_disk import evict_file

SIZES = {"full": (2_000_000, 6_000_000), "tiny": (20_000, 60_000)}  # nodes of the two graphs
FEATURES, DEGREE, CLASSES = 128, 15, 47


def write_inputs(folder: Path, n: int, seed: int = 0) -> int:
    """A random homophilous graph of ``n`` nodes as a .npy folder, written in chunks; its bytes."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, n)
    np.save(folder / "y.npy", y)
    centroids = rng.standard_normal((CLASSES, FEATURES), dtype=np.float32)
    x = np.lib.format.open_memmap(folder / "x.npy", "w+", np.float32, (n, FEATURES))
    edges = np.lib.format.open_memmap(folder / "edge_index.npy", "w+", np.int64, (2, n * DEGREE))
    step = 1 << 18
    for a in range(0, n, step):
        b = min(a + step, n)
        noise = rng.standard_normal((b - a, FEATURES), dtype=np.float32)
        x[a:b] = centroids[y[a:b]] + 2.0 * noise
        dst = np.repeat(np.arange(a, b), DEGREE)
        src = rng.integers(0, n, dst.size)
        edges[0, a * DEGREE : b * DEGREE] = src
        edges[1, a * DEGREE : b * DEGREE] = rng.permutation(dst)  # not sorted by destination
    x.flush()
    edges.flush()
    del x, edges
    perm = rng.permutation(n)
    parts = np.split(perm, [n // 10, n // 10 + n // 20])
    for name, part in zip(("train", "val", "test"), parts, strict=True):
        np.save(folder / f"{name}.npy", np.sort(part))
    return sum(p.stat().st_size for p in folder.iterdir())


def write_ogb(inputs: Path, root: Path) -> int:
    """The ``.npy`` folder ``inputs`` as OGB's ogbn-papers100M download unpacks; its bytes.

    Under ``root``: ``raw/data.npz`` (float16 features) and ``raw/node-label.npz``, deflated
    (``numpy.savez_compressed``, as OGB saves them), and ``split/time/*.csv.gz``.
    """
    folder = root / "ogbn_papers100M"
    (folder / "raw").mkdir(parents=True)
    (folder / "split" / "time").mkdir(parents=True)
    edges = np.load(inputs / "edge_index.npy", mmap_mode="r")  # written from the mapping
    x = np.load(inputs / "x.npy", mmap_mode="r").astype(np.float16)
    n, m = len(x), edges.shape[1]
    np.savez_compressed(
        folder / "raw" / "data.npz",
        edge_index=edges,
        node_feat=x,
        num_nodes_list=np.array([n]),
        num_edges_list=np.array([m]),
    )
    del x
    y = np.load(inputs / "y.npy").astype(np.float64)[:, None]
    np.savez_compressed(folder / "raw" / "node-label.npz", node_label=y)
    for ours, theirs in (("train", "train"), ("val", "valid"), ("test", "test")):
        split = np.load(inputs / f"{ours}.npy")
        np.savetxt(folder / "split" / "time" / f"{theirs}.csv.gz", split[:, None], fmt="%d")
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def prepare(inputs: Path, out: Path, dataset: str = "npy") -> dict[str, float]:
    """Prepare ``inputs`` into ``out`` in a fresh process, its pages evicted first.

    ``npy``: cast to bfloat16 (every feature row copied); OGB's layout: its float16 kept.
    """
    for path in _files(inputs):
        evict_file(path)
    source = ["--source=Npy"] if dataset == "npy" else ["--source=Ogb", f"--source.name={dataset}"]
    cli = [sys.executable, "-m", "gnnscale.cli", "prepare", *source]
    cli += [f"--source.root={inputs}", f"--out={out}"]
    cli += ["--feature_dtype=bfloat16"] if dataset == "npy" else []
    done = harness.run(cli, sample_s=0.05)
    assert done.memory is not None
    process = done.memory.processes[done.memory.root]  # its own, not its children's
    return {"s": done.wall_s, "rss_mb": process.rss_mb, "private_mb": process.anon_mb}


def copy(inputs: Path, out: Path) -> float:
    """Seconds to copy the input files sequentially (evicted first), flushed to disk."""
    for path in _files(inputs):
        evict_file(path)
    out.mkdir()
    start = time.perf_counter()
    for i, path in enumerate(_files(inputs)):
        shutil.copyfile(path, out / f"{i}-{path.name}")
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - start


def _digest(*tensors: torch.Tensor) -> str:
    """A batch's tensors as one hash: the epochs' batches compared without keeping them."""
    h = hashlib.blake2b(digest_size=16)
    for t in tensors:
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def pyg_loop(inputs: Path, store: Path) -> dict[str, float]:
    """One epoch of a plain PyG loop from the store and from memory; their batches compared."""
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader
    from torch_geometric.nn import GraphSAGE

    import gnnscale.stores
    from gnnscale.sampling import HopSampler

    edge_index = torch.from_numpy(np.load(inputs / "edge_index.npy"))
    order = edge_index[1].sort(stable=True).indices
    x = torch.from_numpy(np.load(inputs / "x.npy")).bfloat16()  # as stored
    data = Data(x=x, y=torch.from_numpy(np.load(inputs / "y.npy")), edge_index=edge_index[:, order])
    train = torch.from_numpy(np.load(inputs / "train.npy"))
    fs, gs = gnnscale.stores.open(store, verify="size")
    result, batches = {}, {}
    for name, source in (("memory", data), ("store", (fs, gs))):
        torch.manual_seed(0)
        model = GraphSAGE(FEATURES, 128, num_layers=2, out_channels=CLASSES)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
        loader = NeighborLoader(
            source,  # type: ignore[arg-type]
            num_neighbors=[15, 10],
            input_nodes=train,
            batch_size=1024,
            shuffle=True,
            is_sorted=name == "memory",
            # PyG's sampler, sampling in tensor operations: neither of PyG's backends is on PyPI
            neighbor_sampler=HopSampler(source, [15, 10], is_sorted=name == "memory"),
        )
        start, kept = time.perf_counter(), []
        for batch in loader:
            optimizer.zero_grad()
            out = model(batch.x.float(), batch.edge_index)[: batch.batch_size]
            loss = torch.nn.functional.cross_entropy(out, batch.y[: batch.batch_size])
            loss.backward()
            optimizer.step()
            kept.append(_digest(batch.n_id, batch.edge_index, batch.x))
        result[f"{name}_s"] = time.perf_counter() - start
        batches[name] = kept
    result["equal"] = float(batches["memory"] == batches["store"])
    result["batches"] = len(batches["store"])
    return result


def measure(size: str, workdir: Path) -> dict:
    """Both graphs prepared and copied; the plain loop on the smaller one."""
    rows = []
    for i, n in enumerate(SIZES[size]):
        inputs, ogb = workdir / f"inputs{i}", workdir / f"ogb{i}"
        sizes = {"npy": write_inputs(inputs, n, seed=i), "ogbn-papers100M": write_ogb(inputs, ogb)}
        for dataset, folder in (("npy", inputs), ("ogbn-papers100M", ogb)):
            copy_s = copy(folder, workdir / "copy")
            shutil.rmtree(workdir / "copy")
            out = workdir / f"store{i}-{dataset}"
            prepared = prepare(folder, out, dataset)
            row = {"n": n, "dataset": dataset, "input_gib": sizes[dataset] / 2**30}
            rows.append(row | {"copy_s": copy_s, **prepared})
            if i or dataset != "npy":
                shutil.rmtree(out)
        shutil.rmtree(ogb)
        if i:
            shutil.rmtree(inputs)
    return {"rows": rows, "loop": pyg_loop(workdir / "inputs0", workdir / "store0-npy")}


def blocks(tiny: bool) -> list[Block]:
    """on_disk_graph README's ``store`` block."""
    size = "tiny" if tiny else "full"
    base = Path(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(dir=base) as workdir:
        r = measure(size, Path(workdir))
    lines = [
        "| input | prepare | peak resident / private memory | throughput "
        "(prepare / sequential copy) |",
        "|---|---:|---:|---:|",
    ]
    kinds = {"npy": ".npy folder", "ogbn-papers100M": "OGB papers100M layout (deflated .npz)"}
    for row in r["rows"]:
        gib = row["input_gib"]
        lines.append(
            f"| {kinds[row['dataset']]}, {row['n']:,} nodes, {gib:.2f} GiB | {row['s']:.0f} s | "
            f"{row['rss_mb']:,.0f} / "
            f"{row['private_mb']:,.0f} MiB | {gib / row['s'] * 1024:,.0f} / "
            f"{gib / row['copy_s'] * 1024:,.0f} MiB/s ({row['copy_s'] / row['s']:.2f}x) |"
        )
    loop = r["loop"]
    lines += [
        "",
        f"A plain PyG loop (PyG's `GraphSAGE`, `NeighborLoader` with gnnscale's `HopSampler`, "
        "fan-out [15, 10], batches of "
        f"1,024 seeds, {loop['batches']} batches) over the {r['rows'][0]['n']:,}-node store: "
        f"{loop['store_s']:.1f} s/epoch from `(fs, gs)`, {loop['memory_s']:.1f} s/epoch on the "
        f"same graph in memory ({loop['store_s'] / loop['memory_s']:.2f}x); batches "
        f"{'equal, every one' if loop['equal'] else 'NOT EQUAL'} (node ids, edges, features).",
    ]
    return [Block(Path("recipes/on_disk_graph/README.md"), "store", "\n".join(lines))]


SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about=(
        "a .npy folder prepared by streaming at two sizes (peak memory, throughput against a"
        " plain copy), and a plain PyG loop over the store against the graph in memory (a "
        "few minutes)"
    ),
    writes="store in on_disk_graph's README",
    threads=f"{torch.get_num_threads()} torch threads, one process at a time",
    formerly=("store",),
)
