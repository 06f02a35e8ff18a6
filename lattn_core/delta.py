"""The delta rule and its relatives: DeltaNet, Gated DeltaNet, Comba, DeltaProduct.

Notation (the article's "convention B", one head): ``Q, K`` are ``(n, d_k)``, ``V`` is ``(n, d_v)``,
the state ``S`` is ``(d_v, d_k)``, a read is ``o_t = S_t q_t``. Causal, no implicit scaling, float64.

DeltaNet (the delta rule, with a per-token step ``beta_t``)::

    S_t = S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T
        = S_{t-1} + beta_t (v_t - S_{t-1} k_t) k_t^T              (erase the old reading, write the new)

``beta`` lies in ``(0, 2]``: for a unit-norm key ``I - beta k k^T`` has the eigenvalue ``1 - beta`` in
``[-1, 1)`` along ``k`` (``beta > 1`` gives the negative eigenvalues some follow-up work argues for).

The parallel form (the article's "inverse trick"). Write ``u_t = beta_t (v_t - S_{t-1} k_t)``, so that
``S_t = S_{t-1} + u_t k_t^T`` is plain linear attention on the pseudo-values ``U``. Unrolling
``S_{t-1} = sum_{j<t} u_j k_j^T`` gives ``u_t = beta_t v_t - beta_t sum_{j<t} (k_t · k_j) u_j``, i.e.
the lower-triangular system::

    (I + A) U = Diag(beta) V,      A = (Diag(beta) K K^T) ⊙ M^-      (strictly lower triangular)
    O = (Q K^T ⊙ M) U = (Q K^T ⊙ M) (I + A)^{-1} Diag(beta) V

solved by :func:`forward_substitution` in ``O(n^2 d_v)``, never by forming an inverse.

The chunkwise (WY/UT) form. Split the tokens into chunks of ``C`` (the last may be shorter). For a
chunk entered with state ``S0`` the same unrolling, now with ``S_{i-1} = S0 + sum_{j<i} u_j k_j^T``,
gives ``(I + A) U = Diag(beta)(V - K S0^T)`` with ``A`` the chunk's own ``C x C`` matrix. With
``T = (I + A)^{-1}`` (the "UT transform")::

    W = T Diag(beta) K,    U~ = T Diag(beta) V,    U = U~ - W S0^T        (pseudo-values)
    O_chunk = Q S0^T + (Q K^T ⊙ M) U                                   (inter- + intra-chunk)
    S_next  = S0 + U^T K

so each chunk costs a few ``C x C`` and ``C x d`` matrix products and the state is touched once per
chunk (``W`` and ``U~`` do not depend on ``S0``, which is why GPUs compute them for all chunks at once).

Gated DeltaNet multiplies the old state by ``alpha_t in (0, 1]``::

    S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T

and everything above carries over with the decay ``exp(b_i - b_j)``, ``b_i = sum_{tau<=i} log alpha_tau``
(differences of log cumulative sums, never ratios of cumulative products, so ``alpha`` near 0 over a
long sequence neither overflows nor divides by zero)::

    A_ij = beta_i exp(b_i - b_j) k_i · k_j   (j < i),   (I + A) U = Diag(beta)(V - Diag(exp(b)) K S0^T)
    O_chunk = Diag(exp(b)) Q S0^T + (Q K^T ⊙ Γ) U,   Γ_ij = exp(b_i - b_j) (j <= i)
    S_next  = exp(b_C) S0 + sum_j exp(b_C - b_j) u_j k_j^T

where ``b`` restarts at each chunk.
"""
from __future__ import annotations

import numpy as np

from ._validate import as_array, check_chunk_size, check_gate, check_int, check_positive, check_qkv

