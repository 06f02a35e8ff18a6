"""Chapter 12's reference code (lattn_core.whats_next) and the survey's case list (kernels.survey).

The survey's timing needs a GPU; here its cases, its records and its input makers are checked on the
CPU (our ops through their PyTorch path, tiny shapes), without timing anything.
"""
import numpy as np
import pytest
import torch

import lattn_core as lc
import lattn_core.whats_next as wn
from kernels import survey

ROW = {row.name: row for row in wn.FAMILY}


def test_family_rows_name_existing_functions_and_chapters():
    """Every model the book treats is in the table once; every lattn_core name exists; every chapter's
    notebook is named with its number."""
    names = [row.name for row in wn.FAMILY]
    assert len(set(names)) == len(names) == 12
    table = wn.family_table()
    assert [r["model"] for r in table] == names
    for row in wn.FAMILY:
        for form in wn.FORM_KEYS:
            fn = getattr(row, form)
            assert fn is None or (fn in lc.__all__ and callable(getattr(lc, fn)))
        assert len(row.chapters) == len(row.notebooks)
        assert all(nb.startswith(f"{ch:02d}_") for ch, nb in zip(row.chapters, row.notebooks))
    broken = wn.FamilyRow(**{**ROW["DeltaNet"].__dict__, "parallel": "no_such_function"})
    with pytest.raises(LookupError, match="no_such_function"):
        wn.family_table(family=(broken,))


def test_family_table_joins_the_catalog_by_form_names():
    """The kernel op comes from the model map row that names one of the model's forms; a model no row
    names (or a catalog without it) has none, so a new catalog row fills the table by itself."""
    from kernels.catalog import model_map
    rows = {r["model"]: r for r in wn.family_table(model_map())}
    assert rows["Gated DeltaNet"]["op"] == "chunk_gated_delta_rule"
    assert rows["Gated DeltaNet"]["family"] == "delta"
    assert rows["softmax attention"]["op"] == "flash_attention"
    assert rows["Comba"]["op"] == "chunk_comba" and rows["Comba"]["family"] == "delta"
    fake = [dict(recurrent="mesanet_recurrent", parallel=None, chunkwise=None, op="chunk_mesa_net",
                 family="mesa")]
    rows = {r["model"]: r for r in wn.family_table(fake)}
    assert rows["MesaNet"]["op"] == "chunk_mesa_net" and rows["DeltaNet"]["op"] is None


@pytest.mark.parametrize("name", ["softmax attention", "linear attention", "Gated DeltaNet", "DeltaProduct",
                                  "FoX (forget-gated softmax)", "PaTH", "MesaNet"])
def test_carried_numbers_match_the_table(name):
    """The rank of the past-to-future Jacobian is the table's state (once the past fills it) or grows
    by the table's cache per token. Ranks are integers: exact equality."""
    row = ROW[name]
    r4, r8 = (wn.carried_numbers(row, t) for t in (4, 8))
    if row.grows:
        assert r8 - r4 == 4 * row.cache_per_token(3, 3)
    else:
        assert r8 == r4 == row.state(3, 3)


def test_carried_numbers_of_one_token_is_a_rank_one_write():
    """One token writes v kᵀ into linear attention's state: the rank-one matrices have d_k + d_v − 1
    free numbers."""
    assert wn.carried_numbers(ROW["linear attention"], 1, d_k=3, d_v=4) == 3 + 4 - 1
    with pytest.raises(ValueError, match="n_past"):
        wn.carried_numbers(ROW["linear attention"], 0)


