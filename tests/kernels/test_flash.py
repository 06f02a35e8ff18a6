"""The Triton flash-attention kernel against float64 references.

On a machine without a GPU the kernel runs through Triton's interpreter (CPU tensors); with CUDA the
same tests also run compiled on the GPU, plus larger GPU-only shapes.

References: causal attention per (batch, head) is ``lattn_core.softmax_attention`` in float64 on the
scaled queries; full (non-causal) attention is the textbook definition written out below in NumPy;
the large GPU shapes use ``kernels.reference.attention_ref`` in float64 (itself tested against
``lattn_core`` elsewhere). Inputs are cast to float64 *after* rounding to the tested dtype, so the
tolerances below measure the kernel's arithmetic, not the input rounding.

Tolerances (outputs are convex combinations of ``v`` rows with ``v ~ N(0, 1)``, so ``|o| <~ 3``):
- float32: 1e-5. Products are IEEE float32 (``input_precision="ieee"``), sums of <= T terms and
  ``exp2`` each cost a few float32 ulps (2^-24 ≈ 6e-8 relative); 1e-5 leaves ~50x headroom while a
  TF32 product (10-bit mantissa, ~1e-3 error) or any indexing/masking bug would fail it.
- float16: 4e-3. The probabilities are rounded to float16 before ``P V`` (2^-11 ≈ 4.9e-4 relative)
  and the output is stored in float16 (half an ulp at |o| < 4 is 2^-10 ≈ 1e-3).
- bfloat16: 3e-2. Same two roundings with an 8-bit mantissa (2^-8 ≈ 3.9e-3 relative; half an ulp
  at |o| < 4 is 2^-7 ≈ 7.8e-3), with headroom for their sum.
"""

import numpy as np
import pytest
import torch

import kernels
import lattn_core as lc
from kernels.reference import attention_ref

TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}

DEVICES = (["cpu"] if kernels.INTERPRET else []) + (["cuda"] if torch.cuda.is_available() else [])
if not DEVICES:  # pragma: no cover - a CUDA machine with TRITON_INTERPRET unset always has "cuda"
    DEVICES = ["cpu"]


def full_softmax_attention(Q, K, V):
    """Non-causal attention by its definition: row-softmax of Q Kᵀ (max-subtracted), times V."""
    S = Q @ K.T
    P = np.exp(S - S.max(axis=1, keepdims=True))
    return (P @ V) / P.sum(axis=1, keepdims=True)


def reference64(q, k, v, scale, causal):
    """float64 reference, per (b, h), from lattn_core (causal) or the definition above (full)."""
    qn, kn, vn = (x.detach().to("cpu", torch.float64).numpy() for x in (q, k, v))
    B, T, H, _ = qn.shape
    out = np.empty(vn.shape)
    for b in range(B):
        for h in range(H):
            Q, K, V = scale * qn[b, :, h], kn[b, :, h], vn[b, :, h]
            out[b, :, h] = lc.softmax_attention(Q, K, V) if causal else full_softmax_attention(Q, K, V)
    return out


def rand_qkv(B, T, H, D, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, T, H, D, generator=g).to(dtype).to(device) for _ in range(3)]


def run_and_check(q, k, v, causal, scale=None, name=""):
    D = q.shape[-1]
    scale = D ** -0.5 if scale is None else scale
    o = kernels.flash_attention(q, k, v, scale=scale, causal=causal, backend="triton")
    assert o.shape == v.shape and o.dtype == v.dtype and o.device == v.device
    ref = reference64(q, k, v, scale, causal)
    # tolerance: see the module docstring (per dtype)
    lc.check_close(f"flash {name} {tuple(q.shape)} {q.dtype} causal={causal}",
                   o.to("cpu", torch.float64).numpy(), ref, TOL[q.dtype])
    return o


# Odd lengths: 1 (a lone query), below/above one key block, and more than one query block.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("T,D", [(1, 16), (2, 128), (17, 32), (63, 64), (65, 16), (130, 32)])
def test_float32_odd_lengths(device, causal, T, D):
    q, k, v = rand_qkv(2, T, 2, D, torch.float32, device, seed=T)
    run_and_check(q, k, v, causal)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("D", [16, 32, 64, 128])
