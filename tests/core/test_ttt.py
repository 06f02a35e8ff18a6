"""Test-time training (chapter 4): each loss's autodiff step is the recurrence the article's table names."""
import numpy as np
import pytest
import sympy as sp
import torch

import lattn_core as lc

# Autodiff in float64 on O(n) accumulations of O(1) terms: round-off ~1e-14; 1e-10 is ample
# headroom while any wrong factor (eta vs eta/2, a missing sign) shows up at >= 1e-2.
TOL = 1e-10


def make(n, d_k=4, d_v=3, seed=0):
    rng = np.random.default_rng(seed)
    Q = rng.normal(size=(n, d_k))
    K = rng.normal(size=(n, d_k))
    K /= np.linalg.norm(K, axis=1, keepdims=True)
    V = rng.normal(size=(n, d_v))
    return Q, K, V, rng


def decay_closed_form(Q, K, V, gamma, scale=1.0):
    """Independent closed form: o_i = sum_{j<=i} gamma^(i-j) (q_i . k_j) scale v_j."""
    n = Q.shape[0]
    i, j = np.indices((n, n))
    G = np.where(j <= i, gamma ** np.maximum(i - j, 0), 0.0)
    return ((Q @ K.T) * G) @ (scale * V)


@pytest.mark.parametrize("eta", [1.0, 0.3])
def test_dot_loss_gives_linear_attention(eta):
    Q, K, V, _ = make(20)
    lc.check_close("TTT(dot) = eta * linear attention", lc.ttt_recurrent(Q, K, V, "dot", eta),
                   decay_closed_form(Q, K, V, 1.0, eta), TOL)


@pytest.mark.parametrize("eta,lam", [(1.0, 0.1), (0.5, 0.4)])
def test_dot_l2_loss_gives_decay(eta, lam):
    # S_t = (1 - eta lam) S_{t-1} + eta v_t k_t^T: RetNet's decay gamma = 1 - eta lam (article: eta = 1, lam = 1 - gamma)
    Q, K, V, _ = make(25, seed=1)
    lc.check_close("TTT(dot+l2) = decay attention", lc.ttt_recurrent(Q, K, V, "dot+l2", eta, lam=lam),
                   decay_closed_form(Q, K, V, 1 - eta * lam, eta), TOL)


def test_squared_loss_gives_deltanet():
    Q, K, V, rng = make(30, seed=2)
    eta = rng.uniform(0.1, 2.0, size=30)
    lc.check_close("TTT(squared, eta) = DeltaNet(beta = eta)", lc.ttt_recurrent(Q, K, V, "squared", eta),
                   lc.deltanet_recurrent(Q, K, V, eta), TOL)


def test_squared_frobenius_loss_gives_comba_and_gdn():
    Q, K, V, rng = make(30, seed=3)
    eta = rng.uniform(0.1, 1.0, size=30)
    lam = rng.uniform(0.0, 0.5, size=30)
    gamma = 1 - eta * lam
    got = lc.ttt_recurrent(Q, K, V, "squared+frobenius", eta, lam=lam)
    lc.check_close("TTT(squared+frob) = Comba(gamma = 1 - eta lam, eta)", got, lc.comba_recurrent(Q, K, V, gamma, eta), TOL)
    K2, V2, alpha, beta = lc.comba_to_gated_deltanet(K, V, gamma, eta)
    lc.check_close("... = Gated DeltaNet after the Comba map", got, lc.gated_deltanet_recurrent(Q, K2, V2, alpha, beta),
                   1e-9, relative=True)


@pytest.mark.parametrize("loss", lc.TTT_LOSSES)
def test_symbolic_step_matches_table(loss):
    S_new, s = lc.ttt_symbolic_step(loss)
    S, k, v, eta, lam = s["S"], s["k"], s["v"], s["eta"], s["lam"]
    expected = {
        "dot": S + eta * v * k.T,
        "dot+l2": (1 - eta * lam) * S + eta * v * k.T,
        "squared": S + eta * (v - S * k) * k.T,
        "squared+frobenius": (1 - eta * lam) * S + eta * (v - S * k) * k.T,
    }[loss]
    lc.check_symbolic(f"SymPy step of {loss}", S_new, expected)
    if loss == "squared":  # and it is the erase-then-write form S (I - eta k k^T) + eta v k^T
        lc.check_symbolic("erase-then-write", S_new, S * (sp.eye(2) - eta * k * k.T) + eta * v * k.T)


def test_symbolic_step_rejects_a_wrong_recurrence():
    # the check can fail: the squared loss does NOT give the linear-attention update
    S_new, s = lc.ttt_symbolic_step("squared")
    res = lc.check_symbolic("wrong", S_new, s["S"] + s["eta"] * s["v"] * s["k"].T, raise_on_fail=False)
    assert not res.passed


