"""Benchmark: causal softmax attention forward, our Triton kernel vs PyTorch SDPA vs fla.

    python -m kernels.benchmarks.bench_flash            # full sweep, writes kernels/results/bench_flash.json
    python -m kernels.benchmarks.bench_flash --quick    # small sweep for a Colab GPU (prints only)
    python -m kernels.benchmarks.bench_flash --quick --write

Timed shapes: bf16, H = 16, D = 128, B = 65536 // T (so B·T = 65,536 tokens), T from 1024 to 16384,
causal, forward only. Implementations:

- ``triton``: :func:`kernels.flash_attention` (``backend="triton"``) on ``[B, T, H, D]``;
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` on the ``[B, H, T, D]``
  transposed *views* of the same tensors (no copy in the timed region), PyTorch's default backend
  choice; ``sdpa_flash`` / ``sdpa_cudnn`` force one backend (recorded for context, may be absent);
- ``fla``: ``fla.ops.attn.parallel_attn`` when ``fla`` imports (always causal).

Each output is compared with a float64 reference on a slice (batch 0, 2 heads): ``err`` is fla's
RMS ratio (:func:`harness.err_ratio`), ``max_abs_err`` the max absolute error. A correctness sweep
over odd shapes (all three dtypes) is recorded with ``ms = null``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")   # before fla is imported anywhere

import torch  # noqa: E402

from . import harness  # noqa: E402

NAME = "bench_flash"
H, D = 16, 128
TOKENS = 65536
T_FULL = [1024, 2048, 4096, 8192, 16384]
T_QUICK, TOKENS_QUICK = [1024, 2048], 16384
SWEEP_T = [1, 17, 1000, 1023, 4097]
SWEEP_D = [16, 32, 64, 128]
SWEEP_DTYPES = [torch.float16, torch.bfloat16, torch.float32]
# Pass/fail bound recorded with the sweep (max abs error, outputs |o| <~ 4): probabilities and the
# output are rounded to the input dtype (bf16 8-bit, fp16 11-bit mantissa); float32 is IEEE.
SWEEP_TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
SWEEP_BUDGET_S = 100.0
DEVICE = "cuda"   # module-level so a CPU smoke run (interpreter) can reuse the code path


def causal_flops(B, T, H, D):
    """2 matmuls x 2 FLOP per multiply-add over the T(T+1)/2 visible (query, key) pairs."""
    return 4.0 * B * H * D * T * (T + 1) / 2


def _dtname(dt):
    return str(dt).replace("torch.", "")


def _errors(o, q, k, v, scale, causal=True, nb=1, nh=2):
    """err_ratio and max |o - ref| on batch [:nb], heads [:nh], against a float64 reference."""
    from kernels.reference import attention_ref
    sl = (slice(0, nb), slice(None), slice(0, nh))
    ref = attention_ref(q[sl].double(), k[sl].double(), v[sl].double(), scale, causal)
    out = o[sl].double()
    err = harness.err_ratio(out, ref)
    mae = (out - ref).abs().max().item() if torch.isfinite(out).all() else float("inf")
    del ref
    return err, mae


def _load_fla():
    try:
        from fla.ops.attn import parallel_attn
        return parallel_attn, None
    except Exception as e:  # noqa: BLE001 - record why fla is missing
        return None, f"fla import failed: {type(e).__name__}: {e}"[:300]


def _sdpa_backend_fn(name):
    """A callable running SDPA with one forced backend, or None if this torch lacks it."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}[name]
    except Exception:
        return None

    def run(qt, kt, vt, scale):
        with sdpa_kernel([backend]):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale)
    return run


def _triton_config_note(q, k, v, causal=True):
    """The launch plan of :func:`kernels.triton_flash._launch_plan` for these inputs (with the
    autotuner's choice where the plan is to autotune)."""
    from kernels import triton_flash
    kind, cfg = triton_flash._launch_plan(q, k, v, causal)
    if kind == "autotune":
        cfg = getattr(getattr(triton_flash, "_attn_fwd_tuned", None), "best_config", None)
    return f"{kind}: {cfg}"


