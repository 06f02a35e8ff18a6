"""Chapter 7: the KV cache against the state, the table of attention matrices, the
kernel trick, ALiBi and FoX. Every identity the chapter checks, with its tolerance and why.

Tolerances: the references are float64. Forms that regroup the same sums (three forms of FoX, a
table row against its recurrence) differ by round-off, ~1e-15 relative on O(1) outputs over at
most a few hundred terms: 1e-10 leaves four orders of headroom and still fails on any wrong term.
Truncated feature maps are approximations: their errors are measured and compared with bounds."""
import functools
import itertools
import math

import numpy as np
import pytest
import sympy as sp

import lattn_core as lc


def _qkv(n, d_k=4, d_v=3, seed=0, scale=0.6):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, d_k)) * scale, rng.normal(size=(n, d_k)) * scale,
            rng.normal(size=(n, d_v)))


def _gates(n, low, seed=0):
    return np.exp(np.random.default_rng(seed).uniform(np.log(low), 0.0, size=n))


def _fox_brute(Q, K, V, gamma):
    """The definition with Python loops and products of gates (independent of lattn_core)."""
    n = Q.shape[0]
    out = np.zeros_like(V, dtype=float)
    for t in range(n):
        w = np.array([math.exp(Q[t] @ K[j]) * math.prod(gamma[j + 1:t + 1]) for j in range(t + 1)])
        out[t] = (w[:, None] * V[:t + 1]).sum(0) / w.sum()
    return out


# ---------------------------------------------------------------------------------------------
# FoX: three forms, the definition, gates near zero
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,C", [(1, 1), (2, 1), (7, 3), (40, 16), (65, 64), (90, 13)])
def test_fox_three_forms_match_the_definition(n, C):
    Q, K, V = _qkv(n, seed=n)
    g = _gates(n, 0.05, seed=n)
    ref = _fox_brute(Q, K, V, g)
    # float64 sums of at most 90 positive terms: round-off ~1e-15
    lc.check_close("parallel = definition", lc.fox_attention_parallel(Q, K, V, g), ref, 1e-12)
    lc.check_close("recurrent = definition", lc.fox_attention_recurrent(Q, K, V, g), ref, 1e-12)
    lc.check_close(f"chunkwise (C = {C}) = definition",
                   lc.fox_attention_chunkwise(Q, K, V, g, chunk_size=C), ref, 1e-12)
    lc.check_close("fox_attention = parallel", lc.fox_attention(Q, K, V, g),
                   lc.fox_attention_parallel(Q, K, V, g), 1e-15)
    P = lc.fox_attention_matrix(Q, K, g)
    lc.check_close("matrix: rows sum to 1, zero above the diagonal",
                   np.concatenate([P.sum(1), np.triu(P, 1).ravel()]),
                   np.concatenate([np.ones(n), np.zeros(n * n)]), 1e-12)


def test_fox_with_unit_gates_is_softmax_attention():
    Q, K, V = _qkv(50, seed=3)
    ones = np.ones(50)
    for fn in (lc.fox_attention, lc.fox_attention_recurrent,
               functools.partial(lc.fox_attention_chunkwise, chunk_size=7)):
        lc.check_close("γ ≡ 1: FoX = softmax attention", fn(Q, K, V, ones),
                       lc.softmax_attention(Q, K, V), 1e-12)


def test_fox_forms_agree_for_harsh_gates_and_stay_finite_for_gates_near_zero():
    Q, K, V = _qkv(600, d_k=8, d_v=4, seed=5, scale=1.0)
    g = _gates(600, 1e-8, seed=5)          # cumulative products reach 10^-2400: underflow
    par = lc.fox_attention_parallel(Q, K, V, g)
    # only differences of sums of log gates are exponentiated: float64 round-off
    lc.check_close("harsh gates: chunkwise (C = 64) = parallel",
                   lc.fox_attention_chunkwise(Q, K, V, g, chunk_size=64), par, 1e-10)
    lc.check_close("harsh gates: recurrent = parallel, first 150 tokens",
                   lc.fox_attention_recurrent(Q[:150], K[:150], V[:150], g[:150]), par[:150], 1e-10)
    tiny = np.full(3000, 1e-300)
    Ql, Kl, Vl = _qkv(3000, seed=6)
    for fn in (lc.fox_attention, lc.fox_attention_chunkwise):
        out = fn(Ql, Kl, Vl, tiny)
        assert np.isfinite(out).all()
        # every earlier token is down by 1e-300 at least: the output is the token's own value
        lc.check_close("gates 1e-300: o_t = v_t", out, Vl, 1e-12)