def test_custom_callable_loss_matches_named_loss():
    Q, K, V, _ = make(12, seed=4)
    custom = lambda S, k, v: 0.5 * ((S @ k - v) ** 2).sum()
    lc.check_close("callable = 'squared'", lc.ttt_recurrent(Q, K, V, custom, 0.7),
                   lc.ttt_recurrent(Q, K, V, "squared", 0.7), TOL)


def test_momentum_matches_explicit_loop():
    n = 25
    Q, K, V, rng = make(n, seed=5)
    eta = rng.uniform(0.1, 0.5, size=n)
    mu = rng.uniform(0.0, 0.9, size=n)
    S = np.zeros((V.shape[1], K.shape[1]))
    Z = np.zeros_like(S)                     # the momentum buffer Z_t
    out = []
    for t in range(n):
        grad = np.outer(S @ K[t] - V[t], K[t])   # hand gradient of 1/2||Sk - v||^2 (independent of autodiff)
        Z = mu[t] * Z - eta[t] * grad
        S = S + Z
        out.append(S @ Q[t])
    got, S_fin = lc.ttt_recurrent(Q, K, V, "squared", eta, momentum=mu, return_state=True)
    lc.check_close("Titans momentum = loop", got, np.array(out), TOL)
    lc.check_close("final state", S_fin, S, TOL)
    _, states = lc.ttt_recurrent(Q, K, V, "squared", eta, momentum=mu, return_states=True)
    lc.check_close("trajectory ends at the final state", states[-1], S, TOL)
    lc.check_close("trajectory reads give the outputs", np.einsum("tij,tj->ti", states, Q), got, TOL)
    # momentum changes the result (the test is not vacuous)
    assert np.max(np.abs(got - lc.ttt_recurrent(Q, K, V, "squared", eta))) > 1e-3


def test_momentum_with_dot_loss_is_a_second_order_linear_recurrence():
    # grad = -v k^T does not depend on S, so Z_t = sum_j mu^(t-j) eta v_j k_j^T and
    # S_t = sum_{j<=t} (1 - mu^(t-j+1))/(1 - mu) eta v_j k_j^T.
    n, mu, eta = 15, 0.6, 0.5
    Q, K, V, _ = make(n, seed=6)
    i, j = np.indices((n, n))
    W = np.where(j <= i, (1 - mu ** (i - j + 1)) / (1 - mu), 0.0)
    lc.check_close("momentum closed form", lc.ttt_recurrent(Q, K, V, "dot", eta, momentum=mu),
                   ((Q @ K.T) * W) @ (eta * V), TOL)


@pytest.mark.parametrize("b", [1, 3, 4, 50])
def test_minibatch_matches_explicit_loop(b):
    n = 17
    Q, K, V, rng = make(n, seed=7)
    eta = rng.uniform(0.1, 1.0, size=n)
    S = np.zeros((V.shape[1], K.shape[1]))
    out = []
    for t in range(n):
        if t % b == 0:
            S0 = S.copy()
        S = S + eta[t] * np.outer(V[t] - S0 @ K[t], K[t])   # gradient at the block-start state
        out.append(S @ Q[t])
    lc.check_close(f"mini-batch b={b} = loop", lc.ttt_recurrent(Q, K, V, "squared", eta, batch_size=b),
                   np.array(out), TOL)


def test_minibatch_one_is_deltanet_and_full_batch_from_zero_is_linear_attention():
    n = 16
    Q, K, V, _ = make(n, seed=8)
    lc.check_close("b=1 = DeltaNet", lc.ttt_recurrent(Q, K, V, "squared", batch_size=1),
                   lc.deltanet_recurrent(Q, K, V), TOL)
    # one block covering everything: every gradient is taken at S = 0, i.e. -v k^T: linear attention
    lc.check_close("b=n = linear attention", lc.ttt_recurrent(Q, K, V, "squared", batch_size=n),
                   decay_closed_form(Q, K, V, 1.0), TOL)


def test_lms_widrow_hoff_is_squared_loss_sgd():
    # LMS adaptive filter (Widrow & Hoff 1960): weights w, input x_t, desired d_t, step mu:
    #   e_t = d_t - w . x_t ;  w <- w + mu e_t x_t.   With d_v = 1, S = w^T: the squared-loss TTT.
    n, d, mu = 40, 5, 0.3
    rng = np.random.default_rng(9)
    X = rng.normal(size=(n, d)) / np.sqrt(d)
    w_true = rng.normal(size=d)
    D = X @ w_true
    w = np.zeros(d)
    preds = []
    for t in range(n):
        e = D[t] - w @ X[t]
        w = w + mu * e * X[t]
        preds.append(w @ X[t])
    O, S = lc.ttt_recurrent(X, X, D[:, None], "squared", mu, return_state=True)
    lc.check_close("LMS weights = TTT state", S[0], w, TOL)
    lc.check_close("LMS post-update predictions", O[:, 0], np.array(preds), TOL)


