"""The MesaNet kernels (``kernels.mesa.chunk_mesa_net``) against float64 references.

On a machine without a GPU the kernels run through Triton's interpreter (CPU tensors, small heads
and short sequences that still cross the 64-token chunks: one token, a ragged tail, gla's sequence
split, V != K both ways); with CUDA the same tests also run compiled, plus the benchmark's head size.

References (:func:`kernels.reference.chunk_mesa_net_ref`, float64): ``exact=True`` forms every
``H_t`` and solves it with ``torch.linalg.solve`` (the exact function and, by autograd, its exact
gradients); without it, the same conjugate-gradient iteration as the kernel, unrolled in PyTorch.
The reference is itself checked against ``lattn_core.mesanet_recurrent`` here. Inputs are cast to
float64 *after* rounding to the tested dtype, so the tolerances measure the kernels' arithmetic.

Inputs as MesaNet's layers make them: L2-normalised q and k, log decays ``logsigmoid(N(0,1) + 1)``,
``beta = sigmoid(N(0, 1))``, ``lamb = softplus(U(0, 1)) + 0.5``: every ``H_t + Diag(lamb)`` then has
a condition number below ~20, so 30 CG steps reach float32 round-off (CG's bound
``2((sqrt(20)-1)/(sqrt(20)+1))^30 ~ 1e-6``, and at K <= 32 CG ends in at most K steps in exact
arithmetic) and the kernel's implicit gradients (those of the exact solve) are comparable with the
exact reference's.

Tolerances:
- float32 (IEEE products): 2e-5 of max(max |ref|, 1) for the output, states and every gradient. The
  solve is 30 CG steps, each a few float32 roundings (6e-8) per sum of <= 64 or K terms, amplified by
  the condition number (<= 20); measured ~2e-7 of the max. A TF32 product (1e-3), a float16 operand
  (5e-4), a wrong mask or a stale chunk state fails by orders of magnitude.
- 16-bit: fla's RMS error ratio (``err_ratio``): ``o`` 5e-3, gradients 8e-3 (PaTH's tolerances
  from fla's tests: 16-bit storage of ``o`` alone is ~1e-3 in bfloat16). The solve's operands are
  float16 (bfloat16 q, k convert exactly), the outputs of the gla stages 16-bit.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kernels
import lattn_core as lc
from kernels.backend import GPU_CLASSES
from kernels.harness import err_ratio
from kernels.mesa import chunk_mesa_net
from kernels.reference import chunk_mesa_net_ref
from kernels.mesa.op import chunk_mesa_net_triton
from kernels.mesa.plan import plan_for

DEVICES = (["cpu"] if kernels.INTERPRET else []) + (["cuda"] if torch.cuda.is_available() else [])
if not DEVICES:  # pragma: no cover - a CUDA machine with TRITON_INTERPRET unset always has "cuda"
    DEVICES = ["cpu"]

NAMES = ("q", "k", "v", "g", "beta", "lamb", "h_kk_init", "h_kv_init")
TOL32 = 2e-5
RMS_TOL = {"o": 5e-3, "grad": 8e-3}


def make_inputs(B, T, H, K, V, dtype, device, *, states=False, gate_dtype=torch.float32, seed=0):
    """``q, k, v`` in ``dtype``; ``g``, ``beta``, ``lamb`` in ``gate_dtype``; with ``states`` a
    symmetric positive semi-definite ``h_kk_init`` and a ``h_kv_init`` (float32), else ``None``."""
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, H, generator=gen) + 1)
    beta = torch.sigmoid(torch.randn(B, T, H, generator=gen))
    lamb = F.softplus(torch.rand(H, K, generator=gen)) + 0.5
    hkk = hkv = None
    if states:
        A = torch.randn(B, H, K, K, generator=gen) / K
        hkk = A @ A.transpose(-1, -2)
        hkv = torch.randn(B, H, K, V, generator=gen) / K
    out = [q.to(dtype), k.to(dtype), v.to(dtype), g.to(gate_dtype), beta.to(gate_dtype), lamb.to(gate_dtype),
           hkk, hkv]
    return [None if x is None else x.to(device) for x in out]


def run(fn, inputs, *, final=False, seed=1, like=None):
    """``(outputs, grads)``: ``fn(*inputs)`` -> ``(o, h_kk, h_kv)``, and the gradients of every
    input that is given, for random upstream gradients of ``o`` (and the final states), rounded to
    each output's dtype, or to those of the outputs ``like`` (the tested run's, for its reference)."""
    leaves = [None if x is None else x.detach().clone().requires_grad_(True) for x in inputs]
    o, hkk, hkv = fn(*leaves)
    gen = torch.Generator().manual_seed(seed)
    outs = [o] + ([hkk, hkv] if final else [])
    dts = [x.dtype for x in (like if like is not None else outs)[:len(outs)]]
    seeds = [torch.randn(x.shape, generator=gen).to(dt).to(x.dtype).to(x.device) for x, dt in zip(outs, dts)]
    present = [(n, x) for n, x in zip(NAMES, leaves) if x is not None]
    gs = torch.autograd.grad(outs, [x for _, x in present], seeds)
    grads = {"d" + n: gr for (n, _), gr in zip(present, gs)}
    # dh_kk_init: the whole gradient, antisymmetric part included, in the orientation of (H + Λ) x = q
    # solved as written (fla's naive_mesa_net_exact, torch.linalg.solve), so it is compared as it is
    return [o, hkk, hkv], grads


def as64(inputs):
    return [None if x is None else x.detach().to(torch.float64) for x in inputs]


def ours(iters, final, **kw):
    return lambda *a: chunk_mesa_net_triton(*a[:6], iters, a[6], a[7], final, **kw)


def exact(final):
    return lambda *a: chunk_mesa_net_ref(*a[:6], 30, a[6], a[7], final, exact=True)


def max_err(x, ref):
    return ((x.detach().double().cpu() - ref.detach().double().cpu()).abs().max()
            / max(ref.abs().max().item(), 1.0)).item()


# (B, T, H, K, V, states, num_segments): one token; ragged with V > K and both states; gla's split of
# the states' march into segments (NT = 3, three segments) with V < K
FLOAT32_CASES = [(1, 1, 1, 16, 16, False, None), (2, 70, 2, 16, 32, True, None), (1, 150, 2, 32, 16, True, 3)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B,T,H,K,V,states,ns", FLOAT32_CASES)
def test_float32_against_exact_solve(device, B, T, H, K, V, states, ns):
    inputs = make_inputs(B, T, H, K, V, torch.float32, device, states=states, seed=T)
    outs, grads = run(ours(30, states, plan={"num_segments": ns}), inputs, final=states)
    outs64, grads64 = run(exact(states), as64(inputs), final=states, like=outs)
    for name, a, b in zip(("o", "h_kk", "h_kv"), outs, outs64):
        if b is not None:
            assert a is not None and a.dtype == torch.float32, name
            assert max_err(a, b) < TOL32, name
    assert set(grads) == set(grads64)
    for name in grads64:
        assert max_err(grads[name], grads64[name]) < TOL32, name


@pytest.mark.parametrize("device", DEVICES)
def test_cg_iterates_match_reference(device):
    """Few iterations, far from converged: the kernel runs the reference's iteration, step for step
    (float32 against float64, the same 2e-5)."""
    inputs = make_inputs(1, 100, 2, 32, 16, torch.float32, device, seed=3)
    for iters in (0, 1, 3):
        o = ours(iters, False)(*inputs)[0]
        o64 = chunk_mesa_net_ref(*as64(inputs)[:6], iters)[0]
        assert max_err(o, o64) < TOL32, iters
    assert o64.abs().max() > 0.1    # three steps already give an output (the test can see a wrong one)


@pytest.mark.parametrize("device", DEVICES)
def test_cg_error_decreases_with_iterations(device):
    """The error against the exact solve falls with every doubling of the iteration count and reaches
    float32 round-off; with 0 iterations x = 0, so o = 0 (the zero start)."""
    inputs = make_inputs(1, 64, 1, 32, 16, torch.float32, device, seed=5)
    o64 = chunk_mesa_net_ref(*as64(inputs)[:6], exact=True)[0]
    errs = [err_ratio(ours(n, False)(*inputs)[0].cpu(), o64.cpu()) for n in (0, 1, 2, 3, 4, 5, 16)]
    assert errs[0] == pytest.approx(1.0)
    assert all(b < 0.7 * a for a, b in zip(errs[:-1], errs[1:-1])), errs
    assert errs[-1] < 1e-5, errs


def _fla_mesa_inputs(B, T, H, D, gate_range, device, seed=42):
    """fla's test_mesa.py inputs (float16): q, v from rand/10, keys normalised rand (all positive,
    so H_t is ill-conditioned without decay), gates e^g uniform in gate_range."""
    torch.manual_seed(seed)
    q = torch.rand(B, T, H, D, dtype=torch.float16) / 10
    k = torch.nn.functional.normalize(torch.rand(B, T, H, D), p=2, dim=-1).half()
    v = torch.rand(B, T, H, D, dtype=torch.float16) / 10
    beta = torch.rand(B, T, H, dtype=torch.float16).sigmoid()
    g = torch.rand(B, T, H).uniform_(*gate_range).log()
    lamb = torch.rand(H, D, dtype=torch.float16).sigmoid() * 0.75 + 0.25
    return [x.to(device) for x in (q, k, v, g, beta, lamb)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gate_range", [(0.01, 0.1), (0.8, 0.99), (1.0, 1.0)], ids=["harsh", "mild", "none"])
def test_iterations_past_convergence_stay_put(device, gate_range):
    """fla passes ``max_CG_iteration = K`` (128 at K = 128), far past convergence. A row stops at
    float32's roundoff (solve.CG_FLOOR): 256 and 1024 iterations give the 64-iteration result,
    finite and within fla's tolerance (0.006). Without the stop the recursive residual underflows
    and the 16-bit products turn the iterates to NaN by 256 iterations (the interpreter, float16,
    fla's inputs; on the H200 at 128: NaN with harsh gates, an error ratio of 7.2 with none)."""
    q, k, v, g, beta, lamb = _fla_mesa_inputs(1, 128, 2, 64, gate_range, device)
    o64 = chunk_mesa_net_ref(*(x.cpu().double() for x in (q, k, v, g, beta, lamb)), exact=True)[0]
    outs = [kernels.chunk_mesa_net(q, k, v, g, beta, lamb, max_CG_iteration=n, backend="triton")[0].cpu()
            for n in (64, 256, 1024)]
    assert all(torch.isfinite(o).all() for o in outs)
    assert torch.equal(outs[1], outs[0]) and torch.equal(outs[2], outs[0])
    assert err_ratio(outs[0], o64) < 0.006


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("gate_dtype", ["float32", "inputs"])
def test_half_inputs(device, dtype, gate_dtype):
    gd = torch.float32 if gate_dtype == "float32" else dtype
    inputs = make_inputs(1, 100, 2, 32, 64, dtype, device, states=True, gate_dtype=gd, seed=7)
    outs, grads = run(ours(30, True), inputs, final=True)
    outs64, grads64 = run(exact(True), as64(inputs), final=True, like=outs)
    assert outs[0].dtype == dtype and outs[1].dtype == outs[2].dtype == torch.float32
    for a, b in zip(outs, outs64):
        assert err_ratio(a.cpu(), b.cpu()) < RMS_TOL["o"]
    for name in grads64:
        assert grads[name].dtype == inputs[NAMES.index(name[1:])].dtype, name
        assert err_ratio(grads[name].cpu(), grads64[name].cpu()) < RMS_TOL["grad"], name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,operand,beta_dtype", [(torch.float32, torch.float32, torch.float32),
                                                      (torch.bfloat16, torch.float16, torch.float32),
                                                      (torch.bfloat16, torch.float16, torch.bfloat16)])
