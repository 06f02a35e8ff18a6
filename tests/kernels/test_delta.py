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
from kernels.backend import Launch

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
# rounds to nearest even like the GPU; see kernels/backend.py.)
TOL16_OUT, TOL16_GRAD = 1e-2, 1e-2


def _rel_err(x, ref):
    x = x.detach().double()
    ref = ref.detach().double()
    assert torch.isfinite(x).all(), "non-finite values"
    return ((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def _rms_ratio(x, ref):
    from kernels.harness import err_ratio
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


def _run(inp, dtype, *, gated, fs, scale=None, backend="triton", grad=True, plan=None):
    """Run the op on ``dtype`` copies (leaf tensors); returns outputs and the leaves. ``plan``: overrides
    of the launch plan (:func:`kernels.delta.plan.plan_for`), run through the Triton path directly."""
    leaves = {}
    for n, t in inp.items():
        if t is None:
            continue
        # the state is float32 in every case; .to keeps strides, so non-contiguous inputs stay so
        x = t.float() if n == "h0" else t.to(dtype)
        leaves[n] = x.detach().requires_grad_(grad)
    args = (leaves["q"], leaves["k"], leaves["v"])
    kw = dict(scale=scale, initial_state=leaves.get("h0"), output_final_state=fs)
    if plan is not None:
        from kernels.delta.op import delta_rule_triton
        K = args[0].shape[-1]
        o, ht = delta_rule_triton(*args, leaves["g"] if gated else None, leaves["beta"],
                                  scale if scale is not None else K ** -0.5, leaves.get("h0"), fs, plan=dict(plan))
        return o, ht, leaves
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


# The inference forward (no gradient asked for) runs in T form by default (the solve + the T-form
# march, no W/U); these cases pin it, its plan's choices and the W/U form to the definition.
INFER_VARIANTS = [dict(), dict(t_form=False), dict(march_bv=16, march_scores_stored=True),
                  dict(march_bv=16, march_scores_stored=False), dict(march_scores_stored=True),
                  dict(march_ranges=2), dict(march_ranges=3, march_scores_stored=False)]
# (op gated?, T, K, V, harsh gates, beta_max)
INFER_CASES = [(True, 130, 32, 16, True, 2.0), (False, 70, 16, 32, False, 2.0), (True, 1, 16, 16, False, 1.0)]


def _ids(d):
    return ",".join(f"{k}={v}" for k, v in d.items()) or "default"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("plan", INFER_VARIANTS, ids=_ids)
@pytest.mark.parametrize("gated,T,K,V,harsh,beta_max", INFER_CASES)
def test_inference_forms(device, plan, gated, T, K, V, harsh, beta_max):
    """T form and W/U form, both sources of the scores, one or several chunk ranges: float32 outputs
    and final state within TOL32 of the float64 recurrence (same bound and reasoning as the training
    path)."""
    inp = _inputs(2, T, 2, K, V, gated=gated, seed=T + K + V, device=device, harsh=harsh, beta_max=beta_max)
    with torch.no_grad():
        o, ht, leaves = _run(inp, torch.float32, gated=gated, fs=True, grad=False, plan=plan)
        ro, rht, _ = _reference(leaves, gated=gated, fs=True, scale=None)
    assert _rel_err(o, ro) <= TOL32 and _rel_err(ht, rht) <= TOL32


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("plan", [dict(), dict(t_form=False), dict(march_bv=16, march_scores_stored=False),
                                  dict(march_ranges=4)], ids=_ids)
def test_inference_forms_half_precision(device, plan):
    """bf16 inference forward (T form; the solve's block products in 3xTF32 on the GPU, which the
    interpreter computes exactly) within the bf16 bound TOL16_OUT of the float64 recurrence,
    including β up to 2."""
    inp = _inputs(1, 150, 2, 32, 32, gated=True, seed=31, device=device, beta_max=2.0)
    with torch.no_grad():
        o, ht, leaves = _run(inp, torch.bfloat16, gated=True, fs=True, grad=False, plan=plan)
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
@pytest.mark.parametrize("K,V", [(300, 16), (16, 257), (0, 16)])
def test_bad_head_sizes_raise(device, K, V):
    """Head sizes over 256 (fla's largest) raise before anything compiles; every size up to 256
    runs (tests/kernels/test_common.py)."""
    q = torch.randn(1, 8, 1, K, device=device)
    k = torch.randn(1, 8, 1, K, device=device)
    v = torch.randn(1, 8, 1, V, device=device)
    beta = torch.rand(1, 8, 1, device=device)
    g = -torch.rand(1, 8, 1, device=device)
    with pytest.raises(ValueError, match="head size|non-empty"):
        kernels.chunk_delta_rule(q, k, v, beta, backend="triton")
    with pytest.raises(ValueError, match="head size|non-empty"):
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
    # rounded (|b| reaches 1e4, so b_i − b_j cancels; kernels/delta/HISTORY.md, round 6);
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
    state (kernels/delta/lab/logs/conditioning_delta_round5.json),
    so the bound is relative: the T form may not be more than 10 % worse than the W/U form."""
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
        o_wu, ht_wu, _ = _run(inp, torch.bfloat16, gated=gated, fs=True, grad=False, plan=dict(t_form=False))
        r = {n: t.double() for n, t in leaves.items()}
        ro, rht = reference.chunk_scalar_ref(r["q"], r["k"], r["v"], r.get("g") if gated else None,
                                             r["beta"], K ** -0.5, r["h0"], True)
    for x, x_wu, ref in ((o, o_wu, ro), (ht, ht_wu, rht)):
        err, err_wu = _rms_ratio(x, ref), _rms_ratio(x_wu, ref)
        assert err <= 1.1 * err_wu, (err, err_wu)
        assert err <= (5e-2 if correlated else 2e-2), err


@pytest.mark.parametrize("device", DEVICES)
def test_torch_fallback_backward_agrees(device, monkeypatch):
    """The batched-PyTorch backward of the per-chunk algebra (``chunk_grads_torch``) stays correct."""
    from kernels.delta import op
    from kernels.delta.backward import chunk_grads_torch
    monkeypatch.setattr(op, "chunk_grads", lambda q, k, v, g, beta, b, tm, a, hs, dh, do, vp, dvp, scale, plan:
                        chunk_grads_torch(q, k, v, g, beta, scale, hs, dh, do))
    inp = _inputs(1, 70, 2, 16, 32, gated=True, seed=9, device=device, harsh=True)
    _check(inp, torch.float32, gated=True, fs=True, seed=9)


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_resources_falls_back_to_torch_backward(device, monkeypatch):
    """If the per-chunk backward kernel cannot launch (e.g. float32 at K = V = 128 needs more shared
    memory than the GPU has), the batched-PyTorch backward takes over with the same gradients."""
    from triton.runtime.errors import OutOfResources
    from kernels.delta import op

    def refuse(*args, **kwargs):
        raise OutOfResources(253952, 232448, "shared memory")
    monkeypatch.setattr(op, "chunk_grads", refuse)
    inp = _inputs(1, 40, 1, 16, 16, gated=True, seed=12, device=device)
    _check(inp, torch.float32, gated=True, fs=True, seed=12)


# launch-plan variants (the lab's sweeps try them on the GPU at K = V = 128 and check each against the
# default there): each must compute the same function; small shapes here
VARIANTS = [dict(fwd_bv=16, bwd_bv=16, dqk_bv=16, dwy_bv=16), dict(fwd_bv=32, bwd_bv=32, fwd=(Launch(4, 1),)),
            dict(wu_bk=16, solve_kc=16), dict(solve=(Launch(2, 1),), wu=(Launch(2, 1),), dqk=(Launch(8, 1),),
                                                 dwy=(Launch(8, 1),)),
            dict(fwd_bv=16, bwd_bv=16, fwd=(Launch(4, 1),)), dict(dqk_bk=32)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("plan", VARIANTS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_plan_variants(device, plan, monkeypatch):
    """Other tiles and launches of the same kernels compute the same function (``dqk_bk=32``: the
    per-chunk backward split over key columns, whose K-blocks' shares of dq, dk and the log-gate
    gradient must add up to the unsplit result)."""
    from kernels.delta import op
    from kernels.delta.plan import plan_for
    monkeypatch.setattr(op, "plan_for", lambda *a, **kw: plan_for(*a, **{**plan, **kw}))
    inp = _inputs(1, 70, 2, 64 if "dqk_bk" in plan else 32, 32, gated=True, seed=21, device=device, with_h0=True,
                  beta_max=1.0, harsh="dqk_bk" in plan)
    _check(inp, torch.bfloat16 if ON_GPU else torch.float32, gated=True, fs=True, seed=21)


def test_plan_rejects_bad_overrides():
    from kernels.delta.plan import plan_for
    with pytest.raises(ValueError, match="unknown field"):
        plan_for(torch.bfloat16, "cpu", B=1, T=64, H=1, K=32, V=32, fwd_bw=16)
    with pytest.raises(ValueError, match="fwd_bv"):
        plan_for(torch.bfloat16, "cpu", B=1, T=64, H=1, K=32, V=32, fwd_bv=24)
    with pytest.raises(ValueError, match="march_ranges"):
        plan_for(torch.bfloat16, "cpu", B=1, T=64, H=1, K=32, V=32, march_ranges=0)


def test_measured_plan():
    """The defaults the NOTES record: V-blocks by batch × heads, one-warp solve for 16-bit inputs,
    stored scores only below V-block 64, two chunk ranges only on a GPU that the march would not fill."""
    from kernels.delta.plan import plan_for
    big = plan_for(torch.bfloat16, "cpu", B=8, T=8192, H=16, K=128, V=128)
    small = plan_for(torch.bfloat16, "cpu", B=1, T=32768, H=16, K=128, V=128)
    assert (big.fwd_bv, big.march_bv, big.march_scores_stored) == (64, 64, False)
    assert (small.fwd_bv, small.march_bv, small.march_scores_stored) == (16, 16, True)
    assert big.solve[0] == Launch(1, 1) and plan_for(torch.float32, "cpu", B=1, T=64, H=1, K=32, V=32).solve[0] == Launch(4, 1)
    assert big.fwd[0] == Launch(4, 1) and small.fwd[0] == Launch(4, 3) and big.march[0] == Launch(4, 2)
    assert small.march_ranges == 1          # no CUDA device here: one range


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fs,T", [(False, 300), (True, 300), (True, 320)])
def test_inference_segments_match_one_range(device, fs, T):
    """The segmented inference forward (chunk ranges, each march launch continuing from the state
    the previous one left) gives the unsegmented outputs, with and without row masks (T = 320 is
    a multiple of the chunk, and the unmasked loop is checked against the masked one): float32,
    bound TOL32 between the two."""
    inp = _inputs(1, T, 2, 32, 32, gated=True, seed=5, device=device, with_h0=False)
    outs = []
    for plan in (dict(march_ranges=1, march_even=False), dict(march_ranges=4)):
        with torch.no_grad():
            o, ht, _ = _run(inp, torch.float32, gated=True, fs=fs, grad=False, plan=plan)
        assert (ht is not None) == fs
        outs.append((o, ht))
    assert _rel_err(outs[1][0], outs[0][0]) <= TOL32
    if fs:
        assert _rel_err(outs[1][1], outs[0][1]) <= TOL32


# ------------------------------------------------------------------ (Gated) DeltaProduct
def _product_inputs(B, T, H, K, V, n, *, gated, seed, device, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)
    k = F.normalize(torch.randn(B, T * n, H, K, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T * n, H, V, generator=gen, dtype=torch.float64)
    beta = 2 * torch.rand(B, T * n, H, generator=gen, dtype=torch.float64)
    g = -0.5 * torch.rand(B, T, H, generator=gen, dtype=torch.float64) if gated else None
    return [None if t is None else t.to(device=device, dtype=dtype) for t in (q, k, v, g, beta)]


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("n,T", [(1, 5), (2, 37), (3, 30)])     # T·n crosses the 64-token chunk
def test_deltaproduct_is_lattn_cores_definition(gated, n, T):
    """The op's PyTorch path (float32) = lc.deltaproduct_recurrent (float64, on the same rounded
    inputs) per batch and head, with the gate once per token. float32 round-off over <= 90 steps of
    O(1) values is ~1e-6; 1e-4 still fails by O(1) for a gate or a query on the wrong step."""
    import lattn_core as lc
    q, k, v, g, beta = _product_inputs(2, T, 2, 8, 4, n, gated=gated, seed=n + T, device="cpu")
    o, S = kernels.chunk_gated_delta_product(q, k, v, g, beta, n, scale=1.0, output_final_state=True)
    for b in range(2):
        for h in range(2):
            ref = lc.deltaproduct_recurrent(q[b, :, h].double().numpy(), k[b, :, h].reshape(T, n, 8).double().numpy(),
                                            v[b, :, h].reshape(T, n, 4).double().numpy(),
                                            beta[b, :, h].reshape(T, n).double().numpy(),
                                            None if g is None else g[b, :, h].double().exp().numpy())
            lc.check_close("chunk_gated_delta_product = lc.deltaproduct_recurrent", o[b, :, h].numpy(), ref, 1e-4)
    assert S.shape == (2, 2, 8, 4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gated", [False, True])
def test_deltaproduct_triton_against_the_reference(device, gated):
    """The Triton path (the delta family's kernels on the T·n steps) = the PyTorch path (the float32
    reference, itself checked against lattn_core above), outputs, final state and every gradient (q,
    k, v, g, beta, initial state), at TOL32: both float32, so ~1e-6 apart."""
    n, T = 2, 45
    ins = _product_inputs(1, T, 2, 16, 16, n, gated=gated, seed=7, device=device)
    h0 = torch.randn(1, 2, 16, 16, generator=torch.Generator().manual_seed(3)).to(device)
    leaves = [None if t is None else t.clone().requires_grad_() for t in ins + [h0]]
    o, S = kernels.chunk_gated_delta_product(*leaves[:5], n, scale=0.5, initial_state=leaves[5],
                                             output_final_state=True, backend="triton")
    ref_leaves = [None if t is None else t.detach().cpu().requires_grad_() for t in ins + [h0]]
    o_r, S_r = kernels.chunk_gated_delta_product(*ref_leaves[:5], n, scale=0.5, initial_state=ref_leaves[5],
                                                 output_final_state=True, backend="torch")
    assert _rel_err(o.cpu(), o_r) < TOL32 and _rel_err(S.cpu(), S_r) < TOL32
    gen = torch.Generator().manual_seed(11)
    do, dS = torch.randn(o_r.shape, generator=gen), torch.randn(S_r.shape, generator=gen)
    used = [i for i, t in enumerate(leaves) if t is not None]
    grads = torch.autograd.grad((o * do.to(o)).sum() + (S * dS.to(S)).sum(), [leaves[i] for i in used])
    grads_r = torch.autograd.grad((o_r * do).sum() + (S_r * dS).sum(), [ref_leaves[i] for i in used])
    for i, gr, gr_r in zip(used, grads, grads_r):
        assert _rel_err(gr.cpu(), gr_r) < TOL32, ("q", "k", "v", "g", "beta", "h0")[i]


def test_deltaproduct_bad_inputs():
    q, k, v, g, beta = _product_inputs(1, 4, 1, 8, 8, 2, gated=True, seed=0, device="cpu")
    with pytest.raises(ValueError, match="num_householder must be an integer >= 1"):
        kernels.chunk_gated_delta_product(q, k, v, g, beta, 0)
    with pytest.raises(ValueError, match=r"k must have shape \[B, T·num_householder, H, K\] = \[1, 12, 1, 8\]"):
        kernels.chunk_gated_delta_product(q, k, v, g, beta, 3)
    with pytest.raises(ValueError, match=r"g must have shape \[B, T, H\] = \[1, 4, 1\]"):
        kernels.chunk_gated_delta_product(q, k, v, beta, beta, 2)


# ------------------------------------------------------------------ Comba (Chapter 6's form)
def _comba_inputs(B, T, H, K, V, *, seed, device, harsh=False):
    """Comba's inputs: γ = exp(g) in [0.2, 1] (harsh: down to 1e-20, below the op's floor on every fifth
    token), η in (0, 1.5] with η/γ above 2 on every third token (the key rescaling)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64)
    g = torch.log(0.2 + 0.8 * torch.rand(B, T, H, generator=gen, dtype=torch.float64))
    if harsh:
        g[:, ::5] = -46.0                       # γ = 1e-20 < exp(-30)
    eta = 0.05 + 0.95 * torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    eta[:, ::3] = torch.minimum(3.0 * g[:, ::3].exp(), torch.full_like(eta[:, ::3], 1.5))
    return [t.to(device=device, dtype=torch.float32) for t in (q, k, v, g, eta)]