def test_every_row_runs_its_forms_on_its_inputs():
    """Each recipe of family_inputs feeds every form a model has, and the forms agree (float64, 20
    tokens: round-off ~1e-13)."""
    for row in wn.FAMILY:
        x = wn.family_inputs(row, 20, 4, 3, 1)
        ref = wn.run_family(row, x)
        assert ref.shape == (20, 3) and np.all(np.isfinite(ref))
        for form in ("parallel", "chunkwise"):
            if getattr(row, form) is not None:
                np.testing.assert_allclose(wn.run_family(row, x, form), ref, atol=1e-9)
    with pytest.raises(ValueError, match="form"):
        wn.run_family(ROW["Comba"], wn.family_inputs(ROW["Comba"], 4, 2, 2, 0), "blocked")
    no_parallel = wn.FamilyRow(**{**ROW["Comba"].__dict__, "parallel": None})
    with pytest.raises(ValueError, match="Comba has no parallel form"):
        wn.run_family(no_parallel, wn.family_inputs(no_parallel, 4, 2, 2, 0), "parallel")


def test_published_config_is_chapter_7s_shape():
    """published_config takes a published model's attention shape from Chapter 7's list: Llama-3-8B's
    cache is lc.kv_cache_size with its 8 key-value heads; an unknown name raises ValueError."""
    cfg = wn.published_config("Llama-3-8B")
    shape = next(s for s in lc.MODEL_SHAPES if s.name == "Llama-3-8B")
    assert (cfg.layers, cfg.heads, cfg.kv_heads, cfg.head_dim) == (shape.layers, shape.heads, shape.kv_heads,
                                                                   shape.head_dim) == (32, 32, 8, 128)
    assert wn.decode_memory(ROW["softmax attention"], cfg, 8192) == lc.kv_cache_size(32, 8, 128, 8192)
    with pytest.raises(ValueError, match="name must be one of"):
        wn.published_config("GPT-5")


def test_decode_memory_is_chapter_7s_count():
    """Softmax attention's cache is lc.kv_cache_size (16-bit); a d_v × d_k state is lc.linear_state_size
    in float32; MesaNet adds d_k(d_k+1)/2 per head; FoX one number per token and head. Integers: exact."""
    cfg = wn.EXAMPLE_CONFIG
    L, H, d = cfg.layers, cfg.heads, cfg.head_dim
    for n in (0, 1, 4096):
        assert wn.decode_memory(ROW["softmax attention"], cfg, n) == lc.kv_cache_size(L, cfg.kv_heads, d, n)
        assert wn.decode_memory(ROW["softmax attention"], cfg, n, kv_heads=4, batch=3) == \
            lc.kv_cache_size(L, 4, d, n, batch=3)
        assert wn.decode_memory(ROW["Gated DeltaNet"], cfg, n) == \
            lc.linear_state_size(L, H, d, d, bytes_per_number=4)
    assert wn.decode_memory(ROW["MesaNet"], cfg, 10) - wn.decode_memory(ROW["Gated DeltaNet"], cfg, 10) == \
        L * H * d * (d + 1) // 2 * 4
    assert wn.decode_memory(ROW["FoX (forget-gated softmax)"], cfg, 7) - \
        wn.decode_memory(ROW["softmax attention"], cfg, 7) == L * cfg.kv_heads * 7 * 2
    # the crossover n = H d / H_kv: the cache equals the state
    n_eq = H * d // cfg.kv_heads
    assert wn.decode_memory(ROW["softmax attention"], cfg, n_eq) == wn.decode_memory(ROW["DeltaNet"], cfg, 0)
    assert 1.2e9 < cfg.params() < 1.4e9
    np.testing.assert_array_equal(wn.decode_memory(ROW["softmax attention"], cfg, np.array([1, 2])),
                                  [lc.kv_cache_size(L, H, d, 1), lc.kv_cache_size(L, H, d, 2)])
    with pytest.raises(ValueError, match="n"):
        wn.decode_memory(ROW["DeltaNet"], cfg, -1)


