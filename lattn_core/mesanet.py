"""MesaNet: the in-context linear regression solved exactly at every token (Chapter 10).

Test-time training (Chapter 4) reads DeltaNet as one step of gradient descent on the squared loss
``1/2 |S k_t - v_t|^2``. That loss is a linear regression, and a linear regression has a closed-form
solution. MesaNet (von Oswald et al., 2025) uses it: with forget gates ``gamma_t in (0, 1]``, optional
per-token weights ``beta_t >= 0`` (fla's ``beta``) and a positive diagonal ``Lambda = Diag(lam)``::

    G_t = gamma_t G_{t-1} + beta_t v_t k_t^T              (d_v x d_k)
    H_t = gamma_t H_{t-1} + beta_t k_t k_t^T              (d_k x d_k, symmetric, >= 0)
    o_t = G_t (H_t + Lambda)^{-1} q_t

``S_t = G_t (H_t + Lambda)^{-1}`` minimises the gated, regularised squared loss over every pair so far,

    L_t(S) = 1/2 sum_{j<=t} w_tj |S k_j - v_j|^2 + 1/2 sum_i lam_i |S e_i|^2,   w_tj = beta_j Gamma_tj,

whose gradient is ``S (H_t + Lambda) - G_t`` (the normal equations). The forms here:

- :func:`mesanet_recurrent`, the definition: a loop over tokens, one ``d_k x d_k`` solve per token;
- :func:`mesanet_parallel`: every ``H_t = K^T Diag(w_t) K`` at once (``O(n^2 d_k^2)`` memory), then
  ``O = (X K^T ⊙ Γ) Diag(beta) V`` with the solved queries ``x_t = (H_t + Lambda)^{-1} q_t``:
  the output is Chapter 3's gated linear attention read with ``x_t`` in place of ``q_t``;
- :func:`mesanet_chunkwise`: ``H_t`` for every token from Chapter 3's chunked gated sums
  (:func:`~lattn_core.forget_gates.decay_attention_chunkwise`; column ``i`` of every ``H_t`` is the
  read with the query ``e_i``), an exact solve per token, and one more chunked pass for the outputs;
- :func:`mesanet_cg`: the same without ever forming ``H_t``. Conjugate gradients need only products
  ``H_t p_t``, and for all tokens at once these are one chunked pass of gated linear attention with
  the search directions as queries and the keys as values; a fixed number of iterations, from zero
  or from a warm start (fla's decoding step starts from the Jacobi guess ``q_t / diag(H_t + Lambda)``).

The regression view: :func:`regression_weights`, :func:`mesanet_loss` and :func:`ridge_lstsq` (the
same minimiser from a least-squares solver), :func:`mesanet_states` (every ``G_t``, ``H_t``) and
:func:`mesanet_rls`, recursive least squares: the Sherman-Morrison update (:func:`sherman_morrison`)
of ``Sigma_t = (H_t + Lambda_t)^{-1}`` (the chapter's Σ_t) in ``O(d_k^2)`` per token, with the gain
``a_t = beta_t Sigma_t k_t``::

    S_t = S_{t-1} + (v_t - S_{t-1} k_t) a_t^T              (DeltaNet's gain is beta_t k_t)

Without gates it equals MesaNet; with gates it is the textbook exponentially weighted RLS, whose
regulariser fades with the gates (``Lambda_t = gamma_1 ... gamma_t Lambda``), because MesaNet's fixed
``Lambda`` turns the update of ``H_t + Lambda`` into more than a rank-one change.

Conjugate gradients on dense systems: :func:`conjugate_gradient` (batched, fixed iteration count,
optional warm start), :func:`cg_bound` (the textbook bound ``2((sqrt(kappa)-1)/(sqrt(kappa)+1))^m``
on the error in the ``A``-norm) and :func:`cg_convergence` (the measured error against it).

The chapter's experiments: :func:`regression_race` (in-context linear regression, MesaNet against
DeltaNet as the number of pairs grows) and :func:`reassignment_experiment` (a key given a new value
late in the sequence: MesaNet averages the two values, DeltaNet replaces; gates and ``beta`` as knobs).

Rows are tokens, 0-based here as everywhere in the package (the book counts from 1).
"""
from __future__ import annotations

