"""Compile every kernel launch of a family for a GPU class, without a GPU.

    TRITON_INTERPRET=0 python -m kernels.compile flash|gla|delta|deltaformer|path|conv|mesa [--quick] [--arch 75|80|89|90]
                                                 [--smem BYTES] [--dtype bf16|fp16]

The family's Triton path (validation, the class's plan, the stages) runs on CPU tensors with every
kernel launch *captured* instead of executed (:func:`capture`); each distinct launch (kernel,
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
layouts, shared memory beyond what a block may use) on a CPU-only machine; ``tests/test_compile.py``
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

__all__ = ["capture", "compile_launch", "family_launches", "source_key", "main"]


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
    """Run the family's Triton path on CPU tensors for a set of representative calls with the plans
    of the GPU class ``caps`` (default Hopper), every launch captured: the benchmark's K = V = 128
    shapes in the class's 16-bit dtype ``half`` (bfloat16 from sm_80, float16 below), and with
    ``quick=False`` the other dtypes and head sizes."""
    import torch
    import torch.nn.functional as F
    from .backend import HOPPER, INTERPRET
    if INTERPRET:
        raise SystemExit("run with TRITON_INTERPRET=0: interpreted kernels cannot be compiled")
    caps = caps if caps is not None else HOPPER
    f16, f32 = torch.float16, torch.float32
    bf = half if half is not None else (torch.bfloat16 if caps.major >= 8 else f16)
    halves = tuple(dict.fromkeys((bf, torch.bfloat16 if caps.major >= 8 else f16, f16)))   # the class's 16-bit dtypes
    launches = []
    if family == "flash":
        from .common import gates
        from .flash import backward, forward
        from .flash.op import flash_attention_triton
        # (dtype, head size, causal, T, FoX gates): forward and backward, with and without the bias
        cases = [(bf, 128, True, T, gate) for T in (1024, 4096) for gate in (None, f32)]
        cases += [(f32, 128, True, 100, f32), (f16, 16, False, 100, None), (bf, 64, True, 1024, None)]
        if not quick:
            cases += [(dt, D, c, T, None) for dt in halves + (f32,) for D in (16, 32, 64, 128)
                      for c in (True, False) for T in (100, 4096)]
        with capture([forward, backward, gates]) as sink:
            for dt, D, causal, T, gate in cases:
                q = torch.randn(1, T, 2, D, dtype=dt, requires_grad=True)
                g = None if gate is None else (-torch.rand(1, T, 2)).to(gate).requires_grad_()
                o = flash_attention_triton(q, q, q, 0.1, causal, g, caps=caps)
                torch.autograd.grad(o.float().sum(), [q] + ([] if g is None else [g]))
        launches = sink
    elif family == "gla":
        from .gla import backward, march, prep
        from .gla.op import chunk_gla_triton
        cases = [(g, bf, 128, 128, 300, ns, gd) for g in (0, 1, 2) for ns in (None, 3)
                 for gd in ((f32, bf) if g else (None,))]
        if caps.major < 9:   # float32 takes other tiles off Hopper: the widest head size it runs in Triton
            kf = 128 if caps.major >= 8 else 64
            cases += [(1, f32, kf, kf, 300, None, f32)]
        if not quick:
            cases += [(1, f32, 64, 64, 100, None, f32), (2, f32, 64, 64, 100, 2, f32), (1, f16, 16, 16, 100, None, f16),
                      (2, f16, 16, 16, 100, None, f16), (2, bf, 256, 256, 100, None, bf), (2, bf, 32, 16, 100, 2, f32)]
        with capture([prep, march, backward]) as sink:
            for gate, dt, K, V, T, ns, gdt in cases:
                B, H = 1, 2
                q = torch.randn(B, T, H, K, dtype=dt, requires_grad=True)
                v = torch.randn(B, T, H, V, dtype=dt, requires_grad=True)
                g = None if gate == 0 else (-torch.rand(B, T, H, *((K,) if gate == 2 else ()))).to(gdt).requires_grad_()
                h0 = torch.randn(B, H, K, V, requires_grad=True)
                o, ht = chunk_gla_triton(q, q, v, g, 0.1, h0, True, num_segments=ns, caps=caps)
                torch.autograd.grad((o.float().sum() + ht.sum()), [q, v, h0] + ([g] if g is not None else []),
                                    allow_unused=True)
        launches = sink
    elif family == "delta":
        from .common import solve
        from .delta import backward, comba, march, wy
        from .delta.op import delta_rule_triton
        # (dtype, K, V, gated, batch × heads, plan overrides): B·H = 256 takes V-blocks of 64, B·H = 2
        # blocks of 16 with stored scores; two chunk ranges take the narrow scores configuration
        cases = [(bf, 128, 128, gated, (64, 4), {}) for gated in (False, True)]
        cases += [(bf, 128, 128, True, (1, 2), {"march_ranges": 2, "march_scores_bk": 64})]
        if caps.major < 9:   # float32 off Hopper (per-chunk gradients by PyTorch at K = 128 there)
            cases += [(f32, 128, 128, True, (1, 2), {})]
        if not quick:
            cases += [(dt, K, V, True, (1, 2), {}) for dt in (f16, f32) for K, V in ((16, 16), (64, 128), (128, 64))]
        with capture([solve, wy, march, backward, comba]) as sink:
            for dt, K, V, gated, (B, H), over in cases:
                T = 130
                q = torch.randn(B, T, H, K, dtype=dt, requires_grad=True)
                k = F.normalize(torch.randn(B, T, H, K), dim=-1).to(dt).requires_grad_()
                v = torch.randn(B, T, H, V, dtype=dt, requires_grad=True)
                beta = torch.rand(B, T, H, dtype=dt, requires_grad=True)
                g = -torch.rand(B, T, H, requires_grad=True) if gated else None
                with torch.no_grad():          # the inference forward (T form)
                    delta_rule_triton(q, k, v, g, beta, 0.1, None, True, plan=dict(over), caps=caps)
                o, ht = delta_rule_triton(q, k, v, g, beta, 0.1, None, True, plan=dict(over), caps=caps)
                torch.autograd.grad(o.float().sum() + ht.sum(), [q, k, v, beta] + ([g] if gated else []))
                if gated and caps.major >= 8:  # chunk_comba's change of variables (sm_75 runs the delta rule in PyTorch)
                    mapped = comba.comba_map(k, v, g, beta)
                    torch.autograd.grad(sum(t.float().sum() for t in mapped), [k, v, g, beta])
        launches = sink
    elif family == "deltaformer":
        from .deltaformer import pseudo
        from .deltaformer.op import deltaformer_attn_triton
        from .flash import backward, forward
        # (dtype, K, V, B·H, T, β dtype): the benchmark's head size with the column split (B·H = 2)
        # and without it (B·H = 256), several spans (T = 3000) and one (T = 100)
        cases = [(bf, 128, 128, (1, 2), 3000, f32), (bf, 128, 128, (128, 2), 300, bf), (f32, 64, 64, (1, 2), 100, f32)]
        if not quick:
            cases += [(dt, K, V, (1, 2), 300, dt) for dt in halves + (f32,) for K, V in ((16, 16), (32, 128), (128, 64))]
        with capture([pseudo, forward, backward]) as sink:
            for dt, K, V, (B, H), T, bdt in cases:
                q = torch.randn(B, T, H, K, dtype=dt, requires_grad=True)
                v = torch.randn(B, T, H, V, dtype=dt, requires_grad=True)
                beta = torch.rand(B, T, H, dtype=bdt, requires_grad=True)
                o = deltaformer_attn_triton(q, q, v, beta, 0.1, caps=caps)
                torch.autograd.grad(o.float().sum(), [q, v, beta])
        launches = sink
    elif family == "path":
        from .common import gates, solve
        from .path import backward as path_bwd, forward as path_fwd, local
        from .path.op import parallel_path_attn_triton
        # (dtype, K, V, T, w/β dtype, gate): the benchmark's head size, with and without the FoX gate
        cases = [(bf, 128, 128, 300, f32, None), (bf, 128, 128, 300, bf, f32), (f32, 64, 64, 100, f32, f32)]
        if not quick:
            cases += [(dt, K, V, 100, dt, None) for dt in halves + (f32,) for K, V in ((16, 16), (32, 128), (128, 64))]
        with capture([solve, gates, local, path_fwd, path_bwd]) as sink:
            for dt, K, V, T, wdt, gate in cases:
                q = torch.randn(1, T, 2, K, dtype=dt, requires_grad=True)
                v = torch.randn(1, T, 2, V, dtype=dt, requires_grad=True)
                w = torch.randn(1, T, 2, K, dtype=wdt, requires_grad=True)
                beta = torch.rand(1, T, 2, dtype=wdt, requires_grad=True)
                g = None if gate is None else (-torch.rand(1, T, 2)).to(gate).requires_grad_()
                o = parallel_path_attn_triton(q, q, v, w, beta, g, 0.1, caps=caps)
                torch.autograd.grad(o.float().sum(), [q, v, w, beta] + ([] if g is None else [g]))
        launches = sink
    elif family == "conv":
        from .conv import backward as conv_bwd, forward as conv_fwd
        from .conv.op import causal_conv1d_triton
        # (dtype, D, W, activation, bias/residual/state/final state): the benchmark's setting, then others
        # (the marching forward up to W = 4, the tiled one at W = 8)
        cases = [(bf, 2048, 4, "silu", False), (bf, 4096, 4, "silu", True), (bf, 2048, 4, None, False),
                 (bf, 512, 8, "silu", True)]
        if not quick:
            cases += [(dt, D, W, a, o) for dt in halves + (f32,) for D, W in ((64, 2), (200, 3), (512, 8))
                      for a in (None, "silu") for o in (False, True)]
        with capture([conv_fwd, conv_bwd]) as sink:
            for dt, D, W, act, opts in cases:
                x = torch.randn(2, 300, D, dtype=dt, requires_grad=True)
                w = torch.randn(D, W, dtype=dt, requires_grad=True)
                b, r, s = ((torch.randn(*sh, dtype=dt, requires_grad=True) if opts else None)
                           for sh in ((D,), (2, 300, D), (2, D, W)))
                y, ht = causal_conv1d_triton(x, w, b, r, s, opts, act, caps=caps)
                loss = y.float().sum() + (ht.float().sum() if ht is not None else 0)
                torch.autograd.grad(loss, [t for t in (x, w, b, r, s) if t is not None])
        launches = sink
    elif family == "mesa":
        from .gla import backward as gla_bwd, march, prep
        from .mesa import prep as mesa_prep, solve as mesa_solve, states as mesa_states
        from .mesa.op import chunk_mesa_net_triton
        import torch.nn.functional as F
        # (dtype, K, V, T, num_segments, states, gate dtype): the benchmark's K = V = 128 with and without
        # gla's sequence split, initial and final states; then float32, float16, small or unequal heads
        cases = [(bf, 128, 128, 300, ns, st, gd) for ns in (None, 3) for st in (False, True) for gd in (f32, bf)]
        if not quick:
            cases += [(dt, K, V, 100, None, True, f32) for dt in (f16, f32) for K, V in ((16, 16), (32, 128), (64, 256))]
        with capture([mesa_prep, mesa_states, mesa_solve, march, gla_bwd, prep]) as sink:
            for dt, K, V, T, ns, st, gd in cases:
                B, H = 1, 2
                q = torch.randn(B, T, H, K, dtype=dt, requires_grad=True)
                k = F.normalize(torch.randn(B, T, H, K), dim=-1).to(dt).requires_grad_()
                v = torch.randn(B, T, H, V, dtype=dt, requires_grad=True)
                g = (-torch.rand(B, T, H)).to(gd).requires_grad_()
                beta = torch.rand(B, T, H, dtype=gd, requires_grad=True)
                lamb = (torch.rand(H, K) + 0.25).requires_grad_()
                h0 = torch.eye(K).expand(B, H, K, K).contiguous().requires_grad_() if st else None
                hv0 = torch.randn(B, H, K, V, requires_grad=True) if st else None
                o, hk, hv = chunk_mesa_net_triton(q, k, v, g, beta, lamb, 30, h0, hv0, st, caps=caps,
                                                  plan={"num_segments": ns})
                loss = o.float().sum() + (hk.sum() + hv.sum() if st else 0)
                leaves = [q, k, v, g, beta, lamb] + ([h0, hv0] if st else [])
                torch.autograd.grad(loss, leaves, allow_unused=True)
        launches = sink
    else:
        raise SystemExit(f"unknown family {family!r}; choose flash, gla, delta, deltaformer, path, conv or mesa")
    return _dedup(launches)


def source_key() -> str:
    """A digest of everything a compile check's result depends on: the source of every shipped
    module of ``kernels`` (the lab, the benchmarks and the survey apart) and Triton's version. The
    check's cache (``tests/test_compile.py``) is valid while this stays the same."""
    import triton
    root = Path(__file__).resolve().parent
    h = hashlib.sha256(f"triton {triton.__version__}".encode())
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if "lab" in rel.parts or rel.name.startswith("bench") or rel.name == "survey.py":
            continue
        h.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def main(argv=None):
    import torch
    from .backend import GPU_CLASSES
    p = argparse.ArgumentParser(prog="python -m kernels.compile", description=__doc__.split("\n\n")[0])
    p.add_argument("family", choices=("flash", "gla", "delta", "deltaformer", "path", "conv", "mesa"))
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
