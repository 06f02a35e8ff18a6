"""PaTH attention: Householder products as position encoding (Chapter 9).

PaTH (Yang et al., 2025) replaces the plain score ``q_i·k_j`` of softmax attention by

    A_ij = q_i^T R_ij k_j,   R_ij = H_i H_{i-1} ... H_{j+1},   H_t = I - beta_t w_t w_t^T,

(``R_ii = I``; rows are queries, 0-based here as everywhere in the package). With ``beta_t = 2`` and
unit ``w_t`` (or ``beta = 1`` and ``|w| = sqrt(2)``) every ``H_t`` is a reflection, so ``R_ij`` is
orthogonal like RoPE's rotation ``Omega^(i-j)``; PaTH lets the transformations depend on the data.

The three forms of the scores, as everywhere in the book:

- :func:`path_scores_recurrent`, the definition: each key is carried forward factor by factor,
  ``x <- H_t x``, and read by every later query (``O(n^2 d)``);
- :func:`path_attention_scores` (= :func:`path_scores_parallel`), the article's closed form

      A = (Q K^T ⊙ M) - (Q W^T ⊙ M)(I + Diag(beta)(W W^T ⊙ M^-))^{-1} Diag(beta)(W K^T ⊙ M^-),

  one triangular solve over the whole sequence (``M`` lower triangular with the diagonal, ``M^-``
  strictly lower);
- :func:`path_scores_chunkwise`: blocks of ``C`` tokens, never more than one block's
  ``C × C`` inverse at a time. Inside a block the closed form on the block; across blocks each
  query is pulled back to the start of its block, each key pushed to the end of its block, and the
  query carried backwards over the whole blocks in between by their UT transforms
  ``P_b = I - W_b^T T_b Diag(beta_b) W_b`` (the route the PaTH paper takes, in ``O(n^2 d)``).

:func:`path_attention` and its three forms take the row softmax over ``j <= i`` and multiply by
``V``; ``gamma`` adds FoX's forget gates (PaTH-FoX): scores ``+ log Gamma_ij``.

The derivation's steps are exposed so the chapter can check each one: :func:`householder_product`
(the product itself), :func:`path_transition` (its closed form over ``W_[j:i]``),
:func:`path_score_terms` (the component forms of the article's equalities), and the two special
cases, :func:`path_qk_transform` (``Q - DeltaNet(Q, W, W)``) and :func:`reflection_rotation`
(two reflections make a rotation: RoPE as a special PaTH).
"""
from __future__ import annotations

import numpy as np

from ._validate import as_array, check_chunk_size, check_gate, check_int
from .delta import deltanet_parallel, forward_substitution
from .softmax import row_softmax

__all__ = ["householder_product", "path_transition", "path_scores_recurrent", "path_scores_parallel",
           "path_attention_scores", "path_scores_chunkwise", "path_attention", "path_attention_recurrent",
           "path_attention_parallel", "path_attention_chunkwise", "path_score_terms", "path_qk_transform",
           "path_absolute_scores", "reflection_rotation"]


def _path_beta(beta, n: int) -> np.ndarray:
    """``beta``: ``None`` (ones) or ``(n,)`` in ``[0, 2]`` (2 makes each factor a reflection for unit ``w``)."""
    return np.ones(n) if beta is None else check_gate(beta, "beta", (n,), low=0.0, high=2.0, low_inclusive=True)


def _path_inputs(Q, K, W, beta):
    """Validated ``Q, K, W`` (``(n, d)`` each) and ``beta`` (``(n,)``, default ones, in ``[0, 2]``)."""
    Q = as_array(Q, "Q", ("n", "d_k"))
    n, d = Q.shape
    K = as_array(K, "K", (n, d))
    W = as_array(W, "W", (n, d))
    return Q, K, W, _path_beta(beta, n)


def _pair(i, j, n: int) -> tuple:
    """The token pair ``(i, j)``: integers with ``0 <= j <= i < n``."""
    i, j = check_int(i, "i", 0), check_int(j, "j", 0)
    if not j <= i < n:
        raise ValueError(f"need 0 <= j <= i < n = {n}; got i = {i}, j = {j}")
    return i, j


def _transition_inputs(W, beta, i, j):
    W = as_array(W, "W", ("n", "d"))
    n = W.shape[0]
    return (W, _path_beta(beta, n), *_pair(i, j, n))