import numpy as np

from ._validate import as_array, check_chunk_size, check_gate, check_int, check_qkv
from .delta import deltanet_recurrent
from .forget_gates import decay_attention_chunkwise, decay_mask

__all__ = ["mesanet_recurrent", "mesanet_parallel", "mesanet_chunkwise", "mesanet_cg", "mesanet_states",
           "mesanet_rls", "regression_weights", "mesanet_loss", "ridge_lstsq", "sherman_morrison",
           "conjugate_gradient", "cg_bound", "cg_convergence", "regression_race",
           "reassignment_experiment"]


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------
def _lam(lam, d_k: int) -> np.ndarray:
    """``lam``: a positive scalar or a positive ``(d_k,)`` array; returned as ``(d_k,)``."""
    try:
        nd = np.ndim(lam)
    except Exception:                      # pragma: no cover - np.ndim accepts almost anything
        nd = -1
    if nd == 0:
        return np.full(d_k, float(check_gate(lam, "lam", (), high=np.inf, high_inclusive=False)))
    if nd == 1:
        return check_gate(lam, "lam", (d_k,), high=np.inf, high_inclusive=False)
    raise ValueError(f"lam must be a positive scalar or have shape ({d_k},); got shape {np.shape(lam)}")


def _beta(beta, n: int) -> np.ndarray:
    """``beta``: ``None`` (ones) or ``(n,)`` weights in ``[0, inf)``."""
    if beta is None:
        return np.ones(n)
    return check_gate(beta, "beta", (n,), low=0.0, high=np.inf, low_inclusive=True, high_inclusive=False)


def _gamma(gamma, n: int) -> np.ndarray:
    return check_gate(gamma, "gamma", (n,))


#: The smallest ``lam`` the forms accept, relative to ``max lam + sum_j beta_j |k_j|^2`` (a bound on
#: the largest eigenvalue of every ``H_t + Diag(lam)``): below it the systems' condition numbers pass
#: 1e12 and a float64 solve is singular or meaningless, each form failing its own way.
LAM_FLOOR = 1e-12


def _inputs(Q, K, V, gamma, lam, beta):
    """The checked inputs of every form (one message for every failure, ``lam`` too small included)."""
    Q, K, V = check_qkv(Q, K, V)
    n, d_k = K.shape
    g, lam, beta = _gamma(gamma, n), _lam(lam, d_k), _beta(beta, n)
    floor = LAM_FLOOR * (lam.max() + float(beta @ np.einsum("ij,ij->i", K, K)))
    if lam.min() < floor:
        raise ValueError(f"lam must be > 0 and at least {LAM_FLOOR:g} × (max lam + sum_j beta_j |k_j|^2) = "
                         f"{floor:.3g} elementwise, or H_t + Diag(lam) is singular in float64; found "
                         f"{lam.min():.3g}")
    return Q, K, V, g, lam, beta


def _solve(A, B):
    """Batched solve of ``A x = b`` with ``A`` ``(..., d, d)`` and ``B`` ``(..., d)``."""
    return np.linalg.solve(A, B[..., None])[..., 0]


# --------------------------------------------------------------------------------------------
# the three forms
# --------------------------------------------------------------------------------------------
def mesanet_recurrent(Q, K, V, gamma, lam, *, beta=None) -> np.ndarray:
    """The definition (API.md): ``G_t = gamma_t G_{t-1} + beta_t v_t k_t^T``,
    ``H_t = gamma_t H_{t-1} + beta_t k_t k_t^T``, ``o_t = G_t (H_t + Diag(lam))^{-1} q_t``.

    ``gamma``: ``(n,)`` in ``(0, 1]``; ``lam``: a positive scalar or ``(d_k,)``; ``beta``: ``None``
    (all ones, the article's form) or ``(n,)`` in ``[0, inf)`` (fla's per-token weight).

    Defined in Chapter 10 (MesaNet).
    """
    Q, K, V, g, lam, beta = _inputs(Q, K, V, gamma, lam, beta)
    n, d_k = K.shape
    G = np.zeros((V.shape[1], d_k))            # sum of beta_j v_j k_j^T, gated
    H = np.zeros((d_k, d_k))                   # sum of beta_j k_j k_j^T, gated
    Lam = np.diag(lam)
    O = np.empty((n, V.shape[1]))
    for t in range(n):
        G = g[t] * G + beta[t] * np.outer(V[t], K[t])
        H = g[t] * H + beta[t] * np.outer(K[t], K[t])
        q_hat = np.linalg.solve(H + Lam, Q[t])  # (H_t + Lambda) q_hat = q_t
        O[t] = G @ q_hat
    return O


