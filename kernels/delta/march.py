"""Stage: the sequential march over chunks, the state on chip for the whole sequence.

Two forms. Training (:func:`state_forward`, the W/U form): per chunk ``v' = U − W S``, the output
and the next state, writing the state entering every chunk and ``v'`` for the backward; there is
no state round trip through memory and no separate output kernel. Inference (:func:`inference_forward`,
the T form, when no input needs a gradient): ``v' = U − W S = T (β ⊙ (v − e^{b} ⊙ K S))``, so
``W`` and ``U`` are never formed; the march reads ``T`` and ``v`` instead (one more
``[64, 64] × [64, BV]`` product per step, two fewer ``[64, K]`` tiles through memory per chunk).
When the march is a single partial wave of programs (small batch × heads), its chunks are cut
into ranges and the per-chunk kernels of later ranges run on a side CUDA stream while the march
works through earlier ones.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import launch
from .plan import CHUNK
from ..common.solve import solve_chunks
from .wy import _mask_gate, chunk_scores

__all__ = ["state_forward", "inference_forward"]

# Runtime sizes are not specialised (Triton would otherwise compile a new variant for T == 1,
# T % 16 == 0, H == 1, ...): alignment comes from the constexpr head sizes that multiply every
# offset, and one compiled kernel per (dtype, K, V, flags) serves all sequence lengths and heads.
_NO_SPEC = ["T", "H", "NT", "NTC"]


@triton.jit
def _load_state(ptr, i_bh, ck, cv, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, PRESENT: tl.constexpr):
    """Columns ``cv`` of one ``[K, V]`` float32 state (initial state or final-state gradient) of
    sequence·head ``i_bh``, or zeros when there is none."""
    if PRESENT:
        return tl.load(ptr + i_bh * K * V + ck[:, None] * V + cv[None, :]).to(tl.float32)
    return tl.zeros([K, BV], dtype=tl.float32)


@triton.jit(do_not_specialize=_NO_SPEC)
def _state_fwd_kernel(q_ptr, k_ptr, w_ptr, u_ptr, b_ptr, a_ptr, o_ptr, h0_ptr, ht_ptr, hs_ptr, vp_ptr,
                      scale, T, H, NT, NTC,
                      K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                      HAS_H0: tl.constexpr, STORE_HT: tl.constexpr, STORE_HS: tl.constexpr):
    """Sequential over chunks, state ``S[K, BV]`` on chip: per chunk the pseudo-values
    ``v' = U − W S``, the output ``o = (q ⊙ e^{b}) S + P v'`` (``P`` the stored scores) and the next
    state ``S ← e^{b_C} S + (k ⊙ e^{b_C − b})ᵀ v'``. For training (``STORE_HS``) it also writes the
    state entering every chunk and ``v'`` (the backward reads both)."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)     # 64-bit offsets: [B*H, NT, K, V] buffers get large
    i_b = i_bh // H
    i_h = i_bh % H
    dt = q_ptr.dtype.element_ty
    rc = tl.arange(0, 64)
    ck = tl.arange(0, K)
    cv = i_v * BV + tl.arange(0, BV)
    qp = q_ptr + (i_b * T * H + i_h) * K
    kp = k_ptr + (i_b * T * H + i_h) * K
    op = o_ptr + (i_b * T * H + i_h) * V
    wp = w_ptr + i_bh * NTC * K
    up = u_ptr + i_bh * NTC * V
    bp = b_ptr + i_bh * NTC
    S = _load_state(h0_ptr, i_bh, ck, cv, K, V, BV, HAS_H0)
    for n in range(NT):
        t0 = n * 64
        if STORE_HS:
            tl.store(hs_ptr + (i_bh * NT + n) * K * V + ck[:, None] * V + cv[None, :], S.to(hs_ptr.dtype.element_ty))
        rows = t0 + rc
        rmask = rows < T
        q = tl.load(qp + rows[:, None] * (H * K) + ck[None, :], mask=rmask[:, None], other=0.0)
        k = tl.load(kp + rows[:, None] * (H * K) + ck[None, :], mask=rmask[:, None], other=0.0)
        w = tl.load(wp + rows[:, None] * K + ck[None, :])
        u = tl.load(up + rows[:, None] * V + cv[None, :]).to(tl.float32)
        b = tl.load(bp + rows)
        b_last = tl.load(bp + t0 + 63)
        Sd = S.to(dt)
        vp = u - tl.dot(w, Sd, input_precision=PREC)                      # pseudo-values v'
        vpd = vp.to(dt)
        if STORE_HS:
            tl.store(vp_ptr + (i_bh * NTC + rows[:, None]) * V + cv[None, :], vpd)
        qe = (q.to(tl.float32) * (tl.exp(b) * scale)[:, None]).to(dt)
        o = tl.dot(qe, Sd, input_precision=PREC)
        sd = tl.load(a_ptr + (i_bh * NTC + rows[:, None]) * 64 + rc[None, :])
        o += tl.dot(sd, vpd, input_precision=PREC)
        tl.store(op + rows[:, None] * (H * V) + cv[None, :], o.to(o_ptr.dtype.element_ty),
                 mask=rmask[:, None])
        kd = (k.to(tl.float32) * tl.exp(b_last - b)[:, None]).to(dt)
        S = S * tl.exp(b_last) + tl.dot(tl.trans(kd), vpd, input_precision=PREC)
    if STORE_HT:
        tl.store(ht_ptr + i_bh * K * V + ck[:, None] * V + cv[None, :], S)


