"""Any head size up to 256 on every op.

The Triton kernels tile a few head sizes (powers of two). An op given another one pads its head
axes with zeros up to the next size a kernel tiles, runs the kernel, and cuts the padding off the
outputs. This is exact for everything the book's ops compute with a head axis:

- a zero column of ``q``, ``k`` or ``w`` adds nothing to any dot product (scores, ``k·k``,
  ``w·k``, the delta rule's ``S^T k``), so every score, softmax, solve and gate is unchanged;
- a zero column of ``v`` gives a zero column of ``o``, which is cut;
- states padded with zeros stay zero in the padded rows and columns (each update adds an outer
  product of padded vectors), and MesaNet's ``H_t + Diag(lamb)`` is block-diagonal with the
  padded block ``Diag(lamb_pad)``, whose right-hand side is zero, so conjugate gradients never
  move there.

Gradients flow through the padding and the cut (autograd), so the padded entries' gradients are
simply dropped. Above a family's largest tile (and up to :data:`MAX_HEAD`) the op runs its
differentiable PyTorch implementation on the device instead (correct, not fast); a head size
over :data:`MAX_HEAD` raises ``ValueError`` (fla's largest), except for the gla family's ops, which
take up to :data:`GLA_MAX_HEAD` as fla's do.
"""
from __future__ import annotations

import torch

__all__ = ["MAX_HEAD", "GLA_MAX_HEAD", "head_tile", "pad_axis"]

MAX_HEAD = 256   #: the largest head size every op takes (fla's largest for all but GLA)
GLA_MAX_HEAD = 1024   #: the gla family's largest (fla's GLA tests pass 320 and 512)


def head_tile(name: str, d: int, sizes, max_head: int = MAX_HEAD) -> int | None:
    """The size the kernels run a head axis of size ``d`` at: the smallest of ``sizes`` that holds
    it, or ``None`` when ``d`` is over the largest (the PyTorch path). ``ValueError`` naming the axis
    (``name``) when ``d`` is outside ``1 .. max_head`` (:data:`MAX_HEAD`, except where a family's
    peer takes more: fla's GLA tests pass 320 and 512)."""
    d = int(d)
    if not 1 <= d <= max_head:
        raise ValueError(f"{name} must be between 1 and {max_head}; got {d}")
    fits = [s for s in sorted(sizes) if s >= d]
    return fits[0] if fits else None


def pad_axis(x, size: int, dim: int = -1, value: float = 0.0):
    """``x`` padded with ``value`` at the end of axis ``dim`` up to ``size`` (``x`` itself when it
    is that size already, ``None`` for ``None``)."""
    if x is None:
        return None
    dim = dim % x.dim()
    extra = int(size) - x.shape[dim]
    if extra == 0:
        return x
    if extra < 0:
        raise ValueError(f"cannot pad axis {dim} of size {x.shape[dim]} down to {size}")
    pad = [0, 0] * (x.dim() - dim)
    pad[-1] = extra            # F.pad lists (before, after) from the last axis backwards
    return torch.nn.functional.pad(x, pad, value=value)
