"""Triton (gated) delta-rule kernels vs the float64 token-by-token definition: outputs, final states
and every gradient (q, k, v, beta, g, initial_state).

On a machine without CUDA the kernels run through Triton's interpreter (tiny shapes keep this file
fast); with CUDA the same tests run compiled on the GPU, plus larger GPU-only shapes. The oracle is
``kernels.reference.recurrent_ref`` (the recurrence itself, no chunking) in float64 with autograd,
fed the *same* (already rounded) inputs as the kernel, so only the kernel's own arithmetic counts.
"""
import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels import reference

DEVICES = ["cuda"] if torch.cuda.is_available() else ["cpu"]   # CPU: interpreter; CUDA: compiled
ON_GPU = DEVICES == ["cuda"]

# Tolerances, relative to the largest magnitude of the reference quantity (max-abs error / max-abs ref).
# float32: the kernel runs in float32 (tl.dot with input_precision="ieee"), eps = 1.2e-7. Errors grow
# through the 64×64 triangular solve (β up to 2 gives entries of (I + A)^{-1} of order 10-100) and
# through ≤ 130-step recurrences; measured ~1e-6 on the interpreter. 2e-4 leaves > 100× headroom,
# while a wrong mask, index or gate exponent gives errors of order 1.
TOL32 = 2e-4
# bfloat16/float16: the kernel rounds W, U, v', the state and the gated q, k to the input dtype before
# every tensor-core product (as fla does); bf16 has unit roundoff 2^-9 ≈ 2e-3, and several such
# roundings meet in each output (measured RMS error ratio ≈ 3-4e-3 for o and the final state and
# ≈ 2.5-5e-3 for the gradients on the interpreter). We use fla's RMS error ratio
# (harness.err_ratio) with bound 1e-2: above what correct rounding gives, far below the O(1) of a
# real bug. fp16 (unit roundoff 2^-12) measures ≈ 5e-4 and gets the same bound. (The interpreter
# rounds to nearest even like the GPU; see kernels/_interp.py.)
TOL16_OUT, TOL16_GRAD = 1e-2, 1e-2


