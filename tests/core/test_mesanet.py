"""MesaNet (lattn_core.mesanet): the three forms, the regression view (least squares, the normal
equations, recursive least squares by Sherman-Morrison, DeltaNet as one gradient step on the same
loss), conjugate gradients and their bound, why Lambda matters, the chapter's experiments, and bad
input.

Tolerances. Everything is float64. The forms regroup the same sums and solve the same well-posed
systems (``Lambda >= 0.1`` here unless a test says otherwise, so ``cond(H_t + Lambda)`` stays below
~1e3 for unit-scale keys): round-off ~1e-13, and 1e-9 fails on any wrong term,
gate or mask. SymPy checks are exact.
"""
import numpy as np
import pytest
import sympy as sp

import lattn_core as lc


def _inputs(n, d_k=5, d_v=3, seed=0, gates=(0.7, 1.0)):
    rng = np.random.default_rng(seed)
    Q, K, V = rng.normal(size=(n, d_k)), rng.normal(size=(n, d_k)), rng.normal(size=(n, d_v))
    gamma = rng.uniform(*gates, size=n)
    lam = rng.uniform(0.1, 1.0, size=d_k)
    beta = rng.uniform(0.0, 1.5, size=n)
    return Q, K, V, gamma, lam, beta


def _solve_rows(G, H, lam):
    """S_t = G_t (H_t + Diag(lam))^{-1} for every t (H symmetric)."""
    A = H + np.diag(lam)
    return np.swapaxes(np.linalg.solve(A, np.swapaxes(G, -1, -2)), -1, -2)


@pytest.mark.parametrize("n,C", [(1, 1), (2, 1), (9, 4), (40, 16), (65, 64), (70, 13)])
@pytest.mark.parametrize("with_beta", [False, True])
def test_three_forms_agree(n, C, with_beta):
    Q, K, V, gamma, lam, beta = _inputs(n, seed=n)
    beta = beta if with_beta else None
    O = lc.mesanet_recurrent(Q, K, V, gamma, lam, beta=beta)
    assert O.shape == (n, 3) and O.dtype == np.float64
    lc.check_close("parallel = recurrent", lc.mesanet_parallel(Q, K, V, gamma, lam, beta=beta), O, 1e-9)
    lc.check_close(f"chunkwise (C = {C}) = recurrent",
                   lc.mesanet_chunkwise(Q, K, V, gamma, lam, beta=beta, chunk_size=C), O, 1e-9)


def test_scalar_lam_is_a_constant_vector_and_default_beta_is_one():
    Q, K, V, gamma, _, _ = _inputs(30, seed=1)
    O = lc.mesanet_recurrent(Q, K, V, gamma, 0.3)
    lc.check_close("lam = 0.3 is lam = (0.3, ..., 0.3)", lc.mesanet_chunkwise(Q, K, V, gamma, np.full(5, 0.3)), O,
                   1e-12)
    lc.check_close("beta = None is beta = 1", lc.mesanet_recurrent(Q, K, V, gamma, 0.3, beta=np.ones(30)), O, 1e-12)
    lc.check_close("chunk_size as API.md's sixth argument", lc.mesanet_chunkwise(Q, K, V, gamma, 0.3, 7), O, 1e-9)


def test_states_are_the_gated_sums():
    """mesanet_states (d_k chunked reads with the queries e_i) = the sums written out."""
    n = 23
    _, K, V, gamma, _, beta = _inputs(n, seed=2)
    G, H = lc.mesanet_states(K, V, gamma, beta, chunk_size=6)
    for t in (0, 7, 22):
        w = lc.regression_weights(gamma, t, beta)
        lc.check_close(f"G_{t}", G[t], (w[:, None] * V[:t + 1]).T @ K[:t + 1], 1e-12)
        lc.check_close(f"H_{t}", H[t], (w[:, None] * K[:t + 1]).T @ K[:t + 1], 1e-12)
    lc.check_close("H_t symmetric", H, np.swapaxes(H, 1, 2), 1e-14)


