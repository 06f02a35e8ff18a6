"""Stage 2: ``(H_t + Lambda) x_t = b_t`` by conjugate gradients, all tokens of a chunk in lockstep.

One program per (chunk, batch·head) runs every iteration for its 64 tokens with the chunk's
entering state ``H_c`` on chip. Inside the chunk ``H_t = e^{b_t} H_c + sum_{j <= t} e^{b_t - b_j}
beta_j k_j k_j^T`` (``b`` the cumulative log gate from the chunk's start), so the products of one
iteration, ``H_t p_t`` for the 64 tokens at once, are a small masked attention and one product
with ``H_c``::

    H P = Diag(e^b) P H_c + ((P (Diag(beta) K)^T) ⊙ D) K,     D_tj = e^{b_t - b_j} [j <= t]

plus ``Lambda P``. The forward solves with ``b = q``, the backward with ``b = dL/dx`` (the matrix is
symmetric). CG starts from zero and runs at most ``ITERS`` iterations; a row stops (its steps
become zero) once ``|r_t|^2 <= CG_FLOOR |b_t|^2``, or where its curvature is not positive, and the
program stops once all its rows have (well-conditioned chunks finish in a few steps). fla runs a
fixed count with ``1e-5`` added to each denominator; the relative stop does the same work without
a scale of its own: after convergence the recursive residual keeps shrinking into float32's
underflow while the 16-bit products leave the true one at roundoff, and the steps taken there
diverge (measured: NaN, or errors of 10^3, at ``max_CG_iteration = 128`` on well-conditioned rows;
``kernels/mesa/NOTES.md``). The PyTorch path, ``kernels.reference._cg``, stops at the same floor
for float32.

Operands of the products, in the plan's ``operand`` dtype (float16 for 16-bit inputs):
- ``P`` row-scaled to unit length (``|p|^2`` carried by CG's recurrence ``|p_k|^2 = |r_k|^2 +
  beta_k^2 |p_{k-1}|^2``, no extra reduction): the rows stay O(1) in float16 as the residual shrinks
  by orders of magnitude, and cannot overflow when a residual jumps up (CG's residual norms are not
  monotone; scaling by ``1 / |r_t|`` could); the products are linear in each row, so the result
  is scaled back exactly;
- ``H_c`` divided by its largest entry (restored, with the decay ``e^{b_t}``, on the product's rows):
  float16's range then holds any state, whatever the keys' norms and the gates.
The scaled ``P`` is converted once per iteration and feeds both products.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.tiles import round_operand, round_store

__all__ = ["cg_solve", "CG_FLOOR"]

#: a row of the solve stops once ``|r|^2 <= CG_FLOOR |b|^2`` (float32's unit roundoff squared):
#: past it the recursively updated residual keeps shrinking while the true one cannot, and with
#: 16-bit products the steps taken there drift away from the solution (NaN or wrong by orders of
#: magnitude at ``max_CG_iteration = K`` on well-conditioned rows: ``NOTES.md``, "Robustness past
#: convergence")
CG_FLOOR = float(torch.finfo(torch.float32).eps) ** 2


@triton.jit
def _cg_kernel(rhs, kb, kk, g, lamb, hs, x, T, NT, ITERS,
               FLOOR: tl.constexpr, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, IP: tl.constexpr, EMU: tl.constexpr):
    """grid (NT, B·H). ``rhs``, ``x``: ``[B, T, H, K]``; ``kb`` = beta·k and ``kk`` = k in the operand
    dtype; ``g`` ``[B, T, H]`` log gates; ``lamb`` ``[H, K]``; ``hs`` ``[B·H, NT, K, K]`` float32."""
    DT = kk.dtype.element_ty
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    rows = i_t * BT + o_t
    mask_t = rows < T
    offs = i_b.to(tl.int64) * T * H * K + i_h * K + rows[:, None] * (H * K) + o_k[None, :]
    # padded rows (past T) load zeros: b = 0, k = 0, so they neither solve nor disturb anything
    ka = round_operand(tl.load(kb + offs, mask=mask_t[:, None], other=0.), DT, EMU)
    kv = round_operand(tl.load(kk + offs, mask=mask_t[:, None], other=0.), DT, EMU)
    r = tl.load(rhs + offs, mask=mask_t[:, None], other=0.).to(tl.float32)
    gt = tl.load(g + i_b.to(tl.int64) * T * H + rows * H + i_h, mask=mask_t, other=0.).to(tl.float32)
    bt = tl.cumsum(gt, axis=0)
    D = tl.exp(tl.where(o_t[:, None] >= o_t[None, :], bt[:, None] - bt[None, :], float("-inf")))
    eb = tl.exp(bt)
    lam = tl.load(lamb + i_h * K + o_k).to(tl.float32)
    Hc = tl.load(hs + (i_bh * NT + i_t).to(tl.int64) * K * K + o_k[:, None] * K + o_k[None, :])
    sH = tl.max(tl.max(tl.abs(Hc), axis=1), axis=0)
    sH = tl.where(sH > 0, sH, 1.0)
    Hn = round_operand(Hc / sH, DT, EMU)

    xs = tl.zeros([BT, K], dtype=tl.float32)
    p = r
    rr = tl.sum(r * r, axis=1)
    pp = rr                                   # |p|^2, carried by CG's own recurrence (no reduction)
    floor = rr * FLOOR                        # a row stops once |r|^2 <= FLOOR |b|^2
    act = rr > floor                          # rows still iterating (padded rows never start)
    it = 0
    n_act = tl.sum(act.to(tl.int32), axis=0)
    while (it < ITERS) & (n_act > 0):         # the whole chunk stops once every row has
        npn = tl.sqrt(pp)
        inv = tl.where(npn > 0, 1.0 / tl.where(npn > 0, npn, 1.0), 0.0)
        ph = round_operand(p * inv[:, None], DT, EMU)            # unit rows: one operand for both products
        A = tl.dot(ph, tl.trans(ka), input_precision=IP) * D                         # [BT, BT]
        acc = tl.dot(ph, Hn, input_precision=IP) * (eb * sH)[:, None]                # the state's part
        acc = tl.dot(round_operand(A, DT, EMU), kv, acc, input_precision=IP)         # + the chunk's own
        Ap = acc * npn[:, None] + lam[None, :] * p
        pAp = tl.sum(p * Ap, axis=1)
        ok = act & (pAp > 0)
        alpha = tl.where(ok, rr / tl.where(ok, pAp, 1.0), 0.0)
        xs += alpha[:, None] * p
        r -= alpha[:, None] * Ap
        rr_new = tl.sum(r * r, axis=1)
        step = tl.where(ok, rr_new / tl.where(ok, rr, 1.0), 0.0)
        p = tl.where(ok[:, None], r + step[:, None] * p, 0.0)
        pp = tl.where(ok, rr_new + step * step * pp, 0.0)
        rr = tl.where(ok, rr_new, rr)
        act = ok & (rr_new > floor)
        n_act = tl.sum(act.to(tl.int32), axis=0)
        it += 1
    tl.store(x + offs, round_store(xs, x.dtype.element_ty, EMU), mask=mask_t[:, None])


def cg_solve(rhs, kb, kk, g, lamb, hs, iterations: int, plan, out_dtype):
    """``x`` ``[B, T, H, K]`` (``out_dtype``) with ``(H_t + Diag(lamb_h)) x_t = rhs_t`` after
    ``iterations`` CG steps from zero, ``H_t`` from the chunk states ``hs`` (:mod:`.states`)."""
    B, T, H, K = kk.shape
    NT = triton.cdiv(T, plan.BT)
    x = torch.empty(B, T, H, K, dtype=out_dtype, device=kk.device)
    _cg_kernel[(NT, B * H)](rhs.contiguous(), kb, kk, g, lamb, hs, x, T, NT, int(iterations), FLOOR=CG_FLOOR, H=H, K=K,
                            BT=plan.BT, IP=plan.IP, EMU=plan.EMU, num_warps=plan.warps_cg,
                            num_stages=plan.stages_cg)
    return x
