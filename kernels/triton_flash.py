"""Causal (or full) softmax attention: a FlashAttention-style Triton forward kernel.

Layout ``[B, T, H, D]`` (fla's) with arbitrary strides on ``B``, ``T`` and ``H`` (the head axis ``D``
must be contiguous; it is made so only if it is not). One program owns ``BLOCK_M`` queries of one
``(batch, head)`` pair and streams over key blocks of ``BLOCK_N`` keys, keeping the online-softmax
state (running row max ``m``, running denominator ``l``, unnormalised output ``acc``) in float32
registers. Scores use ``exp2``: ``log2(e)`` is folded into the scale, so ``exp(scale·s) =
exp2(scale·log2(e)·s)``.

Causal attention is split in two loops: key blocks strictly left of the query block are fully
visible and run without any mask; only the key blocks on the diagonal apply the causal (and
sequence-tail) mask. Query blocks are launched longest-work first within each head; the autotuner
also chooses between "heads inner" order (the whole grid longest-first) and "blocks inner" order
(the programs running together share one head's keys and values in L2).

Launch plan (:func:`_launch_plan`, from the H200 sweep in ``kernels/results/logs/explore_flash.json``,
see ``kernels/NOTES_flash.md`` round 2), for causal float16/bfloat16 inputs with ``D = 128``:

- ``T <= 2048``: the pointer kernel with 64 x 64 tiles, 4 warps, 3 stages (two CTAs per SM);
- ``T > 2048`` with packed heads (``stride(2) == D``, 16-byte aligned rows): the TMA variant
  (device-side tensor descriptors for Q/K/V/O), 128 x 128 tiles, 8 warps, 3 stages;
- otherwise (non-packed heads, float32, other ``D``, non-causal, the interpreter): the pointer
  kernel, autotuned (16-bit, ``D >= 64``, ``T >= 512`` on a GPU) or with a fixed tiling.

Precision: float32 inputs use ``input_precision="ieee"`` for both products (on a GPU this avoids
TF32 and makes the result agree with the interpreter's exact float32 arithmetic); float16/bfloat16
use the tensor-core path, with the probabilities cast to the value dtype before ``P V`` and all
accumulation in float32. The output has ``v``'s dtype.

The kernel is forward-only: :class:`FlashAttentionFunction`'s backward recomputes attention with
:func:`kernels.reference.attention_ref` in float32 under autograd (an O(T^2)-memory backward; a
fused Triton backward is future work).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._common import INTERPRET, next_pow2
from ._interp import apply_interpreter_fixes
from .reference import attention_ref

__all__ = ["flash_attention_triton", "FlashAttentionFunction"]

_LOG2E = 1.4426950408889634


if INTERPRET:
    apply_interpreter_fixes()


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
def _attn_block_loop(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, offs_d,
                     lo, hi, T, qk_scale,
                     BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, TAIL_MASK: tl.constexpr,
                     PRECISION: tl.constexpr):
    """Online softmax over key blocks ``[lo, hi)``; masks only when the constexpr flags say so."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
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
        # Scores in log2 units are qk_scale·s (qk_scale = scale·log2 e > 0, so the row max commutes
        # with the scaling and qk_scale·s − m is one fused multiply-add per score).
        # Every row has seen at least one visible key before or in its first block (key 0, or its
        # own diagonal key), so m_new is finite and exp2(-inf - m_new) = 0 never meets -inf - -inf.
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr,
                     sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sob, sot, soh,
                     T, H, BH, qk_scale, T_BUCKET,
                     D: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEADS_INNER: tl.constexpr):
    # A 1-D grid of cdiv(T, BM)·B·H programs (no 65,535 limit on a grid axis). Query blocks are
    # visited last-first (under a causal mask the last block has the most keys). HEADS_INNER:
    #   True:  consecutive programs = the same query block of successive (b, h): the whole grid runs
    #          longest-first, best load balance;
    #   False: consecutive programs = the query blocks of one (b, h): the CTAs running together read
    #          the same keys and values, which then come from L2 rather than HBM.
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
    i_h = (pid_bh % H).to(tl.int64)

    q_base = q_ptr + i_b * sqb + i_h * sqh
    k_base = k_ptr + i_b * skb + i_h * skh
    v_base = v_ptr + i_b * svb + i_h * svh
    o_base = o_ptr + i_b * sob + i_h * soh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(q_base + offs_m[:, None] * sqt + offs_d[None, :], mask=(offs_m < T)[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)

    if CAUSAL:
        # keys [0, start_m·BM): fully visible to every query of the block, and all < T.
        diag_lo = start_m * BLOCK_M
        acc, l_i, m_i = _attn_block_loop(acc, l_i, m_i, q, k_base, v_base, skt, svt, offs_m, offs_d,
                                         0, diag_lo, T, qk_scale,
                                         BLOCK_N, False, False, PRECISION)
        # the diagonal: keys [start_m·BM, min((start_m+1)·BM, T)), causal and tail mask.
        diag_hi = tl.minimum(diag_lo + BLOCK_M, T)
        acc, l_i, m_i = _attn_block_loop(acc, l_i, m_i, q, k_base, v_base, skt, svt, offs_m, offs_d,
                                         diag_lo, diag_hi, T, qk_scale,
                                         BLOCK_N, True, True, PRECISION)
    else:
        full_hi = (T // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _attn_block_loop(acc, l_i, m_i, q, k_base, v_base, skt, svt, offs_m, offs_d,
                                         0, full_hi, T, qk_scale,
                                         BLOCK_N, False, False, PRECISION)
        acc, l_i, m_i = _attn_block_loop(acc, l_i, m_i, q, k_base, v_base, skt, svt, offs_m, offs_d,
                                         full_hi, T, T, qk_scale,
                                         BLOCK_N, False, True, PRECISION)

    o = acc / l_i[:, None]
    tl.store(o_base + offs_m[:, None] * sot + offs_d[None, :], o.to(o_ptr.dtype.element_ty),
             mask=(offs_m < T)[:, None])


def _tuned_configs():
    """Autotuning candidates for 16-bit inputs with D in {64, 128} and T >= 512 (GPU only).

    Hopper, D = 128: the q tile (BM·D·2 B) plus 2·BN·D·2 B of (k, v) per pipeline stage must fit
    227 KiB of shared memory (BN = 128 with 3 stages: 32 + 192 KiB); BM = 128 with 8 warps keeps the
    128x128 float32 accumulator at 64 registers per thread (no spills: tests/aot_compile_flash.py).
    The last config (80 KiB) is a fallback for GPUs with ~100 KiB of shared memory (a Colab L4).
    """
    cfgs = [(128, 64, 8, 3, False), (128, 64, 8, 3, True), (128, 128, 8, 3, False),
            (128, 128, 8, 3, True), (128, 64, 8, 4, False), (64, 64, 4, 2, False)]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "HEADS_INNER": hi}, num_warps=w, num_stages=s)
            for bm, bn, w, s, hi in cfgs]


