"""Lab: the backward's block shapes, swept on a GPU (bf16, H = 16, D = 128, causal).

    python -m kernels.flash.lab.sweep_backward [--out FILE]

First the dk/dv pass's candidates (with the dq pass at the default), then the dq pass's (with the
best dk/dv); each timed as the whole backward (delta + dk/dv + dq) on saved forward results, at
B·T = 65,536 with T = 2048 and 32768, with and without FoX's bias. SDPA's forward + backward is timed
beside it as the yardstick. Prints a table and writes JSON (default ``lab/logs/sweep_backward.json``).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from kernels.flash import plan as P
from kernels.flash.backward import flash_backward
from kernels.flash.forward import flash_forward
from kernels.harness import bench_ms

from kernels.results import environment

H, D = 16, 128
SHAPES = [(32, 2048), (2, 32768)]
DKDV = [(64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 8, 3), (64, 64, 4, 2), (64, 64, 4, 3), (32, 64, 4, 3),
        (64, 128, 4, 2)]
DQ = [(128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 2), (64, 64, 4, 3), (128, 32, 8, 3), (64, 32, 4, 3),
      (128, 128, 8, 2)]


def time_backward(x, gs, plan):
    q, k, v, o, lse, do = x
    return bench_ms(lambda: flash_backward(q, k, v, o, lse, do, D ** -0.5, True, plan, gs), warmup=5, rep=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).parent / "logs" / "sweep_backward.json"))
    args = ap.parse_args()
    rows = []
    for B, T in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(T)
        q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
        do = torch.randn_like(v)
        g = F.logsigmoid(torch.randn(B, T, H, device="cuda", generator=gen))
        fplan = P.plan_for(q.dtype, q.device, B=B, T=T, H=H, K=D, V=D, causal=True, tma=P.tma_compatible(q, k, v))
        for bias in (False, True):
            gs = torch.cumsum(g, 1) if bias else None
            o, lse = flash_forward(q, k, v, D ** -0.5, True, fplan, gs)
            x = (q, k, v, o, lse, do)
            fwd = bench_ms(lambda: flash_forward(q, k, v, D ** -0.5, True, fplan, gs), warmup=5, rep=30)
            best_kv, best = None, float("inf")
            for cfg in DKDV:
                plan = P.BackwardPlan(dkdv=P.Blocks(*cfg), dq=P.HOPPER_BWD_SHORT.dq)
                try:
                    ms = time_backward(x, gs, plan)
                except Exception as e:   # out of resources
                    ms = None
                    print("dkdv", cfg, type(e).__name__, str(e).splitlines()[0][:120])
                rows.append(dict(B=B, T=T, bias=bias, stage="dkdv", cfg=cfg, bwd_ms=ms, fwd_ms=fwd))
                print(f"B={B} T={T} bias={bias} dkdv {cfg}: {ms}", flush=True)
                if ms is not None and ms < best:
                    best_kv, best = cfg, ms
            for cfg in DQ:
                plan = P.BackwardPlan(dkdv=P.Blocks(*best_kv), dq=P.Blocks(*cfg))
                try:
                    ms = time_backward(x, gs, plan)
                except Exception as e:
                    ms = None
                    print("dq", cfg, type(e).__name__, str(e).splitlines()[0][:120])
                rows.append(dict(B=B, T=T, bias=bias, stage="dq", cfg=cfg, dkdv=best_kv, bwd_ms=ms, fwd_ms=fwd))
                print(f"B={B} T={T} bias={bias} dq {cfg} (dkdv {best_kv}): {ms}", flush=True)
        qs, ks, vs = (t.transpose(1, 2).requires_grad_(True) for t in (q, k, v))

        def sdpa_step():
            out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=D ** -0.5)
            return torch.autograd.grad(out, (qs, ks, vs), do.transpose(1, 2))
        with torch.no_grad():
            sdpa_fwd = bench_ms(lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True), warmup=5, rep=30)
        rows.append(dict(B=B, T=T, stage="sdpa", fwd_ms=sdpa_fwd, fwdbwd_ms=bench_ms(sdpa_step, warmup=5, rep=30)))
        print(rows[-1], flush=True)
    Path(args.out).write_text(json.dumps(dict(env=environment(), rows=rows), indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
