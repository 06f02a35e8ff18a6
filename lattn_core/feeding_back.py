"""Chapters 7 and 8: feeding back. Linear attention's ideas carried back into softmax attention.

Chapter 7, in code:

* the **KV cache** of real model shapes against the state of a linear attention of the same shapes
  (:data:`MODEL_SHAPES`, :func:`kv_cache_size`, :func:`linear_state_size`,
  :func:`cache_state_crossover`);
* the article's **table of attention matrices** built as explicit ``n x n`` matrices from their
  formulas, in NumPy or on SymPy matrices (:func:`attention_matrices`), and the recurrence they
  come from, run on SymPy matrices (:func:`symbolic_recurrence`);
* the **kernel trick** ``exp(Q K^T) = phi(Q) phi(K)^T`` with a truncated Taylor feature map
  (:func:`taylor_feature_map`, :func:`taylor_feature_count`, :func:`taylor_feature_error`,
  :func:`taylor_remainder_bound`; Chapter 2's random features are
  :func:`lattn_core.random_feature_map`);
* **FoX**, softmax attention with the forget gate's bias ``log Γ`` (Lin et al., 2025), in three
  forms (:func:`fox_attention_recurrent`, :func:`fox_attention_parallel`,
  :func:`fox_attention_chunkwise`; :func:`fox_attention` is the API name) and as a gated linear
  attention on features (:func:`feature_fox_attention`); **ALiBi** (Press et al., 2022) as its
  constant-gate case (:func:`alibi_slopes`, :func:`alibi_gates`, :func:`alibi_bias`).

Every exponent the FoX functions add to a score is a sum of log gates, never the log of a product
that may already have underflowed: ``log Γ`` comes from :func:`lattn_core.log_decay_mask`
(Chapter 3), the blocked form takes the sums inside the span it visits, and the token loop adds
``log gamma_t`` to every cached token as it goes. The row softmax and the online-softmax step are
Chapter 1's (:func:`lattn_core.row_softmax`).

Chapter 8:

* **DeltaFormer** (Zhong et al., 2025), ``P (I + Diag(beta) B)^{-1} V`` with ``P``, ``B`` the
  exponentials (or row softmaxes) of ``Q K^T`` and ``K K^T``, in three forms
  (:func:`deltaformer_recurrent`, :func:`deltaformer_parallel`, :func:`deltaformer_chunkwise`;
  :func:`deltaformer` is the API name), its matrices (:func:`deltaformer_matrices`), the delta
  attention it shares with DeltaNet on finite features (:func:`delta_attention`), the ``q·k``
  variant (:func:`deltaformer_qk`), the Neumann series of the inverse and where it ends
  (:func:`neumann_terms`, :func:`neumann_errors`, :func:`dependency_chain_length`), and the work
  of one layer with and without shared key-value heads (:func:`deltaformer_work`).

The article names DeltaFormer's two matrices ``A`` and ``B``; the book calls the first ``P``, as
every attention matrix of queries against keys is called (book/notation.md), and keeps ``B``, the
delta rule's strictly lower matrix of Chapter 6 with ``exp`` applied to the scores. Functions that
take the pair as arguments keep the parameter names ``A, B``.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from ._validate import as_array, check_chunk_size, check_gate, check_int, check_qkv, check_symbolic_finite
from .delta import forward_substitution
from .forget_gates import decay_attention_chunkwise, decay_mask, log_decay_mask
from .masks import causal_mask, strict_causal_mask
from .softmax import _blocked_attention, _online_softmax_fold, attention_scores, row_softmax

__all__ = [
    "ModelShape", "MODEL_SHAPES", "kv_cache_size", "linear_state_size", "cache_state_crossover",
    "attention_matrices", "symbolic_recurrence",
    "taylor_feature_map", "taylor_feature_count", "taylor_feature_error", "taylor_remainder_bound",
    "fox_attention", "fox_attention_recurrent", "fox_attention_parallel", "fox_attention_chunkwise",
    "fox_attention_matrix", "feature_fox_attention",
    "alibi_slopes", "alibi_gates", "alibi_bias",
    "deltaformer", "deltaformer_recurrent", "deltaformer_parallel", "deltaformer_chunkwise",
    "deltaformer_matrices", "delta_attention", "deltaformer_qk", "neumann_terms",
    "neumann_errors", "dependency_chain_length", "deltaformer_work",
]


# --------------------------------------------------------------------------------------------
# KV cache against state
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelShape:
    """The attention shape of a published model: layers, query heads, key-value heads, head width,
    and the key of its paper in ``book/references.bib``. ``attention`` says which sharing it uses.

    Defined in Chapter 7 (Feeding back)."""

    name: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    cite: str

    @property
    def attention(self) -> str:
        """``"MHA"`` (one key-value head per query head), ``"MQA"`` (one for all), else ``"GQA"``."""
        if self.kv_heads == self.heads:
            return "MHA"
        return "MQA" if self.kv_heads == 1 else "GQA"


#: Published shapes (from each model's paper; Llama 2's key-value heads as released).
MODEL_SHAPES = (
    ModelShape("GPT-3 175B", 96, 96, 96, 128, "brown2020language"),
    ModelShape("Llama-2-7B", 32, 32, 32, 128, "touvron2023llama"),
    ModelShape("Llama-2-70B", 80, 64, 8, 128, "touvron2023llama"),
    ModelShape("Llama-3-8B", 32, 32, 8, 128, "grattafiori2024llama"),
    ModelShape("Falcon-7B", 32, 71, 1, 64, "almazrouei2023falcon"),
    ModelShape("PaLM 540B", 118, 48, 1, 256, "chowdhery2023palm"),
)


def kv_cache_size(layers: int, kv_heads: int, head_dim: int, n: int, *, batch: int = 1,
                  bytes_per_number: int = 2) -> int:
    """Bytes of the KV cache after ``n`` tokens: a key and a value of ``head_dim`` numbers per token,
    per key-value head and per layer, ``2 · layers · kv_heads · head_dim · n · batch`` numbers
    (``bytes_per_number = 2``: 16-bit). Grows linearly in ``n``.

    Defined in Chapter 7 (Feeding back)."""
    for name, val in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim),
                      ("batch", batch), ("bytes_per_number", bytes_per_number)):
        check_int(val, name, 1)
    check_int(n, "n", 0)
    return 2 * layers * kv_heads * head_dim * n * batch * bytes_per_number


def linear_state_size(layers: int, heads: int, d_k: int, d_v: int, *, batch: int = 1,
                      bytes_per_number: int = 2) -> int:
    """Bytes of the states of a linear attention with the same layers and heads: one ``d_v x d_k``
    state per head and layer, ``layers · heads · d_k · d_v · batch`` numbers, whatever ``n``.

    Defined in Chapter 7 (Feeding back)."""
    for name, val in (("layers", layers), ("heads", heads), ("d_k", d_k), ("d_v", d_v),
                      ("batch", batch), ("bytes_per_number", bytes_per_number)):
        check_int(val, name, 1)
    return layers * heads * d_k * d_v * batch * bytes_per_number


def cache_state_crossover(shape: ModelShape) -> float:
    """The number of tokens whose KV cache holds as many numbers as the linear-attention state of
    the same shape: ``heads · head_dim / (2 · kv_heads)`` (from ``kv_cache_size = linear_state_size``
    with ``d_k = d_v = head_dim``; the layers cancel).

    Defined in Chapter 7 (Feeding back)."""
    if not isinstance(shape, ModelShape):
        raise ValueError(f"shape must be a ModelShape; got {type(shape).__name__}")
    return shape.heads * shape.head_dim / (2 * shape.kv_heads)


# --------------------------------------------------------------------------------------------
# The table of attention matrices
# --------------------------------------------------------------------------------------------
#: The rows of the article's table, in its order, with the formula each key stands for.
TABLE_ROWS = {
    "softmax": "exp(QK^T) ⊙ M",
    "linear": "QK^T ⊙ M",
    "gated": "QK^T ⊙ Γ",
    "deltanet": "(QK^T ⊙ M)(I + KK^T ⊙ M^-)^{-1}",
    "gated_deltanet": "((QK^T ⊙ M)(I + KK^T ⊙ M^-)^{-1}) ⊙ Γ",
    "gated_deltanet_inner": "(QK^T ⊙ Γ)(I + KK^T ⊙ Γ^-)^{-1}",
}


def _is_sympy(x) -> bool:
    try:
        import sympy as sp
    except ImportError:  # pragma: no cover - sympy is in requirements.txt
        return False
    return isinstance(x, sp.MatrixBase)


def attention_matrices(Q, K, gamma) -> dict:
    """The article's table of attention matrices, each built from its formula as an ``n x n``
    matrix ``P`` such that the model's output is ``P V`` (keys as in :data:`TABLE_ROWS`):

    ``softmax``: ``exp(Q K^T) ⊙ M`` (the numerator; divide each row by its sum for the
    probabilities); ``linear``: ``Q K^T ⊙ M``; ``gated``: ``Q K^T ⊙ Γ``; ``deltanet``:
    ``(Q K^T ⊙ M)(I + K K^T ⊙ M^-)^{-1}``; ``gated_deltanet``: that matrix ``⊙ Γ``;
    ``gated_deltanet_inner``: ``(Q K^T ⊙ Γ)(I + K K^T ⊙ Γ^-)^{-1}`` with ``Γ^- = Γ - I``.
    The delta rows have ``beta = 1`` (the article's table; Chapter 5 folds ``beta`` into ``k, v``).

    NumPy: ``Q``, ``K`` ``(n, d_k)``, ``gamma`` ``(n,)`` in ``(0, 1]``; the inverses are applied by
    forward substitution, ``Γ`` is :func:`lattn_core.decay_mask`. SymPy: ``Q``, ``K`` SymPy
    matrices and ``gamma`` a sequence of ``n`` expressions; ``Γ`` is then the products themselves
    and the inverses are SymPy's, so the table can be checked symbolically. The ``softmax`` row is
    ``exp`` as written (it overflows for large scores: a formula to compare, not a stable form).

    Defined in Chapter 7 (Feeding back).
    """
    if _is_sympy(Q) or _is_sympy(K):
        import sympy as sp
        Q, K = sp.Matrix(Q), sp.Matrix(K)
        n = Q.shape[0]
        if K.shape != Q.shape or len(gamma) != n:
            raise ValueError(f"Q and K must have the same shape and gamma n = {n} entries; got "
                             f"{Q.shape}, {K.shape} and {len(gamma)}")
        M = sp.Matrix(n, n, lambda i, j: 1 if j <= i else 0)
        M_strict = sp.Matrix(n, n, lambda i, j: 1 if j < i else 0)
        G = sp.Matrix(n, n, lambda i, j: sp.prod(list(gamma[j + 1:i + 1])) if j <= i else 0)
        I = sp.eye(n)
        had = lambda a, b: a.multiply_elementwise(b)
        mm = lambda a, b: a * b
        exp = lambda a: a.applyfunc(sp.exp)
        inv_times = lambda A, rhs: A.inv() * rhs
        QK, KK = Q * K.T, K * K.T
    else:
        K = as_array(K, "K", ("n", "d_k"))
        n = K.shape[0]
        Q = as_array(Q, "Q", K.shape)
        G = decay_mask(check_gate(gamma, "gamma", (n,)))
        M, M_strict, I = causal_mask(n), strict_causal_mask(n), np.eye(n)
        had = lambda a, b: a * b
        mm = lambda a, b: a @ b
        exp = np.exp
        # A = I + (strictly lower): forward substitution applies A^{-1}, no inverse formed
        inv_times = lambda A, rhs: forward_substitution(A - I, rhs)
        QK, KK = Q @ K.T, K @ K.T
    # The table, row by row: had is the entrywise product ⊙, mm the matrix
    # product, inv_times(I + X, R) applies (I + X)^{-1} to R; M and M_strict
    # are the masks M and M^-, G is the decay mask Γ.
    # DeltaNet: (QK^T ⊙ M)(I + KK^T ⊙ M^-)^{-1}
    delta = mm(had(QK, M), inv_times(I + had(KK, M_strict), I))
    return {
        "softmax": had(exp(QK), M),          # exp(QK^T) ⊙ M
        "linear": had(QK, M),                # QK^T ⊙ M
        "gated": had(QK, G),                 # QK^T ⊙ Γ
        "deltanet": delta,
        "gated_deltanet": had(delta, G),     # DeltaNet's matrix, then ⊙ Γ
        "gated_deltanet_inner":              # Γ inside both factors
            mm(had(QK, G), inv_times(I + had(KK, G - I), I)),
    }


def symbolic_recurrence(Q, K, V, gamma=None, *, delta: bool = False):
    """The recurrences behind the table, run token by token on SymPy matrices::

        S_t = gamma_t S_{t-1} (I - k_t k_t^T) + v_t k_t^T     (delta=True: the delta rule, beta = 1)
        S_t = gamma_t S_{t-1} + v_t k_t^T                     (delta=False)
        o_t = S_t q_t

    ``gamma=None`` means no gate (``gamma_t = 1``): linear attention and DeltaNet; with ``gamma``
    (``n`` expressions) the gated forms. ``Q``, ``K``: ``(n, d_k)``; ``V``: ``(n, d_v)``.
    Returns ``O`` as an ``(n, d_v)`` SymPy matrix, entries expanded. Symbols may stand for
    anything; numeric NaN or infinities in any input raise.

    Defined in Chapter 7 (Feeding back).
    """
    import sympy as sp
    Q, K, V = sp.Matrix(Q), sp.Matrix(K), sp.Matrix(V)
    n, d_k = K.shape
    if Q.shape != K.shape or V.shape[0] != n:
        raise ValueError(f"Q, K must be (n, d_k) and V (n, d_v) with one n; got {Q.shape}, "
                         f"{K.shape}, {V.shape}")
    for M, name in ((Q, "Q"), (K, "K"), (V, "V")):
        check_symbolic_finite(M, name)
    if gamma is not None:
        if len(gamma) != n:
            raise ValueError(f"gamma must hold n = {n} entries; got {len(gamma)}")
        gamma = check_symbolic_finite(list(gamma), "gamma")
    S = sp.zeros(V.shape[1], d_k)
    rows = []
    for t in range(n):
        k, v, q = K[t, :].T, V[t, :].T, Q[t, :].T
        g = 1 if gamma is None else gamma[t]
        S = g * S * (sp.eye(d_k) - k * k.T) + v * k.T if delta else g * S + v * k.T
        rows.append((S * q).T)
    return sp.Matrix.vstack(*rows).applyfunc(sp.expand)


# --------------------------------------------------------------------------------------------
# The kernel trick: exp(q.k) as an inner product of (infinitely many) features
# --------------------------------------------------------------------------------------------
def taylor_feature_count(d: int, order: int, *, symmetric: bool = False) -> int:
    """The number of features of :func:`taylor_feature_map`: ``1 + d + d^2 + ... + d^order``.

    ``symmetric=True`` counts the distinct monomials instead (a tensor power repeats each monomial
    of degree ``s`` in every order of its factors): ``C(d + order, order)``, still ``~ d^order /
    order!`` for large ``d``.

    Defined in Chapter 7 (Feeding back).
    """
    d, order = check_int(d, "d", 1), check_int(order, "order", 0)
    if symmetric:
        return math.comb(d + order, order)
    return sum(d ** s for s in range(order + 1))


def taylor_feature_map(X, order: int) -> np.ndarray:
    """The Taylor features of ``exp``, truncated at ``order``::

        phi(x) = [1, x, x⊗x / sqrt(2!), ..., x^{⊗order} / sqrt(order!)]

    so that ``phi(q).phi(k) = sum_{s <= order} (q.k)^s / s!``, the Taylor polynomial of
    ``exp(q.k)`` (``⟨x^{⊗s}, y^{⊗s}⟩ = (x.y)^s``). ``X``: ``(n, d)``; returns
    ``(n, taylor_feature_count(d, order))``. The exact map (``order = ∞``) has infinitely many
    features: this is the article's ``phi`` with ``exp(Q K^T) = phi(Q) phi(K)^T``.

    Defined in Chapter 7 (Feeding back).
    """
    X = as_array(X, "X", ("n", "d"))
    order = check_int(order, "order", 0)
    n = X.shape[0]
    power = np.ones((n, 1))                      # x^{⊗0}
    blocks = [power]
    for s in range(1, order + 1):
        power = (power[:, :, None] * X[:, None, :]).reshape(n, -1)     # x^{⊗s}
        blocks.append(power / math.sqrt(math.factorial(s)))
    return np.concatenate(blocks, axis=1)


def taylor_remainder_bound(score_max: float, order: int) -> float:
    """An upper bound on ``|exp(s) - sum_{r <= order} s^r / r!|`` over ``|s| <= score_max``:
    Lagrange's remainder, ``score_max^{order+1} exp(score_max) / (order + 1)!``.

    Defined in Chapter 7 (Feeding back)."""
    score_max = float(as_array(score_max, "score_max", ()))
    if not score_max >= 0:
        raise ValueError(f"score_max must be a finite number >= 0; got {score_max!r}")
    order = check_int(order, "order", 0)
    return score_max ** (order + 1) * math.exp(score_max) / math.factorial(order + 1)


def taylor_feature_error(Q, K, orders) -> np.ndarray:
    """Relative error ``|phi(Q) phi(K)^T - exp(Q K^T)|_F / |exp(Q K^T)|_F`` of the truncated Taylor
    features, one value per entry of ``orders``. Deterministic: no sampling, unlike Chapter 2's
    :func:`lattn_core.random_feature_error`.

    Defined in Chapter 7 (Feeding back)."""
    Q = as_array(Q, "Q", ("n", "d"))
    K = as_array(K, "K", ("n_k", Q.shape[1]))
    orders = [check_int(int(z) if isinstance(z, np.integer) else z, "orders entry", 0)
              for z in np.atleast_1d(orders).tolist()]
    exact = np.exp(Q @ K.T)
    return np.array([np.linalg.norm(taylor_feature_map(Q, z) @ taylor_feature_map(K, z).T - exact)
                     / np.linalg.norm(exact) for z in orders])


# --------------------------------------------------------------------------------------------
# FoX: softmax attention with a forget gate, three forms
# --------------------------------------------------------------------------------------------
def _fox_inputs(Q, K, V, gamma):
    Q, K, V = check_qkv(Q, K, V)
    return Q, K, V, np.log(check_gate(gamma, "gamma", (K.shape[0],)))


def fox_attention_matrix(Q, K, gamma) -> np.ndarray:
    """FoX's attention probabilities ``softmax(Q K^T + log Γ)``, row by row over ``j <= i``:
    ``(n, n)``, zero above the diagonal. ``log Γ`` is :func:`lattn_core.log_decay_mask` (finite
    on and below the diagonal for any gates in ``(0, 1]``).

    Defined in Chapter 7 (Feeding back)."""
    Q, K, _, _ = _fox_inputs(Q, K, K, gamma)
    return row_softmax(attention_scores(Q, K) + log_decay_mask(gamma))


def fox_attention_parallel(Q, K, V, gamma) -> np.ndarray:
    """The matrix form: ``O = softmax(Q K^T + log Γ) V`` (:func:`fox_attention_matrix`), i.e.
    ``o_t = sum_{j<=t} exp(q_t.k_j) Γ_tj v_j / sum_{j<=t} exp(q_t.k_j) Γ_tj``. O(n^2) memory.

    Defined in Chapter 7 (Feeding back)."""
    Q, K, V, _ = _fox_inputs(Q, K, V, gamma)
    return fox_attention_matrix(Q, K, gamma) @ V


def fox_attention(Q, K, V, gamma) -> np.ndarray:
    """FoX, the Forgetting Transformer's attention (Lin et al., 2025): softmax attention whose
    score of query ``t`` and key ``j`` gets the forget gate's bias ``log Γ_tj = sum_{tau=j+1..t}
    log gamma_tau``::

        o_t = sum_{j<=t} exp(q_t.k_j) Γ_tj v_j / sum_{j<=t} exp(q_t.k_j) Γ_tj

    ``gamma``: ``(n,)`` in ``(0, 1]``; a constant ``gamma`` is ALiBi (:func:`alibi_gates`). Computed
    in log space (:func:`fox_attention_parallel`): finite for gates near 0 and long sequences.

    Defined in Chapter 7 (Feeding back).
    """
    return fox_attention_parallel(Q, K, V, gamma)


def fox_attention_recurrent(Q, K, V, gamma) -> np.ndarray:
    """FoX as it decodes, one token at a time. The cache holds, for every earlier token ``j``, its
    key, its value and its log decay ``a_j = log Γ_tj``. Step ``t`` adds ``log gamma_t`` to every
    cached ``a_j`` (the forget gate acting on the cache, as it acts on a linear-attention state),
    appends ``(k_t, v_t, a_t = 0)``, and reads the cache with an online softmax over the scores
    ``q_t.k_j + a_j``: a running max, numerator and denominator, O(d_v) memory besides the cache.
    O(n^2) Python steps: the definition, not a fast form.

    Defined in Chapter 7 (Feeding back).
    """
    Q, K, V, logg = _fox_inputs(Q, K, V, gamma)
    n, d_v = V.shape
    out = np.empty((n, d_v))
    decay = np.zeros(n)                      # a_j for the cached tokens j < t
    for t in range(n):
        decay[:t] += logg[t]                 # every cached token decays by gamma_t
        decay[t] = 0.0                       # token t joins the cache undecayed
        m, z, y = np.float64(-np.inf), 0.0, np.zeros(d_v)
        for j in range(t + 1):
            s = Q[t] @ K[j:j + 1].T + decay[j]
            m, z, y = _online_softmax_fold(m, z, y, s, V[j:j + 1])
        out[t] = y / z
    return out


def fox_attention_chunkwise(Q, K, V, gamma, *, chunk_size: int = 64) -> np.ndarray:
    """FoX blocked as FlashAttention runs it (Chapter 1's :func:`lattn_core.softmax_attention_chunkwise`
    with one more term per tile): query and key blocks of ``chunk_size``, an online softmax over the
    key blocks, and each tile's bias ``sum_{tau=j+1..i} log gamma_tau`` taken as a difference of
    sums that start at the tile's first key (so near the diagonal it is a difference of small
    numbers). Only ``chunk_size x chunk_size`` scores exist at a time.

    Defined in Chapter 7 (Feeding back)."""
    Q, K, V, logg = _fox_inputs(Q, K, V, gamma)
    return _blocked_attention(Q, K, V, check_chunk_size(chunk_size), logg)


def feature_fox_attention(Q, K, V, gamma, feature_map) -> np.ndarray:
    """The article's substitution: gated linear attention on features ``phi(Q)``, ``phi(K)``,
    normalised::

        o_t = [(phi(Q) phi(K)^T ⊙ Γ) V]_t / [(phi(Q) phi(K)^T ⊙ Γ) 1]_t

    computed as an RNN (:func:`lattn_core.decay_attention_chunkwise` on ``[V, 1]``) with a state of
    ``p x (d_v + 1)`` numbers for ``p`` features. With ``phi(Q) phi(K)^T = exp(Q K^T)`` exactly it
    is :func:`fox_attention`; a truncated ``feature_map`` (a callable, ``(n, d) -> (n, p)``)
    approximates it.

    Defined in Chapter 7 (Feeding back).
    """
    Q, K, V, _ = _fox_inputs(Q, K, V, gamma)
    if not callable(feature_map):
        raise ValueError(f"feature_map must be a callable (n, d) -> (n, p); got {feature_map!r}")
    fQ = np.asarray(feature_map(Q), dtype=np.float64)
    fK = np.asarray(feature_map(K), dtype=np.float64)
    if fQ.ndim != 2 or fQ.shape[0] != Q.shape[0] or fK.shape != fQ.shape:
        raise ValueError(f"feature_map must map (n, d) to (n, p) for Q and K alike; got {fQ.shape} "
                         f"and {fK.shape}")
    ones = np.ones((V.shape[0], 1))
    both = decay_attention_chunkwise(fQ, fK, np.concatenate([V, ones], axis=1), gamma)
    return both[:, :-1] / both[:, -1:]


# --------------------------------------------------------------------------------------------
# ALiBi: the constant gate
# --------------------------------------------------------------------------------------------
def alibi_slopes(n_heads: int) -> np.ndarray:
    """ALiBi's slopes for ``n_heads`` heads (Press et al., 2022): for a power of two ``H`` the
    geometric sequence ``2^(-8/H), 2^(-16/H), ..., 2^(-8)``; otherwise the slopes of the largest
    power of two below ``H``, then every other slope of the next power of two, as the paper's code
    does (in that order). Returns ``(n_heads,)``.

    Defined in Chapter 7 (Feeding back)."""
    H = check_int(n_heads, "n_heads", 1)
    geometric = lambda h: 2.0 ** (-8.0 * np.arange(1, h + 1) / h)
    base = 2 ** int(math.floor(math.log2(H)))
    if base == H:
        return geometric(H)
    return np.concatenate([geometric(base), geometric(2 * base)[0::2][:H - base]])


def _check_slope(slope) -> float:
    if isinstance(slope, bool) or not isinstance(slope, numbers.Real) or not np.isfinite(slope) \
            or slope < 0:
        raise ValueError(f"slope must be a finite number >= 0; got {slope!r}")
    return float(slope)


def alibi_gates(n: int, slope: float) -> np.ndarray:
    """ALiBi as a forget gate: the constant ``gamma_t = exp(-slope)`` for ``n`` tokens, so that
    ``log Γ_ij = -slope (i - j)``, ALiBi's bias (:func:`alibi_bias`). ``slope >= 0`` (0: no bias).

    Defined in Chapter 7 (Feeding back)."""
    return np.full(check_int(n, "n", 1), math.exp(-_check_slope(slope)))


def alibi_bias(n: int, slope: float) -> np.ndarray:
    """ALiBi's bias as its paper defines it: ``-slope · (i - j)`` for ``j <= i``, ``-inf`` above
    (the causal mask), ``(n, n)``. Added to ``Q K^T`` before the softmax.

    Defined in Chapter 7 (Feeding back)."""
    n, slope = check_int(n, "n", 1), _check_slope(slope)
    i, j = np.indices((n, n))
    return np.where(j <= i, -slope * (i - j), -np.inf)


# --------------------------------------------------------------------------------------------
# DeltaFormer: the delta rule inside softmax attention (Chapter 8)
# --------------------------------------------------------------------------------------------
def _masked_exp_rows(S, allowed, normalize: bool) -> np.ndarray:
    """``exp(S)`` on the ``allowed`` entries (0 elsewhere), or, with ``normalize``, the softmax of
    each row over its allowed entries (a row with none is all zeros: the first row of ``B``).
    The softmax subtracts each row's largest allowed score first, so it never overflows."""
    S = np.where(allowed, S, -np.inf)
    if not normalize:
        with np.errstate(over="raise"):
            return np.exp(S)
    out = np.zeros_like(S)
    rows = allowed.any(axis=1)
    if rows.any():
        out[rows] = row_softmax(S[rows])
    return out


