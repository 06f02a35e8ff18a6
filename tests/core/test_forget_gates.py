"""Chapter 3: forget gates. Three forms agree (harsh gates included), Γ, RoPE as complex decay, the
associative scan, which gates factor, and the kernels' PyTorch paths against the NumPy references."""
import math

import numpy as np
import pytest
import sympy as sp

import lattn_core as lc

# float64 with cumulative-log differences: the error of c_i - c_j is ~eps * |c| (|c| <= a few
# thousand here), i.e. ~1e-12 relative on the decays; 1e-10 absolute on O(100) outputs is headroom.
TOL = 1e-10


def qkv(n, d_k=6, d_v=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d_k)), rng.normal(size=(n, d_k)), rng.normal(size=(n, d_v))


def harsh_gates(shape, seed, low=1e-3):
    """log-uniform gates in [low, 1]: many near 0, many near 1."""
    rng = np.random.default_rng(seed)
    return np.exp(rng.uniform(np.log(low), 0.0, size=shape))


def brute_decay(Q, K, V, gamma):
    """o_t = sum_{j<=t} (prod_{tau=j+1..t} gamma_tau) (q_t.k_j) v_j with explicit products."""
    n = Q.shape[0]
    out = np.zeros((n, V.shape[1]))
    for t in range(n):
        for j in range(t + 1):
            out[t] += math.prod(gamma[j + 1:t + 1]) * float(Q[t] @ K[j]) * V[j]
    return out


def brute_gla(Q, K, V, gamma):
    n = Q.shape[0]
    out = np.zeros((n, V.shape[1]))
    for t in range(n):
        for j in range(t + 1):
            dec = np.prod(gamma[j + 1:t + 1], axis=0) if t > j else np.ones(Q.shape[1])
            out[t] += float(np.sum(Q[t] * K[j] * dec)) * V[j]
    return out


@pytest.mark.parametrize("n,chunk_size", [(1, 1), (1, 8), (2, 1), (13, 4), (50, 7), (64, 16)])
def test_decay_forms_match_definition(n, chunk_size):
    Q, K, V = qkv(n, seed=n)
    g = harsh_gates(n, seed=n, low=0.05)
    ref = brute_decay(Q, K, V, g)
    lc.check_close("decay recurrent", lc.decay_attention_recurrent(Q, K, V, g), ref, TOL)
    lc.check_close("decay parallel", lc.decay_attention_parallel(Q, K, V, g), ref, TOL)
    lc.check_close("decay chunkwise", lc.decay_attention_chunkwise(Q, K, V, g, chunk_size=chunk_size), ref, TOL)
    lc.check_close("decay scan", lc.gated_attention_scan(Q, K, V, g), ref, TOL)


@pytest.mark.parametrize("n,chunk_size", [(1, 1), (1, 8), (2, 1), (13, 4), (40, 7)])
def test_gla_forms_match_definition(n, chunk_size):
    Q, K, V = qkv(n, seed=n + 1)
    g = harsh_gates((n, 6), seed=n, low=0.05)
    ref = brute_gla(Q, K, V, g)
    lc.check_close("gla recurrent", lc.gla_attention_recurrent(Q, K, V, g), ref, TOL)
    lc.check_close("gla parallel", lc.gla_attention_parallel(Q, K, V, g), ref, TOL)
    lc.check_close("gla chunkwise", lc.gla_attention_chunkwise(Q, K, V, g, chunk_size=chunk_size), ref, TOL)
    lc.check_close("gla scan", lc.gated_attention_scan(Q, K, V, g), ref, TOL)


@pytest.mark.parametrize("chunk_size", [1, 16, 37, 64, 500, 1000])
def test_harsh_gates_over_500_tokens(chunk_size):
    n = 500
    Q, K, V = qkv(n, seed=9)
    g = harsh_gates(n, seed=1)                      # gamma in [1e-3, 1]: products reach 1e-1000s
    ref = lc.decay_attention_recurrent(Q, K, V, g)
    assert np.all(np.isfinite(ref))
    lc.check_close("decay chunkwise, harsh", lc.decay_attention_chunkwise(Q, K, V, g, chunk_size=chunk_size), ref, TOL)
    lc.check_close("decay parallel, harsh", lc.decay_attention_parallel(Q, K, V, g), ref, TOL)
    G = harsh_gates((n, 6), seed=2)
    ref = lc.gla_attention_recurrent(Q, K, V, G)
    lc.check_close("gla chunkwise, harsh", lc.gla_attention_chunkwise(Q, K, V, G, chunk_size=chunk_size), ref, TOL)
    if chunk_size == 16:
        lc.check_close("gla parallel, harsh", lc.gla_attention_parallel(Q, K, V, G), ref, TOL)
        lc.check_close("scan, harsh", lc.gated_attention_scan(Q, K, V, G), ref, TOL)


