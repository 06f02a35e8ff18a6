"""The delta rule family (chapters 5 and 6): forms agree, the inverse trick, gates, Comba, DeltaProduct."""
import numpy as np
import pytest
import scipy.linalg
import sympy as sp

import lattn_core as lc

# Tolerances: all forms are float64 on O(n) sums of O(1) terms with unit-norm keys (a contractive
# update), so their round-off is ~1e-14; 1e-10 leaves orders of magnitude of headroom and still
# catches any algebraic slip (which shows up at >= 1e-3).
TOL = 1e-10


def make(n, d_k=5, d_v=3, seed=0, harsh=False):
    rng = np.random.default_rng(seed)
    Q = rng.normal(size=(n, d_k))
    K = rng.normal(size=(n, d_k))
    K /= np.linalg.norm(K, axis=1, keepdims=True)      # L2-normalised keys: the stable regime
    V = rng.normal(size=(n, d_v))
    beta = rng.uniform(0.05, 2.0, size=n)               # includes (1, 2]: negative eigenvalues
    low = 1e-3 if harsh else 0.5
    alpha = np.exp(rng.uniform(np.log(low), 0.0, size=n))
    return Q, K, V, alpha, beta


def brute_gdn(Q, K, V, alpha, beta):
    """The definition with explicit matrices I - beta k k^T (independent of lattn_core's loop)."""
    n, d_k = K.shape
    S = np.zeros((V.shape[1], d_k))
    out = []
    for t in range(n):
        k = K[t][:, None]
        S = alpha[t] * S @ (np.eye(d_k) - beta[t] * k @ k.T) + beta[t] * V[t][:, None] @ k.T
        out.append(S @ Q[t])
    return np.array(out)


# ------------------------------------------------------------------------------------------
# three forms agree
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,chunk", [(1, 1), (1, 4), (2, 1), (13, 4), (40, 7), (64, 16), (65, 64), (30, 100)])
def test_deltanet_forms_agree(n, chunk):
    Q, K, V, _, beta = make(n, seed=n)
    ref = brute_gdn(Q, K, V, np.ones(n), beta)
    lc.check_close("recurrent = definition", lc.deltanet_recurrent(Q, K, V, beta), ref, TOL)
    lc.check_close("parallel = definition", lc.deltanet_parallel(Q, K, V, beta), ref, TOL)
    lc.check_close("chunkwise = definition", lc.deltanet_chunkwise(Q, K, V, beta, chunk_size=chunk), ref, TOL)


def test_deltanet_default_beta_is_one():
    Q, K, V, _, _ = make(11)
    ones = np.ones(11)
    for f in (lc.deltanet_recurrent, lc.deltanet_parallel, lc.deltanet_chunkwise):
        lc.check_close(f.__name__, f(Q, K, V), brute_gdn(Q, K, V, ones, ones), TOL)


@pytest.mark.parametrize("n,chunk", [(1, 1), (1, 8), (17, 5), (50, 8), (64, 32), (33, 1)])
@pytest.mark.parametrize("harsh", [False, True])
def test_gated_deltanet_forms_agree(n, chunk, harsh):
    Q, K, V, alpha, beta = make(n, d_k=6, d_v=4, seed=100 + n, harsh=harsh)
    ref = brute_gdn(Q, K, V, alpha, beta)
    lc.check_close("recurrent", lc.gated_deltanet_recurrent(Q, K, V, alpha, beta), ref, TOL)
    lc.check_close("parallel", lc.gated_deltanet_parallel(Q, K, V, alpha, beta), ref, TOL)
    lc.check_close("chunkwise", lc.gated_deltanet_chunkwise(Q, K, V, alpha, beta, chunk_size=chunk), ref, TOL)


def test_gated_deltanet_stays_finite_for_tiny_gates_over_long_sequences():
    # sum log alpha reaches about -2e4 here: any cumulative product would underflow (and 1/product
    # overflow) in float64, the log-difference forms must not.
    n = 3000
    Q, K, V, _, beta = make(n, seed=7)
    alpha = np.full(n, 1e-3)
    rec = lc.gated_deltanet_recurrent(Q, K, V, alpha, beta)
    par = lc.gated_deltanet_parallel(Q, K, V, alpha, beta)
    chk = lc.gated_deltanet_chunkwise(Q, K, V, alpha, beta, chunk_size=64)
    assert np.all(np.isfinite(par)) and np.all(np.isfinite(chk))
    lc.check_close("parallel, alpha=1e-3, n=3000", par, rec, TOL)
    lc.check_close("chunkwise, alpha=1e-3, n=3000", chk, rec, TOL)


