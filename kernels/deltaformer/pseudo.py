"""Stage: the pseudo-values ``u = (I + Diag(β) P)^{-1} v``, chunk by chunk, and their adjoint.

``P`` is the strictly causal row softmax of the key-key scores, ``P_ij = exp2(c·k_i·k_j − lse_i)``
for ``j < i`` (``c = scale·log2 e``, ``lse_i`` the row's log-sum-exp in log2 units; the first row is
empty and its ``lse`` is stored as ``+inf``, so every ``p`` recomputed from it is 0). Row ``i`` of
``(I + Diag(β) P) u = v`` reads ``u_i = v_i − β_i r_i`` with ``r_i = Σ_{j<i} P_ij u_j``: a softmax
attention of ``k_i`` over the *earlier* keys with the *earlier* pseudo-values as values. So:

1. **fold** (:func:`_fold_earlier_kernel`, parallel): the online softmax of flash attention
   (:func:`kernels.flash.forward.online_softmax_step`) over every key before the current span,
   one program per 64 rows; it leaves ``(m, l, acc)`` per row;
2. **chunks** (:func:`_pseudo_values_kernel`, one program per (batch, head), serial over the
   span's 64-token chunks): finish the fold over the span's earlier chunks, add the chunk's own
   strictly-lower scores to the row statistics (now ``lse`` is final), split ``r`` into what the
   earlier chunks gave (``a``, known) and the chunk's own part, and solve the chunk's unit
   lower-triangular ``64 × 64`` system ``(I + Diag(β) P_cc) u_c = v_c − β a`` in registers with the
   shared 16×16-block inverse (:func:`kernels.common.solve.inv4_unit_lower16`,
   :func:`kernels.common.solve.merge_inverse16`).

The adjoint ``w = (I + Diag(β) P)^{-T} du`` runs the same way backwards in time: the rows *after*
the span contribute ``Σ_{i>t} β_i P_it w_i`` (a column sum with known ``lse``, like the dk/dv pass of
the flash backward: :func:`_fold_later_kernel`), then the span's chunks are solved last to first
with the transposed inverse (:func:`_adjoint_chunks_kernel`).

No ``T × T`` tensor exists: the folds stream keys past a 64-row block, the solve holds one
``64 × 64`` block (in a per-program scratch tile of global memory, read back in 16×16 blocks).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.solve import inv4_unit_lower16, merge_inverse16
from ..common.softmax import LOG2E, load_rows, online_softmax_step
from .plan import CHUNK, DeltaFormerPlan

__all__ = ["pseudo_values", "adjoint_values"]


# ----------------------------------------------------------------------------------------------
# shared pieces
# ----------------------------------------------------------------------------------------------

@triton.jit
def _load_fresh(base, o_r, stride, o_d, T):
    """Rows ``o_r`` of a float32 ``[T, D]`` slab this very program may have just written (read
    past the L1 cache, after a barrier); zeros past ``T``."""
    return tl.load(base + o_r[:, None] * stride + o_d[None, :], mask=(o_r < T)[:, None], other=0.0,
                   cache_modifier=".cg")


@triton.jit
def _fold_keys(acc, l_i, m_i, kq, k_base, u_base, sk, su, o_dk, o_dv, lo, hi, T, qk_scale,
               BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Flash attention's online softmax of the rows ``kq`` over the keys ``[lo, hi)`` (all earlier
    than every row, so unmasked) with the pseudo-values as values."""
    o_n0 = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        o_n = start + o_n0
        kk = load_rows(k_base, o_n, sk, o_dk, T, False)
        uu = tl.load(u_base + o_n[:, None] * su + o_dv[None, :], cache_modifier=".cg")
        s = tl.dot(kq, tl.trans(kk), input_precision=PRECISION)
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, uu, qk_scale, PRECISION)
    return acc, l_i, m_i