def test_gates_near_zero_long_sequence_stay_finite():
    n = 3000
    Q, K, V = qkv(n, seed=10)
    g = np.full(n, 1e-8)                                       # prod over 40 steps < 1e-308
    g[::97] = 1.0
    out = lc.decay_attention_chunkwise(Q, K, V, g, chunk_size=64)
    assert np.all(np.isfinite(out))
    lc.check_close("tiny gates: chunkwise = recurrent", out, lc.decay_attention_recurrent(Q, K, V, g), TOL)
    G = np.full((n, 6), 1e-8)
    out = lc.gla_attention_chunkwise(Q, K, V, G, chunk_size=32)
    assert np.all(np.isfinite(out))
    lc.check_close("tiny vector gates: chunkwise = recurrent", out, lc.gla_attention_recurrent(Q, K, V, G), TOL)


def test_decay_mask_is_a_product_of_gates():
    g = harsh_gates(30, seed=3, low=0.2)
    G = lc.decay_mask(g)
    brute = np.array([[math.prod(g[j + 1:i + 1]) if j <= i else 0.0 for j in range(30)] for i in range(30)])
    lc.check_close("Γ_ij = prod gamma", G, brute, 1e-14)
    assert np.allclose(np.diag(G), 1.0) and np.allclose(np.diag(G, -1), g[1:])
    # semigroup: Γ_ij = Γ_ik Γ_kj for j <= k <= i
    i, k, j = 25, 11, 4
    lc.check_close("Γ_ij = Γ_ik Γ_kj", G[i, j], G[i, k] * G[k, j], 1e-15)
    # symbolically: the ratio of cumulative products telescopes into the product of the gates
    gs = sp.symbols("g1:6", positive=True)
    P = [sp.prod(gs[:t]) for t in range(1, 6)]
    assert lc.check_symbolic("P_5 / P_2 = g3 g4 g5", P[4] / P[1], gs[2] * gs[3] * gs[4]).passed
    # constant gamma: RetNet's Γ_ij = gamma^{i-j}
    lc.check_close("RetNet Γ = gamma^(i-j)", lc.decay_mask(np.full(20, 0.9)),
                   np.tril(0.9 ** np.subtract.outer(np.arange(20), np.arange(20)).clip(0)), 1e-14)


def test_naive_decay_mask_breaks_and_stable_one_does_not():
    g = np.full(300, 0.01)
    naive, stable = lc.decay_mask_naive(g), lc.decay_mask(g)
    assert np.isnan(naive).any()                   # 0/0 once prod underflows
    assert np.all(np.isfinite(stable)) and np.allclose(np.diag(stable, -1), 0.01)
    mild = harsh_gates(40, seed=4, low=0.5)        # products stay ~1e-12: both constructions work
    lc.check_close("naive = stable for mild gates", lc.decay_mask_naive(mild), lc.decay_mask(mild), 1e-12)


def test_decay_is_a_diagonal_rescaling_when_safe():
    Q, K, V = qkv(40, seed=5)
    g = harsh_gates(40, seed=5, low=0.6)
    lc.check_close("(QK^T ⊙ Γ)V = (Diag(P)Q)(Diag(P)^{-1}K)^T ⊙ M)V", lc.decay_attention_rescaled(Q, K, V, g),
                   lc.decay_attention_parallel(Q, K, V, g), 1e-9)
    G = harsh_gates((40, 6), seed=6, low=0.6)
    lc.check_close("GLA as rescaled linear attention", lc.decay_attention_rescaled(Q, K, V, G),
                   lc.gla_attention_parallel(Q, K, V, G), 1e-9)
    # unsafe: cumulative products underflow and 1/P overflows
    Q, K, V = qkv(400, seed=7)
    g = np.full(400, 0.05)
    bad = lc.decay_attention_rescaled(Q, K, V, g)
    assert not np.all(np.isfinite(bad))
    assert np.all(np.isfinite(lc.decay_attention_chunkwise(Q, K, V, g)))