__all__ = [
    "forward_substitution", "blockwise_unit_lower_inverse",
    "deltanet_recurrent", "deltanet_parallel", "deltanet_chunkwise", "deltanet_attention_matrix",
    "gated_deltanet_recurrent", "gated_deltanet_parallel", "gated_deltanet_chunkwise",
    "comba_recurrent", "comba_parallel", "comba_chunkwise", "comba_to_gated_deltanet", "gated_deltanet_to_comba",
    "deltaproduct_recurrent", "deltaproduct_parallel", "deltaproduct_chunkwise",
    "gated_deltanet_via_cumulative_alpha", "cumulative_alpha_breakdown", "overwrite_experiment",
]


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------
def _beta(beta, n: int) -> np.ndarray:
    if beta is None:
        return np.ones(n)
    return check_gate(beta, "beta", (n,), low=0.0, high=2.0)


def _alpha(alpha, n: int) -> np.ndarray:
    return check_gate(alpha, "alpha", (n,))


# --------------------------------------------------------------------------------------------
# the triangular solve
# --------------------------------------------------------------------------------------------
def forward_substitution(A, B) -> np.ndarray:
    """Solve ``(I + A) X = B`` for a strictly lower-triangular ``A`` by forward substitution.

    Row by row, ``x_i = b_i - sum_{j<i} A_ij x_j``: ``O(n^2 d)`` operations for ``A`` ``(n, n)`` and
    ``B`` ``(n, d)`` (or ``(n,)``), with no inverse formed. Entries of ``A`` on or above the diagonal
    must be zero (a ``ValueError`` says otherwise).

    Defined in Chapter 6 (The inverse trick).
    """
    A = as_array(A, "A", ("n", "n"))
    n = A.shape[0]
    if A.shape[1] != n:
        raise ValueError(f"A must be square (n, n); got shape {A.shape}")
    if np.any(np.triu(A) != 0):
        raise ValueError("A must be strictly lower triangular (zeros on and above the diagonal)")
    B = as_array(B, "B", None)
    vector = B.ndim == 1
    B = as_array(B[:, None] if vector else B, "B", (n, "d"))
    X = np.empty_like(B)
    for i in range(n):
        X[i] = B[i] - A[i, :i] @ X[:i]
    return X[:, 0] if vector else X


def blockwise_unit_lower_inverse(A, block: int = 16) -> np.ndarray:
    """``(I + A)^{-1}`` for strictly lower-triangular ``A``, block row by block row (the kernels' way).

    With ``T = (I + A)^{-1}`` split into ``block × block`` tiles, the diagonal tiles are the inverses
    of the diagonal tiles of ``I + A`` (each by :func:`forward_substitution`), and each tile below the
    diagonal follows from ``(I + A) T = I``::

        T_II = (I + A_II)^{-1},      T_IJ = -T_II sum_{J <= M < I} A_IM T_MJ      (J < I).

    ``n`` need not be a multiple of ``block`` (the last tile is smaller).

    Defined in Chapter 6 (The inverse trick).
    """
    A = as_array(A, "A", ("n", "n"))
    n = A.shape[0]
    if A.shape[1] != n:
        raise ValueError(f"A must be square (n, n); got shape {A.shape}")
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
        raise ValueError(f"block must be a positive integer; got {block!r}")
    edges = list(range(0, n, block)) + [n]
    tiles = [slice(a, b) for a, b in zip(edges[:-1], edges[1:])]
    T = np.zeros((n, n))
    for i, I in enumerate(tiles):
        T[I, I] = forward_substitution(A[I, I], np.eye(I.stop - I.start))
        for j in range(i):
            J = tiles[j]
            acc = sum(A[I, tiles[m]] @ T[tiles[m], J] for m in range(j, i))
            T[I, J] = -T[I, I] @ acc
    return T


# --------------------------------------------------------------------------------------------
# one generic recurrence (gated delta rule); every _recurrent form below is a special case
# --------------------------------------------------------------------------------------------
def _gdn_loop(Q, K, V, alpha, beta, dtype=np.float64):
    """``S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``, ``o_t = S_t q_t``."""
    Q, K, V = (np.asarray(x, dtype=dtype) for x in (Q, K, V))
    alpha, beta = np.asarray(alpha, dtype=dtype), np.asarray(beta, dtype=dtype)
    n, d_k = K.shape
    S = np.zeros((V.shape[1], d_k), dtype=dtype)
    O = np.empty((n, V.shape[1]), dtype=dtype)
    for t in range(n):
        k = K[t]
        S = alpha[t] * S                              # forget
        S = S + beta[t] * np.outer(V[t] - S @ k, k)   # erase, then write
        O[t] = S @ Q[t]                               # read
    return O


