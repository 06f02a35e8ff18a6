"""One GPU call, many variants: time explicit configurations of the flash-attention forward.

    python -m kernels.benchmarks.explore_flash                 # all variants, T in {1024, 4096, 16384}
    python -m kernels.benchmarks.explore_flash base_bn64 tma_bn64   # only these variants
    OUT=/some/dir BUDGET_S=200 python -m kernels.benchmarks.explore_flash

Shapes: bf16, H = 16, D = 128, B = 65536 // T, causal, forward only (the ``bench_flash`` shapes).
Each variant of :func:`kernels.triton_flash.flash_forward_variant` (autotuning bypassed) is compiled,
checked against SDPA's output (max abs error; bf16 outputs of two correct kernels differ by a few
bf16 ulps, so > ``TOL`` or any non-finite value is a failure), and timed with ``harness.bench_ms``.
A compile or launch error is recorded and the sweep continues. Risky variants (TMA, warp
specialisation, persistent grids) come last, and the JSON is rewritten after every variant, so a
fatal CUDA error still leaves the earlier rows. Results: ``$OUT/explore_flash.json`` (``OUT``
defaults to /tmp; these are exploration numbers, not the book's ``kernels/results``). The table is
printed last. ``BUDGET_S`` (default 200) stops starting new variants once exceeded.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from . import harness

H, D, TOKENS = 16, 128, 65536
TS = [1024, 4096, 16384]
# Max |o - o_sdpa| bound: |o| <~ 4, both outputs rounded to bf16 (half an ulp at 4 is 2^-7 ~ 7.8e-3
# each) plus p rounded to bf16 before P·V in both kernels; a wrong mask or tile gives O(1) errors.
TOL = 3e-2
DEVICE = "cuda"   # module-level so a CPU smoke run (interpreter, tiny shapes) can reuse the code path


def V(**kw):
    return kw


# (name, variant): the round-1 production winners first (autotune picked 128x64 for T <= 4096, 128x128
# for T >= 8192; 8 warps, 3 stages, blocks-inner order), then tile/pipeline sweeps, then new code paths.
# Round-2 results: kernels/results/logs/explore_flash.json; since then production uses
# bm64_bn64_w4_s3 for T <= 2048 and tma_bn128 above (triton_flash._launch_plan, NOTES_flash.md).
VARIANTS = [
    ("base_bn64", V(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)),
    ("base_bn128", V(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)),
    # (c) pipeline depth / tiles / warps / launch order
    ("bn64_s2", V(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2)),
    ("bn64_s4", V(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=4)),
    ("bn64_s5", V(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=5)),
    ("bn128_s2", V(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2)),
    ("bn32_s4", V(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=4)),
    ("bm64_bn64_w4_s3", V(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)),
    ("bm64_bn64_w4_s4", V(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=4)),
    ("hi_bn64", V(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, HEADS_INNER=True)),
    # (d) register cap (168 regs x 256 threads: still one CTA per SM by registers, fewer live values)
    ("bn64_maxnreg168", V(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, maxnreg=168)),
    # (g) causal diagonal: one masked BM x BM block vs two BM/2 halves
    ("bn64_diag128", V(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, DIAG_N=128)),
    ("bn128_diag64", V(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3, DIAG_N=64)),
    # (e) FA4-style lazy rescale
    ("lazy_bn64", V(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, LAZY_RESCALE=True)),
    ("lazy_bn128", V(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3, LAZY_RESCALE=True)),
    # (a) TMA loads/stores through device-side tensor descriptors (sm_90 AOT: 139 / 204 registers
    # for BN 64 / 128 instead of 196 / 255 + spill)
    ("tma_bn64", V(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, TMA=True)),
    ("tma_bn64_s4", V(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=4, TMA=True)),
    ("tma_bn128", V(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3, TMA=True)),
    ("tma_bn128_s2", V(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2, TMA=True)),
    ("tma_bn128_diag64", V(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3, TMA=True, DIAG_N=64)),
    ("tma_lazy_bn64", V(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, TMA=True, LAZY_RESCALE=True)),
    ("tma_lazy_bn128", V(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3, TMA=True, LAZY_RESCALE=True)),
    # (f) persistent grid (one program per SM), tiles longest-first (heads inner: whole grid in LPT order)
    ("pers1_bn64", V(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, PERSISTENT=1, HEADS_INNER=True)),
    ("pers1_tma_bn64", V(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, PERSISTENT=1, HEADS_INNER=True,
                         TMA=True)),
    ("pers1_tma_bn128_s2", V(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2, PERSISTENT=1,
                             HEADS_INNER=True, TMA=True)),
]

# (b) Warp specialisation, run only by name (not in the default sweep). Triton 3.6 on sm_90 (AOT
# compile, tests/aot_compile_flash.py --explore): with 8 warps `warp_specialize=True` compiles to the
# same code as without (no partitions, no setmaxnreg); with 4 warps the Hopper pass
# NVGPUWarpSpecialization fails (MLIR dominance assertion) for every tile tried.
EXTRA_VARIANTS = [
    ("ws_bn64", V(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, WARP_SPEC=True)),
    ("ws_tma_bn128", V(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3, WARP_SPEC=True, TMA=True)),
    ("ws_tma_bn64_w4", V(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=2, WARP_SPEC=True, TMA=True)),
]


def causal_flops(B, T):
    return 4.0 * B * H * D * T * (T + 1) / 2


def _short(e: BaseException) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"[:240]


def table(rows, sdpa) -> str:
    head = f"{'variant':<22}" + "".join(f" | T={T:<5}  ms  /sdpa" for T in TS) + " | max_err  status"
    out = [head, "-" * len(head)]
    out.append(f"{'sdpa (default)':<22}" + "".join(
        f" | {sdpa[T]['ms']:12.3f} {1.0:5.2f}" if sdpa.get(T, {}).get("ms") else " | " + " " * 18 for T in TS))
    for name, _ in VARIANTS + EXTRA_VARIANTS:
        recs = {r["T"]: r for r in rows if r["variant"] == name}
        if not recs:
            continue
        cells, errs, status = "", [], set()
        for T in TS:
            r = recs.get(T)
            if r and r.get("ms"):
                cells += f" | {r['ms']:12.3f} {r['ratio']:5.2f}"
            else:
                cells += f" | {'-':>12} {'-':>5}"
            if r:
                if r.get("max_abs_err") is not None:
                    errs.append(r["max_abs_err"])
                status.add(r["status"])
        mx = f"{max(errs):.1e}" if errs else "-"
        out.append(f"{name:<22}{cells} | {mx:>7}  {','.join(sorted(status))}")
    for T in TS:
        ok = [r for r in rows if r["T"] == T and r.get("ms")]
        if ok:
            b = min(ok, key=lambda r: r["ms"])
            out.append(f"best T={T}: {b['variant']} {b['ms']:.3f} ms, x{b['ratio']:.2f} of sdpa, "
                       f"{b['tflops']:.0f} TFLOP/s (sdpa {sdpa[T]['tflops']:.0f})")
    return "\n".join(out)


def main(argv):
    from kernels.triton_flash import flash_forward_variant
    only = [a for a in argv if not a.startswith("-")]
    variants = [(n, v) for n, v in VARIANTS + EXTRA_VARIANTS if n in only] if only else list(VARIANTS)
    out_dir = Path(os.environ.get("OUT", "/tmp"))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "explore_flash.json"
    budget = float(os.environ.get("BUDGET_S", "200"))
    t0 = time.time()
    env = harness.environment()
    F = torch.nn.functional
    dtype = torch.bfloat16
    scale = D ** -0.5

    data, sdpa, rows = {}, {}, []
    for T in TS:
        B = TOKENS // T
        g = torch.Generator(device=DEVICE).manual_seed(T)
        q, k, v = (torch.randn(B, T, H, D, device=DEVICE, dtype=dtype, generator=g) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        with torch.no_grad():
            ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale).transpose(1, 2)
            ms = harness.bench_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale))
        data[T] = (B, q, k, v, ref)
        sdpa[T] = dict(ms=ms, tflops=causal_flops(B, T) / (ms * 1e-3) / 1e12)
        print(f"sdpa T={T}: {ms:.3f} ms", flush=True)

    def dump(extra=None):
        payload = dict(name="explore_flash", env=env, config=dict(H=H, D=D, tokens=TOKENS, dtype="bfloat16",
                                                                   causal=True, Ts=TS, tol=TOL),
                       sdpa={str(T): s for T, s in sdpa.items()}, records=rows, **(extra or {}))
        path.write_text(json.dumps(payload, indent=1))

    skipped = []
    for name, var in variants:
        if time.time() - t0 > budget:
            skipped.append(name)
            continue
        tv = time.time()
        for T in TS:
            B, q, k, v, ref = data[T]
            rec = dict(variant=name, T=T, B=B, cfg=var, ms=None, ratio=None, tflops=None, max_abs_err=None)
            try:
                with torch.no_grad():
                    o = flash_forward_variant(q, k, v, scale, True, **var)
                    if DEVICE == "cuda":
                        torch.cuda.synchronize()
                    err = (o.float() - ref.float()).abs().max().item()
                    rec["max_abs_err"] = err
                    if not (err <= TOL):           # also catches NaN
                        rec["status"] = "WRONG"
                    else:
                        ms = harness.bench_ms(lambda: flash_forward_variant(q, k, v, scale, True, **var))
                        rec.update(ms=ms, ratio=ms / sdpa[T]["ms"],
                                   tflops=causal_flops(B, T) / (ms * 1e-3) / 1e12, status="ok")
                    del o
            except Exception as e:  # noqa: BLE001 - compile/launch errors are results here
                rec["status"] = "ERROR"
                rec["error"] = _short(e)
            rows.append(rec)
            line = f"{name:<22} T={T:<6}" + (f"{rec['ms']:8.3f} ms  x{rec['ratio']:.2f}" if rec["ms"] else
                                               f" {rec['status']} {rec.get('error', rec.get('max_abs_err'))}")
            print(line, flush=True)
            if rec["status"] == "ERROR":
                break                                  # same error at every T: do not recompile
        dump(dict(skipped=skipped))
        print(f"  ({name}: {time.time() - tv:.1f} s)", flush=True)
    dump(dict(skipped=skipped, wall_s=time.time() - t0))
    print(f"\nwrote {path}; wall {time.time() - t0:.0f} s; skipped (budget): {skipped or 'none'}")
    print(f"device: {env.get('device')}  torch {env.get('torch')}  triton {env.get('triton')}\n")
    print(table(rows, sdpa), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
