"""Stage 2's gradient across windows: the pairs of blocks in different windows, without a per-pair write.

Windows are ``m`` consecutive blocks of 64 tokens (``plan.window_blocks``). For a query block ``i``
in window ``a`` and a key block ``l`` in an earlier window ``w``, with ``P_b = I − W_bᵀ U_b``:

- ``Q^a_i = Q̃_i P_{i−1} ⋯ P_{s(a)}``, the queries pulled to their window's start;
- ``K̄_l = K̂_l P_{l+1}ᵀ ⋯ P_{e(w)}ᵀ``, the keys pushed to their window's end;
- ``Π_v = P_{e(v)} ⋯ P_{s(v)}``, a window's product (``X Π_v`` carries rows across window ``v``);
- ``X_{i,w} = Q^a_i Π_{a−1} ⋯ Π_{w+1}`` and the scores ``S_il = X_{i,w} K̄_lᵀ``.

The passes (the algebra checked against autograd in float64: ``lab/windowed_bwd.py``):

1. :func:`window_prepare`: ``Q^a``, ``K̄`` and ``Π``;
2. ``_cross_q_kernel``, query-major: down the windows ``X ← X Π_{w+1}`` and ``G_w = Σ_{l∈w} dS K̄_l``,
   up the Horner sum ``R ← R Π_vᵀ + G_v`` with ``M_v += X_vᵀ R``; ``dQ^a = R``;
3. ``_cross_k_kernel``, key-major: ``dK̄_l = Σ_i dS_ilᵀ X_{i,w}`` and ``dV_l`` with ``X = Q^a Φ``
   recomputed from a running ``Φ = Π_{a−1} ⋯ Π_{w+1}``, or (``plan.cross_carry``) the key block
   carried instead, once a window: ``K̃ = K̄_l Φᵀ``, ``S = Q^a K̃ᵀ``, ``dK̄_l = (Σ_{i∈a} dS_ilᵀ Q^a_i) Φ``;
   no atomics;
4. the pairs inside a window: :func:`kernels.path.backward.path_backward`'s walk stopped at the
   window's start, its Horner sum started from ``dQ^a``;
5. ``_key_push_bwd_kernel``: ``dK̄ → dK̂`` and the crossed blocks' ``dP``;
6. ``_window_products_bwd_kernel``: ``M_v → dP_b`` inside each window.

Every ``dP_b`` reaches the per-block backward as ``gw = W_b dP_b`` and ``hu = U_b dP_bᵀ``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import launch
from .forward import _add_tile as _add, _gates, _probs, _put_tile as _put, _query_block, _tile, _tile_rows

__all__ = ["window_blocks", "window_prepare", "cross_window_grads", "window_grads_back"]


@triton.jit
def _cross(x, a_ptr, b_ptr, s0, K: tl.constexpr, PREC: tl.constexpr):
    """``x − (x Aᵀ) B`` with ``A, B`` the ``[64, K]`` tiles at row ``s0``: ``x P_b`` for
    ``(A, B) = (W_b, U_b)``, ``x P_bᵀ`` for ``(U_b, W_b)``; float32 in, float32 out."""
    td = a_ptr.dtype.element_ty
    a = tl.dot(x.to(td), tl.trans(_tile(a_ptr, s0, K)), input_precision=PREC)
    return x - tl.dot(a.to(td), _tile(b_ptr, s0, K), input_precision=PREC)


@triton.jit(do_not_specialize=["NT", "NTC", "NW"])
def _window_prep_kernel(qt_ptr, kh_ptr, u_ptr, wt_ptr, qa_ptr, kbar_ptr, pi_ptr, NT, NTC, NW,
                        WB: tl.constexpr, K: tl.constexpr, PREC: tl.constexpr):
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    buf = i_bh * NTC * K
    ws = i_t // WB * WB
    we = tl.minimum(ws + WB, NT) - 1
    t0 = i_t * 64
    # Q^a: the block's queries walked down to the window's start
    x = _tile(qt_ptr + buf, t0, K).to(tl.float32)
    for n in range(0, i_t - ws):
        x = _cross(x, wt_ptr + buf, u_ptr + buf, (i_t - 1 - n) * 64, K, PREC)
    _put(qa_ptr + buf, t0, x, 64, K)
    # K̄: the block's keys pushed up to the window's end, z ← z P_bᵀ
    z = _tile(kh_ptr + buf, t0, K).to(tl.float32)
    for b in range(i_t + 1, we + 1):
        z = _cross(z, u_ptr + buf, wt_ptr + buf, b * 64, K, PREC)
    _put(kbar_ptr + buf, t0, z, 64, K)
    # Π: the first block of each window forms its product, Π ← Π P_b from the last block down
    if i_t == ws:
        r = tl.arange(0, K)
        p = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
        for n in range(0, we - ws + 1):
            td = wt_ptr.dtype.element_ty
            s0 = (we - n) * 64
            a = tl.dot(p.to(td), tl.trans(_tile(wt_ptr + buf, s0, K)), input_precision=PREC)
            p -= tl.dot(a.to(td), _tile(u_ptr + buf, s0, K), input_precision=PREC)
        _put(pi_ptr + (i_bh * NW + i_t // WB) * K * K, 0, p, K, K)


def window_blocks(plan, NTC: int) -> int:
    """Blocks per window for buffers of ``NTC`` rows a head: ``plan.window_blocks``, or 0 (no
    windows) when the plan has none or one window would hold every block."""
    WB = plan.window_blocks
    return WB if WB and NTC // 64 > WB else 0


def window_prepare(qt, kh, u, wt, plan):
    """Pass 1: ``(qa, kbar, pi)``: ``Q^a`` and ``K̄`` in the prepared layout and transport dtype,
    ``Π`` float32 ``[B·H, NW, K, K]``."""
    BH, NTC, K = qt.shape
    NT = NTC // 64
    WB = plan.window_blocks
    NW = triton.cdiv(NT, WB)
    qa, kbar = torch.zeros_like(qt), torch.zeros_like(kh)
    pi = torch.empty(BH, NW, K, K, dtype=torch.float32, device=qt.device)
    launch(_window_prep_kernel, (NT, BH), (qt, kh, u, wt, qa, kbar, pi, NT, NTC, NW),
           dict(WB=WB, K=K, PREC=plan.precision), plan.bwd)
    return qa, kbar, pi


@triton.jit(do_not_specialize=["T", "H", "NQ", "NTC", "BH", "NW"])
def _cross_q_kernel(qa_ptr, kbar_ptr, pi_ptr, v_ptr, do_ptr, lse_ptr, dlt_ptr, G_ptr,
                    dqa_ptr, m_ptr, dG_ptr, xs_ptr, gs_ptr,
                    T, H, NQ, NTC, BH, NW, scale, qk_scale, g_to_s,
                    WB: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BM: tl.constexpr,
                    HAS_G: tl.constexpr, PREC: tl.constexpr):
    i_p = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, 64)
    kk = tl.arange(0, K)
    td = qa_ptr.dtype.element_ty
    xs_base = xs_ptr + i_p.to(tl.int64) * NW * BM * K       # this program's slot: X_w and G_w per window
    gs_base = gs_ptr + i_p.to(tl.int64) * NW * BM * K
    for i_mbh in range(i_p, NQ * BH, nprog):
        i_bh, t0, rows, valid, do, lse, dlt, g_row = _query_block(i_mbh, NQ, BH, T, H, NTC, do_ptr, lse_ptr, dlt_ptr,
                                                                  G_ptr, V, BM, HAS_G)
        i_b = i_bh // H
        i_h = i_bh % H
        i_a = t0 // 64 // WB                                 # the queries' window
        buf = i_bh * NTC * K
        v_base = v_ptr + (i_b * T * H + i_h) * V
        g_base = G_ptr + i_b * T * H + i_h
        dg_row = tl.zeros([BM], dtype=tl.float32)
        x = _tile_rows(qa_ptr + buf, t0, BM, K).to(tl.float32)
        pi_base = pi_ptr + i_bh * NW * K * K
        # down: X_w, then G_w = Σ_{l∈w} dS K̄_l
        for n in range(0, i_a):
            w = i_a - 1 - n
            if n > 0:
                x = tl.dot(x.to(td), _tile_rows(pi_base + (w + 1) * K * K, 0, K, K).to(td), input_precision=PREC)
            xt = x.to(td)
            _put(xs_base + w * BM * K, 0, xt, BM, K)
            g = tl.zeros([BM, K], dtype=tl.float32)
            for j in range(0, WB):
                s0 = (w * WB + j) * 64
                kb = _tile(kbar_ptr + buf, s0, K)
                s = tl.dot(xt, tl.trans(kb), input_precision=PREC)
                if HAS_G:
                    s += (g_row[:, None] - _gates(g_base, s0, T, H)[None, :]) * g_to_s
                v = tl.load(v_base + (s0 + cols).to(tl.int64)[:, None] * (H * V) + tl.arange(0, V)[None, :])
                p, dz = _probs(s, lse, valid, do, v, dlt, qk_scale, PREC)
                g += tl.dot((dz * scale).to(td), kb, input_precision=PREC)
                if HAS_G:
                    dg_row += tl.sum(dz, 1)
            _put(gs_base + w * BM * K, 0, g, BM, K)
        tl.debug_barrier()
        # up: M_v += X_vᵀ R, R ← R Π_vᵀ + G_v
        racc = tl.zeros([BM, K], dtype=tl.float32)
        for v in range(0, i_a):
            rt = racc.to(td)
            xv = _tile_rows(xs_base + v * BM * K, 0, BM, K)
            mv = tl.dot(tl.trans(xv), rt, input_precision=PREC)
            tl.atomic_add(m_ptr + ((i_bh * NW + v) * K + kk[:, None]) * K + kk[None, :], mv, sem="relaxed")
            pv = _tile_rows(pi_base + v * K * K, 0, K, K).to(td)
            racc = tl.dot(rt, tl.trans(pv), input_precision=PREC) \
                + _tile_rows(gs_base + v * BM * K, 0, BM, K).to(tl.float32)
        _put(dqa_ptr + buf, t0, racc, BM, K)
        if HAS_G:
            tl.atomic_add(dG_ptr + i_bh * NTC + rows, dg_row, sem="relaxed")
        tl.debug_barrier()


@triton.jit(do_not_specialize=["T", "H", "NT", "NTC", "NW"])
def _cross_k_kernel(qa_ptr, kbar_ptr, pi_ptr, v_ptr, do_ptr, lse_ptr, dlt_ptr, G_ptr,
                    dkbar_ptr, dv_ptr, dG_ptr,
                    T, H, NT, NTC, NW, scale, qk_scale, g_to_s,
                    WB: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BM: tl.constexpr,
                    BN: tl.constexpr, HAS_G: tl.constexpr, PREC: tl.constexpr, CARRY: tl.constexpr):
    # BN keys a program (64, or 128 inside one window) meet BM query rows a step
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    s0 = i_t * BN
    i_w = s0 // 64 // WB
    buf = i_bh * NTC * K
    td = qa_ptr.dtype.element_ty
    r = tl.arange(0, BM)
    kk = tl.arange(0, K)
    cols = tl.arange(0, BN)
    v_base = v_ptr + (i_b * T * H + i_h) * V
    do_base = do_ptr + (i_b * T * H + i_h) * V
    g_base = G_ptr + i_b * T * H + i_h
    pi_base = pi_ptr + i_bh * NW * K * K
    kb = _tile_rows(kbar_ptr + buf, s0, BN, K)
    v = tl.load(v_base + (s0 + cols).to(tl.int64)[:, None] * (H * V) + tl.arange(0, V)[None, :],
                mask=((s0 + cols) < T)[:, None], other=0.0)
    g_col = tl.zeros([BN], dtype=tl.float32)
    if HAS_G:
        g_col = _gates(g_base, s0, T, H, BN)
    dkb = tl.zeros([BN, K], dtype=tl.float32)
    dvb = tl.zeros([BN, V], dtype=tl.float32)
    dg_col = tl.zeros([BN], dtype=tl.float32)
    phi = tl.where(kk[:, None] == kk[None, :], 1.0, 0.0)    # Φ = Π_{a−1} ⋯ Π_{w+1}
    for i_a in range(i_w + 1, NW):
        if i_a > i_w + 1:
            phi = tl.dot(_tile_rows(pi_base + (i_a - 1) * K * K, 0, K, K).to(td), phi.to(td), input_precision=PREC)
        phit = phi.to(td)
        if CARRY:      # the keys carried to window a's start: the pair's scores are Q^a K̃ᵀ
            kt = tl.dot(kb, tl.trans(phit), input_precision=PREC).to(td)
        else:
            kt = kb
        dkt = tl.zeros([BN, K], dtype=tl.float32)
        # the window's query steps that start before T, counted up front: no branch in the loop
        for j in range(0, tl.cdiv(tl.minimum(WB * 64, T - i_a * WB * 64), BM)):
            t0 = i_a * WB * 64 + j * BM
            rows = t0 + r
            valid = rows < T
            if CARRY:
                x = _tile_rows(qa_ptr + buf, t0, BM, K)
            else:
                x = tl.dot(_tile_rows(qa_ptr + buf, t0, BM, K), phit, input_precision=PREC).to(td)
            s = tl.dot(x, tl.trans(kt), input_precision=PREC)
            if HAS_G:
                g_row = tl.load(g_base + rows.to(tl.int64) * H, mask=valid, other=0.0)
                s += (g_row[:, None] - g_col[None, :]) * g_to_s
            lse = tl.load(lse_ptr + i_bh * NTC + rows)
            dlt = tl.load(dlt_ptr + i_bh * NTC + rows)
            do = tl.load(do_base + rows.to(tl.int64)[:, None] * (H * V) + tl.arange(0, V)[None, :],
                         mask=valid[:, None], other=0.0)
            p, dz = _probs(s, lse, valid, do, v, dlt, qk_scale, PREC)
            dvb += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC)
            if CARRY:
                dkt += tl.dot(tl.trans((dz * scale).to(td)), x, input_precision=PREC)
            else:
                dkb += tl.dot(tl.trans((dz * scale).to(td)), x, input_precision=PREC)
            if HAS_G:
                dg_col -= tl.sum(dz, 0)
        if CARRY:      # dK̄ = dK̃ Φ
            dkb += tl.dot(dkt.to(td), phit, input_precision=PREC)
    _put(dkbar_ptr + buf, s0, dkb, BN, K)
    _put(dv_ptr + i_bh * NTC * V, s0, dvb, BN, V)
    if HAS_G:
        tl.atomic_add(dG_ptr + i_bh * NTC + s0 + cols, dg_col, sem="relaxed")


def cross_window_grads(qa, kbar, pi, v, do, lse, dlt, G, scale: float, plan, dv, dG):
    """Passes 2 and 3: ``(dqa, dkbar, mw)`` float32 (the gradients of ``Q^a``, ``K̄`` and the
    window products ``Π``); ``dv`` (float32 ``[B·H, NTC, V]``) gets the cross-window part written,
    ``dG`` (or ``None``) has it added."""
    from ..common.softmax import LOG2E
    from .plan import backward_slots
    B, T, H, V = v.shape
    BH, NTC, K = qa.shape
    NT = triton.cdiv(T, 64)
    WB = plan.window_blocks
    NW = pi.shape[1]
    NQ = triton.cdiv(T, plan.rows)
    dev = v.device
    f32 = dict(dtype=torch.float32, device=dev)
    dqa = torch.zeros(BH, NTC, K, **f32)
    dkbar = torch.zeros(BH, NTC, K, **f32)
    mw = torch.zeros(BH, NW, K, K, **f32)
    nprog = backward_slots(plan, dev, NQ * BH)
    xs = torch.empty(nprog, NW, plan.rows, K, dtype=qa.dtype, device=dev)
    gs = torch.empty(nprog, NW, plan.rows, K, **f32)
    common = (T, H)
    gp = G if G is not None else dlt
    BN, BQ = plan.cross_keys, plan.cross_queries or plan.rows
    for name, val in (("cross_keys", BN), ("cross_queries", BQ)):
        if val not in (64, plan.rows):
            raise ValueError(f"plan.{name} must be 64 or plan.rows = {plan.rows}; got {val!r}")
    meta = dict(WB=WB, K=K, V=V, BM=plan.rows, HAS_G=G is not None, PREC=plan.precision)
    qk = (float(scale), float(scale) * LOG2E, 1.0 / float(scale))
    launch(_cross_q_kernel, (nprog,),
           (qa, kbar, pi, v, do, lse, dlt, gp, dqa, mw, dG if dG is not None else dlt, xs, gs,
            *common, NQ, NTC, BH, NW, *qk), meta, plan.cross)
    launch(_cross_k_kernel, (triton.cdiv(T, BN), BH),
           (qa, kbar, pi, v, do, lse, dlt, gp, dkbar, dv, dG if dG is not None else dlt,
            *common, NT, NTC, NW, *qk), dict(meta, BM=BQ, BN=BN, CARRY=plan.cross_carry), plan.cross)
    return dqa, dkbar, mw


@triton.jit(do_not_specialize=["NT", "NTC"])
def _key_push_bwd_kernel(kh_ptr, u_ptr, wt_ptr, dkbar_ptr, dkh_ptr, gw_ptr, hu_ptr, NT, NTC,
                         WB: tl.constexpr, K: tl.constexpr, PREC: tl.constexpr):
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    buf = i_bh * NTC * K
    td = wt_ptr.dtype.element_ty
    we = tl.minimum(i_t // WB * WB + WB, NT) - 1
    t0 = i_t * 64
    e = _tile(dkbar_ptr + buf, t0, K)                       # E = dK̄ P_e ⋯ P_{b+1}
    for n in range(0, we - i_t):
        b = we - n
        z = _tile(kh_ptr + buf, t0, K).to(tl.float32)       # Z: the keys at block b's start
        for c in range(i_t + 1, b):
            z = _cross(z, u_ptr + buf, wt_ptr + buf, c * 64, K, PREC)
        w_b = _tile(wt_ptr + buf, b * 64, K)
        u_b = _tile(u_ptr + buf, b * 64, K)
        et = e.to(td)
        zt = z.to(td)
        # dP_b += Eᵀ Z: W_b dP_b = (W_b Eᵀ) Z and U_b dP_bᵀ = (U_b Zᵀ) E
        _add(gw_ptr + buf, b * 64, tl.dot(tl.dot(w_b, tl.trans(et), input_precision=PREC).to(td), zt,
                                          input_precision=PREC), 64, K)
        _add(hu_ptr + buf, b * 64, tl.dot(tl.dot(u_b, tl.trans(zt), input_precision=PREC).to(td), et,
                                          input_precision=PREC), 64, K)
        e = _cross(e, wt_ptr + buf, u_ptr + buf, b * 64, K, PREC)
    _add(dkh_ptr + buf, t0, e, 64, K)


@triton.jit(do_not_specialize=["NT", "NTC", "NW"])
def _window_products_bwd_kernel(u_ptr, wt_ptr, mw_ptr, gw_ptr, hu_ptr, NT, NTC, NW,
                                WB: tl.constexpr, K: tl.constexpr, PREC: tl.constexpr):
    i_w = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    buf = i_bh * NTC * K
    td = wt_ptr.dtype.element_ty
    ws = i_w * WB
    we = tl.minimum(ws + WB, NT) - 1
    f = _tile_rows(mw_ptr + (i_bh * NW + i_w) * K * K, 0, K, K)   # F_b = P_{b+1}ᵀ ⋯ P_eᵀ M
    for n in range(0, we - ws + 1):
        b = we - n
        w_b = _tile(wt_ptr + buf, b * 64, K)
        u_b = _tile(u_ptr + buf, b * 64, K)
        ft = f.to(td)
        wf = tl.dot(w_b, ft, input_precision=PREC)            # W_b F_b
        # W_b dP_b = W_b F_b Rᵀ, R = P_{b−1} ⋯ P_s: apply P_sᵀ, …, P_{b−1}ᵀ on the right
        y = wf
        for c in range(ws, b):
            y = _cross(y, u_ptr + buf, wt_ptr + buf, c * 64, K, PREC)
        _add(gw_ptr + buf, b * 64, y, 64, K)
        # U_b dP_bᵀ = (U_b R) F_bᵀ: U_b walked down across b−1, …, s
        z = u_b.to(tl.float32)
        for m in range(0, b - ws):
            z = _cross(z, wt_ptr + buf, u_ptr + buf, (b - 1 - m) * 64, K, PREC)
        _add(hu_ptr + buf, b * 64, tl.dot(z.to(td), tl.trans(ft), input_precision=PREC), 64, K)
        f -= tl.dot(tl.trans(u_b), wf.to(td), input_precision=PREC)   # F_{b−1} = P_bᵀ F_b


def window_grads_back(kh, u, wt, dkbar, mw, dkh, gw, hu, plan):
    """Passes 5 and 6: ``dK̄`` back to ``dK̂`` and the crossed blocks' ``gw, hu``; the window
    products' gradients ``mw`` to the ``gw, hu`` of their blocks (all added into the float32
    buffers)."""
    BH, NTC, K = kh.shape
    NT = NTC // 64
    WB = plan.window_blocks
    NW = mw.shape[1]
    meta = dict(WB=WB, K=K, PREC=plan.precision)
    launch(_key_push_bwd_kernel, (NT, BH), (kh, u, wt, dkbar, dkh, gw, hu, NT, NTC), meta, plan.bwd)
    launch(_window_products_bwd_kernel, (NW, BH), (u, wt, mw, gw, hu, NT, NTC, NW), meta, plan.bwd)
