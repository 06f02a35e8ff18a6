"""Triton kernels for chunkwise (gated) linear attention: ``chunk_linear_attn``, ``chunk_simple_gla``
and ``chunk_gla``, forward and backward.

Layout as in fla: ``q, k`` ``[B, T, H, K]``, ``v`` ``[B, T, H, V]``; log gates ``g`` ``[B, T, H]``
(scalar, ``GATE == 1``) or ``[B, T, H, K]`` (vector, ``GATE == 2``); no gate is ``GATE == 0``.
States are ``[K, V]`` per head (fla's orientation)::

    S_t = exp(g_t) S_{t-1} + k_t v_t^T,      o_t = scale * S_t^T q_t.

Inside a chunk of ``BT`` tokens, with ``b`` the chunk-local cumulative log gate (``b_i = g_1 + ... +
g_i``, ``b_C`` its value at the chunk's last token) and ``S`` the state entering the chunk::

    O     = (Q~ * e^{b}) S + (Q~ K^T * Gamma) V,        Gamma_ij = e^{b_i - b_j} (i >= j), 0 else
    S_new = e^{b_C} S + (K * e^{b_C - b})^T V                            (Q~ = scale * Q)

Only *differences* of cumulative log gates inside one chunk appear in exponents, and every exponent
is <= 0, so nothing overflows however harsh the gates are. For the vector gate the intra-chunk
score ``sum_d q_id k_jd e^{b_id - b_jd}`` is split into log2(BT) levels: level l pairs the second
half of every block of 2h rows (h = BT / 2^(l+1)) with its first half, and with E the cumulative gate
at the end of the first half, e^{b_i - b_j} = e^{b_i - E} e^{E - b_j} with both exponents <= 0 — one
matrix product per level (plus the diagonal, exponent 0). See :func:`_gla_level`.

Forward (no per-chunk states written to HBM): one program per (batch*head, V-block) marches over
the chunks with the state in registers, writing only ``o``. When batch*heads*V-blocks is too small
to fill the GPU, the sequence is cut into ``NS`` segments: (1) every segment's own contribution to
the state (from zero) and its total decay, in parallel; (2) a short sequential combine gives each
segment's entering state; (3) the fused forward runs per segment from that state.

Backward: (1) the per-chunk entering states ``h`` are recomputed (in parallel over segments, from
the segment entering states saved by the forward); (2) a reverse march gives ``dh`` (the gradient
w.r.t. the state leaving each chunk) and the initial state's gradient; (3) two kernels parallel over
chunks give ``dv`` and ``dq, dk`` plus the per-position gate terms ``q*dq - k*dk`` and every chunk's
gate carry ``<h_{c+1}, dh_c>`` (the sum of those terms over all later positions, final state
included); ``dg`` is the carry plus a suffix sum inside the chunk (:func:`_dg_kernel`).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._common import INTERPRET, next_pow2
from ._interp import apply_interpreter_fixes

__all__ = ["chunk_simple_gla_triton", "chunk_gla_triton", "SUPPORTED_HEAD_SIZES"]

SUPPORTED_HEAD_SIZES = (16, 32, 64, 128, 256)
_NUM_SMS_DEFAULT = 132

#: Overrides of the forward's launch parameters, for tuning sweeps only (``bench_gla --explore``):
#: keys ``"BV_f"`` (value columns per forward program, a power of two dividing V), ``"warps_f"``
#: (its num_warps), ``"stages_f"`` (its num_stages) and ``"split"`` (False: never split the sequence);
#: for the vector gate ``"gla_fwd"`` (``"new"``, the default since the round-3 H200 measurement:
#: :func:`_gla_prep_kernel` + the lean march; ``"old"``: round 2's score pre-pass + the march that
#: gates q and k itself), ``"warps_p"`` and
#: ``"BK_p"`` (the prep kernel's num_warps and K-slice). Empty by default; the tests set only ``gla_fwd``.
TUNE: dict = {}


if INTERPRET:
    apply_interpreter_fixes()


# ----------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------

@triton.jit
def _r16(x, DT: tl.constexpr, EMU: tl.constexpr):
    """Round ``x`` to the matmul operand dtype ``DT``.

    Compiled: a plain cast (the tensor cores take 16-bit operands). Under the interpreter
    (``EMU``) the value is rounded to ``DT`` *and kept in float32*, because the interpreter
    mis-computes 16-bit ``tl.dot``; bfloat16 is rounded to nearest-even by hand, because the
    interpreter's own float32 -> bfloat16 cast truncates (a biased rounding the GPU does not have).
    So the CPU tests see the same operand roundings as the GPU.
    """
    if EMU:
        if DT == tl.bfloat16:
            u = x.to(tl.float32).to(tl.uint32, bitcast=True)
            u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
            return u.to(tl.float32, bitcast=True)
        elif DT == tl.float16:
            return x.to(tl.float16).to(tl.float32)
        else:
            return x.to(tl.float32)
    else:
        return x.to(DT)


@triton.jit
def _st(x, ODT: tl.constexpr, EMU: tl.constexpr):
    """Cast ``x`` for a store into a tensor of dtype ``ODT`` (rounded to nearest under EMU too)."""
    return _r16(x, ODT, EMU).to(ODT)


@triton.jit
def _gla_level(b, o_i, LV: tl.constexpr, BT: tl.constexpr, K: tl.constexpr):
    """Level ``LV`` of the vector gate's intra-chunk scores (chunk of BT tokens, b ``[BT, K]`` the
    chunk-local cumulative log gate).

    Level LV pairs the rows i in the second half of a block of 2*HB rows (HB = BT >> (LV + 1)) with
    the rows j in its first half. With E the cumulative gate at the last row of the first half,
    e^{b_i - b_j} = e^{b_i - E} e^{E - b_j}, and both exponents are <= 0 (b is non-increasing), so
    the level's scores are one matrix product (q e^{b - E}) (k e^{E - b})^T. Returns the query
    exponent ``qe`` and key exponent ``ke`` ``[BT, K]`` (-inf on rows outside their half, so that
    those rows vanish) and the ``[BT, BT]`` mask of the level's pairs. Every pair i > j of the chunk
    belongs to exactly one level (the highest bit in which i and j differ).
    """
    HB: tl.constexpr = BT >> (LV + 1)
    NB: tl.constexpr = BT // (2 * HB)
    b4 = tl.reshape(b, [NB, 2, HB, K])
    i1 = tl.arange(0, 2)[None, :, None, None]
    i2 = tl.arange(0, HB)[None, None, :, None]
    E = tl.sum(tl.sum(tl.where((i1 == 0) & (i2 == HB - 1), b4, 0.), axis=2), axis=1)      # [NB, K]
    Er = tl.reshape(tl.broadcast_to(E[:, None, None, :], [NB, 2, HB, K]), [BT, K])
    second = ((o_i // HB) % 2) == 1
    qe = tl.where(second[:, None], b - Er, float("-inf"))
    ke = tl.where(second[:, None], float("-inf"), Er - b)
    pair = (second[:, None] & (((o_i // HB) % 2) == 0)[None, :]
            & ((o_i // (2 * HB))[:, None] == (o_i // (2 * HB))[None, :]))
    return qe, ke, pair


@triton.jit
def _gla_chunk_scores(q_t, k_t, b, BT: tl.constexpr, K: tl.constexpr, DT: tl.constexpr, EMU: tl.constexpr,
                      IP: tl.constexpr):
    """Vector gate, one chunk: A_ij = sum_d q_id k_jd e^{b_id - b_jd} for j <= i, else 0 (``[BT, BT]``
    float32; q_t, k_t ``[BT, K]`` in any float dtype (kept as given, to save registers), b ``[BT, K]``
    float32). The diagonal has exponent 0; the pairs i > j come in log2(BT) levels of one matrix
    product each (:func:`_gla_level`)."""
    o_i = tl.arange(0, BT)
    A = tl.where(o_i[:, None] == o_i[None, :],
                 tl.sum(q_t.to(tl.float32) * k_t.to(tl.float32), axis=1)[:, None], 0.)
    for LV in tl.static_range(8):          # BT <= 256: levels with half-blocks of BT/2, ..., 1 rows
        if (BT >> (LV + 1)) > 0:
            qe, ke, pair = _gla_level(b, o_i, LV, BT, K)
            ql = _r16(q_t.to(tl.float32) * tl.exp(qe), DT, EMU)
            kl = _r16(k_t.to(tl.float32) * tl.exp(ke), DT, EMU)
            A += tl.where(pair, tl.dot(ql, tl.trans(kl), input_precision=IP), 0.)
    return A


@triton.jit
def _gla_scores_kernel(q, k, g, As, scale, T, NT,
                       H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, IP: tl.constexpr,
                       EMU: tl.constexpr):
    """Vector gate: the intra-chunk scores scale * A (K5) of every chunk, in parallel; grid (NT, B*H).
    ``As`` ``[B*H, NT*BT, BT]`` in q's dtype (the forward march rounds A to it for the tensor cores
    anyway)."""
    DT = k.dtype.element_ty
    c = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    rows = c * BT + o_t
    mask_t = rows < T
    offs = i_b * T * H * K + i_h * K + rows[:, None] * (H * K) + o_k[None, :]
    q_t = tl.load(q + offs, mask=mask_t[:, None], other=0.)
    k_t = tl.load(k + offs, mask=mask_t[:, None], other=0.)
    b_t = tl.cumsum(tl.load(g + offs, mask=mask_t[:, None], other=0.).to(tl.float32), axis=0)
    A = _gla_chunk_scores(q_t, k_t, b_t, BT, K, DT, EMU, IP) * scale
    tl.store(As + (i_bh * NT + c).to(tl.int64) * BT * BT + o_t[:, None] * BT + o_t[None, :],
             _st(A, As.dtype.element_ty, EMU))


@triton.jit
def _mop(mask, GT: tl.constexpr, EMU: tl.constexpr):
    """A 0/1 matrix as a matmul operand of the gate's dtype ``GT`` (float32 under the interpreter):
    exact in every dtype, so ``_mop(M) @ g`` sums gates exactly up to float32 accumulation."""
    if EMU:
        return tl.where(mask, 1.0, 0.0)
    else:
        return tl.where(mask, 1.0, 0.0).to(GT)


@triton.jit
def _mul16(x, e, DT: tl.constexpr, EMU: tl.constexpr):
    """``x * e`` rounded to the operand dtype ``DT`` (x in its input dtype, e float32).

    Compiled with 16-bit ``DT``: one inline-PTX op per element (widen, multiply in float32, round to
    nearest), so that the compiler cannot hoist a float32 copy of ``x`` out of the caller's unrolled
    level loop (common-subexpression elimination of the widening did exactly that and doubled the
    registers that q and k hold). Same value as ``_r16(x.to(float32) * e)``, which is what runs under
    the interpreter and for float32."""
    if EMU:
        return _r16(x.to(tl.float32) * e, DT, EMU)
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
                  BK: tl.constexpr, DT: tl.constexpr, GT: tl.constexpr, IP: tl.constexpr, GIP: tl.constexpr,
                  EMU: tl.constexpr):
    """One level of K5 (half-blocks of HB rows) by matrix products only (round 3). The level's
    exponent rows ``X = M g`` are ``b_i - E`` on the rows i of second halves (the gates from the half's
    start to i) and ``E - b_j`` on the rows j of first halves (the gates after j up to the half's end),
    both <= 0; one exponential ``e^X`` scales q and k alike, and the pair mask keeps the products of
    second-half queries with first-half keys of the same block (the other rows carry finite values
    that the mask drops). Returns the level's masked ``[BT, BT]`` scores (without the scale)."""
    sec = (ii & HB) != 0                                  # row i in the second half of its block
    Mx = _mop(((ii ^ jj) < HB) & (sec == (jj <= ii)), GT, EMU)
    Al = tl.zeros([BT, BT], dtype=tl.float32)
    for kb in tl.static_range(K // BK):
        offs = base + (kb * BK + tl.arange(0, BK))[None, :]
        g_t = tl.load(g + offs, mask=mask_t[:, None], other=0.)
        e = tl.exp(tl.dot(Mx, g_t.to(tl.float32) if EMU else g_t, input_precision=GIP))
        ql = _mul16(tl.load(q + offs, mask=mask_t[:, None], other=0.), e, DT, EMU)
        kl = _mul16(tl.load(k + offs, mask=mask_t[:, None], other=0.), e, DT, EMU)
        Al = tl.dot(ql, tl.trans(kl), Al, input_precision=IP)
    pair = ((ii ^ jj) < 2 * HB) & sec & ((jj & HB) == 0)
    return tl.where(pair, Al, 0.)


@triton.jit
def _gla_prep_kernel(q, k, g, qg, kg, dch, As, scale, T, NT,
                     H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                     IP: tl.constexpr, GIP: tl.constexpr, EMU: tl.constexpr):
    """Vector gate, round 3: everything of a chunk that does not need the state, in parallel over
    chunks; grid (NT, B*H). Writes

    - ``qg = scale * q * e^{b}`` and ``kg = k * e^{b_C - b}`` (``[B, T, H, K]``, q's dtype: the
      operands the march would round to that dtype for the tensor cores anyway),
    - ``dch`` ``[B*H, NT, K]`` float32: the chunk's total log decay ``b_C``,
    - ``As`` ``[B*H, NT*BT, BT]``: the intra-chunk scores ``scale * A`` (K5).

    Every segmented sum of gates the chunk needs (the prefix sums b, the suffix sums b_C - b and the
    level exponents of K5: ``b_i - E`` for query rows, ``E - b_j`` for key rows) is one product
    ``M @ g`` with a 0/1 matrix M: exact for 16-bit gates (float32 accumulation), no scans, no
    reshapes, no gathers. At each level the query and key exponents sit on disjoint rows, so ONE
    ``[BT, K]`` exponential serves both factors; rows of the wrong half carry finite garbage
    (every exponent is <= 0) that the level's pair mask removes. Exponentials per chunk: (2 + log2
    BT) x BT x K.
    """
    DT = k.dtype.element_ty
    GT = g.dtype.element_ty
    c = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    o_t = tl.arange(0, BT)
    rows = c * BT + o_t
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
        gm = g_t.to(tl.float32) if EMU else g_t
        tl.store(dch + (i_bh * NT + c).to(tl.int64) * K + o_k, tl.sum(g_t.to(tl.float32), axis=0))
        # b = L g (inclusive prefix sums), b_C - b = U g (strict suffix sums, <= 0 and exact)
        b = tl.dot(_mop(jj <= ii, GT, EMU), gm, input_precision=GIP)
        tl.store(qg + offs, _st(q_t.to(tl.float32) * (tl.exp(b) * scale), qg.dtype.element_ty, EMU),
                 mask=mask_t[:, None])
        bu = tl.dot(_mop(jj > ii, GT, EMU), gm, input_precision=GIP)
        tl.store(kg + offs, _st(k_t.to(tl.float32) * tl.exp(bu), kg.dtype.element_ty, EMU), mask=mask_t[:, None])
        # the diagonal (exponent 0)
        A += tl.where(ii == jj, tl.dot(_r16(q_t, DT, EMU), tl.trans(_r16(k_t, DT, EMU)), input_precision=IP), 0.)
    # the levels of K5; K in slices of BK inside each level (fewer live registers: the level's
    # exponent tile is [BT, BK]; the slices are reloaded from L1/L2 or kept by the compiler)
    for LV in tl.static_range(8):              # BT <= 256: half-blocks of BT/2, ..., 1 rows
        if (BT >> (LV + 1)) > 0:
            A += _gla_level_mm(q, k, g, base, mask_t, ii, jj, BT >> (LV + 1), BT, K, BK, DT, GT, IP, GIP, EMU)
    tl.store(As + (i_bh * NT + c).to(tl.int64) * BT * BT + ii * BT + jj, _st(A * scale, As.dtype.element_ty, EMU))


@triton.jit
def _fwd_kernel(q, k, v, g, o, h0, ht, dec, hs, As, scale, T, NT, SEG_CHUNKS, NS,
                H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                GATE: tl.constexpr, HAS_H0: tl.constexpr, COMPUTE_O: tl.constexpr,
                STORE_FINAL: tl.constexpr, STORE_DEC: tl.constexpr, STORE_H: tl.constexpr,
                IP: tl.constexpr, EMU: tl.constexpr, PRE: tl.constexpr = False):
    """March over the chunks of one segment with the state ``S[BK, BV]`` in registers.

    ``PRE`` (vector gate, round 3): the inputs are the outputs of :func:`_gla_prep_kernel`:
    ``q`` = scale * q e^{b}, ``k`` = k e^{b_C - b}, ``g`` = the per-chunk decays ``[B*H, NT, K]``
    (fp32), ``As`` the scores; the march is then the ungated one plus ``S *= e^{b_C}`` per chunk.

    grid = (NK * NV, B*H*NS). ``h0``/``ht``: per-(bh, segment) entering/leaving states
    ``[B*H*NS, K, V]`` fp32; ``dec``: per-(bh, segment) total log decay (``[B*H*NS, K]``);
    ``hs``: per-chunk entering states ``[B*H, NT, K, V]`` fp32. ``COMPUTE_O`` needs ``BK == K``.
    ``As``: vector gate only, the intra-chunk scores (times the scale) ``[B*H, NT*BT, BT]`` written by
    :func:`_gla_scores_kernel`.
    """
    DT = k.dtype.element_ty
    i_kv = tl.program_id(0)
    i_bhs = tl.program_id(1)
    NV: tl.constexpr = V // BV
    i_k = i_kv // NV
    i_v = i_kv % NV
    i_bh = i_bhs // NS
    i_s = i_bhs % NS
    i_b = i_bh // H
    i_h = i_bh % H

    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, BT)
    qk_base = i_b * T * H * K + i_h * K
    v_base = i_b * T * H * V + i_h * V
    g_base = i_b * T * H + i_h if GATE == 1 else qk_base

    S = tl.zeros([BK, BV], dtype=tl.float32)
    st_offs = o_k[:, None] * V + o_v[None, :]
    if HAS_H0:
        S += tl.load(h0 + i_bhs * K * V + st_offs)
    if GATE == 2:
        total = tl.zeros([BK], dtype=tl.float32)
    else:
        total = tl.zeros([1], dtype=tl.float32)

    # The last segment may be shorter: its chunks past NT load nothing (masked: k = v = 0, g = 0),
    # which leaves S unchanged, and store nothing. (Loop bounds are host integers, not derived
    # from program ids, so the interpreter and the compiler treat them alike.)
    if GATE == 1:
        # the scalar gate is loaded one chunk ahead: Triton's pipeliner only prefetches loads that
        # feed a tl.dot, and a plain load inside the loop exposes one memory latency per chunk
        # (round 1: the scalar-gated forward took about twice the ungated one)
        rows0 = i_s * SEG_CHUNKS * BT + o_t
        g_next = tl.load(g + g_base + rows0 * H, mask=rows0 < T, other=0.)
    if GATE == 2:
        if PRE:   # the chunk decays, loaded one chunk ahead (as the scalar gate)
            c0 = i_s * SEG_CHUNKS
            d_next = tl.load(g + (i_bh * NT + c0).to(tl.int64) * K + o_k, mask=(c0 < NT) & (o_k >= 0), other=0.)
    for j in tl.range(0, SEG_CHUNKS):
        c = i_s * SEG_CHUNKS + j
        rows = c * BT + o_t
        mask_t = rows < T
        if STORE_H:
            tl.store(hs + (i_bh * NT + c).to(tl.int64) * K * V + st_offs, _st(S, hs.dtype.element_ty, EMU),
                     mask=(c < NT) & (st_offs >= 0))
        k_t = tl.load(k + qk_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None], other=0.)
        v_t = tl.load(v + v_base + rows[:, None] * (H * V) + o_v[None, :], mask=mask_t[:, None], other=0.)
        if GATE == 1:
            g_t = g_next.to(tl.float32)
            rows_n = rows + BT
            g_next = tl.load(g + g_base + rows_n * H, mask=rows_n < T, other=0.)
            b_t = tl.cumsum(g_t, axis=0)
            b_c = tl.sum(g_t, axis=0)
        if GATE == 2:
            if PRE:
                b_c = d_next
                cn = c + 1
                d_next = tl.load(g + (i_bh * NT + cn).to(tl.int64) * K + o_k, mask=(cn < NT) & (o_k >= 0),
                                 other=0.)
            else:
                g_t = tl.load(g + g_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None],
                              other=0.).to(tl.float32)
                b_t = tl.cumsum(g_t, axis=0)
                b_c = tl.sum(g_t, axis=0)
        if COMPUTE_O:
            if GATE == 2 and PRE:
                q_t = tl.load(q + qk_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None],
                              other=0.)
                o_c = tl.dot(_r16(q_t, DT, EMU), _r16(S, DT, EMU), input_precision=IP)
                A = tl.load(As + (i_bh * NT + c).to(tl.int64) * BT * BT + o_t[:, None] * BT + o_t[None, :],
                            mask=(c < NT) & (o_t[:, None] >= 0), other=0.)
            elif GATE == 2:
                q_t = tl.load(q + qk_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None],
                              other=0.)
                o_c = tl.dot(_r16((q_t.to(tl.float32) * tl.exp(b_t)), DT, EMU), _r16(S, DT, EMU),
                             input_precision=IP) * scale
                # the scores come from a parallel pre-pass (keeps this march's registers for the state)
                A = tl.load(As + (i_bh * NT + c).to(tl.int64) * BT * BT + o_t[:, None] * BT + o_t[None, :],
                            mask=(c < NT) & (o_t[:, None] >= 0), other=0.)
            else:
                # q goes to the tensor cores as loaded (so its load is pipelined); the scale and
                # the scalar decays act on the float32 results
                q_t = tl.load(q + qk_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None],
                              other=0.)
                o_c = tl.dot(_r16(q_t, DT, EMU), _r16(S, DT, EMU), input_precision=IP)       # [BT, BV]
                A = tl.dot(_r16(q_t, DT, EMU), tl.trans(_r16(k_t, DT, EMU)), input_precision=IP)   # [BT, BT]
                causal = o_t[:, None] >= o_t[None, :]
                if GATE == 1:
                    o_c = o_c * (scale * tl.exp(b_t))[:, None]
                    A = A * (scale * tl.exp(tl.where(causal, b_t[:, None] - b_t[None, :], float("-inf"))))
                else:
                    o_c = o_c * scale
                    A = tl.where(causal, A * scale, 0.)
            o_c += tl.dot(_r16(A, DT, EMU), _r16(v_t, DT, EMU), input_precision=IP)
            tl.store(o + v_base + rows[:, None] * (H * V) + o_v[None, :], _st(o_c, o.dtype.element_ty, EMU),
                     mask=mask_t[:, None])
        # state update: S <- e^{b_C} S + (K * e^{b_C - b})^T V
        if GATE == 0:
            S += tl.dot(tl.trans(_r16(k_t, DT, EMU)), _r16(v_t, DT, EMU), input_precision=IP)
        if GATE == 1:
            # the per-token decay e^{b_C - b_j} scales row j of V (64 columns) rather than of K (so
            # k goes to the tensor cores as loaded)
            vg = _r16((v_t.to(tl.float32) * tl.exp(b_c - b_t)[:, None]), DT, EMU)
            S = S * tl.exp(b_c) + tl.dot(tl.trans(_r16(k_t, DT, EMU)), vg, input_precision=IP)
            total += b_c
        if GATE == 2:
            if PRE:
                S = S * tl.exp(b_c)[:, None] + tl.dot(tl.trans(_r16(k_t, DT, EMU)), _r16(v_t, DT, EMU),
                                                      input_precision=IP)
            else:
                kg = _r16((k_t.to(tl.float32) * tl.exp(b_c[None, :] - b_t)), DT, EMU)
                S = S * tl.exp(b_c)[:, None] + tl.dot(tl.trans(kg), _r16(v_t, DT, EMU), input_precision=IP)
            total += b_c
    if STORE_FINAL:
        tl.store(ht + i_bhs * K * V + st_offs, S)
    if STORE_DEC:
        if GATE == 2:
            if i_v == 0:
                tl.store(dec + i_bhs * K + o_k, total)
        if GATE == 1:
            if i_kv == 0:
                tl.store(dec + i_bhs + tl.arange(0, 1), total)