def test_gated_deltanet_with_alpha_one_is_deltanet():
    Q, K, V, _, beta = make(20)
    lc.check_close("GDN(alpha=1) = DeltaNet", lc.gated_deltanet_recurrent(Q, K, V, np.ones(20), beta),
                   lc.deltanet_recurrent(Q, K, V, beta), TOL)


def test_deltanet_overwrites_a_repeated_key():
    # beta = 1, unit key: after writing (k, v1) then (k, v2), reading k returns exactly v2.
    k = np.array([[0.6, 0.8, 0.0]])
    K = np.vstack([k, k])
    V = np.array([[5.0], [10.0]])
    O = lc.deltanet_recurrent(K, K, V)
    lc.check_close("read after overwrite", O[-1], [10.0], 1e-12)


# ------------------------------------------------------------------------------------------
# the inverse trick
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,d", [(1, 1), (5, 3), (60, 4)])
def test_forward_substitution_matches_solve_triangular_and_inverse(n, d):
    rng = np.random.default_rng(n)
    A = np.tril(rng.normal(size=(n, n)) * 0.3, k=-1)
    B = rng.normal(size=(n, d))
    X = lc.forward_substitution(A, B)
    ref = scipy.linalg.solve_triangular(np.eye(n) + A, B, lower=True, unit_diagonal=True)
    # (I + A) has unit diagonal; its condition grows with n but stays < 1e6 here, so float64
    # solves agree to ~1e-10 relative.
    lc.check_close("forward substitution = solve_triangular", X, ref, 1e-9, relative=True)
    lc.check_close("forward substitution = inverse", X, np.linalg.inv(np.eye(n) + A) @ B, 1e-9, relative=True)
    lc.check_close("residual (I+A)X - B", (np.eye(n) + A) @ X, B, 1e-9, relative=True)
    lc.check_close("vector right-hand side", lc.forward_substitution(A, B[:, 0]), ref[:, 0], 1e-9, relative=True)


def test_forward_substitution_rejects_non_strictly_lower():
    with pytest.raises(ValueError, match="strictly lower"):
        lc.forward_substitution(np.eye(3), np.ones((3, 1)))
    with pytest.raises(ValueError, match="A must"):
        lc.forward_substitution(np.zeros((3, 2)), np.ones((3, 1)))
    with pytest.raises(ValueError, match="B must"):
        lc.forward_substitution(np.zeros((3, 3)), np.ones((4, 1)))
    with pytest.raises(ValueError, match="B must be real"):
        lc.forward_substitution(np.zeros((3, 3)), np.ones(3) * 1j)


def test_pseudo_values_solve_the_unrolled_recurrence():
    # u_t = beta_t (v_t - S_{t-1} k_t) from the loop equals (I + A)^{-1} Diag(beta) V.
    n = 9
    Q, K, V, _, beta = make(n)
    S = np.zeros((V.shape[1], K.shape[1]))
    U_loop = []
    for t in range(n):
        u = beta[t] * (V[t] - S @ K[t])
        U_loop.append(u)
        S = S + np.outer(u, K[t])
    A = np.tril(beta[:, None] * (K @ K.T), k=-1)
    lc.check_close("U = (I+A)^-1 Diag(beta) V", lc.forward_substitution(A, beta[:, None] * V), np.array(U_loop), TOL)


def test_symbolic_inverse_identities():
    # I - (I+A)^{-1} A = (I+A)^{-1}, for a symbolic strictly lower-triangular 3x3 A.
    a = sp.symbols("a21 a31 a32")
    A = sp.Matrix([[0, 0, 0], [a[0], 0, 0], [a[1], a[2], 0]])
    I3 = sp.eye(3)
    inv = (I3 + A).inv()
    lc.check_symbolic("I - (I+A)^-1 A = (I+A)^-1", I3 - inv * A, inv)
    # Neumann series terminates: (I+A)^-1 = I - A + A^2 for nilpotent A (A^3 = 0)
    lc.check_symbolic("(I+A)^-1 = I - A + A^2", inv, I3 - A + A * A)


