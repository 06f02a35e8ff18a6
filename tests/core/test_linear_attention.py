"""Chapter 2: linear attention's three forms, its identities, feature maps, normalisation, recall."""
import numpy as np
import pytest
import sympy as sp

import lattn_core as lc

# float64 sums of O(n) terms of size O(d): round-off is ~1e-14 relative; 1e-10 (absolute, on outputs
# of size up to a few hundred) leaves ample headroom while still catching any real algebra mistake.
TOL = 1e-10


def brute_linear_attention(Q, K, V):
    """The definition o_t = sum_{j<=t} (q_t . k_j) v_j, one scalar product at a time."""
    n = Q.shape[0]
    out = np.zeros((n, V.shape[1]))
    for t in range(n):
        for j in range(t + 1):
            out[t] += float(np.dot(Q[t], K[j])) * V[j]
    return out


def qkv(n, d_k=5, d_v=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d_k)), rng.normal(size=(n, d_k)), rng.normal(size=(n, d_v))


@pytest.mark.parametrize("n", [1, 2, 7, 64, 200])
@pytest.mark.parametrize("chunk_size", [1, 3, 16, 64, 500])
def test_three_forms_agree_with_definition(n, chunk_size):
    Q, K, V = qkv(n, seed=n)
    ref = brute_linear_attention(Q, K, V)
    lc.check_close("recurrent = definition", lc.linear_attention_recurrent(Q, K, V), ref, TOL)
    lc.check_close("parallel = definition", lc.linear_attention_parallel(Q, K, V), ref, TOL)
    lc.check_close("chunkwise = definition", lc.linear_attention_chunkwise(Q, K, V, chunk_size=chunk_size), ref, TOL)
    lc.check_close("scan = definition", lc.gated_attention_scan(Q, K, V), ref, TOL)


def test_associativity_numeric_and_symbolic():
    Q, K, V = qkv(50, 6, 4, seed=3)
    lc.check_close("(QK^T)V = Q(K^T V)", lc.linear_attention_nocausal(Q, K, V, order="left"),
                   lc.linear_attention_nocausal(Q, K, V, order="right"), TOL)
    Qs, Ks, Vs = (sp.Matrix(3, 2, sp.symbols(f"{c}0:6")) for c in "qkv")
    assert lc.check_symbolic("(QK^T)V = Q(K^T V)", (Qs * Ks.T) * Vs, Qs * (Ks.T * Vs)).passed
    with pytest.raises(ValueError, match="order must be"):
        lc.linear_attention_nocausal(Q, K, V, order="middle")


def test_rnn_unrolling_symbolic_and_state():
    # o_t = sum_j v_j (k_j^T q_t) = (sum_j v_j k_j^T) q_t, symbolically for t = 3, d = 2
    q = sp.Matrix(sp.symbols("q0:2"))
    ks = [sp.Matrix(sp.symbols(f"k{j}_0:2")) for j in range(3)]
    vs = [sp.Matrix(sp.symbols(f"v{j}_0:2")) for j in range(3)]
    lhs = sum((v * (k.T * q)[0, 0] for k, v in zip(ks, vs)), sp.zeros(2, 1))
    S = sp.zeros(2, 2)
    for k, v in zip(ks, vs):
        S = S + v * k.T                                     # S_t = S_{t-1} + v_t k_t^T
    assert lc.check_symbolic("sum_j v_j k_j^T q = S_t q", lhs, S * q).passed
    # causal matrix form = masked scores times V, symbolically for n = 3
    Qs, Ks, Vs = (sp.Matrix(3, 2, sp.symbols(f"{c}0:6")) for c in "QKV")
    M = sp.Matrix(3, 3, lambda i, j: 1 if j <= i else 0)
    rows = [sum((Vs[j, :] * (Qs[t, :] * Ks[j, :].T)[0, 0] for j in range(t + 1)), sp.zeros(1, 2)) for t in range(3)]
    assert lc.check_symbolic("(QK^T ⊙ M)V = rows of the RNN", (Qs * Ks.T).multiply_elementwise(M) * Vs,
                             sp.Matrix.vstack(*rows)).passed
    Q, K, V = qkv(30, seed=4)
    lc.check_close("S_n = V^T K", lc.linear_attention_state(K, V), sum(np.outer(V[j], K[j]) for j in range(30)), TOL)
    # the last output read from the final state
    lc.check_close("o_n = S_n q_n", lc.linear_attention_recurrent(Q, K, V)[-1], lc.linear_attention_state(K, V) @ Q[-1], TOL)


