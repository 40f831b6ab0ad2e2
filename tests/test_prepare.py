"""``gnnscale prepare``: one typed ``--source`` per kind of input, each writing its folder.

The sources' folders are compared with the writers they call (their graphs are tested in
``test_store_*.py``, ``test_ondisk.py`` and ``test_ogb.py``); here: that each source is reached
from the command line and its config file, that what it records about its input is what the
command recorded before the sources were typed (so folders prepared then are kept), that the
old form is refused in one line saying what to write, and that a refusal names the ``--source``
flag.
"""

import dataclasses
import errno
import os
import sys
import typing
from pathlib import Path

import pytest
import torch

import gnnscale.cli
from gnnscale import NeighborDataModule, Preprocess, make_synthetic_graph, stores
from gnnscale.cli.prepare import Dataset, Npy, Ogb, Recommender, Synthetic, prepare, prepare_main
from gnnscale.data.datasets import DATASETS
from gnnscale.data.synthetic import write_streamed_synthetic
from gnnscale.errors import ConfigError
from gnnscale.stores.ogb import OGB
from gnnscale.stores.prepared import PreparedGraph
from gnnscale.stores.writing import write_graph
from gnnscale.testing import TINY

SOURCES = (Dataset, Synthetic, Npy, Ogb, Recommender)
CFG = dataclasses.replace(TINY, avg_degree=float(TINY.avg_degree))  # as the command parses it
TINY_FLAGS = [f"--source.synthetic.{k}={v}" for k, v in dataclasses.asdict(CFG).items()]


def test_a_dataset_is_written_as_fit_loads_it_and_recorded_as_before(tmp_path):
    preprocess = Preprocess(normalize_features=True)
    flags = ["--source=Dataset", *TINY_FLAGS, "--source.preprocess.normalize_features=true"]
    out = prepare_main([f"--out={tmp_path / 'g'}", *flags])
    loaded = NeighborDataModule("synthetic", synthetic=CFG, preprocess=preprocess).data
    assert torch.equal(PreparedGraph(out).data.x, loaded.x)
    source = {"dataset": "synthetic", "preprocess": dataclasses.asdict(preprocess)}
    source["synthetic"] = dataclasses.asdict(CFG)  # what `--dataset synthetic` recorded
    expected = write_graph(loaded, tmp_path / "expected", source)
    assert PreparedGraph(out).manifest.key == PreparedGraph(expected).manifest.key


def test_a_named_dataset_is_read_from_its_root(tmp_path, cora_root):
    out = prepare_main(
        [f"--out={tmp_path / 'g'}", "--source=Dataset", "--source.name=Cora",
         f"--source.root={cora_root}"]
    )  # fmt: skip
    manifest = PreparedGraph(out).manifest
    assert manifest.num_nodes == 2708 and manifest.source["root"] == str(cora_root)


def test_the_streamed_generator_writes_the_graph_it_draws_chunk_by_chunk(tmp_path):
    flags = ["--source=Synthetic", *TINY_FLAGS, "--source.chunk_nodes=1000"]
    out = prepare_main([f"--out={tmp_path / 'g'}", *flags])
    expected = write_streamed_synthetic(CFG, tmp_path / "expected", "float32", 1000)
    for name in ("manifest.json", "x.bin", "row.bin", "colptr.bin", "train_mask.bin"):
        assert (out / name).read_bytes() == (expected / name).read_bytes(), name


def test_the_sources_are_the_python_api_too(tmp_path):
    """``prepare(out=..., source=Npy(root))``: the function the command parses, called."""
    arrays = stores.save_npy(make_synthetic_graph(TINY), tmp_path / "arrays")
    out = prepare(out=tmp_path / "g", source=Npy(arrays))
    assert PreparedGraph(out).manifest.source["npy"] == str(arrays.resolve())
    assert prepare(out=out, source=Npy(arrays)) == out  # the same settings: kept


def test_a_config_file_chooses_its_source_by_class_path(tmp_path):
    config = tmp_path / "prepare.yaml"
    config.write_text(
        f"out: {tmp_path / 'g'}\nfeature_dtype: bfloat16\nsource:\n  class_path: Recommender\n"
        "  init_args:\n    synthetic: {num_users: 300, num_items: 200, num_categories: 20,"
        " num_communities: 5}\n    split: {train_fraction: 0.5}\n"
    )
    manifest = PreparedGraph(prepare_main(["--config", str(config)])).manifest
    assert manifest.source["dataset"] == "recommender"
    assert manifest.source["split"]["train_fraction"] == 0.5
    assert manifest.files["item/x"].dtype == "bfloat16"


def test_the_sources_name_every_dataset_gnnscale_prepare_reads():
    """The choices are written out (types for ``--help``); they must follow the lists."""
    names = typing.get_args(typing.get_type_hints(Dataset.__init__)["name"])
    assert set(names) == set(DATASETS) - {"prepared"} - set(OGB)  # OGB's: read as they unpack
    assert set(typing.get_args(typing.get_type_hints(Ogb.__init__)["name"])) == set(OGB)


def test_help_says_gnnscale_prepare_and_lists_the_sources(capsys):
    with pytest.raises(SystemExit):
        prepare_main(["--help"])
    shown = capsys.readouterr().out
    assert shown.startswith("usage: gnnscale prepare ")
    for source in SOURCES:
        assert f"gnnscale.cli.prepare.{source.__name__}" in shown, source
    with pytest.raises(SystemExit):
        prepare_main(["--source.help", "Npy"])
    assert "--source.root" in capsys.readouterr().out