def time_shapes(Ts, tokens, dtype, rep):
    import kernels
    F = torch.nn.functional
    parallel_attn, fla_note = _load_fla()
    records = []
    for T in Ts:
        B = max(1, tokens // T)
        scale = D ** -0.5
        g = torch.Generator(device=DEVICE).manual_seed(T)
        q, k, v = (torch.randn(B, T, H, D, device=DEVICE, dtype=dtype, generator=g) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))          # [B, H, T, D] views, no copies
        flops = causal_flops(B, T, H, D)

        impls = [("triton", lambda: kernels.flash_attention(q, k, v, scale=scale, causal=True, backend="triton"),
                  lambda o: o, None),
                 ("sdpa", lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale),
                  lambda o: o.transpose(1, 2), "default backend choice")]
        for name in ("sdpa_flash", "sdpa_cudnn"):
            run = _sdpa_backend_fn(name)
            if run is not None:
                impls.append((name, (lambda run=run: run(qt, kt, vt, scale)), lambda o: o.transpose(1, 2),
                              "forced backend"))
        if parallel_attn is not None:
            impls.append(("fla", lambda: parallel_attn(q, k, v, scale=scale), lambda o: o, "parallel_attn"))
        else:
            records.append(dict(impl="fla", T=T, B=B, H=H, D=D, dtype=_dtname(dtype), pass_="fwd", ms=None,
                                err=None, max_abs_err=None, note=fla_note))

        for name, fn, to_bthd, note in impls:
            rec = dict(impl=name, T=T, B=B, H=H, D=D, dtype=_dtname(dtype), pass_="fwd", ms=None, err=None,
                       max_abs_err=None, tflops=None, note=note)
            try:
                with torch.no_grad():
                    o = to_bthd(fn())                       # first call: compile / autotune
                    if DEVICE == "cuda":
                        torch.cuda.synchronize()
                    rec["err"], rec["max_abs_err"] = _errors(o, q, k, v, scale)
                    del o
                    ms = harness.bench_ms(fn, rep=rep)
                rec["ms"] = ms
                rec["tflops"] = flops / (ms * 1e-3) / 1e12
                if name == "triton":
                    rec["note"] = _triton_config_note(q, k, v)
            except Exception as e:  # noqa: BLE001 - a failing baseline is recorded, not fatal
                rec["note"] = f"{type(e).__name__}: {e}"[:300]
            records.append(rec)
            print(f"  T={T:6d} B={B:3d} {name:11s} ms={rec['ms']}  err={rec['err']}  note={rec['note']}",
                  flush=True)
        del q, k, v, qt, kt, vt
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return records


def correctness_sweep(budget_s):
    """Odd shapes through the Triton kernel vs a float64 reference (B = 1, H = 2); no timing."""
    import kernels
    records, t0 = [], time.time()
    cases = [(T, Dh, dt, True) for dt in SWEEP_DTYPES for Dh in SWEEP_D for T in SWEEP_T]
    cases += [(T, 128, dt, False) for dt in SWEEP_DTYPES for T in SWEEP_T]     # non-causal, D = 128
    for T, Dh, dt, causal in cases:
        rec = dict(impl="triton", T=T, B=1, H=2, D=Dh, dtype=_dtname(dt), pass_="fwd", ms=None, err=None,
                   max_abs_err=None, causal=causal, ok=None, note="correctness sweep")
        if time.time() - t0 > budget_s:
            rec["note"] = "correctness sweep: skipped (time budget)"
            records.append(rec)
            continue
        try:
            g = torch.Generator(device=DEVICE).manual_seed(1000 * T + Dh)
            q, k, v = (torch.randn(1, T, 2, Dh, device=DEVICE, generator=g).to(dt) for _ in range(3))
            scale = Dh ** -0.5
            o = kernels.flash_attention(q, k, v, scale=scale, causal=causal, backend="triton")
            rec["err"], rec["max_abs_err"] = _errors(o, q, k, v, scale, causal)
            rec["ok"] = bool(rec["max_abs_err"] <= SWEEP_TOL[dt])
        except Exception as e:  # noqa: BLE001
            rec["note"] = f"correctness sweep: {type(e).__name__}: {e}"[:300]
            rec["ok"] = False
        records.append(rec)
    return records


