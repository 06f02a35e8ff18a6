"""``chunk_mesa_net``: MesaNet's per-token regression solved by conjugate gradients, in Triton.

Read top to bottom: check the inputs, pick the backend, plan the launches, then three stages
(after :func:`kernels.mesa.prep.prep_keys` forms ``k`` and ``beta·k`` in the operand dtype, one pass).

1. the states of ``H`` entering every chunk (:func:`kernels.mesa.states.h_states`): the gla
   family's chunked gated sums with the keys ``beta·k`` and the values ``k``;
2. the solve (:func:`kernels.mesa.solve.cg_solve`): ``x_t = (H_t + Diag(lamb)) ^{-1} q_t`` by a fixed
   number of CG iterations, one program per chunk and head;
3. the outputs ``o_t = G_tᵀ x_t``: gla's ``chunk_simple_gla`` with the queries ``x``, the keys
   ``beta·k``, the values ``v`` and scale 1 (``G`` is never formed).

The backward differentiates the exact solve (implicit differentiation): stage 3's gla backward
gives ``dx`` (and the gradients of its keys, values, gates and initial state); ``y = (H_t + Λ)^{-1}
dx_t`` by the same CG kernel (the matrix is symmetric); ``dq = y``, ``dlamb = -Σ_t y_t ⊙ x_t``; and
``dH_t = -y_t x_tᵀ`` pulled back into ``k``, ``beta``, ``g`` and ``h_kk_init`` by the backward stages
of gla's "linear attention with the queries ``x``, keys ``beta·k``, values ``k``" (output gradient
``-y``), called directly on the chunk states the backward's solve has just recomputed.
"""
from __future__ import annotations

import numbers

import torch

from ..backend import check_dtypes, device_caps, resolve_backend
from ..gla.backward import chunk_grads, gate_grads, state_grads
from ..gla.op import HEAD_SIZES as GLA_HEAD_SIZES, chunk_gla_triton
from ..common import head_tile, pad_axis
from ..common.norm import qk_l2norm
from ..common.varlen import VarlenSpec, varlen
from ..validate import (QKV_CHECKED, ValueChecks, check_flag, check_gate_tensor, check_qkv, check_tensor,
                        documents_checks)
from ..reference import chunk_mesa_net_ref
from .plan import KEY_SIZES, plan_for
from .prep import prep_keys
from .solve import cg_solve
from .states import h_states, h_states_again

__all__ = ["chunk_mesa_net", "chunk_mesa_net_triton", "KEY_SIZES", "VALUE_SIZES"]

VALUE_SIZES = GLA_HEAD_SIZES      #: V: stage 3 is gla's


_STATE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check_mesa_inputs(q, k, v, g, beta, lamb, max_CG_iteration, h_kk_init, h_kv_init, output_final_state,
                       check_values) -> int:
    B, T, H, K, V = check_qkv(q, k, v)
    checks = ValueChecks(check_values)
    check_gate_tensor(g, "g", (B, T, H), q, nonpositive=True, checks=checks)
    check_gate_tensor(beta, "beta", (B, T, H), q, checks=checks)
    check_gate_tensor(lamb, "lamb", (H, K), q, checks=checks)
    checks.bounds(beta, "beta must be >= 0 elementwise (H_t + Diag(lamb) must stay positive definite for CG)",
                  lo=0.0)
    checks.bounds(lamb, f"lamb must be > 0 elementwise (shape [H, K] = [{H}, {K}])", lo=0.0, lo_open=True)
    if isinstance(max_CG_iteration, bool) or not isinstance(max_CG_iteration, numbers.Integral) \
            or max_CG_iteration < 0:
        raise ValueError(f"max_CG_iteration must be an integer >= 0; got {max_CG_iteration!r}")
    if h_kk_init is not None:
        check_tensor(h_kk_init, "h_kk_init", (B, H, K, K), q, names="[B, H, K, K]", dtypes=_STATE_DTYPES)
        checks.finite(h_kk_init, "h_kk_init")
        checks.symmetric(h_kk_init, "h_kk_init", rtol=1e-5, atol=1e-6)
    if h_kv_init is not None:
        check_tensor(h_kv_init, "h_kv_init", (B, H, K, V), q, names="[B, H, K, V]", dtypes=_STATE_DTYPES)
    check_flag(output_final_state, "output_final_state")
    checks.run()
    return int(max_CG_iteration)


@varlen(VarlenSpec(tokens=("q", "k", "v", "g", "beta"), states=("h_kk_init", "h_kv_init"),
                   returns=("tokens", "state", "state")))
