"""Chapter 2 ("Linear attention"): linear attention, its three forms, normalisation, feature maps
and its blurring memory.

All functions follow the book's convention B: ``Q, K`` are ``(n, d_k)``, ``V`` is ``(n, d_v)``, the
state ``S`` is ``(d_v, d_k)``, a write adds ``v_t k_t^T`` and a read is ``o_t = S_t q_t``. Causal,
no implicit scaling, float64.
"""
from __future__ import annotations

import numpy as np

from ._validate import as_array, check_chunk_size, check_gate, check_int, check_positive, check_qkv

__all__ = [
    "linear_attention_recurrent", "linear_attention_parallel", "linear_attention_chunkwise",
    "linear_attention_nocausal", "linear_attention_state",
    "elu_plus_one", "draw_random_features", "random_feature_map", "random_feature_error",
    "normalized_linear_attention",
    "recall_experiment", "recall_error_theory", "recall_vs_length",
]


# --------------------------------------------------------------------------------------------
# The three forms of O = (Q K^T ⊙ M) V
# --------------------------------------------------------------------------------------------
def linear_attention_recurrent(Q, K, V) -> np.ndarray:
    """The RNN form, token by token: ``S_t = S_{t-1} + v_t k_t^T``, ``o_t = S_t q_t`` (``S_0 = 0``).

    O(1) memory in ``n`` (one ``d_v × d_k`` state), O(n d_k d_v) time.

    Defined in Chapter 2 (Linear attention).
    """
    Q, K, V = check_qkv(Q, K, V)
    n, d_k = K.shape
    S = np.zeros((V.shape[1], d_k))      # S_0 = 0, a d_v x d_k matrix
    O = np.empty((n, V.shape[1]))
    for t in range(n):
        S += np.outer(V[t], K[t])        # write: S_t = S_{t-1} + v_t k_t^T
        O[t] = S @ Q[t]                  # read: o_t = S_t q_t (ch2-rnn)
    return O


def linear_attention_parallel(Q, K, V) -> np.ndarray:
    """The matrix form ``O = (Q K^T ⊙ M) V`` (M the causal mask): O(n^2) time and memory.

    Defined in Chapter 2 (Linear attention)."""
    Q, K, V = check_qkv(Q, K, V)
    return np.tril(Q @ K.T) @ V      # tril is ⊙ M (ch2-linear-attn)


def linear_attention_nocausal(Q, K, V, *, order: str = "right") -> np.ndarray:
    """Non-causal linear attention, either ``(Q K^T) V`` (``order="left"``, O(n^2 d)) or
    ``Q (K^T V)`` (``order="right"``, O(n d^2)): equal by associativity of the matrix product.

    Defined in Chapter 2 (Linear attention)."""
    Q, K, V = check_qkv(Q, K, V)
    if order == "left":
        return (Q @ K.T) @ V
    if order == "right":
        return Q @ (K.T @ V)
    raise ValueError(f"order must be 'left' or 'right'; got {order!r}")


def linear_attention_chunkwise(Q, K, V, *, chunk_size: int = 64) -> np.ndarray:
    """Chunk by chunk: inside a chunk the parallel form, across chunks the state.

    For a chunk ``c`` with rows ``Q_c, K_c, V_c`` and the state ``S`` of all earlier chunks::

        O_c = Q_c S^T + (Q_c K_c^T ⊙ M) V_c,      S <- S + V_c^T K_c

    O(n C d + n d^2) time for chunk size ``C``; ``chunk_size`` need not divide ``n``.

    Defined in Chapter 2 (Linear attention).
    """
    Q, K, V = check_qkv(Q, K, V)
    C = check_chunk_size(chunk_size)
    n, d_k = K.shape
    S = np.zeros((V.shape[1], d_k))      # the state entering the first chunk
    O = np.empty((n, V.shape[1]))
    for s in range(0, n, C):             # chunk [s, s+C), the last maybe shorter
        q, k, v = Q[s:s + C], K[s:s + C], V[s:s + C]
        # read the earlier chunks from S, plus the parallel form inside the chunk
        O[s:s + C] = q @ S.T + np.tril(q @ k.T) @ v      # (ch2-chunk), line 1
        S += v.T @ k                                     # (ch2-chunk), line 2
    return O


def linear_attention_state(K, V) -> np.ndarray:
    """The final state ``S_n = sum_j v_j k_j^T = V^T K`` (``(d_v, d_k)``).

    Defined in Chapter 2 (Linear attention)."""
    K = as_array(K, "K", ("n", "d_k"))
    V = as_array(V, "V", (K.shape[0], "d_v"))
    return V.T @ K


# --------------------------------------------------------------------------------------------
# Feature maps and the normalised (kernelised) form
# --------------------------------------------------------------------------------------------
def elu_plus_one(X) -> np.ndarray:
    """``phi(x) = elu(x) + 1`` elementwise (x + 1 for x > 0, exp(x) otherwise): positive everywhere.

    The feature map of Katharopoulos et al. (2020). ``X``: ``(n, d)``.

    Defined in Chapter 2 (Linear attention).
    """
    X = as_array(X, "X", ("n", "d"))
    return np.where(X > 0, X + 1.0, np.exp(np.minimum(X, 0.0)))


