"""Lab: time the pseudo-value stage (forward, and the adjoint solve) under several launch plans,
next to the flash forward alone and fla's pseudo-value stage, on the benchmark's shapes.

    python kernels/deltaformer/lab/sweep_plan.py [--out FILE]

Writes ``$OUT/sweep_plan.json`` (or /tmp); the H200 run the notes cite is kept as
``lab/logs/sweep_plan_round1.json``.
"""
import argparse
import itertools
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
from kernels.deltaformer import bench                                      # noqa: E402
from kernels.deltaformer.plan import DeltaFormerPlan, plan_for             # noqa: E402
from kernels.deltaformer.pseudo import adjoint_values, pseudo_values      # noqa: E402
from kernels.flash.forward import flash_forward                           # noqa: E402
from kernels.flash.plan import plan_for as flash_plan_for, tma_compatible  # noqa: E402
from kernels.harness import bench_ms                         # noqa: E402
from kernels.results import environment                         # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "sweep_plan.json"))
p.add_argument("--shapes", default="32x2048,8x8192,1x32768")
p.add_argument("--budget-s", type=float, default=420)
args = p.parse_args()
t0 = time.time()
rows = []
s = bench.D ** -0.5
for shape in args.shapes.split(","):
    B, T = map(int, shape.split("x"))
    case = dict(op="deltaformer", B=B, T=T, beta="float32")
    x = bench.make_inputs(case)
    q, k, v, beta = x["q"], x["k"], x["v"], x["beta"]
    fp = flash_plan_for(q.dtype, q.device, B=B, T=T, H=bench.H, K=q.shape[-1], V=v.shape[-1], causal=True,
                        tma=tma_compatible(q, k, v))
    rows.append(dict(B=B, T=T, what="flash_forward", ms=bench_ms(lambda: flash_forward(q, k, v, s, True, fp),
                                                                  warmup=3, rep=10)))
    print(rows[-1], flush=True)
    try:
        fn = bench.fla_pseudo_values()
        with torch.no_grad():
            rows.append(dict(B=B, T=T, what="fla_pseudo_values", ms=bench_ms(lambda: fn.apply(k, k, v, beta, 512, None),
                                                                             warmup=2, rep=5)))
        print(rows[-1], flush=True)
    except Exception as e:
        print("fla", e)
    default = plan_for(q.dtype, q.device, B=B, T=T, H=bench.H)
    whole = -(-T // 64) * 64
    spans = sorted({default.span, whole, 2048, 1024, 512, 256} & set(range(64, whole + 1, 64)), reverse=True)
    du = torch.randn_like(v)
    for span, cw, cs in itertools.product(spans, (4, 8), (1, 2)):
        if time.time() - t0 > args.budget_s:
            break
        plan = DeltaFormerPlan(span=span, chunk_warps=cw, chunk_stages=cs)
        try:
            ms = bench_ms(lambda: pseudo_values(k, v, beta, s, plan), warmup=2, rep=5)
            u, r, lse = pseudo_values(k, v, beta, s, plan)
            ms_adj = bench_ms(lambda: adjoint_values(k, beta, lse, du, s, plan), warmup=2, rep=5)
        except Exception as e:
            ms, ms_adj = None, str(e)[:200]
        rows.append(dict(B=B, T=T, what="pseudo_values", plan=plan.__dict__, default=plan == default, ms=ms,
                         ms_adjoint=ms_adj))
        print(rows[-1], flush=True)
    del x, q, k, v, beta
    torch.cuda.empty_cache()
json.dump(dict(env=environment(), rows=rows), open(args.out, "w"), indent=1)
print("wrote", args.out)