def test_eta_absorbed_into_k_and_v():
    # beta (S k - v) k^T = (S (sqrt(beta) k) - sqrt(beta) v)(sqrt(beta) k)^T: DeltaNet with beta equals
    # DeltaNet with beta = 1 on k' = sqrt(beta) k, v' = sqrt(beta) v, q unchanged.
    n = 30
    Q, K, V, rng = make(n, seed=10)
    beta = rng.uniform(0.1, 1.0, size=n)
    r = np.sqrt(beta)[:, None]
    lc.check_close("DeltaNet(beta) = DeltaNet(sqrt(beta) k, sqrt(beta) v)", lc.deltanet_recurrent(Q, K, V, beta),
                   lc.deltanet_recurrent(Q, r * K, r * V), TOL)
    lc.check_close("also through TTT", lc.ttt_recurrent(Q, K, V, "squared", beta),
                   lc.ttt_recurrent(Q, r * K, r * V, "squared", 1.0), TOL)
    s = sp.symbols("s1 s2")
    k1, v1, b = sp.symbols("k v beta", positive=True)
    lhs = b * (s[0] * k1 - v1) * k1
    rhs = (s[0] * sp.sqrt(b) * k1 - sp.sqrt(b) * v1) * sp.sqrt(b) * k1
    lc.check_symbolic("scalar absorption", lhs, rhs)


def test_autodiff_gradient_is_really_used():
    # a loss with no closed form in the table: Huber-like smooth loss; compare with finite differences
    Q, K, V, _ = make(3, seed=11)
    loss = lambda S, k, v: torch.log(torch.cosh(S @ k - v)).sum()
    O, S = lc.ttt_recurrent(Q[:1], K[:1], V[:1], loss, 1.0, return_state=True)
    # one step from zero: grad = tanh(0 - v) k^T, so S_1 = tanh(v) k^T
    lc.check_close("log-cosh step", S, np.outer(np.tanh(V[0]), K[0]), TOL)


def test_bad_inputs():
    Q, K, V, _ = make(5)
    with pytest.raises(ValueError, match="loss must be"):
        lc.ttt_recurrent(Q, K, V, "l1")
    with pytest.raises(ValueError, match="eta must"):
        lc.ttt_recurrent(Q, K, V, "squared", -1.0)
    with pytest.raises(ValueError, match="eta must"):
        lc.ttt_recurrent(Q, K, V, "squared", np.ones(4))
    with pytest.raises(ValueError, match="lam must"):
        lc.ttt_recurrent(Q, K, V, "dot+l2", 1.0, lam=-0.1)
    with pytest.raises(ValueError, match="lam is only"):
        lc.ttt_recurrent(Q, K, V, "dot", 1.0, lam=0.1)
    with pytest.raises(ValueError, match="momentum must"):
        lc.ttt_recurrent(Q, K, V, "squared", momentum=1.0)
    with pytest.raises(ValueError, match="batch_size"):
        lc.ttt_recurrent(Q, K, V, "squared", batch_size=0)
    with pytest.raises(ValueError, match="cannot be combined"):
        lc.ttt_recurrent(Q, K, V, "squared", momentum=0.5, batch_size=2)
    with pytest.raises(ValueError, match="initial_state"):
        lc.ttt_recurrent(Q, K, V, initial_state=np.zeros((2, 2)))
    with pytest.raises(ValueError, match="K must"):
        lc.ttt_recurrent(Q, K[:, :, None], V)
    with pytest.raises(ValueError, match="loss must be"):
        lc.ttt_symbolic_step("huber")
    with pytest.raises(ValueError, match="d_k"):
        lc.ttt_symbolic_step("dot", d_k=0)


def test_regression_curve_compression_story():
    # squared loss, eta = 1, noiseless: SGD recovers the rule (error falls by orders of magnitude);
    # the unbounded dot loss does not (its state grows like t/d_k * W).
    sq = lc.ttt_regression_curve("squared", 1.0, n=150)
    dot = lc.ttt_regression_curve("dot", 1.0, n=150)
    assert sq.shape == (150,) and sq[-1] < 1e-4 * sq[0]
    assert dot[-1] > dot[20] > 1.0
    # and the curve is the state's error: at t = 1 from S_0 = 0 the state is eta (v_1 - 0) k_1^T,
    # identical for both losses (the gradients agree at S = 0)
    lc.check_close("first step identical", sq[0], dot[0], 1e-12)
    with pytest.raises(ValueError, match="n must"):
        lc.ttt_regression_curve(n=0)


