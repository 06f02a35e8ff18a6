"""PaTH attention: Householder products as position encoding (Chapter 9).

PaTH (Yang et al., 2025) replaces the plain score ``q_i·k_j`` of softmax attention by

    A_ij = q_i^T R_ij k_j,   R_ij = E_i E_{i-1} ... E_{j+1},   E_t = I - beta_t w_t w_t^T,

(``R_ii = I``; rows are queries, 0-based here as everywhere in the package). ``E_t`` is an
elementary reflector; with ``beta_t = 2`` and unit ``w_t`` (or ``beta = 1`` and ``|w| = sqrt(2)``)
it is a reflection, so ``R_ij`` is orthogonal like RoPE's rotation ``Omega^(i-j)``; PaTH lets the
transformations depend on the data.

One inverse serves the whole sequence (Chapter 9's ``T``, the resolvent of Chapter 6's system with
the directions in the keys' place):

    T = (I + B_W)^{-1},   B_W = Diag(beta)(W W^T ⊙ M^-),

``M`` lower triangular with the diagonal, ``M^-`` strictly lower. The three forms of the scores, as
everywhere in the book:

- :func:`path_scores_recurrent`, the definition: each key is carried forward factor by factor,
  ``x <- E_t x``, and read by every later query (``O(n^2 d)``);
- :func:`path_attention_scores` (= :func:`path_scores_parallel`), the article's closed form

      A = (Q K^T ⊙ M) - (Q W^T ⊙ M) T Diag(beta) (W K^T ⊙ M^-),

  one triangular solve over the whole sequence. As written here it costs ``O(n^3)``: the solve's
  right-hand side ``Diag(beta)(W K^T ⊙ M^-)`` has ``n`` columns, and so does the product after it;
- :func:`path_scores_chunkwise`: blocks of ``C`` tokens, never more than one block's
  ``C × C`` inverse at a time. Inside a block the closed form on the block; across blocks each
  query is pulled back to the start of its block, each key pushed to the end of its block, and the
  query carried backwards over the whole blocks in between by their products in WY form
  ``P_b = I - W_b^T Y_b``, ``Y_b = T_b Diag(beta_b) W_b`` with ``T_b`` the block's diagonal block of
  ``T`` (the route the PaTH paper takes: ``O(n^2 d + n C^2)``).

:func:`path_attention` and its three forms take the row softmax over ``j <= i`` and multiply by
``V``; ``gamma`` adds FoX's forget gates (PaTH-FoX): scores ``+ log Gamma_ij``.

The derivation's steps are exposed so the chapter can check each one: :func:`householder_product`
(the product itself), :func:`path_transition` (its closed form over ``W_[j:i]``),
:func:`path_score_terms` and :func:`path_qk_terms` (the article's two component derivations, line
by line), and the two special cases, :func:`path_qk_transform` (``Q - DeltaNet(Q, W, W)``) and
:func:`reflection_rotation` (two reflections make a rotation: RoPE as a special PaTH).
"""
from __future__ import annotations

import numpy as np

from ._validate import as_array, check_chunk_size, check_gate, check_int
from .delta import deltanet_parallel, forward_substitution
from .softmax import row_softmax