def test_log_space_keeps_a_key_that_the_product_of_gates_loses():
    """Γ_31 = e^-800 underflows to 0 in float64, but q_3.k_1 = 1000 outweighs it: the true output
    is v_1. Adding log(decay_mask) (= -inf) loses it; log_decay_mask (= -800) keeps it."""
    g = np.array([1.0, math.exp(-400), math.exp(-400)])
    Q = np.array([[0.0], [0.0], [1.0]])
    K = np.array([[1000.0], [0.0], [0.0]])
    V = np.eye(3)
    assert lc.decay_mask(g)[2, 0] == 0.0 and lc.log_decay_mask(g)[2, 0] == pytest.approx(-800)
    with np.errstate(divide="ignore"):
        naive = lc.row_softmax(lc.attention_scores(Q, K) + np.log(lc.decay_mask(g))) @ V
    good = lc.fox_attention(Q, K, V, g)
    # weights e^200 : 1 : e^-400 on v_1, v_3, v_2: the output is v_1 to 1e-80
    lc.check_close("log space: o_3 = v_1", good[2], [1.0, 0.0, 0.0], 1e-12)
    lc.check_close("recurrent and chunkwise too", np.stack([
        lc.fox_attention_recurrent(Q, K, V, g)[2], lc.fox_attention_chunkwise(Q, K, V, g)[2]]),
        np.array([[1.0, 0.0, 0.0]] * 2), 1e-12)
    assert naive[2, 0] < 1e-12 and naive[2, 2] > 0.99     # the product-then-log route lost v_1


def test_a_near_zero_gate_is_a_reset():
    """γ_r ≈ 0 forgets everything before r: FoX's rows from r on are softmax attention on the
    suffix (Exercise 1). The dropped terms are below e^-690 times the kept ones."""
    Q, K, V = _qkv(60, seed=8)
    g = _gates(60, 0.9, seed=8)
    r = 23
    g[r] = 1e-300
    out = lc.fox_attention(Q, K, V, g)
    lc.check_close("reset at r: rows r.. = FoX on the suffix", out[r:],
                   lc.fox_attention(Q[r:], K[r:], V[r:], g[r:]), 1e-12)
    lc.check_close("with no other gate it is softmax attention on the suffix",
                   lc.fox_attention(Q, K, V, np.where(np.arange(60) == r, 1e-300, 1.0))[r:],
                   lc.softmax_attention(Q[r:], K[r:], V[r:]), 1e-12)


# ---------------------------------------------------------------------------------------------
# the substitution: exp(QKᵀ) ⊙ Γ = exp(QKᵀ + log Γ); ALiBi and FoX as its two readings
# ---------------------------------------------------------------------------------------------
def test_gate_inside_the_exponential_numeric_and_symbolic():
    Q, K, _ = _qkv(30, seed=9)
    g = _gates(30, 0.2, seed=9)
    lhs = np.exp(lc.attention_scores(Q, K) + lc.log_decay_mask(g))
    rhs = lc.attention_matrices(Q, K, g)["softmax"] * lc.decay_mask(g)
    # exp of a sum against a product of two exps: relative round-off ~1e-15
    lc.check_close("exp(QKᵀ + log Γ) = exp(QKᵀ) ⊙ Γ", lhs, rhs, 1e-12, relative=True)
    s = sp.Matrix(3, 3, sp.symbols("s1:10", real=True))
    gs = sp.symbols("g1:4", positive=True)
    G = sp.Matrix(3, 3, lambda i, j: sp.prod(gs[j + 1:i + 1]) if j <= i else 0)
    logG = sp.Matrix(3, 3, lambda i, j: sp.log(G[i, j]) if j <= i else -sp.oo)
    lc.check_symbolic("exp(S + log Γ) = exp(S) ⊙ Γ, three tokens",
                      (s + logG).applyfunc(sp.exp), s.applyfunc(sp.exp).multiply_elementwise(G))