# --------------------------------------------------------------------------------------------
# DeltaNet
# --------------------------------------------------------------------------------------------
def deltanet_recurrent(Q, K, V, beta=None) -> np.ndarray:
    """DeltaNet, the definition: ``S_t = S_{t-1}(I - beta_t k_t k_t^T) + beta_t v_t k_t^T``, ``o_t = S_t q_t``.

    ``Q, K``: ``(n, d_k)``; ``V``: ``(n, d_v)``; ``beta``: ``(n,)`` in ``(0, 2]`` (default all ones).
    Keys are used as given: L2-normalise them for a contractive (stable) update.

    Defined in Chapter 5 (The delta rule).
    """
    Q, K, V = check_qkv(Q, K, V)
    beta = _beta(beta, K.shape[0])
    return _gdn_loop(Q, K, V, np.ones(K.shape[0]), beta)


def deltanet_parallel(Q, K, V, beta=None) -> np.ndarray:
    """DeltaNet in the article's matrix form ``O = (QK^T ⊙ M)(I + Diag(beta)KK^T ⊙ M^-)^{-1} Diag(beta) V``.

    The inverse is applied by :func:`forward_substitution` (``O(n^2 d)``), never formed.

    Defined in Chapter 6 (The inverse trick).
    """
    Q, K, V = check_qkv(Q, K, V)
    beta = _beta(beta, K.shape[0])
    B = np.tril(beta[:, None] * (K @ K.T), k=-1)     # (Diag(β) K Kᵀ) ⊙ M⁻
    U = forward_substitution(B, beta[:, None] * V)   # (I + B)^{-1} Diag(β) V
    return np.tril(Q @ K.T) @ U                      # (Q Kᵀ ⊙ M) U


def deltanet_attention_matrix(Q, K, beta=None) -> np.ndarray:
    """DeltaNet's attention matrix ``P = (QK^T ⊙ M)(I + Diag(beta)KK^T ⊙ M^-)^{-1} Diag(beta)``,
    ``(n, n)`` and lower triangular: :func:`deltanet_parallel` is ``P V``. The inverse is applied by
    :func:`forward_substitution` to ``Diag(beta)`` (``O(n^3)``: for showing the matrix, not for
    computing outputs). Chapter 6: Gated DeltaNet's attention matrix is ``P ⊙ Γ``.

    Defined in Chapter 6 (The inverse trick).
    """
    Q, K, _ = check_qkv(Q, K, K)
    beta = _beta(beta, K.shape[0])
    B = np.tril(beta[:, None] * (K @ K.T), k=-1)          # the book's strictly lower B
    return np.tril(Q @ K.T) @ forward_substitution(B, np.diag(beta))


def deltanet_chunkwise(Q, K, V, beta=None, *, chunk_size: int = 64) -> np.ndarray:
    """DeltaNet chunk by chunk in the WY/UT form (see the module docstring for the equations).

    Defined in Chapter 6 (The inverse trick)."""
    Q, K, V = check_qkv(Q, K, V)
    beta = _beta(beta, K.shape[0])
    C = check_chunk_size(chunk_size)
    return _gdn_chunkwise(Q, K, V, np.ones(K.shape[0]), beta, C)


# --------------------------------------------------------------------------------------------
# Gated DeltaNet
# --------------------------------------------------------------------------------------------
def gated_deltanet_recurrent(Q, K, V, alpha, beta=None) -> np.ndarray:
    """Gated DeltaNet: ``S_t = alpha_t S_{t-1}(I - beta_t k_t k_t^T) + beta_t v_t k_t^T``, ``o_t = S_t q_t``.

    ``alpha``: ``(n,)`` in ``(0, 1]``; ``beta``: ``(n,)`` in ``(0, 2]`` (default all ones).

    Defined in Chapter 6 (The inverse trick).
    """
    Q, K, V = check_qkv(Q, K, V)
    n = K.shape[0]
    return _gdn_loop(Q, K, V, _alpha(alpha, n), _beta(beta, n))


