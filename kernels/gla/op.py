"""``chunk_linear_attn``, ``chunk_simple_gla``, ``chunk_gla``: validated, dispatched, and on the GPU
one autograd op made of the family's stages.

Forward (:class:`ChunkGLAFunction`): plan the launch (:func:`kernels.gla.plan.plan_for`); for the
vector gate, prepare every chunk in parallel (:func:`kernels.gla.prep.prepare_vector_gate`); march
over the chunks with the state on chip (:func:`kernels.gla.march.march_forward`). Backward: recompute
the state entering every chunk (:func:`kernels.gla.march.chunk_states`), march the state gradients
backwards (:func:`kernels.gla.backward.state_grads`), then the per-chunk gradients
(:func:`kernels.gla.backward.chunk_grads`) and the gate's (:func:`kernels.gla.backward.gate_grads`).
"""
from __future__ import annotations

import torch

from .. import reference
from ..backend import check_dtypes, device_caps, resolve_backend
from ..common import GLA_MAX_HEAD, head_tile, pad_axis
from ..common.varlen import VarlenSpec, varlen
from ..validate import QKV_CHECKED, check_linear, documents_checks
from .backward import chunk_grads, gate_grads, state_grads
from .march import chunk_states, march_forward
from .plan import gate_code, plan_for
from .prep import prepare_vector_gate

__all__ = ["chunk_linear_attn", "chunk_simple_gla", "chunk_gla", "chunk_gla_triton", "HEAD_SIZES"]

HEAD_SIZES = (16, 32, 64, 128, 256)


class ChunkGLAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, h0, scale, output_final_state, plan):
        As = None
        qm, km, gm = q, k, g
        if plan.gate == 2:
            qm, km, gm, As = prepare_vector_gate(q, k, g, scale, plan)
        o, ht, inits = march_forward(qm, km, v, gm, As, h0, scale, plan, output_final_state)
        ctx.save_for_backward(q, k, v, g, inits, As)
        ctx.scale, ctx.plan = scale, plan
        ctx.h0_dtype = h0.dtype if h0 is not None else None
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, inits, As = ctx.saved_tensors
        plan, scale = ctx.plan, ctx.scale
        do = do.contiguous()
        dht = dht.contiguous().float() if dht is not None else None
        hs, dec = chunk_states(q, k, v, g, inits, scale, plan)
        dhs, dh0 = state_grads(q, g, do, dht, dec, scale, plan, ctx.h0_dtype is not None)
        dq, dk, dv, terms = chunk_grads(q, k, v, g, do, hs, dhs, As, scale, plan)
        dg = gate_grads(g, terms, plan) if terms is not None else None
        if dh0 is not None:
            dh0 = dh0.to(ctx.h0_dtype)
        return dq, dk, dv, dg, dh0, None, None, None


def _torch_path(q, k, v, g, scale, initial_state, output_final_state):
    if g is not None and g.dim() == 4:
        return reference.chunk_gla_ref(q, k, v, g, scale, initial_state, output_final_state)
    return reference.chunk_scalar_ref(q, k, v, g, None, scale, initial_state, output_final_state)