def test_decode_steps_are_the_recurrences():
    """gated_delta_step token by token = lc.gated_deltanet_recurrent; kv_cache_step = the last row of
    lc.softmax_attention (float64: round-off ~1e-15)."""
    rng = np.random.default_rng(3)
    n, d = 30, 5
    Q, K, V = rng.normal(size=(3, n, d))
    K /= np.linalg.norm(K, axis=1, keepdims=True)
    a, b = rng.uniform(0.7, 1, n), rng.uniform(0.1, 1, n)
    t = lambda x: torch.tensor(x, dtype=torch.float64)     # noqa: E731
    S = torch.zeros(1, 1, d, d, dtype=torch.float64)
    out = [wn.gated_delta_step(S, t(Q[i])[None, None], t(K[i])[None, None], t(V[i])[None, None],
                               t(a[i])[None, None], t(b[i])[None, None])[0, 0].numpy() for i in range(n)]
    np.testing.assert_allclose(out, lc.gated_deltanet_recurrent(Q, K, V, a, b), atol=1e-12)
    o = wn.kv_cache_step(t(Q[-1])[None, None], t(K)[None, None], t(V)[None, None], scale=1.0)
    np.testing.assert_allclose(o[0, 0].numpy(), lc.softmax_attention(Q, K, V)[-1], atol=1e-12)
    with pytest.raises(ValueError, match="S must be"):
        wn.gated_delta_step(S[0], t(Q[0])[None], t(K[0])[None], t(V[0])[None], t(a[:1]), t(b[:1]))
    with pytest.raises(ValueError, match="q must be"):
        wn.kv_cache_step(t(Q[:1]), t(K)[None, None], t(V)[None, None])


def test_rereading_rnn_is_softmax_attention_in_either_order():
    """The re-reading RNN with the softmax cell is lc.softmax_attention, reading newest or oldest first,
    in n(n+1)/2 steps (float64: round-off ~1e-15)."""
    rng = np.random.default_rng(4)
    Q, K = rng.normal(size=(2, 25, 6))
    V = rng.normal(size=(25, 3))
    ref = lc.softmax_attention(Q, K, V)
    count = {}
    np.testing.assert_allclose(wn.rereading_rnn(Q, K, V, counter=count), ref, atol=1e-12)
    np.testing.assert_allclose(wn.rereading_rnn(Q, K, V, backward=False), ref, atol=1e-12)
    assert count["steps"] == 25 * 26 // 2
    big = 40 * Q                      # scores in the hundreds: the running max keeps it finite
    np.testing.assert_allclose(wn.rereading_rnn(big, K, V), lc.softmax_attention(big, K, V), atol=1e-10)
    with pytest.raises(ValueError):
        wn.rereading_rnn(Q[:3], K, V)


def test_stick_breaking_cell_is_its_matrix_form_and_depends_on_order():
    """The stick-breaking cell read newest first = the log-space matrix form; its rows' weights sum to
    1 − Π(1 − a); read oldest first it is another model (float64 round-off ~1e-15)."""
    rng = np.random.default_rng(5)
    Q, K = rng.normal(size=(2, 30, 4))
    V = rng.normal(size=(30, 2))
    cell = wn.StickBreakingCell()
    np.testing.assert_allclose(wn.rereading_rnn(Q, K, V, cell), wn.stick_breaking_attention(Q, K, V),
                               atol=1e-12)
    a = 1 / (1 + np.exp(-(Q @ K.T)))
    left = np.array([np.prod(1 - a[i, :i + 1]) for i in range(30)])
    np.testing.assert_allclose(wn.stick_breaking_attention(Q, K, np.ones((30, 1)))[:, 0], 1 - left, atol=1e-12)
    assert np.abs(wn.rereading_rnn(Q, K, V, cell, backward=False) - wn.rereading_rnn(Q, K, V, cell)).max() > 0.1
    huge = 800 * Q                    # sigmoid of ±hundreds: log space keeps the weights finite
    assert np.all(np.isfinite(wn.stick_breaking_attention(huge, K, V)))


# --- kernels/survey.py, on the CPU, without timing -------------------------------------------------------

