"""DeltaFormer's reference math (lattn_core.feeding_back, Chapter 8): its three
forms, the matrices' masks, stability of the normalised form, and bad input. float64 throughout:
the forms differ only in the order of the same sums (round-off ~1e-15 relative to |O| of a few),
so they must agree to 1e-10; a wrong mask, a missing beta or a block boundary off by one fails that
by orders of magnitude."""
import numpy as np
import pytest

import lattn_core as lc

FORMS = (lc.deltaformer_recurrent, lc.deltaformer_parallel,
         lambda Q, K, V, normalize=False, beta=None: lc.deltaformer_chunkwise(
             Q, K, V, normalize, beta, chunk_size=7))


def case(n=29, d=5, dv=3, scale=0.3, seed=0):
    rng = np.random.default_rng(seed)
    Q, K = rng.normal(size=(2, n, d)) * scale
    return Q, K, rng.normal(size=(n, dv)), rng.uniform(0.1, 2.0, n)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("n", [1, 7, 29])
def test_three_forms_agree(normalize, n):
    Q, K, V, beta = case(n=n, scale=1.0 if normalize else 0.3)
    ref = lc.deltaformer(Q, K, V, normalize, beta)
    for form in FORMS:
        lc.check_close(f"deltaformer form {form}", form(Q, K, V, normalize, beta), ref, 1e-10)
    # the definition spelled out: A (I + Diag(beta) B)^{-1} V with an explicit inverse
    A, B = lc.deltaformer_matrices(Q, K, normalize=normalize)
    lc.check_close("A (I + Diag(beta) B)^-1 V", A @ np.linalg.inv(np.eye(n) + beta[:, None] * B) @ V, ref, 1e-10)


def test_matrices_masks_and_first_row():
    Q, K, V, _ = case(n=6)
    A, B = lc.deltaformer_matrices(Q, K)
    assert np.all(np.triu(A, 1) == 0) and np.all(np.triu(B) == 0)          # j <= i and j < i
    lc.check_close("A = exp(QK^T) below and on the diagonal", np.tril(A),
                   np.tril(np.exp(Q @ K.T)), 1e-14)
    An, Bn = lc.deltaformer_matrices(Q, K, normalize=True)
    assert np.allclose(An.sum(1), 1) and np.allclose(Bn.sum(1)[1:], 1) and np.all(Bn[0] == 0)
    # the first token has no earlier key: its pseudo-value is its value, and normalised attention
    # over one key returns it
    lc.check_close("o_1 = v_1 (normalised)", lc.deltaformer(Q, K, V, True)[0], V[0], 1e-15)


def test_default_beta_is_one():
    Q, K, V, _ = case()
    lc.check_close("beta=None is beta=1", lc.deltaformer(Q, K, V, True),
                   lc.deltaformer(Q, K, V, True, np.ones(len(V))), 0.0 + 1e-15)


def test_normalised_form_is_stable_for_large_scores():
    """Scores of several hundred overflow exp in float64 (e^710); the normalised form only ever
    exponentiates differences from each row's largest score."""
    Q, K, V, beta = case(scale=10.0)
    assert np.abs(K @ K.T).max() > 710
    outs = [form(Q, K, V, True, beta) for form in FORMS]
    assert all(np.isfinite(o).all() for o in outs)
    for o in outs[1:]:
        lc.check_close("normalised forms agree at large scores", o, outs[0], 1e-8)
    with pytest.raises(FloatingPointError):
        lc.deltaformer(Q, K, V, False, beta)          # the unnormalised exp overflows: said, not NaN


def test_bad_inputs_raise():
    Q, K, V, beta = case(n=5)
    with pytest.raises(ValueError, match="normalize"):
        lc.deltaformer(Q, K, V, normalize="yes")
    with pytest.raises(ValueError, match="beta"):
        lc.deltaformer(Q, K, V, beta=np.ones(4))
    with pytest.raises(ValueError, match="beta"):
        lc.deltaformer(Q, K, V, beta=np.full(5, 2.5))
    with pytest.raises(ValueError):
        lc.deltaformer(Q, K[:4], V)
    with pytest.raises(ValueError, match="chunk_size"):
        lc.deltaformer_chunkwise(Q, K, V, chunk_size=0)


def test_deltanet_is_delta_attention_on_finite_features():
    """With a finite feature map the identity is exact: DeltaNet on phi(Q), phi(K) (Chapter 6's
    matrix form) is A (I + Diag(beta) B)^{-1} Diag(beta) V with A = phi(Q)phi(K)^T ⊙ M and
    B = phi(K)phi(K)^T ⊙ M^-; with phi(x)phi(y)^T = exp(x·y) (infinitely many features) it is
    DeltaFormer. Checked with degree-2 Taylor features (exact for their own kernel)."""
    Q, K, V, beta = case(n=17, d=3)
    fQ, fK = lc.taylor_feature_map(Q, 2), lc.taylor_feature_map(K, 2)
    A, B = np.tril(fQ @ fK.T), np.tril(fK @ fK.T, -1)
    lc.check_close("DeltaNet(phi(Q), phi(K)) = delta attention on the features",
                   lc.deltanet_parallel(fQ, fK, V, beta),
                   lc.delta_attention(A, B, beta[:, None] * V, beta), 1e-10)


