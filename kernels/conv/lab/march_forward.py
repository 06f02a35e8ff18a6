"""Lab: a forward that marches along time, off the shipped path (not yet timed on a GPU).

The shipped forward (:mod:`kernels.conv.forward`) computes one ``[BT, BD]`` tile per program and
reads every input ``W`` times, once per tap, ``W - 1`` of them from the L1/L2 caches. On the H200
it ran at about 0.70 of a copy's bandwidth; issue 23's forward target (0.8x fla's time) needs
about 0.82 (``NOTES.md``). This variant reads every input row once: a program owns ``BD`` channels
of one batch and ``SEG`` consecutive tokens, walks them four rows per step (four independent loads
in flight per thread; the compile check shows the loop is not software-pipelined through shared
memory, so the unrolling is what hides the latency), and keeps the last three rows in registers
(``h1``, ``h2``, ``h3``: rows ``t-1``, ``t-2``, ``t-3``), each output row a sum of taps over those
and the step's rows. Only the three rows before a segment are read twice (``3 / SEG`` extra).

Widths 1 to 4 (fla's models use 2 to 4); the same arguments and results as
:func:`kernels.conv.forward.conv_forward` (``tests/test_kernel_conv.py`` checks them equal).
``lab/sweep_march.py`` is the measurement to run: segment lengths, channel blocks, warps and
stages against the shipped forward and a copy.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.backend import Launch, launch
from kernels.conv.forward import ACTIVATION_CODES, _tap

__all__ = ["march_forward", "MAX_MARCH_WIDTH"]

MAX_MARCH_WIDTH = 4     #: the widest convolution this variant unrolls (three rows kept in registers)


@triton.jit
def _row(x, s, i_b, r, o_d, m_d, sxb, sxt, T, D, W: tl.constexpr, HAS_STATE: tl.constexpr):
    """Row ``r`` (a scalar) of ``concat(state, x)`` for batch ``i_b`` and channels ``o_d``, float32
    ``[BD]``: ``x_r`` for ``0 <= r < T``, state slot ``W + r`` for ``-W <= r < 0``, else zero."""
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
def _march_fwd_kernel(x, w, bias, res, s, y, T, D, sxb, sxt, srb, srt, W: tl.constexpr, SEG: tl.constexpr,
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


def march_forward(x, weight, bias, residual, state, activation, *, seg: int = 64, bd: int = 512,
                  launches=(Launch(4, 3),)):
    """``y`` as :func:`kernels.conv.forward.conv_forward` returns it (``[B, T, D]``, ``x``'s dtype), by
    the marching kernel: ``seg`` tokens (a power of two, at least 4) and ``bd`` channels (a power of
    two) per program, ``launches`` the warps and stages to try. Widths 1 to :data:`MAX_MARCH_WIDTH`."""
    B, T, D = x.shape
    W = weight.shape[1]
    if not 1 <= W <= MAX_MARCH_WIDTH:
        raise ValueError(f"weight must have 1 to {MAX_MARCH_WIDTH} taps for the marching forward; got {W}")
    for name, v, low in (("seg", seg, 4), ("bd", bd, 1)):
        if v < low or v & (v - 1):
            raise ValueError(f"{name} must be a power of two >= {low}; got {v!r}")
    y = torch.empty(B, T, D, dtype=x.dtype, device=x.device)
    r = residual if residual is not None else x
    grid = (triton.cdiv(T, seg), triton.cdiv(D, bd), B)
    launch(_march_fwd_kernel, grid,
           (x, weight, bias if bias is not None else weight, r, state if state is not None else x, y, T, D,
            x.stride(0), x.stride(1), r.stride(0), r.stride(1)),
           dict(W=W, SEG=seg, BD=bd, ACT=ACTIVATION_CODES[activation], HAS_BIAS=bias is not None,
                HAS_RES=residual is not None, HAS_STATE=state is not None), launches)
    return y
