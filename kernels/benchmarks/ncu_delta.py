"""Run the delta-rule inference forward a few times at one benchmark shape, for Nsight Compute.

    ncu --kernel-name regex:_march --launch-skip 2 --launch-count 1 --set full \\
        python -m kernels.benchmarks.ncu_delta --B 1 --T 32768

A diagnostic (where a kernel's warps stall), not a benchmark: the tuning knobs come from
``LATTN_DELTA_TUNE`` as everywhere else.
"""
from __future__ import annotations

import argparse


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--T", type=int, default=32768)
    p.add_argument("--H", type=int, default=16)
    p.add_argument("--D", type=int, default=128)
    p.add_argument("--gated", action="store_true")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    import torch
    import torch.nn.functional as F
    import kernels
    g = torch.Generator(device="cuda").manual_seed(0)
    B, T, H, D = args.B, args.T, args.H, args.D
    def rnd(*s):
        return torch.randn(*s, device="cuda", generator=g)
    q = F.normalize(rnd(B, T, H, D), dim=-1).bfloat16()
    k = F.normalize(rnd(B, T, H, D), dim=-1).bfloat16()
    v = rnd(B, T, H, D).bfloat16()
    beta = torch.rand(B, T, H, device="cuda", generator=g).bfloat16()
    gate = F.logsigmoid(rnd(B, T, H)).float() if args.gated else None
    with torch.no_grad():
        for _ in range(args.reps):
            kernels.chunk_gated_delta_rule(q, k, v, gate, beta, backend="triton") if gate is not None else \
                kernels.chunk_delta_rule(q, k, v, beta, backend="triton")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