def test_long_sequence_with_gates_near_zero_stays_finite():
    """Gates of 1e-3 over 300 tokens: products underflow to 0 gracefully (log-gate differences)."""
    n = 300
    Q, K, V, _, lam, _ = _inputs(n, seed=3)
    gamma = np.full(n, 1e-3)
    O = lc.mesanet_recurrent(Q, K, V, gamma, lam)
    assert np.isfinite(O).all()
    lc.check_close("chunkwise, gates 1e-3", lc.mesanet_chunkwise(Q, K, V, gamma, lam, chunk_size=64), O, 1e-9)
    lc.check_close("parallel, gates 1e-3", lc.mesanet_parallel(Q, K, V, gamma, lam), O, 1e-9)


# ------------------------------------------------------------------ the regression view
def test_state_is_the_least_squares_solution():
    """S_t = G_t (H_t + Λ)^{-1} = numpy.linalg.lstsq on the stacked weighted system; it minimises
    the loss (the gradient S(H + Λ) − G vanishes, and any perturbation increases the loss)."""
    n = 40
    _, K, V, gamma, lam, beta = _inputs(n, d_k=6, seed=4)
    G, H = lc.mesanet_states(K, V, gamma, beta)
    S = _solve_rows(G, H, lam)
    rng = np.random.default_rng(0)
    for t in (0, 3, 5, 20, 39):                       # t + 1 < d_k: underdetermined, Λ decides
        w = lc.regression_weights(gamma, t, beta)
        lc.check_close(f"S_{t} = lstsq", S[t], lc.ridge_lstsq(K[:t + 1], V[:t + 1], w, lam), 1e-10)
        lc.check_close(f"gradient at S_{t}", S[t] @ (H[t] + np.diag(lam)) - G[t], 0.0 * G[t], 1e-10)
        base = lc.mesanet_loss(S[t], K, V, gamma, lam, t, beta)
        for _ in range(5):
            assert lc.mesanet_loss(S[t] + 1e-3 * rng.normal(size=S[t].shape), K, V, gamma, lam, t, beta) > base


def test_normal_equations_symbolically():
    """SymPy, d_v = 1, d_k = 2, three weighted pairs: the gradient of the loss is S(H + Λ) − G,
    so S = G (H + Λ)^{-1} makes it vanish."""
    k = [sp.Matrix(sp.symbols(f"k{j}a k{j}b")) for j in range(3)]
    v = sp.symbols("v0:3")
    w = sp.symbols("w0:3", positive=True)
    l1, l2 = sp.symbols("l1 l2", positive=True)
    S = sp.Matrix([sp.symbols("s1 s2")]).reshape(1, 2)
    loss = sum(w[j] * ((S * k[j])[0] - v[j]) ** 2 for j in range(3)) / 2 + (l1 * S[0] ** 2 + l2 * S[1] ** 2) / 2
    grad = sp.Matrix([[sp.diff(loss, S[0]), sp.diff(loss, S[1])]])
    H = sum((w[j] * k[j] * k[j].T for j in range(3)), sp.zeros(2, 2))
    G = sum((w[j] * v[j] * k[j].T for j in range(3)), sp.zeros(1, 2))
    Lam = sp.diag(l1, l2)
    lc.check_symbolic("∇L = S(H + Λ) − G", grad, S * (H + Lam) - G)
    S_star = G * (H + Lam).inv()
    lc.check_symbolic("∇L(G (H + Λ)^{-1}) = 0", (S_star * (H + Lam) - G).applyfunc(sp.simplify), sp.zeros(1, 2))


def test_sherman_morrison():
    a = sp.Matrix(2, 2, sp.symbols("a11 a12 a21 a22"))
    u, v = sp.Matrix(sp.symbols("u1 u2")), sp.Matrix(sp.symbols("v1 v2"))
    A_inv = a.inv()
    sm = A_inv - A_inv * u * v.T * A_inv / (1 + (v.T * A_inv * u)[0])
    lc.check_symbolic("Sherman–Morrison (2 × 2)", (sm - (a + u * v.T).inv()).applyfunc(sp.simplify), sp.zeros(2, 2))
    rng = np.random.default_rng(5)
    A = rng.normal(size=(6, 6)) + 6 * np.eye(6)
    x, y = rng.normal(size=6), rng.normal(size=6)
    lc.check_close("sherman_morrison = inverse", lc.sherman_morrison(np.linalg.inv(A), x, y),
                   np.linalg.inv(A + np.outer(x, y)), 1e-10)
    with pytest.raises(ValueError, match="singular"):
        lc.sherman_morrison(np.eye(2), np.array([1.0, 0.0]), np.array([-1.0, 0.0]))


