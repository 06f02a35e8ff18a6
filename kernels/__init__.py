"""PyTorch ops backed by Triton kernels, with fla's names, argument order and layout.

On a machine without a CUDA device, importing this package sets ``TRITON_INTERPRET=1`` (before any
kernel is decorated) so that ``backend="triton"`` can run the kernels through Triton's interpreter;
the default on CPU tensors is the differentiable PyTorch implementation in :mod:`kernels.reference`.
"""
import os as _os

try:
    import torch as _torch
    if not _torch.cuda.is_available():
        _os.environ.setdefault("TRITON_INTERPRET", "1")
except Exception:  # pragma: no cover
    pass

from ._common import HAS_TRITON, INTERPRET, resolve_backend  # noqa: E402
from .ops import (chunk_delta_rule, chunk_gated_delta_rule, chunk_gla, chunk_linear_attn,  # noqa: E402
                  chunk_simple_gla, flash_attention)

__all__ = ["flash_attention", "chunk_linear_attn", "chunk_simple_gla", "chunk_gla",
           "chunk_delta_rule", "chunk_gated_delta_rule", "HAS_TRITON", "INTERPRET", "resolve_backend"]