@pytest.mark.parametrize("T,harsh", [(1, False), (37, False), (70, True)])
def test_comba_is_lattn_cores_definition(T, harsh):
    """The op's PyTorch path (float32) = lc.comba_recurrent (float64, same rounded inputs; gates at the
    op's floor exp(-30) where they were below it) per batch and head: float32 round-off over <= 70 steps
    of O(1) values ~1e-6, so 1e-4; a map that missed γ on the values or the key's scale is off by O(1)."""
    import lattn_core as lc
    from kernels.delta.op import COMBA_MIN_LOG_GATE
    q, k, v, g, eta = _comba_inputs(2, T, 2, 8, 4, seed=T, device="cpu", harsh=harsh)
    o, S = kernels.chunk_comba(q, k, v, g, eta, scale=1.0, output_final_state=True)
    gamma = g.double().clamp(min=COMBA_MIN_LOG_GATE).exp()
    for b in range(2):
        for h in range(2):
            ref = lc.comba_recurrent(q[b, :, h].double().numpy(), k[b, :, h].double().numpy(),
                                     v[b, :, h].double().numpy(), gamma[b, :, h].numpy(), eta[b, :, h].double().numpy())
            lc.check_close("chunk_comba = lc.comba_recurrent", o[b, :, h].numpy(), ref, 1e-4, relative=True)
    assert S.shape == (2, 2, 8, 4)


