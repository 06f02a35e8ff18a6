"""Lab (CPU): the cross-window kernels' shared memory, registers and spills on Hopper, per variant.

The compile check (``kernels/compile.py``) compiles the launches of today's plan; this compiles the
two cross-window kernels (``windows.py``) as the compile check captures them (``bench.py``'s compile
cases, 16-bit, K = V = 128) with the constexprs and launch changed: no gates (what the benchmark
times), one to three stages, the key pass's tile and ``CARRY`` (``plan.cross_carry``). It shows which
launches fit in Hopper's 227 KiB before a GPU is spent on them (``NOTES.md``, "Open").

    TRITON_INTERPRET=0 python kernels/path/lab/cross_smem.py
"""
import os

os.environ["TRITON_INTERPRET"] = "0"

from kernels.backend import GPU_CLASSES  # noqa: E402
from kernels.compile import compile_launch, family_launches  # noqa: E402

VARIANTS = [dict(HAS_G=False, num_stages=st, CARRY=carry, **tile)
            for carry in (False, True) for tile in (dict(BN=64, BM=128), dict(BN=128, BM=64))
            for st in (1, 2, 3)]


def main():
    launches = [launch for launch in family_launches("path", True, GPU_CLASSES[90])
                if getattr(launch[0], "fn", launch[0]).__name__ == "_cross_k_kernel"]
    print("kernel, variant, shared bytes (limit), registers, spilled bytes", flush=True)
    for kernel, args, kw in launches:
        for var in VARIANTS:
            rec = compile_launch(kernel, args, dict(kw, **var), 90)
            print("_cross_k_kernel", var, rec.get("shared"), f"({rec.get('smem_limit')})", rec.get("regs"),
                  rec.get("spill_bytes"), rec.get("error", "")[:120], flush=True)


if __name__ == "__main__":
    main()
