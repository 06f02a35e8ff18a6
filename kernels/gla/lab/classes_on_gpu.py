"""Every GPU class's plan of the three families, compiled for the GPU at hand, against the PyTorch path.

    CUDA_LAUNCH_BLOCKING=1 python kernels/gla/lab/classes_on_gpu.py [75 80 89 90]

A class's tiles are valid launches on any newer GPU, so a Hopper runs the T4's, A100's and L4's plans
(not their code: a T4 compiles them for sm_75). Prints fla's RMS error ratio per op and dtype against
the float32 PyTorch implementations (outputs only; each op's backward is run too). See
``kernels/gla/NOTES.md``, "Other GPUs", "Open": the T4 plan at float16, K = 128 faulted here once.
"""
import subprocess
import sys

import torch
import torch.nn.functional as F

from kernels import reference
from kernels.backend import GPU_CLASSES, device_caps
from kernels.delta.op import delta_rule_triton
from kernels.flash.op import flash_attention_triton
from kernels.gla.op import chunk_gla_triton
from kernels.harness import err_ratio

# one process per class: a fault (an illegal address) leaves the CUDA context unusable, and the
# classes after it would not be run
archs = [int(a) for a in sys.argv[1:]] or list(GPU_CLASSES)
if len(archs) > 1:
    codes = [subprocess.run([sys.executable, __file__, str(a)]).returncode for a in archs]
    print("exit codes per class:", dict(zip(archs, codes)), flush=True)
    sys.exit(max(codes))
dev = torch.device("cuda")
print("device_caps:", device_caps(dev), torch.cuda.get_device_name(), flush=True)
torch.manual_seed(0)
B, T, H, K = 2, 1000, 4, 128
scale = K ** -0.5
for arch in archs:
    caps = GPU_CLASSES[arch]
    for dt in ((torch.bfloat16, torch.float16, torch.float32) if caps.major >= 8 else (torch.float16, torch.float32)):
        q, k, v = (torch.randn(B, T, H, K, device=dev, dtype=dt) for _ in range(3))
        kn = F.normalize(k.float(), dim=-1).to(dt)
        g = F.logsigmoid(torch.randn(B, T, H, device=dev) + 2)
        gv = F.logsigmoid(torch.randn(B, T, H, K, device=dev) + 2)
        beta = torch.rand(B, T, H, device=dev).to(dt)
        res = []
        o = flash_attention_triton(q, k, v, scale, True, caps=caps)
        res.append(("flash", err_ratio(o, reference.attention_ref(q.float(), k.float(), v.float(), scale, True))))
        for name, gg in (("linear_attn", None), ("simple_gla", g), ("gla", gv)):
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            o, ht = chunk_gla_triton(*leaves, gg, scale, None, True, caps=caps)
            o.float().sum().backward()
            torch.cuda.synchronize()
            if gg is not None and gg.dim() == 4:
                ro, _ = reference.chunk_gla_ref(q.float(), k.float(), v.float(), gg, scale, None, True)
            else:
                ro, _ = reference.chunk_scalar_ref(q.float(), k.float(), v.float(), gg, None, scale, None, True)
            res.append((name, err_ratio(o, ro)))
        for name, gg in (("delta_rule", None), ("gated_delta_rule", g)):
            leaves = [x.detach().requires_grad_() for x in (q, kn, v)]
            o, ht = delta_rule_triton(*leaves, gg, beta, scale, None, True, caps=caps)
            o.float().sum().backward()
            torch.cuda.synchronize()
            ro, _ = reference.chunk_scalar_ref(q.float(), kn.float(), v.float(), gg, beta.float(), scale, None, True)
            res.append((name, err_ratio(o, ro)))
        print(arch, str(dt).split(".")[-1], " ".join(f"{n}={e:.1e}" for n, e in res), flush=True)