def _factor(w, b):
    return np.eye(w.shape[0]) - b * np.outer(w, w)


def householder_product(W, beta, i: int, j: int) -> np.ndarray:
    """``R_ij = H_i H_{i-1} ... H_{j+1}`` as a ``(d, d)`` matrix (``I`` when ``i == j``), multiplied
    out factor by factor; ``0 <= j <= i < n``, ``beta`` ``None`` (ones) or ``(n,)`` in ``[0, 2]``
    as for :func:`path_attention`.

    Defined in Chapter 9 (PaTH)."""
    W, beta, i, j = _transition_inputs(W, beta, i, j)
    R = np.eye(W.shape[1])
    for t in range(j + 1, i + 1):
        R = _factor(W[t], beta[t]) @ R
    return R


def path_transition(W, beta, i: int, j: int) -> np.ndarray:
    """The closed form of :func:`householder_product`:
    ``R_ij = I - W_s^T (I + Diag(beta_s)(W_s W_s^T ⊙ M^-))^{-1} Diag(beta_s) W_s`` with
    ``W_s = W_[j:i]`` the rows ``j+1 .. i`` (DeltaNet's inverse trick with the values set to zero);
    arguments as :func:`householder_product`'s.

    Defined in Chapter 9 (PaTH)."""
    W, beta, i, j = _transition_inputs(W, beta, i, j)
    d = W.shape[1]
    Ws, bs = W[j + 1:i + 1], beta[j + 1:i + 1]
    if Ws.shape[0] == 0:
        return np.eye(d)
    X = forward_substitution(np.tril(bs[:, None] * (Ws @ Ws.T), k=-1), bs[:, None] * Ws)
    return np.eye(d) - Ws.T @ X


def path_scores_recurrent(Q, K, W, beta=None) -> np.ndarray:
    """The definition: key ``j`` is carried forward, ``x <- H_t x`` for ``t = j+1, j+2, ...``, and
    read by query ``t`` as ``A_tj = q_t·x``. ``(n, n)``, ``-inf`` above the diagonal.

    Defined in Chapter 9 (PaTH)."""
    Q, K, W, beta = _path_inputs(Q, K, W, beta)
    n = K.shape[0]
    A = np.full((n, n), -np.inf)
    for j in range(n):
        x = K[j].copy()
        A[j, j] = Q[j] @ x
        for t in range(j + 1, n):
            x = x - beta[t] * W[t] * (W[t] @ x)
            A[t, j] = Q[t] @ x
    return A


def path_scores_parallel(Q, K, W, beta=None) -> np.ndarray:
    """The article's closed form (see the module docstring), one triangular solve; ``-inf`` above
    the diagonal.

    Defined in Chapter 9 (PaTH)."""
    Q, K, W, beta = _path_inputs(Q, K, W, beta)
    n = K.shape[0]
    lower = np.tril(np.ones((n, n), dtype=bool))
    # (I + Diag(β)(W Wᵀ ⊙ M⁻))^{-1} Diag(β) (W Kᵀ ⊙ M⁻), applied by forward substitution
    Y = forward_substitution(np.tril(beta[:, None] * (W @ W.T), k=-1), beta[:, None] * np.tril(W @ K.T, k=-1))
    A = np.tril(Q @ K.T) - np.tril(Q @ W.T) @ Y
    return np.where(lower, A, -np.inf)


path_attention_scores = path_scores_parallel


def _block_ut(Wb, bb):
    """``T_b Diag(β_b) W_b`` of one block: ``P_b = H_last ... H_first = I - W_bᵀ (T_b Diag(β_b) W_b)``."""
    return forward_substitution(np.tril(bb[:, None] * (Wb @ Wb.T), k=-1), bb[:, None] * Wb)


