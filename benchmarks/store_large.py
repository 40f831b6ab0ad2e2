"""A heterogeneous graph shaped like OGB-LSC MAG240M, its paper features larger than memory.

Written by ``python benchmarks/figures.py store_large`` (on_disk_graph's ``store_large`` block:
the node task) and ``store_large_links`` (its ``store_large_links`` block: the link task, from
``store_large_links.py``), each on a graph of its own; run only when named: about 50 GiB of
disk, an hour or more each, so that each half can run on its own. MAG240M has 244M papers
(768 float16 features, 175 GB), 122M authors, 26k institutions; papers cite papers (5.3 per
paper), authors write papers (3.2 per author) and are affiliated with institutions (0.36 per
author).
Here the same shape at a twelfth of the counts, 20M papers, so that the paper features alone
(29 GiB) exceed this machine's memory:

- the graph is written as a ``.npy`` folder chunk by chunk: papers in 153 classes, each a
  centroid in noise that the features alone resolve about half the time; citations and
  authorship homophilous, citation counts heavy-tailed (``mag_graph``); the reverse of every
  relation. Authors get 32 float16 features from their field (MAG240M's have none; its
  baselines average their papers'), institutions none (the model learns an embedding per
  institution);
- ``gnnscale prepare --source Npy`` streams it into a store: the CSC of each of the six edge
  types built out of core, the paper features used where they lie (float16, C-order);
- the disk's random 4-KiB read rate at depth 32 (``store_reads.disk_rate``, on the paper
  features), the rate the store's 32 reading threads can reach;
- ``gnnscale fit`` of the hetero recipe from the store (``dataset: prepared``, target
  ``paper``), two epochs of a bounded number of batches from a cold page cache, while a sampler
  records every process's private memory and another the device's reads per second; test
  accuracy on the test papers, beside the nearest class centroid of the training papers'
  features (the features alone);
- the same with every sampled paper projected before the first layer averages it
  (``project_after_mean=false``; by default the raw features are averaged first);
- the same with a feature cache of 10% of the paper features' bytes
  (``--data.feature_cache_gib``): its second epoch against the first run's;
- both again with the fit's memory limited (a memory cgroup of ``LIMIT_GIB``, the page cache
  included), so that the features are several times the memory the fit may use, not barely
  more: a second epoch here is served from the page cache in large part either way;
- (``store_large_links``) ``gnnscale fit`` of the link recipe on the papers' citations, one
  process and two ranks under ``torchrun``, two epochs of a bounded number of batches from a
  cold page cache: 0.01% of the citations held out for each of validation and test (streamed
  into a split folder once, by the first run), each held-out citation's source ranking 1,000
  papers drawn at random beside its true ones (only those are embedded), with uniform
  neighbours (PinSAGE's walks need the whole graph in memory); recall@20 beside the most
  cited papers'.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import harness
import numpy as np
import psutil
import torch
from blocks import REPO, Block, Section
from device_reads import DiskReads, disk_reads
from mag_graph import features_alone, write_graph
from on_disk import DDP, TORCHRUN
from store_reads import DEPTH, disk_rate

SHAPES = {  # papers, authors, institutions, batches trained, seed papers a batch
    "full": {
        "papers": 20_000_000,
        "authors": 10_000_000,
        "institutions": 2_200,
        "batches": 50,  # an epoch's; two epochs a fit, two fits
        "link_batches": 200,  # the link task's: at 50, it stays below the most cited papers
        "batch_size": 1024,
        "held_out": 1e-4,  # of the citations, each of validation and test: 10,000
    },
    # tiny: small batches, so that an epoch holds a whole accumulation of 2
    "tiny": {
        "papers": 20_000,
        "authors": 10_000,
        "institutions": 50,
        "batches": 5,
        "link_batches": 5,
        "batch_size": 64,
        "held_out": 0.01,
    },
}


def _evict(folder: Path) -> None:
    os.sync()  # a page not yet written back stays cached
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def fit(
    workdir: Path,
    store: Path,
    inputs: Path,
    shape: dict,
    name: str,
    *flags: str,
    task: str = "hetero_node_classification",
    ranks: int = 1,
    cgroup: Path | None = None,
) -> dict:
    """One ``gnnscale fit`` of ``task``'s recipe from the evicted store; its figures.

    ``hetero_node_classification`` classifies papers; ``link_prediction_pinsage`` predicts
    citations (:func:`_link_flags`). ``ranks``: 2 under ``torchrun``. ``cgroup``: a memory
    cgroup it runs in. Every file under ``workdir`` is evicted first: the inputs, the store and
    a link split's folder.
    """
    _evict(workdir)
    config = REPO / "recipes" / task / "config.yaml"
    save_dir = workdir / "runs" / name
    launch = [sys.executable, *(TORCHRUN if ranks > 1 else []), "-m", "gnnscale.cli", "fit"]
    epoch_reads = {"class_path": "device_reads.EpochReads", "init_args": {"path": str(store)}}
    profile = [  # how long the training loop waited for each batch, and trained on it
        "--trainer.profiler=lightning.pytorch.profilers.SimpleProfiler",
        f"--trainer.profiler.init_args.dirpath={save_dir}",
        "--trainer.profiler.init_args.filename=profile",
    ]
    task_flags = (
        ["--data.target_type=paper", "--trainer.limit_val_batches=2", *profile]
        if task == "hetero_node_classification"
        else [*_link_flags(workdir, shape), *(DDP if ranks > 1 else [])]
    )
    argv = [
        *launch,
        f"--config={config}",
        *task_flags,
        "--data.dataset=prepared",
        f"--data.root={store}",
        "--data.num_neighbors=[10,5]",
        "--data.verify=size",
        f"--data.batch_size={shape['batch_size']}",
        "--data.eval.batch_size=1024",
        "--trainer.max_epochs=2",
        f"--trainer.limit_train_batches={_batches(task, shape)}",
        "--trainer.enable_progress_bar=false",
        f"--trainer.logger.init_args.save_dir={save_dir}",
        f"--trainer.default_root_dir={workdir}",
        f"--trainer.callbacks+={json.dumps(epoch_reads)}",  # each epoch's reads of the disk
        *flags,
    ]
    paper_x = inputs / "nodes" / "paper" / "x.npy"  # used in place by the store
    before, disk = disk_reads(paper_x), DiskReads(paper_x)
    disk.start()
    try:
        done = harness.run(
            argv, logs=save_dir, env={"PYTHONPATH": _path()}, sample_s=0.5, cgroup=cgroup
        )
    finally:
        disk.done.set()
        disk.join()
    seconds = done.wall_s
    after = disk_reads(paper_x)
    metrics = done.metrics
    assert done.memory is not None
    # the trainer (each rank under torchrun) and, after it, its loader worker
    training = done.memory.at_depth(1 if ranks > 1 else 0)
    workers = done.memory.at_depth(2 if ranks > 1 else 1)
    busy = [r for r in disk.rates if r > 1000] or [0]
    figures = {
        "fit_s": seconds,
        "epoch_s": metrics["perf/epoch_s"],  # training alone: validation is timed apart
        "val_s": metrics.get("perf/val_s", []),
        "hit_rate": metrics.get("perf/cache_hit_rate", []),
        "device_reads": metrics["perf/device_reads"],  # each epoch's, its training alone
        "busy_reads_per_s": float(np.median(busy)),
        "reads_per_s": (after[0] - before[0]) / seconds,
        "private_mb": [max((p.anon_mb for p in g), default=0.0) for g in (training, workers)],
        "test": {k: v[-1] for k, v in metrics.items() if k.startswith("test/")},
        "loop": _loop(save_dir / "fit-profile.txt"),
    }
    print(f"store-large: {name}: {json.dumps(figures)}", flush=True)  # kept should a later fit fail
    return figures


def _loop(profile: Path) -> dict[str, float]:
    """Mean seconds a training batch waited for the loader, and spent in the training step."""
    if not profile.exists():  # no profiler asked (the link fits)
        return {}
    means = {}
    for line in profile.read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        for key, action in (("wait", "train_dataloader_next"), ("step", "run_training_batch")):
            if len(cells) > 3 and cells[1].endswith(action):
                means[key] = float(cells[2])
    return means


# One process times each part of a few cold batches of the node task, as the loader makes them:
# the neighbour lists read ahead (the store's threads), PyG's sampling from those lists, the
# features and labels gathered (the store's threads); then one training step's worth of model
# work is left out (the fit's s/batch minus these is what the trainer adds).
PHASES = """
import json, sys, time
import numpy as np, torch
from torch_geometric.loader import NeighborLoader
from torch_geometric.sampler import NodeSamplerInput
import gnnscale.stores
from gnnscale.sampling import HopSampler
from device_reads import disk_reads
store, seeds_file = sys.argv[1], sys.argv[2]
batches, batch_size = int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(2)
fs, gs = gnnscale.stores.open(store, verify="size", read_threads=32)
fanout = {a.edge_type: [10, 5] for a in gs.get_all_edge_attrs()}
# as the heterogeneous DataModule: its models read no edge features
sampler = HopSampler((fs, gs), fanout, edge_ids=False)
train = torch.from_numpy(np.load(seeds_file))
order = torch.randperm(train.numel(), generator=torch.Generator().manual_seed(0))
loader = NeighborLoader((fs, gs), num_neighbors=fanout, input_nodes=("paper", train),
                        batch_size=batch_size, neighbor_sampler=sampler)