_attn_fwd_tuned = triton.autotune(configs=_tuned_configs(), key=["T_BUCKET", "D", "CAUSAL"])(_attn_fwd_kernel) \
    if not INTERPRET else None


def _fixed_config(T: int, D: int, dtype: torch.dtype):
    """``(BLOCK_M, BLOCK_N, num_warps, num_stages, HEADS_INNER)`` where autotuning is not used."""
    if INTERPRET:
        # The interpreter is exact and slow: small tiles (BM = 2·BN exercises two diagonal blocks).
        return 32, 16, 4, 1, False
    if dtype == torch.float32:
        # IEEE fp32 products run on CUDA cores; tiles chosen so that the sm_90 build does not spill
        # registers (checked with an ahead-of-time compile and cuobjdump --dump-resource-usage).
        return (64, 32, 8, 2, False) if D <= 64 else (32, 16, 8, 2, False)
    if D <= 32:
        return 64, 64, 4, 3, False
    return (64, 64, 4, 3, False) if T <= 256 else (128, 64, 8, 3, False)


def _autotune_shape(T: int, D: int, dtype: torch.dtype) -> bool:
    """Shapes where the pointer kernel is autotuned on a GPU (16-bit, D >= 64, T >= 512)."""
    return dtype in (torch.float16, torch.bfloat16) and D >= 64 and T >= 512


