"""Compile the flash-attention kernel ahead of time for an H100/H200 (sm_90), without a GPU.

Run in a fresh process (``TRITON_INTERPRET=0``; the test suite's process interprets kernels):
``python tests/aot_compile_flash.py [--quick]`` (``--quick``: the benchmark's bf16 D = 128 causal
configurations, including the production short tiling and TMA variant, plus one of each other
launch path, about a dozen compiles; the default: all, ~60; ``--explore [names]``: the sweep's
variants). For every configuration the op can launch it prints one JSON
line: shared memory, registers and spill stack (from ``cuobjdump --dump-resource-usage``) and
whether the Hopper tensor-core instruction ``wgmma`` is used. This catches what the interpreter
accepts but the GPU compiler rejects (dot shapes, dtypes, layouts) on a CPU-only machine.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import kernels.triton_flash as tf  # noqa: E402

CONSTEXPRS = ("D", "CAUSAL", "PRECISION", "BLOCK_M", "BLOCK_N", "HEADS_INNER", "DIAG_N", "TMA", "WARP_SPEC",
              "LAZY_RESCALE", "THRESH", "PERSISTENT")
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def configs():
    """(dtype, D, causal, (BLOCK_M, BLOCK_N, warps, stages, HEADS_INNER)) for every launch path."""
    out = []
    for causal in (True, False):
        for D in (16, 32, 64, 128):
            out.append(("fp32", D, causal, tf._fixed_config(4096, D, tf.torch.float32)))
            for dt, tdt in (("fp16", tf.torch.float16), ("bf16", tf.torch.bfloat16)):
                out.append((dt, D, causal, tf._fixed_config(100, D, tdt)))
                out.append((dt, D, causal, tf._fixed_config(4096, D, tdt)))
                if D == 128 and causal:
                    out.append((dt, D, causal, tf.SHORT_CONFIG))     # production, T <= SHORT_T_MAX
                if D >= 64:
                    for c in tf._tuned_configs():
                        out.append((dt, D, causal, (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"],
                                                    c.num_warps, c.num_stages, c.kwargs["HEADS_INNER"])))
    return sorted(set(out))


def compile_one(dt, D, causal, cfg):
    fn = tf._attn_fwd_kernel
    bm, bn, warps, stages, heads_inner = cfg
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in CONSTEXPRS:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = "*" + dt
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name == "qk_scale":
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
            if name.startswith("s"):          # strides of packed [B, T, H, D] tensors
                attrs[(i,)] = [["tt.divisibility", 16]]
    const = dict(D=D, CAUSAL=causal, PRECISION="ieee" if dt == "fp32" else "tf32", BLOCK_M=bm, BLOCK_N=bn,
                 HEADS_INNER=heads_inner)
    k = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=warps, num_stages=stages))
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    usage = subprocess.run([str(CUOBJDUMP), "--dump-resource-usage", f.name], capture_output=True,
                           text=True, check=True).stdout
    os.unlink(f.name)
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    return dict(dtype=dt, D=D, causal=causal, config=list(cfg), shared=k.metadata.shared, regs=regs,
                stack=stack, wgmma="wgmma.mma_async" in k.asm["ptx"])


def quick_configs():
    full = configs()
    pick = [c for c in full if c[0] == "bf16" and c[1] == 128 and c[2]]          # the benchmark path
    pick += [c for c in full if c[0] == "fp32" and c[1] in (16, 128) and c[2]]   # CUDA-core fp32 path
    pick += [c for c in full if c[0] == "fp16" and c[1] == 16 and not c[2]]      # small D, full attention
    return pick


def compile_variant(name, var, D=128, causal=True, dt="bf16"):
    """One exploration variant of ``_attn_fwd_explore`` (kernels/benchmarks/explore_flash.py)."""
    fn = tf._attn_fwd_explore
    cfg = {**tf.VARIANT_DEFAULTS, **var}
    sig, attrs = {}, {}
    for i, arg in enumerate(fn.arg_names):
        if arg in CONSTEXPRS:
            sig[arg] = "constexpr"
        elif arg.endswith("_ptr"):
            sig[arg] = "*" + dt
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif arg == "qk_scale":
            sig[arg] = "fp32"
        else:
            sig[arg] = "i32"
            if arg.startswith("s"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    const = dict(D=D, CAUSAL=causal, PRECISION="tf32", BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
                 DIAG_N=cfg["DIAG_N"] or cfg["BLOCK_N"], HEADS_INNER=bool(cfg["HEADS_INNER"]),
                 TMA=bool(cfg["TMA"]), WARP_SPEC=bool(cfg["WARP_SPEC"]), LAZY_RESCALE=bool(cfg["LAZY_RESCALE"]),
                 THRESH=tf.RESCALE_THRESHOLD, PERSISTENT=bool(cfg["PERSISTENT"]))
    opts = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if cfg["maxnreg"] is not None:
        opts["maxnreg"] = cfg["maxnreg"]
    rec = dict(variant=name, dtype=dt, D=D, causal=causal)
    try:
        k = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32), options=opts)
    except Exception as e:  # noqa: BLE001 - report, keep going
        rec["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"[:300]
        return rec
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    usage = subprocess.run([str(CUOBJDUMP), "--dump-resource-usage", f.name], capture_output=True,
                           text=True, check=True).stdout
    os.unlink(f.name)
    ptx = k.asm["ptx"]
    rec.update(shared=k.metadata.shared, regs=int(re.search(r"REG:(\d+)", usage).group(1)),
               stack=int(re.search(r"STACK:(\d+)", usage).group(1)), wgmma="wgmma.mma_async" in ptx,
               tma="cp.async.bulk.tensor" in ptx, setmaxnreg="setmaxnreg" in ptx)
    return rec


if __name__ == "__main__" and "--explore" in sys.argv:
    from kernels.benchmarks.explore_flash import EXTRA_VARIANTS, VARIANTS
    only = [a for a in sys.argv[1:] if not a.startswith("--")]
    for name, var in VARIANTS + EXTRA_VARIANTS:
        if not only or name in only:
            print(json.dumps(compile_variant(name, var)), flush=True)
elif __name__ == "__main__":
    for dt, D, causal, cfg in (quick_configs() if "--quick" in sys.argv else configs()):
        print(json.dumps(compile_one(dt, D, causal, cfg)), flush=True)
    # the production TMA path (long causal 16-bit D = 128 with packed heads: triton_flash._launch_plan)
    for dt in (("bf16",) if "--quick" in sys.argv else ("bf16", "fp16")):
        print(json.dumps(compile_variant("production_tma", tf.TMA_CONFIG, dt=dt)), flush=True)
