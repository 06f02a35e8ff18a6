import torch, triton, kernels
from kernels.path import parallel_path_attn
for B,T in [(32,2048),(1,32768)]:
    H,D=16,128
    q,k,v=(torch.randn(B,T,H,D,device="cuda",dtype=torch.bfloat16) for _ in range(3))
    w=torch.nn.functional.normalize(torch.randn(B,T,H,D,device="cuda"),dim=-1)
    beta=2*torch.sigmoid(torch.randn(B,T,H,device="cuda"))
    f=lambda: parallel_path_attn(q,k,v,w,beta)[0]
    with torch.no_grad():
        ms=triton.testing.do_bench(f, warmup=5, rep=20)
    xs=[x.requires_grad_(True) for x in (q,k,v,w,beta)]
    do=torch.randn_like(q)
    step=lambda: torch.autograd.grad(parallel_path_attn(*xs)[0], xs, do)
    ms2=triton.testing.do_bench(step, warmup=3, rep=10)
    print(B,T,"fwd",round(ms,3),"fwdbwd",round(ms2,3),flush=True)
