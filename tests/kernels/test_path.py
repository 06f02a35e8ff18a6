"""The PaTH attention kernel (``kernels.parallel_path_attn``) against float64 references.

On a machine without a GPU the kernels run through Triton's interpreter (CPU tensors, with short
sequences that still cross the 64-token blocks: one block, a ragged tail, several blocks, B > 1);
with CUDA the same tests also run compiled, plus fla's shapes and tolerances and the memory check.

References: per batch and head, ``lattn_core.path_attention(scale·Q, K, V, W, beta, gamma=exp(scale·g))``
in float64 (the article's closed form with a library inverse); gradients from the differentiable
``kernels.reference.path_attn_ref`` in float64, itself checked against ``lattn_core`` here. Inputs
are cast to float64 *after* rounding to the tested dtype (``w``, ``beta`` and ``g`` included), so
the tolerances measure the kernels' arithmetic, not the input rounding. ``w`` is unit-norm (fla's
layers normalise it; the op uses it as given) unless a test says otherwise.

Tolerances:
- float32 (IEEE products; the carried queries, ``K̂``, ``U`` and ``W`` kept in float32, the
  "transport" dtype of float32 inputs): outputs 2e-5 and gradients 5e-5, as max error over
  max(max |ref|, 1). Each score is a chain of T/64 block crossings and a 64×64 triangular solve,
  each a few float32 ulps (6e-8) per sum of ≤ 64 or K terms; the measured errors are ~1e-6 at
  T ≤ 150 (≥ 10x headroom), while a TF32 product (1e-3), a float16 transport (5e-4), a wrong mask
  or a stale carried query fails by orders of magnitude.
- q, k ×30: logits reach ~4e3, where one float32 rounding is ~2.4e-4 absolute, i.e. a relative
  change of the probabilities of that size per rounding: 2e-3 (measured 6e-5).
- 16-bit: fla's own test tolerances for PaTH, as fla's RMS error ratio (``err_ratio``): ``o``
  5e-3, ``dq, dk, dv`` 8e-3, ``dw`` 1.5e-2, ``dbeta`` and ``dg`` 2e-2 (16-bit inputs, the carried
  queries in float16; measured ~3e-4 through the interpreter in float16).
"""

import numpy as np
import pytest
import torch

import kernels
import lattn_core as lc
from kernels.backend import GPU_CLASSES
from kernels.harness import err_ratio
from kernels.path.op import HEAD_SIZES, parallel_path_attn_triton
from kernels.path.plan import CHUNK, plan_for
from kernels.reference import attention_ref, path_attn_ref, path_rows_ref

DEVICES = (["cpu"] if kernels.INTERPRET else []) + (["cuda"] if torch.cuda.is_available() else [])
if not DEVICES:  # pragma: no cover - a CUDA machine with TRITON_INTERPRET unset always has "cuda"
    DEVICES = ["cpu"]

RMS_TOL = {"o": 5e-3, "dq": 8e-3, "dk": 8e-3, "dv": 8e-3, "dw": 1.5e-2, "dbeta": 2e-2, "dg": 2e-2}
NAMES = ("q", "k", "v", "w", "beta", "g")


