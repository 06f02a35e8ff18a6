"""Chapter 3 beyond the references (tests/core/test_forget_gates.py): the kernel's level decomposition of
the GLA scores (ch3-k-levels), the gate gradient and the backward march (ch3-k-dgate) against autograd,
the Triton kernels against the references, the experiment "forgetting on cue", and the statements the
chapter makes about the stored benchmark."""
import numpy as np
import pytest

import lattn_core as lc

torch = pytest.importorskip("torch")


# ---------------------------------------------------------------------------------------------
# (ch3-k-levels): the pairs of a chunk sorted into levels, each level one product
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("C", [1, 2, 5, 16, 37, 64])
def test_pair_levels_put_a_reference_row_between_key_and_query(C):
    levels = lc.chunk_pair_levels(C)
    i, j = np.indices((C, C))
    assert np.all(levels[j > i] == -1) and np.all(np.diag(levels) == 0)
    n_levels = int(np.ceil(np.log2(C))) if C > 1 else 0
    assert levels.max() == n_levels
    for a, b in zip(*np.nonzero(levels > 0)):
        lv = levels[a, b]
        h = 2 ** (lv - 1)
        rho = (a // (2 * h)) * 2 * h + h - 1
        assert b <= rho < a                                   # both exponents <= 0
        assert a // (2 * h) == b // (2 * h)                   # one aligned block of 2h rows
        assert (a // h) % 2 == 1 and (b // h) % 2 == 0        # query in its second half, key in its first


def test_the_kernel_chunk_has_six_levels():
    assert lc.chunk_pair_levels(64).max() == 6


@pytest.mark.parametrize("C,low", [(64, 1e-3), (37, 1e-3), (16, 0.5), (1, 0.1)])
def test_scores_by_levels_equal_the_direct_scores(C, low):
    rng = np.random.default_rng(C)
    Q, K = rng.normal(size=(C, 16)), rng.normal(size=(C, 16))
    gamma = np.exp(rng.uniform(np.log(low), 0, size=(C, 16)))
    direct = lc.gla_attention_parallel(Q, K, np.eye(C), gamma)   # V = I: the score matrix
    # float64, differences of cumulative logs on both sides: round-off ~1e-15 on O(10) scores
    lc.check_close("scores by levels = direct", lc.gla_scores_by_levels(Q, K, gamma), direct, 1e-12)


def test_scores_by_levels_stay_finite_where_the_naive_split_overflows():
    rng = np.random.default_rng(3)
    Q, K = rng.normal(size=(64, 16)), rng.normal(size=(64, 16))
    harsh = np.exp(rng.uniform(np.log(1e-3), 0, size=(64, 16)))
    b = np.cumsum(np.log(harsh), axis=0)
    with np.errstate(over="ignore"):
        assert np.isinf(np.exp(-b).astype(np.float32)).any()     # e^{-b_j} overflows float32
    assert np.isfinite(lc.gla_scores_by_levels(Q, K, harsh)).all()
    tiny = np.full((64, 16), 1e-30)                              # b down to -4400: still finite
    P = lc.gla_scores_by_levels(Q, K, tiny)
    assert np.isfinite(P).all()
    lc.check_close("tiny gates keep the diagonal", np.diag(P), np.sum(Q * K, axis=1), 1e-12)


def test_scores_by_levels_validate_their_inputs():
    with pytest.raises(ValueError, match="gamma"):
        lc.gla_scores_by_levels(np.ones((4, 2)), np.ones((4, 2)), np.full((4, 2), 1.5))
    with pytest.raises(ValueError, match="chunk_size"):
        lc.chunk_pair_levels(0)


# ---------------------------------------------------------------------------------------------
# (ch3-k-dgate), the chunk carry and the backward march, against autograd (float64)
# ---------------------------------------------------------------------------------------------
def _gla_inputs(T=96, Kd=8, Vd=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, T, 1, Kd, dtype=torch.float64, generator=gen) for _ in range(2))
    v = torch.randn(1, T, 1, Vd, dtype=torch.float64, generator=gen)
    g = torch.empty(1, T, 1, Kd, dtype=torch.float64).uniform_(0.05, 1, generator=gen).log()
    return q, k, v, g


def test_gate_gradient_carry_and_backward_march_match_autograd():
    from kernels import reference
    ref = lambda *a, **kw: reference.chunk_gla_ref(*a, scale=1.0, chunk_size=16, **kw)
    q, k, v, g = _gla_inputs()
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g)]
    o, _ = ref(*leaves)
    do = torch.randn_like(o)
    dq, dk, _, dg = torch.autograd.grad(o, leaves, do)
    dc = (q * dq - k * dk)[0, :, 0]
    suffix = dc.flip(0).cumsum(0).flip(0)
    # float64 throughout: round-off ~1e-14 on O(10) gradients
    lc.check_close("dg = reverse cumsum", dg[0, :, 0].numpy(), suffix.numpy(), 1e-10)

    at = {}                                  # t0 -> (state leaving t0, gradient of the later loss)
    for t0 in (16, 32, 48, 64):
        _, s_out = ref(*(x[:, :t0] for x in (q, k, v, g)), output_final_state=True)
        leaf = s_out.detach().requires_grad_()
        o_rest, _ = ref(*(x[:, t0:] for x in (q, k, v, g)), initial_state=leaf)
        at[t0] = s_out.detach(), torch.autograd.grad(o_rest, leaf, do[:, t0:])[0]
    for t_c in (16, 32, 48):
        s1, ds1 = at[t_c]
        lc.check_close("carry", suffix[t_c].numpy(), (s1 * ds1).sum(-1)[0, 0].numpy(), 1e-10)
        ds2 = at[t_c + 16][1]
        b = g[0, t_c:t_c + 16, 0].cumsum(0)
        march = b[-1].exp()[:, None] * ds2[0, 0] + (q[0, t_c:t_c + 16, 0] * b.exp()).T @ do[0, t_c:t_c + 16, 0]
        lc.check_close("backward march", ds1[0, 0].numpy(), march.numpy(), 1e-10)