def regression_weights(gamma, t: int, beta=None) -> np.ndarray:
    """``w_tj = beta_j Gamma_tj`` for ``j = 0 .. t``: the weight pair ``j`` has in the loss at token
    ``t`` (``Gamma_tj`` the product of the gates after ``j`` up to ``t``, from log-gate differences).

    Defined in Chapter 10 (MesaNet)."""
    g = as_array(gamma, "gamma", ("n",))
    n = g.shape[0]
    g = _gamma(g, n)
    t = check_int(t, "t", 0)
    if t >= n:
        raise ValueError(f"t must lie in [0, n - 1] = [0, {n - 1}]; got {t}")
    c = np.cumsum(np.log(g))
    return _beta(beta, n)[:t + 1] * np.exp(c[t] - c[:t + 1])


def mesanet_parallel(Q, K, V, gamma, lam, *, beta=None) -> np.ndarray:
    """The matrix form: ``H_t = K^T Diag(w_t) K`` for every ``t`` at once, the solved queries
    ``x_t = (H_t + Lambda)^{-1} q_t`` stacked as ``X``, then ``O = (X K^T ⊙ Γ) Diag(beta) V``.

    Defined in Chapter 10 (MesaNet)."""
    Q, K, V, g, lam, beta = _inputs(Q, K, V, gamma, lam, beta)
    W = decay_mask(g) * beta[None, :]                     # w_tj = β_j Γ_tj, 0 above the diagonal
    H = np.einsum("tj,jk,jl->tkl", W, K, K)
    X = _solve(H + np.diag(lam), Q)
    return ((X @ K.T) * W) @ V


def _gated_sum_reads(P, K, Values, g, C):
    """Row ``t``: ``sum_{j<=t} Gamma_tj (k_j · p_t) values_j`` by Chapter 3's chunked gated sums."""
    return decay_attention_chunkwise(P, K, Values, g, chunk_size=C)


def _states_by_reads(K, Values, g, C):
    """Every state ``sum_{j<=t} Gamma_tj values_j k_j^T`` as ``(n, d_out, d_k)``: column ``i`` is the
    chunked gated read with the query ``e_i`` at every token (``d_k`` passes)."""
    n, d_k = K.shape
    out = np.empty((n, Values.shape[1], d_k))
    for i in range(d_k):
        E = np.zeros((n, d_k))
        E[:, i] = 1.0
        out[:, :, i] = _gated_sum_reads(E, K, Values, g, C)
    return out


def mesanet_states(K, V, gamma, beta=None, *, chunk_size: int = 64):
    """Every ``G_t`` ``(n, d_v, d_k)`` and ``H_t`` ``(n, d_k, d_k)``, from Chapter 3's chunked gated
    sums (:func:`~lattn_core.forget_gates.decay_attention_chunkwise`): column ``i`` of all of them at
    once is the read with the query ``e_i``.

    Defined in Chapter 10 (MesaNet)."""
    K = as_array(K, "K", ("n", "d_k"))
    n, _ = K.shape
    V = as_array(V, "V", (n, "d_v"))
    g, beta, C = _gamma(gamma, n), _beta(beta, n), check_chunk_size(chunk_size)
    both = _states_by_reads(K, beta[:, None] * np.hstack([V, K]), g, C)
    d_v = V.shape[1]
    return both[:, :d_v], both[:, d_v:]