def _segment_log_decay(log_alpha):
    """``L_ij = b_i - b_j`` for ``j <= i`` (``b`` the cumulative sum of ``log_alpha``), ``-inf`` above."""
    b = np.cumsum(log_alpha)
    D = b[:, None] - b[None, :]
    D[np.triu_indices(len(b), k=1)] = -np.inf      # mask before exp: no overflow above the diagonal
    return b, D


def gated_deltanet_parallel(Q, K, V, alpha, beta=None) -> np.ndarray:
    """Gated DeltaNet in matrix form: ``O = (QK^T ⊙ Γ)(I + Diag(beta)(KK^T ⊙ Γ ⊙ M^-))^{-1} Diag(beta) V``.

    ``Γ_ij = prod_{tau=j+1..i} alpha_tau = exp(b_i - b_j)`` for ``j <= i``, from differences of the
    log cumulative sum ``b`` (so every exponent is ``<= 0``).

    Defined in Chapter 6 (The inverse trick).
    """
    Q, K, V = check_qkv(Q, K, V)
    n = K.shape[0]
    alpha, beta = _alpha(alpha, n), _beta(beta, n)
    _, D = _segment_log_decay(np.log(alpha))
    G = np.exp(D)                                    # Γ, zero above the diagonal
    BG = np.tril(beta[:, None] * (K @ K.T) * G, k=-1)  # B ⊙ Γ
    U = forward_substitution(BG, beta[:, None] * V)  # (I + B ⊙ Γ)^{-1} Diag(β) V
    return ((Q @ K.T) * G) @ U                       # (Q Kᵀ ⊙ Γ) U


def _gdn_chunkwise(Q, K, V, alpha, beta, C):
    n, d_k = K.shape
    d_v = V.shape[1]
    S = np.zeros((d_v, d_k))
    O = np.empty((n, d_v))
    log_alpha = np.log(alpha)
    for s in range(0, n, C):                     # the chunk [s, e), entered with S
        e = min(s + C, n)
        q, k, v, bt = Q[s:e], K[s:e], V[s:e], beta[s:e]
        b, D = _segment_log_decay(log_alpha[s:e])  # b_i, restarting in each chunk
        G = np.exp(D)                            # Γ: the causal mask M if no gate
        gam = np.exp(b)                          # decay from the chunk start to i
        A = np.tril(bt[:, None] * (k @ k.T) * G, k=-1)
        # the UT transform T = (I + A)^{-1}, applied by forward substitution
        rhs = np.concatenate([gam[:, None] * k, v], axis=1)
        WU = forward_substitution(A, bt[:, None] * rhs)
        W, U_tilde = WU[:, :d_k], WU[:, d_k:]    # W and Ũ do not depend on S
        U = U_tilde - W @ S.T                    # the pseudo-values, given S
        O[s:e] = gam[:, None] * (q @ S.T) + ((q @ k.T) * G) @ U
        S = np.exp(b[-1]) * S + (np.exp(b[-1] - b)[:, None] * U).T @ k
    return O


def gated_deltanet_chunkwise(Q, K, V, alpha, beta=None, *, chunk_size: int = 64) -> np.ndarray:
    """Gated DeltaNet chunk by chunk (WY/UT form with in-chunk log decays; see the module docstring).

    Here ``W = T Diag(beta) Diag(exp(b)) K``: the entering state is seen through the in-chunk decay.

    Defined in Chapter 6 (The inverse trick).
    """
    Q, K, V = check_qkv(Q, K, V)
    n = K.shape[0]
    alpha, beta = _alpha(alpha, n), _beta(beta, n)
    return _gdn_chunkwise(Q, K, V, alpha, beta, check_chunk_size(chunk_size))


