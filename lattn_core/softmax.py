"""Chapter 1 ("The quadratic cost"): softmax attention, three ways: the matrix form, the article's
O(1)-extra-memory recurrence, and the blocked (FlashAttention-style) chunkwise form of that
recurrence."""
from __future__ import annotations

import numpy as np

from ._validate import as_array, check_chunk_size, check_qkv

__all__ = ["softmax_attention", "softmax_attention_recurrent", "softmax_attention_chunkwise",
           "softmax_attention_numerator", "rms_norm", "attention_scores", "row_softmax",
           "causal_block_mask"]


def attention_scores(Q, K) -> np.ndarray:
    """The causal score matrix ``Q K^T + log M``: entries above the diagonal are ``-inf``.
    ``Q``, ``K``: ``(n, d_k)``, real and finite.

    Defined in Chapter 1 (The quadratic cost)."""
    K = as_array(K, "K", ("n", "d_k"))
    Q = as_array(Q, "Q", K.shape)
    n = Q.shape[0]
    S = Q @ K.T                             # every score q_i.k_j: n x n
    S[np.triu_indices(n, k=1)] = -np.inf    # + log M: -inf above the diagonal
    return S


def row_softmax(S) -> np.ndarray:
    """The softmax of every row of a score matrix whose excluded entries are ``-inf``.

    Stable: each row's largest score is subtracted before ``exp`` (``exp(-inf) = 0``). ``S``:
    ``(n, m)``, no NaN or ``+inf``, at least one finite entry per row (a causal score matrix always
    has its diagonal). Returns the ``(n, m)`` probabilities, rows summing to 1.

    Defined in Chapter 1 (The quadratic cost).
    """
    S = as_array(S, "S", ("n", "m"), finite=False)
    if np.isnan(S).any() or np.isposinf(S).any():
        raise ValueError("S must hold finite scores or -inf (excluded entries); found NaN or +inf")
    top = _row_max(S)                       # each row's largest score, finite
    P = np.exp(S - top)                     # <= 1: no overflow; exp(-inf) = 0
    return P / P.sum(axis=1, keepdims=True)  # each row sums to one (ch1-softmax)


def _row_max(S) -> np.ndarray:
    """Each row's largest entry, as an ``(n, 1)`` column; ``ValueError`` for a row that is all
    ``-inf`` (a softmax of nothing)."""
    top = S.max(axis=1, keepdims=True)
    if not np.all(np.isfinite(top)):
        row = int(np.argmin(np.isfinite(top[:, 0])))
        raise ValueError(f"S must have a finite entry in every row; row {row} is all -inf")
    return top


def softmax_attention(Q, K, V) -> np.ndarray:
    """Causal softmax attention ``o_t = sum_{j<=t} exp(q_t·k_j) v_j / sum_{j<=t} exp(q_t·k_j)``.

    No implicit ``1/sqrt(d)``: scale ``Q`` yourself. Computed stably by subtracting each row's max
    (:func:`row_softmax` of :func:`attention_scores`).
    ``Q, K``: ``(n, d_k)``; ``V``: ``(n, d_v)``; returns ``(n, d_v)`` float64.

    Defined in Chapter 1 (The quadratic cost).
    """
    Q, K, V = check_qkv(Q, K, V)
    return row_softmax(attention_scores(Q, K)) @ V


def _online_softmax_fold(m, z, y, s, v):
    """Fold scores into a running softmax: the one step of every online form in the book.

    ``s``: scores ``(..., c)`` of ``c`` new keys, ``v``: their values ``(c, d_v)``; the running max
    ``m`` ``(...)``, denominator ``z`` ``(...)`` and numerator ``y`` ``(..., d_v)`` are rescaled by
    ``exp(m_old - m_new)`` and the new terms added. ``m = -inf`` (with ``z = 0``, ``y = 0``) starts a
    row; every row must see a finite score in its first fold. Returns ``(m, z, y)``.
    """
    m_new = np.maximum(m, s.max(axis=-1))      # m' = max(m, s)
    rescale = np.exp(m - m_new)                 # e^(m - m'); 0 on the first fold
    p = np.exp(s - m_new[..., None])            # e^(s - m') <= 1
    # (ch1-online): z' = e^(m-m') z + sum_j e^(s_j-m'), and y' likewise with v_j
    return m_new, rescale * z + p.sum(axis=-1), rescale[..., None] * y + p @ v