@triton.jit
def _combine_kernel(contrib, dec, h0, inits, ht, NS,
                    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                    GATE: tl.constexpr, HAS_H0: tl.constexpr, STORE_FINAL: tl.constexpr,
                    REVERSE: tl.constexpr):
    """Sequential pass over segments: entering state of segment s+1 = e^{dec_s} S_s + contrib_s.

    ``REVERSE`` runs the same recursion from the last segment to the first (for state gradients:
    the gradient entering segment s from the right is e^{dec_s} dS + contrib_s).
    """
    i_kv = tl.program_id(0)
    i_bh = tl.program_id(1)
    NV: tl.constexpr = V // BV
    i_k = i_kv // NV
    i_v = i_kv % NV
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    st_offs = o_k[:, None] * V + o_v[None, :]
    S = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_H0:
        S += tl.load(h0 + i_bh * K * V + st_offs)
    for ss in tl.range(0, NS):
        if REVERSE:
            idx = i_bh * NS + (NS - 1 - ss)
        else:
            idx = i_bh * NS + ss
        tl.store(inits + idx * K * V + st_offs, S)
        if GATE == 1:
            d = tl.load(dec + idx + tl.arange(0, 1))
            S = S * tl.exp(d)[:, None]
        if GATE == 2:
            d = tl.load(dec + idx * K + o_k)
            S = S * tl.exp(d)[:, None]
        S += tl.load(contrib + idx * K * V + st_offs)
    if STORE_FINAL:
        tl.store(ht + i_bh * K * V + st_offs, S)


