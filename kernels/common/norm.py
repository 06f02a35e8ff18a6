"""fla's ``use_qk_l2norm_in_kernel``: queries and keys scaled to unit length inside the op.

fla's delta-rule ops and MesaNet take ``use_qk_l2norm_in_kernel=True`` (its layers pass it), and
normalise ``q`` and ``k`` in a kernel of their own before the recurrence, as
``x / sqrt(Σ x² + eps)`` with ``eps = 1e-6`` in float32, stored in the input's dtype. Ours does the
same in PyTorch in front of the kernels (no fusion: one more read and write of ``q`` and ``k``),
so autograd gives the normalisation's backward.
"""
from __future__ import annotations

import torch

from ..validate import check_flag

__all__ = ["L2NORM_EPS", "l2norm", "qk_l2norm"]

L2NORM_EPS = 1e-6   #: fla's ``l2norm`` epsilon, added to the sum of squares


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """``x / sqrt(Σ x² + eps)`` over the last axis, in float32, returned in ``x``'s dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().sum(-1, keepdim=True) + eps)).to(x.dtype)


def qk_l2norm(q, k, use_qk_l2norm_in_kernel: bool):
    """``(q, k)`` normalised by :func:`l2norm` when the flag is set, else as given; ``ValueError``
    unless the flag is a bool."""
    if check_flag(use_qk_l2norm_in_kernel, "use_qk_l2norm_in_kernel"):
        return l2norm(q), l2norm(k)
    return q, k
