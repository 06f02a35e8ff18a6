"""Triton kernels for the chunkwise (gated) delta rule: ``chunk_delta_rule`` / ``chunk_gated_delta_rule``.

Semantics (fla's orientation, state ``S`` is ``[K, V]`` per head, ``a_t = exp(g_t)``, ``a_t = 1``
without a gate)::

    S_t = a_t S_{t-1};   S_t = S_t + β_t k_t (v_t − S_tᵀ k_t)ᵀ;   o_t = scale · S_tᵀ q_t

Chunks of ``C = 64`` tokens; ``b`` is the within-chunk cumulative log gate (``b_i = Σ_{s≤i} g_s``,
restarting at every chunk), so every exponent is a difference ``b_i − b_j`` (``j ≤ i``) or
``b_C − b_i`` or ``b_i`` itself, all ``≤ 0``: the kernels stay finite for arbitrarily harsh gates.

Forward: two kernels.

1. ``_wy_fwd_kernel`` (grid: chunks × batch·heads, fully parallel) builds
   ``A_ij = β_i e^{b_i − b_j} k_i·k_j`` (``j < i``) in 16×16 blocks, inverts the four unit
   lower-triangular diagonal blocks ``I + A_ii`` by forward substitution in registers, merges them
   into ``T = (I + A)^{-1}`` by block substitution (``T_ij = −T_ii Σ_m A_im T_mj``), and writes the
   WY/UT factors ``W = T (β e^{b} K)`` and ``U = T (β V)``.
2. ``_state_fwd_kernel`` (grid: V-blocks × batch·heads, sequential over chunks) keeps the state
   ``S`` (``[K, BV]``, float32) in registers for the whole sequence and per chunk computes the
   pseudo-values ``v' = U − W S``, the output ``o = (q ⊙ e^{b}) S + (q kᵀ ⊙ Γ) v'`` and the next state
   ``S ← e^{b_C} S + (k ⊙ e^{b_C − b})ᵀ v'``. There is no state round trip through HBM and no
   separate output kernel. For training it also writes the state entering every chunk.

Backward (three Triton kernels; derivation in ``kernels/NOTES_delta.md``). The forward, when any
input needs a gradient, also keeps ``T = (I + A)^{-1}`` per chunk (float32, ``[64, 64]``) and the
state entering every chunk (``[K, V]`` per chunk in the input dtype: every use in the backward feeds
a tensor-core product in that dtype anyway).

3. ``_state_bwd_kernel`` (sequential over chunks in reverse) carries the state adjoint ``dS`` on
   chip: ``dv' = (q kᵀ ⊙ Γ)ᵀ do + (k ⊙ e^{b_C − b}) dS``,
   ``dS ← e^{b_C} dS + (q ⊙ e^{b})ᵀ do − Wᵀ dv'``, writing the adjoint of the state leaving every
   chunk and, at the end, the gradient of ``initial_state``.
4. ``_local_bwd_kernel`` (parallel over chunks) differentiates each chunk's algebra (``A``, ``T``,
   ``W``, ``U``, ``v'``, ``o`` and the state update) with the entering state and the leaving-state
   adjoint held fixed; since the states enter linearly and their adjoints come from step 3, the sum
   of these per-chunk gradients is the exact total gradient. It writes ``dv, dβ``, the gradient of
   the cumulative log gates ``db`` (``dg`` is its reverse cumulative sum inside each chunk, one
   PyTorch op) and float32 partial ``dq, dk``;
5. ``_state_terms_bwd_kernel`` (parallel over chunks) adds the two ``[64, K]`` terms that pair
   ``do`` and ``v'`` with the states and writes ``dq, dk`` (kept apart from step 4 to limit
   register spills at K = 128; ``LATTN_DELTA_BWD_SPLIT=0`` fuses them).

``LATTN_DELTA_BWD=torch`` swaps steps 4-5 for batched PyTorch + autograd (``_chunk_local_grads``), an
independent cross-check and a fallback should the compiled kernels misbehave on some GPU/Triton
combination; the same path is used automatically when a kernel does not fit the GPU
(``OutOfResources``, e.g. float32 at K = V = 128).

Float32 inputs use ``input_precision="ieee"`` in every ``tl.dot``; float16/bfloat16 inputs feed the
tensor cores in their own dtype with float32 accumulation (the triangular solve is always float32
``ieee``). ``o`` has ``v``'s dtype and the final state is float32.
"""
from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from ._common import INTERPRET
from ._interp import apply_interpreter_fixes

__all__ = ["chunk_gated_delta_rule_triton", "CHUNK"]

CHUNK = 64          # chunk length C (four 16-row blocks: the solve below is written for it)
_HEAD_SIZES = (16, 32, 64, 128)
# Backward of the per-chunk algebra: "triton" (``_local_bwd_kernel``, default) or "torch"
# (batched PyTorch + autograd, ``_chunk_local_grads``; a cross-check and a fallback).
_BWD_IMPL = os.environ.get("LATTN_DELTA_BWD", "triton")
_U_FP32 = os.environ.get("LATTN_DELTA_U_FP32", "0") == "1"
# Split the per-chunk backward in two kernels (default), which keeps the K-wide float32
# accumulators of the second apart from the 64×64 algebra of the first; "0" fuses them.
_BWD_SPLIT = os.environ.get("LATTN_DELTA_BWD_SPLIT", "1") != "0"

# Tuning overrides for exploration (``kernels/benchmarks/explore_delta.py``); 0 = the default
# heuristic. Set through ``LATTN_DELTA_TUNE="fwd_bv=32,fwd_warps=4"`` (read at import) or the
# ``tuning(**kw)`` context manager. An explicit warps/stages override launches exactly that config
# (no fallback), so a config that does not fit raises instead of being silently replaced.
#   fwd_split   1: forward = sequential ``_state_vp_fwd_kernel`` (v', states) + parallel
#               ``_out_fwd_kernel`` (outputs); 0: the fused ``_state_fwd_kernel``
#   fwd_bv / fwd_warps / fwd_stages        the sequential forward kernel
#   out_bv / out_warps / out_stages        the parallel output kernel (fwd_split=1)
#   bwd_bv / bwd_warps / bwd_stages        the sequential backward kernel
#   local_bv / par_warps / par_stages      the parallel backward kernels (and the WY kernel)
_TUNE_KEYS = ("fwd_split", "fwd_bv", "fwd_warps", "fwd_stages", "out_bv", "out_warps", "out_stages",
              "bwd_bv", "bwd_warps", "bwd_stages", "local_bv", "par_warps", "par_stages")
_TUNE = dict.fromkeys(_TUNE_KEYS, 0)


def _parse_tune(text: str) -> dict:
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, _, val = item.partition("=")
        if key not in _TUNE_KEYS or not val.strip().isdigit():
            raise ValueError(f"LATTN_DELTA_TUNE: expected comma-separated key=int with key in "
                             f"{_TUNE_KEYS}; got {item!r}")
        out[key] = int(val)
    return out