@pytest.mark.parametrize("used", ["both", "kb"])
def test_prep_kernel_against_its_pytorch_form(device, dtype, operand, beta_dtype, used):
    """kernels.mesa.prep: k and beta·k in the operand dtype by one Triton pass each way = the PyTorch
    form (autograd for the gradients), K = 24 (not a power of two), beta at 0 on some rows.
    Outputs: the same float32 product rounded once, so equal up to a float16 rounding boundary
    (2^-10 relative of the largest entry). dk: the kernel adds its two parts in float32 and rounds
    once where autograd rounds each part to k's dtype first: within 2 units in the last place of
    bfloat16 (2^-7). dbeta: the same float32 sum over 24 terms in another order (1e-6 float32;
    bfloat16 dbeta one unit, 2^-7). `used="kb"`: only beta·k reaches the loss."""
    from kernels.mesa.prep import prep_keys, prep_keys_torch
    gen = torch.Generator().manual_seed(3)
    k = torch.randn(2, 37, 3, 24, generator=gen).to(dtype)
    beta = torch.rand(2, 37, 3, generator=gen)
    beta[:, ::5] = 0.0
    beta = beta.to(beta_dtype)
    n = 1 if used == "kb" else 2
    outs = [torch.randn(k.shape, generator=gen) for _ in range(n)]
    results = []
    for f, dev in ((prep_keys, device), (prep_keys_torch, "cpu")):
        leaves = [k.to(dev).requires_grad_(), beta.to(dev).requires_grad_()]
        got = f(*leaves, operand)
        got = got[::-1][:n]                            # (kb,) or (kb, kk)
        loss = sum((a.float() * o.to(dev)).sum() for a, o in zip(got, outs))
        grads = torch.autograd.grad(loss, leaves)
        results.append([t.detach().double().cpu() for t in (*got, *grads)])
    small = dtype == torch.float32 and beta_dtype == torch.float32
    tols = [2 ** -10] * n + ([1e-6, 1e-6] if small else [2 ** -7, 2 ** -7])
    for i, (a, b, tol) in enumerate(zip(*results, tols)):
        err = ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
        assert err <= tol, (i, err, tol)


