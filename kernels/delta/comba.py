"""Stage: Comba's change of variables onto Gated DeltaNet (Chapter 6), one elementwise pass each way.

Comba, ``S_t = γ_t S_{t-1} + η_t k_t (v_t − S_{t-1}ᵀ k_t)ᵀ``, is Gated DeltaNet with the same gate
after a map of its inputs (``lattn_core.comba_to_gated_deltanet``): per token and head, with
``g' = max(g, COMBA_MIN_LOG_GATE)``, ``γ = exp(g')``, ``r = η / γ`` and ``c = sqrt(max(r / 2, 1))``,

    k' = c · k,   v' = γ c · v,   β' = min(r, 2),   g' (the gate, floored)

(``c = 1`` while ``r <= 2``; past 2 the key is scaled so that ``β' = r / c² = 2``).

:func:`comba_map_torch` writes the map as PyTorch operations (autograd differentiates it): the
reference, and the op's PyTorch path. On ``[B, T, H, D]`` tensors it costs several float32 passes
each way; :func:`comba_map` does it in one Triton pass forward (read ``k, v, g, η``; write ``k', v',
g', β'``) and one backward (:class:`CombaMapFunction`), with the same float32 arithmetic in the same
order: ``k' = (float(k) · c)`` rounded to ``k``'s dtype, ``v' = float(v) · (γ c)`` rounded to ``v``'s.

The backward, from ``dk', dv', dg'`` (the gate's gradient out of the delta-rule kernels) and ``dβ'``::

    dk = c dk',   dv = γ c dv',   s_k = Σ dk' ⊙ k,   s_v = Σ dv' ⊙ v,   dc = s_k + γ s_v
    dr = dβ' [r <= 2] + dc / (4c) [r >= 2],   dη = dr / γ,   dg = (dg' + γ c s_v − r dr) [g >= floor]

(the masks are those of PyTorch's ``where``/``clamp`` gradients, so both paths agree at the
boundaries too).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import INTERPRET, Launch, launch
from ..common.tiles import round_store, rows_tile

__all__ = ["comba_map", "comba_map_torch", "COMBA_MIN_LOG_GATE", "MAP_ELEMENTS", "MAP_LAUNCH"]

#: gates below exp(-30) ≈ 1e-13 are raised to it (a change of at most 1e-13 of the state), so that
#: the change of variables (``η / γ``) stays far from float32's range
COMBA_MIN_LOG_GATE = -30.0
#: elements of the widest row tile (rows × head size) of one program, and its launch: a memory-bound
#: elementwise pass; not swept (the survey times the op with it, ``kernels/survey.json``)
MAP_ELEMENTS = 2048
MAP_LAUNCH = (Launch(4, 1),)


def comba_map_torch(k, v, g, eta, compute=torch.float32):
    """``(k', v', g', β')`` by PyTorch operations (differentiable), computed in ``compute`` (float64
    makes the tests' reference): ``k'``, ``v'`` in the dtypes of ``k``, ``v``; ``g'`` in ``compute``;
    ``β'`` in ``eta``'s dtype."""
    gf = g.to(compute).clamp(min=COMBA_MIN_LOG_GATE)
    ratio = eta.to(compute) * torch.exp(-gf)                     # η / γ
    c = torch.sqrt(torch.clamp(ratio / 2, min=1.0))              # the key's scale where η / γ > 2
    k2 = (k.to(compute) * c[..., None]).to(k.dtype)
    v2 = (v.to(compute) * (torch.exp(gf) * c)[..., None]).to(v.dtype)
    beta2 = torch.where(ratio > 2, torch.full_like(ratio, 2.0), ratio).to(eta.dtype)   # = ratio / c², 2 past 2
    return k2, v2, gf, beta2


@triton.jit
def _factors(g, eta, MIN_G: tl.constexpr):
    """Per row: the floored log gate ``g'``, ``r = η / γ``, the key's scale ``c`` and ``γ``."""
    gf = tl.maximum(g, MIN_G)
    ratio = eta * tl.exp(-gf)
    c = tl.sqrt(tl.maximum(ratio / 2, 1.0))
    return gf, ratio, c, tl.exp(gf)


@triton.jit
def _map_fwd_kernel(k, v, g, eta, k2, v2, gf_out, beta2, N, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                    BV: tl.constexpr, BR: tl.constexpr, MIN_G: tl.constexpr, EMU: tl.constexpr):
    """``BR`` (token, head) rows: ``k' = c k``, ``v' = γ c v``, ``g'``, ``β' = min(r, 2)``."""
    i_r = tl.program_id(0)
    o_r = i_r * BR + tl.arange(0, BR)
    m_r = o_r < N
    gf, ratio, c, gamma = _factors(tl.load(g + o_r, mask=m_r, other=0.0).to(tl.float32),
                                   tl.load(eta + o_r, mask=m_r, other=0.0).to(tl.float32), MIN_G)
    tl.store(gf_out + o_r, gf, mask=m_r)
    tl.store(beta2 + o_r, round_store(tl.minimum(ratio, 2.0), beta2.dtype.element_ty, EMU), mask=m_r)
    pk, mk = rows_tile(k, o_r, m_r, K, BK)
    kt = tl.load(pk, mask=mk, other=0.0).to(tl.float32)
    tl.store(rows_tile(k2, o_r, m_r, K, BK)[0], round_store(kt * c[:, None], k2.dtype.element_ty, EMU), mask=mk)
    pv, mv = rows_tile(v, o_r, m_r, V, BV)
    vt = tl.load(pv, mask=mv, other=0.0).to(tl.float32)
    tl.store(rows_tile(v2, o_r, m_r, V, BV)[0], round_store(vt * (gamma * c)[:, None], v2.dtype.element_ty, EMU), mask=mv)


@triton.jit
def _map_bwd_kernel(k, v, g, eta, dk2, dv2, dgf, dbeta2, dk, dv, dg, deta, N, K: tl.constexpr, V: tl.constexpr,
                    BK: tl.constexpr, BV: tl.constexpr, BR: tl.constexpr, MIN_G: tl.constexpr,
                    HAS_DGF: tl.constexpr, HAS_DBETA: tl.constexpr, EMU: tl.constexpr):
    """The map's gradients on ``BR`` rows (the module's docstring has the formulas)."""
    i_r = tl.program_id(0)
    o_r = i_r * BR + tl.arange(0, BR)
    m_r = o_r < N
    gr = tl.load(g + o_r, mask=m_r, other=0.0).to(tl.float32)
    gf, ratio, c, gamma = _factors(gr, tl.load(eta + o_r, mask=m_r, other=0.0).to(tl.float32), MIN_G)
    pk, mk = rows_tile(k, o_r, m_r, K, BK)
    gk = tl.load(rows_tile(dk2, o_r, m_r, K, BK)[0], mask=mk, other=0.0).to(tl.float32)
    tl.store(rows_tile(dk, o_r, m_r, K, BK)[0], round_store(gk * c[:, None], dk.dtype.element_ty, EMU), mask=mk)
    s_k = tl.sum(gk * tl.load(pk, mask=mk, other=0.0).to(tl.float32), 1)
    pv, mv = rows_tile(v, o_r, m_r, V, BV)
    gv = tl.load(rows_tile(dv2, o_r, m_r, V, BV)[0], mask=mv, other=0.0).to(tl.float32)
    tl.store(rows_tile(dv, o_r, m_r, V, BV)[0], round_store(gv * (gamma * c)[:, None], dv.dtype.element_ty, EMU), mask=mv)
    s_v = tl.sum(gv * tl.load(pv, mask=mv, other=0.0).to(tl.float32), 1)
    dc = s_k + gamma * s_v
    dr = tl.where(ratio / 2 >= 1.0, dc / (4 * c), 0.0)
    if HAS_DBETA:
        dr += tl.where(ratio <= 2.0, tl.load(dbeta2 + o_r, mask=m_r, other=0.0).to(tl.float32), 0.0)
    d = gamma * c * s_v - ratio * dr
    if HAS_DGF:
        d += tl.load(dgf + o_r, mask=m_r, other=0.0)
    tl.store(dg + o_r, round_store(tl.where(gr >= MIN_G, d, 0.0), dg.dtype.element_ty, EMU), mask=m_r)
    tl.store(deta + o_r, round_store(dr * tl.exp(-gf), deta.dtype.element_ty, EMU), mask=m_r)


def _tiles(K: int, V: int):
    BK, BV = triton.next_power_of_2(K), triton.next_power_of_2(V)
    return BK, BV, max(1, MAP_ELEMENTS // max(BK, BV))


class CombaMapFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, k, v, g, eta):
        ctx.set_materialize_grads(False)
        K, V = k.shape[-1], v.shape[-1]
        N = g.numel()
        BK, BV, BR = _tiles(K, V)
        k2, v2 = torch.empty_like(k), torch.empty_like(v)
        gf = torch.empty(g.shape, dtype=torch.float32, device=g.device)
        beta2 = torch.empty_like(eta)
        launch(_map_fwd_kernel, (triton.cdiv(N, BR),), (k, v, g, eta, k2, v2, gf, beta2, N),
               dict(K=K, V=V, BK=BK, BV=BV, BR=BR, MIN_G=COMBA_MIN_LOG_GATE, EMU=INTERPRET), MAP_LAUNCH)
        ctx.save_for_backward(k, v, g, eta)
        return k2, v2, gf, beta2

    @staticmethod
    def backward(ctx, dk2, dv2, dgf, dbeta2):
        k, v, g, eta = ctx.saved_tensors
        K, V = k.shape[-1], v.shape[-1]
        N = g.numel()
        BK, BV, BR = _tiles(K, V)
        dk2 = torch.zeros_like(k) if dk2 is None else dk2.contiguous()
        dv2 = torch.zeros_like(v) if dv2 is None else dv2.contiguous()
        dk, dv, dg, deta = torch.empty_like(k), torch.empty_like(v), torch.empty_like(g), torch.empty_like(eta)
        launch(_map_bwd_kernel, (triton.cdiv(N, BR),),
               (k, v, g, eta, dk2, dv2, dgf.float().contiguous() if dgf is not None else g,
                dbeta2.contiguous() if dbeta2 is not None else eta, dk, dv, dg, deta, N),
               dict(K=K, V=V, BK=BK, BV=BV, BR=BR, MIN_G=COMBA_MIN_LOG_GATE, HAS_DGF=dgf is not None,
                    HAS_DBETA=dbeta2 is not None, EMU=INTERPRET), MAP_LAUNCH)
        return dk, dv, dg, deta


def comba_map(k, v, g, eta):
    """``(k', v', g', β')`` as :func:`comba_map_torch` returns them, by the Triton kernels (one pass
    forward, one backward). ``k``: ``[B, T, H, K]``, ``v``: ``[B, T, H, V]``, ``g``, ``eta``:
    ``[B, T, H]``, already validated."""
    return CombaMapFunction.apply(k.contiguous(), v.contiguous(), g.contiguous(), eta.contiguous())
