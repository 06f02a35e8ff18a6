"""The inference march of the (gated) delta rule written in Gluon, Triton's lower-level dialect
(``triton.experimental.gluon``, Hopper only): an experiment of round 9 (``kernels/NOTES_delta.md``).

It computes the same function as ``_march_t_kernel`` in ``triton_delta.py`` (with other roundings), per chunk of 64 tokens
and V-block of ``BV`` columns, with the state ``S`` (``[K, BV]``, float32) in registers::

    x  = β ⊙ (v − e^{b} ⊙ K S)               (K S: tensor cores)
    v' = T x                                 (T = (I + A)^{-1} of the chunk)
    o  = e^{b}·scale ⊙ (Q S) + (P T) x       (P: the chunk's masked, gated, scaled scores)
    S ← e^{b_C} S + Kᵀ (e^{b_C − b} ⊙ v')

What Gluon allows and ``tl.dot`` does not: the tensor-core products are issued asynchronously and
waited on only where their result is needed, so ``Q S`` runs beside ``K S`` and ``(P T) x`` beside
``T x``; the tiles of the next chunks are fetched by the tensor-memory accelerator into a ring of
``STAGES`` shared-memory buffers, one barrier per tile and buffer. ``P T`` is formed per chunk before the
march (so the output needs ``x`` instead of ``v'``, one register → shared-memory copy less per step).

A second kernel, ``_march_gl_wu_kernel``, marches in the W/U form of the training forward
(``v' = U − W S``, ``o = e^{b}·scale ⊙ (Q S) + P v'``), two products on the chain instead of three,
for ``W`` and ``U`` formed before the march.

Status (round 9, H200, ``kernels/NOTES_delta.md``): both are options of the inference forward
(``triton_delta.tuning(mt_gl=1)`` for the T form, ``mt_gl=3`` for the W/U form), off by default.
Their march is faster than the Triton march at batch × heads of 16 and 32, but the forward as a whole
gains at most a few per cent there, and loses at larger batch × heads.

Restrictions (the caller falls back to the Triton march otherwise): an NVIDIA GPU of compute
capability 9 (Hopper), float16/bfloat16 inputs, ``T`` a multiple of 64, contiguous ``[B, T, H, D]``
inputs. Gluon kernels do not run in Triton's CPU interpreter, so this file runs only in the GPU
tests; on a CPU the tests compile it for sm_90a (``tests/aot_compile_gluon_delta.py``: compiler,
``ptxas``, shared memory, spills), which catches what breaks compilation but not wrong results.
"""
from __future__ import annotations

try:   # Gluon is experimental and absent from older Triton releases
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    HAVE_GLUON = True
except Exception:   # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

import torch

__all__ = ["HAVE_GLUON", "march_gluon", "march_gluon_wu", "gluon_march_supported"]


def gluon_march_supported(q, T: int) -> bool:
    """Whether ``march_gluon`` can run these inputs (Hopper GPU, 16-bit, ``T`` a multiple of 64)."""
    return (HAVE_GLUON and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and T % 64 == 0
            and torch.cuda.get_device_capability(q.device)[0] == 9)


