"""The MQAR experiment of Chapter 6: data generator, models, state sizes, a tiny training run."""
import pytest
import torch
import torch.nn.functional as F

from kernels.reference import recurrent_ref
from experiments.mqar import (ALL_MIXERS, FILLER, GATE_TEMPERATURE, IGNORE, MIXERS, MQARModel, cpu_config,
                             gpu_config, load_stored_large, make_mqar, run_mqar_seeds, run_mqar_sweep,
                             seed_summary, state_size, sweep_records, train_mqar)


# ------------------------------------------------------------------ generator
@pytest.mark.parametrize("vocab,N,L,nq", [(64, 4, 64, None), (64, 20, 64, None), (32, 8, 30, 5), (8, 1, 3, 1)])
def test_every_target_is_the_value_paired_with_that_key(vocab, N, L, nq):
    x, y, m = make_mqar(vocab, N, L, batch=16, seed=3, num_queries=nq)
    assert x.shape == y.shape == m.shape == (16, L)
    nq = N if nq is None else nq
    half = vocab // 2
    for b in range(16):
        keys, vals = x[b, 0:2 * N:2].tolist(), x[b, 1:2 * N:2].tolist()
        assert len(set(keys)) == N and len(set(vals)) == N                 # one answer per key
        assert all(1 <= k < half for k in keys) and all(half <= v < vocab for v in vals)
        paired = dict(zip(keys, vals))
        scored = m[b].nonzero().flatten().tolist()
        assert len(scored) == nq and all(t >= 2 * N for t in scored)       # queries follow the pairs
        for t in scored:                                                    # the definition, position by position
            assert y[b, t].item() == paired[x[b, t].item()]
        # unscored positions: masked, target ignored; in the query region they hold the filler
        assert (y[b][~m[b]] == IGNORE).all()
        rest = [t for t in range(2 * N, L) if t not in scored]
        assert all(x[b, t].item() == FILLER for t in rest)
        assert len({x[b, t].item() for t in scored}) == nq                 # each key asked at most once


def test_generator_is_seeded():
    a = make_mqar(64, 8, 64, 4, seed=11)
    b = make_mqar(64, 8, 64, 4, seed=11)
    c = make_mqar(64, 8, 64, 4, seed=12)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not torch.equal(a[0], c[0])


def test_generator_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_kv_pairs must be <= 15"):
        make_mqar(32, 16, 64, 2, 0)
    with pytest.raises(ValueError, match="seq_len must be >= 2 \\* num_kv_pairs \\+ num_queries = 24"):
        make_mqar(64, 8, 20, 2, 0)
    with pytest.raises(ValueError, match="num_queries must be <= num_kv_pairs"):
        make_mqar(64, 4, 64, 2, 0, num_queries=5)
    with pytest.raises(ValueError, match="batch must be an integer >= 1"):
        make_mqar(64, 4, 64, 0, 0)


# ------------------------------------------------------------------ models
@pytest.mark.parametrize("mixer", ALL_MIXERS)
def test_forward_runs_and_is_differentiable(mixer):
    torch.manual_seed(0)
    model = MQARModel(mixer, vocab_size=32, d_model=16, n_heads=2, head_dim=8, mlp=True)
    x, y, m = make_mqar(32, 4, 20, 3, seed=0)
    logits = model(x)
    assert logits.shape == (3, 20, 32) and torch.isfinite(logits).all()
    F.cross_entropy(logits[m], y[m]).backward()
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


def test_mesanet_mixer_is_the_reference_with_an_exact_solve():
    """The MesaNet mixer = kernels.reference.chunk_mesa_net_ref with an exact solve (float64) on the
    mixer's own q, k, v, g, beta, Λ: its d_k CG steps are exact up to float32 round-off on O(1)
    entries (~1e-6); 1e-4 leaves headroom and still catches a wrong gate, beta, Λ or head split."""
    from kernels.reference import chunk_mesa_net_ref
    torch.manual_seed(2)
    model = MQARModel("mesanet", vocab_size=32, d_model=16, n_heads=2, head_dim=8)
    x = model.norm1(model.embed(make_mqar(32, 4, 70, 2, seed=1)[0]))
    mix = model.mix
    with torch.no_grad():
        q, k, v = mix.qkv(x)
        assert q.shape[-1] == 4 and v.shape[-1] == 12          # d_k = head_dim / 2, d_v = 3 head_dim / 2
        g = F.logsigmoid(mix.g_proj(x)) / GATE_TEMPERATURE
        beta = torch.sigmoid(mix.b_proj(x))
        lamb = F.softplus(mix.lamb_raw)
        o_ref = chunk_mesa_net_ref(*(t.double() for t in (q, k, v, g, beta, lamb)), exact=True)[0]
        o = mix(x)
    torch.testing.assert_close(o, mix.o_proj(o_ref.float().reshape(2, 70, -1)), atol=1e-4, rtol=0)