def test_symbolic_block_triangular_inverse():
    # [[P, 0], [C, D]]^{-1} = [[P^-1, 0], [-D^-1 C P^-1, D^-1]] with 2x2 lower-triangular blocks
    p = sp.symbols("p11 p21 p22", nonzero=True)
    dd = sp.symbols("d11 d21 d22", nonzero=True)
    c = sp.symbols("c11 c12 c21 c22")
    P = sp.Matrix([[p[0], 0], [p[1], p[2]]])
    D = sp.Matrix([[dd[0], 0], [dd[1], dd[2]]])
    C = sp.Matrix([[c[0], c[1]], [c[2], c[3]]])
    Z = sp.zeros(2, 2)
    big = sp.Matrix(sp.BlockMatrix([[P, Z], [C, D]]))
    rhs = sp.Matrix(sp.BlockMatrix([[P.inv(), Z], [-D.inv() * C * P.inv(), D.inv()]]))
    lc.check_symbolic("block lower-triangular inverse", big.inv(), rhs)


def test_numeric_block_triangular_inverse():
    rng = np.random.default_rng(3)
    n, m = 6, 4
    P = np.eye(n) + np.tril(rng.normal(size=(n, n)) * 0.3, -1)
    D = np.eye(m) + np.tril(rng.normal(size=(m, m)) * 0.3, -1)
    C = rng.normal(size=(m, n))
    big = np.block([[P, np.zeros((n, m))], [C, D]])
    Pi, Di = np.linalg.inv(P), np.linalg.inv(D)
    rhs = np.block([[Pi, np.zeros((n, m))], [-Di @ C @ Pi, Di]])
    # well-conditioned unit-triangular blocks: float64 inverses agree to ~1e-14
    lc.check_close("block inverse", np.linalg.inv(big), rhs, 1e-12)


# ------------------------------------------------------------------------------------------
# Gated DeltaNet through the cumulative gate
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 5, 30])
def test_cumulative_alpha_rewriting_is_exact_on_short_sequences(n):
    Q, K, V, alpha, beta = make(n, seed=50 + n)
    ref = lc.gated_deltanet_recurrent(Q, K, V, alpha, beta)
    # alpha in [0.5, 1]: abar_30 >= 1e-9, 1/abar <= 1e9, so the rescaled float64 run keeps ~1e-7 relative
    # accuracy at worst; on these sizes it is far better. Relative to the output's scale:
    lc.check_close("GDN = DeltaNet(abar q, k, v/abar)", lc.gated_deltanet_via_cumulative_alpha(Q, K, V, alpha, beta),
                   ref, 1e-8, relative=True)
    # and by hand: the rewriting is literally DeltaNet on rescaled inputs
    abar = np.cumprod(alpha)
    lc.check_close("by hand", lc.deltanet_recurrent(Q * abar[:, None], K, V / abar[:, None], beta), ref, 1e-8,
                   relative=True)


def test_cumulative_alpha_breakdown_is_measured():
    alpha = 0.9
    lengths = [10, 200, 600, 1000, 2000]
    res = lc.cumulative_alpha_breakdown(lengths, alpha)
    e32, e64 = res["error"]["float32"], res["error"]["float64"]
    ov32 = res["overflow_length"]["float32"]
    # the predicted float32 overflow length: log(max float32) / -log(0.9) ~ 842
    assert abs(ov32 - np.log(np.finfo(np.float32).max) / -np.log(alpha)) < 1e-9
    # abar = 0.9^n drops below float32's smallest normal (1.2e-38) at n ~ 834, just before 1/abar overflows
    assert abs(0.9 ** res["underflow_length"]["float32"] - np.finfo(np.float32).tiny) < 1e-40
    assert res["underflow_length"]["float32"] < ov32 < res["underflow_length"]["float64"]
    for n, e in zip(lengths, e32):
        if n < ov32 * 0.95:
            assert e < 1e-5, (n, e)          # float32 round-off (~1e-7) while 1/abar fits
        elif n > ov32 * 1.05:
            assert not np.isfinite(e), (n, e)  # 1/abar = inf: the rewritten run returns NaN/inf
    # float64 has 8x more exponent range: still exact at n = 2000 (overflow near 6700)
    assert res["overflow_length"]["float64"] > 2000
    assert np.all(e64 < 1e-10)
    # and it does break in float64 too, once the length passes its own limit
    n = 7000
    Q, K, V, _, _ = make(n, seed=1)
    bad = lc.gated_deltanet_via_cumulative_alpha(Q, K, V, np.full(n, alpha))
    assert not np.all(np.isfinite(bad))
    assert np.all(np.isfinite(lc.gated_deltanet_chunkwise(Q, K, V, np.full(n, alpha), chunk_size=64)))


