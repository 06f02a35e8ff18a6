"""The short-convolution kernel (``kernels.conv.causal_conv1d``) against float64 references.

On a machine without a GPU the kernels run through Triton's interpreter (CPU tensors, small shapes
whose tiles are made smaller still so that every test crosses tile borders in time and channels);
with CUDA the same tests also run compiled, plus the benchmark's width and dtype at a larger size.

References: :func:`kernels.reference.causal_conv1d_ref` in float64 (outputs, and gradients by
autograd), itself checked here against ``lattn_core.short_conv`` / ``short_conv_recurrent`` (the
book's definition, weight ``(w, d)`` with row 0 the current token) and by ``gradcheck``. Inputs are
cast to float64 *after* rounding to the tested dtype, so the tolerances measure the kernels'
arithmetic, not the input rounding.

Tolerances:
- float32: max error ≤ 2e-5 · max(max |ref|, 1). Each output is a sum of W ≤ 8 products and a
  bias in float32 (a few ulps, 6e-8 each); ``dweight``/``dbias`` are sums over B·T ≤ 100 terms,
  reduced in float32. Measured ≤ 5e-6 relative; a wrong lag, slot or mask fails by O(1).
- 16-bit: fla's RMS error ratio (``err_ratio``) ≤ 4e-3 for bfloat16 and 5e-4 for float16: the
  result is rounded once to the 16-bit dtype (relative rounding 2^-9 and 2^-12 at most, RMS about
  a third of that) after float32 arithmetic.
- decoding continuity, strided inputs: exact equality (the same sums in the same order).
"""
import json
from dataclasses import replace
import numpy as np
import pytest
import torch
import triton

import kernels
import lattn_core as lc
from kernels.harness import err_ratio
from kernels.conv import causal_conv1d
from kernels.reference import causal_conv1d_ref
from kernels.conv.op import causal_conv1d_triton
from kernels.conv.plan import ConvPlan, plan_for

DEVICES = (["cpu"] if kernels.INTERPRET else []) + (["cuda"] if torch.cuda.is_available() else [])
if not DEVICES:  # pragma: no cover - a CUDA machine with TRITON_INTERPRET unset always has "cuda"
    DEVICES = ["cpu"]

# small tiles: T = 37 crosses 5 time tiles (and marching segments), D = 24 two channel tiles, the backward's partial sums
# are reduced over several rows and steps
SMALL = dict(march_seg=8, march_bd=16, fwd_bt=8, fwd_bd=16, bwd_bt=8, bwd_bd=16, bwd_steps=2, small_bd=16, red_bp=4, red_bn=16)
NAMES = ("x", "weight", "bias", "residual", "initial_state")


def _plan(device):
    return SMALL if device == "cpu" else None


def make_inputs(B, T, D, W, dtype, device, *, bias=True, residual=True, state=True, seed=0, wdtype=None):
    gen = torch.Generator().manual_seed(seed)
    wd = wdtype or dtype
    x = torch.randn(B, T, D, generator=gen).to(dtype)
    w = (torch.randn(D, W, generator=gen) / W ** 0.5).to(wd)
    b = torch.randn(D, generator=gen).to(wd) if bias else None
    r = torch.randn(B, T, D, generator=gen).to(dtype) if residual else None
    s = torch.randn(B, D, W, generator=gen).to(wd) if state else None
    return [t.to(device) if t is not None else None for t in (x, w, b, r, s)]


def run(fn, inputs, act, final, dy, dh, **kw):
    """Outputs and the gradients of ``<y, dy> + <final_state, dh>`` for every tensor input."""
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in inputs]
    y, ht = fn(*leaves, output_final_state=final, activation=act, **kw)
    loss = (y.double() * dy).sum() + ((ht.double() * dh).sum() if final else 0)
    used = [t for t in leaves if t is not None]
    grads = torch.autograd.grad(loss, used)
    it = iter(grads)
    return y, ht, [next(it) if t is not None else None for t in leaves]


def reference(inputs, act, final, dy, dh):
    x64 = [t.detach().double() if t is not None else None for t in inputs]
    return run(causal_conv1d_ref, x64, act, final, dy, dh)


def max_rel(a, ref):
    a, ref = a.detach().double().cpu(), ref.detach().double().cpu()
    return (a - ref).abs().max().item() / max(ref.abs().max().item(), 1.0)