def draw_random_features(m: int, d: int, *, seed: int = 0, orthogonal: bool = False) -> np.ndarray:
    """``m`` Gaussian projection directions ``w_r ~ N(0, I_d)`` as an ``(m, d)`` array.

    ``orthogonal=True`` draws them in blocks of ``d`` mutually orthogonal directions whose norms
    are again chi-distributed (Performer's variance reduction).

    Defined in Chapter 2 (Linear attention).
    """
    for name, val in (("m", m), ("d", d)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < 1:
            raise ValueError(f"{name} must be a positive integer; got {val!r}")
    rng = np.random.default_rng(seed)
    if not orthogonal:
        return rng.standard_normal((m, d))
    blocks = []
    for _ in range(-(-m // d)):
        q, r = np.linalg.qr(rng.standard_normal((d, d)))
        q = q * np.sign(np.diag(r))[None, :]           # sign fix: makes q Haar-distributed
        norms = np.linalg.norm(rng.standard_normal((d, d)), axis=1)
        blocks.append(q.T * norms[:, None])
    return np.concatenate(blocks)[:m]


def random_feature_map(X, omega) -> np.ndarray:
    """Positive random features (Performer, FAVOR+):
    ``phi(x) = exp(W x - |x|^2 / 2) / sqrt(m)`` with ``W = omega`` of shape ``(m, d)``.

    For ``w ~ N(0, I)``, ``E[exp(w.q - |q|^2/2) exp(w.k - |k|^2/2)] = exp(q.k)``, so
    ``phi(Q) phi(K)^T`` is an unbiased Monte-Carlo estimate of ``exp(Q K^T)``. Returns ``(n, m)``.

    Defined in Chapter 2 (Linear attention).
    """
    X = as_array(X, "X", ("n", "d"))
    omega = as_array(omega, "omega", ("m", X.shape[1]))
    m = omega.shape[0]
    return np.exp(X @ omega.T - 0.5 * np.sum(X * X, axis=1, keepdims=True)) / np.sqrt(m)


def random_feature_error(Q, K, feature_counts, *, n_seeds: int = 8, seed: int = 0,
                         orthogonal: bool = False) -> np.ndarray:
    """Mean relative error ``|phi(Q) phi(K)^T - exp(Q K^T)|_F / |exp(Q K^T)|_F`` for each feature
    count in ``feature_counts``, averaged over ``n_seeds`` independent draws. Returns an array.

    For an unbiased Monte-Carlo estimate the error falls like ``1/sqrt(m)``.

    Defined in Chapter 2 (Linear attention).
    """
    Q = as_array(Q, "Q", ("n", "d"))
    K = as_array(K, "K", ("n_k", Q.shape[1]))
    counts = [int(m) for m in np.atleast_1d(feature_counts)]
    if any(m < 1 for m in counts):
        raise ValueError(f"feature_counts must be positive integers; got {feature_counts!r}")
    n_seeds = check_int(n_seeds, "n_seeds", 1)
    exact = np.exp(Q @ K.T)
    out = []
    for m in counts:
        errs = []
        for s in range(n_seeds):
            W = draw_random_features(m, Q.shape[1], seed=seed + 7919 * s + m, orthogonal=orthogonal)
            approx = random_feature_map(Q, W) @ random_feature_map(K, W).T
            errs.append(np.linalg.norm(approx - exact) / np.linalg.norm(exact))
        out.append(np.mean(errs))
    return np.array(out)


def normalized_linear_attention(Q, K, V, feature_map=None) -> np.ndarray:
    """The original, normalised linear attention (Katharopoulos et al., 2020)::

        o_t = sum_{j<=t} (phi(q_t).phi(k_j)) v_j / sum_{j<=t} phi(q_t).phi(k_j)

    ``feature_map`` is a callable applied to ``Q`` and ``K`` (``None``: the identity, in which case
    the denominator can be zero or negative and the output blows up: that is why the original
    needs a positive ``phi``). The denominator is the numerator with ``V`` replaced by ones.

    Defined in Chapter 2 (Linear attention).
    """
    Q, K, V = check_qkv(Q, K, V)
    if feature_map is not None:
        if not callable(feature_map):
            raise ValueError(f"feature_map must be a callable or None; got {feature_map!r}")
        Q, K = np.asarray(feature_map(Q), dtype=np.float64), np.asarray(feature_map(K), dtype=np.float64)
    num = linear_attention_chunkwise(Q, K, V)
    den = linear_attention_chunkwise(Q, K, np.ones((V.shape[0], 1)))
    with np.errstate(divide="ignore", invalid="ignore"):
        return num / den


# --------------------------------------------------------------------------------------------
# "Memory blurs": store n pairs, read one back
# --------------------------------------------------------------------------------------------
def _gate_weights(n: int, gamma) -> np.ndarray:
    """``w_j = prod_{tau=j+1..n} gamma_tau`` (the weight of pair ``j`` in ``S_n``), via log sums."""
    if gamma is None:
        return np.ones(n)
    g = np.asarray(gamma, dtype=np.float64)
    if g.ndim == 0:
        g = check_gate(float(g), "gamma", ())
        return np.exp(np.log(g) * np.arange(n - 1, -1, -1))
    g = check_gate(g, "gamma", (n,))
    logs = np.log(g)
    suffix = np.concatenate([np.cumsum(logs[::-1])[::-1][1:], [0.0]])   # sum_{tau > j} log gamma_tau
    return np.exp(suffix)


def recall_experiment(n: int, d_k: int = 64, d_v: int = 64, *, gamma=None, seed: int = 0) -> dict:
    """Write ``n`` random pairs ``(k_j, v_j)`` into one state and read each back with its own key.

    Keys are random unit vectors in ``R^{d_k}``, values standard normal. The state is
    ``S_n = sum_j w_j v_j k_j^T`` with ``w_j = prod_{tau=j+1..n} gamma_tau`` (``w = 1`` without decay;
    ``gamma`` is ``None``, a constant in ``(0, 1]`` or an ``(n,)`` array). Reading with ``k_j`` gives
    ``r_j = S_n k_j = w_j v_j + sum_{i != j} w_i (k_i.k_j) v_i``: the stored value plus crosstalk.

    Returns a dict of ``(n,)`` arrays indexed by ``j``: ``age`` (``n - j``, 0 for the newest),
    ``cosine`` (``cos(r_j, v_j)``) and ``rel_error`` (``|r_j / w_j - v_j| / |v_j|``: crosstalk
    relative to the signal, after undoing the known decay).

    Defined in Chapter 3 (Forget gates).
    """
    for name, val in (("n", n), ("d_k", d_k), ("d_v", d_v)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < 1:
            raise ValueError(f"{name} must be a positive integer; got {val!r}")
    rng = np.random.default_rng(seed)
    K = rng.standard_normal((n, d_k))
    K /= np.linalg.norm(K, axis=1, keepdims=True)
    V = rng.standard_normal((n, d_v))
    w = _gate_weights(n, gamma)
    S = (V * w[:, None]).T @ K                         # sum_j w_j v_j k_j^T
    R = K @ S.T                                        # row j: r_j = S k_j
    cos = np.sum(R * V, axis=1) / (np.linalg.norm(R, axis=1) * np.linalg.norm(V, axis=1))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rel = np.linalg.norm(R / w[:, None] - V, axis=1) / np.linalg.norm(V, axis=1)
    return {"age": n - 1 - np.arange(n), "cosine": cos, "rel_error": rel}


def recall_error_theory(n: int, d_k: int, *, gamma=None) -> np.ndarray:
    """The expected recall error of :func:`recall_experiment` for each stored pair ``j``.

    With random unit keys, ``E[(k_i.k_j)^2] = 1/d_k``, so the crosstalk-to-signal ratio is
    ``rel_error_j ≈ sqrt(sum_{i != j} (w_i / w_j)^2 / d_k)``; without decay this is
    ``sqrt((n - 1) / d_k)`` for every ``j``: it grows without bound as ``n`` grows.

    Defined in Chapter 2 (Linear attention).
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive integer; got {n!r}")
    check_positive(d_k, "d_k", ())
    w = _gate_weights(n, gamma)
    logw = np.log(w)
    # sum_{i != j} exp(2 (log w_i - log w_j)), computed relative to the largest weight
    top = logw.max()
    total = np.sum(np.exp(2 * (logw - top)))
    with np.errstate(over="ignore"):
        ratio = (total - np.exp(2 * (logw - top))) * np.exp(2 * (top - logw))
    return np.sqrt(np.maximum(ratio, 0.0) / d_k)


def recall_vs_length(lengths, d_k: int = 64, d_v: int = 64, *, gamma=None, n_seeds: int = 4,
                     seed: int = 0) -> dict:
    """Mean recall ``rel_error`` and ``cosine`` over all stored pairs and ``n_seeds`` draws, for each
    ``n`` in ``lengths`` (see :func:`recall_experiment`). Returns ``{"n", "rel_error", "cosine"}``.

    Defined in Chapter 2 (Linear attention)."""
    ns = [int(x) for x in np.atleast_1d(lengths)]
    n_seeds = check_int(n_seeds, "n_seeds", 1)
    rel, cos = [], []
    for n in ns:
        runs = [recall_experiment(n, d_k, d_v, gamma=gamma, seed=seed + 1000 * s + n) for s in range(n_seeds)]
        rel.append(np.mean([np.mean(r["rel_error"]) for r in runs]))
        cos.append(np.mean([np.mean(r["cosine"]) for r in runs]))
    return {"n": np.array(ns), "rel_error": np.array(rel), "cosine": np.array(cos)}