def test_gla_with_equal_gates_is_scalar_decay():
    Q, K, V = qkv(60, seed=8)
    g = harsh_gates(60, seed=8)
    lc.check_close("GLA(1 gamma^T) = scalar decay", lc.gla_attention_chunkwise(Q, K, V, np.repeat(g[:, None], 6, 1)),
                   lc.decay_attention_chunkwise(Q, K, V, g), TOL)
    lc.check_close("gamma = 1 is plain linear attention", lc.decay_attention_chunkwise(Q, K, V, np.ones(60)),
                   lc.linear_attention_parallel(Q, K, V), TOL)


def test_rope_is_a_complex_decay():
    n = 70
    Q, K, V = qkv(n, d_k=8, seed=11)
    rng = np.random.default_rng(11)
    theta = rng.uniform(0, np.pi, size=4)
    g = harsh_gates(n, seed=11, low=0.5)
    lc.check_close("complex decay = rotated q, k", lc.rope_decay_attention_complex(Q, K, V, g, theta),
                   lc.rope_decay_attention_rotated(Q, K, V, g, theta), TOL)
    R_Q, R_K = lc.rope_rotate(Q, theta), lc.rope_rotate(K, theta)
    lc.check_close("rotation keeps norms", np.linalg.norm(R_Q, axis=1), np.linalg.norm(Q, axis=1), 1e-12)
    # relative position: (R_i q).(R_j k) depends only on i - j: shift both positions by 5
    q, k = np.tile(Q[:1], (n, 1)), np.tile(K[:1], (n, 1))
    Rq, Rk = lc.rope_rotate(q, theta), lc.rope_rotate(k, theta)
    lc.check_close("RoPE score depends on i - j", Rq[20] @ Rk[3], Rq[25] @ Rk[8], 1e-12)
    # symbolic: Re[(x+iy) e^{ia} conj((u+iv) e^{ib})] = rotated-pair dot product
    x, y, u, v, a, b = sp.symbols("x y u v a b", real=True)
    lhs = sp.re(sp.expand_complex((x + sp.I * y) * sp.exp(sp.I * a) * sp.conjugate((u + sp.I * v) * sp.exp(sp.I * b))))
    rot = lambda p, r, ang: (p * sp.cos(ang) - r * sp.sin(ang), p * sp.sin(ang) + r * sp.cos(ang))
    (x1, y1), (u1, v1) = rot(x, y, a), rot(u, v, b)
    assert lc.check_symbolic("Re(q~ conj(k~) e^{i(a-b)}) = R_a q . R_b k", sp.simplify(lhs),
                             sp.expand(x1 * u1 + y1 * v1)).passed
    with pytest.raises(ValueError, match="d_k must be even"):
        lc.rope_rotate(np.ones((3, 5)), np.ones(2))
    with pytest.raises(ValueError, match=r"theta must have shape \(4,\)"):
        lc.rope_decay_attention_complex(Q, K, V, g, np.ones(3))


@pytest.mark.parametrize("n", [1, 2, 5, 16, 33, 100])
def test_scan_equals_loop(n):
    rng = np.random.default_rng(n)
    cases = [
        (rng.uniform(0.1, 1, size=n), rng.normal(size=(n, 3, 2)), "scalar"),
        (rng.uniform(0.1, 1, size=(n, 3)), rng.normal(size=(n, 3, 2)), "diagonal"),
        (rng.uniform(0.1, 1, size=(n, 3, 2)), rng.normal(size=(n, 3, 2)), "elementwise"),
        (rng.normal(size=(n, 3, 3)) * 0.5, rng.normal(size=(n, 3, 2)), "matrix"),
        (rng.normal(size=(n, 3, 3)) * 0.5, rng.normal(size=(n, 3)), "matrix"),
    ]
    for A, B, kind in cases:
        H, rounds = lc.linear_recurrence_scan(A, B, kind=kind, return_rounds=True)
        assert rounds == math.ceil(math.log2(n)) if n > 1 else rounds == 0
        lc.check_close(f"scan = loop ({kind})", H, lc.linear_recurrence_loop(A, B, kind=kind), 1e-12)
        h0 = rng.normal(size=B.shape[1:])
        lc.check_close(f"scan = loop with h0 ({kind})", lc.linear_recurrence_scan(A, B, kind=kind, h0=h0),
                       lc.linear_recurrence_loop(A, B, kind=kind, h0=h0), 1e-12)