def test_elu_plus_one_is_positive_and_correct():
    X = np.array([[-50.0, -1.0, 0.0, 2.0]])
    phi = lc.elu_plus_one(X)
    assert np.all(phi > 0)
    lc.check_close("elu+1 values", phi, [[np.exp(-50.0), np.exp(-1.0), 1.0, 3.0]], 1e-15)


def brute_normalized(Q, K, V):
    out = np.zeros((Q.shape[0], V.shape[1]))
    for t in range(Q.shape[0]):
        w = np.array([Q[t] @ K[j] for j in range(t + 1)])
        out[t] = (w[:, None] * V[: t + 1]).sum(0) / w.sum()
    return out


def test_normalized_linear_attention_and_rmsnorm():
    Q, K, V = qkv(40, seed=5)
    phiQ, phiK = lc.elu_plus_one(Q), lc.elu_plus_one(K)
    out = lc.normalized_linear_attention(Q, K, V, feature_map=lc.elu_plus_one)
    lc.check_close("normalised form = definition", out, brute_normalized(phiQ, phiK, V), TOL)
    # a positive denominator is a per-row scale, which RMSNorm removes (eps = 0):
    num = lc.linear_attention_parallel(phiQ, phiK, V)
    lc.check_close("RMSNorm(normalised) = RMSNorm(numerator)", lc.rms_norm(out), lc.rms_norm(num), TOL)
    with pytest.raises(ValueError, match="feature_map must be a callable"):
        lc.normalized_linear_attention(Q, K, V, feature_map=3)


def test_raw_features_make_the_denominator_cross_zero():
    # Without a positive feature map the denominator q_t . sum_j k_j changes sign along the sequence,
    # and the normalised output is unbounded near the crossings; RMSNorm of the numerator is not.
    Q, K, V = qkv(400, seed=6)
    den = lc.linear_attention_parallel(Q, K, np.ones((400, 1)))[:, 0]
    assert np.any(den > 0) and np.any(den < 0)
    raw = lc.normalized_linear_attention(Q, K, V)
    assert np.max(np.abs(raw)) > 100 * np.max(np.abs(lc.rms_norm(lc.linear_attention_parallel(Q, K, V))))


def test_random_features_unbiased_and_error_decreasing():
    rng = np.random.default_rng(7)
    Q, K = rng.normal(size=(16, 8)) * 0.3, rng.normal(size=(16, 8)) * 0.3
    counts = [16, 64, 256, 1024, 4096]
    for orth in (False, True):
        err = lc.random_feature_error(Q, K, counts, n_seeds=6, orthogonal=orth)
        assert np.all(np.diff(err) < 0), err
        slope = np.polyfit(np.log(counts), np.log(err), 1)[0]
        # Monte-Carlo error ~ m^{-1/2}; 6 seeds leave some noise in the fitted exponent.
        assert -0.75 < slope < -0.3, slope
    # unbiasedness: the mean of many independent estimates approaches exp(q.k)
    W = lc.draw_random_features(200_000, 8, seed=1)
    est = lc.random_feature_map(Q[:1], W) @ lc.random_feature_map(K[:1], W).T
    lc.check_close("E[phi(q).phi(k)] = exp(q.k)", est, np.exp(Q[:1] @ K[:1].T), 0.02, relative=True)
    # normalised linear attention with many random features approximates softmax attention
    V = rng.normal(size=(16, 3))
    W = lc.draw_random_features(20_000, 8, seed=2)
    approx = lc.normalized_linear_attention(Q, K, V, feature_map=lambda X: lc.random_feature_map(X, W))
    # Monte-Carlo error ~ 1/sqrt(20000) ~ 1e-2 on the scores; 0.05 on the outputs is generous.
    lc.check_close("random features ≈ softmax attention", approx, lc.softmax_attention(Q, K, V), 0.05)
    with pytest.raises(ValueError, match=r"omega must have shape \(m, 8\)"):
        lc.random_feature_map(Q, np.ones((5, 3)))
    with pytest.raises(ValueError, match="m must be a positive integer"):
        lc.draw_random_features(0, 8)


