"""Compile every kernel launch of a family for a GPU class, without a GPU.

    TRITON_INTERPRET=0 python -m kernels.compile flash|gla|delta|deltaformer|path|mesa|conv [--quick] [--arch 75|80|89|90]
                                                 [--smem BYTES] [--dtype bf16|fp16]

The family's Triton path (validation, the class's plan, the stages) runs on CPU tensors, for the
calls the family declares (``COMPILE`` in ``kernels/<family>/bench.py``: the modules that hold its
kernels and the calls that exercise them), with every kernel launch *captured* instead of executed
(:func:`capture`); each distinct launch (kernel,
constexprs, argument dtypes, warps, stages) is compiled with ``triton.compile`` for ``sm_<arch>``
(``sm_90a`` on Hopper) and its PTX assembled by the ``ptxas`` bundled with Triton
(:func:`compile_launch`). The plans are asked for that class's decision (``caps=``, see
:data:`kernels.backend.GPU_CLASSES`: T4 sm_75, A100 sm_80, L4 sm_89, H100/H200 sm_90). One JSON
line per launch: shared memory against the class's per-block limit (``smem_limit``, ``fits``;
``--smem`` checks against another limit, e.g. to see the check fail), registers, spilled bytes,
which products the compiler emitted (Hopper ``wgmma``, Ampere-style ``mma.sync``, else CUDA-core
FMAs) and whether TMA is used, or the error. The cases' 16-bit dtype is bfloat16 from sm_80 and
float16 below (``--dtype`` forces one: bfloat16 on sm_75 must stop with the ops' ``ValueError``).
This catches what the interpreter accepts but the GPU compiler rejects (dot shapes, dtypes,
layouts, shared memory beyond what a block may use) on a CPU-only machine; ``tests/kernels/test_compile.py``
runs it for every family and class. The interpreter must be off (``kernels`` turns it on when no
GPU is present), so it runs in a fresh process.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["capture", "compile_launch", "family_launches", "source_key", "NOT_COMPILED", "main"]


class _Capture:
    """Stands in for a jit kernel (or an autotuner): ``k[grid](*args, **kw)`` records the launch."""

    def __init__(self, kernel, sink):
        self.kernel, self.sink = kernel, sink
        self.fn = getattr(kernel, "fn", kernel)

    def __getitem__(self, grid):
        def record(*args, **kw):
            configs = getattr(self.kernel, "configs", None)
            if configs:            # an autotuner: every candidate configuration is a launch
                for c in configs:
                    self.sink.append((self.kernel.fn, args, dict(kw, **c.kwargs, num_warps=c.num_warps,
                                                                 num_stages=c.num_stages)))
            else:
                self.sink.append((self.kernel, args, kw))
        return record


@contextlib.contextmanager
def capture(modules):
    """Within the block, every jit kernel and autotuner defined in ``modules`` records its launches
    in the yielded list instead of running."""
    import triton
    sink, saved = [], []
    for mod in modules:
        for name, obj in list(vars(mod).items()):
            if isinstance(obj, (triton.runtime.jit.JITFunction, triton.runtime.autotuner.Autotuner)):
                saved.append((mod, name, obj))
                setattr(mod, name, _Capture(obj, sink))
    try:
        yield sink
    finally:
        for mod, name, obj in saved:
            setattr(mod, name, obj)


_TY = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.int64": "i64",
       "torch.int32": "i32", "torch.int8": "i8"}


def compile_launch(kernel, args, kw, arch: int = 90, smem_limit: int | None = None) -> dict:
    """Compile one captured launch for ``sm_<arch>``; returns the resource report (or the error).
    ``fits``: the shared memory is within ``smem_limit`` (default: the class's per-block limit)."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    kw = dict(kw)
    opts = {"num_warps": kw.pop("num_warps", 4), "num_stages": kw.pop("num_stages", 3)}
    fn = getattr(kernel, "fn", kernel) if not isinstance(kernel, triton.runtime.jit.JITFunction) else kernel
    sig, attrs = {}, {}
    for i, (name, x) in enumerate(zip(fn.arg_names, args)):
        if isinstance(x, torch.Tensor):
            sig[name] = "*" + _TY[str(x.dtype)]
        elif isinstance(x, bool):
            sig[name] = "i1"
        elif isinstance(x, int):
            sig[name] = "i32" if abs(x) < 2 ** 31 else "i64"
        else:
            sig[name] = "fp32"
        # the 16-divisibility Triton's launcher assumes for pointers and integers divisible by 16
        # (without it the loads are neither vectorised nor pipelined)
        if isinstance(x, torch.Tensor) or (type(x) is int and x % 16 == 0 and name not in _no_spec(fn)):
            attrs[(i,)] = [["tt.divisibility", 16]]
    # constexprs the launch did not pass take the kernel's defaults
    for name in fn.arg_names[len(args):]:
        sig[name] = "constexpr"
    dts = [_TY[str(x.dtype)] for x in args if isinstance(x, torch.Tensor)]
    rec = {"kernel": fn.__name__, "dtype": dts[0] if dts else None,
           "constexprs": {k: (v if isinstance(v, (int, float, bool, str)) else str(v)) for k, v in kw.items()},
           **opts}
    t0 = time.perf_counter()
    try:
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=kw, attrs=attrs),
                           target=GPUTarget("cuda", arch, 32), options=opts)
    except Exception as e:  # noqa: BLE001 - reported, the caller decides
        lines = str(e).strip().splitlines()
        rec["error"] = f"{type(e).__name__}: {lines[-1] if lines else ''}"[:400]
        return rec
    from triton.backends.nvidia.compiler import sm_arch_from_capability
    from .backend import gpu_class
    ptx = k.asm["ptx"]
    rc, log = _ptxas_report(ptx, sm_arch_from_capability(arch))
    regs = re.search(r"Used (\d+) registers", log)
    spill = [int(a) + int(b) for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)]
    limit = smem_limit if smem_limit is not None else gpu_class(arch).smem
    rec.update(compile_s=round(time.perf_counter() - t0, 2), ptxas_rc=rc, shared=k.metadata.shared, smem_limit=limit, fits=k.metadata.shared <= limit,
               regs=int(regs.group(1)) if regs else None, spill_bytes=max(spill) if spill else 0,
               wgmma="wgmma.mma_async" in ptx, mma_sync="mma.sync" in ptx, tma="cp.async.bulk.tensor" in ptx)
    return rec