@triton.jit
def _bwd_dh_kernel(q, g, do, dinit, dhs, dout, scale, T, NT, SEG_CHUNKS, NS,
                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                   BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                   GATE: tl.constexpr, HAS_INIT: tl.constexpr, STORE_DH: tl.constexpr, STORE_OUT: tl.constexpr,
                   IP: tl.constexpr, EMU: tl.constexpr):
    """Reverse march over the chunks of one segment: dhs[c] = dL/d(state leaving chunk c);
    dS_enter = e^{b_C} dS + (Q~ e^{b})^T dO. grid (NK * NV, B*H*NS).

    ``dinit``: per-(bh, segment) gradient w.r.t. the state leaving the segment ``[B*H*NS, K, V]``;
    ``dout``: the gradient w.r.t. the state entering it (the segment's contribution when started
    from zero; the initial state's gradient when NS = 1).
    """
    DT = q.dtype.element_ty
    i_kv = tl.program_id(0)
    i_bhs = tl.program_id(1)
    NV: tl.constexpr = V // BV
    i_k = i_kv // NV
    i_v = i_kv % NV
    i_bh = i_bhs // NS
    i_s = i_bhs % NS
    i_b = i_bh // H
    i_h = i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, BT)
    qk_base = i_b * T * H * K + i_h * K
    v_base = i_b * T * H * V + i_h * V
    g_base = i_b * T * H + i_h if GATE == 1 else qk_base
    st_offs = o_k[:, None] * V + o_v[None, :]
    dS = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_INIT:
        dS += tl.load(dinit + i_bhs * K * V + st_offs)
    # chunks past NT (in the last segment) load nothing and leave dS unchanged
    if GATE == 1:   # prefetched one chunk ahead, as in _fwd_kernel
        rows0 = (i_s * SEG_CHUNKS + SEG_CHUNKS - 1) * BT + o_t
        g_next = tl.load(g + g_base + rows0 * H, mask=rows0 < T, other=0.)
    for j in tl.range(0, SEG_CHUNKS):
        c = i_s * SEG_CHUNKS + SEG_CHUNKS - 1 - j
        if STORE_DH:
            tl.store(dhs + (i_bh * NT + c).to(tl.int64) * K * V + st_offs, _st(dS, dhs.dtype.element_ty, EMU),
                     mask=(c < NT) & (st_offs >= 0))
        rows = c * BT + o_t
        mask_t = rows < T
        do_t = tl.load(do + v_base + rows[:, None] * (H * V) + o_v[None, :], mask=mask_t[:, None], other=0.)
        if GATE == 0:
            q_t = tl.load(q + qk_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None], other=0.)
            dS += tl.dot(tl.trans(_r16(q_t, DT, EMU)), _r16(do_t, DT, EMU), input_precision=IP) * scale
        if GATE == 1:
            q_t = tl.load(q + qk_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None], other=0.)
            g_t = g_next.to(tl.float32)
            rows_n = rows - BT
            g_next = tl.load(g + g_base + rows_n * H, mask=(rows_n >= 0) & (rows_n < T), other=0.)
            b_t = tl.cumsum(g_t, axis=0)
            b_c = tl.sum(g_t, axis=0)
            # the decays e^{b_i} (and the scale) act on the rows of dO, so q goes to the tensor cores as loaded
            dog = _r16((do_t.to(tl.float32) * (scale * tl.exp(b_t))[:, None]), DT, EMU)
            dS = dS * tl.exp(b_c) + tl.dot(tl.trans(_r16(q_t, DT, EMU)), dog, input_precision=IP)
        if GATE == 2:
            q_t = tl.load(q + qk_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None],
                          other=0.).to(tl.float32) * scale
            g_t = tl.load(g + g_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None],
                          other=0.).to(tl.float32)
            b_t = tl.cumsum(g_t, axis=0)
            b_c = tl.sum(g_t, axis=0)
            qg = _r16((q_t * tl.exp(b_t)), DT, EMU)
            dS = dS * tl.exp(b_c)[:, None] + tl.dot(tl.trans(qg), _r16(do_t, DT, EMU), input_precision=IP)
    if STORE_OUT:
        tl.store(dout + i_bhs * K * V + st_offs, dS)


