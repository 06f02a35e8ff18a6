"""Jit helpers of the gla family: segmented sums of gates.

``_gate_mm`` forms the
segmented sums of gates ``M @ g`` that the vector gate's levels (K5 of ``kernels/gla/DERIVATION.md``)
need in the forward's prep stage, on the tensor cores, and ``_gla_level`` gives a level's exponents
from the cumulative gate as the backward forms them.
"""
import triton
import triton.language as tl

__all__ = ["_gla_level", "_gate_mm"]


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


@triton.jit
def _gate_mm(mask, g, GT: tl.constexpr, PIECES: tl.constexpr, EMU: tl.constexpr):
    """``M @ g`` for the 0/1 matrix ``M = mask`` ``[BT, BT]`` and gates ``g`` ``[BT, BK]``: segmented
    sums of gates, on the tensor cores, with float32 accumulation.

    16-bit gates enter the product as they are (``M`` is exact in any dtype): the sums are exact up
    to float32 accumulation. Float32 gates are cut into ``PIECES`` bfloat16 pieces, each the rounding
    of what the previous ones left (bfloat16 has float32's exponent range, so nothing overflows), and
    ``M @ g`` is one bfloat16 product per piece into one float32 accumulator: three pieces hold all 24
    bits of the significand (exact sums, float32 inputs), two hold 16 (float16 inputs, whose operands
    keep 11). One piece (bfloat16 inputs) rounds each gate to 8 bits: an exponent ``x <= 0`` moves by
    at most ``2^-8 |x|``, so the factor ``e^x <= 1`` moves by at most ``2^-8 |x| e^x <= 2^-8 / e``,
    about 0.37 of the bound ``2^-8`` on the rounding of the bfloat16 operand the factor then scales:
    float32 gates cost the bfloat16 kernel no precision it keeps, and no time. (An IEEE float32 product,
    ``input_precision="ieee"``, would run on the CUDA cores: that was a 10-15x slower forward for
    float32 gates, the dtype fla's layers pass.) Under the interpreter (``EMU``) 16-bit gates are
    widened to float32 (it mis-computes 16-bit products)."""
    if GT == tl.float32:
        m = tl.where(mask, 1.0, 0.0).to(tl.bfloat16)
        hi = g.to(tl.bfloat16)      # (with one piece the caller has rounded g already: a no-op)
        acc = tl.dot(m, hi)
        if PIECES >= 2:
            r = g - hi.to(tl.float32)
            mid = r.to(tl.bfloat16)
            acc = tl.dot(m, mid, acc)
            if PIECES == 3:
                acc = tl.dot(m, (r - mid.to(tl.float32)).to(tl.bfloat16), acc)
        return acc
    elif EMU:
        return tl.dot(tl.where(mask, 1.0, 0.0), g.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(tl.where(mask, 1.0, 0.0).to(GT), g)
