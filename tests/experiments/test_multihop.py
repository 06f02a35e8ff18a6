"""The multi-hop experiment (experiments.multihop): the data generator against a definition written
out token by token, the curriculum, the shared embedding, the torch DeltaFormer layer (beta in (0, 1)
and free) against lattn_core's, the zero-temperature matrices and the hand-set layer, the no-link
baseline, seeding, bad input, a tiny run, the learning-rate grid, the claims on constructed runs,
the GPU setting's code path and the stored-results loader.

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


@pytest.mark.parametrize("mixer,free", [("deltaformer", False), ("deltaformer", True), ("softmax", False)])
def test_model_layers_are_lattn_cores_references(mixer, free):
    """The model's mixer (its projections, kernels.deltaformer_attn or flash_attention, its output
    projection) in float32 = the same projections around lc.deltaformer (normalised, with beta) or
    lc.softmax_attention in float64, head by head, scale head_dim^-1/2; with ``free_beta`` beta is
    the projection itself (negative somewhere here), else its sigmoid. float32 round-off on
    outputs of size ~1 through a 23-token triangular solve is ~1e-6: 1e-5."""
    torch.manual_seed(0)
    mix = mh.AttentionMixer(mixer, d_model=8, n_heads=2, head_dim=4, free_beta=free)
    x = torch.randn(2, 23, 8)
    def delta_ref(Q, K, V, b):
        # lc.deltaformer takes beta in (0, 2]; a free beta goes through its normalised matrices
        if not free:
            return lc.deltaformer(Q, K, V, True, b)
        A, B = lc.deltaformer_matrices(Q, K, normalize=True)
        return A @ np.linalg.solve(np.eye(len(V)) + b[:, None] * B, V)
    fn = delta_ref if mixer == "deltaformer" else (lambda Q, K, V, b: lc.softmax_attention(Q, K, V))
    with torch.no_grad():
        out = mix(x)
        q, k, v = (t.double() for t in mix.qkv(x))
        beta = mix.beta(x).double() if mixer == "deltaformer" else None
        if beta is not None:
            raw = mix.b_proj(x)
            assert torch.equal(beta, (raw if free else torch.sigmoid(raw)).double())
            assert (beta.min() < 0) == free
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
    mix = m.mixers[0]
    assert isinstance(mix, TokenMixer) and mix.convs is None and mix.mixer == "deltanet"
    shapes = lambda mod: sorted((n, tuple(p.shape)) for n, p in mod.mixers.named_parameters())
    assert shapes(m) == shapes(f)
    # the positive control: two blocks of softmax attention, each with the same parameters as the
    # one-layer model's block
    two = mh.MultihopModel("softmax2", 6, 3, d_model=16, n_heads=2)
    one = mh.MultihopModel("softmax", 6, 3, d_model=16, n_heads=2)
    assert len(two.mixers) == len(two.mlps) == len(two.norms) == 2 and len(one.mixers) == 1
    n_par = lambda mod: sum(p.numel() for p in mod.parameters())
    assert n_par(two) - n_par(one) == n_par(one.mixers[0]) + n_par(one.mlps[0]) + n_par(one.norms[0])


def test_one_table_of_variables_for_names_and_reads():
    """A statement's embedding is kind + as_name(var[name]) + as_read(var[read]) + value: with the
    role maps set to the identity, the copy ``x=y`` and the pair ``x=v``, ``y=v`` differ by exactly
    what their definitions say, so the variable y enters the copy through the same table row as
    it enters ``y=v``."""
    n_vars, n_values = 6, 3
    emb = mh.StatementEmbedding(n_vars, n_values, 8)
    with torch.no_grad():
        emb.as_name.weight.copy_(torch.eye(8))
        emb.as_read.weight.copy_(torch.eye(8))
    tok_value = lambda x, v: 1 + x * n_values + v
    tok_copy = lambda x, y: 1 + n_vars * n_values + x * n_vars + y
    with torch.no_grad():
        e = lambda t: emb(torch.tensor([t]))[0]
        copy, val_x, val_y = e(tok_copy(1, 4)), e(tok_value(1, 2)), e(tok_value(4, 2))
        want = (emb.kind.weight[2] + emb.var.weight[1] + emb.var.weight[4] + emb.value.weight[n_values])
        lc.check_close("x=y from its parts", copy.numpy(), want.numpy(), 1e-6)
        # y's row: the same in the read slot of x=y and the name slot of y=v
        read_y = copy - emb.var.weight[1] - emb.kind.weight[2] - emb.value.weight[n_values]
        name_y = val_y - emb.kind.weight[1] - emb.value.weight[2] - emb.var.weight[n_vars]
        lc.check_close("one row for y in both roles", read_y.numpy(), name_y.numpy(), 1e-6)
    assert not torch.allclose(val_x, val_y)


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
        k = m.mixers[0].qkv(m.norms[0](m.embed(x)))[1].double()       # [B, T, H, D]
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
    with pytest.raises(ValueError, match="model must be a one-layer DeltaFormer"):
        mh.link_weight(mh.MultihopModel("softmax", 26, 8, d_model=16, n_heads=2), x, 26, 8)


def test_beta_by_kind_averages_beta_per_statement_kind():
    """beta_by_kind against its definition: per head, the mean of the layer's beta over the copy
    statements and over the x=v statements (decoded independently)."""
    torch.manual_seed(3)
    x, _, _ = mh.make_variable_chains(26, 8, (1, 2, 3), 2, 4, seed=1)
    m = mh.MultihopModel("deltaformer_free", 26, 8, d_model=16, n_heads=2)
    got = mh.beta_by_kind(m, x, 26, 8)
    with torch.no_grad():
        beta = m.mixers[0].b_proj(m.norms[0](m.embed(x)))            # free: the projection itself
    kinds = [[decode(int(t), 26, 8)[0] for t in row] for row in x]
    for name in ("copy", "value"):
        sel = torch.tensor([[k == name for k in row] for row in kinds])
        want = beta[sel].mean(0)
        lc.check_close(f"mean beta at {name}", np.array(got[name]), want.numpy(), 1e-6)
    with pytest.raises(ValueError, match="one-layer DeltaFormer"):
        mh.beta_by_kind(mh.MultihopModel("softmax2", 26, 8, d_model=16, n_heads=2), x, 26, 8)


# ------------------------------------------------------------------ the curriculum and the ceiling
def test_curriculum_stages_add_hop_counts_and_keep_programs_within_the_full_size():
    """Over the first `curriculum` share of the steps the hop counts come in as many equal stages
    (the k smallest in stage k), with c·K // k chains of each; after it, the full programs. No
    stage's program has more statements than a full one (so n_vars always suffices)."""
    hops, c, steps = (1, 2, 3, 4), 2, 400
    stages = [mh.curriculum_stage(s, steps, hops, c, 0.5) for s in range(steps)]
    assert stages[0] == ((1,), 8) and stages[49] == ((1,), 8) and stages[50] == ((1, 2), 4)
    assert stages[100] == ((1, 2, 3), 2) and stages[150] == ((1, 2, 3, 4), 2) == stages[-1]
    assert [s for s in range(1, steps) if stages[s] != stages[s - 1]] == [50, 100, 150]
    full = c * sum(hops)
    assert all(ch * sum(hs) <= full for hs, ch in stages)
    assert all(mh.curriculum_stage(s, steps, hops, c, 0.0) == (hops, c) for s in (0, 399))
    assert mh.curriculum_stage(0, steps, (3, 1, 2), c, 0.5) == ((1,), 6)      # sorted hop counts
    with pytest.raises(ValueError, match=r"curriculum must lie in \[0, 1\]"):
        mh.curriculum_stage(0, steps, hops, c, 1.5)