def _refused(tmp_path, monkeypatch, capsys, args):
    """``gnnscale prepare --out g ARGS``'s error: one line, exit status 2, no folder written."""
    monkeypatch.setattr(sys, "argv", ["gnnscale", "prepare", f"--out={tmp_path / 'g'}", *args])
    monkeypatch.delenv("GNNSCALE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as done:
        gnnscale.cli.run()
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert not (tmp_path / "g").exists()
    return err


@pytest.mark.parametrize(
    "old,new",
    [
        (["--dataset=npy", "--root=arrays"], "write --source Npy --source.root arrays ("),
        (
            ["--stream=true", "--synthetic.num_nodes=1000", "--chunk_nodes", "100"],
            "write --source Synthetic --source.synthetic.num_nodes 1000 --source.chunk_nodes 100 (",
        ),
        (
            ["--dataset", "ogbn-mag", "--root", "data"],
            "write --source Ogb --source.name ogbn-mag --source.root data (",
        ),
        (
            ["--dataset=Cora", "--preprocess.to_undirected=true"],
            "write --source Dataset --source.name Cora --source.preprocess.to_undirected true (",
        ),
        (
            ["--dataset=recommender", "--recommender.num_users=10", "--split.val_fraction=0.2"],
            "write --source Recommender --source.synthetic.num_users 10 "
            "--source.split.val_fraction 0.2 (",
        ),
    ],
    ids=["npy", "stream", "ogb", "dataset", "recommender"],
)
def test_the_old_form_is_refused_in_one_line_saying_what_to_write(
    tmp_path, monkeypatch, capsys, old, new
):
    err = _refused(tmp_path, monkeypatch, capsys, old)
    assert err.startswith("gnnscale: error: --")
    assert "gnnscale prepare's old form" in err and new in err, err


@pytest.mark.parametrize(
    "given,message",
    [
        ([], "say what to read: --source CLASS, one of Dataset, Synthetic, Npy, Ogb, Recommender"),
        (
            ["--source.synthetic.num_nodes=100"],
            "--source.synthetic.num_nodes is given before any --source: write --source CLASS "
            "first, one of Dataset, Synthetic, Npy, Ogb, Recommender",
        ),
    ],
    ids=["no source", "a source's option alone"],
)
def test_a_missing_source_is_asked_for_in_one_line_naming_the_sources(
    tmp_path, monkeypatch, capsys, given, message
):
    """Not "the following arguments are required: source", nor jsonargparse's "Not a valid
    subclass of Source. Got value: NestedArg(...)" with its four ways to give a class."""
    err = _refused(tmp_path, monkeypatch, capsys, given)
    assert err.startswith(f"gnnscale: error: {message}"), err


def test_an_old_config_file_is_refused_naming_the_key_it_became(tmp_path):
    config = tmp_path / "prepare.yaml"
    config.write_text(f"out: {tmp_path / 'g'}\ndataset: recommender\nrecommender:\n  seed: 1\n")
    with pytest.raises(ConfigError, match=r"^--(dataset|recommender\.seed): gnnscale prepare's"):
        prepare_main(["--config", str(config)])


@pytest.mark.parametrize(
    "flags,message",
    [
        (
            ["--source=Synthetic", "--source.synthetic.num_classes=1"],
            "--source.synthetic.num_classes must be between 2 and --source.synthetic.num_nodes "
            "(100000) (got 1)",
        ),
        (
            ["--source=Dataset", "--source.synthetic.homophily=2"],
            "--source.synthetic.homophily must be between 0 and 1 (got 2.0)",
        ),
        (
            ["--source=Recommender", "--source.split.train_fraction=0.95"],
            "--source.split.train_fraction and --source.split.val_fraction must be > 0 and sum "
            "to less than 1, the rest being the test split (got 0.95, 0.1)",
        ),
        (
            ["--source=Dataset", "--source.name=Cora", "--source.root={missing}"],
            "--source.root '{missing}' does not exist or is not a folder: create it (mkdir -p "
            "{missing}) to download Cora into it, or point --source.root at the folder that "
            "holds Cora",
        ),
        (  # drawn whole into memory before it is written: refused from its settings
            ["--source=Dataset", "--source.synthetic.num_nodes=100000000000"],
            "the generated graph alone takes about",
        ),
    ],
    ids=["Synthetic", "Dataset", "Recommender split", "Dataset root", "Dataset too large"],
)
def test_a_sources_refusal_names_the_source_flag(tmp_path, flags, message):
    missing = str(tmp_path / "missing")
    flags = [f.format(missing=missing) for f in flags]
    with pytest.raises(ConfigError) as refused:
        prepare_main([f"--out={tmp_path / 'g'}", *flags])
    assert str(refused.value).startswith(message.format(missing=missing)), refused.value
    assert "--data." not in str(refused.value).split(": ")[0], refused.value
    assert not (tmp_path / "g").exists()


def test_prepare_into_a_read_only_folder_is_one_line(tmp_path, monkeypatch, capsys):
    """A read-only ``--out`` (a read-only mount: root ignores permission bits, so mkdir fails)."""
    real_mkdir = Path.mkdir
    blocked = tmp_path / "mnt"

    def mkdir(self: Path, *args, **kwargs):
        if self.is_relative_to(blocked):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    monkeypatch.delenv("GNNSCALE_DEBUG", raising=False)
    argv = ["gnnscale", "prepare", f"--out={blocked / 'g'}", "--source=Dataset", *TINY_FLAGS]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as stopped:
        gnnscale.cli.run()
    err = capsys.readouterr().err
    assert stopped.value.code == 2, err
    assert err.startswith(f"gnnscale: error: cannot write {blocked}"), err
    assert err.endswith("make that folder writable, or write elsewhere (--out)\n")
    assert err.count("\n") == 1 and not (blocked / "g").exists()
