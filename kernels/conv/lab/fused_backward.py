"""Lab: the fused backward, off the shipped path (``lab/sweep.py`` times it against the split one).

One kernel for ``dx``, ``dw`` and ``db``: with SiLU, a tile of ``dx`` needs ``dz`` on its rows and the
``W - 1`` after them, so each program recomputes ``z`` (and the sigmoid) on ``W`` shifted copies of
its tile instead of storing ``dz``: it reads ``x`` and ``dy`` once from memory and writes ``dx`` once.
On the H200 (``lab/sweep.py``; its log was not kept, ``NOTES.md`` records the result) its
registers kept it at half the speed of the shipped two-pass backward at best, so
:func:`kernels.conv.backward.conv_backward` does not use it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.backend import launch
from kernels.conv.backward import _add_dw, _final_state_rows, _silu_grad, _store_partials, _sum_rows
from kernels.conv.forward import ACTIVATION_CODES, _preactivation, _tap


@triton.jit
def _conv_bwd_kernel(x, w, bias, s, dy, dht, dx, dwp, dbp, T, D, NP, sxb, sxt, sdb, sdt, W: tl.constexpr,
                     BW: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, STEPS: tl.constexpr, ACT: tl.constexpr,
                     HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr, HAS_DHT: tl.constexpr,
                     NEED_DW: tl.constexpr, NEED_DB: tl.constexpr):
    """``STEPS`` consecutive ``[BT, BD]`` tiles of ``dx``; one partial ``[BD, W]`` of ``dw`` and ``[BD]``
    of ``db`` (row ``i_b · NP + i_p`` of ``dwp``, ``dbp``)."""
    i_p, i_d, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    cols = tl.arange(0, BW)
    dw_acc = tl.zeros((BT, BD, BW), dtype=tl.float32)     # summed over its rows once, after the loop
    db_acc = tl.zeros((BT, BD), dtype=tl.float32)
    pdy = dy + i_b.to(tl.int64) * sdb
    for c in range(STEPS):
        t0 = (i_p * STEPS + c) * BT
        o_t = t0 + tl.arange(0, BT)
        dx_acc = tl.zeros((BT, BD), dtype=tl.float32)
        for j in tl.static_range(W):          # dz on the rows j after the tile's, through the tap of lag j
            r = o_t + j
            g = tl.load(pdy + r.to(tl.int64)[:, None] * sdt + o_d[None, :], mask=(r < T)[:, None] & m_d[None, :],
                        other=0.0).to(tl.float32)
            if ACT == 1:
                z = _preactivation(x, s, w, bias, i_b, r, t0 + j, o_d, m_d, sxb, sxt, T, D, W, HAS_BIAS, HAS_STATE)
                g = _silu_grad(g, z)
            dx_acc += _tap(w, o_d, m_d, j, W)[None, :] * g
            if j == 0:                          # the tile's own dz: the taps' and the bias's sums
                if NEED_DB:
                    db_acc += g
                if NEED_DW:
                    dw_acc = _add_dw(dw_acc, g, x, s, i_b, o_t, t0, o_d, m_d, cols, sxb, sxt, T, D, W, HAS_STATE)
        if HAS_DHT:
            dx_acc += _final_state_rows(dht, i_b, o_t, o_d, m_d, T, D, W)
        px = dx + i_b.to(tl.int64) * T * D + o_t.to(tl.int64)[:, None] * D + o_d[None, :]
        tl.store(px, dx_acc.to(dx.dtype.element_ty), mask=(o_t < T)[:, None] & m_d[None, :])
    _store_partials(dwp, dbp, dw_acc, db_acc, (i_b * NP + i_p).to(tl.int64), o_d, m_d, cols, D, W, NEED_DW, NEED_DB)


def fused_conv_backward(x, weight, bias, state, dy, dht, activation, plan, *, need_dw: bool, need_db: bool):
    """``(dx, dw, db)`` as :func:`kernels.conv.backward.conv_backward`, in one pass."""
    B, T, D = x.shape
    W = weight.shape[1]
    NP = triton.cdiv(T, plan.bwd_bt * plan.bwd_steps)
    dx = torch.empty(B, T, D, dtype=x.dtype, device=x.device)
    dwp = torch.empty(B * NP, D, W, dtype=torch.float32, device=x.device) if need_dw else dx
    dbp = torch.empty(B * NP, D, dtype=torch.float32, device=x.device) if need_db else dx
    launch(_conv_bwd_kernel, (NP, triton.cdiv(D, plan.bwd_bd), B),
           (x, weight, bias if bias is not None else weight, state if state is not None else x, dy,
            dht if dht is not None else dy, dx, dwp, dbp, T, D, NP, x.stride(0), x.stride(1), dy.stride(0), dy.stride(1)),
           dict(W=W, BW=triton.next_power_of_2(W), BT=plan.bwd_bt, BD=plan.bwd_bd, STEPS=plan.bwd_steps,
                ACT=ACTIVATION_CODES[activation], HAS_BIAS=bias is not None, HAS_STATE=state is not None,
                HAS_DHT=dht is not None, NEED_DW=need_dw, NEED_DB=need_db), plan.bwd)
    dw = _sum_rows(dwp, torch.empty_like(weight), plan) if need_dw else None
    db = _sum_rows(dbp, torch.empty_like(bias), plan) if need_db else None
    return dx, dw, db
