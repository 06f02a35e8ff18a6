"""Stage 2's gradient: two sweeps per query block, the second in the opposite direction.

With ``X_{i,l} = Q̃_i P_{i−1} ⋯ P_{l+1}`` the query block carried back to block ``l`` (the forward's
walk), the scores of the pair are ``S_il = X_{i,l} K̂_lᵀ`` and, with ``dS`` from the softmax's
backward (recomputed from the saved log-sum-exp, as flash attention does):

- ``dK̂_l = Σ_i dS_ilᵀ X_{i,l}`` and ``dV_l = Σ_i P_ilᵀ dO_i``: found while walking *down*, the way
  the forward walks, from the carried ``X`` (added into float32 buffers with atomics: other query
  blocks add to the same key block);
- ``dQ̃_i = Σ_{l<i} dS_il K̂_l P_{l+1}ᵀ ⋯ P_{i−1}ᵀ``: a Horner sum in the *other* direction,
  ``R ← R P_lᵀ + dS_il K̂_l`` for ``l = 0, 1, …, i−1``;
- the gradient of each crossed product ``P_l = I − W_lᵀ U_l``, ``M_l = Σ_{i>l} X_{i,l}ᵀ R_{i,l}``
  with ``R_{i,l}`` the Horner sum before block ``l``: it needs ``X`` (made walking down) and ``R``
  (made walking up) at the same ``l``. Only ``W_l M_l`` and ``U_l M_lᵀ`` are wanted
  (``dU_l = −W_l M_l``, ``dW_l = −U_l M_lᵀ``), ``64 × K`` each, added with atomics.

So each program walks down, leaving every ``X_{i,l}`` and ``dS_il`` in its own slot of scratch, then
walks up reading them back. The grid is persistent (one program per slot, walking the pairs longest
first), so the scratch is ``slots × T × (K + 64)`` values, not ``T² K / 64``. The gradients of the
FoX gates are the row and column sums of ``dS``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import launch
from ..common.softmax import LOG2E
from .forward import (_add_tile, _gates, _in_rows, _probs, _put_tile, _query_block, _tile, _tile_rows,
                      diagonal_scores)
from .plan import CHUNK, backward_slots
from .windows import cross_window_grads, window_blocks, window_grads_back, window_prepare

__all__ = ["path_backward"]


@triton.jit(do_not_specialize=["T", "H", "NQ", "NTC", "BH", "SLOT"])
def _path_bwd_kernel(qt_ptr, kh_ptr, u_ptr, wt_ptr, aloc_ptr, v_ptr, do_ptr, lse_ptr, dlt_ptr, G_ptr,
                     dqt_ptr, dkh_ptr, gw_ptr, hu_ptr, daloc_ptr, dv_ptr, dG_ptr, xs_ptr, dzs_ptr, dqa_ptr,
                     T, H, NQ, NTC, BH, SLOT, scale, qk_scale, g_to_s,
                     K: tl.constexpr, V: tl.constexpr, BM: tl.constexpr, HAS_G: tl.constexpr,
                     WB: tl.constexpr, PREC: tl.constexpr):
    i_p = tl.program_id(0)
    nprog = tl.num_programs(0)
    r = tl.arange(0, BM)
    cols = tl.arange(0, 64)
    top = r < 64
    td = qt_ptr.dtype.element_ty
    # this program's slot of scratch: BM rows of X (and of dS) per 64-token key block
    xs_base = xs_ptr + i_p.to(tl.int64) * SLOT * K
    dzs_base = dzs_ptr + i_p.to(tl.int64) * SLOT * 64
    for i_mbh in range(i_p, NQ * BH, nprog):
        i_bh, t0, rows, valid, do, lse, dlt, g_row = _query_block(i_mbh, NQ, BH, T, H, NTC, do_ptr, lse_ptr, dlt_ptr,
                                                                  G_ptr, V, BM, HAS_G)
        i_m = t0 // BM
        i_b = i_bh // H
        i_h = i_bh % H
        ws = 0                                                   # the walk's first key block
        if WB > 0:
            ws = t0 // 64 // WB * WB
        buf = i_bh * NTC * K
        v_base = v_ptr + (i_b * T * H + i_h) * V
        g_base = G_ptr + i_b * T * H + i_h
        x = _tile_rows(qt_ptr + buf, t0, BM, K).to(tl.float32)
        dg_row = tl.zeros([BM], dtype=tl.float32)
        # the block's own keys (stage 1's A_loc: their gradient goes back there), as the forward
        s_a, s_b = diagonal_scores(aloc_ptr + i_bh * NTC * 64, x.to(td), kh_ptr + buf, g_row, g_base, t0, T, H,
                                   g_to_s, K, BM, HAS_G, PREC)
        p, dz_a = _probs(s_a, lse, valid, do, _in_rows(v_base, t0, T, H * V, V), dlt, qk_scale, PREC)
        _add_tile(dv_ptr + i_bh * NTC * V, t0, tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC), 64, V)
        if HAS_G:
            dg_row += tl.sum(dz_a, 1)
            tl.atomic_add(dG_ptr + i_bh * NTC + t0 + cols, -tl.sum(dz_a, 0), sem="relaxed")
        if BM == 128:
            p, dz_b = _probs(s_b, lse, valid, do, _in_rows(v_base, t0 + 64, T, H * V, V), dlt, qk_scale, PREC)
            _add_tile(dv_ptr + i_bh * NTC * V, t0 + 64, tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC),
                      64, V)
            if HAS_G:
                dg_row += tl.sum(dz_b, 1)
                tl.atomic_add(dG_ptr + i_bh * NTC + t0 + 64 + cols, -tl.sum(dz_b, 0), sem="relaxed")
            _put_tile(daloc_ptr + i_bh * NTC * 64, t0, tl.where(top[:, None], dz_a, dz_b) * scale, BM, 64)
            # the rows of b met block a's keys through X K̂_aᵀ, and then crossed it: as a walk step
            xt = x.to(td)
            dsc = tl.where(top[:, None], 0.0, dz_a * scale).to(td)
            _put_tile(xs_base, (t0 // 64 - ws) * BM, xt, BM, K)
            _put_tile(dzs_base, (t0 // 64 - ws) * BM, dsc, BM, 64)
            _add_tile(dkh_ptr + buf, t0, tl.dot(tl.trans(dsc), xt, input_precision=PREC), 64, K)
            a = tl.dot(xt, tl.trans(_tile(wt_ptr + buf, t0, K)), input_precision=PREC)
            x -= tl.dot(tl.where(top[:, None], 0.0, a).to(td), _tile(u_ptr + buf, t0, K), input_precision=PREC)
        else:
            _put_tile(daloc_ptr + i_bh * NTC * 64, t0, dz_a * scale, BM, 64)
        # first sweep, down: the forward's walk, keeping X and dS for the second (with windows,
        # down to the window's start: the earlier windows are windows.py's)
        nb = i_m * (BM // 64) - ws
        for n in range(0, nb):
            s0 = (ws + nb - 1 - n) * 64
            xt = x.to(td)
            _put_tile(xs_base, (s0 // 64 - ws) * BM, xt, BM, K)
            s = tl.dot(xt, tl.trans(_tile(kh_ptr + buf, s0, K)), input_precision=PREC)
            if HAS_G:
                s += (g_row[:, None] - _gates(g_base, s0, T, H)[None, :]) * g_to_s
            v = tl.load(v_base + (s0 + cols).to(tl.int64)[:, None] * (H * V) + tl.arange(0, V)[None, :])
            p, dz = _probs(s, lse, valid, do, v, dlt, qk_scale, PREC)
            dsc = (dz * scale).to(td)
            _put_tile(dzs_base, (s0 // 64 - ws) * BM, dsc, BM, 64)
            _add_tile(dv_ptr + i_bh * NTC * V, s0, tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC), 64, V)
            _add_tile(dkh_ptr + buf, s0, tl.dot(tl.trans(dsc), xt, input_precision=PREC), 64, K)
            if HAS_G:
                dg_row += tl.sum(dz, 1)
                tl.atomic_add(dG_ptr + i_bh * NTC + s0 + cols, -tl.sum(dz, 0), sem="relaxed")
            a = tl.dot(xt, tl.trans(_tile(wt_ptr + buf, s0, K)), input_precision=PREC)
            x -= tl.dot(a.to(td), _tile(u_ptr + buf, s0, K), input_precision=PREC)
        tl.debug_barrier()            # the slot's writes, visible to every thread of the program
        # second sweep, up: R ← R P_lᵀ + dS_il K̂_l, and M_l's two products (with BM = 128 the last
        # step is block a, which only the rows of b crossed)
        r_acc = tl.zeros([BM, K], dtype=tl.float32)
        if WB > 0:    # the gradient of the queries at the window's start, from the earlier windows
            r_acc = _tile_rows(dqa_ptr + buf, t0, BM, K)
        for l in range(0, nb + BM // 64 - 1):
            s0 = (ws + l) * 64
            act = ~top | (l < nb)
            xt = _tile_rows(xs_base, l * BM, BM, K)
            w = _tile(wt_ptr + buf, s0, K)
            u = _tile(u_ptr + buf, s0, K)
            rt = r_acc.to(td)
            a = tl.where(act[:, None], tl.dot(xt, tl.trans(w), input_precision=PREC), 0.0)
            _add_tile(gw_ptr + buf, s0, tl.dot(tl.trans(a.to(td)), rt, input_precision=PREC), 64, K)
            c = tl.where(act[:, None], tl.dot(rt, tl.trans(u), input_precision=PREC), 0.0).to(td)
            _add_tile(hu_ptr + buf, s0, tl.dot(tl.trans(c), xt, input_precision=PREC), 64, K)
            r_acc -= tl.dot(c, w, input_precision=PREC)
            r_acc += tl.dot(_tile_rows(dzs_base, l * BM, BM, 64), _tile(kh_ptr + buf, s0, K), input_precision=PREC)
        _put_tile(dqt_ptr + buf, t0, r_acc, BM, K)
        if HAS_G:
            tl.atomic_add(dG_ptr + i_bh * NTC + rows, dg_row, sem="relaxed")
        tl.debug_barrier()            # every read of the slot done before the next pair writes it


def path_backward(qt, kh, u, wt, aloc, v, do, o, lse, G, scale: float, plan, windows=None):
    """Stage 2's gradient. Returns float32 ``(dqt, dkh, gw, hu, daloc, dv, dG)``: the first five in
    the prepared layouts (for :func:`kernels.path.local.local_backward`), ``dv`` ``[B, T, H, V]`` in
    ``v``'s dtype, ``dG`` ``[B, T, H]`` (the gradient of the cumulative gates) or ``None``."""
    B, T, H, V = v.shape
    K, NTC = qt.shape[-1], qt.shape[1]
    NQ = triton.cdiv(T, plan.rows)
    BH = B * H
    dev = v.device
    do = do.contiguous()
    dlt = torch.zeros(BH, NTC, dtype=torch.float32, device=dev)
    dlt[:, :T] = (do.float() * o.float()).sum(-1).permute(0, 2, 1).reshape(BH, T)
    f32 = dict(dtype=torch.float32, device=dev)
    dqt = torch.empty(BH, NTC, K, **f32)
    dkh, gw, hu = (torch.zeros(BH, NTC, K, **f32) for _ in range(3))
    daloc = torch.empty(BH, NTC, CHUNK, **f32)
    dv = torch.zeros(BH, NTC, V, **f32)
    dG = torch.zeros(BH, NTC, **f32) if G is not None else None
    WB = window_blocks(plan, NTC)
    dqa = dlt
    if WB:
        # the pairs in different windows (windows.py): their part of dV and dG, the queries'
        # gradient at their window's start, and dK̂, gw, hu through the pushed keys and the
        # window products
        qa, kbar, pi = windows if windows is not None else window_prepare(qt, kh, u, wt, plan)
        dqa, dkbar, mw = cross_window_grads(qa, kbar, pi, v, do, lse, dlt, G, scale, plan, dv, dG)
        window_grads_back(kh, u, wt, dkbar, mw, dkh, gw, hu, plan)
    nprog = backward_slots(plan, dev, NQ * BH)
    per = (WB if WB else NTC // CHUNK) * plan.rows       # scratch rows per slot: BM per key block walked
    xs = torch.empty(nprog, per, K, dtype=qt.dtype, device=dev)
    dzs = torch.empty(nprog, per, CHUNK, dtype=qt.dtype, device=dev)
    launch(_path_bwd_kernel, (nprog,),
           (qt, kh, u, wt, aloc, v, do, lse, dlt, G if G is not None else dlt,
            dqt, dkh, gw, hu, daloc, dv, dG if G is not None else dlt, xs, dzs, dqa,
            T, H, NQ, NTC, BH, per, float(scale), float(scale) * LOG2E, 1.0 / float(scale)),
           dict(K=K, V=V, BM=plan.rows, HAS_G=G is not None, WB=WB, PREC=plan.precision), plan.bwd)
    dv = dv[:, :T].reshape(B, H, T, V).transpose(1, 2).to(v.dtype)
    if dG is not None:
        dG = dG[:, :T].reshape(B, H, T).transpose(1, 2)
    return dqt, dkh, gw, hu, daloc, dv, dG
