"""Lab: time ``chunk_gla`` under other launch plans (a tuning aid, not the benchmark of record).

    python -m kernels.gla.lab.sweep [--shapes 32x2048,1x32768] [--fwdbwd] \
        [--plan '{"BK_p": 64, "warps_p": 8}' ...]

For every shape, gate dtype (float32 and bfloat16 log gates, bf16 q, k, v, H = 16, K = V = 128)
and plan override (the measured plan first), the median forward time, optionally forward +
backward, the device time of every kernel (torch.profiler) and the RMS difference of the output
from the measured plan's. Writes ``$OUT/sweep_gla.json`` (or /tmp). The plan is data
(:func:`kernels.gla.plan.plan_for`), so a variant here is a dict of fields, never a code path.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from kernels.harness import kernel_times

H, K, V = 16, 128, 128


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="32x2048,1x32768", help="BxT,... (default 32x2048,1x32768)")
    p.add_argument("--plan", action="append", default=[], help="a JSON dict of plan overrides (repeatable)")
    p.add_argument("--fwdbwd", action="store_true", help="also time forward + backward")
    p.add_argument("--op", default="gla", choices=("gla", "simple_gla"))
    args = p.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from kernels.gla.op import chunk_gla_triton
    from kernels.harness import bench_ms, err_ratio
    from kernels.results import environment
    plans = [{}] + [json.loads(x) for x in args.plan]
    rows, t0 = [], time.perf_counter()
    for shape in args.shapes.split(","):
        B, T = map(int, shape.split("x"))
        gen = torch.Generator(device="cuda").manual_seed(B + T)
        q, k, v = (torch.randn(B, T, H, d, device="cuda", dtype=torch.bfloat16, generator=gen) for d in (K, K, V))
        gshape = (B, T, H, K) if args.op == "gla" else (B, T, H)
        g32 = F.logsigmoid(torch.randn(*gshape, device="cuda", generator=gen))
        for gname, g in (("float32", g32), ("bfloat16", g32.to(torch.bfloat16))):
            base = None
            for over in plans:
                fn = lambda: chunk_gla_triton(q, k, v, g, K ** -0.5, plan=over)[0]   # noqa: E731
                row = dict(B=B, T=T, op=args.op, gates=gname, plan=over)
                try:
                    with torch.no_grad():
                        o = fn()
                        base = o if base is None else base
                        row["diff_vs_measured_plan"] = err_ratio(o, base)
                        row["fwd_ms"] = bench_ms(fn, warmup=5, rep=30)
                        row["fwd_kernels_ms"] = kernel_times(fn)
                    if args.fwdbwd:
                        leaves = [x.detach().requires_grad_(True) for x in (q, k, v, g)]
                        do = torch.randn_like(v)

                        def step():
                            o = chunk_gla_triton(*leaves[:3], leaves[3], K ** -0.5, plan=over)[0]
                            return torch.autograd.grad(o, leaves, do)
                        row["fwdbwd_ms"] = bench_ms(step, warmup=5, rep=30)
                        row["fwdbwd_kernels_ms"] = kernel_times(step, n=5)
                except Exception as e:  # noqa: BLE001 - a variant that does not fit is recorded
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                rows.append(row)
                print(json.dumps(row), flush=True)
                torch.cuda.empty_cache()
    out = Path(os.environ.get("OUT", "/tmp")) / "sweep_gla.json"
    out.write_text(json.dumps({"env": environment(), "rows": rows}, indent=1))
    print(f"wrote {out} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
