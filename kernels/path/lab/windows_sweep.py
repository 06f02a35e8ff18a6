"""Lab: PaTH across windows against today's walk (issue 41, PaTH round 3).

At the benchmark's shapes (bfloat16, H = 16, K = V = 128, no gate), times the op's forward and
forward + backward (``PathFunction`` with ``plan.window_blocks`` in (0, 4, 8, 16); 0: the walk
over every earlier block; each window size also with ``forward_windows=False``, the windows in the
backward only) and stage 2's gradient alone, and records how far each windowed result is
from the walk's (RMS of the difference over the RMS of the walk's, per output and gradient).

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
from kernels.path.op import PathFunction  # noqa: E402

WINDOWS = (0, 4, 8, 16)
NAMES = ("o", "dq", "dk", "dv", "dw", "dbeta")


def main(out=None):
    rows = []
    for B, T in SHAPES:
        x = stage_inputs(B, T)
        plan, scale = x["plan"], x["scale"]
        ins = [x[n] for n in ("q", "k", "v", "w", "beta")]
        leaves = [t.detach().clone().requires_grad_(True) for t in ins]
        rec = dict(B=B, T=T)
        ref = None
        for wb, fw in [(0, True)] + [(wb, fw) for wb in WINDOWS[1:] for fw in (True, False)]:
            p = dataclasses.replace(plan, window_blocks=wb, forward_windows=fw)
            tag = f"{wb}" + ("" if fw else " bwd only")
            op = lambda: PathFunction.apply(*leaves, None, scale, p)   # noqa: E731
            o = op()
            got = [o] + list(torch.autograd.grad(o, leaves, x["do"]))
            if ref is None:
                ref = got
            else:
                rec[f"rms_diff[{tag}]"] = {n: round(float((a.detach().float() - b.detach().float()).norm()
                                                          / b.detach().float().norm()), 6)
                                           for n, a, b in zip(NAMES, got, ref)}
            with torch.no_grad():
                rec[f"fwd_ms[{tag}]"] = ms(op)
            rec[f"fwdbwd_ms[{tag}]"] = ms(lambda: torch.autograd.grad(op(), leaves, x["do"]))
            args = [x[n] for n in ("qt", "kh", "u", "wt", "aloc", "v", "do", "o", "lse")]
            rec[f"stage2_bwd_ms[{tag}]"] = ms(lambda: path_backward(*args, None, scale, p))
            print(B, T, tag, rec[f"fwd_ms[{tag}]"], rec[f"fwdbwd_ms[{tag}]"], rec[f"stage2_bwd_ms[{tag}]"],
                  rec.get(f"rms_diff[{tag}]"), flush=True)
        print(json.dumps(rec), flush=True)
        rows.append(rec)
        del x, ins, leaves, ref
        torch.cuda.empty_cache()
    return save(out, rows, torch.cuda.get_device_name())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
