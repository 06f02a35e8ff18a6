"""Benchmark: our Triton chunk_linear_attn / chunk_simple_gla / chunk_gla against fla's.

Usage (on a GPU)::

    python -m kernels.benchmarks.bench_gla            # full run, prints a table
    python -m kernels.benchmarks.bench_gla --quick    # one shape, fewer repetitions
    python -m kernels.benchmarks.bench_gla --write    # also writes kernels/results/bench_gla.json
    python -m kernels.benchmarks.bench_gla --explore  # forward launch-parameter sweep (ours only)

Shapes: bfloat16, H = 16, K = V = 128, B*T = 65,536 tokens with T in {2048, 8192, 32768}, plus
B = 1, T = 32768. Passes: ``fwd`` (inputs without grad) and ``fwdbwd`` (forward + backward of
``(o * do).sum()`` via ``torch.autograd.grad``). Times are medians of ``triton.testing.do_bench``
(``harness.bench_ms``). No initial state, no final state (the training configuration).

Inputs are realistic and never zero: q, k, v standard normal (keys are *not* L2-normalised, as in
fla's own tests), log gates ``g = logsigmoid(N(0, 1))`` (scalar ``[B, T, H]`` for simple GLA, per
key channel ``[B, T, H, K]`` for GLA), scale ``K ** -0.5``.

Accuracy: outputs and gradients of ours and fla's, against the float64 chunkwise reference of
:mod:`kernels.reference`, as fla's ``err_ratio`` (RMS(x - ref) / RMS(ref)). To bound memory the
check runs on a slice: batch element 0 and the first ``min(T, 8192)`` tokens (``err_T`` in the
record), all 16 heads.

fla is imported with ``FLA_DISABLE_BACKEND_DISPATCH=1`` (its plain Triton path); every fla call is
wrapped, and a failure (fla 0.6.0 refuses some backward passes on Triton 3.6 / Hopper) is recorded
as ``{"ms": null, "note": <error>}`` rather than worked around.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")   # before fla is imported anywhere

SHAPES_FULL = [(32, 2048), (8, 8192), (2, 32768), (1, 32768)]     # (B, T)
SHAPES_QUICK = [(32, 2048)]
OPS = ["linear_attn", "simple_gla", "gla"]
H, K, V = 16, 128, 128
ERR_T_MAX = 8192


def _parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m kernels.benchmarks.bench_gla",
                                description="Time our Triton chunk_linear_attn / chunk_simple_gla / "
                                            "chunk_gla against fla's on a GPU (bf16, H=16, K=V=128).")
    p.add_argument("--quick", action="store_true", help="one shape (B=32, T=2048) and fewer repetitions")
    p.add_argument("--write", action="store_true", help="write kernels/results/bench_gla.json")
    p.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of " + ",".join(OPS))
    p.add_argument("--no-fla", action="store_true", help="time only our kernels")
    p.add_argument("--explore", action="store_true",
                   help="instead of the benchmark: time our forward of the three ops over a "
                        "grid of launch parameters (triton_gla.TUNE) at B=32,T=2048 and B=1,T=32768; "
                        "for gla: old vs new forward, per-kernel device times, the prep kernel's and "
                        "the march's parameters (gla first; --ops limits the ops); "
                        "writes $OUT/explore_gla.json (or kernels/results/logs/explore_gla.json)")
    p.add_argument("--budget-s", type=float, default=200.0,
                   help="wall-clock budget in seconds (default 200): once spent, the remaining "
                        "measurements are recorded as skipped (ms null, with a note), so one run stays "
                        "bounded; with --write the JSON is rewritten after every shape, so whatever was "
                        "measured is kept even if the run is killed")
    return p.parse_args(argv)


def _fla_fns():
    """fla's three ops, or the import error as a string."""
    try:
        from fla.ops.gla import chunk_gla
        from fla.ops.linear_attn import chunk_linear_attn
        from fla.ops.simple_gla import chunk_simple_gla
    except Exception as e:  # pragma: no cover - depends on the machine
        return f"import fla failed: {type(e).__name__}: {e}"
    return {
        "linear_attn": lambda q, k, v, g: chunk_linear_attn(q, k, v, scale=K ** -0.5, normalize=False)[0],
        "simple_gla": lambda q, k, v, g: chunk_simple_gla(q, k, v, g=g, scale=K ** -0.5)[0],
        "gla": lambda q, k, v, g: chunk_gla(q, k, v, g, scale=K ** -0.5)[0],
    }


