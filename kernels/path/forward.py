"""Stage 2: the flash-style pass, queries carried backwards over whole blocks.

One program per (query block ``i``, batch·head). It starts on its own block, whose scores stage 1
left in ``A_loc``, then walks the key blocks ``l = i−1, i−2, …, 0``. On reaching block ``l`` it holds
``X = Q̃_i P_{i−1} ⋯ P_{l+1}`` (each query pulled back to the end of block ``l``), so the block's
scores are ``X K̂_lᵀ``; then it crosses the block, ``X ← X P_l = X − (X W_lᵀ) U_l``. Each step folds
its scores into the flash family's online softmax (:func:`kernels.common.softmax.online_softmax_step`).
Four products per block pair where flash attention has two; nothing ``T × T`` is written.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import launch
from ..common.softmax import LOG2E, online_softmax_step

__all__ = ["path_forward"]


@triton.jit
def _tile(base, row0, D: tl.constexpr):
    """A ``[64, D]`` tile of a dense ``[rows, D]`` buffer at row ``row0``."""
    r = row0 + tl.arange(0, 64)
    return tl.load(base + r[:, None] * D + tl.arange(0, D)[None, :])


@triton.jit
def _in_rows(base, t0, T, stride_t, D: tl.constexpr):
    """Rows ``t0 .. t0+63`` of an input ``[T, D]`` view; zeros past ``T``."""
    r = t0 + tl.arange(0, 64)
    return tl.load(base + r.to(tl.int64)[:, None] * stride_t + tl.arange(0, D)[None, :], mask=(r < T)[:, None],
                   other=0.0)


@triton.jit
def _gates(g_base, t0, T, stride_t, R: tl.constexpr = 64):
    """The cumulative gates of ``R`` tokens from ``t0``; zeros past ``T``."""
    r = t0 + tl.arange(0, R)
    return tl.load(g_base + r.to(tl.int64) * stride_t, mask=r < T, other=0.0)


@triton.jit
def _tile_rows(base, row0, R: tl.constexpr, D: tl.constexpr):
    """An ``[R, D]`` tile of a dense ``[rows, D]`` buffer at row ``row0``."""
    r = row0 + tl.arange(0, R)
    return tl.load(base + r[:, None] * D + tl.arange(0, D)[None, :])


@triton.jit
def _add_tile(base, row0, x, R: tl.constexpr, D: tl.constexpr):
    """``base[row0 : row0+R, :D] += x`` (float32 atomics, relaxed: only the sums matter)."""
    r = row0 + tl.arange(0, R)
    tl.atomic_add(base + r[:, None] * D + tl.arange(0, D)[None, :], x, sem="relaxed")


@triton.jit
def _put_tile(base, row0, x, R: tl.constexpr, D: tl.constexpr):
    r = row0 + tl.arange(0, R)
    tl.store(base + r[:, None] * D + tl.arange(0, D)[None, :], x.to(base.dtype.element_ty))


@triton.jit
def _probs(s, lse, valid, do, v, dlt, qk_scale, PREC: tl.constexpr):
    """The probabilities of one block of scores and ``dZ = P ⊙ (dO Vᵀ − δ)``, the gradient of the
    logits ``scale · A + G_i − G_j``; rows past ``T`` give zeros."""
    p = tl.where(valid[:, None], tl.math.exp2(s * qk_scale - lse[:, None]), 0.0)
    dz = p * (tl.dot(do, tl.trans(v), input_precision=PREC) - dlt[:, None])
    return p, dz


@triton.jit
def _query_block(i_mbh, NQ, BH, T, H, NTC, do_ptr, lse_ptr, dlt_ptr, G_ptr,
                 V: tl.constexpr, BM: tl.constexpr, HAS_G: tl.constexpr):
    """A backward work item ``i_mbh`` of the persistent grids (query blocks longest first): its
    batch·head ``i_bh``, first row ``t0``, rows, which rows exist, ``dO``, the log-sum-exp, ``δ``
    and the rows' cumulative gates (zeros without gates)."""
    i_bh = (i_mbh % BH).to(tl.int64)
    t0 = (NQ - 1 - i_mbh // BH) * BM
    i_b = i_bh // H
    i_h = i_bh % H
    rows = t0 + tl.arange(0, BM)
    valid = rows < T
    do = tl.load(do_ptr + (i_b * T * H + i_h) * V + rows.to(tl.int64)[:, None] * (H * V) + tl.arange(0, V)[None, :],
                 mask=valid[:, None], other=0.0)
    lse = tl.load(lse_ptr + i_bh * NTC + rows)
    dlt = tl.load(dlt_ptr + i_bh * NTC + rows)
    g_row = tl.zeros([BM], dtype=tl.float32)
    if HAS_G:
        g_row = tl.load(G_ptr + i_b * T * H + i_h + rows.to(tl.int64) * H, mask=valid, other=0.0)
    return i_bh, t0, rows, valid, do, lse, dlt, g_row


@triton.jit
def diagonal_scores(aloc_ptr, xt, kh_ptr, g_row, g_base, t0, T, H, g_to_s,
                    K: tl.constexpr, BM: tl.constexpr, HAS_G: tl.constexpr, PREC: tl.constexpr):
    """The scores of a query block of ``BM`` rows against its own keys, ``(s_a, s_b)``: ``s_a``
    against the keys of its first 64-block ``a``, ``s_b`` against those of its second ``b`` (all
    ``-inf`` when ``BM = 64``). Rows of ``a`` read ``a``'s keys from stage 1's ``A_loc``; rows of
    ``b`` read ``b``'s from ``A_loc`` and ``a``'s through ``X K̂_aᵀ``, ``X`` their queries pulled
    back to ``b``'s start, which is ``a``'s end."""
    r = tl.arange(0, BM)
    c = tl.arange(0, 64)
    aload = _tile_rows(aloc_ptr, t0, BM, 64)
    top = r < 64
    s_a = tl.where(top[:, None], aload, 0.0)
    if BM == 128:
        s_a = tl.where(top[:, None], s_a, tl.dot(xt, tl.trans(_tile(kh_ptr, t0, K)), input_precision=PREC))
    s_a = tl.where((top[:, None] & (c[None, :] <= r[:, None])) | ~top[:, None], s_a, float("-inf"))
    s_a = tl.where((t0 + c)[None, :] < T, s_a, float("-inf"))
    s_b = tl.where(~top[:, None] & (c[None, :] <= r[:, None] - 64) & ((t0 + 64 + c)[None, :] < T), aload,
                   float("-inf"))
    if HAS_G:
        s_a += (g_row[:, None] - _gates(g_base, t0, T, H)[None, :]) * g_to_s
        if BM == 128:
            s_b += (g_row[:, None] - _gates(g_base, t0 + 64, T, H)[None, :]) * g_to_s
    return s_a, s_b


@triton.jit(do_not_specialize=["T", "H", "NQ", "NTC", "NW"])
def _path_fwd_kernel(qt_ptr, kh_ptr, u_ptr, wt_ptr, aloc_ptr, v_ptr, G_ptr, o_ptr, lse_ptr, kbar_ptr, pi_ptr,
                     T, H, NQ, NTC, NW, qk_scale, g_to_s,
                     K: tl.constexpr, V: tl.constexpr, BM: tl.constexpr, HAS_G: tl.constexpr,
                     WB: tl.constexpr, PREC: tl.constexpr):
    i_mbh = tl.program_id(0)
    BH = tl.num_programs(0) // NQ
    i_bh = (i_mbh % BH).to(tl.int64)
    i_m = NQ - 1 - i_mbh // BH                     # longest rows first
    i_b = i_bh // H
    i_h = i_bh % H
    t0 = i_m * BM
    rows = t0 + tl.arange(0, BM)
    r = tl.arange(0, BM)
    cols = tl.arange(0, 64)
    buf = i_bh * NTC * K
    v_base = v_ptr + (i_b * T * H + i_h) * V
    g_base = G_ptr + i_b * T * H + i_h
    td = qt_ptr.dtype.element_ty
    x = _tile_rows(qt_ptr + buf, t0, BM, K).to(tl.float32)
    g_row = tl.zeros([BM], dtype=tl.float32)
    if HAS_G:
        g_row = tl.load(g_base + rows.to(tl.int64) * H, mask=rows < T, other=0.0)
    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, V], dtype=tl.float32)
    # the block's own keys: block a first (every row sees one of its keys), then block b
    s_a, s_b = diagonal_scores(aloc_ptr + i_bh * NTC * 64, x.to(td), kh_ptr + buf, g_row, g_base, t0, T, H,
                               g_to_s, K, BM, HAS_G, PREC)
    acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s_a, _in_rows(v_base, t0, T, H * V, V), qk_scale, PREC)
    if BM == 128:
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s_b, _in_rows(v_base, t0 + 64, T, H * V, V),
                                            qk_scale, PREC)
        # the rows of b cross block a
        a = tl.dot(x.to(td), tl.trans(_tile(wt_ptr + buf, t0, K)), input_precision=PREC)
        a = tl.where((r >= 64)[:, None], a, 0.0)
        x -= tl.dot(a.to(td), _tile(u_ptr + buf, t0, K), input_precision=PREC)
    # the earlier blocks, last first, the queries carried backwards across each (with windows, the
    # blocks of the queries' own window)
    ws = 0
    if WB > 0:
        ws = t0 // 64 // WB * WB
    nb = i_m * (BM // 64) - ws
    for n in range(0, nb):
        s0 = (ws + nb - 1 - n) * 64
        xt = x.to(td)
        s = tl.dot(xt, tl.trans(_tile(kh_ptr + buf, s0, K)), input_precision=PREC)
        if HAS_G:
            s += (g_row[:, None] - _gates(g_base, s0, T, H)[None, :]) * g_to_s
        v = tl.load(v_base + (s0 + cols).to(tl.int64)[:, None] * (H * V) + tl.arange(0, V)[None, :])
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, v, qk_scale, PREC)
        a = tl.dot(xt, tl.trans(_tile(wt_ptr + buf, s0, K)), input_precision=PREC)
        x -= tl.dot(a.to(td), _tile(u_ptr + buf, s0, K), input_precision=PREC)
    if WB > 0:
        # then the earlier windows, last first: the keys pushed to their window's end (K̄), the
        # queries carried across a whole window by its product (X ← X Π), two products a pair
        for n in range(0, ws // WB):
            w = ws // WB - 1 - n
            if n > 0:
                x = tl.dot(x.to(td), _tile_rows(pi_ptr + (i_bh * NW + w + 1) * K * K, 0, K, K).to(td),
                           input_precision=PREC)
            xt = x.to(td)
            for j in range(0, WB):
                s0 = (w * WB + j) * 64
                s = tl.dot(xt, tl.trans(_tile(kbar_ptr + buf, s0, K)), input_precision=PREC)
                if HAS_G:
                    s += (g_row[:, None] - _gates(g_base, s0, T, H)[None, :]) * g_to_s
                v = tl.load(v_base + (s0 + cols).to(tl.int64)[:, None] * (H * V) + tl.arange(0, V)[None, :])
                acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, v, qk_scale, PREC)
    lse = m_i + tl.math.log2(l_i)
    tl.store(lse_ptr + i_bh * NTC + rows, lse)
    o = acc / l_i[:, None]
    tl.store(o_ptr + (i_b * T * H + i_h) * V + rows.to(tl.int64)[:, None] * (H * V) + tl.arange(0, V)[None, :],
             o.to(o_ptr.dtype.element_ty), mask=(rows < T)[:, None])


