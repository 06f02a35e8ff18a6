"""Chapter 6's recall experiment (experiments.mqar): the rewrites generator, the models, their state
sizes, training, the loss curves, the claims on constructed runs, and the stored GPU run."""
import json
import math

import pytest

from experiments.common import RESULTS_DIR
import torch
import torch.nn.functional as F

from kernels.reference import recurrent_ref
import experiments.mqar as mq
from experiments.common import failed_claims, loss_curves
from experiments.mqar import (ALL_MIXERS, FILLER, GATE_TEMPERATURE, IGNORE, MIXERS, MQARModel, cpu_config,
                              gpu_config, make_mqar, points, state_size, train_recall)


# ------------------------------------------------------------------ generator
@pytest.mark.parametrize("vocab,N,R,L,nq", [(64, 4, 1, 64, None), (64, 16, 1, 64, None), (64, 4, 8, 72, None),
                                            (32, 3, 2, 20, 2), (8, 1, 3, 7, 1), (1024, 8, 8, 256, None)])
def test_every_target_is_the_latest_value_written_under_its_key(vocab, N, R, L, nq):
    """The definition, position by position: each key written exactly R times with a value of its own
    (all N R values distinct), and each query's target is the value of that key's last write."""
    x, y, m = make_mqar(vocab, N, L, batch=16, seed=3, num_queries=nq, writes_per_key=R)
    assert x.shape == y.shape == m.shape == (16, L)
    nq = N if nq is None else nq
    half, W = vocab // 2, N * R
    for b in range(16):
        keys, vals = x[b, 0:2 * W:2].tolist(), x[b, 1:2 * W:2].tolist()
        assert len(set(keys)) == N and all(keys.count(k) == R for k in set(keys))      # N keys, R writes each
        assert len(set(vals)) == W                                                    # a fresh value per write
        assert all(1 <= k < half for k in keys) and all(half <= v < vocab for v in vals)
        latest = {}
        for k, v in zip(keys, vals):                                                  # the last write wins
            latest[k] = v
        scored = m[b].nonzero().flatten().tolist()
        assert len(scored) == nq and all(t >= 2 * W for t in scored)                  # queries follow the writes
        for t in scored:
            assert y[b, t].item() == latest[x[b, t].item()]
        assert (y[b][~m[b]] == IGNORE).all()
        rest = [t for t in range(2 * W, L) if t not in scored]
        assert all(x[b, t].item() == FILLER for t in rest)
        assert len({x[b, t].item() for t in scored}) == nq                            # each key asked once


def test_rewrites_change_the_answer():
    """With R >= 2 the answer is never a key's first value (every write has its own value), so a
    memory that returns the first write scores 0 and one that returns the last scores 1."""
    x, y, m = make_mqar(64, 4, 40, 32, seed=5, writes_per_key=2)
    for b in range(32):
        first = {}
        for k, v in zip(x[b, 0:16:2].tolist(), x[b, 1:16:2].tolist()):
            first.setdefault(k, v)
        assert all(y[b, t].item() != first[x[b, t].item()] for t in m[b].nonzero().flatten().tolist())


def test_generator_is_seeded():
    a = make_mqar(64, 4, 40, 4, seed=11, writes_per_key=3)
    b = make_mqar(64, 4, 40, 4, seed=11, writes_per_key=3)
    c = make_mqar(64, 4, 40, 4, seed=12, writes_per_key=3)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not torch.equal(a[0], c[0])


def test_generator_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_kv_pairs must be <= 15"):
        make_mqar(32, 16, 64, 2, 0)
    with pytest.raises(ValueError, match="num_kv_pairs \\* writes_per_key must be <= 16"):
        make_mqar(32, 4, 64, 2, 0, writes_per_key=5)
    with pytest.raises(ValueError, match="seq_len must be >= 2 \\* num_kv_pairs \\* writes_per_key \\+ num_queries = 36"):
        make_mqar(64, 4, 30, 2, 0, writes_per_key=4)
    with pytest.raises(ValueError, match="num_queries must be <= num_kv_pairs"):
        make_mqar(64, 4, 64, 2, 0, num_queries=5)
    with pytest.raises(ValueError, match="writes_per_key must be an integer >= 1"):
        make_mqar(64, 4, 64, 2, 0, writes_per_key=0)
    with pytest.raises(ValueError, match="batch must be an integer >= 1"):
        make_mqar(64, 4, 64, 0, 0)