# ---------------------------------------------------------------------------------------------
# the oracle
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("W,T", [(1, 5), (2, 1), (3, 7), (4, 2), (4, 9)])
@pytest.mark.parametrize("act", [None, "silu"])
def test_reference_is_lattn_core_short_conv(W, T, act):
    """fla's layout [D, W] (last column current) is the book's (w, d) reversed and transposed; the
    state's slots 1..W-1 are short_conv_recurrent's cache transposed (slot 0 is never read)."""
    rng = np.random.default_rng(W * 10 + T)
    D = 5
    X, wb = rng.normal(size=(T, D)), rng.normal(size=(W, D))
    cache = rng.normal(size=(W - 1, D))
    w = torch.from_numpy(lc.conv_weight_to_fla(wb))
    y, _ = causal_conv1d_ref(torch.from_numpy(X)[None], w, activation=act)
    np.testing.assert_allclose(y[0].numpy(), lc.short_conv(X, wb, activation=act), rtol=1e-12, atol=1e-12)
    state = torch.from_numpy(np.vstack([rng.normal(size=(1, D)), cache]).T.copy())[None]   # [1, D, W]
    y, ht = causal_conv1d_ref(torch.from_numpy(X)[None], w, initial_state=state, output_final_state=True)
    Y, new_cache = lc.short_conv_recurrent(X, wb, initial_state=cache, return_state=True)
    np.testing.assert_allclose(y[0].numpy(), Y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ht[0, :, 1:].numpy().T, new_cache, rtol=0, atol=0)
    # the last W inputs of concat(state, x), slot 0 included
    np.testing.assert_array_equal(ht[0].numpy().T, np.vstack([state[0].numpy().T, X])[-W:])


def test_reference_gradcheck_short_sequence():
    """The oracle's gradients by finite differences, T = 1 < W - 1 with both states (fla #1140)."""
    inputs = make_inputs(2, 1, 3, 4, torch.float64, "cpu", seed=3)
    leaves = [t.requires_grad_() for t in inputs]

    def f(*a):
        y, ht = causal_conv1d_ref(*a, output_final_state=True, activation="silu")
        return y, ht
    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-7)


def test_cpu_default_is_reference():
    inputs = make_inputs(2, 6, 4, 3, torch.float32, "cpu")
    y, ht = causal_conv1d(*inputs, output_final_state=True, activation="silu")
    y0, h0 = causal_conv1d_ref(*inputs, output_final_state=True, activation="silu")
    assert torch.equal(y, y0) and torch.equal(ht, h0)


# ---------------------------------------------------------------------------------------------
# the kernels in float32
# ---------------------------------------------------------------------------------------------
# (B, T, D, W, activation, bias/residual/state, final state)
F32_CASES = [(2, 37, 24, 4, "silu", True, True), (2, 37, 24, 4, None, False, False),
             (1, 1, 24, 4, "silu", True, True), (2, 2, 20, 4, None, True, True),     # T < W - 1
             (2, 3, 24, 3, "swish", False, True), (1, 37, 24, 1, "silu", True, True),
             (2, 19, 17, 2, None, True, False), (1, 21, 24, 8, "silu", True, True)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B,T,D,W,act,opts,final", F32_CASES)
def test_float32_against_float64(device, B, T, D, W, act, opts, final):
    inputs = make_inputs(B, T, D, W, torch.float32, device, bias=opts, residual=opts, state=opts, seed=T + W)
    gen = torch.Generator().manual_seed(1)
    dy = torch.randn(B, T, D, generator=gen, dtype=torch.float64).to(device)
    dh = torch.randn(B, D, W, generator=gen, dtype=torch.float64).to(device)
    y0, h0, g0 = reference(inputs, act, final, dy, dh)
    y, ht, g = run(causal_conv1d_triton, inputs, act, final, dy, dh, plan=_plan(device))
    assert y.dtype == torch.float32 and y.shape == (B, T, D)
    assert max_rel(y, y0) < 2e-5
    if final:
        assert ht.shape == (B, D, W) and max_rel(ht, h0) == 0.0      # copies of inputs: exact
    else:
        assert ht is None
    for name, a, b in zip(NAMES, g, g0):
        if b is None:
            assert a is None
            continue
        assert a.dtype == torch.float32, name
        assert max_rel(a, b) < 2e-5, name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T", [1, 2])
def test_final_state_gradient_short_sequence(device, T):
    """T < W - 1 with a loss on the final state only (fla #1140): the old state's slots i >= T
    reappear in slot i - T, so their gradient is dh's slot i - T exactly; x_t sits in slot W - T + t;
    slots i < T left the state and were not read (no loss on y)."""
    W, D = 4, 20
    inputs = make_inputs(2, T, D, W, torch.float32, device, residual=False, seed=T)
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in inputs]
    y, ht = causal_conv1d_triton(*leaves, output_final_state=True, activation="silu", plan=_plan(device))
    dh = torch.randn(2, D, W, device=device)
    dx, dw, db, ds = torch.autograd.grad((ht * dh).sum(), [leaves[0], leaves[1], leaves[2], leaves[4]])
    assert torch.equal(ds[..., T:], dh[..., :W - T]) and torch.equal(ds[..., :T], torch.zeros_like(ds[..., :T]))
    assert torch.equal(dx, dh[..., W - T:].transpose(1, 2))
    assert torch.equal(dw, torch.zeros_like(dw)) and torch.equal(db, torch.zeros_like(db))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cut", [1, 2, 9])
