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
from .reference import attention_ref

__all__ = ["flash_attention_triton", "FlashAttentionFunction"]

_LOG2E = 1.4426950408889634


def _interpreter_fixes():
    """Two gaps of Triton 3.6's interpreter (with NumPy 2) that the compiled path does not have.

    1. ``range()`` with program-id-derived bounds: the interpreter holds a scalar as a 1-element
       array and converts it with ``int(array)``, which NumPy 2 rejects. We extend its per-launch
       patch of ``tl.tensor`` (restored after each launch) with an ``__index__`` reading the element.
    2. ``tl.dot`` on bfloat16: the interpreter stores bfloat16 as raw ``uint16`` bits and multiplies
       the bits. We widen bfloat16 operands to float32 first (exact), so the product is the exact
       float32 one, as on tensor cores (which accumulate bf16 products in float32).

    Idempotent; applied only when interpreting.
    """
    import numpy as np
    import triton.runtime.interpreter as interp

    orig_patch = getattr(interp, "_patch_lang_tensor", None)
    if orig_patch is not None and not getattr(orig_patch, "_lattn_fix", False):
        def scalar_index(self):
            data = np.asarray(self.handle.data)
            if data.size != 1:
                raise TypeError(f"only a scalar can be used as an index; got shape {data.shape}")
            return int(data.reshape(-1)[0])

        def patched(tensor, scope):
            orig_patch(tensor, scope)
            scope.set_attr(tensor, "__index__", scalar_index)
        patched._lattn_fix = True
        interp._patch_lang_tensor = patched

    builder = getattr(interp, "InterpreterBuilder", None)
    orig_dot = getattr(builder, "create_dot", None)
    if orig_dot is not None and not getattr(orig_dot, "_lattn_fix", False):
        def widen(h):
            if h.dtype == tl.bfloat16 or getattr(h.dtype, "scalar", None) == tl.bfloat16:
                bits = np.asarray(h.data).astype(np.uint32) << np.uint32(16)
                return interp.TensorHandle(bits.view(np.float32), tl.float32)
            return h

        def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
            return orig_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)
        create_dot._lattn_fix = True
        builder.create_dot = create_dot


if INTERPRET:
    _interpreter_fixes()


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
        if CAUSAL_MASK:
            keep = offs_n[None, :] <= offs_m[:, None]
            if TAIL_MASK:
                keep = keep & (offs_n[None, :] < T)
            s = tl.where(keep, s, float("-inf"))
        elif TAIL_MASK:
            s = tl.where(offs_n[None, :] < T, s, float("-inf"))
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


def _use_autotune(T: int, D: int, dtype: torch.dtype) -> bool:
    return (not INTERPRET) and dtype in (torch.float16, torch.bfloat16) and D >= 64 and T >= 512


def _flash_forward(q, k, v, scale: float, causal: bool) -> torch.Tensor:
    B, T, H, D = q.shape
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    o = torch.empty((B, T, H, D), dtype=v.dtype, device=v.device)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"   # "tf32" is ignored for 16-bit inputs
    t_bucket = min(max(next_pow2(T), 1024), 8192)   # autotune key: <=1024, 2048, 4096, >=8192
    args = (q, k, v, o, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
            T, H, B * H, float(scale) * _LOG2E, t_bucket)
    if _use_autotune(T, D, q.dtype):
        def grid(meta):
            return (triton.cdiv(T, meta["BLOCK_M"]) * B * H,)
        _attn_fwd_tuned[grid](*args, D=D, CAUSAL=causal, PRECISION=precision)
    else:
        bm, bn, warps, stages, heads_inner = _fixed_config(T, D, q.dtype)
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