def test_rls_gain_form_symbolically():
    """One RLS step: S_{t-1} + (v − S_{t-1}k) a^T with a = β Σ_t k, Σ_t = (A + β k k^T)^{-1},
    S_{t-1} = G A^{-1}, equals (G + β v k^T) Σ_t (A = H_{t-1} + Λ symmetric, d_k = 2)."""
    a11, a12, a22, b = sp.symbols("a11 a12 a22 beta")
    A = sp.Matrix([[a11, a12], [a12, a22]])
    G = sp.Matrix([sp.symbols("g1 g2")]).reshape(1, 2)
    k = sp.Matrix(sp.symbols("k1 k2"))
    v = sp.Symbol("v")
    Sigma = (A + b * k * k.T).inv()
    S_prev = G * A.inv()
    gain = b * Sigma * k
    lhs = S_prev + (v - (S_prev * k)[0]) * gain.T
    lc.check_symbolic("RLS gain form = batch solution", (lhs - (G + b * v * k.T) * Sigma).applyfunc(sp.simplify),
                      sp.zeros(1, 2))


def test_rls_equals_batch_without_gates_and_fades_the_regulariser_with_them():
    n = 60
    Q, K, V, gamma, lam, beta = _inputs(n, seed=6, gates=(0.9, 1.0))
    ones = np.ones(n)
    lc.check_close("RLS = MesaNet (no gates)", lc.mesanet_rls(Q, K, V, ones, lam, beta=beta),
                   lc.mesanet_recurrent(Q, K, V, ones, lam, beta=beta), 1e-9)
    O, S, Sigma = lc.mesanet_rls(Q, K, V, gamma, lam, beta=beta, return_states=True)
    G, H = lc.mesanet_states(K, V, gamma, beta)
    fade = np.cumprod(gamma)
    A = H + fade[:, None, None] * np.diag(lam)
    lc.check_close("gated RLS: Σ_t = (H_t + γ_1…γ_t Λ)^{-1}", Sigma, np.linalg.inv(A), 1e-8, relative=True)
    S_ref = np.swapaxes(np.linalg.solve(A, np.swapaxes(G, 1, 2)), 1, 2)
    lc.check_close("gated RLS: S_t = G_t Σ_t", S, S_ref, 1e-8, relative=True)
    lc.check_close("gated RLS: o_t = S_t q_t", O, np.einsum("tvk,tk->tv", S, Q), 1e-12)
    # and so, with gates, it is not MesaNet (whose Λ stays put)
    assert np.abs(O - lc.mesanet_recurrent(Q, K, V, gamma, lam, beta=beta)).max() > 1e-3


def test_deltanet_is_a_gradient_step_and_newton_is_exact():
    """From S_{t-1} = argmin L_{t-1}: ∇L_t(S_{t-1}) = β_t(S_{t-1}k_t − v_t)k_tᵀ + (1 − γ_t) S_{t-1}Λ
    (only the new pair's term, plus a decay when gated); a Newton step from any S lands on S_t;
    DeltaNet is the plain gradient step S − β_t(S k_t − v_t)k_tᵀ, token after token."""
    n = 30
    Q, K, V, gamma, lam, beta = _inputs(n, seed=7)
    G, H = lc.mesanet_states(K, V, gamma, beta)
    S = _solve_rows(G, H, lam)
    grad = lambda S_, t: S_ @ (H[t] + np.diag(lam)) - G[t]
    rng = np.random.default_rng(1)
    for t in (1, 12, 29):
        expect = beta[t] * np.outer(S[t - 1] @ K[t] - V[t], K[t]) + (1 - gamma[t]) * S[t - 1] @ np.diag(lam)
        lc.check_close(f"∇L_{t}(S_{t - 1})", grad(S[t - 1], t), expect, 1e-10)
        X = rng.normal(size=S[t].shape)
        newton = X - grad(X, t) @ np.linalg.inv(H[t] + np.diag(lam))
        lc.check_close(f"Newton step from anywhere = S_{t}", newton, S[t], 1e-10)
    b = rng.uniform(0.1, 1.0, n)
    Sd, O = np.zeros((3, 5)), np.empty((n, 3))
    for t in range(n):
        Sd = Sd - b[t] * np.outer(Sd @ K[t] - V[t], K[t])        # the gradient of ½|S k − v|²
        O[t] = Sd @ Q[t]
    lc.check_close("DeltaNet = LMS", lc.deltanet_recurrent(Q, K, V, b), O, 1e-10)


