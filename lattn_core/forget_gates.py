"""Chapter 3 ("Forget gates"): scalar decay (RetNet, Mamba2), vector decay (GLA), RoPE as a complex
decay, the decay mask Γ, the associative scan, and which gates admit the chunkwise matmul form.

Convention B throughout: ``S_t`` is ``(d_v, d_k)``, ``o_t = S_t q_t``. Gates are factors in ``(0, 1]``.
Every stable form below works with *cumulative sums of log gates* and uses only their differences
``b_i - b_j`` with ``j <= i`` (which are ``<= 0``), never a ratio of cumulative products: a product of
many small gates underflows to 0, and ``0 / 0`` is NaN.
"""
from __future__ import annotations

import numpy as np

from ._validate import as_array, check_chunk_size, check_gate, check_int, check_qkv
from .linear_attention import recall_experiment

__all__ = [
    "decay_attention_recurrent", "decay_attention_parallel", "decay_attention_chunkwise",
    "gla_attention_recurrent", "gla_attention_parallel", "gla_attention_chunkwise",
    "decay_mask", "log_decay_mask", "decay_mask_naive", "decay_attention_rescaled",
    "rope_rotate", "rope_decay_attention_complex", "rope_decay_attention_rotated",
    "compose_affine", "linear_recurrence_scan", "linear_recurrence_loop", "gated_attention_scan",
    "matrix_gate_attention_recurrent", "matrix_gate_attention_parallel", "pairwise_transitions",
    "elementwise_gate_attention_recurrent", "elementwise_gate_attention_parallel",
    "is_outer_product_gate", "outer_gate_attention_chunkwise",
    "chunk_pair_levels", "gla_scores_by_levels", "topic_recall",
]


def _check_scalar_gate(gamma, n):
    return check_gate(gamma, "gamma", (n,))


def _check_vector_gate(gamma, n, d_k):
    return check_gate(gamma, "gamma", (n, d_k))


def _masked_exp(diff, causal):
    """``exp(diff)`` where ``causal`` is True and exactly 0 elsewhere (no overflow above the diagonal)."""
    return np.exp(np.where(causal, diff, -np.inf))


# --------------------------------------------------------------------------------------------
# The decay mask Γ
# --------------------------------------------------------------------------------------------
def log_decay_mask(gamma) -> np.ndarray:
    """``log Γ``: ``c_i - c_j`` for ``j <= i`` (0 on the diagonal) and ``-inf`` above it, with
    ``c = cumsum(log gamma)``.

    Never the log of :func:`decay_mask`: an entry of ``Γ`` that underflows to 0 has a finite log
    here (``-1e4`` is a fine exponent to add to a score, ``log 0 = -inf`` is not). ``gamma``:
    ``(n,)`` in ``(0, 1]``. Chapter 7 adds this to softmax scores (ALiBi, FoX).

    Defined in Chapter 7 (Feeding back).
    """
    g = as_array(gamma, "gamma", ("n",))
    g = _check_scalar_gate(g, g.shape[0])
    c = np.cumsum(np.log(g))         # c_i = sum of log gamma_tau, tau <= i
    n = g.shape[0]
    # c_i - c_j <= 0 for j <= i (ch3-gamma, in logs); -inf above the diagonal
    return np.where(np.tri(n, dtype=bool), c[:, None] - c[None, :], -np.inf)


def decay_mask(gamma) -> np.ndarray:
    """``Γ_ij = prod_{tau=j+1..i} gamma_tau`` for ``j <= i`` (1 on the diagonal), 0 above it.

    Computed as ``exp(c_i - c_j)`` with ``c = cumsum(log gamma)`` (:func:`log_decay_mask`): every
    exponent is ``<= 0``, so entries underflow gracefully to 0 and never become NaN. ``gamma``:
    ``(n,)`` in ``(0, 1]``.

    Defined in Chapter 3 (Forget gates).
    """
    return np.exp(log_decay_mask(gamma))


def decay_mask_naive(gamma) -> np.ndarray:
    """The textbook construction ``Γ_ij = P_i / P_j`` with ``P_i = prod_{tau<=i} gamma_tau``.

    Mathematically equal to :func:`decay_mask`, numerically broken: once ``P`` underflows to 0
    (e.g. 0.01^162 rounds to 0 in float64) the ratio is ``0/0 = NaN``, and before that it loses accuracy.
    Kept to show the failure; never use it.

    Defined in Chapter 3 (Forget gates).
    """
    g = as_array(gamma, "gamma", ("n",))
    g = _check_scalar_gate(g, g.shape[0])
    P = np.cumprod(g)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        R = P[:, None] / P[None, :]
    return np.where(np.tri(g.shape[0], dtype=bool), R, 0.0)


