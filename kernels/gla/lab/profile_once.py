"""Lab: one forward + backward of ``chunk_gla`` at a benchmark shape, for a profiler to capture.

    ncu -k regex:_gla_prep_kernel -c 1 --set detailed python3 -m kernels.gla.lab.profile_once [B T gates]

Runs the op twice (the first call compiles), bf16 q, k, v, H = 16, K = V = 128, log gates float32
(default) or bfloat16.
"""
import sys

import torch
import torch.nn.functional as F

from kernels.gla.op import chunk_gla_triton


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    B, T = (int(argv[0]), int(argv[1])) if len(argv) >= 2 else (32, 2048)
    gates = argv[2] if len(argv) >= 3 else "float32"
    H, K = 16, 128
    q, k, v = (torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = F.logsigmoid(torch.randn(B, T, H, K, device="cuda"))
    g = (g if gates == "float32" else g.to(torch.bfloat16)).requires_grad_(True)
    for _ in range(2):
        o, _ = chunk_gla_triton(q, k, v, g, K ** -0.5)
        torch.autograd.grad(o, (q, k, v, g), torch.randn_like(o))
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