def path_scores_chunkwise(Q, K, W, beta=None, *, chunk_size: int = 64) -> np.ndarray:
    """Blocks of ``chunk_size`` tokens (see the module docstring): at most one ``C × C`` inverse at a
    time, ``O(n^2 d)`` work. ``-inf`` above the diagonal.

    Defined in Chapter 9 (PaTH)."""
    Q, K, W, beta = _path_inputs(Q, K, W, beta)
    C = check_chunk_size(chunk_size)
    n = K.shape[0]
    A = np.full((n, n), -np.inf)
    starts = list(range(0, n, C))
    # per block: its UT factor U_b = T_b Diag(β_b) W_b, queries pulled back to the block's start
    # (q̃_iᵀ = q_iᵀ H_i ... H_s) and keys pushed to the block's end (k̂_j = H_e ... H_{j+1} k_j)
    U, Qt, Kh = {}, {}, {}
    for s in starts:
        sl = slice(s, min(s + C, n))
        Wb, bb, Qb, Kb = W[sl], beta[sl], Q[sl], K[sl]
        U[s] = _block_ut(Wb, bb)
        Qt[s] = Qb - np.tril(Qb @ Wb.T) @ U[s]
        # k̂_j = k_j − W_bᵀ T_b Diag(β_b) (W_b K_bᵀ ⊙ M⁻)[:, j]
        Y = forward_substitution(np.tril(bb[:, None] * (Wb @ Wb.T), k=-1), bb[:, None] * np.tril(Wb @ Kb.T, k=-1))
        Kh[s] = Kb - Y.T @ Wb
        # inside the block: the closed form on the block
        Ab = np.tril(Qb @ Kb.T) - np.tril(Qb @ Wb.T) @ Y
        A[sl, sl] = np.where(np.tril(np.ones(Ab.shape, dtype=bool)), Ab, -np.inf)
    for bi, s in enumerate(starts):
        rows = slice(s, min(s + C, n))
        X = Qt[s].copy()                  # queries carried backwards over whole blocks
        for s_prev in reversed(starts[:bi]):
            cols = slice(s_prev, min(s_prev + C, n))
            A[rows, cols] = X @ Kh[s_prev].T
            # x ← P_bᵀ x with P_b = I − W_bᵀ U_b: xᵀ P_b = xᵀ − (xᵀ W_bᵀ) U_b
            X = X - (X @ W[cols].T) @ U[s_prev]
    return A


def _softmax_values(A, V, gamma):
    n = A.shape[0]
    if gamma is not None:
        g = np.log(check_gate(gamma, "gamma", (n,)))
        G = np.cumsum(g)
        A = A + np.where(np.isfinite(A), G[:, None] - G[None, :], 0.0)
    return row_softmax(A) @ V


def _check_v(V, n):
    return as_array(V, "V", (n, "d_v"))


def path_attention_recurrent(Q, K, V, W, beta=None, *, gamma=None) -> np.ndarray:
    """Row softmax over ``j <= i`` of :func:`path_scores_recurrent`, times ``V``; ``gamma``: FoX's
    forget gates ``(n,)`` in ``(0, 1]`` (PaTH-FoX), default none.

    Defined in Chapter 9 (PaTH)."""
    A = path_scores_recurrent(Q, K, W, beta)
    return _softmax_values(A, _check_v(V, A.shape[0]), gamma)


def path_attention_parallel(Q, K, V, W, beta=None, *, gamma=None) -> np.ndarray:
    """Row softmax over ``j <= i`` of the closed-form scores, times ``V`` (``gamma``: PaTH-FoX).

    Defined in Chapter 9 (PaTH)."""
    A = path_scores_parallel(Q, K, W, beta)
    return _softmax_values(A, _check_v(V, A.shape[0]), gamma)


def path_attention_chunkwise(Q, K, V, W, beta=None, *, gamma=None, chunk_size: int = 64) -> np.ndarray:
    """Row softmax over ``j <= i`` of the blocked scores, times ``V`` (``gamma``: PaTH-FoX).

    Defined in Chapter 9 (PaTH)."""
    A = path_scores_chunkwise(Q, K, W, beta, chunk_size=chunk_size)
    return _softmax_values(A, _check_v(V, A.shape[0]), gamma)


def path_attention(Q, K, V, W, beta=None, *, gamma=None) -> np.ndarray:
    """PaTH attention (API.md): row softmax over ``j <= i`` of :func:`path_attention_scores`, times
    ``V``; ``gamma`` adds FoX's forget gates (PaTH-FoX).

    Defined in Chapter 9 (PaTH)."""
    return path_attention_parallel(Q, K, V, W, beta, gamma=gamma)