# ------------------------------------------------------------------ Λ and the spectrum
def test_lambda_sets_the_spectrum():
    """With t + 1 < d_k pairs H_t has rank t + 1 (d_k − t − 1 zero eigenvalues); the eigenvalues of
    H_t + λI are those of H_t plus λ, so cond(H_t + λI) = (eig_max + λ)/λ when H_t is singular."""
    n, d_k = 40, 12
    _, K, V, gamma, _, _ = _inputs(n, d_k=d_k, seed=8)
    _, H = lc.mesanet_states(K, V, gamma)
    for t in (0, 4, 10):
        ev = np.linalg.eigvalsh(H[t])
        assert np.linalg.matrix_rank(H[t], tol=1e-10 * ev[-1]) == t + 1
        lc.check_close(f"eig(H_{t} + 0.3 I) = eig(H_{t}) + 0.3", np.linalg.eigvalsh(H[t] + 0.3 * np.eye(d_k)),
                       ev + 0.3, 1e-12)
        lc.check_close(f"cond(H_{t} + 0.3 I)", np.linalg.cond(H[t] + 0.3 * np.eye(d_k)), (ev[-1] + 0.3) / 0.3,
                       1e-9, relative=True)


def test_gates_shrink_directions_no_longer_written():
    """A direction u orthogonal to every key after token s: uᵀ H_t u = Γ_ts uᵀ H_s u exactly."""
    rng = np.random.default_rng(9)
    n, d_k, s = 50, 6, 19
    K = rng.normal(size=(n, d_k))
    u = np.zeros(d_k)
    u[0] = 1.0
    K[s + 1:, 0] = 0.0                     # later keys never touch e_0
    gamma = rng.uniform(0.7, 1.0, n)
    _, H = lc.mesanet_states(K, np.zeros((n, 1)), gamma)
    c = np.cumsum(np.log(gamma))
    for t in (s, 30, 49):
        lc.check_close(f"uᵀ H_{t} u = Γ_{t},{s} uᵀ H_{s} u", u @ H[t] @ u, np.exp(c[t] - c[s]) * (u @ H[s] @ u),
                       1e-12)


def test_large_lambda_gives_gated_linear_attention():
    """λ o_t → G_t q_t (gated linear attention) as λ → ∞: the gap falls like 1/λ."""
    n = 25
    Q, K, V, gamma, _, _ = _inputs(n, seed=10)
    ref = lc.decay_attention_recurrent(Q, K, V, gamma)
    # λ well above the largest eigenvalue of every H_t (|k|² ~ 5, gates >= 0.7: below ~20)
    gaps = [np.abs(L * lc.mesanet_recurrent(Q, K, V, gamma, L) - ref).max() for L in (1e3, 1e4, 1e5)]
    assert gaps[0] / gaps[1] == pytest.approx(10, rel=0.1) and gaps[1] / gaps[2] == pytest.approx(10, rel=0.1)
    assert gaps[2] < 1e-3 * np.abs(ref).max()


# ------------------------------------------------------------------ conjugate gradients
def _spd(d, cond, seed):
    rng = np.random.default_rng(seed)
    Qm, _ = np.linalg.qr(rng.normal(size=(d, d)))
    return Qm @ np.diag(np.geomspace(1.0, cond, d)) @ Qm.T, rng.normal(size=d)


@pytest.mark.parametrize("cond", [2.0, 30.0, 1e3])
def test_cg_error_is_below_the_textbook_bound(cond):
    A, b = _spd(20, cond, seed=int(cond))
    res = lc.cg_convergence(A, b, 40)
    lc.check_close("cond(A)", res["kappa"], cond, 1e-8, relative=True)
    assert res["error"][0] == pytest.approx(1.0)
    # relative round-off in the A-norm is ~1e-14; the bound may fall below it
    assert np.all(res["error"] <= res["bound"] + 1e-12), (res["error"], res["bound"])
    assert res["error"][-1] < 1e-8


