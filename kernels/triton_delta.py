"""Triton kernels for the chunkwise (gated) delta rule: ``chunk_delta_rule`` / ``chunk_gated_delta_rule``.

Semantics (fla's orientation, state ``S`` is ``[K, V]`` per head, ``a_t = exp(g_t)``, ``a_t = 1``
without a gate)::

    S_t = a_t S_{t-1};   S_t = S_t + β_t k_t (v_t − S_tᵀ k_t)ᵀ;   o_t = scale · S_tᵀ q_t

Chunks of ``C = 64`` tokens; ``b`` is the within-chunk cumulative log gate (``b_i = Σ_{s≤i} g_s``,
restarting at every chunk), so every exponent is a difference ``b_i − b_j`` (``j ≤ i``) or
``b_C − b_i`` or ``b_i`` itself, all ``≤ 0``: the kernels stay finite for arbitrarily harsh gates.

Training forward: three kernels (the inference forward, without gradients, is below them).

1. ``_kkt_solve_kernel`` (grid: chunks × batch·heads, fully parallel) builds
   ``A_ij = β_i e^{b_i − b_j} k_i·k_j`` (``j < i``) in 16×16 blocks, inverts the four unit
   lower-triangular diagonal blocks ``I + A_ii`` by forward substitution in registers (row by row,
   reading ``A_ii`` transposed so that no step moves data between register layouts), merges them
   into ``T = (I + A)^{-1}`` by block substitution (``T_ij = −T_ii Σ_m A_im T_mj``, 3×TF32
   products for 16-bit inputs) and writes ``T`` as a dense ``[64, 64]`` tile in the input dtype
   (one warp per chunk: the 16×16 tiles are replicated across warps, so more warps only add
   reduction traffic). The within-chunk cumulative log gate ``b`` comes from a small kernel before
   it (``_gate_cumsum_kernel``).
2. ``_wu_fwd_kernel`` (same grid) forms the WY/UT factors ``W = T (β e^{b} K)`` and ``U = T (β V)``
   as ``[64, 64]`` products over column blocks (``wy_fuse=1`` does this inside kernel 1 instead),
   and the chunk's masked, gated, scaled scores ``P = scale · (q kᵀ ⊙ Γ ⊙ M)`` (``[64, 64]``, stored
   in the input dtype): every later kernel reads ``P`` instead of recomputing it per V-block
   (``aqk=2`` restores the recomputation).
3. ``_state_fwd_kernel`` (grid: V-blocks × batch·heads, sequential over chunks) keeps the state
   ``S`` (``[K, BV]``, float32) in registers for the whole sequence and per chunk computes the
   pseudo-values ``v' = U − W S``, the output ``o = (q ⊙ e^{b}) S + P v'`` and the next state
   ``S ← e^{b_C} S + (k ⊙ e^{b_C − b})ᵀ v'``. There is no state round trip through HBM and no
   separate output kernel. For training it also writes the state entering every chunk and ``v'``.
   (``fwd_split=1``: a sequential kernel for ``v'`` and the states, then a parallel output kernel.)

Inference forward (no input needs a gradient; ``tform=2`` uses the training kernels instead):
``v' = U − W S = T (β ⊙ (v − e^{b} ⊙ K S))``, so ``W`` and ``U`` are never formed. Kernel 1 writes
``T`` only, and ``_march_t_kernel`` (the sequential pass in "T form") reads ``T`` and ``v`` instead of
``W`` and ``U``. That is one more ``[64, 64] × [64, BV]`` product per step, and two fewer
``[64, K]``-sized tiles through memory per chunk. With V-blocks of 64 the pass forms the scores
itself. With narrower blocks it reads them from ``_wu_fwd_kernel`` run in scores-only mode.
The march reads ``β`` as float32 ``[B·H, NT·64]``, written beside ``b`` by the gate-cumsum kernel
(a strided 2-byte read cannot be copied into shared memory ahead of use, and it cost the
latency-bound loop a global-memory wait per step), and drops its row masks when ``T`` is a multiple
of 64. When the march is a single partial wave of programs (small batch × heads), the chunks are cut
into two ranges and the solve and scores of the second run on a side CUDA stream while the march
works through the first (``_segments``; each march launch resumes from the state the last one left).
On Hopper GPUs the march can also run as a Gluon kernel (``kernels/gluon_delta.py``, knob ``mt_gl``;
off by default: round 9 measured its march faster at small batch × heads, the forward barely).
``_tsolve_kernel`` (``tsolve=1``) is an alternative kernel 1 with four warps: it forms ``A`` with one
``K Kᵀ`` product and inverts by doubling the solved diagonal blocks (1 → 2 → … → 64, exact
algebra, TF32 products for 16-bit inputs). It took the same time as the one-warp kernel on the H200
and is less precise, so it is not the default.

Backward (derivation in ``kernels/NOTES_delta.md``). The forward keeps ``T``, ``W``, ``U``, ``P``,
the entering state of every chunk and ``v'`` (all in the input dtype: every use in the backward
feeds a tensor-core product in that dtype anyway).

4. ``_state_bwd_kernel`` (sequential over chunks in reverse) carries the state adjoint ``dS`` on
   chip: ``dv' = Pᵀ do + (k ⊙ e^{b_C − b}) dS``,
   ``dS ← e^{b_C} dS + (q ⊙ e^{b})ᵀ do − Wᵀ dv'``, writing ``dv'`` and the adjoint of the state
   leaving every chunk and, at the end, the gradient of ``initial_state``.
5. ``_bwd_dqk_kernel`` (grid: K-blocks × chunks × batch·heads) gives, with the states, their
   adjoints, ``v'`` and ``dv'`` known, ``dq``, the part of ``dk`` through the scores and the state
   update, ``dW = −dv' Sᵀ`` and its share of the log-gate gradient;
6. ``_bwd_wy_kernel`` (grid: chunks × batch·heads) differentiates ``U = T (β V)``,
   ``W = T (β e^b K)`` and ``T = (I + A)^{-1}``: ``dv``, ``dβ``, the rest of ``dk`` and of the
   log-gate gradient ``db`` (``dg`` is its reverse cumulative sum inside each chunk, one PyTorch op).
   It recomputes ``U`` and ``W`` from ``T`` (the same products as kernel 2, so the same values)
   rather than reading them back (``dwy_rec=2`` reads them).

Launch parameters (V-blocks, warps, stages) are fixed heuristics chosen by the H200 sweeps recorded
in ``kernels/NOTES_delta.md`` (``kernels/benchmarks/explore_delta.py``), not autotuned.

``LATTN_DELTA_BWD=torch`` swaps steps 5-6 for batched PyTorch + autograd (``_chunk_local_grads``), an
independent cross-check and a fallback should the compiled kernels misbehave on some GPU/Triton
combination; the same path is used automatically when a kernel does not fit the GPU
(``OutOfResources``).

Triton 3.6 on Hopper: some launch configurations of these multi-``tl.dot`` kernels end in an illegal
memory access (seen in the sweeps for a few V-block/warp combinations, none of them a default; the
upstream reports are triton-lang/triton#10486 and #11366). The defaults are configurations that
passed the GPU tests and the sweeps' checks; explicit ``tuning`` overrides are not guarded.

Float32 inputs use ``input_precision="ieee"`` in every ``tl.dot``; float16/bfloat16 inputs feed the
tensor cores in their own dtype with float32 accumulation. The triangular solve is float32: its row
loop on the FMA units, its block products 3×TF32 (near-IEEE; ``kkt_oprec=1`` makes them IEEE). ``o``
has ``v``'s dtype and the final state is float32.
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
from .gluon_delta import gluon_march_supported, march_gluon, march_gluon_wu

__all__ = ["chunk_gated_delta_rule_triton", "CHUNK"]

CHUNK = 64          # chunk length C (four 16-row blocks: the solve below is written for it)
_HEAD_SIZES = (16, 32, 64, 128)
# Backward of the per-chunk algebra: "triton" (``_local_bwd_kernel``, default) or "torch"
# (batched PyTorch + autograd, ``_chunk_local_grads``; a cross-check and a fallback).
_BWD_IMPL = os.environ.get("LATTN_DELTA_BWD", "triton")
_U_FP32 = os.environ.get("LATTN_DELTA_U_FP32", "0") == "1"

# Tuning overrides for exploration (``kernels/benchmarks/explore_delta.py``); 0 = the default
# heuristic. Set through ``LATTN_DELTA_TUNE="fwd_bv=32,fwd_warps=4"`` (read at import) or the
# ``tuning(**kw)`` context manager. An explicit warps/stages override launches exactly that config
# (no fallback), so a config that does not fit raises instead of being silently replaced.
#   kkt_warps / kkt_bk                     the per-chunk T = (I + A)^{-1} kernel (warps; column
#                                          block of the K Kᵀ accumulation)
#   wy_fuse     1: W, U formed in the same kernel as T; 0: a second kernel (``_wu_fwd_kernel``)
#   wu_bk / wu_warps                       column block and warps of the W, U products
#   fwd_split   1: forward = sequential ``_state_vp_fwd_kernel`` (v', states) + parallel
#               ``_out_fwd_kernel`` (outputs); 0: the fused ``_state_fwd_kernel``
#   fwd_bv / fwd_warps / fwd_stages        the sequential forward kernel
#   out_bv / out_warps                     the parallel output kernel (fwd_split=1)
#   bwd_bv / bwd_warps / bwd_stages        the sequential backward kernel
#   dqk_bk / dqk_bv / dqk_warps            ``_bwd_dqk_kernel`` (K-block of the grid, V-block, warps)
#   dwy_bv / dwy_warps                     ``_bwd_wy_kernel``
#   aqk         1: the intra-chunk scores are computed once per chunk (``_wu_fwd_kernel``) and read
#               by the sequential kernels and ``_bwd_dqk_kernel``; 2: each kernel recomputes them
#   dwy_rec     1: ``_bwd_wy_kernel`` recomputes ``U``, ``W`` from ``T``; 2: it reads them back
#   tsolve      1: ``T`` by block doubling on the whole chunk (``_tsolve_kernel``, ``ts_warps``);
#               2 (default): the one-warp 16×16-block kernel (``_kkt_solve_kernel``)
#   ts_prec     precision of the doubling products for 16-bit inputs: 1 tf32, 2 tf32x3, 3 ieee
#   tform       1: the inference forward (no gradient asked for) in T form (``_march_t_kernel``:
#               no W, U); 2: W/U form as in training
#   mt_bv / mt_warps / mt_stages           ``_march_t_kernel``
#   mqk         1: ``_march_t_kernel`` reads scores stored by the solve; 2: it forms them itself
#   kkt_oprec   precision of the one-warp solve's off-diagonal block products for 16-bit inputs:
#               1 ieee, 2 tf32x3 (default), 3 tf32
#   mt_seg      chunk ranges of the inference forward whose solve overlaps the march on a side
#               stream (1: none; 0: the default rule of ``_segments``)
#   mt_even     1 (default): the march drops its row masks when T is a multiple of 64; 2: keeps them
#   mt_gl       1: the inference march in Gluon, T form; 3: in Gluon, W/U form (``gluon_delta.py``;
#               Hopper, 16-bit, T a multiple of 64, else the Triton march); 2: the Triton march;
#               mt_gst: the Gluon march's pipeline stages
_TUNE_KEYS = ("kkt_warps", "kkt_bk", "wy_fuse", "wu_bk", "wu_warps", "fwd_split", "fwd_bv", "fwd_warps",
              "fwd_stages", "out_bv", "out_warps", "bwd_bv", "bwd_warps", "bwd_stages",
              "dqk_bk", "dqk_bv", "dqk_warps", "dwy_bv", "dwy_warps", "aqk", "dwy_rec",
              "tsolve", "ts_warps", "ts_prec", "tform", "mt_bv", "mt_warps", "mt_stages", "mqk",
              "kkt_oprec", "mt_seg", "mt_even", "mt_gl", "mt_gst")
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
def _load_state(ptr, bh, ck, cv, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, PRESENT: tl.constexpr):
    """Columns ``cv`` of one ``[K, V]`` float32 state (initial state or final-state gradient) of
    sequence·head ``bh``, or zeros when there is none."""
    if PRESENT:
        return tl.load(ptr + bh * K * V + ck[:, None] * V + cv[None, :]).to(tl.float32)
    return tl.zeros([K, BV], dtype=tl.float32)


@triton.jit
def _mask_gate(s, b, scale):
    """Intra-chunk scores ``scale · s_ij e^{b_i − b_j}`` for ``j ≤ i``, zero above the diagonal
    (``s = q kᵀ`` of one chunk, float32; every exponent is ≤ 0)."""
    rc = tl.arange(0, 64)
    causal = rc[:, None] >= rc[None, :]
    return tl.where(causal, s * tl.exp(tl.where(causal, b[:, None] - b[None, :], 0.0)) * scale, 0.0)


@triton.jit
def _gram16(s, ba, bb, beta_a):
    """One 16×16 block of ``A_ij = β_i e^{b_i − b_j} k_i·k_j`` below the diagonal blocks (every
    exponent ≤ 0) from the block of dot products ``s = k_i·k_j``."""
    return s * tl.exp(ba[:, None] - bb[None, :]) * beta_a[:, None]


@triton.jit
def _gram16_diag_t(s, b, beta):
    """The transpose of a diagonal block of ``A`` (strictly lower, ``A_ij = β_i e^{b_i − b_j}
    k_i·k_j`` for ``j < i``), read off the
    symmetric block of dot products ``s = k_i·k_j`` without a transpose: ``Aᵀ[r, c] = A[c, r] =
    β_c e^{b_c − b_r} s_rc`` for ``c > r``."""
    r = tl.arange(0, 16)
    up = r[None, :] > r[:, None]
    d = b[None, :] - b[:, None]
    return tl.where(up, s * tl.exp(tl.where(up, d, 0.0)), 0.0) * beta[None, :]


@triton.jit
def _inv4_unit_lower16(At0, At1, At2, At3):
    """``(I + A)^{-1}`` of four strictly lower-triangular 16×16 blocks by forward substitution,
    row by row, from their transposes: row ``i`` of ``A`` is column ``i`` of ``Aᵀ``, a vector
    along the rows, which is what ``Σ_j a_j T[j, :]`` broadcasts, so no step of the loop moves
    data between layouts (read from ``A`` itself, row ``i`` lies along the columns, and the
    round-5 loop converted two vectors per block and step; NOTES_delta.md, round 6). The four
    independent solves share one loop so that their steps can overlap; a loop, not unrolled:
    far fewer live registers (ptxas, sm_90a)."""
    r = tl.arange(0, 16)
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    T0 = eye
    T1 = eye
    T2 = eye
    T3 = eye
    for i in range(1, 16):
        col = r[None, :] == i
        row = r[:, None] == i
        e = tl.where(r == i, 1.0, 0.0)
        a0 = tl.sum(tl.where(col, At0, 0.0), 1)          # row i of A, along the rows (index j)
        a1 = tl.sum(tl.where(col, At1, 0.0), 1)
        a2 = tl.sum(tl.where(col, At2, 0.0), 1)
        a3 = tl.sum(tl.where(col, At3, 0.0), 1)
        T0 = tl.where(row, (e - tl.sum(a0[:, None] * T0, 0))[None, :], T0)
        T1 = tl.where(row, (e - tl.sum(a1[:, None] * T1, 0))[None, :], T1)
        T2 = tl.where(row, (e - tl.sum(a2[:, None] * T2, 0))[None, :], T2)
        T3 = tl.where(row, (e - tl.sum(a3[:, None] * T3, 0))[None, :], T3)
    return T0, T1, T2, T3


@triton.jit
def _wu_chunk(q_ptr, k_ptr, v_ptr, beta_ptr, b_ptr, w_ptr, u_ptr, t_ptr, a_ptr, scale, n, bh, T, H, NTC,
              K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr, QK: tl.constexpr,
              WU: tl.constexpr, PT: tl.constexpr = False):
    """``W = T (β e^b K)`` and ``U = T (β V)`` of one chunk from its stored ``T``: ``[64, 64]``
    products over K and V in column blocks of ``BK``. With ``QK`` also the chunk's masked, gated,
    scaled scores ``P = scale · (q kᵀ ⊙ Γ ⊙ M)`` (``[64, 64]``, the input dtype), which the
    sequential kernels would otherwise recompute for every V-block. ``WU=False``: the scores only.
    ``PT``: the product ``P T`` is stored instead of ``P`` (the Gluon march, ``gluon_delta.py``)."""
    bi = bh // H
    h = bh % H
    dt = k_ptr.dtype.element_ty
    rc = tl.arange(0, 64)
    rows = n * 64 + rc
    rmask = rows < T
    Tm = tl.load(t_ptr + (bh * NTC + rows[:, None]) * 64 + rc[None, :]).to(dt)
    beta = tl.load(beta_ptr + bi * T * H + h + rows * H, mask=rmask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + bh * NTC + rows)
    sk = beta * tl.exp(b)
    if QK:   # first, so that its [64, 64] accumulator is dead before the W, U products
        s = tl.zeros([64, 64], dtype=tl.float32)
        for c0 in tl.static_range(0, K, BK):
            kq_off = (bi * T * H + h) * K + rows[:, None] * (H * K) + (c0 + tl.arange(0, BK))[None, :]
            s += tl.dot(tl.load(q_ptr + kq_off, mask=rmask[:, None], other=0.0),
                        tl.trans(tl.load(k_ptr + kq_off, mask=rmask[:, None], other=0.0)), input_precision=PREC)
        s = _mask_gate(s, b, scale)
        if PT:
            s = tl.dot(s.to(dt), Tm, input_precision=PREC)
        tl.store(a_ptr + (bh * NTC + rows[:, None]) * 64 + rc[None, :], s.to(a_ptr.dtype.element_ty))
    if WU:
        for c0 in tl.static_range(0, K, BK):
            ck = c0 + tl.arange(0, BK)
            x = tl.load(k_ptr + (bi * T * H + h) * K + rows[:, None] * (H * K) + ck[None, :],
                        mask=rmask[:, None], other=0.0)
            x = (x.to(tl.float32) * sk[:, None]).to(dt)
            tl.store(w_ptr + (bh * NTC + rows[:, None]) * K + ck[None, :],
                     tl.dot(Tm, x, input_precision=PREC).to(w_ptr.dtype.element_ty))
        for c0 in tl.static_range(0, V, BK):
            cv = c0 + tl.arange(0, BK)
            y = tl.load(v_ptr + (bi * T * H + h) * V + rows[:, None] * (H * V) + cv[None, :],
                        mask=rmask[:, None], other=0.0)
            y = (y.to(tl.float32) * beta[:, None]).to(dt)
            tl.store(u_ptr + (bh * NTC + rows[:, None]) * V + cv[None, :],
                     tl.dot(Tm, y, input_precision=PREC).to(u_ptr.dtype.element_ty))


@triton.jit
def _key_rows4(kp, c0, t0, T, H, K: tl.constexpr, KC: tl.constexpr):
    """Columns ``c0 .. c0+KC`` of the chunk's keys at row ``t0``, as its four 16-row blocks."""
    return (_rows16(kp + c0, t0, T, H * K, KC), _rows16(kp + c0, t0 + 16, T, H * K, KC),
            _rows16(kp + c0, t0 + 32, T, H * K, KC), _rows16(kp + c0, t0 + 48, T, H * K, KC))


