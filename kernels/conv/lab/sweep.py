"""Lab: the conv plan's tiles, warps and backward form, swept on a GPU.

    python3 -m kernels.conv.lab.sweep [--write]

bfloat16, SiLU, W = 4, no bias (the benchmark's setting) at B = 32, T = 2048, D = 2048. Times the
forward (which is also the tile of the split backward's ``dx`` pass) and the backward alone, each
configuration's median in ms (``triton.testing.do_bench``), with the copy of ``x`` as the yardstick.
The best of each (and the backward's form: ``split`` = the shipped two passes, ``dz`` through
memory; ``fused`` = ``lab/fused_backward.py``, ``dz`` recomputed) is printed; ``--write`` keeps the
table in ``lab/logs/sweep.json``. The H200 run behind the plan's tiled defaults was not kept:
``kernels/conv/NOTES.md`` ("Plan") records its choices and margins.
"""
from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path

import torch

from kernels.backend import Launch
from kernels.conv.backward import conv_backward
from kernels.conv.lab.fused_backward import fused_conv_backward
from kernels.conv.forward import conv_forward
from kernels.conv.plan import plan_for
from kernels.harness import bench_ms

from kernels.results import environment

B, T, D, W = 32, 2048, 2048, 4
FWD = [(bt, bd, wp) for bt, bd, wp in itertools.product((4, 8, 16, 32), (64, 128, 256), (2, 4, 8))]
BWD = [(split, bt, bd, steps, wp) for split in (True, False) for bt, bd in ((4, 64), (4, 128), (8, 64), (8, 128),
                                                                            (16, 64), (16, 128))
       for steps in (4, 16, 64) for wp in (4, 8)]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(B, T, D, device="cuda", generator=gen).to(torch.bfloat16)
    w = ((torch.rand(D, W, device="cuda", generator=gen) * 2 - 1) / W ** 0.5).to(torch.bfloat16)
    dy = torch.randn(B, T, D, device="cuda", generator=gen).to(torch.bfloat16)
    base = plan_for(x.dtype, x.device, T=T, D=D, W=W, march=False)
    copy_ms = bench_ms(lambda: x.clone())
    nbytes = x.numel() * x.element_size()
    rows = []
    t0 = time.time()
    print(f"copy {copy_ms:.3f} ms ({2 * nbytes / copy_ms / 1e6:.0f} GB/s)", flush=True)
    for bt, bd, wp in FWD:
        plan = plan_for(x.dtype, x.device, T=T, D=D, W=W, march=False, fwd_bt=bt, fwd_bd=bd, fwd=(Launch(wp, 1),))
        ms = bench_ms(lambda: conv_forward(x, w, None, None, None, "silu", plan))
        rows.append(dict(kernel="fwd", bt=bt, bd=bd, warps=wp, ms=round(ms, 4),
                         copy_fraction=round(copy_ms / ms, 3)))
        print(rows[-1], flush=True)
    best_fwd = min((r for r in rows if r["kernel"] == "fwd"), key=lambda r: r["ms"])
    for split, bt, bd, steps, wp in BWD:
        plan = plan_for(x.dtype, x.device, T=T, D=D, W=W, march=False, fwd_bt=best_fwd["bt"], fwd_bd=best_fwd["bd"],
                        fwd=(Launch(best_fwd["warps"], 1),), bwd_bt=bt, bwd_bd=bd, bwd_steps=steps,
                        bwd=(Launch(wp, 1),))
        bwd = conv_backward if split else fused_conv_backward
        ms = bench_ms(lambda: bwd(x, w, None, None, dy, None, "silu", plan, need_dw=True, need_db=False))
        # the backward's unavoidable traffic is 3 tensors (read x, dy; write dx); a copy moves 2
        rows.append(dict(kernel="bwd", split=split, bt=bt, bd=bd, steps=steps, warps=wp, ms=round(ms, 4),
                         copy_fraction=round(1.5 * copy_ms / ms, 3)))
        print(rows[-1], flush=True)
    best_bwd = min((r for r in rows if r["kernel"] == "bwd"), key=lambda r: r["ms"])
    default_bwd = [r for r in rows if r["kernel"] == "bwd" and (r["split"], r["bt"], r["bd"], r["steps"], r["warps"])
                   == (True, base.bwd_bt, base.bwd_bd, base.bwd_steps, base.bwd[0].num_warps)]
    print("best forward:", best_fwd)
    print("best backward:", best_bwd)
    print("current default backward:", default_bwd[0] if default_bwd else "not in the sweep")
    print(f"{time.time() - t0:.0f} s")
    if "--write" in argv:
        out = Path(__file__).parent / "logs" / "sweep.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(dict(env=environment(), shape=dict(B=B, T=T, D=D, W=W, dtype="bfloat16",
                                                                     activation="silu"),
                                       copy_ms=round(copy_ms, 4), rows=rows), indent=1) + "\n")
        print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