def _our_fns():
    import kernels
    return {
        "linear_attn": lambda q, k, v, g: kernels.chunk_linear_attn(q, k, v, scale=K ** -0.5)[0],
        "simple_gla": lambda q, k, v, g: kernels.chunk_simple_gla(q, k, v, g, scale=K ** -0.5)[0],
        "gla": lambda q, k, v, g: kernels.chunk_gla(q, k, v, g, scale=K ** -0.5)[0],
    }


def _inputs(op, B, T, dtype, device, seed=0):
    import torch
    import torch.nn.functional as F
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, T, H, K, device=device, dtype=dtype, generator=gen)
    k = torch.randn(B, T, H, K, device=device, dtype=dtype, generator=gen)
    v = torch.randn(B, T, H, V, device=device, dtype=dtype, generator=gen)
    if op == "linear_attn":
        g = None
    elif op == "simple_gla":
        g = F.logsigmoid(torch.randn(B, T, H, device=device, dtype=torch.float32, generator=gen)).to(dtype)
    else:
        g = F.logsigmoid(torch.randn(B, T, H, K, device=device, dtype=torch.float32, generator=gen)).to(dtype)
    do = torch.randn(B, T, H, V, device=device, dtype=dtype, generator=gen)
    return q, k, v, g, do


def _grads(fn, q, k, v, g, do):
    import torch
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v) + ((g,) if g is not None else ())]
    o = fn(*leaves[:3], leaves[3] if g is not None else None)
    grads = torch.autograd.grad(o, leaves, do)
    names = ["dq", "dk", "dv", "dg"][:len(leaves)]
    return o.detach(), dict(zip(names, grads))


def _reference(op, q, k, v, g, do):
    """float64 chunkwise reference (kernels.reference) on float64 copies: o and gradients."""
    import torch
    from kernels import reference
    q, k, v, do = (x.to(torch.float64) for x in (q, k, v, do))
    g = None if g is None else g.to(torch.float64)
    if op == "gla":
        fn = lambda q, k, v, g: reference.chunk_gla_ref(q, k, v, g, K ** -0.5)[0]  # noqa: E731
    else:
        fn = lambda q, k, v, g: reference.chunk_scalar_ref(q, k, v, g, None, K ** -0.5)[0]  # noqa: E731
    return _grads(fn, q, k, v, g, do)


def _errors(fn, op, sl, ref):
    """err_ratio of fn's o and grads vs the float64 reference on the slice ``sl``."""
    from kernels.benchmarks.harness import err_ratio
    o, grads = _grads(fn, *sl)
    o_ref, grads_ref = ref
    err = {"o": err_ratio(o, o_ref)}
    for name in grads_ref:
        err[name] = err_ratio(grads[name], grads_ref[name])
    return err


def _short(e: BaseException) -> str:
    msg = f"{type(e).__name__}: {e}".strip().replace("\n", " ")
    return msg[:300]