@triton.jit
def _bwd_dv_kernel(q, k, g, do, dhs, dv, As, scale, T, NT,
                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                   BT: tl.constexpr, BV: tl.constexpr,
                   GATE: tl.constexpr, IP: tl.constexpr, EMU: tl.constexpr):
    """dV = A^T dO + (K * e^{b_C - b}) dh, one chunk and V-block per program; grid (NV, NT, B*H).

    For the vector gate (``GATE == 2``) A is read from the forward's score pre-pass ``As``
    (:func:`_gla_scores_kernel`, scale included).
    """
    DT = k.dtype.element_ty
    i_v = tl.program_id(0)
    c = tl.program_id(1)
    i_bh = tl.program_id(2)
    i_b = i_bh // H
    i_h = i_bh % H
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, BT)
    rows = c * BT + o_t
    mask_t = rows < T
    qk_base = i_b * T * H * K + i_h * K
    v_base = i_b * T * H * V + i_h * V
    g_base = i_b * T * H + i_h if GATE == 1 else qk_base
    k_t = tl.load(k + qk_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None], other=0.)
    do_t = tl.load(do + v_base + rows[:, None] * (H * V) + o_v[None, :], mask=mask_t[:, None], other=0.)
    dh = tl.load(dhs + (i_bh * NT + c).to(tl.int64) * K * V + o_k[:, None] * V + o_v[None, :])
    q_t = tl.load(q + qk_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None],
                  other=0.).to(tl.float32) * scale
    causal = o_t[:, None] >= o_t[None, :]
    if GATE == 2:
        g_t = tl.load(g + g_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None],
                      other=0.).to(tl.float32)
        b_t = tl.cumsum(g_t, axis=0)
        b_c = tl.sum(g_t, axis=0)
        A = tl.load(As + (i_bh * NT + c).to(tl.int64) * BT * BT + o_t[:, None] * BT + o_t[None, :])
        kg = _r16((k_t.to(tl.float32) * tl.exp(b_c[None, :] - b_t)), DT, EMU)
    elif GATE == 1:
        A = tl.dot(_r16(q_t, DT, EMU), tl.trans(_r16(k_t, DT, EMU)), input_precision=IP)
        g_t = tl.load(g + g_base + rows * H, mask=mask_t, other=0.).to(tl.float32)
        b_t = tl.cumsum(g_t, axis=0)
        b_c = tl.sum(g_t, axis=0)
        A = A * tl.exp(tl.where(causal, b_t[:, None] - b_t[None, :], float("-inf")))
        kg = _r16((k_t.to(tl.float32) * tl.exp(b_c - b_t)[:, None]), DT, EMU)
    else:
        A = tl.dot(_r16(q_t, DT, EMU), tl.trans(_r16(k_t, DT, EMU)), input_precision=IP)
        A = tl.where(causal, A, 0.)
        kg = _r16(k_t, DT, EMU)
    dv_c = tl.dot(tl.trans(_r16(A, DT, EMU)), _r16(do_t, DT, EMU), input_precision=IP)
    dv_c += tl.dot(kg, _r16(dh, DT, EMU), input_precision=IP)
    tl.store(dv + v_base + rows[:, None] * (H * V) + o_v[None, :], _st(dv_c, dv.dtype.element_ty, EMU),
             mask=mask_t[:, None])