def _ptxas_report(ptx: str, sm: str):
    """``(returncode, ptxas -v log)`` of assembling ``ptx`` for ``sm``, kept beside Triton's cache
    (keyed by the PTX's hash) so that a re-run costs nothing, as Triton's own cache makes the compile."""
    import triton
    key = hashlib.sha256((sm + ptx).encode()).hexdigest()
    cache = Path(triton.knobs.cache.dir) / "lattn_ptxas"
    hit = cache / f"{key}.json"
    if hit.exists():
        try:
            return tuple(json.loads(hit.read_text()))
        except ValueError:
            pass
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    r = subprocess.run([str(ptxas), f"-arch={sm}", "-v", f.name, "-o", os.devnull], capture_output=True, text=True)
    os.unlink(f.name)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = hit.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps([r.returncode, r.stderr]))
        tmp.replace(hit)
    except OSError:
        pass
    return r.returncode, r.stderr


def _no_spec(fn):
    return set(getattr(fn, "do_not_specialize", ()) or ())


def _dedup(launches):
    seen, out = set(), []
    for kernel, args, kw in launches:
        key = (getattr(kernel, "fn", kernel).__name__,
               tuple(str(a.dtype) if hasattr(a, "dtype") else type(a).__name__ for a in args),
               tuple(sorted((k, str(v)) for k, v in kw.items())))
        if key not in seen:
            seen.add(key)
            out.append((kernel, args, kw))
    return out