_TUNE.update(_parse_tune(os.environ.get("LATTN_DELTA_TUNE", "")))


@contextlib.contextmanager
def tuning(**kw):
    """Temporarily override tuning knobs (see ``_TUNE_KEYS``; 0 restores the heuristic)."""
    bad = [k for k in kw if k not in _TUNE_KEYS]
    if bad:
        raise ValueError(f"tuning: unknown knob(s) {bad}; expected some of {_TUNE_KEYS}")
    saved = dict(_TUNE)
    _TUNE.update({k: int(v) for k, v in kw.items()})
    try:
        yield
    finally:
        _TUNE.clear()
        _TUNE.update(saved)


if INTERPRET:
    apply_interpreter_fixes()


# Runtime sizes are not specialised (Triton would otherwise compile a new variant for T == 1,
# T % 16 == 0, H == 1, ...): alignment comes from the constexpr head sizes that multiply every
# offset, and one compiled kernel per (dtype, K, V, flags) serves all sequence lengths and heads.
_NO_SPEC = ["T", "H", "NT", "NTC"]


# ------------------------------------------------------------------------------------------------
# small jit helpers
# ------------------------------------------------------------------------------------------------
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
def _gram16(ka, kb, ba, bb, beta_a, DIAG: tl.constexpr, PREC: tl.constexpr):
    """One 16×16 block of ``A_ij = β_i e^{b_i − b_j} k_i·k_j`` (strictly lower on the diagonal)."""
    s = tl.dot(ka, tl.trans(kb), input_precision=PREC)
    d = ba[:, None] - bb[None, :]
    if DIAG:
        r = tl.arange(0, 16)
        low = r[:, None] > r[None, :]
        s = tl.where(low, s * tl.exp(tl.where(low, d, 0.0)), 0.0)
    else:
        s = s * tl.exp(d)          # off-diagonal blocks lie wholly below the diagonal: d <= 0
    return s * beta_a[:, None]


@triton.jit
def _inv_unit_lower16(A):
    """``(I + A)^{-1}`` for a strictly lower-triangular 16×16 ``A`` by forward substitution."""
    r = tl.arange(0, 16)
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    Ti = eye
    for i in tl.static_range(1, 16):
        a = tl.sum(tl.where(r[:, None] == i, A, 0.0), 0)          # row i of A, indexed by column j
        new = tl.where(r == i, 1.0, 0.0) - tl.sum(a[:, None] * Ti, 0)
        Ti = tl.where(r[:, None] == i, new[None, :], Ti)
    return Ti


