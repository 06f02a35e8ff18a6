"""Compile the Gluon marches of ``kernels/gluon_delta.py`` for an H100/H200 (sm_90a) *without a GPU*.

    TRITON_INTERPRET=0 python tests/aot_compile_gluon_delta.py

Gluon kernels do not run in Triton's CPU interpreter, so the CPU tests cannot execute them; this
script at least puts them through the whole GPU compiler (Gluon → TTGIR → PTX → ``ptxas``) at the
launch configurations ``march_gluon`` / ``march_gluon_wu`` use, and prints one JSON line per
configuration: shared memory, registers, spill bytes and whether the products became Hopper
``wgmma`` instructions. ``tests/test_kernel_delta.py::test_gluon_marches_compile_for_hopper``
runs it. (``TRITON_INTERPRET=0`` because importing ``kernels`` on a machine without a GPU would
otherwise switch Triton to its interpreter.)
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (kernel, BV, STAGES, GATED): the V-blocks the forward picks (16 at B·H = 16, 32 at 32, 64 above),
# the stage counts it uses, both gate settings for the T form
CONFIGS = [("_march_gl_kernel", 16, 3, True), ("_march_gl_kernel", 32, 3, True), ("_march_gl_kernel", 64, 2, True),
           ("_march_gl_kernel", 16, 3, False), ("_march_gl_wu_kernel", 16, 3, True), ("_march_gl_wu_kernel", 32, 2, True)]
K = V = 128


def _desc_type(block, dtype):
    from triton.experimental.gluon import language as gl
    lay = gl.NVMMASharedLayout.get_default_for(block, dtype)
    name = {gl.bfloat16: "bf16", gl.float32: "fp32"}[dtype]
    return f"tensordesc<{name}[{', '.join(str(b) for b in block)}],{lay!r}>"


def _signature(kern, BV):
    from triton.experimental.gluon import language as gl
    blocks = dict(q_desc=[64, K], k_desc=[64, K], v_desc=[64, BV], t_desc=[64, 64], p_desc=[64, 64],
                  w_desc=[64, K], u_desc=[64, BV])
    sig = {}
    for n in kern.arg_names:
        if n in blocks:
            sig[n] = _desc_type(blocks[n], gl.bfloat16)
        elif n in ("be_desc", "g_desc"):
            sig[n] = _desc_type([64], gl.float32)
        elif n == "o_ptr":
            sig[n] = "*bf16"
        elif n.endswith("_ptr"):
            sig[n] = "*fp32"
        elif n == "scale":
            sig[n] = "fp32"
        elif n in ("T", "H", "NTC", "N0", "N1"):
            sig[n] = "i32"
    return sig


def compile_one(name, BV, stages, gated):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from kernels import gluon_delta as gd
    kern = getattr(gd, name)
    meta = dict(K=K, V=V, BV=BV, STAGES=stages, HAS_H0=True, STORE_HT=True, GATED=gated)
    sig = _signature(kern, BV)
    full = {n: ("constexpr" if n in meta else sig[n]) for n in kern.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kern.arg_names) if str(full[n]).startswith("*")}
    c = triton.compile(GluonASTSource(fn=kern, signature=full, constexprs=meta, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as d:
        ptx = Path(d) / "k.ptx"
        ptx.write_text(c.asm["ptx"])
        r = subprocess.run([str(ptxas), "-v", "--gpu-name=sm_90a", str(ptx), "-o", os.devnull],
                           capture_output=True, text=True)
    info = r.stderr
    regs = re.search(r"Used (\d+) registers", info)
    spill = [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", info)]
    return {"kernel": name, "BV": BV, "stages": stages, "gated": gated, "shared": c.metadata.shared,
            "registers": int(regs.group(1)) if regs else None, "spill_bytes": max(spill) if spill else 0,
            "wgmma": "wgmma.mma_async" in c.asm["ptx"], "ptxas_rc": r.returncode}


def main():
    for cfg in CONFIGS:
        try:
            row = compile_one(*cfg)
        except Exception as exc:   # reported, and the test fails on it
            row = {"kernel": cfg[0], "BV": cfg[1], "stages": cfg[2], "gated": cfg[3], "error": repr(exc)[:2000]}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
