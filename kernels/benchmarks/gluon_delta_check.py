"""Round 9 sweep: the Gluon inference march (``kernels/gluon_delta.py``, knob ``mt_gl``) against
the Triton march, one GPU call (< 3 min on an H200 when the kernels are compiled fresh).

    python -m kernels.benchmarks.gluon_delta_check [--out DIR] [--budget 240]

At the benchmark's shapes (bf16, H = 16, K = V = 128; B·T = 65,536 at T = 2048, 8192, 32768 and
B = 1 at T = 32768), for the delta rule and the gated delta rule, inference forward (no gradient):
the default (Triton march) and the Gluon march at 2, 3 and 4 pipeline stages, with one and with
two chunk ranges. Each variant's output is compared with the default's (``harness.err_ratio``,
RMS ratio; the sweep flags anything above 1e-2, the bf16 tolerance of the tests, and the GPU tests
then check the adopted configuration against a float64 reference) and timed (``harness.bench_ms``,
median ms). With ``--profile`` a ``torch.profiler`` table per kernel of the default and the first
Gluon variant at B = 1 and B = 2. Not a benchmark of record: ``bench_delta`` is.

Writes ``$OUT/gluon_delta_check.json`` (``--set bv``: ``bv_delta_check.json``; or ``--out``).
"""
from __future__ import annotations

import argparse
import json
import os
import time

from .bench_delta import H, K, V, _make_inputs, _ours

SHAPES = [(32, 2048), (8, 8192), (2, 32768), (1, 32768)]
TOL = 1e-2


def _variants(which="r9", B=1):
    """The knob settings swept: ``r9`` the round-9 Gluon marches; ``bv`` (round 10, B ≤ 2) the
    march at twice the default V-block (half the programs, so that the per-chunk kernels of later
    chunk ranges have SMs of their own) with 1–8 chunk ranges, Triton and Gluon marches."""
    if which == "bv":
        bv = 32 if B == 1 else 64
        out = [dict(mt_bv=bv, mt_seg=n) for n in (1, 2, 4, 8)]
        out += [dict(mt_gl=1, mt_bv=bv, mt_seg=n) for n in (1, 2, 4, 8)]
        out += [dict(mt_gl=3, mt_bv=bv, mt_seg=n) for n in (2, 4)]
        out += [dict(mt_seg=4), dict(mt_gl=1, mt_seg=4)]
        return out
    out = [dict(mt_gl=3, mt_gst=s) for s in (3, 2)] + [dict(mt_gl=3, mt_gst=3, mt_seg=1),
                                                         dict(mt_gl=3, mt_gst=2, mt_seg=1)]
    out += [dict(mt_gl=1, mt_gst=3), dict(mt_gl=1, mt_gst=3, mt_seg=1)]
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--budget", type=float, default=240.0, help="seconds; what is left after that is skipped")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--small", action="store_true", help="only the B = 1 and B = 2 shapes")
    p.add_argument("--set", default="r9", choices=("r9", "bv"), help="which variants (see _variants)")
    args = p.parse_args(argv)
    start = time.time()
    import torch
    from kernels import triton_delta as td
    from .explore_delta import _err, _profile
    from .harness import bench_ms, environment, err_ratio
    if not torch.cuda.is_available():
        print("gluon_delta_check needs a CUDA GPU")
        return 2
    res = {"env": environment(), "set": args.set, "tol": TOL, "shapes": SHAPES, "records": [], "profile": {}, "skipped": []}
    dev = torch.device("cuda")
    for B, T in SHAPES:
        if args.small and B > 2:
            continue
        x = _make_inputs(B, T, dev, torch.bfloat16, 0)
        for op in ("delta_rule", "gated_delta_rule"):
            fn = _ours(op)
            with torch.no_grad():
                ref = fn(**x).float()
                base = round(bench_ms(lambda: fn(**x)), 4)
                res["records"].append(dict(B=B, T=T, op=op, tune={}, ms=base))
                print(f"[{time.time() - start:6.1f}s] B{B} T{T} {op} default {base} ms", flush=True)
                for tune in _variants(args.set, B):
                    if time.time() - start > args.budget:
                        res["skipped"].append(f"B{B}_T{T}:{op}:{tune}")
                        continue
                    rec = dict(B=B, T=T, op=op, tune=tune)
                    try:
                        with td.tuning(**tune):
                            o = fn(**x)
                            torch.cuda.synchronize()
                            rec["err_vs_default"] = round(err_ratio(o.float(), ref), 6)
                            rec["ms"] = round(bench_ms(lambda: fn(**x)), 4)
                            rec["ratio_vs_default"] = round(rec["ms"] / base, 4)
                    except Exception as e:
                        rec["error"] = _err(e)
                    res["records"].append(rec)
                    print(f"[{time.time() - start:6.1f}s] {rec}", flush=True)
                if args.profile and B <= 2 and op == "gated_delta_rule":
                    prof = res["profile"][f"B{B}_T{T}"] = {}
                    prof["default"] = _profile(lambda: fn(**x))
                    for tune in ((_variants()[0], _variants()[4]) if args.set == "r9"
                                 else (_variants("bv", B)[2], _variants("bv", B)[6])):
                        with td.tuning(**tune):
                            prof[f"gluon {tune}"] = _profile(lambda: fn(**x))
            del ref
        del x
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "gluon_delta_check.json" if args.set == "r9" else f"{args.set}_delta_check.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", path)
    for r in res["records"]:
        print(f"B{r['B']:>2} T{r['T']:>5} {r['op']:<17} {str(r['tune']):<40} ms={r.get('ms')} "
              f"x={r.get('ratio_vs_default')} err={r.get('err_vs_default')} {r.get('error', '')[:80]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
