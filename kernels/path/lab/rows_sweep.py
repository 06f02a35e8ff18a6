"""Round 2 (lab): query blocks of 64 rows against 128 on the GPU, forward and forward + backward,
and the largest difference between the two plans' outputs and gradients (the same inputs)."""
import sys
import torch
import triton
import kernels.path.op as pop
from kernels.path.plan import plan_for

H, D = 16, 128
shapes = [(32, 2048), (1, 32768)] if len(sys.argv) < 2 else [tuple(map(int, a.split("x"))) for a in sys.argv[1:]]
for B, T in shapes:
    gen = torch.Generator(device="cuda").manual_seed(T)
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    w = torch.nn.functional.normalize(torch.randn(B, T, H, D, device="cuda", generator=gen), dim=-1)
    beta = 2 * torch.sigmoid(torch.randn(B, T, H, device="cuda", generator=gen))
    do = torch.randn_like(q)
    res, outs = {}, {}
    for rows in (64, 128):
        plan = plan_for(q.dtype, q.device, rows=rows)
        xs = [x.detach().clone().requires_grad_(True) for x in (q, k, v, w, beta)]
        f = lambda: pop.PathFunction.apply(*xs, None, D ** -0.5, plan)
        with torch.no_grad():
            res[f"fwd{rows}"] = round(triton.testing.do_bench(f, warmup=3, rep=10), 3)
        res[f"fwdbwd{rows}"] = round(triton.testing.do_bench(lambda: torch.autograd.grad(f(), xs, do),
                                                             warmup=3, rep=10), 3)
        o = f()
        outs[rows] = [o] + list(torch.autograd.grad(o, xs, do))
    diff = max(((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()
               for a, b in zip(outs[64], outs[128]))
    print(B, T, res, "max relative difference 64 vs 128:", f"{diff:.2e}", flush=True)
