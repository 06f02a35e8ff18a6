"""Lab: the marching backward against the two-pass one (both in ``backward.py``), on a GPU.

    python3 -m kernels.conv.lab.sweep_march_backward [--write]

The benchmark's setting (bfloat16, SiLU, W = 4, no bias, weight gradient needed) at its two widths,
B · T = 65,536: a copy of ``x`` (the yardstick), the two-pass backward (``march=False``: ``dz``
written and read back) and the marching one over segment lengths, channel blocks and warps. Each
configuration's median in ms (``kernels.harness.bench_ms``), its bandwidth as a fraction of the
copy's by the one-pass minimum (read ``x`` and ``dy``, write ``dx``: 1.5 copies), and its largest
difference from the two-pass backward's ``dx`` and ``dw`` (``dw``, a sum over 65,536 tokens of
size about 100, differs by its last bfloat16 bit, 0.25 to 0.5, with the order of the sums).
``--write`` keeps the table in ``kernels/conv/lab/logs/sweep_march_backward.json``, which the plan's
defaults cite. (The marching kernel was written here first, as ``lab/march_backward.py``; the
logged run timed that file, which moved into ``backward.py`` unchanged.)
"""
from __future__ import annotations

import itertools
import sys
import time

from kernels.conv.lab.sweep_march import SHAPES, W    # the forward sweep's shapes and width

MARCH = [(seg, bd, wp) for seg, bd, wp in itertools.product((64, 128, 256, 512), (256, 512, 1024), (2, 4, 8))
         if bd // (32 * wp) in (1, 2, 4)]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    import torch
    from kernels.backend import Launch
    from kernels.conv.backward import conv_backward
    from kernels.conv.lab.sweep_march import sweep_configs, write_log
    from kernels.conv.plan import plan_for
    from kernels.harness import bench_ms
    from kernels.results import environment
    rows, t0 = [], time.time()
    for B, T, D in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(D)
        x = torch.randn(B, T, D, device="cuda", generator=gen).to(torch.bfloat16)
        dy = torch.randn(B, T, D, device="cuda", generator=gen).to(torch.bfloat16)
        w = ((torch.rand(D, W, device="cuda", generator=gen) * 2 - 1) / W ** 0.5).to(torch.bfloat16)
        plan = plan_for(x.dtype, x.device, T=T, D=D, W=W, march=False)
        copy_ms = bench_ms(lambda: x.clone())
        shipped = lambda: conv_backward(x, w, None, None, dy, None, "silu", plan, need_dw=True, need_db=False)  # noqa
        want_dx, want_dw, _ = shipped()

        def add(name, ms, got=None, **kw):
            diff = None if got is None else max((got[0].float() - want_dx.float()).abs().max().item(),
                                                (got[1].float() - want_dw.float()).abs().max().item())
            rows.append(dict(B=B, T=T, D=D, variant=name, ms=ms, copy_fraction=1.5 * copy_ms / ms, max_diff=diff,
                             **kw))
            print(f"B={B} T={T} D={D} {name:30s} {ms:.4f} ms  {1.5 * copy_ms / ms:.3f} of copy"
                  + ("" if diff is None else f"  max diff {diff:.2e}"), flush=True)
        add("copy (1 copy)", copy_ms)
        add("shipped (two passes)", bench_ms(shipped))
        def marching(seg, bd, wp):
            mp = plan_for(x.dtype, x.device, T=T, D=D, W=W, bwd_march_seg=seg, bwd_march_bd=bd,
                          bwd_march=(Launch(wp, 1),))
            return lambda: conv_backward(x, w, None, None, dy, None, "silu", mp, need_dw=True, need_db=False)
        sweep_configs(rows, add, (B, T, D), MARCH, marching)
    print(f"{time.time() - t0:.0f} s")
    if "--write" in argv:
        write_log(rows, "sweep_march_backward.json", environment())
    return 0


if __name__ == "__main__":
    sys.exit(main())
