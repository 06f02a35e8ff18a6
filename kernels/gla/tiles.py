"""Shared jit helpers of the gla family: operand rounding and the level decomposition of (K5).

``_r16`` rounds a matmul operand to the input dtype (emulated in float32 under the interpreter, so
the CPU tests see the GPU's roundings), ``_st`` rounds for a store, and ``_gla_level`` gives one
level of the vector gate's intra-chunk scores (see ``kernels/gla/NOTES.md``, "Vector gates").
"""
import triton
import triton.language as tl

__all__ = ["_r16", "_st", "_gla_level"]


@triton.jit
def _r16(x, DT: tl.constexpr, EMU: tl.constexpr):
    """Round ``x`` to the matmul operand dtype ``DT``.

    Compiled: a plain cast (the tensor cores take 16-bit operands). Under the interpreter
    (``EMU``) the value is rounded to ``DT`` *and kept in float32*, because the interpreter
    mis-computes 16-bit ``tl.dot``; bfloat16 is rounded to nearest-even by hand, because the
    interpreter's own float32 -> bfloat16 cast truncates (a biased rounding the GPU does not have).
    So the CPU tests see the same operand roundings as the GPU.
    """
    if EMU:
        if DT == tl.bfloat16:
            u = x.to(tl.float32).to(tl.uint32, bitcast=True)
            u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
            return u.to(tl.float32, bitcast=True)
        elif DT == tl.float16:
            return x.to(tl.float16).to(tl.float32)
        else:
            return x.to(tl.float32)
    else:
        return x.to(DT)


@triton.jit
def _st(x, ODT: tl.constexpr, EMU: tl.constexpr):
    """Cast ``x`` for a store into a tensor of dtype ``ODT`` (rounded to nearest under EMU too)."""
    return _r16(x, ODT, EMU).to(ODT)


@triton.jit
def _gla_level(b, o_i, LV: tl.constexpr, BT: tl.constexpr, K: tl.constexpr):
    """Level ``LV`` of the vector gate's intra-chunk scores (chunk of BT tokens, b ``[BT, K]`` the
    chunk-local cumulative log gate).

    Level LV pairs the rows i in the second half of a block of 2*HB rows (HB = BT >> (LV + 1)) with
    the rows j in its first half. With E the cumulative gate at the last row of the first half,
    e^{b_i - b_j} = e^{b_i - E} e^{E - b_j}, and both exponents are <= 0 (b is non-increasing), so
    the level's scores are one matrix product (q e^{b - E}) (k e^{E - b})^T. Returns the query
    exponent ``qe`` and key exponent ``ke`` ``[BT, K]`` (-inf on rows outside their half, so that
    those rows vanish) and the ``[BT, BT]`` mask of the level's pairs. Every pair i > j of the chunk
    belongs to exactly one level (the highest bit in which i and j differ).
    """
    HB: tl.constexpr = BT >> (LV + 1)
    NB: tl.constexpr = BT // (2 * HB)
    b4 = tl.reshape(b, [NB, 2, HB, K])
    i1 = tl.arange(0, 2)[None, :, None, None]
    i2 = tl.arange(0, HB)[None, None, :, None]
    E = tl.sum(tl.sum(tl.where((i1 == 0) & (i2 == HB - 1), b4, 0.), axis=2), axis=1)      # [NB, K]
    Er = tl.reshape(tl.broadcast_to(E[:, None, None, :], [NB, 2, HB, K]), [BT, K])
    second = ((o_i // HB) % 2) == 1
    qe = tl.where(second[:, None], b - Er, float("-inf"))
    ke = tl.where(second[:, None], float("-inf"), Er - b)
    pair = (second[:, None] & (((o_i // HB) % 2) == 0)[None, :]
            & ((o_i // (2 * HB))[:, None] == (o_i // (2 * HB))[None, :]))
    return qe, ke, pair
