"""Stage: the gradients, all from ``dz = dy ⊙ act'(z)`` (``z`` the convolution plus bias, recomputed).

- ``dx_t = sum_j w_j ⊙ dz_{t+j} + dht[:, t - T + W]``: the same taps run backwards in time (the
  transposed convolution), plus the final state's gradient for the last ``W`` tokens that it holds;
- ``dw_j = sum_{b,t} dz_t ⊙ concat(state, x)_{t-j}``, ``db = sum_{b,t} dz_t``: each program keeps its
  terms in registers and writes one partial sum; :func:`_sum_rows_kernel` adds the partials in a
  fixed order (deterministic, no atomics);
- the initial state's slot ``i`` collects ``w_j ⊙ dz_t`` of the tokens ``t < i`` that read it
  (``i = t + W - j``) and, when ``T <= i``, the final state's slot ``i - T`` that holds it unchanged
  (the case fla's tracker #1140 got wrong): :func:`state_grad`, one small program per channel block.

Two ways to get ``dx``, as the forward has two:

- **marching** (widths 1 to :data:`~kernels.conv.forward.MAX_MARCH_WIDTH`, the plan's default):
  :func:`_march_bwd_kernel` walks ``bwd_march_seg`` tokens four rows per step, forms ``dz`` from
  ``x`` and ``dy``, adds its terms to ``dw`` and ``db`` and completes ``dx`` three rows behind,
  so ``x`` and ``dy`` are read once, ``dx`` is written once and ``dz`` never leaves the chip. On the
  H200 it took 0.35 of the two-pass time (``lab/logs/sweep_march_backward.json``, NOTES);
- **two passes** (any width): :func:`_dz_kernel` writes ``dz`` with the partial sums (``bwd_steps``
  tiles per program, summed element by element in a ``[BT, BD, W]`` register tile), and
  :func:`_dx_kernel` reads ``dz`` back on the forward's tiles. A tiled single pass would recompute
  ``z`` on ``W`` shifted copies of its tile: slower (``lab/fused_backward.py``, timed by ``lab/sweep.py``;
  that log was not kept, ``HISTORY.md`` records the result).

(Here ``w_j`` is the tap of lag ``j``, ``weight[:, W - 1 - j]``.)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import launch
from .forward import ACTIVATION_CODES, MAX_MARCH_WIDTH, _preactivation, _row, _rows, _tap

__all__ = ["conv_backward", "state_grad"]


@triton.jit
def _silu_grad(g, z):
    """``g · SiLU'(z)`` with ``SiLU'(z) = σ(z) (1 + z (1 − σ(z)))``."""
    sg = tl.sigmoid(z)
    return g * sg * (1.0 + z * (1.0 - sg))


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
    """The marching backward (widths 1 to 4): rows ``[i_s · SEG, (i_s + 1) · SEG)`` of ``dx`` for
    channels ``i_d · BD + [0, BD)``, and this program's partial row of ``dw`` (``[BD, W]``, the
    weight's layout) and ``db``. Four rows per step; the last three rows of ``x`` and of ``dz`` are
    carried in registers; one extra step past the segment supplies the ``dz`` that its last ``dx``
    rows need (not added to ``dw``, ``db``)."""
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


@triton.jit
def _add_dw(dw_acc, g, x, s, i_b, o_t, t0, o_d, m_d, cols, sxb, sxt, T, D, W: tl.constexpr, HAS_STATE: tl.constexpr):
    """``dw_acc[t, d, W-1-i] += g_t ⊙ x_{t-i}`` for every lag ``i``: the weight gradient's terms of one
    tile, element by element (its rows are summed once, by :func:`_store_partials`)."""
    for i in tl.static_range(W):
        xi = _rows(x, s, i_b, o_t - i, t0 - i, o_d, m_d, sxb, sxt, T, D, W, HAS_STATE)
        dw_acc += tl.where(cols[None, None, :] == W - 1 - i, (g * xi)[:, :, None], 0.0)
    return dw_acc


@triton.jit
def _store_partials(dwp, dbp, dw_acc, db_acc, row, o_d, m_d, cols, D, W: tl.constexpr, NEED_DW: tl.constexpr,
                    NEED_DB: tl.constexpr):
    """One program's partial sums: row ``row`` of ``dwp`` (``[BD, W]``) and ``dbp`` (``[BD]``)."""
    if NEED_DW:
        pw = dwp + row * D * W + o_d[:, None] * W + cols[None, :]
        tl.store(pw, tl.sum(dw_acc, 0), mask=m_d[:, None] & (cols < W)[None, :])
    if NEED_DB:
        tl.store(dbp + row * D + o_d, tl.sum(db_acc, 0), mask=m_d)


