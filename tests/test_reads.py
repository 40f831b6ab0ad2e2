"""Rows gathered by many threads at once: the rows one ``index_select`` gathers, bit for bit."""

import os

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from gnnscale import make_synthetic_graph
from gnnscale.stores import reads
from gnnscale.stores.prepared import PreparedGraph
from gnnscale.stores.writing import write_graph
from gnnscale.testing import TINY


@pytest.fixture
def mapped(tmp_path):
    """A prepared graph's mapped files: bfloat16 features, int64 labels, a bool mask."""
    folder = write_graph(make_synthetic_graph(TINY), tmp_path / "g", {"t": 1}, "bfloat16")
    graph = PreparedGraph(folder)
    return [graph.tensor(name) for name in ("x", "y", "train_mask")]


@pytest.mark.parametrize("threads", [1, 3, 16])
def test_threads_gather_the_rows_index_select_gathers(mapped, threads, monkeypatch):
    monkeypatch.setattr(reads, "MIN_ROWS", 8)  # let 16 threads share a few thousand rows
    g = torch.Generator().manual_seed(0)
    n = mapped[0].size(0)
    index = torch.cat([torch.randint(n, (5000,), generator=g), torch.tensor([0, n - 1, 0])])
    for tensor in mapped:
        for idx in (index, index.int(), index[:5], index[:0]):
            out = reads.gather(tensor, idx, threads)
            expected = tensor.index_select(0, idx.long())
            assert out.dtype == tensor.dtype and out.shape == expected.shape
            # bit for bit: compare the raw bytes, not the (bfloat16) values
            assert torch.equal(out.view(torch.uint8), expected.view(torch.uint8))
    assert ((os.getpid(), threads) in reads._pools) == (threads > 1)  # the threads did read


def test_an_index_out_of_range_fails_in_the_caller(mapped, monkeypatch):
    monkeypatch.setattr(reads, "MIN_ROWS", 8)
    index = torch.arange(4000)
    index[3999] = mapped[0].size(0)  # in the last thread's share
    with pytest.raises(IndexError):
        reads.gather(mapped[0], index, 4)


class _Gathers(Dataset):
    def __init__(self, tensor):
        self.tensor = tensor

    def __len__(self):
        return 3

    def __getitem__(self, i):
        index = torch.arange(i, self.tensor.size(0), 3)
        out = reads.gather(self.tensor, index, 4)
        return out, out.is_shared()


def test_a_loader_worker_gathers_into_shared_memory(mapped, monkeypatch):
    """As PyG's own gathers in a worker: the batch is written where it is handed over."""
    monkeypatch.setattr(reads, "MIN_ROWS", 8)
    x = mapped[0]
    loader = DataLoader(_Gathers(x), batch_size=None, num_workers=1)
    for i, (out, shared) in enumerate(loader):
        assert shared
        assert torch.equal(out.view(torch.uint8), x[i::3].view(torch.uint8))