# ------------------------------------------------------------------------------------------
# Comba <-> Gated DeltaNet
# ------------------------------------------------------------------------------------------
def test_comba_definition():
    n = 12
    Q, K, V, gamma, eta = make(n, seed=4)
    S = np.zeros((V.shape[1], K.shape[1]))
    out = []
    for t in range(n):
        S = gamma[t] * S + eta[t] * np.outer(V[t] - S @ K[t], K[t])
        out.append(S @ Q[t])
    lc.check_close("comba_recurrent = definition", lc.comba_recurrent(Q, K, V, gamma, eta), np.array(out), TOL)


@pytest.mark.parametrize("n,chunk", [(1, 4), (19, 8), (40, 16)])
def test_comba_three_forms_agree(n, chunk):
    """Comba's parallel and chunkwise forms (Gated DeltaNet's, after the change of variables) equal
    its recurrence, n = 1 and n not divisible by the chunk, with eta/gamma above 2 on some tokens (the
    key rescaling): float64 round-off on O(1) outputs, 1e-9."""
    rng = np.random.default_rng(n)
    Q, K, V, _, _ = make(n, seed=n)
    gamma = rng.uniform(0.1, 1.0, size=n)
    eta = rng.uniform(0.05, 1.0, size=n)
    eta[::3] = 3.0 * gamma[::3]
    ref = lc.comba_recurrent(Q, K, V, gamma, eta)
    lc.check_close("comba_parallel = comba_recurrent", lc.comba_parallel(Q, K, V, gamma, eta), ref, 1e-9)
    lc.check_close("comba_chunkwise = comba_recurrent", lc.comba_chunkwise(Q, K, V, gamma, eta, chunk_size=chunk),
                   ref, 1e-9)
    with pytest.raises(ValueError, match="eta"):
        lc.comba_parallel(Q, K, V, gamma, -eta)
    with pytest.raises(ValueError, match="Q"):
        lc.comba_chunkwise(Q[:, :-1], K, V, gamma, eta)


@pytest.mark.parametrize("n,m,chunk,gated", [(1, 2, 4, True), (13, 3, 8, True), (20, 1, 16, False), (9, 2, 64, True)])
def test_deltaproduct_three_forms_agree(n, m, chunk, gated):
    """DeltaProduct's parallel and chunkwise forms (Gated DeltaNet over the n·m micro-steps, read at
    each token's last) equal its recurrence: m = 1 (DeltaNet), chunks that split a token's factors,
    beta up to 2; 1e-9."""
    rng = np.random.default_rng(100 + n)
    Q = rng.normal(size=(n, 6))
    K = rng.normal(size=(n, m, 6))
    K /= np.linalg.norm(K, axis=-1, keepdims=True)
    V = rng.normal(size=(n, m, 4))
    beta = rng.uniform(0.1, 2.0, size=(n, m))
    alpha = rng.uniform(0.3, 1.0, size=n) if gated else None
    ref = lc.deltaproduct_recurrent(Q, K, V, beta, alpha)
    lc.check_close("deltaproduct_parallel = recurrent", lc.deltaproduct_parallel(Q, K, V, beta, alpha), ref, 1e-9)
    lc.check_close("deltaproduct_chunkwise = recurrent",
                   lc.deltaproduct_chunkwise(Q, K, V, beta, alpha, chunk_size=chunk), ref, 1e-9)
    with pytest.raises(ValueError, match="beta"):
        lc.deltaproduct_parallel(Q, K, V, beta * 3.0, alpha)
    with pytest.raises(ValueError, match="Q must have shape"):
        lc.deltaproduct_chunkwise(Q[:, :-1], K, V, beta, alpha)