def test_reference_agrees_with_lattn_core():
    """beta = 1, gamma = exp(g): the exact reference is ``lattn_core.mesanet_recurrent`` (1e-10: both
    float64 direct solves), and the CG reference with 2K steps too (1e-8: CG in float64 at K = 8)."""
    B, T, H, K, V = 1, 90, 2, 8, 5
    q, k, v, g, _, lamb, _, _ = as64(make_inputs(B, T, H, K, V, torch.float32, "cpu", seed=11))
    beta = torch.ones(B, T, H, dtype=torch.float64)
    o_exact = chunk_mesa_net_ref(q, k, v, g, beta, lamb, exact=True, chunk_size=32)[0]
    o_cg = chunk_mesa_net_ref(q, k, v, g, beta, lamb, 2 * K)[0]
    for h in range(H):
        want = lc.mesanet_recurrent(q[0, :, h].numpy(), k[0, :, h].numpy(), v[0, :, h].numpy(),
                                    np.exp(g[0, :, h].numpy()), lamb[h].numpy())
        assert np.abs(o_exact[0, :, h].numpy() - want).max() < 1e-10
        assert np.abs(o_cg[0, :, h].numpy() - want).max() < 1e-8


def test_reference_cg_gradient_past_convergence():
    """Three times more CG steps than the head size K (so CG has converged long before the last):
    the reference's autograd gradients stay finite and agree with the exact solve's (4e-4: float32
    arithmetic, relative to the largest entry). Without the stopping floor of its ``_cg`` the ratios
    of vanishing residuals sent NaN into the gradients (the GPU setting of Chapter 10's MQAR)."""
    inputs = make_inputs(2, 50, 2, 4, 6, torch.float32, "cpu", seed=17)
    outs, grads = run(lambda *a: chunk_mesa_net_ref(*a[:6], 12, None, None, False), inputs)
    outs64, grads64 = run(exact(False), as64(inputs), like=outs)
    assert max_err(outs[0], outs64[0]) < 4e-4
    for name in grads64:
        assert torch.isfinite(grads[name]).all(), name
        assert max_err(grads[name], grads64[name]) < 4e-4, name