def test_qk_variant_differs_unless_queries_are_keys():
    Q, K, V, beta = case(n=12)
    gap = np.abs(lc.deltaformer_qk(Q, K, V, True, beta) - lc.deltaformer(Q, K, V, True, beta)).max()
    assert gap > 1e-3, gap                      # q·k and k·k pseudo-values are different models
    lc.check_close("q·k = k·k pseudo-values when Q = K", lc.deltaformer_qk(K, K, V, True, beta),
                   lc.deltaformer(K, K, V, True, beta), 1e-12)


def test_neumann_series_is_finite_and_needs_the_longest_chain():
    """(-Diag(beta) B) is strictly lower triangular, so nilpotent: the series stops. A dense B needs
    n terms; a B whose tokens link only to the token two places back splits into two chains (the
    even and the odd tokens) and needs as many terms as the longer one. Exact means round-off
    (1e-12 here); one term fewer leaves an error of the size of the last term (> 1e-9)."""
    Q, K, V, beta = case(n=9, scale=0.4)
    A, B = lc.deltaformer_matrices(Q, K, normalize=True)
    exact = lc.delta_attention(A, B, V, beta)
    L = lc.dependency_chain_length(B)
    assert L == 9
    errs = [lc.max_abs_error(lc.neumann_terms(A, B, V, m, beta), exact) for m in range(1, L + 1)]
    assert errs[-1] < 1e-12 and errs[-2] > 1e-9, errs     # exact at L terms, not before
    B2 = np.where(np.subtract.outer(np.arange(9), np.arange(9)) == 2, B, 0.0)
    L2 = lc.dependency_chain_length(B2)
    assert L2 == 5                                        # 8 > 6 > 4 > 2 > 0
    exact2 = lc.delta_attention(A, B2, V, beta)
    assert lc.max_abs_error(lc.neumann_terms(A, B2, V, L2, beta), exact2) < 1e-12
    assert lc.max_abs_error(lc.neumann_terms(A, B2, V, L2 - 1, beta), exact2) > 1e-9
    assert lc.dependency_chain_length(np.zeros((4, 4))) == 1
    with pytest.raises(ValueError, match="terms"):
        lc.neumann_terms(A, B, V, 0)
    with pytest.raises(ValueError, match="strictly lower"):
        lc.dependency_chain_length(A)


def test_mqa_shares_the_pseudo_values():
    """The pseudo-values need only K and V, so heads that share K and V share them: the work counted
    by deltaformer_work matches the operation counts of the parts, and MQA saves nearly half of it
    for many heads (the key-value part is about half of each head's work when d_k = d_v)."""
    n, d, H = 64, 16, 8
    w = lc.deltaformer_work(n, d, d, H, 1)
    assert w["kv_part"] == (n * n - n) // 2 * 2 * d and w["query_part"] == (n * n + n) // 2 * 2 * d
    assert w["unshared"] == H * (w["kv_part"] + w["query_part"])
    assert w["shared"] == w["kv_part"] + H * w["query_part"]
    assert lc.deltaformer_work(n, d, d, H, H)["saved"] == 0
    assert 0.4 < w["saved"] < 0.5 * (1 - 1 / H) + 1e-12
    with pytest.raises(ValueError, match="kv_heads must divide"):
        lc.deltaformer_work(n, d, d, 8, 3)


def test_neumann_errors_tabulates_the_truncations():
    """neumann_errors(A, B, V, beta) is the error of every truncation 1..L against the solve, L the
    longest dependency chain by default: the last is round-off (< 1e-12 on O(1) outputs), the one
    before it is not (> 1e-9), and each entry is neumann_terms' own error (same sums, exactly)."""
    Q, K, V, beta = case(n=9, scale=0.4)
    A, B = lc.deltaformer_matrices(Q, K, normalize=True)
    errs = lc.neumann_errors(A, B, V, beta)
    exact = lc.delta_attention(A, B, V, beta)
    assert errs.shape == (9,) and errs[-1] < 1e-12 and errs[-2] > 1e-9, errs
    assert all(e == lc.max_abs_error(lc.neumann_terms(A, B, V, m + 1, beta), exact)
               for m, e in enumerate(errs))
    assert lc.neumann_errors(A, B, V, beta, max_terms=3).tolist() == errs[:3].tolist()
    with pytest.raises(ValueError, match="max_terms"):
        lc.neumann_errors(A, B, V, beta, max_terms=0)