def test_cg_basics():
    A, b = _spd(8, 10.0, seed=11)
    x = np.linalg.solve(A, b)
    lc.check_close("d steps: exact", lc.conjugate_gradient(A, b, 8), x, 1e-10)
    lc.check_close("warm start at the solution stays", lc.conjugate_gradient(A, b, 3, x0=x), x, 1e-12)
    its = lc.conjugate_gradient(A, b, 5, return_iterates=True)
    assert its.shape == (6, 8) and np.all(its[0] == 0)
    lc.check_close("zero right-hand side: zero, no NaN", lc.conjugate_gradient(A, np.zeros(8), 4), np.zeros(8),
                   1e-300 + 1e-20)
    As = np.stack([A, 2 * A + np.eye(8)])
    bs = np.stack([b, -b])
    lc.check_close("batched = one at a time", lc.conjugate_gradient(As, bs, 8),
                   np.stack([lc.conjugate_gradient(As[i], bs[i], 8) for i in range(2)]), 1e-12)


def test_cg_needs_as_many_steps_as_distinct_eigenvalues():
    """With t + 1 < d_k pairs and a scalar λ, H_t + λI has at most t + 2 distinct eigenvalues:
    conjugate gradients are exact after t + 2 steps, long before d_k."""
    n, d_k = 10, 32
    Q, K, V, gamma, _, _ = _inputs(n, d_k=d_k, seed=12)
    _, H = lc.mesanet_states(K, V, gamma)
    t = 5
    A = H[t] + 0.5 * np.eye(d_k)
    x = np.linalg.solve(A, Q[t])
    lc.check_close(f"{t + 2} steps: exact", lc.conjugate_gradient(A, Q[t], t + 2), x, 1e-9)
    assert np.abs(lc.conjugate_gradient(A, Q[t], t) - x).max() > 1e-6      # and not before


def test_mesanet_cg_converges_to_the_exact_forms():
    n, d_k = 50, 6
    Q, K, V, gamma, lam, beta = _inputs(n, d_k=d_k, seed=13)
    O = lc.mesanet_chunkwise(Q, K, V, gamma, lam, beta=beta, chunk_size=8)
    for x0 in ("zero", "jacobi"):
        lc.check_close(f"CG, {d_k} + 10 steps, x0 = {x0}",
                       lc.mesanet_cg(Q, K, V, gamma, lam, d_k + 10, beta=beta, x0=x0, chunk_size=8), O, 1e-9)
    its = lc.mesanet_cg(Q, K, V, gamma, lam, 4, beta=beta, return_iterates=True)
    assert its.shape == (5, n, 3)
    lc.check_close("0 steps from zero: zero output", its[0], 0 * O, 1e-300 + 1e-20)
    lc.check_close("iterates = separate runs", its[3], lc.mesanet_cg(Q, K, V, gamma, lam, 3, beta=beta), 1e-12)
    G, H = lc.mesanet_states(K, V, gamma, beta)
    X = np.linalg.solve(H + np.diag(lam), Q[..., None])[..., 0]
    lc.check_close("warm start at the solution: exact at 0 steps",
                   lc.mesanet_cg(Q, K, V, gamma, lam, 0, beta=beta, x0=X), O, 1e-10)
    jac = lc.mesanet_cg(Q, K, V, gamma, lam, 0, beta=beta, x0="jacobi")
    x_j = Q / (np.diagonal(H, axis1=1, axis2=2) + lam)
    lc.check_close("Jacobi start = q / diag(H + Λ)", jac, np.einsum("tvk,tk->tv", G, x_j), 1e-12)


# ------------------------------------------------------------------ the experiments
def test_regression_race_shape_and_the_chapters_claims():
    d_k = 8
    r = lc.regression_race(40, d_k=d_k, d_v=2, noise=0.0, lam=1e-4, trials=20, seed=0)
    assert r["mesanet"].shape == r["deltanet"].shape == (40,) and r["pairs"][0] == 1
    # noiseless: least squares is (up to λ) exact once d_k independent keys are in; LMS is not
    assert r["mesanet"][d_k + 2:].max() < 1e-3
    assert np.all(r["deltanet"][d_k + 2:] > 10 * r["mesanet"][d_k + 2:])
    # one pair: both write the same thing up to λ (MesaNet) and β k kᵀ (DeltaNet)
    assert r["mesanet"][0] == pytest.approx(r["deltanet"][0], rel=1e-2)


