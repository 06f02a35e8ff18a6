"""Lab: a backward that marches along time in one pass, off the shipped path (not yet timed on a GPU).

The shipped backward (:mod:`kernels.conv.backward`) takes two passes: the first reads ``x`` and
``dy`` and writes ``dz = dy ⊙ act'(z)`` with the partial sums of ``dw`` and ``db``; the second reads
``dz`` back and writes ``dx``. That moves ``5·N`` elements (``N = B·T·D``) where ``3·N`` would do
(read ``x`` and ``dy``, write ``dx``): on the H200 the forward + backward ran at 0.34–0.35 of a
copy's bandwidth by the ``5·N`` count of the whole step (``NOTES.md``, round 2). The tiled fused
backward (``lab/fused_backward.py``) avoided the round trip by recomputing ``z`` on ``W`` shifted
copies of each tile and was twice as slow.

This variant marches like the shipped forward: a program owns ``SEG`` consecutive tokens of ``BD``
channels and walks them four rows per step, carrying the last three rows of ``x`` and of ``dz`` in
registers. At row ``t`` it forms ``dz_t`` (from ``x_{t-3..t}`` and ``dy_t``), adds ``dz_t ⊙ x_{t-j}``
to its ``dw`` registers and ``dz_t`` to ``db``, and completes ``dx_{t-3} = Σ_j w_j ⊙ dz_{t-3+j}``. One
extra step past the segment supplies the ``dz`` of the next segment's first rows, which the last
``dx`` rows need (they are not added to ``dw``, ``db``). So ``x`` and ``dy`` are read once (plus
four rows per segment), ``dx`` is written once, and ``dz`` never leaves the chip. The partial sums
of ``dw``, ``db`` (one ``[BD, W]`` row per program) are added by the shipped
:func:`kernels.conv.backward._sum_rows` in a fixed order; the initial state's gradient stays
:func:`kernels.conv.backward.state_grad`.

Widths 1 to 4. ``tests/test_kernel_conv.py`` checks it equal to the shipped backward on the
interpreter; ``lab/sweep_march.py --backward`` is the measurement to run.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.backend import Launch, launch
from kernels.conv.backward import _silu_grad, _sum_rows
from kernels.conv.forward import ACTIVATION_CODES, MAX_MARCH_WIDTH, _row, _tap

__all__ = ["march_backward"]


@triton.jit
def _dz_row(g, x0, x1, x2, x3, w0, w1, w2, w3, b, ACT: tl.constexpr):
    """``dz`` of one row: ``dy ⊙ SiLU'(z)`` with ``z = w0 x_t + w1 x_{t-1} + w2 x_{t-2} + w3 x_{t-3} + b``
    (``dy`` itself without an activation)."""
    if ACT == 1:
        g = _silu_grad(g, w0 * x0 + w1 * x1 + w2 * x2 + w3 * x3 + b)
    return g


@triton.jit
def _store_dx(acc, dht, i_b, s, o_d, m_d, lo, hi, T, D, pdx, dx, W: tl.constexpr, HAS_DHT: tl.constexpr):
    """Row ``s`` of ``dx`` (``acc`` plus the final state's gradient when ``s >= T - W``), stored when
    ``lo <= s < hi`` and ``s < T``."""
    m = m_d & (s >= lo) & (s < hi) & (s < T)
    if HAS_DHT:
        k = s - T + W
        ph = dht + i_b.to(tl.int64) * D * W + o_d.to(tl.int64) * W + k
        acc += tl.load(ph, mask=m & (k >= 0), other=0.0).to(tl.float32)
    tl.store(pdx + s.to(tl.int64) * D, acc.to(dx.dtype.element_ty), mask=m)


@triton.jit
def _march_bwd_kernel(x, w, bias, s, dy, dht, dx, dwp, dbp, T, D, NS, sxb, sxt, sdb, sdt, W: tl.constexpr,
                      SEG: tl.constexpr, BD: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
                      HAS_STATE: tl.constexpr, HAS_DHT: tl.constexpr, NEED_DW: tl.constexpr,
                      NEED_DB: tl.constexpr):
    """Rows ``[i_s · SEG, (i_s + 1) · SEG)`` of ``dx`` for channels ``i_d · BD + [0, BD)``, and this
    program's partial row of ``dw`` (``[BD, W]``, the weight's layout) and ``db``."""
    i_s, i_d, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    t0 = i_s * SEG
    zero = tl.zeros((BD,), dtype=tl.float32)
    w0 = _tap(w, o_d, m_d, 0, W)
    w1 = _tap(w, o_d, m_d, 1, W) if W > 1 else zero
    w2 = _tap(w, o_d, m_d, 2, W) if W > 2 else zero
    w3 = _tap(w, o_d, m_d, 3, W) if W > 3 else zero
    b = zero
    if HAS_BIAS:
        b = tl.load(bias + o_d, mask=m_d, other=0.0).to(tl.float32)
    h1 = _row(x, s, i_b, t0 - 1, o_d, m_d, sxb, sxt, T, D, W, HAS_STATE)     # x_{t-1}, x_{t-2}, x_{t-3}
    h2 = _row(x, s, i_b, t0 - 2, o_d, m_d, sxb, sxt, T, D, W, HAS_STATE)
    h3 = _row(x, s, i_b, t0 - 3, o_d, m_d, sxb, sxt, T, D, W, HAS_STATE)
    e1 = zero                                                                 # dz_{t-1}, dz_{t-2}, dz_{t-3}
    e2 = zero
    e3 = zero
    dw0 = zero
    dw1 = zero
    dw2 = zero
    dw3 = zero
    db = zero
    px = x + i_b.to(tl.int64) * sxb + o_d
    pg = dy + i_b.to(tl.int64) * sdb + o_d
    pdx = dx + i_b.to(tl.int64) * T * D + o_d
    for i in range(0, SEG + 4, 4):          # the last step: the next segment's first rows, for dx only
        t = t0 + i
        xa = tl.load(px + t.to(tl.int64) * sxt, mask=m_d & (t < T), other=0.0).to(tl.float32)
        xb = tl.load(px + (t + 1).to(tl.int64) * sxt, mask=m_d & (t + 1 < T), other=0.0).to(tl.float32)
        xc = tl.load(px + (t + 2).to(tl.int64) * sxt, mask=m_d & (t + 2 < T), other=0.0).to(tl.float32)
        xd = tl.load(px + (t + 3).to(tl.int64) * sxt, mask=m_d & (t + 3 < T), other=0.0).to(tl.float32)
        ga = tl.load(pg + t.to(tl.int64) * sdt, mask=m_d & (t < T), other=0.0).to(tl.float32)
        gb = tl.load(pg + (t + 1).to(tl.int64) * sdt, mask=m_d & (t + 1 < T), other=0.0).to(tl.float32)
        gc = tl.load(pg + (t + 2).to(tl.int64) * sdt, mask=m_d & (t + 2 < T), other=0.0).to(tl.float32)
        gd = tl.load(pg + (t + 3).to(tl.int64) * sdt, mask=m_d & (t + 3 < T), other=0.0).to(tl.float32)
        za = _dz_row(ga, xa, h1, h2, h3, w0, w1, w2, w3, b, ACT)
        zb = _dz_row(gb, xb, xa, h1, h2, w0, w1, w2, w3, b, ACT)
        zc = _dz_row(gc, xc, xb, xa, h1, w0, w1, w2, w3, b, ACT)
        zd = _dz_row(gd, xd, xc, xb, xa, w0, w1, w2, w3, b, ACT)
        inside = tl.where(i < SEG, 1.0, 0.0)   # the extra step adds nothing to dw, db
        if NEED_DW:
            dw0 += inside * (za * xa + zb * xb + zc * xc + zd * xd)
            dw1 += inside * (za * h1 + zb * xa + zc * xb + zd * xc)
            dw2 += inside * (za * h2 + zb * h1 + zc * xa + zd * xb)
            dw3 += inside * (za * h3 + zb * h2 + zc * h1 + zd * xa)
        if NEED_DB:
            db += inside * (za + zb + zc + zd)
        # dx_{t-3} .. dx_t, each complete now that dz_{t+3} is known
        _store_dx(w0 * e3 + w1 * e2 + w2 * e1 + w3 * za, dht, i_b, t - 3, o_d, m_d, t0, t0 + SEG, T, D, pdx, dx,
                  W, HAS_DHT)
        _store_dx(w0 * e2 + w1 * e1 + w2 * za + w3 * zb, dht, i_b, t - 2, o_d, m_d, t0, t0 + SEG, T, D, pdx, dx,
                  W, HAS_DHT)
        _store_dx(w0 * e1 + w1 * za + w2 * zb + w3 * zc, dht, i_b, t - 1, o_d, m_d, t0, t0 + SEG, T, D, pdx, dx,
                  W, HAS_DHT)
        _store_dx(w0 * za + w1 * zb + w2 * zc + w3 * zd, dht, i_b, t, o_d, m_d, t0, t0 + SEG, T, D, pdx, dx,
                  W, HAS_DHT)
        h1 = xd
        h2 = xc
        h3 = xb
        e1 = zd
        e2 = zc
        e3 = zb
    row = (i_b * NS + i_s).to(tl.int64)
    if NEED_DW:                              # weight[:, W - 1 - j] is the tap of lag j
        pw = dwp + row * D * W + o_d.to(tl.int64) * W + (W - 1)
        tl.store(pw, dw0, mask=m_d)
        if W > 1:
            tl.store(pw - 1, dw1, mask=m_d)
        if W > 2:
            tl.store(pw - 2, dw2, mask=m_d)
        if W > 3:
            tl.store(pw - 3, dw3, mask=m_d)
    if NEED_DB:
        tl.store(dbp + row * D + o_d, db, mask=m_d)


def march_backward(x, weight, bias, state, dy, dht, activation, plan, *, need_dw: bool, need_db: bool,
                   seg: int = 128, bd: int = 256, launches=(Launch(4, 1),)):
    """``(dx, dw, db)`` as :func:`kernels.conv.backward.conv_backward` returns them, in one marching
    pass: ``seg`` tokens (a power of two, at least 4) and ``bd`` channels (a power of two) per
    program; ``plan`` supplies the partial-sum reduction's tile. Widths 1 to 4."""
    B, T, D = x.shape
    W = weight.shape[1]
    if not 1 <= W <= MAX_MARCH_WIDTH:
        raise ValueError(f"weight must have 1 to {MAX_MARCH_WIDTH} taps for the marching backward; got {W}")
    for name, v, low in (("seg", seg, 4), ("bd", bd, 1)):
        if v < low or v & (v - 1):
            raise ValueError(f"{name} must be a power of two >= {low}; got {v!r}")
    NS = triton.cdiv(T, seg)
    dx = torch.empty(B, T, D, dtype=x.dtype, device=x.device)
    dwp = torch.empty(B * NS, D, W, dtype=torch.float32, device=x.device) if need_dw else dx
    dbp = torch.empty(B * NS, D, dtype=torch.float32, device=x.device) if need_db else dx
    launch(_march_bwd_kernel, (NS, triton.cdiv(D, bd), B),
           (x, weight, bias if bias is not None else weight, state if state is not None else x, dy,
            dht if dht is not None else dy, dx, dwp, dbp, T, D, NS, x.stride(0), x.stride(1), dy.stride(0),
            dy.stride(1)),
           dict(W=W, SEG=seg, BD=bd, ACT=ACTIVATION_CODES[activation], HAS_BIAS=bias is not None,
                HAS_STATE=state is not None, HAS_DHT=dht is not None, NEED_DW=need_dw, NEED_DB=need_db), launches)
    dw = _sum_rows(dwp, torch.empty_like(weight), plan) if need_dw else None
    db = _sum_rows(dbp, torch.empty_like(bias), plan) if need_db else None
    return dx, dw, db
