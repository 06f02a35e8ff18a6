import sys, time, torch
import kernels
from kernels.path import parallel_path_attn
from kernels.reference import path_attn_ref
from kernels.harness import err_ratio
def run(B,T,H,D,dt,gate,wdt=torch.float32):
    torch.manual_seed(0)
    q,k,v = (torch.randn(B,T,H,D, device="cuda").to(dt) for _ in range(3))
    w = torch.nn.functional.normalize(torch.randn(B,T,H,D,device="cuda"), dim=-1).to(wdt)
    beta = (2*torch.sigmoid(torch.randn(B,T,H,device="cuda"))).to(wdt)
    g = (torch.log(torch.sigmoid(torch.randn(B,T,H,device="cuda")+3))) if gate else None
    xs=[q,k,v,w,beta]+([g] if gate else [])
    xs=[x.requires_grad_(True) for x in xs]
    do = torch.randn(B,T,H,D,device="cuda").to(dt)
    o,_ = parallel_path_attn(*xs[:5], g if gate else None)
    gr = torch.autograd.grad(o,xs,do)
    xd=[x.detach().double().requires_grad_(True) for x in xs]
    od = path_attn_ref(*xd[:5], xd[5] if gate else None, scale=D**-0.5)
    grd = torch.autograd.grad(od,xd,do.double())
    res = {"o": err_ratio(o, od)}
    for n,a,b in zip("q k v w beta g".split(),gr,grd): res["d"+n]=err_ratio(a,b)
    print(B,T,H,D,dt,gate,wdt, {k:round(v,5) for k,v in res.items()}, flush=True)
for args in [(2,300,2,64,torch.float32,False),(2,300,2,64,torch.float32,True),(1,1000,2,128,torch.bfloat16,False),
             (1,1000,2,128,torch.bfloat16,True),(2,257,3,32,torch.float16,True,torch.float16),(1,4096,2,128,torch.bfloat16,False)]:
    try:
        run(*args)
    except Exception as e:
        import traceback; traceback.print_exc()