def test_decoding_continuity(device, cut):
    """Two pieces, the first's final state passed to the second, give one run's outputs and final
    state exactly (pieces shorter than W - 1 included)."""
    B, T, D, W = 2, 12, 24, 4
    x, w, b, _, s = make_inputs(B, T, D, W, torch.float32, device, residual=False, seed=cut)
    plan = _plan(device)
    y, ht = causal_conv1d_triton(x, w, b, None, s, True, "silu", plan=plan)
    y1, h1 = causal_conv1d_triton(x[:, :cut], w, b, None, s, True, "silu", plan=plan)
    y2, h2 = causal_conv1d_triton(x[:, cut:], w, b, None, h1, True, "silu", plan=plan)
    assert torch.equal(torch.cat([y1, y2], 1), y) and torch.equal(h2, ht)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cut", [1, 2, 9])
def test_chained_pieces_have_one_runs_gradients(device, cut):
    """fla's tracker #1140 as a user meets it: a first piece shorter than W - 1 (cut = 1, 2) or
    longer (9), its final state passed to the second piece, and a loss on both pieces' outputs and
    the last final state. The gradients of x, weight, bias and the initial state equal one call's.
    Float32 with the sums over tokens split differently: 1e-5 of the largest entry."""
    B, T, D, W = 2, 12, 24, 4
    inputs = make_inputs(B, T, D, W, torch.float32, device, residual=False, seed=cut)
    x, w, b, _, s = [t.detach().clone().requires_grad_() if t is not None else None for t in inputs]
    plan = _plan(device)
    gen = torch.Generator().manual_seed(100 + cut)
    dy = torch.randn(B, T, D, generator=gen).to(device)
    dh = torch.randn(B, D, W, generator=gen).to(device)

    def grads(pieces):
        state, ys = s, []
        for lo, hi in pieces:
            y, state = causal_conv1d_triton(x[:, lo:hi], w, b, None, state, True, "silu", plan=plan)
            ys.append(y)
        loss = (torch.cat(ys, 1) * dy).sum() + (state * dh).sum()
        return torch.autograd.grad(loss, [x, w, b, s])

    for name, one, two in zip(("x", "weight", "bias", "initial_state"), grads([(0, T)]),
                              grads([(0, cut), (cut, T)])):
        err = (one - two).abs().max().item() / max(one.abs().max().item(), 1.0)
        assert err <= 1e-5, f"{name}: {err:.2e}"