def mesanet_chunkwise(Q, K, V, gamma, lam, chunk_size: int = 64, *, beta=None) -> np.ndarray:
    """The chunkwise form (API.md): every ``H_t`` from Chapter 3's chunked gated sums, each
    ``(H_t + Diag(lam)) x_t = q_t`` solved exactly, and the outputs ``o_t = G_t x_t`` as one more
    chunked pass, gated linear attention read with ``x_t`` (``G_t`` is never formed).

    Defined in Chapter 10 (MesaNet)."""
    Q, K, V, g, lam, beta = _inputs(Q, K, V, gamma, lam, beta)
    C = check_chunk_size(chunk_size)
    H = _states_by_reads(K, beta[:, None] * K, g, C)
    X = _solve(H + np.diag(lam), Q)
    return _gated_sum_reads(X, K, beta[:, None] * V, g, C)


# --------------------------------------------------------------------------------------------
# conjugate gradients
# --------------------------------------------------------------------------------------------
def _cg_loop(apply_A, b, x, iterations, on_iterate=None):
    """Conjugate gradients for a batch of systems ``A x = b`` (rows of ``b``), all in lockstep.
    A system whose residual is exactly zero stays where it is (no 0/0)."""
    dot = lambda a, c: np.sum(a * c, axis=-1, keepdims=True)
    r = b - apply_A(x)                      # the residual
    p = r.copy()                            # the first search direction
    rr = dot(r, r)
    if on_iterate is not None:
        on_iterate(x)
    for _ in range(iterations):
        Ap = apply_A(p)                     # the one product with A per step
        pAp = dot(p, Ap)
        alpha = np.divide(rr, pAp, out=np.zeros_like(rr), where=pAp > 0)
        x = x + alpha * p                   # the exact minimiser along p
        r = r - alpha * Ap
        rr_new = dot(r, r)
        step = np.divide(rr_new, rr, out=np.zeros_like(rr), where=rr > 0)
        p = r + step * p                    # next direction, A-conjugate
        rr = rr_new
        if on_iterate is not None:
            on_iterate(x)
    return x


def _check_spd_system(A, b):
    A = as_array(A, "A", None, finite=False).copy()
    if A.ndim < 2 or A.shape[-1] != A.shape[-2] or A.shape[-1] == 0:
        raise ValueError(f"A must have shape (..., d, d) (square in its last two axes); got {A.shape}")
    if not np.all(np.isfinite(A)):
        raise ValueError("A contains NaN or inf; all entries must be finite")
    if not np.allclose(A, np.swapaxes(A, -1, -2), rtol=1e-10, atol=1e-12 * max(1.0, np.abs(A).max())):
        raise ValueError("A must be symmetric (conjugate gradients need a symmetric positive definite A)")
    b = as_array(b, "b", A.shape[:-1])
    return A, b


def conjugate_gradient(A, b, iterations: int, x0=None, *, return_iterates: bool = False):
    """``iterations`` steps of conjugate gradients on ``A x = b``.

    ``A``: ``(..., d, d)`` symmetric positive definite (a batch of systems, solved in lockstep);
    ``b``: ``(..., d)``; ``x0``: the warm start (default zeros), shape of ``b``. Returns ``x``, or
    with ``return_iterates=True`` an array ``(iterations + 1, ..., d)`` of every iterate from ``x0``
    on. In exact arithmetic ``x`` is exact after at most ``d`` steps (after as many steps as ``A``
    has distinct eigenvalues); in floating point it is close after that.

    Defined in Chapter 10 (MesaNet).
    """
    A, b = _check_spd_system(A, b)
    iterations = check_int(iterations, "iterations", 0)
    x0 = np.zeros_like(b) if x0 is None else as_array(x0, "x0", b.shape)
    seen = []
    x = _cg_loop(lambda p: (A @ p[..., None])[..., 0], b, x0, iterations,
                 seen.append if return_iterates else None)
    return np.stack(seen) if return_iterates else x


