"""Stage: the WY/UT factors and the scores of every chunk, in parallel.

From the chunk's ``T`` (:mod:`kernels.common.solve`): ``W = T (β e^{b} K)`` and ``U = T (β V)``
as ``[64, 64]`` products over column blocks, and the chunk's masked, gated, scaled scores
``P = scale · (q kᵀ ⊙ Γ ⊙ M)`` (``[64, 64]``, stored in the input dtype): every later kernel reads
``P`` instead of recomputing it per V-block. :func:`wy_factors` is the training forward's stage,
:func:`chunk_scores` the scores alone (the inference march, where ``W`` and ``U`` are never formed).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import launch
from .plan import CHUNK

__all__ = ["wy_factors", "chunk_scores"]


@triton.jit
def _mask_gate(s, b, scale):
    """Intra-chunk scores ``scale · s_ij e^{b_i − b_j}`` for ``j ≤ i``, zero above the diagonal
    (``s = q kᵀ`` of one chunk, float32; every exponent is ≤ 0)."""
    rc = tl.arange(0, 64)
    causal = rc[:, None] >= rc[None, :]
    return tl.where(causal, s * tl.exp(tl.where(causal, b[:, None] - b[None, :], 0.0)) * scale, 0.0)


@triton.jit
def _wu_chunk(q_ptr, k_ptr, v_ptr, beta_ptr, b_ptr, w_ptr, u_ptr, t_ptr, a_ptr, scale, i_t, i_bh, T, H, NTC,
              K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr, QK: tl.constexpr,
              WU: tl.constexpr):
    """``W = T (β e^b K)`` and ``U = T (β V)`` of one chunk from its stored ``T``: ``[64, 64]``
    products over K and V in column blocks of ``BK``. With ``QK`` also the chunk's masked, gated,
    scaled scores ``P = scale · (q kᵀ ⊙ Γ ⊙ M)`` (``[64, 64]``, the input dtype), which the
    sequential kernels would otherwise recompute for every V-block. ``WU=False``: the scores only."""
    i_b = i_bh // H
    i_h = i_bh % H
    dt = k_ptr.dtype.element_ty
    rc = tl.arange(0, 64)
    rows = i_t * 64 + rc
    rmask = rows < T
    Tm = tl.load(t_ptr + (i_bh * NTC + rows[:, None]) * 64 + rc[None, :]).to(dt)
    beta = tl.load(beta_ptr + i_b * T * H + i_h + rows * H, mask=rmask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + i_bh * NTC + rows)
    sk = beta * tl.exp(b)
    if QK:   # first, so that its [64, 64] accumulator is dead before the W, U products
        s = tl.zeros([64, 64], dtype=tl.float32)
        for c0 in tl.static_range(0, K, BK):
            kq_off = (i_b * T * H + i_h) * K + rows[:, None] * (H * K) + (c0 + tl.arange(0, BK))[None, :]
            s += tl.dot(tl.load(q_ptr + kq_off, mask=rmask[:, None], other=0.0),
                        tl.trans(tl.load(k_ptr + kq_off, mask=rmask[:, None], other=0.0)), input_precision=PREC)
        s = _mask_gate(s, b, scale)
        tl.store(a_ptr + (i_bh * NTC + rows[:, None]) * 64 + rc[None, :], s.to(a_ptr.dtype.element_ty))
    if WU:
        for c0 in tl.static_range(0, K, BK):
            ck = c0 + tl.arange(0, BK)
            x = tl.load(k_ptr + (i_b * T * H + i_h) * K + rows[:, None] * (H * K) + ck[None, :],
                        mask=rmask[:, None], other=0.0)
            x = (x.to(tl.float32) * sk[:, None]).to(dt)
            tl.store(w_ptr + (i_bh * NTC + rows[:, None]) * K + ck[None, :],
                     tl.dot(Tm, x, input_precision=PREC).to(w_ptr.dtype.element_ty))
        for c0 in tl.static_range(0, V, BK):
            cv = c0 + tl.arange(0, BK)
            y = tl.load(v_ptr + (i_b * T * H + i_h) * V + rows[:, None] * (H * V) + cv[None, :],
                        mask=rmask[:, None], other=0.0)
            y = (y.to(tl.float32) * beta[:, None]).to(dt)
            tl.store(u_ptr + (i_bh * NTC + rows[:, None]) * V + cv[None, :],
                     tl.dot(Tm, y, input_precision=PREC).to(u_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["T", "H", "NTC", "N0"])
def _wu_fwd_kernel(q_ptr, k_ptr, v_ptr, beta_ptr, b_ptr, w_ptr, u_ptr, t_ptr, a_ptr, scale, T, H, NTC, N0,
                   K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr, QK: tl.constexpr,
                   WU: tl.constexpr):
    _wu_chunk(q_ptr, k_ptr, v_ptr, beta_ptr, b_ptr, w_ptr, u_ptr, t_ptr, a_ptr, scale, tl.program_id(0) + N0,
              tl.program_id(1).to(tl.int64), T, H, NTC, K, V, BK, PREC, QK, WU)


def _precision(dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def wy_factors(q, k, v, b, beta, tm, scale: float, plan):
    """``W`` ``[B·H, NT·64, K]``, ``U`` ``[B·H, NT·64, V]`` and the scores ``P`` ``[B·H, NT·64, 64]``
    (all in the input dtype) of every chunk, from its ``T`` (``tm``)."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    NTC = NT * CHUNK
    dev = k.device
    w = torch.empty(B * H, NTC, K, dtype=k.dtype, device=dev)
    u = torch.empty(B * H, NTC, V, dtype=k.dtype, device=dev)
    a = torch.empty(B * H, NTC, CHUNK, dtype=k.dtype, device=dev)
    launch(_wu_fwd_kernel, (NT, B * H), (q, k, v, beta, b, w, u, tm, a, float(scale), T, H, NTC, 0),
           dict(K=K, V=V, BK=plan.wu_bk, PREC=_precision(k.dtype), QK=True, WU=True), plan.wu)
    return w, u, a


def chunk_scores(q, k, b, beta, tm, a, scale: float, plan, n0: int = 0, n1=None):
    """The scores ``P`` of chunks ``n0 .. n1-1`` into ``a`` (``[B·H, NT·64, 64]``)."""
    B, T, H, K = k.shape
    NT = triton.cdiv(T, CHUNK)
    n1 = NT if n1 is None else n1
    launch(_wu_fwd_kernel, (n1 - n0, B * H), (q, k, k, beta, b, tm, tm, tm, a, float(scale), T, H, NT * CHUNK, n0),
           dict(K=K, V=K, BK=plan.march_scores_bk, PREC=_precision(k.dtype), QK=True, WU=False), plan.march_scores)
    return a
