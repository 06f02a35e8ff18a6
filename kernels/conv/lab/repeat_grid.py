"""Lab: does a finer grid make the marching backward's time repeat at D = 2048?

    python3 -m kernels.conv.lab.repeat_grid [--reps 5] [--write]

Round 3's benchmark (``HISTORY.md``) timed the same code at ``D = 2048`` at 0.436–0.765 ms forward +
backward in two runs, while ``D = 4096`` repeated to 1 %. At ``D = 2048`` and B · T = 65,536 the
default segment (512 tokens × 1024 channels) makes exactly 256 programs, about two per SM. This
script times the op's forward + backward (``causal_conv1d``, bf16, SiLU, W = 4, the benchmark's
inputs and step) at the benchmark's shapes with the backward's segment at 512, 256 and 128 tokens,
the settings interleaved and repeated ``--reps`` times, and prints each setting's median, smallest
and largest time. A segment that keeps the median and narrows the spread is the case for raising
``plan.MIN_PROGRAMS``. ``--write`` keeps the table in ``lab/logs/repeat_grid.json``; the H200
run there did not make the case (``NOTES.md``, "Plan").
"""
from __future__ import annotations

import statistics
import sys
import time

SEGMENTS = (512, 256, 128)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    reps = int(argv[argv.index("--reps") + 1]) if "--reps" in argv else 5
    import torch
    from kernels.conv import bench
    from kernels.conv.op import causal_conv1d_triton
    from kernels.conv.lab.sweep_march import write_log
    from kernels.harness import bench_ms
    from kernels.results import environment
    rows, t0 = [], time.time()
    for case in bench.cases():
        x = bench.make_inputs(case)
        dy = torch.randn_like(x["x"])
        times = {seg: [] for seg in SEGMENTS}
        for _ in range(reps):
            for seg in SEGMENTS:
                xs = x["x"].detach().clone().requires_grad_()
                ws = x["weight"].detach().clone().requires_grad_()

                def step():
                    y = causal_conv1d_triton(xs, ws, activation="silu", plan={"bwd_march_seg": seg})[0]
                    return torch.autograd.grad(y, [xs, ws], dy)
                times[seg].append(bench_ms(step))
        for seg, ts in times.items():
            row = dict(B=case["B"], T=case["T"], D=case["D"], bwd_march_seg=seg, ms=ts,
                       median=statistics.median(ts), low=min(ts), high=max(ts))
            rows.append(row)
            print(f"B={row['B']} T={row['T']} D={row['D']} seg={seg:4d}  median {row['median']:.3f} ms  "
                  f"[{row['low']:.3f}, {row['high']:.3f}]", flush=True)
    print(f"{time.time() - t0:.0f} s")
    if "--write" in argv:
        write_log(rows, "repeat_grid.json", environment())
    return 0


if __name__ == "__main__":
    sys.exit(main())