def test_scan_operator_is_associative_symbolically():
    A = [sp.Matrix(2, 2, sp.symbols(f"a{i}_0:4")) for i in range(3)]
    b = [sp.Matrix(2, 1, sp.symbols(f"b{i}_0:2")) for i in range(3)]
    e1, e2, e3 = zip(A, b)
    left = lc.compose_affine(e3, lc.compose_affine(e2, e1))
    right = lc.compose_affine(lc.compose_affine(e3, e2), e1)
    assert lc.check_symbolic("(e3∘e2)∘e1 = e3∘(e2∘e1), A part", left[0], right[0]).passed
    assert lc.check_symbolic("(e3∘e2)∘e1 = e3∘(e2∘e1), b part", left[1], right[1]).passed
    h = sp.Matrix(2, 1, sp.symbols("h0:2"))
    composed = lc.compose_affine(e2, e1)
    assert lc.check_symbolic("composition applies the steps in order", composed[0] * h + composed[1],
                             A[1] * (A[0] * h + b[0]) + b[1]).passed


def test_matrix_gates_scan_works_parallel_needs_pairwise_products():
    n = 24
    Q, K, V = qkv(n, d_k=4, seed=12)
    A = np.random.default_rng(12).normal(size=(n, 4, 4)) * 0.5
    ref = lc.matrix_gate_attention_recurrent(Q, K, V, A)
    lc.check_close("matrix gate: scan = loop", lc.gated_attention_scan(Q, K, V, A), ref, TOL)
    lc.check_close("matrix gate: pairwise-product form = loop", lc.matrix_gate_attention_parallel(Q, K, V, A), ref, TOL)
    T = lc.pairwise_transitions(A)
    assert T.shape == (n, n, 4, 4)
    lc.check_close("T_ij = A_{j+1}...A_i", T[7, 3], A[4] @ A[5] @ A[6] @ A[7], 1e-12)
    assert not np.allclose(A[1] @ A[2], A[2] @ A[1])     # these gates do not commute
    # a diagonal matrix gate is GLA
    g = harsh_gates((n, 4), seed=13, low=0.1)
    D = np.einsum("tc,cd->tcd", g, np.eye(4))
    lc.check_close("Diag gate = GLA", lc.matrix_gate_attention_parallel(Q, K, V, D),
                   lc.gla_attention_parallel(Q, K, V, g), TOL)


def test_which_elementwise_gates_factor():
    n, d_v, d_k = 20, 3, 4
    rng = np.random.default_rng(14)
    Q, K, V = qkv(n, d_k, d_v, seed=14)
    alpha, beta = harsh_gates((n, d_v), seed=15, low=0.1), harsh_gates((n, d_k), seed=16, low=0.1)
    outer = alpha[:, :, None] * beta[:, None, :]
    scalar = np.broadcast_to(harsh_gates(n, seed=17)[:, None, None], (n, d_v, d_k))
    gla = np.broadcast_to(beta[:, None, :], (n, d_v, d_k))
    delta, Am = rng.uniform(0.1, 1, size=(n, d_v)), rng.uniform(0.1, 2, size=(d_v, d_k))
    mamba1 = np.exp(-delta[:, :, None] * Am[None])          # exp(Δ_t[p] A[p, c]): not an outer product
    for name, G in (("outer", outer), ("scalar", scalar), ("gla", gla)):
        ok, resid, a, b = lc.is_outer_product_gate(G)
        assert ok, (name, resid)
        lc.check_close(f"{name}: G_t = alpha_t beta_t^T", a[:, :, None] * b[:, None, :], G, 1e-12)
    ok, resid, _, _ = lc.is_outer_product_gate(mamba1)
    assert not ok and resid > 1e-2
    ref = lc.elementwise_gate_attention_recurrent(Q, K, V, outer)
    lc.check_close("outer gate: chunkwise matmul form = loop",
                   lc.outer_gate_attention_chunkwise(Q, K, V, alpha, beta, chunk_size=6), ref, TOL)
    lc.check_close("elementwise parallel = loop (outer)", lc.elementwise_gate_attention_parallel(Q, K, V, outer), ref, TOL)
    ref = lc.elementwise_gate_attention_recurrent(Q, K, V, mamba1)
    lc.check_close("elementwise parallel = loop (Mamba-1)", lc.elementwise_gate_attention_parallel(Q, K, V, mamba1), ref, TOL)
    S = lc.linear_recurrence_scan(mamba1, V[:, :, None] * K[:, None, :], kind="elementwise")
    lc.check_close("elementwise scan = loop (Mamba-1)", np.einsum("tpc,tc->tp", S, Q), ref, TOL)
    lc.check_close("scalar gate via elementwise = decay", lc.elementwise_gate_attention_recurrent(Q, K, V, scalar),
                   lc.decay_attention_recurrent(Q, K, V, scalar[:, 0, 0]), TOL)