def cg_bound(kappa, iterations) -> np.ndarray:
    """The textbook bound on conjugate gradients after ``m`` steps:
    ``|x_m - x*|_A <= 2 ((sqrt(kappa) - 1)/(sqrt(kappa) + 1))^m |x_0 - x*|_A`` (``kappa >= 1`` the
    condition number of ``A``); ``iterations`` a count or an array of counts.

    Defined in Chapter 10 (MesaNet)."""
    kappa = as_array(kappa, "kappa", None, finite=False)
    if not np.all(np.isfinite(kappa)) or np.any(kappa < 1):
        raise ValueError(f"kappa must be a finite condition number >= 1; got {kappa!r}")
    m = as_array(iterations, "iterations", None, finite=False)
    if np.any(m < 0) or not np.all(np.isfinite(m)):
        raise ValueError(f"iterations must be non-negative; got {iterations!r}")
    s = np.sqrt(kappa)
    return np.minimum(1.0, 2.0 * ((s - 1.0) / (s + 1.0)) ** m)


def cg_convergence(A, b, iterations: int, x0=None) -> dict:
    """Conjugate gradients on one system ``A x = b`` (``A`` ``(d, d)``), measured: ``"error"`` is
    ``|x_m - x*|_A / |x_0 - x*|_A`` for ``m = 0 .. iterations`` (``x*`` from a direct solve),
    ``"kappa"`` the condition number of ``A``, ``"bound"`` :func:`cg_bound` at each ``m``,
    ``"eigenvalues"`` those of ``A`` (ascending).

    Defined in Chapter 10 (MesaNet)."""
    A = as_array(A, "A", ("d", "d"))
    b = as_array(b, "b", (A.shape[0],))
    xs = conjugate_gradient(A, b, iterations, x0, return_iterates=True)
    x_star = np.linalg.solve(A, b)
    a_norm = lambda e: np.sqrt(np.maximum(np.einsum("...i,ij,...j->...", e, A, e), 0.0))
    err0 = a_norm(xs[0] - x_star)
    ev = np.linalg.eigvalsh(A)
    if not ev[0] > 0:
        raise ValueError("A must be positive definite; its smallest eigenvalue is not positive")
    kappa = ev[-1] / ev[0]
    m = np.arange(iterations + 1)
    err = a_norm(xs - x_star) / err0 if err0 > 0 else np.zeros(iterations + 1)
    return {"error": err, "kappa": kappa, "bound": cg_bound(kappa, m), "eigenvalues": ev,
            "iterations": m}


def mesanet_cg(Q, K, V, gamma, lam, iterations: int, *, beta=None, x0="zero", chunk_size: int = 64,
               return_iterates: bool = False):
    """MesaNet with ``(H_t + Lambda) x_t = q_t`` solved by ``iterations`` steps of conjugate
    gradients, for every token in lockstep, without forming any ``H_t``.

    Each product ``H_t p_t`` (for all tokens at once) is one chunked pass of Chapter 3's gated sums
    with the search directions as queries and ``Diag(beta) K`` as values; the outputs are one more
    pass with the solutions as queries and ``Diag(beta) V`` as values. ``x0``: ``"zero"``,
    ``"jacobi"`` (``q_t / diag(H_t + Lambda)``, the diagonal of each ``H_t`` from one more pass) or
    an ``(n, d_k)`` array. Returns ``O`` ``(n, d_v)``; with ``return_iterates=True`` an array
    ``(iterations + 1, n, d_v)`` of the outputs after ``0 .. iterations`` steps.

    Defined in Chapter 10 (MesaNet).
    """
    Q, K, V, g, lam, beta = _inputs(Q, K, V, gamma, lam, beta)
    C = check_chunk_size(chunk_size)
    iterations = check_int(iterations, "iterations", 0)
    n, d_k = K.shape
    Kb, Vb = beta[:, None] * K, beta[:, None] * V
    if isinstance(x0, str):
        if x0 == "zero":
            x_start = np.zeros_like(Q)
        elif x0 == "jacobi":
            ones = np.ones((n, 1))
            diag = _gated_sum_reads(ones, ones, beta[:, None] * K * K, g, C)   # diag(H_t), row t
            x_start = Q / (diag + lam)
        else:
            raise ValueError(f"x0 must be 'zero', 'jacobi' or an array of shape ({n}, {d_k}); got {x0!r}")
    else:
        x_start = as_array(x0, "x0", (n, d_k))
    # (H_t + Λ) p_t for every token at once: one chunked gated read, values β_j k_j
    apply_A = lambda P: _gated_sum_reads(P, K, Kb, g, C) + lam * P
    # o_t = G_t x_t for every token: one more read, values β_j v_j (no G_t formed)
    read_out = lambda X: _gated_sum_reads(X, K, Vb, g, C)
    outs = []
    keep = (lambda X: outs.append(read_out(X))) if return_iterates else None
    x = _cg_loop(apply_A, Q, x_start, iterations, keep)
    return np.stack(outs) if return_iterates else read_out(x)