# --------------------------------------------------------------------------------------------
# Scalar decay: S_t = gamma_t S_{t-1} + v_t k_t^T
# --------------------------------------------------------------------------------------------
def decay_attention_recurrent(Q, K, V, gamma) -> np.ndarray:
    """``S_t = gamma_t S_{t-1} + v_t k_t^T``, ``o_t = S_t q_t``. ``gamma``: ``(n,)`` in ``(0, 1]``.

    A constant ``gamma`` is RetNet's retention; a data-dependent ``gamma_t`` is Mamba2's scalar gate.

    Defined in Chapter 3 (Forget gates).
    """
    Q, K, V = check_qkv(Q, K, V)
    n, d_k = K.shape
    g = _check_scalar_gate(gamma, n)
    S = np.zeros((V.shape[1], d_k))              # S_0 = 0
    O = np.empty((n, V.shape[1]))
    for t in range(n):
        S = g[t] * S + np.outer(V[t], K[t])      # forget, then write (ch3-retnet)
        O[t] = S @ Q[t]                          # read, as in Chapter 2
    return O


def decay_attention_parallel(Q, K, V, gamma) -> np.ndarray:
    """``O = (Q K^T ⊙ Γ) V`` with the decay mask ``Γ`` of :func:`decay_mask`.

    Defined in Chapter 3 (Forget gates)."""
    Q, K, V = check_qkv(Q, K, V)
    _check_scalar_gate(gamma, K.shape[0])
    return ((Q @ K.T) * decay_mask(gamma)) @ V


def decay_attention_chunkwise(Q, K, V, gamma, *, chunk_size: int = 64) -> np.ndarray:
    """Chunk by chunk, with ``b`` the cumulative log gate *inside* the chunk (``b_i <= 0``)::

        O_c = Diag(e^b) Q_c S^T + (Q_c K_c^T ⊙ exp(b_i - b_j) ⊙ M) V_c
        S  <- e^{b_C} S + V_c^T Diag(e^{b_C - b}) K_c

    Every exponent is a difference ``<= 0``: no overflow, no ``0/0``, for any gates and any ``n``.

    Defined in Chapter 3 (Forget gates).
    """
    Q, K, V = check_qkv(Q, K, V)
    C = check_chunk_size(chunk_size)
    n, d_k = K.shape
    logg = np.log(_check_scalar_gate(gamma, n))
    S = np.zeros((V.shape[1], d_k))
    O = np.empty((n, V.shape[1]))
    for s in range(0, n, C):
        q, k, v = Q[s:s + C], K[s:s + C], V[s:s + C]
        b = np.cumsum(logg[s:s + C])     # b_i: log gates summed inside the chunk
        L = len(b)
        # the chunk's block of the decay mask, exp(b_i - b_j) for j <= i, else 0
        G = _masked_exp(b[:, None] - b[None, :], np.tri(L, dtype=bool))
        # (ch3-chunk): the decayed read of the old state, plus P V in the chunk
        O[s:s + C] = np.exp(b)[:, None] * (q @ S.T) + ((q @ k.T) * G) @ v
        # (ch3-chunk): decay the state by e^(b_C), add the chunk's decayed writes
        S = np.exp(b[-1]) * S + (v * np.exp(b[-1] - b)[:, None]).T @ k
    return O


def decay_attention_rescaled(Q, K, V, gamma) -> np.ndarray:
    """Decay as a diagonal rescaling of plain linear attention (exact math, unstable numerics)::

        (Q K^T ⊙ Γ) V = ((Diag(P) Q)(Diag(P)^{-1} K)^T ⊙ M) V,   P_i = prod_{tau<=i} gamma_tau

    ``gamma`` is ``(n,)`` (scalar decay) or ``(n, d_k)`` (GLA: ``P`` is then per dimension and
    multiplies ``Q``, divides ``K`` elementwise). ``1/P`` overflows (and ``P`` underflows) once the
    cumulative product leaves float64's range, giving inf/NaN; even before that, ``q_i P_i`` and
    ``k_j / P_j`` differ by up to ``1/P_n`` in size, so round-off is amplified. Shown, not used.

    Defined in Chapter 3 (Forget gates).
    """
    Q, K, V = check_qkv(Q, K, V)
    n, d_k = K.shape
    g = as_array(gamma, "gamma", None)
    g = _check_scalar_gate(g, n)[:, None] if g.ndim == 1 else _check_vector_gate(g, n, d_k)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        P = np.cumprod(g, axis=0) * np.ones((1, d_k))
        return np.tril((Q * P) @ (K / P).T) @ V