@pytest.mark.parametrize("slope", [0.0, 0.05, 0.5, 2.0])
def test_alibi_is_the_constant_gate(slope):
    n = 70
    Q, K, V = _qkv(n, seed=10)
    logG, bias = lc.log_decay_mask(lc.alibi_gates(n, slope)), lc.alibi_bias(n, slope)
    low = np.tril_indices(n)
    # log Γ_ij = (i - j) log γ: a cumulative sum of n equal logs, round-off ~n · eps · slope
    lc.check_close("log Γ of γ = e^-ξ = ALiBi's -ξ (i - j), j <= i", logG[low], bias[low],
                   1e-12 * max(1.0, slope * n))
    up = np.triu_indices(n, 1)
    assert np.all(logG[up] == -np.inf) and np.all(bias[up] == -np.inf)
    ref = lc.row_softmax(lc.attention_scores(Q, K) + lc.alibi_bias(n, slope)) @ V
    lc.check_close("FoX with ALiBi's gate = ALiBi attention", lc.fox_attention(Q, K, V, lc.alibi_gates(n, slope)),
                   ref, 1e-12)


def test_alibi_slopes_follow_the_paper():
    assert np.array_equal(lc.alibi_slopes(8), 2.0 ** -np.arange(1, 9))
    lc.check_close("H = 16: 2^(-8h/16) = 2^(-h/2)", lc.alibi_slopes(16),
                   2.0 ** (-np.arange(1, 17) / 2), 1e-15)
    # not a power of two: the 4 slopes of H = 4, then every other one of H = 8
    six = lc.alibi_slopes(6)
    assert np.array_equal(six, np.array([2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]))
    assert len(lc.alibi_slopes(12)) == 12 and len(set(lc.alibi_slopes(12))) == 12
    assert np.all(lc.alibi_gates(5, 0.25) == math.exp(-0.25))


def test_feature_substitution_converges_to_fox():
    """(φ(Q)φ(K)ᵀ ⊙ Γ)V normalised = FoX as φ's Taylor order grows: a gated linear attention with
    p = 1 + d + ... + d^ζ features approximates it, the error falling with ζ."""
    rng = np.random.default_rng(11)
    n, d = 40, 4
    Q, K = rng.normal(size=(n, d)) / d ** 0.5, rng.normal(size=(n, d)) / d ** 0.5
    V = rng.normal(size=(n, 2))
    g = _gates(n, 0.3, seed=11)
    ref = lc.fox_attention(Q, K, V, g)
    errs = [lc.max_abs_error(lc.feature_fox_attention(Q, K, V, g, functools.partial(
        lc.taylor_feature_map, order=z)), ref) for z in (1, 3, 5, 7)]
    assert all(b < a for a, b in zip(errs, errs[1:])), errs
    assert errs[-1] < 1e-3, errs          # the remainder bound at |s| <= 2.5, ζ = 7 is ~1e-2


# ---------------------------------------------------------------------------------------------
# the kernel trick: Taylor features
# ---------------------------------------------------------------------------------------------
def test_taylor_features_give_the_taylor_polynomial():
    Q, K, _ = _qkv(12, d_k=3, seed=12)
    S = Q @ K.T
    for z in (0, 1, 2, 5):
        phiQ, phiK = lc.taylor_feature_map(Q, z), lc.taylor_feature_map(K, z)
        assert phiQ.shape == (12, lc.taylor_feature_count(3, z)) == (12, sum(3 ** l for l in range(z + 1)))
        poly = sum(S ** l / math.factorial(l) for l in range(z + 1))
        # float64 sums of O(1) products: round-off
        lc.check_close(f"φ_{z}(Q)φ_{z}(K)ᵀ = Σ_(ℓ≤{z}) (QKᵀ)^ℓ/ℓ!", phiQ @ phiK.T, poly, 1e-12)
        err = np.abs(phiQ @ phiK.T - np.exp(S)).max()
        assert err <= lc.taylor_remainder_bound(np.abs(S).max(), z)   # Lagrange's bound holds
    x, y = sp.Matrix(sp.symbols("x1:3")), sp.Matrix(sp.symbols("y1:3"))
    power = lambda u, l: functools.reduce(lambda a, b: sp.Matrix(sp.kronecker_product(a, b)), [u] * l)
    lc.check_symbolic("⟨x⊗x⊗x, y⊗y⊗y⟩ = (xᵀy)³", (power(x, 3).T * power(y, 3))[0], (x.T * y)[0] ** 3)


def test_taylor_error_falls_with_order_and_the_feature_count_explodes():
    rng = np.random.default_rng(13)
    Q, K = rng.normal(size=(20, 4)) / 2, rng.normal(size=(20, 4)) / 2
    errs = lc.taylor_feature_error(Q, K, range(9))
    assert np.all(np.diff(errs) < 0) and errs[-1] < 1e-3
    assert lc.taylor_feature_count(128, 2) == 1 + 128 + 128 ** 2
    # the distinct monomials of degree <= ζ in d variables: C(d + ζ, ζ), counted by brute force
    d, z = 4, 3
    monomials = {tuple(sorted(c)) for l in range(z + 1) for c in itertools.product(range(d), repeat=l)}
    assert lc.taylor_feature_count(d, z, symmetric=True) == len(monomials) == math.comb(d + z, z)