@triton.jit(do_not_specialize=_NO_SPEC + ["N0", "N1"])
def _march_t_kernel(q_ptr, k_ptr, v_ptr, beta_ptr, b_ptr, t_ptr, a_ptr, o_ptr, h0_ptr, ht_ptr,
                    scale, T, H, NT, NTC, N0, N1,
                    K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                    HAS_H0: tl.constexpr, STORE_HT: tl.constexpr, HAS_A: tl.constexpr, EVEN: tl.constexpr):
    """Sequential over chunks, state ``S[K, BV]`` on chip, from ``T`` instead of ``W``, ``U``:
    ``v' = T (β ⊙ (v − e^{b} ⊙ K S))`` (the same as ``U − W S``), ``o = e^{b}·scale ⊙ (q S) + P v'``,
    ``S ← e^{b_C} S + Kᵀ (e^{b_C − b} ⊙ v')``. The gate and scale factors multiply rows of the
    float32 products, so ``q`` and ``k`` enter the tensor cores as loaded. ``HAS_A``: the scores
    ``P`` were stored by an earlier kernel; else they are formed here. ``EVEN``: ``T`` is a
    multiple of 64, so no tile needs a row mask (fewer instructions per step of this
    latency-bound loop)."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    dt = q_ptr.dtype.element_ty
    rc = tl.arange(0, 64)
    ck = tl.arange(0, K)
    cv = i_v * BV + tl.arange(0, BV)
    qp = q_ptr + (i_b * T * H + i_h) * K
    kp = k_ptr + (i_b * T * H + i_h) * K
    vp_ = v_ptr + (i_b * T * H + i_h) * V
    op = o_ptr + (i_b * T * H + i_h) * V
    btp = beta_ptr + i_bh * NTC     # β as float32 [B·H, NT·64]: streamed in with the tiles below
    tp = t_ptr + i_bh * NTC * 64
    bp = b_ptr + i_bh * NTC
    S = _load_state(h0_ptr, i_bh, ck, cv, K, V, BV, HAS_H0)
    for n in range(N0, N1):   # chunks N0 .. N1-1 (a range of the segmented forward)
        t0 = n * 64
        rows = t0 + rc
        rmask = rows < T
        qo = rows[:, None] * (H * K) + ck[None, :]
        vo = rows[:, None] * (H * V) + cv[None, :]
        if EVEN:
            q = tl.load(qp + qo)
            k = tl.load(kp + qo)
            v = tl.load(vp_ + vo)
        else:
            q = tl.load(qp + qo, mask=rmask[:, None], other=0.0)
            k = tl.load(kp + qo, mask=rmask[:, None], other=0.0)
            v = tl.load(vp_ + vo, mask=rmask[:, None], other=0.0)
        beta = tl.load(btp + rows)
        tm = tl.load(tp + rows[:, None] * 64 + rc[None, :])
        b = tl.load(bp + rows)
        b_last = tl.load(bp + t0 + 63)
        eb = tl.exp(b)
        Sd = S.to(dt)
        x = beta[:, None] * (v.to(tl.float32) - eb[:, None] * tl.dot(k, Sd, input_precision=PREC))
        vpp = tl.dot(tm, x.to(dt), input_precision=PREC)                   # pseudo-values v'
        o = tl.dot(q, Sd, input_precision=PREC) * (eb * scale)[:, None]
        if HAS_A:
            sd = tl.load(a_ptr + (i_bh * NTC + rows[:, None]) * 64 + rc[None, :])
        else:
            sd = _mask_gate(tl.dot(q, tl.trans(k), input_precision=PREC), b, scale).to(dt)
        o = tl.dot(sd, vpp.to(dt), acc=o, input_precision=PREC)
        if EVEN:
            tl.store(op + vo, o.to(o_ptr.dtype.element_ty))
        else:
            tl.store(op + vo, o.to(o_ptr.dtype.element_ty), mask=rmask[:, None])
        vk = (vpp * tl.exp(b_last - b)[:, None]).to(dt)
        S = tl.dot(tl.trans(k), vk, acc=S * tl.exp(b_last), input_precision=PREC)
    if STORE_HT:
        tl.store(ht_ptr + i_bh * K * V + ck[:, None] * V + cv[None, :], S)


def _precision(dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def state_forward(q, k, w, u, b, a, scale: float, h0, output_final_state: bool, store_states: bool, plan):
    """The W/U-form march. Returns ``o``, the final state (or ``None``) and, for training
    (``store_states``), the state entering every chunk and the pseudo-values ``v'`` (input dtype)."""
    B, T, H, K = q.shape
    V = u.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    NTC = NT * CHUNK
    BH = B * H
    dev = q.device
    o = torch.empty(B, T, H, V, dtype=q.dtype, device=dev)
    ht = torch.empty(B, H, K, V, dtype=torch.float32, device=dev) if output_final_state else None
    # chunk states and v' in the input dtype: every use in the backward feeds a tensor-core product
    # in that dtype anyway, and 16 bits halve the largest saved tensors
    hs = torch.empty(BH, NT, K, V, dtype=q.dtype, device=dev) if store_states else None
    vp = torch.empty(BH, NTC, V, dtype=q.dtype, device=dev) if store_states else None
    launch(_state_fwd_kernel, (V // plan.fwd_bv, BH),
           (q, k, w, u, b, a, o, h0 if h0 is not None else o, ht if ht is not None else o,
            hs if hs is not None else o, vp if vp is not None else o, float(scale), T, H, NT, NTC),
           dict(K=K, V=V, BV=plan.fwd_bv, PREC=_precision(q.dtype), HAS_H0=h0 is not None,
                STORE_HT=output_final_state, STORE_HS=store_states), plan.fwd)
    return o, ht, hs, vp


_SIDE: dict = {}


def _side_stream(dev):
    """One side CUDA stream per device, for work that overlaps the sequential march."""
    key = torch.device(dev).index
    if key not in _SIDE:
        _SIDE[key] = torch.cuda.Stream(device=dev)
    return _SIDE[key]


def inference_forward(q, k, v, b, beta, bt, scale: float, h0, output_final_state: bool, plan):
    """The T-form forward: ``T`` (:func:`kernels.common.solve.solve_chunks`), the scores where the
    march reads them stored (:func:`kernels.delta.wy.chunk_scores`), then the march. ``bt``: ``β``
    as float32 ``[B·H, NT·64]``. Returns ``o`` and the final state (or ``None``).

    With several chunk ranges (``plan.march_ranges``) the solve and the scores of range ``i + 1`` run
    on a side stream while the march works through range ``i`` (each march launch starts from the
    state the previous one left in ``ht``): when the march is a single partial wave, latency-bound,
    the per-chunk kernels fill its SMs' idle issue slots instead of running before it."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    NTC = NT * CHUNK
    BH = B * H
    dev = q.device
    BV = plan.march_bv
    stored = plan.march_scores_stored
    nseg = max(1, min(plan.march_ranges, NT))
    edges = [NT * i // nseg for i in range(nseg + 1)]
    segs = [(edges[i], edges[i + 1]) for i in range(nseg)]
    tm = torch.empty(BH, NTC, CHUNK, dtype=k.dtype, device=dev)
    a = torch.empty(BH, NTC, CHUNK, dtype=k.dtype, device=dev) if stored else None
    o = torch.empty(B, T, H, V, dtype=q.dtype, device=dev)
    ht = torch.empty(B, H, K, V, dtype=torch.float32, device=dev) \
        if (output_final_state or len(segs) > 1) else None

    def per_chunk(n0, n1):
        solve_chunks(k, b, beta, plan, tm, n0, n1)
        if stored:
            chunk_scores(q, k, b, beta, tm, a, scale, plan, n0, n1)

    side = _side_stream(dev) if len(segs) > 1 and dev.type == "cuda" else None
    events = []
    if side is not None:
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for n0, n1 in segs:
                per_chunk(n0, n1)
                events.append(torch.cuda.Event())
                events[-1].record(side)
    for i, (n0, n1) in enumerate(segs):
        if side is None:
            per_chunk(n0, n1)
        else:
            torch.cuda.current_stream(dev).wait_event(events[i])
        s0 = h0 if i == 0 else ht
        launch(_march_t_kernel, (V // BV, BH),
               (q, k, v, bt, b, tm, a if stored else tm, o, s0 if s0 is not None else o,
                ht if ht is not None else o, float(scale), T, H, NT, NTC, n0, n1),
               dict(K=K, V=V, BV=BV, PREC=_precision(q.dtype), HAS_H0=s0 is not None, STORE_HT=ht is not None,
                    HAS_A=stored, EVEN=T % CHUNK == 0 and plan.march_even), plan.march)
    return o, ht if output_final_state else None
