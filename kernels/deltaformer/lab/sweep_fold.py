"""Lab, round 2: the parallel fold's tiling and the span at the benchmark's shapes, and where the time
of a training step goes (per-kernel totals from torch.profiler) under the default plan.

    python kernels/deltaformer/lab/sweep_fold.py [--out FILE]

Writes ``$OUT/sweep_fold.json`` (or /tmp); the H200 run the notes cite is kept as
``lab/logs/sweep_fold_round2.json``.
"""
import argparse
import json
import os
import sys
import time
from collections import defaultdict

import torch

sys.path.insert(0, os.getcwd())
import kernels                                                             # noqa: E402
from kernels.deltaformer import bench                                      # noqa: E402
from kernels.deltaformer.plan import DeltaFormerPlan, plan_for             # noqa: E402
from kernels.deltaformer.pseudo import adjoint_values, pseudo_values      # noqa: E402
from kernels.harness import bench_ms                         # noqa: E402
from kernels.results import environment                         # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "sweep_fold.json"))
p.add_argument("--budget-s", type=float, default=300)
args = p.parse_args()
t0 = time.time()
rows, profiles = [], []
s = bench.D ** -0.5
FOLDS = [(64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 4, 2)]
for B, T, spans in ((1, 32768, (1024, 2048)), (8, 8192, (256, 512)), (32, 2048, (256,))):
    case = dict(op="deltaformer", B=B, T=T, beta="float32")
    x = bench.make_inputs(case)
    q, k, v, beta = x["q"], x["k"], x["v"], x["beta"]
    du = torch.randn_like(v)
    default = plan_for(q.dtype, q.device, B=B, T=T, H=bench.H)
    # where a training step's time goes, default plan
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, beta)]
    # check_values=False: a timing sweep, no host sync for value checks (as the benchmark of record)
    step = lambda: torch.autograd.grad(kernels.deltaformer_attn(*leaves, scale=s, check_values=False),  # noqa: E731
                                       leaves, du)
    step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    tot = defaultdict(float)
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            tot[e.key[:60]] += e.device_time_total / 1e3
    profiles.append(dict(B=B, T=T, plan=default.__dict__, kernels_ms={k_: round(v_, 3) for k_, v_ in
                                                                      sorted(tot.items(), key=lambda kv: -kv[1])}))
    print(profiles[-1], flush=True)
    for span in spans:
        for fm, fn, fw, fs in FOLDS:
            if time.time() - t0 > args.budget_s:
                break
            plan = DeltaFormerPlan(span=span, fold_m=fm, fold_n=fn, fold_warps=fw, fold_stages=fs)
            try:
                ms = bench_ms(lambda: pseudo_values(k, v, beta, s, plan), warmup=2, rep=5)
                u, r, lse = pseudo_values(k, v, beta, s, plan)
                ms_adj = bench_ms(lambda: adjoint_values(k, beta, lse, du, s, plan), warmup=2, rep=5)
            except Exception as e:
                ms, ms_adj = None, str(e)[:200]
            rows.append(dict(B=B, T=T, plan=plan.__dict__, default=plan == default, ms=ms, ms_adjoint=ms_adj))
            print(rows[-1], flush=True)
    del x, q, k, v, beta, leaves
    torch.cuda.empty_cache()
json.dump(dict(env=environment(), rows=rows, profiles=profiles), open(args.out, "w"), indent=1)
print("wrote", args.out)
