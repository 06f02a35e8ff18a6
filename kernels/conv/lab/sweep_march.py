"""Lab: the marching forward against the tiled one, on a GPU (the sweep that chose ``plan.fwd_march``).

    python3 -m kernels.conv.lab.sweep_march [--write]

bfloat16, SiLU, W = 4, no bias (the benchmark's setting) at the benchmark's two widths, B · T =
65,536: the tiled forward (``march=False``), fla's Triton ``causal_conv1d`` when importable, a copy
of ``x`` (the yardstick), and the marching forward over segment lengths, channel blocks and warps
(plan overrides). Each configuration's median in ms (``kernels.harness.bench_ms``), its fraction of
the copy's bandwidth, and its largest difference from the tiled forward's output (the two must
agree to bf16 rounding). ``--write`` keeps the table in ``kernels/conv/lab/logs/sweep_march.json``.

The kept run (H200, 2026-11-25) was made when the marching kernel lived in this folder: its rows
named ``shipped`` are the tiled forward, then the shipped one.
"""
from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path

SHAPES = [(32, 2048, 2048), (8, 8192, 4096)]          # (B, T, D)
W = 4
MARCH = [(seg, bd, wp) for seg, bd, wp in itertools.product((16, 32, 64, 128, 256), (256, 512, 1024), (2, 4, 8))]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from kernels.harness import pure_triton_fla
    pure_triton_fla()     # before fla is imported
    import torch
    from kernels.backend import Launch
    from kernels.conv.forward import conv_forward
    from kernels.conv.plan import plan_for
    from kernels.harness import bench_ms
    from kernels.results import environment
    try:
        from fla.modules.causal_conv1d import causal_conv1d as fla_conv
    except Exception as e:  # noqa: BLE001 - reported
        fla_conv = None
        print(f"fla: not run ({type(e).__name__}: {e})")
    rows, t0 = [], time.time()
    for B, T, D in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(D)
        x = torch.randn(B, T, D, device="cuda", generator=gen).to(torch.bfloat16)
        w = ((torch.rand(D, W, device="cuda", generator=gen) * 2 - 1) / W ** 0.5).to(torch.bfloat16)
        plan = plan_for(x.dtype, x.device, T=T, D=D, W=W, march=False)
        copy_ms = bench_ms(lambda: x.clone())
        want = conv_forward(x, w, None, None, None, "silu", plan)

        def add(name, ms, out=None, **kw):
            diff = None if out is None else (out.float() - want.float()).abs().max().item()
            rows.append(dict(B=B, T=T, D=D, variant=name, ms=ms, copy_fraction=copy_ms / ms, max_diff=diff, **kw))
            print(f"B={B} T={T} D={D} {name:28s} {ms:.4f} ms  {copy_ms / ms:.3f} of copy"
                  + ("" if diff is None else f"  max diff {diff:.2e}"), flush=True)
        add("copy", copy_ms)
        add("tiled", bench_ms(lambda: conv_forward(x, w, None, None, None, "silu", plan)))
        if fla_conv is not None:
            add("fla", bench_ms(lambda: fla_conv(x, w, activation="silu", backend="triton")[0]),
                fla_conv(x, w, activation="silu", backend="triton")[0])

        def make_run(seg, bd, wp):
            mp = plan_for(x.dtype, x.device, T=T, D=D, W=W, march_seg=seg, march_bd=bd, fwd_march=(Launch(wp, 1),))
            return lambda: conv_forward(x, w, None, None, None, "silu", mp)
        sweep_configs(rows, add, (B, T, D), MARCH, make_run)
    print(f"{time.time() - t0:.0f} s")
    if "--write" in argv:
        write_log(rows, "sweep_march.json", environment())
    return 0


def sweep_configs(rows, add, shape, configs, make_run):
    """Time ``make_run(seg, bd, warps)`` for every configuration of ``configs`` that fits the shape's
    width, report each through ``add`` (or record its failure in ``rows``), then print the fastest."""
    B, T, D = shape
    for seg, bd, wp in configs:
        if bd > D:
            continue
        timed = time_config(rows, dict(B=B, T=T, D=D, seg=seg, bd=bd, warps=wp), make_run(seg, bd, wp))
        if timed:
            add(f"march seg={seg} bd={bd} warps={wp}", timed[1], timed[0], seg=seg, bd=bd, warps=wp)
    print_best(rows, B, T, D)


def time_config(rows, case: dict, run):
    """``(output, median ms)`` of one marching configuration, or ``None`` after recording in ``rows``
    why it failed (a configuration that does not compile is a result too)."""
    from kernels.harness import bench_ms
    try:
        return run(), bench_ms(run)
    except Exception as e:  # noqa: BLE001 - recorded
        rows.append(dict(case, variant="march", ms=None, note=f"{type(e).__name__}: {e}"[:200]))
        return None


def print_best(rows, B, T, D):
    """Print the fastest marching row of one shape."""
    best = min((r for r in rows if (r["B"], r["T"], r["D"]) == (B, T, D) and r["variant"].startswith("march")
                and r["ms"]), key=lambda r: r["ms"])
    print(f"best marching: {best['variant']} {best['ms']:.4f} ms, {best['copy_fraction']:.3f} of copy", flush=True)


def write_log(rows, name, env, out=None):
    """Keep the table in ``lab/logs/<name>`` (or at ``out``) with the environment and the width."""
    out = Path(out) if out is not None else Path(__file__).resolve().parent / "logs" / name
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"env": env, "W": W, "rows": rows}, indent=1) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    sys.exit(main())
