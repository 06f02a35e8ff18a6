"""Lab: the backward across windows against today's walk (issue 41, PaTH round 3).

At the benchmark's shapes (bfloat16, H = 16, K = V = 128, w and β in float32, no gate), times
stage 2's gradient (``backward.path_backward``) with ``plan.window_blocks`` in (0, 4, 8, 16) (0:
today's walk over every earlier block) and the per-block backward after it, and records how far
each windowed result is from the walk's (largest difference over the largest entry, per output).

    python kernels/path/lab/windows_sweep.py [out.json]
"""
import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from atomics_cost import SHAPES, ms, save, stage_inputs  # noqa: E402

from kernels.path.backward import path_backward  # noqa: E402
from kernels.path.local import local_backward  # noqa: E402

WINDOWS = (0, 4, 8, 16)
NAMES = ("dqt", "dkh", "gw", "hu", "daloc", "dv")


def main(out=None):
    rows = []
    for B, T in SHAPES:
        x = stage_inputs(B, T)
        plan = x["plan"]
        args = [x[n] for n in ("qt", "kh", "u", "wt", "aloc", "v", "do", "o", "lse")]
        rec = dict(B=B, T=T)
        ref = None
        for wb in WINDOWS:
            p = dataclasses.replace(plan, window_blocks=wb)
            got = path_backward(*args, None, x["scale"], p)
            if ref is None:
                ref = got
            else:
                rec[f"maxdiff[{wb}]"] = {n: round(float((a.float() - b.float()).abs().max() / b.float().abs().max()), 6)
                                         for n, a, b in zip(NAMES, got, ref)}
            rec[f"backward_ms[{wb}]"] = ms(lambda: path_backward(*args, None, x["scale"], p))
            print(B, T, wb, rec[f"backward_ms[{wb}]"], rec.get(f"maxdiff[{wb}]"), flush=True)
        dqt, dkh, gw, hu, daloc, dv, _ = ref
        rec["local_backward_ms"] = ms(lambda: local_backward(x["q"], x["k"], x["w"], x["beta"], x["tm"], dqt, dkh,
                                                             gw, hu, daloc, plan, torch.float32))
        print(json.dumps(rec), flush=True)
        rows.append(rec)
        del x, args, ref
        torch.cuda.empty_cache()
    return save(out, rows, torch.cuda.get_device_name())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
