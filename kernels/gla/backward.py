"""Stage: the backward, (K6)-(K10) of ``kernels/gla/DERIVATION.md``.

With the state entering every chunk recomputed (:func:`kernels.gla.march.chunk_states`):

1. :func:`state_grads`: a reverse march for ``dh``, the gradient w.r.t. the state leaving each chunk
   (K6), and the initial state's gradient; split into segments like the forward;
2. :func:`chunk_grads`: parallel over chunks, ``dv`` (K7), then ``dq``, ``dk`` (K8) with the
   per-position gate terms ``q·dq − k·dk`` and every chunk's gate carry ``<h_{c+1}, dh_c>`` (K10);
3. :func:`gate_grads`: ``dg`` = the chunk's carry + a suffix sum inside the chunk (K9).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .march import combine_segments
from ..common.tiles import round_operand, round_store
from .tiles import _gla_level

__all__ = ["state_grads", "chunk_grads", "gate_grads"]


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
            tl.store(dhs + (i_bh * NT + c).to(tl.int64) * K * V + st_offs, round_store(dS, dhs.dtype.element_ty, EMU),
                     mask=(c < NT) & (st_offs >= 0))
        rows = c * BT + o_t
        mask_t = rows < T
        do_t = tl.load(do + v_base + rows[:, None] * (H * V) + o_v[None, :], mask=mask_t[:, None], other=0.)
        if GATE == 0:
            q_t = tl.load(q + qk_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None], other=0.)
            dS += tl.dot(tl.trans(round_operand(q_t, DT, EMU)), round_operand(do_t, DT, EMU), input_precision=IP) * scale
        if GATE == 1:
            q_t = tl.load(q + qk_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None], other=0.)
            g_t = g_next.to(tl.float32)
            rows_n = rows - BT
            g_next = tl.load(g + g_base + rows_n * H, mask=(rows_n >= 0) & (rows_n < T), other=0.)
            b_t = tl.cumsum(g_t, axis=0)
            b_c = tl.sum(g_t, axis=0)
            # the decays e^{b_i} (and the scale) act on the rows of dO, so q goes to the tensor cores as loaded
            dog = round_operand((do_t.to(tl.float32) * (scale * tl.exp(b_t))[:, None]), DT, EMU)
            dS = dS * tl.exp(b_c) + tl.dot(tl.trans(round_operand(q_t, DT, EMU)), dog, input_precision=IP)
        if GATE == 2:
            q_t = tl.load(q + qk_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None],
                          other=0.).to(tl.float32) * scale
            g_t = tl.load(g + g_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None],
                          other=0.).to(tl.float32)
            b_t = tl.cumsum(g_t, axis=0)
            b_c = tl.sum(g_t, axis=0)
            qg = round_operand((q_t * tl.exp(b_t)), DT, EMU)
            dS = dS * tl.exp(b_c)[:, None] + tl.dot(tl.trans(qg), round_operand(do_t, DT, EMU), input_precision=IP)
    if STORE_OUT:
        tl.store(dout + i_bhs * K * V + st_offs, dS)


@triton.jit
def _bwd_dv_kernel(q, k, g, do, dhs, dv, As, scale, T, NT,
                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                   BT: tl.constexpr, BV: tl.constexpr,
                   GATE: tl.constexpr, IP: tl.constexpr, EMU: tl.constexpr):
    """dV = A^T dO + (K * e^{b_C - b}) dh, one chunk and V-block per program; grid (NV, NT, B*H).

    For the vector gate (``GATE == 2``) A is read from the forward's score pre-pass ``As``
    (the prep stage's ``As``, scale included).
    """
    DT = k.dtype.element_ty
    i_v = tl.program_id(0)
    i_t = tl.program_id(1)
    i_bh = tl.program_id(2)
    i_b = i_bh // H
    i_h = i_bh % H
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, BT)
    rows = i_t * BT + o_t
    mask_t = rows < T
    qk_base = i_b * T * H * K + i_h * K
    v_base = i_b * T * H * V + i_h * V
    g_base = i_b * T * H + i_h if GATE == 1 else qk_base
    k_t = tl.load(k + qk_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None], other=0.)
    do_t = tl.load(do + v_base + rows[:, None] * (H * V) + o_v[None, :], mask=mask_t[:, None], other=0.)
    dh = tl.load(dhs + (i_bh * NT + i_t).to(tl.int64) * K * V + o_k[:, None] * V + o_v[None, :])
    q_t = tl.load(q + qk_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None],
                  other=0.).to(tl.float32) * scale
    causal = o_t[:, None] >= o_t[None, :]
    if GATE == 2:
        g_t = tl.load(g + g_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None],
                      other=0.).to(tl.float32)
        b_t = tl.cumsum(g_t, axis=0)
        b_c = tl.sum(g_t, axis=0)
        A = tl.load(As + (i_bh * NT + i_t).to(tl.int64) * BT * BT + o_t[:, None] * BT + o_t[None, :])
        kg = round_operand((k_t.to(tl.float32) * tl.exp(b_c[None, :] - b_t)), DT, EMU)
    elif GATE == 1:
        A = tl.dot(round_operand(q_t, DT, EMU), tl.trans(round_operand(k_t, DT, EMU)), input_precision=IP)
        g_t = tl.load(g + g_base + rows * H, mask=mask_t, other=0.).to(tl.float32)
        b_t = tl.cumsum(g_t, axis=0)
        b_c = tl.sum(g_t, axis=0)
        A = A * tl.exp(tl.where(causal, b_t[:, None] - b_t[None, :], float("-inf")))
        kg = round_operand((k_t.to(tl.float32) * tl.exp(b_c - b_t)[:, None]), DT, EMU)
    else:
        A = tl.dot(round_operand(q_t, DT, EMU), tl.trans(round_operand(k_t, DT, EMU)), input_precision=IP)
        A = tl.where(causal, A, 0.)
        kg = round_operand(k_t, DT, EMU)
    dv_c = tl.dot(tl.trans(round_operand(A, DT, EMU)), round_operand(do_t, DT, EMU), input_precision=IP)
    dv_c += tl.dot(kg, round_operand(dh, DT, EMU), input_precision=IP)
    tl.store(dv + v_base + rows[:, None] * (H * V) + o_v[None, :], round_store(dv_c, dv.dtype.element_ty, EMU),
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
    i_t = tl.program_id(1)
    i_bh = tl.program_id(2)
    i_b = i_bh // H
    i_h = i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    o_t = tl.arange(0, BT)
    rows = i_t * BT + o_t
    mask_t = rows < T
    qk_base = i_b * T * H * K + i_h * K
    v_base = i_b * T * H * V + i_h * V
    st_base = (i_bh * NT + i_t).to(tl.int64) * K * V
    dP = tl.zeros([BT, BT], dtype=tl.float32)
    dq_i = tl.zeros([BT, BK], dtype=tl.float32)
    dk_i = tl.zeros([BT, BK], dtype=tl.float32)
    hdh = tl.zeros([BK], dtype=tl.float32)
    for vb in tl.static_range(V // BV):
        o_v = vb * BV + tl.arange(0, BV)
        v_t = round_operand(tl.load(v + v_base + rows[:, None] * (H * V) + o_v[None, :], mask=mask_t[:, None],
                      other=0.), DT, EMU)
        do_t = round_operand(tl.load(do + v_base + rows[:, None] * (H * V) + o_v[None, :], mask=mask_t[:, None],
                       other=0.), DT, EMU)
        h = round_operand(tl.load(hs + st_base + o_k[:, None] * V + o_v[None, :]), DT, EMU)
        dh = round_operand(tl.load(dhs + st_base + o_k[:, None] * V + o_v[None, :]), DT, EMU)
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
        tl.store(cpart + ((i_b * NT + i_t) * H + i_h) * K + o_k, tl.exp(b_c) * hdh + tl.sum(k_t * dk_t, axis=0))
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
                dPl = round_operand(tl.where(pair, dP, 0.), DT, EMU)
                ql = round_operand(q_t * eq, DT, EMU)
                kl = round_operand(k_t * ek, DT, EMU)
                rq = tl.dot(dPl, kl, input_precision=IP)
                ck = tl.dot(tl.trans(dPl), ql, input_precision=IP)
                dq_t += eq * rq
                dk_t += ek * ck
                dgt += ql.to(tl.float32) * rq - kl.to(tl.float32) * ck
        tl.store(dq + offs, round_store((dq_t * scale), dq.dtype.element_ty, EMU), mask=mask_t[:, None])
        tl.store(dk + offs, round_store(dk_t, dk.dtype.element_ty, EMU), mask=mask_t[:, None])
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
            tl.store(cpart + ((i_k * B + i_b) * NT + i_t) * H + i_h, cy)
            # per-position gate terms q~.dq - k.dk: the inter-chunk parts, plus the intra-chunk pairs
            # M_ij = dP_ij Gamma_ij (q~_i . k_j) (i > j) entering row i with + and row j with -.
            # The pair i = j enters q~.dq and k.dk alike and cancels exactly, so it is left out rather
            # than computed twice with different 16-bit roundings (with those, the diagonal's
            # rounding noise dominated dg's error); M is float32 from the float32 dP and scores.
            QK = tl.dot(round_operand(q_t, DT, EMU), tl.trans(round_operand(k_t, DT, EMU)), input_precision=IP)
            M = tl.where(o_t[:, None] > o_t[None, :], dPg * QK, 0.)
            part = tl.sum(q_t * dq_t - k_t * dk_t, axis=1) + tl.sum(M, axis=1) - tl.sum(M, axis=0)
        else:
            dPg = tl.where(causal, dP, 0.)
            dq_t = dq_i
            dk_t = dk_i
        dq_t += tl.dot(round_operand(dPg, DT, EMU), round_operand(k_t, DT, EMU), input_precision=IP)
        dk_t += tl.dot(tl.trans(round_operand(dPg, DT, EMU)), round_operand(q_t, DT, EMU), input_precision=IP)
        # dq_t is dL/dq~ (q~ = scale q): dL/dq = scale dq_t, and q dL/dq = q~ dq_t.
        offs = qk_base + rows[:, None] * (H * K) + o_k[None, :]
        tl.store(dq + offs, round_store((dq_t * scale), dq.dtype.element_ty, EMU), mask=mask_t[:, None])
        tl.store(dk + offs, round_store(dk_t, dk.dtype.element_ty, EMU), mask=mask_t[:, None])
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
    i_t = tl.program_id(1)
    i_bh = tl.program_id(2)
    i_b = i_bh // H
    i_h = i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    rows = i_t * BT + tl.arange(0, BT)
    m = (rows < T)[:, None]
    offs = i_b * T * H * KG + i_h * KG + rows[:, None] * (H * KG) + o_k[None, :]
    x = tl.zeros([BT, BK], dtype=tl.float32)
    cy = tl.zeros([BK], dtype=tl.float32)
    for p in tl.range(0, NP):
        x += tl.load(dgl + p * (B * T * H * KG) + offs, mask=m, other=0.)
        cy += tl.load(cpart + p * (B * NT * H * KG) + ((i_b * NT + i_t) * H + i_h) * KG + o_k)
    rc = cy[None, :] + tl.cumsum(x, axis=0, reverse=True)
    tl.store(dg + offs, rc.to(dg.dtype.element_ty), mask=m)


# ----------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------


def state_grads(q, g, do, dht, dec, scale: float, plan, need_dh0: bool):
    """``dh`` of every chunk (``[B·H, NT, K, V]``, ``plan.state_dtype``) and the initial state's
    gradient (float32, or ``None``); ``dec``: the segments' log decays from :func:`chunk_states`."""
    B, T, H, K = q.shape
    V = do.shape[-1]
    BH = B * H
    dev = q.device
    f32 = torch.float32
    gg = g if g is not None else q
    dummy = torch.empty(1, dtype=f32, device=dev)
    NKV = (K // plan.BK_s) * (V // plan.BV_s)
    dhs = torch.empty(BH, plan.NT, K, V, dtype=plan.state_dtype, device=dev)
    common = dict(H=H, K=K, V=V, BT=plan.BT, BK=plan.BK_s, BV=plan.BV_s, GATE=plan.gate, IP=plan.IP,
                  EMU=plan.EMU, num_warps=plan.warps_s, num_stages=plan.stages_s)
    if plan.NS == 1:
        dh0 = torch.empty(B, H, K, V, dtype=f32, device=dev) if need_dh0 else None
        _bwd_dh_kernel[(NKV, BH)](q, gg, do, dht if dht is not None else dummy, dhs,
                                  dh0 if dh0 is not None else dummy, scale, T, plan.NT, plan.NT, 1,
                                  HAS_INIT=dht is not None, STORE_DH=True, STORE_OUT=dh0 is not None, **common)
        return dhs, dh0
    # per-segment contributions from a zero gradient, the reverse combine, then the march that stores dh
    NS = plan.NS
    contrib = torch.empty(BH * NS, K, V, dtype=f32, device=dev)
    _bwd_dh_kernel[(NKV, BH * NS)](q, gg, do, dummy, dummy, contrib, scale, T, plan.NT, plan.SEG, NS,
                                   HAS_INIT=False, STORE_DH=False, STORE_OUT=True, **common)
    dinits, dh0 = combine_segments(contrib, dec, dht, plan, B, H, K, V, need_dh0, reverse=True)
    _bwd_dh_kernel[(NKV, BH * NS)](q, gg, do, dinits, dhs, dummy, scale, T, plan.NT, plan.SEG, NS,
                                   HAS_INIT=True, STORE_DH=True, STORE_OUT=False, **common)
    return dhs, dh0


def chunk_grads(q, k, v, g, do, hs, dhs, As, scale: float, plan):
    """``dq, dk, dv`` and, with a gate, the per-position gate terms and chunk carries for
    :func:`gate_grads` (``None`` without a gate)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    BH = B * H
    dev = q.device
    f32 = torch.float32
    gate, NT = plan.gate, plan.NT
    gg = g if g is not None else q
    dummy = torch.empty(1, dtype=f32, device=dev)
    dv = torch.empty_like(v)
    _bwd_dv_kernel[(V // plan.BV_dv, NT, BH)](q, k, gg, do, dhs, dv, As if As is not None else dummy, scale, T, NT,
                                              H=H, K=K, V=V, BT=plan.BT, BV=plan.BV_dv, GATE=gate, IP=plan.IP,
                                              EMU=plan.EMU, num_warps=plan.warps_dv)
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    NK = K // plan.BK_dq
    if gate == 2:
        dgl = torch.empty(B, T, H, K, dtype=f32, device=dev)
        cpart = torch.empty(1, B, NT, H, K, dtype=f32, device=dev)
    elif gate == 1:
        dgl = torch.empty(NK, B, T, H, dtype=f32, device=dev)
        cpart = torch.empty(NK, B, NT, H, dtype=f32, device=dev)
    else:
        dgl = cpart = dummy
    _bwd_dqdk_kernel[(NK, NT, BH)](q, k, v, gg, do, hs, dhs, dq, dk, dgl, cpart, scale, B, T, NT, H=H, K=K, V=V,
                                   BT=plan.BT, BK=plan.BK_dq, BV=plan.BV_dq, GATE=gate, IP=plan.IP,
                                   EMU=plan.EMU, num_warps=plan.warps_dq)
    return dq, dk, dv, ((dgl, cpart) if gate else None)


def gate_grads(g, terms, plan):
    """(K9) + (K10): ``dg`` in ``g``'s dtype from the per-position terms and the chunk carries.

    ``dL/dB_t`` (``B_t = g_1 + … + g_t`` over the whole sequence) is ``q·dq − k·dk``; ``dg_t`` is its
    reverse cumulative sum, formed per chunk from the chunk's carry ``<h_{c+1}, dh_c>`` (which
    includes the final state's gradient) plus a suffix sum inside the chunk."""
    dgl, cpart = terms
    B, T, H = g.shape[:3]
    KG = g.shape[3] if plan.gate == 2 else 1
    NP = cpart.shape[0]
    dg = torch.empty_like(g)
    BKG = min(KG, 64)
    _dg_kernel[(KG // BKG, plan.NT, B * H)](dgl, cpart, dg, B, T, plan.NT, NP, H=H, KG=KG, BT=plan.BT, BK=BKG,
                                            num_warps=4)
    return dg