def test_each_head_size(device, causal, D):
    q, k, v = rand_qkv(1, 40, 2, D, torch.float32, device, seed=D)
    run_and_check(q, k, v, causal, scale=0.7 / D ** 0.5)  # an explicit, non-default scale


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T", [17, 130])
def test_half_precisions(device, causal, dtype, T):
    q, k, v = rand_qkv(1, T, 2, 64, dtype, device, seed=T + 1)
    run_and_check(q, k, v, causal)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [True, False])
def test_non_contiguous_inputs(device, causal):
    g = torch.Generator().manual_seed(5)
    B, T, H, D = 2, 37, 3, 32
    # q: a slice of a bigger tensor (every stride differs from the packed one);
    # k: a [B, H, T, D] tensor seen as [B, T, H, D]; v: every other time step of a longer sequence.
    big = torch.randn(B + 1, T + 5, H + 2, D + 16, generator=g).to(device)
    q = big[1:, 3:T + 3, 1:H + 1, 8:D + 8]
    k = torch.randn(B, H, T, D, generator=g).to(device).transpose(1, 2)
    v = torch.randn(B, 2 * T, H, D, generator=g).to(device)[:, ::2]
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    o = run_and_check(q, k, v, causal, name="strided")
    # and the same as on packed copies: same tiles, same order of operations, so equal up to at most
    # a last-bit difference if the compiler fuses differently for the other stride specialisation
    # (|o| < 4, float32 ulp there <= 4.8e-7).
    o2 = kernels.flash_attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=causal,
                                 backend="triton")
    torch.testing.assert_close(o, o2, atol=1e-6, rtol=0)


# --- the backward and FoX's bias ---------------------------------------------------------------
# Gradient tolerances, all against float64 gradients of the float64 reference on the same
# (rounded) inputs and the same upstream gradient:
# - float32, max error over max(max |reference|, 1) <= 2e-5 (the 1: a lone query's dq is exactly 0): the backward sums up to T products of
#   float32 terms twice over (p, then ds), each a few ulps (6e-8); 2e-5 is ~100x their size at
#   these T while a wrong mask, a wrong row statistic or a TF32 product (1e-3) fails it.
# - 16-bit, fla's RMS error ratio: outputs <= 5e-3 (the accuracy target for outputs), dq/dk/dv <= 1e-2 (p and ds are
#   rounded to the input dtype before their products: 2^-9 relative for bfloat16, and each gradient
#   is a sum of such rounded terms), gate gradients dg <= 2e-2 (the accuracy target for gate gradients; dg is a reverse
#   cumulative sum of column sums, so it adds the float32 rounding of long sums).
from kernels.common.gates import cumulative_gates  # noqa: E402  (tested in tests/kernels/test_common.py)
from kernels.harness import err_ratio  # noqa: E402

RMS_TOL = {"o": 5e-3, "dq": 1e-2, "dk": 1e-2, "dv": 1e-2, "dg": 2e-2}


