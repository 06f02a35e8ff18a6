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
import json
import os
import subprocess
import sys
from pathlib import Path

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


def test_compiles_for_hopper_without_spills():
    """The GPU compiler (sm_90, what an H100/H200 runs) accepts the kernel; no register spills.

    Runs ``tests/aot_compile_flash.py --quick`` in a fresh process (the interpreter must be off to
    compile). 16-bit configurations must use Hopper tensor cores (``wgmma``), fit the 227 KiB of
    shared memory per block, and not spill registers beyond a couple of words (the BN = 128
    configurations sit at the 255-register limit and spill 8 bytes; a real spill of the
    accumulator or score tile would be hundreds of bytes and cost speed).
    """
    triton = pytest.importorskip("triton")
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        pytest.skip("this triton build has no NVIDIA backend tools (ptxas/cuobjdump)")
    script = Path(__file__).resolve().parent / "aot_compile_flash.py"
    env = dict(os.environ, TRITON_INTERPRET="0")
    res = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True,
                         env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert len(rows) >= 6
    for r in rows:
        assert "error" not in r, r
        assert r["shared"] <= 227 * 1024, r
        if r["dtype"] != "fp32":
            assert r["wgmma"] and r["stack"] <= 16, r
    # the production choices for causal bf16 D = 128 are among them: short tiling and TMA (no spill)
    import kernels.triton_flash as tf
    assert any(r.get("config") == list(tf.SHORT_CONFIG) and r["dtype"] == "bf16" and r["causal"] for r in rows)
    tma = [r for r in rows if r.get("variant") == "production_tma"]
    assert len(tma) == 1 and tma[0]["tma"] and tma[0]["stack"] == 0, tma


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("cfg", [(32, 16, 4, 1, True), (16, 16, 4, 1, False), (64, 64, 4, 2, True)])
def test_other_tilings_and_launch_orders(device, causal, cfg, monkeypatch):
    """Other (BLOCK_M, BLOCK_N) tilings and both program orders give the same, correct result.

    The op's own choice is one tiling per platform; the autotuner on a GPU may pick any of its list,
    so each tiling family and both HEADS_INNER orders are checked here through the same launch code.
    """
    import kernels.triton_flash as tf
    monkeypatch.setattr(tf, "_fixed_config", lambda T, D, dtype: cfg)
    # (D = 32 below: never autotuned, never the short/TMA plan, so the patched tiling is launched)
    q, k, v = rand_qkv(2, 70, 3, 32, torch.float32, device, seed=11)
    run_and_check(q, k, v, causal, name=f"tiling {cfg}")


# --- the production launch plan (kernels.triton_flash._launch_plan) ----------------------------------
def test_launch_plan_choices():
    """The GPU-side choice per input (decided with interpret=False, so it is checked on a CPU)."""
    import kernels.triton_flash as tf

    def plan(B, T, H, D, dtype, causal=True, heads_packed=True):
        shape = (B, T, H, D) if heads_packed else (B, H, T, D)
        x = torch.empty(shape, dtype=dtype)
        x = x if heads_packed else x.transpose(1, 2)          # [B, T, H, D] view, stride(2) = T·D
        return tf._launch_plan(x, x, x, causal, interpret=False)[0]

    bf, fp = torch.bfloat16, torch.float16
    assert plan(2, 1024, 2, 128, bf) == "short"
    assert plan(1, 2048, 2, 128, fp) == "short"
    assert plan(1, 2049, 2, 128, bf) == "autotune"                       # ragged tail: no TMA
    assert plan(1, 2176, 2, 128, bf) == "tma"                            # 17 whole 128-row tiles
    assert plan(1, 4096, 2, 128, fp) == "tma"
    assert plan(1, 4096, 2, 128, bf, heads_packed=False) == "autotune"   # TMA needs packed heads
    assert plan(1, 4096, 2, 128, bf, causal=False) == "autotune"         # not in the sweep
    assert plan(1, 4096, 2, 64, bf) == "autotune"
    assert plan(1, 4096, 2, 128, torch.float32) == "fixed"
    assert tf._launch_plan(*(torch.empty(1, 4096, 2, 128, dtype=bf),) * 3, True, interpret=True)[0] == "fixed"
    # a view of the first 2 of 5 packed heads qualifies (rows 5·128·2 B apart); padded heads
    # (stride(2) = 130 != D) do not
    x = torch.empty(1, 8, 5, 128, dtype=bf)[:, :, :2]
    assert tf._tma_compatible(x) and not tf._tma_compatible(torch.empty(1, 8, 2, 130, dtype=bf)[..., :128])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T,kind", [(100, "short"), (384, "tma")])