@pytest.mark.parametrize("harsh", [False, True])
def test_gated_deltanet_equals_comba(harsh):
    # GDN(alpha, beta, v) = Comba(gamma = alpha, eta = alpha beta, v / alpha)
    n = 40
    Q, K, V, alpha, beta = make(n, seed=8, harsh=harsh)
    Kc, Vc, gamma, eta = lc.gated_deltanet_to_comba(K, V, alpha, beta)
    assert np.array_equal(gamma, alpha)
    lc.check_close("eta = alpha beta", eta, alpha * beta, 1e-15)
    # dividing v by alpha >= 1e-3 and multiplying back: relative round-off ~1e-13
    lc.check_close("GDN = Comba", lc.comba_recurrent(Q, Kc, Vc, gamma, eta),
                   lc.gated_deltanet_recurrent(Q, K, V, alpha, beta), 1e-9, relative=True)


def test_comba_equals_gated_deltanet_including_key_rescaling():
    # Comba with eta/gamma > 2 needs the key rescaled to keep GDN's beta in (0, 2].
    n = 30
    rng = np.random.default_rng(9)
    Q, K, V, _, _ = make(n, seed=9)
    gamma = rng.uniform(0.2, 1.0, size=n)
    eta = rng.uniform(0.05, 1.0, size=n)
    eta[::3] = 3.0 * gamma[::3]                     # eta/gamma = 3 > 2 on every third token
    K2, V2, alpha, beta = lc.comba_to_gated_deltanet(K, V, gamma, eta)
    assert np.all(beta <= 2.0) and np.any(np.abs(np.linalg.norm(K2, axis=1) - 1) > 1e-3)
    lc.check_close("Comba = GDN", lc.gated_deltanet_recurrent(Q, K2, V2, alpha, beta),
                   lc.comba_recurrent(Q, K, V, gamma, eta), 1e-9, relative=True)


def test_comba_symbolic_equivalence():
    # alpha S (I - beta k k^T) + beta v k^T = alpha S + alpha beta (v/alpha - S k) k^T on a 2x2 state
    s = sp.Matrix(2, 2, sp.symbols("s11 s12 s21 s22"))
    k = sp.Matrix(sp.symbols("k1 k2"))
    v = sp.Matrix(sp.symbols("v1 v2"))
    al, be = sp.symbols("alpha beta", positive=True)
    gdn = al * s * (sp.eye(2) - be * k * k.T) + be * v * k.T
    comba = al * s + al * be * (v / al - s * k) * k.T
    lc.check_symbolic("GDN = Comba(gamma=alpha, eta=alpha beta, v/alpha)", gdn, comba)


# ------------------------------------------------------------------------------------------
# DeltaProduct
# ------------------------------------------------------------------------------------------
def test_deltaproduct_m1_is_deltanet_and_gated():
    n = 15
    Q, K, V, alpha, beta = make(n, seed=11)
    lc.check_close("DeltaProduct m=1 = DeltaNet", lc.deltaproduct_recurrent(Q, K[:, None], V[:, None], beta[:, None]),
                   lc.deltanet_recurrent(Q, K, V, beta), TOL)
    lc.check_close("Gated DeltaProduct m=1 = GDN",
                   lc.deltaproduct_recurrent(Q, K[:, None], V[:, None], beta[:, None], alpha=alpha),
                   lc.gated_deltanet_recurrent(Q, K, V, alpha, beta), TOL)


def test_deltaproduct_m_steps_is_deltanet_on_the_interleaved_sequence():
    # m steps per token = DeltaNet over n*m tokens, read every m-th output (with q_t at the last step)
    n, m, d_k, d_v = 8, 3, 4, 2
    rng = np.random.default_rng(12)
    Q = rng.normal(size=(n, d_k))
    K = rng.normal(size=(n, m, d_k))
    K /= np.linalg.norm(K, axis=2, keepdims=True)
    V = rng.normal(size=(n, m, d_v))
    beta = rng.uniform(0.1, 2.0, size=(n, m))
    Qlong = np.zeros((n * m, d_k))
    Qlong[m - 1::m] = Q
    long = lc.deltanet_recurrent(Qlong, K.reshape(n * m, d_k), V.reshape(n * m, d_v), beta.reshape(-1))
    lc.check_close("DeltaProduct = interleaved DeltaNet", lc.deltaproduct_recurrent(Q, K, V, beta), long[m - 1::m], TOL)


