"""Tile helpers every family's kernels use: operand and store rounding, and row tiles.

``round_operand`` rounds a matmul operand to the dtype the tensor cores take (emulated in float32
under the interpreter, so the CPU tests see the GPU's roundings), ``round_store`` rounds for a
store, and ``rows_tile`` gives the pointers and mask of a block of rows of a row-major tensor.
"""
import triton
import triton.language as tl

__all__ = ["round_operand", "round_store", "rows_tile"]


@triton.jit
def round_operand(x, DT: tl.constexpr, EMU: tl.constexpr):
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
def round_store(x, ODT: tl.constexpr, EMU: tl.constexpr):
    """Cast ``x`` for a store into a tensor of dtype ``ODT`` (rounded to nearest under EMU too)."""
    return round_operand(x, ODT, EMU).to(ODT)


@triton.jit
def rows_tile(p, o_r, m_r, D: tl.constexpr, BD: tl.constexpr):
    """Pointers and mask of rows ``o_r`` (mask ``m_r``) of a row-major ``[N, D]`` tensor, ``BD``
    (a power of two >= ``D``) columns wide."""
    o_d = tl.arange(0, BD)
    return p + o_r.to(tl.int64)[:, None] * D + o_d[None, :], m_r[:, None] & (o_d < D)[None, :]
