"""Softmax attention, three ways: the matrix form, the article's O(1)-extra-memory recurrence, and
the blocked (FlashAttention-style) chunkwise form of that recurrence."""
from __future__ import annotations

import numpy as np

from ._validate import as_array, check_chunk_size, check_qkv

__all__ = ["softmax_attention", "softmax_attention_recurrent", "softmax_attention_chunkwise",
           "softmax_attention_numerator", "rms_norm", "attention_scores", "causal_block_mask"]


def attention_scores(Q, K) -> np.ndarray:
    """The causal score matrix ``Q K^T + log M``: entries above the diagonal are ``-inf``."""
    Q = np.asarray(Q, dtype=np.float64)
    K = np.asarray(K, dtype=np.float64)
    n = Q.shape[0]
    S = Q @ K.T
    S[np.triu_indices(n, k=1)] = -np.inf
    return S


def softmax_attention(Q, K, V) -> np.ndarray:
    """Causal softmax attention ``o_t = sum_{j<=t} exp(q_t·k_j) v_j / sum_{j<=t} exp(q_t·k_j)``.

    No implicit ``1/sqrt(d)``: scale ``Q`` yourself. Computed stably by subtracting each row's max.
    ``Q, K``: ``(n, d_k)``; ``V``: ``(n, d_v)``; returns ``(n, d_v)`` float64.
    """
    Q, K, V = check_qkv(Q, K, V)
    S = attention_scores(Q, K)
    S -= S.max(axis=1, keepdims=True)
    P = np.exp(S)                       # exp(-inf) = 0 above the diagonal
    return (P @ V) / P.sum(axis=1, keepdims=True)


def softmax_attention_recurrent(Q, K, V) -> np.ndarray:
    """The same output as :func:`softmax_attention`, as a recurrence over keys.

    For each query ``q_i`` keep three running quantities over ``j = 1..i``: the max score ``m``, the
    numerator ``y = sum exp(s_j - m) v_j`` (a ``d_v`` vector) and the denominator
    ``z = sum exp(s_j - m)``. A new key rescales ``y`` and ``z`` by ``exp(m_old - m_new)``. Extra
    memory per query is ``O(d_v)``, independent of ``n``; time is ``O(n^2 d)`` overall.
    """
    Q, K, V = check_qkv(Q, K, V)
    n, d_v = V.shape
    out = np.empty((n, d_v))
    for i in range(n):
        m, z, y = -np.inf, 0.0, np.zeros(d_v)
        for j in range(i + 1):
            s = float(Q[i] @ K[j])
            m_new = max(m, s)
            rescale = np.exp(m - m_new)       # exp(-inf) = 0 on the first step
            w = np.exp(s - m_new)
            y = rescale * y + w * V[j]
            z = rescale * z + w
            m = m_new
        out[i] = y / z
    return out


def causal_block_mask(n: int, chunk_size: int) -> np.ndarray:
    """Which (query block, key block) tiles a causal blocked attention visits.

    Blocks are ``[b * chunk_size, min((b + 1) * chunk_size, n))``; tile ``(i, j)`` is visited when
    key block ``j`` holds at least one key at or before the last query of block ``i`` (``j <= i``).
    Returns a boolean ``(n_blocks, n_blocks)`` array; the fraction of ``True`` entries tends to 1/2.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive integer; got {n!r}")
    c = check_chunk_size(chunk_size)
    starts = np.arange(0, int(n), c)
    last_query = np.minimum(starts + c, int(n)) - 1
    return starts[None, :] <= last_query[:, None]


def softmax_attention_chunkwise(Q, K, V, chunk_size: int = 64) -> np.ndarray:
    """The same output as :func:`softmax_attention`, blocked the way FlashAttention computes it.

    Queries and keys are cut into blocks of ``chunk_size`` rows (the last block may be shorter).
    For each query block, the key blocks it can see (:func:`causal_block_mask`) are visited in
    order, keeping per query a running max ``m``, numerator ``y`` (``d_v``) and denominator ``z``;
    when a block raises the max, the old ``y`` and ``z`` are rescaled by ``exp(m_old - m_new)``.
    Only ``chunk_size x chunk_size`` scores exist at any time: extra memory ``O(chunk_size (chunk_size
    + d_v))`` instead of ``O(n^2)``; time is still ``O(n^2 d)``.
    """
    Q, K, V = check_qkv(Q, K, V)
    c = check_chunk_size(chunk_size)
    n, d_v = V.shape
    out = np.empty((n, d_v))
    for qs in range(0, n, c):
        qe = min(qs + c, n)
        q_idx = np.arange(qs, qe)
        m = np.full(qe - qs, -np.inf)
        z = np.zeros(qe - qs)
        y = np.zeros((qe - qs, d_v))
        for ks in range(0, qe, c):           # key blocks starting at or before the last query
            ke = min(ks + c, n)
            s = Q[qs:qe] @ K[ks:ke].T
            s[np.arange(ks, ke)[None, :] > q_idx[:, None]] = -np.inf   # causal mask inside the tile
            m_new = np.maximum(m, s.max(axis=1))   # finite: key 0 is visible to every query
            rescale = np.exp(m - m_new)            # exp(-inf) = 0 on the first block
            p = np.exp(s - m_new[:, None])
            y = rescale[:, None] * y + p @ V[ks:ke]
            z = rescale * z + p.sum(axis=1)
            m = m_new
        out[qs:qe] = y / z[:, None]
    return out


def softmax_attention_numerator(Q, K, V) -> np.ndarray:
    """The numerator of softmax attention alone: ``(exp(Q K^T) ⊙ M) V``, no denominator.

    This is the form the article calls the core of softmax attention: the denominator is the same
    product with ``V`` replaced by a column of ones, and an RMSNorm on the output cancels it
    (:func:`rms_norm`). Computed as written (no max subtraction), so large scores overflow to
    ``inf``: it is a definition to reason with, not a stable implementation.
    """
    Q, K, V = check_qkv(Q, K, V)
    n = Q.shape[0]
    A = np.exp(Q @ K.T) * np.tril(np.ones((n, n)))
    return A @ V


def rms_norm(X, eps: float = 0.0) -> np.ndarray:
    """Row-wise RMSNorm without a learned gain: ``x / sqrt(mean(x**2) + eps)`` for every row of ``X``.

    ``X``: ``(n, d)``. A row of zeros with ``eps = 0`` raises ``ValueError``.
    """
    X = as_array(X, "X", ("n", "d"))
    if not (eps >= 0 and np.isfinite(eps)):
        raise ValueError(f"eps must be a finite number >= 0; got {eps!r}")
    ms = np.mean(X * X, axis=1, keepdims=True) + eps
    if np.any(ms == 0):
        raise ValueError("X has a row of zeros and eps = 0: its RMS norm is undefined")
    return X / np.sqrt(ms)