@triton.jit
def _final_state_rows(dht, i_b, o_t, o_d, m_d, T, D, W: tl.constexpr):
    """The final state's gradient on the rows ``o_t`` (``x_t`` is slot ``t - T + W``; zero elsewhere)."""
    k = o_t - T + W
    mk = ((k >= 0) & (o_t < T))[:, None] & m_d[None, :]
    ph = dht + i_b.to(tl.int64) * D * W + o_d[None, :].to(tl.int64) * W + k[:, None]
    return tl.load(ph, mask=mk, other=0.0).to(tl.float32)


@triton.jit
def _dz_kernel(x, w, bias, s, dy, dz, dwp, dbp, T, D, NP, sxb, sxt, sdb, sdt, W: tl.constexpr, BW: tl.constexpr,
               BT: tl.constexpr, BD: tl.constexpr, STEPS: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
               HAS_STATE: tl.constexpr, STORE_DZ: tl.constexpr, NEED_DW: tl.constexpr, NEED_DB: tl.constexpr):
    """Pass 1: ``STEPS`` consecutive ``[BT, BD]`` tiles of ``dz = dy ⊙ act'(z)``
    (stored, contiguous ``[B, T, D]``, when ``STORE_DZ``) and one partial ``[BD, W]`` of ``dw`` and
    ``[BD]`` of ``db``, from the same rows of ``x`` that make ``z``."""
    i_p, i_d, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    cols = tl.arange(0, BW)
    dw_acc = tl.zeros((BT, BD, BW), dtype=tl.float32)     # summed over its rows once, after the loop
    db_acc = tl.zeros((BT, BD), dtype=tl.float32)
    for c in range(STEPS):
        t0 = (i_p * STEPS + c) * BT
        o_t = t0 + tl.arange(0, BT)
        m = (o_t < T)[:, None] & m_d[None, :]
        g = tl.load(dy + i_b.to(tl.int64) * sdb + o_t.to(tl.int64)[:, None] * sdt + o_d[None, :], mask=m,
                    other=0.0).to(tl.float32)
        if ACT == 1:
            z = _preactivation(x, s, w, bias, i_b, o_t, t0, o_d, m_d, sxb, sxt, T, D, W, HAS_BIAS, HAS_STATE)
            g = _silu_grad(g, z)
        if STORE_DZ:
            pz = dz + i_b.to(tl.int64) * T * D + o_t.to(tl.int64)[:, None] * D + o_d[None, :]
            tl.store(pz, g.to(dz.dtype.element_ty), mask=m)
        if NEED_DB:
            db_acc += g
        if NEED_DW:
            dw_acc = _add_dw(dw_acc, g, x, s, i_b, o_t, t0, o_d, m_d, cols, sxb, sxt, T, D, W, HAS_STATE)
    _store_partials(dwp, dbp, dw_acc, db_acc, (i_b * NP + i_p).to(tl.int64), o_d, m_d, cols, D, W, NEED_DW, NEED_DB)