# --------------------------------------------------------------------------------------------
# Comba and its equivalence with Gated DeltaNet
# --------------------------------------------------------------------------------------------
def comba_recurrent(Q, K, V, gamma, eta) -> np.ndarray:
    """The Comba form: ``S_t = gamma_t S_{t-1} + eta_t (v_t - S_{t-1} k_t) k_t^T``, ``o_t = S_t q_t``.

    The forget factor multiplies only the first ``S_{t-1}``: this is SGD on
    ``1/2 ||S k - v||^2 + lam/2 ||S||_F^2`` with ``gamma = 1 - eta lam``. ``gamma``: ``(n,)`` in
    ``(0, 1]``; ``eta``: ``(n,)``, positive.

    Defined in Chapter 6 (The inverse trick).
    """
    Q, K, V = check_qkv(Q, K, V)
    n, d_k = K.shape
    gamma = _alpha_named(gamma, "gamma", n)
    eta = check_positive(eta, "eta", (n,))
    S = np.zeros((V.shape[1], d_k))
    O = np.empty((n, V.shape[1]))
    for t in range(n):
        S = gamma[t] * S + eta[t] * np.outer(V[t] - S @ K[t], K[t])
        O[t] = S @ Q[t]
    return O


def _alpha_named(g, name, n):
    return check_gate(g, name, (n,))


def gated_deltanet_to_comba(K, V, alpha, beta=None):
    """Map Gated DeltaNet inputs to Comba inputs that give the same states and outputs.

    ``alpha S (I - beta k k^T) + beta v k^T = alpha S + (alpha beta)(v / alpha - S k) k^T``, so
    Comba with ``gamma = alpha``, ``eta = alpha beta`` and values ``v / alpha`` (keys and queries
    unchanged). Returns ``(K, V', gamma, eta)``.

    Defined in Chapter 6 (The inverse trick).
    """
    K = as_array(K, "K", ("n", "d_k"))
    n = K.shape[0]
    V = as_array(V, "V", (n, "d_v"))
    alpha, beta = _alpha(alpha, n), _beta(beta, n)
    return K.copy(), V / alpha[:, None], alpha.copy(), alpha * beta


def comba_to_gated_deltanet(K, V, gamma, eta):
    """Map Comba inputs to Gated DeltaNet inputs that give the same states and outputs.

    Comba's ``gamma S + eta (v - S k) k^T`` equals ``gamma S (I - (eta/gamma) k k^T) + (eta/gamma)(gamma v) k^T``.
    Gated DeltaNet's ``beta`` must stay in ``(0, 2]``; when ``eta/gamma > 2`` the key is rescaled,
    ``k' = c k`` with ``c = sqrt(eta / (2 gamma))``, so that ``beta' = eta / (gamma c^2) = 2`` and the
    value becomes ``v' = gamma c v`` (the state, hence ``o_t = S_t q_t`` with ``q`` unchanged, is the
    same). Returns ``(K', V', alpha, beta)``.

    Defined in Chapter 6 (The inverse trick).
    """
    K = as_array(K, "K", ("n", "d_k"))
    n = K.shape[0]
    V = as_array(V, "V", (n, "d_v"))
    gamma = _alpha_named(gamma, "gamma", n)
    eta = check_positive(eta, "eta", (n,))
    ratio = eta / gamma
    c = np.where(ratio > 2.0, np.sqrt(ratio / 2.0), 1.0)    # key rescaling where beta would exceed 2
    beta = np.where(ratio > 2.0, 2.0, ratio)                  # = ratio / c^2, without round-off past 2
    return c[:, None] * K, (gamma * c)[:, None] * V, gamma.copy(), beta


def comba_parallel(Q, K, V, gamma, eta) -> np.ndarray:
    """Comba in matrix form: Gated DeltaNet's :func:`gated_deltanet_parallel` on the inputs
    :func:`comba_to_gated_deltanet` maps Comba's to (the two recurrences have the same states, so the
    same attention matrix after the change of variables). Arguments as :func:`comba_recurrent`.

    Defined in Chapter 6 (The inverse trick)."""
    Q = as_array(Q, "Q", ("n", "d_k"))
    K2, V2, alpha, beta = comba_to_gated_deltanet(K, V, gamma, eta)
    return gated_deltanet_parallel(Q, K2, V2, alpha, beta)


