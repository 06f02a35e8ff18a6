"""Time each stage of parallel_path_attn on the GPU (lab: where the time goes)."""
import dataclasses, torch, triton
from kernels.backend import Launch
from kernels.path.plan import plan_for
from kernels.path.local import prepare_blocks, local_backward
from kernels.path.forward import path_forward
from kernels.path.backward import path_backward

def ms(f):
    return round(triton.testing.do_bench(f, warmup=3, rep=10), 3)

for B, T in [(32, 2048), (1, 32768)]:
    H, D = 16, 128
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    w = torch.nn.functional.normalize(torch.randn(B, T, H, D, device="cuda"), dim=-1)
    beta = 2 * torch.sigmoid(torch.randn(B, T, H, device="cuda"))
    plan = plan_for(q.dtype, q.device)
    w = w.to(plan.transport)
    qt, kh, u, wt, aloc, tm = prepare_blocks(q, k, w, beta, plan)
    res = {"prepare": ms(lambda: prepare_blocks(q, k, w, beta, plan))}
    for warps, stages in [(4, 2), (4, 1), (8, 1), (8, 2)]:
        p2 = dataclasses.replace(plan, fwd=(Launch(warps, stages),))
        try:
            res[f"fwd w{warps}s{stages}"] = ms(lambda: path_forward(qt, kh, u, wt, aloc, v, None, D**-0.5, p2))
        except Exception as e:
            res[f"fwd w{warps}s{stages}"] = str(e)[:60]
    o, lse = path_forward(qt, kh, u, wt, aloc, v, None, D**-0.5, plan)
    do = torch.randn_like(o)
    res["bwd"] = ms(lambda: path_backward(qt, kh, u, wt, aloc, v, do, o, lse, None, D**-0.5, plan))
    dqt, dkh, gw, hu, daloc, dv, dG = path_backward(qt, kh, u, wt, aloc, v, do, o, lse, None, D**-0.5, plan)
    res["local_bwd"] = ms(lambda: local_backward(q, k, w, beta, tm, dqt, dkh, gw, hu, daloc, plan, torch.float32))
    print(B, T, res, flush=True)