@pytest.mark.parametrize("device", DEVICES)
def test_strided_inputs(device):
    """x and residual as column slices of wider tensors (time stride > D) and as a transposed
    [B, D, T] tensor (channel stride > 1, copied): the contiguous results exactly."""
    B, T, D, W = 2, 13, 24, 3
    x, w, b, r, s = make_inputs(B, T, D, W, torch.float32, device, seed=5)
    plan = _plan(device)
    y0, h0 = causal_conv1d_triton(x, w, b, r, s, True, "silu", plan=plan)
    wide = torch.randn(B, T, 3 * D, device=device)
    xs, rs = wide.clone(), wide.clone()
    xs[..., D:2 * D], rs[..., :D] = x, r
    y1, h1 = causal_conv1d_triton(xs[..., D:2 * D], w, b, rs[..., :D], s, True, "silu", plan=plan)
    xt = x.transpose(1, 2).contiguous().transpose(1, 2)
    y2, h2 = causal_conv1d_triton(xt, w, b, r, s, True, "silu", plan=plan)
    for y, h in ((y1, h1), (y2, h2)):
        assert torch.equal(y, y0) and torch.equal(h, h0)
    # gradients through a strided x
    leaf = wide.clone().requires_grad_()
    y, _ = causal_conv1d_triton(leaf[..., D:2 * D], w, b, None, None, False, "silu", plan=plan)
    (gx,) = torch.autograd.grad(y.sum(), [leaf])
    x64 = leaf[..., D:2 * D].detach().double().requires_grad_()
    (g64,) = torch.autograd.grad(causal_conv1d_ref(x64, w.double(), b.double(), activation="silu")[0].sum(), [x64])
    assert max_rel(gx[..., D:2 * D], g64) < 2e-5 and gx[..., :D].abs().max() == 0


# ---------------------------------------------------------------------------------------------
# 16-bit inputs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,wdtype,tol", [(torch.bfloat16, None, 4e-3), (torch.float16, None, 5e-4),
                                              (torch.bfloat16, torch.float32, 4e-3)],
                         ids=["bf16", "fp16", "bf16-f32-weights"])
def test_half_inputs(device, dtype, wdtype, tol):
    B, T, D, W = 2, 37, 24, 4
    inputs = make_inputs(B, T, D, W, dtype, device, seed=7, wdtype=wdtype)
    gen = torch.Generator().manual_seed(2)
    dy = torch.randn(B, T, D, generator=gen, dtype=torch.float64).to(dtype).double().to(device)
    dh = torch.randn(B, D, W, generator=gen, dtype=torch.float64).to(dtype).double().to(device)
    y0, h0, g0 = reference(inputs, "silu", True, dy, dh)
    y, ht, g = run(causal_conv1d_triton, inputs, "silu", True, dy, dh, plan=_plan(device))
    assert y.dtype == dtype and ht.dtype == dtype
    assert err_ratio(y, y0) < tol and torch.equal(ht.double(), h0.double())
    for name, a, b, t in zip(NAMES, g, g0, inputs):
        assert a.dtype == t.dtype, name
        assert err_ratio(a, b) < tol, name


# ---------------------------------------------------------------------------------------------
# contract
# ---------------------------------------------------------------------------------------------
def _bad_cases():
    x, w = torch.randn(2, 5, 4), torch.randn(4, 3)
    return [
        (dict(x=torch.randn(5, 4)), "x must have shape"),
        (dict(x=torch.randn(2, 0, 4)), "non-empty"),
        (dict(x=x.double()), "x must be float32"),
        (dict(x=x.to(torch.int32)), "x must be float32"),
        (dict(weight=torch.randn(5, 3)), r"weight must have shape \[D, W\] = \[4, W\]"),
        (dict(weight=torch.randn(4, 1, 3)), r"weight must have shape \[D, W\]"),
        (dict(weight=torch.randn(4, 0)), r"in \[1, 8\]"),
        (dict(weight=torch.randn(4, 9)), r"in \[1, 8\]; got 9"),
        (dict(weight=w.double()), "weight must be float32"),
        (dict(bias=torch.randn(3)), r"bias must have shape \[D\]"),
        (dict(residual=torch.randn(2, 4, 4)), r"residual must have shape \[B, T, D\]"),
        (dict(initial_state=torch.randn(2, 4, 2)), r"initial_state must have shape \[B, D, W\] = \[2, 4, 3\]"),
        (dict(initial_state=torch.randn(1, 4, 3)), r"initial_state must have shape"),
        (dict(activation="relu"), "activation must be None, 'silu' or 'swish'"),
        (dict(output_final_state="yes"), "output_final_state must be a bool"),
        (dict(backend="cuda"), "backend must be one of"),
    ]


@pytest.mark.parametrize("case,msg", _bad_cases())
def test_bad_inputs(case, msg):
    args = dict(x=torch.randn(2, 5, 4), weight=torch.randn(4, 3))
    args.update(case)
    with pytest.raises(ValueError, match=msg):
        causal_conv1d(**args)