def comba_chunkwise(Q, K, V, gamma, eta, *, chunk_size: int = 64) -> np.ndarray:
    """Comba chunk by chunk: :func:`gated_deltanet_chunkwise` on the mapped inputs, as
    :func:`comba_parallel`.

    Defined in Chapter 6 (The inverse trick)."""
    Q = as_array(Q, "Q", ("n", "d_k"))
    K2, V2, alpha, beta = comba_to_gated_deltanet(K, V, gamma, eta)
    return gated_deltanet_chunkwise(Q, K2, V2, alpha, beta, chunk_size=chunk_size)


# --------------------------------------------------------------------------------------------
# DeltaProduct
# --------------------------------------------------------------------------------------------
def _deltaproduct_inputs(Q, K, V, beta, alpha):
    """Validated DeltaProduct inputs as float64 arrays; ``alpha`` ones when ``None``."""
    K = as_array(K, "K", ("n", "m", "d_k"))
    n, m, d_k = K.shape
    Q = as_array(Q, "Q", (n, d_k))
    V = as_array(V, "V", (n, m, "d_v"))
    beta = check_gate(beta, "beta", (n, m), low=0.0, high=2.0)
    alpha = np.ones(n) if alpha is None else _alpha(alpha, n)
    return Q, K, V, beta, alpha


def deltaproduct_recurrent(Q, K, V, beta, alpha=None) -> np.ndarray:
    """DeltaProduct: ``m`` delta-rule steps per token, then a read.

    ``Q``: ``(n, d_k)``; ``K``: ``(n, m, d_k)``; ``V``: ``(n, m, d_v)``; ``beta``: ``(n, m)`` in
    ``(0, 2]``; optional ``alpha``: ``(n,)`` in ``(0, 1]`` applied once per token (Gated DeltaProduct).
    For token ``t``: ``S <- alpha_t S``, then for ``i = 1..m``,
    ``S <- S (I - beta_{t,i} k_{t,i} k_{t,i}^T) + beta_{t,i} v_{t,i} k_{t,i}^T``; finally ``o_t = S q_t``.
    The state transition per token is a product of ``m`` generalised Householder matrices.
    ``m = 1`` is DeltaNet (Gated DeltaNet with ``alpha``).

    Defined in Chapter 6 (The inverse trick).
    """
    Q, K, V, beta, alpha = _deltaproduct_inputs(Q, K, V, beta, alpha)
    n, m, d_k = K.shape
    S = np.zeros((V.shape[2], d_k))
    O = np.empty((n, V.shape[2]))
    for t in range(n):
        S = alpha[t] * S
        for i in range(m):
            k = K[t, i]
            S = S + beta[t, i] * np.outer(V[t, i] - S @ k, k)
        O[t] = S @ Q[t]
    return O


def _deltaproduct_steps(Q, K, V, beta, alpha):
    """DeltaProduct as Gated DeltaNet on ``n·m`` micro-steps: token ``t``'s ``m`` keys, values and
    ``beta`` in turn, its gate on the first of them (``1`` on the others), its query on the last
    (zeros elsewhere; those outputs are dropped). Returns the flattened inputs and ``m``."""
    Q, K, V, beta, alpha = _deltaproduct_inputs(Q, K, V, beta, alpha)
    n, m, d_k = K.shape
    a_steps = np.ones((n, m))
    a_steps[:, 0] = alpha
    q_steps = np.zeros((n, m, d_k))
    q_steps[:, -1] = Q
    return (q_steps.reshape(n * m, d_k), K.reshape(n * m, d_k), V.reshape(n * m, -1), a_steps.reshape(-1),
            beta.reshape(-1), m)


def deltaproduct_parallel(Q, K, V, beta, alpha=None) -> np.ndarray:
    """DeltaProduct in matrix form: :func:`gated_deltanet_parallel` over the ``n·m`` micro-steps
    (one per Householder factor), read at the last micro-step of each token. The product of ``m``
    factors per token is ``m`` rows of the one unit lower-triangular solve. Arguments as
    :func:`deltaproduct_recurrent`.

    Defined in Chapter 6 (The inverse trick)."""
    Qs, Ks, Vs, a, b, m = _deltaproduct_steps(Q, K, V, beta, alpha)
    return gated_deltanet_parallel(Qs, Ks, Vs, a, b)[m - 1::m]


