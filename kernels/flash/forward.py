"""Stage: the flash-attention forward kernel (online softmax over key blocks, state on chip).

Layout ``[B, T, H, D]`` (fla's; ``q, k`` head size ``DK``, ``v`` head size ``DV``) with arbitrary
strides on ``B``, ``T`` and ``H`` (the head axis must be contiguous; it is made so only if it is
not). One program owns ``BLOCK_M`` queries
of one ``(batch, head)`` pair and streams over key blocks of ``BLOCK_N`` keys, keeping the
online-softmax state (running row max ``m``, running denominator ``l``, unnormalised output
``acc``) in float32 registers: :func:`kernels.common.softmax.online_softmax_step` is that update,
one key block at a time (on the common floor: PaTH and DeltaFormer fold their scores with it too). Scores use ``exp2``: ``log2(e)`` is folded
into the scale, so ``exp(scale·s) = exp2(scale·log2(e)·s)``.

The optional bias (FoX, ALiBi): scores ``scale·q_i·k_j + G_i − G_j`` with ``G`` the cumulative log
forget gates (float32). In *score units* the bias is ``gs = G / scale``, so that
``qk_scale·(s_ij + gs_i − gs_j)`` is the whole exponent in log2 units. A softmax does not change when
a row is shifted by a constant, so the kernel replaces each row's ``G_i`` by one reference value per
block, ``G_r`` (its first row's): every score of key ``j`` loses ``(G_j − G_r) / scale``, one
subtraction per score. The reference matters for precision, not for the result: ``G`` reaches −10³
to −10⁴ over long sequences, where float32's spacing is 10⁻⁴ to 10⁻³ (a relative error of each
weight of that size), while ``G_j − G_r`` for the keys that carry weight (those near the block) is
small and exact; the division by ``scale`` comes after the subtraction for the same reason. Where
``G`` falls steeply inside one block (gates near 0), rows far from ``G_r`` still see large numbers
and lose ~10⁻⁴ of relative precision in their probabilities: far below the 2⁻⁹ to which 16-bit
inputs round them anyway, but not float32's. So float32 inputs take ``BIAS_EXACT``: each score gets
``(G_i − G_j) / scale`` against its own row (two more operations per score). The kernel also writes each row's log-sum-exp ``lse``
(log2 units, float32, ``[B, H, T]``) of the unshifted exponents: all the backward needs to
recompute the probabilities.

Causal attention runs in two loops: key blocks strictly left of the query block are fully visible
and run without any mask; only the key blocks on the diagonal apply the causal (and sequence-tail)
mask. Query blocks are launched longest-work first within each head.

Precision: float32 inputs use ``input_precision="ieee"`` for both products (on a GPU this avoids
TF32 and agrees with the interpreter's exact float32 arithmetic); float16/bfloat16 use the tensor
cores, with the probabilities cast to the value dtype before ``P V`` and all accumulation in
float32. The output has ``v``'s dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import INTERPRET
from ..common.softmax import LOG2E, load_rows, online_softmax_step
from .plan import AUTOTUNE, FlashPlan

__all__ = ["flash_forward", "load_gates"]

@triton.jit
def _mask_scores(s, o_m, o_n, T, CAUSAL_MASK: tl.constexpr, TAIL_MASK: tl.constexpr):
    """Set to -inf the scores of keys after the query (causal) or past the sequence end (tail)."""
    if CAUSAL_MASK:
        keep = o_n[None, :] <= o_m[:, None]
        if TAIL_MASK:
            keep = keep & (o_n[None, :] < T)
        s = tl.where(keep, s, float("-inf"))
    elif TAIL_MASK:
        s = tl.where(o_n[None, :] < T, s, float("-inf"))
    return s


@triton.jit
def load_gates(g_base, o_r, stride_gt, T, TAIL_MASK: tl.constexpr):
    """The cumulative log gates ``G`` (float32) at ``o_r``; zeros past ``T``."""
    if TAIL_MASK:
        return tl.load(g_base + o_r * stride_gt, mask=o_r < T, other=0.0)
    return tl.load(g_base + o_r * stride_gt)


@triton.jit
def _key_blocks(acc, l_i, m_i, q, k_base, v_base, g_base, g_ref, g_row, k_desc, v_desc,
                stride_kt, stride_vt, stride_gt, col_k, col_v,
                o_m, o_dk, o_dv, lo, hi, T, qk_scale, g_to_s,
                BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, TAIL_MASK: tl.constexpr,
                PRECISION: tl.constexpr, TMA: tl.constexpr, HAS_BIAS: tl.constexpr,
                BIAS_EXACT: tl.constexpr):
    """Online softmax over the key blocks ``[lo, hi)``; masks only where the constexpr flags say so.
    ``TMA``: keys and values come through the tensor descriptors (rows past ``T`` load as zeros).
    ``HAS_BIAS``: subtract ``(G_j − G_r) / scale`` from every score of key ``j`` before the mask
    (``BIAS_EXACT``: ``(G_j − G_i) / scale``, each row against its own ``G_i = g_row``)."""
    o_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        o_n = start_n + o_n0
        if TMA:
            k = k_desc.load([start_n, col_k])
            v = v_desc.load([start_n, col_v])
        else:
            k = load_rows(k_base, o_n, stride_kt, o_dk, T, TAIL_MASK)
            v = load_rows(v_base, o_n, stride_vt, o_dv, T, TAIL_MASK)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)                # [BM, BN] float32, unscaled
        if HAS_BIAS:
            gk = load_gates(g_base, o_n, stride_gt, T, TAIL_MASK)
            if BIAS_EXACT:
                s -= (gk[None, :] - g_row[:, None]) * g_to_s
            else:
                s -= ((gk - g_ref) * g_to_s)[None, :]
        s = _mask_scores(s, o_m, o_n, T, CAUSAL_MASK, TAIL_MASK)
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, v, qk_scale, PRECISION)
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, g_ptr, lse_ptr,
                     sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sob, sot, soh, sgb, sgt, sgh,
                     T, H, BH, qk_scale, g_to_s, T_BUCKET,
                     DK: tl.constexpr, DV: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEADS_INNER: tl.constexpr,
                     HAS_BIAS: tl.constexpr, BIAS_EXACT: tl.constexpr = False, TMA: tl.constexpr = False):
    # A 1-D grid of cdiv(T, BM)·B·H programs (no 65,535 limit on a grid axis). Query blocks are
    # visited last-first (under a causal mask the last block has the most keys). HEADS_INNER:
    #   True:  consecutive programs = the same query block of successive (b, h): the whole grid runs
    #          longest-first, best load balance;
    #   False: consecutive programs = the query blocks of one (b, h): the programs running together
    #          read the same keys and values, which then come from L2 rather than HBM.
    i_mbh = tl.program_id(0)
    num_m = tl.cdiv(T, BLOCK_M)
    if HEADS_INNER:
        i_bh = i_mbh % BH
        i_m = i_mbh // BH
    else:
        i_bh = i_mbh // num_m
        i_m = i_mbh % num_m
    start_m = num_m - 1 - i_m
    i_b = (i_bh // H).to(tl.int64)
    i_h32 = i_bh % H
    i_h = i_h32.to(tl.int64)
    col_k = i_h32 * DK                     # column of this head in the [T, H·D] views (TMA)
    col_v = i_h32 * DV

    q_base = q_ptr + i_b * sqb + i_h * sqh
    k_base = k_ptr + i_b * skb + i_h * skh
    v_base = v_ptr + i_b * svb + i_h * svh
    o_base = o_ptr + i_b * sob + i_h * soh
    g_base = g_ptr + i_b * sgb + i_h * sgh
    o_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_dk = tl.arange(0, DK)
    o_dv = tl.arange(0, DV)
    if TMA:
        # device-side descriptors over this batch's [T, H·D] slab (D contiguous, heads adjacent:
        # tma_compatible checks stride(2) == D); out-of-range rows load as zeros and are not stored
        q_desc = tl.make_tensor_descriptor(q_ptr + i_b * sqb, shape=[T, H * DK], strides=[sqt, 1],
                                           block_shape=[BLOCK_M, DK])
        k_desc = tl.make_tensor_descriptor(k_ptr + i_b * skb, shape=[T, H * DK], strides=[skt, 1],
                                           block_shape=[BLOCK_N, DK])
        v_desc = tl.make_tensor_descriptor(v_ptr + i_b * svb, shape=[T, H * DV], strides=[svt, 1],
                                           block_shape=[BLOCK_N, DV])
        q = q_desc.load([start_m * BLOCK_M, col_k])
    else:
        k_desc = k_base
        v_desc = v_base
        q = load_rows(q_base, o_m, sqt, o_dk, T, True)

    g_ref = 0.0
    g_row = tl.zeros([BLOCK_M], dtype=tl.float32)
    if HAS_BIAS:
        g_ref = tl.load(g_base + (start_m * BLOCK_M) * sgt)        # the block's reference row r
        g_row = load_gates(g_base, o_m, sgt, T, True)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DV], dtype=tl.float32)
    if CAUSAL:
        # keys [0, start_m·BM): fully visible to every query of the block, and all < T
        diag_lo = start_m * BLOCK_M
        acc, l_i, m_i = _key_blocks(acc, l_i, m_i, q, k_base, v_base, g_base, g_ref, g_row, k_desc, v_desc,
                                    skt, svt, sgt, col_k, col_v, o_m, o_dk, o_dv,
                                    0, diag_lo, T, qk_scale, g_to_s,
                                    BLOCK_N, False, False, PRECISION, TMA, HAS_BIAS, BIAS_EXACT)
        # the diagonal: keys [start_m·BM, min((start_m+1)·BM, T)), causal and tail mask
        diag_hi = tl.minimum(diag_lo + BLOCK_M, T)
        acc, l_i, m_i = _key_blocks(acc, l_i, m_i, q, k_base, v_base, g_base, g_ref, g_row, k_desc, v_desc,
                                    skt, svt, sgt, col_k, col_v, o_m, o_dk, o_dv,
                                    diag_lo, diag_hi, T, qk_scale, g_to_s,
                                    BLOCK_N, True, True, PRECISION, TMA, HAS_BIAS, BIAS_EXACT)
    else:
        full_hi = (T // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _key_blocks(acc, l_i, m_i, q, k_base, v_base, g_base, g_ref, g_row, k_desc, v_desc,
                                    skt, svt, sgt, col_k, col_v, o_m, o_dk, o_dv,
                                    0, full_hi, T, qk_scale, g_to_s,
                                    BLOCK_N, False, False, PRECISION, TMA, HAS_BIAS, BIAS_EXACT)
        acc, l_i, m_i = _key_blocks(acc, l_i, m_i, q, k_base, v_base, g_base, g_ref, g_row, k_desc, v_desc,
                                    skt, svt, sgt, col_k, col_v, o_m, o_dk, o_dv,
                                    full_hi, T, T, qk_scale, g_to_s,
                                    BLOCK_N, False, True, PRECISION, TMA, HAS_BIAS, BIAS_EXACT)

    # the row's log-sum-exp in log2 units, of the exponents with the row's own gs_i (not gs_r):
    # p_ij = exp2(qk_scale·(s_ij + gs_i − gs_j) − lse_i) in the backward
    lse = m_i + tl.math.log2(l_i)
    if HAS_BIAS and not BIAS_EXACT:
        lse += (qk_scale * g_to_s) * (g_row - g_ref)
    tl.store(lse_ptr + i_bh.to(tl.int64) * T + o_m, lse, mask=o_m < T)
    o = (acc / l_i[:, None]).to(o_ptr.dtype.element_ty)
    if TMA:
        o_desc = tl.make_tensor_descriptor(o_ptr + i_b * sob, shape=[T, H * DV], strides=[sot, 1],
                                           block_shape=[BLOCK_M, DV])
        o_desc.store([start_m * BLOCK_M, col_v], o)
    else:
        tl.store(o_base + o_m[:, None] * sot + o_dv[None, :], o, mask=(o_m < T)[:, None])


_attn_fwd_tuned = None if INTERPRET else triton.autotune(
    configs=[triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "HEADS_INNER": hi}, num_warps=w, num_stages=s)
             for bm, bn, w, s, hi in AUTOTUNE],
    key=["T_BUCKET", "DK", "DV", "CAUSAL", "HAS_BIAS"])(_attn_fwd_kernel)


def _alloc_scratch(size: int, alignment: int, stream):
    """Global scratch for device-side tensor descriptors (``triton.set_allocator``)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def flash_forward(q, k, v, scale: float, causal: bool, plan: FlashPlan, G=None, out_dtype=None):
    """``softmax(scale · q kᵀ + G_i − G_j + log M) v`` with the launch ``plan`` (``G_i`` drops out).

    ``G``: ``None`` or the cumulative log gates (float32 ``[B, T, H]``). ``out_dtype``: ``o``'s
    dtype (default ``v``'s; float32 keeps the accumulator unrounded, for a backward whose row sums
    ``Σ o·do`` must not carry 16-bit rounding: DeltaFormer's).
    Returns ``(o, lse)``: ``o`` ``[B, T, H, DV]`` in ``out_dtype``, ``lse`` float32 ``[B, H, T]``
    (log2 units of the scaled scores less ``G_j``), what the backward recomputes the probabilities
    from."""
    B, T, H, DK = q.shape
    DV = v.shape[-1]
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    o = torch.empty((B, T, H, DV), dtype=out_dtype or v.dtype, device=v.device)
    lse = torch.empty((B, H, T), dtype=torch.float32, device=v.device)
    has_bias = G is not None
    g_arg, g_strides = (G, G.stride()) if has_bias else (lse, (0, 0, 0))   # unused pointer if no bias
    precision = "ieee" if q.dtype == torch.float32 else "tf32"   # "tf32" is ignored for 16-bit inputs
    t_bucket = min(max(1 << max(T - 1, 0).bit_length(), 1024), 8192)   # autotune key: <=1024, ..., >=8192
    args = (q, k, v, o, g_arg, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
            *g_strides, T, H, B * H, float(scale) * LOG2E, 1.0 / float(scale), t_bucket)
    meta = dict(DK=DK, DV=DV, CAUSAL=causal, PRECISION=precision, HAS_BIAS=has_bias,
                BIAS_EXACT=has_bias and q.dtype == torch.float32)
    if plan.kind == "autotune":
        def grid(meta):
            return (triton.cdiv(T, meta["BLOCK_M"]) * B * H,)
        _attn_fwd_tuned[grid](*args, **meta)
        return o, lse
    if plan.kind == "tma" and not INTERPRET:
        triton.set_allocator(_alloc_scratch)
    _attn_fwd_kernel[(triton.cdiv(T, plan.block_m) * B * H,)](
        *args, **meta, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
        HEADS_INNER=plan.heads_inner, TMA=plan.kind == "tma", num_warps=plan.num_warps,
        num_stages=plan.num_stages)
    return o, lse
