"""Stage: the flash-attention forward kernel (online softmax over key blocks, state on chip).

Layout ``[B, T, H, D]`` (fla's) with arbitrary strides on ``B``, ``T`` and ``H`` (the head axis
``D`` must be contiguous; it is made so only if it is not). One program owns ``BLOCK_M`` queries
of one ``(batch, head)`` pair and streams over key blocks of ``BLOCK_N`` keys, keeping the
online-softmax state (running row max ``m``, running denominator ``l``, unnormalised output
``acc``) in float32 registers: :func:`online_softmax_step` is that update, one key block at a
time, and the part of this family other kernels reuse. Scores use ``exp2``: ``log2(e)`` is folded
into the scale, so ``exp(scale·s) = exp2(scale·log2(e)·s)``.

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
from .plan import AUTOTUNE, FlashPlan

__all__ = ["flash_forward", "online_softmax_step", "LOG2E"]

LOG2E = 1.4426950408889634


@triton.jit
def _mask_scores(s, offs_m, offs_n, T, CAUSAL_MASK: tl.constexpr, TAIL_MASK: tl.constexpr):
    """Set to -inf the scores of keys after the query (causal) or past the sequence end (tail)."""
    if CAUSAL_MASK:
        keep = offs_n[None, :] <= offs_m[:, None]
        if TAIL_MASK:
            keep = keep & (offs_n[None, :] < T)
        s = tl.where(keep, s, float("-inf"))
    elif TAIL_MASK:
        s = tl.where(offs_n[None, :] < T, s, float("-inf"))
    return s


@triton.jit
def online_softmax_step(acc, l_i, m_i, s, v, qk_scale, PRECISION: tl.constexpr):
    """Fold one block of scores ``s`` ``[BM, BN]`` (unscaled, masked entries -inf) and its values
    ``v`` ``[BN, D]`` into the running ``(acc, l, m)`` of the online softmax.

    Scores in log2 units are ``qk_scale·s`` (``qk_scale = scale·log2 e > 0``, so the row max commutes
    with the scaling and ``qk_scale·s − m`` is one fused multiply-add per score). The caller
    guarantees that every row has seen a visible key by its first block (key 0, or its own diagonal
    key), so ``m_new`` is finite and ``exp2(-inf − m_new) = 0`` never meets ``-inf − -inf``."""
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    p = tl.math.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
    return acc, l_i, m_new


@triton.jit
def _key_blocks(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, stride_kt, stride_vt, col,
                offs_m, offs_d, lo, hi, T, qk_scale,
                BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, TAIL_MASK: tl.constexpr,
                PRECISION: tl.constexpr, TMA: tl.constexpr):
    """Online softmax over the key blocks ``[lo, hi)``; masks only where the constexpr flags say so.
    ``TMA``: keys and values come through the tensor descriptors (rows past ``T`` load as zeros)."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        if TMA:
            k = k_desc.load([start_n, col])
            v = v_desc.load([start_n, col])
        else:
            k_ptrs = k_base + offs_n[:, None] * stride_kt + offs_d[None, :]
            v_ptrs = v_base + offs_n[:, None] * stride_vt + offs_d[None, :]
            if TAIL_MASK:
                in_range = offs_n < T
                k = tl.load(k_ptrs, mask=in_range[:, None], other=0.0)
                v = tl.load(v_ptrs, mask=in_range[:, None], other=0.0)
            else:
                k = tl.load(k_ptrs)
                v = tl.load(v_ptrs)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)                # [BM, BN] float32, unscaled
        s = _mask_scores(s, offs_m, offs_n, T, CAUSAL_MASK, TAIL_MASK)
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, v, qk_scale, PRECISION)
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr,
                     sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sob, sot, soh,
                     T, H, BH, qk_scale, T_BUCKET,
                     D: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEADS_INNER: tl.constexpr,
                     TMA: tl.constexpr = False):
    # A 1-D grid of cdiv(T, BM)·B·H programs (no 65,535 limit on a grid axis). Query blocks are
    # visited last-first (under a causal mask the last block has the most keys). HEADS_INNER:
    #   True:  consecutive programs = the same query block of successive (b, h): the whole grid runs
    #          longest-first, best load balance;
    #   False: consecutive programs = the query blocks of one (b, h): the programs running together
    #          read the same keys and values, which then come from L2 rather than HBM.
    pid = tl.program_id(0)
    num_m = tl.cdiv(T, BLOCK_M)
    if HEADS_INNER:
        pid_bh = pid % BH
        pid_m = pid // BH
    else:
        pid_bh = pid // num_m
        pid_m = pid % num_m
    start_m = num_m - 1 - pid_m
    i_b = (pid_bh // H).to(tl.int64)
    i_h32 = pid_bh % H
    i_h = i_h32.to(tl.int64)
    col = i_h32 * D                                   # column of this head in the [T, H·D] views (TMA)

    q_base = q_ptr + i_b * sqb + i_h * sqh
    k_base = k_ptr + i_b * skb + i_h * skh
    v_base = v_ptr + i_b * svb + i_h * svh
    o_base = o_ptr + i_b * sob + i_h * soh
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    if TMA:
        # device-side descriptors over this batch's [T, H·D] slab (D contiguous, heads adjacent:
        # plan_for checks stride(2) == D); out-of-range rows load as zeros and are not stored
        q_desc = tl.make_tensor_descriptor(q_ptr + i_b * sqb, shape=[T, H * D], strides=[sqt, 1],
                                           block_shape=[BLOCK_M, D])
        k_desc = tl.make_tensor_descriptor(k_ptr + i_b * skb, shape=[T, H * D], strides=[skt, 1],
                                           block_shape=[BLOCK_N, D])
        v_desc = tl.make_tensor_descriptor(v_ptr + i_b * svb, shape=[T, H * D], strides=[svt, 1],
                                           block_shape=[BLOCK_N, D])
        q = q_desc.load([start_m * BLOCK_M, col])
    else:
        k_desc = k_base
        v_desc = v_base
        q = tl.load(q_base + offs_m[:, None] * sqt + offs_d[None, :], mask=(offs_m < T)[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    if CAUSAL:
        # keys [0, start_m·BM): fully visible to every query of the block, and all < T
        diag_lo = start_m * BLOCK_M
        acc, l_i, m_i = _key_blocks(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, skt, svt, col,
                                    offs_m, offs_d, 0, diag_lo, T, qk_scale,
                                    BLOCK_N, False, False, PRECISION, TMA)
        # the diagonal: keys [start_m·BM, min((start_m+1)·BM, T)), causal and tail mask
        diag_hi = tl.minimum(diag_lo + BLOCK_M, T)
        acc, l_i, m_i = _key_blocks(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, skt, svt, col,
                                    offs_m, offs_d, diag_lo, diag_hi, T, qk_scale,
                                    BLOCK_N, True, True, PRECISION, TMA)
    else:
        full_hi = (T // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _key_blocks(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, skt, svt, col,
                                    offs_m, offs_d, 0, full_hi, T, qk_scale,
                                    BLOCK_N, False, False, PRECISION, TMA)
        acc, l_i, m_i = _key_blocks(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, skt, svt, col,
                                    offs_m, offs_d, full_hi, T, T, qk_scale,
                                    BLOCK_N, False, True, PRECISION, TMA)

    o = (acc / l_i[:, None]).to(o_ptr.dtype.element_ty)
    if TMA:
        o_desc = tl.make_tensor_descriptor(o_ptr + i_b * sob, shape=[T, H * D], strides=[sot, 1],
                                           block_shape=[BLOCK_M, D])
        o_desc.store([start_m * BLOCK_M, col], o)
    else:
        tl.store(o_base + offs_m[:, None] * sot + offs_d[None, :], o, mask=(offs_m < T)[:, None])


_attn_fwd_tuned = None if INTERPRET else triton.autotune(
    configs=[triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "HEADS_INNER": hi}, num_warps=w, num_stages=s)
             for bm, bn, w, s, hi in AUTOTUNE],
    key=["T_BUCKET", "D", "CAUSAL"])(_attn_fwd_kernel)


def _alloc_scratch(size: int, alignment: int, stream):
    """Global scratch for device-side tensor descriptors (``triton.set_allocator``)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def flash_forward(q, k, v, scale: float, causal: bool, plan: FlashPlan) -> torch.Tensor:
    """``softmax(scale · q kᵀ + log M) v`` with the launch ``plan``; ``o`` ``[B, T, H, D]`` in ``v``'s dtype."""
    B, T, H, D = q.shape
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    o = torch.empty((B, T, H, D), dtype=v.dtype, device=v.device)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"   # "tf32" is ignored for 16-bit inputs
    t_bucket = min(max(1 << max(T - 1, 0).bit_length(), 1024), 8192)   # autotune key: <=1024, ..., >=8192
    args = (q, k, v, o, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
            T, H, B * H, float(scale) * LOG2E, t_bucket)
    if plan.kind == "autotune":
        def grid(meta):
            return (triton.cdiv(T, meta["BLOCK_M"]) * B * H,)
        _attn_fwd_tuned[grid](*args, D=D, CAUSAL=causal, PRECISION=precision)
        return o
    if plan.kind == "tma" and not INTERPRET:
        triton.set_allocator(_alloc_scratch)
    _attn_fwd_kernel[(triton.cdiv(T, plan.block_m) * B * H,)](
        *args, D=D, CAUSAL=causal, PRECISION=precision, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
        HEADS_INNER=plan.heads_inner, TMA=plan.kind == "tma", num_warps=plan.num_warps,
        num_stages=plan.num_stages)
    return o