# ------------------------------------------------------------------ models
@pytest.mark.parametrize("mixer", ALL_MIXERS)
def test_forward_runs_and_is_differentiable(mixer):
    torch.manual_seed(0)
    model = MQARModel(mixer, vocab_size=32, d_model=16, n_heads=2, head_dim=8, mlp=True)
    x, y, m = make_mqar(32, 3, 20, 3, seed=0, writes_per_key=2)
    logits = model(x)
    assert logits.shape == (3, 20, 32) and torch.isfinite(logits).all()
    torch.testing.assert_close(model(x, m), logits[m], atol=1e-5, rtol=0)   # the head at the queries only
    F.cross_entropy(model(x, m), y[m]).backward()
    mix = model.mix
    params = [mix.q_proj.weight, mix.k_proj.weight, mix.v_proj.weight, model.embed.weight]
    params += [mix.g_proj.weight] if mixer in ("decay", "gated_deltanet", "mesanet") else []
    params += [mix.b_proj.weight] if mixer in ("deltanet", "gated_deltanet", "mesanet") else []
    params += [mix.lamb_raw] if mixer == "mesanet" else []
    for p in params:   # every input of the token mixer receives a non-zero, finite gradient
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


@pytest.mark.parametrize("mixer", MIXERS)
def test_mixer_is_its_recurrence(mixer):
    """The mixer's op output equals the token-by-token recurrence with the mixer's own q, k, v, g, beta."""
    torch.manual_seed(1)
    model = MQARModel(mixer, vocab_size=32, d_model=16, n_heads=2, head_dim=8)   # float32: the ops' dtypes
    x = model.norm1(model.embed(make_mqar(32, 4, 70, 2, seed=1)[0]))   # T = 70 spans two 64-chunks
    mix = model.mix
    with torch.no_grad():
        q, k, v = mix.qkv(x)
        g = F.logsigmoid(mix.g_proj(x)) / GATE_TEMPERATURE if mix.gated else None
        beta = torch.sigmoid(mix.b_proj(x)) if mix.delta else None
        o_ref, S_ref = recurrent_ref(*(t.double() for t in (q, k, v)),
                                     None if g is None else g.double(), None if beta is None else beta.double(),
                                     1.0, None, True)
        o, S = mix(x, output_final_state=True)
        o_ref = mix.o_proj(o_ref.float().reshape(2, 70, -1))
    # float32 op vs float64 recurrence on O(1) entries summed over <= 70 tokens: float32 round-off is
    # ~1e-6 relative; 1e-4 absolute leaves headroom but still catches a wrong gate, beta or state.
    torch.testing.assert_close(o, o_ref, atol=1e-4, rtol=0)
    torch.testing.assert_close(S.double(), S_ref, atol=1e-4, rtol=0)


def test_key_convolution_starts_from_the_previous_token():
    torch.manual_seed(0)
    for flag, want in ((True, 0), (False, 1)):       # width 2: index 0 weights x_{t-1}, index 1 weights x_t
        mix = MQARModel("linear", 16, d_model=8, head_dim=8, key_from_previous=flag).mix
        wq, wk, wv = (c.weight[:, 0, :] for c in mix.convs)
        assert (wk.argmax(-1) == want).all() and (wq.argmax(-1) == 1).all() and (wv.argmax(-1) == 1).all()
        x = torch.randn(1, 5, 8)
        y = mix.convs[1](x)
        # the convolution is causal: y_0 depends on x_0 only, and changing x_4 leaves y_0..y_3 alone
        x2 = x.clone(); x2[0, 4] += 1.0
        assert torch.equal(mix.convs[1](x2)[0, :4], y[0, :4])