def softmax_attention_recurrent(Q, K, V) -> np.ndarray:
    """The same output as :func:`softmax_attention`, as a recurrence over keys.

    For each query ``q_i`` keep three running quantities over ``j = 1..i``: the max score ``m``, the
    numerator ``y = sum exp(s_j - m) v_j`` (a ``d_v`` vector) and the denominator
    ``z = sum exp(s_j - m)``. A new key rescales ``y`` and ``z`` by ``exp(m_old - m_new)``. Extra
    memory per query is ``O(d_v)``, independent of ``n``; time is ``O(n^2 d)`` overall.

    Defined in Chapter 1 (The quadratic cost).
    """
    Q, K, V = check_qkv(Q, K, V)
    n, d_v = V.shape
    out = np.empty((n, d_v))
    for i in range(n):                      # one query at a time
        m, z, y = np.float64(-np.inf), 0.0, np.zeros(d_v)    # the state (m, y, z)
        for j in range(i + 1):              # its keys, one at a time
            s = Q[i] @ K[j:j + 1].T         # one score, shape (1,)
            m, z, y = _online_softmax_fold(m, z, y, s, V[j:j + 1])
        out[i] = y / z                      # o_i = y / z after the last key
    return out


def causal_block_mask(n: int, chunk_size: int) -> np.ndarray:
    """Which (query block, key block) tiles a causal blocked attention visits.

    Blocks are ``[b * chunk_size, min((b + 1) * chunk_size, n))``; tile ``(i, j)`` is visited when
    key block ``j`` holds at least one key at or before the last query of block ``i`` (``j <= i``).
    Returns a boolean ``(n_blocks, n_blocks)`` array; the fraction of ``True`` entries tends to 1/2.

    Defined in Chapter 1 (The quadratic cost).
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

    Defined in Chapter 1 (The quadratic cost).
    """
    Q, K, V = check_qkv(Q, K, V)
    return _blocked_attention(Q, K, V, check_chunk_size(chunk_size))


def _blocked_attention(Q, K, V, c, log_gates=None):
    """The blocked online softmax of :func:`softmax_attention_chunkwise` on validated float64
    inputs, tiles of ``c x c``. With ``log_gates`` (``(n,)``, Chapter 7's forget gates as logs) the
    score of query ``i`` and key ``j`` gets the bias ``sum_{tau=j+1..i} log_gates[tau]``, taken as a
    difference of sums that start at the tile's first key ``ks`` (never of sums over the whole
    sequence, whose size would swamp a small difference)."""
    n, d_v = V.shape
    out = np.empty((n, d_v))
    for qs in range(0, n, c):               # query block [qs, qe)
        qe = min(qs + c, n)
        q_idx = np.arange(qs, qe)
        # the block's state: running maxima m, sums z, numerators Y
        m = np.full(qe - qs, -np.inf)
        z = np.zeros(qe - qs)
        y = np.zeros((qe - qs, d_v))
        for ks in range(0, qe, c):          # key blocks c' <= c, left to right
            ke = min(ks + c, n)
            s = Q[qs:qe] @ K[ks:ke].T       # one C x C tile of scores
            if log_gates is not None:       # Chapter 7's gates: sums over ks+1..x
                span = np.concatenate([[0.0], np.cumsum(log_gates[ks + 1:qe])])
                s += span[q_idx - ks, None] - span[None, :ke - ks]
            future = np.arange(ks, ke)[None, :] > q_idx[:, None]
            s[future] = -np.inf             # the mask, inside the diagonal tile
            # key 0 is in the first block and visible to all: m is finite after it
            m, z, y = _online_softmax_fold(m, z, y, s, V[ks:ke])   # (ch1-flash)
        out[qs:qe] = y / z[:, None]         # O_[c] = Diag(z)^-1 Y
    return out


def softmax_attention_numerator(Q, K, V) -> np.ndarray:
    """The numerator of softmax attention alone: ``(exp(Q K^T) ⊙ M) V``, no denominator.

    This is the form the article calls the core of softmax attention: the denominator is the same
    product with ``V`` replaced by a column of ones, and an RMSNorm on the output cancels it
    (:func:`rms_norm`). Computed as written (no max subtraction), so large scores overflow to
    ``inf``: it is a definition to reason with, not a stable implementation.

    Defined in Chapter 1 (The quadratic cost).
    """
    Q, K, V = check_qkv(Q, K, V)
    n = Q.shape[0]
    A = np.exp(Q @ K.T) * np.tril(np.ones((n, n)))
    return A @ V


def rms_norm(X, eps: float = 0.0) -> np.ndarray:
    """Row-wise RMSNorm without a learned gain: ``x / sqrt(mean(x**2) + eps)`` for every row of ``X``.

    ``X``: ``(n, d)``. A row of zeros with ``eps = 0`` raises ``ValueError``.

    Defined in Chapter 1 (The quadratic cost).
    """
    X = as_array(X, "X", ("n", "d"))
    if not (eps >= 0 and np.isfinite(eps)):
        raise ValueError(f"eps must be a finite number >= 0; got {eps!r}")
    ms = np.mean(X * X, axis=1, keepdims=True) + eps
    if np.any(ms == 0):
        raise ValueError("X has a row of zeros and eps = 0: its RMS norm is undefined")
    return X / np.sqrt(ms)
