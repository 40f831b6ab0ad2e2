"""The recipes under ``recipes/``, listed once.

The smoke tests, ``gnnscale plan``'s check, the README writer and the benchmarks all read this
list (torchtune's ``_recipe_registry.py``), so adding a recipe is one entry here plus its folder.
It describes a checkout of the repository: the paths point into ``recipes/`` beside the package.

Each entry says how to run the recipe small (``tiny``: CPU, seconds, for tests and for checking
the figure pipeline) and which runs its README's table shows (``variants``; the first is the
recipe as shipped). ``figure_args`` shortens a recipe whose shipped run would take too long to
measure here; the tables print those arguments beside the figures.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["CORA_RAW", "RECIPES", "REPO", "Recipe", "offline_cora", "recipe"]

REPO = Path(__file__).resolve().parents[1]
# The offline copy of Cora's raw files beside a checkout (``../shared`` in CI): tests and the
# figures read Cora from it, as users who are online download it.
CORA_RAW = REPO.parent / "shared" / "datasets" / "Planetoid" / "Cora" / "raw"


def offline_cora(data: Path) -> None:
    """Copy Cora's raw files into the data folder ``data`` (Planetoid reads them offline)."""
    cora = data / "Cora" / "raw"
    if CORA_RAW.is_dir() and not cora.exists():
        shutil.copytree(CORA_RAW, cora)


# A generated graph of 3,000 nodes where the features alone are a weak signal (the smoke tests
# measure a features-only baseline on it), loaders in the main process.
_TINY_GRAPH = (
    "--data.init_args.synthetic.num_nodes=3000",
    "--data.init_args.synthetic.num_features=32",
    "--data.init_args.synthetic.num_classes=5",
    "--data.init_args.synthetic.train_fraction=0.3",
    "--data.init_args.synthetic.val_fraction=0.1",
)
_NO_WORKERS = (
    "--data.init_args.loader.num_workers=0",
    "--data.init_args.loader.persistent_workers=false",
)
_TINY_SAGE = (
    *_TINY_GRAPH,
    *_NO_WORKERS,
    "--model.init_args.hidden_channels=64",
    "--model.init_args.optimizer.init_args.lr=0.01",
    "--trainer.max_epochs=4",
)


@dataclass(frozen=True)
class Recipe:
    """One scaling scenario: a folder ``recipes/<name>/`` with ``config.yaml`` and a README.

    Args:
        name: The folder's name.
        technique: What it teaches, in a few words (the README's recipe table).
        tiny: CLI overrides that make it a CPU run of seconds on a generated graph.
        variants: README table rows: a label and the overrides of each (first: as shipped).
        figure_args: Overrides for every measured run, when the shipped run is too long here.
        processes: Training processes of one run (DDP ranks on one machine).
        tiny_prepare: Overrides of its ``prepare.yaml`` (if it has one) for the tiny run.
        prepare_command: The subcommand that runs its ``prepare.yaml``: ``prepare`` (one graph)
            or ``prepare-graphs`` (many small graphs).
        prepare_first: Whether its shipped config trains on what ``prepare.yaml`` writes; if
            not, the ``prepare.yaml`` is its README's optional from-disk variant.
        seeds: Runs per variant at least (``figures.py recipes --seeds`` may ask for more):
            a recipe of seconds compares with a paper's figure as a mean over seeds.
        task: ``node`` (metric ``test/acc``), ``hetero_node`` (one node type of a
            heterogeneous graph, metric ``test/acc``), ``graph`` (graph-level regression, metric
            ``test/mae``), ``link`` (metric ``test/recall@20`` beside the popularity
            baseline's) or ``temporal_link`` (metric ``test/mrr`` beside EdgeBank's and
            popularity's).
        planned: Whether ``gnnscale plan`` models its batches (its table shows the prediction).
    """

    name: str
    technique: str
    tiny: tuple[str, ...]
    variants: tuple[tuple[str, tuple[str, ...]], ...] = (("as shipped", ()),)
    figure_args: tuple[str, ...] = ()
    processes: int = 1
    tiny_prepare: tuple[str, ...] = ()
    prepare_command: Literal["prepare", "prepare-graphs"] = "prepare"
    prepare_first: bool = True
    task: Literal["node", "hetero_node", "graph", "link", "temporal_link"] = "node"
    seeds: int = 1
    planned: bool = True

    @property
    def folder(self) -> Path:
        """``recipes/<name>`` in this checkout."""
        return REPO / "recipes" / self.name

    @property
    def config(self) -> Path:
        """The recipe's ``config.yaml``."""
        return self.folder / "config.yaml"

    @property
    def script(self) -> Path | None:
        """The recipe's ``train.py``, for a model YAML cannot name; ``None`` if it has none."""
        path = self.folder / "train.py"
        return path if path.exists() else None

    @property
    def prepare_config(self) -> Path | None:
        """The ``prepare.yaml`` its shipped config needs run first (``gnnscale prepare``)."""
        path = self.folder / "prepare.yaml"
        return path if path.exists() and self.prepare_first else None

    def prepare_argv(self, *overrides: str) -> list[str]:
        """The ``gnnscale prepare`` command its README runs before training."""
        assert self.prepare_config is not None, f"{self.name} has no prepare.yaml"
        config = ["--config", str(self.prepare_config)]
        return [sys.executable, "-m", "gnnscale.cli", self.prepare_command, *config, *overrides]

    def argv(self, subcommand: str, *overrides: str) -> list[str]:
        """The command that runs it in a new process, as its README says: ``python ...``."""
        entry = [str(self.script)] if self.script else ["-m", "gnnscale.cli"]
        return [sys.executable, *entry, subcommand, "--config", str(self.config), *overrides]