# --------------------------------------------------------------------------------------------
# Vector decay (GLA): S_t = S_{t-1} Diag(gamma_t) + v_t k_t^T
# --------------------------------------------------------------------------------------------
def gla_attention_recurrent(Q, K, V, gamma) -> np.ndarray:
    """``S_t = S_{t-1} Diag(gamma_t) + v_t k_t^T``, ``o_t = S_t q_t``. ``gamma``: ``(n, d_k)``.

    Defined in Chapter 3 (Forget gates)."""
    Q, K, V = check_qkv(Q, K, V)
    n, d_k = K.shape
    g = _check_vector_gate(gamma, n, d_k)
    S = np.zeros((V.shape[1], d_k))
    O = np.empty((n, V.shape[1]))
    for t in range(n):
        S = S * g[t][None, :] + np.outer(V[t], K[t])
        O[t] = S @ Q[t]
    return O


def _gla_scores(q, k, b):
    """``A_ij = sum_c q_ic k_jc exp(b_ic - b_jc)`` for ``j <= i`` (0 above): the GLA score matrix."""
    L = q.shape[0]
    causal = np.tri(L, dtype=bool)[:, :, None]
    D = _masked_exp(b[:, None, :] - b[None, :, :], causal)            # (L, L, d_k)
    return np.einsum("ic,jc,ijc->ij", q, k, D)


def gla_attention_parallel(Q, K, V, gamma) -> np.ndarray:
    """``o_i = sum_{j<=i} (sum_c q_ic k_jc prod_{tau=j+1..i} gamma_tau,c) v_j``: one decay mask per
    key dimension (an ``(n, n, d_k)`` tensor, from cumulative-log differences).

    Defined in Chapter 3 (Forget gates)."""
    Q, K, V = check_qkv(Q, K, V)
    n, d_k = K.shape
    c = np.cumsum(np.log(_check_vector_gate(gamma, n, d_k)), axis=0)
    return _gla_scores(Q, K, c) @ V


def gla_attention_chunkwise(Q, K, V, gamma, *, chunk_size: int = 16) -> np.ndarray:
    """Chunk by chunk, ``b`` the within-chunk cumulative log gate (``(C, d_k)``, entries ``<= 0``)::

        o_i = S (e^{b_i} ⊙ q_i) + sum_{j<=i in chunk} (sum_c q_ic k_jc e^{b_ic - b_jc}) v_j
        S  <- S Diag(e^{b_C}) + V_c^T (K_c ⊙ e^{b_C - b})

    Defined in Chapter 3 (Forget gates).
    """
    Q, K, V = check_qkv(Q, K, V)
    C = check_chunk_size(chunk_size)
    n, d_k = K.shape
    logg = np.log(_check_vector_gate(gamma, n, d_k))
    S = np.zeros((V.shape[1], d_k))
    O = np.empty((n, V.shape[1]))
    for s in range(0, n, C):
        q, k, v = Q[s:s + C], K[s:s + C], V[s:s + C]
        b = np.cumsum(logg[s:s + C], axis=0)
        O[s:s + C] = (q * np.exp(b)) @ S.T + _gla_scores(q, k, b) @ v
        S = S * np.exp(b[-1])[None, :] + v.T @ (k * np.exp(b[-1][None, :] - b))
    return O


def chunk_pair_levels(chunk_size: int) -> np.ndarray:
    """The level of every pair ``(i, j)`` of a chunk in the GLA kernel's factorisation of the scores.

    Rows and columns count from 0. For ``i > j`` the level is ``l = 1 + `` the position of the highest
    bit in which ``i`` and ``j`` differ: the pair lies in an aligned block of ``2h`` rows,
    ``h = 2^(l-1)``, with ``i`` in the block's second half and ``j`` in its first, and the last row of
    the first half, ``rho = (i // 2h) * 2h + h - 1``, satisfies ``j <= rho < i``. The diagonal is 0,
    the entries above it -1. A chunk of ``C`` rows has ``ceil(log2 C)`` levels.

    Defined in Chapter 3 (Forget gates).
    """
    C = check_chunk_size(chunk_size)
    i, j = np.arange(C)[:, None], np.arange(C)[None, :]
    levels = np.frexp((i ^ j).astype(float))[1]          # bit length of i XOR j (0 for i = j)
    return np.where(j > i, -1, levels).astype(int)