def test_torch_backend_is_the_reference():
    inputs = make_inputs(1, 40, 2, 16, 16, torch.float32, "cpu", states=True, seed=13)
    o, hkk, hkv = chunk_mesa_net(*inputs[:6], 7, inputs[6], inputs[7], True, backend="torch")
    o2, hkk2, hkv2 = chunk_mesa_net_ref(*inputs[:6], 7, inputs[6], inputs[7], True)
    assert torch.equal(o, o2) and torch.equal(hkk, hkk2) and torch.equal(hkv, hkv2)
    assert chunk_mesa_net(*inputs[:6], 7, backend="torch")[1:] == (None, None)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs_raise(device):
    q, k, v, g, beta, lamb, hkk, hkv = make_inputs(1, 10, 2, 16, 16, torch.float32, device, states=True)

    def call(**over):
        a = dict(q=q, k=k, v=v, g=g, beta=beta, lamb=lamb, h_kk_init=None, h_kv_init=None)
        a.update(over)
        return chunk_mesa_net(backend="triton", **a)

    bad = [
        (dict(k=k[..., :8]), "k must have the shape of q"),
        (dict(v=v[:, :5]), "v must have shape"),
        (dict(g=g[..., :1]), "g must have shape"),
        (dict(g=-g), "g holds log decays"),
        (dict(beta=beta[0]), "beta must have shape"),
        (dict(beta=-beta), "beta must be >= 0"),
        (dict(lamb=lamb[0]), r"lamb must have shape \[2, 16\]"),
        (dict(lamb=lamb - 2.0), "lamb must be > 0"),
        (dict(lamb=torch.zeros_like(lamb)), "lamb must be > 0"),
        (dict(max_CG_iteration=-1), "max_CG_iteration must be an integer >= 0"),
        (dict(max_CG_iteration=2.5), "max_CG_iteration must be an integer"),
        (dict(max_CG_iteration=True), "max_CG_iteration must be an integer"),
        (dict(h_kk_init=hkk[..., :8]), r"h_kk_init must have shape \[B, H, K, K\]"),
        (dict(h_kv_init=hkv[:, :1]), r"h_kv_init must have shape \[B, H, K, V\]"),
        (dict(h_kk_init=hkk + torch.triu(torch.ones_like(hkk), 1)), "h_kk_init must be symmetric"),
    ]
    for over, msg in bad:        # value checks too: they run on every device
        with pytest.raises(ValueError, match=msg):
            call(**over)
    # head sizes over 256 (fla's largest), before anything compiles; every size up to 256 runs
    # (tests/kernels/test_common.py)
    q300 = torch.randn(1, 10, 2, 300, device=device)
    with pytest.raises(ValueError, match="K .* between 1 and 256"):
        chunk_mesa_net(q300, q300, v, g, beta, torch.ones(2, 300, device=device), backend="triton")
    with pytest.raises(ValueError, match="V .* between 1 and 256"):
        chunk_mesa_net(q, k, torch.randn(1, 10, 2, 260, device=device), g, beta, lamb, backend="triton")