@documents_checks(f"{QKV_CHECKED}; ``g``, ``beta`` ``[B, T, H]`` and ``lamb`` ``[H, K]`` (all three required): "
                  "float32/float16/bfloat16 tensors on ``q``'s device; ``max_CG_iteration`` an integer "
                  "``>= 0``; ``h_kk_init`` ``None`` or ``[B, H, K, K]`` and ``h_kv_init`` ``None`` or "
                  "``[B, H, K, V]`` (float64 allowed too) on ``q``'s device; ``output_final_state`` a bool",
                  "``g`` finite and ``<= 0``, ``beta`` finite and ``>= 0``, ``lamb`` finite and ``> 0``, "
                  "``h_kk_init`` finite and symmetric (to ``1e-5`` relative, ``1e-6`` of its largest entry "
                  "absolute)")
def chunk_mesa_net(q, k, v, g, beta, lamb, max_CG_iteration=30, h_kk_init=None, h_kv_init=None,
                   output_final_state=False, backend=None, *, check_values=True, use_qk_l2norm_in_kernel=False):
    """MesaNet (fla's ``chunk_mesa_net``; API.md): per batch and head
    ``H_t = e^{g_t} H_{t-1} + beta_t k_t k_tᵀ``, ``G_t = e^{g_t} G_{t-1} + beta_t k_t v_tᵀ`` and
    ``o_t = G_tᵀ (H_t + Diag(lamb_h))^{-1} q_t``, the solve by ``max_CG_iteration`` conjugate-gradient
    steps from zero. No scale. Returns ``(o, h_kk, h_kv)``: the final states ``[B, H, K, K]`` and
    ``[B, H, K, V]`` (float32) with ``output_final_state``, else ``None``.

    ``q, k`` ``[B, T, H, K]``; ``v`` ``[B, T, H, V]`` (``V`` may differ from ``K``); ``g``
    ``[B, T, H]`` log decays ``<= 0``; ``beta`` ``[B, T, H]`` ``>= 0``; ``lamb`` ``[H, K]`` ``> 0``
    (``g``, ``beta``, ``lamb`` in float32 or the inputs' dtype); ``h_kk_init`` (symmetric) and
    ``h_kv_init`` the states before the first token. q and k are used as given (MesaNet's layers
    normalise them), or scaled to unit length first with ``use_qk_l2norm_in_kernel=True`` (fla's
    keyword; :mod:`kernels.common.norm`). Gradients are those of the exact solve (implicit differentiation), the solve
    of the backward by as many CG steps. ``h_kk_init``'s gradient is the whole one of
    ``(H_t + Diag(lamb)) x_t = q_t`` solved as written (``-y xᵀ`` from the solve, as fla's reference
    gives it), not only its symmetric part; only the symmetric part reaches any input that builds a
    symmetric state, so chained calls get the same gradients either way.
    """
    iters = _check_mesa_inputs(q, k, v, g, beta, lamb, max_CG_iteration, h_kk_init, h_kv_init, output_final_state,
                               check_values)
    q, k = qk_l2norm(q, k, use_qk_l2norm_in_kernel)
    if resolve_backend(backend, q) == "torch":
        return chunk_mesa_net_ref(q, k, v, g, beta, lamb, iters, h_kk_init, h_kv_init, output_final_state)
    return chunk_mesa_net_triton(q, k, v, g, beta, lamb, iters, h_kk_init, h_kv_init, output_final_state)


