"""What ``compare.py`` measures: its sizes, and each row's recipe config and hand-loop spec.

A row is one configuration of the comparison table: gnnscale as shipped or with the hand loop's
settings, or the plain PyG loop (``handwritten.py``) in either precision. Overrides are written
in the recipe YAML's layout and merged into the recipe's ``config.yaml``.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
RECIPES = {"neighbor": "neighbor_sage", "cluster": "cluster_gcn", "saint": "graphsaint"}
MATCHED = {"precision": "32-true", "accumulate_grad_batches": 1}  # what a plain PyG loop does


@dataclass(frozen=True)
class Size:
    """Settings of one benchmark size; overrides use the recipe YAML's layout."""

    epochs: int
    reps: int
    eval_reps: int  # the first repetitions also evaluate (test accuracy, whole-run peak RSS)
    overrides: dict[str, Any]  # applied to every sampler recipe
    sampler_overrides: dict[str, dict[str, Any]]
    gat_overrides: dict[str, Any]
    scale_nodes: tuple[int, ...]
    scale_features: int
    scale_batches: int
    bandwidth_repeats: int
    timeout_s: float


TINY_GRAPH = {  # tests/conftest.py's TINY, with the smoke tests' training fraction
    "num_nodes": 3000,
    "avg_degree": 12,
    "num_features": 32,
    "num_classes": 5,
    "feature_noise": 4.0,
    "train_fraction": 0.3,
}
SIZES = {
    "tiny": Size(
        epochs=2,
        reps=1,
        eval_reps=1,
        overrides={
            "data": {
                "synthetic": TINY_GRAPH,
                "loader": {"num_workers": 0, "persistent_workers": False},
            },
            "model": {"hidden_channels": 64, "optimizer": {"init_args": {"lr": 0.01}}},
        },
        sampler_overrides={
            "neighbor": {"data": {"batch_size": 256}},
            "cluster": {"data": {"num_parts": 20}},
            "saint": {"data": {"batch_size": 300, "num_steps": 4}},
        },
        gat_overrides={"data": {"synthetic": {"num_nodes": 300}}, "model": {"hidden_channels": 64}},
        scale_nodes=(1_000, 10_000),
        scale_features=16,
        scale_batches=3,
        bandwidth_repeats=10,
        timeout_s=300,
    ),
    "full": Size(
        epochs=3,
        reps=2,
        eval_reps=1,  # one exact evaluation costs about an epoch on 1 core: once per row
        overrides={},
        sampler_overrides={},
        gat_overrides={},
        scale_nodes=(100_000, 1_000_000, 10_000_000),
        scale_features=32,  # 10^7 x 100 fp32 features alone would be 4 GB; the graph is 3.2 GB
        scale_batches=10,
        bandwidth_repeats=30,
        timeout_s=1500,
    ),
}


# --- configs -----------------------------------------------------------------------------------


