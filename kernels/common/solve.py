"""Stage: the per-chunk triangular solve ``T = (I + A)^{-1}``, every chunk in parallel.

``A_ij = β_i e^{b_i − b_j} k_i·k_j`` for ``j < i`` inside a chunk of 64 tokens (``b`` the
within-chunk cumulative log gate, from :func:`chunk_cumsum`). One program per (chunk, batch·head)
builds ``A`` in 16×16 blocks (the ten with ``I >= J``, from column blocks of the keys), inverts the
four unit lower-triangular diagonal blocks ``I + A_II`` by forward substitution in registers (row
by row, reading ``A_II`` transposed so that no step moves data between register layouts), merges
them into ``T`` by block substitution (``T_IJ = −T_II Σ_M A_IM T_MJ``, 3×TF32 products for 16-bit
inputs: near-IEEE at 0.77× the time of IEEE products) and writes ``T`` as a dense ``[64, 64]``
tile in the input dtype. One warp per chunk: the 16×16 tiles are replicated across warps, so more
warps only add reduction traffic. :func:`solve_chunks` is the public entry, called by the delta
family (``A`` from the keys) and PaTH (``w`` in the keys' place, no gate); DeltaFormer's pseudo-value
stage reuses the two jit steps, :func:`inv4_unit_lower16` and :func:`merge_inverse16`. A caller's
plan gives the solve's launch (``plan.solve``, a :class:`kernels.backend.Launch`) and its key
columns per step (``plan.solve_kc``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import launch

__all__ = ["CHUNK", "chunk_cumsum", "solve_chunks", "inv4_unit_lower16", "merge_inverse16"]

CHUNK = 64   #: tokens per chunk of the solve (the delta, PaTH and DeltaFormer families' chunk)


@triton.jit
def _rows16(ptr, r0, T, stride_t, D: tl.constexpr):
    """Load rows ``r0 .. r0+15`` (masked by ``T``) of a ``[T, D]`` view with row stride ``stride_t``."""
    r = r0 + tl.arange(0, 16)
    c = tl.arange(0, D)
    return tl.load(ptr + r[:, None] * stride_t + c[None, :], mask=(r < T)[:, None], other=0.0)


@triton.jit
def _vec16(ptr, r0, T, stride_t):
    r = r0 + tl.arange(0, 16)
    return tl.load(ptr + r * stride_t, mask=r < T, other=0.0).to(tl.float32)


@triton.jit
def _gram16(s, ba, bb, beta_a):
    """One 16×16 block of ``A_ij = β_i e^{b_i − b_j} k_i·k_j`` below the diagonal blocks (every
    exponent ≤ 0) from the block of dot products ``s = k_i·k_j``."""
    return s * tl.exp(ba[:, None] - bb[None, :]) * beta_a[:, None]


@triton.jit
def _gram16_diag_t(s, b, beta):
    """The transpose of a diagonal block of ``A`` (strictly lower, ``A_ij = β_i e^{b_i − b_j}
    k_i·k_j`` for ``j < i``), read off the
    symmetric block of dot products ``s = k_i·k_j`` without a transpose: ``Aᵀ[r, c] = A[c, r] =
    β_c e^{b_c − b_r} s_rc`` for ``c > r``."""
    r = tl.arange(0, 16)
    up = r[None, :] > r[:, None]
    d = b[None, :] - b[:, None]
    return tl.where(up, s * tl.exp(tl.where(up, d, 0.0)), 0.0) * beta[None, :]


@triton.jit
def inv4_unit_lower16(At0, At1, At2, At3):
    """``(I + A)^{-1}`` of four strictly lower-triangular 16×16 blocks by forward substitution,
    row by row, from their transposes: row ``i`` of ``A`` is column ``i`` of ``Aᵀ``, a vector
    along the rows, which is what ``Σ_j a_j T[j, :]`` broadcasts, so no step of the loop moves
    data between layouts (read from ``A`` itself, row ``i`` lies along the columns, and the
    round-5 loop converted two vectors per block and step; kernels/delta/HISTORY.md, round 6). The four
    independent solves share one loop so that their steps can overlap; a loop, not unrolled:
    far fewer live registers (ptxas, sm_90a)."""
    r = tl.arange(0, 16)
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    T0 = eye
    T1 = eye
    T2 = eye
    T3 = eye
    for i in range(1, 16):
        col = r[None, :] == i
        row = r[:, None] == i
        e = tl.where(r == i, 1.0, 0.0)
        a0 = tl.sum(tl.where(col, At0, 0.0), 1)          # row i of A, along the rows (index j)
        a1 = tl.sum(tl.where(col, At1, 0.0), 1)
        a2 = tl.sum(tl.where(col, At2, 0.0), 1)
        a3 = tl.sum(tl.where(col, At3, 0.0), 1)
        T0 = tl.where(row, (e - tl.sum(a0[:, None] * T0, 0))[None, :], T0)
        T1 = tl.where(row, (e - tl.sum(a1[:, None] * T1, 0))[None, :], T1)
        T2 = tl.where(row, (e - tl.sum(a2[:, None] * T2, 0))[None, :], T2)
        T3 = tl.where(row, (e - tl.sum(a3[:, None] * T3, 0))[None, :], T3)
    return T0, T1, T2, T3


@triton.jit
def merge_inverse16(T00, T11, T22, T33, A10, A20, A21, A30, A31, A32, OPREC: tl.constexpr):
    """The blocks below the diagonal of ``(I + A)^{-1}`` for a ``[64, 64]`` unit lower-triangular
    ``I + A`` held as 16×16 blocks, from the inverses ``T_II`` of its diagonal blocks and the six
    blocks ``A_IJ`` below them, by block substitution ``T_IJ = −T_II Σ_{J ≤ M < I} A_IM T_MJ``.
    Returns ``(T10, T20, T21, T30, T31, T32)``. Shared with every family that solves a chunk's
    triangular system in registers (DeltaFormer's pseudo-values)."""
    T10 = -tl.dot(T11, tl.dot(A10, T00, input_precision=OPREC), input_precision=OPREC)
    T21 = -tl.dot(T22, tl.dot(A21, T11, input_precision=OPREC), input_precision=OPREC)
    T20 = -tl.dot(T22, tl.dot(A20, T00, input_precision=OPREC) + tl.dot(A21, T10, input_precision=OPREC),
                  input_precision=OPREC)
    T32 = -tl.dot(T33, tl.dot(A32, T22, input_precision=OPREC), input_precision=OPREC)
    T31 = -tl.dot(T33, tl.dot(A31, T11, input_precision=OPREC) + tl.dot(A32, T21, input_precision=OPREC),
                  input_precision=OPREC)
    T30 = -tl.dot(T33, tl.dot(A30, T00, input_precision=OPREC) + tl.dot(A31, T10, input_precision=OPREC)
                  + tl.dot(A32, T20, input_precision=OPREC), input_precision=OPREC)
    return T10, T20, T21, T30, T31, T32


@triton.jit
def _key_rows4(kp, c0, t0, T, H, K: tl.constexpr, KC: tl.constexpr):
    """Columns ``c0 .. c0+KC`` of the chunk's keys at row ``t0``, as its four 16-row blocks."""
    return (_rows16(kp + c0, t0, T, H * K, KC), _rows16(kp + c0, t0 + 16, T, H * K, KC),
            _rows16(kp + c0, t0 + 32, T, H * K, KC), _rows16(kp + c0, t0 + 48, T, H * K, KC))


@triton.jit
def _gram10(kp, t0, T, H, K: tl.constexpr, KC: tl.constexpr, PREC: tl.constexpr):
    """The ten 16×16 blocks (``i ≥ j``) of ``K Kᵀ`` of the chunk at row ``t0`` (float32), over
    column blocks of ``KC`` keys: the four diagonal ones (``s00, s11, s22, s33``), then the six
    below them (``s10, s20, s21, s30, s31, s32``)."""
    s00 = tl.zeros([16, 16], dtype=tl.float32)
    s11 = tl.zeros([16, 16], dtype=tl.float32)
    s22 = tl.zeros([16, 16], dtype=tl.float32)
    s33 = tl.zeros([16, 16], dtype=tl.float32)
    s10 = tl.zeros([16, 16], dtype=tl.float32)
    s20 = tl.zeros([16, 16], dtype=tl.float32)
    s21 = tl.zeros([16, 16], dtype=tl.float32)
    s30 = tl.zeros([16, 16], dtype=tl.float32)
    s31 = tl.zeros([16, 16], dtype=tl.float32)
    s32 = tl.zeros([16, 16], dtype=tl.float32)
    for c0 in tl.static_range(0, K, KC):
        k0, k1, k2, k3 = _key_rows4(kp, c0, t0, T, H, K, KC)
        s00 += tl.dot(k0, tl.trans(k0), input_precision=PREC)
        s11 += tl.dot(k1, tl.trans(k1), input_precision=PREC)
        s22 += tl.dot(k2, tl.trans(k2), input_precision=PREC)
        s33 += tl.dot(k3, tl.trans(k3), input_precision=PREC)
        s10 += tl.dot(k1, tl.trans(k0), input_precision=PREC)
        s20 += tl.dot(k2, tl.trans(k0), input_precision=PREC)
        s21 += tl.dot(k2, tl.trans(k1), input_precision=PREC)
        s30 += tl.dot(k3, tl.trans(k0), input_precision=PREC)
        s31 += tl.dot(k3, tl.trans(k1), input_precision=PREC)
        s32 += tl.dot(k3, tl.trans(k2), input_precision=PREC)
    return s00, s11, s22, s33, s10, s20, s21, s30, s31, s32


@triton.jit(do_not_specialize=["T", "H", "NTC"])
def _gate_cumsum_kernel(g_ptr, b_ptr, beta_ptr, bt_ptr, T, H, NTC, HAS_G: tl.constexpr, BETA: tl.constexpr):
    """``b``: the within-chunk cumulative sum of the log gate ``g`` (``[B, T, H]``), float32,
    written as ``[B·H, NT·64]``; one chunk per program, zero gates past ``T`` (zeros throughout
    without a gate). ``BETA``: also ``β`` in the same float32 layout (zero past ``T``), for the
    inference march, which then streams it into shared memory with its other per-chunk tiles."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    rows = i_t * 64 + tl.arange(0, 64)
    if HAS_G:
        # summed in float64 and rounded once: harsh gates (log decays of −1000 and more) make the
        # exponent differences b_i − b_j cancel, so every float32 rounding of the running sum shows
        g = tl.load(g_ptr + (i_b * T + rows) * H + i_h, mask=rows < T, other=0.0).to(tl.float64)
        tl.store(b_ptr + i_bh * NTC + rows, tl.cumsum(g, 0).to(tl.float32))
    else:
        tl.store(b_ptr + i_bh * NTC + rows, tl.zeros([64], dtype=tl.float32))
    if BETA:
        beta = tl.load(beta_ptr + (i_b * T + rows) * H + i_h, mask=rows < T, other=0.0)
        tl.store(bt_ptr + i_bh * NTC + rows, beta.to(tl.float32))


@triton.jit(do_not_specialize=["T", "H", "NTC", "N0"])
def _solve_kernel(k_ptr, beta_ptr, b_ptr, t_ptr, T, H, NTC, N0,
                  K: tl.constexpr, KC: tl.constexpr, PREC: tl.constexpr, OPREC: tl.constexpr):
    """``T = (I + A)^{-1}`` of one chunk (chunk ``N0`` + the program's first index), written as a
    dense ``[64, 64]`` tile (zeros above the diagonal)."""
    i_t = tl.program_id(0) + N0
    i_bh = tl.program_id(1).to(tl.int64)     # 64-bit offsets: [B*H, NT, K, V] buffers get large
    i_b = i_bh // H
    i_h = i_bh % H
    t0 = i_t * 64
    kp = k_ptr + (i_b * T * H + i_h) * K
    btp = beta_ptr + i_b * T * H + i_h
    bp = b_ptr + i_bh * NTC
    be0 = _vec16(btp, t0, T, H)
    be1 = _vec16(btp, t0 + 16, T, H)
    be2 = _vec16(btp, t0 + 32, T, H)
    be3 = _vec16(btp, t0 + 48, T, H)
    g0 = _vec16(bp, t0, NTC, 1)
    g1 = _vec16(bp, t0 + 16, NTC, 1)
    g2 = _vec16(bp, t0 + 32, NTC, 1)
    g3 = _vec16(bp, t0 + 48, NTC, 1)
    # the ten 16×16 blocks (i >= j) of K Kᵀ, accumulated over column blocks of KC keys (fewer
    # live registers than holding the chunk's keys whole): the four diagonal ones, then the six
    # below them (forming those after the diagonal inverses spilled more and was 1.6–1.9× slower)
    s00, s11, s22, s33, s10, s20, s21, s30, s31, s32 = _gram10(kp, t0, T, H, K, KC, PREC)
    # T = (I + A)^{-1}: diagonal blocks by forward substitution (from their transposes), then
    # block substitution
    T00, T11, T22, T33 = inv4_unit_lower16(_gram16_diag_t(s00, g0, be0), _gram16_diag_t(s11, g1, be1),
                                            _gram16_diag_t(s22, g2, be2), _gram16_diag_t(s33, g3, be3))
    # A below the diagonal in 16×16 blocks
    A10 = _gram16(s10, g1, g0, be1)
    A20 = _gram16(s20, g2, g0, be2)
    A21 = _gram16(s21, g2, g1, be2)
    A30 = _gram16(s30, g3, g0, be3)
    A31 = _gram16(s31, g3, g1, be3)
    A32 = _gram16(s32, g3, g2, be3)
    T10, T20, T21, T30, T31, T32 = merge_inverse16(T00, T11, T22, T33, A10, A20, A21, A30, A31, A32, OPREC)
    # T as a dense [64, 64] tile per chunk, in the dtype that feeds the products (W, U and the backward)
    rr = tl.arange(0, 16)
    tp = t_ptr + (i_bh * NTC + t0) * 64 + rr[:, None] * 64 + rr[None, :]
    tt = t_ptr.dtype.element_ty
    z = tl.zeros([16, 16], dtype=tt)
    tl.store(tp, T00.to(tt))
    tl.store(tp + 16, z)
    tl.store(tp + 32, z)
    tl.store(tp + 48, z)
    tl.store(tp + 16 * 64, T10.to(tt))
    tl.store(tp + 16 * 64 + 16, T11.to(tt))
    tl.store(tp + 16 * 64 + 32, z)
    tl.store(tp + 16 * 64 + 48, z)
    tl.store(tp + 32 * 64, T20.to(tt))
    tl.store(tp + 32 * 64 + 16, T21.to(tt))
    tl.store(tp + 32 * 64 + 32, T22.to(tt))
    tl.store(tp + 32 * 64 + 48, z)
    tl.store(tp + 48 * 64, T30.to(tt))
    tl.store(tp + 48 * 64 + 16, T31.to(tt))
    tl.store(tp + 48 * 64 + 32, T32.to(tt))
    tl.store(tp + 48 * 64 + 48, T33.to(tt))


def chunk_cumsum(g, beta, B: int, T: int, H: int, NT: int, with_beta: bool = False):
    """Within-chunk cumulative log gate, float32, ``[B·H, NT·64]`` (zero gates past ``T``, zeros
    without a gate) and, ``with_beta``, ``β`` in the same float32 layout (else ``None``; the inference
    march streams it in with its other per-chunk tiles)."""
    b = torch.empty(B * H, NT * CHUNK, dtype=torch.float32, device=beta.device)
    bt = torch.empty_like(b) if with_beta else None
    _gate_cumsum_kernel[(NT, B * H)](g if g is not None else b, b, beta, bt if with_beta else b, T, H, NT * CHUNK,
                                     HAS_G=g is not None, BETA=with_beta, num_warps=1)
    return b, bt


def solve_chunks(k, b, beta, plan, tm=None, n0: int = 0, n1=None):
    """``T = (I + A)^{-1}`` of chunks ``n0 .. n1-1`` (all by default) into ``tm`` (allocated
    ``[B·H, NT·64, 64]`` in ``k``'s dtype when not given), for keys ``k`` ``[B, T, H, K]``, the
    within-chunk cumulative log gate ``b`` and ``β`` ``[B, T, H]``."""
    B, T, H, K = k.shape
    NT = triton.cdiv(T, CHUNK)
    NTC = NT * CHUNK
    n1 = NT if n1 is None else n1
    if tm is None:
        tm = torch.empty(B * H, NTC, CHUNK, dtype=k.dtype, device=k.device)
    f32 = k.dtype == torch.float32
    launch(_solve_kernel, (n1 - n0, B * H), (k, beta, b, tm, T, H, NTC, n0),
           dict(K=K, KC=plan.solve_kc, PREC="ieee" if f32 else "tf32", OPREC="ieee" if f32 else "tf32x3"),
           plan.solve)
    return tm