def deltaproduct_chunkwise(Q, K, V, beta, alpha=None, *, chunk_size: int = 64) -> np.ndarray:
    """DeltaProduct chunk by chunk over the micro-steps (``chunk_size`` of them per chunk), as
    :func:`deltaproduct_parallel`; the kernel ``chunk_gated_delta_product`` takes the same route.

    Defined in Chapter 6 (The inverse trick)."""
    Qs, Ks, Vs, a, b, m = _deltaproduct_steps(Q, K, V, beta, alpha)
    return gated_deltanet_chunkwise(Qs, Ks, Vs, a, b, chunk_size=chunk_size)[m - 1::m]


# --------------------------------------------------------------------------------------------
# Gated DeltaNet as DeltaNet through the cumulative gate (exact, and where it breaks)
# --------------------------------------------------------------------------------------------
def gated_deltanet_via_cumulative_alpha(Q, K, V, alpha, beta=None, *, dtype=np.float64) -> np.ndarray:
    """Gated DeltaNet computed as plain DeltaNet on rescaled inputs.

    With ``abar_t = prod_{tau<=t} alpha_tau`` the state ``S'_t = S_t / abar_t`` obeys DeltaNet's rule
    with values ``v_t / abar_t``, and ``o_t = S'_t (abar_t q_t)``. So DeltaNet on
    ``(abar ⊙ Q, K, V / abar)`` is Gated DeltaNet. Exact in exact arithmetic; in floating point
    ``abar_t`` underflows and ``1/abar_t`` overflows once ``sum log alpha`` passes the ``dtype``'s
    exponent range (see :func:`cumulative_alpha_breakdown`). ``dtype``: the floating type the
    rescaling and the recurrence run in (float64 or float32); the result is returned as float64.

    Defined in Chapter 6 (The inverse trick).
    """
    Q, K, V = check_qkv(Q, K, V)
    n = K.shape[0]
    alpha, beta = _alpha(alpha, n), _beta(beta, n)
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype must be float32 or float64; got {dtype}")
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        abar = np.cumprod(alpha.astype(dtype))     # the cumulative product, as the rewriting needs it
        Qs = Q.astype(dtype) * abar[:, None]
        Vs = V.astype(dtype) / abar[:, None]
        O = _gdn_loop(Qs, K.astype(dtype), Vs, np.ones(n, dtype=dtype), beta.astype(dtype), dtype=dtype)
    return O.astype(np.float64)


