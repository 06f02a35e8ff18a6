"""Cumulative log gates: ``G = cumsum(g)`` over the time axis in one pass, and its adjoint.

FoX's bias ``G_i − G_j`` (the flash family) and PaTH-FoX's need ``G``; their backward turns ``dG``
into ``dg`` by the reversed sum. PyTorch's scan over a middle axis runs one thread per column,
which at ``B = 1`` costs milliseconds; this kernel scans tiles of ``BLOCK_T`` steps on chip.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["cumulative_gates"]


@triton.jit
def _add(a, b):
    """The scan's combine function. (Ours rather than ``tl.cumsum``'s: Triton's own is decorated when
    Triton is first imported, and if PyTorch imported Triton before :mod:`kernels` set
    ``TRITON_INTERPRET``, it is a compiled function the interpreter cannot call.)"""
    return a + b


@triton.jit
def _cumsum_kernel(x_ptr, y_ptr, T, H, sxb, sxt, sxh, syb, syt, syh,
                   BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, REVERSE: tl.constexpr):
    """``y = cumsum(x)`` over ``T`` (``REVERSE``: from the end), float32, for a block of heads of one
    batch element: tiles of ``BLOCK_T`` steps, each scanned on chip and offset by the running total."""
    i_b = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1)
    o_h = i_h * BLOCK_H + tl.arange(0, BLOCK_H)
    carry = tl.zeros([BLOCK_H], dtype=tl.float32)
    for i in range(0, tl.cdiv(T, BLOCK_T)):
        if REVERSE:
            o_t = T - (i + 1) * BLOCK_T + tl.arange(0, BLOCK_T)
        else:
            o_t = i * BLOCK_T + tl.arange(0, BLOCK_T)
        keep = ((o_t >= 0) & (o_t < T))[:, None] & (o_h < H)[None, :]
        x = tl.load(x_ptr + i_b * sxb + o_t[:, None] * sxt + o_h[None, :] * sxh, mask=keep,
                    other=0.0).to(tl.float32)
        y = tl.associative_scan(x, 0, _add, reverse=REVERSE) + carry[None, :]
        carry += tl.sum(x, 0)
        tl.store(y_ptr + i_b * syb + o_t[:, None] * syt + o_h[None, :] * syh,
                 y.to(y_ptr.dtype.element_ty), mask=keep)


def cumulative_gates(x, *, reverse: bool = False, out_dtype=torch.float32, time_dim: int = 1):
    """``cumsum(x)`` over the time axis ``time_dim`` of a 3-D ``x`` (``[B, T, H]`` or ``[B, H, T]``),
    accumulated in float32, as a ``[B, T, H]`` tensor of ``out_dtype`` (``reverse``: ``y_t =
    Σ_{s ≥ t} x_s``). One pass on the GPU: PyTorch's scan over a middle axis runs one thread per
    column, which at ``B = 1`` costs milliseconds."""
    if time_dim == 1:
        B, T, H = x.shape
        sxb, sxt, sxh = x.stride()
    else:
        B, H, T = x.shape
        sxb, sxh, sxt = x.stride()
    y = torch.empty((B, T, H), dtype=out_dtype, device=x.device)
    block_h = min(triton.next_power_of_2(H), 16)
    _cumsum_kernel[(B, triton.cdiv(H, block_h))](x, y, T, H, sxb, sxt, sxh, *y.stride(), BLOCK_T=256,
                                                  BLOCK_H=block_h, REVERSE=reverse)
    return y
