"""Chapter 7's multi-hop experiment (experiments.multihop): the data generator against a definition
written out token by token, the torch DeltaFormer layer against lattn_core's, the zero-temperature
matrices, the no-link baseline, seeding, bad input, a tiny run, the GPU setting's code path and the
stored-results loader.

Tolerances: the layer checks run in float64, where the model's mixer (kernels.deltaformer_attn's
PyTorch path: a batched softmax, a triangular solve, softmax attention) and lattn_core (NumPy,
SciPy's solve) differ only by round-off, ~1e-15 on outputs of size ~1 over a few dozen tokens; 1e-9
leaves six orders of headroom and still fails by orders of magnitude for a wrong mask, a missing
beta or a wrong scale."""
import json
import math
from collections import Counter

import numpy as np
import pytest
import torch

import lattn_core as lc
from experiments import multihop as mh


def decode(tok, n_vars, n_values):
    """The definition of the token ids, written out independently of experiments.multihop."""
    if tok == 0:
        return ("bos",)
    tok -= 1
    if tok < n_vars * n_values:
        return ("value", tok // n_values, tok % n_values)
    tok -= n_vars * n_values
    if tok < n_vars * n_vars:
        return ("copy", tok // n_vars, tok % n_vars)
    tok -= n_vars * n_vars
    assert tok < n_vars, tok
    return ("query", tok)


# ------------------------------------------------------------------ data
@pytest.mark.parametrize("n_vars,n_values,hops,c", [(26, 8, (1, 2, 3, 4), 2), (5, 2, (2,), 2),
                                                     (12, 3, (1, 5), 1), (40, 16, (3, 1, 6), 3)])
def test_every_answer_is_h_hops_away(n_vars, n_values, hops, c):
    x, y, hop = mh.make_variable_chains(n_vars, n_values, hops, c, batch=6, seed=11)
    T = mh.sequence_length(hops, c)
    n_stmt = c * sum(hops)
    assert x.shape == y.shape == hop.shape == (6, T) and x.dtype == torch.long
    assert T == 1 + n_stmt + c * len(hops)
    assert int(x.min()) >= 0 and int(x.max()) < mh.vocab_size(n_vars, n_values)
    for b in range(6):
        toks = [decode(int(t), n_vars, n_values) for t in x[b]]
        assert toks[0] == ("bos",) and all(t[0] in ("value", "copy") for t in toks[1:1 + n_stmt])
        assigned = {}                               # variable -> what it was given, in order
        for t in toks[1:1 + n_stmt]:
            assert t[1] not in assigned             # every variable is assigned once
            if t[0] == "copy":
                assert t[2] in assigned             # copied from a variable assigned before
            assigned[t[1]] = t
        per_hop = Counter()
        for pos in range(1 + n_stmt, T):
            kind, var = toks[pos]
            assert kind == "query"
            steps, node = 1, assigned[var]          # follow the links back to a value
            while node[0] == "copy":
                node, steps = assigned[node[2]], steps + 1
            assert int(hop[b, pos]) == steps and int(y[b, pos]) == node[2]
            per_hop[steps] += 1
        assert per_hop == Counter({h: c for h in hops})
        assert torch.all(y[b, :1 + n_stmt] == mh.IGNORE) and torch.all(hop[b, :1 + n_stmt] == 0)
        # no chain runs past its end: every variable is queried at most once, and only chain ends
        ends = [toks[p][1] for p in range(1 + n_stmt, T)]
        read = {t[2] for t in toks[1:1 + n_stmt] if t[0] == "copy"}
        assert len(set(ends)) == len(ends) and not set(ends) & read


def test_generator_is_seeded():
    a, b, c = (mh.make_variable_chains(26, 8, (1, 2, 3, 4), 2, 16, seed=s) for s in (5, 5, 6))
    assert all(torch.equal(u, v) for u, v in zip(a, b)) and not torch.equal(a[0], c[0])
    # the statements are interleaved, not laid out chain by chain: in 16 programs some link
    # points back more than one position
    A = [mh.link_matrices(a[0][i], 26, 8)[1] for i in range(16)]
    assert any(np.any(np.tril(B, -2)) for B in A)


def test_generator_rejects_bad_arguments():
    with pytest.raises(ValueError, match="n_vars must be at least the number of statements"):
        mh.make_variable_chains(19, 8, (1, 2, 3, 4), 2, 2, 0)
    with pytest.raises(ValueError, match="n_values must be an integer >= 2"):
        mh.make_variable_chains(26, 1, (1, 2), 1, 2, 0)
    with pytest.raises(ValueError, match="hops must be a non-empty sequence of distinct"):
        mh.make_variable_chains(26, 8, (1, 1), 1, 2, 0)
    with pytest.raises(ValueError, match="hops must be"):
        mh.make_variable_chains(26, 8, (0, 2), 1, 2, 0)
    with pytest.raises(ValueError, match="hops must be"):
        mh.make_variable_chains(26, 8, (), 1, 2, 0)
    with pytest.raises(ValueError, match="chains_per_hop must be an integer >= 1"):
        mh.make_variable_chains(26, 8, (1, 2), 0, 2, 0)
    with pytest.raises(ValueError, match="batch must be an integer >= 1"):
        mh.make_variable_chains(26, 8, (1, 2), 1, 0, 0)
    with pytest.raises(ValueError, match="n_vars must be <= 26"):
        mh.token_text([0], 27, 8)
    with pytest.raises(ValueError, match="ids must be tokens"):
        mh.token_text([10_000], 4, 2)
    with pytest.raises(ValueError, match="ids must be one sequence"):
        mh.link_matrices(torch.zeros(2, 3, dtype=torch.long), 4, 2)


def test_token_text_names_the_tokens():
    x, y, _ = mh.make_variable_chains(6, 4, (1, 2), 2, 1, seed=2)
    words = mh.token_text(x[0], 6, 4)
    assert words[0] == "BOS" and len(words) == x.shape[1]
    for w, t, tok in zip(words[1:], y[0, 1:].tolist(), x[0, 1:].tolist()):
        d = decode(tok, 6, 4)
        if d[0] == "query":
            assert w == f"{chr(97 + d[1])}?" and t >= 0
        elif d[0] == "value":
            assert w == f"{chr(97 + d[1])}={d[2]}" and t == mh.IGNORE
        else:
            assert w == f"{chr(97 + d[1])}={chr(97 + d[2])}" and t == mh.IGNORE


# ------------------------------------------------------------------ the zero-temperature solution
@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_link_matrices_follow_every_chain(beta):
    """With the exact link matrices, A (I + beta B)^{-1} V at a query h hops from its value is
    (-beta)^(h-1) times that value's one-hot vector: one layer, any number of hops. B's longest
    dependency chain is the longest chain of the program, so that many Neumann terms are exact
    and one fewer is not. Exact in float64 (sums of powers of 1/2), checked to 1e-12."""
    x, y, hop = mh.make_variable_chains(26, 8, (1, 2, 3, 4), 2, 4, seed=7)
    for b in range(4):
        A, B, V = mh.link_matrices(x[b], 26, 8)
        assert np.all(np.triu(B) == 0) and np.all(np.triu(A, 1) == 0)
        bet = np.full(len(V), beta)
        O = lc.delta_attention(A, B, V, bet)
        for i in np.nonzero(y[b].numpy() >= 0)[0]:
            want = np.zeros(8)
            want[int(y[b, i])] = (-beta) ** (int(hop[b, i]) - 1)
            lc.check_close(f"query at {i}, {int(hop[b, i])} hops", O[i], want, 1e-12)
        assert lc.dependency_chain_length(B) == 4
        errs = lc.neumann_errors(A, B, V, bet)
        assert errs[-1] < 1e-12 and errs[-2] > 0.1, errs


def test_mode_baseline_is_the_most_common_value_guess():
    x, y, hop = mh.make_variable_chains(26, 8, (1, 2, 3, 4), 2, 64, seed=3)
    got = mh.mode_baseline(x, y, hop, (1, 2, 3, 4), 26, 8)
    want = {h: [] for h in (1, 2, 3, 4)}
    for b in range(64):
        vals = Counter(d[2] for d in (decode(int(t), 26, 8) for t in x[b]) if d[0] == "value")
        top = [v for v, n in vals.items() if n == max(vals.values())]
        for i in np.nonzero(y[b].numpy() >= 0)[0]:
            want[int(hop[b, i])].append((int(y[b, i]) in top) / len(top))
    # the same average of the same fractions in another order: round-off only
    assert np.allclose(got, [np.mean(want[h]) for h in (1, 2, 3, 4)], atol=1e-6, rtol=0)
    assert 0.15 < min(got) and max(got) < 0.5     # eight values from eight, ~0.3: not 1/8


# ------------------------------------------------------------------ the layers
def _per_head(q, k, v, beta, scale, fn):
    """lattn_core's reference head by head on [B, T, H, D] tensors; scale·q·k through
    sqrt(scale) q, k (lattn_core scores with q·k as it stands)."""
    r = math.sqrt(scale)
    out = [[fn(r * q[b, :, h].numpy(), r * k[b, :, h].numpy(), v[b, :, h].numpy(),
               None if beta is None else beta[b, :, h].numpy()) for h in range(q.shape[2])]
           for b in range(q.shape[0])]
    return torch.tensor(np.array(out)).permute(0, 2, 1, 3)         # [B, T, H, D]


def test_cpu_deltaformer_is_lattn_cores_in_float64():
    """The PyTorch DeltaFormer the CPU runs train through (kernels.reference.deltaformer_ref, what
    kernels.deltaformer_attn calls on a CPU: a batched softmax, one unit-triangular solve, softmax
    attention) = lc.deltaformer (normalised, with beta) head by head, in float64, to 1e-9; with
    beta near zero it is plain softmax attention, far from it."""
    from kernels.reference import deltaformer_ref
    g = torch.Generator().manual_seed(0)
    B, T, H, D, Dv = 2, 23, 3, 5, 4
    q, k = (torch.randn(B, T, H, D, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, T, H, Dv, generator=g, dtype=torch.float64)
    beta = torch.rand(B, T, H, generator=g, dtype=torch.float64)
    scale = D ** -0.5
    out = deltaformer_ref(q, k, v, beta, scale)
    ref = _per_head(q, k, v, beta, scale, lambda Q, K, V, b: lc.deltaformer(Q, K, V, True, b))
    lc.check_close("deltaformer_ref = lc.deltaformer (float64)", out.numpy(), ref.numpy(), 1e-9)
    soft = _per_head(q, k, v, None, scale, lambda Q, K, V, b: lc.softmax_attention(Q, K, V))
    assert np.abs(out.numpy() - soft.numpy()).max() > 1e-2
    leaves = [t[:1, :7].clone().requires_grad_(True) for t in (q, k, v, beta)]
    assert torch.autograd.gradcheck(lambda *a: deltaformer_ref(*a, scale), leaves)


@pytest.mark.parametrize("mixer", ["deltaformer", "softmax"])
def test_model_layers_are_lattn_cores_references(mixer):
    """The model's mixer (its projections, kernels.deltaformer_attn or flash_attention, its output
    projection) in float32 = the same projections around lc.deltaformer (normalised, with beta) or
    lc.softmax_attention in float64, head by head, scale head_dim^-1/2. float32 round-off on
    outputs of size ~1 through a 23-token triangular solve is ~1e-6: 1e-5."""
    torch.manual_seed(0)
    mix = mh.AttentionMixer(mixer, d_model=8, n_heads=2, head_dim=4)
    x = torch.randn(2, 23, 8)
    fn = ((lambda Q, K, V, b: lc.deltaformer(Q, K, V, True, b)) if mixer == "deltaformer"
          else (lambda Q, K, V, b: lc.softmax_attention(Q, K, V)))
    with torch.no_grad():
        out = mix(x)
        q, k, v = (t.double() for t in mix.qkv(x))
        beta = mix.beta(x).double() if mixer == "deltaformer" else None
        heads = _per_head(q, k, v, beta, 0.5, fn)
        ref = mix.o_proj.double()(heads.reshape(2, 23, 8))
    lc.check_close(f"model's {mixer} mixer = lattn_core per head", out.numpy(), ref.numpy(), 1e-5)
    with pytest.raises(ValueError, match="mixer must be"):
        mh.MultihopModel("mamba", 4, 2)
    with pytest.raises(ValueError, match="mixer must be 'softmax' or 'deltaformer'"):
        mh.AttentionMixer("deltanet", 6, 2, 3)


def test_deltanet_model_uses_the_books_delta_rule():
    """The DeltaNet model's mixer is experiments.mqar's TokenMixer (kernels.chunk_delta_rule), with
    no short convolution, and has the same projections as DeltaFormer's."""
    from experiments.mqar import TokenMixer
    m = mh.MultihopModel("deltanet", 6, 3, d_model=16, n_heads=2)
    f = mh.MultihopModel("deltaformer", 6, 3, d_model=16, n_heads=2)
    assert isinstance(m.mix, TokenMixer) and m.mix.convs is None and m.mix.mixer == "deltanet"
    shapes = lambda mod: sorted((n, tuple(p.shape)) for n, p in mod.mix.named_parameters())
    assert shapes(m) == shapes(f)


def test_link_weight_reads_the_pre_attention_at_the_links():
    """link_weight against its definition written out with loops: for each copy statement t
    (decoded independently) and the earlier statement j assigning what it copies, the largest over
    heads of exp(s_tj) / sum_{i<t} exp(s_ti) with s = head_dim^-1/2 k_t·k_i, averaged; and the mean
    of 1/t. float64 sums over at most 28 terms: 1e-9."""
    torch.manual_seed(2)
    x, _, _ = mh.make_variable_chains(26, 8, (1, 2, 3, 4), 2, 3, seed=9)
    m = mh.MultihopModel("deltaformer", 26, 8, d_model=16, n_heads=2)
    got, even = mh.link_weight(m, x, 26, 8)
    with torch.no_grad():
        k = m.mix.qkv(m.norm(m.embed(x)))[1].double()                 # [B, T, H, D]
    want, want_even = [], []
    for b in range(3):
        toks = [decode(int(t), 26, 8) for t in x[b]]
        where = {}
        for t, tok in enumerate(toks):
            if tok[0] == "copy":
                j = where[tok[2]]
                w = []
                for h in range(2):
                    s = [float(k[b, t, h] @ k[b, i, h]) / math.sqrt(8) for i in range(t)]
                    w.append(math.exp(s[j] - max(s)) / sum(math.exp(z - max(s)) for z in s))
                want.append(max(w))
                want_even.append(1 / t)
            if tok[0] in ("value", "copy"):
                where[tok[1]] = t
    assert abs(got - np.mean(want)) < 1e-9 and abs(even - np.mean(want_even)) < 1e-9
    assert 0 < got < 1
    with pytest.raises(ValueError, match="model must be a 'deltaformer'"):
        mh.link_weight(mh.MultihopModel("softmax", 26, 8, d_model=16, n_heads=2), x, 26, 8)


# ------------------------------------------------------------------ training
TINY = mh.cpu_config(hops=(1, 2), chains_per_hop=2, n_vars=8, n_values=3, d_model=16,
                     n_heads=2, steps=4, batch=4, eval_batch=8, threads=1)


def test_tiny_run_is_reproducible_and_complete():
    a = mh.run_multihop(TINY)
    b = mh.run_multihop(TINY)
    assert [r["mixer"] for r in a["records"]] == list(mh.MIXERS)
    for ra, rb in zip(a["records"], b["records"]):
        assert ra["accuracy"] == rb["accuracy"] and ra["losses"] == rb["losses"]
        assert len(ra["accuracy"]) == len(ra["baseline"]) == 2 and np.isfinite(ra["loss"])
        assert all(0 <= x <= 1 for x in ra["accuracy"] + ra["baseline"])
    assert a["records"][0]["baseline"] == a["records"][2]["baseline"]     # one evaluation set
    c = mh.run_multihop(mh.cpu_config(**{**TINY.as_dict(), "seed": 1}))
    assert any(ra["losses"] != rc["losses"] for ra, rc in zip(a["records"], c["records"]))


def test_training_lowers_the_loss():
    cfg = mh.cpu_config(**{**TINY.as_dict(), "steps": 60, "mixers": ("deltaformer",)})
    r = mh.train_model("deltaformer", cfg)
    first, last = np.mean(r["losses"][:5]), np.mean(r["losses"][-5:])
    assert last < first - 0.1, (first, last)


def test_run_arguments_are_checked():
    with pytest.raises(ValueError, match="mixers must be drawn from"):
        mh.run_multihop(mh.cpu_config(**{**TINY.as_dict(), "mixers": ("softmax", "rwkv")}))
    with pytest.raises(ValueError, match="seeds must be a non-empty list"):
        mh.run_seeds(TINY, [0, 0])
    with pytest.raises(ValueError, match="mixer must be one of"):
        mh.train_model("rwkv", TINY)
    with pytest.raises(ValueError, match="loss_every"):
        mh.run_multihop(TINY, loss_every=0)


def test_gpu_setting_runs_and_stores_through_main(tmp_path, monkeypatch, capsys):
    """The GPU setting's code path on a CPU (`--gpu --device cpu --steps 2`): its task shape and
    model, trained two steps, written with the device, date and versions, read back by
    load_stored (which says the settings differ from gpu_config's: two steps, a CPU), summarised
    and plotted. A file written with gpu_config's own settings reads back as the same."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import experiments.common
    monkeypatch.setattr(experiments.common, "RESULTS_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="--gpu --write"):
        mh.load_stored()
    assert mh.main(["--gpu", "--device", "cpu", "--steps", "2", "--seeds", "0", "--write"]) == 0
    assert "wrote" in capsys.readouterr().out
    data = mh.load_stored()
    assert data["env"]["torch"] == torch.__version__ and not data["same_as_gpu_config"]
    assert data["config"]["hops"] == list(mh.gpu_config().hops) and data["config"]["steps"] == 2
    summ = mh.seed_summary(data["records"])
    assert summ["hops"] == list(mh.gpu_config().hops) and set(summ["mean"]) == set(mh.MIXERS)
    assert len(mh.summary_sentences(summ)) == len(summ["hops"])
    fig, ax = plt.subplots()
    mh.plot_summary(summ, ax, "t")
    assert len(ax.get_lines()) == 4                # three models and the baseline
    plt.close(fig)
    cfg = mh.gpu_config().as_dict()
    cfg.pop("seed")
    cfg["seeds"] = [0]
    (tmp_path / f"{mh.STORED}.json").write_text(json.dumps(
        {"name": mh.STORED, "env": {"device": "test"}, "config": cfg,
         "records": data["records"]}))
    assert mh.load_stored()["same_as_gpu_config"]


def test_seed_summary_and_sentences():
    recs = [{"mixer": m, "seed": s, "hops": [1, 2], "accuracy": acc, "baseline": [0.3, 0.2 + s / 10]}
            for m, s, acc in [("softmax", 0, [1.0, 0.3]), ("deltanet", 0, [0.9, 0.8]),
                              ("softmax", 1, [1.0, 0.3]), ("deltanet", 1, [1.0, 0.6])]]
    summ = mh.seed_summary(recs)
    assert summ["mean"]["deltanet"] == pytest.approx([0.95, 0.7])
    assert summ["first"] == {"softmax": [2, 0], "deltanet": [1, 2]}
    assert summ["baseline"] == pytest.approx([0.3, 0.25])
    lines = mh.summary_sentences(summ)
    assert lines[1] == ("2 hops: DeltaNet 0.700, softmax attention 0.300 (DeltaNet first in 2 of 2 "
                        "seeds); most common value 0.250")
    one = mh.summary_sentences(mh.seed_summary([r for r in recs if r["seed"] == 0]))
    assert one[0] == ("1 hop: softmax attention 1.000, DeltaNet 0.900; most common value 0.300")


def test_the_chapters_claims_on_one_seed():
    """What the chapter says of its CPU run (seed 0, the run the notebook trains): every model
    learns the one-hop lookup; softmax attention and DeltaFormer stay within 0.05 of the
    most-common-value guess at every hop count beyond one (so the chapter says this budget did not
    teach DeltaFormer to follow a link); DeltaNet beats that guess by more than 0.2 at two hops and
    its accuracy falls with every further hop. About 30 s on two cores."""
    run = mh.run_multihop(mh.cpu_config(seed=0))
    acc = run["accuracy"]
    base = run["records"][0]["baseline"]
    assert min(a[0] for a in acc.values()) > 0.9, acc
    for m in ("softmax", "deltaformer"):
        assert max(abs(a - b) for a, b in zip(acc[m][1:], base[1:])) < 0.05, (m, acc[m], base)
    assert acc["deltanet"][1] > base[1] + 0.2, acc
    assert all(a > b for a, b in zip(acc["deltanet"], acc["deltanet"][1:])), acc
