"""Lab: what fla's float16 cast of q and k costs, by itself (CPU, float64 arithmetic).

    python3 -m kernels.mesa.lab.fp16_cast [--write]

fla's ``chunk_mesa_net`` casts q and k to float16 inside; what does that cost by itself? This
script isolates the cast from everything else: it runs the float64 *exact* solve
(:func:`kernels.reference.chunk_mesa_net_ref`, ``exact=True``) twice on the same inputs, once with
q and k as given and once with q and k rounded to float16 first, and reports the RMS error ratio
(fla's measure) of the output and of every gradient between the two. Inputs as the benchmark of
record makes them (unit q, k rows, v ~ N(0, 1), g = logsigmoid(N(0, 1)), beta = sigmoid(N(0, 1)),
lamb = softplus(U(0, 1)) + 0.25), at K = V = 128, given in bfloat16 (the benchmark's dtype) and in
float32. ``--write`` keeps the table in ``lab/logs/fp16_cast.json``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from kernels.harness import err_ratio
from kernels.reference import chunk_mesa_net_ref

B, T, H, D = 1, 256, 2, 128
NAMES = ("q", "k", "v", "g", "beta", "lamb")


def make_inputs(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1) for _ in range(2))
    v = torch.randn(B, T, H, D, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen))
    beta = torch.sigmoid(torch.randn(B, T, H, generator=gen))
    lamb = torch.nn.functional.softplus(torch.rand(H, D, generator=gen)) + 0.25
    return [q.to(dtype), k.to(dtype), v.to(dtype), g, beta, lamb]


def exact_run(inputs, do, cast):
    """Output and gradients of the float64 exact solve; ``cast``: q and k rounded to float16 first."""
    leaves = [x.detach().double().requires_grad_() for x in inputs]
    q, k = leaves[:2]
    if cast:    # the rounding only: its gradient passes straight through, as a cast's does
        q = q + (q.detach().half().double() - q.detach())
        k = k + (k.detach().half().double() - k.detach())
    o = chunk_mesa_net_ref(q, k, *leaves[2:], exact=True)[0]
    return [o] + list(torch.autograd.grad(o, leaves, do))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        inputs = make_inputs(dtype)
        do = torch.randn(B, T, H, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        moved = sum(int((x.half().to(dtype) != x).sum()) for x in inputs[:2])
        plain, cast = exact_run(inputs, do, False), exact_run(inputs, do, True)
        errs = {n: err_ratio(a, b) for n, a, b in zip(("o",) + tuple("d" + n for n in NAMES), cast, plain)}
        rows.append(dict(dtype=str(dtype).replace("torch.", ""), entries_changed_by_cast=moved, err=errs))
        print(f"{rows[-1]['dtype']:9s} q, k entries the cast changes: {moved:6d}   "
              + "  ".join(f"{n} {e:.1e}" for n, e in errs.items()), flush=True)
    if "--write" in argv:
        out = Path(__file__).resolve().parent / "logs" / "fp16_cast.json"
        out.write_text(json.dumps({"shape": dict(B=B, T=T, H=H, K=D, V=D), "rows": rows}, indent=1) + "\n")
        print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
