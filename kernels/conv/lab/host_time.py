"""Lab: the host's time for one forward + backward of the op, against the GPU's.

    python -m kernels.conv.lab.host_time [--steps 200] [--write]

``lab/graph_timing.py`` found the launched step at ``D = 2048`` slower than the same kernels
replayed from a CUDA graph, and read it as the GPU waiting for the host. This measures the host's
side directly: after a synchronise, ``--steps`` steps are enqueued back to back without waiting
(a step is three launches, far below the launch queue's depth, so the host never blocks on the
GPU), and the wall time over the steps is the host's time per step. For scale, the same for the
forward alone and for one ``x.clone()`` (the copy the benchmark of record compares with). The
benchmark's shapes (bf16, SiLU, W = 4). ``--write`` keeps the table in ``lab/logs/host_time.json``.
"""
from __future__ import annotations

import statistics
import sys
import time


def host_ms(fn, steps: int, reps: int = 5) -> float:
    """Median over ``reps`` of the host's wall time per call of ``fn`` enqueued ``steps`` times."""
    import torch
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(steps):
            fn()
        out.append((time.perf_counter() - t) * 1e3 / steps)
        torch.cuda.synchronize()
    return statistics.median(out)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else 200
    import torch
    from kernels.conv import bench
    from kernels.conv.lab.graph_timing import fwdbwd_step
    from kernels.conv.lab.sweep_march import write_log
    from kernels.conv.op import causal_conv1d_triton
    from kernels.results import environment
    rows = []
    for case in bench.cases():
        step, inp = fwdbwd_step(case)

        def forward():
            with torch.no_grad():
                return causal_conv1d_triton(inp["x"], inp["weight"], activation="silu")[0]

        for fn in (step, forward):
            fn()
        row = dict(B=case["B"], T=case["T"], D=case["D"], steps=steps,
                   host_fwdbwd_ms=host_ms(step, steps), host_fwd_ms=host_ms(forward, steps),
                   host_copy_ms=host_ms(lambda: inp["x"].clone(), steps))
        rows.append(row)
        print(f"B={row['B']} T={row['T']} D={row['D']}: host per step fwd+bwd {row['host_fwdbwd_ms']:.3f} ms, "
              f"fwd {row['host_fwd_ms']:.3f} ms, copy {row['host_copy_ms']:.3f} ms", flush=True)
    if "--write" in argv:
        write_log(rows, "host_time.json", environment())
    return 0


if __name__ == "__main__":
    sys.exit(main())
