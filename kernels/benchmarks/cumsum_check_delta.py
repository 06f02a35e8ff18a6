"""Float32 error of the delta-rule inference forward under harsh gates, by how the within-chunk
cumulative log gate ``b`` is summed (a diagnostic for kernels/NOTES_delta.md, round 6).

    python -m kernels.benchmarks.cumsum_check_delta      (a CUDA GPU; run from the repository root)

Inputs are those of ``tests/test_kernel_delta.py::test_gpu_large_shapes`` (B = 2, H = 3; T = 777
with harsh gates, log decays of −1000 and more, and T = 2049 with mild ones). Prints the RMS error
ratio of ``o`` and of the final state against the float64 recurrence for ``b`` from the kernel's
float64 scan (the default) and from PyTorch's float32 ``cumsum`` (the round-5 code). (The run in
``kernels/results/logs/cumsum_check_round6.log`` also had each with the round-5 row loop of the
solve, since removed: the same errors.)
"""
from __future__ import annotations

import os
import sys


def _torch_cumsum(g, beta, B, T, H, NT, with_beta=False):
    """Round 5's PyTorch version of ``triton_delta._chunk_cumsum`` (a float32 scan of the gate;
    ``β`` as the kernel lays it out)."""
    import torch
    from kernels import triton_delta as td
    C = td.CHUNK
    gp = torch.zeros(B, H, NT * C, dtype=torch.float32, device=g.device)
    gp[:, :, :T] = g.float().transpose(1, 2)
    bt = None
    if with_beta:
        bt = torch.zeros(B, H, NT * C, dtype=torch.float32, device=g.device)
        bt[:, :, :T] = beta.float().transpose(1, 2)
        bt = bt.view(B * H, NT * C)
    return gp.view(B, H, NT, C).cumsum(-1).view(B * H, NT * C).contiguous(), bt


def main():
    import torch
    if not torch.cuda.is_available():
        print("cumsum_check_delta needs a CUDA GPU")
        return 2
    sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
    import test_kernel_delta as t
    from kernels import reference, triton_delta as td
    kernel_scan = td._chunk_cumsum
    try:
        for T_, K, V in ((777, 128, 64), (2049, 128, 128)):
            inp = t._inputs(2, T_, 3, K, V, gated=True, seed=T_ + K, device="cuda", beta_max=1.0,
                            harsh=T_ == 777)
            for name, scan in (("float64 scan (default)", kernel_scan), ("torch float32 cumsum", _torch_cumsum)):
                td._chunk_cumsum = scan
                o, ht, leaves = t._run(inp, torch.float32, gated=True, fs=True, grad=False)
                r = {n: x.double() for n, x in leaves.items()}
                ro, rht = reference.chunk_scalar_ref(r["q"], r["k"], r["v"], r["g"], r["beta"], K ** -0.5,
                                                     r["h0"], True)
                print(T_, K, V, name, "o", float(t._rms_ratio(o, ro)), "ht", float(t._rms_ratio(ht, rht)),
                      flush=True)
    finally:
        td._chunk_cumsum = kernel_scan
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
