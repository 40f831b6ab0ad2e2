"""Caches are built aside and renamed into place, checked when read, rebuilt when damaged."""

import multiprocessing
import os
import time

import pytest

from gnnscale import ClusterDataModule, SyntheticGraph
from gnnscale.stores.cache import cached_folder, check_writable


def _write(value: bytes):
    def build(folder):
        (folder / "sub").mkdir()
        (folder / "sub" / "part.pt").write_bytes(value)

    return build


def test_built_once_then_read(tmp_path):
    assert cached_folder(tmp_path / "c", _write(b"abc"), "test")
    assert not cached_folder(tmp_path / "c", _write(b"other"), "test")  # intact: kept
    assert (tmp_path / "c" / "sub" / "part.pt").read_bytes() == b"abc"


def test_a_failed_build_leaves_nothing(tmp_path):
    def build(folder):
        (folder / "part.pt").write_bytes(b"half")
        raise KeyboardInterrupt  # as a user's Ctrl-C midway

    with pytest.raises(KeyboardInterrupt):
        cached_folder(tmp_path / "c", build, "test")
    assert [p.name for p in tmp_path.iterdir()] == []


@pytest.mark.parametrize("damage", ["flip", "truncate", "no record"])
def test_a_damaged_cache_is_reported_and_rebuilt(tmp_path, damage):
    folder = tmp_path / "c"
    cached_folder(folder, _write(b"abcdef"), "test")
    part = folder / "sub" / "part.pt"
    if damage == "flip":
        part.write_bytes(b"abcdeF")  # same size, other contents
    elif damage == "truncate":
        part.write_bytes(b"abc")
    else:
        (folder / "cache.json").unlink()  # as a cache written before gnnscale kept records
    with pytest.warns(UserWarning, match=f"the test cache {folder} is (damaged|incomplete)"):
        assert cached_folder(folder, _write(b"abcdef"), "test")
    assert part.read_bytes() == b"abcdef"


def _build_slowly(folder: str, log: str) -> None:
    def build(tmp):
        with open(log, "a") as f:
            f.write("built\n")
        time.sleep(0.5)
        (tmp / "part.pt").write_bytes(b"x")

    cached_folder(folder, build, "test")


def test_processes_sharing_a_cache_build_it_once(tmp_path):
    log = tmp_path / "log"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_build_slowly, args=(tmp_path / "c", log)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert log.read_text() == "built\n"
    assert (tmp_path / "c" / "part.pt").read_bytes() == b"x"


def test_cache_folder_that_cannot_be_made_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="--data.root: cannot create the cache folder .* a file"):
        check_writable(tmp_path / "file" / "gnnscale_cache", "--data.root")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only folders")
def test_read_only_cache_folder_is_refused(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(ValueError, match="--data.root"):
            check_writable(tmp_path / "gnnscale_cache", "--data.root")
    finally:
        tmp_path.chmod(0o700)


def test_cluster_partition_damaged_on_disk_is_rebuilt_not_used(tmp_path):
    graph = SyntheticGraph(num_nodes=1000, avg_degree=6)
    dm = ClusterDataModule(root=tmp_path, num_parts=10, clusters_per_batch=2, synthetic=graph)
    dm.setup("fit")
    perm = dm._cluster_data.partition.node_perm.clone()
    (saved,) = (tmp_path / "gnnscale_cache").rglob("*.pt")
    data = bytearray(saved.read_bytes())
    data[-100] ^= 0xFF  # inside the zip's payload: torch.load might still read it
    saved.write_bytes(bytes(data))
    again = ClusterDataModule(root=tmp_path, num_parts=10, clusters_per_batch=2, synthetic=graph)
    with pytest.warns(UserWarning, match="Cluster-GCN partition cache .* is damaged"):
        again.setup("fit")
    assert again._cluster_data.partition.node_perm.equal(perm)


def test_cluster_refuses_a_root_it_cannot_write_before_partitioning(tmp_path):
    (tmp_path / "file").write_text("")
    dm = ClusterDataModule(root=tmp_path / "file", num_parts=10, clusters_per_batch=2)
    with pytest.raises(ValueError, match="a file is in the way"):
        dm.setup("fit")