@pytest.mark.parametrize("free", [True, False])
def test_the_hand_set_layer_answers_every_hop_and_needs_its_temperature(free):
    """The hand-set DeltaFormer layer (kernels.deltaformer_attn on one-hot queries and keys, beta -1
    or just inside (0, 1) at copies) answers every query of every hop count at the module's scale;
    at a scale of 0.1 its softmaxes are nearly flat and it does not (so the check can fail)."""
    hops = (1, 2, 3, 4)
    x, y, hop = mh.make_variable_chains(32, 8, hops, 2, 64, seed=5)
    acc = mh.handset_accuracy(x, y, hop, hops, 32, 8, free=free)
    assert min(acc) >= 0.99, acc
    flat = mh.handset_accuracy(x, y, hop, hops, 32, 8, free=free, scale=0.1)
    assert max(flat[1:]) < 0.6, flat


def test_the_hand_set_layer_is_the_link_matrices_at_a_high_temperature():
    """At a scale of 40 the hand-set layer's output on one program is A (I + Diag(beta) B)^{-1} V
    with the exact 0/1 link matrices (mh.link_matrices) and beta = -1 at copies: the softmax's
    leak is e^-40 per token, far below float32's round-off (the op runs in float32: outputs of
    size 1 through a 29-token solve, ~1e-6; 1e-5)."""
    import kernels
    x, y, hop = mh.make_variable_chains(26, 8, (1, 2, 3, 4), 2, 1, seed=4)
    A, B, V = mh.link_matrices(x[0], 26, 8)
    kinds = [decode(int(t), 26, 8)[0] for t in x[0]]
    beta = np.array([-1.0 if k == "copy" else 0.0 for k in kinds])
    want = A @ np.linalg.solve(np.eye(len(V)) + beta[:, None] * B, V)   # beta 0 and -1: by hand
    parts = mh._parts(26, 8)[x[0]]
    one = lambda i, n: torch.nn.functional.one_hot(i, n + 1)[:, :n].float()
    stmt = torch.tensor([k in ("value", "copy") for k in kinds], dtype=torch.float32)[:, None]
    k = (one(parts[:, 1], 26) + one(parts[:, 2], 26)) * stmt
    q = one(parts[:, 1], 26) * torch.tensor([k_ == "query" for k_ in kinds], dtype=torch.float32)[:, None]
    v = one(parts[:, 3], 8)
    o = kernels.deltaformer_attn(q[None, :, None], k[None, :, None], v[None, :, None],
                                 torch.tensor(beta, dtype=torch.float32)[None, :, None], scale=40.0)[0, :, 0]
    rows = np.flatnonzero(y[0].numpy() >= 0)
    lc.check_close("hand-set layer at the queries = exact link matrices", o.double().numpy()[rows],
                   want[rows], 1e-5)
    assert np.all(want[rows].max(1) == 1.0)                        # beta = -1: every value with +1