def test_survey_cases_cover_every_op_and_length_once():
    cases = survey.train_cases()
    ours = [c for c in cases if c["impl"] == "ours"]
    assert {c["op"] for c in ours} == set(survey.OPS)
    assert len(ours) == len(survey.OPS) * len(survey.T_ALL)
    assert all(c["B"] * c["T"] == survey.TOKENS for c in cases)
    assert [c["T"] for c in cases if c["impl"] == "sdpa"] == list(survey.T_ALL)
    assert all(c["op"] == "flash_attention" for c in cases if c["impl"] == "sdpa")
    fla = [c for c in cases if c["impl"] == "fla"]
    assert {c["T"] for c in fla} == set(survey.FLA_T) and {c["op"] for c in fla} == set(survey.OPS)
    assert all(c["impl"] != "fla" for c in survey.train_cases(("train",)))
    assert set(survey.FLA_NAMES) == set(survey.OPS)
    # every public op of kernels is in the survey
    import kernels
    ops = {n for n in kernels.__all__ if callable(getattr(kernels, n)) and n not in ("resolve_backend",)}
    assert ops <= set(survey.OPS)
    dec = survey.decode_cases()
    assert {c["B"] for c in dec} == set(survey.DECODE_BATCH)
    assert sorted(c["context"] for c in dec if c["context"] is not None) == \
        sorted(list(survey.DECODE_CONTEXT) * len(survey.DECODE_BATCH))


def test_survey_records_are_what_the_report_reads():
    """Records carry the case, the pass and the time, or a note; the report divides ours by fla's per
    op and shape, and each record is assigned to the part that wrote it."""
    from kernels.report import ratio_rows
    recs = [survey.record(dict(impl="ours", op="chunk_gla", B=8, T=8192), "fwd", ms=2.0),
            survey.record(dict(impl="fla", op="chunk_gla", B=8, T=8192), "fwd", ms=4.0),
            survey.record(dict(impl="ours", op="chunk_gla", B=8, T=8192), "fwdbwd", ms=6.0, peak_mib=10),
            survey.record(dict(impl="fla", op="chunk_gla", B=8, T=8192), "fwdbwd", note="RuntimeError: no"),
            survey.record(dict(impl="sdpa (KV cache)", B=1, context=1024), "step", ms=0.1, section="decode")]
    assert recs[0] == dict(section="train", impl="ours", op="chunk_gla", B=8, T=8192, ms=2.0, note="",
                           **{"pass": "fwd"})
    assert recs[2]["peak_mib"] == 10.0 and recs[3]["ms"] is None
    rows = {r["pass"]: r for r in ratio_rows({"records": recs[:4]})}
    assert rows["fwd"]["ratio"] == 0.5 and rows["fwdbwd"]["ratio"] is None
    assert rows["fwdbwd"]["note"] == "RuntimeError: no"
    assert [survey.part_of(r) for r in recs] == ["train", "fla", "train", "fla", "decode"]


def test_survey_run_of_some_ops_keeps_the_others():
    """--parts fla --ops a,b re-times fla's records of a and b only; a train run re-times SDPA too; a
    decode run all decoding records."""
    rec = lambda impl, op, section="train": dict(impl=impl, op=op, section=section)
    fla_a, fla_c = rec("fla", "chunk_gla"), rec("fla", "chunk_mesa_net")
    ours_a, sdpa = rec("ours", "chunk_gla"), rec("sdpa", "flash_attention")
    dec = rec("sdpa (KV cache)", None, "decode")
    ops = ("chunk_gla", "chunk_delta_rule")
    assert [survey.replaced_by(r, ["fla"], ops) for r in (fla_a, fla_c, ours_a, sdpa, dec)] == \
        [True, False, False, False, False]
    assert [survey.replaced_by(r, ["train"], ops) for r in (fla_a, ours_a, rec("ours", "chunk_mesa_net"), sdpa)] \
        == [False, True, False, True]
    assert survey.replaced_by(dec, ["decode"], ()) and not survey.replaced_by(dec, ["train"], ops)