@triton.jit
def _bwd_dqdk_kernel(q, k, v, g, do, hs, dhs, dq, dk, dgl, cpart, scale, B, T, NT,
                     H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     GATE: tl.constexpr, IP: tl.constexpr, EMU: tl.constexpr):
    """dQ, dK and the gate terms q*dq - k*dk for one chunk and K-block; grid (NK, NT, B*H).

    dQ~ = (dO h^T) e^{b} + (dP * Gamma) K,    dK = (V dh^T) e^{b_C - b} + (dP * Gamma)^T Q~,
    with dP = dO V^T. For the vector gate (``GATE == 2``) Gamma is per key channel and the intra-chunk
    terms go level by level (:func:`_gla_level`); ``dgl`` and ``cpart`` are then per channel,
    ``[B, T, H, K]`` and ``[1, B, NT, H, K]``.
    ``dgl``: fp32 ``[NK, B, T, H]`` partial sums over this K-block of q*dq - k*dk (scalar gate);
    ``cpart``: fp32 ``[NK, B, NT, H]`` this K-block's part of the chunk's gate carry
    ``<h_{c+1}, dh_c> = e^{b_C} <h_c, dh_c> + sum_j k_j . (V dh_c^T)_j e^{b_C - b_j}`` (see _dg_kernel).
    """
    DT = k.dtype.element_ty
    i_k = tl.program_id(0)
    c = tl.program_id(1)
    i_bh = tl.program_id(2)
    i_b = i_bh // H
    i_h = i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    o_t = tl.arange(0, BT)
    rows = c * BT + o_t
    mask_t = rows < T
    qk_base = i_b * T * H * K + i_h * K
    v_base = i_b * T * H * V + i_h * V
    st_base = (i_bh * NT + c).to(tl.int64) * K * V
    dP = tl.zeros([BT, BT], dtype=tl.float32)
    dq_i = tl.zeros([BT, BK], dtype=tl.float32)
    dk_i = tl.zeros([BT, BK], dtype=tl.float32)
    hdh = tl.zeros([BK], dtype=tl.float32)
    for vb in tl.static_range(V // BV):
        o_v = vb * BV + tl.arange(0, BV)
        v_t = _r16(tl.load(v + v_base + rows[:, None] * (H * V) + o_v[None, :], mask=mask_t[:, None],
                      other=0.), DT, EMU)
        do_t = _r16(tl.load(do + v_base + rows[:, None] * (H * V) + o_v[None, :], mask=mask_t[:, None],
                       other=0.), DT, EMU)
        h = _r16(tl.load(hs + st_base + o_k[:, None] * V + o_v[None, :]), DT, EMU)
        dh = _r16(tl.load(dhs + st_base + o_k[:, None] * V + o_v[None, :]), DT, EMU)
        if GATE != 0:
            hdh += tl.sum(h.to(tl.float32) * dh.to(tl.float32), axis=1)
        dP += tl.dot(do_t, tl.trans(v_t), input_precision=IP)
        dq_i += tl.dot(do_t, tl.trans(h), input_precision=IP)
        dk_i += tl.dot(v_t, tl.trans(dh), input_precision=IP)
    q_t = tl.load(q + qk_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None],
                  other=0.).to(tl.float32) * scale
    k_t = tl.load(k + qk_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None],
                  other=0.).to(tl.float32)
    causal = o_t[:, None] >= o_t[None, :]
    if GATE == 2:
        offs = qk_base + rows[:, None] * (H * K) + o_k[None, :]
        g_t = tl.load(g + offs, mask=mask_t[:, None], other=0.).to(tl.float32)
        b_t = tl.cumsum(g_t, axis=0)
        b_c = tl.sum(g_t, axis=0)
        dq_t = dq_i * tl.exp(b_t)
        dk_t = dk_i * tl.exp(b_c[None, :] - b_t)
        # the gate carry per key channel: e^{b_C} <h_c, dh_c>_v + sum_j k_j (V dh_c^T)_j e^{b_C - b_j}
        tl.store(cpart + ((i_b * NT + c) * H + i_h) * K + o_k, tl.exp(b_c) * hdh + tl.sum(k_t * dk_t, axis=0))
        # intra-chunk part, level by level (see _gla_level): A_l = (q e^{qe}) (k e^{ke})^T on pairs,
        # so dq += e^{qe} (dP_l (k e^{ke})) and dk += e^{ke} (dP_l^T (q e^{qe})); plus the diagonal
        # gate terms q~.dq - k.dk: the inter parts now; the diagonal pair cancels exactly and is left
        # out; each level adds ql * (dP_l kl) - kl * (dP_l^T ql) from the *same* rounded ql, kl, dP_l,
        # so that pairs inside a suffix cancel to float32 accuracy in dg (see the scalar branch)
        dgt = q_t * dq_t - k_t * dk_t
        diag = tl.sum(tl.where(o_t[:, None] == o_t[None, :], dP, 0.), axis=1)
        dq_t += diag[:, None] * k_t
        dk_t += diag[:, None] * q_t
        for LV in tl.static_range(8):
            if (BT >> (LV + 1)) > 0:
                qe, ke, pair = _gla_level(b_t, o_t, LV, BT, BK)
                eq = tl.exp(qe)
                ek = tl.exp(ke)
                dPl = _r16(tl.where(pair, dP, 0.), DT, EMU)
                ql = _r16(q_t * eq, DT, EMU)
                kl = _r16(k_t * ek, DT, EMU)
                rq = tl.dot(dPl, kl, input_precision=IP)
                ck = tl.dot(tl.trans(dPl), ql, input_precision=IP)
                dq_t += eq * rq
                dk_t += ek * ck
                dgt += ql.to(tl.float32) * rq - kl.to(tl.float32) * ck
        tl.store(dq + offs, _st((dq_t * scale), dq.dtype.element_ty, EMU), mask=mask_t[:, None])
        tl.store(dk + offs, _st(dk_t, dk.dtype.element_ty, EMU), mask=mask_t[:, None])
        tl.store(dgl + offs, dgt, mask=mask_t[:, None])
    else:
        if GATE == 1:
            g_t = tl.load(g + i_b * T * H + i_h + rows * H, mask=mask_t, other=0.).to(tl.float32)
            b_t = tl.cumsum(g_t, axis=0)
            b_c = tl.sum(g_t, axis=0)
            dPg = dP * tl.exp(tl.where(causal, b_t[:, None] - b_t[None, :], float("-inf")))
            dq_t = dq_i * tl.exp(b_t)[:, None]
            dk_t = dk_i * tl.exp(b_c - b_t)[:, None]
            # the gate carry of this chunk (all fp32, from the fp32 accumulator of dk's inter-chunk part)
            cy = tl.exp(b_c) * tl.sum(hdh, axis=0) + tl.sum(tl.sum(k_t * dk_t, axis=1), axis=0)
            tl.store(cpart + ((i_k * B + i_b) * NT + c) * H + i_h, cy)
            # per-position gate terms q~.dq - k.dk: the inter-chunk parts, plus the intra-chunk pairs
            # M_ij = dP_ij Gamma_ij (q~_i . k_j) (i > j) entering row i with + and row j with -.
            # The pair i = j enters q~.dq and k.dk alike and cancels exactly, so it is left out rather
            # than computed twice with different 16-bit roundings (with those, the diagonal's
            # rounding noise dominated dg's error); M is float32 from the float32 dP and scores.
            QK = tl.dot(_r16(q_t, DT, EMU), tl.trans(_r16(k_t, DT, EMU)), input_precision=IP)
            M = tl.where(o_t[:, None] > o_t[None, :], dPg * QK, 0.)
            part = tl.sum(q_t * dq_t - k_t * dk_t, axis=1) + tl.sum(M, axis=1) - tl.sum(M, axis=0)
        else:
            dPg = tl.where(causal, dP, 0.)
            dq_t = dq_i
            dk_t = dk_i
        dq_t += tl.dot(_r16(dPg, DT, EMU), _r16(k_t, DT, EMU), input_precision=IP)
        dk_t += tl.dot(tl.trans(_r16(dPg, DT, EMU)), _r16(q_t, DT, EMU), input_precision=IP)
        # dq_t is dL/dq~ (q~ = scale q): dL/dq = scale dq_t, and q dL/dq = q~ dq_t.
        offs = qk_base + rows[:, None] * (H * K) + o_k[None, :]
        tl.store(dq + offs, _st((dq_t * scale), dq.dtype.element_ty, EMU), mask=mask_t[:, None])
        tl.store(dk + offs, _st(dk_t, dk.dtype.element_ty, EMU), mask=mask_t[:, None])
        if GATE == 1:
            tl.store(dgl + i_k * (B * T * H) + i_b * T * H + i_h + rows * H, part,
                     mask=mask_t)


