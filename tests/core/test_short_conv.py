"""Short convolutions and the K = V argument (lattn_core.short_conv, Chapter 11): the four forms of
the convolution, the one-tap shift, the Toeplitz form with SymPy, the decoding cache, bad input;
DeltaNet's state when V = K in closed form (numerically, with SymPy, against Chapter 4's autodiff
test-time training and Chapter 9's product of factors), the exact least-squares state, the
neighbour pairs as a shifted key, and the measured claims the chapter makes.

Tolerances. Everything is float64. A convolution output is a sum of at most ``w`` products, so the
forms differ by round-off ~1e-16; 1e-12 leaves room and fails for any wrong tap or offset, which
moves an entry by O(1). DeltaNet's state after ``n <= 64`` unit-key steps with ``beta in (0, 2]``
stays O(1) (every factor has norm <= 1); regrouping the same products gives ~1e-14, checked to
1e-10. Least squares goes through one solve with a condition number below 1e4 here: 1e-9.
"""
import numpy as np
import pytest
import sympy as sp

import lattn_core as lc


def _unit(A):
    return A / np.linalg.norm(A, axis=-1, keepdims=True)


def _conv_brute(X, W):
    """The definition entry by entry, with Python loops."""
    n, d = X.shape
    Y = np.zeros((n, d))
    for t in range(n):
        for c in range(d):
            Y[t, c] = sum(W[i, c] * X[t - i, c] for i in range(W.shape[0]) if t - i >= 0)
    return Y


# ------------------------------------------------------------------ the convolution
@pytest.mark.parametrize("n,w,d,C", [(1, 1, 3, 1), (1, 4, 2, 5), (2, 4, 3, 1), (9, 2, 4, 4), (17, 4, 5, 3),
                                     (30, 4, 6, 64), (12, 7, 2, 5)])
def test_four_forms_agree(n, w, d, C):
    rng = np.random.default_rng(n * 10 + w)
    X, W = rng.normal(size=(n, d)), rng.normal(size=(w, d))
    ref = _conv_brute(X, W)
    lc.check_close("definition = brute force", lc.short_conv(X, W), ref, 1e-12)
    lc.check_close("decoding loop = brute force", lc.short_conv_recurrent(X, W), ref, 1e-12)
    lc.check_close("Toeplitz form = brute force", lc.short_conv_parallel(X, W), ref, 1e-12)
    lc.check_close(f"blocks of {C} = brute force", lc.short_conv_chunkwise(X, W, chunk_size=C), ref, 1e-12)
    silu_ref = ref / (1 + np.exp(-ref))
    for fn in (lc.short_conv, lc.short_conv_recurrent, lc.short_conv_parallel, lc.short_conv_chunkwise):
        lc.check_close(f"{fn.__name__} with SiLU", fn(X, W, activation="silu"), silu_ref, 1e-12)


def test_silu_is_x_times_sigmoid_and_finite():
    x = np.linspace(-30, 30, 121)
    lc.check_close("SiLU(x) = x sigmoid(x)", lc.silu(x), x / (1 + np.exp(-x)), 1e-12)
    assert np.all(np.isfinite(lc.silu(np.array([-1e4, 1e4])))) and lc.silu(np.array([1e4]))[0] == 1e4


