"""The DeltaFormer kernel (``kernels.deltaformer_attn``) against float64 references.

On a machine without a GPU the kernels run through Triton's interpreter (CPU tensors, with short
spans so that the parallel fold and the serial chunk pass both run); with CUDA the same tests also
run compiled, plus larger GPU-only shapes and the production plans.

References: per batch and head, ``lattn_core.deltaformer(√scale·Q, √scale·K, V, normalize=True,
beta)`` in float64 (the book's matrix form with a library triangular solve); gradients from the
differentiable ``kernels.reference.deltaformer_ref`` in float64, itself checked against
``lattn_core`` here. Inputs are cast to float64 *after* rounding to the tested dtype.

Tolerances:
- float32 (IEEE products): outputs 2e-5 and gradients 5e-5, as max error over max(max |ref|, 1).
  The pseudo-values pass through a chain of T/64 triangular solves, each folding sums of up to T
  float32 terms (a few ulps, 6e-8, each); the measured errors are ~1e-6, and a TF32 product
  (1e-3), a wrong mask or a stale pseudo-value fails by orders of magnitude.
- 16-bit: fla's RMS error ratio, ``o`` <= 5e-3 and gradients <= 1e-2 as for the flash kernel
  (probabilities and the upstream gradients of the two softmaxes are rounded to the input dtype
  before their products); ``dbeta`` <= 2e-2 (a sum over the head size of products of two rounded
  vectors).
"""

import numpy as np
import pytest
import torch

import kernels
import lattn_core as lc
from kernels.backend import GPU_CLASSES
from kernels.deltaformer.plan import CHUNK, INTERPRETER_PLAN, DeltaFormerPlan, plan_for
from kernels.harness import err_ratio
from kernels.reference import deltaformer_ref

DEVICES = (["cpu"] if kernels.INTERPRET else []) + (["cuda"] if torch.cuda.is_available() else [])
if not DEVICES:  # pragma: no cover - a CUDA machine with TRITON_INTERPRET unset always has "cuda"
    DEVICES = ["cpu"]

RMS_TOL = {"o": 5e-3, "dq": 1e-2, "dk": 1e-2, "dv": 1e-2, "dbeta": 2e-2}


def make_inputs(B, T, H, K, V, dtype, device, *, beta=True, beta_dtype=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=g).to(dtype).to(device) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=g).to(dtype).to(device)
    b = torch.rand(B, T, H, generator=g).to(beta_dtype or dtype).to(device) if beta else None
    return q, k, v, b


def lattn_reference(q, k, v, beta, scale):
    """float64 outputs per (b, h) from lattn_core's DeltaFormer (the chapter's matrix form)."""
    qn, kn, vn = (x.detach().to("cpu", torch.float64).numpy() for x in (q, k, v))
    bn = None if beta is None else beta.detach().to("cpu", torch.float64).numpy()
    B, T, H, _ = qn.shape
    out = np.empty(vn.shape)
    root = scale ** 0.5
    for b in range(B):
        for h in range(H):
            out[:, :, h][b] = lc.deltaformer(root * qn[b, :, h], root * kn[b, :, h], vn[b, :, h], normalize=True,
                                             beta=None if bn is None else bn[b, :, h])
    return out


def grads(fn, q, k, v, beta, do):
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    b = None if beta is None else beta.detach().clone().requires_grad_(True)
    o = fn(*leaves, b)
    gs = torch.autograd.grad(o, leaves + ([] if b is None else [b]), do)
    names = ["dq", "dk", "dv"] + ([] if b is None else ["dbeta"])
    return {"o": o, **dict(zip(names, gs))}