# ------------------------------------------------------------------ training
TINY = mh.cpu_config(mixers=("softmax", "softmax2", "deltaformer", "deltaformer_free"), hops=(1, 2),
                     chains_per_hop=2, n_vars=8, n_values=3, d_model=16, n_heads=2, steps=4, batch=4,
                     eval_batch=8, threads=1)


def test_tiny_run_is_reproducible_and_complete():
    a = mh.run_multihop(TINY)
    b = mh.run_multihop(TINY)
    assert [r["mixer"] for r in a["records"]] == list(TINY.mixers)
    for ra, rb in zip(a["records"], b["records"]):
        assert ra["accuracy"] == rb["accuracy"] and ra["losses"] == rb["losses"]
        assert len(ra["accuracy"]) == len(ra["baseline"]) == len(ra["ceiling"]) == 2
        assert np.isfinite(ra["loss"]) and all(0 <= x <= 1 for x in ra["accuracy"] + ra["baseline"])
        assert (ra["beta"] is not None) == ra["mixer"].startswith("deltaformer")
    assert a["records"][0]["baseline"] == a["records"][2]["baseline"]     # one evaluation set
    c = mh.run_multihop(mh.cpu_config(**{**TINY.as_dict(), "seed": 1}))
    assert any(ra["losses"] != rc["losses"] for ra, rc in zip(a["records"], c["records"]))


def test_training_lowers_the_loss():
    cfg = mh.cpu_config(**{**TINY.as_dict(), "steps": 60, "lr": 1e-2, "curriculum": 0.0,
                           "mixers": ("deltaformer_free",)})
    r = mh.train_model("deltaformer_free", cfg)
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
    with pytest.raises(ValueError, match="curriculum must lie"):
        mh.run_multihop(mh.cpu_config(**{**TINY.as_dict(), "curriculum": -0.1}))
    with pytest.raises(ValueError, match="grid_seed must not be one of the seeds"):
        mh.run_seeds(mh.cpu_config(**{**TINY.as_dict(), "lr_grid": (1e-3, 1e-2), "grid_seed": 0}), [0])
    with pytest.raises(ValueError, match="lr_grid must hold distinct positive"):
        mh.run_seeds(mh.cpu_config(**{**TINY.as_dict(), "lr_grid": (0.0,)}), [0])