@pytest.mark.parametrize("dims,dk,dv", [("d_k", 8, 8), ("state", 4, 12)])
def test_mesanet_mixer_is_the_reference_with_an_exact_solve(dims, dk, dv):
    """The MesaNet mixer = kernels.reference.chunk_mesa_net_ref with an exact solve (float64) on the
    mixer's own q, k, v, g, beta, Λ, at equal key size (d_k = d_v = head_dim) and at equal state
    (d_k = head_dim / 2, d_v = 3 head_dim / 2): its d_k CG steps are exact up to float32 round-off on
    O(1) entries (~1e-6); 1e-4 leaves headroom and still catches a wrong gate, beta, Λ or head split."""
    from kernels.reference import chunk_mesa_net_ref
    torch.manual_seed(2)
    model = MQARModel("mesanet", vocab_size=32, d_model=16, n_heads=2, head_dim=8, mesa_dims=dims)
    x = model.norm1(model.embed(make_mqar(32, 4, 70, 2, seed=1)[0]))
    mix = model.mix
    with torch.no_grad():
        q, k, v = mix.qkv(x)
        assert q.shape[-1] == dk and v.shape[-1] == dv
        g = F.logsigmoid(mix.g_proj(x)) / GATE_TEMPERATURE
        beta = torch.sigmoid(mix.b_proj(x))
        lamb = F.softplus(mix.lamb_raw)
        o_ref = chunk_mesa_net_ref(*(t.double() for t in (q, k, v, g, beta, lamb)), exact=True)[0]
        o = mix(x)
    torch.testing.assert_close(o, mix.o_proj(o_ref.float().reshape(2, 70, -1)), atol=1e-4, rtol=0)


def test_state_sizes_are_measured_from_the_ops():
    """The four rules hold H d_k d_v numbers at any head size; MesaNet twice that at equal d_k and
    the same at equal state (d_k² + d_k d_v = head_dim²)."""
    for h in (8, 16):
        sizes = {m: state_size(MQARModel(m, 32, d_model=16, n_heads=2, head_dim=h)) for m in MIXERS}
        assert set(sizes.values()) == {2 * h * h}, sizes
        assert state_size(MQARModel("mesanet", 32, d_model=16, n_heads=2, head_dim=h)) == 2 * 2 * h * h
        assert state_size(MQARModel("mesanet", 32, d_model=16, n_heads=2, head_dim=h, mesa_dims="state")) == 2 * h * h
    with pytest.raises(ValueError, match="mesa_dims must be"):
        MQARModel("mesanet", 32, head_dim=8, mesa_dims="half")
    with pytest.raises(ValueError, match="head_dim must be even"):
        MQARModel("mesanet", 32, head_dim=7, mesa_dims="state")
    with pytest.raises(ValueError, match="mixer must be one of"):
        MQARModel("mamba", 32)


def test_configs_are_valid_for_the_generator():
    for cfg in (cpu_config(), gpu_config()):
        for N, R in points(cfg):   # every setting of the run can be generated
            make_mqar(cfg.vocab_size, N, cfg.seq_len, 1, 0, writes_per_key=R)
        assert (cfg.rewrite_pairs, 1) in points(cfg)                # the control is scored
        assert cfg.tune_head_dim in cfg.head_dims
    g = gpu_config()
    assert g.vocab_size // 2 - 1 > 127                              # more possible keys than the first version
    assert min(g.head_dims) == 8 and max(g.head_dims) == 64
    assert len(g.lr_grid) >= 3 and g.grid_seed not in (0, 1, 2)
    assert max(g.head_dims) >= 2 * g.rewrite_pairs                  # some d_k leave the rewritten keys room


# ------------------------------------------------------------------ training and its records
_TINY = dict(kv_pairs=(2, 3), rewrite_pairs=2, writes_per_key=(2,), vocab_size=16, seq_len=12, d_model=16,
             steps=60, batch=16, eval_batch=32)


def test_tiny_training_run_reduces_the_loss_and_is_deterministic():
    cfg = cpu_config(**_TINY)
    r1 = train_recall("deltanet", 8, cfg)
    r2 = train_recall("deltanet", 8, cfg)
    c1 = {c["label"]: c for c in r1["loss_curves"]}
    assert r1["loss_curves"] == r2["loss_curves"] and r1["accuracy"] == r2["accuracy"]   # bitwise repeatable
    first = [c["loss"][0] for c in c1.values()]
    last = [c["loss"][-1] for c in c1.values()]
    assert sum(last) < 0.8 * sum(first), (first, last)                                     # it learns something
    assert r1["points"] == [[2, 1], [3, 1], [2, 2]] and len(r1["accuracy"]) == 3
    assert all(0.0 <= a <= 1.0 for a in r1["accuracy"])
    assert r1["state_size"] == 64


