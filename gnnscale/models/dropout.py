"""Dropout with a cheaper mask on the CPU: one of the node models' speed tricks.

Switched by ``SpeedTricks.cpu_dropout`` (``gnnscale.models.fast``, where the others live);
``python benchmarks/figures.py speed_defaults`` measures it off.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from gnnscale.errors import check_probabilities


class Dropout(torch.nn.Module):
    """``torch.nn.Dropout`` with a cheaper mask on the CPU; ``F.dropout`` elsewhere.

    PyTorch's CPU dropout draws one Bernoulli variate per element (``bernoulli_``), which took
    longer than the layer's matrix product. Here an element's mask comes from 1, 8 or 16 random
    bits: for p = 0.5 one bit is the mask (``numpy.unpackbits``); else an element is kept when
    8 bits (if ``(1 - p) * 2**8`` is a whole number) or 16 fall below
    ``k = round((1 - p) * 2**bits)``. Kept values are scaled by ``2**bits / k``. The output is
    unbiased exactly; the rate is ``p`` exactly with 1 or 8 bits and within ``2**-17`` of it
    with 16. The comparison writes bytes (or the input's dtype) straight away: a boolean mask
    multiplied into bfloat16 took longer than the multiply.

    ``forward(x, relu=True)`` applies a ReLU in the same pass and saves only its output, which
    the next layer saves anyway: ReLU's backward (``output > 0``) then also covers the mask.

    Args:
        p: Probability of zeroing an element.
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        check_probabilities(dropout=p)
        self.p = p

    def forward(self, x: Tensor, relu: bool = False) -> Tensor:
        """Zero elements of ``x`` (after a ReLU if ``relu``) at rate ``p``, scale the rest."""
        bits = next(b for b in (1, 8, 16) if ((1 - self.p) * 2**b).is_integer() or b == 16)
        keep = round((1 - self.p) * 2**bits)
        if not self.training or keep == 2**bits:
            return F.relu(x) if relu else x
        if x.device.type != "cpu" or keep == 0:
            return F.dropout(F.relu(x) if relu else x, self.p, training=True)
        scale = 2**bits / keep
        if relu:
            return _ReluMaskedScale.apply(x, _keep_mask(x.shape, bits, keep, x.dtype), scale)
        return _MaskedScale.apply(x, _keep_mask(x.shape, bits, keep, torch.uint8), scale)

    def extra_repr(self) -> str:
        """Shown in the model's printout."""
        return f"p={self.p}"


@torch.compiler.disable  # numpy's bits, not a graph to trace
def _keep_mask(shape: torch.Size, bits: int, keep: int, dtype: torch.dtype) -> Tensor:
    """1 where an element is kept, else 0, in ``dtype``: see :class:`Dropout`."""
    numel = shape.numel()
    words = _random_words((numel * bits + 63) // 64)
    if bits == 1:  # each bit is an element's mask: 1/8 of the random words, no comparison
        unpacked = np.unpackbits(words.numpy().view(np.uint8), count=numel)
        return torch.from_numpy(unpacked).view(shape).to(dtype)
    if bits == 8:
        draws, below = words.view(torch.uint8), keep
    else:  # torch compares int16, not uint16: shift the threshold
        draws, below = words.view(torch.int16), keep - 2**15
    return torch.lt(draws[:numel].view(shape), below, out=torch.empty(shape, dtype=dtype))


def _random_words(count: int) -> Tensor:
    """``count`` random 64-bit words from numpy's PCG64, seeded from torch's generator.

    PCG64 drew them twice as fast as torch's CPU generator (``random_``) here; the seed comes
    from torch, so ``seed_everything`` still decides every mask.
    """
    seed = int(torch.randint(2**62, ()).item())
    return torch.from_numpy(np.random.PCG64(seed).random_raw(count).view(np.int64))


class _MaskedScale(torch.autograd.Function):
    """``x * mask * scale``, saving only the byte mask for backward (as ``F.dropout`` does)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, mask: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return (x * mask.to(x.dtype)).mul_(scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (mask,) = ctx.saved_tensors
        return (grad * mask.to(grad.dtype)).mul_(ctx.scale), None, None


class _ReluMaskedScale(torch.autograd.Function):
    """``relu(x) * mask * scale``, saving only the output: its zeros are ReLU's and the mask's."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, mask: Tensor, scale: float) -> Tensor:
        out = torch.addcmul(x.new_zeros(()), torch.relu(x), mask, value=scale)  # one pass
        ctx.save_for_backward(out)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (out,) = ctx.saved_tensors
        return torch.ops.aten.threshold_backward(grad, out, 0).mul_(ctx.scale), None, None
