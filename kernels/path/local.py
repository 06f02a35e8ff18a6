"""Stage 1 and its gradient: what each block of 64 tokens does on its own.

For a block ``b`` (tokens ``s .. e−1``) with directions ``W`` (``[64, K]``), ``β`` and the
shared triangular solve's inverse ``T = (I + L)^{-1}``, ``L = Diag(β)(W Wᵀ ⊙ M⁻)``
(:func:`kernels.common.solve.solve_chunks` with ``w`` in the keys' place and no gate), the block's
Householder product is ``P_b = H_{e−1} ⋯ H_s = I − Wᵀ U`` with the UT factor ``U = T Diag(β) W``.
The prepare kernel writes, per block:

- ``Q̃ = Q − (Q Wᵀ ⊙ M) U``: each query pulled back to the block's start, ``q̃_iᵀ = q_iᵀ H_i ⋯ H_s``;
- ``Y = T Diag(β)(W Kᵀ ⊙ M⁻)`` and ``K̂ = K − Yᵀ W``: each key pushed to the block's end,
  ``k̂_j = H_{e−1} ⋯ H_{j+1} k_j``;
- ``A_loc = (Q Kᵀ ⊙ M) − (Q Wᵀ ⊙ M) Y``: the scores inside the block (the article's closed form on
  the block, ``lattn_core.path_scores_chunkwise``);
- ``U`` and ``W`` in the transport dtype, for the passes that carry queries over whole blocks.

The backward kernel takes the gradients of those outputs (``dQ̃``, ``dK̂``, ``dA_loc`` and the
gradients ``G = W M`` and ``Hh = U Mᵀ`` that reach ``P_b = I − Wᵀ U`` from the blocks after it, so
``dU = −G`` and ``dW = −Hh`` there) back to ``dq``, ``dk``, ``dw`` and ``dβ``, through ``T`` by
``dL = −Tᵀ dT Tᵀ``. Everything here is ``O(T · 64 · K)``; the quadratic work is in the passes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import launch
from ..common.solve import chunk_cumsum, solve_chunks
from .plan import CHUNK

__all__ = ["prepare_blocks", "local_backward", "local_columns"]


@triton.jit
def _rows(base, t0, T, stride_t, D: tl.constexpr):
    """Rows ``t0 .. t0+63`` of a ``[T, D]`` view (row stride ``stride_t``) as float32; zeros past ``T``."""
    r = t0 + tl.arange(0, 64)
    c = tl.arange(0, D)
    return tl.load(base + r[:, None] * stride_t + c[None, :], mask=(r < T)[:, None], other=0.0).to(tl.float32)


@triton.jit
def _store_rows(base, x, t0, T, stride_t, D: tl.constexpr):
    r = t0 + tl.arange(0, 64)
    c = tl.arange(0, D)
    tl.store(base + r[:, None] * stride_t + c[None, :], x.to(base.dtype.element_ty), mask=(r < T)[:, None])


@triton.jit
def _block_tile(base, row0, C: tl.constexpr):
    """A dense ``[64, C]`` tile at row ``row0`` of a ``[rows, C]`` buffer, as float32."""
    r = row0 + tl.arange(0, 64)
    c = tl.arange(0, C)
    return tl.load(base + r[:, None] * C + c[None, :]).to(tl.float32)


@triton.jit(do_not_specialize=["T", "H", "NTC", "TMS"])
def _prepare_kernel(q_ptr, k_ptr, w_ptr, beta_ptr, tm_ptr, qt_ptr, kh_ptr, u_ptr, wt_ptr, aloc_ptr,
                    T, H, NTC, TMS, K: tl.constexpr, PREC: tl.constexpr):
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    t0 = i_t * 64
    r = t0 + tl.arange(0, 64)
    c = tl.arange(0, 64)
    row_base = (i_b * T * H + i_h) * K
    q = _rows(q_ptr + row_base, t0, T, H * K, K)
    k = _rows(k_ptr + row_base, t0, T, H * K, K)
    w = _rows(w_ptr + row_base, t0, T, H * K, K)
    beta = tl.load(beta_ptr + i_b * T * H + i_h + r * H, mask=r < T, other=0.0).to(tl.float32)
    tmat = _block_tile(tm_ptr + i_bh * TMS * 64, t0, 64)
    lower = c[None, :] <= c[:, None]
    below = c[None, :] < c[:, None]
    u = tl.dot(tmat, beta[:, None] * w, input_precision=PREC)                       # U = T Diag(β) W
    qw = tl.where(lower, tl.dot(q, tl.trans(w), input_precision=PREC), 0.0)          # Q Wᵀ ⊙ M
    e = tl.where(below, tl.dot(w, tl.trans(k), input_precision=PREC), 0.0) * beta[:, None]
    y = tl.dot(tmat, e, input_precision=PREC)                                       # Y = T Diag(β)(W Kᵀ ⊙ M⁻)
    qt = q - tl.dot(qw, u, input_precision=PREC)
    kh = k - tl.dot(tl.trans(y), w, input_precision=PREC)
    aloc = tl.where(lower, tl.dot(q, tl.trans(k), input_precision=PREC), 0.0) - tl.dot(qw, y, input_precision=PREC)
    out = i_bh * NTC * K
    _store_rows(qt_ptr + out, qt, t0, NTC, K, K)
    _store_rows(kh_ptr + out, kh, t0, NTC, K, K)
    _store_rows(u_ptr + out, u, t0, NTC, K, K)
    _store_rows(wt_ptr + out, w, t0, NTC, K, K)
    _store_rows(aloc_ptr + i_bh * NTC * 64, aloc, t0, NTC, 64, 64)


def prepare_blocks(q, k, w, beta, plan):
    """Stage 1: the shared triangular solve (:mod:`kernels.common.solve`) for ``T``, then one program per (block, batch·head).
    ``w`` in the transport dtype (the caller casts it once; the backward reads the same values).
    Returns ``(qt, kh, u, wt, aloc, tm)``: ``[B·H, NT·64, K]`` in the transport dtype (``plan.
    transport``), ``aloc`` ``[B·H, NT·64, 64]`` float32 (zero above the diagonal), ``tm`` the
    inverses ``[B·H, NT·64, 64]`` float32."""
    B, T, H, K = q.shape
    NT = triton.cdiv(T, CHUNK)
    NTC = triton.cdiv(T, plan.rows) * plan.rows      # rows per head: whole query blocks of the passes
    b0, _ = chunk_cumsum(None, beta, B, T, H, NT)
    tm = torch.empty(B * H, NT * CHUNK, CHUNK, dtype=torch.float32, device=q.device)
    td = plan.transport
    solve_chunks(w, b0, beta, plan.solve_plan(K, w.dtype), tm=tm)
    # a padded 64-block past the last (NTC > NT·64) holds zeros, what its zero inputs would give
    alloc = torch.zeros if NTC > NT * CHUNK else torch.empty
    qt, kh, u, wt = (alloc(B * H, NTC, K, dtype=td, device=q.device) for _ in range(4))
    aloc = alloc(B * H, NTC, CHUNK, dtype=torch.float32, device=q.device)
    launch(_prepare_kernel, (NT, B * H), (q, k, w, beta, tm, qt, kh, u, wt, aloc, T, H, NTC, NT * CHUNK),
           dict(K=K, PREC=plan.local_precision), plan.local)
    return qt, kh, u, wt, aloc, tm


@triton.jit
def _cols(base, t0, c0, T, stride_t, KB: tl.constexpr):
    """Columns ``c0 .. c0+KB`` of rows ``t0 .. t0+63`` of a ``[T, ·]`` view as float32; zeros past ``T``."""
    r = t0 + tl.arange(0, 64)
    c = c0 + tl.arange(0, KB)
    return tl.load(base + r[:, None] * stride_t + c[None, :], mask=(r < T)[:, None], other=0.0).to(tl.float32)


@triton.jit
def _store_cols(base, x, t0, c0, T, stride_t, KB: tl.constexpr):
    r = t0 + tl.arange(0, 64)
    c = c0 + tl.arange(0, KB)
    tl.store(base + r[:, None] * stride_t + c[None, :], x.to(base.dtype.element_ty), mask=(r < T)[:, None])


@triton.jit
def _put_block(base, row0, x):
    """Store a ``[64, 64]`` float32 tile at row ``row0`` of a ``[rows, 64]`` buffer."""
    r = row0 + tl.arange(0, 64)
    c = tl.arange(0, 64)
    tl.store(base + r[:, None] * 64 + c[None, :], x)


@triton.jit(do_not_specialize=["T", "H", "NTC", "TMS", "bh0"])
def _local_bwd_matrices_kernel(q_ptr, k_ptr, w_ptr, beta_ptr, tm_ptr, dqt_ptr, dkh_ptr, gw_ptr, daloc_ptr,
                               mats_ptr, dbeta_ptr, T, H, NTC, TMS, bh0,
                               K: tl.constexpr, KB: tl.constexpr, PREC: tl.constexpr):
    # First half of the per-block backward: the 64×64 matrices the chain rule needs (products over
    # K, in column blocks of KB), dβ, and the five matrices the column half reads (written to `mats`).
    i_t = tl.program_id(0)
    i_m = tl.program_id(1).to(tl.int64)   # this launch's head (launches of at most plan.local_scratch bytes)
    i_bh = bh0 + i_m
    i_b = i_bh // H
    i_h = i_bh % H
    t0 = i_t * 64
    r = t0 + tl.arange(0, 64)
    c = tl.arange(0, 64)
    row_base = (i_b * T * H + i_h) * K
    acc = i_bh * NTC * K
    beta = tl.load(beta_ptr + i_b * T * H + i_h + r * H, mask=r < T, other=0.0).to(tl.float32)
    lower = c[None, :] <= c[:, None]
    below = c[None, :] < c[:, None]
    qw = tl.zeros([64, 64], dtype=tl.float32)        # Q Wᵀ
    wk = tl.zeros([64, 64], dtype=tl.float32)        # W Kᵀ
    ww = tl.zeros([64, 64], dtype=tl.float32)        # W Wᵀ
    dqw_t = tl.zeros([64, 64], dtype=tl.float32)     # dQ̃ Wᵀ
    wdk = tl.zeros([64, 64], dtype=tl.float32)       # W dK̂ᵀ
    gww = tl.zeros([64, 64], dtype=tl.float32)       # (W M) Wᵀ
    for c0 in tl.static_range(0, K, KB):
        q = _cols(q_ptr + row_base, t0, c0, T, H * K, KB)
        k = _cols(k_ptr + row_base, t0, c0, T, H * K, KB)
        w = _cols(w_ptr + row_base, t0, c0, T, H * K, KB)
        qw += tl.dot(q, tl.trans(w), input_precision=PREC)
        wk += tl.dot(w, tl.trans(k), input_precision=PREC)
        ww += tl.dot(w, tl.trans(w), input_precision=PREC)
        dqw_t += tl.dot(_cols(dqt_ptr + acc, t0, c0, NTC, K, KB), tl.trans(w), input_precision=PREC)
        wdk += tl.dot(w, tl.trans(_cols(dkh_ptr + acc, t0, c0, NTC, K, KB)), input_precision=PREC)
        gww += tl.dot(_cols(gw_ptr + acc, t0, c0, NTC, K, KB), tl.trans(w), input_precision=PREC)
    tmat = _block_tile(tm_ptr + i_bh * TMS * 64, t0, 64)
    da = _block_tile(daloc_ptr + i_bh * NTC * 64, t0, 64)
    mats = mats_ptr + i_m * 5 * TMS * 64
    qw = tl.where(lower, qw, 0.0)
    _put_block(mats, t0, qw)
    e = tl.where(below, wk, 0.0) * beta[:, None]                      # Diag(β)(W Kᵀ ⊙ M⁻)
    y = tl.dot(tmat, e, input_precision=PREC)                          # Y = T Diag(β)(W Kᵀ ⊙ M⁻)
    _put_block(mats + 3 * TMS * 64, t0, y)
    # A_loc = (Q Kᵀ ⊙ M) − qw Y  and  Q̃ = Q − qw U with dQ̃ Uᵀ = (dQ̃ Wᵀ) Diag(β) Tᵀ
    dqw = -tl.dot(da, tl.trans(y), input_precision=PREC) \
        - tl.dot(dqw_t * beta[None, :], tl.trans(tmat), input_precision=PREC)
    _put_block(mats + TMS * 64, t0, tl.where(lower, dqw, 0.0))
    # K̂ = K − Yᵀ W
    dy = -tl.dot(tl.trans(qw), da, input_precision=PREC) - wdk
    # dU = −W M − qwᵀ dQ̃ (P_b = I − Wᵀ U, and Q̃), seen through W: dU Wᵀ
    duw = -gww - tl.dot(tl.trans(qw), dqw_t, input_precision=PREC)
    # U = T Diag(β) W and Y = T Diag(β) E: dT, and β's share (diag(W dUᵀ T) = column sums of duw ⊙ T)
    tdy = tl.dot(tl.trans(tmat), dy, input_precision=PREC)
    dbeta = tl.sum(duw * tmat, 0) + tl.sum(tl.where(below, wk, 0.0) * tdy, 1)
    _put_block(mats + 2 * TMS * 64, t0, tl.where(below, tdy * beta[:, None], 0.0))
    dt = duw * beta[None, :] + tl.dot(dy, tl.trans(e), input_precision=PREC)
    # T = (I + L)^{-1}: dL = −Tᵀ dT Tᵀ on L's support; L = Diag(β)(W Wᵀ ⊙ M⁻)
    dl = -tl.dot(tl.dot(tl.trans(tmat), dt, input_precision=PREC), tl.trans(tmat), input_precision=PREC)
    dl = tl.where(below, dl, 0.0)
    dbeta += tl.sum(ww * dl, 1)
    nb = dl * beta[:, None]
    _put_block(mats + 4 * TMS * 64, t0, nb + tl.trans(nb))
    tl.store(dbeta_ptr + i_b * T * H + i_h + r * H, dbeta.to(dbeta_ptr.dtype.element_ty), mask=r < T)


@triton.jit(do_not_specialize=["T", "H", "NTC", "TMS", "bh0"])
def _local_bwd_columns_kernel(q_ptr, k_ptr, w_ptr, beta_ptr, tm_ptr, dqt_ptr, dkh_ptr, gw_ptr, hu_ptr, daloc_ptr,
                              mats_ptr, dq_ptr, dk_ptr, dw_ptr, T, H, NTC, TMS, bh0,
                              K: tl.constexpr, KB: tl.constexpr, PREC: tl.constexpr):
    # Second half: one program per (block, batch·head, column block of KB): the 64×KB gradients
    # from the five matrices of the first half, T and dA_loc.
    i_t = tl.program_id(0)
    i_m = tl.program_id(1).to(tl.int64)   # this launch's head (launches of at most plan.local_scratch bytes)
    i_bh = bh0 + i_m
    i_c = tl.program_id(2)
    c0 = i_c * KB
    i_b = i_bh // H
    i_h = i_bh % H
    t0 = i_t * 64
    r = t0 + tl.arange(0, 64)
    row_base = (i_b * T * H + i_h) * K
    acc = i_bh * NTC * K
    mats = mats_ptr + i_m * 5 * TMS * 64
    beta = tl.load(beta_ptr + i_b * T * H + i_h + r * H, mask=r < T, other=0.0).to(tl.float32)
    da = _block_tile(daloc_ptr + i_bh * NTC * 64, t0, 64)
    q = _cols(q_ptr + row_base, t0, c0, T, H * K, KB)
    k = _cols(k_ptr + row_base, t0, c0, T, H * K, KB)
    w = _cols(w_ptr + row_base, t0, c0, T, H * K, KB)
    dqt = _cols(dqt_ptr + acc, t0, c0, NTC, K, KB)
    dkh = _cols(dkh_ptr + acc, t0, c0, NTC, K, KB)
    dqw = _block_tile(mats + TMS * 64, t0, 64)
    dq = dqt + tl.dot(da, k, input_precision=PREC) + tl.dot(dqw, w, input_precision=PREC)
    _store_cols(dq_ptr + row_base, dq, t0, c0, T, H * K, KB)
    de = _block_tile(mats + 2 * TMS * 64, t0, 64)
    dk = dkh + tl.dot(tl.trans(da), q, input_precision=PREC) + tl.dot(tl.trans(de), w, input_precision=PREC)
    _store_cols(dk_ptr + row_base, dk, t0, c0, T, H * K, KB)
    qw = _block_tile(mats, t0, 64)
    du = -_cols(gw_ptr + acc, t0, c0, NTC, K, KB) - tl.dot(tl.trans(qw), dqt, input_precision=PREC)
    tmat = _block_tile(tm_ptr + i_bh * TMS * 64, t0, 64)
    dw = -_cols(hu_ptr + acc, t0, c0, NTC, K, KB) \
        - tl.dot(_block_tile(mats + 3 * TMS * 64, t0, 64), dkh, input_precision=PREC) \
        + tl.dot(tl.trans(dqw), q, input_precision=PREC) \
        + beta[:, None] * tl.dot(tl.trans(tmat), du, input_precision=PREC) \
        + tl.dot(de, k, input_precision=PREC) \
        + tl.dot(_block_tile(mats + 4 * TMS * 64, t0, 64), w, input_precision=PREC)
    _store_cols(dw_ptr + row_base, dw, t0, c0, T, H * K, KB)


def local_columns(plan, K: int) -> int:
    """The per-block backward's key-column block: the plan's ``local_kb`` (default 64), never wider
    than ``K`` (a block of 32 columns at ``K = 16`` read and wrote the next head's columns: the A100
    plan's float32 gradients at ``K = 16`` were wrong, ``book/logs/gpu_class_80_20261129.log``)."""
    return min(plan.local_kb or 64, K)


def local_backward(q, k, w, beta, tm, dqt, dkh, gw, hu, daloc, plan, dw_dtype):
    """Stage 1's gradient: ``(dq, dk, dw, dbeta)`` in the dtypes of ``q, k``, ``dw_dtype`` and
    ``beta``'s from the float32 gradients of the prepared tensors (``[B·H, NT·64, ·]``)."""
    B, T, H, K = q.shape
    NT = triton.cdiv(T, CHUNK)
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    dw, dbeta = torch.empty_like(w, dtype=dw_dtype), torch.empty_like(beta)
    TMS = NT * CHUNK
    # five float32 64×64 matrices per block (qw, dqw, de, y, nsym) pass from the first kernel to the
    # second: 1,280 bytes a token and head, so the heads go in launches of at most plan.local_scratch
    # bytes (whole, they took the 2^31-element test past the H200's memory)
    per_head = 5 * TMS * CHUNK * 4
    step = max(1, min(B * H, plan.local_scratch // per_head))
    mats = torch.empty(step, 5, TMS, CHUNK, dtype=torch.float32, device=q.device)
    KB = local_columns(plan, K)
    meta = dict(K=K, KB=KB, PREC=plan.local_precision)
    for bh0 in range(0, B * H, step):
        n = min(step, B * H - bh0)
        launch(_local_bwd_matrices_kernel, (NT, n),
               (q, k, w, beta, tm, dqt, dkh, gw, daloc, mats, dbeta, T, H, dqt.shape[1], TMS, bh0), meta,
               plan.local_bwd)
        launch(_local_bwd_columns_kernel, (NT, n, triton.cdiv(K, KB)),
               (q, k, w, beta, tm, dqt, dkh, gw, hu, daloc, mats, dq, dk, dw, T, H, dqt.shape[1], TMS, bh0), meta,
               plan.local_bwd)
    return dq, dk, dw, dbeta