@pytest.mark.parametrize("fn,gate_shape", [
    (lc.decay_attention_recurrent, "n"), (lc.decay_attention_parallel, "n"), (lc.decay_attention_chunkwise, "n"),
    (lc.gla_attention_recurrent, "nd"), (lc.gla_attention_parallel, "nd"), (lc.gla_attention_chunkwise, "nd")])
def test_bad_inputs_raise(fn, gate_shape):
    Q, K, V = qkv(6, 4, 2)
    g = np.full(6, 0.5) if gate_shape == "n" else np.full((6, 4), 0.5)
    with pytest.raises(ValueError, match=r"Q must have shape \(6, 4\)"):
        fn(Q[:, :3], K, V, g)
    with pytest.raises(ValueError, match=r"V must have shape \(6, d_v\)"):
        fn(Q, K, V[:5], g)
    with pytest.raises(ValueError, match=r"K must have shape \(n, d_k\) \(2-D\)"):
        fn(Q, K[0], V, g)
    with pytest.raises(ValueError, match="gamma must have shape"):
        fn(Q, K, V, g[:5])
    for bad_value in (0.0, 1.5, -0.2):
        bad = g.copy(); bad.flat[2] = bad_value
        with pytest.raises(ValueError, match=r"gamma must lie in \(0, 1\]"):
            fn(Q, K, V, bad)
    bad = g.copy(); bad.flat[1] = np.nan
    with pytest.raises(ValueError, match="gamma contains NaN"):
        fn(Q, K, V, bad)
    bad = Q.copy(); bad[0, 0] = np.inf
    with pytest.raises(ValueError, match="Q contains inf"):
        fn(bad, K, V, g)
    if "chunkwise" in fn.__name__:
        with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
            fn(Q, K, V, g, chunk_size=0)


def test_other_validation():
    with pytest.raises(ValueError, match=r"gamma must lie in \(0, 1\]"):
        lc.decay_mask([0.5, 0.0])
    with pytest.raises(ValueError, match=r"A must have shape \(4, 3, 3\)"):
        lc.linear_recurrence_scan(np.ones((4, 3, 2)), np.ones((4, 3)), kind="matrix")
    with pytest.raises(ValueError, match="kind must be one of"):
        lc.linear_recurrence_scan(np.ones(4), np.ones((4, 3)), kind="banana")
    with pytest.raises(ValueError, match=r"B must have shape"):
        lc.linear_recurrence_loop(np.ones(4), np.ones(4))
    Q, K, V = qkv(5, 4, 2)
    with pytest.raises(ValueError, match="gamma must be None"):
        lc.gated_attention_scan(Q, K, V, np.ones((5, 4, 4, 1)))
    with pytest.raises(ValueError, match=r"G must lie in \(0, 1\]"):
        lc.elementwise_gate_attention_recurrent(Q, K, V, np.full((5, 2, 4), 2.0))
    with pytest.raises(ValueError, match=r"alpha must have shape \(5, 2\)"):
        lc.outer_gate_attention_chunkwise(Q, K, V, np.ones((5, 4)), np.ones((5, 4)))