def test_plan_overrides():
    p = plan_for(torch.bfloat16, "cpu", T=100, D=64, interpret=False, fwd_bt=32)
    assert isinstance(p, ConvPlan) and p.fwd_bt == 32 and p.bwd_steps >= 1
    short = plan_for(torch.bfloat16, "cpu", T=5, D=64, interpret=False)     # short T: one program's tiles
    assert short.bwd_steps == -(-5 // short.bwd_bt)                          # cover it, no more
    with pytest.raises(ValueError, match="unknown field"):
        plan_for(torch.float32, "cpu", T=8, D=8, tiles=3)
    with pytest.raises(ValueError, match="power of two"):
        plan_for(torch.float32, "cpu", T=8, D=8, fwd_bd=24)
    with pytest.raises(ValueError, match="bwd_steps"):
        plan_for(torch.float32, "cpu", T=8, D=8, bwd_steps=0)


# ---------------------------------------------------------------------------------------------
# compiled, on a GPU
# ---------------------------------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled Triton needs a CUDA device")
@pytest.mark.parametrize("D", [2048, 4096])
def test_gpu_benchmark_shape(D):
    """The benchmark's setting (bfloat16, W = 4, SiLU) at B·T = 8192, the default plan."""
    B, T, W = 4, 2048, 4
    inputs = make_inputs(B, T, D, W, torch.bfloat16, "cuda", residual=False, seed=D)
    gen = torch.Generator().manual_seed(3)
    dy = torch.randn(B, T, D, generator=gen, dtype=torch.float64).to(torch.bfloat16).double().cuda()
    dh = torch.randn(B, D, W, generator=gen, dtype=torch.float64).to(torch.bfloat16).double().cuda()
    y0, h0, g0 = reference(inputs, "silu", True, dy, dh)
    y, ht, g = run(causal_conv1d, inputs, "silu", True, dy, dh)
    assert err_ratio(y, y0) < 4e-3 and torch.equal(ht.double(), h0)
    for name, a, b in zip(NAMES, g, g0):
        if b is not None:
            assert err_ratio(a, b) < 4e-3, name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled Triton needs a CUDA device")
def test_gpu_deterministic_weight_gradient():
    """The taps' and bias's gradients are reduced in a fixed order: two runs agree bit for bit."""
    inputs = make_inputs(8, 1024, 512, 4, torch.bfloat16, "cuda", residual=False, seed=9)
    dy = torch.randn(8, 1024, 512, device="cuda", dtype=torch.float64)
    dh = torch.randn(8, 512, 4, device="cuda", dtype=torch.float64)
    _, _, g1 = run(causal_conv1d, inputs, "silu", True, dy, dh)
    _, _, g2 = run(causal_conv1d, inputs, "silu", True, dy, dh)
    assert all(torch.equal(a, b) for a, b in zip(g1, g2) if a is not None)


def test_layer_run_loads_and_tabulates(tmp_path):
    """kernels.conv.bench_layer: the stored layer run reads back and prints one line per variant with its
    share over `bare`; a missing file names the command that writes it."""
    from kernels.conv import bench_layer as layer
    with pytest.raises(FileNotFoundError, match="python -m kernels.conv.bench_layer --write"):
        layer.load(tmp_path / "none.json")
    rows = [{"variant": v, "fwd_ms": f, "fwdbwd_ms": b, "share_fwd": (f - 2.0) / f, "share_fwdbwd": (b - 7.5) / b}
            for v, f, b in (("conv", 2.5, 10.0), ("bare", 2.0, 7.5))]
    path = tmp_path / "layer.json"
    path.write_text(json.dumps({"env": {"device": "test"}, "args": dict(B=1, T=8, hidden=4, heads=1, head_dim=4,
                                                                         width=4), "rows": rows}))
    text = layer.table(layer.load(path))
    assert "our causal_conv1d" in text and "20.0%" in text and "25.0%" in text and "neither" in text
    assert "as launched" in text and "CUDA graphs" not in text
    stored = layer.load()                     # the run this copy of the book ships
    assert {r["variant"] for r in stored["rows"]} >= {"conv", "bare"} and stored["env"]["device"]


def test_layer_byte_floor():
    """bench_layer.byte_floor: three convolutions of N = B·T·heads·head_dim bf16 values move 2·N·2
    bytes each forward and 5·N·2 forward + backward; floor_check flags an extra time below that."""
    from kernels.conv import bench_layer as layer
    args = dict(B=2, T=1000, hidden=8, heads=2, head_dim=4, width=4)   # N = 16,000 values, 32,000 bytes
    floor = layer.byte_floor({"args": args}, gbps=1000.0)               # 1 GB/s = 1e6 bytes per ms
    assert floor["fwd"] == pytest.approx(3 * 2 * 32000 / 1e6 / 1000) and floor["fwdbwd"] == pytest.approx(
        2.5 * floor["fwd"])
    rows = [{"variant": "conv", "fwd_ms": 1.0 + 2 * floor["fwd"], "fwdbwd_ms": 1.0 + floor["fwdbwd"] / 2},
            {"variant": "silu", "fwd_ms": 1.0, "fwdbwd_ms": 1.0}, {"variant": "bare", "fwd_ms": 1.0, "fwdbwd_ms": 1.0}]
    checks = {c["pass_"]: c for c in layer.floor_check({"args": args, "rows": rows}, gbps=1000.0)}
    assert set(checks) == {"fwd", "fwdbwd"} and not checks["fwd"]["below"] and checks["fwdbwd"]["below"]
    assert checks["fwd"]["extra_ms"] == pytest.approx(2 * floor["fwd"])
    assert layer.copy_bandwidth({"records": [{"impl": "copy", "gbps": g} for g in (1.0, 3.0, 2.0)]
                                 + [{"impl": "ours", "gbps": 9.0}]}) == 2.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T,W,seg,extras", [(37, 4, 8, True), (37, 3, 16, False), (5, 4, 4, True), (1, 2, 4, True),
                                             (9, 1, 4, False), (2, 4, 8, True)])