def cumulative_alpha_breakdown(lengths, alpha: float, *, d_k: int = 8, d_v: int = 8, seed: int = 0,
                               dtypes=("float32", "float64")) -> dict:
    """Measure where the cumulative-gate rewriting of Gated DeltaNet breaks, per length and dtype.

    For each ``n`` in ``lengths``: random inputs (unit-norm keys, ``beta = 1``), a constant gate
    ``alpha``; the error of :func:`gated_deltanet_via_cumulative_alpha` run in each dtype against
    :func:`gated_deltanet_recurrent` in float64, relative to the reference's largest entry (``inf``
    when the result holds NaN/inf). Also the log10 of ``abar_n = alpha^n``, and for each dtype the
    length past which ``1/abar`` cannot be represented (``log(1/abar) > log(max)``) and the length
    past which ``abar`` falls below the smallest normal number (``tiny``; it then loses precision and,
    further on, becomes 0).

    Returns ``{"lengths", "log10_abar", "error": {dtype: array}, "overflow_length": {dtype: float},
    "underflow_length": {dtype: float}}``.

    Defined in Chapter 6 (The inverse trick).
    """
    lengths = [int(x) for x in lengths]
    if not lengths or min(lengths) < 1:
        raise ValueError(f"lengths must be a non-empty list of positive integers; got {lengths!r}")
    alpha = float(check_gate(alpha, "alpha", ()))
    rng = np.random.default_rng(seed)
    n_max = max(lengths)
    Q = rng.normal(size=(n_max, d_k))
    K = rng.normal(size=(n_max, d_k))
    K /= np.linalg.norm(K, axis=1, keepdims=True)
    V = rng.normal(size=(n_max, d_v))
    out = {"lengths": np.array(lengths), "log10_abar": np.array(lengths) * np.log10(alpha),
           "error": {}, "overflow_length": {}, "underflow_length": {}}
    refs = {n: gated_deltanet_recurrent(Q[:n], K[:n], V[:n], np.full(n, alpha)) for n in lengths}
    for name in dtypes:
        dt = np.dtype(name)
        errs = []
        for n in lengths:
            got = gated_deltanet_via_cumulative_alpha(Q[:n], K[:n], V[:n], np.full(n, alpha), dtype=dt)
            ref = refs[n]
            if not np.all(np.isfinite(got)):
                errs.append(np.inf)
            else:
                errs.append(float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-300)))
        out["error"][name] = np.array(errs)
        log_max = np.log(np.finfo(dt).max)
        out["overflow_length"][name] = np.inf if alpha == 1.0 else log_max / -np.log(alpha)
        out["underflow_length"][name] = np.inf if alpha == 1.0 else np.log(np.finfo(dt).tiny) / np.log(alpha)
    return out


# --------------------------------------------------------------------------------------------
# the overwriting experiment of Chapter 5: x = 5, later x = 10, read x
# --------------------------------------------------------------------------------------------
def overwrite_experiment(n_interfering: int, *, beta: float = 1.0, where: str = "between", d_k: int = 32,
                         value_scale: float = 5.0, trials: int = 30, seed: int = 0) -> dict:
    """Write ``(k_x, 5)``, later ``(k_x, 10)``, read with ``q = k_x``; ``n_interfering`` other writes.

    The other writes have random unit keys and values ``value_scale * N(0, 1)``. ``where``:
    ``"between"`` puts them all between the two assignments (the stale value must be replaced),
    ``"after"`` puts them all after the second one (the fresh value must survive them).
    Keys are unit vectors in ``d_k`` dimensions. Returns ``{"linear": reads, "delta": reads}``, one
    read per trial: plain linear attention (``S_t = S_{t-1} + v_t k_t^T``, so the read is
    ``sum_j (k_j · k_x) v_j``) and DeltaNet with the given ``beta`` (all writes).

    Defined in Chapter 5 (The delta rule).
    """
    if where not in ("between", "after"):
        raise ValueError(f"where must be 'between' or 'after'; got {where!r}")
    if isinstance(n_interfering, bool) or not isinstance(n_interfering, (int, np.integer)) or n_interfering < 0:
        raise ValueError(f"n_interfering must be a non-negative integer; got {n_interfering!r}")
    m = int(n_interfering)
    beta = float(check_gate(beta, "beta", (), low=0.0, high=2.0))
    d_k, trials = check_int(d_k, "d_k", 1), check_int(trials, "trials", 1)
    value_scale = float(as_array(value_scale, "value_scale", ()))
    rng = np.random.default_rng(seed)
    lin, dn = np.empty(trials), np.empty(trials)
    for r in range(trials):
        keys = rng.normal(size=(m + 1, d_k))
        keys /= np.linalg.norm(keys, axis=1, keepdims=True)
        kx, Ki = keys[0], keys[1:]
        Vi = value_scale * rng.normal(size=(m, 1))
        if where == "between":
            K = np.vstack([kx, Ki, kx])
            V = np.vstack([[5.0], Vi, [10.0]])
        else:
            K = np.vstack([kx, kx, Ki])
            V = np.vstack([[5.0], [10.0], Vi])
        Q = np.zeros_like(K)
        Q[-1] = kx
        lin[r] = float((K @ kx) @ V[:, 0])                      # linear attention's read at the end
        dn[r] = deltanet_recurrent(Q, K, V, np.full(len(K), beta))[-1, 0]
    return {"linear": lin, "delta": dn}