def chunk_gla_triton(q, k, v, g, scale, initial_state=None, output_final_state=False, *, num_segments=None,
                     plan=None, caps=None):
    """The Triton path of all three ops (``g``: ``None``, ``[B, T, H]`` or ``[B, T, H, K]``), inputs
    already validated. ``num_segments`` forces the forward's sequence split; ``plan``: overrides of
    the measured plan (a dict; the tests and the lab's sweeps try other launch values this way);
    ``caps``: the GPU class to plan for (default: the inputs' device's; the compile check and the
    tests give one). Head sizes other than the tiles (:data:`HEAD_SIZES`) are zero-padded to the next
    one (:mod:`kernels.common.heads`); dtypes the class cannot run raise ``ValueError`` here, before
    anything is compiled."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    Kp = head_tile("K (head size of q and k)", K, HEAD_SIZES, GLA_MAX_HEAD)
    Vp = head_tile("V (head size of v)", V, HEAD_SIZES, GLA_MAX_HEAD)
    caps = caps if caps is not None else device_caps(q.device)
    check_dtypes(caps, q.device, q=q, g=g)       # k and v share q's dtype (check_qkv)
    if Kp is None or Vp is None:      # over the largest tile: PyTorch on the device
        return _torch_path(q, k, v, g, scale, initial_state, output_final_state)
    if (Kp, Vp) != (K, V):            # zero padding to the tiles (kernels.common.heads: exact)
        gp = pad_axis(g, Kp) if g is not None and g.dim() == 4 else g
        h0p = pad_axis(pad_axis(initial_state, Kp, -2), Vp) if initial_state is not None else None
        o, ht = chunk_gla_triton(pad_axis(q, Kp), pad_axis(k, Kp), pad_axis(v, Vp), gp, scale, h0p,
                                 output_final_state, num_segments=num_segments, plan=plan, caps=caps)
        return o[..., :V].contiguous(), (ht[:, :, :K, :V].contiguous() if ht is not None else None)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g = g.contiguous() if g is not None else None
    h0 = initial_state.contiguous().float() if initial_state is not None else None
    overrides = dict(plan or {})
    plan = plan_for(q.dtype, q.device, gate=gate_code(g), B=B, T=T, H=H, K=K, V=V, num_segments=num_segments,
                    caps=caps, **overrides)
    if plan.upcast:   # 16-bit heads narrower than 64: the float32 kernels (plan.SMALL_HEAD), cast back
        overrides.pop("upcast", None)
        o, ht = chunk_gla_triton(q.float(), k.float(), v.float(), g.float() if g is not None else None, scale, initial_state, output_final_state,
                                 num_segments=num_segments, plan=overrides, caps=caps)
        return o.to(q.dtype), ht
    if plan.path == "torch":    # a class these kernels do not fit (kernels/gla/plan.py): PyTorch on the device
        return _torch_path(q, k, v, g, scale, initial_state, output_final_state)
    o, ht = ChunkGLAFunction.apply(q, k, v, g, h0, float(scale), bool(output_final_state), plan)
    return o, (ht if output_final_state else None)


_LINEAR_CHECKED = (QKV_CHECKED + "; ``initial_state`` ``None`` or ``[B, H, K, V]`` on their device; ``scale`` "
                   "``None`` or a positive finite number; ``output_final_state`` a bool")


@varlen(VarlenSpec(tokens=("q", "k", "v"), states=("initial_state",)))
@documents_checks(_LINEAR_CHECKED, None)
def chunk_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False, backend=None, *,
                      check_values=True):
    """Causal linear attention ``S_t = S_{t-1} + k_t v_tᵀ``, ``o_t = scale · S_tᵀ q_t``.

    As ``fla.ops.linear_attn.chunk_linear_attn(..., normalize=False)``. Returns ``(o, final_state)``.
    """
    scale = check_linear(q, k, v, scale, initial_state, output_final_state, check_values=check_values)
    if resolve_backend(backend, q) == "torch":
        return reference.chunk_scalar_ref(q, k, v, None, None, scale, initial_state, output_final_state)
    return chunk_gla_triton(q, k, v, None, scale, initial_state, output_final_state)


@varlen(VarlenSpec(tokens=("q", "k", "v", "g"), states=("initial_state",)))
@documents_checks(_LINEAR_CHECKED + "; ``g`` (required) a ``[B, T, H]`` float32/float16/bfloat16 tensor on "
                  "``q``'s device", "``g`` finite and ``<= 0``")
def chunk_simple_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, backend=None, *,
                     check_values=True):
    """Scalar-gated linear attention ``S_t = exp(g_t) S_{t-1} + k_t v_tᵀ`` (``g``: ``[B, T, H]``, ≤ 0)."""
    scale = check_linear(q, k, v, scale, initial_state, output_final_state, g=g, g_shape="scalar",
                         check_values=check_values)
    if resolve_backend(backend, q) == "torch":
        return reference.chunk_scalar_ref(q, k, v, g, None, scale, initial_state, output_final_state)
    return chunk_gla_triton(q, k, v, g, scale, initial_state, output_final_state)


@varlen(VarlenSpec(tokens=("q", "k", "v", "g"), states=("initial_state",)))
@documents_checks(_LINEAR_CHECKED + "; ``g`` (required) a ``[B, T, H, K]`` float32/float16/bfloat16 tensor "
                  "on ``q``'s device", "``g`` finite and ``<= 0``")
def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, backend=None, *,
              check_values=True):
    """Gated linear attention ``S_t = Diag(exp(g_t)) S_{t-1} + k_t v_tᵀ`` (``g``: ``[B, T, H, K]``, ≤ 0)."""
    scale = check_linear(q, k, v, scale, initial_state, output_final_state, g=g, g_shape="vector",
                         check_values=check_values)
    if resolve_backend(backend, q) == "torch":
        return reference.chunk_gla_ref(q, k, v, g, scale, initial_state, output_final_state)
    return chunk_gla_triton(q, k, v, g, scale, initial_state, output_final_state)