@triton.jit
def _fold_rows(acc, kt, k_base, lse_base, beta_base, w_base, sk, sb, sw, o_dk, o_dv, lo, hi, T,
               qk_scale, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """``acc += Σ_{i ∈ [lo, hi)} P_it β_i w_i`` for the columns ``kt`` (all earlier than every row
    ``i``, so unmasked; rows past ``T`` have ``lse = +inf``, hence ``p = 0``)."""
    o_i0 = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        o_i = start + o_i0
        ok = o_i < T
        ki = load_rows(k_base, o_i, sk, o_dk, T, True)
        lse = tl.load(lse_base + o_i, mask=ok, other=float("inf"))
        be = tl.load(beta_base + o_i * sb, mask=ok, other=0.0).to(tl.float32)
        wi = _load_fresh(w_base, o_i, sw, o_dv, T)
        s = tl.dot(ki, tl.trans(kt), input_precision=PRECISION)                   # [BN, BM]
        p = tl.math.exp2(s * qk_scale - lse[:, None])
        bw = be[:, None] * wi
        acc = tl.dot(tl.trans(p.to(kt.dtype)), bw.to(kt.dtype), acc, input_precision=PRECISION)
    return acc


@triton.jit
def _invert_chunk(ptr, OPREC: tl.constexpr):
    """In place: the ``[64, 64]`` float32 tile at ``ptr`` holding a strictly lower ``A`` becomes
    ``(I + A)^{-1}``, by the shared 16×16-block inverse (diagonal blocks read transposed)."""
    r = tl.arange(0, 16)
    rows = r[:, None] * 64
    cols = r[None, :]
    At0 = tl.load(ptr + r[None, :] * 64 + r[:, None], cache_modifier=".cg")
    At1 = tl.load(ptr + (16 + r[None, :]) * 64 + 16 + r[:, None], cache_modifier=".cg")
    At2 = tl.load(ptr + (32 + r[None, :]) * 64 + 32 + r[:, None], cache_modifier=".cg")
    At3 = tl.load(ptr + (48 + r[None, :]) * 64 + 48 + r[:, None], cache_modifier=".cg")
    A10 = tl.load(ptr + 16 * 64 + rows + cols, cache_modifier=".cg")
    A20 = tl.load(ptr + 32 * 64 + rows + cols, cache_modifier=".cg")
    A21 = tl.load(ptr + 32 * 64 + 16 + rows + cols, cache_modifier=".cg")
    A30 = tl.load(ptr + 48 * 64 + rows + cols, cache_modifier=".cg")
    A31 = tl.load(ptr + 48 * 64 + 16 + rows + cols, cache_modifier=".cg")
    A32 = tl.load(ptr + 48 * 64 + 32 + rows + cols, cache_modifier=".cg")
    T00, T11, T22, T33 = inv4_unit_lower16(At0, At1, At2, At3)
    T10, T20, T21, T30, T31, T32 = merge_inverse16(T00, T11, T22, T33, A10, A20, A21, A30, A31, A32, OPREC)
    tl.debug_barrier()                     # every read of A is done before T overwrites it
    z = tl.zeros([16, 16], dtype=tl.float32)
    tl.store(ptr + rows + cols, T00)
    tl.store(ptr + 16 + rows + cols, z)
    tl.store(ptr + 32 + rows + cols, z)
    tl.store(ptr + 48 + rows + cols, z)
    tl.store(ptr + 16 * 64 + rows + cols, T10)
    tl.store(ptr + 16 * 64 + 16 + rows + cols, T11)
    tl.store(ptr + 16 * 64 + 32 + rows + cols, z)
    tl.store(ptr + 16 * 64 + 48 + rows + cols, z)
    tl.store(ptr + 32 * 64 + rows + cols, T20)
    tl.store(ptr + 32 * 64 + 16 + rows + cols, T21)
    tl.store(ptr + 32 * 64 + 32 + rows + cols, T22)
    tl.store(ptr + 32 * 64 + 48 + rows + cols, z)
    tl.store(ptr + 48 * 64 + rows + cols, T30)
    tl.store(ptr + 48 * 64 + 16 + rows + cols, T31)
    tl.store(ptr + 48 * 64 + 32 + rows + cols, T32)
    tl.store(ptr + 48 * 64 + 48 + rows + cols, T33)


@triton.jit
def _chunk_inverse(scratch, A, OPREC: tl.constexpr):
    """``(I + A)^{-1}`` of a strictly lower ``[64, 64]`` tile ``A``, through the scratch tile."""
    r = tl.arange(0, 64)
    tile = scratch + r[:, None] * 64 + r[None, :]
    tl.store(tile, A)
    tl.debug_barrier()
    _invert_chunk(scratch, OPREC)
    tl.debug_barrier()
    return tl.load(tile, cache_modifier=".cg")


# ----------------------------------------------------------------------------------------------
# forward: u
# ----------------------------------------------------------------------------------------------

@triton.jit
def _fold_earlier_kernel(k_ptr, u_ptr, acc_ptr, m_ptr, l_ptr, T, H, c0, qk_scale,
                         DK: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         PRECISION: tl.constexpr):
    """Rows ``c0 + BLOCK_M·i_m ..``: the online softmax over keys ``[0, c0)``, left as ``(m, l, acc)``."""
    i_m = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_m = c0 + i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_dk = tl.arange(0, DK)
    o_dv = tl.arange(0, DV)
    k_base = k_ptr + i_b * T * H * DK + i_h * DK
    u_base = u_ptr + i_b * T * H * DV + i_h * DV
    kq = load_rows(k_base, o_m, H * DK, o_dk, T, True)
    acc = tl.zeros([BLOCK_M, DV], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    acc, l_i, m_i = _fold_keys(acc, l_i, m_i, kq, k_base, u_base, H * DK, H * DV, o_dk, o_dv, 0, c0, T,
                               qk_scale, BLOCK_N, PRECISION)
    ok = o_m < T
    tl.store(m_ptr + i_bh * T + o_m, m_i, mask=ok)
    tl.store(l_ptr + i_bh * T + o_m, l_i, mask=ok)
    tl.store(acc_ptr + i_b * T * H * DV + i_h * DV + o_m[:, None] * (H * DV) + o_dv[None, :], acc,
             mask=ok[:, None])


@triton.jit
def _pseudo_values_kernel(k_ptr, v_ptr, beta_ptr, u_ptr, r_ptr, lse_ptr, m_ptr, l_ptr, scratch_ptr,
                          T, H, c0, c1, qk_scale, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
                          BLOCK_N: tl.constexpr, HAS_PRE: tl.constexpr, PRECISION: tl.constexpr,
                          OPREC: tl.constexpr):
    """The chunks of the span ``[c0, c1)`` of one (batch, head), in order, for the value columns
    ``BV·i_v ..`` (``HAS_PRE``: the fold over ``[0, c0)`` left ``(m, l, acc)``; ``acc`` lies in
    ``r``). Every column block recomputes the same scores, row statistics and inverse: the
    columns of ``u`` are independent given those, and splitting them puts more SMs to work when
    there are few (batch, head) pairs."""
    i_bh = tl.program_id(0).to(tl.int64)
    i_v = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    o_dk = tl.arange(0, DK)
    o_dv = i_v * BV + tl.arange(0, BV)
    k_base = k_ptr + i_b * T * H * DK + i_h * DK
    v_base = v_ptr + i_b * T * H * DV + i_h * DV
    u_base = u_ptr + i_b * T * H * DV + i_h * DV
    r_base = r_ptr + i_b * T * H * DV + i_h * DV
    scratch = scratch_ptr + (i_bh * tl.num_programs(1) + i_v) * 4096
    for s0 in range(c0, c1, 64):
        o_m = s0 + tl.arange(0, 64)
        ok = o_m < T
        kq = load_rows(k_base, o_m, H * DK, o_dk, T, True)
        if HAS_PRE:
            m_i = tl.load(m_ptr + i_bh * T + o_m, mask=ok, other=float("-inf"))
            l_i = tl.load(l_ptr + i_bh * T + o_m, mask=ok, other=0.0)
            acc = tl.load(r_base + o_m[:, None] * (H * DV) + o_dv[None, :], mask=ok[:, None], other=0.0)
        else:
            acc = tl.zeros([64, BV], dtype=tl.float32)
            l_i = tl.zeros([64], dtype=tl.float32)
            m_i = tl.full([64], float("-inf"), dtype=tl.float32)
        # the span's earlier chunks (their u was written by this program)
        acc, l_i, m_i = _fold_keys(acc, l_i, m_i, kq, k_base, u_base, H * DK, H * DV, o_dk, o_dv, c0, s0, T,
                                   qk_scale, BLOCK_N, PRECISION)
        # the chunk's own strictly earlier keys complete the row statistics
        s = tl.dot(kq, tl.trans(kq), input_precision=PRECISION)
        s = tl.where(o_m[None, :] < o_m[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)        # the first row attends to nothing
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_new = l_i * alpha + tl.sum(p, 1)
        seen = l_new > 0
        inv_l = tl.where(seen, 1.0 / tl.where(seen, l_new, 1.0), 0.0)
        P = p * inv_l[:, None]                                        # the chunk's block of P
        a = acc * (alpha * inv_l)[:, None]                            # r_i from the earlier chunks
        lse = tl.where(seen, m_new + tl.math.log2(tl.where(seen, l_new, 1.0)), float("inf"))
        tl.store(lse_ptr + i_bh * T + o_m, lse, mask=ok)
        beta = tl.load(beta_ptr + (i_b * T + o_m) * H + i_h, mask=ok, other=0.0).to(tl.float32)
        v = load_rows(v_base, o_m, H * DV, o_dv, T, True).to(tl.float32)
        rhs = v - beta[:, None] * a
        # (I + Diag(β) P_cc) u_c = rhs, by the 16×16-block inverse
        Tm = _chunk_inverse(scratch, beta[:, None] * P, OPREC)
        u = tl.dot(Tm, rhs, input_precision=OPREC)
        tl.store(u_base + o_m[:, None] * (H * DV) + o_dv[None, :], u.to(u_ptr.dtype.element_ty),
                 mask=ok[:, None])
        r = a + tl.dot(P, u, input_precision=OPREC)
        tl.store(r_base + o_m[:, None] * (H * DV) + o_dv[None, :], r, mask=ok[:, None])
        tl.debug_barrier()                                            # u is read by the next chunk


def _precisions(dtype) -> tuple[str, str]:
    """Products of inputs (``PRECISION``: IEEE for float32, ignored for 16-bit) and of the solve's
    float32 tiles (``OPREC``: IEEE for float32, 3×TF32 otherwise, as the shared solve)."""
    f32 = dtype == torch.float32
    return ("ieee" if f32 else "tf32"), ("ieee" if f32 else "tf32x3")


def _split(DV: int, plan: DeltaFormerPlan) -> int:
    """Column blocks of the serial pass: the plan's, as far as blocks of at least 16 columns allow."""
    split = plan.chunk_split
    while split > 1 and DV // split < 16:
        split //= 2
    return split


def _spans(T: int, span: int):
    for c0 in range(0, T, span):
        yield c0, min(c0 + span, triton.cdiv(T, CHUNK) * CHUNK)


def pseudo_values(k, v, beta, scale: float, plan: DeltaFormerPlan):
    """``u`` (``v``'s dtype), ``r = P u`` (float32, what ``β``'s gradient needs) and ``lse`` (float32
    ``[B, H, T]``, log2 units, ``+inf`` on the first row) for ``k`` ``[B, T, H, K]`` and ``v``
    ``[B, T, H, V]`` (contiguous) and ``β`` ``[B, T, H]``."""
    B, T, H, DK = k.shape
    DV = v.shape[-1]
    u = torch.empty_like(v)
    r = torch.empty((B, T, H, DV), dtype=torch.float32, device=v.device)
    lse = torch.empty((B, H, T), dtype=torch.float32, device=v.device)
    m = torch.empty_like(lse) if plan.span < T else lse
    l_ = torch.empty_like(lse) if plan.span < T else lse
    split = _split(DV, plan)
    scratch = torch.empty((B * H * split, CHUNK, CHUNK), dtype=torch.float32, device=v.device)
    prec, oprec = _precisions(k.dtype)
    qk_scale = float(scale) * LOG2E
    fold = plan.fold
    for c0, c1 in _spans(T, plan.span):
        if c0 > 0:
            _fold_earlier_kernel[(triton.cdiv(c1 - c0, fold.m), B * H)](
                k, u, r, m, l_, T, H, c0, qk_scale, DK=DK, DV=DV, BLOCK_M=fold.m, BLOCK_N=fold.n, PRECISION=prec,
                num_warps=fold.warps, num_stages=fold.stages)
        _pseudo_values_kernel[(B * H, split)](
            k, v, beta, u, r, lse, m, l_, scratch, T, H, c0, c1, qk_scale, DK=DK, DV=DV, BV=DV // split,
            BLOCK_N=plan.chunk_n, HAS_PRE=c0 > 0, PRECISION=prec, OPREC=oprec, num_warps=plan.chunk_warps,
            num_stages=plan.chunk_stages)
    return u, r, lse


# ----------------------------------------------------------------------------------------------
# backward: w = (I + Diag(β) P)^{-T} du
# ----------------------------------------------------------------------------------------------

@triton.jit
def _fold_later_kernel(k_ptr, lse_ptr, beta_ptr, w_ptr, g_ptr, T, H, c0, c1, qk_scale,
                       DK: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       PRECISION: tl.constexpr):
    """Columns ``c0 + BLOCK_M·i_m ..``: ``Σ_{i ≥ c1} P_it β_i w_i`` into ``g``."""
    i_m = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_t = c0 + i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_dk = tl.arange(0, DK)
    o_dv = tl.arange(0, DV)
    k_base = k_ptr + i_b * T * H * DK + i_h * DK
    kt = load_rows(k_base, o_t, H * DK, o_dk, T, True)
    acc = tl.zeros([BLOCK_M, DV], dtype=tl.float32)
    acc = _fold_rows(acc, kt, k_base, lse_ptr + i_bh * T, beta_ptr + i_b * T * H + i_h,
                     w_ptr + i_b * T * H * DV + i_h * DV, H * DK, H, H * DV, o_dk, o_dv, c1, T, T, qk_scale,
                     BLOCK_N, PRECISION)
    tl.store(g_ptr + i_b * T * H * DV + i_h * DV + o_t[:, None] * (H * DV) + o_dv[None, :], acc,
             mask=(o_t < T)[:, None])


@triton.jit
def _adjoint_chunks_kernel(k_ptr, lse_ptr, beta_ptr, du_ptr, w_ptr, g_ptr, scratch_ptr, T, H, c0, c1, qk_scale,
                           DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, BLOCK_N: tl.constexpr,
                           HAS_POST: tl.constexpr, PRECISION: tl.constexpr, OPREC: tl.constexpr):
    """The chunks of the span ``[c0, c1)`` of one (batch, head), last to first, for the value
    columns ``BV·i_v ..`` (``HAS_POST``: the rows after the span left their contribution in
    ``g``)."""
    i_bh = tl.program_id(0).to(tl.int64)
    i_v = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    o_dk = tl.arange(0, DK)
    o_dv = i_v * BV + tl.arange(0, BV)
    k_base = k_ptr + i_b * T * H * DK + i_h * DK
    row_base = i_b * T * H * DV + i_h * DV
    lse_base = lse_ptr + i_bh * T
    beta_base = beta_ptr + i_b * T * H + i_h
    scratch = scratch_ptr + (i_bh * tl.num_programs(1) + i_v) * 4096
    n_chunks = (c1 - c0) // 64
    for idx in range(n_chunks):
        s0 = c1 - 64 - idx * 64
        o_t = s0 + tl.arange(0, 64)
        ok = o_t < T
        kt = load_rows(k_base, o_t, H * DK, o_dk, T, True)
        g = load_rows(du_ptr + row_base, o_t, H * DV, o_dv, T, True).to(tl.float32)
        if HAS_POST:
            g -= tl.load(g_ptr + row_base + o_t[:, None] * (H * DV) + o_dv[None, :], mask=ok[:, None],
                         other=0.0)
        later = tl.zeros([64, BV], dtype=tl.float32)
        later = _fold_rows(later, kt, k_base, lse_base, beta_base, w_ptr + row_base, H * DK, H, H * DV,
                           o_dk, o_dv, s0 + 64, c1, T, qk_scale, BLOCK_N, PRECISION)
        g -= later
        # the chunk's own block: A_ij = β_i P_ij for j < i, recomputed from the saved lse
        lse = tl.load(lse_base + o_t, mask=ok, other=float("inf"))
        beta = tl.load(beta_base + o_t * H, mask=ok, other=0.0).to(tl.float32)
        s = tl.dot(kt, tl.trans(kt), input_precision=PRECISION)
        P = tl.where(o_t[None, :] < o_t[:, None], tl.math.exp2(s * qk_scale - lse[:, None]), 0.0)
        Tm = _chunk_inverse(scratch, beta[:, None] * P, OPREC)
        w = tl.dot(tl.trans(Tm), g, input_precision=OPREC)              # (I + A)^{-T} g
        tl.store(w_ptr + row_base + o_t[:, None] * (H * DV) + o_dv[None, :], w, mask=ok[:, None])
        tl.debug_barrier()                                              # w is read by the earlier chunks


def adjoint_values(k, beta, lse, du, scale: float, plan: DeltaFormerPlan):
    """``w = (I + Diag(β) P)^{-T} du`` (float32 ``[B, T, H, V]``), the gradient of ``v``, from the
    forward's ``lse`` and the gradient ``du`` of the pseudo-values."""
    B, T, H, DK = k.shape
    DV = du.shape[-1]
    du = du if du.is_contiguous() else du.contiguous()
    w = torch.empty(du.shape, dtype=torch.float32, device=du.device)
    g = torch.empty_like(w) if plan.span < T else w
    split = _split(DV, plan)
    scratch = torch.empty((B * H * split, CHUNK, CHUNK), dtype=torch.float32, device=du.device)
    prec, oprec = _precisions(k.dtype)
    qk_scale = float(scale) * LOG2E
    later = plan.later
    for c0, c1 in reversed(list(_spans(T, plan.span))):
        has_post = c1 < T
        if has_post:
            _fold_later_kernel[(triton.cdiv(c1 - c0, later.m), B * H)](
                k, lse, beta, w, g, T, H, c0, c1, qk_scale, DK=DK, DV=DV, BLOCK_M=later.m, BLOCK_N=later.n,
                PRECISION=prec, num_warps=later.warps, num_stages=later.stages)
        _adjoint_chunks_kernel[(B * H, split)](
            k, lse, beta, du, w, g, scratch, T, H, c0, c1, qk_scale, DK=DK, DV=DV, BV=DV // split,
            BLOCK_N=plan.chunk_n, HAS_POST=has_post, PRECISION=prec, OPREC=oprec, num_warps=plan.chunk_warps,
            num_stages=plan.chunk_stages)
    return w