def grads_and_reference(q, k, v, g=None, causal=True, scale=None, seed=0):
    """Our output and gradients (Triton) and the float64 reference's, for one upstream gradient."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(v.shape, generator=gen).to(v.dtype).to(v.device)
    names = ["q", "k", "v"] + ([] if g is None else ["g"])
    ins = [q, k, v] + ([] if g is None else [g])
    leaves = [x.detach().clone().requires_grad_(True) for x in ins]
    if g is None:
        o = kernels.flash_attention(*leaves, scale=scale, causal=causal, backend="triton")
    else:
        o = kernels.parallel_forgetting_attn(*leaves, scale=scale, backend="triton")
    grads = torch.autograd.grad(o, leaves, do)
    if g is not None:
        # The op forms G = cumsum(g) in float32 (as fla does); like every other input, the reference
        # starts from that rounded G (its float64 differences sum back to it exactly), so the
        # tolerances measure the kernels' arithmetic. (A float32 G of size |G| is itself off by up to
        # |G|·2^-24, a relative error of that size in each weight: 2e-4 at |G| = 3300.)
        G32 = cumulative_gates(g.detach()).to("cpu", torch.float64)
        ins = ins[:3] + [torch.diff(G32, dim=1, prepend=torch.zeros_like(G32[:, :1]))]
    l64 = [x.detach().to("cpu", torch.float64).requires_grad_(True) for x in ins]
    o64 = attention_ref(*l64[:3], scale, causal, g=None if g is None else l64[3])
    g64 = torch.autograd.grad(o64, l64, do.to("cpu", torch.float64))
    assert all(a.dtype == x.dtype and a.shape == x.shape for a, x in zip(grads, leaves))
    return dict(zip(["o"] + ["d" + n for n in names], [o] + list(grads))), \
        dict(zip(["o"] + ["d" + n for n in names], [o64] + list(g64)))


def check_grads(ours, ref, label):
    exact = ours["o"].dtype == torch.float32          # float32 inputs (gates may be float32 anyway)
    for name, a in ours.items():
        a64, r = a.detach().to("cpu", torch.float64), ref[name].detach()
        if exact:
            err = (a64 - r).abs().max().item() / max(r.abs().max().item(), 1.0)
            tol = 1e-5 if name == "o" else 2e-5
        else:
            err, tol = err_ratio(a64, r), RMS_TOL[name]
        print(f"{'✓' if err <= tol else '✗'} {label} {name}: {err:.2e} (tol {tol:g})")
        assert err <= tol, f"{label} {name}: {err:.3e} > {tol:g}"


def log_gates(B, T, H, device, *, low=-3.0, dtype=torch.float32, seed=0):
    """Log forget gates in [low, 0): logsigmoid of N(1, 2), clipped below at ``low``."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.nn.functional.logsigmoid(1 + 2 * torch.randn(B, T, H, generator=gen)).clamp(min=low)
    return g.to(dtype).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("T,K,V", [(1, 16, 16), (67, 32, 16), (130, 16, 32)])
def test_backward_float32_odd_shapes(device, causal, T, K, V):
    """dq, dk, dv of flash_attention (any T, V != K, causal or not) against float64 autograd."""
    gen = torch.Generator().manual_seed(T + K)
    q, k = (torch.randn(2, T, 2, K, generator=gen).to(device) for _ in range(2))
    v = torch.randn(2, T, 2, V, generator=gen).to(device)
    ours, ref = grads_and_reference(q, k, v, causal=causal, scale=0.3, seed=T)
    check_grads(ours, ref, f"flash T={T} K={K} V={V} causal={causal}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T,low", [(1, -3.0), (67, -3.0), (100, -60.0)])
