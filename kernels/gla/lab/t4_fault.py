"""Which launch of the T4 plan faults on a Hopper GPU, and which tiling does not (NOTES.md, "Open").

    python kernels/gla/lab/t4_fault.py            # every candidate, one process each (CUDA_LAUNCH_BLOCKING=1)

The T4's plan for linear attention at float16, K = V = 128 (``_fma_tiles``: BV_f = 32 on 8 warps, one
stage) stopped with an illegal memory access at the forward march's first launch on the H200
(``lab/logs/classes_on_gpu_75_h200_20261129.log``), while the interpreter runs the same plan right.
Each candidate below changes one field of that plan (``chunk_gla_triton(plan=...)``) and runs the
forward and backward of linear attention and simple GLA (B = 2, T = 1000, H = 4, the shape of the
fault) in its own process, so that a fault leaves the others' CUDA context alone. Prints one JSON line
per candidate: the overrides, ``ok`` or the error's last line, and the output's RMS error ratio
against the PyTorch path in float32.
"""
import json
import os
import subprocess
import sys

CANDIDATES = [
    {},                                   # the T4 plan as it is (expected: the fault)
    {"warps_f": 4},
    {"BV_f": 16},
    {"BV_f": 64, "warps_f": 4},
    {"stages_f": 2},
    {"num_segments": 1},
    {"warps_f": 4, "warps_dv": 4, "warps_dq": 4},
]


def run_one(over: dict) -> dict:
    import torch
    import torch.nn.functional as F
    from kernels import reference
    from kernels.backend import GPU_CLASSES
    from kernels.gla.op import chunk_gla_triton
    from kernels.harness import err_ratio
    caps = GPU_CLASSES[75]
    torch.manual_seed(0)
    B, T, H, K = 2, 1000, 4, 128
    q, k, v = (torch.randn(B, T, H, K, device="cuda", dtype=torch.float16) for _ in range(3))
    g = F.logsigmoid(torch.randn(B, T, H, device="cuda") + 2)
    over = dict(over)
    ns = over.pop("num_segments", None)
    out = {}
    for name, gg in (("linear_attn", None), ("simple_gla", g)):
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        o, _ = chunk_gla_triton(*leaves, gg, K ** -0.5, None, True, num_segments=ns, plan=over, caps=caps)
        o.float().sum().backward()
        torch.cuda.synchronize()
        ro, _ = reference.chunk_scalar_ref(q.float(), k.float(), v.float(), gg, None, K ** -0.5, None, True)
        out[name] = float(err_ratio(o, ro))
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(json.dumps(run_one(json.loads(sys.argv[1]))), flush=True)
        sys.exit(0)
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
    for over in CANDIDATES:
        r = subprocess.run([sys.executable, __file__, json.dumps(over)], capture_output=True, text=True, env=env,
                           timeout=600)
        last = (r.stdout.strip().splitlines() or [""])[-1]
        res = json.loads(last) if r.returncode == 0 and last.startswith("{") else \
            (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(json.dumps({"overrides": over, "result": res}), flush=True)