# Production choices for causal 16-bit D = 128 (the sweep's shapes; kernels/results/logs/explore_flash.json):
# at T = 1024 the 64 x 64 / 4-warp tiling was the fastest variant (two CTAs per SM overlap one CTA's
# softmax with the other's MMAs), at T = 4096 and 16384 the TMA variant with BLOCK_N = 128 (TMA takes
# the K/V address arithmetic out of the registers: 204 instead of 255 + spill). T = 2048 and 8192 were
# not in the sweep; the threshold sits between the measured 1024 (short wins) and 4096 (TMA wins).
SHORT_T_MAX = 2048
SHORT_CONFIG = (64, 64, 4, 3, False)     # (BLOCK_M, BLOCK_N, num_warps, num_stages, HEADS_INNER)
TMA_CONFIG = dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3, TMA=True)


def _tma_compatible(x: torch.Tensor) -> bool:
    """Device-side TMA descriptors over ``[T, H·D]`` need packed heads and 16-byte aligned rows/base."""
    es = x.element_size()
    return (x.stride(-1) == 1 and x.stride(2) == x.shape[3] and (x.stride(1) * es) % 16 == 0
            and (x.stride(0) * es) % 16 == 0 and x.data_ptr() % 16 == 0)


def _launch_plan(q, k, v, causal: bool, interpret: bool = INTERPRET):
    """``("short", cfg)``, ``("tma", variant)``, ``("autotune", None)`` or ``("fixed", cfg)``.

    ``interpret=False`` lets a CPU test check the GPU decision without a GPU.
    """
    B, T, H, D = q.shape
    # The "short" and "tma" plans were measured on Hopper (H200): TMA needs sm_90 and ~225 KiB of
    # shared memory, so other GPUs (a Colab T4/L4/A100) take the autotuned path instead.
    hopper = (not interpret and q.is_cuda and torch.cuda.get_device_capability(q.device)[0] >= 9)
    if not interpret and (hopper or not q.is_cuda) and causal and q.dtype in (torch.float16, torch.bfloat16) \
            and D == 128:
        if T <= SHORT_T_MAX:
            return "short", SHORT_CONFIG
        # TMA only for whole query tiles: those lengths were measured on the H200; a ragged tail
        # through the TMA path has so far run only in the interpreter (which emulates TMA).
        if T % TMA_CONFIG["BLOCK_M"] == 0 and all(_tma_compatible(x) for x in (q, k, v)):
            return "tma", dict(TMA_CONFIG)
    if not interpret and _autotune_shape(T, D, q.dtype):
        return "autotune", None
    return "fixed", _fixed_config(T, D, q.dtype)


def _flash_forward(q, k, v, scale: float, causal: bool) -> torch.Tensor:
    B, T, H, D = q.shape
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    kind, cfg = _launch_plan(q, k, v, causal)
    if kind == "tma":
        return flash_forward_variant(q, k, v, scale, causal, **cfg)
    o = torch.empty((B, T, H, D), dtype=v.dtype, device=v.device)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"   # "tf32" is ignored for 16-bit inputs
    t_bucket = min(max(next_pow2(T), 1024), 8192)   # autotune key: <=1024, 2048, 4096, >=8192
    args = (q, k, v, o, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
            T, H, B * H, float(scale) * _LOG2E, t_bucket)
    if kind == "autotune":
        def grid(meta):
            return (triton.cdiv(T, meta["BLOCK_M"]) * B * H,)
        _attn_fwd_tuned[grid](*args, D=D, CAUSAL=causal, PRECISION=precision)
    else:
        bm, bn, warps, stages, heads_inner = cfg
        _attn_fwd_kernel[(triton.cdiv(T, bm) * B * H,)](*args, D=D, CAUSAL=causal, PRECISION=precision,
                                                         BLOCK_M=bm, BLOCK_N=bn, HEADS_INNER=heads_inner,
                                                         num_warps=warps, num_stages=stages)
    return o


class FlashAttentionFunction(torch.autograd.Function):
    """Forward: the Triton kernel. Backward: attention recomputed with PyTorch in float32
    (:func:`kernels.reference.attention_ref` under autograd), O(T^2) memory."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal):
        ctx.save_for_backward(q, k, v)
        ctx.scale, ctx.causal = scale, causal
        return _flash_forward(q, k, v, scale, causal)

    @staticmethod
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors
        with torch.enable_grad():
            qd, kd, vd = (x.detach().requires_grad_(True) for x in (q, k, v))
            o = attention_ref(qd, kd, vd, ctx.scale, ctx.causal)
            dq, dk, dv = torch.autograd.grad(o, (qd, kd, vd), do)
        return dq, dk, dv, None, None


def flash_attention_triton(q, k, v, scale: float, causal: bool) -> torch.Tensor:
    """Softmax attention with the Triton forward kernel (inputs already validated by
    :func:`kernels.ops.flash_attention`). Returns ``o`` ``[B, T, H, D]`` in ``v``'s dtype."""
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite; got {scale!r}")
    return FlashAttentionFunction.apply(q, k, v, float(scale), bool(causal))


