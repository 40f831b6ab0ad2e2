"""Skip decorators for tests, modelled on ``torch_geometric.testing``."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch_geometric.typing

__all__ = ["requires_cuda", "requires_sampler", "requires_torch_sparse", "with_package"]

requires_sampler: Callable[[Any], Any] = pytest.mark.skipif(
    not (torch_geometric.typing.WITH_PYG_LIB or torch_geometric.typing.WITH_TORCH_SPARSE),
    reason="neighbour sampling needs pyg-lib or torch-sparse (run install.sh)",
)
requires_torch_sparse: Callable[[Any], Any] = pytest.mark.skipif(
    not torch_geometric.typing.WITH_TORCH_SPARSE,
    reason="GraphSAINT needs torch-sparse (run install.sh)",
)
requires_cuda: Callable[[Any], Any] = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"
)


def with_package(name: str) -> Callable[[Any], Any]:
    """Skip unless ``name`` can be imported."""
    return pytest.mark.skipif(
        importlib.util.find_spec(name) is None, reason=f"needs the {name} package"
    )