__all__ = ["householder_product", "path_transition", "path_scores_recurrent", "path_scores_parallel",
           "path_attention_scores", "path_scores_chunkwise", "path_attention", "path_attention_recurrent",
           "path_attention_parallel", "path_attention_chunkwise", "path_score_terms", "path_qk_terms",
           "path_qk_transform",
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
    """``R_ij = E_i E_{i-1} ... E_{j+1}`` as a ``(d, d)`` matrix (``I`` when ``i == j``), multiplied
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
    ``R_ij = I - W_s^T (I + B_s)^{-1} Diag(beta_s) W_s``, ``B_s = Diag(beta_s)(W_s W_s^T ⊙ M^-)``, with
    ``W_s = W_[j:i]`` the rows ``j+1 .. i`` (DeltaNet's inverse trick with the values set to zero);
    arguments as :func:`householder_product`'s.

    Defined in Chapter 9 (PaTH)."""
    W, beta, i, j = _transition_inputs(W, beta, i, j)
    d = W.shape[1]
    Ws, bs = W[j + 1:i + 1], beta[j + 1:i + 1]
    if Ws.shape[0] == 0:
        return np.eye(d)
    # (I + B_s)^{-1} Diag(β_s) W_s by forward substitution: d right-hand sides
    Y = forward_substitution(np.tril(bs[:, None] * (Ws @ Ws.T), k=-1), bs[:, None] * Ws)
    return np.eye(d) - Ws.T @ Y


def path_scores_recurrent(Q, K, W, beta=None) -> np.ndarray:
    """The definition: key ``j`` is carried forward, ``x <- E_t x`` for ``t = j+1, j+2, ...``, and
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
    the diagonal. ``O(n^3)`` as written: the solve has ``n`` right-hand sides.

    Defined in Chapter 9 (PaTH)."""
    Q, K, W, beta = _path_inputs(Q, K, W, beta)
    n = K.shape[0]
    lower = np.tril(np.ones((n, n), dtype=bool))
    # T Diag(β) P_WK = (I + B_W)^{-1} Diag(β)(W Kᵀ ⊙ M⁻) by forward substitution: n right-hand sides
    B_W = np.tril(beta[:, None] * (W @ W.T), k=-1)
    TP = forward_substitution(B_W, beta[:, None] * np.tril(W @ K.T, k=-1))
    # A = A_0 − P_QW (T Diag(β) P_WK)
    A = np.tril(Q @ K.T) - np.tril(Q @ W.T) @ TP
    return np.where(lower, A, -np.inf)


path_attention_scores = path_scores_parallel


def _block_wy(Wb, bb):
    """``Y_b = T_b Diag(β_b) W_b`` of one block: its product ``P_b = E_last ... E_first = I - W_bᵀ Y_b``."""
    return forward_substitution(np.tril(bb[:, None] * (Wb @ Wb.T), k=-1), bb[:, None] * Wb)


def path_scores_chunkwise(Q, K, W, beta=None, *, chunk_size: int = 64) -> np.ndarray:
    """Blocks of ``chunk_size`` tokens (see the module docstring): at most one ``C × C`` inverse at a
    time, ``O(n^2 d + n C^2)`` work. ``-inf`` above the diagonal.

    Defined in Chapter 9 (PaTH)."""
    Q, K, W, beta = _path_inputs(Q, K, W, beta)
    C = check_chunk_size(chunk_size)
    n = K.shape[0]
    A = np.full((n, n), -np.inf)
    starts = list(range(0, n, C))
    # per block: its WY factor Y_b = T_b Diag(β_b) W_b, queries pulled back to the block's start
    # (q̃_iᵀ = q_iᵀ E_i ... E_s) and keys pushed to the block's end (k̂_j = E_e ... E_{j+1} k_j)
    Yb, Qt, Kh = {}, {}, {}
    for s in starts:
        sl = slice(s, min(s + C, n))
        Wb, bb, Qb, Kb = W[sl], beta[sl], Q[sl], K[sl]
        Yb[s] = _block_wy(Wb, bb)
        Qt[s] = Qb - np.tril(Qb @ Wb.T) @ Yb[s]
        # k̂_j = k_j − W_bᵀ T_b Diag(β_b) (W_b K_bᵀ ⊙ M⁻)[:, j]
        TP = forward_substitution(np.tril(bb[:, None] * (Wb @ Wb.T), k=-1), bb[:, None] * np.tril(Wb @ Kb.T, k=-1))
        Kh[s] = Kb - TP.T @ Wb
        # inside the block: the closed form on the block
        Ab = np.tril(Qb @ Kb.T) - np.tril(Qb @ Wb.T) @ TP
        A[sl, sl] = np.where(np.tril(np.ones(Ab.shape, dtype=bool)), Ab, -np.inf)
    for bi, s in enumerate(starts):
        rows = slice(s, min(s + C, n))
        X = Qt[s].copy()                  # queries carried backwards over whole blocks
        for s_prev in reversed(starts[:bi]):
            cols = slice(s_prev, min(s_prev + C, n))
            A[rows, cols] = X @ Kh[s_prev].T
            # x ← P_bᵀ x with P_b = I − W_bᵀ Y_b: xᵀ P_b = xᵀ − (xᵀ W_bᵀ) Y_b
            X = X - (X @ W[cols].T) @ Yb[s_prev]
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


def _resolvent(W, beta):
    """``T = (I + B_W)^{-1}`` with ``B_W = Diag(β)(W Wᵀ ⊙ M⁻)``, formed explicitly (for the component
    sums that index its entries; the forms themselves never form it)."""
    n = W.shape[0]
    return np.linalg.inv(np.eye(n) + np.tril(beta[:, None] * (W @ W.T), k=-1))


def path_score_terms(Q, K, W, beta, i: int, j: int) -> dict:
    """One score ``A_ij`` (``j <= i``) by each line of the article's derivation, for the chapter to
    compare (``T = (I + B_W)^{-1}``, ``s = j+1 .. i`` the slice, ``β`` kept as ``Diag(β)`` right of
    ``T``): ``"product"`` (``q_iᵀ R_ij k_j`` multiplied out), ``"slice"`` (with the inverse of the
    slice's own system), ``"sub-block"`` (with the sub-block ``T_[j:i, j:i]``), ``"sum over slice"``
    (``Σ_p Σ_l Σ_r Σ_s Q_ip W_lp T_lr β_r W_rs K_js`` over ``l, r`` in the slice), ``"sum over l <= i,
    r > j"`` (the ranges widened, free because ``T`` is lower triangular), ``"indicators"`` (every
    ``l, r`` with ``χ_{l<=i} χ_{r>j}``), ``"masked products"`` (the ``p`` and ``s`` sums done first:
    ``Σ_l Σ_r (Q Wᵀ ⊙ M)_il T_lr β_r (W Kᵀ ⊙ M⁻)_rj``) and ``"closed form"`` (the matrix formula).

    Defined in Chapter 9 (PaTH)."""
    Q, K, W, beta = _path_inputs(Q, K, W, beta)
    n = K.shape[0]
    i, j = _pair(i, j, n)
    qi, kj = Q[i], K[j]
    T = _resolvent(W, beta)
    TB = T * beta[None, :]                   # T Diag(β): entry (l, r) is T_lr β_r
    out = {"product": qi @ householder_product(W, beta, i, j) @ kj,
           "slice": qi @ path_transition(W, beta, i, j) @ kj}
    s = slice(j + 1, i + 1)
    out["sub-block"] = qi @ kj - qi @ W[s].T @ TB[s, s] @ W[s] @ kj
    l_idx, r_idx = np.arange(n)[:, None], np.arange(n)[None, :]

    def four_sums(keep):                     # Σ_p Σ_l Σ_r Σ_s Q_ip W_lp T_lr β_r W_rs K_js over keep[l, r]
        return np.einsum("p,lp,lr,rs,s->", qi, W, np.where(keep, TB, 0.0), W, kj)
    out["sum over slice"] = qi @ kj - four_sums((l_idx > j) & (l_idx <= i) & (r_idx > j) & (r_idx <= i))
    out["sum over l <= i, r > j"] = qi @ kj - four_sums((l_idx <= i) & (r_idx > j))
    chi_l = (np.arange(n) <= i).astype(float)
    chi_r = (np.arange(n) > j).astype(float)
    out["indicators"] = qi @ kj - np.einsum("p,lp,l,lr,r,rs,s->", qi, W, chi_l, TB, chi_r, W, kj)
    P_QW = np.tril(Q @ W.T)                  # (Q Wᵀ ⊙ M)
    P_WK = np.tril(W @ K.T, k=-1)            # (W Kᵀ ⊙ M⁻)
    out["masked products"] = qi @ kj - P_QW[i] @ TB @ P_WK[:, j]
    out["closed form"] = path_scores_parallel(Q, K, W, beta)[i, j]
    return out


def path_qk_terms(X, W, beta, i: int) -> dict:
    """Row ``i`` of ``X R_i``-transformed queries, ``(x_iᵀ R_i)_s`` for every ``s``, with
    ``R_i = E_i ... E_0`` the product from the first token, by each line of the article's second
    derivation (``T = (I + B_W)^{-1}``, ``β`` as ``Diag(β)`` right of ``T``): ``"product"`` (multiplied
    out), ``"prefix"`` (the closed form over the rows ``0 .. i`` with the sub-block ``T_[:i, :i]``),
    ``"sum over prefix"`` (``X_is − Σ_p Σ_l Σ_r X_ip W_lp T_lr β_r W_rs`` over ``l, r <= i``),
    ``"sum over r < n"`` (``r`` widened to every token: ``T`` is lower triangular), ``"indicators"``
    (every ``l`` with ``χ_{l<=i}``), ``"masked products"`` (``Σ_l (X Wᵀ ⊙ M)_il (T Diag(β) W)_ls``) and
    ``"DeltaNet"`` (row ``i`` of ``X − DeltaNet(X, W, W)``, :func:`path_qk_transform`). Each a ``(d,)``
    vector; ``X`` ``(n, d)`` (queries or keys), ``W`` ``(n, d)``, ``beta`` as for :func:`path_attention`.

    Defined in Chapter 9 (PaTH)."""
    X = as_array(X, "X", ("n", "d"))
    n = X.shape[0]
    W = as_array(W, "W", X.shape)
    beta = _path_beta(beta, n)
    i = check_int(i, "i", 0)
    if not i < n:
        raise ValueError(f"need 0 <= i < n = {n}; got i = {i}")
    xi = X[i]
    T = _resolvent(W, beta)
    TB = T * beta[None, :]
    R = np.eye(X.shape[1])
    for t in range(i + 1):
        R = _factor(W[t], beta[t]) @ R
    out = {"product": xi @ R}
    p = slice(0, i + 1)
    out["prefix"] = xi - xi @ W[p].T @ TB[p, p] @ W[p]
    l_idx, r_idx = np.arange(n)[:, None], np.arange(n)[None, :]

    def three_sums(keep):                    # Σ_p Σ_l Σ_r X_ip W_lp T_lr β_r W_rs over keep[l, r], per s
        return np.einsum("p,lp,lr,rs->s", xi, W, np.where(keep, TB, 0.0), W)
    out["sum over prefix"] = xi - three_sums((l_idx <= i) & (r_idx <= i))
    out["sum over r < n"] = xi - three_sums(l_idx <= i)
    chi_l = (np.arange(n) <= i).astype(float)
    out["indicators"] = xi - np.einsum("p,lp,l,lr,rs->s", xi, W, chi_l, TB, W)
    out["masked products"] = xi - np.tril(X @ W.T)[i] @ (TB @ W)
    out["DeltaNet"] = path_qk_transform(X, W, beta)[i]
    return out


def path_qk_transform(X, W, beta=None) -> np.ndarray:
    """``X - DeltaNet(X, W, W)``: row ``i`` is ``x_iᵀ R_i`` with ``R_i = E_i ... E_0`` (the second
    special case: with orthogonal factors, queries and keys so transformed turn PaTH into plain
    softmax attention, as RoPE's absolute rotations do).

    Defined in Chapter 9 (PaTH)."""
    X = as_array(X, "X", ("n", "d"))
    W = as_array(W, "W", X.shape)
    return X - deltanet_parallel(X, W, W, beta)


def path_absolute_scores(Q, K, W, beta=None) -> np.ndarray:
    """``Q̃ K̃ᵀ`` (causal, ``-inf`` above the diagonal) with ``Q̃, K̃`` from :func:`path_qk_transform`:
    equal to PaTH's scores exactly when every ``E_t`` is orthogonal (``β_t |w_t|² = 2``), otherwise
    the "Canon layer" reading: a position signal added to ``Q`` and ``K`` by a long convolution.

    Defined in Chapter 9 (PaTH)."""
    Q, K, W, beta = _path_inputs(Q, K, W, beta)
    A = path_qk_transform(Q, W, beta) @ path_qk_transform(K, W, beta).T
    return np.where(np.tril(np.ones(A.shape, dtype=bool)), A, -np.inf)


def reflection_rotation(a, b) -> np.ndarray:
    """``E_b E_a`` for two reflections ``E_x = I - 2 x xᵀ/|x|²``: a rotation by twice the angle from
    ``a`` to ``b`` in their plane (RoPE's ``Ω`` as a product of two PaTH factors).

    Defined in Chapter 9 (PaTH)."""
    a = as_array(a, "a", ("d",))
    b = as_array(b, "b", a.shape)
    for name, x in (("a", a), ("b", b)):
        if not np.linalg.norm(x) > 0:
            raise ValueError(f"{name} must be a non-zero vector")
    Ea = _factor(a / np.linalg.norm(a), 2.0)
    Eb = _factor(b / np.linalg.norm(b), 2.0)
    return Eb @ Ea
