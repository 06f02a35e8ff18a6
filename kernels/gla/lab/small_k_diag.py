"""Lab (diagnosis): gla's Triton path at small head sizes in 16-bit on the GPU, against float64."""
import torch
import torch.nn.functional as F
from kernels.gla.op import chunk_gla_triton
from kernels.harness import err_ratio
from kernels.reference import chunk_gla_ref, chunk_scalar_ref

DEV = "cuda" if torch.cuda.is_available() else "cpu"
for gate in ("scalar", "vector"):
    for K, V in ((16, 32), (32, 32), (32, 64), (64, 64), (32, 128)):
        for dt, upcast in ((torch.bfloat16, False), (torch.bfloat16, True), (torch.float32, False)):
            gen = torch.Generator().manual_seed(K + V)
            B, T, H = 1, 100, 2
            q, k = (F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1) for _ in range(2))
            v = torch.randn(B, T, H, V, generator=gen)
            g = F.logsigmoid(torch.randn(B, T, H, *((K,) if gate == "vector" else ()), generator=gen) + 2)
            do = torch.randn(B, T, H, V, generator=gen)
            ins = [x.to(DEV) for x in (q.to(dt), k.to(dt), v.to(dt), g)]
            leaves = [x.clone().requires_grad_() for x in ins]
            o, _ = chunk_gla_triton(*leaves, 1.0, plan={"upcast": upcast})
            gr = torch.autograd.grad(o, leaves, do.to(DEV).to(o.dtype))
            l64 = [x.detach().double().cpu().requires_grad_() for x in ins]
            if gate == "vector":
                o64, _ = chunk_gla_ref(*l64, 1.0)
            else:
                o64, _ = chunk_scalar_ref(l64[0], l64[1], l64[2], l64[3], None, 1.0)
            gr64 = torch.autograd.grad(o64, l64, do.double())
            errs = [err_ratio(o.cpu(), o64)] + [err_ratio(a.cpu(), b) for a, b in zip(gr, gr64)]
            print(gate, K, V, str(dt)[6:], "upcast" if upcast else "", "o dq dk dv dg:", " ".join(f"{e:.4f}" for e in errs), flush=True)