def make_inputs(B, T, H, K, V, dtype, device, *, gates=False, w_dtype=None, seed=0):
    """``q, k, v`` in ``dtype``; unit ``w``, ``beta`` uniform in [0, 2] and (with ``gates``) log
    forget gates ``g = logsigmoid(N(0, 1))`` in ``w_dtype`` (default ``dtype``)."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=gen).to(dtype).to(device) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=gen).to(dtype).to(device)
    wd = w_dtype or dtype
    w = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1).to(wd).to(device)
    beta = (2 * torch.rand(B, T, H, generator=gen)).to(wd).to(device)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen)).to(wd).to(device) if gates else None
    return q, k, v, w, beta, g


def lattn_reference(q, k, v, w, beta, g, scale):
    """float64 outputs per (b, h) from lattn_core's PaTH (the chapter's closed form), ``scale``
    folded into Q and the gates as ``gamma = exp(scale·g)`` (fla's convention: the bias
    ``G_i − G_j`` inside the scale)."""
    qn, kn, vn, wn, bn = (x.detach().to("cpu", torch.float64).numpy() for x in (q, k, v, w, beta))
    gn = None if g is None else np.exp(scale * g.detach().to("cpu", torch.float64).numpy())
    B, T, H, _ = qn.shape
    out = np.empty(vn.shape)
    for b in range(B):
        for h in range(H):
            out[b, :, h] = lc.path_attention(scale * qn[b, :, h], kn[b, :, h], vn[b, :, h], wn[b, :, h],
                                             bn[b, :, h], gamma=None if gn is None else gn[b, :, h])
    return out


def grads(fn, inputs, do):
    """``{"o", "dq", ..., "dbeta"[, "dg"]}`` of ``fn(q, k, v, w, beta, g)`` for the upstream ``do``."""
    leaves = [None if x is None else x.detach().clone().requires_grad_(True) for x in inputs]
    o = fn(*leaves)
    present = [(f"d{n}", x) for n, x in zip(NAMES, leaves) if x is not None]
    gs = torch.autograd.grad(o, [x for _, x in present], do)
    return {"o": o, **{n: d for (n, _), d in zip(present, gs)}}


def check_against_float64(inputs, label, *, seed=1, tol=None, lattn=True):
    """Outputs and gradients of the Triton path against float64; ``tol`` overrides the float32
    tolerances (``(outputs, gradients)``); ``lattn``: also check the float64 reference against
    lattn_core (skipped where NumPy's T × T inverse per head would be slow)."""
    q, v = inputs[0], inputs[2]
    scale = q.shape[-1] ** -0.5
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(v.shape, generator=gen).to(v.dtype).to(v.device)
    ours = grads(lambda *a: kernels.parallel_path_attn(*a, backend="triton")[0], inputs, do)
    d64 = lambda x: None if x is None else x.detach().to("cpu", torch.float64)   # noqa: E731
    ref = grads(lambda *a: path_attn_ref(*a, scale=scale), [d64(x) for x in inputs], d64(do))
    if lattn:   # the differentiable reference is lattn_core's closed form (float64 round-off)
        lc.check_close(f"{label}: reference = lattn_core", ref["o"].detach().numpy(),
                       lattn_reference(*inputs, scale), 1e-10, relative=True)
    exact = v.dtype == torch.float32
    for (name, a), x in zip(ours.items(), [v] + [x for x in inputs if x is not None]):
        assert a.dtype == x.dtype and a.shape == x.shape, f"{label} {name}: {a.dtype} {tuple(a.shape)}"
        a64, r = a.detach().to("cpu", torch.float64), ref[name].detach()
        assert torch.isfinite(a64).all(), f"{label} {name}: not finite"
        if exact:
            err = (a64 - r).abs().max().item() / max(r.abs().max().item(), 1.0)
            tol_o, tol_g = tol or (2e-5, 5e-5)
            t = tol_o if name == "o" else tol_g
        else:
            err, t = err_ratio(a64, r), RMS_TOL[name]
        print(f"{'✓' if err <= t else '✗'} {label} {name}: {err:.2e} (tol {t:g})")
        assert err <= t, f"{label} {name}: {err:.3e} > {t:g}"
    return ours, ref


# T = 1 (a lone token: o = v), one whole block, a ragged tail (150 = 2·64 + 22), B = 2 across two
# blocks; K = 16, 32 (and 128, whose local backward runs two column blocks); V ≠ K both ways.
FLOAT32_CASES = [
    pytest.param(1, 1, 2, 16, 16, False, id="T1"),
    pytest.param(1, 1, 2, 32, 16, True, id="T1-g-V<K"),
    pytest.param(1, 64, 2, 16, 16, True, id="T64-K16-g"),
    pytest.param(1, 64, 2, 32, 32, False, id="T64-K32"),
    pytest.param(1, 150, 2, 16, 16, False, id="T150-K16"),
    pytest.param(1, 150, 2, 32, 32, True, id="T150-K32-g"),
    pytest.param(2, 130, 2, 16, 32, True, id="B2-T130-K16-V32-g"),
    pytest.param(2, 130, 2, 16, 32, False, id="B2-T130-K16-V32"),
    pytest.param(2, 130, 2, 32, 16, True, id="B2-T130-K32-V16-g"),
    pytest.param(2, 130, 2, 32, 16, False, id="B2-T130-K32-V16"),
    pytest.param(1, 70, 1, 128, 64, True, id="T70-K128-V64-g"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B,T,H,K,V,with_g", FLOAT32_CASES)
def test_float32_against_float64(device, B, T, H, K, V, with_g):
    inputs = make_inputs(B, T, H, K, V, torch.float32, device, gates=with_g, seed=T + K + V)
    ours, _ = check_against_float64(inputs, f"path B={B} T={T} K={K} V={V} g={with_g}")
    if T == 1:   # a lone query attends to itself with no factor in between: o = v, and only v learns
        torch.testing.assert_close(ours["o"], inputs[2], atol=0, rtol=0)
        for name in ("dw", "dbeta") + (("dg",) if with_g else ()):
            assert not ours[name].any(), name
        # dq, dk are scale·(do·v − do·o) times k or q, with o = v: zero up to the two dot products'
        # summation orders (the kernel's tl.dot and PyTorch's sum over V terms, a few ulps each)
        for name in ("dq", "dk"):
            assert ours[name].abs().max() <= 1e-6, name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("w_dtype", [torch.float32, None], ids=["w-float32", "w-inputs-dtype"])
@pytest.mark.parametrize("with_g", [False, True], ids=["", "g"])
def test_half_inputs(device, w_dtype, with_g):
    """16-bit q, k, v with w, beta (and g) in float32, as fla's layers pass them, or in the inputs'
    dtype; each gradient comes back in its input's dtype."""
    dtype = torch.float16 if device == "cpu" else torch.bfloat16   # the interpreter computes float16 in NumPy
    K, V = (32, 32) if with_g else (16, 32)
    inputs = make_inputs(1, 150, 2, K, V, dtype, device, gates=with_g, w_dtype=w_dtype, seed=9)
    check_against_float64(inputs, f"path {dtype} w {w_dtype or dtype} g={with_g}")


@pytest.mark.parametrize("device", DEVICES)
def test_strided_inputs(device):
    """Views of [B, H, T, D] tensors (the layers' transposes), gates included: same results."""
    inputs = make_inputs(2, 90, 3, 16, 16, torch.float32, device, gates=True, seed=4)
    strided = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in inputs]
    assert not any(x.is_contiguous() for x in strided)
    check_against_float64(strided, "path strided")


# fla's reported PaTH NaN cases, as regressions: outputs and gradients finite and right.

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_g", [False, True], ids=["", "g"])
def test_beta_zero_is_softmax_attention(device, with_g):
    """β = 0: every factor is I, PaTH is (FoX) causal softmax attention, and w gets no gradient."""
    q, k, v, w, _, g = make_inputs(1, 130, 2, 16, 16, torch.float32, device, gates=with_g, seed=3)
    beta = torch.zeros(1, 130, 2, device=device)
    ours, _ = check_against_float64([q, k, v, w, beta, g], f"path beta=0 g={with_g}")
    d64 = lambda x: None if x is None else x.detach().to("cpu", torch.float64)   # noqa: E731
    gen = torch.Generator().manual_seed(1)      # the same upstream gradient as check_against_float64
    do = torch.randn(v.shape, generator=gen).double()
    # FoX attention with fla's PaTH convention: the gate bias inside the scale
    att = grads(lambda q_, k_, v_, w_, b_, g_: attention_ref(q_, k_, v_, 16 ** -0.5,
                                                             g=None if g_ is None else g_ * 16 ** -0.5),
                [d64(x) for x in (q, k, v, None, None, g)], do)
    # float32 against float64 softmax attention: the flash kernel's float32 tolerance (1e-5), relative
    # to the largest value (dg is a reversed cumulative sum over T terms of up to ~6)
    for name in ("o", "dq", "dk", "dv") + (("dg",) if with_g else ()):
        lc.check_close(f"beta=0 {name} = softmax attention", ours[name].detach().to("cpu", torch.float64).numpy(),
                       att[name].detach().numpy(), 1e-5, relative=True)
    assert not ours["dw"].any()      # every term of dw carries a factor β


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_g", [False, True], ids=["", "g"])
@pytest.mark.parametrize("repeated", [False, True], ids=["random-w", "one-w"])
def test_reflections(device, with_g, repeated):
    """β = 2 and unit w: every factor a reflection (orthogonal); ``one-w``: the same direction at
    every token, so consecutive factors cancel and the UT inverse is ±2 everywhere below.

    ``one-w`` is ill-conditioned: ``I + Diag(β)(W Wᵀ ⊙ M⁻)`` on a block of 64 has condition number
    ~6.6e3, so float32 round-off (6e-8) may grow to ~4e-4 in the block's scores; a float32 PyTorch
    solve gets 4e-5 there and the kernel 9e-5 (its inverse T is exactly as accurate as PyTorch's
    float32 inverse; the rest is summation order). Without gates, whose decay hides the far scores,
    the measured errors reach 1.6e-5 (o) and 1.5e-4 (dβ): tolerances 1e-4 and 1e-3."""
    q, k, v, w, _, g = make_inputs(1, 150, 2, 16, 16, torch.float32, device, gates=with_g, seed=5)
    if repeated:
        w = w[:, :1].expand_as(w).contiguous()
    beta = torch.full((1, 150, 2), 2.0, device=device)
    check_against_float64([q, k, v, w, beta, g], f"path reflections g={with_g} repeated={repeated}",
                          tol=(1e-4, 1e-3) if repeated else None)


@pytest.mark.parametrize("device", DEVICES)
def test_zero_rows_of_w(device):
    """Rows of w exactly zero (every fifth token, and the whole second block): identity factors
    whatever β (here some β = 2, some 0); and w = 0 everywhere: softmax attention, dβ = 0."""
    q, k, v, w, beta, g = make_inputs(1, 150, 2, 16, 16, torch.float32, device, gates=True, seed=6)
    w[:, ::5] = 0
    w[:, 64:128] = 0
    beta[:, 1::7] = 2.0
    beta[:, 3::11] = 0.0
    check_against_float64([q, k, v, w, beta, g], "path zero rows of w")
    ours, _ = check_against_float64([q, k, v, torch.zeros_like(w), beta, None], "path w = 0")
    assert not ours["dbeta"].any()
    o = ours["o"].detach().to("cpu", torch.float64)
    ref = attention_ref(*(x.detach().to("cpu", torch.float64) for x in (q, k, v)), 16 ** -0.5)
    lc.check_close("w = 0 is softmax attention", o.numpy(), ref.numpy(), 1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_g", [False, True], ids=["", "g"])
def test_large_qk(device, with_g):
    """q, k ×30: logits of thousands, a near one-hot softmax; finite, and within float32 of the
    float64 reference at those logits (tolerance in the module docstring)."""
    q, k, v, w, beta, g = make_inputs(1, 130, 2, 16, 16, torch.float32, device, gates=with_g, seed=7)
    check_against_float64([30 * q, 30 * k, v, w, beta, g], f"path q,k x30 g={with_g}", tol=(2e-3, 2e-3))


@pytest.mark.parametrize("device", DEVICES)
def test_memory_is_linear_in_T(device):
    """No T x T tensor: what the autograd graph keeps (inputs, the prepared q̃, k̂, U, W, the blocks'
    64 x 64 scores and inverses, o and the log-sum-exps) doubles when T doubles."""
    from kernels.path.plan import plan_for
    if plan_for(torch.float32, torch.device(device), K=16).path == "torch":
        pytest.skip("this GPU class (an L4 or a T4) runs float32 PaTH on the PyTorch path, T x T by design")
    kept = []
    for T in (128, 256):
        q, k, v, w, beta, g = make_inputs(1, T, 2, 16, 32, torch.float32, device, gates=True, seed=8)
        o, extra = kernels.parallel_path_attn(q.requires_grad_(), k, v, w, beta, g, backend="triton")
        assert extra is None
        saved = [t for t in o.grad_fn.saved_tensors if t is not None]
        assert max(t.numel() for t in saved) <= 2 * T * max(16, 32, CHUNK), [t.shape for t in saved]
        kept.append(sum(t.numel() for t in saved))
    assert kept[1] == 2 * kept[0], kept


def test_torch_backend_is_the_reference():
    """The CPU default (backend "torch") is the differentiable reference, equal to lattn_core."""
    q, k, v, w, beta, g = make_inputs(2, 37, 3, 8, 12, torch.float32, "cpu", gates=True, seed=11)
    x64 = [x.double() for x in (q, k, v, w, beta, g)]
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        kernels.parallel_path_attn(*x64)
    for gate in (None, g):
        ref = lattn_reference(q, k, v, w, beta, gate, 8 ** -0.5)
        # float64 on both sides: round-off of a 37-token triangular solve
        o64 = path_attn_ref(*x64[:5], None if gate is None else x64[5], 8 ** -0.5)
        lc.check_close("reference vs lattn_core", o64.numpy(), ref, 1e-12)
        # float32: a 37-token solve and softmax in float32 (~1e-6)
        o32, extra = kernels.parallel_path_attn(q, k, v, w, beta, gate)     # K = 8: the torch path takes any
        assert extra is None and o32.dtype == torch.float32
        lc.check_close(f"torch backend (float32) g={gate is not None}", o32.double().numpy(), ref, 1e-5)
        o32s, _ = kernels.parallel_path_attn(q, k, v, w, beta, gate, scale=0.5, backend="torch")
        lc.check_close("torch backend, scale 0.5", o32s.double().numpy(),
                       lattn_reference(q, k, v, w, beta, gate, 0.5), 1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs_raise(device):
    q, k, v, w, beta, g = make_inputs(1, 8, 2, 32, 32, torch.float32, device, gates=True)
    path = kernels.parallel_path_attn
    with pytest.raises(ValueError, match=r"w must have shape \[1, 8, 2, 32\]"):
        path(q, k, v, w[..., :16], beta)
    with pytest.raises(ValueError, match=r"w must have shape"):
        path(q, k, v, w[:, :7], beta)
    with pytest.raises(ValueError, match="w must be a torch.Tensor"):
        path(q, k, v, None, beta)
    with pytest.raises(ValueError, match=r"beta must have shape \[1, 8, 2\]"):
        path(q, k, v, w, beta[:, :7])
    with pytest.raises(ValueError, match=r"beta must have shape \[1, 8, 2\]"):
        path(q, k, v, w, beta[..., None])
    with pytest.raises(ValueError, match="beta must be a torch.Tensor"):
        path(q, k, v, w, 0.5)
    with pytest.raises(ValueError, match=r"g must have shape \[1, 8, 2\]"):
        path(q, k, v, w, beta, g[:, :, :1])
    with pytest.raises(ValueError, match="k must have the shape of q"):
        path(q, k[:, :7], v, w, beta)
    with pytest.raises(ValueError, match="v must have shape"):
        path(q, k, v[:, :7], w, beta)
    with pytest.raises(ValueError, match="scale must be a positive"):
        path(q, k, v, w, beta, scale=-1.0)
    # dtypes and devices, as kernels.validate checks them
    with pytest.raises(ValueError, match="q, k and v must share one dtype"):
        path(q, k.half(), v, w, beta)
    with pytest.raises(ValueError, match="w must be float32, float16 or bfloat16"):
        path(q, k, v, w.double(), beta)
    with pytest.raises(ValueError, match="beta must be float32, float16 or bfloat16"):
        path(q, k, v, w, beta.double())
    with pytest.raises(ValueError, match="g must be float32, float16 or bfloat16"):
        path(q, k, v, w, beta, g.double())
    with pytest.raises(ValueError, match="q, k and v must be on one device"):
        path(q, k.to("meta"), v, w, beta)
    for name, i in (("w", 3), ("beta", 4), ("g", 5)):
        args = [q, k, v, w, beta, g]
        args[i] = args[i].to("meta")
        with pytest.raises(ValueError, match=f"{name} must be on {q.device} like q"):
            path(*args)
    # head sizes over 256 (fla's largest), before anything compiles; every size up to 256 runs
    # (zero padding or the PyTorch path on the device: tests/kernels/test_common.py)
    for K, V, which in ((300, 32, "head size K .* between 1 and 256"), (32, 260, "head size V .* between 1 and 256")):
        a, b, c, d, e, _ = make_inputs(1, 8, 2, K, V, torch.float32, device)
        with pytest.raises(ValueError, match=which):
            path(a, b, c, d, e, backend="triton")
    # the value checks run on every device (one host sync per call: tests/kernels/test_validate.py)
    for bad in (2.5, -0.1):
        with pytest.raises(ValueError, match=r"beta must lie in \[0, 2\]"):
            path(q, k, v, w, beta.clone().fill_(bad))
    with pytest.raises(ValueError, match="g holds log decays and must be <= 0"):
        path(q, k, v, w, beta, g.abs() + 0.1)
    for name, i in (("w", 3), ("beta", 4), ("g", 5)):
        args = [q, k, v, w, beta, g]
        args[i] = args[i].clone()
        args[i].view(-1)[3] = float("nan")
        with pytest.raises(ValueError, match=f"{name} contains NaN or inf"):
            path(*args)


def test_plan():
    """Transport dtypes (float16 carries the queries of 16-bit inputs, float32 of float32 ones);
    the per-block stage's precision at K = 16; classes below sm_80 run PyTorch on the device and refuse bfloat16 before compiling."""
    cuda = torch.device("cuda")
    for dtype, transport in ((torch.float32, torch.float32), (torch.float16, torch.float16),
                             (torch.bfloat16, torch.float16)):
        for caps in (GPU_CLASSES[80], GPU_CLASSES[90]):
            plan = plan_for(dtype, cuda, interpret=False, caps=caps, K=64)
            assert plan.transport == transport and plan.path == "triton"
        assert plan_for(dtype, torch.device("cpu"), interpret=True).transport == transport
    assert plan_for(torch.float32, cuda, interpret=False, caps=GPU_CLASSES[90]).precision == "ieee"
    # 16-bit inputs take TF32 in the per-block stage and 128 query rows, except at K = 16, where
    # that failed on the H200 (NaN gradients, or an illegal memory access: plan.py)
    plans = [plan_for(torch.bfloat16, cuda, interpret=False, caps=GPU_CLASSES[90], K=K) for K in (16, 32, 128)]
    assert [(p.local_precision, p.rows) for p in plans] == [("ieee", 64), ("tf32", 128), ("tf32", 128)]
    assert plan_for(torch.float32, cuda, interpret=False, caps=GPU_CLASSES[90], K=16).rows == 128
    # float32 at K = 128 on an A100: its tiles do not fit 163 KiB (plan.py), so PyTorch; K = 64 fits
    a100 = [plan_for(torch.float32, cuda, interpret=False, caps=GPU_CLASSES[80], K=K) for K in (64, 128)]
    assert [(p.path, p.local_kb) for p in a100] == [("triton", 32), ("torch", None)]
    assert plan_for(torch.bfloat16, cuda, interpret=False, caps=GPU_CLASSES[80], K=128).path == "triton"
    # the per-block backward on 4 warps for 16-bit inputs on Hopper (measured, plan.py); 8 elsewhere
    assert [plan_for(dt, cuda, interpret=False, caps=GPU_CLASSES[c]).local_bwd[0].num_warps
            for dt, c in ((torch.bfloat16, 90), (torch.float32, 90), (torch.bfloat16, 80))] == [4, 8, 8]
    assert plan_for(torch.float16, cuda, interpret=False, caps=GPU_CLASSES[75]).path == "torch"
    assert plan_for(torch.float16, torch.device("cpu"), interpret=True).precision == "ieee"
    # windows (windows.py) by default only on Hopper with 16-bit inputs, from T: none up to 32 blocks,
    # then the largest power of two not above sqrt(T / 64) (plan.default_window_blocks, measured)
    hop = lambda dt, T, c=90: plan_for(dt, cuda, interpret=False, caps=GPU_CLASSES[c], K=128, T=T).window_blocks  # noqa: E731
    assert [hop(torch.bfloat16, T) for T in (None, 1000, 2048, 2049, 4096, 8192, 32768)] == [0, 0, 0, 4, 8, 8, 16]
    assert [hop(torch.float32, 8192), hop(torch.bfloat16, 8192, 80), hop(torch.float16, 8192, 89)] == [0, 0, 0]
    assert plan_for(torch.bfloat16, cuda, interpret=False, caps=GPU_CLASSES[90], K=128, T=8192,
                    window_blocks=0).window_blocks == 0
    assert HEAD_SIZES == (16, 32, 64, 128)
    q, k, v, w, beta, _ = make_inputs(1, 8, 2, 16, 16, torch.bfloat16, "cpu")
    with pytest.raises(ValueError, match="q is bfloat16, which needs compute capability 8.0"):
        parallel_path_attn_triton(q, k, v, w, beta, None, 0.25, caps=GPU_CLASSES[75])


# fla's test shapes and tolerances (bfloat16, w and beta in float32, T = 1000, K = V = 128), V ≠ K
# both ways, float16 inputs (w in float16 too: the transport dtype), float32 (IEEE products).
GPU_SHAPES = [(1, 1000, 2, 128, 128, torch.bfloat16, torch.float32, False),
              (1, 1000, 2, 128, 128, torch.bfloat16, torch.float32, True),
              (1, 1000, 2, 64, 128, torch.bfloat16, torch.float32, True),
              (1, 1000, 2, 128, 64, torch.bfloat16, torch.float32, False),
              (1, 1000, 2, 128, 128, torch.float16, torch.float32, True),
              (2, 777, 3, 64, 64, torch.float16, torch.float16, True),
              (1, 4096, 2, 128, 128, torch.bfloat16, torch.float32, True),
              (1, 2650, 2, 128, 64, torch.bfloat16, torch.float32, False),   # windows of 4, the last partial
              (1, 513, 2, 32, 16, torch.float32, torch.float32, True)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled Triton needs a CUDA device")
@pytest.mark.parametrize("B,T,H,K,V,dtype,w_dtype,with_g", GPU_SHAPES)
def test_gpu_large_shapes(B, T, H, K, V, dtype, w_dtype, with_g):
    """The production plans on the GPU against float64, fla's error ratios for 16-bit inputs."""
    inputs = make_inputs(B, T, H, K, V, dtype, "cuda", gates=with_g, w_dtype=w_dtype, seed=T)
    check_against_float64(inputs, f"path GPU {(B, T, H, K, V)} {dtype} w {w_dtype} g={with_g}", lattn=T <= 1000)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled Triton needs a CUDA device")
def test_gpu_memory_is_linear_in_T():
    """Peak memory of a training step doubles, not quadruples, when T doubles (at B·H = 4 the
    backward's persistent programs, and so its scratch, are at their cap of two per SM)."""
    peaks = []
    for T in (8192, 16384):
        inputs = make_inputs(1, T, 4, 128, 128, torch.bfloat16, "cuda", gates=True, w_dtype=torch.float32, seed=1)
        leaves = [x.requires_grad_() for x in inputs]
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        kernels.parallel_path_attn(*leaves)[0].sum().backward()
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
    assert peaks[1] < 2.5 * peaks[0], peaks


def test_rows_reference_is_the_closed_form():
    """kernels.reference.path_rows_ref (a few query rows, the queries carried back token by token,
    O(T d) memory) equals the closed-form reference's rows: the first, both sides of a block edge,
    the last, with and without gates. Float64 both: ~1e-15."""
    gen = torch.Generator().manual_seed(11)
    B, T, H, K, V = 2, 150, 3, 16, 8
    q, k = (torch.randn(B, T, H, K, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64)
    w = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    beta = 2 * torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen, dtype=torch.float64))
    rows = [0, 1, 63, 64, 100, 149]
    for gate in (None, g):
        full = path_attn_ref(q, k, v, w, beta, gate, scale=0.25)
        part = path_rows_ref(q, k, v, w, beta, gate, scale=0.25, rows=rows)
        assert (full[:, rows] - part).abs().max().item() < 1e-12
    for bad in ([], [T], [-1]):
        with pytest.raises(ValueError, match="rows must be indices"):
            path_rows_ref(q, k, v, w, beta, None, 0.25, rows=bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled Triton needs a CUDA device")
@pytest.mark.parametrize("with_g", [False, True], ids=["", "g"])
def test_gpu_far_rows_of_a_long_sequence(with_g):
    """The benchmark measures errors on the first 2,048 tokens only; here the last rows of a
    16,384-token sequence (and one in the middle), whose queries cross every block before them,
    against float64 (path_rows_ref): bf16 inputs, w and beta in float32, without gates (every key
    reached) and with them, K = V = 128. fla's output tolerance, 0.005 RMS relative, over the rows."""
    B, T, H, D = 1, 16384, 2, 128
    inputs = make_inputs(B, T, H, D, D, torch.bfloat16, "cpu", gates=with_g, w_dtype=torch.float32, seed=21)
    q, k, v, w, beta, g = (None if x is None else x.cuda() for x in inputs)
    o = kernels.parallel_path_attn(q, k, v, w, beta, g, backend="triton")[0]
    rows = [T - 1, T - 2, T - 65, T // 2]
    ref = path_rows_ref(q, k, v, w, beta, g, scale=D ** -0.5, rows=rows)
    err = err_ratio(o[:, rows].double().cpu(), ref)
    assert err <= 0.005, err


def _gpu_memory_gb() -> float:
    return torch.cuda.get_device_properties(0).total_memory / 1e9 if torch.cuda.is_available() else 0.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled Triton needs a CUDA device")
@pytest.mark.skipif(_gpu_memory_gb() < 120, reason="tensors past 2^31 elements need over 100 GB of GPU memory")
@pytest.mark.bigmem
def test_gpu_offsets_past_int32():
    """fla's tracker records an int32 overflow in PaTH on long inputs. Here every [B, T, H, D] tensor
    has B·T·H·D = 1040·1024·16·128 > 2^31 elements (bfloat16, w too; inputs, copies, outputs and
    gradients with the backward's float32 buffers come to about 100 GB by estimate: an H200), so an
    element offset computed in int32 would wrap into another sequence's data. The first and the last
    sequence's outputs and gradients must equal the same sequence run alone (B = 1, offsets far below
    2^31): the same kernels on the same values, so they differ only by the order of the backward's
    float32 atomic sums, then one bfloat16 rounding; 5e-3 of the norm allows that, and a wrapped
    offset (another sequence's inputs) is off by O(1)."""
    B, T, H, D = 1040, 1024, 16, 128
    assert B * T * H * D > 2 ** 31
    gen = torch.Generator(device="cuda").manual_seed(0)
    rnd = lambda *shape: torch.randn(*shape, device="cuda", generator=gen)     # noqa: E731
    q, k, v = (rnd(B, T, H, D).to(torch.bfloat16) for _ in range(3))
    w = torch.nn.functional.normalize(rnd(B, T, H, D), dim=-1).to(torch.bfloat16)
    beta = (2 * torch.sigmoid(rnd(B, T, H))).to(torch.bfloat16)
    g = torch.nn.functional.logsigmoid(rnd(B, T, H))
    do = rnd(B, T, H, D).to(torch.bfloat16)
    inputs = (q, k, v, w, beta, g)
    whole = grads(lambda *a: kernels.parallel_path_attn(*a)[0], inputs, do)
    for b in (0, B - 1):
        alone = grads(lambda *a: kernels.parallel_path_attn(*a)[0], [x[b:b + 1] for x in inputs], do[b:b + 1])
        for name, ref in alone.items():
            got = whole[name][b:b + 1].float()
            err = ((got - ref.float()).norm() / ref.float().norm()).item()
            assert err < 5e-3, (b, name, err)


# Query blocks of 128 rows (the plan's ``rows``: two 64-blocks per program, the second block's rows
# meeting the first block's keys through the carried queries): the same function as 64 rows.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T,with_g", [(1, False), (100, True), (128, False), (257, True)])
def test_query_blocks_of_128_rows(device, T, with_g):
    from kernels.path.plan import plan_for
    inputs = make_inputs(1, T, 2, 16, 32, torch.float32, device, gates=with_g, seed=T + 7)
    plan = plan_for(torch.float32, torch.device(device), K=16, rows=128)
    if plan.path == "torch":   # --gpu-class 89 or 75: float32 PaTH runs in PyTorch there (plan.py)
        pytest.skip("this GPU class runs float32 PaTH on the PyTorch path")
    assert plan.rows == 128
    gen = torch.Generator().manual_seed(3)
    do = torch.randn(1, T, 2, 32, generator=gen).to(device)
    _plan_against_float64(inputs, plan, 16 ** -0.5, do, f"rows=128 T={T}")


def _plan_against_float64(inputs, plan, scale, do, label):
    """The op run with ``plan`` (through ``PathFunction``) against the float64 reference: the output and
    every gradient, max error over the reference's largest entry (at least 1)."""
    from kernels.path.op import PathFunction
    ours = grads(lambda q, k, v, w, b, g: PathFunction.apply(q, k, v, w, b, g, scale, plan), inputs, do)
    d64 = lambda x: None if x is None else x.detach().to("cpu", torch.float64)   # noqa: E731
    ref = grads(lambda *a: path_attn_ref(*a, scale=scale), [d64(x) for x in inputs], d64(do))
    for name, a in ours.items():
        r = ref[name].detach()
        err = (a.detach().to("cpu", torch.float64) - r).abs().max().item() / max(r.abs().max().item(), 1.0)
        # float32 with IEEE products, as test_float32_against_float64: ~1e-6, tolerance with margin
        assert err <= (2e-5 if name == "o" else 5e-5), f"{label} {name}: {err:.2e}"


# The per-block backward's column block is clamped to K: the A100 plan's float32 block of 32 columns
# at K = 16 read and wrote the next head's columns (forced on the H200: dq off by 0.7 of its size).
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("H", [1, 3])
def test_column_block_wider_than_the_head(device, H):
    from dataclasses import replace
    from kernels.path.local import local_columns
    from kernels.path.plan import plan_for
    T, K, V = 70, 16, 32
    inputs = make_inputs(1, T, H, K, V, torch.float32, device, gates=True, seed=21)
    plan = replace(plan_for(torch.float32, torch.device(device), K=K), local_kb=32)
    assert local_columns(plan, K) == K and local_columns(plan, 64) == 32
    do = torch.randn(1, T, H, V, generator=torch.Generator().manual_seed(4)).to(device)
    _plan_against_float64(inputs, plan, K ** -0.5, do, f"local_kb=32, K=16, H={H}")


def test_plan_rows_must_be_64_or_128():
    from kernels.path.plan import plan_for
    with pytest.raises(ValueError, match="rows must be 64 or 128"):
        plan_for(torch.float32, torch.device("cpu"), rows=96)


# The backward across windows (windows.py; the algebra in lab/windowed_bwd.py): pairs of blocks in
# different windows go through the window products, pushed keys and the queries' gradient at their
# window's start. Windows of one block, of two with 128-row query blocks, and a partial last window,
# with and without gates, against float64.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T,rows,window,with_g", [(200, 64, 1, True), (300, 64, 3, False), (520, 128, 2, True)])
def test_windows_against_float64(device, T, rows, window, with_g):
    from dataclasses import replace
    from kernels.path.plan import plan_for
    inputs = make_inputs(1, T, 2, 16, 32, torch.float32, device, gates=with_g, seed=T + window)
    plan = plan_for(torch.float32, torch.device(device), K=16, rows=rows)
    if plan.path == "torch":   # --gpu-class 89 or 75: float32 PaTH runs in PyTorch there (plan.py)
        pytest.skip("this GPU class runs float32 PaTH on the PyTorch path")
    plan = replace(plan, window_blocks=window)
    do = torch.randn(1, T, 2, 32, generator=torch.Generator().manual_seed(5)).to(device)
    _plan_against_float64(inputs, plan, 16 ** -0.5, do, f"window_blocks={window} rows={rows} T={T}")


# With beta in [0, 2] and forget gates, pairs two or more windows apart carry almost nothing (each
# block's product contracts, the gates decay), so the tests above would not see the window products'
# orientation there. Pure reflections (beta = 2, orthogonal products) and no gates keep every pair's
# weight: seven windows of one block, pairs up to six windows apart.
@pytest.mark.parametrize("device", DEVICES)
def test_windows_far_apart_with_reflections(device):
    from dataclasses import replace
    from kernels.path.plan import plan_for
    q, k, v, w, beta, g = make_inputs(1, 420, 1, 16, 16, torch.float32, device, seed=7)
    plan = plan_for(torch.float32, torch.device(device), K=16, rows=64)
    if plan.path == "torch":   # --gpu-class 89 or 75: float32 PaTH runs in PyTorch there (plan.py)
        pytest.skip("this GPU class runs float32 PaTH on the PyTorch path")
    plan = replace(plan, window_blocks=1)
    do = torch.randn(1, 420, 1, 16, generator=torch.Generator().manual_seed(8)).to(device)
    _plan_against_float64((q, k, v, w, torch.full_like(beta, 2.0), g), plan, 0.5, do,
                          "windows of 1, reflections, T=420")


# The key-major cross-window pass with 128 keys a program (plan.cross_keys = rows = 128; a candidate
# of NOTES.md's round 4, two 64-blocks of one window) and with 64 query rows a step past them
# (plan.cross_queries, flash's long-T key pass), and carrying its key block across the windows
# instead of the queries (plan.cross_carry: K̃ = K̄ Φᵀ once a window, dK̄ = dK̃ Φ): against float64
# with gates and a partial last window, and with reflections across seven windows (a transposed Φ
# fails them); a width other than 64 or rows is refused.
_TILES = [(keys, queries, False) for keys, queries in [(128, None), (128, 64), (64, 64)]]
_SHAPES = [(520, 2, False), (900, 2, True), (650, 4, False)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T,window,reflect,keys,queries,carry",
                         [shape + tile for tile in _TILES for shape in _SHAPES]
                         + [(900, 2, True, 64, None, True), (650, 4, False, 128, 64, True)])
def test_cross_window_pass_with_128_keys(device, T, window, reflect, keys, queries, carry):
    from dataclasses import replace
    from kernels.path.plan import plan_for
    q, k, v, w, beta, g = make_inputs(1, T, 2, 16, 32, torch.float32, device, gates=not reflect, seed=T)
    if reflect:
        beta = torch.full_like(beta, 2.0)
    else:       # mild gates: fla's logsigmoid(N(0, 1)) leaves pairs a window apart no weight at all
        g = 0.02 * g
    plan = plan_for(torch.float32, torch.device(device), K=16, rows=128)
    if plan.path == "torch":   # --gpu-class 89 or 75: float32 PaTH runs in PyTorch there (plan.py)
        pytest.skip("this GPU class runs float32 PaTH on the PyTorch path")
    plan = replace(plan, window_blocks=window, cross_keys=keys, cross_queries=queries, cross_carry=carry)
    do = torch.randn(1, T, 2, 32, generator=torch.Generator().manual_seed(3)).to(device)
    _plan_against_float64((q, k, v, w, beta, g), plan, 0.25, do,
                          f"cross_keys={keys} cross_queries={queries} cross_carry={carry} windows of {window} T={T}")


@pytest.mark.parametrize("field", ["cross_keys", "cross_queries"])
def test_cross_keys_must_be_64_or_the_query_rows(field):
    from dataclasses import replace
    from kernels.path.plan import plan_for
    from kernels.path.windows import cross_window_grads
    plan = replace(plan_for(torch.float32, torch.device("cpu"), rows=64), window_blocks=2, **{field: 128})
    t = torch.zeros(1, 128, 16)
    with pytest.raises(ValueError, match=f"plan.{field} must be 64 or plan.rows = 64; got 128"):
        cross_window_grads(t, t, torch.zeros(1, 1, 16, 16), torch.zeros(1, 128, 1, 16), torch.zeros(1, 128, 1, 16),
                           t[..., 0], t[..., 0], None, 0.25, plan, t, None)


@pytest.mark.parametrize("device", DEVICES)
def test_per_block_backward_in_launches_of_heads(device):
    """The per-block backward's matrices (local.py) go in launches of at most plan.local_scratch bytes
    of heads: with room for one head a launch (six launches here) every gradient equals the single
    launch's bit for bit (the same kernels on the same values)."""
    from dataclasses import replace
    from kernels.path.op import PathFunction
    from kernels.path.plan import plan_for
    inputs = make_inputs(2, 100, 3, 16, 16, torch.float32, device, gates=True, seed=4)
    plan = plan_for(torch.float32, torch.device(device), K=16)
    if plan.path == "torch":   # --gpu-class 89 or 75: float32 PaTH runs in PyTorch there (plan.py)
        pytest.skip("this GPU class runs float32 PaTH on the PyTorch path")
    do = torch.randn(2, 100, 3, 16, generator=torch.Generator().manual_seed(2)).to(device)
    got = [grads(lambda q, k, v, w, b, g: PathFunction.apply(q, k, v, w, b, g, 0.25, p), inputs, do)
           for p in (plan, replace(plan, local_scratch=1))]
    for name, a in got[0].items():
        assert torch.equal(a, got[1][name]), name


@pytest.mark.parametrize("device", DEVICES)
def test_windows_in_the_backward_only(device):
    """plan.forward_windows False: the forward walks every block and the backward prepares the
    windows itself (path_backward); against float64 as above."""
    from dataclasses import replace
    from kernels.path.plan import plan_for
    inputs = make_inputs(1, 300, 2, 16, 32, torch.float32, device, gates=True, seed=9)
    plan = plan_for(torch.float32, torch.device(device), K=16, rows=64)
    if plan.path == "torch":   # --gpu-class 89 or 75: float32 PaTH runs in PyTorch there (plan.py)
        pytest.skip("this GPU class runs float32 PaTH on the PyTorch path")
    plan = replace(plan, window_blocks=2, forward_windows=False)
    do = torch.randn(1, 300, 2, 32, generator=torch.Generator().manual_seed(7)).to(device)
    _plan_against_float64(inputs, plan, 16 ** -0.5, do, "windows of 2 in the backward only")


def test_window_blocks_must_fit_the_query_rows():
    from kernels.path.plan import plan_for
    with pytest.raises(ValueError, match="window_blocks must be"):
        plan_for(torch.float32, torch.device("cpu"), rows=128, window_blocks=3)


@pytest.mark.parametrize("device", DEVICES)
def test_windows_half_inputs(device):
    """16-bit inputs (float16 transport: the window products and the carried queries in float16, as
    fla's ``hc_whole``) across windows of three blocks, at fla's RMS tolerances against float64."""
    from dataclasses import replace
    from kernels.path.op import PathFunction
    from kernels.path.plan import plan_for
    dtype = torch.float16 if device == "cpu" else torch.bfloat16   # the interpreter computes float16 in NumPy
    inputs = make_inputs(1, 450, 2, 32, 32, dtype, device, gates=True, w_dtype=torch.float32, seed=12)
    plan = replace(plan_for(dtype, torch.device(device), K=32, rows=64), window_blocks=3)
    scale = 32 ** -0.5
    do = torch.randn(1, 450, 2, 32, generator=torch.Generator().manual_seed(6)).to(dtype).to(device)
    ours = grads(lambda q, k, v, w, b, g: PathFunction.apply(q, k, v, w, b, g, scale, plan), inputs, do)
    d64 = lambda x: None if x is None else x.detach().to("cpu", torch.float64)   # noqa: E731
    ref = grads(lambda *a: path_attn_ref(*a, scale=scale), [d64(x) for x in inputs], d64(do))
    for name, a in ours.items():
        err = err_ratio(a.detach().to("cpu", torch.float64), ref[name].detach())
        assert err <= RMS_TOL[name], f"windows of 3, {dtype} {name}: {err:.3e} > {RMS_TOL[name]:g}"
