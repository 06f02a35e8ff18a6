"""Stage: the forward march (state on chip), the segment combine, and the per-chunk states.

One program per (batch·head, V-block) marches over the chunks with the state ``S[K, BV]`` in
float32 registers, applying (K1) and (K2) of ``kernels/gla/DERIVATION.md`` chunk after chunk and writing
only ``o``. When batch·heads is too small to fill the GPU the sequence is cut into ``NS``
segments (K3): every segment's own contribution to the state and its total decay, in parallel; a
short sequential combine for the segments' entering states; then the march per segment.
:func:`march_forward` is the forward; :func:`chunk_states` recomputes the state entering every
chunk for the backward (the march without outputs).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.tiles import round_operand, round_store

__all__ = ["march_forward", "chunk_states", "chunk_states_and_final", "segment_entering_states", "combine_segments"]


@triton.jit
def _fwd_kernel(q, k, v, g, o, h0, ht, dec, hs, As, scale, T, NT, SEG_CHUNKS, NS,
                H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                GATE: tl.constexpr, HAS_H0: tl.constexpr, COMPUTE_O: tl.constexpr,
                STORE_FINAL: tl.constexpr, STORE_DEC: tl.constexpr, STORE_H: tl.constexpr,
                IP: tl.constexpr, EMU: tl.constexpr, PRE: tl.constexpr = False):
    """March over the chunks of one segment with the state ``S[BK, BV]`` in registers.

    ``PRE`` (vector gate): the inputs are the outputs of the prep stage (``kernels/gla/prep.py``):
    ``q`` = scale * q e^{b}, ``k`` = k e^{b_C - b}, ``g`` = the per-chunk decays ``[B*H, NT, K]``
    (fp32), ``As`` the scores; the march is then the ungated one plus ``S *= e^{b_C}`` per chunk.
    Without ``PRE`` the vector gate is marched only for the states (``COMPUTE_O=False``: the
    backward's recomputation).

    grid = (NK * NV, B*H*NS). ``h0``/``ht``: per-(bh, segment) entering/leaving states
    ``[B*H*NS, K, V]`` fp32; ``dec``: per-(bh, segment) total log decay (``[B*H*NS, K]``);
    ``hs``: per-chunk entering states ``[B*H, NT, K, V]`` fp32. ``COMPUTE_O`` needs ``BK == K``.
    ``As``: vector gate only, the intra-chunk scores (times the scale) ``[B*H, NT*BT, BT]`` written by
    the prep stage.
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
            tl.store(hs + (i_bh * NT + c).to(tl.int64) * K * V + st_offs, round_store(S, hs.dtype.element_ty, EMU),
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
                o_c = tl.dot(round_operand(q_t, DT, EMU), round_operand(S, DT, EMU), input_precision=IP)
                A = tl.load(As + (i_bh * NT + c).to(tl.int64) * BT * BT + o_t[:, None] * BT + o_t[None, :],
                            mask=(c < NT) & (o_t[:, None] >= 0), other=0.)
            else:
                # q goes to the tensor cores as loaded (so its load is pipelined); the scale and
                # the scalar decays act on the float32 results
                q_t = tl.load(q + qk_base + rows[:, None] * (H * K) + o_k[None, :], mask=mask_t[:, None],
                              other=0.)
                o_c = tl.dot(round_operand(q_t, DT, EMU), round_operand(S, DT, EMU), input_precision=IP)       # [BT, BV]
                A = tl.dot(round_operand(q_t, DT, EMU), tl.trans(round_operand(k_t, DT, EMU)), input_precision=IP)   # [BT, BT]
                causal = o_t[:, None] >= o_t[None, :]
                if GATE == 1:
                    o_c = o_c * (scale * tl.exp(b_t))[:, None]
                    A = A * (scale * tl.exp(tl.where(causal, b_t[:, None] - b_t[None, :], float("-inf"))))
                else:
                    o_c = o_c * scale
                    A = tl.where(causal, A * scale, 0.)
            o_c += tl.dot(round_operand(A, DT, EMU), round_operand(v_t, DT, EMU), input_precision=IP)
            tl.store(o + v_base + rows[:, None] * (H * V) + o_v[None, :], round_store(o_c, o.dtype.element_ty, EMU),
                     mask=mask_t[:, None])
        # state update: S <- e^{b_C} S + (K * e^{b_C - b})^T V
        if GATE == 0:
            S += tl.dot(tl.trans(round_operand(k_t, DT, EMU)), round_operand(v_t, DT, EMU), input_precision=IP)
        if GATE == 1:
            # the per-token decay e^{b_C - b_j} scales row j of V (64 columns) rather than of K (so
            # k goes to the tensor cores as loaded)
            vg = round_operand((v_t.to(tl.float32) * tl.exp(b_c - b_t)[:, None]), DT, EMU)
            S = S * tl.exp(b_c) + tl.dot(tl.trans(round_operand(k_t, DT, EMU)), vg, input_precision=IP)
            total += b_c
        if GATE == 2:
            if PRE:
                S = S * tl.exp(b_c)[:, None] + tl.dot(tl.trans(round_operand(k_t, DT, EMU)), round_operand(v_t, DT, EMU),
                                                      input_precision=IP)
            else:
                kg = round_operand((k_t.to(tl.float32) * tl.exp(b_c[None, :] - b_t)), DT, EMU)
                S = S * tl.exp(b_c)[:, None] + tl.dot(tl.trans(kg), round_operand(v_t, DT, EMU), input_precision=IP)
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


def combine_segments(contrib, dec, h0, plan, B, H, K, V, store_final, reverse=False):
    """(K3) over the segments, in order (``reverse``: from the last; for state gradients). Returns the
    state entering every segment ``[B·H·NS, K, V]`` and, with ``store_final``, the one leaving the last."""
    f32 = torch.float32
    dev = contrib.device
    dummy = torch.empty(1, dtype=f32, device=dev)
    inits = torch.empty(B * H * plan.NS, K, V, dtype=f32, device=dev)
    out = torch.empty(B, H, K, V, dtype=f32, device=dev) if store_final else None
    _combine_kernel[((K // plan.BK_s) * (V // plan.BV_s), B * H)](
        contrib, dec, h0 if h0 is not None else dummy, inits, out if out is not None else dummy, plan.NS,
        K=K, V=V, BK=plan.BK_s, BV=plan.BV_s, GATE=plan.gate, HAS_H0=h0 is not None,
        STORE_FINAL=store_final, REVERSE=reverse, num_warps=4)
    return inits, out


def segment_entering_states(q, k, v, g, h0, scale: float, plan, output_final_state: bool):
    """Over gla's sequence split (``plan.NS > 1``): every segment's own sum from a zero state (K1),
    then the combine in order (K3). Returns the state entering every segment ``[B·H·NS, K, V]``
    float32 and, with ``output_final_state``, the final state ``[B, H, K, V]`` (else ``None``).
    MesaNet's state of ``H`` (:mod:`kernels.mesa.states`) starts from here too."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    BH, NS, dev, f32 = B * H, plan.NS, q.device, torch.float32
    dummy = torch.empty(1, dtype=f32, device=dev)
    contrib = torch.empty(BH * NS, K, V, dtype=f32, device=dev)
    dec = torch.zeros(BH * NS, K if plan.gate == 2 else 1, dtype=f32, device=dev)
    _fwd_kernel[((K // plan.BK_s) * (V // plan.BV_s), BH * NS)](
        q, k, v, g if g is not None else q, dummy, dummy, contrib, dec, dummy, dummy, scale, T, plan.NT,
        plan.SEG, NS, H=H, K=K, V=V, BT=plan.BT, BK=plan.BK_s, BV=plan.BV_s, GATE=plan.gate, HAS_H0=False,
        COMPUTE_O=False, STORE_FINAL=True, STORE_DEC=plan.gate != 0, STORE_H=False, IP=plan.IP, EMU=plan.EMU,
        PRE=plan.gate == 2, num_warps=plan.warps_s, num_stages=plan.stages_s)
    return combine_segments(contrib, dec, h0, plan, B, H, K, V, output_final_state)


def march_forward(q, k, v, g, As, h0, scale: float, plan, output_final_state: bool):
    """``o`` and the final state (or ``None``), and the segment entering states the backward starts
    from. For the vector gate ``q``, ``k``, ``g`` and ``As`` are the prep stage's outputs."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    BH = B * H
    dev = q.device
    f32 = torch.float32
    pre = plan.gate == 2
    o = torch.empty(B, T, H, V, dtype=v.dtype, device=dev)
    gg = g if g is not None else q                 # placeholder pointer when there is no gate
    dummy = torch.empty(1, dtype=f32, device=dev)
    As = As if As is not None else dummy
    common = dict(H=H, K=K, V=V, BT=plan.BT, GATE=plan.gate, IP=plan.IP, EMU=plan.EMU, PRE=pre)
    if plan.NS == 1:
        ht = torch.empty(B, H, K, V, dtype=f32, device=dev) if output_final_state else None
        _fwd_kernel[(V // plan.BV_f, BH)](
            q, k, v, gg, o, h0 if h0 is not None else dummy, ht if ht is not None else dummy, dummy, dummy, As,
            scale, T, plan.NT, plan.SEG, plan.NS, BK=K, BV=plan.BV_f, HAS_H0=h0 is not None, COMPUTE_O=True,
            STORE_FINAL=ht is not None, STORE_DEC=False, STORE_H=False, num_warps=plan.warps_f,
            num_stages=plan.stages_f, **common)
        return o, ht, h0
    NS = plan.NS
    inits, ht = segment_entering_states(q, k, v, g, h0, scale, plan, output_final_state)
    _fwd_kernel[(V // plan.BV_f, BH * NS)](
        q, k, v, gg, o, inits, dummy, dummy, dummy, As, scale, T, plan.NT, plan.SEG, NS, BK=K, BV=plan.BV_f,
        HAS_H0=True, COMPUTE_O=True, STORE_FINAL=False, STORE_DEC=False, STORE_H=False,
        num_warps=plan.warps_f, num_stages=plan.stages_f, **common)
    return o, ht, inits


def chunk_states(q, k, v, g, inits, scale: float, plan):
    """The state entering every chunk, ``[B·H, NT, K, V]`` in ``plan.state_dtype``, recomputed from
    the segment entering states ``inits`` (parallel over segments), and each segment's total log
    decay ``[B·H·NS, K or 1]`` (zeros without a gate or a split) for the reverse combine."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    BH = B * H
    dev = q.device
    f32 = torch.float32
    dummy = torch.empty(1, dtype=f32, device=dev)
    split = plan.NS > 1
    hs = torch.empty(BH, plan.NT, K, V, dtype=plan.state_dtype, device=dev)
    dec = torch.zeros(BH * plan.NS, K if plan.gate == 2 else 1, dtype=f32, device=dev) \
        if (split and plan.gate) else dummy
    _fwd_kernel[((K // plan.BK_s) * (V // plan.BV_s), BH * plan.NS)](
        q, k, v, g if g is not None else q, dummy, inits if inits is not None else dummy, dummy, dec, hs, dummy,
        scale, T, plan.NT, plan.SEG, plan.NS, H=H, K=K, V=V, BT=plan.BT, BK=plan.BK_s, BV=plan.BV_s,
        GATE=plan.gate, HAS_H0=inits is not None, COMPUTE_O=False, STORE_FINAL=False,
        STORE_DEC=split and plan.gate != 0, STORE_H=True, IP=plan.IP, EMU=plan.EMU, num_warps=plan.warps_s, num_stages=plan.stages_s)
    return hs, dec


def chunk_states_and_final(q, k, v, g, h0, scale: float, plan, output_final_state: bool):
    """One march (``plan.NS == 1``, no split) from ``h0``: the state entering every chunk
    ``[B·H, NT, K, V]`` (``plan.state_dtype``) and, with ``output_final_state``, the final state
    ``[B, H, K, V]`` float32 (else ``None``). MesaNet's states of ``H`` are this march
    (:mod:`kernels.mesa.states`)."""
    assert plan.NS == 1, "one segment: with gla's split, segment_entering_states then chunk_states"
    B, T, H, K = q.shape
    V = v.shape[-1]
    dev, f32 = q.device, torch.float32
    dummy = torch.empty(1, dtype=f32, device=dev)
    hs = torch.empty(B * H, plan.NT, K, V, dtype=plan.state_dtype, device=dev)
    ht = torch.empty(B, H, K, V, dtype=f32, device=dev) if output_final_state else None
    _fwd_kernel[((K // plan.BK_s) * (V // plan.BV_s), B * H)](
        q, k, v, g if g is not None else q, dummy, h0 if h0 is not None else dummy,
        ht if ht is not None else dummy, dummy, hs, dummy, scale, T, plan.NT, plan.SEG, 1, H=H, K=K, V=V,
        BT=plan.BT, BK=plan.BK_s, BV=plan.BV_s, GATE=plan.gate, HAS_H0=h0 is not None, COMPUTE_O=False,
        STORE_FINAL=ht is not None, STORE_DEC=False, STORE_H=True, IP=plan.IP, EMU=plan.EMU,
        num_warps=plan.warps_s, num_stages=plan.stages_s)
    return hs, ht