def _rel_err(x, ref):
    x = x.detach().double()
    ref = ref.detach().double()
    assert torch.isfinite(x).all(), "non-finite values"
    return ((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def _rms_ratio(x, ref):
    from kernels.benchmarks.harness import err_ratio
    return err_ratio(x, ref)


def _inputs(B, T, H, K, V, *, gated, seed, device, harsh=False, beta_max=2.0, normalise=True,
            noncontig=False, with_h0=True):
    gen = torch.Generator().manual_seed(seed)
    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)
    if noncontig:   # [B, H, T, D] storage viewed as [B, T, H, D]
        q = rnd(B, H, T, K).transpose(1, 2)
        k = rnd(B, H, T, K).transpose(1, 2)
        v = rnd(B, H, T, V).transpose(1, 2)
    else:
        q, k, v = rnd(B, T, H, K), rnd(B, T, H, K), rnd(B, T, H, V)
    k = F.normalize(k, dim=-1) if normalise else 0.3 * k
    beta = torch.rand(B, T, H, generator=gen, dtype=torch.float64) * beta_max
    g = None
    if gated:
        g = F.logsigmoid(rnd(B, T, H) + 2.0)                      # mild: decays near 1
        if harsh:   # log decays down to about -1000 (e^g underflows), plus exact zeros (no decay)
            g = -torch.exp(3.0 * rnd(B, T, H))
            g = torch.where(torch.rand(B, T, H, generator=gen) < 0.2, torch.zeros_like(g), g)
    h0 = rnd(B, H, K, V) if with_h0 else None
    out = dict(q=q, k=k, v=v, g=g, beta=beta, h0=h0)
    return {n: (t.to(device) if t is not None else None) for n, t in out.items()}


def _run(inp, dtype, *, gated, fs, scale=None, backend="triton", grad=True):
    """Run the op on ``dtype`` copies (leaf tensors); returns outputs and the leaves."""
    leaves = {}
    for n, t in inp.items():
        if t is None:
            continue
        # the state is float32 in every case; .to keeps strides, so non-contiguous inputs stay so
        x = t.float() if n == "h0" else t.to(dtype)
        leaves[n] = x.detach().requires_grad_(grad)
    args = (leaves["q"], leaves["k"], leaves["v"])
    kw = dict(scale=scale, initial_state=leaves.get("h0"), output_final_state=fs)
    if backend is not None:
        kw["backend"] = backend
    if gated:
        o, ht = kernels.chunk_gated_delta_rule(*args, leaves["g"], leaves["beta"], **kw)
    else:
        o, ht = kernels.chunk_delta_rule(*args, leaves["beta"], **kw)
    return o, ht, leaves


def _reference(leaves, *, gated, fs, scale):
    """float64 recurrence on the kernel's (rounded) inputs, with float64 leaves for autograd."""
    ref = {n: t.detach().double().requires_grad_(True) for n, t in leaves.items()}
    K = ref["q"].shape[-1]
    o, ht = reference.recurrent_ref(ref["q"], ref["k"], ref["v"], ref.get("g") if gated else None,
                                    ref["beta"], scale if scale is not None else K ** -0.5,
                                    ref.get("h0"), fs)
    return o, ht, ref


def _check(inp, dtype, *, gated, fs, scale=None, seed=0):
    o, ht, leaves = _run(inp, dtype, gated=gated, fs=fs, scale=scale)
    ro, rht, ref = _reference(leaves, gated=gated, fs=fs, scale=scale)
    assert o.dtype == dtype and o.shape == ro.shape
    gen = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(ro.shape, generator=gen, dtype=torch.float64).to(ro.device)
    loss_k = (o.double() * do).sum()
    loss_r = (ro * do).sum()
    if fs:
        assert ht is not None and ht.dtype == torch.float32 and ht.shape == rht.shape
        dht = torch.randn(rht.shape, generator=gen, dtype=torch.float64).to(ro.device)
        loss_k = loss_k + (ht.double() * dht).sum()
        loss_r = loss_r + (rht * dht).sum()
    else:
        assert ht is None
    loss_k.backward()
    loss_r.backward()
    exact = dtype == torch.float32
    errs = {"o": (o, ro)}
    if fs:
        errs["ht"] = (ht, rht)
    for n in leaves:
        assert leaves[n].grad is not None, f"no gradient for {n}"
        assert leaves[n].grad.dtype == leaves[n].dtype
        errs["d" + n] = (leaves[n].grad, ref[n].grad)
    for name, (x, r) in errs.items():
        if exact:
            err = _rel_err(x, r)
            assert err <= TOL32, f"{name}: max rel err {err:.3g} > {TOL32}"
        else:
            err = _rms_ratio(x, r)
            tol = TOL16_OUT if name in ("o", "ht") else TOL16_GRAD
            assert err <= tol, f"{name}: RMS err ratio {err:.3g} > {tol}"


# (op gated?, T, K, V, with h0, output_final_state, harsh gates, beta_max, L2-normalised keys)
CASES_F32 = [
    (False, 1, 16, 16, False, False, False, 1.0, True),
    (False, 5, 16, 32, True, True, False, 2.0, True),
    (False, 63, 32, 16, False, True, False, 2.0, True),
    (False, 65, 32, 32, True, False, False, 1.0, True),
    (False, 130, 16, 16, True, True, False, 2.0, True),
    (False, 65, 16, 16, True, True, False, 1.5, False),
    (True, 1, 16, 16, True, True, False, 1.0, True),
    (True, 5, 32, 16, False, False, False, 2.0, True),
    (True, 63, 16, 32, True, True, True, 2.0, True),
    (True, 65, 32, 32, False, True, False, 1.0, True),
    (True, 130, 16, 16, True, True, True, 1.8, True),
    (True, 130, 16, 32, False, False, False, 2.0, False),
]
# On the GPU every distinct (K, V, constexpr flags) combination is a fresh compile of five kernels
# (seconds each); a subset that still covers both ops, with/without h0 and final state, odd T,
# multi-chunk T, harsh gates and unnormalised keys keeps the compiled run under two minutes.
if ON_GPU:
    CASES_F32 = [CASES_F32[i] for i in (1, 4, 5, 8, 11)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gated,T,K,V,h0,fs,harsh,beta_max,normalise", CASES_F32)
def test_float32_outputs_states_and_grads(device, gated, T, K, V, h0, fs, harsh, beta_max, normalise):
    B, H = (2, 1) if T <= 65 else (1, 2)
    inp = _inputs(B, T, H, K, V, gated=gated, seed=T + K + 7 * V, device=device, harsh=harsh,
                  beta_max=beta_max, normalise=normalise, with_h0=h0)
    _check(inp, torch.float32, gated=gated, fs=fs, seed=T)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,gated", [(torch.bfloat16, False), (torch.bfloat16, True), (torch.float16, True)]
                         + ([] if ON_GPU else [(torch.float16, False)]))
def test_half_precision(device, dtype, gated):
    inp = _inputs(1, 70, 2, 32, 32, gated=gated, seed=3, device=device, beta_max=1.0)
    _check(inp, dtype, gated=gated, fs=True, seed=5)


@pytest.mark.parametrize("device", DEVICES)
def test_noncontiguous_inputs_and_custom_scale(device):
    inp = _inputs(1, 40, 2, 16, 16, gated=True, seed=11, device=device, noncontig=True)
    assert not inp["q"].is_contiguous()
    _check(inp, torch.float32, gated=True, fs=True, scale=0.7, seed=11)


@pytest.mark.parametrize("device", DEVICES)
def test_inference_path_without_grad(device):
    """No input needs a gradient: the forward skips saving chunk states; same outputs."""
    inp = _inputs(1, 100, 2, 16, 16, gated=True, seed=2, device=device)
    with torch.no_grad():
        o, ht, leaves = _run(inp, torch.float32, gated=True, fs=True, grad=False)
        ro, rht, _ = _reference({n: t for n, t in leaves.items()}, gated=True, fs=True, scale=None)
    assert _rel_err(o, ro) <= TOL32 and _rel_err(ht, rht) <= TOL32


# The inference forward (no gradient asked for) runs in T form by default (``_tsolve_kernel`` +
# ``_march_t_kernel``, no W/U); these cases pin it, its knobs and the W/U form to the definition.
INFER_VARIANTS = [dict(), dict(tform=2), dict(tsolve=2), dict(mt_bv=16, mqk=1), dict(mt_bv=16, mqk=2),
                  dict(mqk=1), dict(tsolve=2, mqk=1), dict(mt_seg=2), dict(mt_seg=3, mqk=2),
                  dict(mt_seg=3, tsolve=1)]
# (op gated?, T, K, V, harsh gates, beta_max)
INFER_CASES = [(True, 130, 32, 16, True, 2.0), (False, 70, 16, 32, False, 2.0), (True, 1, 16, 16, False, 1.0)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tune", INFER_VARIANTS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()) or "default")
@pytest.mark.parametrize("gated,T,K,V,harsh,beta_max", INFER_CASES)
def test_inference_forms(device, tune, gated, T, K, V, harsh, beta_max):
    """T form and W/U form, both solves, both sources of the scores: float32 outputs and final
    state within TOL32 of the float64 recurrence (same bound and reasoning as the training path)."""
    from kernels import triton_delta
    inp = _inputs(2, T, 2, K, V, gated=gated, seed=T + K + V, device=device, harsh=harsh, beta_max=beta_max)
    with torch.no_grad(), triton_delta.tuning(**tune):
        o, ht, leaves = _run(inp, torch.float32, gated=gated, fs=True, grad=False)
        ro, rht, _ = _reference(leaves, gated=gated, fs=True, scale=None)
    assert _rel_err(o, ro) <= TOL32 and _rel_err(ht, rht) <= TOL32


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tune", [dict(), dict(tform=2), dict(mt_bv=16, mqk=2), dict(tsolve=1, ts_prec=2),
                                  dict(tsolve=1, ts_prec=3), dict(kkt_oprec=1), dict(kkt_oprec=3), dict(mt_seg=4)],
                         ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()) or "default")
