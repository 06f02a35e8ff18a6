"""Chapter 4 (test-time training): the notebook's checks and measured claims that tests/core/test_ttt.py
does not already hold, so that a regression fails CI and not only the notebook."""
import numpy as np
import sympy as sp
import torch

import lattn_core as lc

# float64 autodiff over <= 48 steps of O(1) terms: round-off ~1e-14; 1e-10 leaves headroom while a
# wrong factor shows up at >= 1e-2.
TOL = 1e-10


def _qkv(n=48, d_k=8, d_v=4, seed=0):
    rng = np.random.default_rng(seed)
    Q, K, V = (rng.normal(size=(n, d)) for d in (d_k, d_k, d_v))
    return Q, K / np.linalg.norm(K, axis=1, keepdims=True), V


def test_one_step_is_state_minus_autograd_gradient():
    rng = np.random.default_rng(1)
    S0, k, v = rng.normal(size=(3, 4)), rng.normal(size=4), rng.normal(size=3)
    S_t = torch.tensor(S0, requires_grad=True)
    (grad,) = torch.autograd.grad(lc.ttt_loss("squared", S_t, torch.tensor(k), torch.tensor(v)), S_t)
    _, S1 = lc.ttt_recurrent(np.eye(4)[:1], k[None], v[None], "squared", 1.0, initial_state=S0,
                             return_state=True)
    lc.check_close("step = S0 - grad", S1, S0 - grad.numpy(), 1e-14)
    lc.check_close("grad = (S0 k - v) k^T", grad.numpy(), np.outer(S0 @ k - v, k), 1e-14)


def test_table_rows_against_the_parallel_forms():
    # the notebook compares the first two rows with Chapters 2-3's parallel forms
    Q, K, V = _qkv()
    n, eta, lam = len(Q), 0.7, 0.2
    lc.check_close("dot = linear attention", lc.ttt_recurrent(Q, K, V, "dot", eta),
                   lc.linear_attention_parallel(Q, K, eta * V), TOL)
    lc.check_close("dot+l2 = decay", lc.ttt_recurrent(Q, K, V, "dot+l2", eta, lam=lam),
                   lc.decay_attention_parallel(Q, K, eta * V, np.full(n, 1 - eta * lam)), TOL)
    lc.check_close("minibatch m = n = linear attention", lc.ttt_recurrent(Q, K, V, "squared", batch_size=n),
                   lc.linear_attention_parallel(Q, K, V), TOL)


def test_sympy_gradient_is_outer_product():
    S_new, s = lc.ttt_symbolic_step("squared")
    grad = sp.simplify((s["S"] - S_new) / s["eta"])
    lc.check_symbolic("gradient = (Sk - v)k^T", grad, (s["S"] * s["k"] - s["v"]) * s["k"].T)


def test_compression_claims_at_the_default_setting():
    c = {name: lc.ttt_regression_curve(name, 1.0, lam=0.05 if "+" in name else 0.0, n=160)
         for name in lc.TTT_LOSSES}
    sq, dot, dot_l2, sq_l2 = c["squared"], c["dot"], c["dot+l2"], c["squared+frobenius"]
    assert sq[-1] < 1e-4 * sq[0] and dot[-1] > dot[0]
    assert dot_l2[-40:].max() < 0.05 * dot[-1] and dot_l2[-40:].min() > 1e3 * sq[-1]
    assert 1e3 * sq[-1] < sq_l2[-40:].min() < sq_l2[-40:].max() < 1.0


def test_momentum_helps_at_small_learning_rates():
    for eta in (0.1, 0.25):
        plain = lc.ttt_regression_curve("squared", eta, n=160)[-1]
        heavy = lc.ttt_regression_curve("squared", eta, momentum=0.5, n=160)[-1]
        assert heavy < plain, (eta, heavy, plain)


def test_smaller_learning_rates_tolerate_larger_minibatches():
    batches = [1, 2, 4, 8, 16, 32, 64]
    tolerated = {}
    for eta in (0.25, 0.5, 1.0):
        final = [lc.ttt_regression_curve("squared", eta, batch_size=b, n=256)[-1] for b in batches]
        tolerated[eta] = max(b for b, f in zip(batches, final) if f < 1e-2)
    assert tolerated[0.25] >= tolerated[0.5] >= tolerated[1.0] and tolerated[0.25] > tolerated[1.0]


def test_mlp_update_is_not_affine_while_deltanet_is():
    Q, K, V = _qkv()
    rng = np.random.default_rng(0)
    S_a = lc.ttt_mlp_init(8, 4, 16, seed=2)
    S_b = tuple(rng.normal(size=W.shape) for W in S_a)
    step_lin = lambda S: lc.ttt_recurrent(Q[:1], K[:1], V[:1], "squared", 0.1, initial_state=S,
                                          return_state=True)[1]
    assert lc.affine_defect(step_lin, S_a[1][:, :8], S_b[1][:, :8]) < 1e-12
    assert lc.affine_defect(lambda S: lc.ttt_mlp_step(S, K[0], V[0], 0.1), S_a, S_b) > 1e-2


def test_exercise_weighted_squared_loss():
    Q, K, V = _qkv()
    Dw = np.array([0.5, 1.0, 2.0, 0.25])
    weighted = lambda S, k, v: 0.5 * ((S @ k - v) ** 2 * torch.tensor(Dw)).sum()
    S, outs = np.zeros((4, 8)), []
    for t in range(len(Q)):
        S = S + 0.3 * np.diag(Dw) @ np.outer(V[t] - S @ K[t], K[t])
        outs.append(S @ Q[t])
    lc.check_close("weighted loss", lc.ttt_recurrent(Q, K, V, weighted, 0.3), np.array(outs), TOL)


def test_exercise_minibatch_cannot_change_the_dot_loss():
    Q, K, V = _qkv()
    base = lc.ttt_recurrent(Q, K, V, "dot", 0.5)
    for m in (2, 5, len(Q)):
        lc.check_close(f"m = {m}", lc.ttt_recurrent(Q, K, V, "dot", 0.5, batch_size=m), base, TOL)
    # and the squared loss does change with m (the check above is not vacuous)
    assert np.abs(lc.ttt_recurrent(Q, K, V, "squared", 0.5, batch_size=5)
                  - lc.ttt_recurrent(Q, K, V, "squared", 0.5)).max() > 1e-3


def test_exercise_retnet_from_a_penalty():
    Q, K, V = _qkv()
    lc.check_close("eta = 1, lam = 0.1 is RetNet with gamma = 0.9",
                   lc.ttt_recurrent(Q, K, V, "dot+l2", 1.0, lam=0.1),
                   lc.decay_attention_parallel(Q, K, V, np.full(len(Q), 0.9)), TOL)
