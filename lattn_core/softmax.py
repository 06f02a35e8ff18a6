"""Softmax attention, two ways: the matrix form and the article's O(1)-extra-memory recurrence."""
from __future__ import annotations

import numpy as np

from ._validate import check_qkv

__all__ = ["softmax_attention", "softmax_attention_recurrent", "attention_scores"]


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