def check_against_float64(q, k, v, beta, label, seed=1):
    scale = q.shape[-1] ** -0.5
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(v.shape, generator=gen).to(v.dtype).to(v.device)
    ours = grads(lambda a, b_, c, d: kernels.deltaformer_attn(a, b_, c, d, backend="triton"), q, k, v, beta, do)
    d64 = lambda x: None if x is None else x.detach().to("cpu", torch.float64)   # noqa: E731
    ref = grads(lambda a, b_, c, d: deltaformer_ref(a, b_, c, d, scale), d64(q), d64(k), d64(v), d64(beta),
                d64(do))
    # the differentiable reference is lattn_core's matrix form (float64 round-off: 1e-10)
    lc.check_close(f"{label}: reference = lattn_core", ref["o"].detach().numpy(),
                   lattn_reference(q, k, v, beta, scale), 1e-10)
    exact = v.dtype == torch.float32
    for name, a in ours.items():
        a64, r = a.detach().to("cpu", torch.float64), ref[name].detach()
        if exact:
            err = (a64 - r).abs().max().item() / max(r.abs().max().item(), 1.0)
            tol = 2e-5 if name == "o" else 5e-5
        else:
            err, tol = err_ratio(a64, r), RMS_TOL[name]
        print(f"{'✓' if err <= tol else '✗'} {label} {name}: {err:.2e} (tol {tol:g})")
        assert err <= tol, f"{label} {name}: {err:.3e} > {tol:g}"
    return ours


# T = 1 (a lone token: u = v, o = v), below one chunk, not a multiple of the chunk, and (on the
# interpreter, whose spans are two chunks) several spans so that the parallel fold runs too.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T,K,V,with_beta", [(1, 16, 16, True), (40, 16, 32, False), (67, 32, 16, True),
                                             (300, 16, 16, True)])
def test_float32_against_float64(device, T, K, V, with_beta):
    q, k, v, beta = make_inputs(1 if T != 67 else 2, T, 2, K, V, torch.float32, device, beta=with_beta, seed=T)
    ours = check_against_float64(q, k, v, beta, f"deltaformer T={T} K={K} V={V} beta={with_beta}")
    if T == 1:   # u_1 = v_1 and a lone query attends to itself
        torch.testing.assert_close(ours["o"], v, atol=0, rtol=0)


def _skip_where_pytorch_runs(device):
    """Tests of the kernels' own structure do not apply where the class takes the PyTorch path
    (--gpu-class 75: a T4 runs DeltaFormer in PyTorch, plan.py)."""
    from kernels.deltaformer.plan import plan_for
    if plan_for(torch.float32, torch.device(device), B=1, T=64, H=1).path == "torch":
        pytest.skip("this GPU class runs DeltaFormer on the PyTorch path")