def test_models_have_equal_state_size():
    sizes = {mixer: state_size(MQARModel(mixer, 32, d_model=16, n_heads=2, head_dim=8)) for mixer in ALL_MIXERS}
    assert set(sizes.values()) == {2 * 8 * 8}, sizes            # H * d_k * d_v, measured from the op
    cfg = cpu_config()
    sizes = {mixer: state_size(MQARModel(mixer, cfg.vocab_size, cfg.d_model, cfg.n_heads, cfg.head_dim))
             for mixer in MIXERS}
    assert len(set(sizes.values())) == 1 and sizes["linear"] == cfg.n_heads * cfg.head_dim ** 2


def test_configs_are_valid_for_the_generator():
    for cfg in (cpu_config(), gpu_config()):
        for N in cfg.kv_pairs:   # every setting of the sweep can be generated
            make_mqar(cfg.vocab_size, N, cfg.seq_len, 1, 0)
        assert cfg.vocab_size // 2 - 1 > cfg.n_heads * cfg.head_dim   # more keys than key dimensions


# ------------------------------------------------------------------ training
def test_tiny_training_run_reduces_the_loss_and_is_deterministic():
    cfg = cpu_config(mixers=("deltanet",), kv_pairs=(2, 3), vocab_size=16, seq_len=12, d_model=16,
                     head_dim=8, steps=60, batch=16, eval_batch=64)
    r1 = train_mqar("deltanet", cfg)
    r2 = train_mqar("deltanet", cfg)
    assert r1["losses"] == r2["losses"]                               # fixed seeds: bitwise repeatable
    first, last = sum(r1["losses"][:10]) / 10, sum(r1["losses"][-10:]) / 10
    assert last < 0.8 * first, (first, last)                          # it learns something
    assert len(r1["accuracy"]) == 2 and all(0.0 <= a <= 1.0 for a in r1["accuracy"])


def test_sweep_returns_one_curve_per_mixer():
    cfg = cpu_config(kv_pairs=(2, 4), vocab_size=16, seq_len=12, d_model=16, head_dim=8, steps=3,
                     batch=4, eval_batch=8)
    out = run_mqar_sweep(cfg, progress=False)
    assert list(out["accuracy"]) == list(MIXERS)
    assert all(len(a) == 2 for a in out["accuracy"].values())
    assert len({r["state_size"] for r in out["results"]}) == 1
    with pytest.raises(ValueError, match="mixers must be drawn from"):
        run_mqar_sweep(cpu_config(mixers=("mamba",)), progress=False)


def test_short_runs_train_without_a_schedule_error():
    """Fewer than 20 steps use a constant rate: PyTorch's one-cycle schedule divides by zero when its
    warm-up ends at step 0 (steps = 10 at 10 %, or 2), which used to end such runs."""
    for steps in (1, 2, 10):
        cfg = cpu_config(mixers=("linear",), kv_pairs=(2,), vocab_size=16, seq_len=12, d_model=16,
                         head_dim=8, steps=steps, batch=4, eval_batch=8)
        r = train_mqar("linear", cfg)
        assert len(r["losses"]) == steps


def test_sweep_records_are_json_and_subsample_the_loss():
    import json
    cfg = cpu_config(kv_pairs=(2, 4), vocab_size=16, seq_len=12, d_model=16, head_dim=8, steps=5,
                     batch=4, eval_batch=8)
    out = run_mqar_sweep(cfg, progress=False)
    recs = json.loads(json.dumps(sweep_records(out, loss_every=2)))
    assert [r["mixer"] for r in recs] == list(MIXERS)
    for r, res in zip(recs, out["results"]):
        L = res["losses"]                                   # 5 steps, N cycling 2, 4, 2, 4, 2
        assert r["losses"] == pytest.approx([(L[0] + L[1]) / 2, (L[2] + L[3]) / 2, L[4]])
        assert r["losses_by_n"] == {"2": pytest.approx([(L[0] + L[2]) / 2, L[4]]),
                                    "4": pytest.approx([(L[1] + L[3]) / 2])}
    with pytest.raises(ValueError, match="loss_every must be an integer >= 1"):
        sweep_records(out, loss_every=0)


def test_stored_large_run_matches_gpu_config():
    """The GPU runs the chapter shows (experiments/results/mqar_large.json) were made with the settings
    ``gpu_config()`` has now (else they must be re-run), record every mixer at every N for every
    seed, with accuracies in [0, 1], equal state sizes, and the device and versions they ran with."""
    data = load_stored_large()
    assert data["same_as_gpu_config"]
    want = gpu_config().as_dict()
    seeds = data["config"]["seeds"]
    assert len(seeds) >= 3, "the chapter compares update rules over several seeds"
    assert [(r["seed"], r["mixer"]) for r in data["records"]] == [(s, m) for s in seeds for m in want["mixers"]]
    assert set(data["config"]) == (set(want) - {"seed"}) | {"seeds", "jobs"}
    for r in data["records"]:
        assert r["kv_pairs"] == list(want["kv_pairs"]) and len(r["accuracy"]) == len(want["kv_pairs"])
        assert all(0.0 <= a <= 1.0 for a in r["accuracy"])
    assert len({r["state_size"] for r in data["records"]}) == 1
    assert data["env"]["device"] and data["env"]["date"] and data["env"]["torch"]