@pytest.mark.parametrize("device", DEVICES)
def test_comba_triton_against_the_reference(device):
    """The Triton path (the delta family's kernels after the map) = the PyTorch path, outputs, final
    state and every gradient (q, k, v, g, eta, initial state), at TOL32 (both float32)."""
    ins = _comba_inputs(1, 45, 2, 16, 16, seed=5, device=device)
    h0 = torch.randn(1, 2, 16, 16, generator=torch.Generator().manual_seed(3)).to(device)
    leaves = [t.clone().requires_grad_() for t in ins + [h0]]
    o, S = kernels.chunk_comba(*leaves[:5], scale=0.5, initial_state=leaves[5], output_final_state=True,
                               backend="triton")
    ref_leaves = [t.detach().cpu().requires_grad_() for t in ins + [h0]]
    o_r, S_r = kernels.chunk_comba(*ref_leaves[:5], scale=0.5, initial_state=ref_leaves[5], output_final_state=True,
                                   backend="torch")
    assert _rel_err(o.cpu(), o_r) < TOL32 and _rel_err(S.cpu(), S_r) < TOL32
    gen = torch.Generator().manual_seed(11)
    do, dS = torch.randn(o_r.shape, generator=gen), torch.randn(S_r.shape, generator=gen)
    grads = torch.autograd.grad((o * do.to(o)).sum() + (S * dS.to(S)).sum(), leaves)
    grads_r = torch.autograd.grad((o_r * do).sum() + (S_r * dS).sum(), ref_leaves)
    for name, gr, gr_r in zip(("q", "k", "v", "g", "eta", "h0"), grads, grads_r):
        assert _rel_err(gr.cpu(), gr_r) < TOL32, name


