"""Stage: the forward, ``y = act(conv(x) + bias) + residual``, and the final state.

Both kernels read ``concat(state, x)`` along time through :func:`_rows`: row ``r >= 0`` of a batch
is ``x_r``, row ``-W <= r < 0`` is state slot ``W + r`` (so slot ``W - 1`` is ``x_{-1}``, the newest
past input), anything else is zero. The convolution of a tile of rows ``t`` is then ``W`` shifted
reads, ``sum_j w[:, W-1-j] ⊙ rows(t - j)``; the final state is ``rows(T - W .. T - 1)``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import launch

__all__ = ["conv_forward", "final_state", "ACTIVATION_CODES"]

#: the activation as a kernel constant: 0 none, 1 SiLU (fla's "silu" and "swish" alike)
ACTIVATION_CODES = {None: 0, "silu": 1, "swish": 1}


@triton.jit
def _rows(x, s, i_b, rows, lo, o_d, m_d, sxb, sxt, T, D, W: tl.constexpr, HAS_STATE: tl.constexpr):
    """Rows ``rows`` (a vector; ``lo`` its smallest, a scalar) of ``concat(state, x)`` for batch ``i_b``
    and channels ``o_d``, as a float32 ``[len(rows), BD]`` tile. ``x`` has unit channel stride and
    strides ``sxb, sxt``; the state is ``[B, D, W]`` contiguous. Only a tile that reaches before the
    first token touches the state."""
    m = (rows >= 0) & (rows < T)
    p = x + i_b.to(tl.int64) * sxb + rows.to(tl.int64)[:, None] * sxt + o_d[None, :]
    v = tl.load(p, mask=m[:, None] & m_d[None, :], other=0.0).to(tl.float32)
    if HAS_STATE:
        if lo < 0:
            ms = (rows < 0) & (rows >= -W)
            ps = s + i_b.to(tl.int64) * D * W + o_d[None, :].to(tl.int64) * W + (rows + W)[:, None]
            v += tl.load(ps, mask=ms[:, None] & m_d[None, :], other=0.0).to(tl.float32)
    return v


@triton.jit
def _tap(w, o_d, m_d, j, W: tl.constexpr):
    """The taps of lag ``j`` (``weight[:, W - 1 - j]``) of channels ``o_d``, float32."""
    return tl.load(w + o_d * W + (W - 1 - j), mask=m_d, other=0.0).to(tl.float32)


@triton.jit
def _preactivation(x, s, w, bias, i_b, o_t, lo, o_d, m_d, sxb, sxt, T, D, W: tl.constexpr,
                   HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr):
    """``z = sum_j w_j ⊙ rows(o_t - j) + bias``: the convolution of rows ``o_t`` (smallest ``lo``),
    float32 ``[len(o_t), BD]``."""
    z = _tap(w, o_d, m_d, 0, W)[None, :] * _rows(x, s, i_b, o_t, lo, o_d, m_d, sxb, sxt, T, D, W, HAS_STATE)
    for j in tl.static_range(1, W):
        z += _tap(w, o_d, m_d, j, W)[None, :] * _rows(x, s, i_b, o_t - j, lo - j, o_d, m_d, sxb, sxt, T, D, W,
                                                     HAS_STATE)
    if HAS_BIAS:
        z += tl.load(bias + o_d, mask=m_d, other=0.0).to(tl.float32)[None, :]
    return z


@triton.jit
def _conv_fwd_kernel(x, w, bias, res, s, y, T, D, sxb, sxt, srb, srt, W: tl.constexpr, BT: tl.constexpr,
                     BD: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                     HAS_STATE: tl.constexpr):
    """One ``[BT, BD]`` tile of ``y`` (contiguous ``[B, T, D]``, ``y``'s dtype)."""
    i_t, i_d, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t0 = i_t * BT
    o_t = t0 + tl.arange(0, BT)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    m = (o_t < T)[:, None] & m_d[None, :]
    z = _preactivation(x, s, w, bias, i_b, o_t, t0, o_d, m_d, sxb, sxt, T, D, W, HAS_BIAS, HAS_STATE)
    if ACT == 1:
        z = z * tl.sigmoid(z)
    if HAS_RES:
        pr = res + i_b.to(tl.int64) * srb + o_t.to(tl.int64)[:, None] * srt + o_d[None, :]
        z += tl.load(pr, mask=m, other=0.0).to(tl.float32)
    py = y + i_b.to(tl.int64) * T * D + o_t.to(tl.int64)[:, None] * D + o_d[None, :]
    tl.store(py, z.to(y.dtype.element_ty), mask=m)


@triton.jit
def _final_state_kernel(x, s, ht, T, D, sxb, sxt, W: tl.constexpr, BW: tl.constexpr, BD: tl.constexpr,
                        HAS_STATE: tl.constexpr):
    """``ht[b, :, i] = rows(T - W + i)``, ``i < W``: the last ``W`` rows of ``concat(state, x)``."""
    i_d, i_b = tl.program_id(0), tl.program_id(1)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    o_i = tl.arange(0, BW)
    v = _rows(x, s, i_b, T - W + o_i, T - W, o_d, m_d, sxb, sxt, T, D, W, HAS_STATE)     # [BW, BD]
    p = ht + i_b.to(tl.int64) * D * W + o_d[None, :].to(tl.int64) * W + o_i[:, None]
    tl.store(p, v.to(ht.dtype.element_ty), mask=(o_i < W)[:, None] & m_d[None, :])


def conv_forward(x, weight, bias, residual, state, activation, plan):
    """``y`` ``[B, T, D]`` contiguous in ``x``'s dtype. ``x`` and ``residual`` with unit channel stride
    (any batch and time strides); ``weight``, ``bias``, ``state`` contiguous."""
    B, T, D = x.shape
    W = weight.shape[1]
    y = torch.empty(B, T, D, dtype=x.dtype, device=x.device)
    r = residual if residual is not None else x
    grid = (triton.cdiv(T, plan.fwd_bt), triton.cdiv(D, plan.fwd_bd), B)
    launch(_conv_fwd_kernel, grid,
           (x, weight, bias if bias is not None else weight, r, state if state is not None else x, y, T, D,
            x.stride(0), x.stride(1), r.stride(0), r.stride(1)),
           dict(W=W, BT=plan.fwd_bt, BD=plan.fwd_bd, ACT=ACTIVATION_CODES[activation], HAS_BIAS=bias is not None,
                HAS_RES=residual is not None, HAS_STATE=state is not None), plan.fwd)
    return y


def final_state(x, state, W: int, plan):
    """The state after ``x``: ``[B, D, W]`` in ``x``'s dtype, the last ``W`` rows of
    ``concat(state, x)`` (zeros in front when there is no state)."""
    B, T, D = x.shape
    ht = torch.empty(B, D, W, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(D, plan.small_bd), B)
    launch(_final_state_kernel, grid, (x, state if state is not None else x, ht, T, D, x.stride(0), x.stride(1)),
           dict(W=W, BW=triton.next_power_of_2(W), BD=plan.small_bd, HAS_STATE=state is not None), plan.small)
    return ht
