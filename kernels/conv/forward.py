"""Stage: the forward, ``y = act(conv(x) + bias) + residual``, and the final state.

Every kernel reads ``concat(state, x)`` along time: row ``r >= 0`` of a batch is ``x_r``, row
``-W <= r < 0`` is state slot ``W + r`` (so slot ``W - 1`` is ``x_{-1}``, the newest past input),
anything else is zero. The convolution of rows ``t`` is ``sum_j w[:, W-1-j] ⊙ rows(t - j)``; the
final state is ``rows(T - W .. T - 1)``. Two forwards compute ``y``:

- **marching** (widths 1 to :data:`MAX_MARCH_WIDTH`, the models' widths): a program owns ``SEG``
  consecutive tokens of ``BD`` channels and walks them four rows per step (four loads in flight),
  the last three rows carried in registers, so every input row is read from memory once (plus
  three rows per segment). On the H200 it took 0.81 of the tiled form's time
  (``lab/logs/sweep_march.json``, NOTES);
- **tiled** (any width up to ``MAX_WIDTH``): one ``[BT, BD]`` tile per program, ``W`` shifted reads
  of it (:func:`_rows`), the re-reads served by L1/L2. The backward's ``dx`` pass uses its tiles.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import launch

__all__ = ["conv_forward", "final_state", "ACTIVATION_CODES", "MAX_MARCH_WIDTH"]

#: the activation as a kernel constant: 0 none, 1 SiLU (fla's "silu" and "swish" alike)
ACTIVATION_CODES = {None: 0, "silu": 1, "swish": 1}
MAX_MARCH_WIDTH = 4     #: the widest convolution the marching forward unrolls (three rows carried)


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
def _row(x, s, i_b, r, o_d, m_d, sxb, sxt, T, D, W: tl.constexpr, HAS_STATE: tl.constexpr):
    """Row ``r`` (a scalar) of ``concat(state, x)`` for batch ``i_b`` and channels ``o_d``, float32
    ``[BD]``: the one-row :func:`_rows` of the marching forward."""
    v = tl.load(x + i_b.to(tl.int64) * sxb + r.to(tl.int64) * sxt + o_d, mask=m_d & (r >= 0) & (r < T),
                other=0.0).to(tl.float32)
    if HAS_STATE:
        ps = s + i_b.to(tl.int64) * D * W + o_d.to(tl.int64) * W + (r + W)
        v += tl.load(ps, mask=m_d & (r < 0) & (r >= -W), other=0.0).to(tl.float32)
    return v


@triton.jit
def _store_row(z, b, pr, py, t, m_d, T, D, srt, y, ACT: tl.constexpr, HAS_RES: tl.constexpr):
    """Row ``t`` of ``y`` from its convolution ``z``: ``act(z + bias) (+ residual)``, when ``t < T``."""
    z += b
    if ACT == 1:
        z = z * tl.sigmoid(z)
    m = m_d & (t < T)
    if HAS_RES:
        z += tl.load(pr + t.to(tl.int64) * srt, mask=m, other=0.0).to(tl.float32)
    tl.store(py + t.to(tl.int64) * D, z.to(y.dtype.element_ty), mask=m)


@triton.jit
def _conv_march_kernel(x, w, bias, res, s, y, T, D, sxb, sxt, srb, srt, W: tl.constexpr, SEG: tl.constexpr,
                       BD: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                       HAS_STATE: tl.constexpr):
    """Rows ``[i_s · SEG, (i_s + 1) · SEG)`` of ``y`` for channels ``i_d · BD + [0, BD)``, four rows per
    step (four loads in flight), with rows ``t - 1 .. t - 3`` carried in registers."""
    i_s, i_d, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    t0 = i_s * SEG
    w0 = _tap(w, o_d, m_d, 0, W)
    w1 = _tap(w, o_d, m_d, 1, W) if W > 1 else tl.zeros((BD,), dtype=tl.float32)
    w2 = _tap(w, o_d, m_d, 2, W) if W > 2 else tl.zeros((BD,), dtype=tl.float32)
    w3 = _tap(w, o_d, m_d, 3, W) if W > 3 else tl.zeros((BD,), dtype=tl.float32)
    # the rows before the segment (zeros or the state before the first token)
    h1 = _row(x, s, i_b, t0 - 1, o_d, m_d, sxb, sxt, T, D, W, HAS_STATE)
    h2 = _row(x, s, i_b, t0 - 2, o_d, m_d, sxb, sxt, T, D, W, HAS_STATE)
    h3 = _row(x, s, i_b, t0 - 3, o_d, m_d, sxb, sxt, T, D, W, HAS_STATE)
    b = tl.zeros((BD,), dtype=tl.float32)
    if HAS_BIAS:
        b = tl.load(bias + o_d, mask=m_d, other=0.0).to(tl.float32)
    px = x + i_b.to(tl.int64) * sxb + o_d
    py = y + i_b.to(tl.int64) * T * D + o_d
    pr = res + i_b.to(tl.int64) * srb + o_d
    for i in range(0, SEG, 4):
        t = t0 + i
        xa = tl.load(px + t.to(tl.int64) * sxt, mask=m_d & (t < T), other=0.0).to(tl.float32)
        xb = tl.load(px + (t + 1).to(tl.int64) * sxt, mask=m_d & (t + 1 < T), other=0.0).to(tl.float32)
        xc = tl.load(px + (t + 2).to(tl.int64) * sxt, mask=m_d & (t + 2 < T), other=0.0).to(tl.float32)
        xd = tl.load(px + (t + 3).to(tl.int64) * sxt, mask=m_d & (t + 3 < T), other=0.0).to(tl.float32)
        _store_row(w0 * xa + w1 * h1 + w2 * h2 + w3 * h3, b, pr, py, t, m_d, T, D, srt, y, ACT, HAS_RES)
        _store_row(w0 * xb + w1 * xa + w2 * h1 + w3 * h2, b, pr, py, t + 1, m_d, T, D, srt, y, ACT, HAS_RES)
        _store_row(w0 * xc + w1 * xb + w2 * xa + w3 * h1, b, pr, py, t + 2, m_d, T, D, srt, y, ACT, HAS_RES)
        _store_row(w0 * xd + w1 * xc + w2 * xb + w3 * xa, b, pr, py, t + 3, m_d, T, D, srt, y, ACT, HAS_RES)
        h1 = xd
        h2 = xc
        h3 = xb


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
    """``y`` ``[B, T, D]`` contiguous in ``x``'s dtype, by the marching forward when ``plan.march`` and
    ``W <= MAX_MARCH_WIDTH``, else by the tiled one. ``x`` and ``residual`` with unit channel stride
    (any batch and time strides); ``weight``, ``bias``, ``state`` contiguous."""
    B, T, D = x.shape
    W = weight.shape[1]
    y = torch.empty(B, T, D, dtype=x.dtype, device=x.device)
    r = residual if residual is not None else x
    args = (x, weight, bias if bias is not None else weight, r, state if state is not None else x, y, T, D,
            x.stride(0), x.stride(1), r.stride(0), r.stride(1))
    flags = dict(W=W, ACT=ACTIVATION_CODES[activation], HAS_BIAS=bias is not None, HAS_RES=residual is not None,
                 HAS_STATE=state is not None)
    if plan.march and W <= MAX_MARCH_WIDTH:
        grid = (triton.cdiv(T, plan.march_seg), triton.cdiv(D, plan.march_bd), B)
        launch(_conv_march_kernel, grid, args, dict(flags, SEG=plan.march_seg, BD=plan.march_bd), plan.fwd_march)
    else:
        grid = (triton.cdiv(T, plan.fwd_bt), triton.cdiv(D, plan.fwd_bd), B)
        launch(_conv_fwd_kernel, grid, args, dict(flags, BT=plan.fwd_bt, BD=plan.fwd_bd), plan.fwd)
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
