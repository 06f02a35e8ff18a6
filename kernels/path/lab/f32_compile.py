"""Lab: compile PaTH's float32 launches at K = 128 (A100 and Hopper plans) on the CPU: time,
shared memory, spills.

    TRITON_CACHE_DIR=$(mktemp -d) TRITON_INTERPRET=0 python kernels/path/lab/f32_compile.py

Its log (``logs/a100_f32_k128_compile_cpu.log``) was taken before the A100 plan sent float32 at
K > 64 to PyTorch; run today, the A100 half captures no launch (the PyTorch path launches none).
"""
import importlib
import json

import torch

from kernels.backend import GPU_CLASSES
from kernels.compile import capture, compile_launch
from kernels.path.bench import COMPILE

CASE = (torch.float32, 128, 64, 100, torch.float32, None)     # the compile check's float32 K = 128 case
FIELDS = ("kernel", "constexprs", "num_warps", "compile_s", "regs", "spill_bytes", "shared", "error")

for arch in (80, 90):
    with capture([importlib.import_module(m) for m in COMPILE.modules]) as sink:
        COMPILE.run(CASE, GPU_CLASSES[arch])
    seen = set()
    for kernel, args, kw in sink:
        name = getattr(getattr(kernel, "fn", kernel), "__name__", str(kernel))
        if name.endswith("cumsum_kernel") or (name, str(sorted(kw.items()))) in seen:
            continue
        seen.add((name, str(sorted(kw.items()))))
        r = compile_launch(kernel, args, kw, arch=arch)
        print(arch, json.dumps({k: r.get(k) for k in FIELDS}), flush=True)