phases = {"lists": 0.0, "sampling": 0.0, "features": 0.0}
reads = {k: 0 for k in phases}
nodes = 0
def timed(name, work):
    r, t = disk_reads(store)[0], time.perf_counter()
    out = work()
    phases[name] += time.perf_counter() - t
    reads[name] += disk_reads(store)[0] - r
    return out
for b in range(batches):
    index = order[b * batch_size:(b + 1) * batch_size]
    seeds = train[index]
    inputs = NodeSamplerInput(input_id=index, node=seeds, input_type="paper")
    timed("lists", lambda: gs.read_ahead({"paper": seeds}, fanout))
    sampler.store = None  # PyG's sampling alone, from the lists just read
    out = timed("sampling", lambda: sampler.sample_from_nodes(inputs))
    sampler.store = gs
    batch = timed("features", lambda: loader.filter_fn(out))
    nodes += sum(batch[t].num_nodes for t in batch.node_types)
print(json.dumps({"s": phases, "reads": reads, "nodes": nodes / batches}))
"""


PHASE_BATCHES = 5
LIMIT_GIB = 8.0  # the limited fits' memory, page cache included: the paper features 3.6x it
# The node fit again with every sampled paper projected before the first layer averages it
# (HeteroSAGE's default averages the raw features first: gnnscale.models.fast_hetero.target_only).
UNPROJECTED = "--model.init_args.project_after_mean=false"


def cold_batch_phases(workdir: Path, store: Path, inputs: Path, shape: dict) -> dict:
    """Seconds and device reads of each part of a cold batch, averaged over a few batches."""
    _evict(workdir)
    seeds, batches = inputs / "nodes" / "paper" / "train.npy", PHASE_BATCHES
    argv = [sys.executable, "-c", PHASES, str(store), str(seeds), str(batches)]
    done = harness.run([*argv, str(shape["batch_size"])], env={"PYTHONPATH": _path()})
    r = json.loads(done.stdout)
    return {
        "s": {k: v / batches for k, v in r["s"].items()},
        "reads": {k: v / batches for k, v in r["reads"].items()},
        "nodes": r["nodes"],
    }


def _phases(r: dict) -> str:
    return " / ".join(f"{r['s'][k]:.2f} s ({r['reads'][k]:,.0f})" for k in r["s"])


def _path() -> str:
    """The benchmarks folder and the repository, for the phase script's imports."""
    return os.pathsep.join([str(REPO / "benchmarks"), str(REPO), os.environ.get("PYTHONPATH", "")])