def test_comba_gradients_against_float64_autograd_of_the_recurrence():
    """The gradients through the change of variables are Comba's own: the op's PyTorch path (float32)
    against autograd of the recurrence written out in float64 on the same inputs. float32 round-off
    over 20 steps: 1e-4 of the largest entry; a gradient lost in the map (the key's scale, γ on the
    values) is off by O(1)."""
    ins = _comba_inputs(1, 20, 1, 6, 5, seed=2, device="cpu")
    leaves = [t.clone().requires_grad_() for t in ins]
    o, _ = kernels.chunk_comba(*leaves, scale=1.0)
    loop = [t.double().requires_grad_() for t in ins]
    lq, lk, lv, lg, le = (t[0, :, 0] for t in loop)
    S = torch.zeros(6, 5, dtype=torch.float64)                  # fla's orientation [K, V]
    outs = []
    for t in range(20):
        S = lg[t].exp() * S + le[t] * torch.outer(lk[t], lv[t] - S.T @ lk[t])
        outs.append(S.T @ lq[t])
    o_loop = torch.stack(outs)[None, :, None]
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    assert (o.double() - o_loop).abs().max() < 1e-4 * o_loop.abs().max()
    for name, a, b in zip("qkvge", torch.autograd.grad((o * do.float()).sum(), leaves),
                          torch.autograd.grad((o_loop * do).sum(), loop)):
        assert (a.double() - b).abs().max() < 1e-4 * b.abs().max(), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("used", ["all", "k'"])