def test_reading_ahead_reads_every_page_the_sampler_reads(monkeypatch):
    """Every page of every list the sampler may read is gathered (here: recorded), and the
    frontier follows only the lists taken whole."""
    colptr = torch.tensor([0, 3, 3, 1200, 1210, 1212, 1220])  # node 2: a list over 3 pages
    row = torch.cat(
        [
            torch.tensor([3, 4, 5]),
            torch.randint(6, (1197,)),
            torch.tensor([0] * 10),
            torch.tensor([1, 5]),
            torch.tensor([2] * 8),
        ]
    )
    assert row.numel() == colptr[-1]
    read = []
    real = reads.gather

    def recording(tensor, index, threads):
        read.append((tensor is row, index.clone()))
        return real(tensor, index, threads)

    monkeypatch.setattr(reads, "gather", recording)
    checked = []
    reads.read_ahead(colptr, row, torch.tensor([0, 2]), [3, 2], 4, checked.append)
    # every id the sampler may expand is checked: all of the seeds' lists, before any hop
    assert len(checked) == 1 and torch.equal(
        checked[0], row[torch.cat([torch.arange(3), torch.arange(3, 1200)])]
    )
    pages = lambda index: set((index * 8 // 4096).tolist())  # noqa: E731
    row_reads = [index for is_row, index in read if is_row]
    # hop 1: node 0's list (page 0) and node 2's (bytes 24..9599: pages 0, 1, 2)
    assert pages(row_reads[0]) == {0, 1, 2}
    # hop 2: node 0's whole list (3, 4, 5) is followed; node 2's (1197 entries > 2) is not
    col_reads = [index for is_row, index in read if not is_row]
    assert col_reads[1].tolist() == [3, 4, 5, 4, 5, 6]  # colptr[v] and colptr[v + 1]
    assert pages(row_reads[1]) == pages(torch.arange(1200, 1220))


def test_reading_ahead_on_a_heterogeneous_graph_follows_each_edge_type(monkeypatch):
    """Hop 1 reads the lists of every edge type into the seeds' type; the lists it takes whole
    give the next hop's frontier of their source type, whose own edge types hop 2 reads."""
    # papers cite papers; authors write papers (written_by: paper <- author lists per paper).
    cites = (torch.tensor([0, 1, 1, 3]), torch.tensor([1, 2, 0]))  # colptr over 3 papers, row
    writes = (torch.tensor([0, 1, 1, 2]), torch.tensor([4, 0]))  # authors into papers
    wrote = (torch.tensor([0, 1, 1, 1, 1, 2]), torch.tensor([2, 1]))  # papers into 5 authors
    csc = {
        ("paper", "cites", "paper"): cites,
        ("author", "writes", "paper"): writes,
        ("paper", "rev_writes", "author"): wrote,
    }
    fanout = dict.fromkeys(csc, [5, 5])
    read = []
    real = reads.gather

    def recording(tensor, index, threads):
        read.append((tensor, index.clone()))
        return real(tensor, index, threads)

    monkeypatch.setattr(reads, "gather", recording)
    checked = []
    reads.read_ahead_typed(
        csc,
        {"paper": torch.tensor([0])},
        fanout,
        4,
        lambda ids, t: checked.append((t, ids.tolist())),
    )
    # hop 1, seeds paper 0: cites lists paper 1; writes lists author 4; nothing into authors
    assert checked == [("paper", [1]), ("author", [4])]
    names = {id(cites[0]): "cites", id(writes[0]): "writes", id(wrote[0]): "wrote"}
    colptr_reads = [(names[id(t)], i.tolist()) for t, i in read if id(t) in names]
    assert colptr_reads[:2] == [("cites", [0, 1]), ("writes", [0, 1])]
    # hop 2: papers {1} through cites and writes, authors {4} through rev_writes
    hop2 = dict(colptr_reads[2:])
    assert hop2 == {"cites": [1, 2], "writes": [1, 2], "wrote": [4, 5]} and len(colptr_reads) == 5


@pytest.mark.parametrize("threads", [1, 4])
def test_a_row_cache_gives_the_rows_of_the_file_and_counts_what_it_held(mapped, threads):
    x = mapped[0]
    g = torch.Generator().manual_seed(3)
    ids = torch.randperm(x.size(0), generator=g)[:700].sort().values
    cache = reads.RowCache(ids, x[ids].clone())
    index = torch.randint(x.size(0), (4000,), generator=g)
    out, held = cache.gather(x, index, threads)
    assert torch.equal(out.view(torch.uint8), x[index].view(torch.uint8))
    assert held == int(torch.isin(index, ids).sum()) > 0
    empty = reads.RowCache(ids[:0], x[:0].clone())
    out, held = empty.gather(x, index, threads)
    assert held == 0 and torch.equal(out.view(torch.uint8), x[index].view(torch.uint8))


@pytest.mark.parametrize("chunk_bytes", [1000, 1 << 20])
def test_rows_read_in_one_pass_are_the_mapped_rows(tmp_path, chunk_bytes):
    """Chunks of any size (one row, a row and a bit, the whole file), dtypes of 1 to 8 bytes."""
    graph = PreparedGraph(
        write_graph(make_synthetic_graph(TINY), tmp_path / "g", {"t": 1}, "bfloat16")
    )
    ids = torch.tensor([0, 1, 7, 8, 9, 1500, 2998, 2999])
    for name in ("x", "y", "train_mask"):
        rows = graph.read_rows(name, ids, chunk_bytes)
        assert torch.equal(rows, graph.tensor(name)[ids]), name
    assert graph.read_rows("x", ids[:0]).shape == (0, TINY.num_features)


def test_threads_gather_under_the_callers_inference_mode(mapped, monkeypatch):
    """A loader worker forked inside Lightning's evaluation loop runs in inference mode, which
    is per thread: the reading threads must write its output as the caller would."""
    monkeypatch.setattr(reads, "MIN_ROWS", 8)
    index = torch.arange(0, mapped[0].size(0), 2)
    with torch.inference_mode():
        out = reads.gather(mapped[0], index, 4)
    assert out.is_inference() and torch.equal(out, mapped[0][index])