# The link task: the papers' citations, 1,000 papers ranked for each held-out citation's source
# (every paper's embedding is out of reach at this size), the recipe's monitor renamed so.
LINK_CANDIDATES = 1000
LINK_METRIC = f"recall@20_of{LINK_CANDIDATES}"
LINK_CALLBACKS = f"""trainer:
  callbacks:
    - class_path: gnnscale.callbacks.ThroughputMonitor
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{monitor: val/{LINK_METRIC}, mode: max}}
"""


def _link_flags(workdir: Path, shape: dict) -> list[str]:
    callbacks = workdir / "link_callbacks.yaml"
    callbacks.write_text(LINK_CALLBACKS)
    return [
        f"--config={callbacks}",
        "--data.edge_type=[paper,cites,paper]",
        "--data.neighbors=uniform",  # PinSAGE's walks need the whole graph in memory
        f"--data.split.val_fraction={shape['held_out']}",
        f"--data.split.test_fraction={shape['held_out']}",
        f"--data.eval.candidates={LINK_CANDIDATES}",
        "--data.num_hard_negatives=0",  # a recommender's setting (the recipe's README)
        "--model.init_args.popularity_prior=true",  # citation counts have a heavy tail
    ]


def _batches(task: str, shape: dict) -> int:
    """Training batches an epoch of ``task``."""
    return shape["batches" if task == "hetero_node_classification" else "link_batches"]


