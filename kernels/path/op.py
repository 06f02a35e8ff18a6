"""``parallel_path_attn``: softmax attention whose scores see the keys through Householder products.

Read top to bottom: check the inputs, pick the backend, plan the launches, then two stages.

1. each block of 64 tokens on its own (:func:`kernels.path.local.prepare_blocks`): the delta
   family's triangular solve for the block's UT transform, then the queries pulled back to the
   block's start, the keys pushed to its end, the block's own scores;
2. the flash-style pass (:func:`kernels.path.forward.path_forward`): each query block walks the
   earlier key blocks last first, crossing each by its UT transform, folding scores into the flash
   family's online softmax.

The gradients run the other way: stage 2's (:func:`kernels.path.backward.path_backward`, two sweeps
per query block), then stage 1's (:func:`kernels.path.local.local_backward`), and the FoX gates'
as a reversed cumulative sum.
"""
from __future__ import annotations

import torch

from ..backend import check_dtypes, device_caps, resolve_backend
from ..common.gates import cumulative_gates
from ..reference import path_attn_ref
from ..common import head_tile, pad_axis, share_heads
from ..common.varlen import VarlenSpec, varlen
from ..validate import (QKV_CHECKED, ValueChecks, check_beta_range, check_gate_tensor, check_qkv, default_scale,
                        documents_checks)
from .backward import path_backward
from .forward import path_forward
from .local import local_backward, prepare_blocks
from .windows import window_blocks, window_prepare
from .plan import plan_for

__all__ = ["parallel_path_attn", "HEAD_SIZES"]

HEAD_SIZES = (16, 32, 64, 128)


def _check_path_inputs(q, k, v, w, beta, g, scale, check_values):
    B, T, H, K, V = check_qkv(q, k, v)
    scale = default_scale(scale, K)
    checks = ValueChecks(check_values)
    check_gate_tensor(w, "w", (B, T, H, K), q, checks=checks)
    check_gate_tensor(beta, "beta", (B, T, H), q, checks=checks)
    check_beta_range(beta, checks, "the factors I - beta w w^T; 2 makes them reflections for unit w")
    if g is not None:
        check_gate_tensor(g, "g", (B, T, H), q, nonpositive=True, checks=checks)
    checks.run()
    return scale


@varlen(VarlenSpec(tokens=("q", "k", "v", "w", "beta", "g")))
@documents_checks(f"{QKV_CHECKED}; ``w`` (required) ``[B, T, H, K]``, ``beta`` (required) ``[B, T, H]`` and "
                  "``g`` ``None`` or ``[B, T, H]``: float32/float16/bfloat16 tensors on ``q``'s device; "
                  "``scale`` ``None`` or a positive finite number",
                  "``w`` finite, ``beta`` finite and in ``[0, 2]``, ``g`` finite and ``<= 0``")
def parallel_path_attn(q, k, v, w, beta, g=None, scale=None, backend=None, *, check_values=True):
    """PaTH attention (fla's ``parallel_path_attn``): per batch and head, the causal softmax of
    ``scale · (A_ij + G_i − G_j)`` times ``v``, with ``A_ij = q_iᵀ H_i H_{i−1} ⋯ H_{j+1} k_j``,
    ``H_t = I − β_t w_t w_tᵀ`` (``lattn_core.path_attention_scores``) and, with ``g`` (log forget
    gates, PaTH-FoX), ``G = cumsum(g)``. Returns ``(o, None)``, ``o`` ``[B, T, H, V]``.

    ``q, k``: ``[B, T, H, K]``; ``v``: ``[B, T, H, V]``; ``w``: ``[B, T, H, K]`` (used as given: the
    models normalise it); ``beta``: ``[B, T, H]`` in ``[0, 2]``; ``g``: ``None`` or ``[B, T, H]``,
    ``<= 0``. ``w``, ``beta`` and ``g`` in float32 (as fla insists) or the inputs' dtype.

    The gate bias sits inside the scale, as in fla's kernel and its naive reference. In the
    article's notation (Chapter 9, no implicit scale) this is ``lattn_core.path_attention(scale·Q,
    K, V, W, beta, gamma=exp(scale·g))``: the forget gates are ``γ_t = e^{scale·g_t}``. (fla's FoX,
    :func:`kernels.parallel_forgetting_attn`, adds its bias outside the scale.)

    ``k``, ``v``, ``w`` and ``beta`` may hold fewer heads than ``q`` (and ``g``), a whole divisor
    (fla's grouped-query form), each shared by a group of query heads
    (:func:`kernels.common.heads.share_heads`).
    """
    k, v, w, beta = share_heads(q, "q", k=k, v=v, w=w, beta=beta)
    scale = _check_path_inputs(q, k, v, w, beta, g, scale, check_values)
    if resolve_backend(backend, q) == "torch":
        return path_attn_ref(q, k, v, w, beta, g, scale), None
    return parallel_path_attn_triton(q, k, v, w, beta, g, scale), None


class PathFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, w, beta, g, scale, plan):
        q, k, v, w, beta = (x.contiguous() for x in (q, k, v, w, beta))
        # the kernels add G_i - G_j to the scaled scores: fla's bias inside the scale is G = scale·cumsum(g)
        G = cumulative_gates(g) * scale if g is not None else None
        w_dtype = w.dtype
        w = w.to(plan.transport)    # the directions as every stage uses them (fla, too, casts w to float16)
        qt, kh, u, wt, aloc, tm = prepare_blocks(q, k, w, beta, plan)
        # windows of blocks (plan.window_blocks): queries carried across a window by one product
        # (plan.forward_windows False: the forward walks every block, the backward prepares the windows)
        windowed = window_blocks(plan, qt.shape[1]) and plan.forward_windows
        win = window_prepare(qt, kh, u, wt, plan) if windowed else None
        o, lse = path_forward(qt, kh, u, wt, aloc, v, G, scale, plan, windows=win)
        ctx.save_for_backward(q, k, v, w, beta, G, qt, kh, u, wt, aloc, tm, o, lse, *(win or (None,) * 3))
        ctx.scale, ctx.plan, ctx.g_dtype, ctx.w_dtype = scale, plan, None if g is None else g.dtype, w_dtype
        return o

    @staticmethod
    def backward(ctx, do):
        saved = ctx.saved_tensors
        q, k, v, w, beta, G, qt, kh, u, wt, aloc, tm, o, lse = saved[:14]
        win = saved[14:] if saved[14] is not None else None    # (qa, kbar, pi) of the windows
        dqt, dkh, gw, hu, daloc, dv, dG = path_backward(qt, kh, u, wt, aloc, v, do, o, lse, G, ctx.scale, ctx.plan,
                                                        windows=win)
        dq, dk, dw, dbeta = local_backward(q, k, w, beta, tm, dqt, dkh, gw, hu, daloc, ctx.plan, ctx.w_dtype)
        dg = cumulative_gates(dG * ctx.scale, reverse=True, out_dtype=ctx.g_dtype) if dG is not None else None
        return dq, dk, dv, dw, dbeta, dg, None, None


def parallel_path_attn_triton(q, k, v, w, beta, g, scale: float, *, caps=None):
    """The Triton path, inputs already validated except the head sizes and the dtype the GPU class
    can run (``caps``: default the inputs' device's), both checked before anything compiles. Head
    sizes other than the tiles are zero-padded to the next one (:mod:`kernels.common.heads`); over
    128, PyTorch on the device."""
    K, V = q.shape[-1], v.shape[-1]
    Kp = head_tile("the head size K (last axis of q, k and w)", K, HEAD_SIZES)
    Vp = head_tile("the head size V (last axis of v)", V, HEAD_SIZES)
    caps = caps if caps is not None else device_caps(q.device)
    check_dtypes(caps, q.device, q=q, w=w, beta=beta, g=g)
    if Kp is None or Vp is None:      # over the largest tile: PyTorch on the device
        return path_attn_ref(q, k, v, w, beta, g, scale)
    if (Kp, Vp) != (K, V):            # zero padding to the tiles (kernels.common.heads: exact)
        o = parallel_path_attn_triton(pad_axis(q, Kp), pad_axis(k, Kp), pad_axis(v, Vp), pad_axis(w, Kp), beta, g,
                                      scale, caps=caps)
        return o[..., :V].contiguous()
    plan = plan_for(q.dtype, q.device, K=q.shape[-1], T=q.shape[1], caps=caps)
    if plan.path == "torch":    # a class these kernels do not fit (plan.py): PyTorch on the device
        return path_attn_ref(q, k, v, w, beta, g, scale)
    return PathFunction.apply(q, k, v, w, beta, g, float(scale), plan)
