"""Chapter 10's experiment (experiments.short_conv): the convolution's gradients in closed form, the
tied mixer (K = V exactly where it should be, the book's delta rule, its state in
closed form), the variants' parameters, the 1/N guess, seeding, bad input, a tiny run, the
chapter's claims on its CPU run, the GPU setting's code path and the stored-results loader.

Tolerances: the convolution's gradients are compared in float64, where autograd differs from the closed form
by round-off, ~1e-16 on values of size ~1; 1e-10 leaves room and still fails by O(1) for a wrong
tap. The delta-rule op takes float32 only, so the mixer is compared with float64 references at
1e-4 (float32 round-off over 70 tokens is ~1e-6)."""
import json
import math

import numpy as np
import pytest
import torch

import lattn_core as lc
from experiments import short_conv as sc
from kernels.reference import causal_conv1d_ref


# ------------------------------------------------------------------ the convolution's gradients
@pytest.mark.parametrize("T,W", [(1, 4), (10, 4), (7, 2), (3, 5)])
def test_gradients_in_closed_form(T, W):
    """lc.short_conv_grads (dX_s = Σ_i ψ_i ⊙ dY_{s+i}, dψ_i = Σ_t dY_t ⊙ x_{t−i}) = float64
    autograd through the op's reference (kernels.reference.causal_conv1d_ref, fla's layout), the
    weight converted by lc.conv_weight_from_fla (round-off ~1e-16: 1e-10). The op itself, its
    state and its input checks are tested in tests/test_kernel_conv.py."""
    g = torch.Generator().manual_seed(T + 100 * W)
    x = torch.randn(1, T, 4, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, W, generator=g, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(1, T, 4, generator=g, dtype=torch.float64)
    dx, dw = torch.autograd.grad(causal_conv1d_ref(x, w)[0], (x, w), dy)
    dX, dW = lc.short_conv_grads(x[0].detach().numpy(), lc.conv_weight_from_fla(w.detach().numpy()),
                                 dy[0].numpy())
    lc.check_close("dX in closed form = autograd", dX, dx[0].numpy(), 1e-10)
    lc.check_close("dW in closed form = autograd", dW, lc.conv_weight_from_fla(dw.numpy()), 1e-10)


# ------------------------------------------------------------------ the models
def test_variants_differ_only_where_they_say():
    """'none' and 'q' give k = v exactly; 'k', 'v', 'qkv', 'untied' do not. The parameters are
    the shared ones plus one convolution per named place (and a value projection for 'untied')."""
    torch.manual_seed(0)
    x = torch.randn(2, 9, 16)
    shared = {"q_proj.weight", "kv_proj.weight", "b_proj.weight", "b_proj.bias", "o_proj.weight"}
    for v in sc.VARIANTS:
        mix = sc.TiedDeltaNetMixer(v, 16, 2, 8, conv_width=4)
        _, k, vv = mix.qkv(x)
        assert torch.equal(k, vv) == (v in ("none", "q")), v
        names = {n for n, _ in mix.named_parameters()}
        extra = {f"convs.{c}.weight" for c in sc.CONVS[v]} | ({"v_proj.weight"} if v == "untied" else set())
        assert names == shared | extra, (v, names)
        for c in sc.CONVS[v]:
            assert tuple(mix.convs[c].weight.shape) == (16, 4)
            assert mix.convs[c].weight.abs().max() <= 0.5       # Conv1d's bound 1/sqrt(4)
    with pytest.raises(ValueError, match="variant must be one of"):
        sc.TiedDeltaNetMixer("kv", 16, 2, 8)


@pytest.mark.parametrize("variant", ["none", "qkv"])
def test_mixer_is_lattn_cores_deltanet_and_its_tied_state_the_closed_form(variant):
    """The mixer's output = o_proj of lc.deltanet_recurrent per head on the layer's own q, k, v,
    beta (scale 1); the op's final state [K, V] is Sᵀ; with K = V ('none') S is
    lc.tied_deltanet_state(k, beta), I minus the product of the transitions. The op runs in
    float32 (its dtypes), the references in float64 on the same q, k, v, beta: float32 round-off
    on O(1) entries over 70 tokens (two chunks of 64) is ~1e-6; 1e-4 still catches a wrong beta,
    a transposed state or a missing token."""
    torch.manual_seed(1)
    mix = sc.TiedDeltaNetMixer(variant, 12, 2, 16)
    x = torch.randn(2, 70, 12)
    with torch.no_grad():
        out, S = mix(x, output_final_state=True)
        q, k, v = mix.qkv(x)
        beta = torch.sigmoid(mix.b_proj(x))
    heads = np.zeros((2, 70, 2, 16))
    for b in range(2):
        for h in range(2):
            Q, K, V, bt = (t[b, :, h].double().numpy() for t in (q, k, v, beta))
            heads[b, :, h] = lc.deltanet_recurrent(Q, K, V, bt)
            St = S[b, h].double().numpy().T
            lc.check_close("final state = Sᵀ", St, lc.deltanet_states(K, V, bt)[-1], 1e-4)
            if variant == "none":
                lc.check_close("K = V: S = I − Π(I − β k kᵀ)", St, lc.tied_deltanet_state(K, bt), 1e-4)
    with torch.no_grad():
        ref = mix.o_proj(torch.tensor(heads, dtype=torch.float32).reshape(2, 70, 32))
    lc.check_close("mixer = lattn_core per head", out.numpy(), ref.numpy(), 1e-4)


def test_identity_gap_reads_the_final_state():
    """identity_gap(model, ids) = the mean over sequences and heads of lc.identity_gap of the
    op's final state (float32: 1e-5)."""
    torch.manual_seed(2)
    m = sc.ConvAblationModel("none", 20, d_model=16, n_heads=2, head_dim=16)
    ids = torch.randint(0, 20, (3, 30))
    with torch.no_grad():
        _, S = m.mix(m.norm(m.embed(ids)), output_final_state=True)
    want = np.mean([lc.identity_gap(S[b, h].double().numpy()) for b in range(3) for h in range(2)])
    assert abs(sc.identity_gap(m, ids) - want) < 1e-5


def test_guess_baseline():
    assert sc.guess_baseline([4, 8, 16]) == [0.25, 0.125, 0.0625]
    with pytest.raises(ValueError, match="kv_pairs must be an integer >= 1"):
        sc.guess_baseline([0])


# ------------------------------------------------------------------ training
TINY = sc.cpu_config(kv_pairs=(2, 4), vocab_size=16, seq_len=16, d_model=16, head_dim=16, steps=3,
                     batch=4, eval_batch=8, variants=("none", "k"))


def test_tiny_run_is_reproducible_and_complete():
    a, b = sc.run_short_conv(TINY), sc.run_short_conv(TINY)
    assert [r["variant"] for r in a["records"]] == ["none", "k"]
    for ra, rb in zip(a["records"], b["records"]):
        assert ra["accuracy"] == rb["accuracy"] and ra["losses"] == rb["losses"]
        assert len(ra["accuracy"]) == 2 and all(0 <= x <= 1 for x in ra["accuracy"])
        assert math.isfinite(ra["identity_gap"]) and ra["seed"] == 0
    c = sc.run_short_conv(sc.cpu_config(**{**TINY.as_dict(), "seed": 1}))
    assert any(ra["losses"] != rc["losses"] for ra, rc in zip(a["records"], c["records"]))


def test_variants_in_processes_equal_the_seed_in_turn():
    """jobs > 1 runs each (seed, variant) in its own spawned process and gives the records of the
    seeds run one after the other, timings aside: every variant of a seed starts from the same
    derived seeds, so splitting a seed by variant changes nothing. Stores how many ran at once."""
    a = sc.run_seeds(TINY, [0, 1])
    b = sc.run_seeds(TINY, [0, 1], jobs=4)
    strip = lambda recs: [{k: v for k, v in r.items() if k != "train_seconds"} for r in recs]
    assert strip(a["records"]) == strip(b["records"])
    assert [(r["seed"], r["variant"]) for r in b["records"]] == [(0, "none"), (0, "k"), (1, "none"), (1, "k")]
    assert "jobs" not in a["config"] and b["config"]["jobs"] == 4 and b["config"]["seeds"] == [0, 1]
    assert set(b["seconds"]) == {0, 1}
    with pytest.raises(ValueError, match="jobs must be an integer >= 1"):
        sc.run_seeds(TINY, [0], jobs=0)


def test_run_arguments_are_checked():
    with pytest.raises(ValueError, match="variants must be drawn from"):
        sc.run_short_conv(sc.cpu_config(**{**TINY.as_dict(), "variants": ("none", "kq")}))
    with pytest.raises(ValueError, match="variant must be one of"):
        sc.train_model("kq", TINY)
    with pytest.raises(ValueError, match="seeds must be a non-empty list"):
        sc.run_seeds(TINY, [])
    with pytest.raises(ValueError, match="num_kv_pairs must be"):
        sc.run_short_conv(sc.cpu_config(**{**TINY.as_dict(), "kv_pairs": (40,)}))
    with pytest.raises(ValueError, match="loss_every"):
        sc.run_short_conv(TINY, loss_every=0)


def test_seed_summary_and_sentences():
    recs = [{"variant": v, "seed": s, "kv_pairs": [4, 8], "accuracy": acc, "identity_gap": g}
            for v, s, acc, g in [("none", 0, [0.25, 0.125], 0.5), ("k", 0, [1.0, 0.9], 1.0),
                                 ("none", 1, [0.25, 0.125], 0.7), ("k", 1, [0.8, 0.7], 1.2)]]
    summ = sc.seed_summary(recs)
    assert summ["mean"]["k"] == pytest.approx([0.9, 0.8]) and summ["first"]["k"] == [2, 2]
    assert summ["identity_gap"] == pytest.approx({"none": 0.6, "k": 1.1})
    lines = sc.summary_sentences(summ)
    assert lines == ["conv on K: accuracy 0.90, 0.80 at N = 4, 8; state's distance from I 1.10",
                     "K = V, no conv: accuracy 0.25, 0.12 at N = 4, 8; state's distance from I 0.60"]


def test_the_chapters_claims_on_one_seed():
    """What the chapter says of its CPU run (seed 0, the run the notebook trains): the variants
    with a convolution on K reach at least 0.8 at every N; those without one (K = V, a convolution
    on Q, a convolution on V) stay within 0.05 of the 1/N guess at every N. About 30 s on two
    quiet cores."""
    run = sc.run_short_conv(sc.cpu_config(seed=0))
    sc.check_claims(run["accuracy"], sc.cpu_config().kv_pairs)


def test_check_claims_fails_where_a_claim_does():
    """``check_claims`` passes the chapter's shape and names the variant that breaks it."""
    good = {"k": [1.0, 0.9], "qkv": [0.85, 0.8], "none": [0.26, 0.13], "untied": [0.24, 0.12]}
    sc.check_claims(good, [4, 8])
    with pytest.raises(AssertionError, match="qkv"):
        sc.check_claims(dict(good, qkv=[0.9, 0.79]), [4, 8])
    with pytest.raises(AssertionError, match="untied"):
        sc.check_claims(dict(good, untied=[0.25, 0.2]), [4, 8])
    with pytest.raises(ValueError, match=r"accuracy\['k'\] must have one value per N"):
        sc.check_claims({"k": [1.0]}, [4, 8])


def test_the_chapters_claims_on_the_stored_gpu_runs():
    """What the chapter says of the stored GPU setting (``experiments/results/short_conv.json``,
    committed): the same claims hold in every seed, for all six variants, untied projections
    without a convolution among those at the guess."""
    stored = sc.load_stored()
    assert stored["same_as_gpu_config"]
    assert sorted(stored["config"]["seeds"]) == [0, 1, 2]
    assert {r["variant"] for r in stored["records"]} == set(sc.VARIANTS)
    for seed in stored["config"]["seeds"]:
        recs = [r for r in stored["records"] if r["seed"] == seed]
        sc.check_claims({r["variant"]: r["accuracy"] for r in recs}, stored["config"]["kv_pairs"])


def test_gpu_setting_runs_and_stores_through_main(tmp_path, monkeypatch, capsys):
    """The GPU setting's code path on a CPU (`--gpu --device cpu --steps 2`), with its batches
    shrunk so that the test stays short (`gpu_config` patched: the same shapes, variants and
    model, 4 training and 8 evaluation sequences, one thread): trained two steps, written with the device,
    date and versions, read back by load_stored (not the same settings as gpu_config's),
    summarised and plotted. A file written with gpu_config's own settings reads back as the same."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import experiments.common
    real = sc.gpu_config
    monkeypatch.setattr(experiments.common, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(sc, "gpu_config", lambda **ch: real(**{"batch": 4, "eval_batch": 8, "threads": 1, **ch}))
    with pytest.raises(FileNotFoundError, match="--gpu --seeds 0 1 2 --jobs 18 --write"):
        sc.load_stored()
    assert sc.main(["--gpu", "--device", "cpu", "--steps", "2", "--seeds", "0", "--write"]) == 0
    assert "wrote" in capsys.readouterr().out
    data = sc.load_stored()
    assert data["env"]["torch"] == torch.__version__ and not data["same_as_gpu_config"]
    assert data["config"]["kv_pairs"] == list(real().kv_pairs) and data["config"]["steps"] == 2
    assert data["config"]["seq_len"] == real().seq_len and data["config"]["head_dim"] == real().head_dim
    summ = sc.seed_summary(data["records"])
    assert set(summ["mean"]) == set(sc.VARIANTS)
    assert len(sc.summary_sentences(summ)) == len(sc.VARIANTS)
    fig, ax = plt.subplots()
    sc.plot_summary(summ, ax, "t")
    assert len(ax.get_lines()) == len(sc.VARIANTS) + 1          # the variants and the 1/N guess
    plt.close(fig)
    cfg = real().as_dict()
    cfg.pop("seed")
    cfg["seeds"] = [0]
    (tmp_path / f"{sc.STORED}.json").write_text(json.dumps(
        {"name": sc.STORED, "env": {"device": "test"}, "config": cfg, "records": data["records"]}))
    monkeypatch.setattr(sc, "gpu_config", real)
    assert sc.load_stored()["same_as_gpu_config"]


def test_pieces_of_the_gpu_setting_merge_into_one_file(tmp_path, monkeypatch, capsys):
    """`--only` runs some variants and `--write` merges them with the stored file (the GPU setting's
    code path on a CPU, batches shrunk as above): two calls of one variant each store both, in
    VARIANTS' order, each record with the env of its run; a re-run replaces its own records only;
    a run with other settings is refused rather than mixed in."""
    import experiments.common
    real = sc.gpu_config
    monkeypatch.setattr(experiments.common, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(sc, "gpu_config", lambda **ch: real(**{"batch": 4, "eval_batch": 8, "threads": 1, **ch}))
    run = ["--gpu", "--device", "cpu", "--steps", "2", "--write"]
    assert sc.main(run + ["--seeds", "0", "--only", "k"]) == 0
    assert sc.main(run + ["--seeds", "0", "1", "--only", "none"]) == 0
    data = json.loads((tmp_path / f"{sc.STORED}.json").read_text())
    assert [(r["seed"], r["variant"]) for r in data["records"]] == [(0, "none"), (0, "k"), (1, "none")]
    assert data["config"]["variants"] == ["none", "k"] and data["config"]["seeds"] == [0, 1]
    assert all(r["env"]["torch"] == torch.__version__ for r in data["records"])
    first_k = data["records"][1]["losses"]
    assert sc.main(run + ["--seeds", "0", "--only", "k"]) == 0          # the same piece again
    again = json.loads((tmp_path / f"{sc.STORED}.json").read_text())
    assert len(again["records"]) == 3 and again["records"][1]["losses"] == first_k
    with pytest.raises(ValueError, match="other settings"):
        sc.main(["--gpu", "--device", "cpu", "--steps", "3", "--write", "--seeds", "0", "--only", "k"])
    with pytest.raises(SystemExit):
        sc.main(run + ["--only", "kq"])
    capsys.readouterr()