def _fix_pass_key(records):
    for r in records:
        if "pass_" in r:
            r["pass"] = r.pop("pass_")
    return records


def summary(records):
    lines = ["", f"{'T':>6} {'B':>4} {'triton ms':>10} {'sdpa ms':>9} {'fla ms':>8} {'triton/sdpa':>11} "
             f"{'triton TFLOP/s':>14}"]
    by = {(r["impl"], r["T"]): r for r in records if r.get("note") != "correctness sweep"
          and not str(r.get("note", "")).startswith("correctness sweep")}
    for T in sorted({r["T"] for r in by.values()}):
        tr, sd, fl = by.get(("triton", T)), by.get(("sdpa", T)), by.get(("fla", T))

        def ms(r):
            return r["ms"] if r and r.get("ms") is not None else None

        ratio = ms(tr) / ms(sd) if ms(tr) and ms(sd) else None
        fmt = (lambda x, w, p=3: f"{x:{w}.{p}f}" if x is not None else f"{'-':>{w}}")
        lines.append(f"{T:6d} {tr['B'] if tr else 0:4d} {fmt(ms(tr), 10)} {fmt(ms(sd), 9)} {fmt(ms(fl), 8)} "
                     f"{fmt(ratio, 11, 2)} {fmt(tr.get('tflops') if tr else None, 14, 0)}")
    sweep = [r for r in records if str(r.get("note", "")).startswith("correctness sweep")]
    if sweep:
        bad = [r for r in sweep if r.get("ok") is False]
        skipped = [r for r in sweep if r.get("ok") is None]
        lines.append(f"correctness sweep: {len(sweep) - len(bad) - len(skipped)} ok, {len(bad)} failed, "
                     f"{len(skipped)} skipped")
        for r in bad:
            lines.append(f"  FAILED T={r['T']} D={r['D']} {r['dtype']} causal={r['causal']}: "
                         f"max_abs_err={r['max_abs_err']} {r['note']}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help=f"small sweep (T in {T_QUICK}, B*T = {TOKENS_QUICK}) for a small GPU; prints only")
    p.add_argument("--write", action="store_true", help="with --quick: also write the results JSON")
    p.add_argument("--no-sweep", action="store_true", help="skip the odd-shape correctness sweep")
    args = p.parse_args(argv)

    if not torch.cuda.is_available():
        print("bench_flash needs a CUDA GPU (the Triton interpreter is far too slow to time); "
              "stored results: kernels.benchmarks.harness.load_results('bench_flash')")
        return 0
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("TRITON_INTERPRET is set; unset it to compile the kernels for the GPU")
        return 1

    t0 = time.time()
    major, _ = torch.cuda.get_device_capability()
    dtype = torch.bfloat16 if major >= 8 else torch.float16   # pre-Ampere GPUs (Colab T4) lack bf16 dots
    Ts, tokens = (T_QUICK, TOKENS_QUICK) if args.quick else (T_FULL, TOKENS)
    print(f"bench_flash on {torch.cuda.get_device_name()}: {_dtname(dtype)}, H={H}, D={D}, B*T={tokens}, causal fwd",
          flush=True)
    records = time_shapes(Ts, tokens, dtype, rep=100 if args.quick else 200)
    if not args.no_sweep:
        sweep_budget = 30.0 if args.quick else SWEEP_BUDGET_S
        records += correctness_sweep(sweep_budget)
    records = _fix_pass_key(records)

    config = dict(H=H, D=D, tokens=tokens, T=Ts, dtype=_dtname(dtype), causal=True, pass_="fwd",
                  timing="median of triton.testing.do_bench (CUDA events)",
                  err="harness.err_ratio (RMS ratio) and max abs error vs float64 on batch 0, heads 0-1",
                  sweep=dict(T=SWEEP_T, D=SWEEP_D, dtypes=[_dtname(d) for d in SWEEP_DTYPES], B=1, H=2,
                             tol={_dtname(k): v for k, v in SWEEP_TOL.items()}),
                  quick=bool(args.quick), wall_s=round(time.time() - t0, 1))
    config["pass"] = config.pop("pass_")
    if not args.quick or args.write:
        path = harness.write_results(NAME, config, records)
        print(f"wrote {path}")
    print(summary(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