def test_one_tap_shift_moves_the_sequence_down():
    """weight = e_1 (shift_weight): y_t = x_{t-1}, a zero first row, = J X; with more taps and the
    one in row `lag`, y_t = x_{t-lag}. Exact (products by 0 and 1)."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(8, 3))
    Y = lc.short_conv(X, lc.shift_weight(3))
    assert np.array_equal(Y[1:], X[:-1]) and np.array_equal(Y[0], np.zeros(3))
    assert np.array_equal(lc.shift_matrix(8) @ X, Y)
    Y3 = lc.short_conv(X, lc.shift_weight(3, lag=2, width=4))
    assert np.array_equal(Y3[2:], X[:-2]) and not Y3[:2].any()
    assert np.array_equal(lc.short_conv(X, lc.shift_weight(3, lag=0)), X)


def test_conv_matrix_is_a_sum_of_shifts_symbolically():
    """Psi = sum_i w_i J^i, banded lower-triangular Toeplitz: Psi[t, s] = w_{t-s} for 0 <= t-s < w
    (SymPy, n = 5, three symbolic taps); Psi x is the convolution of x; Toeplitz matrices of two
    convolutions commute and their product is the convolution of the taps (SymPy)."""
    n = 5
    w = sp.symbols("w0:3")
    a = sp.symbols("a0:2")
    J = sp.Matrix(n, n, lambda r, c: 1 if r == c + 1 else 0)
    Psi = sum((w[i] * J ** i for i in range(3)), sp.zeros(n, n))
    want = sp.Matrix(n, n, lambda r, c: w[r - c] if 0 <= r - c < 3 else 0)
    lc.check_symbolic("sum_i w_i J^i = banded Toeplitz", Psi, want)
    x = sp.Matrix(sp.symbols("x0:5"))
    conv = sp.Matrix([sum(w[i] * x[t - i] for i in range(3) if t - i >= 0) for t in range(n)])
    lc.check_symbolic("Psi x = the convolution of x", Psi * x, conv)
    A = a[0] * sp.eye(n) + a[1] * J
    lc.check_symbolic("Toeplitz convolutions commute", Psi * A, A * Psi)
    taps = sp.Poly(sum(w[i] * sp.Symbol("z") ** i for i in range(3)) * (a[0] + a[1] * sp.Symbol("z")),
                   sp.Symbol("z")).all_coeffs()[::-1]
    lc.check_symbolic("product = convolution of the taps", Psi * A,
                      sum((c * J ** i for i, c in enumerate(taps)), sp.zeros(n, n)))
    rng = np.random.default_rng(2)
    wn = rng.normal(size=3)
    lc.check_close("conv_matrix = the SymPy matrix", lc.conv_matrix(wn, n),
                   np.array(want.subs(dict(zip(w, wn))), dtype=float), 1e-12)


def test_decoding_cache_continues_the_sequence():
    """The cache after one piece, passed as initial_state, continues it exactly; the cache is the
    last w - 1 inputs."""
    rng = np.random.default_rng(3)
    X, W = rng.normal(size=(13, 4)), rng.normal(size=(4, 4))
    Y1, state = lc.short_conv_recurrent(X[:6], W, return_state=True)
    assert np.array_equal(state, X[3:6])
    Y2 = lc.short_conv_recurrent(X[6:], W, initial_state=state)
    lc.check_close("two pieces = one sequence", np.vstack([Y1, Y2]), lc.short_conv(X, W), 1e-12)
    _, s1 = lc.short_conv_recurrent(X[:6], W[:1], return_state=True)
    assert s1.shape == (0, 4)


def test_fla_weight_layout_round_trip():
    """(w, d) with weight[0] current ↔ fla's (d, w) with the last column current: a round trip is
    the identity and the current tap lands in the last column."""
    W = np.arange(12.0).reshape(3, 4)
    F = lc.conv_weight_to_fla(W)
    assert F.shape == (4, 3) and np.array_equal(F[:, -1], W[0]) and np.array_equal(F[:, 0], W[2])
    assert np.array_equal(lc.conv_weight_from_fla(F), W)


def test_bad_input_raises():
    X, W = np.ones((5, 3)), np.ones((2, 3))
    with pytest.raises(ValueError, match=r"X must have shape \(n, d\)"):
        lc.short_conv(np.ones(5), W)
    with pytest.raises(ValueError, match=r"weight must have shape \(w, 3\)"):
        lc.short_conv(X, np.ones((2, 4)))
    with pytest.raises(ValueError, match="X contains NaN"):
        lc.short_conv_parallel(np.full((5, 3), np.nan), W)
    with pytest.raises(ValueError, match="activation must be one of"):
        lc.short_conv(X, W, activation="relu")
    with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
        lc.short_conv_chunkwise(X, W, chunk_size=0)
    with pytest.raises(ValueError, match=r"initial_state must have shape \(1, 3\)"):
        lc.short_conv_recurrent(X, W, initial_state=np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"initial_state must have shape \(0, 3\)"):
        lc.short_conv_recurrent(X, W[:1], initial_state=np.ones((1, 3)))
    with pytest.raises(ValueError, match="lag must be a non-negative integer"):
        lc.shift_matrix(4, -1)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        lc.conv_matrix([1.0, 2.0], 0)
    with pytest.raises(ValueError, match="width must be greater than lag"):
        lc.shift_weight(3, lag=2, width=2)
    with pytest.raises(ValueError, match="beta must lie in"):
        lc.tied_deltanet_state(np.ones((3, 2)), beta=np.array([1.0, 2.5, 1.0]))
    with pytest.raises(ValueError, match="lam must lie in"):
        lc.least_squares_state(np.ones((3, 2)), np.ones((3, 2)), 0.0)
    with pytest.raises(ValueError, match="S must be square"):
        lc.identity_gap(np.ones((2, 3)))
    with pytest.raises(ValueError, match="X must hold at least 2 tokens"):
        lc.readout(np.eye(3), np.ones((1, 3)))
    with pytest.raises(ValueError, match="width must be at least 2"):
        lc.context_recall(1)
    with pytest.raises(ValueError, match="n_hubs must be <= n_phrases"):
        lc.context_recall(3, n_phrases=2, n_hubs=3)
    with pytest.raises(ValueError, match="shift must be 0 or 1"):
        lc.lag_weights(3, 8, shift=2)
    with pytest.raises(ValueError, match=r"dY must have shape \(5, 3\)"):
        lc.short_conv_grads(X, W, np.ones((4, 3)))
    # SiLU rejects what every other reference rejects (NaN used to pass through)
    for bad, what in ((np.array([1.0, np.nan]), "NaN"), (np.array([np.inf]), "inf")):
        with pytest.raises(ValueError, match=f"x contains {what}"):
            lc.silu(bad)
    with pytest.raises(ValueError, match="x must be real"):
        lc.silu(np.ones(2) * 1j)
    # context_recall: sizes checked before NumPy sees them
    for kw, match in ((dict(d=0), "d must be a positive integer"), (dict(d=2.5), "d must be a positive integer"),
                      (dict(d=2), r"width must be at most d \+ 1 = 3"),
                      (dict(n_phrases=0), "n_phrases must be a positive integer")):
        with pytest.raises(ValueError, match=match):
            lc.context_recall(4, **kw)


# ------------------------------------------------------------------ keys equal to values
@pytest.mark.parametrize("n,d", [(1, 3), (5, 4), (40, 8)])
def test_tied_deltanet_state_closed_form(n, d):
    """With V = K: the recurrence's last state = I − (I − β_1 k_1 k_1ᵀ)...(I − β_n k_n k_nᵀ)
    (tied_deltanet_state) = Chapter 4's test-time training on the squared loss by autodiff
    (η = β) = I − Rᵀ with R = H_n ... H_1 Chapter 9's product of factors."""
    rng = np.random.default_rng(n + d)
    K = _unit(rng.normal(size=(n, d)))
    beta = rng.uniform(0.1, 2.0, size=n)
    S = lc.tied_deltanet_state(K, beta)
    lc.check_close("closed form = recurrence", S, lc.deltanet_states(K, K, beta)[-1], 1e-10)
    _, S_ttt = lc.ttt_recurrent(K, K, K, "squared", eta=beta, return_state=True)
    lc.check_close("closed form = autodiff TTT", S, S_ttt, 1e-10)
    W0 = np.vstack([np.zeros(d), K])                        # a dummy token 0: R_{n,0} = H_n ... H_1
    R = lc.householder_product(W0, np.concatenate([[1.0], beta]), n, 0)
    lc.check_close("closed form = I − Rᵀ (Chapter 9)", S, np.eye(d) - R.T, 1e-10)