@triton.jit
def _dg_kernel(dgl, cpart, dg, B, T, NT, NP,
               H: tl.constexpr, KG: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr):
    """dg_t = carry_c + sum_{t' >= t in chunk c} dgl_t', in parallel over chunks.

    ``dgl``: fp32 ``[NP, B, T, H, KG]`` per-position terms ``q*dq - k*dk`` (summed over NP partials);
    ``cpart``: fp32 ``[NP, B, NT, H, KG]`` partials of the chunk's *carry*, the sum of those terms
    over all later positions. The carry is not a suffix sum over the sequence: it is the local
    quantity ``<h_{c+1}, dh_c>`` (the state leaving chunk c against the gradient w.r.t. it, final
    state gradient included), equal to that sum in exact arithmetic (shifting every later cumulative
    log gate by d scales the state leaving chunk c by e^d). A suffix sum over T positions would add
    up T rounding errors of the terms (its error grows like sqrt(T) while dg does not); this carry
    has the error of one chunk. ``dg`` in g's dtype; grid (KG // BK, NT, B*H).
    """
    i_k = tl.program_id(0)
    c = tl.program_id(1)
    i_bh = tl.program_id(2)
    i_b = i_bh // H
    i_h = i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    rows = c * BT + tl.arange(0, BT)
    m = (rows < T)[:, None]
    offs = i_b * T * H * KG + i_h * KG + rows[:, None] * (H * KG) + o_k[None, :]
    x = tl.zeros([BT, BK], dtype=tl.float32)
    cy = tl.zeros([BK], dtype=tl.float32)
    for p in tl.range(0, NP):
        x += tl.load(dgl + p * (B * T * H * KG) + offs, mask=m, other=0.)
        cy += tl.load(cpart + p * (B * NT * H * KG) + ((i_b * NT + c) * H + i_h) * KG + o_k)
    rc = cy[None, :] + tl.cumsum(x, axis=0, reverse=True)
    tl.store(dg + offs, rc.to(dg.dtype.element_ty), mask=m)


# ----------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------

def _check_head_sizes(K: int, V: int):
    for name, d in (("K (head size of q and k)", K), ("V (head size of v)", V)):
        if d not in SUPPORTED_HEAD_SIZES:
            raise ValueError(f"{name} must be one of {SUPPORTED_HEAD_SIZES} for the Triton GLA kernels; "
                             f"got {d}")