# ---------------------------------------------------------------------------------------------
# the table of attention matrices
# ---------------------------------------------------------------------------------------------
RECURRENT = {
    "linear": lambda Q, K, V, g: lc.linear_attention_recurrent(Q, K, V),
    "gated": lambda Q, K, V, g: lc.decay_attention_recurrent(Q, K, V, g),
    "deltanet": lambda Q, K, V, g: lc.deltanet_recurrent(Q, K, V),
    "gated_deltanet": lambda Q, K, V, g: lc.gated_deltanet_recurrent(Q, K, V, g),
    "gated_deltanet_inner": lambda Q, K, V, g: lc.gated_deltanet_recurrent(Q, K, V, g),
}


def _unit_keys(n, d_k=4, seed=14):
    rng = np.random.default_rng(seed)
    Q, K = rng.normal(size=(n, d_k)), rng.normal(size=(n, d_k))
    return Q, K / np.linalg.norm(K, axis=1, keepdims=True), rng.normal(size=(n, 3))


@pytest.mark.parametrize("n", [1, 5, 48])
def test_every_row_of_the_table_is_its_recurrence(n):
    Q, K, V = _unit_keys(n)
    g = _gates(n, 0.2, seed=n)
    table = lc.attention_matrices(Q, K, g)
    assert list(table) == list(lc.feeding_back.TABLE_ROWS)
    for name, rec in RECURRENT.items():
        # float64, contractive delta steps with unit keys: round-off ~1e-14
        lc.check_close(f"{name}: A V = recurrence", table[name] @ V, rec(Q, K, V, g), 1e-10)
        lc.check_close(f"{name}: A = recurrence on the values I", table[name],
                       rec(Q, K, np.eye(n), g), 1e-10)
    A = table["softmax"]
    lc.check_close("softmax: A V = the numerator", A @ V, lc.softmax_attention_numerator(Q, K, V), 1e-12)
    lc.check_close("softmax: rows of A normalised, times V = softmax attention",
                   (A / A.sum(1, keepdims=True)) @ V, lc.softmax_attention(Q, K, V), 1e-12)
    lc.check_close("DeltaNet row = Chapter 6's attention matrix", table["deltanet"],
                   lc.deltanet_attention_matrix(Q, K), 1e-12)
    lc.check_close("the two forms of Gated DeltaNet", table["gated_deltanet"],
                   table["gated_deltanet_inner"], 1e-12)


def test_the_table_symbolically_three_tokens():
    n, d_k = 3, 2
    Q = sp.Matrix(n, d_k, sp.symbols("q1:7"))
    K = sp.Matrix(n, d_k, sp.symbols("k1:7"))
    V = sp.Matrix(n, 1, sp.symbols("v1:4"))
    g = sp.symbols("g1:4", positive=True)
    table = lc.attention_matrices(Q, K, g)
    kinds = {"linear": {}, "gated": dict(gamma=g), "deltanet": dict(delta=True),
             "gated_deltanet": dict(gamma=g, delta=True), "gated_deltanet_inner": dict(gamma=g, delta=True)}
    for name, kw in kinds.items():
        lc.check_symbolic(f"{name}: A V = recurrence", table[name] * V,
                          lc.symbolic_recurrence(Q, K, V, **kw))
    lc.check_symbolic("softmax row: exp(q_i.k_j) on and below the diagonal", table["softmax"],
                      sp.Matrix(n, n, lambda i, j: sp.exp((Q[i, :] * K[j, :].T)[0]) if j <= i else 0))


def test_symbolic_recurrence_is_the_numeric_one():
    """The SymPy recurrence with numbers substituted = the NumPy references (so the symbolic checks
    test the same recurrences as the numeric ones)."""
    Q, K, V = _unit_keys(4, d_k=2, seed=15)
    g = _gates(4, 0.3, seed=15)
    num = lambda M: np.array(M.evalf(), dtype=float)
    lc.check_close("symbolic gated DeltaNet = gated_deltanet_recurrent",
                   num(lc.symbolic_recurrence(sp.Matrix(Q), sp.Matrix(K), sp.Matrix(V), list(g), delta=True)),
                   lc.gated_deltanet_recurrent(Q, K, V, g), 1e-12)
    lc.check_close("symbolic decay = decay_attention_recurrent",
                   num(lc.symbolic_recurrence(sp.Matrix(Q), sp.Matrix(K), sp.Matrix(V), list(g))),
                   lc.decay_attention_recurrent(Q, K, V, g), 1e-12)