def test_inference_forms_half_precision(device, tune):
    """bf16 inference forward (T form; on the GPU the doubling products of the solve in TF32, or
    ``ts_prec`` 3×TF32 / IEEE, which the interpreter computes exactly alike) within the bf16 bound
    TOL16_OUT of the float64 recurrence, including β up to 2."""
    from kernels import triton_delta
    inp = _inputs(1, 150, 2, 32, 32, gated=True, seed=31, device=device, beta_max=2.0)
    with torch.no_grad(), triton_delta.tuning(**tune):
        o, ht, leaves = _run(inp, torch.bfloat16, gated=True, fs=True, grad=False)
        ro, rht, _ = _reference(leaves, gated=True, fs=True, scale=None)
    assert _rms_ratio(o, ro) <= TOL16_OUT and _rms_ratio(ht, rht) <= TOL16_OUT


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_only_through_final_state(device):
    """Loss on the final state alone: ``do`` is zero, the state adjoint carries everything."""
    inp = _inputs(1, 70, 1, 16, 16, gated=True, seed=4, device=device)
    o, ht, leaves = _run(inp, torch.float32, gated=True, fs=True)
    ro, rht, ref = _reference(leaves, gated=True, fs=True, scale=None)
    ht.square().sum().backward()
    rht.square().sum().backward()
    for n in leaves:
        if ref[n].grad is None:     # q does not reach the final state: its gradient is exactly zero
            assert leaves[n].grad is None or not leaves[n].grad.any(), n
            continue
        err = _rel_err(leaves[n].grad, ref[n].grad)
        assert err <= TOL32, f"d{n}: {err:.3g}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("K,V", [(24, 16), (16, 48), (256, 16), (16, 8)])