def node_fits(workdir: Path, store: Path, inputs: Path, shape: dict, x_gib: float) -> dict:
    """The node task's fits: as shipped, unprojected, cold phases, cached, memory-limited."""
    r = {"plain": fit(workdir, store, inputs, shape, "plain")}
    r["unprojected"] = fit(workdir, store, inputs, shape, "unprojected", UNPROJECTED)
    r["phases"] = cold_batch_phases(workdir, store, inputs, shape)
    r["cache_gib"] = 0.1 * x_gib
    cache = f"--data.feature_cache_gib={r['cache_gib']:.4f}"
    r["cached"] = fit(workdir, store, inputs, shape, "cached", cache)
    with harness.memory_limit(LIMIT_GIB) as group:
        if group is not None:
            r["limited"] = fit(workdir, store, inputs, shape, "limited", cgroup=group)
            r["limited_cached"] = fit(
                workdir, store, inputs, shape, "limited_cached", cache, cgroup=group
            )
    return r


def measure(size: str, workdir: Path, links: bool) -> dict:
    """Write, prepare, train; every figure of the node task's block, or (``links``) the link's.

    Each writes its own graph: on a slow disk either takes over an hour.
    """
    shape = SHAPES[size]
    inputs, store = workdir / "inputs", workdir / "store"
    start = time.perf_counter()
    write_graph(inputs, shape)
    r: dict = {"write_s": time.perf_counter() - start}
    r["x_gib"] = (inputs / "nodes" / "paper" / "x.npy").stat().st_size / 2**30
    r["inputs_gib"] = sum(p.stat().st_size for p in inputs.rglob("*") if p.is_file()) / 2**30
    _evict(inputs)
    cli = [sys.executable, "-m", "gnnscale.cli"]
    prepare = [*cli, "prepare", "--source=Npy", f"--source.root={inputs}", f"--out={store}"]
    done = harness.run(prepare, sample_s=0.2)
    assert done.memory is not None
    r["prepare_s"] = done.wall_s
    r["prepare_private_mb"] = max((p.anon_mb for p in done.memory.processes.values()), default=0.0)
    r["store_gib"] = sum(p.stat().st_size for p in store.rglob("*") if p.is_file()) / 2**30
    r["perm_types"] = len(list(store.glob("*/perm.bin")))
    _evict(inputs)
    r["deep"] = disk_rate(
        inputs / "nodes" / "paper" / "x.npy", DEPTH, 1.0 if size == "tiny" else 15.0
    )
    if links:
        for ranks in (1, 2):
            r[f"links_{ranks}"] = fit(
                workdir, store, inputs, shape, f"links_{ranks}", task="link_prediction_pinsage",
                ranks=ranks,
            )  # fmt: skip
    else:
        r |= node_fits(workdir, store, inputs, shape, r["x_gib"])
    r["deep_after"] = disk_rate(
        inputs / "nodes" / "paper" / "x.npy", DEPTH, 1.0 if size == "tiny" else 15.0
    )
    r["test_papers"] = len(np.load(inputs / "nodes" / "paper" / "test.npy"))
    r["bar"] = features_alone(inputs)
    r["ram_gib"] = psutil.virtual_memory().total / 2**30
    return r