# --------------------------------------------------------------------------------------------
# the regression view
# --------------------------------------------------------------------------------------------
def mesanet_loss(S, K, V, gamma, lam, t: int, beta=None) -> float:
    """``L_t(S) = 1/2 sum_{j<=t} w_tj |S k_j - v_j|^2 + 1/2 sum_i lam_i |S e_i|^2`` with the weights
    of :func:`regression_weights`; ``S`` is ``(d_v, d_k)``.

    Defined in Chapter 10 (MesaNet)."""
    K = as_array(K, "K", ("n", "d_k"))
    n, d_k = K.shape
    V = as_array(V, "V", (n, "d_v"))
    S = as_array(S, "S", (V.shape[1], d_k))
    lam = _lam(lam, d_k)
    w = regression_weights(_gamma(gamma, n), t, beta)
    R = K[:t + 1] @ S.T - V[:t + 1]
    return float(0.5 * np.sum(w * np.sum(R * R, axis=1)) + 0.5 * np.sum(lam * np.sum(S * S, axis=0)))


def ridge_lstsq(K, V, weights, lam) -> np.ndarray:
    """The minimiser of ``1/2 sum_j w_j |S k_j - v_j|^2 + 1/2 sum_i lam_i |S e_i|^2`` from a
    least-squares solver (``numpy.linalg.lstsq``) on the stacked system: rows ``sqrt(w_j) k_j^T``
    with targets ``sqrt(w_j) v_j^T``, then rows ``sqrt(lam_i) e_i^T`` with targets 0. ``K``:
    ``(m, d_k)``, ``V``: ``(m, d_v)``, ``weights``: ``(m,)`` non-negative. Returns ``S``
    ``(d_v, d_k)``. No normal equations are formed: an independent route to the same answer.

    Defined in Chapter 10 (MesaNet)."""
    K = as_array(K, "K", ("m", "d_k"))
    m, d_k = K.shape
    V = as_array(V, "V", (m, "d_v"))
    w = check_gate(weights, "weights", (m,), low=0.0, high=np.inf, low_inclusive=True, high_inclusive=False)
    lam = _lam(lam, d_k)
    A = np.vstack([np.sqrt(w)[:, None] * K, np.diag(np.sqrt(lam))])
    B = np.vstack([np.sqrt(w)[:, None] * V, np.zeros((d_k, V.shape[1]))])
    X, *_ = np.linalg.lstsq(A, B, rcond=None)
    return X.T


def sherman_morrison(A_inv, u, v) -> np.ndarray:
    """``(A + u v^T)^{-1}`` from ``A^{-1}``:
    ``A^{-1} - A^{-1} u v^T A^{-1} / (1 + v^T A^{-1} u)`` (needs ``1 + v^T A^{-1} u != 0``).

    Defined in Chapter 10 (MesaNet)."""
    A_inv = as_array(A_inv, "A_inv", ("d", "d"))
    d = A_inv.shape[0]
    u = as_array(u, "u", (d,))
    v = as_array(v, "v", (d,))
    Au, vA = A_inv @ u, v @ A_inv
    den = 1.0 + v @ Au
    if den == 0:
        raise ValueError("1 + v^T A^{-1} u is zero: A + u v^T is singular")
    return A_inv - np.outer(Au, vA) / den


