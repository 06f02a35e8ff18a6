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

__all__ = ["MAX_HEAD", "GLA_MAX_HEAD", "head_tile", "pad_axis", "share_heads"]

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


def share_heads(like, like_name: str, **tensors):
    """fla's grouped heads (GQA: ``k, v`` shared by groups of query heads; GVA: ``q, k`` shared by
    groups of value heads). ``like`` (named ``like_name``) holds the full head count ``H`` on its
    axis 2 (``q`` for GQA, ``v`` for GVA); ``tensors`` (by name) are the shared ones, which hold one
    head count between them (axis 2): ``H`` (nothing to share), or a whole divisor ``H / G`` of it,
    and then each is repeated ``G`` times along it, head ``h`` serving ``h·G .. h·G + G − 1`` (fla's
    order, ``repeat_interleave``), so the op sees one head count; the gradients sum over each group
    (autograd). Returns them in the order given. Shared tensors of different head counts, or of a
    count that does not divide ``H``, raise ``ValueError`` naming one; ``None``, non-tensors,
    tensors of under 3 axes and a ``like`` that is not a tensor of 3 axes or more are passed over
    (returned as given, for the op's own checks to judge). The kernels then read each shared head
    ``G`` times from memory: correct, not fla's saving."""
    if not isinstance(like, torch.Tensor) or like.dim() < 3 or like.shape[2] < 1:
        return tuple(tensors.values())
    heads = like.shape[2]
    shared = {n: t for n, t in tensors.items() if isinstance(t, torch.Tensor) and t.dim() >= 3}
    if not shared:
        return tuple(tensors.values())
    first, t0 = next(iter(shared.items()))
    h = t0.shape[2]
    for name, t in shared.items():
        if t.shape[2] != h:
            raise ValueError(f"{name} must have the heads of {first} ({h}, axis 2: the shared tensors have one head "
                             f"count); got {t.shape[2]}")
    if h == heads:
        return tuple(tensors.values())
    if not (0 < h < heads and heads % h == 0):
        raise ValueError(f"{first} must have the {heads} heads of {like_name} (axis 2) or a whole divisor of them "
                         f"(fla's grouped heads); got {h}")
    return tuple(t.repeat_interleave(heads // h, dim=2) if n in shared else t for n, t in tensors.items())
