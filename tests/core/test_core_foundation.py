"""The foundation's references against brute force, and the shared validation/check helpers."""
import numpy as np
import pytest

import lattn_core as lc


def brute_softmax_attention(Q, K, V):
    """Definition, one output at a time, with Python floats (independent of lattn_core's code)."""
    n = Q.shape[0]
    out = np.zeros((n, V.shape[1]))
    for t in range(n):
        w = np.array([np.exp(Q[t] @ K[j]) for j in range(t + 1)])
        out[t] = (w[:, None] * V[: t + 1]).sum(0) / w.sum()
    return out


@pytest.mark.parametrize("n", [1, 2, 7, 64, 200])
def test_softmax_forms_match_brute_force(n):
    rng = np.random.default_rng(n)
    d_k, d_v = 5, 3
    Q, K = rng.normal(size=(n, d_k)) * 0.5, rng.normal(size=(n, d_k)) * 0.5
    V = rng.normal(size=(n, d_v))
    ref = brute_softmax_attention(Q, K, V)
    # float64 round-off on O(n) sums of O(1) terms: 1e-12 is ~1e4 ulps of headroom.
    lc.check_close("softmax_attention = definition", lc.softmax_attention(Q, K, V), ref, 1e-12)
    if n <= 64:  # the recurrence is O(n^2) Python steps
        lc.check_close("recurrent = definition", lc.softmax_attention_recurrent(Q, K, V), ref, 1e-12)


def test_softmax_is_stable_for_large_scores():
    rng = np.random.default_rng(0)
    Q, K, V = rng.normal(size=(9, 4)) * 40, rng.normal(size=(9, 4)) * 40, rng.normal(size=(9, 2))
    a = lc.softmax_attention(Q, K, V)
    b = lc.softmax_attention_recurrent(Q, K, V)
    assert np.all(np.isfinite(a))
    lc.check_close("stable forms agree at scores ~1e3", a, b, 1e-10)


@pytest.mark.parametrize("fn", [lc.softmax_attention, lc.softmax_attention_recurrent])
def test_bad_inputs_raise_value_error(fn):
    rng = np.random.default_rng(1)
    Q, K, V = rng.normal(size=(4, 3)), rng.normal(size=(4, 3)), rng.normal(size=(4, 2))
    with pytest.raises(ValueError, match=r"Q must have shape \(4, 3\)"):
        fn(Q[:, :2], K, V)
    with pytest.raises(ValueError, match=r"V must have shape \(4, d_v\)"):
        fn(Q, K, V[:3])
    with pytest.raises(ValueError, match=r"K must have shape \(n, d_k\) \(2-D\)"):
        fn(Q, K[None], V)
    bad = Q.copy(); bad[1, 1] = np.nan
    with pytest.raises(ValueError, match="Q contains NaN"):
        fn(bad, K, V)
    bad = V.copy(); bad[0, 0] = np.inf
    with pytest.raises(ValueError, match="V contains inf"):
        fn(Q, K, bad)


def test_gate_and_chunk_validation():
    with pytest.raises(ValueError, match=r"gamma must lie in \(0, 1\]"):
        lc.check_gate([0.5, 0.0], "gamma", ("n",))
    with pytest.raises(ValueError, match=r"gamma must have shape \(3,\)"):
        lc.check_gate([0.5, 0.5], "gamma", (3,))
    assert lc.check_gate([1.0, 0.25], "gamma", (2,)).dtype == np.float64
    with pytest.raises(ValueError, match="beta must lie in"):
        lc.check_gate([2.5], "beta", (1,), high=2.0)
    for bad in (0, -3, 2.5, True, "4"):
        with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
            lc.check_chunk_size(bad)
    assert lc.check_chunk_size(5) == 5


def test_check_helpers_can_fail():
    ok = lc.check_close("same", np.ones(3), np.ones(3) + 1e-14, 1e-12)
    assert ok.passed and "✓" in repr(ok)
    with pytest.raises(AssertionError, match="✗"):
        lc.check_close("different", np.ones(3), np.ones(3) + 1e-3, 1e-6)
    r = lc.check_close("shown failing", [1.0], [2.0], 1e-3, raise_on_fail=False)
    assert not r.passed and r.error == pytest.approx(1.0)
    assert lc.check_close("nan never passes", [np.nan], [1.0], 1.0, raise_on_fail=False).passed is False
    import sympy as sp
    x, y = sp.symbols("x y")
    assert lc.check_symbolic("(x+y)^2", (x + y) ** 2, x**2 + 2 * x * y + y**2).passed
    with pytest.raises(AssertionError):
        lc.check_symbolic("wrong", (x + y) ** 2, x**2 + y**2)
    A = sp.Matrix(2, 2, sp.symbols("a:4"))
    assert lc.check_symbolic("A A^-1 = I", A * A.inv(), sp.eye(2)).passed


def test_masks():
    M, Mm = lc.causal_mask(4), lc.strict_causal_mask(4)
    assert M.sum() == 10 and Mm.sum() == 6 and np.all(M - Mm == np.eye(4))
    with pytest.raises(ValueError, match="n must be a positive integer"):
        lc.causal_mask(0)


def test_gpu_dtype_matches_the_device():
    import torch
    from lattn_core.notebook import gpu_dtype
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8:
        assert gpu_dtype() is torch.bfloat16
    else:  # no GPU, or one without bf16 tensor cores (a Colab T4)
        assert gpu_dtype() is torch.float16


def test_complex_input_is_rejected():
    """Complex input raises (it used to lose its imaginary part with only a warning), also when the
    imaginary part is zero: the references are real, and a complex dtype is a caller's mistake."""
    rng = np.random.default_rng(2)
    Q, K, V = rng.normal(size=(4, 3)), rng.normal(size=(4, 3)), rng.normal(size=(4, 2))
    with pytest.raises(ValueError, match=r"^x must be real: got a complex array"):
        lc.as_array(np.array([1.0 + 2.0j]), "x", (1,))
    with pytest.raises(ValueError, match=r"^Q must be real: got a complex array"):
        lc.softmax_attention(Q + 0j, K, V)
    with pytest.raises(ValueError, match=r"^gamma must be real"):
        lc.decay_attention_recurrent(Q, K, V, np.full(4, 0.5 + 0.1j))
    with pytest.raises(ValueError, match=r"^lam must be real"):
        lc.check_positive(1 + 1j, "lam", ())
    assert lc.as_array([1, 2], "x", (2,)).dtype == np.float64      # integers still convert


def test_as_array_of_any_shape_and_check_int():
    assert lc.as_array(np.ones((2, 3, 4)), "S", None).shape == (2, 3, 4)
    with pytest.raises(ValueError, match="S contains NaN"):
        lc.as_array(np.full((2, 2), np.nan), "S", None)
    with pytest.raises(ValueError, match="S must be non-empty"):
        lc.as_array(np.ones((0, 2)), "S", None)
    assert lc.check_int(3, "n") == 3 and lc.check_int(np.int64(0), "t", 0) == 0
    for bad in (0, 1.5, True, "2", None):
        with pytest.raises(ValueError, match=r"^n must be an integer >= 1; got"):
            lc.check_int(bad, "n")


def test_check_close_tolerance_must_be_a_positive_real():
    for tol in (0.0, -1e-3, 1e-3j, "1e-3", True):
        with pytest.raises(ValueError, match=r"^tol must be a positive number"):
            lc.check_close("x", [1.0], [1.0], tol)
