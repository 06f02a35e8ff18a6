"""Lab: where PaTH's time goes with windows (issue 41), kernel by kernel.

At the benchmark's shapes (bfloat16, H = 16, K = V = 128, w and β in float32, the default plan:
windows of ``plan.default_window_blocks(T)`` blocks), the device time of every kernel of the forward
and of a training step (forward + backward), averaged over a few calls with ``torch.profiler``
(:func:`kernels.harness.kernel_times`). The kernels name their stage: ``_prepare_kernel`` (the
per-block preparation), ``_window_prep_kernel`` (the windows' products), the forward's walk, the
backward's main pass, the cross-window passes, the key push, the per-block backward's two kernels.

    python kernels/path/lab/stage_profile.py [out.json]
"""
import json
import sys

import torch

import kernels
from kernels.harness import kernel_times, scale_of
from kernels.path import bench
from kernels.path.plan import plan_for
from kernels.results import environment

SHAPES = [(32, 2048), (8, 8192), (1, 32768)]


def main(out=None):
    rows = []
    for B, T in SHAPES:
        x = bench.make_inputs(dict(op="path", B=B, T=T, wb="float32"))
        leaves = [x[n].detach().requires_grad_(True) for n in ("q", "k", "v", "w", "beta")]
        scale = scale_of(x["q"])
        op = lambda: kernels.parallel_path_attn(*leaves, scale=scale, check_values=False)[0]   # noqa: E731
        do = torch.randn_like(x["v"])
        rec = dict(B=B, T=T, window_blocks=plan_for(x["q"].dtype, x["q"].device, K=128, T=T).window_blocks)
        with torch.no_grad():
            rec["fwd_kernels_ms"] = kernel_times(op, n=5)
        rec["fwdbwd_kernels_ms"] = kernel_times(lambda: torch.autograd.grad(op(), leaves, do), n=3)
        for p in ("fwd", "fwdbwd"):
            rec[f"{p}_total_ms"] = round(sum(rec[f"{p}_kernels_ms"].values()), 3)
        print(json.dumps(rec), flush=True)
        rows.append(rec)
        del x, leaves, do
        torch.cuda.empty_cache()
    data = dict(env=environment(), rows=rows)
    if out:
        with open(out, "w") as f:
            json.dump(data, f, indent=1)
    return data


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