def test_tied_deltanet_step_symbolically():
    """One DeltaNet step with v = k: S_t − I = (S_{t−1} − I)(I − β k kᵀ), for a symbolic 2 × 2
    state, key and β."""
    S = sp.Matrix(2, 2, sp.symbols("s0:4"))
    k = sp.Matrix(sp.symbols("k0:2"))
    b = sp.Symbol("beta")
    step = S + b * (k - S * k) * k.T
    lc.check_symbolic("S_t − I = (S_{t−1} − I)(I − β k kᵀ)", step - sp.eye(2),
                      (S - sp.eye(2)) * (sp.eye(2) - b * k * k.T))


def test_identity_minimises_the_tied_objective_symbolically():
    """L(S) = ½ Σ_j |S k_j − k_j|² for two symbolic keys in two dimensions: its gradient is
    (S − I) Σ_j k_j k_jᵀ, zero at S = I, where L = 0 ≤ L(S) everywhere."""
    S = sp.Matrix(2, 2, sp.symbols("s0:4"))
    keys = [sp.Matrix(sp.symbols(f"k{j}_0:2")) for j in range(2)]
    L = sum(((S * k - k).T * (S * k - k))[0, 0] for k in keys) / 2
    grad = S.applyfunc(lambda s: sp.diff(L, s))
    H = sum((k * k.T for k in keys), sp.zeros(2, 2))
    lc.check_symbolic("∇L = (S − I) Σ k kᵀ", grad, (S - sp.eye(2)) * H)
    lc.check_symbolic("∇L(I) = 0", grad.subs(dict(zip(S, sp.eye(2)))), sp.zeros(2, 2))
    lc.check_symbolic("L(I) = 0", L.subs(dict(zip(S, sp.eye(2)))), 0)