@triton.jit
def _gram10(kp, t0, T, H, K: tl.constexpr, KC: tl.constexpr, PREC: tl.constexpr):
    """The ten 16×16 blocks (``i ≥ j``) of ``K Kᵀ`` of the chunk at row ``t0`` (float32), over
    column blocks of ``KC`` keys: the four diagonal ones (``s00, s11, s22, s33``), then the six
    below them (``s10, s20, s21, s30, s31, s32``)."""
    s00 = tl.zeros([16, 16], dtype=tl.float32)
    s11 = tl.zeros([16, 16], dtype=tl.float32)
    s22 = tl.zeros([16, 16], dtype=tl.float32)
    s33 = tl.zeros([16, 16], dtype=tl.float32)
    s10 = tl.zeros([16, 16], dtype=tl.float32)
    s20 = tl.zeros([16, 16], dtype=tl.float32)
    s21 = tl.zeros([16, 16], dtype=tl.float32)
    s30 = tl.zeros([16, 16], dtype=tl.float32)
    s31 = tl.zeros([16, 16], dtype=tl.float32)
    s32 = tl.zeros([16, 16], dtype=tl.float32)
    for c0 in tl.static_range(0, K, KC):
        k0, k1, k2, k3 = _key_rows4(kp, c0, t0, T, H, K, KC)
        s00 += tl.dot(k0, tl.trans(k0), input_precision=PREC)
        s11 += tl.dot(k1, tl.trans(k1), input_precision=PREC)
        s22 += tl.dot(k2, tl.trans(k2), input_precision=PREC)
        s33 += tl.dot(k3, tl.trans(k3), input_precision=PREC)
        s10 += tl.dot(k1, tl.trans(k0), input_precision=PREC)
        s20 += tl.dot(k2, tl.trans(k0), input_precision=PREC)
        s21 += tl.dot(k2, tl.trans(k1), input_precision=PREC)
        s30 += tl.dot(k3, tl.trans(k0), input_precision=PREC)
        s31 += tl.dot(k3, tl.trans(k1), input_precision=PREC)
        s32 += tl.dot(k3, tl.trans(k2), input_precision=PREC)
    return s00, s11, s22, s33, s10, s20, s21, s30, s31, s32