def path_forward(qt, kh, u, wt, aloc, v, G, scale: float, plan, windows=None):
    """Stage 2: ``(o, lse)``; ``o`` ``[B, T, H, V]`` in ``v``'s dtype, ``lse`` float32
    ``[B·H, NT·64]`` (log2 units of ``scale · A + G_i − G_j``). ``G``: ``None`` or the cumulative
    log gates, float32 ``[B, T, H]``. ``windows``: ``None`` (every earlier block walked) or
    :func:`kernels.path.windows.window_prepare`'s ``(qa, kbar, pi)`` for ``plan.window_blocks``."""
    B, T, H, V = v.shape
    K, NTC = qt.shape[-1], qt.shape[1]
    NQ = triton.cdiv(T, plan.rows)
    o = torch.empty_like(v)
    lse = torch.empty(B * H, NTC, dtype=torch.float32, device=v.device)
    kbar, pi = (windows[1], windows[2]) if windows is not None else (qt, lse)
    launch(_path_fwd_kernel, (NQ * B * H,),
           (qt, kh, u, wt, aloc, v, G if G is not None else lse, o, lse, kbar, pi, T, H, NQ, NTC,
            pi.shape[1] if windows is not None else 0, float(scale) * LOG2E, 1.0 / float(scale)),
           dict(K=K, V=V, BM=plan.rows, HAS_G=G is not None, WB=plan.window_blocks if windows is not None else 0,
                PREC=plan.precision), plan.fwd)
    return o, lse