def test_least_squares_state_with_tied_keys():
    """The exact solution V^T K (KᵀK + λI)^{-1}: its gradient of Σ|S k − v|² + λ|S|² is zero; with
    V = K it is I − λ(KᵀK + λI)^{-1} (numerically, and with SymPy on a 2 × 2 H); as λ → 0 with
    n ≥ d keys it tends to I."""
    rng = np.random.default_rng(5)
    K, V = _unit(rng.normal(size=(12, 4))), rng.normal(size=(12, 3))
    lam = 0.3
    S = lc.least_squares_state(K, V, lam)
    grad = (S @ K.T - V.T) @ K + lam * S
    lc.check_close("gradient at the solution", grad, np.zeros_like(S), 1e-9)
    St = lc.least_squares_state(K, K, lam)
    lc.check_close("V = K: I − λ(KᵀK + λI)^{-1}", St,
                   np.eye(4) - lam * np.linalg.inv(K.T @ K + lam * np.eye(4)), 1e-9)
    h = sp.symbols("h0:3")
    lam_s = sp.Symbol("lambda", positive=True)
    Hs = sp.Matrix([[h[0], h[1]], [h[1], h[2]]])
    lc.check_symbolic("H (H + λI)^{-1} = I − λ (H + λI)^{-1}", Hs * (Hs + lam_s * sp.eye(2)).inv(),
                      sp.eye(2) - lam_s * (Hs + lam_s * sp.eye(2)).inv())
    assert lc.identity_gap(lc.least_squares_state(K, K, 1e-9)) < 1e-7


def test_identity_gap():
    assert lc.identity_gap(np.eye(4)) == 0.0
    assert lc.identity_gap(3 * np.eye(4), scaled=True) < 1e-15
    lc.check_close("gap of 3I from I is 2", lc.identity_gap(3 * np.eye(4)), 2.0, 1e-12)
    assert lc.identity_gap(np.zeros((3, 3)), scaled=True) == float("inf")


def test_tied_state_curves_approach_the_identity():
    """What the chapter says of its measured curves (d = 16, n = 64, β = 1, λ = 0.01): DeltaNet's
    and the least-squares state's distance from I falls (below 0.15 and 0.02 after 64 tokens),
    linear attention's distance from its best multiple of I falls too, but stays above 0.3; the
    readout of the DeltaNet state at every token is the token itself."""
    c = lc.tied_state_curves()
    assert c["deltanet"][-1] < 0.15 and c["least squares"][-1] < 0.02
    assert c["deltanet"][-1] < c["deltanet"][15] < c["deltanet"][0]
    assert 0.3 < c["linear"][-1] < c["linear"][15] < c["linear"][0]
    r = lc.readout(lc.deltanet_states(c["X"], c["X"])[-1], c["X"])
    assert r["self"] == 1.0 and r["next"] == 0.0


