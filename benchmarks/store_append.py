"""1% new nodes and edges appended to the papers100M-sized folder, against preparing it whole.

Written by ``python benchmarks/figures.py store_append`` (the ``append`` block here, in
benchmarks/README.md; named only: it writes the 40 GiB folder ``on_disk_large`` trains from).
The folder is prepared afresh and timed (``gnnscale prepare``, the recipe's ``prepare.yaml`` at
111M nodes and 1.6B edges); a part of 1% new nodes (their features and labels) and 1% new edges
(between any nodes, old or new) is written as ``.npy`` arrays, not timed; the folder's pages
are evicted, and ``gnnscale append`` runs in a fresh process, timed whole (the Python start
included) and by its own count. A batch is then drawn from the grown folder, and the append is
undone (its files cut back and removed, the manifest restored), so that ``on_disk_large``
reuses the folder as prepared.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

import harness
import numpy as np
import torch
from blocks import REPO, Block, Section
from on_disk import evict
from on_disk_large import large_workdir, prepare_graph

from gnnscale.stores.manifest import Manifest

SHARE = 0.01  # of the folder's nodes and of its edges
DRAW = """
import sys, torch
from gnnscale import stores
from gnnscale.sampling import HopSampler
from torch_geometric.sampler import NodeSamplerInput
fs, gs = stores.open(sys.argv[1], verify="size")
first = int(sys.argv[2])  # the append's first edge id
torch.manual_seed(0)
seeds = torch.randint(0, fs.num_nodes[None], (1024,))
out = HopSampler((fs, gs), [15, 10]).sample_from_nodes(NodeSamplerInput(None, seeds))
print(out.edge.numel(), int((out.edge >= first).sum()))
"""


def write_part(part: Path, manifest: Manifest, seed: int = 0) -> dict[str, int]:
    """The ``.npy`` arrays of 1% new nodes and 1% new edges; their counts."""
    n, m = manifest.node_count(), manifest.edge_count()
    new_nodes, new_edges = int(n * SHARE), int(m * SHARE)
    rng = np.random.default_rng(seed)
    part.mkdir(parents=True)
    features = manifest.files["x"].shape[1]
    x = np.lib.format.open_memmap(part / "x.npy", "w+", np.float32, (new_nodes, features))
    for a in range(0, new_nodes, 1 << 18):
        b = min(a + (1 << 18), new_nodes)
        x[a:b] = rng.standard_normal((b - a, features), dtype=np.float32)
    x.flush()
    np.save(part / "y.npy", rng.integers(0, manifest.class_count(), new_nodes))
    index = np.lib.format.open_memmap(part / "edge_index.npy", "w+", np.int64, (2, new_edges))
    index[:] = rng.integers(0, n + new_nodes, (2, new_edges))
    index.flush()
    return {"nodes": new_nodes, "edges": new_edges}


def undo(folder: Path, before: Manifest) -> None:
    """Cut the grown files back, remove the append's parts, restore the manifest."""
    for name, entry in before.files.items():
        path = folder / f"{name}.bin"
        if entry.path is None and path.stat().st_size > entry.bytes:
            with path.open("r+b") as f:
                f.truncate(entry.bytes)
    for part in folder.glob("append*"):
        shutil.rmtree(part)
    (folder / "manifest.json").write_text(json.dumps(before.to_json(), indent=1))


def measure(size: str, workdir: Path) -> dict[str, float]:
    """Prepare afresh (timed), append 1% (timed), draw a batch, undo; the figures."""
    folder = workdir / "graph"
    shutil.rmtree(folder, ignore_errors=True)
    (folder.parent / f"{folder.name}.prepare_s").unlink(missing_ok=True)
    prepare_s = prepare_graph(folder, size)
    before = Manifest.read(folder)
    part = workdir / "append-part"
    shutil.rmtree(part, ignore_errors=True)
    counts = write_part(part, before)
    evict(folder)
    argv = [sys.executable, "-m", "gnnscale.cli", "append", f"--out={folder}", f"--root={part}"]
    done = harness.run(argv)
    own = float(re.search(r"in ([\d.]+) s", done.stdout)[1])  # type: ignore[index]
    grown = Manifest.read(folder)
    added = sum(  # the grown files' new bytes, and the append's own files
        e.bytes - (before.files[k].bytes if k in before.files else 0)
        for k, e in grown.files.items()
    )
    drawn = harness.run([sys.executable, "-c", DRAW, str(folder), str(before.edge_count())])
    edges, appended = (int(v) for v in drawn.stdout.split())
    undo(folder, before)
    shutil.rmtree(part)
    return {
        "nodes": before.node_count(),
        "edges": before.edge_count(),
        "new_nodes": counts["nodes"],
        "new_edges": counts["edges"],
        "prepare_s": prepare_s,
        "append_s": done.wall_s,
        "append_own_s": own,
        "written_gib": added / 2**30,
        "folder_gib": sum(e.bytes for e in before.files.values()) / 2**30,
        "drawn": edges,
        "drawn_appended": appended,
    }


def blocks(tiny: bool) -> list[Block]:
    """benchmarks/README.md's ``append`` block (``tiny``: a 50k-node check of the pipeline)."""
    if tiny:
        with tempfile.TemporaryDirectory() as workdir:
            r = measure("tiny", Path(workdir))
    else:
        r = measure("full", large_workdir())
    text = "\n".join(
        [
            "| figure | value |",
            "|---|---:|",
            f"| the folder: nodes / edges | {r['nodes']:,} / {r['edges']:,} |",
            "| `gnnscale prepare` of it, whole (streamed, checksummed) | "
            f"{r['prepare_s']:,.0f} s |",
            f"| appended: new nodes (features, labels) / new edges | {r['new_nodes']:,} / "
            f"{r['new_edges']:,} |",
            f"| `gnnscale append`, the whole command (Python's start included) | "
            f"{r['append_s']:,.1f} s ({r['append_s'] / r['prepare_s']:.1%} of the prepare) |",
            f"| of which the append itself (its own count) | {r['append_own_s']:,.1f} s "
            f"({r['append_own_s'] / r['prepare_s']:.1%}) |",
            f"| bytes it wrote / the folder's | {r['written_gib']:.2f} / "
            f"{r['folder_gib']:.1f} GiB |",
            f"| a [15, 10] batch of 1,024 seeds from the grown folder: edges / appended ones | "
            f"{r['drawn']:,} / {r['drawn_appended']:,} |",
            "",
            "The folder as `benchmarks/on_disk_large.py` prepares it (the on_disk_graph recipe's "
            "`prepare.yaml`), prepared afresh in the same run; the part (1% new nodes with 128 "
            "features and a label each, 1% new edges between any nodes, as `.npy`) written "
            "before, not timed; the folder's pages evicted before the append. The append is "
            "undone afterwards.",
        ]
    )
    if tiny:
        text = "**Tiny settings: a check of the pipeline, not figures.**\n\n" + text
    return [Block(REPO / "benchmarks" / "README.md", "append", text)]


if __name__ == "__main__":
    print(blocks(tiny="--tiny" in sys.argv)[0].text)


SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about=(
        "1% new nodes and edges appended to the papers100M-sized folder, against its prepare "
        "(about 15 minutes, 45 GiB of disk)"
    ),
    writes="append in benchmarks/README.md",
    threads=f"{torch.get_num_threads()} torch threads, one process at a time",
    on_request=True,
)