def test_scalar_gate_gradient_is_the_channel_sum():
    from kernels import reference
    q, k, v, _ = _gla_inputs(T=70, seed=1)
    g = torch.empty(1, 70, 1, dtype=torch.float64).uniform_(0.05, 1).log()
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g)]
    o, _ = reference.chunk_scalar_ref(*leaves, scale=1.0)
    do = torch.randn_like(o)
    dq, dk, _, dg = torch.autograd.grad(o, leaves, do)
    dc = (q * dq - k * dk)[0, :, 0].sum(-1)
    lc.check_close("scalar dg = reverse cumsum of the channel sums", dg[0, :, 0].numpy(),
                   dc.flip(0).cumsum(0).flip(0).numpy(), 1e-10)


# ---------------------------------------------------------------------------------------------
# The Triton kernels (interpreter on CPU) against the references, forward and backward
# ---------------------------------------------------------------------------------------------
def test_triton_gla_kernels_match_the_references():
    import kernels
    from kernels import reference
    gen = torch.Generator().manual_seed(5)
    # on a GPU machine (no interpreter) the kernels compile and run on the GPU, as in the chapter
    dev = "cpu" if kernels.INTERPRET or not torch.cuda.is_available() else "cuda"
    tol = 1e-4 if dev == "cuda" else 5e-5      # a GPU sums in another order
    B, T, H, Dk, Dv = 1, 130, 2, 32, 16
    q, k = (torch.randn(B, T, H, Dk, generator=gen) for _ in range(2))
    v = torch.randn(B, T, H, Dv, generator=gen)
    gam_s = torch.empty(B, T, H).uniform_(np.log(1e-3), 0, generator=gen).exp()
    gam_v = torch.empty(B, T, H, Dk).uniform_(np.log(1e-3), 0, generator=gen).exp()
    head = lambda x, h: x[0, :, h].double().cpu().numpy()
    for op, gam, ref in ((kernels.chunk_simple_gla, gam_s, lc.decay_attention_chunkwise),
                         (kernels.chunk_gla, gam_v, lc.gla_attention_chunkwise)):
        o, _ = op(*(x.to(dev) for x in (q, k, v, gam.log())), scale=1.0, backend="triton")
        for h in range(H):
            # float32: decays carry the rounding of b, |b| <= 64 ln 1000 ≈ 442 -> ~3e-5 relative
            expect = ref(*(head(x, h) for x in (q, k, v, gam)))
            assert lc.max_rel_error(head(o, h), expect) < tol
    xs = [x[:, :, :1].clone().to(dev).requires_grad_() for x in (q, k, v, gam_v.log())]
    o, _ = kernels.chunk_gla(*xs, scale=1.0, backend="triton")
    do = torch.randn(o.shape, generator=gen).to(dev)
    grads = torch.autograd.grad(o, xs, do)
    xs64 = [x.detach().double().requires_grad_() for x in xs]
    o64, _ = reference.chunk_gla_ref(*xs64, scale=1.0)
    grads64 = torch.autograd.grad(o64, xs64, do.double())
    for name, g32, g64 in zip(("dq", "dk", "dv", "dg"), grads, grads64):
        err = ((g32.double() - g64).abs().max() / g64.abs().max()).item()
        assert err < tol, (name, err)           # as above: float32 against float64


