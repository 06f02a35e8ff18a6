"""Lab, round 3: the serial pass's split of the value columns (and its warps) at the benchmark's shapes,
forward stage and adjoint solve, with the round-2 folds.

    python kernels/deltaformer/lab/sweep_split.py [--out FILE]

Writes ``$OUT/sweep_split.json`` (or /tmp); the H200 run the notes cite is kept as
``lab/logs/sweep_split_round3.json``.
"""
import argparse
import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
from kernels.deltaformer import bench                                      # noqa: E402
from kernels.deltaformer.plan import plan_for                              # noqa: E402
from kernels.deltaformer.pseudo import adjoint_values, pseudo_values      # noqa: E402
from kernels.harness import bench_ms                         # noqa: E402
from kernels.results import environment                         # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "sweep_split.json"))
args = p.parse_args()
rows = []
s = bench.D ** -0.5
for B, T in ((1, 32768), (8, 8192), (32, 2048)):
    x = bench.make_inputs(dict(op="deltaformer", B=B, T=T, beta="float32"))
    q, k, v, beta = x["q"], x["k"], x["v"], x["beta"]
    du = torch.randn_like(v)
    default = plan_for(q.dtype, q.device, B=B, T=T, H=bench.H)
    for split in (1, 2, 4):
        for warps in (4, 8):
            plan = dataclasses.replace(default, chunk_split=split, chunk_warps=warps)
            ms = bench_ms(lambda: pseudo_values(k, v, beta, s, plan), warmup=2, rep=5)
            u, r, lse = pseudo_values(k, v, beta, s, plan)
            ms_adj = bench_ms(lambda: adjoint_values(k, beta, lse, du, s, plan), warmup=2, rep=5)
            rows.append(dict(B=B, T=T, plan=dataclasses.asdict(plan), default=plan == default, ms=ms,
                             ms_adjoint=ms_adj))
            print(B, T, "split", split, "warps", warps, "default" if plan == default else "",
                  f"fwd {ms:.2f} adjoint {ms_adj:.2f}", flush=True)
    del x, q, k, v, beta
    torch.cuda.empty_cache()
json.dump(dict(env=environment(), rows=rows), open(args.out, "w"), indent=1)
print("wrote", args.out)