def family_launches(family: str, quick: bool = False, caps=None, half=None):
    """Run the family's Triton path on CPU tensors for its representative calls with the plans of
    the GPU class ``caps`` (default Hopper), every launch captured. The calls are the family's own
    (``COMPILE`` in ``kernels/<family>/bench.py``, a :class:`kernels.harness.CompileCases`): the
    benchmark's K = V = 128 shapes in the class's 16-bit dtype ``half`` (bfloat16 from sm_80, float16
    below), and with ``quick=False`` the other dtypes and head sizes."""
    import importlib
    import torch
    from . import FAMILIES
    from .backend import HOPPER, INTERPRET
    if INTERPRET:
        raise SystemExit("run with TRITON_INTERPRET=0: interpreted kernels cannot be compiled")
    if family not in FAMILIES:
        raise SystemExit(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    caps = caps if caps is not None else HOPPER
    f16 = torch.float16
    bf = half if half is not None else (torch.bfloat16 if caps.major >= 8 else f16)
    halves = tuple(dict.fromkeys((bf, torch.bfloat16 if caps.major >= 8 else f16, f16)))   # the class's 16-bit dtypes
    spec = importlib.import_module(f"kernels.{family}.bench").COMPILE
    with capture([importlib.import_module(m) for m in spec.modules]) as sink:
        for case in spec.cases(caps, quick, bf, halves):
            spec.run(case, caps)
    return _dedup(sink)


#: Shipped modules that no launch depends on: the survey, and results' files, tables and figures.
NOT_COMPILED = ("survey.py", "report.py", "results.py", "catalog.py")


def source_key() -> str:
    """A digest of everything a compile check's result depends on: the source of every shipped
    module of ``kernels`` (the lab, the survey and the other benchmarks, ``bench_*.py``, apart, and
    the modules that only read, write or draw results, ``NOT_COMPILED``; a family's ``bench.py``
    declares its compile cases, so it counts) and Triton's version. The check's cache
    (``tests/kernels/test_compile.py``) is valid while this stays the same."""
    import triton
    root = Path(__file__).resolve().parent
    h = hashlib.sha256(f"triton {triton.__version__}".encode())
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if "lab" in rel.parts or rel.name.startswith("bench_") or str(rel) in NOT_COMPILED:
            continue
        h.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def main(argv=None):
    import torch
    from .backend import GPU_CLASSES
    p = argparse.ArgumentParser(prog="python -m kernels.compile", description=__doc__.split("\n\n")[0])
    from . import FAMILIES
    p.add_argument("family", choices=FAMILIES)
    p.add_argument("--quick", action="store_true", help="the benchmark shapes and one of each other path")
    p.add_argument("--arch", type=int, default=90, choices=sorted(GPU_CLASSES),
                   help="the GPU class: 75 T4, 80 A100, 89 L4, 90 H100/H200")
    p.add_argument("--smem", type=int, default=None, help="check shared memory against this many bytes per block "
                   "instead of the class's limit")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default=None, help="the cases' 16-bit dtype "
                   "(default: bf16 from sm_80, fp16 below)")
    args = p.parse_args(argv)
    caps = GPU_CLASSES[args.arch]
    half = {"bf16": torch.bfloat16, "fp16": torch.float16, None: None}[args.dtype]
    try:
        launches = family_launches(args.family, args.quick, caps, half)
    except ValueError as e:          # what the ops reject for this class (bfloat16 on sm_75)
        print(json.dumps({"family": args.family, "arch": args.arch, "rejected": str(e)}), flush=True)
        return 2
    failures = 0
    print(json.dumps({"family": args.family, "arch": args.arch, "launches": len(launches)}), flush=True)
    for kernel, a, kw in launches:
        rec = compile_launch(kernel, a, kw, args.arch, args.smem)
        failures += "error" in rec or rec.get("ptxas_rc", 0) != 0 or not rec.get("fits", False)
        print(json.dumps(rec), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