def test_the_grid_picks_each_models_best_rate_on_the_grid_seed_then_runs_the_seeds():
    """run_seeds: every mixer at every rate of the grid on grid_seed, the rate with the best mean
    accuracy over the hop counts chosen per mixer (recomputed here from the stored search), then
    every seed at it; the records are those of run_multihop at that rate and seed, in one process
    or in two."""
    from dataclasses import replace
    cfg = replace(TINY, mixers=("softmax", "deltaformer_free"), lr_grid=(1e-3, 3e-2), grid_seed=7, steps=6)
    out = mh.run_seeds(cfg, [0, 1])
    grid = out["grid"]
    assert [(r["mixer"], r["lr"], r["seed"]) for r in grid] == [(m, lr, 7) for m in cfg.mixers for lr in cfg.lr_grid]
    chosen = {c["unit"]: c["lr"] for c in out["config"]["lr_choice"]}
    for m in cfg.mixers:
        rows = [r for r in grid if r["mixer"] == m]
        assert all(r["score"] == pytest.approx(np.mean(r["accuracy"])) for r in rows)
        best = max(rows, key=lambda r: (r["score"], -r["lr"]))["lr"]
        assert chosen[m] == best
        direct = mh.run_multihop(replace(cfg, seed=1, lr=best, mixers=(m,)))["records"][0]
        rec = next(r for r in out["records"] if r["mixer"] == m and r["seed"] == 1)
        assert rec["accuracy"] == direct["accuracy"] and rec["lr"] == best
    assert out["config"]["seeds"] == [0, 1] and "seed" not in out["config"]
    two = mh.run_seeds(cfg, [0, 1], jobs=2)
    strip = lambda recs: [{k: v for k, v in r.items() if k != "train_seconds"} for r in recs]
    assert strip(two["records"]) == strip(out["records"]) and two["config"]["jobs"] == 2


def _record(mixer, seed, acc, base, ceiling=1.0, beta=None):
    return {"mixer": mixer, "seed": seed, "hops": [1, 2, 3], "accuracy": acc, "baseline": base,
            "ceiling": [ceiling] * 3, "ceiling_sigmoid": [1.0] * 3,
            "beta": None if beta is None else {"copy": beta, "value": [0.0] * len(beta)}}


def test_claims_hold_on_a_run_that_shows_them_and_fail_on_one_that_does_not():
    """claims() on constructed runs: one that shows every claim (each holds), and the same run
    with each claim broken in turn (that claim, and only that one, fails)."""
    base = [0.35, 0.35, 0.35]

    def run(**bad):
        recs = []
        for s in (0, 1):
            ceil = bad.get("ceiling", 1.0)
            recs += [_record("softmax", s, bad.get("softmax", [1.0, 0.40, 0.36]), base, ceil),
                     _record("softmax2", s, bad.get("softmax2", [1.0, 1.0, 0.6]), base, ceil),
                     _record("deltaformer", s, bad.get("deltaformer", [1.0, 0.45, 0.34]), base, ceil,
                             beta=[0.4, 0.3]),
                     _record("deltaformer_free", s, bad.get("deltaformer_free", [1.0, 0.95, 0.9]), base,
                             ceil, beta=bad.get("beta", [-1.3, 0.1]))]
        return {"config": {"hops": [1, 2, 3]}, "records": recs}
    good = mh.claims(run())
    assert len(good) == 7 and all(c["holds"] for c in good), [c for c in good if not c["holds"]]
    assert all(set(c) == {"claim", "holds", "measured"} for c in good)
    # the claims: 0 one hop, 1 the control, 2 one softmax layer, 3 the ceiling, 4 beta free
    # follows, 5 its negative beta, 6 beta in (0, 1) does not
    breaks = {"softmax2": ([1.0, 0.5, 0.4], {1, 2}),       # the control fails, and the gap below it
              "softmax": ([1.0, 0.4, 0.5], {2}), "ceiling": (0.9, {3}),
              "deltaformer_free": ([1.0, 0.95, 0.5], {4}), "beta": ([-0.3, 0.2], {5}),
              "deltaformer": ([0.5, 0.4, 0.36], {0})}
    for key, (val, failing) in breaks.items():
        got = [c["holds"] for c in mh.claims(run(**{key: val}))]
        assert got == [i not in failing for i in range(7)], (key, got)
    # beta in (0, 1) learning the links too: its own claim fails (and no other)
    got = [c["holds"] for c in mh.claims(run(deltaformer=[1.0, 0.9, 0.8]))]
    assert got == [i != 6 for i in range(7)], got
    # a run without some models makes no claim about them
    cpu = {"config": {"hops": [1, 2, 3]}, "records": [r for r in run()["records"] if r["mixer"] != "softmax"]}
    assert len(mh.claims(cpu)) == 6


