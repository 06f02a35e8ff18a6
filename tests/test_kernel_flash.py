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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [True, False])
def test_gradients_match_torch_reference(device, causal):
    q, k, v = rand_qkv(1, 19, 2, 16, torch.float32, device, seed=3)
    do = torch.randn_like(v)
    grads = []
    for backend in ("triton", "torch"):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        o = kernels.flash_attention(*leaves, scale=0.4, causal=causal, backend=backend)
        (o * do).sum().backward()
        grads.append([x.grad for x in leaves])
    for name, a, b in zip("qkv", *grads):
        # The backward recomputes with the same float32 PyTorch code; only the incoming upstream
        # gradient is shared, so the gradients agree to float32 round-off (~1e-6 at these sizes).
        lc.check_close(f"d{name} (causal={causal})", a.cpu().numpy(), b.cpu().numpy(), 1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs_raise(device):
    q, k, v = rand_qkv(1, 8, 2, 32, torch.float32, device)
    for D in (48, 256):
        x = torch.randn(1, 8, 2, D, device=device)
        with pytest.raises(ValueError, match="head size"):
            kernels.flash_attention(x, x, x, backend="triton")
    with pytest.raises(ValueError, match="k must have the shape of q"):
        kernels.flash_attention(q, k[:, :7], v, backend="triton")
    with pytest.raises(ValueError, match="v must have"):
        kernels.flash_attention(q, k, v[:, :, :1], backend="triton")
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        kernels.flash_attention(q.to(torch.int32), k, v, backend="triton")
    with pytest.raises(ValueError, match="share one dtype"):
        kernels.flash_attention(q, k.half(), v, backend="triton")


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
    from kernels.flash.plan import AMPERE, TURING, FlashPlan, _tma_compatible, plan_for

    def plan(B, T, H, D, dtype, causal=True, heads_packed=True, caps=HOPPER):
        shape = (B, T, H, D) if heads_packed else (B, H, T, D)
        x = torch.empty(shape, dtype=dtype)
        x = x if heads_packed else x.transpose(1, 2)          # [B, T, H, D] view, stride(2) = T·D
        return plan_for(x, x, x, causal, interpret=False, caps=caps)

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
    assert plan_for(*(torch.empty(1, 4096, 2, 128, dtype=bf),) * 3, True, interpret=True).kind == "tiles"
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

    def gpu_plan(q, k, v, causal, **kw):
        out = plan.plan_for(q, k, v, causal, interpret=False, caps=HOPPER)
        seen.append(out.kind if out.kind == "tma" else "short")
        return out
    monkeypatch.setattr(plan, "SHORT_T_MAX", 128)
    monkeypatch.setattr(op, "plan_for", gpu_plan)
    q, k, v = rand_qkv(1, T, 2, 128, torch.bfloat16, device, seed=T)
    run_and_check(q, k, v, True, name=f"production {kind}")
    assert seen == [kind]
