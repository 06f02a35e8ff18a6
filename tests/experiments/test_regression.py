"""Chapter 10's trained in-context regression (experiments.regression): the data, the exact ridge
reference, the normalised-LMS mixer, training, the claims on constructed runs, the stored run."""
import json

import numpy as np
import pytest

from experiments.common import RESULTS_DIR
import torch

import experiments.regression as reg
from experiments.common import failed_claims
from experiments.mqar import TokenMixer


def test_pairs_and_queries_follow_the_map_of_their_sequence():
    inputs, targets, W, xs, ys, xq = reg.make_regression(3, 2, 5, batch=4, seed=1)
    assert inputs.shape == (4, 10, 6) and targets.shape == (4, 5, 2) and W.shape == (4, 2, 3)
    torch.testing.assert_close(ys, torch.einsum("byx,bnx->bny", W, xs))         # clean: y = W x exactly
    torch.testing.assert_close(targets, torch.einsum("byx,bnx->bny", W, xq))    # the answer to each query
    assert torch.equal(inputs[:, 0::2, :3], xs) and torch.equal(inputs[:, 0::2, 3:5], ys)
    assert (inputs[:, 0::2, 5] == 0).all() and (inputs[:, 1::2, 5] == 1).all()  # the flag marks the queries
    assert torch.equal(inputs[:, 1::2, :3], xq) and (inputs[:, 1::2, 3:5] == 0).all()   # a query hides its y
    noisy = reg.make_regression(3, 2, 5, batch=4, seed=1, noise=0.5)
    assert torch.equal(noisy[2], W) and not torch.allclose(noisy[4], ys)         # same maps, noisy values
    assert torch.equal(noisy[1], targets)                                        # the answers stay clean
    big = reg.make_regression(16, 16, 8, batch=2000, seed=0)
    assert abs(float(big[1].var()) - 1.0) < 0.05          # a target has unit variance per coordinate


def test_regression_data_is_seeded_and_checked():
    a, b = reg.make_regression(4, 4, 6, 3, seed=7), reg.make_regression(4, 4, 6, 3, seed=7)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not torch.equal(a[0], reg.make_regression(4, 4, 6, 3, seed=8)[0])
    with pytest.raises(ValueError, match="noise must be a number >= 0"):
        reg.make_regression(4, 4, 6, 3, 0, noise=-1.0)
    with pytest.raises(ValueError, match="n_pairs must be an integer >= 1"):
        reg.make_regression(4, 4, 0, 3, 0)


def test_ridge_error_is_the_least_squares_fit_on_the_pairs_so_far():
    """ridge_error against numpy's solve, pair count by pair count; with no noise and a tiny λ it is
    exact once the pairs span the inputs (t >= d_x)."""
    _, targets, _, xs, ys, xq = reg.make_regression(3, 2, 6, batch=5, seed=2, noise=0.3)
    lam = 0.7
    got = reg.ridge_error(xs, ys, xq, targets, lam)
    X, Y, Q, T = (t.double().numpy() for t in (xs, ys, xq, targets))
    for t in range(6):
        err = []
        for b in range(5):
            Wh = Y[b, :t + 1].T @ X[b, :t + 1] @ np.linalg.inv(X[b, :t + 1].T @ X[b, :t + 1] + lam * np.eye(3))
            err.append(((Wh @ Q[b, t] - T[b, t]) ** 2).mean())
        assert got[t] == pytest.approx(np.mean(err), rel=1e-10)
    _, targets, _, xs, ys, xq = reg.make_regression(3, 2, 6, batch=5, seed=2)
    clean = reg.ridge_error(xs, ys, xq, targets, 1e-9)
    assert max(clean[2:]) < 1e-12 and clean[0] > 0.01
    with pytest.raises(ValueError, match="lam must be > 0"):
        reg.ridge_error(xs, ys, xq, targets, 0.0)


def test_nlms_mixer_writes_unit_keys_and_scaled_values():
    """qk_norm='nlms': k is a unit vector, v is divided by the key's norm, q is left as it is."""
    torch.manual_seed(0)
    mix = TokenMixer("deltanet", 6, 1, 4, conv_width=1, qk_norm="nlms")
    x = torch.randn(2, 5, 6)
    q, k, v = mix.qkv(x)
    kr = mix.k_proj(x).reshape(2, 5, 1, 4)
    torch.testing.assert_close(k.norm(dim=-1), torch.ones(2, 5, 1))
    torch.testing.assert_close(v, mix.v_proj(x).reshape(2, 5, 1, 4) / kr.norm(dim=-1, keepdim=True))
    torch.testing.assert_close(q, mix.q_proj(x).reshape(2, 5, 1, 4))
    with pytest.raises(ValueError, match="qk_norm must be 'l2' or 'nlms'"):
        TokenMixer("deltanet", 6, 1, 4, qk_norm="none")