def test_bad_head_sizes_raise(device, K, V):
    q = torch.randn(1, 8, 1, K, device=device)
    k = F.normalize(torch.randn(1, 8, 1, K, device=device), dim=-1)
    v = torch.randn(1, 8, 1, V, device=device)
    beta = torch.rand(1, 8, 1, device=device)
    g = -torch.rand(1, 8, 1, device=device)
    with pytest.raises(ValueError, match="head size"):
        kernels.chunk_delta_rule(q, k, v, beta, backend="triton")
    with pytest.raises(ValueError, match="head size"):
        kernels.chunk_gated_delta_rule(q, k, v, g, beta, backend="triton")


# ---------------------------------------------------------------------------------------------
# GPU only: realistic head sizes and long sequences, against the float64 chunkwise reference
# ---------------------------------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled-GPU shapes: needs CUDA")
@pytest.mark.parametrize("dtype,gated,T,K,V", [
    (torch.bfloat16, True, 2049, 128, 128), (torch.bfloat16, False, 2049, 128, 128),
    (torch.float32, True, 2049, 128, 128),   # float32 K = V = 128: the OutOfResources fallback
    (torch.bfloat16, True, 1000, 64, 128), (torch.float32, True, 777, 128, 64)])
def test_gpu_large_shapes(dtype, gated, T, K, V):
    B, H = 2, 3
    inp = _inputs(B, T, H, K, V, gated=gated, seed=T + K, device="cuda", beta_max=1.0,
                  harsh=gated and T == 777)
    o, ht, leaves = _run(inp, dtype, gated=gated, fs=True)
    ref = {n: t.detach().double().requires_grad_(True) for n, t in leaves.items()}
    ro, rht = reference.chunk_scalar_ref(ref["q"], ref["k"], ref["v"], ref.get("g") if gated else None,
                                         ref["beta"], K ** -0.5, ref["h0"], True)
    gen = torch.Generator().manual_seed(0)
    do = torch.randn(ro.shape, generator=gen, dtype=torch.float64).cuda()
    dht = torch.randn(rht.shape, generator=gen, dtype=torch.float64).cuda()
    ((o.double() * do).sum() + (ht.double() * dht).sum()).backward()
    ((ro * do).sum() + (rht * dht).sum()).backward()
    # float32: RMS ratio 1e-4 (ieee float32 throughout; 2049 steps of error growth). The harsh-gate
    # case (T = 777) measures 0.5–1.1e-4 for o depending only on how the cumulative log gate b is
    # rounded (|b| reaches 1e4, so b_i − b_j cancels; kernels/NOTES_delta.md, round 6);
    # bf16: 2e-2, twice the small-shape bound: K = 128 sums and 2049 steps add more roundings.
    tol_o, tol_g = (1e-4, 1e-4) if dtype == torch.float32 else (2e-2, 2e-2)
    assert _rms_ratio(o, ro) <= tol_o, _rms_ratio(o, ro)
    assert _rms_ratio(ht, rht) <= tol_o, _rms_ratio(ht, rht)
    for n in leaves:
        err = _rms_ratio(leaves[n].grad, ref[n].grad)
        assert err <= tol_g, f"d{n}: RMS err ratio {err:.3g} > {tol_g}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled-GPU shapes: needs CUDA")
