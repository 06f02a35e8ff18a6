"""Stage: the backward (derivation in ``kernels/delta/DERIVATION.md``, (D9)-(D13)).

The forward keeps ``T``, ``W``, ``P``, the entering state of every chunk and ``v'`` (all in the
input dtype: every use here feeds a tensor-core product in that dtype anyway). Then:

1. :func:`state_grads` (sequential over chunks in reverse) carries the state adjoint ``dS`` on chip,
   writing ``dv'`` and the adjoint of the state leaving every chunk, and the initial state's gradient;
2. :func:`chunk_grads` (parallel over chunks): ``_bwd_dqk_kernel`` gives ``dq``, the part of ``dk``
   through the scores and the state update, ``dW = −dv' Sᵀ`` and its share of the log-gate gradient;
   ``_bwd_wy_kernel`` differentiates ``U = T (β V)``, ``W = T (β e^b K)`` and ``T = (I + A)^{-1}``:
   ``dv``, ``dβ``, the rest of ``dk`` and of the log-gate gradient ``db`` (``dg`` is its reverse
   cumulative sum inside each chunk).

:func:`chunk_grads_torch` computes what :func:`chunk_grads` computes with batched PyTorch and
autograd: an independent cross-check, and the path taken when a kernel does not fit the GPU
(float32 at K = V = 128 needs more shared memory than an H100/H200 block may use).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import launch
from ..reference import delta_chunk
from .march import _NO_SPEC, _load_state
from .plan import CHUNK

__all__ = ["state_grads", "chunk_grads", "chunk_grads_torch"]


@triton.jit(do_not_specialize=_NO_SPEC)
def _state_bwd_kernel(q_ptr, k_ptr, w_ptr, b_ptr, a_ptr, do_ptr, dht_ptr, dh_ptr, dh0_ptr, dvp_ptr,
                      scale, T, H, NT, NTC,
                      K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                      HAS_DHT: tl.constexpr):
    """Sequential over chunks in reverse, the state adjoint ``dS`` on chip: per chunk
    ``dv' = Pᵀ do + (k ⊙ e^{b_C − b}) dS`` and ``dS ← e^{b_C} dS + (q ⊙ e^{b})ᵀ do − Wᵀ dv'``, writing
    ``dv'`` and the adjoint of the state leaving every chunk and, at the end, the initial state's."""
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
    dop = do_ptr + (i_b * T * H + i_h) * V
    wp = w_ptr + i_bh * NTC * K
    bp = b_ptr + i_bh * NTC
    dS = _load_state(dht_ptr, i_bh, ck, cv, K, V, BV, HAS_DHT)
    for i in range(NT):
        n = NT - 1 - i
        t0 = n * 64
        tl.store(dh_ptr + (i_bh * NT + n) * K * V + ck[:, None] * V + cv[None, :], dS.to(dh_ptr.dtype.element_ty))
        rows = t0 + rc
        rmask = rows < T
        q = tl.load(qp + rows[:, None] * (H * K) + ck[None, :], mask=rmask[:, None], other=0.0)
        k = tl.load(kp + rows[:, None] * (H * K) + ck[None, :], mask=rmask[:, None], other=0.0)
        do = tl.load(dop + rows[:, None] * (H * V) + cv[None, :], mask=rmask[:, None], other=0.0)
        w = tl.load(wp + rows[:, None] * K + ck[None, :])
        b = tl.load(bp + rows)
        b_last = tl.load(bp + t0 + 63)
        dSd = dS.to(dt)
        # P^T[i, j] = scale * (k_i . q_j) e^{b_j - b_i} for j >= i, from the stored scores
        ptd = tl.trans(tl.load(a_ptr + (i_bh * NTC + rows[:, None]) * 64 + rc[None, :]))
        kd = (k.to(tl.float32) * tl.exp(b_last - b)[:, None]).to(dt)
        dvp = tl.dot(ptd, do, input_precision=PREC) + tl.dot(kd, dSd, input_precision=PREC)
        dvpd = dvp.to(dt)
        tl.store(dvp_ptr + (i_bh * NTC + rows[:, None]) * V + cv[None, :], dvpd)   # for the local backward
        qe = (q.to(tl.float32) * (tl.exp(b) * scale)[:, None]).to(dt)
        dS = (dS * tl.exp(b_last) + tl.dot(tl.trans(qe), do, input_precision=PREC)
              - tl.dot(tl.trans(w), dvpd, input_precision=PREC))
    tl.store(dh0_ptr + i_bh * K * V + ck[:, None] * V + cv[None, :], dS)


@triton.jit(do_not_specialize=_NO_SPEC)
def _bwd_dqk_kernel(q_ptr, k_ptr, b_ptr, a_ptr, hs_ptr, dh_ptr, do_ptr, vp_ptr, dvp_ptr,
                    dq_ptr, dk_ptr, dw_ptr, db_ptr, scale, T, H, NT, NTC,
                    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                    PREC: tl.constexpr):
    """Grid (K-blocks, chunks, batch·heads). For the key columns ``ck`` of one chunk:
    ``dq = e^b ⊙ do Sᵀ + (dP ⊙ Γ ⊙ M) K`` (scaled), the partial ``dk`` through the scores and the
    state update ``(dP ⊙ Γ ⊙ M)ᵀ Q̃ + e^{b_C − b} ⊙ v' dS'ᵀ`` (float32, completed by
    ``_bwd_wy_kernel``), ``dW = −dv' Sᵀ`` and this K-block's share of the log-gate gradient;
    ``dP = do v'ᵀ``. Every term is linear in the K-block, so the shares add up (the scores' share of
    the log-gate gradient comes whole from the stored scores, in K-block 0)."""
    i_k = tl.program_id(0)
    i_t = tl.program_id(1)
    i_bh = tl.program_id(2).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    dt = q_ptr.dtype.element_ty
    t0 = i_t * 64
    rc = tl.arange(0, 64)
    ck = i_k * BK + tl.arange(0, BK)
    rows = t0 + rc
    rmask = rows < T
    causal = rc[:, None] >= rc[None, :]
    vbase = (i_b * T * H + i_h) * V
    dqs = tl.zeros([64, BK], dtype=tl.float32)     # do Sᵀ
    dks = tl.zeros([64, BK], dtype=tl.float32)     # v' dS'ᵀ
    dW = tl.zeros([64, BK], dtype=tl.float32)      # -dv' Sᵀ
    dPm = tl.zeros([64, 64], dtype=tl.float32)     # do v'ᵀ
    c = tl.zeros([64], dtype=tl.float32)           # <S, dS'> on these rows (kept in entry 0)
    for i_v in range(V // BV):
        cv = i_v * BV + tl.arange(0, BV)
        sp = (i_bh * NT + i_t) * K * V + ck[:, None] * V + cv[None, :]
        Sd = tl.load(hs_ptr + sp).to(dt)
        dSd = tl.load(dh_ptr + sp).to(dt)
        do = tl.load(do_ptr + vbase + rows[:, None] * (H * V) + cv[None, :], mask=rmask[:, None], other=0.0)
        vpd = tl.load(vp_ptr + (i_bh * NTC + rows[:, None]) * V + cv[None, :])
        dvpd = tl.load(dvp_ptr + (i_bh * NTC + rows[:, None]) * V + cv[None, :])
        dqs += tl.dot(do, tl.trans(Sd), input_precision=PREC)
        dks += tl.dot(vpd, tl.trans(dSd), input_precision=PREC)
        dW -= tl.dot(dvpd, tl.trans(Sd), input_precision=PREC)
        dPm += tl.dot(do, tl.trans(vpd), input_precision=PREC)
        c += tl.sum(tl.sum(Sd.to(tl.float32) * dSd.to(tl.float32), 1), 0) * tl.where(rc == 0, 1.0, 0.0)
    qkoff = (i_b * T * H + i_h) * K + rows[:, None] * (H * K) + ck[None, :]
    q = tl.load(q_ptr + qkoff, mask=rmask[:, None], other=0.0)
    k = tl.load(k_ptr + qkoff, mask=rmask[:, None], other=0.0)
    b = tl.load(b_ptr + i_bh * NTC + rows)
    b_last = tl.load(b_ptr + i_bh * NTC + t0 + 63)
    eb = tl.exp(b)
    edec = tl.exp(b_last - b)
    gam = tl.where(causal, tl.exp(tl.where(causal, b[:, None] - b[None, :], 0.0)), 0.0)   # Γ ⊙ M
    dPm = tl.where(causal, dPm, 0.0)
    # log-gate gradient, this K-block's share: the scores (K-block part of q kᵀ), e^b q̃ S, the update
    # the whole scores, counted once (K-block 0; other blocks load nothing)
    P = tl.load(a_ptr + (i_bh * NTC + rows[:, None]) * 64 + rc[None, :],
                mask=causal & (i_k == 0), other=0.0).to(tl.float32)
    dPP = dPm * P
    qf = q.to(tl.float32)
    kf = k.to(tl.float32)
    db_o = tl.sum(qf * dqs, 1) * eb * scale                  # rowsum(do ⊙ (e^b q̃) S)
    r = tl.sum(kf * dks, 1) * edec                           # rowsum((K̃ dS') ⊙ v')
    db = db_o + tl.sum(dPP, 1) - tl.sum(dPP, 0) - r
    db += tl.where(rc == 63, tl.sum(r, 0) + tl.exp(b_last) * tl.sum(c, 0), 0.0)
    tl.store(db_ptr + (i_k * tl.num_programs(2) + i_bh) * NTC + rows, db)
    dPg = (dPm * gam).to(dt)
    dq = dqs * (eb * scale)[:, None] + tl.dot(dPg, k, input_precision=PREC) * scale
    dk = tl.dot(tl.trans(dPg), q, input_precision=PREC) * scale + dks * edec[:, None]
    tl.store(dq_ptr + qkoff, dq.to(dq_ptr.dtype.element_ty), mask=rmask[:, None])
    tl.store(dk_ptr + qkoff, dk, mask=rmask[:, None])
    tl.store(dw_ptr + (i_bh * NTC + rows[:, None]) * K + ck[None, :], dW.to(dw_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=_NO_SPEC)
def _bwd_wy_kernel(k_ptr, v_ptr, beta_ptr, b_ptr, t_ptr, dvp_ptr, dw_ptr, dkp_ptr, dbp_ptr,
                   dk_ptr, dv_ptr, dbeta_ptr, db_ptr, T, H, NTC,
                   K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, NK: tl.constexpr,
                   PREC: tl.constexpr):
    """Grid (chunks, batch·heads). Through ``U = T (β V)``, ``W = T (β e^b K)`` and
    ``A = diag(β)(K Kᵀ ⊙ Γ)`` (strictly lower): ``dv``, ``dβ``, the rest of ``dk`` (added to the
    partial sums of ``_bwd_dqk_kernel``) and the rest of the log-gate gradient. ``U`` and ``W`` are
    recomputed from ``T`` and the inputs already loaded here (the same products as the forward's
    ``_wu_fwd_kernel``, so the same values) instead of being read back."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    dt = k_ptr.dtype.element_ty
    t0 = i_t * 64
    rc = tl.arange(0, 64)
    ck = tl.arange(0, K)
    rows = t0 + rc
    rmask = rows < T
    causal = rc[:, None] >= rc[None, :]
    strict = rc[:, None] > rc[None, :]
    vbase = (i_b * T * H + i_h) * V
    Tmd = tl.load(t_ptr + (i_bh * NTC + rows[:, None]) * 64 + rc[None, :]).to(dt)
    beta = tl.load(beta_ptr + i_b * T * H + i_h + rows * H, mask=rmask, other=0.0).to(tl.float32)
    dAp = tl.zeros([64, 64], dtype=tl.float32)      # dY Uᵀ
    dbeta = tl.zeros([64], dtype=tl.float32)
    for i_v in range(V // BV):
        cv = i_v * BV + tl.arange(0, BV)
        dvpd = tl.load(dvp_ptr + (i_bh * NTC + rows[:, None]) * V + cv[None, :])
        vv = tl.load(v_ptr + vbase + rows[:, None] * (H * V) + cv[None, :], mask=rmask[:, None], other=0.0)
        u = tl.dot(Tmd, (vv.to(tl.float32) * beta[:, None]).to(dt), input_precision=PREC).to(dt)
        dY = tl.dot(tl.trans(Tmd), dvpd, input_precision=PREC)                           # Tᵀ dU
        tl.store(dv_ptr + vbase + rows[:, None] * (H * V) + cv[None, :],
                 (dY * beta[:, None]).to(dv_ptr.dtype.element_ty), mask=rmask[:, None])
        dbeta += tl.sum(dY * vv.to(tl.float32), 1)
        dAp += tl.dot(dY.to(dt), tl.trans(u), input_precision=PREC)
    qkoff = (i_b * T * H + i_h) * K + rows[:, None] * (H * K) + ck[None, :]
    k = tl.load(k_ptr + qkoff, mask=rmask[:, None], other=0.0)
    dWd = tl.load(dw_ptr + (i_bh * NTC + rows[:, None]) * K + ck[None, :]).to(dt)
    b = tl.load(b_ptr + i_bh * NTC + rows)
    eb = tl.exp(b)
    w = tl.dot(Tmd, (k.to(tl.float32) * (beta * eb)[:, None]).to(dt), input_precision=PREC).to(dt)
    gam = tl.where(causal, tl.exp(tl.where(causal, b[:, None] - b[None, :], 0.0)), 0.0)   # Γ ⊙ M
    # through W = T X, X = diag(β e^b) K
    dX = tl.dot(tl.trans(Tmd), dWd, input_precision=PREC)                                # Tᵀ dW
    dA = -(dAp + tl.dot(dX.to(dt), tl.trans(w), input_precision=PREC))
    dA = tl.where(strict, dA, 0.0)
    xk = tl.sum(dX * k.to(tl.float32), 1)
    dbeta += eb * xk
    db = beta * eb * xk
    dk = dX * (beta * eb)[:, None]
    # through A = diag(β) (K Kᵀ ⊙ Γ), strictly lower
    G = tl.dot(k, tl.trans(k), input_precision=PREC) * gam
    G = tl.where(strict, G, 0.0)
    dbeta += tl.sum(dA * G, 1)
    dAA = dA * G * beta[:, None]
    db += tl.sum(dAA, 1) - tl.sum(dAA, 0)
    dGg = (dA * beta[:, None] * gam).to(dt)
    dk += tl.dot(dGg, k, input_precision=PREC) + tl.dot(tl.trans(dGg), k, input_precision=PREC)
    dk += tl.load(dkp_ptr + qkoff, mask=rmask[:, None], other=0.0)
    for i_k in tl.static_range(NK):
        db += tl.load(dbp_ptr + (i_k * tl.num_programs(1) + i_bh) * NTC + rows)
    tl.store(dk_ptr + qkoff, dk.to(dk_ptr.dtype.element_ty), mask=rmask[:, None])
    tl.store(dbeta_ptr + i_b * T * H + i_h + rows * H, dbeta, mask=rmask)
    tl.store(db_ptr + i_bh * NTC + rows, db)


def _precision(dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def state_grads(q, k, w, b, a, do, dht, scale: float, NT: int, plan):
    """Leaving-state adjoints of every chunk ``[B·H, NT, K, V]``, the initial state's gradient
    (float32) and ``dv'`` of every chunk (input dtype)."""
    B, T, H, K = q.shape
    V = do.shape[-1]
    BH = B * H
    dh = torch.empty(BH, NT, K, V, dtype=q.dtype, device=q.device)
    dvp = torch.empty(BH, NT * CHUNK, V, dtype=q.dtype, device=q.device)
    dh0 = torch.empty(B, H, K, V, dtype=torch.float32, device=q.device)
    dht_c = dht.float().contiguous() if dht is not None else dh0
    launch(_state_bwd_kernel, (V // plan.bwd_bv, BH),
           (q, k, w, b, a, do, dht_c, dh, dh0, dvp, float(scale), T, H, NT, NT * CHUNK),
           dict(K=K, V=V, BV=plan.bwd_bv, PREC=_precision(q.dtype), HAS_DHT=dht is not None), plan.bwd)
    return dh, dh0, dvp


def chunk_grads(q, k, v, g, beta, b, tm, a, hs, dh, do, vp, dvp, scale: float, plan):
    """``dq, dk, dv, dβ, dg`` from the per-chunk algebra, the states and their adjoints held fixed."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = hs.shape[1]
    NTC = NT * CHUNK
    BH = B * H
    dev = q.device
    prec = _precision(q.dtype)
    NK = K // plan.dqk_bk
    dq = torch.empty_like(q)
    dk_p = torch.empty(q.shape, dtype=torch.float32, device=dev)      # partial dk (scores, state)
    dw = torch.empty(BH, NTC, K, dtype=q.dtype, device=dev)
    db_p = torch.empty(NK, BH, NTC, dtype=torch.float32, device=dev)
    launch(_bwd_dqk_kernel, (NK, NT, BH),
           (q, k, b, a, hs, dh, do, vp, dvp, dq, dk_p, dw, db_p, scale, T, H, NT, NTC),
           dict(K=K, V=V, BK=plan.dqk_bk, BV=plan.dqk_bv, PREC=prec), plan.dqk)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dbeta = torch.empty(B, T, H, dtype=torch.float32, device=dev)
    db = torch.empty(BH, NTC, dtype=torch.float32, device=dev)
    launch(_bwd_wy_kernel, (NT, BH), (k, v, beta, b, tm, dvp, dw, dk_p, db_p, dk, dv, dbeta, db, T, H, NTC),
           dict(K=K, V=V, BV=plan.dwy_bv, NK=NK, PREC=prec), plan.dwy)
    dg = None
    if g is not None:   # b_i = Σ_{s ≤ i} g_s inside a chunk: dg = reverse cumulative sum of db
        dg = db.view(B, H, NT, CHUNK).flip(-1).cumsum(-1).flip(-1).view(B, H, NTC)
        dg = dg[:, :, :T].transpose(1, 2)
    return dq, dk, dv, dbeta, dg


def chunk_grads_torch(q, k, v, g, beta, scale, hs, dh, do):
    """Gradients of the per-chunk (parallel) algebra with entering states ``hs`` and leaving-state
    adjoints ``dh`` held fixed, through batched PyTorch ops and autograd (float32).

    Local objective per chunk ``n``: ``<o_n, do_n> + <S_{n+1}, dS_{n+1}>`` with
    ``S_{n+1} = e^{b_C} S_n + (k ⊙ e^{b_C − b})ᵀ v'`` and ``v' = U − W S_n``; the state terms are
    written without forming ``[K, V]`` products: ``e^{b_C} <S_n, dS_{n+1}> + <v', (k ⊙ e^{b_C−b}) dS_{n+1}>``.
    The chunk's algebra is :func:`kernels.reference.delta_chunk` (the one the book derives and tests).
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = CHUNK
    NT = hs.shape[1]
    pad = NT * C - T
    with torch.enable_grad():
        leaves = []
        def leaf(x):
            x = x.detach().float().requires_grad_(True)
            leaves.append(x)
            return x
        ql, kl, vl, bel = leaf(q), leaf(k), leaf(v), leaf(beta)
        gl = leaf(g) if g is not None else None

        def blocks(x):  # [B, T, H, D] -> [B, H, NT, C, D]
            x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)) if pad else x
            return x.reshape(B, NT, C, H, -1).permute(0, 3, 1, 2, 4)
        qc, kc, vc = blocks(ql) * scale, blocks(kl), blocks(vl)
        betac = blocks(bel.unsqueeze(-1)).squeeze(-1)
        doc = blocks(do.float())
        if gl is not None:
            bc = blocks(gl.unsqueeze(-1)).squeeze(-1).cumsum(-1)          # [B, H, NT, C]
        else:
            bc = torch.zeros(B, H, NT, C, dtype=torch.float32, device=q.device)
        Sn = hs.view(B, H, NT, K, V).float()
        dSn = dh.view(B, H, NT, K, V).float()
        ch = delta_chunk(qc, kc, vc, bc, betac, Sn, state=False)        # (ch6-d-wy), (ch6-d-chunk)
        last = bc[..., -1]
        c_n = (Sn * dSn).sum((-1, -2))
        loss = (ch.O * doc).sum() + (last.exp() * c_n).sum() + (ch.U * (ch.Kd @ dSn)).sum()
        grads = torch.autograd.grad(loss, leaves)
    dq, dk, dv, dbeta = grads[:4]
    dg = grads[4] if g is not None else None
    return dq, dk, dv, dbeta, dg