def gla_scores_by_levels(Q, K, gamma) -> np.ndarray:
    """The GLA scores of one chunk, ``P_ij = sum_κ q_iκ k_jκ prod_{τ=j+1..i} gamma_τκ`` (``j <= i``,
    0 above), computed level by level as the kernels do (:func:`chunk_pair_levels`).

    With ``b`` the chunk's cumulative log gates, ``e^{b_i - b_j} = e^{b_i - b_rho} e^{b_rho - b_j}`` for
    the pair's reference row ``rho``; at one level ``rho`` depends on the row alone, so the level's
    scores are ONE product of the ``(C, d_k)`` matrices ``Q ⊙ e^{b - b_rho}`` (rows in second halves)
    and ``K ⊙ e^{b_rho - b}`` (rows in first halves), masked to the level's pairs. Every exponent is
    ``<= 0``: finite for any gates. ``Q``, ``K``, ``gamma``: ``(C, d_k)``, gates in ``(0, 1]``.

    Defined in Chapter 3 (Forget gates).
    """
    K = as_array(K, "K", ("C", "d_k"))
    Q = as_array(Q, "Q", K.shape)
    C, d_k = K.shape
    b = np.cumsum(np.log(check_gate(gamma, "gamma", (C, d_k))), axis=0)
    levels = chunk_pair_levels(C)
    rows = np.arange(C)
    P = np.diag(np.sum(Q * K, axis=1))
    for lv in range(1, int(levels.max()) + 1):
        h = 2 ** (lv - 1)
        rho = np.minimum((rows // (2 * h)) * 2 * h + h - 1, C - 1)
        second = ((rows // h) % 2 == 1)[:, None]
        q_f = np.exp(np.where(second, b - b[rho], -np.inf)) * Q       # 0 on first-half rows
        k_f = np.exp(np.where(second, -np.inf, b[rho] - b)) * K       # 0 on second-half rows
        P += np.where(levels == lv, q_f @ k_f.T, 0.0)
    return P


# --------------------------------------------------------------------------------------------
# RoPE as a complex decay
# --------------------------------------------------------------------------------------------
def _check_theta(theta, d_k):
    if d_k % 2:
        raise ValueError(f"RoPE pairs dimensions: d_k must be even; got d_k = {d_k}")
    return as_array(theta, "theta", (d_k // 2,))


def rope_rotate(X, theta) -> np.ndarray:
    """Rotary position embedding: rotate the pair ``(x_{t,2m}, x_{t,2m+1})`` of row ``t`` (``t = 1..n``)
    by the angle ``t theta_l``. ``X``: ``(n, d)`` with ``d`` even; ``theta``: ``(d/2,)``.

    Defined in Chapter 3 (Forget gates)."""
    X = as_array(X, "X", ("n", "d"))
    theta = _check_theta(theta, X.shape[1])
    ang = np.arange(1, X.shape[0] + 1)[:, None] * theta[None, :]
    x, y = X[:, 0::2], X[:, 1::2]
    out = np.empty_like(X)
    out[:, 0::2] = x * np.cos(ang) - y * np.sin(ang)
    out[:, 1::2] = x * np.sin(ang) + y * np.cos(ang)
    return out


def rope_decay_attention_complex(Q, K, V, gamma, theta) -> np.ndarray:
    """A linear RNN with the *complex* decay ``gamma_t e^{i theta}`` (RetNet's view of RoPE).

    Pair the dimensions of ``q`` and ``k`` as complex numbers, ``q~_m = q_{2m} + i q_{2m+1}``; the
    state is complex, ``(d_v, d_k/2)``::

        S_t = S_{t-1} Diag(gamma_t e^{i theta}) + v_t conj(k~_t)^T,     o_t = Re(S_t q~_t)

    Unrolled, ``o_t = sum_j v_j gamma_{j+1..t} Re(sum_l q~_tl conj(k~_jl) e^{i (t-j) theta_l})``, which
    is exactly the score of RoPE-rotated ``q_t, k_j`` times the real decay.

    Defined in Chapter 3 (Forget gates).
    """
    Q, K, V = check_qkv(Q, K, V)
    n, d_k = K.shape
    theta = _check_theta(theta, d_k)
    g = _check_scalar_gate(gamma, n)
    q = Q[:, 0::2] + 1j * Q[:, 1::2]
    k = K[:, 0::2] + 1j * K[:, 1::2]
    S = np.zeros((V.shape[1], d_k // 2), dtype=np.complex128)
    rot = np.exp(1j * theta)
    O = np.empty((n, V.shape[1]))
    for t in range(n):
        S = S * (g[t] * rot)[None, :] + np.outer(V[t], np.conj(k[t]))
        O[t] = np.real(S @ q[t])
    return O


def rope_decay_attention_rotated(Q, K, V, gamma, theta) -> np.ndarray:
    """The real form: rotate ``q`` and ``k`` by position (:func:`rope_rotate`), then scalar decay
    attention ``(R(Q) R(K)^T ⊙ Γ) V``. Equal to :func:`rope_decay_attention_complex`.

    Defined in Chapter 3 (Forget gates)."""
    Q, K, V = check_qkv(Q, K, V)
    return decay_attention_chunkwise(rope_rotate(Q, theta), rope_rotate(K, theta), V, gamma)


# --------------------------------------------------------------------------------------------
# The associative scan for h_t = A_t h_{t-1} + B_t
# --------------------------------------------------------------------------------------------
_KINDS = ("scalar", "diagonal", "elementwise", "matrix")


def _check_recurrence(A, B, kind, h0):
    if np.ndim(B) not in (2, 3):
        raise ValueError(f"B must have shape (n, m) or (n, m, p); got shape {np.shape(B)}")
    B = as_array(B, "B", ("n", "m") if np.ndim(B) == 2 else ("n", "m", "p"))
    n = B.shape[0]
    if kind is None:
        kind = {1: "scalar", 2: "diagonal", 3: "matrix"}.get(np.ndim(A))
        if kind is None:
            raise ValueError(f"A must have shape (n,), (n, m) or (n, m, m); got {np.shape(A)}")
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}; got {kind!r}")
    m = B.shape[1]
    if kind == "scalar":
        A = as_array(A, "A", (n,))
    elif kind == "diagonal":
        A = as_array(A, "A", (n, m))
    elif kind == "elementwise":
        A = as_array(A, "A", (n,) + B.shape[1:])
    else:
        A = as_array(A, "A", (n, m, m))
    if h0 is not None:
        h0 = as_array(h0, "h0", B.shape[1:])
    return A, B, kind, h0


def _apply(A, X, kind):
    """``A X`` for a batch: the gate acting on a state (or on another gate)."""
    if kind == "scalar":
        return A.reshape(A.shape + (1,) * (X.ndim - A.ndim)) * X
    if kind == "diagonal":
        return A.reshape(A.shape + (1,) * (X.ndim - A.ndim)) * X
    if kind == "elementwise":
        return A * X
    return np.matmul(A, X) if X.ndim == A.ndim else np.einsum("tij,tj->ti", A, X)


def compose_affine(second, first):
    """The scan's operator: apply ``first = (A_1, b_1)``, then ``second = (A_2, b_2)``::

        (A_2, b_2) ∘ (A_1, b_1) = (A_2 A_1, A_2 b_1 + b_2)

    since ``A_2 (A_1 h + b_1) + b_2 = (A_2 A_1) h + (A_2 b_1 + b_2)``. Works on NumPy arrays (batched
    over a leading axis with ``@``) and on SymPy matrices alike; it is associative, which is all a
    parallel prefix scan needs.

    Defined in Chapter 3 (Forget gates).
    """
    (A2, b2), (A1, b1) = second, first
    return A2 @ A1, A2 @ b1 + b2


def linear_recurrence_loop(A, B, *, kind: str | None = None, h0=None) -> np.ndarray:
    """The definition, one step at a time: ``h_t = A_t h_{t-1} + B_t`` (``h_0`` = ``h0`` or 0).

    ``A``: ``(n,)`` (scalar gate), ``(n, m)`` (diagonal), ``(n, m, m)`` (full matrix) or, with
    ``kind="elementwise"``, the shape of ``B`` (a gate multiplying the state entry by entry).
    ``B``: ``(n, m)`` or ``(n, m, p)``. Returns every ``h_t``, shape of ``B``.

    Defined in Chapter 3 (Forget gates).
    """
    A, B, kind, h0 = _check_recurrence(A, B, kind, h0)
    h = np.zeros(B.shape[1:]) if h0 is None else h0.copy()
    H = np.empty_like(B)
    for t in range(B.shape[0]):
        h = _apply(A[t:t + 1], h[None], kind)[0] + B[t]
        H[t] = h
    return H


def linear_recurrence_scan(A, B, *, kind: str | None = None, h0=None, return_rounds: bool = False):
    """All ``h_t`` of ``h_t = A_t h_{t-1} + B_t`` by a Hillis-Steele parallel prefix scan.

    Each step is the affine map ``h -> A_t h + B_t``; composing two maps (first ``(A_1, b_1)``, then
    ``(A_2, b_2)``) is the *associative* operator::

        (A_2, b_2) ∘ (A_1, b_1) = (A_2 A_1, A_2 b_1 + b_2)

    so the inclusive prefix compositions can be formed in ``ceil(log2 n)`` rounds; in round ``r``
    every position ``t >= 2^r`` composes itself with position ``t - 2^r`` (all at once: one batched
    NumPy operation per round). With ``h_0 = 0`` the ``b`` part of prefix ``t`` is ``h_t``.
    Work is ``O(n log n)`` compositions (Blelloch's two-sweep variant gets ``O(n)``), depth ``O(log n)``.
    Gates may be any real numbers here; products of small gates underflow to 0 harmlessly (no
    division). Same shapes as :func:`linear_recurrence_loop`.

    Defined in Chapter 3 (Forget gates).
    """
    A, B, kind, h0 = _check_recurrence(A, B, kind, h0)
    n = B.shape[0]
    A, b = A.copy(), B.copy()
    off, rounds = 1, 0
    while off < n:
        A_new, b_new = A.copy(), b.copy()
        if kind == "matrix" and b.ndim == 3:
            A_new[off:], b_new[off:] = compose_affine((A[off:], b[off:]), (A[:-off], b[:-off]))
        else:
            A_new[off:] = _apply(A[off:], A[:-off], kind)
            b_new[off:] = _apply(A[off:], b[:-off], kind) + b[off:]
        A, b = A_new, b_new
        off *= 2
        rounds += 1
    if h0 is not None:
        b = b + _apply(A, np.broadcast_to(h0, B.shape).copy(), kind)
    return (b, rounds) if return_rounds else b


def gated_attention_scan(Q, K, V, gamma=None) -> np.ndarray:
    """Any of this chapter's linear attentions through the associative scan.

    ``gamma``: ``None`` (plain linear attention), ``(n,)`` (scalar decay), ``(n, d_k)`` (GLA) or
    ``(n, d_k, d_k)`` (a full matrix gate, ``S_t = S_{t-1} A_t + v_t k_t^T``). The scan runs on the
    transposed state ``H_t = S_t^T`` (``(d_k, d_v)``, fla's orientation), for which the recurrence
    is ``H_t = A_t^T H_{t-1} + k_t v_t^T``; then ``o_t = H_t^T q_t``.

    Defined in Chapter 3 (Forget gates).
    """
    Q, K, V = check_qkv(Q, K, V)
    n, d_k = K.shape
    Bt = K[:, :, None] * V[:, None, :]                                 # k_t v_t^T, (n, d_k, d_v)
    if gamma is None:
        A, kind = np.ones(n), "scalar"
    else:
        g = as_array(gamma, "gamma", None)
        if g.ndim == 1:
            A, kind = _check_scalar_gate(g, n), "scalar"
        elif g.ndim == 2:
            A, kind = _check_vector_gate(g, n, d_k), "diagonal"
        elif g.ndim == 3:
            A, kind = np.swapaxes(as_array(g, "gamma", (n, d_k, d_k)), 1, 2), "matrix"
        else:
            raise ValueError(f"gamma must be None, (n,), (n, d_k) or (n, d_k, d_k); got shape {g.shape}")
    H = linear_recurrence_scan(A, Bt, kind=kind)
    return np.einsum("tkv,tk->tv", H, Q)


# --------------------------------------------------------------------------------------------
# Gates that do not factor: full matrices, and elementwise gates that are not outer products
# --------------------------------------------------------------------------------------------
def matrix_gate_attention_recurrent(Q, K, V, A) -> np.ndarray:
    """``S_t = S_{t-1} A_t + v_t k_t^T``, ``o_t = S_t q_t`` with a full ``(d_k, d_k)`` gate ``A_t``.

    Defined in Chapter 3 (Forget gates)."""
    Q, K, V = check_qkv(Q, K, V)
    n, d_k = K.shape
    A = as_array(A, "A", (n, d_k, d_k))
    S = np.zeros((V.shape[1], d_k))
    O = np.empty((n, V.shape[1]))
    for t in range(n):
        S = S @ A[t] + np.outer(V[t], K[t])
        O[t] = S @ Q[t]
    return O


def pairwise_transitions(A) -> np.ndarray:
    """``T_ij = A_{j+1} A_{j+2} ... A_i`` for ``j <= i`` (``T_ii = I``), 0 above: ``(n, n, d, d)``.

    Built row by row, ``T_ij = T_{i-1,j} A_i``: ``O(n^2 d^3)`` time and ``O(n^2 d^2)`` memory.

    Defined in Chapter 3 (Forget gates).
    """
    A = as_array(A, "A", ("n", "d", "d"))
    n, d, d2 = A.shape
    if d != d2:
        raise ValueError(f"A must have shape (n, d, d) (square gates); got {A.shape}")
    T = np.zeros((n, n, d, d))
    for i in range(n):
        if i > 0:
            T[i, :i] = T[i - 1, :i] @ A[i]
        T[i, i] = np.eye(d)
    return T


def matrix_gate_attention_parallel(Q, K, V, A) -> np.ndarray:
    """The parallel form of a full-matrix gate: ``o_i = sum_{j<=i} (k_j^T T_ij q_i) v_j`` with the
    pairwise products ``T_ij`` of :func:`pairwise_transitions` (an ``n × n × d_k × d_k`` tensor).

    For a diagonal gate ``T_ij = Diag(prod gamma)`` collapses to the factored score
    ``(q_i ⊙ P_i).(k_j / P_j)``; for non-commuting matrices there is no per-position factor with a
    stable log-difference form, so each pair needs its own ``d_k × d_k`` product.

    Defined in Chapter 3 (Forget gates).
    """
    Q, K, V = check_qkv(Q, K, V)
    n, d_k = K.shape
    T = pairwise_transitions(as_array(A, "A", (n, d_k, d_k)))
    scores = np.einsum("jc,ijcd,id->ij", K, T, Q)
    return scores @ V


def _check_elementwise_gate(G, n, d_v, d_k):
    return check_gate(G, "G", (n, d_v, d_k))


def elementwise_gate_attention_recurrent(Q, K, V, G) -> np.ndarray:
    """``S_t = G_t ⊙ S_{t-1} + v_t k_t^T``, ``o_t = S_t q_t`` with a ``(d_v, d_k)`` gate per step.

    The general "diagonal" gate on the flattened state (Mamba-1's ``exp(Δ_t A)`` is of this kind).
    ``G``: ``(n, d_v, d_k)`` in ``(0, 1]``. Scalar decay is ``G_t = gamma_t 1 1^T``, GLA is
    ``G_t = 1 gamma_t^T``.

    Defined in Chapter 3 (Forget gates).
    """
    Q, K, V = check_qkv(Q, K, V)
    n, d_k = K.shape
    G = _check_elementwise_gate(G, n, V.shape[1], d_k)
    S = np.zeros((V.shape[1], d_k))
    O = np.empty((n, V.shape[1]))
    for t in range(n):
        S = G[t] * S + np.outer(V[t], K[t])
        O[t] = S @ Q[t]
    return O


def elementwise_gate_attention_parallel(Q, K, V, G) -> np.ndarray:
    """The parallel form of an elementwise gate: ``o_ip = sum_j v_jp sum_c q_ic k_jc D_ij[p, c]`` with
    ``D_ij = prod_{tau=j+1..i} G_tau`` (log-differences). One score matrix *per value channel p*:
    the work needs the ``(n, n, d_v, d_k)`` tensor ``D``, not a single ``n × n`` matmul.

    Defined in Chapter 3 (Forget gates)."""
    Q, K, V = check_qkv(Q, K, V)
    n, d_k = K.shape
    d_v = V.shape[1]
    c = np.cumsum(np.log(_check_elementwise_gate(G, n, d_v, d_k)), axis=0)   # (n, d_v, d_k)
    causal = np.tri(n, dtype=bool)[:, :, None, None]
    D = _masked_exp(c[:, None] - c[None, :], causal)                          # (n, n, d_v, d_k)
    return np.einsum("ic,jc,jp,ijpc->ip", Q, K, V, D)


def is_outer_product_gate(G, *, tol: float = 1e-10):
    """Does every ``G_t`` factor as an outer product ``G_t = alpha_t beta_t^T``?

    With positive entries this holds iff ``log G_t`` is *additively separable*,
    ``log G_t[p, c] = a_t[p] + b_t[c]``, i.e. its double-centred version is zero. Returns
    ``(ok, residual, alpha, beta)``: ``residual`` is the largest entry of the double-centred
    ``log G`` (0 for an exact outer product), ``alpha`` ``(n, d_v)`` and ``beta`` ``(n, d_k)`` the
    factors with ``max_c beta_t[c] = 1`` (meaningful only when ``ok``). Scalar decay and GLA are
    outer products; Mamba-1's ``exp(Δ_t[p] A[p, c])`` is not.

    Defined in Chapter 3 (Forget gates).
    """
    G = as_array(G, "G", ("n", "d_v", "d_k"))
    G = check_gate(G, "G", G.shape)
    L = np.log(G)
    row = L.mean(axis=2, keepdims=True)
    col = L.mean(axis=1, keepdims=True)
    tot = L.mean(axis=(1, 2), keepdims=True)
    resid = float(np.max(np.abs(L - row - col + tot)))
    b = col[:, 0, :] - col[:, 0, :].max(axis=1, keepdims=True)               # (n, d_k), max 0
    a = (row - tot)[:, :, 0] + col[:, 0, :].max(axis=1, keepdims=True)         # a_p + b_c = log G
    return resid <= tol, resid, np.exp(a), np.exp(b)


def outer_gate_attention_chunkwise(Q, K, V, alpha, beta, *, chunk_size: int = 16) -> np.ndarray:
    """``S_t = (alpha_t beta_t^T) ⊙ S_{t-1} + v_t k_t^T = Diag(alpha_t) S_{t-1} Diag(beta_t) + v_t k_t^T``.

    Because the gate is an outer product, the chunk step is built from matmuls. With ``a, b`` the
    within-chunk cumulative logs of ``alpha`` (``(C, d_v)``) and ``beta`` (``(C, d_k)``)::

        read of the old state:  O_c += e^{a} ⊙ ((Q_c ⊙ e^{b}) S^T)
        within the chunk:       o_i += sum_j e^{a_i - a_j} ⊙ v_j (sum_c q_ic k_jc e^{b_ic - b_jc})
        state update:           S <- Diag(e^{a_C}) S Diag(e^{b_C}) + (V_c ⊙ e^{a_C - a})^T (K_c ⊙ e^{b_C - b})

    (the within-chunk term is kept in its stable pairwise form here). ``alpha``: ``(n, d_v)``,
    ``beta``: ``(n, d_k)``, both in ``(0, 1]``.

    Defined in Chapter 3 (Forget gates).
    """
    Q, K, V = check_qkv(Q, K, V)
    C = check_chunk_size(chunk_size)
    n, d_k = K.shape
    d_v = V.shape[1]
    la = np.log(check_gate(alpha, "alpha", (n, d_v)))
    lb = np.log(check_gate(beta, "beta", (n, d_k)))
    S = np.zeros((d_v, d_k))
    O = np.empty((n, d_v))
    for s in range(0, n, C):
        q, k, v = Q[s:s + C], K[s:s + C], V[s:s + C]
        a, b = np.cumsum(la[s:s + C], axis=0), np.cumsum(lb[s:s + C], axis=0)
        L = a.shape[0]
        scores = _gla_scores(q, k, b)                                       # (L, L)
        Da = _masked_exp(a[:, None, :] - a[None, :, :], np.tri(L, dtype=bool)[:, :, None])
        O[s:s + C] = np.exp(a) * ((q * np.exp(b)) @ S.T) + np.einsum("ij,ijp,jp->ip", scores, Da, v)
        S = np.exp(a[-1])[:, None] * S * np.exp(b[-1])[None, :] \
            + (v * np.exp(a[-1] - a)).T @ (k * np.exp(b[-1] - b))
    return O


# --------------------------------------------------------------------------------------------
# Forgetting on cue: recall of the current topic
# --------------------------------------------------------------------------------------------
def topic_recall(n: int, topic_len: int, d_k: int, *, gamma=None, seeds: int = 4) -> np.ndarray:
    """``n`` random pairs written into one state in topics of ``topic_len`` pairs; the last topic is
    the current one. Each of its pairs is read back with its own key, as in
    :func:`lattn_core.recall_experiment` (``d_v = d_k``, ``gamma``: ``None``, a constant or one gate
    per token). Returns the cosine between recalled and stored value for each pair of the current
    topic, oldest first, averaged over ``seeds`` draws.

    Defined in Chapter 3 (Forget gates)."""
    if isinstance(topic_len, bool) or not isinstance(topic_len, (int, np.integer)) \
            or not 1 <= topic_len <= n:
        raise ValueError(f"topic_len must be an integer in [1, n = {n}]; got {topic_len!r}")
    seeds = check_int(seeds, "seeds", 1)
    runs = [recall_experiment(n, d_k, d_k, gamma=gamma, seed=s)["cosine"][-topic_len:]
            for s in range(seeds)]
    return np.mean(runs, axis=0)
