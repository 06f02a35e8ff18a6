"""Stage 2: the flash-style pass, queries carried backwards over whole blocks.

One program per (query block ``i``, batch·head). It starts on its own block, whose scores stage 1
left in ``A_loc``, then walks the key blocks ``l = i−1, i−2, …, 0``. On reaching block ``l`` it holds
``X = Q̃_i P_{i−1} ⋯ P_{l+1}`` (each query pulled back to the end of block ``l``), so the block's
scores are ``X K̂_lᵀ``; then it crosses the block, ``X ← X P_l = X − (X W_lᵀ) U_l``. Each step folds
its scores into the flash family's online softmax (:func:`kernels.flash.forward.online_softmax_step`).
Four products per block pair where flash attention has two; nothing ``T × T`` is written.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import launch
from ..flash.forward import online_softmax_step
from .plan import CHUNK

__all__ = ["path_forward", "LOG2E"]

LOG2E = 1.4426950408889634


@triton.jit
def _tile(base, row0, D: tl.constexpr):
    """A ``[64, D]`` tile of a dense ``[rows, D]`` buffer at row ``row0``."""
    r = row0 + tl.arange(0, 64)
    return tl.load(base + r[:, None] * D + tl.arange(0, D)[None, :])


@triton.jit
def _in_rows(base, t0, T, stride_t, D: tl.constexpr):
    """Rows ``t0 .. t0+63`` of an input ``[T, D]`` view; zeros past ``T``."""
    r = t0 + tl.arange(0, 64)
    return tl.load(base + r[:, None] * stride_t + tl.arange(0, D)[None, :], mask=(r < T)[:, None], other=0.0)


@triton.jit
def _gates(g_base, t0, T, stride_t):
    r = t0 + tl.arange(0, 64)
    return tl.load(g_base + r * stride_t, mask=r < T, other=0.0)


@triton.jit(do_not_specialize=["T", "H", "NT", "NTC"])
def _path_fwd_kernel(qt_ptr, kh_ptr, u_ptr, wt_ptr, aloc_ptr, v_ptr, G_ptr, o_ptr, lse_ptr,
                     T, H, NT, NTC, qk_scale, g_to_s,
                     K: tl.constexpr, V: tl.constexpr, HAS_G: tl.constexpr, PREC: tl.constexpr):
    pid = tl.program_id(0)
    BH = tl.num_programs(0) // NT
    bh = (pid % BH).to(tl.int64)
    i = NT - 1 - pid // BH                     # longest rows first
    bi = bh // H
    h = bh % H
    t0 = i * 64
    rows = t0 + tl.arange(0, 64)
    cols = tl.arange(0, 64)
    buf = bh * NTC * K
    v_base = v_ptr + (bi * T * H + h) * V
    g_base = G_ptr + bi * T * H + h
    td = qt_ptr.dtype.element_ty
    x = _tile(qt_ptr + buf, t0, K).to(tl.float32)
    g_row = tl.zeros([64], dtype=tl.float32)
    if HAS_G:
        g_row = _gates(g_base, t0, T, H)
    m_i = tl.full([64], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([64], dtype=tl.float32)
    acc = tl.zeros([64, V], dtype=tl.float32)
    # the diagonal block: its scores from stage 1, causal and tail masks
    s = _tile(aloc_ptr + bh * NTC * 64, t0, 64)
    if HAS_G:
        s += (g_row[:, None] - g_row[None, :]) * g_to_s
    s = tl.where((cols[None, :] <= cols[:, None]) & ((t0 + cols)[None, :] < T), s, float("-inf"))
    v = _in_rows(v_base, t0, T, H * V, V)
    acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, v, qk_scale, PREC)
    # the earlier blocks, last first, the queries carried backwards across each
    for n in range(0, i):
        s0 = (i - 1 - n) * 64
        xt = x.to(td)
        s = tl.dot(xt, tl.trans(_tile(kh_ptr + buf, s0, K)), input_precision=PREC)
        if HAS_G:
            s += (g_row[:, None] - _gates(g_base, s0, T, H)[None, :]) * g_to_s
        v = tl.load(v_base + (s0 + cols)[:, None] * (H * V) + tl.arange(0, V)[None, :])
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, v, qk_scale, PREC)
        a = tl.dot(xt, tl.trans(_tile(wt_ptr + buf, s0, K)), input_precision=PREC)
        x -= tl.dot(a.to(td), _tile(u_ptr + buf, s0, K), input_precision=PREC)
    lse = m_i + tl.math.log2(l_i)
    tl.store(lse_ptr + bh * NTC + rows, lse)
    o = acc / l_i[:, None]
    tl.store(o_ptr + (bi * T * H + h) * V + rows[:, None] * (H * V) + tl.arange(0, V)[None, :],
             o.to(o_ptr.dtype.element_ty), mask=(rows < T)[:, None])


def path_forward(qt, kh, u, wt, aloc, v, G, scale: float, plan):
    """Stage 2: ``(o, lse)``; ``o`` ``[B, T, H, V]`` in ``v``'s dtype, ``lse`` float32
    ``[B·H, NT·64]`` (log2 units of ``scale · A + G_i − G_j``). ``G``: ``None`` or the cumulative
    log gates, float32 ``[B, T, H]``."""
    B, T, H, V = v.shape
    K = qt.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    NTC = NT * CHUNK
    o = torch.empty_like(v)
    lse = torch.empty(B * H, NTC, dtype=torch.float32, device=v.device)
    launch(_path_fwd_kernel, (NT * B * H,),
           (qt, kh, u, wt, aloc, v, G if G is not None else lse, o, lse, T, H, NT, NTC,
            float(scale) * LOG2E, 1.0 / float(scale)),
           dict(K=K, V=V, HAS_G=G is not None, PREC=plan.precision), plan.fwd)
    return o, lse