def load_config(recipe: str) -> dict[str, Any]:
    """A recipe's ``config.yaml`` as a dict."""
    return yaml.safe_load((REPO / "recipes" / recipe / "config.yaml").read_text())


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` merged in, recursively (neither is modified)."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def yaml_layout(overrides: dict[str, Any]) -> dict[str, Any]:
    """Overrides in the config file's layout: ``data`` and ``model`` keys go under ``init_args``."""
    return {k: v if k == "trainer" else {"init_args": v} for k, v in overrides.items()}


def cli_flags(overrides: dict[str, Any]) -> list[str]:
    """Command-line flags for overrides in YAML layout (``data``/``model`` go to ``init_args``)."""

    def walk(prefix: str, value: Any) -> list[str]:
        if isinstance(value, dict):
            return [f for k, v in value.items() for f in walk(f"{prefix}.{k}", v)]
        text = value if isinstance(value, str) else json.dumps(value)
        return [f"--{prefix}={text}"]

    flags = []
    for section, value in overrides.items():
        prefix = section if section == "trainer" else f"{section}.init_args"
        flags += walk(prefix, value)
    return flags


def hand_spec(sampler: str, cfg: dict[str, Any], seed: int, epochs: int, workdir: Path) -> dict:
    """The plain PyG loop's settings, read from a (merged) recipe config."""
    model, data = cfg["model"]["init_args"], cfg["data"]["init_args"]
    eval_args = data.get("eval", {})
    if eval_args.get("mode", "layerwise") != "layerwise":
        raise ValueError(f"{sampler}: the hand loops evaluate layer-wise only, as the recipes do")
    keys = {
        "neighbor": ("num_neighbors", "batch_size"),
        "cluster": ("num_parts", "clusters_per_batch", "recursive"),
        "saint": ("batch_size", "walk_length", "num_steps", "sample_coverage"),
    }[sampler]
    defaults = {"recursive": False}
    loader = data.get("loader", {})
    return {
        "kind": "hand",
        "sampler": sampler,
        "seed": seed,
        "epochs": epochs,
        "graph": data["synthetic"],
        "model": {
            "hidden_channels": model["hidden_channels"],
            "num_layers": model["num_layers"],
            "dropout": model["dropout"],
            "norm": model.get("norm"),
            "lr": model["optimizer"]["init_args"]["lr"],
        },
        "data": {k: data.get(k, defaults.get(k)) for k in keys},
        "loader": _loader(loader),
        "eval_batch_size": eval_args.get("batch_size", 4096),  # gnnscale.EvalArgs' default
        "cache_dir": str(workdir / "hand_cache" / sampler),
    }


def _loader(loader: dict[str, Any]) -> dict[str, Any]:
    """A config's workers as gnnscale's loaders take them (``auto`` resolved)."""
    from gnnscale.data.args import LoaderArgs

    args = LoaderArgs(loader.get("num_workers", 0), False, loader.get("persistent_workers", False))
    return {k: v for k, v in args.kwargs().items() if k != "pin_memory"}


@dataclass
class Row:
    """One measured configuration of the comparison table."""

    key: str  # e.g. "neighbor/hand"
    sampler: str
    impl: str  # "gnnscale" or "hand"
    label: str
    overrides: dict[str, Any] = field(default_factory=dict)  # gnnscale: config overrides
    hand: dict[str, Any] = field(default_factory=dict)  # hand loop: extra spec entries
    env: dict[str, str] = field(default_factory=dict)  # gnnscale: environment variables
    ref: str = ""  # gnnscale: the hand row its ratios divide by (same precision)
    runs: list[dict[str, Any]] = field(default_factory=list)


def comparison_rows() -> list[Row]:
    """Rows: gnnscale as shipped and with the hand loop's settings; the hand loop, both precisions.

    Each gnnscale row is divided by the hand loop in its own precision (``ref``): the shipped
    bf16 recipe by the bf16 hand loop, the fp32 runs by the fp32 one.
    """
    rows = []
    for sampler, recipe in RECIPES.items():
        trainer = load_config(recipe)["trainer"]
        precision = trainer.get("precision", "32-true")
        ref = f"{sampler}/hand_bf16" if precision.startswith("bf16") else f"{sampler}/hand"
        shipped = (
            f"gnnscale, config.yaml ({precision}, "
            f"accumulate {trainer.get('accumulate_grad_batches', 1)})"
        )
        rows.append(Row(f"{sampler}/shipped", sampler, "gnnscale", shipped, ref=ref))
        if sampler == "neighbor":
            label = "gnnscale, bf16, no accumulation (= hand loop, bf16)"
            bf16 = {"trainer": {**MATCHED, "precision": "bf16-mixed"}}
            rows.append(Row("neighbor/matched_bf16", sampler, "gnnscale", label, bf16, ref=ref))
        label = "gnnscale, fp32, no accumulation (= hand loop, fp32)"
        rows.append(
            Row(
                f"{sampler}/matched",
                sampler,
                "gnnscale",
                label,
                {"trainer": MATCHED},
                ref=f"{sampler}/hand",
            )
        )
        hand = {"precision": "bf16"}
        if sampler == "saint":  # like for like (the ÷ hand reference), and graph_saint.py's own
            like = {"normalisation": "node_norm"}
            label = "PyG by hand, {}, GraphSAGE + node_norm"
            rows.append(
                Row("saint/hand_bf16", sampler, "hand", label.format("bf16"), hand={**like, **hand})
            )
            rows.append(Row("saint/hand", sampler, "hand", label.format("fp32"), hand=like))
            own = {"normalisation": "example"}
            label = "PyG by hand, fp32, graph_saint.py normalisation (GraphConv, edge_norm)"
            rows.append(Row("saint/hand_example", sampler, "hand", label, hand=own))
        else:
            rows.append(
                Row(f"{sampler}/hand_bf16", sampler, "hand", "PyG by hand, bf16", hand=hand)
            )
            rows.append(Row(f"{sampler}/hand", sampler, "hand", "PyG by hand, fp32"))
        if sampler == "cluster":
            rows.append(
                Row(
                    "cluster/shipped_4_layers",
                    sampler,
                    "gnnscale",
                    shipped + ", 4 layers",
                    # the sampled validation's fan-out: one entry per layer
                    {
                        "model": {"num_layers": 4},
                        "data": {"eval": {"num_neighbors": [15, 10, 10, 10]}},
                    },
                    ref=ref,
                )
            )
    return rows


def row_config(row: Row, size: Size) -> tuple[dict[str, Any], dict[str, Any]]:
    """The row's overrides and its merged recipe config."""
    overrides = merge(size.overrides, size.sampler_overrides.get(row.sampler, {}))
    overrides = merge(overrides, row.overrides)
    return overrides, merge(load_config(RECIPES[row.sampler]), yaml_layout(overrides))