def test_marching_forward_equals_the_tiled_one(device, T, W, seg, extras):
    """The two forwards of forward.py, the marching one (the plan's default up to W = 4) and the
    tiled one (``march=False``; every width), give the same `y`: bit for bit in float32 up to the
    order of the tap sums (1e-6 on O(1) values), with and without bias, residual, state and SiLU;
    segments that end inside the sequence and past it, widths 1 to 4 (T = 1 and 2: the whole
    output comes from the state). At W = 5 the plan's marching forward hands over to the tiled one."""
    from kernels.conv.forward import conv_forward
    x, w, b, r, s = make_inputs(2, T, 24, W, torch.float32, device, bias=extras, residual=extras, state=extras,
                                seed=T + W)
    act = "silu" if extras else None
    over = _plan(device) or {}
    tiled = conv_forward(x, w, b, r, s, act, plan_for(x.dtype, x.device, T=T, D=24, W=W, **over, march=False))
    marched = conv_forward(x, w, b, r, s, act, plan_for(x.dtype, x.device, T=T, D=24, W=W,
                                                        **dict(over, march_seg=seg, march_bd=16)))
    assert max_rel(marched, tiled) < 1e-6
    w5 = torch.randn(24, 5, generator=torch.Generator().manual_seed(5)).to(device)
    p5 = plan_for(x.dtype, x.device, T=T, D=24, W=5, **over)
    assert p5.march and torch.equal(conv_forward(x, w5, None, None, None, act, p5),
                                    conv_forward(x, w5, None, None, None, act, replace(p5, march=False)))
    with pytest.raises(ValueError, match="march_seg must be a power of two"):
        plan_for(x.dtype, x.device, T=T, D=24, W=W, march_seg=2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T,W,seg,extras", [(37, 4, 8, True), (37, 3, 16, False), (5, 4, 4, True), (1, 2, 4, True),
                                             (9, 1, 4, False), (2, 4, 8, True), (64, 4, 16, True)])
