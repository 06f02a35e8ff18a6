"""PaTH attention (lattn_core.path): the three forms, each step of the article's derivation, the two
special cases, RoPE as two reflections, and bad input.

Tolerances. The references are float64. With unit-norm ``w`` and ``β ∈ (0, 2]`` every factor
``E_t = I − β_t w_t w_tᵀ`` has norm at most 1, so scores stay O(|q||k|) and forms that regroup the
same sums differ by round-off ~1e-14: 1e-9 leaves headroom and fails on any
wrong term or mask. With arbitrary ``|w|`` a factor may stretch by ``|1 − β|w|²|`` > 1, scores grow
like a product of such factors, and the forms are compared relative to the largest score.
"""
import numpy as np
import pytest
import sympy as sp

import lattn_core as lc


def _inputs(n, d=4, seed=0, w_norm=1.0):
    rng = np.random.default_rng(seed)
    Q, K, V = rng.normal(size=(n, d)), rng.normal(size=(n, d)), rng.normal(size=(n, 3))
    W = rng.normal(size=(n, d))
    if w_norm is not None:
        W = w_norm * W / np.linalg.norm(W, axis=1, keepdims=True)
    beta = rng.uniform(0.05, 2.0, size=n)
    return Q, K, V, W, beta


def _finite_close(name, A, B, tol, relative=False):
    assert (np.isfinite(A) == np.isfinite(B)).all(), f"{name}: masks differ"
    m = np.isfinite(A)
    lc.check_close(name, A[m], B[m], tol, relative=relative)


@pytest.mark.parametrize("n,C", [(1, 1), (2, 1), (9, 4), (40, 16), (65, 64), (70, 13)])
def test_three_forms_agree(n, C):
    Q, K, V, W, beta = _inputs(n, seed=n)
    A = lc.path_scores_recurrent(Q, K, W, beta)
    assert np.isneginf(A[np.triu_indices(n, 1)]).all() and np.isfinite(A[np.tril_indices(n)]).all()
    _finite_close("closed form = definition", lc.path_attention_scores(Q, K, W, beta), A, 1e-9)
    _finite_close(f"blocks of {C} = definition", lc.path_scores_chunkwise(Q, K, W, beta, chunk_size=C), A, 1e-9)
    O = lc.path_attention_recurrent(Q, K, V, W, beta)
    lc.check_close("attention: parallel = recurrent", lc.path_attention(Q, K, V, W, beta), O, 1e-9)
    lc.check_close("attention: chunkwise = recurrent",
                   lc.path_attention_chunkwise(Q, K, V, W, beta, chunk_size=C), O, 1e-9)


@pytest.mark.parametrize("w_norm,beta_const", [(None, None), (np.sqrt(2), 1.0), (1.0, 2.0), (0.5, None)])
def test_forms_agree_for_any_norm(w_norm, beta_const):
    """|w| arbitrary (random), √2 with β = 1, unit with β = 2: relative to the largest score (a
    stretching factor makes scores grow; float64 round-off relative to them stays ~1e-14)."""
    n = 30
    Q, K, V, W, beta = _inputs(n, seed=3, w_norm=w_norm)
    if beta_const is not None:
        beta = np.full(n, beta_const)
    A = lc.path_scores_recurrent(Q, K, W, beta)
    _finite_close("closed form", lc.path_attention_scores(Q, K, W, beta), A, 1e-9, relative=True)
    _finite_close("blocks of 7", lc.path_scores_chunkwise(Q, K, W, beta, chunk_size=7), A, 1e-9, relative=True)


