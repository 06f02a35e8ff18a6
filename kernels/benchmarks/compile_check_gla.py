"""Compile every kernel launch of :mod:`kernels.triton_gla` for a GPU target, without a GPU.

Usage: ``python -m kernels.benchmarks.compile_check_gla [--arch 90] [--gates 012]``

The host code (``_forward``/``_backward``) is run on CPU tensors with the kernel launches captured
instead of executed; each captured launch is compiled with ``triton.compile`` for ``sm_<arch>`` and
its PTX assembled with the ``ptxas`` bundled with Triton (``-v``), which reports registers and
spills. This catches what the interpreter accepts but the GPU compiler rejects (dot shapes, dtypes,
non-constexpr globals, ...). It is a development tool, not a test: it takes a few minutes.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m kernels.benchmarks.compile_check_gla")
    p.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 for H100/H200")
    p.add_argument("--gates", default="012", help="which gates: 0 none, 1 scalar, 2 vector")
    p.add_argument("--only", default="", help="comma-separated kernel names to compile (default: all)")
    p.add_argument("--k128", action="store_true", help="only the bf16 K = V = 128 cases (the benchmark's)")
    p.add_argument("--tune", default="", help='JSON dict for triton_gla.TUNE, e.g. \'{"warps_p": 8}\'')
    p.add_argument("--sass", action="store_true",
                   help="also print a census of the SASS (nvdisasm of the cubin): exponentials (MUFU.EX2), "
                        "tensor-core ops (HGMMA/HMMA), shared-memory and local-memory (spill) traffic, "
                        "shuffles, barriers, and the static instruction count")
    args = p.parse_args(argv)
    from kernels._common import INTERPRET
    if INTERPRET:
        # `kernels` was imported with Triton's interpreter on (no GPU here): rerun in a fresh process
        # that hides the missing GPU from `kernels` so that the kernels are compiled, not interpreted.
        if os.environ.get("_COMPILE_CHECK_GLA_CHILD"):
            raise SystemExit("could not switch off TRITON_INTERPRET")
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["_COMPILE_CHECK_GLA_CHILD"] = "1"
        code = ("import sys, runpy, torch; torch.cuda.is_available = lambda: True; "
                "sys.argv = ['compile_check_gla'] + sys.argv[1:]; "
                "runpy.run_module('kernels.benchmarks.compile_check_gla', run_name='__main__')")
        return subprocess.call([sys.executable, "-c", code] + list(argv if argv is not None else sys.argv[1:]),
                               env=env)
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    import kernels.triton_gla as M
    if args.tune:
        import json
        M.TUNE.update(json.loads(args.tune))
    target = GPUTarget("cuda", args.arch, 32)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    launches = []

    class Capture:
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            return lambda *a, **kw: launches.append((self.fn, grid, a, kw))

    helpers = ("_gla_level", "_gla_chunk_scores", "_r16", "_st", "_mop", "_gla_level_mm", "_mul16")      # called inside kernels, not launched
    for name in dir(M):
        obj = getattr(M, name)
        if isinstance(obj, triton.runtime.jit.JITFunction) and name not in helpers:
            setattr(M, name, Capture(obj))
    ty = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}

    def compile_one(fn, a, kw):
        kw = dict(kw)
        opts = {"num_warps": kw.pop("num_warps", 4)}
        if "num_stages" in kw:
            opts["num_stages"] = kw.pop("num_stages")
        sig = {}
        for name, x in zip(fn.arg_names, a):
            if isinstance(x, torch.Tensor):
                sig[name] = "*" + ty[x.dtype]
            elif isinstance(x, bool):
                sig[name] = "i1"
            elif isinstance(x, int):
                sig[name] = "i32"
            else:
                sig[name] = "fp32"
        for name in kw:
            sig[name] = "constexpr"
        # the 16-divisibility that Triton's launcher assumes for tensor pointers and for integer
        # arguments divisible by 16 (without it the loads are not vectorised nor pipelined)
        attrs = {(i,): [["tt.divisibility", 16]] for i, x in enumerate(a)
                 if isinstance(x, torch.Tensor) or (type(x) is int and x % 16 == 0)}
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=kw, attrs=attrs), target=target,
                           options=opts)
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(k.asm["ptx"])
        r = subprocess.run([ptxas, f"-arch=sm_{args.arch}a", "-v", f.name, "-o", os.devnull],
                           capture_output=True, text=True)
        os.unlink(f.name)
        info = "; ".join(line.split("ptxas info    :")[-1].strip() for line in r.stderr.splitlines()
                         if "Used" in line or "spill" in line)
        if args.sass:
            info += " | SASS " + sass_census(k.asm["cubin"])
        return info, opts["num_warps"], k.metadata.shared

    def sass_census(cubin):
        """Static counts of selected SASS instruction classes (a loop body counts once)."""
        import re
        with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
            f.write(cubin)
        r = subprocess.run([os.path.join(os.path.dirname(ptxas), "nvdisasm"), "-c", f.name],
                           capture_output=True, text=True)
        os.unlink(f.name)
        ops = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", r.stdout, re.M)
        classes = {"EX2": ("MUFU.EX2",), "MMA": ("HGMMA", "HMMA"), "LDS": ("LDS", "LDSM"), "STS": ("STS",),
                   "LDL/STL": ("LDL", "STL"), "SHFL": ("SHFL",), "BAR": ("BAR",), "LDG": ("LDG", "LDGSTS")}
        cnt = {c: sum(1 for o in ops if o.split(".")[0] in [x.split(".")[0] for x in pre]
                      and (c != "EX2" or o.startswith("MUFU.EX2"))) for c, pre in classes.items()}
        return " ".join(f"{c}={n}" for c, n in cnt.items()) + f" total={len(ops)}"

    try:   # the first triton.compile of a process can trip over a harness detail; warm it up
        import triton.language as tl

        @triton.jit
        def _warm(x):
            tl.store(x, 1.0)
        triton.compile(ASTSource(fn=_warm, signature={"x": "*fp32"}, constexprs={}), target=target)
    except Exception:
        pass

    cases = [  # gate, K, V, dtype, T, B, H, num_segments
        (0, 128, 128, torch.bfloat16, 300, 2, 2, None), (1, 128, 128, torch.bfloat16, 300, 2, 2, None),
        (2, 128, 128, torch.bfloat16, 300, 2, 2, None), (0, 128, 128, torch.bfloat16, 300, 1, 1, 3),
        (1, 128, 128, torch.bfloat16, 300, 1, 1, 3), (2, 128, 128, torch.bfloat16, 300, 1, 1, 3),
        (0, 128, 128, torch.float32, 300, 1, 1, 3), (1, 64, 64, torch.float32, 100, 1, 1, None),
        (2, 64, 64, torch.float32, 100, 1, 1, 2), (1, 16, 16, torch.float16, 100, 1, 1, None),
        (2, 16, 16, torch.float16, 100, 1, 1, None), (1, 256, 256, torch.bfloat16, 100, 1, 1, None),
        (2, 256, 256, torch.bfloat16, 100, 1, 1, None), (2, 32, 16, torch.bfloat16, 100, 1, 1, 2)]
    seen, failures = set(), 0
    for gate, K, V, dtype, T, B, H, ns in cases:
        if str(gate) not in args.gates:
            continue
        if args.k128 and not (K == 128 and V == 128 and dtype == torch.bfloat16):
            continue
        q = torch.randn(B, T, H, K, dtype=dtype)
        v = torch.randn(B, T, H, V, dtype=dtype)
        g = None if gate == 0 else -torch.rand(B, T, H, *((K,) if gate == 2 else ())).to(dtype)
        launches.clear()
        user_tune = dict(M.TUNE)
        # the vector gate has two forwards (TUNE['gla_fwd']); compile both unless --tune picks one
        for variant in (("old", "new") if gate == 2 and "gla_fwd" not in user_tune else (None,)):
            if variant is not None:
                M.TUNE["gla_fwd"] = variant
            o, ht, inits, cfg = M._forward(q, q, v, g, 0.1, torch.randn(B, H, K, V), True, True, ns)
            M._backward(q, q, v, g, 0.1, inits, ht, torch.randn_like(o), torch.randn(B, H, K, V), cfg, True)
            M.TUNE.clear()
            M.TUNE.update(user_tune)
        for fn, _, a, kw in launches:
            key = (fn.__name__, tuple(x.dtype if isinstance(x, torch.Tensor) else type(x).__name__ for x in a),
                   tuple(sorted(kw.items())))
            if key in seen or (args.only and fn.__name__ not in args.only.split(",")):
                continue
            seen.add(key)
            t0 = time.time()
            try:
                info, warps, smem = compile_one(fn, a, kw)
                print(f"OK   gate={gate} K={K:3d} V={V:3d} {str(dtype)[6:]:8s} {fn.__name__:22s} "
                      f"{time.time() - t0:5.1f}s warps={warps} smem={smem} | {info}", flush=True)
            except Exception as e:
                failures += 1
                print(f"FAIL gate={gate} K={K} V={V} {str(dtype)[6:]} {fn.__name__}: {type(e).__name__}: "
                      f"{str(e)[:2000]}", flush=True)
    print(f"{len(seen)} launch configurations, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