# ------------------------------------------------------------------------------------------------
# 1. per-chunk WY/UT factors (parallel over chunks)
# ------------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["T", "H", "NTC"])
def _wy_fwd_kernel(k_ptr, v_ptr, beta_ptr, b_ptr, w_ptr, u_ptr, t_ptr, T, H, NTC,
                   K: tl.constexpr, V: tl.constexpr, PREC: tl.constexpr, STORE_T: tl.constexpr):
    n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)     # 64-bit offsets: [B*H, NT, K, V] buffers get large
    bi = bh // H
    h = bh % H
    t0 = n * 64
    # input views: k [B, T, H, K], v [B, T, H, V], beta [B, T, H]; b [B*H, NTC] float32 (padded)
    kp = k_ptr + (bi * T * H + h) * K
    vp = v_ptr + (bi * T * H + h) * V
    btp = beta_ptr + bi * T * H + h
    bp = b_ptr + bh * NTC
    k0 = _rows16(kp, t0, T, H * K, K)
    k1 = _rows16(kp, t0 + 16, T, H * K, K)
    k2 = _rows16(kp, t0 + 32, T, H * K, K)
    k3 = _rows16(kp, t0 + 48, T, H * K, K)
    be0 = _vec16(btp, t0, T, H)
    be1 = _vec16(btp, t0 + 16, T, H)
    be2 = _vec16(btp, t0 + 32, T, H)
    be3 = _vec16(btp, t0 + 48, T, H)
    g0 = _vec16(bp, t0, NTC, 1)
    g1 = _vec16(bp, t0 + 16, NTC, 1)
    g2 = _vec16(bp, t0 + 32, NTC, 1)
    g3 = _vec16(bp, t0 + 48, NTC, 1)
    # A in 16x16 blocks (i >= j)
    A00 = _gram16(k0, k0, g0, g0, be0, True, PREC)
    A11 = _gram16(k1, k1, g1, g1, be1, True, PREC)
    A22 = _gram16(k2, k2, g2, g2, be2, True, PREC)
    A33 = _gram16(k3, k3, g3, g3, be3, True, PREC)
    A10 = _gram16(k1, k0, g1, g0, be1, False, PREC)
    A20 = _gram16(k2, k0, g2, g0, be2, False, PREC)
    A21 = _gram16(k2, k1, g2, g1, be2, False, PREC)
    A30 = _gram16(k3, k0, g3, g0, be3, False, PREC)
    A31 = _gram16(k3, k1, g3, g1, be3, False, PREC)
    A32 = _gram16(k3, k2, g3, g2, be3, False, PREC)
    # T = (I + A)^{-1}: diagonal blocks by forward substitution, then block substitution
    T00 = _inv_unit_lower16(A00)
    T11 = _inv_unit_lower16(A11)
    T22 = _inv_unit_lower16(A22)
    T33 = _inv_unit_lower16(A33)
    T10 = -tl.dot(T11, tl.dot(A10, T00, input_precision="ieee"), input_precision="ieee")
    T21 = -tl.dot(T22, tl.dot(A21, T11, input_precision="ieee"), input_precision="ieee")
    T20 = -tl.dot(T22, tl.dot(A20, T00, input_precision="ieee") + tl.dot(A21, T10, input_precision="ieee"),
                  input_precision="ieee")
    T32 = -tl.dot(T33, tl.dot(A32, T22, input_precision="ieee"), input_precision="ieee")
    T31 = -tl.dot(T33, tl.dot(A31, T11, input_precision="ieee") + tl.dot(A32, T21, input_precision="ieee"),
                  input_precision="ieee")
    T30 = -tl.dot(T33, tl.dot(A30, T00, input_precision="ieee") + tl.dot(A31, T10, input_precision="ieee")
                  + tl.dot(A32, T20, input_precision="ieee"), input_precision="ieee")
    dt = k_ptr.dtype.element_ty
    # W = T (β e^b K)
    x0 = (k0.to(tl.float32) * (be0 * tl.exp(g0))[:, None]).to(dt)
    x1 = (k1.to(tl.float32) * (be1 * tl.exp(g1))[:, None]).to(dt)
    x2 = (k2.to(tl.float32) * (be2 * tl.exp(g2))[:, None]).to(dt)
    x3 = (k3.to(tl.float32) * (be3 * tl.exp(g3))[:, None]).to(dt)
    w0 = tl.dot(T00.to(dt), x0, input_precision=PREC)
    w1 = tl.dot(T10.to(dt), x0, input_precision=PREC) + tl.dot(T11.to(dt), x1, input_precision=PREC)
    w2 = (tl.dot(T20.to(dt), x0, input_precision=PREC) + tl.dot(T21.to(dt), x1, input_precision=PREC)
          + tl.dot(T22.to(dt), x2, input_precision=PREC))
    w3 = (tl.dot(T30.to(dt), x0, input_precision=PREC) + tl.dot(T31.to(dt), x1, input_precision=PREC)
          + tl.dot(T32.to(dt), x2, input_precision=PREC) + tl.dot(T33.to(dt), x3, input_precision=PREC))
    rr = tl.arange(0, 16)
    ck = tl.arange(0, K)
    wp = w_ptr + (bh * NTC + t0) * K
    tl.store(wp + (rr[:, None]) * K + ck[None, :], w0.to(dt))
    tl.store(wp + (16 + rr[:, None]) * K + ck[None, :], w1.to(dt))
    tl.store(wp + (32 + rr[:, None]) * K + ck[None, :], w2.to(dt))
    tl.store(wp + (48 + rr[:, None]) * K + ck[None, :], w3.to(dt))
    # U = T (β V)
    y0 = (_rows16(vp, t0, T, H * V, V).to(tl.float32) * be0[:, None]).to(dt)
    y1 = (_rows16(vp, t0 + 16, T, H * V, V).to(tl.float32) * be1[:, None]).to(dt)
    y2 = (_rows16(vp, t0 + 32, T, H * V, V).to(tl.float32) * be2[:, None]).to(dt)
    y3 = (_rows16(vp, t0 + 48, T, H * V, V).to(tl.float32) * be3[:, None]).to(dt)
    u0 = tl.dot(T00.to(dt), y0, input_precision=PREC)
    u1 = tl.dot(T10.to(dt), y0, input_precision=PREC) + tl.dot(T11.to(dt), y1, input_precision=PREC)
    u2 = (tl.dot(T20.to(dt), y0, input_precision=PREC) + tl.dot(T21.to(dt), y1, input_precision=PREC)
          + tl.dot(T22.to(dt), y2, input_precision=PREC))
    u3 = (tl.dot(T30.to(dt), y0, input_precision=PREC) + tl.dot(T31.to(dt), y1, input_precision=PREC)
          + tl.dot(T32.to(dt), y2, input_precision=PREC) + tl.dot(T33.to(dt), y3, input_precision=PREC))
    cv = tl.arange(0, V)
    up = u_ptr + (bh * NTC + t0) * V
    tl.store(up + (rr[:, None]) * V + cv[None, :], u0.to(u_ptr.dtype.element_ty))
    tl.store(up + (16 + rr[:, None]) * V + cv[None, :], u1.to(u_ptr.dtype.element_ty))
    tl.store(up + (32 + rr[:, None]) * V + cv[None, :], u2.to(u_ptr.dtype.element_ty))
    tl.store(up + (48 + rr[:, None]) * V + cv[None, :], u3.to(u_ptr.dtype.element_ty))
    if STORE_T:   # T = (I + A)^{-1} as a dense [64, 64] float32 tile per chunk, for the backward
        tp = t_ptr + (bh * NTC + t0) * 64 + rr[:, None] * 64 + rr[None, :]
        z = tl.zeros([16, 16], dtype=tl.float32)
        tl.store(tp, T00)
        tl.store(tp + 16, z)
        tl.store(tp + 32, z)
        tl.store(tp + 48, z)
        tl.store(tp + 16 * 64, T10)
        tl.store(tp + 16 * 64 + 16, T11)
        tl.store(tp + 16 * 64 + 32, z)
        tl.store(tp + 16 * 64 + 48, z)
        tl.store(tp + 32 * 64, T20)
        tl.store(tp + 32 * 64 + 16, T21)
        tl.store(tp + 32 * 64 + 32, T22)
        tl.store(tp + 32 * 64 + 48, z)
        tl.store(tp + 48 * 64, T30)
        tl.store(tp + 48 * 64 + 16, T31)
        tl.store(tp + 48 * 64 + 32, T32)
        tl.store(tp + 48 * 64 + 48, T33)


# ------------------------------------------------------------------------------------------------
# 2. sequential state pass with fused output (state on chip)
# ------------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=_NO_SPEC)
def _state_fwd_kernel(q_ptr, k_ptr, w_ptr, u_ptr, b_ptr, o_ptr, h0_ptr, ht_ptr, hs_ptr,
                      scale, T, H, NT, NTC,
                      K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                      HAS_H0: tl.constexpr, STORE_HT: tl.constexpr, STORE_HS: tl.constexpr):
    iv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)     # 64-bit offsets: [B*H, NT, K, V] buffers get large
    bi = bh // H
    h = bh % H
    dt = q_ptr.dtype.element_ty
    rc = tl.arange(0, 64)
    ck = tl.arange(0, K)
    cv = iv * BV + tl.arange(0, BV)
    causal = rc[:, None] >= rc[None, :]
    qp = q_ptr + (bi * T * H + h) * K
    kp = k_ptr + (bi * T * H + h) * K
    op = o_ptr + (bi * T * H + h) * V
    wp = w_ptr + bh * NTC * K
    up = u_ptr + bh * NTC * V
    bp = b_ptr + bh * NTC
    if HAS_H0:
        S = tl.load(h0_ptr + bh * K * V + ck[:, None] * V + cv[None, :]).to(tl.float32)
    else:
        S = tl.zeros([K, BV], dtype=tl.float32)
    for n in range(NT):
        t0 = n * 64
        if STORE_HS:
            tl.store(hs_ptr + (bh * NT + n) * K * V + ck[:, None] * V + cv[None, :], S.to(hs_ptr.dtype.element_ty))
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
        qe = (q.to(tl.float32) * (tl.exp(b) * scale)[:, None]).to(dt)
        o = tl.dot(qe, Sd, input_precision=PREC)
        s = tl.dot(q, tl.trans(k), input_precision=PREC)
        s = tl.where(causal, s * tl.exp(tl.where(causal, b[:, None] - b[None, :], 0.0)) * scale, 0.0)
        o += tl.dot(s.to(dt), vpd, input_precision=PREC)
        tl.store(op + rows[:, None] * (H * V) + cv[None, :], o.to(o_ptr.dtype.element_ty),
                 mask=rmask[:, None])
        kd = (k.to(tl.float32) * tl.exp(b_last - b)[:, None]).to(dt)
        S = S * tl.exp(b_last) + tl.dot(tl.trans(kd), vpd, input_precision=PREC)
    if STORE_HT:
        tl.store(ht_ptr + bh * K * V + ck[:, None] * V + cv[None, :], S)