# ------------------------------------------------------------------------------------------
# bad inputs
# ------------------------------------------------------------------------------------------
def test_bad_inputs_raise_value_error():
    Q, K, V, alpha, beta = make(6)
    fns3 = [lc.deltanet_recurrent, lc.deltanet_parallel, lc.deltanet_chunkwise]
    fns_g = [lc.gated_deltanet_recurrent, lc.gated_deltanet_parallel, lc.gated_deltanet_chunkwise,
             lc.gated_deltanet_via_cumulative_alpha]
    for f in fns3:
        with pytest.raises(ValueError, match="K must"):
            f(Q, K[0], V)
        with pytest.raises(ValueError, match="Q must"):
            f(Q[:, :3], K, V)
        with pytest.raises(ValueError, match="V must"):
            f(Q, K, V[:5])
        with pytest.raises(ValueError, match="beta must lie in"):
            f(Q, K, V, np.full(6, 2.5))
        with pytest.raises(ValueError, match="beta must lie in"):
            f(Q, K, V, np.zeros(6))
        with pytest.raises(ValueError, match="beta must"):
            f(Q, K, V, np.ones(5))
        with pytest.raises(ValueError, match="NaN"):
            f(Q, K, np.where(V > 0, np.nan, V))
        with pytest.raises(ValueError, match="inf"):
            f(np.full_like(Q, np.inf), K, V)
    for f in fns_g:
        with pytest.raises(ValueError, match="alpha must lie in"):
            f(Q, K, V, np.full(6, 1.5), beta)
        with pytest.raises(ValueError, match="alpha must lie in"):
            f(Q, K, V, np.zeros(6), beta)
        with pytest.raises(ValueError, match="alpha must"):
            f(Q, K, V, alpha[:, None], beta)
    for f, extra in ((lc.deltanet_chunkwise, ()), (lc.gated_deltanet_chunkwise, (alpha,))):
        for bad in (0, -3, 2.5, True):
            with pytest.raises(ValueError, match="chunk_size"):
                f(Q, K, V, *extra, chunk_size=bad)
    with pytest.raises(ValueError, match="gamma must lie in"):
        lc.comba_recurrent(Q, K, V, np.full(6, 1.1), beta)
    with pytest.raises(ValueError, match="eta must lie in"):
        lc.comba_recurrent(Q, K, V, alpha, -beta)
    # DeltaProduct shapes
    with pytest.raises(ValueError, match="K must"):
        lc.deltaproduct_recurrent(Q, K, V[:, None], beta[:, None])
    with pytest.raises(ValueError, match="V must"):
        lc.deltaproduct_recurrent(Q, K[:, None], V, beta[:, None])
    with pytest.raises(ValueError, match="V must"):
        lc.deltaproduct_recurrent(Q, np.stack([K, K], 1), V[:, None], beta[:, None])
    with pytest.raises(ValueError, match="beta must"):
        lc.deltaproduct_recurrent(Q, K[:, None], V[:, None], beta)
    with pytest.raises(ValueError, match="beta must lie in"):
        lc.deltaproduct_recurrent(Q, K[:, None], V[:, None], 3 * beta[:, None])
    with pytest.raises(ValueError, match="dtype"):
        lc.gated_deltanet_via_cumulative_alpha(Q, K, V, alpha, dtype=np.float16)
    with pytest.raises(ValueError, match="lengths"):
        lc.cumulative_alpha_breakdown([], 0.9)