RECIPES: tuple[Recipe, ...] = (
    Recipe(
        "planetoid",
        "full batch on Cora's public split, the models' defaults: the accuracy reference",
        # Cora needs its files (downloaded, or ../shared offline); the smoke run uses a graph.
        # GATv2's Cora settings (dropout 0.6, lr 0.005) need far more than 30 epochs there; the
        # graph's features are Gaussian, not word counts to normalise.
        tiny=(
            "--data.init_args.dataset=synthetic",
            *_TINY_GRAPH,
            "--data.init_args.preprocess.normalize_features=false",
            "--trainer.max_epochs=30",
            "--model.init_args.dropout=0.2",
            "--model.init_args.attention_dropout=0",
            "--model.init_args.optimizer=torch.optim.Adam",
            "--model.init_args.optimizer.init_args.lr=0.01",
        ),
    ),
    Recipe(
        "neighbor_sage",
        "neighbour sampling (NeighborLoader), GraphSAGE",
        # 900 training nodes: 4 batches an epoch, so its accumulation of 2 steps twice.
        tiny=(*_TINY_SAGE, "--data.init_args.batch_size=256"),
    ),
    Recipe(
        "cluster_gcn",
        "Cluster-GCN (METIS parts, ClusterLoader)",
        tiny=(*_TINY_SAGE, "--data.init_args.num_parts=20"),
        variants=(
            ("2 layers", ()),
            # the sampled validation's fan-out: one entry per layer
            (
                "4 layers",
                (
                    "--model.init_args.num_layers=4",
                    "--data.init_args.eval.num_neighbors=[15,10,10,10]",
                ),
            ),
        ),
    ),
    Recipe(
        "graphsaint",
        "GraphSAINT subgraphs with node_norm",
        tiny=(*_TINY_SAGE, "--data.init_args.batch_size=300", "--data.init_args.num_steps=6"),
        variants=(
            ("random walk (roots 3000, length 2)", ()),
            (
                "node (6000 nodes)",
                ("--data.init_args.sampler=node", "--data.init_args.batch_size=6000"),
            ),
        ),
    ),
    Recipe(
        "gat_attention_memory",
        "edge-wise GATv2 attention, never a dense N × N tensor",
        tiny=(
            "--data.init_args.synthetic.num_nodes=600",
            "--model.init_args.hidden_channels=64",
            "--trainer.max_epochs=30",
        ),
    ),
    Recipe(
        "sparse_embeddings",
        "a learned embedding per node, sparse gradients and SparseAdam",
        tiny=(
            "--data.init_args.synthetic.num_nodes=3000",
            "--data.init_args.synthetic.num_classes=5",
            "--data.init_args.batch_size=128",
            *_NO_WORKERS,
            "--model.init_args.embedding_dim=32",
            "--model.init_args.hidden_channels=64",
            "--trainer.max_epochs=4",
        ),
        # As shipped, 10 epochs of 586 batches: the figures train 2 epochs of 150.
        figure_args=("--trainer.max_epochs=2", "--trainer.limit_train_batches=150"),
        variants=(
            ("as shipped (exact layer-wise test)", ()),
            ("test sampled around each test node", ("--data.init_args.eval.mode=sampled",)),
        ),
    ),
    Recipe(
        "multi_gpu_ddp",
        "DDP, 2 processes sharing the forked graph, count-reduced accuracy",
        tiny=(
            *_TINY_GRAPH,
            "--data.init_args.batch_size=128",
            "--model.init_args.hidden_channels=64",
            "--model.init_args.optimizer.init_args.lr=0.02",
            "--trainer.max_epochs=4",
        ),
        figure_args=("--trainer.accelerator=cpu",),
        processes=2,
        variants=(
            ("as shipped (exact layer-wise test, a block of nodes per process)", ()),
            (
                "test sampled at full fan-out, a share of nodes per process",
                ("--data.init_args.eval.mode=sampled",),
            ),
        ),
    ),
    Recipe(
        "on_disk_graph",
        "a graph prepared on disk once, memory-mapped and shared by every process",
        tiny=(
            *_NO_WORKERS,
            "--data.init_args.batch_size=128",
            "--model.init_args.hidden_channels=64",
            "--model.init_args.optimizer.init_args.lr=0.01",
            "--trainer.max_epochs=4",
        ),
        tiny_prepare=(
            "--source.synthetic.num_nodes=3000",
            "--source.synthetic.avg_degree=12",
            "--source.synthetic.num_features=32",
            "--source.synthetic.num_classes=5",
            "--source.synthetic.feature_noise=4.0",
            "--source.synthetic.train_fraction=0.3",
            "--source.synthetic.val_fraction=0.1",
        ),
        variants=(
            ("as shipped (exact layer-wise test)", ()),
            ("test sampled around each test node", ("--data.init_args.eval.mode=sampled",)),
        ),
    ),
    Recipe(
        "link_prediction_pinsage",
        "link prediction on users, items and categories: PinSAGE neighbours, hard negatives",
        tiny=(
            "--data.init_args.synthetic.num_users=2000",
            "--data.init_args.synthetic.num_items=800",
            "--data.init_args.synthetic.num_categories=40",
            "--data.init_args.synthetic.num_communities=8",
            "--data.init_args.batch_size=256",
            *_NO_WORKERS,
            "--trainer.max_epochs=4",
        ),
        variants=(
            ("PinSAGE neighbours", ()),
            ("uniform neighbours", ("--data.init_args.neighbors=uniform",)),
        ),
        prepare_first=False,  # its prepare.yaml: the from-disk variant (figures.py store_tasks)
        task="link",
    ),
    Recipe(
        "link_prediction_citations",
        "link prediction on a citation graph (Cora): the graph auto-encoder's GCN layers",
        # Cora itself, from its files (downloaded, or ../shared offline): seconds an epoch.
        tiny=("--trainer.max_epochs=10",),
        task="link",
        seeds=3,  # the auto-encoder's paper reports a mean
    ),
    Recipe(
        "temporal_links",
        "link prediction on an interaction stream, neighbours sampled by time",
        tiny=(
            "--data.init_args.stream.num_users=200",
            "--data.init_args.stream.num_items=100",
            "--data.init_args.stream.num_events=4000",
            "--data.init_args.stream.num_communities=8",
            "--data.init_args.batch_size=100",
            "--trainer.max_epochs=2",
        ),
        variants=(
            ("by time, each node's newest interactions (last)", ()),
            ("by time, a uniform subset of them", ("--data.init_args.temporal_strategy=uniform",)),
            ("the same model without time (a static GNN)", ("--data.init_args.temporal=false",)),
        ),
        task="temporal_link",
        seeds=3,  # temporal papers report a mean over runs
        planned=False,  # gnnscale plan models node, link and graph batches
    ),
    Recipe(
        "hetero_node_classification",
        "node classification on users, items and categories: per-relation fan-outs, embeddings",
        tiny=(
            "--data.init_args.synthetic.num_users=2000",
            "--data.init_args.synthetic.num_items=1000",
            "--data.init_args.synthetic.num_categories=40",
            "--data.init_args.synthetic.num_communities=8",
            "--data.init_args.synthetic.feature_noise=4.0",
            "--data.init_args.batch_size=128",
            *_NO_WORKERS,
            "--trainer.max_epochs=4",
        ),
        prepare_first=False,  # its prepare.yaml: the from-disk variant (figures.py store_tasks)
        task="hetero_node",
    ),
    Recipe(
        "many_graphs_on_disk",
        "many small graphs in an LMDB store, read per graph by 2 DDP processes",
        tiny=(
            "--trainer.max_epochs=12",
            "--data.init_args.batch_size=16",
            "--data.init_args.split.val_fraction=0.1",
            "--data.init_args.split.test_fraction=0.2",
            *_NO_WORKERS,
            "--model.init_args.hidden_channels=64",
            "--model.init_args.num_rbf=16",
            "--model.init_args.optimizer.init_args.lr=0.005",
            "--trainer.accumulate_grad_batches=1",
            "--model.init_args.lr_scheduler.init_args.T_max=12",  # the schedule over the run
        ),
        tiny_prepare=("--atoms.num_graphs=1500", "--chunk_graphs=500"),
        # As shipped, 3 epochs of 1M graphs (hours on 2 CPU cores): the figures train 2 epochs
        # of 200 steps, in the main processes (the two ranks already use both cores).
        figure_args=(
            "--trainer.accelerator=cpu",
            "--trainer.max_epochs=2",
            "--trainer.limit_train_batches=200",
            *_NO_WORKERS,
        ),
        processes=2,
        prepare_command="prepare-graphs",
        task="graph",
    ),
)


def recipe(name: str) -> Recipe:
    """The registry entry of ``name``; a clear error names the known ones."""
    for entry in RECIPES:
        if entry.name == name:
            return entry
    raise KeyError(f"no recipe {name!r}; known: {', '.join(r.name for r in RECIPES)}")