class MesaSolveFunction(torch.autograd.Function):
    """``(x, h_kk)`` from ``(q, kb = beta·k, kk = k, g, lamb, h_kk_init)``: stages 1 and 2."""

    @staticmethod
    def forward(ctx, q, kb, kk, g, lamb, h0, iters, plan, output_final_state):
        h0f = h0.float().contiguous() if h0 is not None else None
        lamf = lamb.float().contiguous()
        hs, inits, ht = h_states(kb, kk, g, h0f, plan.states, output_final_state)
        x = cg_solve(q, kb, kk, g, lamf, hs, iters, plan, kk.dtype)
        ctx.save_for_backward(kb, kk, g, lamf, h0f, inits, x)
        ctx.iters, ctx.plan = iters, plan
        ctx.dtypes = (q.dtype, lamb.dtype, None if h0 is None else h0.dtype)
        return x, ht

    @staticmethod
    def backward(ctx, dx, dht):
        kb, kk, g, lamf, h0f, inits, x = ctx.saved_tensors
        plan = ctx.plan
        q_dtype, lamb_dtype, h0_dtype = ctx.dtypes
        need_q, need_kb, need_kk, need_g, need_lamb, need_h0 = ctx.needs_input_grad[:6]
        hs, dec = h_states_again(kb, kk, g, inits, plan.states)
        y = cg_solve(dx.contiguous(), kb, kk, g, lamf, hs, ctx.iters, plan, torch.float32)   # (H + Λ)^{-1} dx
        dq = y.to(q_dtype) if need_q else None
        dlamb = -(y * x.float()).sum((0, 1)).to(lamb_dtype) if need_lamb else None
        dkb = dkk = dg = dh0 = None
        if need_kb or need_kk or need_g or need_h0:
            # dH_t = -y_t x_tᵀ pulled back by the backward stages of gla's "linear attention with the
            # queries -y, keys beta·k, values k" (its state is H; gla's o_t = S_tᵀ q_t, so its state
            # gradient is q do^T) with the output gradient x and the final state's gradient dht, on
            # the chunk states the solve above already read. The gradients of k, beta and g see only
            # the symmetric part of dH; h_kk_init gets the whole of it, in the orientation of
            # (H + Λ) x = q solved as written (-y xᵀ, as fla's), not its transpose
            gp = plan.states
            qy = (-y).to(kk.dtype)
            dht = dht.contiguous().float() if dht is not None else None
            dhs, d0 = state_grads(qy, g, x, dht, dec, 1.0, gp, h0f is not None and need_h0)
            _, dkb, dkk, terms = chunk_grads(qy, kb, kk, g, x, hs, dhs, None, 1.0, gp)
            dg = gate_grads(g, terms, gp)
            if d0 is not None:
                dh0 = d0.to(h0_dtype)
        return dq, dkb, dkk, dg, dlamb, dh0, None, None, None


def chunk_mesa_net_triton(q, k, v, g, beta, lamb, max_CG_iteration, h_kk_init=None, h_kv_init=None,
                          output_final_state=False, *, caps=None, plan=None):
    """The Triton path, inputs already validated except the head sizes and the dtypes the GPU class
    can run (``caps``: default the inputs' device's), both checked before anything compiles. Head
    sizes other than the tiles are zero-padded to the next one (:mod:`kernels.common.heads`); ``K``
    over 128, PyTorch on the device.
    ``plan``: overrides of :func:`kernels.mesa.plan.plan_for` (a dict)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    Kp = head_tile("K (head size of q and k)", K, KEY_SIZES)
    Vp = head_tile("V (head size of v)", V, VALUE_SIZES)
    caps = caps if caps is not None else device_caps(q.device)
    check_dtypes(caps, q.device, q=q, g=g, beta=beta, lamb=lamb)
    if Kp is None or Vp is None:      # over the largest tile: PyTorch on the device
        return chunk_mesa_net_ref(q, k, v, g, beta, lamb, max_CG_iteration, h_kk_init, h_kv_init,
                                  output_final_state)
    if (Kp, Vp) != (K, V):
        # zero padding to the tiles (kernels.common.heads): H_t + Diag(lamb) is block-diagonal, the
        # padded block Diag(1) with a zero right-hand side, so CG never moves there (exact)
        hkk = pad_axis(pad_axis(h_kk_init, Kp, -2), Kp) if h_kk_init is not None else None
        hkv = pad_axis(pad_axis(h_kv_init, Kp, -2), Vp) if h_kv_init is not None else None
        o, h_kk, h_kv = chunk_mesa_net_triton(pad_axis(q, Kp), pad_axis(k, Kp), pad_axis(v, Vp), g, beta,
                                              pad_axis(lamb, Kp, value=1.0), max_CG_iteration, hkk, hkv,
                                              output_final_state, caps=caps, plan=plan)
        if h_kk is not None:
            h_kk, h_kv = h_kk[:, :, :K, :K].contiguous(), h_kv[:, :, :K, :V].contiguous()
        return o[..., :V].contiguous(), h_kk, h_kv
    mplan = plan_for(q.dtype, q.device, B=B, T=T, H=H, K=K, caps=caps, **(plan or {}))
    if mplan.path == "torch":     # a class these kernels do not fit (plan.py): PyTorch on the device
        return chunk_mesa_net_ref(q, k, v, g, beta, lamb, max_CG_iteration, h_kk_init, h_kv_init,
                                  output_final_state)
    od = mplan.operand
    g = g.contiguous()
    kk, kb = prep_keys(k, beta, od)
    x, h_kk = MesaSolveFunction.apply(q.contiguous(), kb, kk, g, lamb, h_kk_init, int(max_CG_iteration), mplan,
                                      bool(output_final_state))
    o, h_kv = chunk_gla_triton(x, kb, v.to(od).contiguous(), g, 1.0, h_kv_init, output_final_state, caps=caps)
    return o.to(v.dtype), h_kk, h_kv