# ------------------------------------------------------------------------------------------
# the PyTorch ops of `kernels` against these references (fla's state is our S^T)
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("T", [1, 37, 70])
def test_kernels_delta_rule_torch_backend_matches_reference(T):
    torch = pytest.importorskip("torch")
    import kernels
    H, dk, dv = 2, 8, 4
    rng = np.random.default_rng(T)
    Q = rng.normal(size=(T, H, dk))
    K = rng.normal(size=(T, H, dk))
    K /= np.linalg.norm(K, axis=-1, keepdims=True)
    V = rng.normal(size=(T, H, dv))
    beta = rng.uniform(0.1, 2.0, size=(T, H))
    alpha = np.exp(rng.uniform(np.log(1e-3), 0.0, size=(T, H)))
    t = lambda x: torch.tensor(x[None], dtype=torch.float32)
    o, S = kernels.chunk_delta_rule(t(Q), t(K), t(V), t(beta), scale=1.0, output_final_state=True, backend="torch")
    og, Sg = kernels.chunk_gated_delta_rule(t(Q), t(K), t(V), t(np.log(alpha)), t(beta), scale=1.0,
                                            output_final_state=True, backend="torch")
    for h in range(H):
        # float32 accumulation on O(T) sums of O(1) terms: ~1e-6; 1e-4 is a loose float32 bound
        ref = lc.deltanet_recurrent(Q[:, h], K[:, h], V[:, h], beta[:, h])
        lc.check_close(f"chunk_delta_rule head {h}", o[0, :, h].double().numpy(), ref, 1e-4)
        refg = lc.gated_deltanet_recurrent(Q[:, h], K[:, h], V[:, h], alpha[:, h], beta[:, h])
        lc.check_close(f"chunk_gated_delta_rule head {h}", og[0, :, h].double().numpy(), refg, 1e-4)
    # final state: fla's [K, V] state is S^T (our S_T recovered column by column below)
    h = 0
    S_ref = _final_state(lc.deltanet_recurrent, Q[:, h], K[:, h], V[:, h], beta[:, h])
    lc.check_close("final state = S^T", S[0, h].double().numpy(), S_ref.T, 1e-4)
    S_refg = _final_state(lambda q, k, v, b: lc.gated_deltanet_recurrent(q, k, v, alpha[:, h], b),
                          Q[:, h], K[:, h], V[:, h], beta[:, h])
    lc.check_close("gated final state = S^T", Sg[0, h].double().numpy(), S_refg.T, 1e-4)


def _final_state(fn, Q, K, V, beta):
    """S_T, column by column: run with q_T = e_i; o_T = S_T e_i is column i (the state does not depend on Q)."""
    d_k = K.shape[1]
    cols = []
    for i in range(d_k):
        Qi = Q.copy()
        Qi[-1] = np.eye(d_k)[i]
        cols.append(fn(Qi, K, V, beta)[-1])
    return np.array(cols).T


# ------------------------------------------------------------------------------------------
# the overwriting experiment (chapter 5)
# ------------------------------------------------------------------------------------------
def test_overwrite_experiment():
    r0 = lc.overwrite_experiment(0, trials=3)
    # no interference: linear attention reads 5 + 10 (both writes add up), DeltaNet reads 10
    lc.check_close("linear attention blends (sums)", r0["linear"], np.full(3, 15.0), 1e-12)
    lc.check_close("DeltaNet replaces", r0["delta"], np.full(3, 10.0), 1e-12)
    # interference between the two writes: DeltaNet (beta = 1, unit key) still reads exactly 10
    rb = lc.overwrite_experiment(20, where="between", trials=5)
    lc.check_close("DeltaNet replaces despite 20 writes in between", rb["delta"], np.full(5, 10.0), 1e-12)
    assert np.all(np.abs(rb["linear"] - 10.0) > 1.0)         # linear attention keeps the stale 5 in
    # beta = 1/2 on every write: the first write stores 2.5, the second moves half-way to 10: 6.25
    rh = lc.overwrite_experiment(0, beta=0.5, trials=2)
    lc.check_close("beta = 1/2 halves each correction", rh["delta"], np.full(2, 6.25), 1e-12)
    ra = lc.overwrite_experiment(6, where="after", trials=1, seed=3)
    assert np.isfinite(ra["delta"]).all() and ra["delta"].shape == (1,)
    with pytest.raises(ValueError, match="where"):
        lc.overwrite_experiment(3, where="before")
    with pytest.raises(ValueError, match="n_interfering"):
        lc.overwrite_experiment(-1)
    with pytest.raises(ValueError, match="beta must lie in"):
        lc.overwrite_experiment(2, beta=3.0)
    # sizes and scales are checked before NumPy sees them (they used to fail inside NumPy)
    for kw, match in ((dict(d_k=0), "d_k must be an integer >= 1"), (dict(d_k=-3), "d_k must be an integer >= 1"),
                      (dict(trials=0), "trials must be an integer >= 1"),
                      (dict(trials=2.5), "trials must be an integer >= 1"),
                      (dict(value_scale=np.nan), "value_scale contains NaN"),
                      (dict(value_scale=1j), "value_scale must be real")):
        with pytest.raises(ValueError, match=match):
            lc.overwrite_experiment(2, **kw)