def test_first_row_and_beta_zero():
    """n = 1: the single score is q·k; β = 0 switches every factor off: plain causal scores Q Kᵀ."""
    Q, K, V, W, beta = _inputs(12, seed=5)
    A1 = lc.path_attention_scores(Q[:1], K[:1], W[:1], beta[:1])
    lc.check_close("n = 1", A1[0, 0], Q[0] @ K[0], 1e-12)
    A0 = lc.path_attention_scores(Q, K, W, np.zeros(12))
    _finite_close("β = 0 is Q Kᵀ", A0, np.where(np.tril(np.ones((12, 12), bool)), Q @ K.T, -np.inf), 1e-12)
    lc.check_close("β = 0: PaTH = softmax attention", lc.path_attention(Q, K, V, W, np.zeros(12)),
                   lc.softmax_attention(Q, K, V), 1e-12)


def test_transition_closed_form_and_sub_block_inverse():
    """R_ij as a product = its closed form over W_[j:i]; the inverse of a sub-block of a triangular
    matrix is the sub-block of its inverse (the step that lets one T serve every (i, j))."""
    n = 14
    _, _, _, W, beta = _inputs(n, seed=7)
    for i, j in [(0, 0), (5, 4), (9, 2), (13, 0)]:
        lc.check_close(f"R_{i}{j}: product = closed form", lc.householder_product(W, beta, i, j),
                       lc.path_transition(W, beta, i, j), 1e-12)
    L = np.eye(n) + np.tril(np.random.default_rng(1).normal(size=(n, n)), -1)
    inv = np.linalg.inv(L)
    for a, b in [(0, 5), (3, 9), (7, 14)]:
        lc.check_close(f"inverse of L[{a}:{b}, {a}:{b}]", np.linalg.inv(L[a:b, a:b]), inv[a:b, a:b], 1e-10)


def test_sub_block_inverse_and_orthogonal_products_symbolically():
    """Two steps of the derivation in SymPy. A sub-block on the diagonal of the inverse of a lower
    triangular matrix (4 × 4, symbolic entries) is the inverse of the same sub-block; and with
    β|w|² = 2 (d = 2, w = √2 (cos θ, sin θ), β = 1) every factor is orthogonal, E Eᵀ = I, so the
    product between tokens i and j is R_i R_jᵀ with R_i the product from the first token."""
    n = 4
    L = sp.Matrix(n, n, lambda r, c: sp.Symbol(f"l{r}{c}") if r > c else (sp.Symbol(f"d{r}") if r == c else 0))
    inv = L.inv()
    for j, i in ((0, 2), (1, 3), (1, 4), (2, 3)):
        assert sp.simplify(inv[j:i, j:i] - L[j:i, j:i].inv()) == sp.zeros(i - j, i - j)
    thetas = sp.symbols("theta1:4", real=True)

    def factor(t):
        w = sp.sqrt(2) * sp.Matrix([sp.cos(t), sp.sin(t)])
        return sp.eye(2) - w * w.T

    E = [factor(t) for t in thetas]
    for Et in E:
        assert sp.simplify(Et * Et.T - sp.eye(2)) == sp.zeros(2, 2)
    R1, R3 = E[0], E[2] * E[1] * E[0]                  # products from the first token
    assert sp.simplify(R3 * R1.T - E[2] * E[1]) == sp.zeros(2, 2)


@pytest.mark.parametrize("n,i,j", [(6, 5, 0), (11, 7, 3), (20, 19, 18), (9, 4, 4)])
def test_each_equality_of_the_derivation(n, i, j):
    """The article's component forms of A_ij, line by line, on random sizes (float64, O(1) terms)."""
    Q, K, _, W, beta = _inputs(n, seed=n + i)
    terms = lc.path_score_terms(Q, K, W, beta, i, j)
    ref = terms["product"]
    for name, value in terms.items():
        lc.check_close(f"A_{i}{j} by '{name}'", value, ref, 1e-10)