@pytest.mark.parametrize("n", [16, 64, 256, 1024])
def test_recall_error_matches_theory_and_grows(n):
    d = 32
    runs = [lc.recall_experiment(n, d, d, seed=s) for s in range(6)]
    measured = np.mean([r["rel_error"].mean() for r in runs])
    theory = lc.recall_error_theory(n, d)
    assert np.allclose(theory, np.sqrt((n - 1) / d))
    # E|crosstalk| vs sqrt(E|crosstalk|^2): the mean norm sits a little below the RMS (Jensen); 20%.
    assert abs(measured - theory[0]) < 0.2 * theory[0] + 0.05, (measured, theory[0])


def test_recall_blurs_with_length():
    res = lc.recall_vs_length([8, 32, 128, 512], 32, 32, n_seeds=3)
    assert np.all(np.diff(res["rel_error"]) > 0) and np.all(np.diff(res["cosine"]) < 0)
    one = lc.recall_experiment(1, 16, 4)
    lc.check_close("a single stored pair is recalled exactly", one["rel_error"], [0.0], 1e-12)


@pytest.mark.parametrize("fn", [lc.linear_attention_recurrent, lc.linear_attention_parallel,
                                lc.linear_attention_chunkwise, lc.gated_attention_scan])
def test_bad_inputs_raise(fn):
    Q, K, V = qkv(6, 4, 2)
    with pytest.raises(ValueError, match=r"Q must have shape \(6, 4\)"):
        fn(Q[:, :3], K, V)
    with pytest.raises(ValueError, match=r"Q must have shape \(6, 4\)"):
        fn(Q[:5], K, V)
    with pytest.raises(ValueError, match=r"V must have shape \(6, d_v\)"):
        fn(Q, K, V[:4])
    with pytest.raises(ValueError, match=r"K must have shape \(n, d_k\) \(2-D\)"):
        fn(Q, K[None], V)
    bad = K.copy(); bad[2, 1] = np.nan
    with pytest.raises(ValueError, match="K contains NaN"):
        fn(Q, bad, V)
    bad = V.copy(); bad[0, 0] = -np.inf
    with pytest.raises(ValueError, match="V contains inf"):
        fn(Q, K, bad)


def test_chunk_size_validated():
    Q, K, V = qkv(6)
    for bad in (0, -1, 2.0, None):
        with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
            lc.linear_attention_chunkwise(Q, K, V, chunk_size=bad)


def test_kernels_torch_path_matches_numpy():
    """kernels.chunk_linear_attn (PyTorch path) against the NumPy reference, per head.

    fla's state is our S^T and its o_t = scale * S^T q_t; with scale = 1 the outputs coincide.
    The public op accepts float32/16/bf16 only, so it is checked in float32 (tolerance relative
    1e-5: float32 round-off over T = 100 sums); its float64 reference path is checked at 1e-10.
    """
    torch = pytest.importorskip("torch")
    import kernels
    from kernels import reference
    rng = np.random.default_rng(11)
    B, T, H, Kd, Vd = 2, 100, 3, 16, 8
    q, k, v = rng.normal(size=(B, T, H, Kd)), rng.normal(size=(B, T, H, Kd)), rng.normal(size=(B, T, H, Vd))
    o32, S32 = kernels.chunk_linear_attn(*(torch.tensor(x, dtype=torch.float32) for x in (q, k, v)),
                                          scale=1.0, output_final_state=True, backend="torch")
    o64, S64 = reference.chunk_scalar_ref(*(torch.tensor(x) for x in (q, k, v)), scale=1.0, output_final_state=True)
    for b in range(B):
        for h in range(H):
            ref = lc.linear_attention_chunkwise(q[b, :, h], k[b, :, h], v[b, :, h])
            lc.check_close("torch float64 path", o64[b, :, h].numpy(), ref, TOL)
            lc.check_close("final state (fla S = our S^T)", S64[b, h].numpy().T,
                           lc.linear_attention_state(k[b, :, h], v[b, :, h]), TOL)
            lc.check_close("kernels.chunk_linear_attn float32", o32[b, :, h].numpy(), ref, 1e-5, relative=True)


def test_experiment_counts_are_checked():
    """n_seeds is a positive integer (0 used to give NaN means, 1.5 a TypeError)."""
    rng = np.random.default_rng(0)
    Q, K = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match=r"^n_seeds must be an integer >= 1"):
            lc.random_feature_error(Q, K, [4], n_seeds=bad)
        with pytest.raises(ValueError, match=r"^n_seeds must be an integer >= 1"):
            lc.recall_vs_length([8], 4, 4, n_seeds=bad)