def test_gpu_setting_runs_and_stores_through_main(tmp_path, monkeypatch, capsys):
    """The GPU setting's code path on a CPU (`--gpu --device cpu --steps 1`): its task shape and
    models, the learning-rate grid then one seed, written with the device, date and versions and
    the grid, read back by load_stored (which says the settings differ from gpu_config's: one
    step, a CPU), summarised, claimed about and plotted. A file written with gpu_config's own
    settings reads back as the same."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import experiments.common
    monkeypatch.setattr(experiments.common, "RESULTS_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="--gpu --jobs 8 --write"):
        mh.load_stored()
    assert mh.main(["--gpu", "--device", "cpu", "--steps", "1", "--seeds", "0", "--write"]) == 0
    printed = capsys.readouterr().out
    assert "wrote" in printed and "learning-rate grid on seed" in printed and printed.count("*") == 1 + len(mh.gpu_config().mixers)
    data = mh.load_stored()
    g = mh.gpu_config()
    assert data["env"]["torch"] == torch.__version__ and not data["same_as_gpu_config"]
    assert data["config"]["hops"] == list(g.hops) and data["config"]["steps"] == 1
    assert [c["unit"] for c in data["config"]["lr_choice"]] == list(g.mixers)
    assert len(data["grid"]) == len(g.lr_grid) * len(g.mixers) and len(data["records"]) == len(g.mixers)
    summ = mh.seed_summary(data["records"])
    assert summ["hops"] == list(g.hops) and set(summ["mean"]) == set(g.mixers)
    assert len(mh.summary_sentences(summ)) == len(summ["hops"]) and len(mh.claims(data)) == 7
    fig, ax = plt.subplots()
    mh.plot_summary(summ, ax, "t")
    assert len(ax.get_lines()) == len(g.mixers) + 2                # the models, the guess, the ceiling
    plt.close(fig)
    cfg = dict(experiments.common.stored_config(g), seeds=[0], jobs=8, lr_choice=data["config"]["lr_choice"])
    (tmp_path / f"{mh.STORED}.json").write_text(json.dumps(
        {"name": mh.STORED, "env": {"device": "test"}, "config": cfg, "records": data["records"]}))
    assert mh.load_stored()["same_as_gpu_config"]


def test_seed_summary_and_sentences():
    recs = [{"mixer": m, "seed": s, "hops": [1, 2], "accuracy": acc, "baseline": [0.3, 0.2 + s / 10],
             "ceiling": [1.0, 0.98 + s / 100]}
            for m, s, acc in [("softmax", 0, [1.0, 0.3]), ("deltaformer_free", 0, [0.9, 0.8]),
                              ("softmax", 1, [1.0, 0.3]), ("deltaformer_free", 1, [1.0, 0.6])]]
    summ = mh.seed_summary(recs)
    assert summ["mean"]["deltaformer_free"] == pytest.approx([0.95, 0.7])
    assert summ["first"] == {"softmax": [2, 0], "deltaformer_free": [1, 2]}
    assert summ["baseline"] == pytest.approx([0.3, 0.25]) and summ["ceiling"] == pytest.approx([1.0, 0.985])
    lines = mh.summary_sentences(summ)
    assert lines[1] == ("2 hops: DeltaFormer, β free 0.700, softmax, 1 layer 0.300 (DeltaFormer, β free "
                        "first in 2 of 2 seeds); most common value 0.250")
    one = mh.summary_sentences(mh.seed_summary([r for r in recs if r["seed"] == 0]))
    assert one[0] == "1 hop: softmax, 1 layer 1.000, DeltaFormer, β free 0.900; most common value 0.300"


def test_the_chapters_claims_on_the_cpu_setting():
    """What the chapter says of its live run (the CPU setting with the positive control and both
    DeltaFormers, seed 0) holds on a seed the chapter does not train, seed 3: the control follows
    two hops, DeltaFormer with beta free follows every hop count with a negative beta at the
    copies, the one with beta in (0, 1) does not. About 30 s on two cores."""
    from experiments.common import assert_claims
    cfg = mh.cpu_config(mixers=("softmax2", "deltaformer", "deltaformer_free"), threads=1)
    assert_claims(mh.claims(mh.run_seeds(cfg, [3], jobs=2)))
