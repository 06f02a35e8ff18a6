"""``deltaformer_attn``: softmax attention over pseudo-values that the delta rule wrote (DeltaFormer).

Read top to bottom: check the inputs, pick the backend, plan the launches, then two stages.

1. the pseudo-values ``u = (I + Diag(β) P)^{-1} v`` (:func:`kernels.deltaformer.pseudo.pseudo_values`),
   ``P`` the strictly causal softmax of the key-key scores;
2. causal softmax attention of ``q`` over ``(k, u)``: the flash family's forward
   (:func:`kernels.flash.forward.flash_forward`), unchanged.

The gradients run the other way: the flash backward gives ``dq``, the ``k`` gradient of the last
attention and ``du``; the adjoint solve turns ``du`` into ``w = dv``
(:func:`kernels.deltaformer.pseudo.adjoint_values`); and the ``k`` gradient through ``P`` is the
flash backward once more, this time of the attention *of the keys over the earlier keys* with ``u``
as values. The flash backward masks ``j ≤ i``; shifting the keys and values down one place (a zero
key in front) turns that into ``j < i`` with no new kernel. Its "output" is ``r = P u``, its
"output gradient" ``−β_i w_i`` (since ``∂L/∂P_ij = −β_i w_i·u_j``), and ``β``'s gradient is
``−w_i·r_i``.
"""
from __future__ import annotations

import torch

from ..backend import check_dtypes, device_caps, resolve_backend
from ..flash.backward import flash_backward
from ..flash.forward import flash_forward
from ..flash.plan import backward_plan_for, tma_compatible
from ..flash.plan import plan_for as flash_plan_for
from ..reference import deltaformer_ref
from ..common import head_tile, pad_axis
from ..common.varlen import VarlenSpec, varlen
from ..validate import QKV_CHECKED, ValueChecks, check_gate_tensor, check_qkv, default_scale, documents_checks
from .plan import plan_for
from .pseudo import adjoint_values, pseudo_values

__all__ = ["deltaformer_attn", "deltaformer_attn_triton", "HEAD_SIZES"]

HEAD_SIZES = (16, 32, 64, 128)


def _shift_down(x):
    """``x`` one step later in time, a zero row in front: row ``j + 1`` holds ``x_j``."""
    return torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)


class DeltaFormerFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, beta, scale, plan, flash_plan, bwd_plan):
        q, k, v = (x.contiguous() for x in (q, k, v))
        b = torch.ones(k.shape[:3], dtype=k.dtype, device=k.device) if beta is None else beta.contiguous()
        u, r, lse_p = pseudo_values(k, v, b, scale, plan)
        # o in float32 for the backward: its row sums Σ_d o·do enter dS = P ⊙ (dP − Σ o·do), a small
        # difference of large terms, and a 16-bit o made dq 5x less accurate (fla's bf16 tolerance
        # missed at T = 500; tests/kernels/test_deltaformer.py)
        o, lse = flash_forward(q, k, u, scale, True, flash_plan, out_dtype=torch.float32)
        ctx.save_for_backward(q, k, b, u, r, lse_p, o, lse)
        ctx.scale, ctx.plan, ctx.bwd_plan = scale, plan, bwd_plan
        ctx.has_beta = beta is not None
        return o.to(v.dtype)

    @staticmethod
    def backward(ctx, do):
        q, k, b, u, r, lse_p, o, lse = ctx.saved_tensors
        scale, plan, bwd_plan = ctx.scale, ctx.plan, ctx.bwd_plan
        dq, dk, du, _ = flash_backward(q, k, u, o, lse, do, scale, True, bwd_plan)
        w = adjoint_values(k, b, lse_p, du, scale, plan)
        # the key-key softmax's backward: keys (and values u) shifted so that j <= i means j < i
        dp_out = (-b.to(torch.float32)[..., None] * w).to(k.dtype)
        dk_row, dk_col, _, _ = flash_backward(k, _shift_down(k), _shift_down(u), r, lse_p, dp_out, scale, True,
                                              bwd_plan)
        dk = dk.float() + dk_row.float()
        dk[:, :-1] += dk_col[:, 1:].float()
        dbeta = -(w * r).sum(-1).to(b.dtype) if ctx.has_beta else None
        return dq, dk.to(k.dtype), w.to(u.dtype), dbeta, None, None, None, None


