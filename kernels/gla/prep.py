"""Stage: the vector gate's per-chunk preparation (``chunk_gla`` only), parallel over chunks.

Everything of a chunk that does not need the state, once per chunk and head: the gated queries
``qg = scale·q·e^{b}``, the gated keys ``kg = k·e^{b_C − b}``, the chunk decays ``b_C`` and the
intra-chunk scores ``scale·A`` of (K5). After it the forward march is the ungated one plus a decay
(``kernels/gla/march.py``). Every segmented sum of gates is a product ``M @ g`` with a 0/1 matrix
``M`` (``_gate_mm`` of ``kernels/gla/tiles.py``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.tiles import round_operand, round_store
from .tiles import _gate_mm

__all__ = ["prepare_vector_gate"]


@triton.jit
def _mul16(x, e, DT: tl.constexpr, EMU: tl.constexpr):
    """``x * e`` rounded to the operand dtype ``DT`` (x in its input dtype, e float32).

    Compiled with 16-bit ``DT``: one inline-PTX op per element (widen, multiply in float32, round to
    nearest), so that the compiler cannot hoist a float32 copy of ``x`` out of the caller's unrolled
    level loop (common-subexpression elimination of the widening did exactly that and doubled the
    registers that q and k hold). Same value as ``round_operand(x.to(float32) * e)``, which is what runs under
    the interpreter and for float32."""
    if EMU:
        return round_operand(x.to(tl.float32) * e, DT, EMU)
    elif DT == tl.bfloat16:
        return tl.inline_asm_elementwise(
            "{ .reg .f32 a; cvt.f32.bf16 a, $1; mul.rn.f32 a, a, $2; cvt.rn.bf16.f32 $0, a; }",
            "=h,h,f", [x, e], dtype=tl.bfloat16, is_pure=True, pack=1)
    elif DT == tl.float16:
        return tl.inline_asm_elementwise(
            "{ .reg .f32 a; cvt.f32.f16 a, $1; mul.rn.f32 a, a, $2; cvt.rn.f16.f32 $0, a; }",
            "=h,h,f", [x, e], dtype=tl.float16, is_pure=True, pack=1)
    else:
        return x.to(tl.float32) * e


@triton.jit
def _gla_level_mm(q, k, g, base, mask_t, ii, jj, HB: tl.constexpr, BT: tl.constexpr, K: tl.constexpr,
                  BK: tl.constexpr, DT: tl.constexpr, GT: tl.constexpr, PIECES: tl.constexpr, IP: tl.constexpr,
                  EMU: tl.constexpr):
    """One level of K5 (half-blocks of HB rows) by matrix products only (round 3). The level's
    exponent rows ``X = M g`` are ``b_i - E`` on the rows i of second halves (the gates from the half's
    start to i) and ``E - b_j`` on the rows j of first halves (the gates after j up to the half's end),
    both <= 0; one exponential ``e^X`` scales q and k alike, and the pair mask keeps the products of
    second-half queries with first-half keys of the same block (the other rows carry finite values
    that the mask drops). Returns the level's masked ``[BT, BT]`` scores (without the scale)."""
    sec = (ii & HB) != 0                                  # row i in the second half of its block
    Mx = ((ii ^ jj) < HB) & (sec == (jj <= ii))
    Al = tl.zeros([BT, BT], dtype=tl.float32)
    for kb in tl.static_range(K // BK):
        offs = base + (kb * BK + tl.arange(0, BK))[None, :]
        g_t = tl.load(g + offs, mask=mask_t[:, None], other=0.)
        if GT == tl.float32 and PIECES == 1:   # only the bfloat16 piece is live across the levels
            g_t = g_t.to(tl.bfloat16)
        e = tl.exp(_gate_mm(Mx, g_t, GT, PIECES, EMU))
        ql = _mul16(tl.load(q + offs, mask=mask_t[:, None], other=0.), e, DT, EMU)
        kl = _mul16(tl.load(k + offs, mask=mask_t[:, None], other=0.), e, DT, EMU)
        Al = tl.dot(ql, tl.trans(kl), Al, input_precision=IP)
    pair = ((ii ^ jj) < 2 * HB) & sec & ((jj & HB) == 0)
    return tl.where(pair, Al, 0.)


@triton.jit
def _gla_prep_kernel(q, k, g, qg, kg, dch, As, scale, T, NT,
                     H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                     PIECES: tl.constexpr, IP: tl.constexpr, EMU: tl.constexpr):
    """Vector gate, round 3: everything of a chunk that does not need the state, in parallel over
    chunks; grid (NT, B*H). Writes

    - ``qg = scale * q * e^{b}`` and ``kg = k * e^{b_C - b}`` (``[B, T, H, K]``, q's dtype: the
      operands the march would round to that dtype for the tensor cores anyway),
    - ``dch`` ``[B*H, NT, K]`` float32: the chunk's total log decay ``b_C``,
    - ``As`` ``[B*H, NT*BT, BT]``: the intra-chunk scores ``scale * A`` (K5).

    Every segmented sum of gates the chunk needs (the prefix sums b, the suffix sums b_C - b and the
    level exponents of K5: ``b_i - E`` for query rows, ``E - b_j`` for key rows) is one product
    ``M @ g`` with a 0/1 matrix M (:func:`_gate_mm`: exact up to float32 accumulation), no scans, no
    reshapes, no gathers. At each level the query and key exponents sit on disjoint rows, so ONE
    ``[BT, K]`` exponential serves both factors; rows of the wrong half carry finite garbage
    (every exponent is <= 0) that the level's pair mask removes. Exponentials per chunk: (2 + log2
    BT) x BT x K.
    """
    DT = k.dtype.element_ty
    GT = g.dtype.element_ty
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    o_t = tl.arange(0, BT)
    rows = i_t * BT + o_t
    mask_t = rows < T
    ii = o_t[:, None]
    jj = o_t[None, :]
    base = i_b * T * H * K + i_h * K + rows[:, None] * (H * K)
    A = tl.zeros([BT, BT], dtype=tl.float32)
    for kb in tl.static_range(K // BK):
        o_k = kb * BK + tl.arange(0, BK)
        offs = base + o_k[None, :]
        q_t = tl.load(q + offs, mask=mask_t[:, None], other=0.)
        k_t = tl.load(k + offs, mask=mask_t[:, None], other=0.)
        g_t = tl.load(g + offs, mask=mask_t[:, None], other=0.)
        tl.store(dch + (i_bh * NT + i_t).to(tl.int64) * K + o_k, tl.sum(g_t.to(tl.float32), axis=0))
        if GT == tl.float32 and PIECES == 1:   # as in the levels: only the bfloat16 piece stays live
            g_t = g_t.to(tl.bfloat16)
        # b = L g (inclusive prefix sums), b_C - b = U g (strict suffix sums, <= 0 and exact)
        b = _gate_mm(jj <= ii, g_t, GT, PIECES, EMU)
        tl.store(qg + offs, round_store(q_t.to(tl.float32) * (tl.exp(b) * scale), qg.dtype.element_ty, EMU),
                 mask=mask_t[:, None])
        bu = _gate_mm(jj > ii, g_t, GT, PIECES, EMU)
        tl.store(kg + offs, round_store(k_t.to(tl.float32) * tl.exp(bu), kg.dtype.element_ty, EMU), mask=mask_t[:, None])
        # the diagonal (exponent 0)
        A += tl.where(ii == jj, tl.dot(round_operand(q_t, DT, EMU), tl.trans(round_operand(k_t, DT, EMU)), input_precision=IP), 0.)
    # the levels of K5; K in slices of BK inside each level (fewer live registers: the level's
    # exponent tile is [BT, BK]; the slices are reloaded from L1/L2 or kept by the compiler)
    for LV in tl.static_range(8):              # BT <= 256: half-blocks of BT/2, ..., 1 rows
        if (BT >> (LV + 1)) > 0:
            A += _gla_level_mm(q, k, g, base, mask_t, ii, jj, BT >> (LV + 1), BT, K, BK, DT, GT, PIECES, IP, EMU)
    tl.store(As + (i_bh * NT + i_t).to(tl.int64) * BT * BT + ii * BT + jj, round_store(A * scale, As.dtype.element_ty, EMU))


def prepare_vector_gate(q, k, g, scale: float, plan):
    """``(qg, kg, dch, As)`` of every chunk: gated queries and keys (q's dtype, ``[B, T, H, K]``), the
    chunk decays ``b_C`` (float32 ``[B·H, NT, K]``) and the scores ``scale·A`` (q's dtype,
    ``[B·H, NT·BT, BT]``; the backward reads them too)."""
    B, T, H, K = q.shape
    qg, kg = torch.empty_like(q), torch.empty_like(k)
    dch = torch.empty(B * H, plan.NT, K, dtype=torch.float32, device=q.device)
    As = torch.empty(B * H, plan.NT * plan.BT, plan.BT, dtype=q.dtype, device=q.device)
    _gla_prep_kernel[(plan.NT, B * H)](q, k, g, qg, kg, dch, As, scale, T, plan.NT, H=H, K=K, BT=plan.BT,
                                       BK=plan.BK_p, PIECES=plan.gate_pieces, IP=plan.IP, EMU=plan.EMU,
                                       num_warps=plan.warps_p)
    return qg, kg, dch, As