@pytest.mark.parametrize("n,i", [(6, 0), (11, 7), (20, 19)])
def test_each_equality_of_the_second_derivation(n, i):
    """The article's component forms of (q_iᵀ R_i)_s, R_i = E_i ⋯ E_0, line by line, ending in
    Q − DeltaNet(Q, W, W) (float64, O(1) terms, 1e-10), for unit w with random β and for |w| = √2
    with β = 1 (reflections). The product itself must differ from q_i, so that a line which dropped
    the correction term could not pass."""
    for w_norm, beta_const in ((1.0, None), (np.sqrt(2), 1.0)):
        Q, _, _, W, beta = _inputs(n, seed=n + i, w_norm=w_norm)
        if beta_const is not None:
            beta = np.full(n, beta_const)
        terms = lc.path_qk_terms(Q, W, beta, i)
        ref = terms["product"]
        assert np.abs(ref - Q[i]).max() > 1e-3          # the factors moved the query
        for name, value in terms.items():
            assert value.shape == Q[i].shape, name
            lc.check_close(f"(q_{i}ᵀ R_{i}) by '{name}'", value, ref, 1e-10)


def test_transition_is_deltanet_with_zero_values_symbolically():
    """SymPy, n = 3, d = 2: the product E_2 E_1 (β folded in) equals the closed form
    I − W_sᵀ (I + Diag(β)(W_s W_sᵀ ⊙ M⁻))^{-1} Diag(β) W_s exactly."""
    w = sp.Matrix(3, 2, sp.symbols("w0:6"))
    b = sp.symbols("b0:3")
    E = [sp.eye(2) - b[t] * w[t, :].T * w[t, :] for t in range(3)]
    product = E[2] * E[1]
    Ws = w[1:, :]
    Bs = sp.diag(b[1], b[2])
    Mminus = sp.Matrix(2, 2, lambda r, c: 1 if r > c else 0)
    inner = sp.eye(2) + Bs * (Ws * Ws.T).multiply_elementwise(Mminus)
    closed = sp.eye(2) - Ws.T * inner.inv() * Bs * Ws
    lc.check_symbolic("E_2 E_1 = closed form", sp.simplify(product - closed), sp.zeros(2, 2))


def test_w_equal_k_is_deltanet():
    """W = K: (I − (I + A)^{-1} A = (I + A)^{-1}) PaTH's scores are DeltaNet's attention matrix
    before Diag(β): scores · Diag(β) V = deltanet_parallel (float64 solves, 1e-10)."""
    n = 25
    Q, K, V, _, beta = _inputs(n, seed=9)
    A = lc.path_attention_scores(Q, K, K, beta)
    lc.check_close("PaTH(W = K) Diag(β) V = DeltaNet", np.where(np.isfinite(A), A, 0.0) @ (beta[:, None] * V),
                   lc.deltanet_parallel(Q, K, V, beta), 1e-10)
    a = sp.Matrix(2, 2, [0, 0, sp.Symbol("a"), 0])
    lc.check_symbolic("I − (I + A)^{-1} A = (I + A)^{-1}", sp.eye(2) - (sp.eye(2) + a).inv() * a,
                      (sp.eye(2) + a).inv())


def test_orthogonal_factors_make_pa_th_absolute():
    """β|w|² = 2 (β = 1, |w| = √2, or β = 2, |w| = 1): R_ij = R_i R_jᵀ, so PaTH is softmax attention
    on Q − DeltaNet(Q, W, W) and K − DeltaNet(K, W, W). With |w| ≠ √2 the two differ."""
    n = 20
    Q, K, V, W, _ = _inputs(n, seed=11)
    for w_scale, b in ((np.sqrt(2), 1.0), (1.0, 2.0)):
        Wn, beta = w_scale * W, np.full(n, b)
        R = [lc.householder_product(np.vstack([np.zeros((1, 4)), Wn]), np.r_[0.0, beta], t + 1, 0) for t in range(n)]
        for i, j in [(7, 3), (19, 0)]:
            lc.check_close(f"R_{i}{j} = R_i R_jᵀ", lc.householder_product(Wn, beta, i, j), R[i] @ R[j].T, 1e-12)
        _finite_close("PaTH = absolute form", lc.path_absolute_scores(Q, K, Wn, beta),
                      lc.path_attention_scores(Q, K, Wn, beta), 1e-10)
        Qt = lc.path_qk_transform(Q, Wn, beta)
        lc.check_close("softmax attention on the transformed Q, K",
                       lc.softmax_attention(Qt, lc.path_qk_transform(K, Wn, beta), V),
                       lc.path_attention(Q, K, V, Wn, beta), 1e-10)
    A, B = lc.path_attention_scores(Q, K, 0.8 * W, None), lc.path_absolute_scores(Q, K, 0.8 * W, None)
    m = np.isfinite(A)
    assert np.abs(A[m] - B[m]).max() > 1e-2     # the identity needs orthogonal factors