def _limited_row(r: dict, batches: int) -> str:
    """The cache's row again, the fit's memory limited to ``LIMIT_GIB`` (where it could be)."""
    what = (
        f"| the same, the fit's memory limited to {LIMIT_GIB:.0f} GiB (a memory cgroup, the "
        f"page cache included: the paper features {r['x_gib'] / LIMIT_GIB:.1f}x it): s/batch, "
        "second epoch, without / with the cache |"
    )
    if "limited" not in r:
        return f"{what} not measured: no memory cgroup (v1) this process may make |"
    plain, cached = r["limited"]["epoch_s"][1], r["limited_cached"]["epoch_s"][1]
    return (
        f"{what} {plain / batches:.2f} / {cached / batches:.2f} ({plain / cached:.2f}x as fast; "
        f"{r['limited_cached']['hit_rate'][-1]:.0%} of rows held; device reads a batch "
        f"{_saved(r['limited'], r['limited_cached'], batches)}) |"
    )


def _saved(plain: dict, cached: dict, batches: int) -> str:
    """Device reads a second-epoch batch without / with the cache, and the share saved."""
    without, with_cache = (f["device_reads"][1] / batches for f in (plain, cached))
    saved = f"{1 - with_cache / without:.0%} fewer" if without else "none without it"
    return f"{without:,.0f} / {with_cache:,.0f} ({saved})"


def _measured(tiny: bool, links: bool) -> dict:
    size = "tiny" if tiny else "full"
    base = Path(os.environ.get("GNNSCALE_LARGE_DIR", tempfile.gettempdir()))
    if not tiny and shutil.disk_usage(base).free < 60 * 2**30:
        raise RuntimeError(f"{base} has under 60 GiB free; set GNNSCALE_LARGE_DIR to a larger disk")
    with tempfile.TemporaryDirectory(dir=base, prefix="gnnscale-store-large-") as workdir:
        return measure(size, Path(workdir), links)


def _block(tiny: bool, name: str, text: str) -> list[Block]:
    if tiny:
        text += "\n\n**Tiny settings: a check of the pipeline, not figures.**"
    return [Block(Path("recipes/on_disk_graph/README.md"), name, text)]


