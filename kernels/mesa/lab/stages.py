"""Time the forward's stages and the solve's launch options on a GPU (bf16, H = 16, K = V = 128).

    python kernels/mesa/lab/stages.py [B T] [--cg 30]

Prints, for one shape: the whole forward and forward + backward (ours and, when installed, fla's),
then each forward stage alone (the states of H, the CG solve under several warps, gla's output
stage), median ms by ``triton.testing.do_bench``.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")


def main(argv=None):
    import torch
    import torch.nn.functional as F
    from kernels.gla.op import chunk_gla_triton
    from kernels.harness import bench_ms
    from kernels.mesa import chunk_mesa_net
    from kernels.mesa.plan import plan_for
    from kernels.mesa.solve import cg_solve
    from kernels.mesa.states import h_states
    p = argparse.ArgumentParser()
    p.add_argument("shape", nargs="*", type=int, default=[32, 2048])
    p.add_argument("--cg", type=int, default=30)
    a = p.parse_args(argv)
    B, T = a.shape
    H, K = 16, 128
    dev = "cuda"
    q = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).bfloat16()
    k = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).bfloat16()
    v = torch.randn(B, T, H, K, device=dev).bfloat16()
    g = F.logsigmoid(torch.randn(B, T, H, device=dev))
    beta = torch.sigmoid(torch.randn(B, T, H, device=dev))
    lamb = F.softplus(torch.rand(H, K, device=dev)) + 0.25
    print(f"B={B} T={T} H={H} K={K} cg={a.cg} {torch.cuda.get_device_name()}")
    peers = {"ours": lambda *x: chunk_mesa_net(*x, max_CG_iteration=a.cg)[0]}
    try:
        from fla.ops.mesa_net import chunk_mesa_net as fla_mesa
        peers["fla"] = lambda *x: fla_mesa(*x, max_CG_iteration=a.cg)[0]
    except Exception as e:
        print("fla:", e)
    for name, fn in peers.items():
        with torch.no_grad():
            f = bench_ms(lambda: fn(q, k, v, g, beta, lamb))
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, g, beta, lamb)]
        do = torch.randn_like(v)
        try:
            fb = bench_ms(lambda: torch.autograd.grad(fn(*leaves), leaves, do))
        except Exception as e:
            fb = float("nan")
            print(name, "backward:", str(e)[:200])
        print(f"{name:5s} fwd {f:8.3f} ms   fwd+bwd {fb:8.3f} ms", flush=True)
    plan = plan_for(q.dtype, q.device, B, T, H, K)
    od = plan.operand
    kk, kb = k.to(od), (beta[..., None] * k.float()).to(od)
    hs, _, _ = h_states(kb, kk, g, None, plan.states, False)
    ms = bench_ms(lambda: h_states(kb, kk, g, None, plan.states, False))
    print(f"stage 1 (H states, NS={plan.states.NS}) {ms:.3f} ms")
    for w in (4, 8):
        pl = plan_for(q.dtype, q.device, B, T, H, K, warps_cg=w)
        try:
            print(f"stage 2 (CG, {w} warps) {bench_ms(lambda: cg_solve(q, kb, kk, g, lamb, hs, a.cg, pl, od)):.3f} ms",
                  flush=True)
        except Exception as e:
            print(f"stage 2 ({w} warps):", str(e)[:200])
    x = cg_solve(q, kb, kk, g, lamb, hs, a.cg, plan, od)
    vv = v.to(od)
    print(f"stage 3 (gla output) {bench_ms(lambda: chunk_gla_triton(x, kb, vv, g, 1.0)):.3f} ms")


if __name__ == "__main__":
    sys.exit(main())
