"""Every identity stated in chapters 0 and 1, checked again (so a regression fails CI)."""
import math

import numpy as np
import pytest
import sympy as sp

import lattn_core as lc


# ---------------------------------------------------------------- chapter 0: RNNs and retrieval

def test_linear_rnn_unrolls_symbolically():
    a, b, h0 = sp.symbols("a b h_0")
    xs = sp.symbols("x_1:7")
    h = h0
    for t, x in enumerate(xs, start=1):
        h = a * h + b * x
        closed = a**t * h0 + sum(a**(t - j) * b * xs[j - 1] for j in range(1, t + 1))
        lc.check_symbolic(f"unrolled linear RNN, t={t}", h, closed)


@pytest.mark.parametrize("n,a,b", [(1, 0.5, 1.0), (17, 0.9, -0.3), (300, 0.99, 2.0), (64, 1.0, 1.0)])
def test_linear_rnn_unrolls(n, a, b):
    rng = np.random.default_rng(n)
    x, h0 = rng.normal(size=(n, 4)), rng.normal(size=4)
    # Brute-force definition of the unrolled sum, term by term.
    brute = np.array([a**t * h0 + sum(a**(t - j) * b * x[j - 1] for j in range(1, t + 1))
                      for t in range(1, n + 1)])
    # float64 sums of <= 300 O(1) terms: round-off ~1e-13; 1e-10 is ample.
    lc.check_close("loop = definition", lc.linear_rnn(x, a, b, h0), brute, 1e-10)
    lc.check_close("matrix product = definition", lc.linear_rnn_unrolled(x, a, b, h0), brute, 1e-10)


def test_linear_rnn_without_decay_is_running_sum():
    x = np.random.default_rng(3).normal(size=(50, 3))
    lc.check_close("a=1 is cumsum", lc.linear_rnn(x, 1.0), np.cumsum(x, axis=0), 1e-12)


@pytest.mark.parametrize("a", [0.5, 0.9, 0.99, 1.02])
def test_vanishing_gradient_matches_power(a):
    Ts = [1, 2, 10, 100]
    grads = np.array([lc.rnn_input_gradient(a, T, b=0.7) for T in Ts])
    # Same float64 multiplications in another order: relative error of a few ulps per step.
    lc.check_close(f"autograd = a^(T-1) b for a={a}", grads, 0.7 * a ** (np.array(Ts) - 1.0), 1e-12,
                   relative=True)


def test_vanishing_product_value_and_tanh_is_smaller():
    lc.check_close("0.9^100 = exp(100 log 0.9)", 0.9**100, math.exp(100 * math.log(0.9)), 1e-18)
    assert 2e-5 < 0.9**100 < 3e-5
    assert lc.rnn_input_gradient(0.9, 50, nonlinearity="tanh") <= lc.rnn_input_gradient(0.9, 50)


def test_attention_lookup_sharpens():
    keys = np.eye(4)
    values = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])
    query = np.array([0.1, 0.9, 0.2, 0.0])
    w_prev = 0.0
    for tau in (2.0, 1.0, 0.3, 0.1, 0.05):
        out, w = lc.attention_lookup(query, keys, values, tau)
        lc.check_close("weights sum to 1", w.sum(), 1.0, 1e-14)
        assert w.argmax() == 1 and w[1] > w_prev  # sharper as the temperature falls
        w_prev = w[1]
    # tau = 0.05: the runner-up trails by 14 nats, weight ~1e-6.
    lc.check_close("sharp lookup returns the closest key's value", out, values[1], 1e-5)


def test_all_positions_at_once_equals_lookups():
    rng = np.random.default_rng(5)
    Q, K = rng.normal(size=(2, 40, 6)) * 0.5
    V = rng.normal(size=(40, 3))
    rows = np.stack([lc.attention_lookup(Q[t], K[: t + 1], V[: t + 1])[0] for t in range(40)])
    lc.check_close("matrix form = per-position lookups", lc.softmax_attention(Q, K, V), rows, 1e-12)


@pytest.mark.parametrize("call,match", [
    (lambda: lc.linear_rnn(np.ones(5), 0.9), r"x must have shape \(n, d\)"),
    (lambda: lc.linear_rnn(np.ones((5, 2)), np.nan), r"a contains NaN"),
    (lambda: lc.linear_rnn(np.ones((5, 2)), 0.9, h0=np.ones(3)), r"h0 must have shape \(2,\)"),
    (lambda: lc.rnn_input_gradient(0.9, 0), r"T must be a positive integer"),
    (lambda: lc.rnn_input_gradient(0.9, 5, nonlinearity="relu"), r"nonlinearity must be"),
    (lambda: lc.attention_lookup(np.ones(3), np.ones((4, 2)), np.ones((4, 1))), r"q must have shape \(2,\)"),
    (lambda: lc.attention_lookup(np.ones(2), np.ones((4, 2)), np.ones((4, 1)), 0.0), r"temperature must lie in"),
])
def test_chapter0_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---------------------------------------------------------------- chapter 1: softmax attention