# ---------------------------------------------------------------------------------------------
# KV cache against state
# ---------------------------------------------------------------------------------------------
def test_kv_cache_and_state_sizes():
    by = {m.name: m for m in lc.MODEL_SHAPES}
    kinds = {name: m.attention for name, m in by.items()}
    assert kinds == {"GPT-3 175B": "MHA", "Llama-2-7B": "MHA", "Llama-2-70B": "GQA",
                     "Llama-3-8B": "GQA", "Falcon-7B": "MQA", "PaLM 540B": "MQA"}
    m = by["Llama-2-7B"]
    # 2 (k, v) · 32 layers · 32 heads · 128 · 4096 tokens · 2 bytes = 2^31 bytes
    assert lc.kv_cache_size(m.layers, m.kv_heads, m.head_dim, 4096) == 2 ** 31
    assert lc.linear_state_size(m.layers, m.heads, m.head_dim, m.head_dim) == 2 ** 25
    for m in lc.MODEL_SHAPES:
        n_eq = lc.cache_state_crossover(m)
        state = lc.linear_state_size(m.layers, m.heads, m.head_dim, m.head_dim)
        lo, hi = (lc.kv_cache_size(m.layers, m.kv_heads, m.head_dim, int(x)) for x in
                  (math.floor(n_eq), math.ceil(n_eq)))
        assert lo <= state <= hi                      # the cache passes the state at n_eq
        grow = lc.kv_cache_size(m.layers, m.kv_heads, m.head_dim, 2000) - \
            lc.kv_cache_size(m.layers, m.kv_heads, m.head_dim, 1000)
        assert grow == lc.kv_cache_size(m.layers, m.kv_heads, m.head_dim, 1000)   # linear in n
    # grouping H query heads into H_kv groups divides the cache by H / H_kv
    a = lc.kv_cache_size(80, 64, 128, 1000)
    assert a == 8 * lc.kv_cache_size(80, 8, 128, 1000) == 64 * lc.kv_cache_size(80, 1, 128, 1000)


# ---------------------------------------------------------------------------------------------
# bad input: every new public function names the argument
# ---------------------------------------------------------------------------------------------
def test_bad_inputs_raise_value_errors_naming_the_argument():
    Q, K, V = _qkv(5)
    g = _gates(5, 0.5)
    for fn in (lc.fox_attention, lc.fox_attention_parallel, lc.fox_attention_recurrent,
               lc.fox_attention_chunkwise):
        with pytest.raises(ValueError, match=r"gamma must lie in \(0, 1\]"):
            fn(Q, K, V, np.r_[g[:4], 0.0])
        with pytest.raises(ValueError, match=r"gamma must have shape \(5,\)"):
            fn(Q, K, V, g[:4])
        with pytest.raises(ValueError, match=r"Q must have shape \(5, 4\)"):
            fn(Q[:, :3], K, V, g)
        with pytest.raises(ValueError, match="V contains NaN"):
            fn(Q, K, np.where(V > 1, np.nan, V), g)
    with pytest.raises(ValueError, match="chunk_size"):
        lc.fox_attention_chunkwise(Q, K, V, g, chunk_size=0)
    with pytest.raises(ValueError, match="gamma"):
        lc.fox_attention_matrix(Q, K, g * 2)
    with pytest.raises(ValueError, match="feature_map must be a callable"):
        lc.feature_fox_attention(Q, K, V, g, 3)
    with pytest.raises(ValueError, match="feature_map must map"):
        lc.feature_fox_attention(Q, K, V, g, lambda X: X[:2])
    with pytest.raises(ValueError, match="gamma"):
        lc.attention_matrices(Q, K, g[:3])
    with pytest.raises(ValueError, match=r"Q must have shape \(5, 4\)"):
        lc.attention_matrices(Q[:4], K, g)
    with pytest.raises(ValueError, match="order must be an integer >= 0"):
        lc.taylor_feature_map(Q, -1)
    with pytest.raises(ValueError, match=r"X must have shape \(n, d\)"):
        lc.taylor_feature_map(Q[0], 2)
    with pytest.raises(ValueError, match="d must be an integer >= 1"):
        lc.taylor_feature_count(0, 2)
    with pytest.raises(ValueError, match="score_max"):
        lc.taylor_remainder_bound(-1.0, 2)
    with pytest.raises(ValueError, match=r"K must have shape \(n_k, 4\)"):
        lc.taylor_feature_error(Q, K[:, :2], [1, 2])
    with pytest.raises(ValueError, match="n_heads must be an integer >= 1"):
        lc.alibi_slopes(0)
    with pytest.raises(ValueError, match="slope must be a finite number >= 0"):
        lc.alibi_gates(5, -0.1)
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        lc.alibi_bias(0, 0.5)
    with pytest.raises(ValueError, match="kv_heads must be an integer >= 1"):
        lc.kv_cache_size(2, 0, 64, 10)
    with pytest.raises(ValueError, match="n must be an integer >= 0"):
        lc.kv_cache_size(2, 1, 64, -1)
    with pytest.raises(ValueError, match="d_v must be an integer >= 1"):
        lc.linear_state_size(2, 4, 64, 0)
    with pytest.raises(ValueError, match="shape must be a ModelShape"):
        lc.cache_state_crossover("Llama")
    with pytest.raises(ValueError, match="gamma must hold n = 2"):
        lc.symbolic_recurrence(sp.eye(2), sp.eye(2), sp.eye(2), [1])
    with pytest.raises(ValueError, match="S must have a finite entry in every row"):
        lc.row_softmax(np.array([[0.0, 1.0], [-np.inf, -np.inf]]))
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        lc.row_softmax(np.array([[0.0, np.inf]]))
    with pytest.raises(ValueError, match=r"gamma must lie in \(0, 1\]"):
        lc.log_decay_mask([0.5, 1.5])