@pytest.mark.parametrize("B,H", [(4, 64), (1, 4)])          # B·H = 256 and 4: both V-block settings
@pytest.mark.parametrize("gated,correlated", [(True, False), (False, False), (False, True)])
def test_gpu_inference_forms(B, H, gated, correlated):
    """bf16 inference forward (T form) at K = V = 128, T = 2049 against the float64 chunkwise
    reference, and against the W/U form (the training forward, which computes what fla computes).

    Well-conditioned inputs: RMS ratio ≤ 2e-2 as in ``test_gpu_large_shapes``. ``correlated``: keys
    near one direction and β = 2, so every step is a reflection and bf16 rounding errors never decay:
    there every implementation, fla's included, measures ≈ 0.032 for ``o`` and ≈ 0.038 for the final
    state (``kernels/benchmarks/conditioning_delta.py``, kernels/results/logs/conditioning_delta_round5.json),
    so the bound is relative: the T form may not be more than 10 % worse than the W/U form."""
    from kernels import triton_delta
    T, K, V = 2049, 128, 128
    inp = _inputs(B, T, H, K, V, gated=gated, seed=B + H, device="cuda", beta_max=1.0)
    if correlated:
        gen = torch.Generator().manual_seed(5)
        base = torch.randn(1, 1, H, K, generator=gen, dtype=torch.float64)
        noise = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)
        inp["k"] = F.normalize(base + 0.3 * noise, dim=-1).cuda()
        inp["beta"] = torch.full((B, T, H), 2.0, dtype=torch.float64).cuda()
    with torch.no_grad():
        o, ht, leaves = _run(inp, torch.bfloat16, gated=gated, fs=True, grad=False)
        with triton_delta.tuning(tform=2):
            o_wu, ht_wu, _ = _run(inp, torch.bfloat16, gated=gated, fs=True, grad=False)
        r = {n: t.double() for n, t in leaves.items()}
        ro, rht = reference.chunk_scalar_ref(r["q"], r["k"], r["v"], r.get("g") if gated else None,
                                             r["beta"], K ** -0.5, r["h0"], True)
    for x, x_wu, ref in ((o, o_wu, ro), (ht, ht_wu, rht)):
        err, err_wu = _rms_ratio(x, ref), _rms_ratio(x_wu, ref)
        assert err <= 1.1 * err_wu, (err, err_wu)
        assert err <= (5e-2 if correlated else 2e-2), err