def test_production_plans_are_correct(device, T, kind, monkeypatch):
    """The production GPU configurations (short tiling; TMA, BLOCK_N = 128) run through
    flash_attention with the plan the GPU would choose (SHORT_T_MAX lowered to 128 so that a
    small T reaches the TMA path; ragged lengths take the pointer path, tested above)."""
    import kernels.triton_flash as tf
    orig = tf._launch_plan
    seen = []

    def gpu_plan(q, k, v, causal, interpret=False):
        out = orig(q, k, v, causal, interpret=False)
        seen.append(out[0])
        return out
    monkeypatch.setattr(tf, "SHORT_T_MAX", 128)
    monkeypatch.setattr(tf, "_launch_plan", gpu_plan)
    q, k, v = rand_qkv(1, T, 2, 128, torch.bfloat16, device, seed=T)
    run_and_check(q, k, v, True, name=f"production {kind}")
    assert seen == [kind]


# --- exploration variants (kernels.triton_flash.flash_forward_variant) ------------------------------
# Every code path of the variant kernel at tiny shapes. In the interpreter: TMA descriptor loads and
# stores are emulated (with the same zero padding past T), warp_specialize / num_warps / num_stages /
# maxnreg have no effect, PERSISTENT runs a 4-program grid (so programs do walk several tiles).
VARIANT_CASES = [
    dict(),
    dict(HEADS_INNER=True),
    dict(DIAG_N=32),                                    # one masked BM x BM diagonal block
    dict(BLOCK_M=32, BLOCK_N=32, DIAG_N=16),            # the diagonal as two halves
    dict(LAZY_RESCALE=True),
    dict(TMA=True),
    dict(WARP_SPEC=True),
    dict(PERSISTENT=1),
    dict(PERSISTENT=1, HEADS_INNER=True, TMA=True, LAZY_RESCALE=True, DIAG_N=32),
    dict(BLOCK_M=16, BLOCK_N=16, maxnreg=128),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("var", VARIANT_CASES, ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()) or "default")
def test_explore_variants(device, causal, dtype, var):
    from kernels.triton_flash import flash_forward_variant
    # T = 70: two full 32-query blocks plus a 6-query tail, so every variant meets a partial block.
    q, k, v = rand_qkv(2, 70, 2, 32, dtype, device, seed=3)
    # scale 1/sqrt(D) (row maxima settle early) and 2.0 (maxima keep jumping by more than the lazy
    # threshold of 8 in log2 units, so the lazy rescale's skip and rescale branches both run). Scale
    # 2.0 only in float32: its near one-hot rows copy single v rows (|v| up to ~4.5 here), beyond the
    # |o| <~ 3 that the bf16 tolerance assumes; float32 checks the same logic at 1e-5.
    for scale in ((32 ** -0.5, 2.0) if dtype == torch.float32 else (32 ** -0.5,)):
        o = flash_forward_variant(q, k, v, scale, causal, **{"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4,
                                                             "num_stages": 2, **var})
        ref = reference64(q, k, v, scale, causal)
        # tolerance: see the module docstring (per dtype)
        lc.check_close(f"variant {var} scale={scale} {dtype} causal={causal}",
                       o.to("cpu", torch.float64).numpy(), ref, TOL[dtype])


def test_explore_variant_bad_inputs():
    from kernels.triton_flash import flash_forward_variant
    q, k, v = rand_qkv(1, 8, 2, 16, torch.float32, DEVICES[0])
    with pytest.raises(ValueError, match="unknown variant keys"):
        flash_forward_variant(q, k, v, 0.25, True, BLOCK_Q=32)
    with pytest.raises(ValueError, match="DIAG_N must divide BLOCK_M"):
        flash_forward_variant(q, k, v, 0.25, True, BLOCK_M=32, BLOCK_N=16, DIAG_N=64)
    with pytest.raises(ValueError, match="TMA needs q"):
        flash_forward_variant(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, 0.25, True, TMA=True)


def test_explore_variants_compile_for_hopper():
    """The new variant code paths (TMA descriptors, lazy rescale, persistent grid, split diagonal)
    compile for sm_90 and do what they claim: wgmma, TMA bulk copies only with TMA=True, shared
    memory within 227 KiB, no spill. (The whole sweep list: ``aot_compile_flash.py --explore``.)"""
    triton = pytest.importorskip("triton")
    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump").exists():
        pytest.skip("this triton build has no NVIDIA backend tools (ptxas/cuobjdump)")
    script = Path(__file__).resolve().parent / "aot_compile_flash.py"
    names = ["lazy_bn64", "tma_bn64", "tma_bn128_diag64", "pers1_tma_bn64"]
    res = subprocess.run([sys.executable, str(script), "--explore", *names], capture_output=True, text=True,
                         env=dict(os.environ, TRITON_INTERPRET="0"), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {r["variant"]: r for r in map(json.loads, (ln for ln in res.stdout.splitlines() if ln.startswith("{")))}
    assert sorted(rows) == sorted(names)
    for name, r in rows.items():
        assert "error" not in r, r
        assert r["wgmma"] and r["stack"] == 0 and r["shared"] <= 227 * 1024, r
        assert r["tma"] == name.startswith(("tma", "pers1_tma")), r
