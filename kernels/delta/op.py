"""``chunk_delta_rule`` and ``chunk_gated_delta_rule``: validated, dispatched, and on the GPU one
autograd op made of the family's stages.

Semantics (fla's orientation, state ``S`` is ``[K, V]`` per head, ``a_t = exp(g_t)``, ``a_t = 1``
without a gate)::

    S_t = a_t S_{t-1};   S_t = S_t + β_t k_t (v_t − S_tᵀ k_t)ᵀ;   o_t = scale · S_tᵀ q_t

Forward (:class:`ChunkDeltaFunction`), chunks of 64 tokens: the within-chunk cumulative log gate
(:func:`kernels.common.solve.chunk_cumsum`), then either the training forward — ``T = (I + A)^{-1}``
of every chunk (:func:`kernels.common.solve.solve_chunks`), ``W``, ``U`` and the scores
(:func:`kernels.delta.wy.wy_factors`), the march that keeps the state on chip
(:func:`kernels.delta.march.state_forward`) — or, when no input needs a gradient, the inference
forward in T form (:func:`kernels.delta.march.inference_forward`). Backward: the reverse march for
the state adjoints (:func:`kernels.delta.backward.state_grads`), then the per-chunk gradients
(:func:`kernels.delta.backward.chunk_grads`).

Every exponent is a difference of within-chunk cumulative log gates and is ≤ 0, so the kernels stay
finite for arbitrarily harsh gates. Float32 inputs use IEEE products throughout; float16/bfloat16
feed the tensor cores in their own dtype with float32 accumulation. ``o`` has ``v``'s dtype, the
final state is float32.
"""
from __future__ import annotations

import torch
import triton
from triton.runtime.errors import OutOfResources

from .. import reference
from ..backend import check_dtypes, device_caps, resolve_backend
from ..common import head_tile, pad_axis, share_heads
from ..common.norm import qk_l2norm
from ..common.varlen import VarlenSpec, host_offsets, varlen
from ..validate import QKV_CHECKED, _got, check_linear, check_tensor, documents_checks
from .backward import chunk_grads, chunk_grads_torch, state_grads
from .comba import COMBA_MIN_LOG_GATE, comba_map, comba_map_torch
from .march import inference_forward, state_forward
from .plan import CHUNK, HEAD_SIZES, plan_for
from ..common.solve import chunk_cumsum, solve_chunks
from .wy import wy_factors

__all__ = ["chunk_delta_rule", "chunk_gated_delta_rule", "chunk_gated_delta_product", "chunk_comba", "delta_rule_triton",
           "COMBA_MIN_LOG_GATE"]


class ChunkDeltaFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, h0, output_final_state, train, plan):
        B, T, H, K = q.shape
        NT = triton.cdiv(T, CHUNK)
        infer = not train and plan.t_form
        b, bt = chunk_cumsum(g, beta, B, T, H, NT, with_beta=infer)
        if infer:
            o, ht = inference_forward(q, k, v, b, beta, bt, scale, h0, output_final_state, plan)
            return o.to(v.dtype), ht
        tm = solve_chunks(k, b, beta, plan)
        w, u, a = wy_factors(q, k, v, b, beta, tm, scale, plan)
        o, ht, hs, vp = state_forward(q, k, w, u, b, a, scale, h0, output_final_state, train, plan)
        if train:
            ctx.save_for_backward(q, k, v, g, beta, b, w, tm, a, hs, vp)
            ctx.scale, ctx.plan = scale, plan
            ctx.h0_dtype = h0.dtype if h0 is not None else None
        return o.to(v.dtype), ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, beta, b, w, tm, a, hs, vp = ctx.saved_tensors
        scale, plan = ctx.scale, ctx.plan
        do = do.to(q.dtype).contiguous()
        dh, dh0, dvp = state_grads(q, k, w, b, a, do, dht, scale, hs.shape[1], plan)
        grads = None
        if plan.grads == "triton":
            try:
                grads = chunk_grads(q, k, v, g, beta, b, tm, a, hs, dh, do, vp, dvp, scale, plan)
            except OutOfResources:
                # float32 inputs at K = V = 128 need more shared memory than a GPU block has for the
                # per-chunk kernels; the batched-PyTorch path computes the same gradients
                grads = None
        if grads is None:     # the plan's choice on a class these kernels do not fit, or the fall-back
            grads = chunk_grads_torch(q, k, v, g, beta, scale, hs, dh, do)
        dq, dk, dv, dbeta, dg = grads
        dh0_out = dh0.to(ctx.h0_dtype) if ctx.h0_dtype is not None else None
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg.to(g.dtype) if g is not None else None,
                dbeta.to(beta.dtype), None, dh0_out, None, None, None)