def test_delta_rule_with_nlms_writes_solves_an_orthogonal_regression():
    """The normalised-LMS form is what makes a raw query work: DeltaNet with beta = 1, keys routed
    from x, values from y, after d_x pairs with orthogonal inputs of different lengths predicts
    W x' exactly for any x', although no key had unit length."""
    d = 4
    mix = TokenMixer("deltanet", 2 * d, 1, d, conv_width=1, qk_norm="nlms")
    with torch.no_grad():
        for p in mix.parameters():
            p.zero_()
        eye = torch.eye(d)
        mix.q_proj.weight[:, :d] = eye
        mix.k_proj.weight[:, :d] = eye
        mix.v_proj.weight[:, d:] = eye
        mix.o_proj.weight[d:, :] = eye
        mix.b_proj.bias.fill_(40.0)                                 # beta = 1
    W = torch.randn(d, d, dtype=torch.float32)
    X = torch.linalg.qr(torch.randn(d, d))[0] * torch.tensor([0.5, 1.0, 2.0, 3.0]).unsqueeze(1)   # orthogonal rows
    seq = torch.cat([X, X @ W.T], 1).unsqueeze(0)                   # [1, d, 2d]: pairs (x_i, W x_i)
    with torch.no_grad():
        _, S = mix(seq, output_final_state=True)
    xq = torch.randn(3, d)
    pred = (S[0, 0].T @ xq.T).T                                     # the state read with a raw query
    torch.testing.assert_close(pred, xq @ W.T, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mixer", reg.MIXERS)
def test_model_predicts_at_the_queries_and_trains(mixer):
    torch.manual_seed(0)
    model = reg.RegressionModel(mixer, 3, 2, d_model=8, head_dim=4)
    inputs, targets = reg.make_regression(3, 2, 5, batch=4, seed=0)[:2]
    out = model(inputs)
    assert out.shape == targets.shape and torch.isfinite(out).all()
    torch.nn.functional.mse_loss(out, targets).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    # causal: a query's prediction does not see later tokens
    later = inputs.clone()
    later[:, 6:] += 1.0
    torch.testing.assert_close(model(later)[:, :3], out[:, :3])


_TINY = dict(d_x=3, d_y=2, n_pairs=6, d_model=8, head_dim=4, steps=60, batch=32, eval_batch=32, lr=0.1)


def test_training_is_deterministic_and_lowers_the_loss():
    cfg = reg.cpu_config(**_TINY)
    a, b = reg.train_regression("deltanet", 0.0, cfg), reg.train_regression("deltanet", 0.0, cfg)
    assert a["error"] == b["error"] and a["loss_curves"] == b["loss_curves"]
    (curve,) = a["loss_curves"]
    assert curve["label"] == "clean" and curve["loss"][-1] < 0.8 * curve["loss"][0]
    assert a["pairs"] == list(range(1, 7)) and len(a["error"]) == len(a["ridge"]) == 6
    assert a["state_size"] == 16


def test_run_seeds_and_bad_settings():
    cfg = reg.cpu_config(**{**_TINY, "steps": 3, "lr_grid": (1e-3, 1e-2), "mixers": ("linear", "mesanet")})
    run = reg.run_seeds(cfg, [0, 2])
    assert [(r["seed"], r["unit"]) for r in run["records"]] == [
        (s, u) for s in (0, 2) for u in ("linear/clean", "linear/noise 0.5", "mesanet/clean", "mesanet/noise 0.5")]
    assert len(run["grid"]) == 8 and {r["seed"] for r in run["grid"]} == {cfg.grid_seed}
    for row in run["config"]["lr_choice"]:
        grid = [r for r in run["grid"] if r["unit"] == row["unit"]]
        assert row["lr"] == max(grid, key=lambda r: r["score"])["lr"] and row["tuned_by"] == row["unit"]
        assert row["scores"] == [r["score"] for r in grid]
        assert all(r["score"] == pytest.approx(-np.mean(r["error"])) for r in grid)   # lower error, higher score
    with pytest.raises(ValueError, match="head_dim must be >= d_x and d_y"):
        reg.run_seeds(reg.cpu_config(head_dim=4), [0])
    with pytest.raises(ValueError, match="mixers must be drawn from"):
        reg.run_seeds(reg.cpu_config(mixers=("decay",)), [0])
    with pytest.raises(ValueError, match="d_model must be >= d_x \\+ d_y \\+ 1"):
        reg.run_seeds(reg.cpu_config(d_model=8), [0])


# ------------------------------------------------------------------ claims on constructed runs
def _run(curves: dict, seeds=(0, 1, 2), d_x=4, n=12):
    """curves[(mixer, task)] = error after each number of pairs (the same in every seed)."""
    recs = [{"unit": f"{m}/{t}", "mixer": m, "task": t, "seed": s, "phase": "seed", "pairs": list(range(1, n + 1)),
             "error": list(e), "ridge": [0.5 / (i + 1) for i in range(n)], "state_size": 16}
            for s in seeds for (m, t), e in curves.items()]
    return {"config": {"d_x": d_x}, "records": recs}


def _good(n=12):
    decay = lambda a, floor: [max(floor, a ** i) for i in range(1, n + 1)]
    return {("linear", "clean"): decay(0.9, 0.3), ("deltanet", "clean"): decay(0.8, 0.01),
            ("mesanet", "clean"): decay(0.5, 0.001), ("linear", "noise 0.5"): decay(0.9, 0.4),
            ("deltanet", "noise 0.5"): decay(0.8, 0.2), ("mesanet", "noise 0.5"): decay(0.7, 0.1)}


def test_regression_claims_hold_and_fail_as_they_should():
    cl = reg.claims(_run(_good()))
    assert len(cl) == 3 and not failed_claims(cl), failed_claims(cl)
    bad = _good()
    bad["mesanet", "clean"] = [0.6 * e for e in bad["deltanet", "clean"]]     # only 0.6 of DeltaNet's
    assert [c["holds"] for c in reg.claims(_run(bad))] == [False, True, True]
    bad = _good()
    bad["mesanet", "noise 0.5"][-1] = 0.25                                  # above DeltaNet at the end
    assert [c["holds"] for c in reg.claims(_run(bad))] == [True, False, True]
    bad = _good()
    bad["linear", "clean"][-1] = 0.005                                      # linear attention below DeltaNet
    assert [c["holds"] for c in reg.claims(_run(bad))] == [True, True, False]
    # in every seed: one seed where MesaNet is worse breaks the noisy claim
    run = _run(_good())
    next(r for r in run["records"] if r["seed"] == 1 and r["unit"] == "mesanet/noise 0.5")["error"][-1] = 0.3
    assert [c["holds"] for c in reg.claims(run)] == [True, False, True]


def test_stored_regression_loader(tmp_path, monkeypatch):
    import experiments.common
    monkeypatch.setattr(experiments.common, "RESULTS_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="python -m experiments.regression --gpu --jobs 18 --write"):
        reg.load_stored()
    for cfg, same in ((reg.gpu_config(), True), (reg.gpu_config(noises=(0.0,)), False)):
        stored = {**experiments.common.stored_config(cfg), "seeds": [0, 1, 2], "jobs": 16, "lr_choice": []}
        (tmp_path / f"{reg.STORED}.json").write_text(json.dumps(
            {"name": reg.STORED, "env": {"device": "test"}, "config": stored, "records": []}))
        assert reg.load_stored()["same_as_gpu_config"] is same


@pytest.mark.skipif(not (RESULTS_DIR / "regression.json").exists(),
                    reason="the stored GPU run is not made yet (python -m experiments.regression --gpu --jobs 18 --write); the chapter says so")
def test_the_stored_gpu_run_is_complete_and_shows_the_claims():
    """experiments/results/regression.json: gpu_config()'s settings, the grid for every model on the
    grid seed, every model in at least three seeds at its chosen rate, and every claim holding."""
    data = reg.load_stored()
    assert data["same_as_gpu_config"]
    cfg = reg.gpu_config()
    grid, seeds = data["grid"], data["records"]
    units = [reg.unit(m, s) for m in cfg.mixers for s in cfg.noises]
    assert sorted((r["unit"], r["lr"]) for r in grid) == sorted((u, lr) for u in units for lr in cfg.lr_grid)
    assert len(data["config"]["seeds"]) >= 3
    assert sorted((r["seed"], r["unit"]) for r in seeds) == sorted((s, u) for s in data["config"]["seeds"] for u in units)
    chosen = {row["unit"]: row["lr"] for row in data["config"]["lr_choice"]}
    assert all(r["lr"] == chosen[r["unit"]] for r in seeds)
    assert data["env"]["device"] and data["env"]["date"] and data["env"]["torch"]
    cl = reg.claims(data)
    assert len(cl) == 3 and not failed_claims(cl), failed_claims(cl)