def blocks(tiny: bool) -> list[Block]:
    """on_disk_graph README's ``store_large`` block: the node task (``tiny``: a check)."""
    r, s = _measured(tiny, links=False), SHAPES["tiny" if tiny else "full"]
    plain, cached, batches, size = r["plain"], r["cached"], s["batches"], f"{s['batch_size']:,}"
    raw = r["unprojected"]
    deep = float(np.median([r["deep"], r["deep_after"]]))
    second = plain["epoch_s"][1] / cached["epoch_s"][1]
    text = "\n".join(
        [
            "| figure | value |",
            "|---|---:|",
            f"| papers / authors / institutions | {s['papers']:,} / {s['authors']:,} / "
            f"{s['institutions']:,} |",
            f"| paper features (768 float16) / this machine's memory | {r['x_gib']:.1f} / "
            f"{r['ram_gib']:.1f} GiB |",
            f"| `.npy` inputs written (features, six edge types, labels, splits) | "
            f"{r['inputs_gib']:.1f} GiB in {r['write_s']:,.0f} s |",
            f"| `gnnscale prepare --source Npy` (features used in place; edge ids kept for "
            f"the {r['perm_types']} of 6 edge types not listed by destination) | "
            f"{r['prepare_s']:,.0f} s, "
            f"{r['store_gib']:.1f} GiB written, peak private memory "
            f"{r['prepare_private_mb']:,.0f} MiB |",
            f"| `gnnscale fit`, whole run (2 epochs of {batches} batches of {size} papers, the "
            f"first cold; validation, test) | {plain['fit_s']:,.0f} s |",
            f"| s/batch, first epoch (cold page cache) / second | "
            f"{plain['epoch_s'][0] / batches:.2f} / {plain['epoch_s'][1] / batches:.2f} |",
            f"| where a cold batch goes, in one process (the first {PHASE_BATCHES} after "
            f"eviction): neighbour lists read ahead / PyG's sampling from them / features and "
            f"labels gathered (device reads each) | {_phases(r['phases'])} |",
            f"| the training loop, a batch of both epochs: waiting for the loader / in the "
            f"training step | {plain['loop']['wait']:.2f} / {plain['loop']['step']:.2f} s |",
            f"| every sampled paper projected before the first layer averages it (`{UNPROJECTED}`"
            f"): s in the training step, a batch / s/batch, first / second epoch (device "
            f"reads/s while busy) | {raw['loop']['step']:.2f} against the default's "
            f"{plain['loop']['step']:.2f} / {raw['epoch_s'][0] / batches:.2f} / "
            f"{raw['epoch_s'][1] / batches:.2f} ({raw['busy_reads_per_s']:,.0f}) |",
            f"| device reads/s while busy / the disk's random 4-KiB rate at depth 32 | "
            f"{plain['busy_reads_per_s']:,.0f} / {deep:,.0f} "
            f"({plain['busy_reads_per_s'] / deep:.0%}) |",
            f"| with a feature cache of 10% of the paper features ({r['cache_gib']:.2f} GiB): "
            f"s/batch, second epoch / whole run | {cached['epoch_s'][1] / batches:.2f} "
            f"({second:.2f}x as fast as without, the disk reading "
            f"{cached['busy_reads_per_s']:,.0f}/s while busy against "
            f"{plain['busy_reads_per_s']:,.0f}; "
            f"{cached['hit_rate'][-1]:.0%} of rows held) / "
            f"{cached['fit_s']:,.0f} s |",
            f"| device reads a batch in the second epoch, without / with the cache (a cache "
            f"saves at most the share of rows it holds) | {_saved(plain, cached, batches)} |",
            _limited_row(r, batches),
            f"| peak private memory, trainer / loader worker (with the cache) | "
            f"{plain['private_mb'][0]:,.0f} / {plain['private_mb'][1]:,.0f} MiB "
            f"({cached['private_mb'][0]:,.0f} / {cached['private_mb'][1]:,.0f}) |",
            f"| test accuracy ({r['test_papers']:,} papers) / features alone | "
            f"{plain['test']['test/acc']:.3f} / {r['bar']:.3f} |",
        ]
    )
    return _block(tiny, "store_large", text)


SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about=(
        "a heterogeneous graph shaped like MAG240M, its paper features larger than memory, "
        "written as .npy, prepared by streaming and trained from the store: papers "
        "classified (about an hour, 60 GiB of disk)"
    ),
    writes="store_large in on_disk_graph's README",
    threads=f"{torch.get_num_threads()} torch threads, 1 loader worker",
    on_request=True,
    formerly=("store-large",),
)