# ------------------------------------------------------------------ a nonlinear model (chapter 4)

def test_mlp_autodiff_equals_hand_written_step():
    # ttt_model_recurrent asks autodiff; ttt_mlp_step is the chain rule by hand (ch4-mlp-step)
    Q, K, V, _ = make(30, d_k=5, d_v=3, seed=12)
    S0 = lc.ttt_mlp_init(5, 3, 7, seed=1)
    eta = np.linspace(0.05, 0.3, 30)
    O, (S1s, S2s) = lc.ttt_model_recurrent(Q, K, V, lc.ttt_mlp, S0, eta, return_states=True)
    S, outs = S0, []
    for t in range(30):
        S = lc.ttt_mlp_step(S, K[t], V[t], eta[t])
        outs.append(lc.ttt_mlp(S, Q[t]))
        lc.check_close(f"first layer after token {t}", S1s[t], S[0], TOL)
        lc.check_close(f"second layer after token {t}", S2s[t], S[1], TOL)
    lc.check_close("outputs f(S_t; q_t)", O, np.array(outs), TOL)
    # the model is really learning (not a vacuous comparison of two zero updates)
    assert np.abs(S1s[-1] - S0[0]).max() > 1e-2 and np.abs(S2s[-1]).max() > 1e-2


def test_mlp_step_by_finite_differences():
    # the hand-written gradient itself, against central differences of the loss (float64)
    rng = np.random.default_rng(13)
    S = (rng.normal(size=(6, 4)), rng.normal(size=(3, 6)))
    k, v = rng.normal(size=4), rng.normal(size=3)
    loss = lambda S1, S2: 0.5 * np.sum((lc.ttt_mlp((S1, S2), k) - v) ** 2)
    S1n, S2n = lc.ttt_mlp_step(S, k, v, 1.0)          # S - grad with eta = 1
    h = 1e-6
    for which, (W, Wn) in enumerate(zip(S, (S1n, S2n))):
        num = np.zeros_like(W)
        for idx in np.ndindex(W.shape):
            Wp, Wm = W.copy(), W.copy()
            Wp[idx] += h
            Wm[idx] -= h
            args_p = (Wp, S[1]) if which == 0 else (S[0], Wp)
            args_m = (Wm, S[1]) if which == 0 else (S[0], Wm)
            num[idx] = (loss(*args_p) - loss(*args_m)) / (2 * h)
        # central differences with h = 1e-6 on O(1) values: error ~1e-9
        lc.check_close(f"layer {which + 1} gradient", W - Wn, num, 1e-7)


def test_model_recurrent_with_linear_model_is_ttt_squared():
    Q, K, V, _ = make(20, seed=14)
    lin = lambda S, x: S[0] @ x
    lc.check_close("generic TTT with f = Sk is DeltaNet",
                   lc.ttt_model_recurrent(Q, K, V, lin, (np.zeros((3, 4)),), 0.6),
                   lc.deltanet_recurrent(Q, K, V, np.full(20, 0.6)), TOL)


def test_affine_defect_separates_linear_from_nonlinear_updates():
    rng = np.random.default_rng(15)
    k = rng.normal(size=4)
    k /= np.linalg.norm(k)
    v = rng.normal(size=3)
    step_lin = lambda S: S @ (np.eye(4) - 0.7 * np.outer(k, k)) + 0.7 * np.outer(v, k)
    assert lc.affine_defect(step_lin, rng.normal(size=(3, 4)), rng.normal(size=(3, 4))) < 1e-12
    S_a = lc.ttt_mlp_init(4, 3, 16, seed=2)
    S_b = tuple(rng.normal(size=W.shape) for W in S_a)
    assert lc.affine_defect(lambda S: lc.ttt_mlp_step(S, k, v, 0.1), S_a, S_b) > 1e-2
    # an affine map that is not linear (a constant term) has no defect either; a square does
    assert lc.affine_defect(lambda S: 2 * S + 1.0, np.ones(3), np.arange(3.0)) < 1e-12
    assert lc.affine_defect(lambda S: S * S, np.ones(3), np.arange(3.0)) > 1.0
    with pytest.raises(ValueError, match="same shapes"):
        lc.affine_defect(step_lin, np.zeros((3, 4)), np.zeros((3, 5)))