def test_stored_large_run_fails_the_check_when_gpu_config_changes(monkeypatch):
    """``same_as_gpu_config`` is a real comparison: change one setting and it turns False."""
    import experiments.mqar as mq
    monkeypatch.setattr(mq, "gpu_config", lambda **ch: gpu_config(steps=gpu_config().steps + 1, **ch))
    assert mq.load_stored_large()["same_as_gpu_config"] is False


def test_chapter_9s_stored_runs_are_found_by_their_own_config(tmp_path, monkeypatch):
    """Chapter 9's GPU sweeps (MesaNet added) live in their own file, checked against gpu_config() with
    Chapter 9's mixers: missing, the error names the command; stored with those settings, they match;
    stored with Chapter 6's four mixers, they do not."""
    import json
    import experiments.common
    import experiments.mqar as mq
    monkeypatch.setattr(experiments.common, "RESULTS_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="--large --mesanet"):
        mq.load_stored_mesanet()
    for mixers, same in ((mq.MESANET_MIXERS, True), (MIXERS, False)):
        cfg = {**gpu_config(mixers=mixers).as_dict(), "seeds": [0], "jobs": 1}
        cfg.pop("seed")
        cfg = json.loads(json.dumps(cfg))
        (tmp_path / f"{mq.STORED_MESANET}.json").write_text(json.dumps(
            {"name": mq.STORED_MESANET, "env": {"device": "test"}, "config": cfg, "records": []}))
        assert mq.load_stored_mesanet()["same_as_gpu_config"] is same


_TINY = dict(kv_pairs=(2, 4), vocab_size=16, seq_len=12, d_model=16, head_dim=8, steps=4, batch=4, eval_batch=8)


def test_seeds_in_processes_equal_seeds_in_turn():
    """Two seeds in two spawned processes give the records of the same seeds run one after the
    other (the seed, not the process, fixes a run), timings aside."""
    cfg = cpu_config(mixers=("linear", "deltanet"), **_TINY)
    a = run_mqar_seeds(cfg, [0, 3], jobs=1, loss_every=1)
    b = run_mqar_seeds(cfg, [0, 3], jobs=2, loss_every=1)
    strip = lambda recs: [{k: v for k, v in r.items() if k != "train_seconds"} for r in recs]
    assert strip(a["records"]) == strip(b["records"])
    assert [(r["seed"], r["mixer"]) for r in a["records"]] == [(0, "linear"), (0, "deltanet"), (3, "linear"), (3, "deltanet")]
    assert a["config"]["seeds"] == [0, 3] and a["config"]["jobs"] == 1 and b["config"]["jobs"] == 2
    assert "seed" not in a["config"]
    # different seeds are different runs
    assert a["records"][0]["losses"] != a["records"][2]["losses"]
    for bad, match in (([], "seeds must be"), ([1, 1], "seeds must be"), ([0.5], "seeds must be")):
        with pytest.raises(ValueError, match=match):
            run_mqar_seeds(cfg, bad)
    with pytest.raises(ValueError, match="jobs must be an integer >= 1"):
        run_mqar_seeds(cfg, [0], jobs=0)
    with pytest.raises(ValueError, match="loss_every must be an integer >= 1"):
        run_mqar_seeds(cfg, [0], loss_every=0)


def test_seed_summary_by_hand():
    recs = [{"mixer": "a", "seed": 0, "kv_pairs": [1, 2], "accuracy": [1.0, 0.5]},
            {"mixer": "b", "seed": 0, "kv_pairs": [1, 2], "accuracy": [1.0, 0.25]},
            {"mixer": "a", "seed": 1, "kv_pairs": [1, 2], "accuracy": [0.5, 0.0]},
            {"mixer": "b", "seed": 1, "kv_pairs": [1, 2], "accuracy": [0.75, 0.5]}]
    s = seed_summary(recs)
    assert s["seeds"] == [0, 1] and s["kv_pairs"] == [1, 2]
    assert s["mean"] == {"a": [0.75, 0.25], "b": [0.875, 0.375]}
    assert s["min"] == {"a": [0.5, 0.0], "b": [0.75, 0.25]} and s["max"] == {"a": [1.0, 0.5], "b": [1.0, 0.5]}
    assert s["first"] == {"a": [1, 1], "b": [2, 1]}          # the tie at seed 0, N = 1 counts for both
    with pytest.raises(ValueError, match="every seed for every mixer"):
        seed_summary(recs[:3])
    with pytest.raises(ValueError, match="same kv_pairs"):
        seed_summary([recs[0], {**recs[1], "kv_pairs": [1, 3]}])
    with pytest.raises(ValueError, match="at least one record"):
        seed_summary([])