def _qkv(n, d_k=5, d_v=3, seed=0, scale=0.5):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d_k)) * scale, rng.normal(size=(n, d_k)) * scale, rng.normal(size=(n, d_v))


def test_three_softmax_forms_agree():
    """recurrent == parallel == chunkwise for n = 1..200, d_k != d_v, random chunk sizes."""
    rng = np.random.default_rng(2024)
    for n in range(1, 201):
        Q, K, V = _qkv(n, seed=n)
        par = lc.softmax_attention(Q, K, V)
        # float64, O(n) terms each <= 1 after the max shift: 1e-12 is ~1e4 ulps.
        if n <= 60 or n % 20 == 0:  # the recurrence is O(n^2) Python steps; sample the long ones
            lc.check_close(f"recurrent = parallel, n={n}", lc.softmax_attention_recurrent(Q, K, V), par, 1e-12)
        sizes = {n, int(rng.integers(2, 2 * n + 2))} | ({1} if n <= 40 else set())  # C=1 is O(n^2) steps
        for C in sorted(sizes):
            lc.check_close(f"chunkwise(C={C}) = parallel, n={n}",
                           lc.softmax_attention_chunkwise(Q, K, V, chunk_size=C), par, 1e-12)


def test_chunkwise_stable_for_large_scores():
    Q, K, V = _qkv(50, scale=30.0, seed=9)   # scores in the hundreds
    out = lc.softmax_attention_chunkwise(Q, K, V, chunk_size=7)
    assert np.all(np.isfinite(out))
    lc.check_close("chunkwise = parallel at large scores", out, lc.softmax_attention(Q, K, V), 1e-10)


def test_numerator_rmsnorm_cancels_denominator():
    Q, K, V = _qkv(30, seed=4)
    num = lc.softmax_attention_numerator(Q, K, V)
    den = lc.softmax_attention_numerator(Q, K, np.ones((30, 1)))
    O = lc.softmax_attention(Q, K, V)
    # Brute-force numerator from its definition.
    brute = np.array([sum(np.exp(Q[t] @ K[j]) * V[j] for j in range(t + 1)) for t in range(30)])
    lc.check_close("numerator = definition", num, brute, 1e-12, relative=True)
    lc.check_close("numerator / denominator = softmax attention", num / den, O, 1e-12)
    lc.check_close("RMSNorm cancels the denominator", lc.rms_norm(num), lc.rms_norm(O), 1e-12)
    lc.check_close("rms_norm has unit RMS rows", np.sqrt((lc.rms_norm(O) ** 2).mean(1)), np.ones(30), 1e-14)


def test_rescaling_identity_symbolic():
    s = sp.symbols("s_1:5", real=True)
    v = sp.symbols("v_1:5", real=True)
    m, m2 = sp.symbols("m m2", real=True)
    y = lambda ref, idx: sum(sp.exp(s[i] - ref) * v[i] for i in idx)
    z = lambda ref, idx: sum(sp.exp(s[i] - ref) for i in idx)
    lc.check_symbolic("rescale numerator", sp.exp(m - m2) * y(m, range(4)), y(m2, range(4)))
    lc.check_symbolic("rescale denominator", sp.exp(m - m2) * z(m, range(4)), z(m2, range(4)))
    plain = sum(sp.exp(s[i]) * v[i] for i in range(4)) / sum(sp.exp(s[i]) for i in range(4))
    lc.check_symbolic("ratio independent of reference", y(m, range(4)) / z(m, range(4)), plain)
    # merging two blocks' partial states (each with its own reference) gives the full sums
    merged = sp.exp(m - m2) * y(m, [0, 1]) + y(m2, [2, 3])
    lc.check_symbolic("block merge", merged, y(m2, range(4)))
    # and a wrong identity is rejected (the check can fail)
    with pytest.raises(AssertionError):
        lc.check_symbolic("wrong rescale", sp.exp(m2 - m) * y(m, range(4)), y(m2, range(4)))


@pytest.mark.parametrize("n,C", [(1, 1), (10, 3), (200, 32), (256, 64), (1000, 7), (5, 100)])
def test_causal_block_mask(n, C):
    vis = lc.causal_block_mask(n, C)
    N = math.ceil(n / C)
    assert vis.shape == (N, N)
    assert np.array_equal(vis, np.tril(np.ones((N, N), dtype=bool)))
    # brute force: tile (i, j) is needed iff some key in block j is <= some query in block i
    need = np.array([[any(kk <= qq for qq in range(i * C, min(i * C + C, n))
                          for kk in range(j * C, min(j * C + C, n))) for j in range(N)] for i in range(N)])
    assert np.array_equal(vis, need)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8", None])
def test_chunkwise_bad_chunk_size(bad):
    Q, K, V = _qkv(8)
    with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
        lc.softmax_attention_chunkwise(Q, K, V, chunk_size=bad)