# ------------------------------------------------------------------ predicting the neighbour
@pytest.mark.parametrize("n,d", [(1, 3), (7, 5), (30, 8)])
def test_neighbour_pairs_are_a_one_tap_shift_of_the_keys(n, d):
    """Test-time training on the pairs (k_{t−1}, v_t) (built with a loop, k_0 = 0: no write at the
    first token), by autodiff with η = β, = DeltaNet on short_conv(K, shift) (recurrent and
    parallel forms)."""
    rng = np.random.default_rng(n)
    Q, K, V = rng.normal(size=(n, d)), _unit(rng.normal(size=(n, d))), rng.normal(size=(n, 2))
    beta = rng.uniform(0.1, 1.5, size=n)
    K_prev = np.array([np.zeros(d) if t == 0 else K[t - 1] for t in range(n)])
    O_ttt = lc.ttt_recurrent(Q, K_prev, V, "squared", eta=beta)
    K_conv = lc.short_conv(K, lc.shift_weight(d))
    lc.check_close("TTT on neighbour pairs = DeltaNet(Q, conv(K), V)",
                   lc.deltanet_recurrent(Q, K_conv, V, beta), O_ttt, 1e-10)
    lc.check_close("... its parallel form", lc.deltanet_parallel(Q, K_conv, V, beta), O_ttt, 1e-10)


def test_neighbour_minimiser_is_the_transition_table():
    """Orthonormal tokens, K = J X, V = X: the least-squares state is Σ_t x_{t+1} x_tᵀ / (1 + λ),
    so reading it at x_j gives x_{j+1} / (1 + λ); DeltaNet (β = 1) holds Σ_t x_{t+1} x_tᵀ exactly,
    and its readout finds the successor of every token. With the tokens' own pairs (K = V) it is
    the projector on their span, which reads back every token, and I after d_k of them."""
    rng = np.random.default_rng(6)
    X = np.linalg.qr(rng.normal(size=(10, 10)))[0][:8]         # 8 orthonormal rows in R^10
    K = lc.short_conv(X, lc.shift_weight(10))
    table = sum(np.outer(X[t + 1], X[t]) for t in range(7))
    lc.check_close("least squares = table / (1 + λ)", lc.least_squares_state(K, X, 0.5), table / 1.5, 1e-9)
    S = lc.deltanet_states(K, X)[-1]
    lc.check_close("DeltaNet = the table", S, table, 1e-10)
    r = lc.readout(S, X)
    assert r["next"] == 1.0 and r["self"] == 0.0
    P = lc.tied_deltanet_state(X)
    lc.check_close("tied: the projector on the tokens' span", P, X.T @ X, 1e-10)
    assert lc.readout(P, X)["self"] == 1.0
    full = np.linalg.qr(rng.normal(size=(10, 10)))[0]
    lc.check_close("tied, d_k orthonormal keys: S = I", lc.tied_deltanet_state(full), np.eye(10), 1e-10)


def test_lag_weights_make_each_query_the_next_key():
    """q_t = k_{t+1} with q = conv(X, lag_weights(w − 1)), k = conv(X, lag_weights(w, shift=1)):
    exact (0/1 weights)."""
    rng = np.random.default_rng(7)
    X = rng.normal(size=(9, 12))
    for w in (2, 3, 4):
        K = lc.short_conv(X, lc.lag_weights(w, 12, shift=1))
        Q = lc.short_conv(X, lc.lag_weights(w - 1, 12))
        assert np.array_equal(Q[:-1], K[1:]), w
        assert not K[0].any()


def test_context_recall_claims():
    """What the chapter says (seeds 0-2, 12 phrases, 3 hubs, d = 64): a key that sees only the
    previous token answers exactly the hubs' latest occurrences; width 4 answers at least 0.4 more
    of the hubs than width 2 in every seed, and width 3 lies between."""
    for seed in range(3):
        r = {w: lc.context_recall(w, seed=seed) for w in (2, 3, 4)}
        assert r[2]["accuracy"] == r[2]["latest"], r
        assert r[4]["accuracy"] >= r[2]["accuracy"] + 0.4, r
        assert r[2]["accuracy"] < r[3]["accuracy"] <= r[4]["accuracy"] + 1e-12, r


def test_a_convolution_on_v_writes_the_predecessor():
    """Chapter 11's exercise 3: values shifted by one token, ``v_t = x_{t−1}``, write the pairs
    ``(x_t, x_{t−1})``; DeltaNet's state read at ``x_j`` returns ``x_{j−1}`` for most tokens (random
    unit tokens in 32 dimensions, 24 of them: the writes interfere a little) and never the next
    token, which is what an MQAR query needs."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(24, 32))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    S = lc.deltanet_states(X, lc.short_conv(X, lc.shift_weight(32)))[-1]
    r = lc.readout(S, X)
    j = np.arange(1, 23)
    assert np.mean(r["match"][1:] == j - 1) > 0.8
    assert r["next"] == 0.0