# ------------------------------------------------------------------------------------------------
# 2b. split forward (``fwd_split=1``): sequential v' + states, then a parallel output kernel
# ------------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=_NO_SPEC)
def _state_vp_fwd_kernel(k_ptr, w_ptr, u_ptr, b_ptr, vp_ptr, h0_ptr, ht_ptr, hs_ptr,
                         T, H, NT, NTC,
                         K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                         HAS_H0: tl.constexpr, STORE_HT: tl.constexpr):
    """Sequential pass without outputs: per chunk ``v' = U − W S`` (written) and the state update;
    the entering state of every chunk is always written (the output kernel reads it)."""
    iv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    bi = bh // H
    h = bh % H
    dt = k_ptr.dtype.element_ty
    rc = tl.arange(0, 64)
    ck = tl.arange(0, K)
    cv = iv * BV + tl.arange(0, BV)
    kp = k_ptr + (bi * T * H + h) * K
    wp = w_ptr + bh * NTC * K
    up = u_ptr + bh * NTC * V
    vpp = vp_ptr + bh * NTC * V
    bp = b_ptr + bh * NTC
    if HAS_H0:
        S = tl.load(h0_ptr + bh * K * V + ck[:, None] * V + cv[None, :]).to(tl.float32)
    else:
        S = tl.zeros([K, BV], dtype=tl.float32)
    for n in range(NT):
        t0 = n * 64
        Sd = S.to(dt)
        tl.store(hs_ptr + (bh * NT + n) * K * V + ck[:, None] * V + cv[None, :], Sd.to(hs_ptr.dtype.element_ty))
        rows = t0 + rc
        rmask = rows < T
        k = tl.load(kp + rows[:, None] * (H * K) + ck[None, :], mask=rmask[:, None], other=0.0)
        w = tl.load(wp + rows[:, None] * K + ck[None, :])
        u = tl.load(up + rows[:, None] * V + cv[None, :]).to(tl.float32)
        b = tl.load(bp + rows)
        b_last = tl.load(bp + t0 + 63)
        vpd = (u - tl.dot(w, Sd, input_precision=PREC)).to(dt)
        tl.store(vpp + rows[:, None] * V + cv[None, :], vpd)
        kd = (k.to(tl.float32) * tl.exp(b_last - b)[:, None]).to(dt)
        S = S * tl.exp(b_last) + tl.dot(tl.trans(kd), vpd, input_precision=PREC)
    if STORE_HT:
        tl.store(ht_ptr + bh * K * V + ck[:, None] * V + cv[None, :], S)


@triton.jit(do_not_specialize=_NO_SPEC)
def _out_fwd_kernel(q_ptr, k_ptr, vp_ptr, b_ptr, hs_ptr, o_ptr, scale, T, H, NT, NTC,
                    K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    """Parallel over (chunk, V-block, sequence·head): ``o = (q ⊙ e^b) S + (q kᵀ ⊙ Γ) v'``."""
    n = tl.program_id(0)
    iv = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    bi = bh // H
    h = bh % H
    dt = q_ptr.dtype.element_ty
    rc = tl.arange(0, 64)
    ck = tl.arange(0, K)
    cv = iv * BV + tl.arange(0, BV)
    t0 = n * 64
    rows = t0 + rc
    rmask = rows < T
    causal = rc[:, None] >= rc[None, :]
    qkoff = (bi * T * H + h) * K + rows[:, None] * (H * K) + ck[None, :]
    q = tl.load(q_ptr + qkoff, mask=rmask[:, None], other=0.0)
    k = tl.load(k_ptr + qkoff, mask=rmask[:, None], other=0.0)
    b = tl.load(b_ptr + bh * NTC + rows)
    Sd = tl.load(hs_ptr + (bh * NT + n) * K * V + ck[:, None] * V + cv[None, :]).to(dt)
    vpd = tl.load(vp_ptr + (bh * NTC + rows[:, None]) * V + cv[None, :]).to(dt)
    qe = (q.to(tl.float32) * (tl.exp(b) * scale)[:, None]).to(dt)
    o = tl.dot(qe, Sd, input_precision=PREC)
    s = tl.dot(q, tl.trans(k), input_precision=PREC)
    s = tl.where(causal, s * tl.exp(tl.where(causal, b[:, None] - b[None, :], 0.0)) * scale, 0.0)
    o += tl.dot(s.to(dt), vpd, input_precision=PREC)
    tl.store(o_ptr + (bi * T * H + h) * V + rows[:, None] * (H * V) + cv[None, :],
             o.to(o_ptr.dtype.element_ty), mask=rmask[:, None])


# ------------------------------------------------------------------------------------------------
# 3. backward: sequential reverse pass for the state adjoints
# ------------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=_NO_SPEC)
def _state_bwd_kernel(q_ptr, k_ptr, w_ptr, b_ptr, do_ptr, dht_ptr, dh_ptr, dh0_ptr,
                      scale, T, H, NT, NTC,
                      K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                      HAS_DHT: tl.constexpr):
    iv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)     # 64-bit offsets: [B*H, NT, K, V] buffers get large
    bi = bh // H
    h = bh % H
    dt = q_ptr.dtype.element_ty
    rc = tl.arange(0, 64)
    ck = tl.arange(0, K)
    cv = iv * BV + tl.arange(0, BV)
    upper = rc[:, None] <= rc[None, :]          # (i, j) with j >= i: transpose of the causal mask
    qp = q_ptr + (bi * T * H + h) * K
    kp = k_ptr + (bi * T * H + h) * K
    dop = do_ptr + (bi * T * H + h) * V
    wp = w_ptr + bh * NTC * K
    bp = b_ptr + bh * NTC
    if HAS_DHT:
        dS = tl.load(dht_ptr + bh * K * V + ck[:, None] * V + cv[None, :]).to(tl.float32)
    else:
        dS = tl.zeros([K, BV], dtype=tl.float32)
    for i in range(NT):
        n = NT - 1 - i
        t0 = n * 64
        tl.store(dh_ptr + (bh * NT + n) * K * V + ck[:, None] * V + cv[None, :], dS.to(dh_ptr.dtype.element_ty))
        rows = t0 + rc
        rmask = rows < T
        q = tl.load(qp + rows[:, None] * (H * K) + ck[None, :], mask=rmask[:, None], other=0.0)
        k = tl.load(kp + rows[:, None] * (H * K) + ck[None, :], mask=rmask[:, None], other=0.0)
        do = tl.load(dop + rows[:, None] * (H * V) + cv[None, :], mask=rmask[:, None], other=0.0)
        w = tl.load(wp + rows[:, None] * K + ck[None, :])
        b = tl.load(bp + rows)
        b_last = tl.load(bp + t0 + 63)
        dSd = dS.to(dt)
        # P^T[i, j] = scale * (k_i . q_j) e^{b_j - b_i} for j >= i
        pt = tl.dot(k, tl.trans(q), input_precision=PREC)
        pt = tl.where(upper, pt * tl.exp(tl.where(upper, b[None, :] - b[:, None], 0.0)) * scale, 0.0)
        kd = (k.to(tl.float32) * tl.exp(b_last - b)[:, None]).to(dt)
        dvp = tl.dot(pt.to(dt), do, input_precision=PREC) + tl.dot(kd, dSd, input_precision=PREC)
        qe = (q.to(tl.float32) * (tl.exp(b) * scale)[:, None]).to(dt)
        dS = (dS * tl.exp(b_last) + tl.dot(tl.trans(qe), do, input_precision=PREC)
              - tl.dot(tl.trans(w), dvp.to(dt), input_precision=PREC))
    tl.store(dh0_ptr + bh * K * V + ck[:, None] * V + cv[None, :], dS)


