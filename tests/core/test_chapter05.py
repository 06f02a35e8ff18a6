"""Chapter 5 (the delta rule): the notebook's checks and measured claims that tests/core/test_ttt.py and
tests/core/test_delta_rule.py do not already hold."""
import numpy as np

import lattn_core as lc


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_full_erase_and_eigenvalues_of_the_transition():
    rng = np.random.default_rng(0)
    k = _unit(rng.normal(size=16))
    S_prev, v = rng.normal(size=(8, 16)), rng.normal(size=8)
    S_next = S_prev @ (np.eye(16) - np.outer(k, k)) + np.outer(v, k)
    lc.check_close("beta = 1: S_t k_t = v_t", S_next @ k, v, 1e-13)
    for b in (0.5, 1.0, 2.0):
        eig = np.sort(np.linalg.eigvalsh(np.eye(16) - b * np.outer(k, k)))
        lc.check_close(f"eigenvalues, beta = {b}", eig, np.sort(np.r_[1 - b, np.ones(15)]), 1e-12)


def test_erase_is_a_write_of_zero_and_the_write_replaces_the_reading():
    # the schematic's three matrices: erase = the step with v = 0, i.e. S (I - k k^T); the write
    # leaves every other column and sets the reading along k to v
    rng = np.random.default_rng(1)
    S_prev = rng.normal(size=(3, 4))
    k, v = np.eye(4)[1], rng.normal(size=3)
    step = lambda val: lc.ttt_recurrent(k[None], k[None], val[None], "squared", 1.0,
                                        initial_state=S_prev, return_state=True)[1]
    erased, written = step(np.zeros(3)), step(v)
    lc.check_close("erase = S(I - kk^T)", erased, S_prev @ (np.eye(4) - np.outer(k, k)), 1e-14)
    lc.check_close("erased column is zero", erased[:, 1], np.zeros(3), 1e-14)
    lc.check_close("written column is v", written[:, 1], v, 1e-14)
    keep = [0, 2, 3]
    lc.check_close("other columns kept", written[:, keep], S_prev[:, keep], 1e-14)


def test_deltanet_update_is_affine():
    rng = np.random.default_rng(2)
    k, v = _unit(rng.normal(size=16)), rng.normal(size=8)
    g = lambda S: S @ (np.eye(16) - 0.7 * np.outer(k, k)) + 0.7 * np.outer(v, k)
    S_a, S_b = rng.normal(size=(2, 8, 16))
    lc.check_close("affine defect", lc.affine_defect(g, S_a, S_b), 0.0, 1e-12)


def test_lms_identifies_the_filter_down_to_the_noise():
    # the notebook's LMS run: same sizes, its claim that the a-priori error falls to the noise
    rng = np.random.default_rng(3)
    n, d, eta, noise = 300, 8, 0.5, 0.01
    X = rng.normal(size=(n, d)) / np.sqrt(d)
    y = X @ rng.normal(size=d) + noise * rng.normal(size=n)
    w, errors = np.zeros(d), []
    for t in range(n):
        e = y[t] - w @ X[t]
        errors.append(e)
        w = w + eta * e * X[t]
    rms_first, rms_last = np.sqrt(np.mean(np.square(errors[:20]))), np.sqrt(np.mean(np.square(errors[-100:])))
    assert rms_last < 2 * noise < 0.1 * rms_first
    lc.check_close("LMS = DeltaNet(beta = eta)",
                   lc.deltanet_recurrent(X, X, y[:, None], np.full(n, eta))[-1, 0], w @ X[-1], 1e-10)


def test_overwrite_claims():
    r64 = lc.overwrite_experiment(64, where="between", trials=60)
    lc.check_close("DeltaNet reads 10 after 64 writes in between", r64["delta"], np.full(60, 10.0), 1e-10)
    lc.check_close("linear attention reads 5 + 10", lc.overwrite_experiment(0, trials=60)["linear"],
                   np.full(60, 15.0), 1e-12)
    err = lambda r: {k: np.mean(np.abs(x - 10)) for k, x in lc.overwrite_experiment(
        r, where="after", trials=60).items()}
    e2, e64 = err(2), err(64)
    assert e2["delta"] < e2["linear"] and e64["delta"] >= e64["linear"]


def test_exercise_reflection():
    rng = np.random.default_rng(4)
    k = _unit(rng.normal(size=16))
    S_prev, v = rng.normal(size=(8, 16)), rng.normal(size=8)
    S = S_prev @ (np.eye(16) - 2 * np.outer(k, k)) + 2 * np.outer(v, k)
    lc.check_close("beta = 2 reflects", S @ k, 2 * v - S_prev @ k, 1e-12)


def test_exercise_writing_twice():
    rng = np.random.default_rng(5)
    k, v = _unit(rng.normal(size=16)), rng.normal(size=8)
    K, V = np.vstack([k, k]), np.vstack([v, v])
    Q = np.vstack([np.zeros(16), k])
    lc.check_close("DeltaNet: second write changes nothing", lc.deltanet_recurrent(Q, K, V)[-1], v, 1e-12)
    lc.check_close("linear attention: 2v", lc.linear_attention_parallel(Q, K, V)[-1], 2 * v, 1e-12)


def test_exercise_orthonormal_keys():
    rng = np.random.default_rng(6)
    Qo, _ = np.linalg.qr(rng.normal(size=(16, 16)))
    K = Qo.T[:10]
    Q, V = rng.normal(size=(10, 16)), rng.normal(size=(10, 8))
    lc.check_close("orthonormal keys: DeltaNet = linear attention", lc.deltanet_recurrent(Q, K, V),
                   lc.linear_attention_parallel(Q, K, V), 1e-12)
    # with non-orthogonal keys they differ (the check is not vacuous)
    K2 = _unit(rng.normal(size=(10, 16)))
    assert np.abs(lc.deltanet_recurrent(Q, K2, V) - lc.linear_attention_parallel(Q, K2, V)).max() > 1e-2