def test_survey_inputs_and_our_ops_run_on_cpu():
    """Every op's inputs have the layout the op takes, and our op (its PyTorch path on the CPU) returns
    [B, T, H, V] (the convolution [B, T, H·D]); an op not in kernels yet is its lookup error.
    DeltaProduct's keys, values and beta have NUM_HOUSEHOLDER rows per token."""
    import kernels
    for op in survey.OPS:
        x = survey.make_inputs(op, 2, 10, heads=2, dim=8, device="cpu", dtype=torch.float32)
        steps = {n: survey.NUM_HOUSEHOLDER if op == "chunk_gated_delta_product" and n in ("k", "v", "beta") else 1
                 for n in x}
        assert all(t.shape[:2] == (2, 10 * steps[n]) for n, t in x.items() if n != "weight")
        fn = survey.our_fn(op)
        if not hasattr(kernels, op):
            assert isinstance(fn, AttributeError)
            continue
        o = fn(**x)
        assert o.shape == ((2, 10, 16) if op == "causal_conv1d" else (2, 10, 2, 8))
        assert torch.isfinite(o).all()
    with pytest.raises(ValueError, match="op"):
        survey.make_inputs("no_such_op", 1, 4, device="cpu")
    o = survey.sdpa_fn()(**{n: t for n, t in survey.make_inputs("flash_attention", 1, 6, heads=2, dim=8,
                                                                 device="cpu", dtype=torch.float32).items()})
    assert o.shape == (1, 6, 2, 8)


def test_survey_decode_functions_on_cpu():
    """The decoding section's functions run and return the step's output or an import error."""
    fns = survey.decode_fns(2, None, heads=2, dim=8, device="cpu")
    assert set(fns) == {c["impl"] for c in survey.decode_cases() if c["context"] is None}
    assert fns["torch step (Gated DeltaNet)"]().shape == (2, 2, 8)
    o, state = fns["ours T=1 (chunk_gated_delta_rule)"]()
    assert o.shape == (2, 1, 2, 8) and state.shape == (2, 2, 8, 8)
    kv = survey.decode_fns(2, 16, heads=2, dim=8, device="cpu")
    assert set(kv) == {"sdpa (KV cache)"} and kv["sdpa (KV cache)"]().shape == (2, 2, 8)
    with pytest.raises(SystemExit):
        survey.main(["--parts", "nonsense"])
    if not torch.cuda.is_available():      # no GPU: the command says so and times nothing
        assert survey.main(["--parts", "train"]) == 2


def test_kernel_sentence_reads_well_for_every_count():
    """The chapter's computed sentence: no empty list after a colon, whatever the catalog holds."""
    rows = wn.family_table()                     # no catalog: no model has an op
    none = wn.kernel_sentence(rows)
    assert none == f"{len(rows)} models, none with a Triton op in kernels yet."
    ops = [dict(r, op=f"op_{i}") for i, r in enumerate(rows)]
    assert wn.kernel_sentence(ops) == f"{len(rows)} models, each with a Triton op in kernels."
    one = [dict(r, op=None) if i == 2 else r for i, r in enumerate(ops)]
    s = wn.kernel_sentence(one)
    assert s.endswith(f"; {rows[2]['model']} has none yet.") and f"{len(rows) - 1} with" in s
    two = [dict(r, op=None) if i in (0, 3) else r for i, r in enumerate(ops)]
    assert wn.kernel_sentence(two).endswith(f"{rows[0]['model']} and {rows[3]['model']} have none yet.")
    for s in (none, wn.kernel_sentence(ops), s):
        assert ": ." not in s and ":." not in s and not s.endswith(" .")


def test_family_markdown_is_a_two_column_table_of_every_row():
    from kernels.catalog import model_map
    rows = wn.family_table(model_map(check_notebooks=False))
    lines = wn.family_markdown(rows).splitlines()
    assert lines[0].count("|") == 3 and set(lines[1]) <= set("|:-")
    assert len(lines) == 2 + len(rows)
    for line, r in zip(lines[2:], rows):
        assert line.count(" | ") == 1                       # two cells, no stray pipe in a formula
        assert f"**{r['model']}**" in line and r["recurrence"] in line
        assert all(f"({nb}.ipynb)" in line for _, nb in r["chapters"])
        assert ("**kernel** " + (f"`{r['op']}`" if r["op"] else "none")) in line
        assert (f"{r['cache_d']:,} numbers per token" if r["grows"] else f"{r['state_d']:,} numbers") in line