def delta_rule_triton(q, k, v, g, beta, scale, initial_state=None, output_final_state=False, plan=None, *,
                      caps=None):
    """The Triton path of both ops (``g=None``: ``chunk_delta_rule``), inputs already validated except
    the head sizes (zero-padded to the next tile, :mod:`kernels.common.heads`; over 128 the
    PyTorch path on the device) and what the GPU class can run (``caps``: the class to plan for, default the
    inputs' device's; the compile check and the tests give one), both checked here before anything
    is compiled. ``plan``: a :class:`~kernels.delta.plan.DeltaPlan`, or a dict of overrides of the
    measured plan (the tests and the lab's sweeps try other launch values this way)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    Kp = head_tile("the key head size K (last axis of q and k)", K, HEAD_SIZES)
    Vp = head_tile("the value head size V (last axis of v)", V, HEAD_SIZES)
    if Kp is None or Vp is None:      # over the largest tile: PyTorch on the device
        return reference.chunk_scalar_ref(q, k, v, g, beta, scale, initial_state, output_final_state)
    if (Kp, Vp) != (K, V):            # zero padding to the tiles (kernels.common.heads: exact)
        h0p = pad_axis(pad_axis(initial_state, Kp, -2), Vp) if initial_state is not None else None
        o, ht = delta_rule_triton(pad_axis(q, Kp), pad_axis(k, Kp), pad_axis(v, Vp), g, beta, scale, h0p,
                                  output_final_state, plan, caps=caps)
        return o[..., :V].contiguous(), (ht[:, :, :K, :V].contiguous() if ht is not None else None)
    if B * H > 65535:
        raise ValueError(f"batch × heads must be at most 65535 for the Triton delta-rule kernels "
                         f"(a CUDA grid dimension); got {B} × {H}")
    caps = caps if caps is not None else device_caps(q.device)
    check_dtypes(caps, q.device, q=q, g=g, beta=beta)     # k and v share q's dtype (check_qkv)
    if plan is None or isinstance(plan, dict):
        plan = plan_for(q.dtype, q.device, B=B, T=T, H=H, K=K, V=V, caps=caps, **(plan or {}))
    if plan.path == "torch":    # a class these kernels do not fit (kernels/delta/plan.py): PyTorch on the device
        return reference.chunk_scalar_ref(q, k, v, g, beta, scale, initial_state, output_final_state)
    q, k, v, beta = (x.contiguous() for x in (q, k, v, beta))
    g = g.contiguous() if g is not None else None
    # float32 copy; the cast is differentiable, so the gradient reaches the caller's tensor
    h0 = initial_state.float().contiguous() if initial_state is not None else None
    # keep T and the chunk states for the backward only when a gradient can be asked for
    train = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, g, beta, h0))
    return ChunkDeltaFunction.apply(q, k, v, g, beta, float(scale), h0, bool(output_final_state), train, plan)


_LINEAR_CHECKED = (QKV_CHECKED + "; ``initial_state`` ``None`` or ``[B, H, K, V]`` on their device; ``scale`` "
                   "``None`` or a positive finite number; ``output_final_state`` a bool")
_BETA = "``beta`` (required) a ``[B, T, H]`` float32/float16/bfloat16 tensor on ``q``'s device"
_G = "``g`` (required) a ``[B, T, H]`` float32/float16/bfloat16 tensor on ``q``'s device"


@varlen(VarlenSpec(tokens=("q", "k", "v", "beta"), states=("initial_state",)))
@documents_checks(f"{_LINEAR_CHECKED}; {_BETA}", "``beta`` finite and in ``[0, 2]``")
def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False, backend=None, *,
                     check_values=True, use_qk_l2norm_in_kernel=False):
    """DeltaNet ``S_t = S_{t-1} + β_t k_t (v_t − S_{t-1}ᵀ k_t)ᵀ`` (``beta``: ``[B, T, H]``).

    As in fla, ``k`` is used as given: L2-normalise it first for a contractive update, or pass
    ``use_qk_l2norm_in_kernel=True`` (fla's keyword), which scales ``q`` and ``k`` to unit length
    first (:mod:`kernels.common.norm`).
    """
    scale = check_linear(q, k, v, scale, initial_state, output_final_state, beta=beta, with_beta=True,
                         check_values=check_values)
    q, k = qk_l2norm(q, k, use_qk_l2norm_in_kernel)
    if resolve_backend(backend, q) == "torch":
        return reference.chunk_scalar_ref(q, k, v, None, beta, scale, initial_state, output_final_state)
    return delta_rule_triton(q, k, v, None, beta, scale, initial_state, output_final_state)


@varlen(VarlenSpec(tokens=("q", "k", "v", "g", "beta"), states=("initial_state",)))
@documents_checks(f"{_LINEAR_CHECKED}; {_G}; {_BETA}", "``g`` finite and ``<= 0``, ``beta`` finite and in ``[0, 2]``")
def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           backend=None, *, check_values=True, use_qk_l2norm_in_kernel=False):
    """Gated DeltaNet ``S_t = exp(g_t) S_{t-1}``, then the delta update with ``β_t`` (``g, beta``: ``[B, T, H]``).

    ``use_qk_l2norm_in_kernel=True`` (fla's keyword) scales ``q`` and ``k`` to unit length first
    (:mod:`kernels.common.norm`).

    ``q`` and ``k`` may hold fewer heads than ``v`` (and ``g``, ``beta``, the state), a whole
    divisor (fla's grouped value attention), each shared by a group of value heads
    (:func:`kernels.common.heads.share_heads`)."""
    q, k = share_heads(v, "v", q=q, k=k)
    scale = check_linear(q, k, v, scale, initial_state, output_final_state, g=g, g_shape="scalar", beta=beta,
                         with_beta=True, check_values=check_values)
    q, k = qk_l2norm(q, k, use_qk_l2norm_in_kernel)
    if resolve_backend(backend, q) == "torch":
        return reference.chunk_scalar_ref(q, k, v, g, beta, scale, initial_state, output_final_state)
    return delta_rule_triton(q, k, v, g, beta, scale, initial_state, output_final_state)


@documents_checks("``num_householder`` an integer ``n >= 1``; ``q`` ``[B, T, H, K]``, ``k`` ``[B, T·n, H, K]``, "
                  "``v`` ``[B, T·n, H, V]`` (tensors, non-empty, of one dtype among float32/float16/bfloat16, on "
                  "one device); ``g`` ``None`` or ``[B, T, H]`` and ``beta`` (required) ``[B, T·n, H]``, "
                  "float32/float16/bfloat16 tensors on ``q``'s device; ``initial_state`` ``None`` or "
                  "``[B, H, K, V]``; ``scale`` ``None`` or a positive finite number; ``output_final_state`` "
                  "a bool", "``g`` finite and ``<= 0``, ``beta`` finite and in ``[0, 2]``")
def chunk_gated_delta_product(q, k, v, g, beta, num_householder, scale=None, initial_state=None,
                              output_final_state=False, backend=None, *, check_values=True, cu_seqlens=None,
                              cu_seqlens_cpu=None, use_qk_l2norm_in_kernel=False):
    """(Gated) DeltaProduct (fla's ``chunk_gated_delta_product``): ``n = num_householder`` delta-rule
    steps per token, the gate once per token, then the read::

        S ← exp(g_t) S;   for i < n: S ← S + β_{t,i} k_{t,i} (v_{t,i} − Sᵀ k_{t,i})ᵀ;   o_t = scale · Sᵀ q_t

    ``q``: ``[B, T, H, K]``; ``k``: ``[B, T·n, H, K]`` and ``v``: ``[B, T·n, H, V]``, the ``n`` steps
    of token ``t`` at rows ``t·n .. t·n + n − 1``; ``beta``: ``[B, T·n, H]``; ``g``: ``[B, T, H]`` log
    gates or ``None``. Returns ``(o, final_state)``.

    It *is* the gated delta rule on the ``T·n`` steps (no kernel of its own): the gate goes on each
    token's first step (``g = 0`` on the others), the query on its last (zero queries on the others,
    whose outputs are dropped). So the Triton path is :func:`chunk_gated_delta_rule`'s kernels on a
    sequence ``n`` times longer, which computes ``n − 1`` outputs per token it throws away; a kernel
    that skipped them would save that work, not change the result.

    ``cu_seqlens`` (keyword, as fla's): ``None``, or the offsets ``[0, ..., T]`` of ``N`` sequences
    packed along ``T`` (``q`` ``[1, T, H, K]``, ``k`` ``[1, T·n, H, K]``, states ``[N, H, K, V]``):
    the steps' offsets, ``n`` times these, go to the delta rule (:mod:`kernels.common.varlen`);
    ``cu_seqlens_cpu``, fla's host copy of them, is taken too (checked equal).
    ``use_qk_l2norm_in_kernel=True`` (fla's keyword) scales ``q`` and ``k`` to unit length first
    (:mod:`kernels.common.norm`)."""
    if isinstance(num_householder, bool) or not isinstance(num_householder, int) or num_householder < 1:
        raise ValueError(f"num_householder must be an integer >= 1; got {num_householder!r}")
    n = num_householder
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        got = list(q.shape) if isinstance(q, torch.Tensor) else _got(q)
        raise ValueError(f"q must be a torch.Tensor of shape [B, T, H, K]; got {got}")
    B, T, H, K = q.shape
    check_tensor(k, "k", (B, T * n, H, K), q, names="[B, T·num_householder, H, K]")
    check_tensor(beta, "beta", (B, T * n, H), q, names="[B, T·num_householder, H]")
    if g is not None:
        check_tensor(g, "g", (B, T, H), q, names="[B, T, H]")   # one gate per token
        g = torch.stack([g] + [torch.zeros_like(g)] * (n - 1), dim=2).reshape(B, T * n, H)
    q_steps = torch.stack([torch.zeros_like(q)] * (n - 1) + [q], dim=2).reshape(B, T * n, H, K)
    if cu_seqlens is not None or cu_seqlens_cpu is not None:
        cu_seqlens = torch.tensor(host_offsets(cu_seqlens, cu_seqlens_cpu, T)) * n   # each token is n steps
    if g is None:
        o, state = chunk_delta_rule(q_steps, k, v, beta, scale, initial_state, output_final_state, backend,
                                    check_values=check_values, cu_seqlens=cu_seqlens,
                                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    else:
        o, state = chunk_gated_delta_rule(q_steps, k, v, g, beta, scale, initial_state, output_final_state,
                                          backend, check_values=check_values, cu_seqlens=cu_seqlens,
                                          use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    return o[:, n - 1::n], state


@varlen(VarlenSpec(tokens=("q", "k", "v", "g", "beta"), states=("initial_state",)))
@documents_checks(f"{_LINEAR_CHECKED}; {_G}; {_BETA}", "``g`` finite and ``<= 0``, ``beta`` finite and in ``[0, 2]``")
def chunk_comba(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, backend=None, *,
                check_values=True, use_qk_l2norm_in_kernel=False):
    """Comba in the book's form (Chapter 6, ``lattn_core.comba_recurrent``) in fla's orientation::

        S_t = γ_t S_{t-1} + η_t k_t (v_t − S_{t-1}ᵀ k_t)ᵀ;   o_t = scale · S_tᵀ q_t

    with ``γ_t = exp(g_t)`` (``g``: ``[B, T, H]`` log gates ``<= 0``) and ``η_t = beta`` (``[B, T, H]``
    in ``[0, 2]``; ``η <= 1 + γ`` keeps the transition's eigenvalues in ``[−1, 1]``). ``q, k``:
    ``[B, T, H, K]``; ``v``: ``[B, T, H, V]``. Returns ``(o, final_state)`` as
    :func:`chunk_gated_delta_rule`.

    No recurrence of its own: Chapter 6's change of variables (``lattn_core.comba_to_gated_deltanet``)
    makes it Gated DeltaNet with the same gate, ``β' = η / γ``, values ``γ v``, and, where ``β'``
    would pass 2, the key scaled by ``c = sqrt(η / (2γ))`` (``β' = 2``, values ``γ c v``). The map
    (:mod:`kernels.delta.comba`: one elementwise Triton pass each way; PyTorch operations on the
    PyTorch path) goes in front of the gated delta-rule kernels. Gates below
    ``exp(COMBA_MIN_LOG_GATE)`` are raised to it. fla's ``chunk_comba`` is another form:
    it decays the state before the read with a separate vector ``p``, and with ``p = k`` it is Gated
    DeltaNet itself. ``use_qk_l2norm_in_kernel=True`` (fla's keyword) scales ``q`` and ``k`` to
    unit length first (:mod:`kernels.common.norm`).

    ``q`` and ``k`` may hold fewer heads than ``v`` (and ``g``, ``beta``, the state), a whole
    divisor (fla's grouped value attention), each shared by a group of value heads
    (:func:`kernels.common.heads.share_heads`)."""
    q, k = share_heads(v, "v", q=q, k=k)
    if g is None or beta is None:
        raise ValueError("g (log gates, γ = exp(g)) and beta (η) must be tensors of shape [B, T, H]; got None")
    scale = check_linear(q, k, v, scale, initial_state, output_final_state, g=g, g_shape="scalar", beta=beta,
                         with_beta=True, check_values=check_values)
    q, k = qk_l2norm(q, k, use_qk_l2norm_in_kernel)
    if resolve_backend(backend, q) == "torch":
        k2, v2, gf, beta2 = comba_map_torch(k, v, g, beta)
        return reference.chunk_scalar_ref(q, k2, v2, gf, beta2, scale, initial_state, output_final_state)
    k2, v2, gf, beta2 = comba_map(k, v, g, beta)
    return delta_rule_triton(q, k2, v2, gf, beta2, scale, initial_state, output_final_state)