def path_score_terms(Q, K, W, beta, i: int, j: int) -> dict:
    """One score ``A_ij`` (``j <= i``) by each line of the article's derivation, for the chapter to
    compare: ``"product"`` (``q_iᵀ R_ij k_j`` multiplied out), ``"slice"`` (with the inverse of the
    slice ``W_[j:i]``), ``"sub-block"`` (with the sub-block ``T_[j:i, j:i]`` of the whole inverse),
    ``"sum over slice"`` / ``"sum over l <= i, r > j"`` / ``"indicators"`` (the component sums of the
    fourth to sixth equalities, as the article writes them) and ``"closed form"`` (the matrix
    formula). ``beta`` is folded in as ``Diag(β)`` next to ``T``.

    Defined in Chapter 9 (PaTH)."""
    Q, K, W, beta = _path_inputs(Q, K, W, beta)
    n = K.shape[0]
    i, j = _pair(i, j, n)
    qi, kj = Q[i], K[j]
    T = np.linalg.inv(np.eye(n) + np.tril(beta[:, None] * (W @ W.T), k=-1)) @ np.diag(beta)
    out = {"product": qi @ householder_product(W, beta, i, j) @ kj,
           "slice": qi @ path_transition(W, beta, i, j) @ kj}
    s = slice(j + 1, i + 1)
    out["sub-block"] = qi @ kj - qi @ W[s].T @ T[s, s] @ W[s] @ kj
    l_idx, r_idx = np.arange(n)[:, None], np.arange(n)[None, :]
    qw, wk = W @ qi, W @ kj                  # Σ_p Q_ip W_lp and Σ_s W_rs K_js, per l and per r
    inside = (l_idx > j) & (l_idx <= i) & (r_idx > j) & (r_idx <= i)
    out["sum over slice"] = qi @ kj - np.sum(np.where(inside, qw[:, None] * T * wk[None, :], 0.0))
    wide = (l_idx <= i) & (r_idx > j)        # T lower triangular: r <= l <= i comes free
    out["sum over l <= i, r > j"] = qi @ kj - np.sum(np.where(wide, qw[:, None] * T * wk[None, :], 0.0))
    chi_l = (np.arange(n) <= i).astype(float)
    chi_r = (np.arange(n) > j).astype(float)
    out["indicators"] = qi @ kj - (chi_l * qw) @ T @ (chi_r * wk)
    out["closed form"] = path_scores_parallel(Q, K, W, beta)[i, j]
    return out


def path_qk_transform(X, W, beta=None) -> np.ndarray:
    """``X - DeltaNet(X, W, W)``: row ``i`` is ``x_iᵀ R_i`` with ``R_i = H_i ... H_0`` (the second
    special case: with orthogonal factors, queries and keys so transformed turn PaTH into plain
    softmax attention, as RoPE's absolute rotations do).

    Defined in Chapter 9 (PaTH)."""
    X = as_array(X, "X", ("n", "d"))
    W = as_array(W, "W", X.shape)
    return X - deltanet_parallel(X, W, W, beta)


def path_absolute_scores(Q, K, W, beta=None) -> np.ndarray:
    """``Q̃ K̃ᵀ`` (causal, ``-inf`` above the diagonal) with ``Q̃, K̃`` from :func:`path_qk_transform`:
    equal to PaTH's scores exactly when every ``H_t`` is orthogonal (``β_t |w_t|² = 2``), otherwise
    the "Canon layer" reading: a position signal added to ``Q`` and ``K`` by a long convolution.

    Defined in Chapter 9 (PaTH)."""
    Q, K, W, beta = _path_inputs(Q, K, W, beta)
    A = path_qk_transform(Q, W, beta) @ path_qk_transform(K, W, beta).T
    return np.where(np.tril(np.ones(A.shape, dtype=bool)), A, -np.inf)


def reflection_rotation(a, b) -> np.ndarray:
    """``H_b H_a`` for two reflections ``H_x = I - 2 x xᵀ/|x|²``: a rotation by twice the angle from
    ``a`` to ``b`` in their plane (RoPE's ``Ω`` as a product of two PaTH factors).

    Defined in Chapter 9 (PaTH)."""
    a = as_array(a, "a", ("d",))
    b = as_array(b, "b", a.shape)
    for name, x in (("a", a), ("b", b)):
        if not np.linalg.norm(x) > 0:
            raise ValueError(f"{name} must be a non-zero vector")
    Ha = _factor(a / np.linalg.norm(a), 2.0)
    Hb = _factor(b / np.linalg.norm(b), 2.0)
    return Hb @ Ha
