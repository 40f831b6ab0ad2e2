"""gnnscale's ``SparseAdam`` against torch's: the same values, state and refusals."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import gnnscale.optim
from gnnscale.optim import SparseAdam


def _train(optimizer: type[torch.optim.SparseAdam], steps: int = 6, **kwargs) -> tuple:
    """An embedding table trained on repeated ids, two micro-batches a step; table and state."""
    torch.manual_seed(0)
    table = nn.Embedding(300, 8, sparse=True)
    opt = optimizer(table.parameters(), lr=0.05, **kwargs)
    for _ in range(steps):
        for _ in range(2):  # accumulated: the gradient holds each id's entries uncoalesced
            ids = torch.randint(0, 120, (200,))  # rows 120..299 never looked up
            (table(ids) * torch.randn(200, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    return table.weight.detach().clone(), opt.state_dict()


@pytest.mark.parametrize("kwargs", [{}, {"maximize": True, "betas": (0.5, 0.9), "eps": 1e-3}])
@pytest.mark.parametrize("chunk", [4096, 7])  # all rows at once; in chunks, a short last one
def test_the_same_values_and_state_as_torch(kwargs, chunk, monkeypatch) -> None:
    monkeypatch.setattr(gnnscale.optim, "_CHUNK", chunk)
    ours, our_state = _train(SparseAdam, **kwargs)
    theirs, their_state = _train(torch.optim.SparseAdam, **kwargs)
    assert torch.equal(ours, theirs)  # the same arithmetic, bit for bit
    a, b = our_state["state"][0], their_state["state"][0]
    assert a["step"] == b["step"] == 6
    assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
    torch.manual_seed(0)
    untouched = nn.Embedding(300, 8).weight.detach()[120:]
    assert torch.equal(ours[120:], untouched)  # rows never looked up never move
    assert not torch.equal(ours[:120], nn.Embedding(300, 8).weight.detach()[:120])


def test_a_checkpointed_state_goes_on_in_torchs_optimizer() -> None:
    torch.manual_seed(1)
    table = nn.Embedding(50, 4, sparse=True)
    twin = nn.Embedding(50, 4, sparse=True)
    twin.load_state_dict(table.state_dict())
    ours, theirs = SparseAdam(table.parameters(), lr=0.1), torch.optim.SparseAdam(twin.parameters())
    ids = torch.tensor([1, 1, 7, 49])
    table(ids).pow(2).sum().backward()
    ours.step()
    twin.load_state_dict(table.state_dict())
    theirs.load_state_dict(copy.deepcopy(ours.state_dict()))  # torch would share the moments
    for module, opt in ((table, ours), (twin, theirs)):
        opt.zero_grad()
        module(ids).pow(3).sum().backward()
        opt.step()
    assert torch.equal(table.weight, twin.weight)


def test_sparse_gradients_of_other_shapes() -> None:
    """Two sparse dimensions, and a parameter that is a transposed (strided) view."""

    def run(optimizer: type[torch.optim.SparseAdam]) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(2)
        square = nn.Parameter(torch.randn(6, 5))
        strided = nn.Parameter(torch.randn(4, 6).t())  # [6, 4], not contiguous
        opt = optimizer([square, strided], lr=0.1)
        for _ in range(3):
            index = torch.tensor([[0, 2, 2, 5], [1, 3, 3, 0]])  # a repeated entry
            square.grad = torch.sparse_coo_tensor(
                index, torch.randn(4), (6, 5), check_invariants=True
            )
            rows = torch.tensor([[0, 3, 3]])
            strided.grad = torch.sparse_coo_tensor(
                rows, torch.randn(3, 4), (6, 4), check_invariants=True
            )
            opt.step()
        return square.detach().clone(), strided.detach().clone()

    for ours, theirs in zip(run(SparseAdam), run(torch.optim.SparseAdam), strict=True):
        assert torch.equal(ours, theirs)


def test_a_dense_gradient_is_refused_as_torch_does() -> None:
    weight = nn.Parameter(torch.zeros(3, 2))
    weight.grad = torch.ones(3, 2)
    with pytest.raises(RuntimeError, match="dense gradients"):
        SparseAdam([weight]).step()
