"""Stage 0: the keys the other stages read, ``k`` and ``beta·k`` in the operand dtype, in one pass.

Stages 1–3 take the keys twice: as ``k`` (the values of the ``H`` states, the right factor of the
solve's chunk product) and as ``beta·k`` (their keys, the left factor), both in the plan's operand
dtype. As PyTorch operations (``k.to(od)`` and ``(beta.float() · k.float()).to(od)``) that is four
passes over ``[B, T, H, K]`` tensors forward, two of them in float32, and as many again in
autograd's backward. :class:`PrepFunction` reads ``k`` and ``beta`` once and writes both; its
backward reads ``dk̃``, ``d(βk)``, ``k`` and ``beta`` once and writes

    dk = dk̃ + beta · d(βk),   dbeta = Σ_K d(βk) ⊙ k

(summed in float32 and rounded once; autograd of the PyTorch form rounds the two parts of ``dk``
to ``k``'s dtype before adding them). Timed with the op, round 2 of ``HISTORY.md``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import INTERPRET, Launch, launch
from ..common.tiles import round_store, rows_tile

__all__ = ["prep_keys", "prep_keys_torch", "PREP_ELEMENTS", "PREP_LAUNCH"]

#: elements of one program's row tile and its launch (an elementwise pass, as chunk_comba's map;
#: not swept)
PREP_ELEMENTS = 2048
PREP_LAUNCH = (Launch(4, 1),)


def prep_keys_torch(k, beta, operand):
    """``(k, beta·k)`` in ``operand`` by PyTorch operations (differentiable): the reference."""
    return k.to(operand), (beta.unsqueeze(-1).float() * k.float()).to(operand)


@triton.jit
def _prep_fwd_kernel(k, beta, kk, kb, N, K: tl.constexpr, BK: tl.constexpr, BR: tl.constexpr,
                     EMU: tl.constexpr):
    """``BR`` (token, head) rows: ``kk = k``, ``kb = beta · k`` (float32 product), both rounded to
    the operand dtype."""
    i_r = tl.program_id(0)
    o_r = i_r * BR + tl.arange(0, BR)
    m_r = o_r < N
    b = tl.load(beta + o_r, mask=m_r, other=0.0).to(tl.float32)
    pk, mk = rows_tile(k, o_r, m_r, K, BK)
    kt = tl.load(pk, mask=mk, other=0.0).to(tl.float32)
    tl.store(rows_tile(kk, o_r, m_r, K, BK)[0], round_store(kt, kk.dtype.element_ty, EMU), mask=mk)
    tl.store(rows_tile(kb, o_r, m_r, K, BK)[0], round_store(kt * b[:, None], kb.dtype.element_ty, EMU), mask=mk)


@triton.jit
def _prep_bwd_kernel(k, beta, dkk, dkb, dk, dbeta, N, K: tl.constexpr, BK: tl.constexpr, BR: tl.constexpr,
                     HAS_DKK: tl.constexpr, HAS_DKB: tl.constexpr, EMU: tl.constexpr):
    """``dk = dkk + beta · dkb`` and ``dbeta = Σ_K dkb ⊙ k`` on ``BR`` rows."""
    i_r = tl.program_id(0)
    o_r = i_r * BR + tl.arange(0, BR)
    m_r = o_r < N
    pk, mk = rows_tile(k, o_r, m_r, K, BK)
    acc = tl.zeros([BR, BK], dtype=tl.float32)
    if HAS_DKK:
        acc += tl.load(rows_tile(dkk, o_r, m_r, K, BK)[0], mask=mk, other=0.0).to(tl.float32)
    db = tl.zeros([BR], dtype=tl.float32)
    if HAS_DKB:
        b = tl.load(beta + o_r, mask=m_r, other=0.0).to(tl.float32)
        g = tl.load(rows_tile(dkb, o_r, m_r, K, BK)[0], mask=mk, other=0.0).to(tl.float32)
        acc += b[:, None] * g
        db = tl.sum(g * tl.load(pk, mask=mk, other=0.0).to(tl.float32), 1)
    tl.store(rows_tile(dk, o_r, m_r, K, BK)[0], round_store(acc, dk.dtype.element_ty, EMU), mask=mk)
    tl.store(dbeta + o_r, round_store(db, dbeta.dtype.element_ty, EMU), mask=m_r)


def _tiles(K: int):
    BK = triton.next_power_of_2(K)
    return BK, max(1, PREP_ELEMENTS // BK)


class PrepFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, k, beta, operand):
        ctx.set_materialize_grads(False)
        K, N = k.shape[-1], beta.numel()
        BK, BR = _tiles(K)
        kk = torch.empty(k.shape, dtype=operand, device=k.device)
        kb = torch.empty_like(kk)
        launch(_prep_fwd_kernel, (triton.cdiv(N, BR),), (k, beta, kk, kb, N),
               dict(K=K, BK=BK, BR=BR, EMU=INTERPRET), PREP_LAUNCH)
        ctx.save_for_backward(k, beta)
        return kk, kb

    @staticmethod
    def backward(ctx, dkk, dkb):
        k, beta = ctx.saved_tensors
        K, N = k.shape[-1], beta.numel()
        BK, BR = _tiles(K)
        dk, dbeta = torch.empty_like(k), torch.empty_like(beta)
        launch(_prep_bwd_kernel, (triton.cdiv(N, BR),),
               (k, beta, dkk.contiguous() if dkk is not None else k, dkb.contiguous() if dkb is not None else k,
                dk, dbeta, N),
               dict(K=K, BK=BK, BR=BR, HAS_DKK=dkk is not None, HAS_DKB=dkb is not None, EMU=INTERPRET),
               PREP_LAUNCH)
        return dk, dbeta, None


def prep_keys(k, beta, operand):
    """``(k, beta·k)`` in the dtype ``operand`` (contiguous ``[B, T, H, K]``), as
    :func:`prep_keys_torch` returns them, by one Triton pass each way."""
    return PrepFunction.apply(k.contiguous(), beta.contiguous(), operand)