def test_marching_backward_equals_the_two_pass_one(device, T, W, seg, extras):
    """The two backwards of backward.py, the marching one (the plan's default up to W = 4) and the
    two-pass one (``march=False``; every width), give the same `dx`, `dw` and `db`, in float32 on
    the interpreter up to the order of the sums (1e-5 relative: dw adds up to 2·37 products per
    channel in another order), with and without bias, state, SiLU and the final state's gradient;
    segments that end inside the sequence and past it, widths 1 to 4, T = 1 and 2 (shorter than
    the convolution). At W = 5 the plan's marching backward hands over to the two-pass one."""
    from kernels.conv.backward import conv_backward
    x, w, b, _, s = make_inputs(2, T, 24, W, torch.float32, device, bias=extras, residual=False, state=extras,
                                seed=T + W)
    act = "silu" if extras else None
    gen = torch.Generator().manual_seed(T)
    dy = torch.randn(2, T, 24, generator=gen).to(device)
    dht = torch.randn(2, 24, W, generator=gen).to(device) if extras else None
    over = _plan(device) or {}
    two_pass = plan_for(x.dtype, x.device, T=T, D=24, W=W, **over, march=False)
    marching = plan_for(x.dtype, x.device, T=T, D=24, W=W, **dict(over, bwd_march_seg=seg, bwd_march_bd=16))
    want = conv_backward(x, w, b, s, dy, dht, act, two_pass, need_dw=True, need_db=extras)
    got = conv_backward(x, w, b, s, dy, dht, act, marching, need_dw=True, need_db=extras)
    for name, a, r in zip(("dx", "dw", "db"), got, want):
        if r is None:
            assert a is None, name
        else:
            assert max_rel(a, r) < 1e-5, name
    w5 = torch.randn(24, 5, generator=torch.Generator().manual_seed(5)).to(device)
    p5 = plan_for(x.dtype, x.device, T=T, D=24, W=5, **over)
    got5 = conv_backward(x, w5, None, None, dy, None, act, p5, need_dw=True, need_db=False)
    want5 = conv_backward(x, w5, None, None, dy, None, act, replace(p5, march=False), need_dw=True, need_db=False)
    assert p5.march and all(torch.equal(g, r) for g, r in zip(got5[:2], want5[:2]))
    with pytest.raises(ValueError, match="bwd_march_seg must be a power of two"):
        plan_for(x.dtype, x.device, T=T, D=24, W=W, bwd_march_seg=2)


def test_marching_backward_fills_a_small_grid():
    """With the batch given, the plan shrinks the marching backward's segment, then its channel
    block (warps alongside), until the grid has MIN_PROGRAMS programs, and never below 64 × 256;
    a grid that is full at the measured default keeps it."""
    from kernels.conv.plan import MIN_PROGRAMS
    caps = kernels.backend.Caps(9, 0, 232448)
    big = plan_for(torch.bfloat16, "cuda", T=2048, D=2048, W=4, B=32, interpret=False, caps=caps)
    default = ConvPlan()
    assert (big.bwd_march_seg, big.bwd_march_bd, big.bwd_march) == (default.bwd_march_seg, default.bwd_march_bd,
                                                                      default.bwd_march)
    small = plan_for(torch.bfloat16, "cuda", T=2048, D=2048, W=4, B=1, interpret=False, caps=caps)
    assert small.bwd_march_seg == 64 and 256 <= small.bwd_march_bd < default.bwd_march_bd
    assert small.bwd_march[0].num_warps * 128 == small.bwd_march_bd
    grid = lambda p: triton.cdiv(2048, p.bwd_march_seg) * triton.cdiv(2048, p.bwd_march_bd)   # noqa: E731
    assert grid(small) >= MIN_PROGRAMS or small.bwd_march_bd == 256
    tiny = plan_for(torch.bfloat16, "cuda", T=8, D=64, W=4, B=1, interpret=False, caps=caps)
    assert (tiny.bwd_march_seg, tiny.bwd_march_bd) == (default.bwd_march_seg, 256)


def test_launched_vs_graphed_fractions():
    """bench.launched_vs_graphed: 5·N·2 bytes over the median time, over the copy's bandwidth; the
    stored log has both ways at every shape of the benchmark."""
    from kernels.conv import bench as cb
    log = {"rows": [dict(B=2, T=1000, D=100, how="eager", median=0.002, low=0.001, high=0.003),
                    dict(B=2, T=1000, D=100, how="graph", median=0.001, low=0.001, high=0.001)]}
    rows = cb.launched_vs_graphed(log, gbps=2000.0)
    # 5 · 2·1000·100 · 2 bytes = 2e6 bytes; in 0.002 ms that is 1000 GB/s, half of 2000
    assert [round(r["copy_fraction"], 9) for r in rows] == [0.5, 1.0]
    stored = cb.launched_vs_graphed()
    shapes = {(r["B"], r["T"], r["D"]) for r in stored}
    assert shapes == {(b, t, d) for b, t in cb.SHAPES_FULL for d in cb.DIMS}
    assert {r["how"] for r in stored} == {"eager", "graph"}
    assert all(0 < r["copy_fraction"] < 1.5 for r in stored)
