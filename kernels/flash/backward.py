"""Stage: the flash-attention backward, recomputing the probabilities block by block (FlashAttention-2).

The forward saved ``o`` and each row's log-sum-exp ``lse`` (log2 units). With ``s_ij = q_i·k_j + gs_i −
gs_j`` (the optional bias in score units, ``gs = G / scale``; each program measures it from one
reference row of its block, as the forward does, for precision) and ``qk_scale = scale·log2 e``::

    p_ij  = exp2(qk_scale·s_ij − lse_i)               the forward's probabilities, recomputed
    δ_i   = do_i · o_i                                 (_bwd_delta_kernel)
    dp_ij = do_i · v_j,   ds_ij = p_ij (dp_ij − δ_i)    the gradient of the exponent z_ij
    dv_j  = Σ_i p_ij do_i,   dk_j = scale Σ_i ds_ij q_i   (_bwd_dkdv_kernel)
    dq_i  = scale Σ_j ds_ij k_j                         (_bwd_dq_kernel)

No ``T × T`` tensor exists at any time: each program keeps one block of keys (dk/dv) or of queries
(dq) on chip and streams the other side past it, so memory is linear in ``T``. Two kernels rather
than one with atomic adds: the dq pass recomputes ``p`` once more, and in exchange every output is
written once, by one program, deterministically.

The bias (FoX, ALiBi). ``z_ij = scale·q_i·k_j + G_i − G_j``, so ``∂L/∂G_m = Σ_j ds_mj − Σ_i ds_im``:
the row sum of ``ds`` (the dq program has the row) less its column sum (the dk/dv program has the
column). In exact arithmetic the row sum is zero (``Σ_j p_mj dp_mj = do_m·o_m = δ_m`` and
``Σ_j p_mj = 1``), but ``δ`` comes from the *rounded* ``o``: its error ``e_m`` enters the column sums
of every later row, and only the row sum, computed from the same ``δ``, cancels it (measured: the
column sums alone left a 7 % RMS error in ``dg`` at bfloat16, T = 2048). The op turns ``dG`` into
``dg`` with a reverse cumulative sum over ``T`` (``G = cumsum(g)``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.softmax import LOG2E, load_rows
from .forward import _mask_scores, load_gates
from .plan import BackwardPlan

__all__ = ["flash_backward"]


@triton.jit
def _bwd_delta_kernel(o_ptr, do_ptr, delta_ptr, sob, sot, soh, sdob, sdot, sdoh, T, H,
                      DV: tl.constexpr, BLOCK_M: tl.constexpr):
    """``δ_i = do_i · o_i`` in float32, ``[B, H, T]``."""
    i_mbh = tl.program_id(0)
    num_m = tl.cdiv(T, BLOCK_M)
    i_bh = i_mbh // num_m
    i_b = (i_bh // H).to(tl.int64)
    i_h = (i_bh % H).to(tl.int64)
    o_m = (i_mbh % num_m) * BLOCK_M + tl.arange(0, BLOCK_M)
    o_dv = tl.arange(0, DV)
    o = load_rows(o_ptr + i_b * sob + i_h * soh, o_m, sot, o_dv, T, True).to(tl.float32)
    do = load_rows(do_ptr + i_b * sdob + i_h * sdoh, o_m, sdot, o_dv, T, True).to(tl.float32)
    tl.store(delta_ptr + i_bh.to(tl.int64) * T + o_m, tl.sum(o * do, 1), mask=o_m < T)


@triton.jit
def _load_row_stats(lse_base, delta_base, o_m, T, TAIL_MASK: tl.constexpr):
    """``lse`` and ``δ`` of rows ``o_m``; past ``T``: ``lse = +inf`` (so ``p = 0``) and ``δ = 0``."""
    if TAIL_MASK:
        lse = tl.load(lse_base + o_m, mask=o_m < T, other=float("inf"))
        delta = tl.load(delta_base + o_m, mask=o_m < T, other=0.0)
    else:
        lse = tl.load(lse_base + o_m)
        delta = tl.load(delta_base + o_m)
    return lse, delta


@triton.jit
def _dkdv_query_blocks(dk, dv, dgk, k, v, gk, gk_abs, g_ref, q_base, do_base, g_base, lse_base, delta_base,
                       sqt, sdot, sgt, o_n, o_dk, o_dv, lo, hi, T, qk_scale, g_to_s,
                       BLOCK_M: tl.constexpr, CAUSAL_MASK: tl.constexpr, TAIL_MASK: tl.constexpr,
                       PRECISION: tl.constexpr, HAS_BIAS: tl.constexpr, BIAS_EXACT: tl.constexpr):
    """Stream the query blocks ``[lo, hi)`` past one key block; everything transposed (keys are
    rows), so that ``pᵀ`` and ``dsᵀ`` feed the products for dv and dk as they are. With the bias,
    ``gk`` holds ``(G_j − G_r) / scale`` and each query row's ``lse`` is shifted by
    ``qk_scale·(G_i − G_r) / scale`` (``BIAS_EXACT``: each score gets ``(G_i − G_j) / scale``)."""
    o_m0 = tl.arange(0, BLOCK_M)
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        o_m = start_m + o_m0
        q = load_rows(q_base, o_m, sqt, o_dk, T, TAIL_MASK)
        do = load_rows(do_base, o_m, sdot, o_dv, T, TAIL_MASK)
        lse, delta = _load_row_stats(lse_base, delta_base, o_m, T, TAIL_MASK)
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)                 # [BN, BM]
        if HAS_BIAS:
            gq = load_gates(g_base, o_m, sgt, T, TAIL_MASK)
            if BIAS_EXACT:
                s_t -= (gk_abs[:, None] - gq[None, :]) * g_to_s
            else:
                s_t -= gk[:, None]
                lse -= (qk_scale * g_to_s) * (gq - g_ref)
        if CAUSAL_MASK:   # before exp2: a future key's score (with FoX's bias) may overflow it
            s_t = tl.where(o_m[None, :] >= o_n[:, None], s_t, float("-inf"))
        p_t = tl.math.exp2(s_t * qk_scale - lse[None, :])
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=PRECISION)
        if HAS_BIAS:
            dgk -= tl.sum(ds_t, 1)
    return dk, dv, dgk


@triton.jit
def _bwd_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, g_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, dg_ptr,
                     sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdob, sdot, sdoh, sgb, sgt, sgh,
                     sdkb, sdkt, sdkh, sdvb, sdvt, sdvh,
                     T, H, qk_scale, scale, g_to_s,
                     DK: tl.constexpr, DV: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr,
                     BIAS_EXACT: tl.constexpr):
    # One program per key block of one (b, h); under a causal mask key block n meets the queries
    # [n·BN, T), so the first blocks have the most work and are launched first.
    i_nbh = tl.program_id(0)
    num_n = tl.cdiv(T, BLOCK_N)
    i_bh = i_nbh // num_n
    start_n = (i_nbh % num_n) * BLOCK_N
    i_b = (i_bh // H).to(tl.int64)
    i_h = (i_bh % H).to(tl.int64)
    o_n = start_n + tl.arange(0, BLOCK_N)
    o_dk = tl.arange(0, DK)
    o_dv = tl.arange(0, DV)
    g_base = g_ptr + i_b * sgb + i_h * sgh
    k = load_rows(k_ptr + i_b * skb + i_h * skh, o_n, skt, o_dk, T, True)
    v = load_rows(v_ptr + i_b * svb + i_h * svh, o_n, svt, o_dv, T, True)
    gk = tl.zeros([BLOCK_N], dtype=tl.float32)
    gk_abs = tl.zeros([BLOCK_N], dtype=tl.float32)
    g_ref = 0.0
    if HAS_BIAS:   # reference row r: this key block's first
        g_ref = tl.load(g_base + start_n * sgt)
        gk_abs = load_gates(g_base, o_n, sgt, T, True)
        gk = (gk_abs - g_ref) * g_to_s
    q_base = q_ptr + i_b * sqb + i_h * sqh
    do_base = do_ptr + i_b * sdob + i_h * sdoh
    lse_base = lse_ptr + i_bh.to(tl.int64) * T
    delta_base = delta_ptr + i_bh.to(tl.int64) * T

    dk = tl.zeros([BLOCK_N, DK], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, DV], dtype=tl.float32)
    dgk = tl.zeros([BLOCK_N], dtype=tl.float32)
    full_hi = (T // BLOCK_M) * BLOCK_M          # queries [0, full_hi) are whole blocks
    if CAUSAL:
        # the diagonal: queries [n·BN, n·BN + BN) see part of this key block (causal and tail mask)
        diag_hi = tl.minimum(start_n + BLOCK_N, T)
        dk, dv, dgk = _dkdv_query_blocks(dk, dv, dgk, k, v, gk, gk_abs, g_ref, q_base, do_base, g_base,
                                         lse_base, delta_base, sqt, sdot, sgt, o_n, o_dk, o_dv,
                                         start_n, diag_hi, T, qk_scale, g_to_s,
                                         BLOCK_M, True, True, PRECISION, HAS_BIAS, BIAS_EXACT)
        lo = start_n + BLOCK_N
    else:
        lo = 0
    # queries that see the whole key block: whole blocks without a mask, then the tail
    dk, dv, dgk = _dkdv_query_blocks(dk, dv, dgk, k, v, gk, gk_abs, g_ref, q_base, do_base, g_base,
                                     lse_base, delta_base, sqt, sdot, sgt, o_n, o_dk, o_dv,
                                     lo, full_hi, T, qk_scale, g_to_s,
                                     BLOCK_M, False, False, PRECISION, HAS_BIAS, BIAS_EXACT)
    dk, dv, dgk = _dkdv_query_blocks(dk, dv, dgk, k, v, gk, gk_abs, g_ref, q_base, do_base, g_base,
                                     lse_base, delta_base, sqt, sdot, sgt, o_n, o_dk, o_dv,
                                     tl.maximum(lo, full_hi), T, T, qk_scale, g_to_s,
                                     BLOCK_M, False, True, PRECISION, HAS_BIAS, BIAS_EXACT)
    # keys past T were zero rows: their results are not stored
    keep = (o_n < T)[:, None]
    tl.store(dk_ptr + i_b * sdkb + i_h * sdkh + o_n[:, None] * sdkt + o_dk[None, :],
             (dk * scale).to(dk_ptr.dtype.element_ty), mask=keep)
    tl.store(dv_ptr + i_b * sdvb + i_h * sdvh + o_n[:, None] * sdvt + o_dv[None, :],
             dv.to(dv_ptr.dtype.element_ty), mask=keep)
    if HAS_BIAS:
        tl.store(dg_ptr + i_bh.to(tl.int64) * T + o_n, dgk, mask=o_n < T)


@triton.jit
def _dq_key_blocks(dq, dgq, q, do, lse, delta, k_base, v_base, g_base, g_ref, g_row, skt, svt, sgt,
                   o_m, o_dk, o_dv, lo, hi, T, qk_scale, g_to_s,
                   BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, TAIL_MASK: tl.constexpr,
                   PRECISION: tl.constexpr, HAS_BIAS: tl.constexpr, BIAS_EXACT: tl.constexpr):
    """Stream the key blocks ``[lo, hi)`` past one query block, accumulating ``dq / scale`` (and,
    with the bias, the row sums of ``ds``)."""
    o_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        o_n = start_n + o_n0
        k = load_rows(k_base, o_n, skt, o_dk, T, TAIL_MASK)
        v = load_rows(v_base, o_n, svt, o_dv, T, TAIL_MASK)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)                   # [BM, BN]
        if HAS_BIAS:
            gk = load_gates(g_base, o_n, sgt, T, TAIL_MASK)
            if BIAS_EXACT:
                s -= (gk[None, :] - g_row[:, None]) * g_to_s
            else:
                s -= ((gk - g_ref) * g_to_s)[None, :]
        s = _mask_scores(s, o_m, o_n, T, CAUSAL_MASK, TAIL_MASK)
        p = tl.math.exp2(s * qk_scale - lse[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
        if HAS_BIAS:
            dgq += tl.sum(ds, 1)
    return dq, dgq


@triton.jit
def _bwd_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, g_ptr, lse_ptr, delta_ptr, dq_ptr, dg_ptr,
                   sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdob, sdot, sdoh, sgb, sgt, sgh,
                   sdqb, sdqt, sdqh,
                   T, H, qk_scale, scale, g_to_s,
                   DK: tl.constexpr, DV: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr,
                   BIAS_EXACT: tl.constexpr):
    # One program per query block of one (b, h), the last (longest under a causal mask) first.
    i_mbh = tl.program_id(0)
    num_m = tl.cdiv(T, BLOCK_M)
    i_bh = i_mbh // num_m
    start_m = (num_m - 1 - i_mbh % num_m) * BLOCK_M
    i_b = (i_bh // H).to(tl.int64)
    i_h = (i_bh % H).to(tl.int64)
    o_m = start_m + tl.arange(0, BLOCK_M)
    o_dk = tl.arange(0, DK)
    o_dv = tl.arange(0, DV)
    g_base = g_ptr + i_b * sgb + i_h * sgh
    q = load_rows(q_ptr + i_b * sqb + i_h * sqh, o_m, sqt, o_dk, T, True)
    do = load_rows(do_ptr + i_b * sdob + i_h * sdoh, o_m, sdot, o_dv, T, True)
    lse, delta = _load_row_stats(lse_ptr + i_bh.to(tl.int64) * T, delta_ptr + i_bh.to(tl.int64) * T,
                                 o_m, T, True)
    g_ref = 0.0
    g_row = tl.zeros([BLOCK_M], dtype=tl.float32)
    if HAS_BIAS:   # reference row r: this query block's first; lse shifted to match
        g_ref = tl.load(g_base + start_m * sgt)
        g_row = load_gates(g_base, o_m, sgt, T, True)
        if not BIAS_EXACT:
            lse -= (qk_scale * g_to_s) * (g_row - g_ref)
    k_base = k_ptr + i_b * skb + i_h * skh
    v_base = v_ptr + i_b * svb + i_h * svh

    dq = tl.zeros([BLOCK_M, DK], dtype=tl.float32)
    dgq = tl.zeros([BLOCK_M], dtype=tl.float32)
    if CAUSAL:
        # keys [0, start_m): visible to every query of the block; then the diagonal, masked
        dq, dgq = _dq_key_blocks(dq, dgq, q, do, lse, delta, k_base, v_base, g_base, g_ref, g_row, skt, svt, sgt,
                            o_m, o_dk, o_dv, 0, start_m, T, qk_scale, g_to_s,
                            BLOCK_N, False, False, PRECISION, HAS_BIAS, BIAS_EXACT)
        dq, dgq = _dq_key_blocks(dq, dgq, q, do, lse, delta, k_base, v_base, g_base, g_ref, g_row, skt, svt, sgt,
                            o_m, o_dk, o_dv, start_m, tl.minimum(start_m + BLOCK_M, T), T,
                            qk_scale, g_to_s, BLOCK_N, True, True, PRECISION, HAS_BIAS, BIAS_EXACT)
    else:
        full_hi = (T // BLOCK_N) * BLOCK_N
        dq, dgq = _dq_key_blocks(dq, dgq, q, do, lse, delta, k_base, v_base, g_base, g_ref, g_row, skt, svt, sgt,
                            o_m, o_dk, o_dv, 0, full_hi, T, qk_scale, g_to_s,
                            BLOCK_N, False, False, PRECISION, HAS_BIAS, BIAS_EXACT)
        dq, dgq = _dq_key_blocks(dq, dgq, q, do, lse, delta, k_base, v_base, g_base, g_ref, g_row, skt, svt, sgt,
                            o_m, o_dk, o_dv, full_hi, T, T, qk_scale, g_to_s,
                            BLOCK_N, False, True, PRECISION, HAS_BIAS, BIAS_EXACT)
    tl.store(dq_ptr + i_b * sdqb + i_h * sdqh + o_m[:, None] * sdqt + o_dk[None, :],
             (dq * scale).to(dq_ptr.dtype.element_ty), mask=(o_m < T)[:, None])
    if HAS_BIAS:   # dG = row sums (here) − column sums (stored by the dk/dv pass, which ran first)
        dg_ptrs = dg_ptr + i_bh.to(tl.int64) * T + o_m
        tl.store(dg_ptrs, tl.load(dg_ptrs, mask=o_m < T, other=0.0) + dgq, mask=o_m < T)


def flash_backward(q, k, v, o, lse, do, scale: float, causal: bool, plan: BackwardPlan, G=None):
    """Gradients of ``flash_forward``'s output: ``(dq, dk, dv, dG)``, the first three in the inputs'
    dtype; ``dG`` (float32 ``[B, H, T]``, the gradient of the cumulative log gates ``G``) only with
    a bias, the cumulative log gates ``G`` (float32 ``[B, T, H]``; else ``None``). ``lse`` is the forward's; ``o`` its output."""
    B, T, H, DK = q.shape
    DV = v.shape[-1]
    do = do if do.stride(-1) == 1 else do.contiguous()
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    dv = torch.empty_like(v)
    delta = torch.empty((B, H, T), dtype=torch.float32, device=q.device)
    has_bias = G is not None
    dg = torch.empty((B, H, T), dtype=torch.float32, device=q.device) if has_bias else delta
    g_arg, g_strides = (G, G.stride()) if has_bias else (delta, (0, 0, 0))  # unused without a bias
    precision = "ieee" if q.dtype == torch.float32 else "tf32"   # "tf32" is ignored for 16-bit inputs
    qk_scale = float(scale) * LOG2E
    common = dict(DK=DK, DV=DV, CAUSAL=causal, PRECISION=precision, HAS_BIAS=has_bias,
                  BIAS_EXACT=has_bias and q.dtype == torch.float32)     # see forward.py

    _bwd_delta_kernel[(triton.cdiv(T, plan.delta_m) * B * H,)](
        o, do, delta, *o.stride()[:3], *do.stride()[:3], T, H, DV=DV, BLOCK_M=plan.delta_m)
    inputs = (q, k, v, do, g_arg, lse, delta)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *g_strides)
    kv = plan.dkdv
    _bwd_dkdv_kernel[(triton.cdiv(T, kv.block_n) * B * H,)](
        *inputs, dk, dv, dg, *strides, *dk.stride()[:3], *dv.stride()[:3], T, H, qk_scale, float(scale),
        1.0 / float(scale),        **common, BLOCK_M=kv.block_m, BLOCK_N=kv.block_n, num_warps=kv.num_warps, num_stages=kv.num_stages)
    dqp = plan.dq
    _bwd_dq_kernel[(triton.cdiv(T, dqp.block_m) * B * H,)](
        *inputs, dq, dg, *strides, *dq.stride()[:3], T, H, qk_scale, float(scale), 1.0 / float(scale),
        **common, BLOCK_M=dqp.block_m, BLOCK_N=dqp.block_n, num_warps=dqp.num_warps,
        num_stages=dqp.num_stages)
    return dq, dk, dv, (dg if has_bias else None)
