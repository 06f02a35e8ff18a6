"""``flash_attention`` and ``parallel_forgetting_attn``: softmax attention, with or without FoX's bias.

One autograd function serves both. Read top to bottom: check the inputs, pick the backend, then on
the Triton path plan the launches (:mod:`kernels.flash.plan`), run the forward stage
(:func:`kernels.flash.forward.flash_forward`, which also saves each row's log-sum-exp) and, for the
gradients, the backward stage (:func:`kernels.flash.backward.flash_backward`, which recomputes the
probabilities block by block). FoX's bias ``G_i − G_j`` comes from ``G = cumsum(g)``; its gradient
``dG`` becomes ``dg`` by a reverse cumulative sum.
"""
from __future__ import annotations

import torch

from ..backend import check_dtypes, device_caps, resolve_backend
from ..reference import attention_ref
from ..common import head_tile, pad_axis, share_heads
from ..common.varlen import VarlenSpec, varlen
from ..validate import (QKV_CHECKED, ValueChecks, check_flag, check_gate_tensor, check_qkv, default_scale,
                        documents_checks)
from .backward import flash_backward
from ..common.gates import cumulative_gates
from .forward import flash_forward
from .plan import backward_plan_for, plan_for, tma_compatible

__all__ = ["flash_attention", "parallel_forgetting_attn", "flash_attention_triton", "HEAD_SIZES"]

HEAD_SIZES = (16, 32, 64, 128)


class FlashAttentionFunction(torch.autograd.Function):
    """Forward and backward on the Triton kernels; ``g`` (log forget gates) may be ``None``."""

    @staticmethod
    def forward(ctx, q, k, v, g, scale, causal, plan, bwd_plan):
        # the cumulative log gates, float32 whatever g's dtype (the kernels form the bias G_i − G_j)
        G = None if g is None else cumulative_gates(g)
        o, lse = flash_forward(q, k, v, scale, causal, plan, G)
        ctx.save_for_backward(q, k, v, o, lse, G)
        ctx.scale, ctx.causal, ctx.bwd_plan = scale, causal, bwd_plan
        ctx.g_dtype = None if g is None else g.dtype
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, G = ctx.saved_tensors
        dq, dk, dv, dG = flash_backward(q, k, v, o, lse, do, ctx.scale, ctx.causal, ctx.bwd_plan, G)
        # dg_t = Σ_{m ≥ t} dG_m (the adjoint of the cumulative sum), [B, H, T] read as [B, T, H]
        dg = None if dG is None else cumulative_gates(dG, reverse=True, out_dtype=ctx.g_dtype, time_dim=2)
        return dq, dk, dv, dg, None, None, None, None


def flash_attention_triton(q, k, v, scale: float, causal: bool, g=None, *, caps=None):
    """The Triton path, inputs already validated except what the kernel adds: the head sizes and
    the dtype the GPU class can run (``caps``: the class, default the inputs' device's; the compile
    check and the tests give one), both before anything is compiled. Head sizes other than the
    tiles are zero-padded to the next one (:mod:`kernels.common.heads`); over 128, PyTorch on the
    device."""
    K, V = q.shape[-1], v.shape[-1]
    Kp = head_tile("the head size K (last axis of q and k)", K, HEAD_SIZES)
    Vp = head_tile("the head size V (last axis of v)", V, HEAD_SIZES)
    caps = caps if caps is not None else device_caps(q.device)
    check_dtypes(caps, q.device, q=q)            # k and v share q's dtype (check_qkv)
    if Kp is None or Vp is None:      # over the largest tile: PyTorch on the device
        return attention_ref(q, k, v, scale, causal, g=g)
    if (Kp, Vp) != (K, V):            # zero padding to the tiles (kernels.common.heads: exact)
        o = flash_attention_triton(pad_axis(q, Kp), pad_axis(k, Kp), pad_axis(v, Vp), scale, causal, g, caps=caps)
        return o[..., :V].contiguous()
    shapes = dict(B=q.shape[0], T=q.shape[1], H=q.shape[2], K=K, V=V)
    plan = plan_for(q.dtype, q.device, **shapes, causal=causal, tma=tma_compatible(q, k, v), caps=caps)
    bwd_plan = backward_plan_for(q.dtype, q.device, **shapes, caps=caps)
    return FlashAttentionFunction.apply(q, k, v, g, float(scale), causal, plan, bwd_plan)


_SCALE = "``scale`` ``None`` or a positive finite number"


def _causal_only(arguments):
    if arguments.get("causal", True) is not True:
        raise ValueError("causal must be True with cu_seqlens: a query that sees every key would see the "
                         "padding between the packed sequences")


@varlen(VarlenSpec(tokens=("q", "k", "v"), returns="tokens", check=_causal_only))
@documents_checks(f"{QKV_CHECKED} (``K`` and ``V`` may differ); {_SCALE}; ``causal`` a bool", None)
def flash_attention(q, k, v, scale=None, causal: bool = True, backend=None, *, check_values=True):
    """Softmax attention ``softmax(scale · q kᵀ + log M) v``; returns ``o`` (``[B, T, H, V]``).

    ``q, k``: ``[B, T, H, K]``; ``v``: ``[B, T, H, V]`` (any ``K, V`` up to 256; they may differ). ``scale`` defaults to ``K ** -0.5``. ``causal=False``: every query
    sees every key. Forward and backward run on Triton kernels with memory linear in ``T``.
    ``k``, ``v`` may hold fewer heads than ``q``, a whole divisor (fla's grouped-query attention),
    each shared by a group of query heads (:func:`kernels.common.heads.share_heads`).
    """
    k, v = share_heads(q, "q", k=k, v=v)
    B, T, H, K, V = check_qkv(q, k, v)
    scale = default_scale(scale, K)
    check_flag(causal, "causal")
    check_flag(check_values, "check_values")     # no values to check (no argument has a restricted range)
    if resolve_backend(backend, q) == "torch":
        return attention_ref(q, k, v, scale, causal)
    return flash_attention_triton(q, k, v, scale, causal)


@varlen(VarlenSpec(tokens=("q", "k", "v", "g"), returns="tokens"))
@documents_checks(f"{QKV_CHECKED}; ``g`` (required) a ``[B, T, H]`` float32/float16/bfloat16 tensor on "
                  f"``q``'s device; {_SCALE}", "``g`` finite and ``<= 0``")
def parallel_forgetting_attn(q, k, v, g, scale=None, backend=None, *, check_values=True):
    """The Forgetting Transformer's attention (FoX): causal softmax attention with the bias
    ``G_i − G_j``, ``G = cumsum(g)`` over ``T``; returns ``o`` (``[B, T, H, V]``).

    ``g``: log forget gates ``[B, T, H]`` (``g <= 0``), float32 or the inputs' dtype; the bias is
    always formed in float32. A constant ``g = −m_h`` per head is ALiBi with slope ``m_h``.
    Gradients flow to ``q, k, v`` and ``g`` (``g`` has ``q``'s heads).
    ``k``, ``v`` may hold fewer heads than ``q``, a whole divisor (fla's grouped-query attention),
    each shared by a group of query heads (:func:`kernels.common.heads.share_heads`).
    """
    k, v = share_heads(q, "q", k=k, v=v)
    B, T, H, K, V = check_qkv(q, k, v)
    scale = default_scale(scale, K)
    checks = ValueChecks(check_values)
    check_gate_tensor(g, "g", (B, T, H), q, nonpositive=True, checks=checks)
    checks.run()
    if resolve_backend(backend, q) == "torch":
        return attention_ref(q, k, v, scale, True, g=g)
    return flash_attention_triton(q, k, v, scale, True, g)