@triton.jit
def _dx_kernel(w, dz, dht, dx, T, D, szb, szt, W: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
               HAS_DHT: tl.constexpr):
    """Pass 2: one ``[BT, BD]`` tile of ``dx = sum_j w_j ⊙ dz_{t+j}`` (the
    transposed convolution) plus the final state's gradient on the last ``W`` tokens."""
    i_t, i_d, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_t = i_t * BT + tl.arange(0, BT)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    pz = dz + i_b.to(tl.int64) * szb + o_d[None, :]
    acc = tl.zeros((BT, BD), dtype=tl.float32)
    for j in tl.static_range(W):
        r = o_t + j
        g = tl.load(pz + r.to(tl.int64)[:, None] * szt, mask=(r < T)[:, None] & m_d[None, :], other=0.0)
        acc += _tap(w, o_d, m_d, j, W)[None, :] * g.to(tl.float32)
    if HAS_DHT:
        acc += _final_state_rows(dht, i_b, o_t, o_d, m_d, T, D, W)
    px = dx + i_b.to(tl.int64) * T * D + o_t.to(tl.int64)[:, None] * D + o_d[None, :]
    tl.store(px, acc.to(dx.dtype.element_ty), mask=(o_t < T)[:, None] & m_d[None, :])


@triton.jit
def _sum_rows_kernel(part, out, P, N, BP: tl.constexpr, BN: tl.constexpr):
    """``out[n] = sum_p part[p, n]`` (float32 partials, summed in a fixed order), cast to ``out``."""
    i_n = tl.program_id(0)
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < N
    acc = tl.zeros((BN,), dtype=tl.float32)
    for p0 in range(0, P, BP):
        o_p = p0 + tl.arange(0, BP)
        v = tl.load(part + o_p.to(tl.int64)[:, None] * N + o_n[None, :], mask=(o_p < P)[:, None] & m_n[None, :],
                    other=0.0)
        acc += tl.sum(v, 0)
    tl.store(out + o_n, acc.to(out.dtype.element_ty), mask=m_n)


@triton.jit
def _state_grad_kernel(x, w, bias, s, dy, dht, ds, T, D, sxb, sxt, sdb, sdt, W: tl.constexpr, BW: tl.constexpr,
                       BD: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_DHT: tl.constexpr):
    """``ds[b, :, i]``: the tokens ``t < min(i, T)`` read slot ``i`` through the tap of lag
    ``t + W - i``; the final state's slot ``i - T`` holds it when ``i >= T``."""
    i_d, i_b = tl.program_id(0), tl.program_id(1)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    o_r = tl.arange(0, BW)                               # tokens 0 .. BW - 1; slots 0 .. BW - 1
    m_r = (o_r < W - 1) & (o_r < T)
    g = tl.load(dy + i_b.to(tl.int64) * sdb + o_r.to(tl.int64)[:, None] * sdt + o_d[None, :],
                mask=m_r[:, None] & m_d[None, :], other=0.0).to(tl.float32)
    if ACT == 1:
        z = _preactivation(x, s, w, bias, i_b, o_r, 0, o_d, m_d, sxb, sxt, T, D, W, HAS_BIAS, True)
        g = _silu_grad(g, z)
    acc = tl.zeros((BW, BD), dtype=tl.float32)
    for j in tl.static_range(W):                         # token t, lag j reads slot t + W - j (if t < j)
        c = _tap(w, o_d, m_d, j, W)[None, :] * g
        sel = o_r[:, None] == o_r[None, :] + W - j       # [slot, token]
        acc += tl.sum(tl.where(sel[:, :, None], c[None, :, :], 0.0), 1)
    if HAS_DHT:
        k = o_r - T
        ph = dht + i_b.to(tl.int64) * D * W + o_d[None, :].to(tl.int64) * W + k[:, None]
        acc += tl.load(ph, mask=((k >= 0) & (o_r < W))[:, None] & m_d[None, :], other=0.0).to(tl.float32)
    p = ds + i_b.to(tl.int64) * D * W + o_d[None, :].to(tl.int64) * W + o_r[:, None]
    tl.store(p, acc.to(ds.dtype.element_ty), mask=(o_r < W)[:, None] & m_d[None, :])


def _sum_rows(part, out, plan):
    P, N = part.shape[0], part[0].numel()
    launch(_sum_rows_kernel, (triton.cdiv(N, plan.red_bn),), (part, out, P, N),
           dict(BP=plan.red_bp, BN=plan.red_bn), plan.small)
    return out