def test_recall_recent_pairs_stay_sharp_with_decay():
    n, d = 256, 32
    runs = [lc.recall_experiment(n, d, d, gamma=0.95, seed=s) for s in range(6)]
    rel = np.mean([r["rel_error"] for r in runs], axis=0)              # indexed by j; age = n - 1 - j
    cos = np.mean([r["cosine"] for r in runs], axis=0)
    plain = np.mean([lc.recall_experiment(n, d, d, seed=s)["rel_error"].mean() for s in range(6)])
    newest, oldest = rel[-8:].mean(), rel[:8].mean()
    assert newest < 0.5 * plain < plain < oldest
    theory = lc.recall_error_theory(n, d, gamma=0.95)
    # cos ≈ 1 / sqrt(1 + rel^2) for crosstalk orthogonal-on-average to the signal: ~0.87 for the
    # newest pairs here, ~0 for the oldest; 0.1 slack for 6 seeds.
    assert cos[-8:].mean() > 1 / np.sqrt(1 + theory[-8:].mean() ** 2) - 0.1 and abs(cos[:8].mean()) < 0.2
    # per-age average over 6 seeds vs the RMS prediction: within 30% for the recent half
    assert np.all(np.abs(rel[n // 2:] - theory[n // 2:]) < 0.3 * theory[n // 2:]), (rel[-5:], theory[-5:])


def test_kernels_torch_paths_match_numpy():
    """chunk_simple_gla / chunk_gla (PyTorch path) against decay / GLA references, per head.

    Layout: fla's q, k [B, T, H, K], v [B, T, H, V], log gates g = log(gamma); its state is our S^T.
    The public ops take float32 (tolerance relative 1e-5 for float32 round-off over T = 90 steps,
    gates in [0.05, 1]); their float64 reference paths are checked at 1e-10.
    """
    torch = pytest.importorskip("torch")
    import kernels
    from kernels import reference
    rng = np.random.default_rng(21)
    B, T, H, Kd, Vd = 2, 90, 2, 16, 8
    q, k, v = rng.normal(size=(B, T, H, Kd)), rng.normal(size=(B, T, H, Kd)), rng.normal(size=(B, T, H, Vd))
    gs = np.exp(rng.uniform(np.log(0.05), 0, size=(B, T, H)))
    gv = np.exp(rng.uniform(np.log(0.05), 0, size=(B, T, H, Kd)))
    t32 = lambda x: torch.tensor(x, dtype=torch.float32)
    t64 = lambda x: torch.tensor(x, dtype=torch.float64)
    o_s32, _ = kernels.chunk_simple_gla(t32(q), t32(k), t32(v), t32(np.log(gs)), scale=1.0, backend="torch")
    o_v32, _ = kernels.chunk_gla(t32(q), t32(k), t32(v), t32(np.log(gv)), scale=1.0, backend="torch")
    o_s64, S_s64 = reference.chunk_scalar_ref(t64(q), t64(k), t64(v), t64(np.log(gs)), scale=1.0, output_final_state=True)
    o_v64, _ = reference.chunk_gla_ref(t64(q), t64(k), t64(v), t64(np.log(gv)), scale=1.0)
    for b in range(B):
        for h in range(H):
            args = q[b, :, h], k[b, :, h], v[b, :, h]
            ref_s = lc.decay_attention_chunkwise(*args, gs[b, :, h])
            ref_v = lc.gla_attention_chunkwise(*args, gv[b, :, h])
            lc.check_close("simple_gla float64 path", o_s64[b, :, h].numpy(), ref_s, TOL)
            lc.check_close("gla float64 path", o_v64[b, :, h].numpy(), ref_v, TOL)
            lc.check_close("chunk_simple_gla float32", o_s32[b, :, h].numpy(), ref_s, 1e-5, relative=True)
            lc.check_close("chunk_gla float32", o_v32[b, :, h].numpy(), ref_v, 1e-5, relative=True)
            # the final state, fla orientation: S_fla = S^T with S = sum_j Γ_{n j} v_j k_j^T
            w = lc.decay_mask(gs[b, :, h])[-1]
            lc.check_close("final state", S_s64[b, h].numpy().T, (v[b, :, h] * w[:, None]).T @ k[b, :, h], TOL)


def test_gates_of_any_rank_reject_complex():
    """The forms that take a gate of several ranks convert it with the shared helper: complex raises
    (it used to lose its imaginary part with a warning)."""
    rng = np.random.default_rng(0)
    Q, K, V = rng.normal(size=(4, 3)), rng.normal(size=(4, 3)), rng.normal(size=(4, 2))
    for fn in (lc.decay_attention_rescaled, lc.gated_attention_scan):
        with pytest.raises(ValueError, match="gamma must be real"):
            fn(Q, K, V, np.full(4, 0.5 + 0.5j))
