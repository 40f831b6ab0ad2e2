"""A link split streamed from a prepared folder: written again when stale or damaged."""

import json
import shutil
import time

import numpy as np
import pytest
import torch

from gnnscale import LinkDataModule
from gnnscale.testing import LINK_TINY, prepared_recommender

RATES = ("user", "rates", "item")


def test_a_damaged_or_stale_link_split_is_written_again_and_a_second_writer_waits(tmp_path):
    """A split is derived data: one truncated, or made from other settings, is written again
    (it was reported, and `prepare` then kept it); a DataModule that finds another process
    writing it waits and keeps what it wrote (it was refused)."""
    import threading

    from gnnscale.stores import atomic

    out, _ = prepared_recommender(tmp_path, LINK_TINY)

    def split():
        dm = LinkDataModule("prepared", out, edge_type=list(RATES), verify="size")
        dm.prepare_data()
        return dm.links.folder, [t.clone() for t in dm.links.labels("train")]

    folder, labels = split()
    (damaged,) = [p for p in folder.rglob("label.bin") if "train" in p.parts]
    damaged.write_bytes(damaged.read_bytes()[:-4])
    again, relabelled = split()
    assert again == folder and all(map(torch.equal, labels, relabelled))
    manifest = json.loads((folder / "manifest.json").read_text())
    # As an older version wrote it: other settings, and a file this one reads missing.
    files = {k: v for k, v in manifest["files"].items() if k != "val/known"}
    (folder / "manifest.json").write_text(json.dumps(manifest | {"key": "stale", "files": files}))
    assert all(map(torch.equal, labels, split()[1]))
    assert json.loads((folder / "manifest.json").read_text())["key"] != "stale"
    shutil.rmtree(folder)
    held = threading.Event()

    def writer():  # another process's writer, holding the lock for a while
        with atomic.locked(folder):
            held.set()
            time.sleep(1.0)

    thread = threading.Thread(target=writer)
    thread.start()
    held.wait()
    assert all(map(torch.equal, labels, split()[1]))  # waited, then wrote it
    thread.join()


@pytest.mark.parametrize("verify", ["size", "full"])
@pytest.mark.parametrize("damaged", ["label_index.bin", "item__rev_rates__user/row.bin"])
def test_a_link_split_holding_a_damaged_id_is_written_again(tmp_path, verify, damaged, capsys):
    """An id past the node count, the file's size kept: it seeded or fed PyG's sampler, a
    segmentation fault; now found at open (checksums, or a range check) and the split rewritten."""
    out, _ = prepared_recommender(tmp_path, LINK_TINY)

    def module():
        dm = LinkDataModule("prepared", out, edge_type=list(RATES), batch_size=64, verify=verify)
        dm.prepare_data()
        return dm

    folder = module().links.folder
    path = folder / "train" / damaged
    ids = np.memmap(path, np.int64, "r+")
    ids[3] = 10**12
    ids.flush()
    del ids
    dm = module()
    assert f"{folder} is damaged ({path}" in capsys.readouterr().out
    dm.setup("fit")
    assert int(np.fromfile(path, np.int64).max()) < 600
    assert len(list(dm.train_dataloader())) > 0


def test_a_link_split_whose_known_keys_leave_the_key_range_is_written_again(tmp_path, capsys):
    """Known keys are sorted, so their ends bound them: a damaged last one is found at open."""
    out, _ = prepared_recommender(tmp_path, LINK_TINY)

    def module():
        dm = LinkDataModule("prepared", out, edge_type=list(RATES), verify="size")
        dm.prepare_data()
        return dm

    folder = module().links.folder
    path = folder / "val" / "known.bin"
    good = np.fromfile(path, np.int64)
    keys = np.memmap(path, np.int64, "r+")
    keys[-1] = 10**15
    keys.flush()
    del keys
    module()
    assert f"{folder} is damaged ({path}" in capsys.readouterr().out
    assert np.array_equal(np.fromfile(path, np.int64), good)