if HAVE_GLUON:
    @gluon.jit
    def _issue(q_desc, k_desc, v_desc, t_desc, p_desc, be_desc, g_desc, q_s, k_s, v_s, t_s, p_s, be_s, g_s,
               bq, bk, bv, bt, bp, slot, row, tr, h, iv, pred,
               K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, GATED: gl.constexpr):
        """Fetch the tiles of one chunk (query and key rows at ``row``, the V-block, ``T`` and
        ``P T`` at ``tr``) into buffer ``slot``, each tile completing its own barrier. (Triton's
        shared-memory hazard analysis puts a CTA-wide barrier between two operations on the same
        barrier allocation; with one allocation per tile, and the byte counts announced before
        any copy is issued, the tile copies need one such barrier instead of one each.) β and the
        log gate ``b`` (float32, 64 values) travel with ``v`` and ``k``, so the loop has no global
        loads for the proxy fences after its shared-memory stores to wait on (round 9c: this
        measured no faster than plain loads, NOTES_delta.md)."""
        mbarrier.expect(bq.index(slot), 64 * K * 2, pred)
        mbarrier.expect(bk.index(slot), 64 * K * 2 + (256 if GATED else 0), pred)
        mbarrier.expect(bv.index(slot), 64 * BV * 2 + 256, pred)
        mbarrier.expect(bt.index(slot), 64 * 64 * 2, pred)
        mbarrier.expect(bp.index(slot), 64 * 64 * 2, pred)
        tma.async_copy_global_to_shared(q_desc, [row, h * K], bq.index(slot), q_s.index(slot), pred)
        tma.async_copy_global_to_shared(k_desc, [row, h * K], bk.index(slot), k_s.index(slot), pred)
        tma.async_copy_global_to_shared(v_desc, [row, h * V + iv * BV], bv.index(slot), v_s.index(slot), pred)
        tma.async_copy_global_to_shared(t_desc, [tr, 0], bt.index(slot), t_s.index(slot), pred)
        tma.async_copy_global_to_shared(p_desc, [tr, 0], bp.index(slot), p_s.index(slot), pred)
        tma.async_copy_global_to_shared(be_desc, [tr], bv.index(slot), be_s.index(slot), pred)
        if GATED:
            tma.async_copy_global_to_shared(g_desc, [tr], bk.index(slot), g_s.index(slot), pred)

    @gluon.jit
    def _ring_barriers(STAGES: gl.constexpr):
        """Five barrier allocations (one per tile kind of the ring, see ``_issue``), each with one
        barrier per buffer, initialised."""
        b0 = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        b1 = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        b2 = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        b3 = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        b4 = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for st in gl.static_range(STAGES):
            mbarrier.init(b0.index(st), count=1)
            mbarrier.init(b1.index(st), count=1)
            mbarrier.init(b2.index(st), count=1)
            mbarrier.init(b3.index(st), count=1)
            mbarrier.init(b4.index(st), count=1)
        return b0, b1, b2, b3, b4

    @gluon.jit
    def _drop_barriers(b0, b1, b2, b3, b4, STAGES: gl.constexpr):
        for st in gl.static_range(STAGES):
            mbarrier.invalidate(b0.index(st))
            mbarrier.invalidate(b1.index(st))
            mbarrier.invalidate(b2.index(st))
            mbarrier.invalidate(b3.index(st))
            mbarrier.invalidate(b4.index(st))

    @gluon.jit
    def _chunk_gate(g_s, slot, rowl: gl.constexpr, GATED: gl.constexpr):
        """The chunk's within-chunk cumulative log gate ``b`` (rows) and its last value ``b_C``, from
        the ring (zeros without a gate)."""
        if GATED:
            b = g_s.index(slot).load(rowl)
            b_last = gl.sum(g_s.index(slot).slice(63, 1).load(gl.BlockedLayout([1], [32], [4], [0])), axis=0)
        else:
            b = gl.zeros([64], gl.float32, layout=rowl)
            b_last = 0.0
        return b, b_last

    @gluon.jit
    def _march_start(h0_ptr, H, T, NTC, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, mma: gl.constexpr,
                     HAS_H0: gl.constexpr):
        """What both marches start from: the program's V-block ``iv``, sequence·head ``bh`` and head
        ``h``; the row and column index vectors (``rr`` chunk rows, ``ck`` keys, ``cv`` the V-block's
        columns); the first row of the sequence in the ``[B·T, H·D]`` views (``seq``) and of the
        sequence·head in the ``[B·H, NT·64]`` buffers (``vec``); ``bh`` as int64 for pointer offsets
        (TMA coordinates stay 32-bit); and the entering state ``S`` (float32, zeros without one)."""
        rowl: gl.constexpr = gl.SliceLayout(1, mma)
        coll: gl.constexpr = gl.SliceLayout(0, mma)
        iv = gl.program_id(0)
        bh = gl.program_id(1)
        h = bh % H
        rr = gl.arange(0, 64, layout=rowl)
        ck = gl.arange(0, K, layout=rowl)
        cv = iv * BV + gl.arange(0, BV, layout=coll)
        seq = (bh // H) * T
        vec = bh * NTC
        bh64 = bh.to(gl.int64)
        if HAS_H0:
            S = gl.load(h0_ptr + bh64 * K * V + ck[:, None] * V + cv[None, :]).to(gl.float32)
        else:
            S = gl.zeros([K, BV], gl.float32, layout=mma)
        return iv, h, rr, ck, cv, seq, vec, bh64, S

    @gluon.jit
    def _march_gl_kernel(q_desc, k_desc, v_desc, t_desc, p_desc, be_desc, g_desc, o_ptr, h0_ptr, ht_ptr,
                         scale, T, H, NTC, N0, N1,
                         K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, STAGES: gl.constexpr,
                         HAS_H0: gl.constexpr, STORE_HT: gl.constexpr, GATED: gl.constexpr):
        dt: gl.constexpr = q_desc.dtype
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BV, 16])
        rowl: gl.constexpr = gl.SliceLayout(1, mma)
        q_s = gl.allocate_shared_memory(dt, [STAGES, 64, K], q_desc.layout)
        k_s = gl.allocate_shared_memory(dt, [STAGES, 64, K], k_desc.layout)
        v_s = gl.allocate_shared_memory(dt, [STAGES, 64, BV], v_desc.layout)
        t_s = gl.allocate_shared_memory(dt, [STAGES, 64, 64], t_desc.layout)
        p_s = gl.allocate_shared_memory(dt, [STAGES, 64, 64], p_desc.layout)
        be_s = gl.allocate_shared_memory(gl.float32, [STAGES, 64], be_desc.layout)
        g_s = gl.allocate_shared_memory(gl.float32, [STAGES, 64], g_desc.layout)
        s_s = gl.allocate_shared_memory(dt, [K, BV], gl.NVMMASharedLayout.get_default_for([K, BV], dt))
        x_s = gl.allocate_shared_memory(dt, [64, BV], gl.NVMMASharedLayout.get_default_for([64, BV], dt))
        w_s = gl.allocate_shared_memory(dt, [64, BV], gl.NVMMASharedLayout.get_default_for([64, BV], dt))
        bq, bk, bv, bt, bp = _ring_barriers(STAGES)

        iv, h, rr, ck, cv, seq, vec, bh64, S = _march_start(h0_ptr, H, T, NTC, K, V, BV, mma, HAS_H0)
        for j in gl.static_range(STAGES - 1):
            n = N0 + j
            _issue(q_desc, k_desc, v_desc, t_desc, p_desc, be_desc, g_desc, q_s, k_s, v_s, t_s, p_s, be_s, g_s,
                   bq, bk, bv, bt, bp, j, seq + n * 64, vec + n * 64, h, iv, n < N1, K, V, BV, GATED)
        zero = gl.zeros([64, BV], gl.float32, layout=mma)
        op = o_ptr + (seq.to(gl.int64) * H + h) * V
        for n in range(N0, N1):
            i = n - N0
            slot = i % STAGES
            s_s.store(S.to(dt))
            fence_async_shared()
            gl.thread_barrier()
            ph = (i // STAGES) & 1
            mbarrier.wait(bk.index(slot), ph)
            mbarrier.wait(bq.index(slot), ph)
            ks = warpgroup_mma(k_s.index(slot), s_s, zero, use_acc=False, is_async=True)
            qs = warpgroup_mma(q_s.index(slot), s_s, zero, use_acc=False, is_async=True)
            # every warp is past the last step's reads, so the buffer it used can be refilled
            nn = n + STAGES - 1
            _issue(q_desc, k_desc, v_desc, t_desc, p_desc, be_desc, g_desc, q_s, k_s, v_s, t_s, p_s, be_s, g_s,
                   bq, bk, bv, bt, bp, (i + STAGES - 1) % STAGES, seq + nn * 64, vec + nn * 64, h, iv, nn < N1,
                   K, V, BV, GATED)
            b, b_last = _chunk_gate(g_s, slot, rowl, GATED)
            eb = gl.exp(b)
            ks = warpgroup_mma_wait(1, deps=[ks])
            mbarrier.wait(bv.index(slot), ph)
            v = v_s.index(slot).load(mma).to(gl.float32)
            beta = be_s.index(slot).load(rowl)
            x = beta[:, None] * (v - eb[:, None] * ks)
            x_s.store(x.to(dt))
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.wait(bt.index(slot), ph)
            mbarrier.wait(bp.index(slot), ph)
            qs = warpgroup_mma_wait(0, deps=[qs])
            vp = warpgroup_mma(t_s.index(slot), x_s, zero, use_acc=False, is_async=True)
            o = warpgroup_mma(p_s.index(slot), x_s, qs * (eb * scale)[:, None], is_async=True)
            vp = warpgroup_mma_wait(1, deps=[vp])
            w_s.store((vp * gl.exp(b_last - b)[:, None]).to(dt))
            fence_async_shared()
            gl.thread_barrier()
            S = warpgroup_mma(k_s.index(slot).permute((1, 0)), w_s, S * gl.exp(b_last), is_async=True)
            o, S = warpgroup_mma_wait(0, deps=[o, S])
            gl.store(op + (n * 64 + rr).to(gl.int64)[:, None] * (H * V) + cv[None, :], o.to(dt))
        _drop_barriers(bq, bk, bv, bt, bp, STAGES)
        if STORE_HT:
            gl.store(ht_ptr + bh64 * K * V + ck[:, None] * V + cv[None, :], S)


    @gluon.jit
    def _issue_wu(q_desc, k_desc, w_desc, u_desc, p_desc, g_desc, q_s, k_s, w_s, u_s, p_s, g_s,
                  bq, bk, bw, bu, bp, slot, row, tr, h, iv, pred, K: gl.constexpr, BV: gl.constexpr,
                  GATED: gl.constexpr):
        """As ``_issue`` for the W/U form: query and key rows at ``row``; ``W``, the V-block of
        ``U``, ``P`` and the log gate at ``tr``."""
        mbarrier.expect(bq.index(slot), 64 * K * 2, pred)
        mbarrier.expect(bk.index(slot), 64 * K * 2, pred)
        mbarrier.expect(bw.index(slot), 64 * K * 2 + (256 if GATED else 0), pred)
        mbarrier.expect(bu.index(slot), 64 * BV * 2, pred)
        mbarrier.expect(bp.index(slot), 64 * 64 * 2, pred)
        tma.async_copy_global_to_shared(w_desc, [tr, 0], bw.index(slot), w_s.index(slot), pred)
        tma.async_copy_global_to_shared(q_desc, [row, h * K], bq.index(slot), q_s.index(slot), pred)
        tma.async_copy_global_to_shared(u_desc, [tr, iv * BV], bu.index(slot), u_s.index(slot), pred)
        tma.async_copy_global_to_shared(k_desc, [row, h * K], bk.index(slot), k_s.index(slot), pred)
        tma.async_copy_global_to_shared(p_desc, [tr, 0], bp.index(slot), p_s.index(slot), pred)
        if GATED:
            tma.async_copy_global_to_shared(g_desc, [tr], bw.index(slot), g_s.index(slot), pred)

    @gluon.jit
    def _march_gl_wu_kernel(q_desc, k_desc, w_desc, u_desc, p_desc, g_desc, o_ptr, h0_ptr, ht_ptr,
                            scale, T, H, NTC, N0, N1,
                            K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, STAGES: gl.constexpr,
                            HAS_H0: gl.constexpr, STORE_HT: gl.constexpr, GATED: gl.constexpr):
        """The march in W/U form: ``v' = U − W S``, ``o = e^{b}·scale ⊙ (Q S) + P v'``,
        ``S ← e^{b_C} S + Kᵀ (e^{b_C − b} ⊙ v')``: two products on the chain from one state to the
        next (``W S``, ``Kᵀ v'``) instead of three, for ``W`` and ``U`` formed before the march."""
        dt: gl.constexpr = q_desc.dtype
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BV, 16])
        rowl: gl.constexpr = gl.SliceLayout(1, mma)
        q_s = gl.allocate_shared_memory(dt, [STAGES, 64, K], q_desc.layout)
        k_s = gl.allocate_shared_memory(dt, [STAGES, 64, K], k_desc.layout)
        w_s = gl.allocate_shared_memory(dt, [STAGES, 64, K], w_desc.layout)
        u_s = gl.allocate_shared_memory(dt, [STAGES, 64, BV], u_desc.layout)
        p_s = gl.allocate_shared_memory(dt, [STAGES, 64, 64], p_desc.layout)
        g_s = gl.allocate_shared_memory(gl.float32, [STAGES, 64], g_desc.layout)
        s_s = gl.allocate_shared_memory(dt, [K, BV], gl.NVMMASharedLayout.get_default_for([K, BV], dt))
        vp_s = gl.allocate_shared_memory(dt, [64, BV], gl.NVMMASharedLayout.get_default_for([64, BV], dt))
        vk_s = gl.allocate_shared_memory(dt, [64, BV], gl.NVMMASharedLayout.get_default_for([64, BV], dt))
        bq, bk, bw, bu, bp = _ring_barriers(STAGES)

        iv, h, rr, ck, cv, seq, vec, bh64, S = _march_start(h0_ptr, H, T, NTC, K, V, BV, mma, HAS_H0)
        for j in gl.static_range(STAGES - 1):
            n = N0 + j
            _issue_wu(q_desc, k_desc, w_desc, u_desc, p_desc, g_desc, q_s, k_s, w_s, u_s, p_s, g_s,
                      bq, bk, bw, bu, bp, j, seq + n * 64, vec + n * 64, h, iv, n < N1, K, BV, GATED)
        zero = gl.zeros([64, BV], gl.float32, layout=mma)
        op = o_ptr + (seq.to(gl.int64) * H + h) * V
        for n in range(N0, N1):
            i = n - N0
            slot = i % STAGES
            ph = (i // STAGES) & 1
            s_s.store(S.to(dt))
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.wait(bw.index(slot), ph)
            ws = warpgroup_mma(w_s.index(slot), s_s, zero, use_acc=False, is_async=True)
            mbarrier.wait(bq.index(slot), ph)
            qs = warpgroup_mma(q_s.index(slot), s_s, zero, use_acc=False, is_async=True)
            nn = n + STAGES - 1
            _issue_wu(q_desc, k_desc, w_desc, u_desc, p_desc, g_desc, q_s, k_s, w_s, u_s, p_s, g_s,
                      bq, bk, bw, bu, bp, (i + STAGES - 1) % STAGES, seq + nn * 64, vec + nn * 64, h, iv, nn < N1,
                      K, BV, GATED)
            b, b_last = _chunk_gate(g_s, slot, rowl, GATED)
            mbarrier.wait(bu.index(slot), ph)
            u = u_s.index(slot).load(mma).to(gl.float32)
            ws = warpgroup_mma_wait(1, deps=[ws])
            vp = u - ws
            vk_s.store((vp * gl.exp(b_last - b)[:, None]).to(dt))
            vp_s.store(vp.to(dt))
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.wait(bk.index(slot), ph)
            S = warpgroup_mma(k_s.index(slot).permute((1, 0)), vk_s, S * gl.exp(b_last), is_async=True)
            qs = warpgroup_mma_wait(1, deps=[qs])
            mbarrier.wait(bp.index(slot), ph)
            o = warpgroup_mma(p_s.index(slot), vp_s, qs * (gl.exp(b) * scale)[:, None], is_async=True)
            S, o = warpgroup_mma_wait(0, deps=[S, o])
            gl.store(op + (n * 64 + rr).to(gl.int64)[:, None] * (H * V) + cv[None, :], o.to(dt))
        _drop_barriers(bq, bk, bw, bu, bp, STAGES)
        if STORE_HT:
            gl.store(ht_ptr + bh64 * K * V + ck[:, None] * V + cv[None, :], S)


def _desc(x, block):
    from triton.experimental.gluon import language as gl_
    dt = {torch.bfloat16: gl_.bfloat16, torch.float16: gl_.float16, torch.float32: gl_.float32}[x.dtype]
    return TensorDescriptor.from_tensor(x, block, gl_.NVMMASharedLayout.get_default_for(block, dt))


def march_gluon(q, k, v, bt, b, tm, pt, o, h0, ht, scale, n0, n1, BV, stages=3, num_warps=4, gated=True):
    """Run chunks ``n0 .. n1-1`` of the inference march (see the module docstring). ``bt``, ``b``:
    float32 ``[B·H, NT·64]`` (β and the within-chunk cumulative log gate); ``tm``, ``pt``: ``T`` and
    ``P T`` of every chunk, ``[B·H, NT·64, 64]`` in the input dtype; ``h0`` the entering state or
    ``None``; ``ht`` receives the leaving state (or ``None``)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    NTC = tm.shape[1]
    q2, k2, v2 = q.view(B * T, H * K), k.view(B * T, H * K), v.view(B * T, H * V)
    t2, p2 = tm.view(-1, 64), pt.view(-1, 64)
    _march_gl_kernel[(V // BV, B * H)](
        _desc(q2, [64, K]), _desc(k2, [64, K]), _desc(v2, [64, BV]), _desc(t2, [64, 64]), _desc(p2, [64, 64]),
        _desc(bt.view(-1), [64]), _desc(b.view(-1), [64]), o, h0 if h0 is not None else bt,
        ht if ht is not None else bt, float(scale), T, H, NTC, n0, n1,
        K=K, V=V, BV=BV, STAGES=stages, HAS_H0=h0 is not None, STORE_HT=ht is not None, GATED=gated,
        num_warps=num_warps)


def march_gluon_wu(q, k, w, u, b, p, o, h0, ht, scale, n0, n1, BV, stages=3, num_warps=4, gated=True):
    """Run chunks ``n0 .. n1-1`` of the inference march in W/U form (``_march_gl_wu_kernel``):
    ``w``, ``u``, ``p``: ``W``, ``U`` and the scores ``P`` of every chunk (``[B·H, NT·64, ·]``,
    input dtype), ``b`` as in ``march_gluon``."""
    B, T, H, K = q.shape
    V = u.shape[-1]
    NTC = w.shape[1]
    q2, k2 = q.view(B * T, H * K), k.view(B * T, H * K)
    _march_gl_wu_kernel[(V // BV, B * H)](
        _desc(q2, [64, K]), _desc(k2, [64, K]), _desc(w.view(-1, K), [64, K]), _desc(u.view(-1, V), [64, BV]),
        _desc(p.view(-1, 64), [64, 64]), _desc(b.view(-1), [64]), o, h0 if h0 is not None else b,
        ht if ht is not None else b, float(scale), T, H, NTC, n0, n1,
        K=K, V=V, BV=BV, STAGES=stages, HAS_H0=h0 is not None, STORE_HT=ht is not None, GATED=gated,
        num_warps=num_warps)