# ------------------------------------------------------------------------------------------------
# Exploration variants (GPU tuning rounds; kernels/benchmarks/explore_flash.py). One of them is in
# production: flash_attention_triton launches TMA_CONFIG through flash_forward_variant for long causal
# 16-bit D = 128 inputs with packed heads (_launch_plan); the others document the sweep. Every flag
# is a constexpr, so each variant compiles to its own specialised binary.
# ------------------------------------------------------------------------------------------------

# FA4-style lazy rescale threshold (log2 units): the running max used for p is only moved when a
# row's true max exceeds it by more than this, so p <= 2^8 (no float32 or bfloat16 overflow risk:
# acc grows by at most 2^8·T·max|v| before the final division).
RESCALE_THRESHOLD = 8.0


@triton.jit
def _xloop(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, stride_kt, stride_vt, col,
           offs_m, offs_d, lo, hi, T, qk_scale,
           BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, TAIL_MASK: tl.constexpr,
           PRECISION: tl.constexpr, TMA: tl.constexpr, WARP_SPEC: tl.constexpr,
           LAZY_RESCALE: tl.constexpr, THRESH: tl.constexpr):
    """:func:`_attn_block_loop` with the variant flags (TMA loads, warp-specialised loop, lazy rescale)."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPEC):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        if TMA:
            # rows >= T of this batch come back as zeros (the descriptor's shape is [T, H·D])
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
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        s = _mask_scores(s, offs_m, offs_n, T, CAUSAL_MASK, TAIL_MASK)
        m_blk = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        if LAZY_RESCALE:
            # keep the stale max unless it is more than THRESH below the true one (first block:
            # m_i = -inf, so every row moves); skip the acc multiply when no row of the tile moved.
            m_new = tl.where(m_blk - m_i > THRESH, m_blk, m_i)
            p = tl.math.exp2(s * qk_scale - m_new[:, None])
            if tl.max(m_new - m_i, 0) > 0:
                alpha = tl.math.exp2(m_i - m_new)
                l_i = l_i * alpha
                acc = acc * alpha[:, None]
            l_i = l_i + tl.sum(p, 1)
        else:
            m_new = m_blk
            p = tl.math.exp2(s * qk_scale - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _xtile(q_ptr, k_ptr, v_ptr, o_ptr, sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sob, sot, soh,
           T, H, BH, qk_scale, tile,
           D: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DIAG_N: tl.constexpr,
           HEADS_INNER: tl.constexpr, TMA: tl.constexpr, WARP_SPEC: tl.constexpr,
           LAZY_RESCALE: tl.constexpr, THRESH: tl.constexpr):
    """One (query block, batch·head) tile; ``tile`` is numbered longest-work first."""
    num_m = tl.cdiv(T, BLOCK_M)
    if HEADS_INNER:
        pid_bh = tile % BH
        pid_m = tile // BH
    else:
        pid_bh = tile // num_m
        pid_m = tile % num_m
    start_m = num_m - 1 - pid_m
    i_b = (pid_bh // H).to(tl.int64)
    i_h32 = pid_bh % H
    i_h = i_h32.to(tl.int64)
    col = i_h32 * D                                   # column of this head in the [T, H·D] views

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q_base = q_ptr + i_b * sqb + i_h * sqh
    k_base = k_ptr + i_b * skb + i_h * skh
    v_base = v_ptr + i_b * svb + i_h * svh
    o_base = o_ptr + i_b * sob + i_h * soh
    if TMA:
        # Device-side descriptors over this batch's [T, H·D] slab (D contiguous, heads adjacent:
        # requires sqh == D, checked by the launcher). Out-of-range rows load as zeros and are not
        # stored. Block shapes: q/o [BM, D], k/v [BN, D] (main loop) and [DIAG_N, D] (diagonal).
        q_desc = tl.make_tensor_descriptor(q_ptr + i_b * sqb, shape=[T, H * D], strides=[sqt, 1],
                                           block_shape=[BLOCK_M, D])
        k_desc = tl.make_tensor_descriptor(k_ptr + i_b * skb, shape=[T, H * D], strides=[skt, 1],
                                           block_shape=[BLOCK_N, D])
        v_desc = tl.make_tensor_descriptor(v_ptr + i_b * svb, shape=[T, H * D], strides=[svt, 1],
                                           block_shape=[BLOCK_N, D])
        if DIAG_N != BLOCK_N:
            kd_desc = tl.make_tensor_descriptor(k_ptr + i_b * skb, shape=[T, H * D], strides=[skt, 1],
                                                block_shape=[DIAG_N, D])
            vd_desc = tl.make_tensor_descriptor(v_ptr + i_b * svb, shape=[T, H * D], strides=[svt, 1],
                                                block_shape=[DIAG_N, D])
        else:
            kd_desc = k_desc
            vd_desc = v_desc
        q = q_desc.load([start_m * BLOCK_M, col])
    else:
        k_desc = k_base
        v_desc = v_base
        kd_desc = k_base
        vd_desc = v_base
        q = tl.load(q_base + offs_m[:, None] * sqt + offs_d[None, :], mask=(offs_m < T)[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    if CAUSAL:
        diag_lo = start_m * BLOCK_M
        acc, l_i, m_i = _xloop(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, skt, svt, col,
                               offs_m, offs_d, 0, diag_lo, T, qk_scale,
                               BLOCK_N, False, False, PRECISION, TMA, WARP_SPEC, LAZY_RESCALE, THRESH)
        diag_hi = tl.minimum(diag_lo + BLOCK_M, T)
        acc, l_i, m_i = _xloop(acc, l_i, m_i, q, k_base, v_base, kd_desc, vd_desc, skt, svt, col,
                               offs_m, offs_d, diag_lo, diag_hi, T, qk_scale,
                               DIAG_N, True, True, PRECISION, TMA, False, LAZY_RESCALE, THRESH)
    else:
        full_hi = (T // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _xloop(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, skt, svt, col,
                               offs_m, offs_d, 0, full_hi, T, qk_scale,
                               BLOCK_N, False, False, PRECISION, TMA, WARP_SPEC, LAZY_RESCALE, THRESH)
        acc, l_i, m_i = _xloop(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, skt, svt, col,
                               offs_m, offs_d, full_hi, T, T, qk_scale,
                               BLOCK_N, False, True, PRECISION, TMA, False, LAZY_RESCALE, THRESH)
    o = (acc / l_i[:, None]).to(o_ptr.dtype.element_ty)
    if TMA:
        o_desc = tl.make_tensor_descriptor(o_ptr + i_b * sob, shape=[T, H * D], strides=[sot, 1],
                                           block_shape=[BLOCK_M, D])
        o_desc.store([start_m * BLOCK_M, col], o)
    else:
        tl.store(o_base + offs_m[:, None] * sot + offs_d[None, :], o, mask=(offs_m < T)[:, None])


@triton.jit
def _attn_fwd_explore(q_ptr, k_ptr, v_ptr, o_ptr,
                      sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sob, sot, soh,
                      T, H, BH, qk_scale, NUM_TILES,
                      D: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DIAG_N: tl.constexpr,
                      HEADS_INNER: tl.constexpr, TMA: tl.constexpr, WARP_SPEC: tl.constexpr,
                      LAZY_RESCALE: tl.constexpr, THRESH: tl.constexpr, PERSISTENT: tl.constexpr):
    """The variant kernel. PERSISTENT: a grid of at most a few programs per SM, each walking tiles
    ``pid, pid + G, pid + 2G, ...`` of the longest-first tile order (a static LPT-like schedule);
    otherwise one program per tile, as in :func:`_attn_fwd_kernel`."""
    if PERSISTENT:
        for tile in range(tl.program_id(0), NUM_TILES, tl.num_programs(0)):
            _xtile(q_ptr, k_ptr, v_ptr, o_ptr, sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sob, sot, soh,
                   T, H, BH, qk_scale, tile, D, CAUSAL, PRECISION, BLOCK_M, BLOCK_N, DIAG_N,
                   HEADS_INNER, TMA, WARP_SPEC, LAZY_RESCALE, THRESH)
    else:
        _xtile(q_ptr, k_ptr, v_ptr, o_ptr, sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sob, sot, soh,
               T, H, BH, qk_scale, tl.program_id(0), D, CAUSAL, PRECISION, BLOCK_M, BLOCK_N, DIAG_N,
               HEADS_INNER, TMA, WARP_SPEC, LAZY_RESCALE, THRESH)


# Variant fields and their defaults (the defaults reproduce the production kernel's arithmetic).
VARIANT_DEFAULTS = dict(BLOCK_M=128, BLOCK_N=64, DIAG_N=None, num_warps=8, num_stages=3, HEADS_INNER=False,
                        TMA=False, WARP_SPEC=False, LAZY_RESCALE=False, PERSISTENT=0, maxnreg=None)


def _alloc_scratch(size: int, alignment: int, stream):
    """Global scratch for device-side tensor descriptors (``triton.set_allocator``)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def flash_forward_variant(q, k, v, scale: float, causal: bool, **variant) -> torch.Tensor:
    """Forward attention with an explicit variant (no autotuning), for tuning experiments.

    ``variant`` keys (see ``VARIANT_DEFAULTS``): BLOCK_M, BLOCK_N, DIAG_N (key block on the causal
    diagonal; None = BLOCK_N; BLOCK_M = one masked block, BLOCK_M/2 = two halves), num_warps,
    num_stages, HEADS_INNER, TMA (device-side tensor descriptors; needs packed [B, T, H, D] rows,
    i.e. stride(2) == D), WARP_SPEC (``tl.range(..., warp_specialize=True)`` on the main key loop),
    LAZY_RESCALE (FA4-style conditional rescale), PERSISTENT (0: one program per tile; n > 0: n
    programs per SM walking the longest-first tile list), maxnreg (register cap per thread; GPU only).
    In the interpreter, num_warps/num_stages/maxnreg/warp_specialize have no effect; TMA loads are
    emulated (same zero padding), PERSISTENT uses a 4-program grid.
    """
    unknown = set(variant) - set(VARIANT_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown variant keys {sorted(unknown)}; expected a subset of {sorted(VARIANT_DEFAULTS)}")
    cfg = {**VARIANT_DEFAULTS, **variant}
    B, T, H, D = q.shape
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    o = torch.empty((B, T, H, D), dtype=v.dtype, device=v.device)
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    dn = cfg["DIAG_N"] or bn
    if causal and bm % dn:
        raise ValueError(f"DIAG_N must divide BLOCK_M; got DIAG_N={dn}, BLOCK_M={bm}")
    if cfg["TMA"]:
        for name, x in (("q", q), ("k", k), ("v", v)):
            if x.stride(2) != D or (x.stride(1) * x.element_size()) % 16:
                raise ValueError(f"TMA needs {name} with packed heads (stride(2) == D) and 16-byte row "
                                 f"strides; got strides {tuple(x.stride())}")
        if not INTERPRET:
            triton.set_allocator(_alloc_scratch)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    num_tiles = triton.cdiv(T, bm) * B * H
    if cfg["PERSISTENT"]:
        progs = 4 if INTERPRET else cfg["PERSISTENT"] * torch.cuda.get_device_properties(q.device).multi_processor_count
        grid = (min(num_tiles, progs),)
    else:
        grid = (num_tiles,)
    launch = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if cfg["maxnreg"] is not None and not INTERPRET:
        launch["maxnreg"] = cfg["maxnreg"]
    _attn_fwd_explore[grid](q, k, v, o, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
                            T, H, B * H, float(scale) * _LOG2E, num_tiles,
                            D=D, CAUSAL=bool(causal), PRECISION=precision, BLOCK_M=bm, BLOCK_N=bn, DIAG_N=dn,
                            HEADS_INNER=bool(cfg["HEADS_INNER"]), TMA=bool(cfg["TMA"]),
                            WARP_SPEC=bool(cfg["WARP_SPEC"]), LAZY_RESCALE=bool(cfg["LAZY_RESCALE"]),
                            THRESH=RESCALE_THRESHOLD, PERSISTENT=bool(cfg["PERSISTENT"]), **launch)
    return o
