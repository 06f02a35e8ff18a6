"""Lab: compile PaTH's float32 launches at K = 128 (A100 and Hopper plans) on the CPU: time, shared memory, spills.

    TRITON_CACHE_DIR=$(mktemp -d) python kernels/path/lab/f32_compile.py

Its log (``logs/a100_f32_k128_compile_cpu.log``) was taken before the A100 plan sent float32 at
K > 64 to PyTorch; run today, the A100 half captures no launch (the PyTorch path launches none).
"""
import sys, json, time, torch
from kernels.compile import capture, compile_launch, _dedup
from kernels.backend import GPU_CLASSES, HOPPER
from kernels.path.bench import COMPILE, _compile_run
import importlib
for cls in (80, 90):
    caps = GPU_CLASSES[cls]
    with capture([importlib.import_module(m) for m in COMPILE.modules]) as sink:
        _compile_run((torch.float32, 128, 64, 100, torch.float32, None), caps)
    for kernel, args, kw in _dedup(sink):
        name = getattr(getattr(kernel, "fn", kernel), "__name__", str(kernel))
        if name in ("_gate_cumsum_kernel", "_cumsum_kernel"):
            continue
        r = compile_launch(kernel, args, kw, arch=cls)
        print(cls, json.dumps({k: r.get(k) for k in ("kernel", "constexprs", "num_warps", "compile_s", "regs", "spill_bytes", "shared", "error")}), flush=True)
