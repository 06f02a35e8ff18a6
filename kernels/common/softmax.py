"""The online softmax, one block of keys at a time (Chapter 1's O(1)-memory recurrence as a tile).

Every attention-like kernel of the book (flash attention and FoX, DeltaFormer's pseudo-values and
its last attention, PaTH's walk over key blocks) keeps a running row max ``m``, a running
denominator ``l`` and an unnormalised output ``acc`` in float32 registers and folds one block of
scores into them with :func:`online_softmax_step`. Scores use ``exp2``: ``log2(e)`` is folded into
the scale (``qk_scale = scale·LOG2E``), so ``exp(scale·s) = exp2(qk_scale·s)``.
"""
import triton
import triton.language as tl

__all__ = ["LOG2E", "online_softmax_step", "load_rows"]

LOG2E = 1.4426950408889634


@triton.jit
def online_softmax_step(acc, l_i, m_i, s, v, qk_scale, PRECISION: tl.constexpr):
    """Fold one block of scores ``s`` ``[BM, BN]`` (unscaled, masked entries -inf) and its values
    ``v`` ``[BN, D]`` into the running ``(acc, l, m)`` of the online softmax.

    Scores in log2 units are ``qk_scale·s`` (``qk_scale = scale·log2 e > 0``, so the row max commutes
    with the scaling and ``qk_scale·s − m`` is one fused multiply-add per score). The caller
    guarantees that every row has seen a visible key by its first block (key 0, or its own diagonal
    key), so ``m_new`` is finite and ``exp2(-inf − m_new) = 0`` never meets ``-inf − -inf``."""
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    p = tl.math.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
    return acc, l_i, m_new


@triton.jit
def load_rows(base, o_r, stride, o_d, T, TAIL_MASK: tl.constexpr):
    """Rows ``o_r`` of a ``[T, D]`` slab (row stride ``stride``, ``D`` contiguous); zeros past ``T``."""
    ptrs = base + o_r[:, None] * stride + o_d[None, :]
    if TAIL_MASK:
        return tl.load(ptrs, mask=(o_r < T)[:, None], other=0.0)
    return tl.load(ptrs)