@pytest.mark.parametrize("device", DEVICES)
def test_torch_fallback_backward_agrees(device, monkeypatch):
    """The batched-PyTorch backward of the per-chunk algebra (LATTN_DELTA_BWD=torch) stays correct."""
    from kernels import triton_delta
    monkeypatch.setattr(triton_delta, "_BWD_IMPL", "torch")
    inp = _inputs(1, 70, 2, 16, 32, gated=True, seed=9, device=device, harsh=True)
    _check(inp, torch.float32, gated=True, fs=True, seed=9)


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_resources_falls_back_to_torch_backward(device, monkeypatch):
    """If the per-chunk backward kernel cannot launch (e.g. float32 at K = V = 128 needs more shared
    memory than the GPU has), the batched-PyTorch backward takes over with the same gradients."""
    from triton.runtime.errors import OutOfResources
    from kernels import triton_delta

    def refuse(*args, **kwargs):
        raise OutOfResources(253952, 232448, "shared memory")
    monkeypatch.setattr(triton_delta, "_local_grads_triton", refuse)
    inp = _inputs(1, 40, 1, 16, 16, gated=True, seed=12, device=device)
    _check(inp, torch.float32, gated=True, fs=True, seed=12)


# tuning variants (kernels/benchmarks/explore_delta.py sweeps them on the GPU at K = V = 128 and
# checks each against the default there): each must compute the same function; small shapes here
VARIANTS = [dict(fwd_split=1), dict(fwd_split=1, out_bv=16, fwd_bv=16),
            dict(fwd_bv=16, bwd_bv=16, dqk_bv=16, dwy_bv=16), dict(fwd_bv=32, bwd_bv=32, fwd_warps=4, fwd_stages=1),
            dict(wy_fuse=1, wu_bk=16, kkt_bk=16), dict(kkt_warps=2, wu_warps=2, dqk_warps=8, dwy_warps=8),
            dict(aqk=2, dwy_rec=2), dict(aqk=1, dwy_rec=1, fwd_bv=16, bwd_bv=16, fwd_stages=1),
            dict(kkt_oprec=1), dict(kkt_oprec=3, kkt_bk=16), dict(wy_fuse=1, kkt_oprec=1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tune", VARIANTS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_tuning_variants(device, tune):
    from kernels import triton_delta
    with triton_delta.tuning(**tune):
        inp = _inputs(1, 70, 2, 32, 32, gated=True, seed=21, device=device, with_h0=True, beta_max=1.0)
        _check(inp, torch.bfloat16 if ON_GPU else torch.float32, gated=True, fs=True, seed=21)


@pytest.mark.parametrize("device", DEVICES)
def test_key_split_local_backward(device):
    """The per-chunk backward split over key columns (``dqk_bk`` < K): every K-block's share of
    dq, dk and the log-gate gradient must add up to the unsplit result."""
    from kernels import triton_delta
    with triton_delta.tuning(dqk_bk=32):
        inp = _inputs(1, 70, 2, 64, 32, gated=True, seed=22, device=device, with_h0=True, harsh=True)
        _check(inp, torch.bfloat16 if ON_GPU else torch.float32, gated=True, fs=True, seed=22)


def test_tuning_rejects_bad_knobs():
    from kernels import triton_delta
    with pytest.raises(ValueError, match="unknown knob"):
        with triton_delta.tuning(fwd_bw=16):
            pass
    with pytest.raises(ValueError, match="LATTN_DELTA_TUNE"):
        triton_delta._parse_tune("fwd_bv=abc")
    with pytest.raises(ValueError, match="fwd_bv"):
        with triton_delta.tuning(fwd_bv=24):
            triton_delta._tuned_bv("fwd_bv", 16, 32)
    assert triton_delta._TUNE["fwd_bv"] == 0    # restored after the with-block
    with pytest.raises(ValueError, match="aqk"):
        with triton_delta.tuning(aqk=3):
            triton_delta._switch("aqk", True)
    k = torch.zeros(1, 64, 1, 16)
    with pytest.raises(ValueError, match="ts_prec"):
        with triton_delta.tuning(tsolve=1, ts_prec=4):
            triton_delta._solve_t(k.bfloat16(), k.bfloat16(), torch.zeros(1, 64), k[..., 0], 1.0, False)
    with pytest.raises(ValueError, match="kkt_oprec"):
        with triton_delta.tuning(kkt_oprec=4):
            triton_delta._solve_t(k.bfloat16(), k.bfloat16(), torch.zeros(1, 64), k[..., 0], 1.0, False)
    with pytest.raises(ValueError, match="mt_seg"):
        with triton_delta.tuning(mt_seg=-1):
            triton_delta._segments(4, 1, 16, 16, torch.device("cpu"))
    with pytest.raises(ValueError, match="mt_gl"):
        with triton_delta.tuning(mt_gl=4):
            triton_delta._gluon_form()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fs,T", [(False, 300), (True, 300), (True, 320)])
def test_inference_segments_match_one_range(device, fs, T):
    """The segmented inference forward (chunk ranges, each march launch continuing from the state
    the previous one left) gives the unsegmented outputs, with and without row masks (T = 320 is
    a multiple of the chunk, and the unmasked loop is checked against the masked one): float32,
    bound TOL32 between the two."""
    from kernels import triton_delta
    inp = _inputs(1, T, 2, 32, 32, gated=True, seed=5, device=device, with_h0=False)
    outs = []
    for tune in (dict(mt_seg=1, mt_even=2), dict(mt_seg=4)):
        with torch.no_grad(), triton_delta.tuning(**tune):
            o, ht, _ = _run(inp, torch.float32, gated=True, fs=fs, grad=False)
        assert (ht is not None) == fs
        outs.append((o, ht))
    assert _rel_err(outs[1][0], outs[0][0]) <= TOL32
    if fs:
        assert _rel_err(outs[1][1], outs[0][1]) <= TOL32


# ---------------------------------------------------------------------------------------------
# The Gluon inference march (kernels/gluon_delta.py, knob mt_gl; Hopper GPUs only)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_scores_times_t_kernel(device):
    """``_wu_fwd_kernel`` with ``PT``: the stored tile is the product of the chunk's scores ``P``
    and ``T`` (what the Gluon march reads), float32 (IEEE products), against the two tiles the
    same kernel stores without ``PT``, multiplied in float64: relative bound TOL32."""
    from kernels import triton_delta as td
    B, T, H, K = 1, 130, 2, 32
    inp = _inputs(B, T, H, K, K, gated=True, seed=31, device=device, with_h0=False)
    q, k, v, g, beta = (inp[n].float() for n in ("q", "k", "v", "g", "beta"))
    NT = -(-T // td.CHUNK)
    b, _ = td._chunk_cumsum(g, beta, B, T, H, NT)
    scale = K ** -0.5
    tm, _, _ = td._solve_t(q, k, b, beta, scale, False)
    outs = []
    for pt in (False, True):
        a = torch.empty_like(tm)
        td._launch(td._wu_fwd_kernel, (NT, B * H), (q, k, v, beta, b, tm, tm, tm, a, scale, T, H, NT * td.CHUNK, 0),
                   dict(K=K, V=K, BK=K, PREC="ieee", QK=True, WU=False, PT=pt), td._par_configs(K, K, 0, nw=4))
        outs.append(a.double().view(-1, td.CHUNK, td.CHUNK))
    want = outs[0] @ tm.double().view(-1, td.CHUNK, td.CHUNK)
    assert _rel_err(outs[1], want) <= TOL32


@pytest.mark.parametrize("device", DEVICES)
def test_gluon_knob_falls_back(device, monkeypatch):
    """Where the Gluon march cannot run (the CPU, T not a multiple of 64) the knob leaves the
    Triton march in place: the same kernels, so the same bits."""
    from kernels import triton_delta as td
    calls = []
    monkeypatch.setattr(td, "march_gluon", lambda *a, **kw: calls.append(1))
    inp = _inputs(1, 100, 2, 32, 32, gated=True, seed=33, device=device)
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    with torch.no_grad():
        o0, ht0, _ = _run(inp, dtype, gated=True, fs=True, grad=False)
        with td.tuning(mt_gl=1):
            o1, ht1, _ = _run(inp, dtype, gated=True, fs=True, grad=False)
    assert not calls
    assert torch.equal(o0, o1) and torch.equal(ht0, ht1)


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.skipif(not _hopper(), reason="the Gluon march needs a Hopper GPU")
@pytest.mark.parametrize("form,stages", [(1, 3), (1, 2), (3, 3), (3, 2)])
@pytest.mark.parametrize("B,H,T", [(1, 4, 2048), (2, 16, 1024), (4, 64, 640)])   # V-blocks 16, 32, 64
@pytest.mark.parametrize("gated,dtype", [(True, torch.bfloat16), (False, torch.bfloat16),
                                         (True, torch.float16)])
def test_gpu_gluon_march(form, stages, B, H, T, gated, dtype, monkeypatch):
    """The Gluon march (T form and W/U form, 2 and 3 pipeline stages, the three V-block widths
    the launch rule picks) against the float64 chunkwise reference, with an initial and a final
    state and (B = 2, bfloat16) harsh gates (float16 cannot hold them: log decays of −1e5 become
    −inf, and every implementation, the Triton march included, then returns NaN). Bound: RMS ratio ≤ 2e-2 (as ``test_gpu_large_shapes``) and at
    most 1.3× the Triton march's own error on the same inputs (the W/U form rounds ``W`` and
    ``U`` to 16 bits, as the training forward does, whose output error is ≈ 1.2× the T form's in
    the benchmark record)."""
    from kernels import triton_delta as td
    from kernels import gluon_delta
    calls = []
    for name in ("march_gluon", "march_gluon_wu"):
        real = getattr(td, name)
        monkeypatch.setattr(td, name, lambda *a, _f=real, **kw: (calls.append(1), _f(*a, **kw))[1])
    K = V = 128
    inp = _inputs(B, T, H, K, V, gated=gated, seed=B * 100 + H + form, device="cuda", beta_max=1.0,
                  harsh=gated and B == 2 and dtype == torch.bfloat16)
    with torch.no_grad():
        o0, ht0, leaves = _run(inp, dtype, gated=gated, fs=True, grad=False)
        with td.tuning(mt_gl=form, mt_gst=stages):
            o1, ht1, _ = _run(inp, dtype, gated=gated, fs=True, grad=False)
        r = {n: t.double() for n, t in leaves.items()}
        ro, rht = reference.chunk_scalar_ref(r["q"], r["k"], r["v"], r.get("g") if gated else None,
                                             r["beta"], K ** -0.5, r["h0"], True)
    assert calls, "the Gluon march did not run"
    assert gluon_delta.HAVE_GLUON
    for x, x0, ref in ((o1, o0, ro), (ht1, ht0, rht)):
        err, err0 = _rms_ratio(x, ref), _rms_ratio(x0, ref)
        assert err <= 2e-2, err
        assert err <= 1.3 * err0, (err, err0)


def test_gluon_marches_compile_for_hopper():
    """The Gluon marches (``kernels/gluon_delta.py``, which the interpreter cannot run) go through the
    whole GPU compiler for sm_90a at the launch configurations the forward uses: no compile error,
    ``ptxas`` accepts the PTX, the products are Hopper ``wgmma`` instructions, shared memory fits
    the 227 KiB a block may use on an H100/H200, and no register spills. Runs
    ``tests/aot_compile_gluon_delta.py`` in a fresh process (the interpreter must be off to compile)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    triton = pytest.importorskip("triton")
    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("this triton build has no NVIDIA backend tools (ptxas)")
    script = Path(__file__).resolve().parent / "aot_compile_gluon_delta.py"
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=dict(os.environ, TRITON_INTERPRET="0"), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    kinds = {(r["kernel"], r["BV"]) for r in rows}
    assert {("_march_gl_kernel", 16), ("_march_gl_wu_kernel", 16)} <= kinds and len(rows) >= 6, rows
    for r in rows:
        assert "error" not in r, r
        assert r["ptxas_rc"] == 0 and r["wgmma"], r
        assert r["shared"] <= 227 * 1024 and r["spill_bytes"] == 0, r