def _num_sms(device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return _NUM_SMS_DEFAULT


class _Cfg:
    """Tile sizes and launch parameters, chosen by simple rules of thumb (see NOTES_gla.md)."""

    def __init__(self, gate: int, B: int, T: int, H: int, K: int, V: int, dtype, device, num_segments=None):
        # BT: the chunk of every march and of the backward's stored states (all three gates)
        self.BT = 64
        self.NT = triton.cdiv(T, self.BT)
        # forward: full K per program (o needs the whole K sum); the state tile is K x BV.
        self.BV_f = min(V, 64 if K <= 128 else 32)
        self.BK_s = min(K, 64)                 # state-only marches tile K as well
        self.BV_s = min(V, 64)
        self.BV_dv = min(V, 64)
        self.BK_dq = min(K, 64)
        self.BV_dq = min(V, 64)
        self.IP = "ieee" if dtype == torch.float32 else "tf32"
        # Triton's interpreter mis-computes tl.dot on 16-bit operands, so there the dots run in
        # float32 on operands rounded to 16 bits (_r16); the compiled GPU path uses tensor cores.
        self.EMU = bool(INTERPRET)
        # Per-chunk states for the backward are stored in the input dtype for 16-bit inputs (the
        # dots that read them round them to that dtype anyway) and in float32 otherwise; the same
        # under the interpreter, so that the CPU tests see the GPU's roundings (see _r16).
        self.state_dtype = torch.float32 if dtype == torch.float32 else dtype
        self.warps_f = 4 if (K * self.BV_f) <= 64 * 64 else 8
        # Triton's default 3 stages, but 2 at K = 256 (3 stages of q, k, g and the scores need more
        # than the 227 KB of shared memory of an H100/H200 for the vector gate)
        self.stages_f = 2 if K >= 256 else 3
        # vector gate: "new" (round 3: _gla_prep_kernel + the lean march; measured on the H200 at
        # 0.78x and 0.73x the time of "old" at B = 32, T = 2048 and B = 1, T = 32768, NOTES_gla.md)
        # or "old" (round 2: score pre-pass + the march that gates q and k itself)
        self.gla_fwd = "new"
        # prep kernel: K columns per inner step and warps; at K = 128 with 16-bit inputs the whole
        # K in one step on 8 warps (round-3 sweep on the H200: about 0.8x the time of 64 columns on
        # 4 warps at B = 32, T = 2048 and B = 1, T = 32768, NOTES_gla.md); elsewhere unmeasured
        wide = K == 128 and dtype != torch.float32
        self.BK_p = 128 if wide else min(K, 64)
        self.warps_p = 8 if wide else 4
        if gate == 2:
            self.gla_fwd = str(TUNE.get("gla_fwd", "new"))
            if self.gla_fwd not in ("new", "old"):
                raise ValueError(f"TUNE['gla_fwd'] must be 'new' or 'old'; got {self.gla_fwd!r}")
            if self.gla_fwd == "new":
                self.warps_f = 4
                self.stages_f = 2
        if TUNE:
            self.BK_p = min(K, int(TUNE.get("BK_p", self.BK_p)))
            self.warps_p = int(TUNE.get("warps_p", self.warps_p))
            self.BV_f = min(V, int(TUNE.get("BV_f", self.BV_f)))
            self.warps_f = int(TUNE.get("warps_f", self.warps_f))
            self.stages_f = int(TUNE.get("stages_f", self.stages_f))
            if TUNE.get("split", True) is False and num_segments is None:
                num_segments = 1
        BH = B * H
        NV = V // self.BV_f
        if num_segments is None:
            # Split the sequence only when the marches would not fill one wave of the GPU (the
            # big forward programs run one per SM); then aim at about two waves, with segments of
            # at least four chunks. Each split costs one extra read of k, v (and g).
            sms = _num_sms(device)
            ns = 1
            if BH * NV < sms and self.NT >= 8:
                ns = min((2 * sms) // (BH * NV), self.NT // 4)
            num_segments = max(1, ns)
        num_segments = max(1, min(int(num_segments), self.NT))
        self.SEG = triton.cdiv(self.NT, num_segments)
        self.NS = triton.cdiv(self.NT, self.SEG)   # no empty segment


def _gate_code(g):
    if g is None:
        return 0
    return 1 if g.dim() == 3 else 2


def _forward(q, k, v, g, scale, h0, output_final_state, need_inits, num_segments=None):
    B, T, H, K = q.shape
    V = v.shape[-1]
    gate = _gate_code(g)
    cfg = _Cfg(gate, B, T, H, K, V, q.dtype, q.device, num_segments)
    BH = B * H
    dev = q.device
    f32 = torch.float32
    o = torch.empty(B, T, H, V, dtype=v.dtype, device=dev)
    gg = g if g is not None else q                 # placeholder pointer when there is no gate
    ht = torch.empty(B, H, K, V, dtype=f32, device=dev) if output_final_state else None
    dummy = torch.empty(1, dtype=f32, device=dev)
    As = dummy
    pre = gate == 2 and cfg.gla_fwd == "new"
    qm, km = q, k                                  # what the march reads as q and k
    if gate == 2:
        As = torch.empty(BH, cfg.NT * cfg.BT, cfg.BT, dtype=q.dtype, device=dev)
        if pre:
            # round 3: one parallel pass over chunks does all the gate work (gated q and k, chunk
            # decays, intra-chunk scores); the march is then the ungated one plus a decay
            qm = torch.empty_like(q)
            km = torch.empty_like(k)
            gg = torch.empty(BH, cfg.NT, K, dtype=f32, device=dev)
            gip = "ieee" if g.dtype == torch.float32 else cfg.IP
            _gla_prep_kernel[(cfg.NT, BH)](q, k, g, qm, km, gg, As, scale, T, cfg.NT, H=H, K=K, BT=cfg.BT,
                                           BK=cfg.BK_p, IP=cfg.IP, GIP=gip, EMU=cfg.EMU,
                                           num_warps=cfg.warps_p)
        else:
            _gla_scores_kernel[(cfg.NT, BH)](q, k, g, As, scale, T, cfg.NT, H=H, K=K, BT=cfg.BT, IP=cfg.IP,
                                             EMU=cfg.EMU, num_warps=4 if K <= 64 else 8)
    if cfg.NS == 1:
        inits = h0
        grid = (V // cfg.BV_f, BH)
        _fwd_kernel[grid](qm, km, v, gg, o, h0 if h0 is not None else dummy, ht if ht is not None else dummy,
                          dummy, dummy, As, scale, T, cfg.NT, cfg.SEG, cfg.NS, H=H, K=K, V=V, BT=cfg.BT, BK=K,
                          BV=cfg.BV_f, GATE=gate, HAS_H0=h0 is not None, COMPUTE_O=True,
                          STORE_FINAL=ht is not None, STORE_DEC=False, STORE_H=False, IP=cfg.IP, EMU=cfg.EMU,
                          PRE=pre, num_warps=cfg.warps_f, num_stages=cfg.stages_f)
    else:
        NS = cfg.NS
        contrib = torch.empty(BH * NS, K, V, dtype=f32, device=dev)
        dec = torch.zeros(BH * NS, K if gate == 2 else 1, dtype=f32, device=dev)
        grid = ((K // cfg.BK_s) * (V // cfg.BV_s), BH * NS)
        _fwd_kernel[grid](qm, km, v, gg, dummy, dummy, contrib, dec, dummy, dummy, scale, T, cfg.NT, cfg.SEG,
                          cfg.NS, H=H, K=K, V=V, BT=cfg.BT, BK=cfg.BK_s, BV=cfg.BV_s, GATE=gate,
                          HAS_H0=False, COMPUTE_O=False, STORE_FINAL=True, STORE_DEC=gate != 0,
                          STORE_H=False, IP=cfg.IP, EMU=cfg.EMU, PRE=pre, num_warps=4)
        inits = torch.empty(BH * NS, K, V, dtype=f32, device=dev)
        _combine_kernel[((K // cfg.BK_s) * (V // cfg.BV_s), BH)](
            contrib, dec, h0 if h0 is not None else dummy, inits, ht if ht is not None else dummy, NS,
            K=K, V=V, BK=cfg.BK_s, BV=cfg.BV_s, GATE=gate, HAS_H0=h0 is not None,
            STORE_FINAL=ht is not None, REVERSE=False, num_warps=4)
        _fwd_kernel[(V // cfg.BV_f, BH * NS)](
            qm, km, v, gg, o, inits, dummy, dummy, dummy, As, scale, T, cfg.NT, cfg.SEG, cfg.NS, H=H, K=K, V=V,
            BT=cfg.BT, BK=K, BV=cfg.BV_f, GATE=gate, HAS_H0=True, COMPUTE_O=True,
            STORE_FINAL=False, STORE_DEC=False, STORE_H=False, IP=cfg.IP, EMU=cfg.EMU, PRE=pre,
            num_warps=cfg.warps_f, num_stages=cfg.stages_f)
    # what the backward needs: the segment entering states and (vector gate) the scores
    return o, ht, ((inits, As if gate == 2 else None) if need_inits else None), cfg


def _backward(q, k, v, g, scale, saved, ht, do, dht, cfg, need_dh0):
    inits, As = saved
    B, T, H, K = q.shape
    V = v.shape[-1]
    gate = _gate_code(g)
    BH = B * H
    dev = q.device
    f32 = torch.float32
    NT = cfg.NT
    gg = g if g is not None else q
    dummy = torch.empty(1, dtype=f32, device=dev)
    # (1) recompute the entering state of every chunk (parallel over segments)
    hs = torch.empty(BH, NT, K, V, dtype=cfg.state_dtype, device=dev)
    NS = cfg.NS
    NKV = (K // cfg.BK_s) * (V // cfg.BV_s)
    split = NS > 1
    dec = torch.zeros(BH * NS, K if gate == 2 else 1, dtype=f32, device=dev) if (split and gate) else dummy
    _fwd_kernel[(NKV, BH * NS)](q, k, v, gg, dummy, inits if inits is not None else dummy, dummy, dec, hs, dummy,
                                scale, T, NT, cfg.SEG, NS, H=H, K=K, V=V, BT=cfg.BT, BK=cfg.BK_s, BV=cfg.BV_s,
                                GATE=gate, HAS_H0=inits is not None, COMPUTE_O=False,
                                STORE_FINAL=False, STORE_DEC=split and gate != 0, STORE_H=True, IP=cfg.IP,
                                EMU=cfg.EMU, num_warps=4)
    # (2) reverse march for dh (gradient w.r.t. the state leaving each chunk) and dh0; split like
    #     the forward: per-segment contributions, a reverse combine, then the per-segment march
    dhs = torch.empty(BH, NT, K, V, dtype=cfg.state_dtype, device=dev)
    dh0 = torch.empty(B, H, K, V, dtype=f32, device=dev) if need_dh0 else None
    common = dict(H=H, K=K, V=V, BT=cfg.BT, BK=cfg.BK_s, BV=cfg.BV_s, GATE=gate, IP=cfg.IP, EMU=cfg.EMU,
                  num_warps=4)
    if not split:
        _bwd_dh_kernel[(NKV, BH)](q, gg, do, dht if dht is not None else dummy, dhs,
                                  dh0 if dh0 is not None else dummy, scale, T, NT, NT, 1,
                                  HAS_INIT=dht is not None, STORE_DH=True, STORE_OUT=dh0 is not None, **common)
    else:
        contrib = torch.empty(BH * NS, K, V, dtype=f32, device=dev)
        _bwd_dh_kernel[(NKV, BH * NS)](q, gg, do, dummy, dummy, contrib, scale, T, NT, cfg.SEG, NS,
                                       HAS_INIT=False, STORE_DH=False, STORE_OUT=True, **common)
        dinits = torch.empty(BH * NS, K, V, dtype=f32, device=dev)
        _combine_kernel[(NKV, BH)](contrib, dec, dht if dht is not None else dummy, dinits,
                                   dh0 if dh0 is not None else dummy, NS, K=K, V=V, BK=cfg.BK_s, BV=cfg.BV_s,
                                   GATE=gate, HAS_H0=dht is not None, STORE_FINAL=dh0 is not None, REVERSE=True,
                                   num_warps=4)
        _bwd_dh_kernel[(NKV, BH * NS)](q, gg, do, dinits, dhs, dummy, scale, T, NT, cfg.SEG, NS,
                                       HAS_INIT=True, STORE_DH=True, STORE_OUT=False, **common)
    # (3) dv, then dq, dk and the gate terms, parallel over chunks
    dv = torch.empty_like(v)
    _bwd_dv_kernel[(V // cfg.BV_dv, NT, BH)](q, k, gg, do, dhs, dv, As if As is not None else dummy, scale, T, NT, H=H, K=K, V=V, BT=cfg.BT,
                                             BV=cfg.BV_dv, GATE=gate, IP=cfg.IP, EMU=cfg.EMU,
                                             num_warps=4 if K <= 64 else 8)
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    NK = K // cfg.BK_dq
    if gate == 2:
        dgl = torch.empty(B, T, H, K, dtype=f32, device=dev)
    elif gate == 1:
        dgl = torch.empty(NK, B, T, H, dtype=f32, device=dev)
    else:
        dgl = dummy
    if gate == 2:
        cpart = torch.empty(1, B, NT, H, K, dtype=f32, device=dev)
    elif gate == 1:
        cpart = torch.empty(NK, B, NT, H, dtype=f32, device=dev)
    else:
        cpart = dummy
    _bwd_dqdk_kernel[(NK, NT, BH)](q, k, v, gg, do, hs, dhs, dq, dk, dgl, cpart, scale, B, T, NT, H=H, K=K, V=V,
                                   BT=cfg.BT, BK=cfg.BK_dq, BV=cfg.BV_dq, GATE=gate, IP=cfg.IP,
                                   EMU=cfg.EMU, num_warps=8 if cfg.BK_dq >= 64 else 4)
    dg = None
    if gate:
        # dL/dB_t (B_t = g_1 + ... + g_t over the whole sequence) is q*dq - k*dk; dg_t is its
        # reverse cumulative sum, formed per chunk from the chunk's carry <h_{c+1}, dh_c> (which
        # includes the final state's gradient) plus a suffix sum inside the chunk (_dg_kernel).
        KG = K if gate == 2 else 1
        NP = 1 if gate == 2 else NK
        dg = torch.empty_like(g)
        BKG = min(KG, 64)
        _dg_kernel[(KG // BKG, NT, BH)](dgl, cpart, dg, B, T, NT, NP, H=H, KG=KG, BT=cfg.BT, BK=BKG,
                                        num_warps=4)
    return dq, dk, dv, dg, dh0


class _ChunkGLAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, h0, scale, output_final_state, num_segments):
        need = any(ctx.needs_input_grad[:5])
        o, ht, saved, cfg = _forward(q, k, v, g, scale, h0, output_final_state, need, num_segments)
        inits, As = saved if saved is not None else (None, None)
        ctx.save_for_backward(q, k, v, g, inits, As, ht)
        ctx.scale = scale
        ctx.cfg = cfg
        ctx.has_h0 = h0 is not None
        ctx.h0_dtype = h0.dtype if h0 is not None else None
        return o, (ht if output_final_state else None)

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, inits, As, ht = ctx.saved_tensors
        do = do.contiguous()
        if dht is not None:
            dht = dht.contiguous().float()
        dq, dk, dv, dg, dh0 = _backward(q, k, v, g, ctx.scale, (inits, As), ht, do, dht, ctx.cfg, ctx.has_h0)
        if dh0 is not None:
            dh0 = dh0.to(ctx.h0_dtype)
        return dq, dk, dv, dg, dh0, None, None, None


def _run(q, k, v, g, scale, initial_state, output_final_state, num_segments):
    B, T, H, K = q.shape
    V = v.shape[-1]
    _check_head_sizes(K, V)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if g is not None:
        g = g.contiguous()
    h0 = initial_state
    if h0 is not None:
        h0 = h0.contiguous()
        if h0.dtype != torch.float32:
            h0 = h0.float()
    o, ht = _ChunkGLAFunction.apply(q, k, v, g, h0, float(scale), bool(output_final_state), num_segments)
    return o, ht


def chunk_simple_gla_triton(q, k, v, g, scale, initial_state=None, output_final_state=False, *,
                            num_segments=None):
    """Scalar-gated (``g`` ``[B, T, H]``) or ungated (``g=None``) chunkwise linear attention.

    ``num_segments`` forces the forward's sequence split (default: chosen from the GPU's size).
    """
    return _run(q, k, v, g, scale, initial_state, output_final_state, num_segments)


def chunk_gla_triton(q, k, v, g, scale, initial_state=None, output_final_state=False, *, num_segments=None):
    """Vector-gated (``g`` ``[B, T, H, K]``) chunkwise linear attention (GLA)."""
    return _run(q, k, v, g, scale, initial_state, output_final_state, num_segments)