def mesanet_rls(Q, K, V, gamma, lam, *, beta=None, return_states: bool = False):
    """Recursive least squares: ``Sigma_t = (H_t + Lambda_t)^{-1}`` (the chapter's Σ_t) by
    Sherman-Morrison in ``O(d_k^2)`` per token and the state by the gain ``a_t = beta_t Sigma_t k_t``::

        Sigma_t = sherman_morrison(Sigma_{t-1} / gamma_t, beta_t k_t, k_t),   Sigma_{-1} = Lambda^{-1}
        S_t = S_{t-1} + (v_t - S_{t-1} k_t) a_t^T,                              o_t = S_t q_t

    ``Lambda_t = gamma_0 ... gamma_t Lambda``: the textbook exponentially weighted RLS, whose
    regulariser fades with the gates. With every ``gamma_t = 1`` it is MesaNet exactly (up to
    round-off). Returns ``O``; with ``return_states=True`` also ``(S, Sigma)``, the ``(n, d_v, d_k)``
    and ``(n, d_k, d_k)`` arrays of every ``S_t`` and ``Sigma_t``.

    Defined in Chapter 10 (MesaNet).
    """
    Q, K, V, g, lam, beta = _inputs(Q, K, V, gamma, lam, beta)
    n, d_k = K.shape
    d_v = V.shape[1]
    Sigma = np.diag(1.0 / lam)              # Σ before any pair: Λ^{-1}
    S = np.zeros((d_v, d_k))
    O = np.empty((n, d_v))
    Ss, Sigmas = np.empty((n, d_v, d_k)), np.empty((n, d_k, d_k))
    for t in range(n):
        # (ch10-sm): the inverse of γ_t (H_{t-1} + Λ_{t-1}) + β_t k_t k_tᵀ
        Sigma = sherman_morrison(Sigma / g[t], beta[t] * K[t], K[t])
        Sigma = 0.5 * (Sigma + Sigma.T)     # symmetric against round-off
        gain = beta[t] * (Sigma @ K[t])     # a_t; DeltaNet's gain: β_t k_t
        S = S + np.outer(V[t] - S @ K[t], gain)
        O[t] = S @ Q[t]
        Ss[t], Sigmas[t] = S, Sigma
    return (O, Ss, Sigmas) if return_states else O


# --------------------------------------------------------------------------------------------
# experiments
# --------------------------------------------------------------------------------------------
def _unit_rows(rng, m, d):
    X = rng.normal(size=(m, d))
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def regression_race(n: int = 96, *, d_k: int = 16, d_v: int = 4, noise: float = 0.0, lam: float = 1e-3,
                    beta_delta: float = 1.0, trials: int = 100, seed: int = 0) -> dict:
    """In-context linear regression: a hidden rule ``W`` (``(d_v, d_k)``, entries ``N(0, 1)``, so
    ``E|W k|^2 = d_v`` for a unit key), pairs ``(k_j, v_j = W k_j + noise * N(0, 1))`` with unit keys,
    and at every token a fresh unit query ``q_t``: the prediction ``o_t`` is scored against ``W q_t``.

    Runs MesaNet (no gates, ``lam``) and DeltaNet (``beta_delta``) on the same streams. Returns
    ``{"mesanet": e, "deltanet": e, "pairs": 1..n}``, ``e`` of shape ``(n,)``: the relative error
    ``mean |o_t - W q_t|^2 / mean |W q_t|^2`` after ``t`` pairs, averaged over ``trials``.

    Defined in Chapter 10 (MesaNet).
    """
    n, d_k, d_v, trials = (check_int(x, name, 1) for x, name in
                           ((n, "n"), (d_k, "d_k"), (d_v, "d_v"), (trials, "trials")))
    noise = float(check_gate(noise, "noise", (), low=0.0, high=np.inf, low_inclusive=True,
                             high_inclusive=False))
    rng = np.random.default_rng(seed)
    sq = {"mesanet": np.zeros(n), "deltanet": np.zeros(n)}
    ref = np.zeros(n)
    for _ in range(trials):
        W = rng.normal(size=(d_v, d_k))
        K, Q = _unit_rows(rng, n, d_k), _unit_rows(rng, n, d_k)
        V = K @ W.T + noise * rng.normal(size=(n, d_v))
        target = Q @ W.T
        outs = {"mesanet": mesanet_chunkwise(Q, K, V, np.ones(n), lam),
                "deltanet": deltanet_recurrent(Q, K, V, np.full(n, beta_delta))}
        for name, O in outs.items():
            sq[name] += np.sum((O - target) ** 2, axis=1)
        ref += np.sum(target ** 2, axis=1)
    out = {name: s / ref for name, s in sq.items()}
    out["pairs"] = np.arange(1, n + 1)
    return out


