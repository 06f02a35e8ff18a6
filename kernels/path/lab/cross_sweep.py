"""Lab: the cross-window passes' own launch (issue 41, PaTH round 4's first step; NOTES.md, "Open").

The two cross-window kernels (``windows.py``: ``_cross_q_kernel``, ``_cross_k_kernel``) run with the
main pass's launch (8 warps, one stage) and 64 keys a program of the key pass. They take 39 of 78 ms
of a training step at B = 8, T = 8192 and 66 of 102 ms at B = 1, T = 32768
(``lab/logs/stage_profile_20261129.log``), 2.5x our flash attention's backward over the same pairs.
This sweep times stage 2's gradient (:func:`kernels.path.backward.path_backward`, which holds both
passes) for each launch of the two kernels (``plan.cross``: warps x stages, the one launch given
alone so that a launch that does not fit is recorded, not replaced) and each tile of the key pass
(``plan.cross_keys`` keys a program, 64 or 128, against ``plan.cross_queries`` query rows a step,
64 or 128; today 64 x 128, flash's long-T key pass 128 x 64), at the benchmark's two windowed shapes
(bfloat16, H = 16, K = V = 128, the default plan's windows). Each variant's gradients are compared
with the default launch's (RMS of the difference over the RMS of the default's), and the fastest
variant's forward + backward is timed beside the default's.

    python kernels/path/lab/cross_sweep.py [out.json] [--carry]

``--carry`` times instead the key pass that carries its key block across each window
(``plan.cross_carry``, four products a pair, the patch of ``lab/logs/key_carry_20261129.diff`` on
today's source) at the launches that fit beside it, against today's default.
"""
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from atomics_cost import ms, save, stage_inputs  # noqa: E402

from kernels.backend import Launch  # noqa: E402
from kernels.path.backward import path_backward  # noqa: E402
from kernels.path.op import PathFunction  # noqa: E402
from kernels.path.plan import default_window_blocks  # noqa: E402

SHAPES = [(8, 8192), (1, 32768)]
LAUNCHES = [(8, 1), (8, 2), (8, 3), (4, 2)]
TILES = [(64, 128), (128, 64), (128, 128), (64, 64)]      # (keys a program, query rows a step)
GRID = [(bn, bq, w, st, False) for bn, bq in TILES for w, st in LAUNCHES]
# carrying the keys: at one stage, and at the two-stage launches that the compile check fits in
# Hopper's 227 KiB (64 x 128: 225 KiB; 128 x 64: 208 KiB)
CARRY = [(64, 128, 8, 1, True), (64, 128, 8, 2, True), (128, 64, 8, 2, True), (128, 128, 8, 1, True)]


def _rms(a, b):
    return round(float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)), 6)


def main(out=None, variants=GRID):
    rows = []
    for B, T in SHAPES:
        x = stage_inputs(B, T)
        scale = x["scale"]
        base = dataclasses.replace(x["plan"], window_blocks=default_window_blocks(T, x["plan"].rows))
        args = [x[n] for n in ("qt", "kh", "u", "wt", "aloc", "v", "do", "o", "lse")]
        ref = [t for t in path_backward(*args, None, scale, base) if isinstance(t, torch.Tensor)]
        timed = {}
        for bn, bq, warps, stages, carry in variants:
            tag = f"keys {bn} x queries {bq}, {warps} warps, {stages} stages" + (", carry" if carry else "")
            p = dataclasses.replace(base, cross=(Launch(warps, stages),), cross_keys=bn, cross_queries=bq,
                                    cross_carry=carry)
            rec = dict(B=B, T=T, window_blocks=base.window_blocks, cross_keys=bn, cross_queries=bq,
                       warps=warps, stages=stages, carry=carry)
            try:
                got = [t for t in path_backward(*args, None, scale, p) if isinstance(t, torch.Tensor)]
                rec["rms_diff_max"] = max(_rms(a, b) for a, b in zip(got, ref))
                rec["stage2_ms"] = ms(lambda: path_backward(*args, None, scale, p))
                timed[tag] = (rec["stage2_ms"], p)
            except Exception as e:   # e.g. out of shared memory for this launch
                rec["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            print(tag, rec, flush=True)
            rows.append(rec)
        if timed:
            best = min(timed, key=lambda t: timed[t][0])
            leaves = [x[n].detach().clone().requires_grad_(True) for n in ("q", "k", "v", "w", "beta")]
            for tag, p in (("default", base), (best, timed[best][1])):
                def step(p=p):
                    return torch.autograd.grad(PathFunction.apply(*leaves, None, scale, p), leaves, x["do"])
                rec = dict(B=B, T=T, variant=tag, fwdbwd_ms=ms(step))
                print(rec, flush=True)
                rows.append(rec)
        del x, args, ref
        torch.cuda.empty_cache()
    return save(out, rows, torch.cuda.get_device_name())


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if a != "--carry"]
    main(argv[0] if argv else None, [GRID[0]] + CARRY if "--carry" in sys.argv else GRID)