@triton.jit(do_not_specialize=["T", "H", "NTC"])
def _gate_cumsum_kernel(g_ptr, b_ptr, beta_ptr, bt_ptr, T, H, NTC, HAS_G: tl.constexpr, BETA: tl.constexpr):
    """``b``: the within-chunk cumulative sum of the log gate ``g`` (``[B, T, H]``), float32,
    written as ``[B·H, NT·64]``; one chunk per program, zero gates past ``T`` (zeros throughout
    without a gate). ``BETA``: also ``β`` in the same float32 layout (zero past ``T``), for the
    inference march, which then streams it into shared memory with its other per-chunk tiles."""
    n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    bi = bh // H
    h = bh % H
    rows = n * 64 + tl.arange(0, 64)
    if HAS_G:
        # summed in float64 and rounded once: harsh gates (log decays of −1000 and more) make the
        # exponent differences b_i − b_j cancel, so every float32 rounding of the running sum shows
        g = tl.load(g_ptr + (bi * T + rows) * H + h, mask=rows < T, other=0.0).to(tl.float64)
        tl.store(b_ptr + bh * NTC + rows, tl.cumsum(g, 0).to(tl.float32))
    else:
        tl.store(b_ptr + bh * NTC + rows, tl.zeros([64], dtype=tl.float32))
    if BETA:
        beta = tl.load(beta_ptr + (bi * T + rows) * H + h, mask=rows < T, other=0.0)
        tl.store(bt_ptr + bh * NTC + rows, beta.to(tl.float32))


# ------------------------------------------------------------------------------------------------
# 1. per-chunk WY/UT factors (parallel over chunks)
# ------------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["T", "H", "NTC", "N0"])
def _kkt_solve_kernel(q_ptr, k_ptr, v_ptr, beta_ptr, b_ptr, w_ptr, u_ptr, t_ptr, a_ptr, scale, T, H, NTC, N0,
                      K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, KC: tl.constexpr, PREC: tl.constexpr,
                      FUSE_WU: tl.constexpr, QK: tl.constexpr, OPREC: tl.constexpr):
    """``T = (I + A)^{-1}`` of one chunk (chunk ``N0`` + the program's first index), written as a
    dense ``[64, 64]`` tile (zeros above the diagonal); with ``FUSE_WU`` the same program then
    forms ``W`` and ``U`` from it."""
    n = tl.program_id(0) + N0
    bh = tl.program_id(1).to(tl.int64)     # 64-bit offsets: [B*H, NT, K, V] buffers get large
    bi = bh // H
    h = bh % H
    t0 = n * 64
    kp = k_ptr + (bi * T * H + h) * K
    btp = beta_ptr + bi * T * H + h
    bp = b_ptr + bh * NTC
    be0 = _vec16(btp, t0, T, H)
    be1 = _vec16(btp, t0 + 16, T, H)
    be2 = _vec16(btp, t0 + 32, T, H)
    be3 = _vec16(btp, t0 + 48, T, H)
    g0 = _vec16(bp, t0, NTC, 1)
    g1 = _vec16(bp, t0 + 16, NTC, 1)
    g2 = _vec16(bp, t0 + 32, NTC, 1)
    g3 = _vec16(bp, t0 + 48, NTC, 1)
    # the ten 16×16 blocks (i >= j) of K Kᵀ, accumulated over column blocks of KC keys (fewer
    # live registers than holding the chunk's keys whole): the four diagonal ones, then the six
    # below them (forming those after the diagonal inverses spilled more and was 1.6–1.9× slower)
    s00, s11, s22, s33, s10, s20, s21, s30, s31, s32 = _gram10(kp, t0, T, H, K, KC, PREC)
    # T = (I + A)^{-1}: diagonal blocks by forward substitution (from their transposes), then
    # block substitution
    T00, T11, T22, T33 = _inv4_unit_lower16(_gram16_diag_t(s00, g0, be0), _gram16_diag_t(s11, g1, be1),
                                            _gram16_diag_t(s22, g2, be2), _gram16_diag_t(s33, g3, be3))
    # A below the diagonal in 16×16 blocks
    A10 = _gram16(s10, g1, g0, be1)
    A20 = _gram16(s20, g2, g0, be2)
    A21 = _gram16(s21, g2, g1, be2)
    A30 = _gram16(s30, g3, g0, be3)
    A31 = _gram16(s31, g3, g1, be3)
    A32 = _gram16(s32, g3, g2, be3)
    T10 = -tl.dot(T11, tl.dot(A10, T00, input_precision=OPREC), input_precision=OPREC)
    T21 = -tl.dot(T22, tl.dot(A21, T11, input_precision=OPREC), input_precision=OPREC)
    T20 = -tl.dot(T22, tl.dot(A20, T00, input_precision=OPREC) + tl.dot(A21, T10, input_precision=OPREC),
                  input_precision=OPREC)
    T32 = -tl.dot(T33, tl.dot(A32, T22, input_precision=OPREC), input_precision=OPREC)
    T31 = -tl.dot(T33, tl.dot(A31, T11, input_precision=OPREC) + tl.dot(A32, T21, input_precision=OPREC),
                  input_precision=OPREC)
    T30 = -tl.dot(T33, tl.dot(A30, T00, input_precision=OPREC) + tl.dot(A31, T10, input_precision=OPREC)
                  + tl.dot(A32, T20, input_precision=OPREC), input_precision=OPREC)
    # T as a dense [64, 64] tile per chunk, in the dtype that feeds the products (W, U and the backward)
    rr = tl.arange(0, 16)
    tp = t_ptr + (bh * NTC + t0) * 64 + rr[:, None] * 64 + rr[None, :]
    tt = t_ptr.dtype.element_ty
    z = tl.zeros([16, 16], dtype=tt)
    tl.store(tp, T00.to(tt))
    tl.store(tp + 16, z)
    tl.store(tp + 32, z)
    tl.store(tp + 48, z)
    tl.store(tp + 16 * 64, T10.to(tt))
    tl.store(tp + 16 * 64 + 16, T11.to(tt))
    tl.store(tp + 16 * 64 + 32, z)
    tl.store(tp + 16 * 64 + 48, z)
    tl.store(tp + 32 * 64, T20.to(tt))
    tl.store(tp + 32 * 64 + 16, T21.to(tt))
    tl.store(tp + 32 * 64 + 32, T22.to(tt))
    tl.store(tp + 32 * 64 + 48, z)
    tl.store(tp + 48 * 64, T30.to(tt))
    tl.store(tp + 48 * 64 + 16, T31.to(tt))
    tl.store(tp + 48 * 64 + 32, T32.to(tt))
    tl.store(tp + 48 * 64 + 48, T33.to(tt))
    if FUSE_WU:
        tl.debug_barrier()      # the tile written above is read back whole by every thread
        _wu_chunk(q_ptr, k_ptr, v_ptr, beta_ptr, b_ptr, w_ptr, u_ptr, t_ptr, a_ptr, scale, n, bh, T, H, NTC,
                  K, V, BK, PREC, QK, True)