def _delta_final_state(K, V, beta):
    """DeltaNet's state after every write (the read of any key at the end is ``S k``)."""
    S = np.zeros((V.shape[1], K.shape[1]))
    for k, v, b in zip(K, V, beta):
        S = S + b * np.outer(v - S @ k, k)
    return S


def reassignment_experiment(gammas, *, n_facts: int = 20, d_k: int = 32, lam: float = 0.05,
                            first: float = 5.0, second: float = 10.0, value_scale: float = 5.0,
                            late_beta: float = 1.0, trials: int = 40, seed: int = 0) -> dict:
    """Chapter 5's ``x = 5``, later ``x = 10``, for MesaNet and DeltaNet, with facts in between.

    Each trial writes ``(k_x, first)``, then ``n_facts`` facts ``(k_j, v_j)`` (random unit keys,
    values ``value_scale * N(0, 1)``), then ``(k_x, second)``, and reads every key from the final
    state. MesaNet runs with the constant gate ``gamma`` for each entry of ``gammas`` and ``lam``, and
    weight ``late_beta`` on the second assignment (1 elsewhere); DeltaNet with ``beta = 1``.

    Returns ``{"gammas", "mesa_x" (mean read of x per gamma), "mesa_fact_rmse" (root mean square
    error of the facts' reads per gamma), "delta_x", "delta_fact_rmse", "example"}`` where
    ``"example"`` holds one trial's keys, values and the reads, for a figure.

    Defined in Chapter 10 (MesaNet).
    """
    gammas = np.atleast_1d(np.asarray(gammas, dtype=np.float64))
    gammas = check_gate(gammas, "gammas", (gammas.shape[0],))
    m = check_int(n_facts, "n_facts", 0)
    d_k, trials = check_int(d_k, "d_k", 1), check_int(trials, "trials", 1)
    late_beta = float(check_gate(late_beta, "late_beta", (), high=np.inf, high_inclusive=False))
    rng = np.random.default_rng(seed)
    n = m + 2
    beta = np.ones(n)
    beta[-1] = late_beta
    mesa_x, mesa_f = np.zeros(len(gammas)), np.zeros(len(gammas))
    delta_x, delta_f = 0.0, 0.0
    example = None
    for r in range(trials):
        keys = _unit_rows(rng, m + 1, d_k)
        kx, Kf = keys[0], keys[1:]
        Vf = value_scale * rng.normal(size=(m, 1))
        K = np.vstack([kx, Kf, kx])
        V = np.vstack([[first], Vf, [second]])
        Sd = _delta_final_state(K, V, np.ones(n))
        delta_x += (Sd @ kx)[0] / trials
        delta_f += np.mean((Kf @ Sd.T - Vf) ** 2) / trials
        reads = {}
        for i, gm in enumerate(gammas):
            G, H = mesanet_states(K, V, np.full(n, gm), beta, chunk_size=16)
            S = np.linalg.solve(H[-1] + np.diag(_lam(lam, d_k)), G[-1].T).T    # G (H + Λ)^{-1}
            mesa_x[i] += (S @ kx)[0] / trials
            mesa_f[i] += np.mean((Kf @ S.T - Vf) ** 2) / trials
            reads[float(gm)] = Kf @ S.T
        if r == 0:
            example = {"facts": Vf[:, 0], "delta_facts": (Kf @ Sd.T)[:, 0],
                       "mesa_facts": {k: v[:, 0] for k, v in reads.items()}}
    return {"gammas": gammas, "mesa_x": mesa_x, "mesa_fact_rmse": np.sqrt(mesa_f), "delta_x": delta_x,
            "delta_fact_rmse": float(np.sqrt(delta_f)), "example": example}