def test_attention_scores_validates_its_inputs():
    """attention_scores checks Q and K like every other reference (it used to check nothing: a
    length mismatch raised IndexError, NaN passed)."""
    rng = np.random.default_rng(0)
    Q, K = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    with pytest.raises(ValueError, match=r"Q must have shape \(4, 3\)"):
        lc.attention_scores(Q[:3], K)
    with pytest.raises(ValueError, match=r"Q must have shape \(3, 3\)"):     # n is K's, as in check_qkv
        lc.attention_scores(Q, K[:3])
    with pytest.raises(ValueError, match=r"K must have shape \(n, d_k\) \(2-D\)"):
        lc.attention_scores(Q, K[0])
    with pytest.raises(ValueError, match="Q contains NaN"):
        lc.attention_scores(np.where(Q > 1, np.nan, Q), K)
    with pytest.raises(ValueError, match="K contains inf"):
        lc.attention_scores(Q, np.where(K > 1, np.inf, K))
    with pytest.raises(ValueError, match="Q must be real"):
        lc.attention_scores(Q + 1j, K)


def test_symbolic_recurrence_rejects_numeric_nan_and_inf():
    """Symbols pass (they may stand for anything); numeric NaN or infinity in any input raises."""
    a, b = sp.symbols("a b")
    ok = lc.symbolic_recurrence(sp.Matrix([[a]]), sp.Matrix([[1]]), sp.Matrix([[b]]), [a])
    assert ok == sp.Matrix([[a * b]])
    for bad, name in ((sp.Matrix([[sp.nan]]), "Q"), (sp.Matrix([[float("nan")]]), "Q"),
                      (sp.Matrix([[sp.oo]]), "Q"), (sp.Matrix([[a + sp.zoo]]), "Q")):
        with pytest.raises(ValueError, match=rf"^{name} contains NaN or an infinity"):
            lc.symbolic_recurrence(bad, sp.Matrix([[1]]), sp.Matrix([[b]]))
    with pytest.raises(ValueError, match=r"^K contains NaN or an infinity"):
        lc.symbolic_recurrence(sp.Matrix([[a]]), sp.Matrix([[-sp.oo]]), sp.Matrix([[b]]))
    with pytest.raises(ValueError, match=r"^V contains NaN or an infinity"):
        lc.symbolic_recurrence(sp.Matrix([[a]]), sp.Matrix([[1]]), np.array([[np.inf]]))
    with pytest.raises(ValueError, match=r"^gamma contains NaN or an infinity"):
        lc.symbolic_recurrence(sp.Matrix([[a]]), sp.Matrix([[1]]), sp.Matrix([[b]]), [float("nan")])


def test_numeric_helpers_reject_complex_and_bad_counts():
    with pytest.raises(ValueError, match="score_max must be real"):
        lc.taylor_remainder_bound(1 + 1j, 2)