def test_nonlinear_regression_mlp_beats_every_linear_state():
    # chapter 4's claim: in-context regression of a nonlinear rule; the least-squares floor bounds
    # every linear state from below (by construction), and the two-layer state ends below it.
    for seed in range(3):
        r = lc.ttt_nonlinear_regression(seed=seed)
        assert r["mlp"].shape == r["linear"].shape == (400,)
        assert r["linear"].min() >= r["floor"] * (1 - 1e-9)
        assert r["mlp"][-50:].mean() < r["floor"]
    # with a linear rule the floor is zero up to round-off (the model class contains the rule):
    # a degenerate hidden rule of width 1 and tiny scale is nearly linear, floor ~ 0
    r = lc.ttt_nonlinear_regression(n=20, rule_scale=1e-4, rule_width=1, seed=0)
    assert r["floor"] < 1e-6


def test_nonlinear_bad_inputs():
    Q, K, V, _ = make(5)
    with pytest.raises(ValueError, match="initial_state"):
        lc.ttt_model_recurrent(Q, K, V, lc.ttt_mlp, np.zeros((3, 4)))
    with pytest.raises(ValueError, match="model"):
        lc.ttt_model_recurrent(Q, K, V, "mlp", lc.ttt_mlp_init(4, 3, 2))
    with pytest.raises(ValueError, match="d_v"):
        lc.ttt_model_recurrent(Q, K, V, lc.ttt_mlp, lc.ttt_mlp_init(4, 2, 2))
    with pytest.raises(ValueError, match="eta must"):
        lc.ttt_model_recurrent(Q, K, V, lc.ttt_mlp, lc.ttt_mlp_init(4, 3, 2), -1.0)
    with pytest.raises(ValueError, match="d_h"):
        lc.ttt_mlp_init(4, 3, 0)
    with pytest.raises(ValueError, match="n must"):
        lc.ttt_nonlinear_regression(n=0)


def test_mlp_helpers_reject_bad_input():
    """ttt_mlp, ttt_mlp_step and affine_defect check their NumPy inputs (NaN used to pass)."""
    S1, S2 = lc.ttt_mlp_init(3, 2, 4, seed=0)
    S2 = np.ones_like(S2)
    k, v = np.ones(3), np.ones(2)
    with pytest.raises(ValueError, match="X contains NaN"):
        lc.ttt_mlp((S1, S2), np.array([1.0, np.nan, 0.0]))
    with pytest.raises(ValueError, match="S1 contains inf"):
        lc.ttt_mlp((np.where(S1 > 0, np.inf, S1), S2), k)
    with pytest.raises(ValueError, match=r"X must have shape \(m, 3\)"):
        lc.ttt_mlp((S1, S2), np.ones((5, 4)))
    with pytest.raises(ValueError, match=r"S2 must have shape \(d_v, 4\)"):
        lc.ttt_mlp((S1, np.ones((2, 3))), k)
    with pytest.raises(ValueError, match=r"S must be a pair \(S1, S2\)"):
        lc.ttt_mlp(S1, k)
    with pytest.raises(ValueError, match="k contains NaN"):
        lc.ttt_mlp_step((S1, S2), np.full(3, np.nan), v, 0.1)
    with pytest.raises(ValueError, match="v contains inf"):
        lc.ttt_mlp_step((S1, S2), k, np.array([np.inf, 0.0]), 0.1)
    with pytest.raises(ValueError, match=r"v must have shape \(2,\)"):
        lc.ttt_mlp_step((S1, S2), k, np.ones(3), 0.1)
    for eta, match in ((np.nan, "eta contains NaN"), (-0.1, r"eta must lie in \(0, inf\)"),
                       (0.0, r"eta must lie in \(0, inf\)"), (1j, "eta must be real")):
        with pytest.raises(ValueError, match=match):
            lc.ttt_mlp_step((S1, S2), k, v, eta)
    step = lambda S: 2 * S                                                # noqa: E731
    with pytest.raises(ValueError, match="S_a contains NaN"):
        lc.affine_defect(step, np.full((2, 2), np.nan), np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"S_b\[1\] contains inf"):
        lc.affine_defect(step, (np.ones(2), np.ones(2)), (np.ones(2), np.full(2, np.inf)))
    with pytest.raises(ValueError, match="a contains NaN"):
        lc.affine_defect(step, np.ones(2), np.ones(2), a=np.nan)
    # the torch path (what ttt_model_recurrent differentiates) is unchanged
    t = torch.ones(3, dtype=torch.float64)
    assert lc.ttt_mlp((torch.as_tensor(S1), torch.as_tensor(S2)), t).shape == (2,)