def test_reassignment_with_orthonormal_keys_is_a_weighted_average():
    """Orthonormal keys: MesaNet's read of x is (ρ_first·5 + ρ_second·10)/(ρ_first + ρ_second + λ)
    exactly; DeltaNet's (β = 1, unit keys) is 10 exactly."""
    rng = np.random.default_rng(14)
    m, d_k, lam = 6, 10, 0.05
    keys, _ = np.linalg.qr(rng.normal(size=(d_k, m + 1)))
    keys = keys.T
    K = np.vstack([keys[0], keys[1:], keys[0]])
    V = np.vstack([[5.0], rng.normal(size=(m, 1)), [10.0]])
    n = m + 2
    for gm in (1.0, 0.9, 0.5):
        gamma = np.full(n, gm)
        G, H = lc.mesanet_states(K, V, gamma)
        S = _solve_rows(G, H, np.full(d_k, lam))[-1]
        w = lc.regression_weights(gamma, n - 1)
        lc.check_close(f"γ = {gm}: weighted average", (S @ keys[0])[0],
                       (w[0] * 5 + w[-1] * 10) / (w[0] + w[-1] + lam), 1e-12)
    Q = np.zeros_like(K)
    Q[-1] = keys[0]
    lc.check_close("DeltaNet reads 10", lc.deltanet_recurrent(Q, K, V)[-1, 0], 10.0, 1e-12)


def test_reassignment_experiment_claims():
    out = lc.reassignment_experiment([1.0, 0.9, 0.7], trials=10, seed=0)
    lc.check_close("DeltaNet replaces: reads 10", out["delta_x"], 10.0, 1e-9)
    assert 6.0 < out["mesa_x"][0] < 8.0                      # MesaNet without gates: near the average 7.5
    assert np.all(np.diff(out["mesa_x"]) > 0)               # gates move it towards 10 ...
    assert np.all(np.diff(out["mesa_fact_rmse"]) > 0)       # ... and forget the facts in between
    assert out["mesa_fact_rmse"][0] < out["delta_fact_rmse"]
    more = lc.reassignment_experiment([1.0], late_beta=9.0, trials=10, seed=0)
    assert more["mesa_x"][0] > out["mesa_x"][0] + 1.0       # a heavier late write: the per-token knob
    # the experiment's DeltaNet loop is the book's DeltaNet
    rng = np.random.default_rng(0)
    K = rng.normal(size=(7, 4))
    V = rng.normal(size=(7, 2))
    Qr = np.zeros_like(K)
    Qr[-1] = rng.normal(size=4)
    from lattn_core.mesanet import _delta_final_state
    lc.check_close("final state read = deltanet_recurrent", _delta_final_state(K, V, np.ones(7)) @ Qr[-1],
                   lc.deltanet_recurrent(Qr, K, V)[-1], 1e-12)


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("change,match", [
    (dict(Q=np.ones((4, 3))), "Q must have shape"),
    (dict(K=np.ones((5, 3, 1))), "K must have shape"),
    (dict(V=np.ones((4, 2))), "V must have shape"),
    (dict(gamma=np.full(5, 1.5)), r"gamma must lie in \(0, 1\]"),
    (dict(gamma=np.zeros(5)), r"gamma must lie in \(0, 1\]"),
    (dict(gamma=np.ones(4)), "gamma must have shape"),
    (dict(lam=0.0), r"lam must lie in \(0, inf\)"),
    (dict(lam=-np.ones(4)), r"lam must lie in \(0, inf\)"),
    (dict(lam=np.ones(3)), "lam must have shape"),
    (dict(lam=np.ones((4, 4))), r"lam must be a positive scalar or have shape \(4,\)"),
    (dict(beta=-np.ones(5)), r"beta must lie in \[0, inf\)"),
    (dict(beta=np.ones(6)), "beta must have shape"),
    (dict(Q=np.full((5, 4), np.nan)), "Q contains NaN"),
])
def test_bad_input_names_the_argument(change, match):
    rng = np.random.default_rng(0)
    args = dict(Q=rng.normal(size=(5, 4)), K=rng.normal(size=(5, 4)), V=rng.normal(size=(5, 2)),
                gamma=np.full(5, 0.9), lam=0.5, beta=None)
    args.update(change)
    for fn in (lc.mesanet_recurrent, lc.mesanet_parallel, lc.mesanet_chunkwise, lc.mesanet_rls):
        with pytest.raises(ValueError, match=match):
            fn(**args)
    with pytest.raises(ValueError, match=match):
        lc.mesanet_cg(**args, iterations=3)


