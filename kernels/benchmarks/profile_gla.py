"""Per-kernel GPU time of our GLA-family ops (forward and forward+backward), one shape.

    python -m kernels.benchmarks.profile_gla [--B 32] [--T 2048] [--fla] [--out DIR]

A diagnostic, not a benchmark of record (that is ``bench_gla``): ``torch.profiler`` attributes the
device time of one call to each kernel, which shows which kernel of an op to work on. ``--fla`` adds
fla's forward per kernel (its first call autotunes, which takes minutes). Writes
``$OUT/profile_gla.json`` and prints one line per (op, pass).
"""
from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")   # before fla is imported anywhere


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--B", type=int, default=32)
    p.add_argument("--T", type=int, default=2048)
    p.add_argument("--fla", action="store_true", help="also fla's forward (autotunes on first call)")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args(argv)
    import torch
    from .bench_gla import _fla_fns, _grads, _inputs, _our_fns
    from .explore_delta import _profile
    from .harness import environment
    if not torch.cuda.is_available():
        print("profile_gla needs a CUDA GPU")
        return 2
    fns = {"ours": _our_fns()}
    if args.fla:
        fla = _fla_fns()
        if isinstance(fla, dict):
            fns["fla"] = fla
    res = {"env": environment(), "B": args.B, "T": args.T, "dtype": "bfloat16", "profile": {}}
    for impl, table in fns.items():
        for op, fn in table.items():
            q, k, v, g, do = _inputs(op, args.B, args.T, torch.bfloat16, "cuda")
            passes = [("fwd", lambda: fn(q, k, v, g))]
            if impl == "ours":
                passes.append(("fwdbwd", lambda: _grads(fn, q, k, v, g, do)))
            for name, call in passes:
                try:
                    with torch.no_grad() if name == "fwd" else torch.enable_grad():
                        prof = _profile(call)
                except Exception as e:     # a failure is a result here
                    prof = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                res["profile"][f"{impl}:{op}:{name}"] = prof
                print(f"{impl}:{op}:{name} (ms/call): "
                      + "  ".join(f"{kn[:40]}={ms}" for kn, ms in list(prof.items())[:8]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "profile_gla.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