# ------------------------------------------------------------------------------------------------
# 4. backward: per-chunk algebra (parallel over chunks), states and state adjoints given
# ------------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=_NO_SPEC)
def _local_bwd_kernel(q_ptr, k_ptr, v_ptr, beta_ptr, b_ptr, w_ptr, u_ptr, t_ptr, hs_ptr, dh_ptr, do_ptr,
                      dq_ptr, dk_ptr, dv_ptr, dbeta_ptr, db_ptr,
                      scale, T, H, NT, NTC,
                      K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                      STATE_TERMS: tl.constexpr):
    """Gradients of one chunk's objective ``<o, do> + <S', dS'>`` w.r.t. q, k, v, β and b, with the
    entering state ``S`` (``hs``) and the leaving-state adjoint ``dS'`` (``dh``) held fixed.
    Loops over V in blocks of ``BV``; everything else is one 64-row tile. With ``STATE_TERMS=False``
    the two ``[64, K]`` terms that pair the output/state gradients with the states
    (``e^b ⊙ do Sᵀ`` in dq, ``e^{b_C−b} ⊙ v' dS'ᵀ`` in dk) are left to ``_state_terms_bwd_kernel``
    and dq, dk are written as float32 partial sums (fewer live registers at K = 128)."""
    n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    bi = bh // H
    h = bh % H
    dt = q_ptr.dtype.element_ty
    t0 = n * 64
    rc = tl.arange(0, 64)
    ck = tl.arange(0, K)
    rows = t0 + rc
    rmask = rows < T
    causal = rc[:, None] >= rc[None, :]
    strict = rc[:, None] > rc[None, :]
    qkbase = (bi * T * H + h) * K
    vbase = (bi * T * H + h) * V
    q = tl.load(q_ptr + qkbase + rows[:, None] * (H * K) + ck[None, :], mask=rmask[:, None], other=0.0)
    k = tl.load(k_ptr + qkbase + rows[:, None] * (H * K) + ck[None, :], mask=rmask[:, None], other=0.0)
    beta = tl.load(beta_ptr + bi * T * H + h + rows * H, mask=rmask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + bh * NTC + rows)
    b_last = tl.load(b_ptr + bh * NTC + t0 + 63)
    w = tl.load(w_ptr + (bh * NTC + rows[:, None]) * K + ck[None, :])
    Tm = tl.load(t_ptr + (bh * NTC + rows[:, None]) * 64 + rc[None, :])
    eb = tl.exp(b)
    gam = tl.where(causal, tl.exp(tl.where(causal, b[:, None] - b[None, :], 0.0)), 0.0)   # Γ ⊙ M
    P = tl.dot(q, tl.trans(k), input_precision=PREC) * gam * scale                       # q̃ kᵀ ⊙ Γ ⊙ M
    Pd = P.to(dt)
    edec = tl.exp(b_last - b)
    kd = (k.to(tl.float32) * edec[:, None]).to(dt)                                       # K̃
    qe = (q.to(tl.float32) * (eb * scale)[:, None]).to(dt)                               # e^b ⊙ q̃
    Tmd = Tm.to(dt)
    if STATE_TERMS:
        dqe = tl.zeros([64, K], dtype=tl.float32)   # do Sᵀ
        dkd = tl.zeros([64, K], dtype=tl.float32)   # v' dS'ᵀ
    dW = tl.zeros([64, K], dtype=tl.float32)        # -dv' Sᵀ
    dPm = tl.zeros([64, 64], dtype=tl.float32)      # do v'ᵀ
    dAp = tl.zeros([64, 64], dtype=tl.float32)      # dY Uᵀ
    db_o = tl.zeros([64], dtype=tl.float32)         # rowsum(do ⊙ (e^b q̃) S)
    r = tl.zeros([64], dtype=tl.float32)            # rowsum((K̃ dS') ⊙ v')
    dbeta = tl.zeros([64], dtype=tl.float32)
    c = tl.zeros([64], dtype=tl.float32)            # <S, dS'> (kept as a vector, summed at the end)
    for iv in range(V // BV):
        cv = iv * BV + tl.arange(0, BV)
        sp = (bh * NT + n) * K * V + ck[:, None] * V + cv[None, :]
        S = tl.load(hs_ptr + sp).to(tl.float32)
        dS = tl.load(dh_ptr + sp).to(tl.float32)
        Sd = S.to(dt)
        dSd = dS.to(dt)
        do = tl.load(do_ptr + vbase + rows[:, None] * (H * V) + cv[None, :], mask=rmask[:, None], other=0.0)
        vv = tl.load(v_ptr + vbase + rows[:, None] * (H * V) + cv[None, :], mask=rmask[:, None], other=0.0)
        u = tl.load(u_ptr + (bh * NTC + rows[:, None]) * V + cv[None, :])
        vp = u.to(tl.float32) - tl.dot(w, Sd, input_precision=PREC)                      # v'
        vpd = vp.to(dt)
        KdS = tl.dot(kd, dSd, input_precision=PREC)
        dvp = tl.dot(tl.trans(Pd), do, input_precision=PREC) + KdS                        # dv'
        dvpd = dvp.to(dt)
        qS = tl.dot(qe, Sd, input_precision=PREC)
        db_o += tl.sum(do.to(tl.float32) * qS, 1)
        r += tl.sum(KdS * vp, 1)
        c += tl.sum(tl.sum(S * dS, 1), 0) * tl.where(rc == 0, 1.0, 0.0)
        dPm += tl.dot(do, tl.trans(vpd), input_precision=PREC)
        if STATE_TERMS:
            dqe += tl.dot(do, tl.trans(Sd), input_precision=PREC)
            dkd += tl.dot(vpd, tl.trans(dSd), input_precision=PREC)
        dW -= tl.dot(dvpd, tl.trans(Sd), input_precision=PREC)
        dY = tl.dot(tl.trans(Tmd), dvpd, input_precision=PREC)                           # Tᵀ dU
        tl.store(dv_ptr + vbase + rows[:, None] * (H * V) + cv[None, :],
                 (dY * beta[:, None]).to(dv_ptr.dtype.element_ty), mask=rmask[:, None])
        dbeta += tl.sum(dY * vv.to(tl.float32), 1)
        dAp += tl.dot(dY.to(dt), tl.trans(u.to(dt)), input_precision=PREC)
    # through W = T X, X = diag(β e^b) K
    dX = tl.dot(tl.trans(Tmd), dW.to(dt), input_precision=PREC)                          # Tᵀ dW
    dA = -(dAp + tl.dot(dX.to(dt), tl.trans(w), input_precision=PREC))
    dA = tl.where(strict, dA, 0.0)
    kf = k.to(tl.float32)
    xk = tl.sum(dX * kf, 1)
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
    # through o = (e^b ⊙ q̃) S + P v'
    dPm = tl.where(causal, dPm, 0.0)
    dPP = dPm * P
    db += db_o + tl.sum(dPP, 1) - tl.sum(dPP, 0)
    dPg = (dPm * gam).to(dt)
    dq = tl.dot(dPg, k, input_precision=PREC) * scale
    dk += tl.dot(tl.trans(dPg), q, input_precision=PREC) * scale
    # through S' = e^{b_C} S + K̃ᵀ v' (and the e^b q̃ S term of o)
    if STATE_TERMS:
        dq += dqe * (eb * scale)[:, None]
        dk += dkd * edec[:, None]
    db += tl.where(rc == 63, tl.sum(r, 0) + tl.exp(b_last) * tl.sum(c, 0), 0.0) - r
    tl.store(dq_ptr + qkbase + rows[:, None] * (H * K) + ck[None, :], dq.to(dq_ptr.dtype.element_ty),
             mask=rmask[:, None])
    tl.store(dk_ptr + qkbase + rows[:, None] * (H * K) + ck[None, :], dk.to(dk_ptr.dtype.element_ty),
             mask=rmask[:, None])
    tl.store(dbeta_ptr + bi * T * H + h + rows * H, dbeta, mask=rmask)
    tl.store(db_ptr + bh * NTC + rows, db)


@triton.jit(do_not_specialize=_NO_SPEC)
def _state_terms_bwd_kernel(w_ptr, u_ptr, b_ptr, hs_ptr, dh_ptr, do_ptr, dq32_ptr, dk32_ptr, dq_ptr, dk_ptr,
                            scale, T, H, NT, NTC,
                            K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    """Adds the state terms ``e^b ⊙ scale · do Sᵀ`` (dq) and ``e^{b_C − b} ⊙ v' dS'ᵀ`` (dk) to the
    float32 partial sums of ``_local_bwd_kernel`` (``STATE_TERMS=False``) and writes dq, dk."""
    n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    bi = bh // H
    h = bh % H
    dt = w_ptr.dtype.element_ty
    t0 = n * 64
    rc = tl.arange(0, 64)
    ck = tl.arange(0, K)
    rows = t0 + rc
    rmask = rows < T
    qkbase = (bi * T * H + h) * K
    vbase = (bi * T * H + h) * V
    b = tl.load(b_ptr + bh * NTC + rows)
    b_last = tl.load(b_ptr + bh * NTC + t0 + 63)
    w = tl.load(w_ptr + (bh * NTC + rows[:, None]) * K + ck[None, :])
    dqe = tl.zeros([64, K], dtype=tl.float32)
    dkd = tl.zeros([64, K], dtype=tl.float32)
    for iv in range(V // BV):
        cv = iv * BV + tl.arange(0, BV)
        sp = (bh * NT + n) * K * V + ck[:, None] * V + cv[None, :]
        Sd = tl.load(hs_ptr + sp).to(dt)
        dSd = tl.load(dh_ptr + sp).to(dt)
        do = tl.load(do_ptr + vbase + rows[:, None] * (H * V) + cv[None, :], mask=rmask[:, None], other=0.0)
        u = tl.load(u_ptr + (bh * NTC + rows[:, None]) * V + cv[None, :])
        vpd = (u.to(tl.float32) - tl.dot(w, Sd, input_precision=PREC)).to(dt)
        dqe += tl.dot(do, tl.trans(Sd), input_precision=PREC)
        dkd += tl.dot(vpd, tl.trans(dSd), input_precision=PREC)
    offs = qkbase + rows[:, None] * (H * K) + ck[None, :]
    dq = tl.load(dq32_ptr + offs, mask=rmask[:, None], other=0.0) + dqe * (tl.exp(b) * scale)[:, None]
    dk = tl.load(dk32_ptr + offs, mask=rmask[:, None], other=0.0) + dkd * tl.exp(b_last - b)[:, None]
    tl.store(dq_ptr + offs, dq.to(dq_ptr.dtype.element_ty), mask=rmask[:, None])
    tl.store(dk_ptr + offs, dk.to(dk_ptr.dtype.element_ty), mask=rmask[:, None])


# ------------------------------------------------------------------------------------------------
# host side
# ------------------------------------------------------------------------------------------------
def _check_sizes(K: int, V: int):
    if K not in _HEAD_SIZES:
        raise ValueError(f"the key head size K (last axis of q and k) must be one of {_HEAD_SIZES} for "
                         f"the Triton delta-rule kernel; got {K}")
    if V not in _HEAD_SIZES:
        raise ValueError(f"the value head size V (last axis of v) must be one of {_HEAD_SIZES} for "
                         f"the Triton delta-rule kernel; got {V}")


def _pick_bv(BH: int, V: int, K: int) -> int:
    """Largest V-block (≤ 64) that still gives ~2 programs per SM on a 132-SM GPU; ≥ 16."""
    bv = min(V, 64)
    while bv > 16 and BH * (V // bv) < 264:
        bv //= 2
    return bv


def _chunk_cumsum(g, B, T, H, NT):
    """Within-chunk cumulative log gate, float32, ``[B*H, NT*C]`` (zero padding past ``T``)."""
    C = CHUNK
    gp = torch.zeros(B, H, NT * C, dtype=torch.float32, device=g.device)
    gp[:, :, :T] = g.float().transpose(1, 2)
    return gp.view(B, H, NT, C).cumsum(-1).view(B * H, NT * C).contiguous()


_CFG_CACHE: dict = {}


def _launch(kernel, grid, args, meta, configs):
    """Launch with the first of ``configs`` (``num_warps``/``num_stages``) that fits the GPU.

    Simple heuristics, no autotuning: ``configs`` is ordered by expected speed, and a config that
    the compiler rejects for lack of shared memory or registers (``OutOfResources``) is skipped.
    The choice is cached per kernel and compile-time signature. The interpreter ignores configs.
    """
    key = (kernel.fn.__name__ if hasattr(kernel, "fn") else str(kernel),
           tuple(sorted((k, str(v)) for k, v in meta.items())),
           tuple(str(a.dtype) for a in args if isinstance(a, torch.Tensor)),
           tuple(tuple(sorted(c.items())) for c in configs))
    cfg = _CFG_CACHE.get(key)
    if cfg is not None:
        return kernel[grid](*args, **meta, **cfg)
    err = None
    for cfg in configs:
        try:
            out = kernel[grid](*args, **meta, **cfg)
        except OutOfResources as e:   # too much shared memory / registers for this config
            err = e
            continue
        _CFG_CACHE[key] = cfg
        return out
    raise err


def _seq_configs(dtype, K, BV, warps=0, stages=0):
    # 8 warps once the state tile K×BV has ≥ 2048 entries (ptxas, sm_90a: far fewer spills)
    nw = 8 if K * BV >= 2048 else 4
    if warps or stages:    # explicit override (tuning): exactly this config, no fallback
        return [dict(num_warps=warps or nw, num_stages=stages or (1 if dtype == torch.float32 else 2))]
    first = [dict(num_warps=nw, num_stages=2)] if dtype != torch.float32 else []
    return first + [dict(num_warps=nw, num_stages=1), dict(num_warps=8, num_stages=1)]


def _par_configs(K, V, warps=0, stages=0):
    nw = 4 if max(K, V) <= 64 else 8
    if warps or stages:
        return [dict(num_warps=warps or nw, num_stages=stages or 1)]
    return [dict(num_warps=nw, num_stages=1), dict(num_warps=8, num_stages=1)]


def _tuned_bv(key, default, V):
    bv = _TUNE[key] or default
    if bv not in _HEAD_SIZES or bv > V:
        raise ValueError(f"tuning: {key} must be one of {_HEAD_SIZES} and at most V = {V}; got {bv}")
    return bv


def _precision(dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def _wy_fwd(k, v, b, beta, store_t):
    """Kernel 1: ``W, U`` (and ``T`` when ``store_t``) for every chunk."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    NTC = NT * CHUNK
    BH = B * H
    dev = k.device
    w = torch.empty(BH, NTC, K, dtype=k.dtype, device=dev)
    u = torch.empty(BH, NTC, V, dtype=torch.float32 if _U_FP32 else k.dtype, device=dev)
    tm = torch.empty(BH, NTC, CHUNK, dtype=torch.float32, device=dev) if store_t else None
    _launch(_wy_fwd_kernel, (NT, BH), (k, v, beta, b, w, u, tm if tm is not None else w, T, H, NTC),
            dict(K=K, V=V, PREC=_precision(k.dtype), STORE_T=store_t),
            _par_configs(K, V, _TUNE["par_warps"], _TUNE["par_stages"]))
    return w, u, tm


def _state_fwd(q, k, w, u, b, scale, h0, output_final_state, store_states):
    """Kernel 2 (fused) or 2b (``fwd_split``: sequential v' + states, parallel outputs)."""
    B, T, H, K = q.shape
    V = u.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    NTC = NT * CHUNK
    BH = B * H
    dev = q.device
    prec = _precision(q.dtype)
    split = bool(_TUNE["fwd_split"])
    o = torch.empty(B, T, H, V, dtype=q.dtype, device=dev)
    ht = torch.empty(B, H, K, V, dtype=torch.float32, device=dev) if output_final_state else None
    # chunk states for the backward, in the input dtype: every use there feeds a tensor-core product
    # in that dtype anyway, and bf16 halves the largest saved tensor (always kept when split)
    hs = torch.empty(BH, NT, K, V, dtype=q.dtype, device=dev) if (store_states or split) else None
    BV = _tuned_bv("fwd_bv", _pick_bv(BH, V, K), V)
    seq_cfg = _seq_configs(q.dtype, K, BV, _TUNE["fwd_warps"], _TUNE["fwd_stages"])
    if not split:
        _launch(_state_fwd_kernel, (V // BV, BH),
                (q, k, w, u, b, o, h0 if h0 is not None else o, ht if ht is not None else o,
                 hs if hs is not None else o, float(scale), T, H, NT, NTC),
                dict(K=K, V=V, BV=BV, PREC=prec, HAS_H0=h0 is not None, STORE_HT=output_final_state,
                     STORE_HS=store_states), seq_cfg)
        return o, ht, hs
    vp = torch.empty(BH, NTC, V, dtype=q.dtype, device=dev)
    _launch(_state_vp_fwd_kernel, (V // BV, BH),
            (k, w, u, b, vp, h0 if h0 is not None else o, ht if ht is not None else o, hs, T, H, NT, NTC),
            dict(K=K, V=V, BV=BV, PREC=prec, HAS_H0=h0 is not None, STORE_HT=output_final_state), seq_cfg)
    BVO = _tuned_bv("out_bv", min(V, 64), V)
    _launch(_out_fwd_kernel, (NT, V // BVO, BH), (q, k, vp, b, hs, o, float(scale), T, H, NT, NTC),
            dict(K=K, V=V, BV=BVO, PREC=prec),
            _par_configs(K, BVO, _TUNE["out_warps"], _TUNE["out_stages"]))
    return o, ht, hs


def _forward(q, k, v, b, beta, scale, h0, output_final_state, store_states):
    w, u, tm = _wy_fwd(k, v, b, beta, store_states)
    o, ht, hs = _state_fwd(q, k, w, u, b, scale, h0, output_final_state, store_states)
    return o.to(v.dtype), ht, w, u, tm, hs


def _state_bwd(q, k, w, b, do, dht, scale, NT):
    """Kernel 3: leaving-state adjoints of every chunk and the gradient of the initial state."""
    B, T, H, K = q.shape
    V = do.shape[-1]
    BH = B * H
    dh = torch.empty(BH, NT, K, V, dtype=q.dtype, device=q.device)   # leaving-state adjoints
    dh0 = torch.empty(B, H, K, V, dtype=torch.float32, device=q.device)
    BV = _tuned_bv("bwd_bv", _pick_bv(BH, V, K), V)
    has_dht = dht is not None
    dht_c = dht.float().contiguous() if has_dht else dh0
    _launch(_state_bwd_kernel, (V // BV, BH),
            (q, k, w, b, do, dht_c, dh, dh0, float(scale), T, H, NT, NT * CHUNK),
            dict(K=K, V=V, BV=BV, PREC=_precision(q.dtype), HAS_DHT=has_dht),
            _seq_configs(q.dtype, K, BV, _TUNE["bwd_warps"], _TUNE["bwd_stages"]))
    return dh, dh0


def _chunk_local_grads(q, k, v, g, beta, scale, hs, dh, do):
    """Gradients of the per-chunk (parallel) algebra with entering states ``hs`` and leaving-state
    adjoints ``dh`` held fixed, through batched PyTorch ops and autograd (float32).

    Local objective per chunk ``n``: ``<o_n, do_n> + <S_{n+1}, dS_{n+1}>`` with
    ``S_{n+1} = e^{b_C} S_n + (k ⊙ e^{b_C − b})ᵀ v'`` and ``v' = U − W S_n``; the state terms are
    written without forming ``[K, V]`` products: ``e^{b_C} <S_n, dS_{n+1}> + <v', (k ⊙ e^{b_C−b}) dS_{n+1}>``.
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
        causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
        strict = causal.tril(-1)
        diff = bc.unsqueeze(-1) - bc.unsqueeze(-2)
        decay = torch.where(causal, diff, torch.zeros_like(diff)).exp() * causal
        A = ((kc @ kc.transpose(-1, -2)) * decay * betac.unsqueeze(-1)) * strict
        eye = torch.eye(C, dtype=torch.float32, device=q.device)
        U = torch.linalg.solve_triangular(eye + A, vc * betac.unsqueeze(-1), upper=False, unitriangular=True)
        W = torch.linalg.solve_triangular(eye + A, kc * (betac * bc.exp()).unsqueeze(-1), upper=False,
                                          unitriangular=True)
        vp = U - W @ Sn
        o = (qc * bc.exp().unsqueeze(-1)) @ Sn + ((qc @ kc.transpose(-1, -2)) * decay) @ vp
        last = bc[..., -1]
        kd = kc * (last.unsqueeze(-1) - bc).exp().unsqueeze(-1)
        c_n = (Sn * dSn).sum((-1, -2))
        loss = (o * doc).sum() + (last.exp() * c_n).sum() + (vp * (kd @ dSn)).sum()
        grads = torch.autograd.grad(loss, leaves)
    dq, dk, dv, dbeta = grads[:4]
    dg = grads[4] if g is not None else None
    return dq, dk, dv, dbeta, dg


def _local_grads_triton(q, k, v, g, beta, b, w, u, tm, hs, dh, do, scale):
    """Per-chunk backward on the GPU: ``_local_bwd_kernel`` (+ ``_state_terms_bwd_kernel``)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = hs.shape[1]
    BH = B * H
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    split = _BWD_SPLIT
    if split:   # float32 partial sums, completed by _state_terms_bwd_kernel
        dq_p = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        dk_p = torch.empty(k.shape, dtype=torch.float32, device=q.device)
    else:
        dq_p, dk_p = dq, dk
    dbeta = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
    db = torch.empty(BH, NT * CHUNK, dtype=torch.float32, device=q.device)
    # V-block of the inner loop: 32 at K = 128 (ptxas, sm_90a, bf16: fewest register spills)
    BVL = _tuned_bv("local_bv", min(V, 32 if K >= 128 else 64), V)
    prec = _precision(q.dtype)
    pcfg = _par_configs(K, V, _TUNE["par_warps"], _TUNE["par_stages"])
    _launch(_local_bwd_kernel, (NT, BH),
            (q, k, v, beta, b, w, u, tm, hs, dh, do, dq_p, dk_p, dv, dbeta, db, scale, T, H, NT, NT * CHUNK),
            dict(K=K, V=V, BV=BVL, PREC=prec, STATE_TERMS=not split), pcfg)
    if split:
        _launch(_state_terms_bwd_kernel, (NT, BH),
                (w, u, b, hs, dh, do, dq_p, dk_p, dq, dk, scale, T, H, NT, NT * CHUNK),
                dict(K=K, V=V, BV=BVL, PREC=prec), pcfg)
    dg = None
    if g is not None:   # b_i = Σ_{s ≤ i} g_s inside a chunk: dg = reverse cumulative sum of db
        dg = db.view(B, H, NT, CHUNK).flip(-1).cumsum(-1).flip(-1).view(B, H, NT * CHUNK)
        dg = dg[:, :, :T].transpose(1, 2)
    return dq, dk, dv, dbeta, dg


class _ChunkDeltaFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, h0, output_final_state, train):
        B, T, H, K = q.shape
        V = v.shape[-1]
        NT = triton.cdiv(T, CHUNK)
        b = _chunk_cumsum(g, B, T, H, NT) if g is not None else \
            torch.zeros(B * H, NT * CHUNK, dtype=torch.float32, device=q.device)
        o, ht, w, u, tm, hs = _forward(q, k, v, b, beta, scale, h0, output_final_state, store_states=train)
        if train:
            ctx.save_for_backward(q, k, v, g, beta, b, w, u, tm, hs)
            ctx.scale = scale
            ctx.has_h0 = h0 is not None
            ctx.h0_dtype = h0.dtype if h0 is not None else None
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, beta, b, w, u, tm, hs = ctx.saved_tensors
        B, T, H, K = q.shape
        V = v.shape[-1]
        NT = hs.shape[1]
        BH = B * H
        do = do.to(q.dtype).contiguous()
        dh, dh0 = _state_bwd(q, k, w, b, do, dht, float(ctx.scale), NT)
        res = None
        if _BWD_IMPL != "torch":
            try:
                res = _local_grads_triton(q, k, v, g, beta, b, w, u, tm, hs, dh, do, float(ctx.scale))
            except OutOfResources:
                # e.g. float32 inputs at K = V = 128 need more shared memory than a GPU has for
                # this kernel; the batched-PyTorch path computes the same gradients
                res = None
        if res is None:
            res = _chunk_local_grads(q, k, v, g, beta, ctx.scale, hs, dh, do)
        dq, dk, dv, dbeta, dg = res
        dh0_out = dh0.to(ctx.h0_dtype) if ctx.has_h0 else None
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype),
                dg.to(g.dtype) if g is not None else None, dbeta.to(beta.dtype), None, dh0_out, None, None)


def chunk_gated_delta_rule_triton(q, k, v, g, beta, scale, initial_state=None, output_final_state=False):
    """Triton (gated) delta rule; ``g=None`` gives ``chunk_delta_rule``. Returns ``(o, final_state)``.

    Inputs are already validated by :mod:`kernels.ops` except the head sizes, checked here
    (``K, V ∈ {16, 32, 64, 128}``) before any kernel is compiled.
    """
    K, V = q.shape[-1], v.shape[-1]
    _check_sizes(K, V)
    if q.shape[0] * q.shape[2] > 65535:
        raise ValueError(f"batch × heads must be at most 65535 for the Triton delta-rule kernels "
                         f"(a CUDA grid dimension); got {q.shape[0]} × {q.shape[2]}")
    q, k, v, beta = (x.contiguous() for x in (q, k, v, beta))
    if g is not None:
        g = g.contiguous()
    # float32 copy; the cast is differentiable, so the gradient reaches the caller's tensor
    h0 = initial_state.float().contiguous() if initial_state is not None else None
    # keep T and the chunk states for the backward only when a gradient can be asked for
    train = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, g, beta, h0))
    o, ht = _ChunkDeltaFn.apply(q, k, v, g, beta, float(scale), h0, bool(output_final_state), train)
    return o, ht
