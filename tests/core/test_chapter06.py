"""Identities stated in Chapter 6 (the inverse trick) that tests/core/test_delta_rule.py does not already cover."""
import numpy as np
import pytest
import sympy as sp

import lattn_core as lc

# float64 on small, well-conditioned problems with unit-norm keys: round-off is ~1e-14; 1e-10 leaves
# orders of magnitude of headroom and still catches an algebraic slip (which shows up at >= 1e-3).
TOL = 1e-10


def unit_rows(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def make(n, d_k=6, d_v=3, seed=0):
    rng = np.random.default_rng(seed)
    Q, K, V = rng.normal(size=(n, d_k)), unit_rows(rng.normal(size=(n, d_k))), rng.normal(size=(n, d_v))
    beta = rng.uniform(0.05, 2.0, size=n)
    alpha = np.exp(rng.uniform(np.log(0.2), 0.0, size=n))
    return Q, K, V, alpha, beta


# ---------------------------------------------------------------- (ch6-wy): the WY representation
@pytest.mark.parametrize("C,d,seed", [(1, 3, 0), (2, 2, 1), (16, 8, 2), (40, 5, 3)])
def test_wy_representation_of_a_product_of_householder_factors(C, d, seed):
    rng = np.random.default_rng(seed)
    K = unit_rows(rng.normal(size=(C, d)))
    beta = rng.uniform(0.05, 2.0, size=C)
    prod = np.eye(d)                                      # the definition: left-to-right product
    for t in range(C):
        prod = prod @ (np.eye(d) - beta[t] * np.outer(K[t], K[t]))
    W = lc.forward_substitution(np.tril(beta[:, None] * (K @ K.T), k=-1), beta[:, None] * K)
    lc.check_close("prod (I - b k k^T) = I - W^T K", prod, np.eye(d) - W.T @ K, TOL)


def test_wy_representation_symbolic_two_tokens():
    k1, k2 = sp.Matrix(sp.symbols("k11 k12")), sp.Matrix(sp.symbols("k21 k22"))
    b1, b2 = sp.symbols("beta1 beta2")
    I2 = sp.eye(2)
    K = sp.Matrix.vstack(k1.T, k2.T)
    A = sp.Matrix([[0, 0], [b2 * (k2.T * k1)[0], 0]])
    W = (I2 + A).inv() * sp.diag(b1, b2) * K
    lc.check_symbolic("WY, two tokens", (I2 - b1 * k1 * k1.T) * (I2 - b2 * k2 * k2.T), I2 - W.T * K)


# ---------------------------------------------------------------- structure of (I+B)^{-1}
@pytest.mark.parametrize("n,C", [(32, 8), (30, 7), (20, 20)])
def test_inverse_is_unit_lower_triangular_with_inverted_diagonal_blocks(n, C):
    _, K, _, _, beta = make(n, d_k=4, seed=n)
    A = np.tril(beta[:, None] * (K @ K.T), k=-1)
    T = lc.forward_substitution(A, np.eye(n))
    lc.check_close("(I+B)^-1 is unit lower triangular", np.triu(T), np.eye(n), 1e-12)
    lc.check_close("and really the inverse", T @ (np.eye(n) + A), np.eye(n), 1e-9)
    for s in range(0, n, C):
        e = min(s + C, n)
        blk = lc.forward_substitution(A[s:e, s:e], np.eye(e - s))
        lc.check_close(f"diagonal block [{s}:{e}]", T[s:e, s:e], blk, 1e-12)
    if C < n:   # the off-diagonal blocks are not zero: chunks must pass on the state
        assert np.abs(T[C:, :C]).max() > 1e-3


def test_forward_substitution_is_the_inverse_symbolically():
    a21, a31, a32, b1, b2, b3 = sp.symbols("a21 a31 a32 b1 b2 b3")
    A = sp.Matrix([[0, 0, 0], [a21, 0, 0], [a31, a32, 0]])
    x1 = b1                                   # the algorithm, written out row by row
    x2 = b2 - a21 * x1
    x3 = b3 - a31 * x1 - a32 * x2
    lc.check_symbolic("forward substitution = (I+A)^-1 b", sp.Matrix([x1, x2, x3]),
                      (sp.eye(3) + A).inv() * sp.Matrix([b1, b2, b3]))


@pytest.mark.parametrize("n", [1, 6, 12])
def test_neumann_series_is_exact_for_strictly_lower_triangular(n):
    A = np.tril(np.random.default_rng(n).normal(size=(n, n)) * 0.5, k=-1)
    lc.check_close("A^n = 0", np.linalg.matrix_power(A, n), np.zeros((n, n)), 1e-12)
    neumann = sum(np.linalg.matrix_power(-A, j) for j in range(n))
    lc.check_close("sum_{j<n} (-A)^j = (I+A)^-1", neumann, lc.forward_substitution(A, np.eye(n)), 1e-9,
                   relative=True)


# ---------------------------------------------------------------- chunk-size extremes
@pytest.mark.parametrize("gated", [False, True])
def test_chunk_size_one_is_the_recurrence_and_chunk_n_is_the_parallel_form(gated):
    n = 23
    Q, K, V, alpha, beta = make(n, seed=7)
    if gated:
        rec, par = lc.gated_deltanet_recurrent(Q, K, V, alpha, beta), lc.gated_deltanet_parallel(Q, K, V, alpha, beta)
        chunk = lambda C: lc.gated_deltanet_chunkwise(Q, K, V, alpha, beta, chunk_size=C)
    else:
        rec, par = lc.deltanet_recurrent(Q, K, V, beta), lc.deltanet_parallel(Q, K, V, beta)
        chunk = lambda C: lc.deltanet_chunkwise(Q, K, V, beta, chunk_size=C)
    lc.check_close("C = 1 is the recurrence", chunk(1), rec, TOL)
    lc.check_close("C = n is the parallel form", chunk(n), par, TOL)


# ---------------------------------------------------------------- (ch6-comba) as SGD on a regularised loss
def _sgd_step(weight, S, k, v, eta):
    loss = ((S * k - v).T * (S * k - v))[0] / 2 + weight * sum(s ** 2 for s in S)
    return S - eta * S.applyfunc(lambda s: sp.diff(loss, s))


def test_comba_is_sgd_on_the_regularised_squared_loss():
    S = sp.Matrix(2, 2, sp.symbols("s11 s12 s21 s22"))
    k, v = sp.Matrix(sp.symbols("k1 k2")), sp.Matrix(sp.symbols("v1 v2"))
    gamma, eta = sp.symbols("gamma eta", positive=True)
    comba = gamma * S + eta * (v - S * k) * k.T
    lc.check_symbolic("SGD on 1/2||Sk-v||^2 + (1-g)/(2 eta)||S||^2 = Comba",
                      _sgd_step((1 - gamma) / (2 * eta), S, k, v, eta), comba)
    # the weight (1-g)/eta (without the 1/2) scales the state by 2g - 1 instead of g
    lc.check_symbolic("weight (1-g)/eta gives 2g-1", _sgd_step((1 - gamma) / eta, S, k, v, eta),
                      comba.subs(gamma, 2 * gamma - 1))
    res = lc.check_symbolic("and not g", _sgd_step((1 - gamma) / eta, S, k, v, eta), comba, raise_on_fail=False)
    assert not res.passed


# ---------------------------------------------------------------- DeltaProduct: reflections compose to rotations
def test_householder_steps_reflect_and_two_of_them_rotate():
    rng = np.random.default_rng(4)
    d = 5
    k1, k2 = unit_rows(rng.normal(size=(2, d)))
    for b in (0.3, 1.0, 2.0):
        lc.check_close(f"det(I - {b} k k^T) = 1 - beta", np.linalg.det(np.eye(d) - b * np.outer(k1, k1)), 1 - b, 1e-12)
    H1, H2 = (np.eye(d) - 2 * np.outer(k, k) for k in (k1, k2))
    R = H1 @ H2
    lc.check_close("R R^T = I", R @ R.T, np.eye(d), 1e-12)
    lc.check_close("det R = 1", np.linalg.det(R), 1.0, 1e-12)
    assert np.abs(R - R.T).max() > 1e-3          # not symmetric, unlike any single step I - b k k^T
    # and DeltaProduct with these two steps applies exactly this transition to the state:
    # token 1 writes S0 = e_1^T (two identical steps with beta = 1), token 2 applies H1 then H2 (v = 0)
    e1, q = np.eye(d)[0], rng.normal(size=d)
    Qs = np.vstack([np.zeros(d), q])
    Ks = np.stack([np.stack([e1, e1]), np.stack([k1, k2])])
    Vs = np.concatenate([np.ones((1, 2, 1)), np.zeros((1, 2, 1))], axis=0)
    bs = np.array([[1.0, 1.0], [2.0, 2.0]])
    out = lc.deltaproduct_recurrent(Qs, Ks, Vs, bs)
    lc.check_close("DeltaProduct applies H1 H2 to the state", out[-1, 0], e1 @ R @ q, TOL)


# ---------------------------------------------------------------- exercise 3: where the cumulative gate breaks
def test_cumulative_gate_breaks_where_predicted_for_alpha_099():
    n_star = np.log(np.finfo(np.float32).max) / -np.log(0.99)
    res = lc.cumulative_alpha_breakdown([int(0.9 * n_star), int(1.1 * n_star)], 0.99, dtypes=("float32",))
    below, above = res["error"]["float32"]
    assert below < 1e-4                 # float32 round-off while 1/abar is representable
    assert not np.isfinite(above)       # gone once it is not


# --- the kernels' algebra (chapter 6, "How the chunkwise delta-rule kernel works") ---------------
import torch  # noqa: E402


def _gated_chunk(seed, C=64, d_k=16, d_v=8):
    r = np.random.default_rng(seed)
    K = r.normal(size=(C, d_k))
    K /= np.linalg.norm(K, axis=1, keepdims=True)
    Q, V = r.normal(size=(C, d_k)), r.normal(size=(C, d_v))
    beta = r.uniform(0.1, 1.5, size=C)
    b = np.cumsum(np.log(r.uniform(0.8, 1.0, size=C)))
    Gam = np.exp(np.tril(b[:, None] - b[None, :])) * lc.causal_mask(C)
    A = np.tril(beta[:, None] * (K @ K.T) * Gam, k=-1)
    return r, Q, K, V, beta, b, Gam, A


@pytest.mark.parametrize("n,block", [(64, 16), (70, 16), (33, 8), (5, 16)])
def test_blockwise_inverse_equals_forward_substitution(n, block):
    """(ch6-d-blockinv): T_II = (I + A_II)^-1, T_IJ = -T_II sum_M A_IM T_MJ, any n (ragged last tile)."""
    A = np.tril(np.random.default_rng(n).normal(size=(n, n)) * 0.3, k=-1)
    # float64 on O(1) unit-triangular systems of size <= 70: round-off ~1e-14
    lc.check_close("blockwise inverse = forward substitution", lc.blockwise_unit_lower_inverse(A, block),
                   lc.forward_substitution(A, np.eye(n)), 1e-10)
    with pytest.raises(ValueError, match="block must be a positive integer"):
        lc.blockwise_unit_lower_inverse(A, 0)
    with pytest.raises(ValueError, match="strictly lower triangular"):
        lc.blockwise_unit_lower_inverse(A + np.eye(n), block)


def test_delta_chunk_is_one_chunk_of_the_recurrence():
    """(ch6-d-wy), (ch6-d-chunk) as written once in kernels.reference.delta_chunk: from a nonzero
    entering state, its outputs and leaving state are the token-by-token gated delta rule's, and its
    A is the strictly lower matrix built here in NumPy."""
    from kernels import reference
    r, Q, K, V, beta, b, Gam, A = _gated_chunk(5)
    f64 = lambda x: torch.tensor(x, dtype=torch.float64)
    S0T = f64(r.normal(size=(K.shape[1], V.shape[1])))
    ch = reference.delta_chunk(f64(Q), f64(K), f64(V), f64(b), f64(beta), S0T)
    log_alpha = np.diff(b, prepend=0.0)                          # b = cumsum(log alpha)
    one = lambda x: f64(x)[None, :, None]                        # [1, C, 1, ...]: one sequence, one head
    o, ST = reference.recurrent_ref(one(Q), one(K), one(V), one(log_alpha), one(beta), 1.0,
                                    S0T[None, None], output_final_state=True)
    # float64, 64 tokens, O(1) entries: round-off ~1e-13 (chunk) against ~1e-13 (loop); a slip is O(1)
    lc.check_close("delta_chunk's A = (Diag(beta) K K^T ⊙ Γ) ⊙ M⁻", ch.A.numpy(), A, 1e-12)
    lc.check_close("delta_chunk's O = the recurrence's outputs", ch.O.numpy(), o[0, :, 0].numpy(), 1e-10)
    lc.check_close("delta_chunk's S_next = the recurrence's state", ch.S_next.numpy(), ST[0, 0].numpy(), 1e-10)


def test_chunk_backward_closed_forms_match_autograd():
    """(ch6-d-adjoint), (ch6-d-dA): the kernels' closed-form chunk gradients equal autograd."""
    from kernels import reference
    r, Q, K, V, beta, b, Gam, A = _gated_chunk(6)
    C, d_k, d_v = K.shape[0], K.shape[1], V.shape[1]
    f64 = lambda x: torch.tensor(x, dtype=torch.float64)
    Qt, Kt, Vt, bt, bet = map(f64, (Q, K, V, b, beta))
    bet.requires_grad_()                                         # puts A (built from beta) on the graph
    S0T = f64(r.normal(size=(d_k, d_v))).requires_grad_()
    dO, dSn = f64(r.normal(size=(C, d_v))), f64(r.normal(size=(d_k, d_v)))
    ch = reference.delta_chunk(Qt, Kt, Vt, bt, bet, S0T)        # (ch6-d-wy), (ch6-d-chunk)
    ch.A.retain_grad()                                           # A enters O and S_next only through T
    ch.U.retain_grad()
    ((ch.O * dO).sum() + (ch.S_next * dSn).sum()).backward()
    with torch.no_grad():
        adj = reference.delta_chunk_adjoint(Qt, bt, ch, S0T, dO, dSn)
    # float64 autograd vs closed forms on O(10) entries: round-off ~1e-13
    lc.check_close("dU = autograd", adj["dU"].numpy(), ch.U.grad.numpy(), 1e-9)
    lc.check_close("dS0^T = autograd", adj["dS0"].numpy(), S0T.grad.numpy(), 1e-9)
    lc.check_close("dA = autograd (strictly lower)", adj["dA"].numpy(), np.tril(ch.A.grad.numpy(), k=-1), 1e-9)


def test_log_gate_gradient_is_a_reverse_cumulative_sum_in_the_chunk():
    """(ch6-d-dg): with b = cumsum(log alpha) inside a chunk, dL/dlog(alpha_s) = sum_{i >= s} dL/db_i,
    for the whole gated chunk (WY factors, outputs, leaving state) as the loss."""
    from kernels import reference
    r, Q, K, V, beta, _, _, _ = _gated_chunk(8)
    C, d_k, d_v = K.shape[0], K.shape[1], V.shape[1]
    f64 = lambda x: torch.tensor(x, dtype=torch.float64)
    Qt, Kt, Vt, bet = map(f64, (Q, K, V, beta))
    la = f64(np.log(r.uniform(0.5, 1.0, size=C))).requires_grad_()
    b = torch.cumsum(la, 0)
    b.retain_grad()
    S0T, dO, dSn = f64(r.normal(size=(d_k, d_v))), f64(r.normal(size=(C, d_v))), f64(r.normal(size=(d_k, d_v)))
    ch = reference.delta_chunk(Qt, Kt, Vt, b, bet, S0T)
    ((ch.O * dO).sum() + (ch.S_next * dSn).sum()).backward()
    reverse = torch.flip(torch.cumsum(torch.flip(b.grad, [0]), 0), [0])
    # float64 autograd: round-off ~1e-13
    lc.check_close("dL/dlog(alpha) = reverse cumsum of dL/db", la.grad.numpy(), reverse.numpy(), 1e-9)
    # the forward cumulative sum is not it (the check can fail)
    res = lc.check_close("forward cumsum", la.grad.numpy(), torch.cumsum(b.grad, 0).numpy(), 1e-9,
                         raise_on_fail=False)
    assert not res.passed


@pytest.mark.parametrize("seed", [6, 7])
def test_t_form_of_the_pseudo_values(seed):
    """(ch6-d-tform): Ũ − W S₀ᵀ = T Diag(β)(V − Diag(e^b) K S₀ᵀ), numerically on a gated chunk."""
    r, Q, K, V, beta, b, Gam, A = _gated_chunk(seed)
    S0T = r.normal(size=(K.shape[1], V.shape[1]))
    T = lc.forward_substitution(A, np.eye(K.shape[0]))
    W, Ut = T @ ((beta * np.exp(b))[:, None] * K), T @ (beta[:, None] * V)
    # float64, O(1) entries, 64-token chunk: round-off ~1e-14
    lc.check_close("T form (ch6-d-tform)", T @ (beta[:, None] * (V - np.exp(b)[:, None] * (K @ S0T))),
                   Ut - W @ S0T, TOL)


def test_t_form_of_the_pseudo_values_symbolic():
    """(ch6-d-tform) exactly, for a 2-token chunk, d_k = 2, d_v = 1, symbolic T, β, gates, state."""
    t = sp.Matrix(2, 2, sp.symbols("t0:4"))
    be = sp.diag(*sp.symbols("beta1 beta2"))
    eb = sp.diag(*[sp.exp(x) for x in sp.symbols("b1 b2")])
    K, V, S0T = sp.Matrix(2, 2, sp.symbols("k0:4")), sp.Matrix(sp.symbols("v1 v2")), sp.Matrix(sp.symbols("s1 s2"))
    lhs = t * be * V - (t * be * eb * K) * S0T
    rhs = t * be * (V - eb * K * S0T)
    assert sp.simplify(lhs - rhs) == sp.zeros(2, 1)


# ---------------------------------------------------------------- (ch6-gdn-matrix): GDN's attention matrix
@pytest.mark.parametrize("n,seed", [(1, 0), (2, 1), (17, 2), (48, 3)])
def test_gated_deltanet_attention_matrix_is_deltanets_times_the_decay_mask(n, seed):
    """(ch6-parallel) as O = P V, P = (QK^T ⊙ M)(I + B)^-1 Diag(beta) (lc.deltanet_attention_matrix,
    checked here against the definition), and (ch6-gdn-matrix): Gated DeltaNet is (P ⊙ Γ) V, Γ the
    decay mask of its gates; (ch6-gdn-parallel), with B ⊙ Γ, is the same."""
    Q, K, V, alpha, beta = make(n, seed=seed)
    P = lc.deltanet_attention_matrix(Q, K, beta)
    G = lc.decay_mask(alpha)
    gdn = lc.gated_deltanet_recurrent(Q, K, V, alpha, beta)
    lc.check_close("P V = DeltaNet (ch6-parallel)", P @ V, lc.deltanet_recurrent(Q, K, V, beta), TOL)
    # P itself: the outputs of the recurrence for the values I (column j = the value e_j)
    lc.check_close("P = DeltaNet(Q, K, I)", P, lc.deltanet_recurrent(Q, K, np.eye(n), beta), TOL)
    lc.check_close("(P ⊙ Γ) V = Gated DeltaNet (ch6-gdn-matrix)", (P * G) @ V, gdn, TOL)
    # (ch6-gdn-parallel): the mask Γ in both places, (QK^T ⊙ Γ)(I + B ⊙ Γ)^{-1} Diag(beta) V
    B = np.tril(beta[:, None] * (K @ K.T), k=-1)
    U = lc.forward_substitution(B * G, beta[:, None] * V)
    lc.check_close("(QK^T ⊙ Γ)(I + B ⊙ Γ)^-1 Diag(beta) V = Gated DeltaNet", ((Q @ K.T) * G) @ U, gdn, TOL)
    # the conjugation step: Diag(abar) P Diag(abar)^-1 = P ⊙ Γ (abar is finite for these short n)
    abar = np.cumprod(alpha)
    lc.check_close("Diag(abar) P Diag(abar)^-1 = P ⊙ Γ", abar[:, None] * P / abar[None, :], P * G, TOL)
    with pytest.raises(ValueError, match="Q must have shape"):
        lc.deltanet_attention_matrix(Q[:, :-1], K, beta)
    if n > 2:   # the check can fail: without the decay mask it is DeltaNet, not Gated DeltaNet
        res = lc.check_close("P V", P @ V, gdn, TOL, raise_on_fail=False)
        assert not res.passed


def test_decayed_attention_matrix_is_finite_where_the_cumulative_gate_underflows():
    """(ch6-gdn-matrix) never divides by abar: with harsh gates over 600 tokens abar underflows to 0 in
    float64 and the rewriting (ch6-cumalpha) returns inf/NaN, while (P ⊙ Γ) V, Γ from log differences,
    equals the chunkwise form."""
    n = 600
    Q, K, V, _, beta = make(n, seed=11)
    alpha = np.random.default_rng(11).uniform(0.05, 0.5, size=n)
    assert np.cumprod(alpha)[-1] == 0.0                   # the cumulative gate is gone
    assert not np.all(np.isfinite(lc.gated_deltanet_via_cumulative_alpha(Q, K, V, alpha, beta)))
    out = (lc.deltanet_attention_matrix(Q, K, beta) * lc.decay_mask(alpha)) @ V
    # float64 over 600 tokens, outputs O(1): round-off ~1e-13
    lc.check_close("(P ⊙ Γ) V = chunkwise Gated DeltaNet, n = 600", out,
                   lc.gated_deltanet_chunkwise(Q, K, V, alpha, beta), 1e-9)


def test_conjugating_by_the_cumulative_gate_is_the_decay_mask_symbolic():
    """Diag(abar) X Diag(abar)^-1 = X ⊙ Γ for lower-triangular X, exactly (4 tokens, symbolic gates)."""
    n = 4
    a = sp.symbols(f"alpha1:{n + 1}", positive=True)
    X = sp.Matrix(n, n, lambda i, j: sp.Symbol(f"x{i}{j}") if j <= i else 0)
    G = sp.Matrix(n, n, lambda i, j: sp.prod(a[j + 1:i + 1]) if j <= i else 0)
    D = sp.diag(*[sp.prod(a[:t + 1]) for t in range(n)])
    lc.check_symbolic("Diag(abar) X Diag(abar)^-1 = X ⊙ Γ", D * X * D.inv(), X.multiply_elementwise(G))
    res = lc.check_symbolic("not X itself", D * X * D.inv(), X, raise_on_fail=False)
    assert not res.passed