@triton.jit(do_not_specialize=["T", "H", "NTC", "N0"])
def _wu_fwd_kernel(q_ptr, k_ptr, v_ptr, beta_ptr, b_ptr, w_ptr, u_ptr, t_ptr, a_ptr, scale, T, H, NTC, N0,
                   K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr, QK: tl.constexpr,
                   WU: tl.constexpr, PT: tl.constexpr = False):
    _wu_chunk(q_ptr, k_ptr, v_ptr, beta_ptr, b_ptr, w_ptr, u_ptr, t_ptr, a_ptr, scale, tl.program_id(0) + N0,
              tl.program_id(1).to(tl.int64), T, H, NTC, K, V, BK, PREC, QK, WU, PT)


# ------------------------------------------------------------------------------------------------
# 1'. T = (I + A)^{-1} by block doubling on the whole chunk (``tsolve``, four warps)
# ------------------------------------------------------------------------------------------------
@triton.jit
def _double(X, A, ri, cj, BS: tl.constexpr, SPREC: tl.constexpr):
    """One doubling step: ``X`` holds the inverses of the ``BS``-blocks on the diagonal of
    ``I + A``; return those of the ``2·BS``-blocks. Inside a ``2·BS``-block
    ``I + A = D + L`` (``D`` its two diagonal halves, ``L`` the lower-left half) and
    ``(D + L)^{-1} = D^{-1} − D^{-1} L D^{-1}`` exactly, because ``(D^{-1} L)^2 = 0``."""
    L = tl.where((ri // (2 * BS) == cj // (2 * BS)) & (ri % (2 * BS) >= BS) & (cj % (2 * BS) < BS), A, 0.0)
    return X - tl.dot(X, tl.dot(L, X, input_precision=SPREC), input_precision=SPREC)


@triton.jit(do_not_specialize=["T", "H", "NTC", "N0"])
def _tsolve_kernel(q_ptr, k_ptr, beta_ptr, b_ptr, t_ptr, a_ptr, scale, T, H, NTC, N0,
                   K: tl.constexpr, PREC: tl.constexpr, SPREC: tl.constexpr, QK: tl.constexpr):
    """``T = (I + A)^{-1}`` of one chunk as ``[64, 64]`` products: ``A`` from one ``K Kᵀ``
    product, the inverse by doubling the solved diagonal blocks 1 → 2 → 4 → … → 64 (five steps of
    two products each, ``_double``). With ``QK`` also the chunk's scores ``P`` (as ``_wu_chunk``)."""
    n = tl.program_id(0) + N0
    bh = tl.program_id(1).to(tl.int64)
    bi = bh // H
    h = bh % H
    rc = tl.arange(0, 64)
    rows = n * 64 + rc
    rmask = rows < T
    ck = tl.arange(0, K)
    off = (bi * T * H + h) * K + rows[:, None] * (H * K) + ck[None, :]
    k = tl.load(k_ptr + off, mask=rmask[:, None], other=0.0)
    beta = tl.load(beta_ptr + bi * T * H + h + rows * H, mask=rmask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + bh * NTC + rows)
    ri = rc[:, None]
    cj = rc[None, :]
    low = ri > cj
    A = tl.dot(k, tl.trans(k), input_precision=PREC)
    A = tl.where(low, A * tl.exp(tl.where(low, b[:, None] - b[None, :], 0.0)), 0.0) * beta[:, None]
    # 1×1 blocks are 1; their pairs invert to I − A restricted to the 2×2 diagonal blocks
    X = tl.where(ri == cj, 1.0, 0.0) - tl.where(ri // 2 == cj // 2, A, 0.0)
    X = _double(X, A, ri, cj, 2, SPREC)
    X = _double(X, A, ri, cj, 4, SPREC)
    X = _double(X, A, ri, cj, 8, SPREC)
    X = _double(X, A, ri, cj, 16, SPREC)
    X = _double(X, A, ri, cj, 32, SPREC)
    tl.store(t_ptr + (bh * NTC + rows[:, None]) * 64 + cj, X.to(t_ptr.dtype.element_ty))
    if QK:
        s = tl.dot(tl.load(q_ptr + off, mask=rmask[:, None], other=0.0), tl.trans(k), input_precision=PREC)
        s = _mask_gate(s, b, scale)
        tl.store(a_ptr + (bh * NTC + rows[:, None]) * 64 + cj, s.to(a_ptr.dtype.element_ty))


# ------------------------------------------------------------------------------------------------
# 2. sequential state pass with fused output (state on chip)
# ------------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=_NO_SPEC)
def _state_fwd_kernel(q_ptr, k_ptr, w_ptr, u_ptr, b_ptr, a_ptr, o_ptr, h0_ptr, ht_ptr, hs_ptr, vp_ptr,
                      scale, T, H, NT, NTC,
                      K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                      HAS_H0: tl.constexpr, STORE_HT: tl.constexpr, STORE_HS: tl.constexpr,
                      HAS_A: tl.constexpr):
    """Sequential over chunks, state ``S[K, BV]`` on chip; for training (``STORE_HS``) it also
    writes the state entering every chunk and the pseudo-values ``v'`` (the backward reads both).
    ``HAS_A``: the intra-chunk scores come precomputed from ``_wu_fwd_kernel`` instead of being
    recomputed here for every V-block."""
    iv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)     # 64-bit offsets: [B*H, NT, K, V] buffers get large
    bi = bh // H
    h = bh % H
    dt = q_ptr.dtype.element_ty
    rc = tl.arange(0, 64)
    ck = tl.arange(0, K)
    cv = iv * BV + tl.arange(0, BV)
    qp = q_ptr + (bi * T * H + h) * K
    kp = k_ptr + (bi * T * H + h) * K
    op = o_ptr + (bi * T * H + h) * V
    wp = w_ptr + bh * NTC * K
    up = u_ptr + bh * NTC * V
    bp = b_ptr + bh * NTC
    S = _load_state(h0_ptr, bh, ck, cv, K, V, BV, HAS_H0)
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
        if STORE_HS:
            tl.store(vp_ptr + (bh * NTC + rows[:, None]) * V + cv[None, :], vpd)
        qe = (q.to(tl.float32) * (tl.exp(b) * scale)[:, None]).to(dt)
        o = tl.dot(qe, Sd, input_precision=PREC)
        if HAS_A:
            sd = tl.load(a_ptr + (bh * NTC + rows[:, None]) * 64 + rc[None, :])
        else:
            s = tl.dot(q, tl.trans(k), input_precision=PREC)
            sd = _mask_gate(s, b, scale).to(dt)
        o += tl.dot(sd, vpd, input_precision=PREC)
        tl.store(op + rows[:, None] * (H * V) + cv[None, :], o.to(o_ptr.dtype.element_ty),
                 mask=rmask[:, None])
        kd = (k.to(tl.float32) * tl.exp(b_last - b)[:, None]).to(dt)
        S = S * tl.exp(b_last) + tl.dot(tl.trans(kd), vpd, input_precision=PREC)
    if STORE_HT:
        tl.store(ht_ptr + bh * K * V + ck[:, None] * V + cv[None, :], S)


# ------------------------------------------------------------------------------------------------
# 2'. inference forward in T form (``tform``): no W, U; the state pass applies T itself
# ------------------------------------------------------------------------------------------------
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
    iv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    bi = bh // H
    h = bh % H
    dt = q_ptr.dtype.element_ty
    rc = tl.arange(0, 64)
    ck = tl.arange(0, K)
    cv = iv * BV + tl.arange(0, BV)
    qp = q_ptr + (bi * T * H + h) * K
    kp = k_ptr + (bi * T * H + h) * K
    vp_ = v_ptr + (bi * T * H + h) * V
    op = o_ptr + (bi * T * H + h) * V
    btp = beta_ptr + bh * NTC     # β as float32 [B·H, NT·64]: streamed in with the tiles below
    tp = t_ptr + bh * NTC * 64
    bp = b_ptr + bh * NTC
    S = _load_state(h0_ptr, bh, ck, cv, K, V, BV, HAS_H0)
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
            sd = tl.load(a_ptr + (bh * NTC + rows[:, None]) * 64 + rc[None, :])
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
    S = _load_state(h0_ptr, bh, ck, cv, K, V, BV, HAS_H0)
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
    qkoff = (bi * T * H + h) * K + rows[:, None] * (H * K) + ck[None, :]
    q = tl.load(q_ptr + qkoff, mask=rmask[:, None], other=0.0)
    k = tl.load(k_ptr + qkoff, mask=rmask[:, None], other=0.0)
    b = tl.load(b_ptr + bh * NTC + rows)
    Sd = tl.load(hs_ptr + (bh * NT + n) * K * V + ck[:, None] * V + cv[None, :]).to(dt)
    vpd = tl.load(vp_ptr + (bh * NTC + rows[:, None]) * V + cv[None, :]).to(dt)
    qe = (q.to(tl.float32) * (tl.exp(b) * scale)[:, None]).to(dt)
    o = tl.dot(qe, Sd, input_precision=PREC)
    s = tl.dot(q, tl.trans(k), input_precision=PREC)
    s = _mask_gate(s, b, scale)
    o += tl.dot(s.to(dt), vpd, input_precision=PREC)
    tl.store(o_ptr + (bi * T * H + h) * V + rows[:, None] * (H * V) + cv[None, :],
             o.to(o_ptr.dtype.element_ty), mask=rmask[:, None])


# ------------------------------------------------------------------------------------------------
# 3. backward: sequential reverse pass for the state adjoints
# ------------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=_NO_SPEC)
def _state_bwd_kernel(q_ptr, k_ptr, w_ptr, b_ptr, a_ptr, do_ptr, dht_ptr, dh_ptr, dh0_ptr, dvp_ptr,
                      scale, T, H, NT, NTC,
                      K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                      HAS_DHT: tl.constexpr, HAS_A: tl.constexpr):
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
    dS = _load_state(dht_ptr, bh, ck, cv, K, V, BV, HAS_DHT)
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
        if HAS_A:
            ptd = tl.trans(tl.load(a_ptr + (bh * NTC + rows[:, None]) * 64 + rc[None, :]))
        else:
            pt = tl.dot(k, tl.trans(q), input_precision=PREC)
            ptd = tl.where(upper, pt * tl.exp(tl.where(upper, b[None, :] - b[:, None], 0.0)) * scale, 0.0).to(dt)
        kd = (k.to(tl.float32) * tl.exp(b_last - b)[:, None]).to(dt)
        dvp = tl.dot(ptd, do, input_precision=PREC) + tl.dot(kd, dSd, input_precision=PREC)
        dvpd = dvp.to(dt)
        tl.store(dvp_ptr + (bh * NTC + rows[:, None]) * V + cv[None, :], dvpd)   # for the local backward
        qe = (q.to(tl.float32) * (tl.exp(b) * scale)[:, None]).to(dt)
        dS = (dS * tl.exp(b_last) + tl.dot(tl.trans(qe), do, input_precision=PREC)
              - tl.dot(tl.trans(w), dvpd, input_precision=PREC))
    tl.store(dh0_ptr + bh * K * V + ck[:, None] * V + cv[None, :], dS)


# ------------------------------------------------------------------------------------------------
# 4. backward: per-chunk algebra (parallel over chunks), given the states, the state adjoints,
#    v' (from the forward) and dv' (from the sequential backward)
# ------------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=_NO_SPEC)
def _bwd_dqk_kernel(q_ptr, k_ptr, b_ptr, a_ptr, hs_ptr, dh_ptr, do_ptr, vp_ptr, dvp_ptr,
                    dq_ptr, dk_ptr, dw_ptr, db_ptr, scale, T, H, NT, NTC,
                    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                    PREC: tl.constexpr, HAS_A: tl.constexpr):
    """Grid (K-blocks, chunks, batch·heads). For the key columns ``ck`` of one chunk:
    ``dq = e^b ⊙ do Sᵀ + (dP ⊙ Γ ⊙ M) K`` (scaled), the partial ``dk`` through the scores and the
    state update ``(dP ⊙ Γ ⊙ M)ᵀ Q̃ + e^{b_C − b} ⊙ v' dS'ᵀ`` (float32, completed by
    ``_bwd_wy_kernel``), ``dW = −dv' Sᵀ`` and this K-block's share of the log-gate gradient;
    ``dP = do v'ᵀ``. Every term is linear in the K-block, so the shares add up (with ``HAS_A`` the
    scores' share of the log-gate gradient comes whole from the stored scores, in K-block 0)."""
    ik = tl.program_id(0)
    n = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    bi = bh // H
    h = bh % H
    dt = q_ptr.dtype.element_ty
    t0 = n * 64
    rc = tl.arange(0, 64)
    ck = ik * BK + tl.arange(0, BK)
    rows = t0 + rc
    rmask = rows < T
    causal = rc[:, None] >= rc[None, :]
    vbase = (bi * T * H + h) * V
    dqs = tl.zeros([64, BK], dtype=tl.float32)     # do Sᵀ
    dks = tl.zeros([64, BK], dtype=tl.float32)     # v' dS'ᵀ
    dW = tl.zeros([64, BK], dtype=tl.float32)      # -dv' Sᵀ
    dPm = tl.zeros([64, 64], dtype=tl.float32)     # do v'ᵀ
    c = tl.zeros([64], dtype=tl.float32)           # <S, dS'> on these rows (kept in entry 0)
    for iv in range(V // BV):
        cv = iv * BV + tl.arange(0, BV)
        sp = (bh * NT + n) * K * V + ck[:, None] * V + cv[None, :]
        Sd = tl.load(hs_ptr + sp).to(dt)
        dSd = tl.load(dh_ptr + sp).to(dt)
        do = tl.load(do_ptr + vbase + rows[:, None] * (H * V) + cv[None, :], mask=rmask[:, None], other=0.0)
        vpd = tl.load(vp_ptr + (bh * NTC + rows[:, None]) * V + cv[None, :])
        dvpd = tl.load(dvp_ptr + (bh * NTC + rows[:, None]) * V + cv[None, :])
        dqs += tl.dot(do, tl.trans(Sd), input_precision=PREC)
        dks += tl.dot(vpd, tl.trans(dSd), input_precision=PREC)
        dW -= tl.dot(dvpd, tl.trans(Sd), input_precision=PREC)
        dPm += tl.dot(do, tl.trans(vpd), input_precision=PREC)
        c += tl.sum(tl.sum(Sd.to(tl.float32) * dSd.to(tl.float32), 1), 0) * tl.where(rc == 0, 1.0, 0.0)
    qkoff = (bi * T * H + h) * K + rows[:, None] * (H * K) + ck[None, :]
    q = tl.load(q_ptr + qkoff, mask=rmask[:, None], other=0.0)
    k = tl.load(k_ptr + qkoff, mask=rmask[:, None], other=0.0)
    b = tl.load(b_ptr + bh * NTC + rows)
    b_last = tl.load(b_ptr + bh * NTC + t0 + 63)
    eb = tl.exp(b)
    edec = tl.exp(b_last - b)
    gam = tl.where(causal, tl.exp(tl.where(causal, b[:, None] - b[None, :], 0.0)), 0.0)   # Γ ⊙ M
    dPm = tl.where(causal, dPm, 0.0)
    # log-gate gradient, this K-block's share: the scores (K-block part of q kᵀ), e^b q̃ S, the update
    if HAS_A:   # the whole scores, counted once (K-block 0; other blocks load nothing)
        P = tl.load(a_ptr + (bh * NTC + rows[:, None]) * 64 + rc[None, :],
                    mask=causal & (ik == 0), other=0.0).to(tl.float32)
    else:
        P = tl.dot(q, tl.trans(k), input_precision=PREC) * gam * scale
    dPP = dPm * P
    qf = q.to(tl.float32)
    kf = k.to(tl.float32)
    db_o = tl.sum(qf * dqs, 1) * eb * scale                  # rowsum(do ⊙ (e^b q̃) S)
    r = tl.sum(kf * dks, 1) * edec                           # rowsum((K̃ dS') ⊙ v')
    db = db_o + tl.sum(dPP, 1) - tl.sum(dPP, 0) - r
    db += tl.where(rc == 63, tl.sum(r, 0) + tl.exp(b_last) * tl.sum(c, 0), 0.0)
    tl.store(db_ptr + (ik * tl.num_programs(2) + bh) * NTC + rows, db)
    dPg = (dPm * gam).to(dt)
    dq = dqs * (eb * scale)[:, None] + tl.dot(dPg, k, input_precision=PREC) * scale
    dk = tl.dot(tl.trans(dPg), q, input_precision=PREC) * scale + dks * edec[:, None]
    tl.store(dq_ptr + qkoff, dq.to(dq_ptr.dtype.element_ty), mask=rmask[:, None])
    tl.store(dk_ptr + qkoff, dk, mask=rmask[:, None])
    tl.store(dw_ptr + (bh * NTC + rows[:, None]) * K + ck[None, :], dW.to(dw_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=_NO_SPEC)
def _bwd_wy_kernel(k_ptr, v_ptr, beta_ptr, b_ptr, w_ptr, u_ptr, t_ptr, dvp_ptr, dw_ptr, dkp_ptr, dbp_ptr,
                   dk_ptr, dv_ptr, dbeta_ptr, db_ptr, T, H, NTC,
                   K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, NK: tl.constexpr,
                   PREC: tl.constexpr, REC: tl.constexpr):
    """Grid (chunks, batch·heads). Through ``U = T (β V)``, ``W = T (β e^b K)`` and
    ``A = diag(β)(K Kᵀ ⊙ Γ)`` (strictly lower): ``dv``, ``dβ``, the rest of ``dk`` (added to the
    partial sums of ``_bwd_dqk_kernel``) and the rest of the log-gate gradient. ``REC``: ``U`` and
    ``W`` are recomputed from ``T`` and the inputs already loaded here (the same products as
    ``_wu_fwd_kernel``, so the same values) instead of being read back."""
    n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    bi = bh // H
    h = bh % H
    dt = k_ptr.dtype.element_ty
    t0 = n * 64
    rc = tl.arange(0, 64)
    ck = tl.arange(0, K)
    rows = t0 + rc
    rmask = rows < T
    causal = rc[:, None] >= rc[None, :]
    strict = rc[:, None] > rc[None, :]
    vbase = (bi * T * H + h) * V
    Tmd = tl.load(t_ptr + (bh * NTC + rows[:, None]) * 64 + rc[None, :]).to(dt)
    beta = tl.load(beta_ptr + bi * T * H + h + rows * H, mask=rmask, other=0.0).to(tl.float32)
    dAp = tl.zeros([64, 64], dtype=tl.float32)      # dY Uᵀ
    dbeta = tl.zeros([64], dtype=tl.float32)
    for iv in range(V // BV):
        cv = iv * BV + tl.arange(0, BV)
        dvpd = tl.load(dvp_ptr + (bh * NTC + rows[:, None]) * V + cv[None, :])
        vv = tl.load(v_ptr + vbase + rows[:, None] * (H * V) + cv[None, :], mask=rmask[:, None], other=0.0)
        if REC:
            u = tl.dot(Tmd, (vv.to(tl.float32) * beta[:, None]).to(dt), input_precision=PREC).to(u_ptr.dtype.element_ty)
        else:
            u = tl.load(u_ptr + (bh * NTC + rows[:, None]) * V + cv[None, :])
        u = u.to(dt)
        dY = tl.dot(tl.trans(Tmd), dvpd, input_precision=PREC)                           # Tᵀ dU
        tl.store(dv_ptr + vbase + rows[:, None] * (H * V) + cv[None, :],
                 (dY * beta[:, None]).to(dv_ptr.dtype.element_ty), mask=rmask[:, None])
        dbeta += tl.sum(dY * vv.to(tl.float32), 1)
        dAp += tl.dot(dY.to(dt), tl.trans(u), input_precision=PREC)
    qkoff = (bi * T * H + h) * K + rows[:, None] * (H * K) + ck[None, :]
    k = tl.load(k_ptr + qkoff, mask=rmask[:, None], other=0.0)
    dWd = tl.load(dw_ptr + (bh * NTC + rows[:, None]) * K + ck[None, :]).to(dt)
    b = tl.load(b_ptr + bh * NTC + rows)
    eb = tl.exp(b)
    if REC:
        w = tl.dot(Tmd, (k.to(tl.float32) * (beta * eb)[:, None]).to(dt), input_precision=PREC).to(dt)
    else:
        w = tl.load(w_ptr + (bh * NTC + rows[:, None]) * K + ck[None, :])
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
    for ik in tl.static_range(NK):
        db += tl.load(dbp_ptr + (ik * tl.num_programs(1) + bh) * NTC + rows)
    tl.store(dk_ptr + qkoff, dk.to(dk_ptr.dtype.element_ty), mask=rmask[:, None])
    tl.store(dbeta_ptr + bi * T * H + h + rows * H, dbeta, mask=rmask)
    tl.store(db_ptr + bh * NTC + rows, db)


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
    """V-block of the sequential kernels (forward and backward): the largest of 64, 32 that still
    gives at least 128 programs (about one per SM of an H100/H200), else 16. Round-4 sweeps on the
    H200 with the stored scores (NOTES_delta.md): 64 at B·H = 512 and 128, 32 at B·H = 32, 16 at
    B·H = 16, for both kernels."""
    for bv in (64, 32):
        if bv <= V and BH * (V // bv) >= 128:
            return bv
    return min(V, 16)


def _chunk_cumsum(g, beta, B, T, H, NT, with_beta=False):
    """Within-chunk cumulative log gate, float32, ``[B*H, NT*C]`` (zero gates past ``T``, zeros
    without a gate) and, ``with_beta``, ``β`` in the same float32 layout (else ``None``): one small
    kernel (``_gate_cumsum_kernel``) in place of the four PyTorch ones (allocate, transpose, copy,
    scan) it replaced in round 6."""
    b = torch.empty(B * H, NT * CHUNK, dtype=torch.float32, device=beta.device)
    bt = torch.empty_like(b) if with_beta else None
    _gate_cumsum_kernel[(NT, B * H)](g if g is not None else b, b, beta, bt if with_beta else b, T, H, NT * CHUNK,
                                     HAS_G=g is not None, BETA=with_beta, num_warps=1)
    return b, bt


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


def _seq_configs(dtype, K, BV, warps=0, stages=0, nw16=0, ns16=2):
    """Configs of a sequential kernel, first = expected fastest. 16-bit inputs: ``nw16`` warps
    (default: 8 once the state tile K×BV has ≥ 2048 entries) and ``ns16`` stages; float32 (IEEE
    products, twice the registers) keeps round 1's 8 warps, 1 stage."""
    nw = 8 if K * BV >= 2048 else 4
    if warps or stages:    # explicit override (tuning): exactly this config, no fallback
        return [dict(num_warps=warps or (nw16 or nw), num_stages=stages or (1 if dtype == torch.float32 else ns16))]
    first = [dict(num_warps=nw16 or nw, num_stages=ns16)] if dtype != torch.float32 else []
    return first + [dict(num_warps=nw, num_stages=1), dict(num_warps=8, num_stages=1)]


def _par_configs(K, V, warps=0, nw=0):
    """Configs of a kernel that is parallel over chunks (one stage: no loop worth pipelining)."""
    nw = nw or (4 if max(K, V) <= 64 else 8)
    if warps:
        return [dict(num_warps=warps, num_stages=1)]
    return [dict(num_warps=nw, num_stages=1), dict(num_warps=8, num_stages=1)]


def _switch(key, default: bool) -> bool:
    """An on/off knob: 0 = ``default``, 1 = on, 2 = off."""
    val = _TUNE[key]
    if val not in (0, 1, 2):
        raise ValueError(f"tuning: {key} must be 0 (default), 1 (on) or 2 (off); got {val}")
    return default if val == 0 else val == 1


def _tuned_bv(key, default, V):
    bv = _TUNE[key] or default
    if bv not in _HEAD_SIZES or bv > V:
        raise ValueError(f"tuning: {key} must be one of {_HEAD_SIZES} and at most V = {V}; got {bv}")
    return bv


def _precision(dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def _doubling_solve() -> bool:
    """The ``tsolve`` knob: ``_tsolve_kernel`` instead of the default one-warp solve."""
    return _switch("tsolve", False)


def _kkt_opts(dtype):
    """Constexprs of the one-warp solve beyond its sizes: the precision of its block products
    (knob ``kkt_oprec``); float32 inputs keep IEEE products throughout."""
    op = _TUNE["kkt_oprec"]
    if op not in (0, 1, 2, 3):
        raise ValueError(f"tuning: kkt_oprec must be 0 (default), 1 (ieee), 2 (tf32x3) or 3 (tf32); got {op}")
    # default 3×TF32: near-IEEE (≈ 1e-7 apart on T) at 0.77× the time of IEEE products, which run
    # on the FMA units (round-6 sweep on the H200, NOTES_delta.md)
    return dict(OPREC="ieee" if dtype == torch.float32 else ("ieee", "tf32x3", "tf32")[(op or 2) - 1])


def _kkt_configs(K, V, dtype):
    # one warp for 16-bit inputs: the 16×16 tiles of the solve are replicated across warps, so more
    # warps only add reduction traffic (round-3 sweep on the H200: 1 warp 0.40 ms, 4 warps 0.95 ms
    # at B·T = 65,536, NOTES_delta.md); float32 keeps 4 (its operands would not fit one warp)
    return _par_configs(K, V, _TUNE["kkt_warps"], nw=1 if dtype != torch.float32 else 4)


def _solve_t(q, k, b, beta, scale, qk, tm=None, a=None, n0=0, n1=None):
    """``T = (I + A)^{-1}`` of every chunk (``[B·H, NT·64, 64]``, input dtype) and, with ``qk``,
    the chunk scores ``P`` (same shape; else ``None``), by the one-warp ``_kkt_solve_kernel``
    (default; it leaves the scores to ``_wu_fwd_kernel``) or ``_tsolve_kernel`` (``tsolve=1``). On
    the H200 at B·T = 65,536, H = 16, K = 128 (NOTES_delta.md) the two took the same time in round
    5 (≈ 0.40 ms); round 6 brought the one-warp kernel to ≈ 0.27 ms (a row loop without layout
    conversions, 3×TF32 block products), and its products are near-IEEE where the doubling
    kernel's are TF32."""
    B, T, H, K = k.shape
    NT = triton.cdiv(T, CHUNK)
    NTC = NT * CHUNK
    BH = B * H
    dev = k.device
    n1 = NT if n1 is None else n1
    # T in the dtype of the products it feeds (for 16-bit inputs every use rounds it to that dtype);
    # chunks n0 .. n1-1 only, into the given buffers (the segments of ``_tform_fwd``)
    if tm is None:
        tm = torch.empty(BH, NTC, CHUNK, dtype=k.dtype, device=dev)
    if a is None and qk:
        a = torch.empty(BH, NTC, CHUNK, dtype=k.dtype, device=dev)
    prec = _precision(k.dtype)
    if _doubling_solve():
        # the doubling products in TF32 for 16-bit inputs (T is rounded to 16 bits afterwards),
        # IEEE float32 for float32 inputs
        if _TUNE["ts_prec"] not in (0, 1, 2, 3):
            raise ValueError(f"tuning: ts_prec must be 0 (default), 1 (tf32), 2 (tf32x3) or 3 (ieee); "
                             f"got {_TUNE['ts_prec']}")
        sprec = ("tf32", "tf32x3", "ieee")[(_TUNE["ts_prec"] or 1) - 1] if k.dtype != torch.float32 else "ieee"
        _launch(_tsolve_kernel, (n1 - n0, BH), (q, k, beta, b, tm, a if qk else tm, float(scale), T, H, NTC, n0),
                dict(K=K, PREC=prec, SPREC=sprec, QK=qk),
                _par_configs(K, K, _TUNE["ts_warps"], nw=4))
        return tm, a, True
    KC = _tuned_bv("kkt_bk", K, K)
    _launch(_kkt_solve_kernel, (n1 - n0, BH), (q, k, k, beta, b, tm, tm, tm, tm, float(scale), T, H, NTC, n0),
            dict(K=K, V=K, BK=K, KC=KC, PREC=prec, FUSE_WU=False, QK=False, **_kkt_opts(k.dtype)),
            _kkt_configs(K, K, k.dtype))
    return tm, a, False


def _wu_cfg(K, V, small=False):
    # W, U (and the scores) over whole head-size column blocks with 8 warps at head size 128
    # (round-4b sweep on the H200: 0.90× the time of 64-column blocks at 4 warps, NOTES_delta.md);
    # ``small``: 64-column blocks at 4 warps, for the scores of a segmented inference forward,
    # whose programs then fit beside the march's on its SMs (round 7f/g)
    BK = _tuned_bv("wu_bk", min(K, V, 64) if small else min(K, V), min(K, V))
    return BK, _par_configs(K, V, _TUNE["wu_warps"], nw=8 if BK >= 128 else 4)


def _wy_fwd(q, k, v, b, beta, scale):
    """Kernel 1: ``T = (I + A)^{-1}``, ``W`` and ``U`` of every chunk (``T`` is kept for the
    backward) and, unless the ``aqk`` knob is off, the chunk's scores ``P`` (else ``None``)."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    NTC = NT * CHUNK
    BH = B * H
    dev = k.device
    w = torch.empty(BH, NTC, K, dtype=k.dtype, device=dev)
    u = torch.empty(BH, NTC, V, dtype=torch.float32 if _U_FP32 else k.dtype, device=dev)
    qk = _switch("aqk", True)
    prec = _precision(k.dtype)
    BK, wcfg = _wu_cfg(K, V)
    if _TUNE["wy_fuse"] == 1 and not _doubling_solve():
        # W, U (and the scores) in the one-warp solve kernel itself (not the default)
        tm = torch.empty(BH, NTC, CHUNK, dtype=k.dtype, device=dev)
        a = torch.empty(BH, NTC, CHUNK, dtype=k.dtype, device=dev) if qk else None
        _launch(_kkt_solve_kernel, (NT, BH), (q, k, v, beta, b, w, u, tm, a if qk else tm, float(scale), T, H, NTC, 0),
                dict(K=K, V=V, BK=BK, KC=_tuned_bv("kkt_bk", K, K), PREC=prec, FUSE_WU=True, QK=qk,
                     **_kkt_opts(k.dtype)), _kkt_configs(K, V, k.dtype))
        return w, u, tm, a
    tm, a, has_p = _solve_t(q, k, b, beta, scale, qk)
    _launch(_wu_fwd_kernel, (NT, BH), (q, k, v, beta, b, w, u, tm, a if qk else tm, float(scale), T, H, NTC, 0),
            dict(K=K, V=V, BK=BK, PREC=prec, QK=qk and not has_p, WU=True), wcfg)
    return w, u, tm, a


def _side_stream(dev):
    """One side CUDA stream per device, for work that overlaps the sequential march."""
    key = ("side", torch.device(dev).index)
    if key not in _CFG_CACHE:
        _CFG_CACHE[key] = torch.cuda.Stream(device=dev)
    return _CFG_CACHE[key]


def _sm_count(dev):
    key = ("sms", torch.device(dev).index)
    if key not in _CFG_CACHE:
        _CFG_CACHE[key] = torch.cuda.get_device_properties(dev).multi_processor_count
    return _CFG_CACHE[key]


def _segments(NT, BH, V, BV, dev):
    """Chunk ranges of the inference forward (``mt_seg`` knob; default: one range unless the march
    is a single partial wave of programs on a GPU, where its SMs have issue slots to spare: then
    the solve of later ranges runs on a side stream while the march works through earlier ones)."""
    nseg = _TUNE["mt_seg"]
    if nseg < 0:
        raise ValueError(f"tuning: mt_seg must be >= 0; got {nseg}")
    if nseg == 0:
        nseg = 1
        if dev.type == "cuda" and BH * (V // BV) <= _sm_count(dev):
            nseg = _SEGMENTS_SMALL
    nseg = max(1, min(nseg, NT))
    edges = [NT * i // nseg for i in range(nseg + 1)]
    return [(edges[i], edges[i + 1]) for i in range(nseg)]


# two ranges: round 7f/g on the H200 (B = 1, 2 at T = 32768; NOTES_delta.md) measured 2 ranges with
# the small scores configuration at 0.96x / 0.95x the time of one range; 4 were no better, 8 and
# more slower (every range costs three launches and a march restart)
_SEGMENTS_SMALL = 2


def _gluon_form() -> int:
    """The ``mt_gl`` knob: 0 for the Triton march (default; 2 says so explicitly), 1 for the Gluon
    march in T form, 3 for the Gluon march in W/U form (``gluon_delta.py``, round 9)."""
    f = _TUNE["mt_gl"]
    if f not in (0, 1, 2, 3):
        raise ValueError(f"tuning: mt_gl must be 0 or 2 (Triton march), 1 (Gluon, T form) or "
                         f"3 (Gluon, W/U form); got {f}")
    return f if f in (1, 3) else 0


def _tform_fwd(q, k, v, b, beta, bt, scale, h0, output_final_state, gated=True):
    """Inference forward in T form: ``T`` (``_solve_t``), the scores where the march reads them
    stored, then ``_march_t_kernel``; ``W`` and ``U`` are never formed. Returns ``o`` and the final
    state.

    With several chunk ranges (``_segments``) the solve and the scores of range ``i + 1`` run on a
    side stream while the march works through range ``i`` (each march launch starts from the state
    the previous one left in ``ht``): when the march is a single partial wave, latency-bound, the
    per-chunk kernels fill its SMs' idle issue slots instead of running before it."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    NTC = NT * CHUNK
    BH = B * H
    dev = q.device
    # round-5 sweeps on the H200 (NOTES_delta.md): the V-block rule of the other sequential kernels
    # (64 at B·H ≥ 128, 32 at 32, 16 at 16); at V-block 64 the march forms the scores itself (two
    # programs per head) and pipelines 2 stages (two programs per SM fit), below it reads them
    # stored by a small kernel and pipelines 3
    BV = _tuned_bv("mt_bv", _pick_bv(BH, V, K), V)
    gl_form = _gluon_form()
    use_gl = (gl_form > 0 and gluon_march_supported(q, T) and K in (64, 128) and BV <= 64
              and all(x.is_contiguous() for x in (q, k, v)) and not _doubling_solve())
    gl_wu = use_gl and gl_form == 3
    stored = use_gl or _switch("mqk", V // BV > 2)
    prec = _precision(q.dtype)
    segs = _segments(NT, BH, V, BV, dev)
    tm = torch.empty(BH, NTC, CHUNK, dtype=k.dtype, device=dev)
    a = torch.empty(BH, NTC, CHUNK, dtype=k.dtype, device=dev) if stored else None
    o = torch.empty(B, T, H, V, dtype=q.dtype, device=dev)
    w = torch.empty(BH, NTC, K, dtype=k.dtype, device=dev) if gl_wu else tm
    u = torch.empty(BH, NTC, V, dtype=k.dtype, device=dev) if gl_wu else tm
    ht = torch.empty(B, H, K, V, dtype=torch.float32, device=dev) \
        if (output_final_state or len(segs) > 1) else None
    cfg = _seq_configs(q.dtype, K, BV, _TUNE["mt_warps"], _TUNE["mt_stages"],
                       nw16=8 if K * BV >= 128 * 128 else 4, ns16=2 if BV >= 64 else 3)
    BK, wcfg = _wu_cfg(K, V, small=len(segs) > 1)

    def per_chunk(n0, n1):
        _, _, has_p = _solve_t(q, k, b, beta, scale, stored, tm, a, n0, n1)
        if stored and not has_p:
            _launch(_wu_fwd_kernel, (n1 - n0, BH), (q, k, v, beta, b, w, u, tm, a, float(scale), T, H, NTC, n0),
                    dict(K=K, V=V, BK=BK, PREC=prec, QK=True, WU=gl_wu, PT=use_gl and not gl_wu), wcfg)

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
        first = i == 0
        s0 = h0 if first else ht
        if gl_wu:
            march_gluon_wu(q, k, w, u, b, a, o, s0, ht, scale, n0, n1, BV, stages=_TUNE["mt_gst"] or 3,
                           gated=gated)
            continue
        if use_gl:
            march_gluon(q, k, v, bt, b, tm, a, o, s0, ht, scale, n0, n1, BV, stages=_TUNE["mt_gst"] or 3,
                        gated=gated)
            continue
        _launch(_march_t_kernel, (V // BV, BH),
                (q, k, v, bt, b, tm, a if stored else tm, o, s0 if s0 is not None else o,
                 ht if ht is not None else o, float(scale), T, H, NT, NTC, n0, n1),
                dict(K=K, V=V, BV=BV, PREC=prec, HAS_H0=s0 is not None, STORE_HT=ht is not None,
                     HAS_A=stored, EVEN=T % CHUNK == 0 and _switch("mt_even", True)), cfg)
    return o, ht if output_final_state else None


def _state_fwd(q, k, w, u, b, a, scale, h0, output_final_state, store_states):
    """Kernel 2 (fused) or 2b (``fwd_split``: sequential v' + states, parallel outputs).

    Returns ``o``, the final state, and for training (``store_states``) the state entering every
    chunk and the pseudo-values ``v'``."""
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
    # chunk states and v' for the backward, in the input dtype: every use there feeds a tensor-core
    # product in that dtype anyway, and bf16 halves the largest saved tensors (always kept when split)
    hs = torch.empty(BH, NT, K, V, dtype=q.dtype, device=dev) if (store_states or split) else None
    vp = torch.empty(BH, NTC, V, dtype=q.dtype, device=dev) if (store_states or split) else None
    BV = _tuned_bv("fwd_bv", _pick_bv(BH, V, K), V)
    # 16-bit: 4 warps; one stage with V-blocks of 64 (the pipelined loads' shared memory would leave
    # one program per SM), else 3 (round-4 sweep on the H200, NOTES_delta.md)
    seq_cfg = _seq_configs(q.dtype, K, BV, _TUNE["fwd_warps"], _TUNE["fwd_stages"],
                           nw16=4, ns16=1 if BV >= 64 else 3)
    if not split:
        _launch(_state_fwd_kernel, (V // BV, BH),
                (q, k, w, u, b, a if a is not None else b, o, h0 if h0 is not None else o,
                 ht if ht is not None else o, hs if hs is not None else o, vp if vp is not None else o,
                 float(scale), T, H, NT, NTC),
                dict(K=K, V=V, BV=BV, PREC=prec, HAS_H0=h0 is not None, STORE_HT=output_final_state,
                     STORE_HS=store_states, HAS_A=a is not None), seq_cfg)
        return o, ht, hs, vp
    _launch(_state_vp_fwd_kernel, (V // BV, BH),
            (k, w, u, b, vp, h0 if h0 is not None else o, ht if ht is not None else o, hs, T, H, NT, NTC),
            dict(K=K, V=V, BV=BV, PREC=prec, HAS_H0=h0 is not None, STORE_HT=output_final_state), seq_cfg)
    BVO = _tuned_bv("out_bv", min(V, 64), V)
    _launch(_out_fwd_kernel, (NT, V // BVO, BH), (q, k, vp, b, hs, o, float(scale), T, H, NT, NTC),
            dict(K=K, V=V, BV=BVO, PREC=prec), _par_configs(K, BVO, _TUNE["out_warps"]))
    return o, ht, hs, vp


def _forward(q, k, v, b, beta, bt, scale, h0, output_final_state, store_states, gated=True):
    """``bt``: ``β`` as float32 ``[B·H, NT·64]`` (from ``_chunk_cumsum``), read by the inference
    form (T form, unless the ``tform`` knob is off). ``gated=False``: ``b`` is zero (no gate), which
    the Gluon march uses to skip it."""
    if not store_states and _switch("tform", True):
        o, ht = _tform_fwd(q, k, v, b, beta, bt, scale, h0, output_final_state, gated)
        return o.to(v.dtype), ht, None, None, None, None, None, None
    w, u, tm, a = _wy_fwd(q, k, v, b, beta, scale)
    o, ht, hs, vp = _state_fwd(q, k, w, u, b, a, scale, h0, output_final_state, store_states)
    return o.to(v.dtype), ht, w, u, tm, a, hs, vp


def _state_bwd(q, k, w, b, a, do, dht, scale, NT):
    """Kernel 3: leaving-state adjoints of every chunk, ``dv'`` of every chunk and the gradient of
    the initial state."""
    B, T, H, K = q.shape
    V = do.shape[-1]
    BH = B * H
    dh = torch.empty(BH, NT, K, V, dtype=q.dtype, device=q.device)   # leaving-state adjoints
    dvp = torch.empty(BH, NT * CHUNK, V, dtype=q.dtype, device=q.device)
    dh0 = torch.empty(B, H, K, V, dtype=torch.float32, device=q.device)
    BV = _tuned_bv("bwd_bv", _pick_bv(BH, V, K), V)
    has_dht = dht is not None
    dht_c = dht.float().contiguous() if has_dht else dh0
    # 16-bit: 4 warps, 3 pipeline stages (round-4 sweep on the H200, NOTES_delta.md)
    _launch(_state_bwd_kernel, (V // BV, BH),
            (q, k, w, b, a if a is not None else b, do, dht_c, dh, dh0, dvp, float(scale), T, H, NT, NT * CHUNK),
            dict(K=K, V=V, BV=BV, PREC=_precision(q.dtype), HAS_DHT=has_dht, HAS_A=a is not None),
            _seq_configs(q.dtype, K, BV, _TUNE["bwd_warps"], _TUNE["bwd_stages"], nw16=4, ns16=3))
    return dh, dh0, dvp


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


def _local_grads_triton(q, k, v, g, beta, b, w, u, tm, a, hs, dh, do, vp, dvp, scale):
    """Per-chunk backward on the GPU: ``_bwd_dqk_kernel`` then ``_bwd_wy_kernel``."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = hs.shape[1]
    NTC = NT * CHUNK
    BH = B * H
    dev = q.device
    prec = _precision(q.dtype)
    BK = _tuned_bv("dqk_bk", min(K, 64), K)
    NK = K // BK
    BVQ = _tuned_bv("dqk_bv", min(V, 64), V)
    BVW = _tuned_bv("dwy_bv", min(V, 64), V)
    # 4 warps for 16-bit inputs (round-3 sweep on the H200: 0.84× and 0.90× the time at 8 warps
    # for the two kernels); float32 (IEEE products, twice the registers) keeps 8 at head size 128
    pw = 4 if q.dtype != torch.float32 else 0
    dq = torch.empty_like(q)
    dk_p = torch.empty(q.shape, dtype=torch.float32, device=dev)      # partial dk (scores, state)
    dw = torch.empty(BH, NTC, K, dtype=q.dtype, device=dev)
    db_p = torch.empty(NK, BH, NTC, dtype=torch.float32, device=dev)
    _launch(_bwd_dqk_kernel, (NK, NT, BH),
            (q, k, b, a if a is not None else b, hs, dh, do, vp, dvp, dq, dk_p, dw, db_p, scale, T, H, NT, NTC),
            dict(K=K, V=V, BK=BK, BV=BVQ, PREC=prec, HAS_A=a is not None),
            _par_configs(BK, V, _TUNE["dqk_warps"], nw=pw))
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dbeta = torch.empty(B, T, H, dtype=torch.float32, device=dev)
    db = torch.empty(BH, NTC, dtype=torch.float32, device=dev)
    _launch(_bwd_wy_kernel, (NT, BH),
            (k, v, beta, b, w, u, tm, dvp, dw, dk_p, db_p, dk, dv, dbeta, db, T, H, NTC),
            dict(K=K, V=V, BV=BVW, NK=NK, PREC=prec, REC=_switch("dwy_rec", True)),
            _par_configs(K, V, _TUNE["dwy_warps"], nw=pw))
    dg = None
    if g is not None:   # b_i = Σ_{s ≤ i} g_s inside a chunk: dg = reverse cumulative sum of db
        dg = db.view(B, H, NT, CHUNK).flip(-1).cumsum(-1).flip(-1).view(B, H, NTC)
        dg = dg[:, :, :T].transpose(1, 2)
    return dq, dk, dv, dbeta, dg


class _ChunkDeltaFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, h0, output_final_state, train):
        B, T, H, K = q.shape
        V = v.shape[-1]
        NT = triton.cdiv(T, CHUNK)
        b, bt = _chunk_cumsum(g, beta, B, T, H, NT, with_beta=not train)
        o, ht, w, u, tm, a, hs, vp = _forward(q, k, v, b, beta, bt, scale, h0, output_final_state,
                                              store_states=train, gated=g is not None)
        if train:
            ctx.save_for_backward(q, k, v, g, beta, b, w, u, tm, a, hs, vp)
            ctx.scale = scale
            ctx.has_h0 = h0 is not None
            ctx.h0_dtype = h0.dtype if h0 is not None else None
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, beta, b, w, u, tm, a, hs, vp = ctx.saved_tensors
        B, T, H, K = q.shape
        V = v.shape[-1]
        NT = hs.shape[1]
        BH = B * H
        do = do.to(q.dtype).contiguous()
        dh, dh0, dvp = _state_bwd(q, k, w, b, a, do, dht, float(ctx.scale), NT)
        res = None
        if _BWD_IMPL != "torch":
            try:
                res = _local_grads_triton(q, k, v, g, beta, b, w, u, tm, a, hs, dh, do, vp, dvp, float(ctx.scale))
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