def test_comba_map_kernel_against_its_pytorch_form(device, dtype, used):
    """kernels.delta.comba's Triton map against its PyTorch form (autograd for the gradients), rows
    where η/γ is below, at and above 2 and gates below, at and above the floor, K ≠ V not powers of
    two; `used="k'"`: only k' reaches the loss (no gradient arrives for g', β').

    float32: both against the same formulas in float64. The PyTorch form's own error is up to 7e-7
    of the largest entry (dg at the floor rows is a difference of two terms near 1e7). A GPU's exp
    is 2^(x·log2 e) with x·log2 e rounded to float32, which alone is 1.3e-6 relative at the floor's
    |x| = 30, and the largest entries (at the floor rows) combine a few such factors: at most 4× the
    PyTorch form's error plus 1e-5 (the interpreter's exp is NumPy's, within an ulp). A dropped or
    doubled factor is off by 1e-1 or more. bfloat16: the same float32
    arithmetic rounded to bfloat16, so against the PyTorch form directly; an output at a rounding
    boundary may move by one unit in the last place (2^-8 relative): 2^-7."""
    from kernels.delta.comba import COMBA_MIN_LOG_GATE, comba_map, comba_map_torch
    gen = torch.Generator().manual_seed(7)
    B, T, H, K, V = 2, 29, 3, 24, 40
    k = torch.randn(B, T, H, K, generator=gen).to(dtype)
    v = torch.randn(B, T, H, V, generator=gen).to(dtype)
    g = torch.log(0.1 + 0.9 * torch.rand(B, T, H, generator=gen))
    g[:, ::7] = COMBA_MIN_LOG_GATE - 5.0
    g[:, 3::7] = COMBA_MIN_LOG_GATE
    eta = 1.9 * torch.rand(B, T, H, generator=gen)
    eta[:, 1::4] = 2.0 * g[:, 1::4].exp()                  # η/γ = 2 up to rounding
    ins = (k, v, g.float(), eta.to(dtype))
    n = 1 if used == "k'" else 4
    outs = None

    def run(f, leaves):
        nonlocal outs
        got = f(*leaves)
        if outs is None:
            outs = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in got[:n]]
        loss = sum((a.double() * o.to(a.device)).sum() for a, o in zip(got, outs))
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        return [t.detach().double().cpu() for t in got] + [
            torch.zeros(x.shape, dtype=torch.float64) if d is None else d.double().cpu() for d, x in zip(grads, leaves)]

    names = ("k'", "v'", "g'", "beta'", "dk", "dv", "dg", "deta")
    got = run(comba_map, [t.to(device).requires_grad_() for t in ins])
    torch32 = run(comba_map_torch, [t.clone().requires_grad_() for t in ins])
    if dtype == torch.float32:
        exact = run(lambda *x: comba_map_torch(*x, compute=torch.float64),
                    [t.double().requires_grad_() for t in ins])
        for name, a, r, e in zip(names, got, torch32, exact):
            assert _rel_err(a, e) <= 4 * _rel_err(r, e) + 1e-5, (name, _rel_err(a, e), _rel_err(r, e))
    else:
        for name, a, r in zip(names, got, torch32):
            assert _rel_err(a, r) < 2 ** -7, (name, _rel_err(a, r))


def test_comba_bad_inputs():
    q, k, v, g, eta = _comba_inputs(1, 4, 1, 8, 8, seed=0, device="cpu")
    with pytest.raises(ValueError, match="g .* and beta .* must be tensors"):
        kernels.chunk_comba(q, k, v, None, eta)
    with pytest.raises(ValueError, match="beta must lie in"):
        kernels.chunk_comba(q, k, v, g, eta + 2.0)
    with pytest.raises(ValueError, match="g"):
        kernels.chunk_comba(q, k, v, -g, eta)