# ---------------------------------------------------------------------------------------------
# The experiment: forgetting on cue
# ---------------------------------------------------------------------------------------------
def test_forgetting_on_cue_reset_beats_every_constant_decay():
    n, topic, d = 1024, 32, 64
    reset = np.where(np.arange(n) % topic == 0, 1e-3, 1.0)
    cos_reset = lc.topic_recall(n, topic, d, gamma=reset)
    cos_none = lc.topic_recall(n, topic, d)
    const = {g: lc.topic_recall(n, topic, d, gamma=g) for g in np.round(np.linspace(0.8, 0.995, 40), 4)}
    best = max(const, key=lambda g: const[g].mean())
    assert cos_reset.mean() > const[best].mean() > cos_none.mean()
    assert cos_reset.min() > max(c.min() for c in const.values())
    assert const[best][:4].mean() < const[best][-4:].mean()
    assert np.ptp(cos_reset) < 0.1
    # the crosstalk estimate: 31 other pairs in d = 64, cos ≈ 1/sqrt(1 + 31/64) ≈ 0.82
    assert abs(cos_reset.mean() - 1 / np.sqrt(1 + 31 / 64)) < 0.03     # as Chapter 3 states it


def test_topic_recall_validates_topic_len():
    with pytest.raises(ValueError, match="topic_len"):
        lc.topic_recall(10, 20, 4)


# ---------------------------------------------------------------------------------------------
# What the chapter says about the stored benchmark and shows of the kernels' source
# ---------------------------------------------------------------------------------------------
def test_the_chapters_statements_about_the_gla_goals():
    from kernels.results import load_results
    from kernels.report import ratio_rows
    met = {}
    for r in ratio_rows(load_results("gla")):
        if r["op"] in ("simple_gla", "gla"):
            v = None if r["ratio"] is None else r["ratio"] <= r["goal"]
            met.setdefault((r["op"], r["pass"]), {}).setdefault((int(r["B"]), int(r["T"])), []).append(v)
    fwd = met["simple_gla", "fwd"]
    long_T = {s for s in fwd if s[1] == 32768}
    assert long_T and all(all(v) for s, v in fwd.items() if s not in long_T)
    assert not any(any(fwd[s]) for s in long_T)
    assert all(None in v for v in met["simple_gla", "fwdbwd"].values())
    assert not any(x for p in ("fwd", "fwdbwd") for v in met["gla", p].values() for x in v)


def test_the_chapters_source_excerpts_exist():
    from kernels.gla import march, tiles
    from lattn_core.notebook import source_lines
    update = source_lines(march._fwd_kernel, "# state update", "total += b_c")
    assert any("tl.exp(b_c)" in line for line in update)
    gate = source_lines(tiles._gate_mm, "if GT == tl.float32", "return acc")
    assert sum("tl.dot(m" in line for line in gate) == 3           # one product per piece


def test_topic_recall_checks_seeds():
    for bad in (0, 2.5):
        with pytest.raises(ValueError, match=r"^seeds must be an integer >= 1"):
            lc.topic_recall(8, 4, 4, seeds=bad)