def test_bad_input_of_the_helpers():
    rng = np.random.default_rng(0)
    Q, K, V = rng.normal(size=(5, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    g = np.full(5, 0.9)
    with pytest.raises(ValueError, match="chunk_size"):
        lc.mesanet_chunkwise(Q, K, V, g, 0.5, chunk_size=0)
    with pytest.raises(ValueError, match="iterations"):
        lc.mesanet_cg(Q, K, V, g, 0.5, -1)
    with pytest.raises(ValueError, match="x0 must be"):
        lc.mesanet_cg(Q, K, V, g, 0.5, 2, x0="previous")
    with pytest.raises(ValueError, match="x0 must have shape"):
        lc.mesanet_cg(Q, K, V, g, 0.5, 2, x0=np.zeros((5, 3)))
    with pytest.raises(ValueError, match="symmetric"):
        lc.conjugate_gradient(np.triu(np.ones((3, 3))), np.ones(3), 2)
    with pytest.raises(ValueError, match=r"A must have shape \(\.\.\., d, d\)"):
        lc.conjugate_gradient(np.ones((3, 2)), np.ones(3), 2)
    with pytest.raises(ValueError, match="b must have shape"):
        lc.conjugate_gradient(np.eye(3), np.ones(2), 2)
    with pytest.raises(ValueError, match="kappa"):
        lc.cg_bound(0.5, 3)
    with pytest.raises(ValueError, match="kappa must be real"):
        lc.cg_bound(2 + 1j, 3)
    with pytest.raises(ValueError, match="A must be real"):
        lc.conjugate_gradient(np.eye(3) * (1 + 1j), np.ones(3), 2)
    with pytest.raises(ValueError, match=r"t must lie in \[0, n - 1\]"):
        lc.regression_weights(g, 5)
    with pytest.raises(ValueError, match="weights must lie"):
        lc.ridge_lstsq(K, V, -np.ones(5), 0.5)
    with pytest.raises(ValueError, match="gammas must lie"):
        lc.reassignment_experiment([1.2])
    with pytest.raises(ValueError, match="noise must lie"):
        lc.regression_race(noise=-1.0)


@pytest.mark.parametrize("lam", [0.0, 1e-300, 1e-20, np.array([1.0, 1.0, 1e-30, 1.0])])
def test_lam_near_zero_raises_the_same_error_in_every_form(lam):
    """As lam -> 0 the forms used to disagree (one LinAlgError, one output, one error about an
    internal argument); now every form raises one ValueError naming lam. The floor: every entry at
    least 1e-12 of ``max lam + sum_j beta_j |k_j|^2`` (a bound on the largest eigenvalue of
    ``H_t + Diag(lam)``), so the systems' condition numbers stay below 1e12."""
    rng = np.random.default_rng(0)
    Q, K, V = rng.normal(size=(6, 4)), rng.normal(size=(6, 4)), rng.normal(size=(6, 2))
    g = np.full(6, 0.9)
    messages = set()
    for fn in (lc.mesanet_recurrent, lc.mesanet_parallel, lc.mesanet_rls, lc.mesanet_chunkwise):
        with pytest.raises(ValueError, match=r"^lam must ") as e:
            fn(Q, K, V, g, lam)
        messages.add(str(e.value))
    assert len(messages) == 1, messages


def test_mesanet_loss_checks_gamma_against_k():
    rng = np.random.default_rng(0)
    K, V = rng.normal(size=(6, 4)), rng.normal(size=(6, 2))
    with pytest.raises(ValueError, match=r"gamma must have shape \(6,\)"):
        lc.mesanet_loss(np.zeros((2, 4)), K, V, np.full(5, 0.9), 0.1, 3)