def test_two_reflections_make_a_rotation():
    """RoPE's Ω as PaTH factors: E_b E_a is the rotation by twice the angle from a to b."""
    theta = 0.37
    R = lc.reflection_rotation([1.0, 0.0], [np.cos(theta / 2), np.sin(theta / 2)])
    rot = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    lc.check_close("E_b E_a = rotation by θ", R, rot, 1e-12)


def test_rope_is_relative_and_a_special_case_of_path():
    """RoPE's identity (Ω^i q)ᵀ(Ω^j k) = qᵀ Ω^(j−i) k for an orthogonal Ω (random, 6 × 6, by QR; and in
    SymPy for a planar rotation), and
    PaTH with two unit mirrors a, b alternating at β = 2 is RoPE: R_{2m,0} = (E_b E_a)^m = Ω^m with
    Ω the rotation of the two reflections; with one repeated factor R_ij = E^(i−j) depends on i − j
    only. Float64 products of at most nine small matrices: round-off ~1e-15."""
    rng = np.random.default_rng(3)
    omega = np.linalg.qr(rng.normal(size=(6, 6)))[0]
    q, k = rng.normal(size=6), rng.normal(size=6)
    power = np.linalg.matrix_power
    for i, j in ((5, 2), (2, 5), (4, 4), (7, 0)):
        lhs = (power(omega, i) @ q) @ (power(omega, j) @ k)
        rhs = q @ (power(omega, j - i) if j >= i else power(omega.T, i - j)) @ k
        assert abs(lhs - rhs) < 1e-12
    # the same identity in SymPy for a planar rotation by θ and symbolic vectors, i = 3, j = 1
    th = sp.Symbol("theta", real=True)
    rot = sp.Matrix([[sp.cos(th), -sp.sin(th)], [sp.sin(th), sp.cos(th)]])
    qs, ks = sp.Matrix(sp.symbols("q0 q1")), sp.Matrix(sp.symbols("k0 k1"))
    assert sp.simplify(((rot ** 3 * qs).T * (rot * ks))[0] - (qs.T * (rot.T ** 2) * ks)[0]) == 0
    a, b = np.array([1.0, 0.0]), np.array([np.cos(0.3), np.sin(0.3)])
    W = np.array([a if t % 2 else b for t in range(9)])
    rotation = lc.reflection_rotation(a, b)
    for m in range(5):
        np.testing.assert_allclose(lc.householder_product(W, np.full(9, 2.0), 2 * m, 0),
                                   power(rotation, m), atol=1e-12)
    w = rng.normal(size=4)
    W1, beta1 = np.tile(w, (8, 1)), np.full(8, 0.7)
    E = np.eye(4) - 0.7 * np.outer(w, w)
    for i, j in ((3, 1), (7, 5), (6, 0)):
        np.testing.assert_allclose(lc.householder_product(W1, beta1, i, j), power(E, i - j), atol=1e-12)


def test_forget_gates_add_fox_bias():
    """PaTH-FoX: the gates add log Γ_ij to the scores; gates of 1 change nothing."""
    n = 18
    Q, K, V, W, beta = _inputs(n, seed=13)
    g = np.random.default_rng(2).uniform(0.3, 1.0, size=n)
    O = lc.path_attention_recurrent(Q, K, V, W, beta, gamma=g)
    lc.check_close("PaTH-FoX parallel", lc.path_attention(Q, K, V, W, beta, gamma=g), O, 1e-10)
    lc.check_close("PaTH-FoX chunkwise", lc.path_attention_chunkwise(Q, K, V, W, beta, gamma=g, chunk_size=5), O,
                   1e-10)
    lc.check_close("gates of one", lc.path_attention(Q, K, V, W, beta, gamma=np.ones(n)),
                   lc.path_attention(Q, K, V, W, beta), 1e-12)
    assert np.abs(O - lc.path_attention(Q, K, V, W, beta)).max() > 1e-3