def test_loss_curves_name_the_setting_and_step_of_every_point():
    """The stored loss curves cannot mix settings: a run's curve for each setting holds exactly the
    steps that trained on it (step s trains on points[s % len(points)]), windows of loss_every of
    them, each point at the last step of its window."""
    cfg = cpu_config(**{**_TINY, "steps": 23, "loss_every": 4})
    r = train_recall("linear", 8, cfg)
    pts = points(cfg)
    assert [c["label"] for c in r["loss_curves"]] == [f"N={N} R={R}" for N, R in pts]
    for i, c in enumerate(r["loss_curves"]):
        own = [s for s in range(cfg.steps) if s % len(pts) == i]
        assert c["step"] == [own[j:j + 4][-1] for j in range(0, len(own), 4)]
        assert c["every"] == 4 and len(c["loss"]) == len(c["step"])


def test_loss_curves_average_each_settings_own_steps():
    """common.loss_curves on losses that encode their step and setting: every window's mean is the
    mean of its own steps' losses, and no other setting's loss enters it."""
    labels = [f"N={(8, 16, 32, 48, 64)[s % 5]}" for s in range(37)]
    losses = [1000 * (s % 5) + s for s in range(37)]                # setting in the thousands, step below
    curves = loss_curves(losses, labels, 3)
    assert [c["label"] for c in curves] == ["N=8", "N=16", "N=32", "N=48", "N=64"]
    for i, c in enumerate(curves):
        own = list(range(i, 37, 5))
        wins = [own[j:j + 3] for j in range(0, len(own), 3)]
        assert c["step"] == [w[-1] for w in wins]
        assert c["loss"] == [pytest.approx(1000 * i + sum(w) / len(w)) for w in wins]
    with pytest.raises(ValueError, match="labels must name every step"):
        loss_curves(losses, labels[:-1], 3)
    with pytest.raises(ValueError, match="every must be an integer >= 1"):
        loss_curves(losses, labels, 0)


def test_run_seeds_tunes_then_runs_the_seeds():
    """The grid runs each mixer at tune_head_dim once per rate on the grid seed; every model then runs
    at its mixer's chosen rate, and the records say which phase, rate and seed each one is."""
    cfg = cpu_config(**{**_TINY, "steps": 3, "mixers": ("linear", "deltanet"), "head_dims": (4, 8),
                        "tune_head_dim": 8, "lr_grid": (1e-3, 1e-2), "grid_seed": 77})
    run = mq.run_seeds(cfg, [0, 1])
    grid, seeds = run["grid"], run["records"]
    assert all(r["phase"] == "grid" for r in grid) and all(r["phase"] == "seed" for r in seeds)
    assert [(r["unit"], r["lr"]) for r in grid] == [("linear@8", 1e-3), ("linear@8", 1e-2),
                                                    ("deltanet@8", 1e-3), ("deltanet@8", 1e-2)]
    assert all(r["seed"] == 77 for r in grid)
    assert [(r["seed"], r["unit"]) for r in seeds] == [(s, u) for s in (0, 1)
                                                      for u in ("linear@4", "linear@8", "deltanet@4", "deltanet@8")]
    chosen = {row["unit"]: row["lr"] for row in run["config"]["lr_choice"]}
    for m in ("linear", "deltanet"):
        best = max((r for r in grid if r["mixer"] == m), key=lambda r: r["score"])["lr"]
        assert chosen[f"{m}@4"] == chosen[f"{m}@8"] == best
        assert all(r["lr"] == best for r in seeds if r["mixer"] == m)
    # each mixer's grid scores are the mean validation accuracy of its grid records (mqar's default score)
    rows = {row["unit"]: row for row in run["config"]["lr_choice"]}
    for m in ("linear", "deltanet"):
        mine = [r for r in grid if r["mixer"] == m]
        assert rows[f"{m}@8"]["scores"] == [pytest.approx(sum(r["accuracy"]) / len(r["accuracy"])) for r in mine]
        assert rows[f"{m}@4"]["scores"] is None and rows[f"{m}@4"]["tuned_by"] == f"{m}@8"
    assert run["config"]["seeds"] == [0, 1] and "seed" not in run["config"] and "lr" not in run["config"]
    with pytest.raises(ValueError, match="tune_head_dim must be one of head_dims"):
        mq.run_seeds(cpu_config(**{**_TINY, "head_dims": (4,), "tune_head_dim": 8}), [0])
    with pytest.raises(ValueError, match="mixers must be drawn from"):
        mq.run_seeds(cpu_config(mixers=("mamba",)), [0])
    with pytest.raises(ValueError, match="rewrite_pairs must be one of kv_pairs"):
        mq.run_seeds(cpu_config(**{**_TINY, "rewrite_pairs": 5}), [0])


