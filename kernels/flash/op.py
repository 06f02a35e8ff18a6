"""``flash_attention``: softmax attention, validated and dispatched, forward on the Triton kernel.

Read top to bottom: check the inputs, pick the backend, then on the Triton path plan the launch
(:func:`kernels.flash.plan.plan_for`) and run the forward stage (:func:`kernels.flash.forward.flash_forward`).
The backward recomputes attention with PyTorch in float32 (:func:`kernels.reference.attention_ref`
under autograd): an O(T²)-memory backward until the family has a Triton one.
"""
from __future__ import annotations

import torch

from ..backend import check_dtypes, device_caps, resolve_backend
from ..reference import attention_ref
from ..validate import check_head_size, check_qkv, default_scale
from .forward import flash_forward
from .plan import plan_for

__all__ = ["flash_attention", "flash_attention_triton", "HEAD_SIZES"]

HEAD_SIZES = (16, 32, 64, 128)


class FlashAttentionFunction(torch.autograd.Function):
    """Forward: the Triton kernel. Backward: attention recomputed in float32 under autograd."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal, plan):
        ctx.save_for_backward(q, k, v)
        ctx.scale, ctx.causal = scale, causal
        return flash_forward(q, k, v, scale, causal, plan)

    @staticmethod
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors
        with torch.enable_grad():
            qd, kd, vd = (x.detach().requires_grad_(True) for x in (q, k, v))
            o = attention_ref(qd, kd, vd, ctx.scale, ctx.causal)
            dq, dk, dv = torch.autograd.grad(o, (qd, kd, vd), do)
        return dq, dk, dv, None, None, None


def flash_attention_triton(q, k, v, scale: float, causal: bool, *, caps=None):
    """The Triton path, inputs already validated except what the kernel adds: the head size and
    the dtype the GPU class can run (``caps``: the class, default the inputs' device's; the compile
    check and the tests give one), both before anything is compiled."""
    check_head_size("the head size D (last axis of q, k, v)", q.shape[-1], HEAD_SIZES, "flash_attention")
    caps = caps if caps is not None else device_caps(q.device)
    check_dtypes(caps, q.device, q=q)            # k and v share q's dtype (check_qkv)
    return FlashAttentionFunction.apply(q, k, v, float(scale), causal, plan_for(q, k, v, causal, caps=caps))


def flash_attention(q, k, v, scale=None, causal: bool = True, backend=None):
    """Softmax attention ``softmax(scale · q kᵀ + log M) v``; returns ``o`` (``[B, T, H, V]``).

    ``q, k``: ``[B, T, H, D]``; ``v``: ``[B, T, H, D]`` (same head size ``D``, 16 to 128 for the
    Triton kernel). ``scale`` defaults to ``D ** -0.5``.

    The Triton kernel is forward-only: its backward recomputes attention with PyTorch in float32
    (an O(T^2)-memory backward; a fused Triton backward is future work).
    """
    B, T, H, K, V = check_qkv(q, k, v, same_kv_dim=True)
    scale = default_scale(scale, K)
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False; got {causal!r}")
    if resolve_backend(backend, q) == "torch":
        return attention_ref(q, k, v, scale, causal)
    return flash_attention_triton(q, k, v, scale, causal)