def test_forgetting_float32(device, T, low):
    """FoX forward and backward (dq, dk, dv, dg) against float64 autograd; ``low = -60``: gates near 0
    (a product of 60 of them is e^-3600, far below float64's range: only differences of G survive)."""
    gen = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(1, T, 3, 32, generator=gen).to(device) for _ in range(3))
    g = log_gates(1, T, 3, device, low=low, seed=T)
    if low < -30:
        g[:, T // 2:] = low                        # the second half forgets almost everything
    ours, ref = grads_and_reference(q, k, v, g, seed=T)
    assert torch.isfinite(ours["o"]).all() and torch.isfinite(ours["dg"]).all()
    check_grads(ours, ref, f"FoX T={T} low={low}")


@pytest.mark.parametrize("device", DEVICES)
def test_alibi_is_constant_gate_forgetting(device):
    """ALiBi (bias -m (i - j) per head) is FoX with the constant log gate g = -m: the same kernel
    call reproduces softmax attention with ALiBi's bias written out as a T x T matrix."""
    B, T, H, D = 1, 50, 4, 16
    q, k, v = rand_qkv(B, T, H, D, torch.float32, device, seed=9)
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / H) for h in range(H)])
    g = (-slopes).expand(B, T, H).contiguous().to(device)
    o = kernels.parallel_forgetting_attn(q, k, v, g, backend="triton")
    i = torch.arange(T, dtype=torch.float64)
    bias = -slopes.double()[:, None, None] * (i[:, None] - i[None, :])           # [H, T, T]
    s = torch.einsum("bthd,bshd->bhts", q.double().cpu(), k.double().cpu()) * D ** -0.5 + bias
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    ref = torch.einsum("bhts,bshd->bthd", torch.softmax(s, -1), v.double().cpu())
    lc.check_close("ALiBi = FoX with constant gates", o.double().cpu().numpy(), ref.numpy(), 1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_backward_half_precisions(device, dtype):
    """16-bit inputs (float32 or input-dtype gates) within fla's RMS ratios (RMS_TOL)."""
    q, k, v = rand_qkv(1, 70, 2, 32, dtype, device, seed=4)
    ours, ref = grads_and_reference(q, k, v, seed=1)
    check_grads(ours, ref, f"flash {dtype}")
    for gdt in (torch.float32, dtype):
        ours, ref = grads_and_reference(q, k, v, log_gates(1, 70, 2, device, dtype=gdt), seed=2)
        check_grads(ours, ref, f"FoX {dtype}, gates {gdt}")


@pytest.mark.parametrize("device", DEVICES)
def test_backward_memory_is_linear_in_T(device):
    """No T x T tensor: the op's autograd graph saves q, k, v, o, the log-sum-exp (and G), nothing
    that grows like T^2 (checked on what the graph holds, which is what a training step keeps)."""
    T = 300
    q, k, v = (x.requires_grad_(True) for x in rand_qkv(1, T, 2, 16, torch.float32, device))
    g = log_gates(1, T, 2, device).requires_grad_(True)
    for o in (kernels.flash_attention(q, k, v, backend="triton"),
              kernels.parallel_forgetting_attn(q, k, v, g, backend="triton")):
        saved = [t for t in o.grad_fn.saved_tensors if t is not None]
        assert saved and max(t.numel() for t in saved) <= q.numel(), [t.shape for t in saved]


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs_raise(device):
    q, k, v = rand_qkv(1, 8, 2, 32, torch.float32, device)
    for D in (257, 512):        # over fla's largest head size; any size up to 256 runs (tests/kernels/test_common.py)
        x = torch.randn(1, 8, 2, D, device=device)
        with pytest.raises(ValueError, match="head size K .* between 1 and 256"):
            kernels.flash_attention(x, x, x, backend="triton")
    with pytest.raises(ValueError, match="head size V .* between 1 and 256"):
        kernels.flash_attention(q, k, torch.randn(1, 8, 2, 300, device=device), backend="triton")
    with pytest.raises(ValueError, match="k must have the shape of q"):
        kernels.flash_attention(q, k[:, :7], v, backend="triton")
    with pytest.raises(ValueError, match="v must have"):
        kernels.flash_attention(q, k, v[:, :, :1], backend="triton")
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        kernels.flash_attention(q.to(torch.int32), k, v, backend="triton")
    with pytest.raises(ValueError, match="share one dtype"):
        kernels.flash_attention(q, k.half(), v, backend="triton")
    with pytest.raises(ValueError, match="causal"):
        kernels.flash_attention(q, k, v, causal=1, backend="triton")
    g = torch.zeros(1, 8, 2, device=device)
    with pytest.raises(ValueError, match=r"g must have shape \[1, 8, 2\]"):
        kernels.parallel_forgetting_attn(q, k, v, g[:, :7])
    with pytest.raises(ValueError, match="log decays"):     # value checks run on every device
        kernels.parallel_forgetting_attn(q, k, v, g + 0.5)


GPU_SHAPES = [(2, 1000, 4, 128, torch.bfloat16), (1, 4097, 3, 128, torch.float16),
              (3, 1023, 2, 64, torch.bfloat16), (1, 4097, 2, 32, torch.float32),
              (2, 2048, 5, 16, torch.float16), (4, 257, 8, 128, torch.float32)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled Triton needs a CUDA device")
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("B,T,H,D,dtype", GPU_SHAPES)
def test_gpu_large_shapes(B, T, H, D, dtype, causal):
    q, k, v = rand_qkv(B, T, H, D, dtype, "cuda", seed=T + D)
    o = kernels.flash_attention(q, k, v, causal=causal, backend="triton")
    ref = attention_ref(q.double(), k.double(), v.double(), D ** -0.5, causal)
    # tolerance: see the module docstring; the float64 oracle is kernels.reference on the GPU.
    lc.check_close(f"flash GPU {(B, T, H, D)} {dtype} causal={causal}", o.double().cpu().numpy(),
                   ref.cpu().numpy(), TOL[dtype])


GPU_BWD_SHAPES = [(2, 1000, 4, 128, 128, torch.bfloat16, None), (1, 4097, 3, 128, 64, torch.float16, None),
                  (2, 2048, 4, 128, 128, torch.bfloat16, torch.float32),
                  (1, 1027, 2, 64, 128, torch.bfloat16, torch.bfloat16),
                  (1, 517, 2, 128, 128, torch.float32, torch.float32),
                  (1, 4097, 2, 64, 64, torch.float32, torch.float32)]     # |G| reaches ~5000 here


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled Triton needs a CUDA device")
@pytest.mark.parametrize("B,T,H,K,V,dtype,gates", GPU_BWD_SHAPES)
def test_gpu_backward_large_shapes(B, T, H, K, V, dtype, gates):
    """The production backward plans on the GPU (``gates``: FoX with log gates of that dtype)."""
    gen = torch.Generator().manual_seed(T)
    q, k = (torch.randn(B, T, H, K, generator=gen).to(dtype).cuda() for _ in range(2))
    v = torch.randn(B, T, H, V, generator=gen).to(dtype).cuda()
    g = None if gates is None else log_gates(B, T, H, "cuda", dtype=gates, seed=T)
    ours, ref = grads_and_reference(q, k, v, g, seed=T)
    check_grads(ours, ref, f"GPU {(B, T, H, K, V)} {dtype} gates={gates}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("cfg", [(32, 16, 4, 1, True), (16, 16, 4, 1, False), (64, 64, 4, 2, True)])
def test_other_tilings_and_launch_orders(device, causal, cfg, monkeypatch):
    """Other (BLOCK_M, BLOCK_N) tilings and both program orders give the same, correct result.

    The op's own choice is one tiling per platform; the autotuner on a GPU may pick any of its list,
    so each tiling family and both HEADS_INNER orders are checked here through the same launch code.
    """
    from kernels.flash import op
    from kernels.flash.plan import FlashPlan
    bm, bn, warps, stages, heads_inner = cfg
    monkeypatch.setattr(op, "plan_for", lambda *a, **kw: FlashPlan("tiles", bm, bn, warps, stages, heads_inner))
    # (D = 32 below: never autotuned, never the short/TMA plan, so the patched tiling is launched)
    q, k, v = rand_qkv(2, 70, 3, 32, torch.float32, device, seed=11)
    run_and_check(q, k, v, causal, name=f"tiling {cfg}")


# --- the launch plan (kernels.flash.plan.plan_for) ------------------------------------------------
def test_launch_plan_choices():
    """The GPU-side choice per input (decided with interpret=False and the GPU class given, so it is
    checked on a CPU): Hopper's measured plans, and one fixed tiling per dtype on the other classes."""
    from kernels.backend import GPU_CLASSES, HOPPER
    from kernels.flash.plan import AMPERE, TURING, FlashPlan, _tma_compatible, plan_for, tma_compatible

    def plan(B, T, H, D, dtype, causal=True, heads_packed=True, caps=HOPPER):
        shape = (B, T, H, D) if heads_packed else (B, H, T, D)
        x = torch.empty(shape, dtype=dtype)
        x = x if heads_packed else x.transpose(1, 2)          # [B, T, H, D] view, stride(2) = T·D
        return plan_for(dtype, x.device, B=B, T=T, H=H, K=D, V=D, causal=causal, tma=tma_compatible(x, x, x),
                        caps=caps, interpret=False)

    short, tma, auto = FlashPlan("tiles", 64, 64, 4, 3), FlashPlan("tma", 128, 128, 8, 3), FlashPlan("autotune")
    bf, fp = torch.bfloat16, torch.float16
    assert plan(2, 1024, 2, 128, bf) == short
    assert plan(1, 2048, 2, 128, fp) == short
    assert plan(1, 2049, 2, 128, bf) == auto                             # ragged tail: no TMA
    assert plan(1, 2176, 2, 128, bf) == tma                              # 17 whole 128-row tiles
    assert plan(1, 4096, 2, 128, fp) == tma
    assert plan(1, 4096, 2, 128, bf, heads_packed=False) == auto         # TMA needs packed heads
    assert plan(1, 4096, 2, 128, bf, causal=False) == auto               # not in the sweep
    assert plan(1, 4096, 2, 64, bf) == auto
    assert plan(1, 4096, 2, 128, torch.float32) == FlashPlan("tiles", 32, 16, 8, 2)
    assert plan_for(bf, "cpu", B=1, T=4096, H=2, K=128, V=128, causal=True, tma=True, interpret=True).kind == "tiles"
    # TMA only when the caller vouches for the tensors' layout (the ops pass tma_compatible(q, k, v))
    assert plan_for(bf, "cpu", B=1, T=4096, H=2, K=128, V=128, causal=True, interpret=False, caps=HOPPER) == auto
    # other classes: no TMA, no autotuning, one tiling per dtype (not measured there)
    for arch in (80, 89):
        caps = GPU_CLASSES[arch]
        for T, D, dt in ((4096, 128, fp), (1024, 128, bf), (100, 16, bf), (4096, 64, fp)):
            assert plan(1, T, 2, D, dt, caps=caps) == FlashPlan("tiles", *AMPERE)
        assert plan(1, 4096, 2, 128, torch.float32, caps=caps) == FlashPlan("tiles", 32, 16, 8, 2)
        assert plan(1, 4096, 2, 64, torch.float32, caps=caps) == FlashPlan("tiles", 64, 32, 8, 2)
    for T, D, dt in ((4096, 128, fp), (100, 16, torch.float32), (2048, 64, fp)):
        assert plan(1, T, 2, D, dt, caps=GPU_CLASSES[75]) == FlashPlan("tiles", *TURING)
    # a view of the first 2 of 5 packed heads qualifies (rows 5·128·2 B apart); padded heads
    # (stride(2) = 130 != D) do not
    x = torch.empty(1, 8, 5, 128, dtype=bf)[:, :, :2]
    assert _tma_compatible(x) and not _tma_compatible(torch.empty(1, 8, 2, 130, dtype=bf)[..., :128])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T,kind", [(100, "short"), (384, "tma")])
def test_production_plans_are_correct(device, T, kind, monkeypatch):
    """The production GPU configurations (short tiling; TMA, BLOCK_N = 128) run through
    flash_attention with the plan the GPU would choose (SHORT_T_MAX lowered to 128 so that a
    small T reaches the TMA path; ragged lengths take the pointer path, tested above)."""
    from kernels.backend import HOPPER
    from kernels.flash import op, plan
    seen = []

    def gpu_plan(dtype, device, **kw):
        out = plan.plan_for(dtype, device, **{**kw, "interpret": False, "caps": HOPPER})
        seen.append(out.kind if out.kind == "tma" else "short")
        return out
    monkeypatch.setattr(plan, "SHORT_T_MAX", 128)
    monkeypatch.setattr(op, "plan_for", gpu_plan)
    q, k, v = rand_qkv(1, T, 2, 128, torch.bfloat16, device, seed=T)
    run_and_check(q, k, v, True, name=f"production {kind}")
    assert seen == [kind]
