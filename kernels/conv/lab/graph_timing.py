"""Lab: is the spread at D = 2048 the host's? The op's forward + backward timed as it is launched
and replayed from a CUDA graph, interleaved and repeated.

    python3 -m kernels.conv.lab.graph_timing [--reps 5] [--write]

``lab/repeat_grid.py`` found the forward + backward at ``D = 2048`` spread over 0.45–0.72 ms at
every backward segment while ``D = 4096`` repeats to 1 % (``NOTES.md``). Our guess: at about
0.5 ms a step the host's work (autograd, the op's checks, the launches) is a large share of the
step, so ``do_bench``'s events, which time the stream, catch the GPU waiting for the host. A CUDA
graph replays the same kernels with one launch. If the graphed step is faster and repeats, the
guess holds. Each setting: the benchmark's inputs and step (``causal_conv1d``, bf16, SiLU,
W = 4), ``bench_ms`` as the benchmark of record uses it. ``--write`` keeps the table in
``kernels/conv/graph_timing.json`` (``bench.GRAPH_LOG``, beside ``results.json``: Chapter 11 reads it
through ``bench.launched_vs_graphed``, so it ships with the package, outside the lab).
"""
from __future__ import annotations

import statistics
import sys
import time


def fwdbwd_step(case):
    """The benchmark's inputs for ``case`` and its timed step (the op's forward with SiLU, then the
    gradients of ``x`` and the weight for a fixed upstream gradient): ``(step, inputs)``."""
    import torch
    from kernels.conv import bench
    from kernels.conv.op import causal_conv1d_triton
    inp = bench.make_inputs(case)
    x = inp["x"].detach().clone().requires_grad_()
    w = inp["weight"].detach().clone().requires_grad_()
    dy = torch.randn_like(x)

    def step():
        y = causal_conv1d_triton(x, w, activation="silu")[0]
        return torch.autograd.grad(y, [x, w], dy)
    return step, inp


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    reps = int(argv[argv.index("--reps") + 1]) if "--reps" in argv else 5
    import torch
    from kernels.conv import bench
    from kernels.conv.bench_layer import graphed
    from kernels.conv.lab.sweep_march import write_log
    from kernels.harness import bench_ms
    from kernels.results import environment
    rows, t0 = [], time.time()
    for case in bench.cases():
        step, _ = fwdbwd_step(case)
        replay, out = graphed(step)
        ref = step()
        replay()
        torch.cuda.synchronize()
        same = all(torch.equal(a, b) for a, b in zip(out, ref))
        times = {"eager": [], "graph": []}
        for _ in range(reps):
            times["eager"].append(bench_ms(step))
            times["graph"].append(bench_ms(replay))
        for how, ts in times.items():
            row = dict(B=case["B"], T=case["T"], D=case["D"], how=how, ms=ts, median=statistics.median(ts),
                       low=min(ts), high=max(ts), graph_equals_eager=same)
            rows.append(row)
            print(f"B={row['B']} T={row['T']} D={row['D']} {how:5s}  median {row['median']:.3f} ms  "
                  f"[{row['low']:.3f}, {row['high']:.3f}]  same={same}", flush=True)
        del replay, out
    print(f"{time.time() - t0:.0f} s")
    if "--write" in argv:
        from pathlib import Path
        write_log(rows, bench.GRAPH_LOG, environment(), out=Path(bench.__file__).resolve().parent / bench.GRAPH_LOG)
    return 0


if __name__ == "__main__":
    sys.exit(main())