def test_bad_inputs_raise():
    Q, K, V, W, beta = _inputs(6)
    with pytest.raises(ValueError, match="W must have shape"):
        lc.path_attention_scores(Q, K, W[:5], beta)
    for bad in (2.5, -0.1):        # beta must lie in [0, 2], both ends checked
        with pytest.raises(ValueError, match="beta"):
            lc.path_attention_scores(Q, K, W, np.full(6, bad))
    with pytest.raises(ValueError, match="K must have shape"):
        lc.path_attention_scores(Q, K[:, :3], W, beta)
    with pytest.raises(ValueError, match="gamma"):
        lc.path_attention(Q, K, V, W, beta, gamma=np.zeros(6))
    with pytest.raises(ValueError, match="V must have shape"):
        lc.path_attention(Q, K, V[:4], W, beta)
    with pytest.raises(ValueError, match="chunk_size"):
        lc.path_scores_chunkwise(Q, K, W, beta, chunk_size=0)
    with pytest.raises(ValueError, match="need 0 <= j <= i"):
        lc.householder_product(W, beta, 2, 3)
    # the transition helpers take the range path_attention takes: beta in [0, 2]
    for fn in (lc.householder_product, lc.path_transition):
        for bad in (2.5, -0.1):
            with pytest.raises(ValueError, match=r"beta must lie in \[0, 2\]"):
                fn(W, np.full(6, bad), 4, 1)
        assert np.isfinite(fn(W, np.full(6, 2.0), 4, 1)).all()           # the ends are allowed
        assert np.isfinite(fn(W, np.zeros(6), 4, 1)).all()
        for i, j in ((4.0, 1), (4, 1.5), (True, 0)):
            with pytest.raises(ValueError, match=r"^[ij] must be an integer >= 0"):
                fn(W, beta, i, j)
    with pytest.raises(ValueError, match=r"^i must be an integer >= 0"):
        lc.path_score_terms(Q, K, W, beta, 4.5, 1)
    with pytest.raises(ValueError, match="need 0 <= i < n"):
        lc.path_qk_terms(Q, W, beta, 6)
    with pytest.raises(ValueError, match="W must have shape"):
        lc.path_qk_terms(Q, W[:5], beta, 2)
    with pytest.raises(ValueError, match="non-zero"):
        lc.reflection_rotation([0.0, 0.0], [1.0, 0.0])


def test_factor_is_orthogonal_exactly_for_reflections_symbolically():
    """Chapter 9's exercise 1: ``EᵀE − I = β(β|w|² − 2) w wᵀ`` for ``E = I − β w wᵀ`` (SymPy, d = 3),
    so the factor is orthogonal exactly when ``β|w|² = 2`` (or ``β = 0``); a numerical ``E`` with
    ``β = 1.5``, unit ``w`` is not."""
    w = sp.Matrix(sp.symbols("w0:3"))
    b = sp.Symbol("beta")
    E = sp.eye(3) - b * w * w.T
    norm2 = (w.T * w)[0, 0]
    assert sp.simplify(E.T * E - sp.eye(3) - b * (b * norm2 - 2) * w * w.T) == sp.zeros(3, 3)
    assert sp.simplify((E.T * E - sp.eye(3)).subs(b, 2 / norm2)) == sp.zeros(3, 3)
    u = np.array([0.6, 0.8, 0.0])
    En = lc.householder_product(np.stack([u, u]), np.array([0.0, 1.5]), 1, 0)
    assert np.abs(En.T @ En - np.eye(3)).max() > 0.1
