"""``SparseAdam``: torch's ``SparseAdam``, its update done on the gradient's rows by index.

The embedding tables of the heterogeneous, link and embedding models train with sparse
gradients (only the rows a batch looked up) and Adam on those rows. torch's ``SparseAdam``
reads the moments at the gradient's entries with ``Tensor.sparse_mask`` (a sparse-dense
product), adds sparse updates back and makes a dozen passes over every looked-up row at once.
This one gathers a few thousand rows at a time with ``index_select``, updates them while they
are in the caches and writes them back with ``index_copy_``: the same arithmetic in the same
order (the same values, bit for bit), the same state (``step``, ``exp_avg``, ``exp_avg_sq``),
so a checkpoint's state loads into either. On the link recipe's user table (50,000 x 64, about
42,000 rows a step) a step takes about half as long; ``benchmarks/figures.py peers`` measures
the training epoch a user sees.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["SparseAdam"]

# Rows updated together: a few MiB of temporaries that stay in the cores' caches between the
# update's dozen passes (all rows at once took two to three times as long on the link recipe's
# user table).
_CHUNK = 4096


class SparseAdam(torch.optim.SparseAdam):
    """Adam on the rows of sparse gradients (``nn.Embedding(sparse=True)``), by index.

    Arguments and behaviour are torch's ``SparseAdam``'s; only the update's kernels differ
    (module docstring).
    """

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One update of every parameter with a gradient; ``closure`` re-evaluates the loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr = float(group["lr"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not p.grad.is_sparse:
                    raise RuntimeError(
                        "SparseAdam does not support dense gradients, please consider Adam instead"
                    )
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                grad = -p.grad if group["maximize"] else p.grad
                _rows(
                    p,
                    grad,
                    state["exp_avg"],
                    state["exp_avg_sq"],
                    state["step"],
                    lr=lr,
                    beta1=beta1,
                    beta2=beta2,
                    eps=group["eps"],
                )
        return loss


def _rows(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    step: int,
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
) -> None:
    """The update of torch's ``sparse_adam`` for one parameter, on the rows its gradient holds.

    A row is an entry of the gradient's sparse dimensions (an embedding's: one, the node);
    ``param`` and its moments are seen as ``[entries, *dense dimensions]``.
    """
    grad = grad.coalesce()  # one entry per row, sorted: index_copy_ writes each row once
    values = grad.values()
    if not values.numel():
        return
    k = grad.sparse_dim()
    shape = (math.prod(param.shape[:k]), *param.shape[k:])
    strides = torch.tensor(
        [math.prod(param.shape[i + 1 : k]) for i in range(k)], device=values.device
    )
    entries = (grad.indices() * strides.unsqueeze(1)).sum(0) if k > 1 else grad.indices()[0]
    views = [
        t.view(shape) if t.is_contiguous() else t.contiguous().view(shape)
        for t in (param, exp_avg, exp_avg_sq)
    ]
    p, m_all, v_all = views
    step_size = lr * math.sqrt(1 - beta2**step) / (1 - beta1**step)
    for ids, g in zip(entries.split(_CHUNK), values.split(_CHUNK), strict=True):
        old_m = m_all.index_select(0, ids)
        m = g.sub(old_m).mul_(1 - beta1).add_(old_m)
        old_v = v_all.index_select(0, ids)
        v = g.pow(2).sub_(old_v).mul_(1 - beta2).add_(old_v)
        m_all.index_copy_(0, ids, m)
        v_all.index_copy_(0, ids, v)
        update = m.div_(v.sqrt_().add_(eps)).mul_(-step_size)
        p.index_copy_(0, ids, p.index_select(0, ids).add_(update))
    for view, tensor in zip(views, (param, exp_avg, exp_avg_sq), strict=True):
        if view.data_ptr() != tensor.data_ptr():  # a copy of a strided tensor: write it back
            tensor.copy_(view.view(tensor.shape))