def conv_backward(x, weight, bias, state, dy, dht, activation, plan, *, need_dw: bool, need_db: bool):
    """``(dx, dw, db)``: ``dx`` contiguous in ``x``'s dtype, ``dw``/``db`` in the dtypes of ``weight`` and
    ``bias`` (``None`` where not needed). ``dy`` with unit channel stride; ``dht`` ``None`` or
    contiguous ``[B, D, W]``. One marching pass when ``plan.march`` and ``W <= 4``; else pass 1
    writes ``dz`` (only with an activation: without one ``dz = dy``) and the partial sums of ``dw``
    and ``db``, and pass 2 forms ``dx`` from ``dz``."""
    B, T, D = x.shape
    W = weight.shape[1]
    act = ACTIVATION_CODES[activation]
    dx = torch.empty(B, T, D, dtype=x.dtype, device=x.device)
    common = (x, weight, bias if bias is not None else weight, state if state is not None else x, dy)
    strides = (x.stride(0), x.stride(1), dy.stride(0), dy.stride(1))
    flags = dict(W=W, ACT=act, HAS_BIAS=bias is not None, HAS_STATE=state is not None, NEED_DW=need_dw,
                 NEED_DB=need_db)
    if plan.march and W <= MAX_MARCH_WIDTH:
        NP = triton.cdiv(T, plan.bwd_march_seg)
        dwp, dbp = _partials(B * NP, D, W, need_dw, need_db, dx)
        launch(_march_bwd_kernel, (NP, triton.cdiv(D, plan.bwd_march_bd), B),
               (*common, dht if dht is not None else dy, dx, dwp, dbp, T, D, NP, *strides),
               dict(flags, SEG=plan.bwd_march_seg, BD=plan.bwd_march_bd, HAS_DHT=dht is not None), plan.bwd_march)
    else:
        NP = triton.cdiv(T, plan.bwd_bt * plan.bwd_steps)
        dz = torch.empty(B, T, D, dtype=x.dtype, device=x.device) if act else dy
        dwp, dbp = _partials(B * NP, D, W, need_dw, need_db, dx)
        if act or need_dw or need_db:
            launch(_dz_kernel, (NP, triton.cdiv(D, plan.bwd_bd), B), (*common, dz, dwp, dbp, T, D, NP, *strides),
                   dict(flags, BW=triton.next_power_of_2(W), BT=plan.bwd_bt, BD=plan.bwd_bd, STEPS=plan.bwd_steps,
                        STORE_DZ=act != 0), plan.bwd)
        launch(_dx_kernel, (triton.cdiv(T, plan.fwd_bt), triton.cdiv(D, plan.fwd_bd), B),
               (weight, dz, dht if dht is not None else dz, dx, T, D, dz.stride(0), dz.stride(1)),
               dict(W=W, BT=plan.fwd_bt, BD=plan.fwd_bd, HAS_DHT=dht is not None), plan.fwd)
    dw = _sum_rows(dwp, torch.empty_like(weight), plan) if need_dw else None
    db = _sum_rows(dbp, torch.empty_like(bias), plan) if need_db else None
    return dx, dw, db


def _partials(P, D, W, need_dw, need_db, dummy):
    """Float32 buffers for ``P`` partial rows of ``dw`` (``[P, D, W]``) and ``db`` (``[P, D]``); ``dummy``
    stands in for one that is not needed."""
    dev = dummy.device
    return (torch.empty(P, D, W, dtype=torch.float32, device=dev) if need_dw else dummy,
            torch.empty(P, D, dtype=torch.float32, device=dev) if need_db else dummy)


def state_grad(x, weight, bias, state, dy, dht, activation, plan):
    """The initial state's gradient, ``[B, D, W]`` in ``state``'s dtype."""
    B, T, D = x.shape
    W = weight.shape[1]
    ds = torch.empty(B, D, W, dtype=state.dtype, device=x.device)
    grid = (triton.cdiv(D, plan.small_bd), B)
    launch(_state_grad_kernel, grid,
           (x, weight, bias if bias is not None else weight, state, dy, dht if dht is not None else dy, ds, T, D,
            x.stride(0), x.stride(1), dy.stride(0), dy.stride(1)),
           dict(W=W, BW=triton.next_power_of_2(W), BD=plan.small_bd, ACT=ACTIVATION_CODES[activation],
                HAS_BIAS=bias is not None, HAS_DHT=dht is not None), plan.small)
    return ds