def _deltaformer_inputs(Q, K, V, normalize, beta):
    Q, K, V = check_qkv(Q, K, V)
    if not isinstance(normalize, (bool, np.bool_)):
        raise ValueError(f"normalize must be True or False; got {normalize!r}")
    n = K.shape[0]
    beta = np.ones(n) if beta is None else check_gate(beta, "beta", (n,), low=0.0, high=2.0)
    return Q, K, V, bool(normalize), beta


def deltaformer_matrices(Q, K, *, normalize: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """DeltaFormer's two ``(n, n)`` matrices, returned as ``(P, B)``: ``P = exp(Q K^T + log M)``
    (keys ``j <= i``; the article's ``A``) and ``B = exp(K K^T + log M^-)`` (keys ``j < i``:
    strictly lower, its first row empty); with ``normalize`` each ``exp`` becomes a row softmax
    over those positions. ``Q, K``: ``(n, d_k)``.

    Defined in Chapter 8 (DeltaFormer)."""
    Q, K, _ = check_qkv(Q, K, K)
    A = _masked_exp_rows(attention_scores(Q, K), causal_mask(Q.shape[0]).astype(bool), bool(normalize))
    B = _masked_exp_rows(K @ K.T, strict_causal_mask(K.shape[0]).astype(bool), bool(normalize))
    return A, B


def delta_attention(A, B, V, beta=None) -> np.ndarray:
    """``A (I + Diag(beta) B)^{-1} V`` for a lower-triangular ``A`` (DeltaFormer's ``P``) and a
    strictly lower-triangular ``B`` (both ``(n, n)``), the solve by a library triangular solver
    (``I + Diag(beta) B`` is unit lower triangular). DeltaFormer is this with exponentiated scores;
    DeltaNet (Chapter 6) is it with ``A = QK^T ⊙ M``, ``B = KK^T ⊙ M^-`` and ``Diag(beta) V`` for
    ``V``.

    Defined in Chapter 8 (DeltaFormer)."""
    from scipy.linalg import solve_triangular
    V = as_array(V, "V", ("n", "d_v"))
    n = V.shape[0]
    A, B = as_array(A, "A", (n, n)), as_array(B, "B", (n, n))
    if np.any(np.triu(A, 1) != 0) or np.any(np.triu(B) != 0):
        raise ValueError("A must be lower triangular and B strictly lower triangular (zeros above "
                         "their diagonals, and on B's)")
    beta = np.ones(n) if beta is None else check_gate(beta, "beta", (n,), low=0.0, high=2.0)
    return A @ solve_triangular(np.eye(n) + beta[:, None] * B, V, lower=True, unit_diagonal=True)


def deltaformer_parallel(Q, K, V, normalize: bool = False, beta=None) -> np.ndarray:
    """The matrix form ``O = P (I + Diag(beta) B)^{-1} V`` (:func:`deltaformer_matrices`,
    :func:`delta_attention`). O(n^2) memory.

    Defined in Chapter 8 (DeltaFormer)."""
    Q, K, V, normalize, beta = _deltaformer_inputs(Q, K, V, normalize, beta)
    P, B = deltaformer_matrices(Q, K, normalize=normalize)
    return delta_attention(P, B, V, beta)


def deltaformer_qk(Q, K, V, normalize: bool = False, beta=None) -> np.ndarray:
    """The variant fla's naive reference computes: the pseudo-values scored with ``q_t·k_j``
    (``B' = exp(Q K^T + log M^-)``) instead of the article's ``k_t·k_j``. With ``Q = K`` the two
    coincide; otherwise the pseudo-value of token ``t`` depends on its query, so it is no longer a
    function of the keys and values alone (the property that lets MQA share it across heads).

    Defined in Chapter 8 (DeltaFormer)."""
    Q, K, V, normalize, beta = _deltaformer_inputs(Q, K, V, normalize, beta)
    A, _ = deltaformer_matrices(Q, K, normalize=normalize)
    Bqk = _masked_exp_rows(attention_scores(Q, K), strict_causal_mask(K.shape[0]).astype(bool), normalize)
    return delta_attention(A, Bqk, V, beta)


def neumann_terms(A, B, V, terms: int, beta=None) -> np.ndarray:
    """The Neumann series of :func:`delta_attention` cut after ``terms`` terms:
    ``A sum_{m=0}^{terms-1} (-Diag(beta) B)^m V``, computed as ``terms`` products with ``B`` (each
    "attention over the keys" applied to the previous term), then one with ``A``. ``Diag(beta) B`` is
    strictly lower triangular, hence nilpotent: its ``L``-th power vanishes for ``L`` the
    :func:`dependency_chain_length` of ``B``, so ``L`` terms give the exact result.

    Defined in Chapter 8 (DeltaFormer)."""
    V = as_array(V, "V", ("n", "d_v"))
    n = V.shape[0]
    A, B = as_array(A, "A", (n, n)), as_array(B, "B", (n, n))
    beta = np.ones(n) if beta is None else check_gate(beta, "beta", (n,), low=0.0, high=2.0)
    terms = check_int(terms, "terms", 1)
    term, total = V.copy(), V.copy()
    for _ in range(terms - 1):
        term = -beta[:, None] * (B @ term)
        total += term
    return A @ total


def neumann_errors(A, B, V, beta=None, max_terms=None) -> np.ndarray:
    """The largest absolute error of :func:`neumann_terms` with ``1, 2, ..., max_terms`` terms
    against :func:`delta_attention` (default ``max_terms``: :func:`dependency_chain_length` of
    ``B``, where the series becomes exact). Returns an array of ``max_terms`` errors.

    Defined in Chapter 8 (DeltaFormer)."""
    exact = delta_attention(A, B, V, beta)
    L = dependency_chain_length(B) if max_terms is None else check_int(max_terms, "max_terms", 1)
    return np.array([np.abs(neumann_terms(A, B, V, m, beta) - exact).max()
                     for m in range(1, L + 1)])


def dependency_chain_length(B) -> int:
    """The number of tokens on the longest chain ``t_1 > t_2 > ... > t_L`` with every
    ``B[t_i, t_{i+1}] != 0``: the index of nilpotency of a strictly lower-triangular ``B``
    (``B^L = 0``, ``B^{L-1} != 0``), so the number of Neumann terms :func:`neumann_terms` needs.
    ``n`` for a dense ``B`` of ``n`` tokens, 1 for ``B = 0``.

    Defined in Chapter 8 (DeltaFormer)."""
    B = as_array(B, "B", ("n", "n"))
    n = B.shape[0]
    if B.shape[1] != n or np.any(np.triu(B) != 0):
        raise ValueError(f"B must be square and strictly lower triangular; got shape {B.shape}")
    longest = np.ones(n, dtype=int)        # longest chain starting (from the top) at token t
    for t in range(n):
        prev = np.nonzero(B[t, :t])[0]
        if prev.size:
            longest[t] = 1 + longest[prev].max()
    return int(longest.max())


def deltaformer(Q, K, V, normalize: bool = False, beta=None) -> np.ndarray:
    """DeltaFormer: ``P (I + Diag(beta) B)^{-1} V`` with ``P = exp(Q K^T + log M)``,
    ``B = exp(K K^T + log M^-)``; ``normalize=True`` replaces each ``exp`` by a row softmax over its
    allowed positions (the first row of ``B`` is empty). ``beta``: ``(n,)`` in ``(0, 2]``, default 1.
    The pseudo-values ``U = (I + Diag(beta) B)^{-1} V`` are scored with ``k·k``, as in the article.
    Computed in the matrix form (:func:`deltaformer_parallel`).

    Defined in Chapter 8 (DeltaFormer)."""
    return deltaformer_parallel(Q, K, V, normalize, beta)


def deltaformer_recurrent(Q, K, V, normalize: bool = False, beta=None) -> np.ndarray:
    """Token by token: the pseudo-value ``u_t = v_t - beta_t sum_{j<t} B_tj u_j`` (forward
    substitution; ``B_tj`` from ``k_t`` and the earlier keys), then ``o_t = sum_{j<=t} P_tj u_j``,
    ``P_tj`` from ``q_t`` and the keys up to ``t``, attention of ``q_t`` over the pseudo-values.
    The cache holds keys and pseudo-values.

    Defined in Chapter 8 (DeltaFormer)."""
    Q, K, V, normalize, beta = _deltaformer_inputs(Q, K, V, normalize, beta)
    n = K.shape[0]
    U = np.empty_like(V)
    O = np.empty_like(V)
    for t in range(n):
        if t == 0:
            U[0] = V[0]                  # row 0 of B is empty
        else:
            # b: row t of B, k_t scored against the earlier keys
            b = _masked_exp_rows((K[t] @ K[:t].T)[None, :],
                                 np.ones((1, t), bool), normalize)[0]
            # u_t = v_t - beta_t sum_{j<t} B_tj u_j
            U[t] = V[t] - beta[t] * (b @ U[:t])
        # p: row t of P, q_t scored against the keys up to t; o_t = p U
        p = _masked_exp_rows((Q[t] @ K[:t + 1].T)[None, :],
                             np.ones((1, t + 1), bool), normalize)[0]
        O[t] = p @ U[:t + 1]
    return O


def deltaformer_chunkwise(Q, K, V, normalize: bool = False, beta=None, *, chunk_size: int = 64) -> np.ndarray:
    """Blocked, as a GPU would: for each block of ``chunk_size`` tokens, the previous blocks'
    pseudo-values enter the right-hand side (``V_c - Diag(beta_c) B_{c,<c} U_{<c}``), a
    ``chunk_size``-sized forward substitution solves the block (:func:`lattn_core.forward_substitution`),
    and the block's outputs are ``P_{c,<=c} U_{<=c}``. Only ``chunk_size x n`` slabs of ``P`` and
    ``B`` exist at a time (rows of a normalised matrix need every earlier key).

    Defined in Chapter 8 (DeltaFormer)."""
    Q, K, V, normalize, beta = _deltaformer_inputs(Q, K, V, normalize, beta)
    C = check_chunk_size(chunk_size)
    n = K.shape[0]
    U = np.empty_like(V)
    O = np.empty_like(V)
    for c0 in range(0, n, C):
        c1 = min(c0 + C, n)
        rows = np.arange(c0, c1)[:, None]
        # the block's rows of B (keys j < t) and of P (keys j <= t)
        keys = np.arange(c1)[None, :]
        B = _masked_exp_rows(K[c0:c1] @ K[:c1].T, keys < rows, normalize)
        P = _masked_exp_rows(Q[c0:c1] @ K[:c1].T, keys <= rows, normalize)
        # the earlier blocks' pseudo-values are known: to the right-hand side
        rhs = V[c0:c1] - beta[c0:c1, None] * (B[:, :c0] @ U[:c0])
        # the block's own unit lower-triangular system, by forward substitution
        U[c0:c1] = forward_substitution(beta[c0:c1, None] * B[:, c0:c1],
                                        rhs)
        O[c0:c1] = P @ U[:c1]
    return O


def deltaformer_work(n: int, d_k: int, d_v: int, n_heads: int, kv_heads: int) -> dict:
    """Multiply-adds of one DeltaFormer layer over ``n`` tokens, causal halves counted exactly:
    per key-value head the scores ``K K^T`` (``n(n-1)/2 · d_k``) and the solve for the pseudo-values
    (``n(n-1)/2 · d_v``), which involve only keys and values; per query head the scores ``Q K^T``
    (``n(n+1)/2 · d_k``) and ``A U`` (``n(n+1)/2 · d_v``). Returns ``{"kv_part", "query_part",
    "shared", "unshared", "saved"}``: the work when ``n_heads`` query heads share ``kv_heads``
    key-value heads (MQA/GQA: the pseudo-values are computed once per key-value head), the work if
    every query head computed its own, and the fraction saved.

    Defined in Chapter 8 (DeltaFormer)."""
    n, d_k, d_v = check_int(n, "n", 1), check_int(d_k, "d_k", 1), check_int(d_v, "d_v", 1)
    H, H_kv = check_int(n_heads, "n_heads", 1), check_int(kv_heads, "kv_heads", 1)
    if H % H_kv:
        raise ValueError(f"kv_heads must divide n_heads; got n_heads={H}, kv_heads={H_kv}")
    kv = n * (n - 1) // 2 * (d_k + d_v)
    query = n * (n + 1) // 2 * (d_k + d_v)
    shared, unshared = H_kv * kv + H * query, H * (kv + query)
    return {"kv_part": kv, "query_part": query, "shared": shared, "unshared": unshared,
            "saved": 1 - shared / unshared}