def test_plan():
    dev = torch.device("cpu")      # any device: the class comes from caps (and 132 SMs off the GPU)
    hop = GPU_CLASSES[90]
    p = plan_for(torch.bfloat16, dev, B=32, T=2048, H=16, K=128, interpret=False, caps=hop)
    assert (p.operand, p.warps_cg, p.BT, p.path) == (torch.float16, 8, 64, "triton")
    assert p.states.state_dtype == torch.float32 and p.states.gate == 1
    p32 = plan_for(torch.float32, dev, B=1, T=100, H=2, K=32, interpret=False, caps=hop)
    assert (p32.operand, p32.IP, p32.warps_cg) == (torch.float32, "ieee", 4)
    assert plan_for(torch.float16, dev, B=1, T=100, H=2, K=32, interpret=False, caps=GPU_CLASSES[75]).path == "torch"
    assert plan_for(torch.float16, dev, B=1, T=640, H=2, K=32, interpret=False, caps=hop, num_segments=3).states.NS == 3
    with pytest.raises(ValueError, match="plan overrides"):
        plan_for(torch.float16, dev, B=1, T=100, H=2, K=32, caps=hop, BT=32)


# ---------------------------------------------------------------------------------------------
# compiled, on a GPU: the benchmark's head size
# ---------------------------------------------------------------------------------------------
GPU_SHAPES = [(2, 1000, 4, 128, 128, torch.bfloat16, False), (1, 700, 4, 64, 128, torch.float16, True),
              (1, 2100, 2, 128, 64, torch.bfloat16, True)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled Triton needs a CUDA device")
@pytest.mark.parametrize("B,T,H,K,V,dtype,states", GPU_SHAPES)
def test_gpu_large_shapes(B, T, H, K, V, dtype, states):
    inputs = make_inputs(B, T, H, K, V, dtype, "cuda", states=states, seed=T)
    outs, grads = run(lambda *a: chunk_mesa_net(*a[:6], 30, a[6], a[7], states), inputs, final=states)
    outs64, grads64 = run(exact(states), as64(inputs), final=states, like=outs)
    for a, b in zip(outs, outs64):
        if b is not None:
            assert err_ratio(a, b) < RMS_TOL["o"]
    for name in grads64:
        assert err_ratio(grads[name], grads64[name]) < RMS_TOL["grad"], name


def test_step_costs_fit_the_sweep():
    """kernels.mesa.bench.step_costs: a line through (CG steps, ms) per implementation and pass;
    exact for times that are exactly linear, and a pair timed at one count only is left out."""
    from kernels.mesa.bench import step_costs
    recs = [dict(op="mesa_cg", impl="ours", cg=c, ms=2.0 + 0.5 * c) for c in (5, 10, 30)]
    recs += [dict(op="mesa_cg", impl="fla", cg=5, ms=4.0), dict(op="mesa", impl="ours", cg=30, ms=99.0)]
    for r in recs:
        r["pass"] = "fwd"
    out = step_costs({"records": recs})
    assert set(out) == {("ours", "fwd")}
    assert out["ours", "fwd"]["per_step_ms"] == pytest.approx(0.5) and out["ours", "fwd"]["rest_ms"] == pytest.approx(2.0)
    assert out["ours", "fwd"]["steps"] == [5, 10, 30]