# ------------------------------------------------------------------ claims on constructed runs
def _run(acc: dict, head_dims=(8, 16), seeds=(0, 1, 2), N=4, Rs=(2, 4, 8), once=(4, 8, 16)):
    """A constructed run: acc[(mixer, head_dim)] = accuracy per setting (write-once N, then rewrites)."""
    pts = [[n, 1] for n in once] + [[N, R] for R in Rs]
    recs = [{"unit": f"{m}@{h}", "mixer": m, "head_dim": h, "seed": s, "phase": "seed", "points": pts,
             "accuracy": list(a), "state_size": h * h} for s in seeds for (m, h), a in acc.items()]
    return {"config": {}, "records": recs}


def _good():
    acc = {}
    for h in (8, 16):
        base = 0.5 if h == 8 else 0.9                          # write-once grows with d_k
        acc["linear", h] = [base, base - 0.1, base - 0.2, 0.45, 0.25, 0.12]
        acc["decay", h] = [base, base - 0.1, base - 0.2, 0.6, 0.5, 0.4]
        acc["deltanet", h] = [base + 0.05, base - 0.05, base - 0.15, 0.9, 0.85, 0.8]
        acc["gated_deltanet", h] = [base + 0.05, base - 0.05, base - 0.15, 0.9, 0.85, 0.8]
    return acc


def test_chapter_6_claims_hold_on_a_run_that_shows_them():
    cl = mq.claims(_run(_good()))
    assert len(cl) == 6 and not failed_claims(cl), failed_claims(cl)
    assert all(set(c) == {"claim", "holds", "measured"} for c in cl)
    assert "linear attention by at least 0.2" in cl[0]["claim"] and "+0.680" in cl[0]["measured"]


def _lower(acc, keys, idx, by):
    for k in keys:
        for i in idx:
            acc[k][i] -= by


@pytest.mark.parametrize("change,broken", [
    # linear attention recalls the latest value at d_k = 16: DeltaNet's lead, 1/R and the control fail
    (lambda a: a[("linear", 16)].__setitem__(5, 0.7), [0, 2, 3]),
    # decay as good as Gated DeltaNet with rewrites at the reference d_k (8: the run names none)
    (lambda a: a[("decay", 8)].__setitem__(5, 0.75), [1]),
    # ... at another d_k: not claimed
    (lambda a: a[("decay", 16)].__setitem__(5, 0.75), []),
    # the control: linear attention far behind DeltaNet with the same keys written once
    (lambda a: a[("linear", 8)].__setitem__(0, 0.25), [3]),
    # written once, decay far behind the others at every d_k
    (lambda a: _lower(a, [("decay", 8), ("decay", 16)], range(3), 0.3), [5]),
    # written once, a larger state gains every rule too little
    (lambda a: _lower(a, [(m, 16) for m in MIXERS], range(3), 0.3), [4]),
])
def test_chapter_6_claims_fail_on_runs_that_break_them(change, broken):
    acc = _good()
    change(acc)
    cl = mq.claims(_run(acc))
    assert [i for i, c in enumerate(cl) if not c["holds"]] == broken, [c["measured"] for c in cl]


def test_claims_need_every_seed():
    """'In every seed': one bad seed breaks the rewrites claim although the mean still clears it."""
    run = _run(_good())
    for r in run["records"]:
        if r["seed"] == 2 and r["mixer"] == "deltanet" and r["head_dim"] == 8:
            r["accuracy"][5] = 0.2                        # one seed: DeltaNet no better than linear
    cl = mq.claims(run)
    assert not cl[0]["holds"] and cl[1]["holds"]


def test_capacity_claims_need_two_head_sizes():
    acc = {k: v for k, v in _good().items() if k[1] == 8}
    cl = mq.claims(_run(acc, head_dims=(8,)))
    assert len(cl) == 4 and all("written once (N" not in c["claim"] for c in cl)