def deltaformer_attn_triton(q, k, v, beta, scale: float, *, caps=None):
    """The Triton path, inputs already validated except the head sizes and the dtype the GPU class
    can run (``caps``: default the inputs' device's), both checked before anything compiles. Head
    sizes other than the tiles are zero-padded to the next one (:mod:`kernels.common.heads`); over
    128, PyTorch on the device."""
    K, V = q.shape[-1], v.shape[-1]
    Kp = head_tile("the head size K (last axis of q and k)", K, HEAD_SIZES)
    Vp = head_tile("the head size V (last axis of v)", V, HEAD_SIZES)
    caps = caps if caps is not None else device_caps(q.device)
    check_dtypes(caps, q.device, q=q)
    if Kp is None or Vp is None:      # over the largest tile: PyTorch on the device
        return deltaformer_ref(q, k, v, beta, scale)
    if (Kp, Vp) != (K, V):            # zero padding to the tiles (kernels.common.heads: exact)
        o = deltaformer_attn_triton(pad_axis(q, Kp), pad_axis(k, Kp), pad_axis(v, Vp), beta, scale, caps=caps)
        return o[..., :V].contiguous()
    B, T, H, _ = q.shape
    plan = plan_for(q.dtype, q.device, B=B, T=T, H=H, caps=caps)
    if plan.path == "torch":    # a class these kernels do not fit (plan.py): PyTorch on the device
        return deltaformer_ref(q, k, v, beta, scale)
    shapes = dict(B=B, T=T, H=H, K=K, V=V)
    flash_plan = flash_plan_for(q.dtype, q.device, **shapes, causal=True, tma=tma_compatible(q, k, v), caps=caps)
    bwd_plan = backward_plan_for(q.dtype, q.device, **shapes, caps=caps)
    return DeltaFormerFunction.apply(q, k, v, beta, float(scale), plan, flash_plan, bwd_plan)


@varlen(VarlenSpec(tokens=("q", "k", "v", "beta"), returns="tokens"))
@documents_checks(f"{QKV_CHECKED}; ``beta`` ``None`` or a ``[B, T, H]`` float32/float16/bfloat16 tensor on "
                  "``q``'s device; ``scale`` ``None`` or a positive finite number", "``beta`` finite")
def deltaformer_attn(q, k, v, beta=None, scale=None, backend=None, *, check_values=True):
    """DeltaFormer's attention: ``softmax(scale · q kᵀ + log M) u`` with the pseudo-values
    ``u = (I + Diag(β) P)^{-1} v``, ``P = softmax(scale · k kᵀ + log M⁻)`` (strictly causal; its
    first row is empty, so ``u_1 = v_1``). Returns ``o`` ``[B, T, H, V]``.

    ``q, k``: ``[B, T, H, K]``; ``v``: ``[B, T, H, V]``; ``beta``: ``[B, T, H]`` or ``None`` (ones),
    in the inputs' dtype or float32. The pseudo-values score keys against keys (``k·k``) as the
    article and the paper write them; fla's naive reference scores them ``q·k``. Memory is linear
    in ``T``: no ``T × T`` tensor in the forward or the backward.
    """
    B, T, H, K, V = check_qkv(q, k, v)
    scale = default_scale(scale, K)
    checks = ValueChecks(check_values)
    if beta is not None:
        check_gate_tensor(beta, "beta", (B, T, H), q, checks=checks)
    checks.run()
    if resolve_backend(backend, q) == "torch":
        return deltaformer_ref(q, k, v, beta, scale)
    return deltaformer_attn_triton(q, k, v, beta, scale)