@pytest.mark.parametrize("device", DEVICES)
def test_beta_zero_is_softmax_attention(device):
    """β = 0 switches the delta rule off: u = v, and the op is causal softmax attention."""
    _skip_where_pytorch_runs(device)
    q, k, v, _ = make_inputs(1, 90, 2, 16, 16, torch.float32, device, beta=False, seed=3)
    beta = torch.zeros(1, 90, 2, device=device)
    o = kernels.deltaformer_attn(q, k, v, beta, backend="triton")
    # both run the same flash kernel on the same values, so they agree to the last bit
    torch.testing.assert_close(o, kernels.flash_attention(q, k, v, backend="triton"), atol=0, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_float32_beta_with_half_inputs(device):
    """fla's layers pass β in float32 next to 16-bit q, k, v: accepted, gradient in float32."""
    if device == "cpu":
        dtype = torch.float16         # the interpreter computes 16-bit floats in NumPy's float16
    else:
        dtype = torch.bfloat16
    q, k, v, beta = make_inputs(1, 70, 2, 32, 32, dtype, device, beta_dtype=torch.float32, seed=5)
    ours = check_against_float64(q, k, v, beta, f"deltaformer {dtype}, beta float32")
    assert ours["dbeta"].dtype == torch.float32 and ours["o"].dtype == dtype


@pytest.mark.parametrize("device", DEVICES)
def test_bfloat16_shared_query_key_gradient(device):
    """fla's check with q = k (where its q·k pseudo-value scores and ours, k·k, coincide): bfloat16,
    the gradient of the shared tensor (dq + dk) within fla's gradient tolerance (RMS error ratio
    0.008) of float64. The last attention's backward forms dS = P ⊙ (dP − Σ o·do); with a bfloat16
    o in that row sum the error ratio was 0.0127 here (0.0146 at fla's B = 2, T = 500 on the H200);
    the float32 o the op now keeps for its backward gives 0.0035."""
    gen = torch.Generator().manual_seed(42)
    x = torch.randn(2, 300, 2, 64, generator=gen).to(torch.bfloat16)
    v = torch.randn(2, 300, 2, 64, generator=gen).to(torch.bfloat16)
    beta = torch.randn(2, 300, 2, generator=gen).sigmoid().to(torch.bfloat16)
    do = torch.randn(2, 300, 2, 64, generator=gen).to(torch.bfloat16)
    out = {}
    for name, fn, dt in (("ours", lambda a, b, c: kernels.deltaformer_attn(a, a, b, c, backend="triton"), None),
                         ("f64", lambda a, b, c: deltaformer_ref(a, a, b, c, 64 ** -0.5), torch.float64)):
        leaves = [t.detach().clone().to(dt or t.dtype).to(device).requires_grad_(True) for t in (x, v, beta)]
        fn(*leaves).backward(do.to(dt or do.dtype).to(device))
        out[name] = [t.grad for t in leaves]
    for label, a, b in zip(("dq + dk", "dv", "dbeta"), out["ours"], out["f64"]):
        assert err_ratio(a.cpu(), b.cpu()) < 0.008, f"{label}: {err_ratio(a.cpu(), b.cpu()):.4f}"


@pytest.mark.parametrize("device", DEVICES)
def test_memory_is_linear_in_T(device):
    """No T x T tensor: what the autograd graph keeps grows like T (q, k, β, u, r, the two
    log-sum-exps, o), never like T²."""
    _skip_where_pytorch_runs(device)
    T = 200
    q, k, v, beta = make_inputs(1, T, 2, 16, 16, torch.float32, device, seed=7)
    o = kernels.deltaformer_attn(q.requires_grad_(), k, v, beta, backend="triton")
    saved = [t for t in o.grad_fn.saved_tensors if t is not None]
    assert saved and max(t.numel() for t in saved) <= 2 * q.numel(), [t.shape for t in saved]


def test_torch_backend_is_the_reference():
    """The CPU default (backend "torch") is the differentiable reference, equal to lattn_core."""
    q, k, v, beta = make_inputs(2, 37, 3, 8, 12, torch.float32, "cpu", seed=11)
    q, k, v, beta = (x.double() for x in (q, k, v, beta))
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        kernels.deltaformer_attn(q, k, v, beta)
    o = deltaformer_ref(q, k, v, beta, 8 ** -0.5)
    # float64 on both sides: round-off of a 37-token triangular solve
    lc.check_close("reference vs lattn_core", o.numpy(), lattn_reference(q, k, v, beta, 8 ** -0.5), 1e-12)
    o32 = kernels.deltaformer_attn(q.float(), k.float(), v.float(), beta.float())
    lc.check_close("torch backend (float32)", o32.double().numpy(), o.numpy(), 1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs_raise(device):
    q, k, v, beta = make_inputs(1, 8, 2, 32, 32, torch.float32, device)
    with pytest.raises(ValueError, match=r"beta must have shape \[1, 8, 2\]"):
        kernels.deltaformer_attn(q, k, v, beta[:, :7])
    with pytest.raises(ValueError, match="beta must be a torch.Tensor"):
        kernels.deltaformer_attn(q, k, v, 0.5)
    with pytest.raises(ValueError, match="k must have the shape of q"):
        kernels.deltaformer_attn(q, k[:, :7], v)
    with pytest.raises(ValueError, match="scale must be a positive"):
        kernels.deltaformer_attn(q, k, v, scale=-1.0)
    x = torch.randn(1, 8, 2, 260, device=device)    # over 256; any size up to it runs (tests/kernels/test_common.py)
    with pytest.raises(ValueError, match="head size K .* between 1 and 256"):
        kernels.deltaformer_attn(x, x, x, backend="triton")


def test_plan_spans():
    """The span: the chunk count that keeps the parallel fold at two programs per SM (132 SMs
    here), down to a power of two and within [256, 1024] tokens, never past the sequence."""
    cuda, bf = torch.device("cuda"), torch.bfloat16      # (the dtype does not change the plan)
    HOPPER = dict(interpret=False, sms=132, caps=GPU_CLASSES[90])
    assert plan_for(bf, cuda, B=32, T=2048, H=16, **HOPPER).span == 256      # 64 -> 256
    assert plan_for(bf, cuda, B=8, T=8192, H=16, **HOPPER).span == 256       # 192 -> 128 -> 256
    assert plan_for(bf, cuda, B=1, T=32768, H=16, **HOPPER).span == 1024     # 1088 -> 1024
    assert plan_for(bf, cuda, B=1, T=32768, H=4, **HOPPER).span == 1024      # capped
    assert plan_for(bf, cuda, B=1, T=100, H=1, **HOPPER).span == 128         # never past the sequence
    for B, T, H in ((3, 5000, 7), (1, 70000, 1), (64, 512, 32)):
        span = plan_for(bf, cuda, B=B, T=T, H=H, **HOPPER).span
        assert span % CHUNK == 0 and (span & (span - 1) == 0 or span >= T)
    assert plan_for(bf, cuda, B=1, T=32768, H=16, **HOPPER).chunk_split == 4     # few (b, h) pairs
    assert plan_for(bf, cuda, B=32, T=2048, H=16, **HOPPER).chunk_split == 1
    assert plan_for(bf, cuda, B=1, T=300, H=2, interpret=False, sms=58, caps=GPU_CLASSES[89]).later.m == 64   # L4's 99 KiB
    assert plan_for(bf, cuda, B=1, T=300, H=2, interpret=False, sms=40, caps=GPU_CLASSES[75]).path == "torch"
    assert plan_for(bf, torch.device("cpu"), B=1, T=300, H=2, interpret=True) == DeltaFormerPlan(span=2 * CHUNK, **INTERPRETER_PLAN)


GPU_SHAPES = [(2, 1000, 4, 128, 128, torch.bfloat16, torch.float32), (1, 4097, 3, 128, 64, torch.float16, None),
              (8, 2048, 4, 64, 64, torch.bfloat16, torch.bfloat16), (1, 777, 2, 64, 128, torch.float32, torch.float32),
              (1, 8192, 2, 128, 128, torch.bfloat16, torch.float32)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled Triton needs a CUDA device")
@pytest.mark.parametrize("B,T,H,K,V,dtype,beta_dtype", GPU_SHAPES)
def test_gpu_large_shapes(B, T, H, K, V, dtype, beta_dtype):
    """The production plans (spans from :func:`plan_for`, the flash family's tilings) on the GPU."""
    q, k, v, beta = make_inputs(B, T, H, K, V, dtype, "cuda", beta=beta_dtype is not None, beta_dtype=beta_dtype,
                                seed=T)
    check_against_float64(q, k, v, beta, f"deltaformer GPU {(B, T, H, K, V)} {dtype} beta {beta_dtype}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled Triton needs a CUDA device")
def test_gpu_memory_is_linear_in_T():
    """Peak memory of a training step doubles, not quadruples, when T doubles."""
    peaks = []
    for T in (8192, 16384):
        q, k, v, beta = make_inputs(1, T, 4, 128, 128, torch.bfloat16, "cuda", seed=1)
        leaves = [x.requires_grad_() for x in (q, k, v, beta)]
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        kernels.deltaformer_attn(*leaves).sum().backward()
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
    assert peaks[1] < 2.5 * peaks[0], peaks