@pytest.mark.parametrize("fn", [lc.softmax_attention_chunkwise, lc.softmax_attention_numerator])
def test_chapter1_bad_qkv(fn):
    Q, K, V = _qkv(6, d_k=4, d_v=2)
    with pytest.raises(ValueError, match=r"Q must have shape \(6, 4\)"):
        fn(Q[:, :3], K, V)
    with pytest.raises(ValueError, match=r"V must have shape \(6, d_v\)"):
        fn(Q, K, V[:5])
    bad = V.copy(); bad[0, 0] = np.inf
    with pytest.raises(ValueError, match="V contains inf"):
        fn(Q, K, bad)


def test_rms_norm_bad_input():
    with pytest.raises(ValueError, match=r"X must have shape \(n, d\)"):
        lc.rms_norm(np.ones(3))
    with pytest.raises(ValueError, match="row of zeros"):
        lc.rms_norm(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="eps must be"):
        lc.rms_norm(np.ones((2, 3)), eps=-1.0)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        lc.causal_block_mask(0, 4)


# ------------------------------------------------- chapters 0 and 1: the experiments' claims

def test_token_one_term_and_the_remembering_experiment():
    """Chapter 0's experiment, as the notebook runs it (seed 42): token 1's term in h_n is
    a^(n-1) v_1, its share of the RNN state at n = 1024 is below 1e-3 for a = 0.9 and 0.99, and
    attention's weight on token 1 (query = its key, temperature 0.1) stays above one half."""
    rng = np.random.default_rng(42)
    n_max, d = 1024, 32
    keys = rng.normal(size=(n_max, d))
    keys /= np.linalg.norm(keys, axis=1, keepdims=True)
    vals = rng.normal(size=(n_max, d))
    contrib = lc.linear_rnn_unrolled(vals[:50], 0.9)[-1] - lc.linear_rnn_unrolled(vals[1:50], 0.9)[-1]
    # float64 differences of O(1) sums: round-off ~1e-15.
    lc.check_close("token 1's term in h_50 is a^49 v_1", contrib, 0.9 ** 49 * vals[0], 1e-12)
    for a in (0.9, 0.99):
        share = np.linalg.norm(a ** (n_max - 1) * vals[0]) / np.linalg.norm(lc.linear_rnn(vals, a)[-1])
        assert share < 1e-3, (a, share)
    lengths = np.unique(np.geomspace(1, n_max, 30).astype(int))
    weights = [lc.attention_lookup(keys[0], keys[:m], vals[:m], 0.1)[1][0] for m in lengths]
    assert min(weights) > 0.5, weights


def test_peak_memory_full_quadratic_blocked_one_row_per_token():
    """Chapter 1's experiment: the full form's peak allocation grows like n^2 (log-log slope 2 within
    0.1: only its O(n d) terms pull it away), the blocked form's by one float64 output row (8 d_v
    bytes) per extra token (2%: allocator bookkeeping)."""
    from lattn_core.notebook import peak_bytes
    rng = np.random.default_rng(0)
    ns, d = np.array([256, 512, 1024, 2048]), 16
    full, block = [], []
    for n in ns:
        Q, K, V = (rng.normal(size=(n, d)) / d ** 0.25 for _ in range(3))
        full.append(peak_bytes(lc.softmax_attention, Q, K, V))
        block.append(peak_bytes(lc.softmax_attention_chunkwise, Q, K, V, chunk_size=64))
    slope = np.polyfit(np.log(ns), np.log(full), 1)[0]
    lc.check_close("full form: peak memory slope", slope, 2.0, 0.1)
    per_token = (block[-1] - block[-2]) / (ns[-1] - ns[-2])
    lc.check_close("blocked form: bytes per extra token", per_token, 8.0 * d, 0.02, relative=True)


def test_peak_bytes_measures_an_allocation():
    from lattn_core.notebook import peak_bytes
    nbytes = peak_bytes(np.ones, (1000, 1000))          # one float64 array of 8 MB
    assert 8_000_000 <= nbytes < 8_100_000, nbytes


@pytest.mark.parametrize("path,start,stop", [
    ("kernels.common.softmax:online_softmax_step", "m_new = tl.maximum", "return acc"),
    ("kernels.gla.march:_fwd_kernel", "# q goes to the tensor cores", "o_c += tl.dot"),
    ("kernels.gla.march:_fwd_kernel", "# state update", "S += tl.dot(tl.trans(round_operand(k_t"),
    ("kernels.flash.backward:_dq_key_blocks", "s = tl.dot(q, tl.trans(k)", "dgq += tl.sum(ds, 1)")])
def test_chapter_kernel_excerpts_exist_and_fit(path, start, stop, capsys):
    """The kernel excerpts chapters 1, 2 and 7 print: their markers are in the source, and the
    printed excerpt, heading included, fits the book's column."""
    import importlib
    from lattn_core.checks import LINE_WIDTH
    from lattn_core.notebook import show_source
    module, name = path.split(":")
    show_source(getattr(importlib.import_module(module), name), start, stop)
    out = capsys.readouterr().out.splitlines()
    assert len(out) > 2 and max(map(len, out)) <= LINE_WIDTH, out