def _kernel_times(fn, n=10):
    """Average device time per call of every kernel that ``fn`` launches (torch.profiler), in ms."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None)
        if t is None:
            t = getattr(ev, "cuda_time_total", 0.0)
        if t:
            out[ev.key[:60]] = round(t / n / 1000.0, 4)
    return out


def explore(args):
    """Forward launch-parameter sweep of our kernels (a tuning aid, not the benchmark)."""
    import itertools
    import json
    from pathlib import Path
    import torch
    from kernels import triton_gla
    from kernels.benchmarks import harness
    t0 = time.perf_counter()
    rows = []
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else Path(__file__).resolve().parents[1] / "results" / "logs"
    out.mkdir(parents=True, exist_ok=True)
    grid = [dict(BV_f=bv, warps_f=w, stages_f=st) for bv, w, st in itertools.product((64, 128), (4, 8), (2, 3))]
    grid += [dict(BV_f=64, warps_f=8, stages_f=3, split=False)]
    # chunk_gla (round 3): the old forward (round 2) against the new one (prep kernel + lean march),
    # the prep kernel's warps and K-slice, and the new march's tile / warps / stages
    grid_gla = [dict(gla_fwd="old")]
    grid_gla += [dict(gla_fwd="new", warps_p=w, BK_p=bk) for w, bk in itertools.product((4, 8), (32, 64, 128))]
    grid_gla += [dict(gla_fwd="new", BV_f=bv, warps_f=w, stages_f=st)
                 for bv, w, st in itertools.product((64, 128), (4, 8), (2, 3))]
    grid_gla += [dict(gla_fwd="new", split=False)]
    ops = [o for o in args.ops.split(",") if o in OPS]
    # gla first: it is the op this sweep is for now (the budget cuts the last rows)
    for op in sorted(ops, key=lambda o: o != "gla"):
        fn = _our_fns()[op]
        for B, T in ((32, 2048), (1, 32768)):
            q, k, v, g, _ = _inputs(op, B, T, torch.bfloat16, "cuda")
            triton_gla.TUNE.clear()
            ref = fn(q, k, v, g)
            if op == "gla":
                for variant in ("old", "new"):   # where the time goes: device time per kernel
                    triton_gla.TUNE.clear()
                    triton_gla.TUNE["gla_fwd"] = variant
                    per_kernel = _kernel_times(lambda: fn(q, k, v, g))
                    rows.append({"op": op, "B": B, "T": T, "tune": {"gla_fwd": variant}, "per_kernel_ms": per_kernel})
                    print(f"{op:11s} B={B:2d} T={T:5d} gla_fwd={variant} per kernel (ms): {per_kernel}", flush=True)
            for tune in [{}] + (grid_gla if op == "gla" else grid):
                if time.perf_counter() - t0 > args.budget_s:
                    break
                triton_gla.TUNE.clear()
                triton_gla.TUNE.update(tune)
                try:
                    o = fn(q, k, v, g)
                    same = harness.err_ratio(o, ref)
                    ms = harness.bench_ms(lambda: fn(q, k, v, g), warmup=5, rep=20)
                    note = ""
                except Exception as e:
                    ms, same, note = None, None, _short(e)
                rows.append({"op": op, "B": B, "T": T, "tune": tune or "default", "fwd_ms": ms,
                             "err_vs_default": same, "note": note})
                print(f"{op:11s} B={B:2d} T={T:5d} {str(tune or 'default'):60s} fwd {ms}  "
                      f"(vs default config: {same}) {note}", flush=True)
            triton_gla.TUNE.clear()
            (out / "explore_gla.json").write_text(json.dumps({"env": harness.environment(), "rows": rows},
                                                             indent=1, default=float))
    print(f"wrote {out / 'explore_gla.json'} ({time.perf_counter() - t0:.0f} s)")
    return 0


def main(argv=None):
    args = _parse(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench_gla needs a CUDA GPU (the comparison is against fla's GPU kernels); nothing to do.")
        return 1
    if args.explore:
        return explore(args)
    from kernels.benchmarks import harness
    dtype = torch.bfloat16
    device = "cuda"
    shapes = SHAPES_QUICK if args.quick else SHAPES_FULL
    warmup, rep = (5, 20) if args.quick else (10, 50)
    ops = [o for o in args.ops.split(",") if o]
    for o in ops:
        if o not in OPS:
            raise SystemExit(f"--ops: unknown op {o!r}; choose from {OPS}")
    ours = _our_fns()
    fla = {} if args.no_fla else _fla_fns()
    fla_import_error = fla if isinstance(fla, str) else None
    impls = [("ours", ours)] + ([] if args.no_fla else [("fla", fla)])
    records = []
    t_start = time.perf_counter()
    budget_note = f"skipped: the run's time budget (--budget-s {args.budget_s:g}) was spent"

    def over_budget():
        return time.perf_counter() - t_start > args.budget_s

    def write():
        from kernels import triton_gla
        config = {"dtype": "bfloat16", "H": H, "K": K, "V": V, "shapes": shapes, "ops": ops,
                  "triton_gla_tune": dict(triton_gla.TUNE),
                  "warmup_ms": warmup, "rep_ms": rep, "err_T_max": ERR_T_MAX, "budget_s": args.budget_s,
                  "elapsed_s": round(time.perf_counter() - t_start, 1),
                  "inputs": "q,k,v ~ N(0,1) (keys not normalised); g = logsigmoid(N(0,1)); scale K^-0.5; "
                            "no initial/final state",
                  "fla_env": {"FLA_DISABLE_BACKEND_DISPATCH": os.environ.get("FLA_DISABLE_BACKEND_DISPATCH")}}
        return harness.write_results("bench_gla", config, records)
    # shapes outer, ops inner: if the budget runs out, it is the last shapes of every op that are
    # skipped, not a whole op
    for B, T in shapes:
        for op in ops:
            if over_budget():
                for impl, _ in impls:
                    for pass_ in ("fwd", "fwdbwd"):
                        records.append({"impl": impl, "op": op, "T": T, "B": B, "H": H, "K": K, "V": V,
                                        "dtype": "bfloat16", "err_T": min(T, ERR_T_MAX), "pass": pass_,
                                        "ms": None, "err": None, "note": budget_note})
                print(f"{op:11s} B={B:2d} T={T:5d}  {budget_note}", flush=True)
                continue
            t_shape = time.perf_counter()
            q, k, v, g, do = _inputs(op, B, T, dtype, device)
            err_T = min(T, ERR_T_MAX)
            sl = tuple(None if x is None else x[:1, :err_T].contiguous() for x in (q, k, v, g, do))
            try:
                ref = _reference(op, *sl)
            except Exception as e:  # pragma: no cover
                ref = None
                print(f"[{op} T={T}] reference failed: {_short(e)}", file=sys.stderr)
            torch.cuda.empty_cache()
            for impl, fns in impls:
                base = {"impl": impl, "op": op, "T": T, "B": B, "H": H, "K": K, "V": V,
                        "dtype": "bfloat16", "err_T": err_T}
                if fla_import_error is not None and impl == "fla":
                    for pass_ in ("fwd", "fwdbwd"):
                        records.append(dict(base, **{"pass": pass_, "ms": None, "err": None,
                                                     "note": fla_import_error}))
                    continue
                fn = fns[op]
                err, err_note = None, ""
                t_impl = time.perf_counter()
                if ref is not None:
                    try:
                        err = _errors(fn, op, sl, ref)
                    except Exception as e:
                        err_note = "accuracy check failed: " + _short(e)
                torch.cuda.empty_cache()
                # forward
                try:
                    if over_budget():
                        raise RuntimeError(budget_note)
                    ms = harness.bench_ms(lambda: fn(q, k, v, g), warmup=warmup, rep=rep)
                    note = err_note
                except Exception as e:
                    ms, note = None, _short(e)
                # do_bench scales its repetitions to `rep` milliseconds, so a slow kernel costs a
                # few calls; the budget is checked before each timed pass
                records.append(dict(base, **{"pass": "fwd", "ms": ms,
                                             "err": None if err is None else {"o": err["o"]},
                                             "note": note}))
                # forward + backward
                leaves = [x.detach().requires_grad_(True) for x in (q, k, v) + ((g,) if g is not None else ())]

                def fwdbwd():
                    o = fn(*leaves[:3], leaves[3] if g is not None else None)
                    return torch.autograd.grad(o, leaves, do)
                try:
                    if over_budget():
                        raise RuntimeError(budget_note)
                    ms = harness.bench_ms(fwdbwd, warmup=warmup, rep=rep)
                    note = err_note
                except Exception as e:
                    ms, note = None, _short(e)
                    if os.environ.get("BENCH_GLA_TRACEBACK"):
                        traceback.print_exc()
                records.append(dict(base, **{"pass": "fwdbwd", "ms": ms, "err": err, "note": note}))
                del leaves
                torch.cuda.empty_cache()
                r = records[-2:]
                for x in r:
                    x["wall_s"] = round(time.perf_counter() - t_impl, 1)   # accuracy check + both timings
                print(f"{impl:4s} {op:11s} B={B:2d} T={T:5d}  fwd {r[0]['ms']}  fwdbwd {r[1]['ms']}  "
                      f"err {err} {r[0]['note'] or ''} {r[1]['note'] or ''}  "
                      f"[{time.perf_counter() - t_impl:.1f} s; {time.perf_counter() - t_start:.0f} s total]",
                      flush=True)
            del q, k, v, g, do, sl, ref
            torch.cuda.empty_cache()
            print(f"  ({op} B={B} T={T}: {time.perf_counter() - t_shape:.1f} s)", flush=True)
            if args.write:
                write()

    if args.write:
        path = write()
        print(f"wrote {path}")

    # summary table (last)
    def find(impl, op, B, T, pass_):
        for r in records:
            if (r["impl"], r["op"], r["B"], r["T"], r["pass"]) == (impl, op, B, T, pass_):
                return r
        return None
    print()
    hdr = f"{'op':11s} {'B':>3s} {'T':>6s} {'pass':7s} {'ours ms':>9s} {'fla ms':>9s} {'ours/fla':>9s} " \
          f"{'max err ours':>13s} {'max err fla':>12s}"
    print(hdr)
    print("-" * len(hdr))
    for op in ops:
        for B, T in shapes:
            for pass_ in ("fwd", "fwdbwd"):
                a = find("ours", op, B, T, pass_)
                b = find("fla", op, B, T, pass_)
                ma = a["ms"] if a else None
                mb = b["ms"] if b else None
                ratio = f"{ma / mb:9.3f}" if (ma and mb) else f"{'-':>9s}"
                ea = max(a["err"].values()) if a and a.get("err") else None
                eb = max(b["err"].values()) if b and b.get("err") else None
                fmt = lambda x, w: f"{x:{w}.3f}" if x is not None else f"{'-':>{w}s}"  # noqa: E731
                fe = lambda x, w: f"{x:{w}.2e}" if x is not None else f"{'-':>{w}s}"  # noqa: E731
                print(f"{op:11s} {B:3d} {T:6d} {pass_:7s} {fmt(ma, 9)} {fmt(mb, 9)} {ratio} "
                      f"{fe(ea, 13)} {fe(eb, 12)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
