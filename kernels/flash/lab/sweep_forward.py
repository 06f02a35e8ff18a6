"""Lab: the forward's launch plans, with and without FoX's bias, swept on a GPU (bf16, H = 16, D = 128).

    python -m kernels.flash.lab.sweep_forward [--out FILE]

Every candidate :class:`kernels.flash.plan.FlashPlan` at B·T = 65,536 with T in {2048, 8192, 32768},
causal, beside torch SDPA's forward. Prints a table and writes JSON (default ``lab/logs/sweep_forward.json``).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from kernels.flash.forward import flash_forward
from kernels.flash.plan import FlashPlan
from kernels.harness import bench_ms

from kernels.results import environment

H, D = 16, 128
SHAPES = [(32, 2048), (8, 8192), (2, 32768)]
PLANS = [FlashPlan("tiles", 64, 64, 4, 3), FlashPlan("tiles", 64, 64, 4, 2), FlashPlan("tiles", 128, 64, 8, 3),
         FlashPlan("tiles", 128, 128, 8, 3), FlashPlan("tiles", 128, 64, 8, 3, True),
         FlashPlan("tma", 128, 128, 8, 3), FlashPlan("tma", 128, 64, 8, 3), FlashPlan("tma", 128, 128, 8, 2),
         FlashPlan("tma", 64, 64, 4, 3), FlashPlan("tma", 128, 128, 8, 3, True)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).parent / "logs" / "sweep_forward.json"))
    args = ap.parse_args()
    rows = []
    for B, T in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(T)
        q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
        gs = torch.cumsum(F.logsigmoid(torch.randn(B, T, H, device="cuda", generator=gen)), 1)
        sdpa = bench_ms(lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                               v.transpose(1, 2), is_causal=True), warmup=5, rep=30)
        rows.append(dict(B=B, T=T, plan="sdpa", ms=sdpa))
        print(f"B={B} T={T} sdpa {sdpa:.3f}", flush=True)
        for plan in PLANS:
            for bias in (False, True):
                try:
                    ms = bench_ms(lambda: flash_forward(q, k, v, D ** -0.5, True, plan, gs if bias else None),
                                  warmup=5, rep=30)
                except Exception as e:
                    ms = None
                    print(type(e).__name__, str(e).splitlines()[0][:100])
                rows.append(dict(B=B, T=T, plan=repr(plan), bias=bias, ms=ms))
                print(f"B={B} T={T} bias={bias} {plan}: {ms}", flush=True)
    Path(args.out).write_text(json.dumps(dict(env=environment(), rows=rows), indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
