"""Lab: which stage goes wrong at K = 16 with 16-bit inputs on the H200? (diagnosis, not shipped)

    python3 -m kernels.path.lab.k16_diag            # every case, one process each (a CUDA fault
                                                     # poisons the process that meets it)
    python3 -m kernels.path.lab.k16_diag CASE       # one case

The run of record (``lab/logs/k16_diag_h200.log``) named the plan of the time ``shipped``: 128
query rows, IEEE per-block products. Each case runs ``test_half_inputs``' failing input (bf16,
B = 1, T = 150, H = 2, K = 16, V = 32, no gate) through :class:`kernels.path.op.PathFunction`
with one plan field changed, and prints every
gradient's RMS error ratio against the float64 reference (fla's measure; its tolerances 0.005 for
``o``, 0.008 for ``dq, dk, dv``, 0.015 for ``dw``, 0.02 for ``dbeta``).
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

CASES = {     # plan fields changed from the plan of the time: 128 rows, IEEE per-block products
    "shipped": dict(rows=128),
    "local-tf32": dict(rows=128, local_precision="tf32"),
    "local-4warps": dict(rows=128, local=("L", 4)),
    "rows64": dict(rows=64),
    "pass-ieee": dict(rows=128, precision="ieee"),
    "transport-fp32": dict(rows=128, transport="float32"),
}


def run_case(name: str) -> None:
    import torch
    from kernels.backend import Launch
    from kernels.path.op import PathFunction
    from kernels.path.plan import plan_for
    from kernels.reference import path_attn_ref
    spec = dict(CASES[name])
    dtype, K = torch.bfloat16, 16
    B, T, H, V = 1, 150, 2, 32
    gen = torch.Generator().manual_seed(9)
    q, k = (torch.randn(B, T, H, K, generator=gen) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=gen)
    w = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    beta = 2 * torch.rand(B, T, H, generator=gen)
    do = torch.randn(B, T, H, V, generator=gen)
    plan = plan_for(dtype, torch.device("cuda"), K=K, rows=spec.pop("rows"))
    if "local" in spec:
        spec["local"] = (Launch(spec.pop("local")[1], 1), Launch(4, 1))
    if "transport" in spec:
        spec["transport"] = getattr(torch, spec["transport"])
    plan = dataclasses.replace(plan, **spec)
    print(name, plan, flush=True)
    ins = [x.to(dtype).cuda().requires_grad_() for x in (q, k, v)] + [w.cuda().requires_grad_(),
                                                                     beta.cuda().requires_grad_()]
    o = PathFunction.apply(*ins[:5], None, K ** -0.5, plan)
    gs = torch.autograd.grad(o, ins, do.to(dtype).cuda())
    torch.cuda.synchronize()
    r64 = [x.detach().double().cpu().requires_grad_() for x in ins]
    o64 = path_attn_ref(*r64, scale=K ** -0.5)
    g64 = torch.autograd.grad(o64, r64, do.double())
    errs = {}
    for n, a, r in zip(("o", "dq", "dk", "dv", "dw", "dbeta"), (o,) + gs, (o64,) + g64):
        a, r = a.detach().double().cpu(), r.detach()
        errs[n] = ((a - r).pow(2).mean().sqrt() / r.pow(2).mean().sqrt()).item()
    print(name, " ".join(f"{n} {e:.2e}" for n, e in errs.items()), flush=True)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        run_case(argv[0])
        return 0
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    for name in CASES:
        try:
            p = subprocess.run([sys.executable, "-m", "kernels.path.lab.k16_diag", name], env=env,
                               capture_output=True, text=True, timeout=90)
            out = p.stdout + p.stderr
            lines = [ln for ln in out.splitlines() if ln.startswith(name) or "Error" in ln
                     or "/kernels/" in ln]
            print("\n".join(lines[-8:]) or out[-800:], flush=True)
        except subprocess.TimeoutExpired:
            print(name, "TIMEOUT (90 s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