# ------------------------------------------------------------------ the stored run
def test_stored_run_loader_checks_the_settings(tmp_path, monkeypatch):
    """Missing, the error names the command; stored with gpu_config()'s settings it matches; with one
    setting changed it does not."""
    import experiments.common
    monkeypatch.setattr(experiments.common, "RESULTS_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="python -m experiments.mqar --gpu --jobs 16 --write"):
        mq.load_stored()
    for cfg, same in ((gpu_config(), True), (gpu_config(steps=1), False)):
        stored = {**experiments.common.stored_config(cfg), "seeds": [0, 1, 2], "jobs": 16, "lr_choice": []}
        (tmp_path / f"{mq.STORED}.json").write_text(json.dumps(
            {"name": mq.STORED, "env": {"device": "test"}, "config": stored, "records": []}))
        assert mq.load_stored()["same_as_gpu_config"] is same


@pytest.mark.skipif(not (RESULTS_DIR / "mqar_recall.json").exists(),
                    reason="the stored GPU run is not made yet (python -m experiments.mqar --gpu --jobs 16 --write); the chapter says so")
def test_the_stored_gpu_run_is_complete_and_judges_the_claims():
    """experiments/results/mqar_recall.json (written by the GPU command of gpu_config's docstring,
    whole or a few rules per call with --only): run with the settings gpu_config() has now, with the
    grid (every rate for every stored mixer at tune_head_dim, on the grid seed), every model in at
    least three seeds at its mixer's chosen rate, the device and versions recorded, and a verdict with
    its measurement on every claim the stored rules can test; all six once every rule is stored. The
    claims were fixed before the run: the appendix reports the verdicts (``claims_verdict``), whichever
    way they come out, so this test asserts that each is judged, not that each holds (what the claims
    compute is tested on constructed runs above)."""
    data = mq.load_stored()
    cfg = gpu_config()
    assert data["same_as_gpu_config"] or data["missing"], "made with other settings: run the command anew"
    mixers = [m for m in cfg.mixers if m not in data["missing"]]
    assert mixers == list(data["config"]["mixers"])
    grid, seeds = data["grid"], data["records"]
    assert sorted((r["mixer"], r["lr"]) for r in grid) == sorted((m, lr) for m in mixers for lr in cfg.lr_grid)
    assert all(r["head_dim"] == cfg.tune_head_dim and r["seed"] == cfg.grid_seed for r in grid)
    assert len(data["config"]["seeds"]) >= 3
    assert sorted((r["seed"], r["unit"]) for r in seeds) == sorted(
        (s, mq.unit(m, h)) for s in data["config"]["seeds"] for m in mixers for h in cfg.head_dims)
    chosen = {row["unit"]: row["lr"] for row in data["config"]["lr_choice"]}
    for r in seeds:
        assert r["lr"] == chosen[r["unit"]] == chosen[mq.unit(r["mixer"], cfg.tune_head_dim)]
        assert r["points"] == [list(p) for p in points(cfg)] and all(0 <= a <= 1 for a in r["accuracy"])
        assert r["state_size"] == r["head_dim"] ** 2
    assert data["env"]["device"] and data["env"]["date"] and data["env"]["torch"]
    cl = mq.claims(data)
    assert cl and all(isinstance(c["holds"], bool) and c["measured"] for c in cl), cl
    if data["missing"]:
        pytest.skip(f"the stored GPU run holds {mixers} only ({len(cl)} claims judged); not made yet: "
                    f"{data['missing']} ({mq.COMMAND} --only {' '.join(data['missing'])}); the appendix says so")
    assert len(cl) == 6


def test_untrained_runs_are_those_at_the_floor_everywhere():
    """A seed run counts as untrained when every accuracy is at most the floor, not when one is."""
    rec = lambda seed, acc: {"seed": seed, "mixer": "mesanet", "head_dim": 32, "lr": 0.01, "accuracy": acc,
                             "final_loss": 6.2}
    run = {"config": {"vocab_size": 1024},
           "records": [rec(0, [0.002, 0.003, 0.001]), rec(1, [0.9, 0.01, 0.02]), rec(2, [0.05, 0.05, 0.0])]}
    got = mq.untrained_runs(run)
    assert [(r["seed"], r["best"]) for r in got] == [(0, 0.003), (2, 0.05)]
    assert got[0] == {"seed": 0, "mixer": "mesanet", "head_dim": 32, "lr": 0.01, "best": 0.003, "final_loss": 6.2,
                      "n_values": 512, "plateau": math.log(512), "trained_seeds": [1]}   # 1024 tokens: 511 keys, 512 values
    assert [r["seed"] for r in mq.untrained_runs(run, floor=0.004)] == [0]
    with pytest.raises(ValueError, match="floor must lie in"):
        mq.untrained_runs(run, floor=1.0)
