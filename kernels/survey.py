"""The survey: every op of :mod:`kernels` and torch SDPA at the same shapes, in one run (Chapter 12).

    python -m kernels.survey [--write] [--parts train,decode,fla] [--ops a,b] [--fla-T 8192] [--budget-s 500]
                             [--quick]

Writes ``kernels/survey.json`` through :mod:`kernels.harness` (device, date, versions, the config and
one record per measurement); the book draws it in Chapter 12. Three parts, each a list of records:

* ``train``: bfloat16, H = 16, D = 128, B·T = 65,536 tokens with T from 512 to 65,536 (B = 65536/T);
  ``fwd`` (no gradients) and ``fwdbwd`` (forward and the gradients of every differentiable input,
  with the step's peak memory) for every op of :data:`OPS` (``impl="ours"``: every op its family
  enters in the survey, ``OPS`` in ``kernels/<family>/bench.py``, in the book's order) and for
  ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` (``impl="sdpa"``, recorded
  under ``op="flash_attention"``, the op it computes).
* ``fla``: fla's counterpart of every op (:data:`FLA_NAMES`), at the lengths ``--fla-T`` only (fla
  autotunes each kernel for a new shape, 25 s to minutes each on a fresh machine). Records carry
  ``impl="fla"``, so :func:`kernels.report.ratio_table` divides our time by fla's.
* ``decode``: one decoding step at batch 1 and 64: softmax attention reading a KV cache of
  :data:`DECODE_CONTEXT` tokens (SDPA, ``lattn_core.kv_cache_step``), against Gated DeltaNet's state
  update in PyTorch (``lattn_core.gated_delta_step``), our ``chunk_gated_delta_rule`` called with
  T = 1 and an initial state, and fla's ``fused_recurrent_gated_delta_rule`` (its decoding kernel).

An op that is not importable (an op still being written) or that raises is recorded with ``ms``
``None`` and the error as its ``note``, never worked around. A wall-clock budget is checked before
every timing; what it leaves out is recorded as skipped. The file is rewritten after every op, and a
run of some parts or some ops (``--ops``) keeps the records it does not re-time (:func:`replaced_by`).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path


H, D, TOKENS = 16, 128, 65536
T_ALL = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
T_QUICK = (2048, 16384)
FLA_T = (8192,)
DECODE_BATCH = (1, 64)
DECODE_CONTEXT = (1024, 4096, 16384, 65536)
PARTS = ("train", "decode", "fla")
PASSES = ("fwd", "fwdbwd")
PATH = Path(__file__).resolve().with_name("survey.json")


def _entries() -> dict:
    """``{kernels op: (family's bench module, its Op)}`` for every op a family enters in the survey
    (``Op.survey``), in the book's order: by chapter, then family, then as the family lists them."""
    import importlib
    from . import FAMILIES
    found = []
    for family in FAMILIES:
        bench = importlib.import_module(f"kernels.{family}.bench")
        found += [(op.survey.chapter, bench, op) for op in bench.OPS if op.survey is not None]
    found.sort(key=lambda e: e[0])                    # stable: family and listing order within a chapter
    return {op.kernel: (bench, op) for _, bench, op in found}


_ENTRIES = _entries()
# Every op of kernels, in the book's order, with the inputs it differentiates (those its inputs have).
OPS = {name: op.grads for name, (_, op) in _ENTRIES.items()}
# ours -> fla's counterpart, "module.name". DeltaFormer: fla's own front end needs the separately
# compiled flash-attn package, so its peer is fla's pseudo-value stage followed by SDPA, as in
# kernels/deltaformer/bench.py.
FLA_NAMES = {name: op.fla for name, (_, op) in _ENTRIES.items()}
# what the ops record of themselves in the config (DeltaProduct's steps per token, the convolution's width)
_OP_CONFIG = {k: v for _, op in _ENTRIES.values() for k, v in op.survey.config.items()}
NUM_HOUSEHOLDER = _OP_CONFIG["num_householder"]      # DeltaProduct's steps per token
CONV_WIDTH = _OP_CONFIG["conv_width"]
CONFIG = dict(H=H, D=D, dtype="bfloat16", tokens=TOKENS, **_OP_CONFIG, T=list(T_ALL),
              decode_batch=list(DECODE_BATCH), decode_context=list(DECODE_CONTEXT),
              fla_names=dict(FLA_NAMES),
              cases={name: {k: v for k, v in op.survey.case(None, None, H, D).items() if k not in ("B", "T")}
                     for name, (_, op) in _ENTRIES.items()},
              inputs="each family's make_inputs (kernels/<family>/bench.py) at the op's case (the cases field): "
                     "q, k, v ~ N(0, 1), k L2-normalised for the delta rule and MesaNet (MesaNet's q too); "
                     "g = logsigmoid(N(0, 1)) in float32 ([B, T, H], GLA's [B, T, H, D]); beta = sigmoid(N(0, 1)) "
                     "in float32 (PaTH: 2 sigmoid, w L2-normalised, float32); MesaNet lamb = 1 [H, K], not an "
                     "input, 30 CG steps; conv: x [B, T, H D] ~ N(0, 1), weight [H D, 4] ~ U(-1/2, 1/2), SiLU; "
                     "DeltaProduct: k, v, beta with T num_householder rows; Comba: Gated DeltaNet's inputs, beta "
                     "as eta (fla's form with p = k); scale D^-0.5")


def train_cases(parts=PARTS, *, ts=T_ALL, fla_ts=FLA_T, ops=tuple(OPS)) -> list:
    """The (impl, op, B, T) of every training-shape measurement of ``parts``, in run order: ours for
    every op and length, SDPA at every length, then fla at ``fla_ts``."""
    out = []
    if "train" in parts:
        for op in ops:
            out += [dict(impl="ours", op=op, B=TOKENS // T, T=T) for T in ts]
        out += [dict(impl="sdpa", op="flash_attention", B=TOKENS // T, T=T) for T in ts]
    if "fla" in parts:
        for op in ops:
            out += [dict(impl="fla", op=op, B=TOKENS // T, T=T) for T in fla_ts]
    return out


def decode_cases(batches=DECODE_BATCH, contexts=DECODE_CONTEXT) -> list:
    """The (impl, B, context) of every decoding measurement: the KV-cache read at every context,
    the state updates once per batch (their cost does not depend on the context)."""
    out = []
    for B in batches:
        out += [dict(impl="sdpa (KV cache)", B=B, context=n) for n in contexts]
        out += [dict(impl=impl, B=B, context=None)
                for impl in ("torch step (Gated DeltaNet)", "ours T=1 (chunk_gated_delta_rule)",
                             "fla fused_recurrent (Gated DeltaNet)")]
    return out


def record(case: dict, pass_: str, ms=None, note: str = "", peak_mib=None, section: str = "train") -> dict:
    """One record of the results file: the case's fields, the pass, the median ``ms`` (``None`` with a
    ``note`` saying why), and ``peak_mib`` (forward + backward only)."""
    rec = dict(section=section, **case, **{"pass": pass_}, ms=None if ms is None else float(ms), note=note or "")
    if peak_mib is not None:
        rec["peak_mib"] = float(peak_mib)
    return rec


def part_of(rec: dict) -> str:
    """Which part of the run wrote a record (``train``, ``fla`` or ``decode``)."""
    if rec.get("section") == "decode":
        return "decode"
    return "fla" if rec.get("impl") == "fla" else "train"


def replaced_by(rec: dict, parts, ops) -> bool:
    """Whether a run of ``parts`` over ``ops`` re-times (and so replaces) a stored record: every
    record of its parts for those ops, and SDPA's and the decoding records whenever their part runs."""
    part = part_of(rec)
    if part not in parts:
        return False
    return part == "decode" or rec.get("impl") == "sdpa" or rec.get("op") in ops


def _case(op: str, B: int = 1, T: int = 1, heads: int = H, dim: int = D) -> dict:
    """The case of ``op``'s family's ``make_inputs`` at the survey's shapes (its calls read the
    case's settings, MesaNet's CG count, not its shape)."""
    if op not in OPS:
        raise ValueError(f"op must be one of {tuple(OPS)}; got {op!r}")
    return _ENTRIES[op][1].survey.case(B, T, heads, dim)


def make_inputs(op: str, B: int, T: int, *, heads: int = H, dim: int = D, device="cuda", dtype=None,
                seed: int = 0) -> dict:
    """The keyword inputs of ``op`` (never zeros; see :data:`CONFIG`'s ``inputs``), ``[B, T, ...]``:
    its family's ``make_inputs`` at the survey's case for it."""
    case = _case(op, B, T, heads, dim)
    return _ENTRIES[op][0].make_inputs(case, device=device, dtype=dtype, seed=seed + 7 * T + B)


def our_fn(op: str):
    """``fn(**inputs) -> o`` running our op (with ``check_values=False``, as its family's benchmark
    calls it: fla checks no values), or the exception raised looking it up (an op not in
    :mod:`kernels` yet)."""
    from .harness import our_fn as ours
    return ours(_ENTRIES[op][1], _case(op))


def sdpa_fn():
    """Causal softmax attention by ``torch.nn.functional.scaled_dot_product_attention`` on
    ``[B, H, T, D]`` views of the same ``[B, T, H, D]`` tensors."""
    from .harness import causal_sdpa
    return causal_sdpa


def fla_fn(op: str):
    """``fn(**inputs) -> o`` running fla's counterpart of ``op`` (:data:`FLA_NAMES`), or the
    exception raised importing it."""
    from .harness import peer_fn
    return peer_fn(_ENTRIES[op][1], _case(op))


def _time_case(fn, x, grads, *, warmup, rep):
    """``{pass: (ms, peak_mib, note)}`` for one implementation on one input set."""
    import torch
    from .harness import bench_ms, short_error
    out = {}
    try:
        with torch.no_grad():
            out["fwd"] = (bench_ms(lambda: fn(**x), warmup=warmup, rep=rep), None, "")
    except Exception as e:
        out["fwd"] = (None, None, short_error(e))
    try:
        leaves = {n: (t.detach().clone().requires_grad_(n in grads) if t.is_floating_point() else t)
                  for n, t in x.items()}
        ins = [leaves[n] for n in grads]
        do = torch.randn_like(fn(**leaves))

        def step():
            return torch.autograd.grad(fn(**leaves), ins, do)
        ms = bench_ms(step, warmup=warmup, rep=rep)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        out["fwdbwd"] = (ms, round((torch.cuda.max_memory_allocated() - base) / 2 ** 20, 1), "")
    except Exception as e:
        out["fwdbwd"] = (None, None, short_error(e))
    return out


def run_train(cases, *, warmup, rep, deadline, write):
    """Time every case of :func:`train_cases`; ``write()`` after each op and implementation."""
    import torch
    records, last = [], None
    for case in cases:
        key = (case["impl"], case["op"])
        if last is not None and key != last:
            write(records)
        last = key
        fn = {"ours": lambda: our_fn(case["op"]), "sdpa": sdpa_fn, "fla": lambda: fla_fn(case["op"])}[case["impl"]]()
        if isinstance(fn, BaseException):
            from .harness import short_error
            records += [record(case, p, note=short_error(fn)) for p in PASSES]
            continue
        if time.perf_counter() > deadline:
            records += [record(case, p, note="skipped: the run's time budget was spent") for p in PASSES]
            continue
        x = make_inputs(case["op"], case["B"], case["T"])
        grads = [n for n in OPS[case["op"]] if n in x]
        t0 = time.perf_counter()
        res = _time_case(fn, x, grads, warmup=warmup, rep=rep)
        records += [record(case, p, ms=res[p][0], note=res[p][2], peak_mib=res[p][1]) for p in PASSES]
        shown = "  ".join(f"{p} {res[p][0]:.3f} ms" if res[p][0] is not None else f"{p} - {res[p][2][:60]}"
                          for p in PASSES)
        print(f"{case['impl']:5s} {case['op']:25s} B={case['B']:4d} T={case['T']:6d}  {shown}  "
              f"[{time.perf_counter() - t0:.1f} s]", flush=True)
        del x
        torch.cuda.empty_cache()
    write(records)
    return records


def decode_fns(B: int, context, *, heads: int = H, dim: int = D, device="cuda"):
    """``{impl: fn()}`` for one decoding step at batch ``B`` (the KV-cache read needs ``context``),
    each with its inputs made here; an implementation that cannot be set up is its exception."""
    import torch
    import torch.nn.functional as F
    from lattn_core.whats_next import gated_delta_step, kv_cache_step
    gen = torch.Generator(device=device).manual_seed(B)
    rand = lambda *shape, dt=torch.float32: torch.randn(*shape, device=device, generator=gen).to(dt)  # noqa: E731
    out = {}
    if context is not None:
        bf = torch.bfloat16
        q, kc, vc = rand(B, heads, dim, dt=bf), rand(B, heads, context, dim, dt=bf), rand(B, heads, context, dim, dt=bf)
        out["sdpa (KV cache)"] = lambda: kv_cache_step(q, kc, vc)
        return out
    S = rand(B, heads, dim, dim) * 0.01
    q, k, v = rand(B, heads, dim), F.normalize(rand(B, heads, dim), dim=-1), rand(B, heads, dim)
    a, b = torch.sigmoid(rand(B, heads)), torch.sigmoid(rand(B, heads))
    out["torch step (Gated DeltaNet)"] = lambda: gated_delta_step(S, q, k, v, a, b)
    bf = torch.bfloat16
    q1, k1, v1 = (t[:, None].to(bf) for t in (q, k, v))           # [B, 1, H, D]
    g1, b1 = a.log()[:, None], b[:, None]
    S_kv = S.transpose(-1, -2).contiguous()                        # fla's layout [B, H, K, V]
    try:
        import kernels
        # check_values=False: a decoding step timed against fla's, which checks no values
        out["ours T=1 (chunk_gated_delta_rule)"] = lambda: kernels.chunk_gated_delta_rule(
            q1, k1, v1, g1, b1, initial_state=S_kv, output_final_state=True, check_values=False)
    except Exception as e:
        out["ours T=1 (chunk_gated_delta_rule)"] = e
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
        out["fla fused_recurrent (Gated DeltaNet)"] = lambda: fused_recurrent_gated_delta_rule(
            q1, k1, v1, g=g1, beta=b1, initial_state=S_kv, output_final_state=True)
    except Exception as e:
        out["fla fused_recurrent (Gated DeltaNet)"] = e
    return out


def run_decode(cases, *, warmup, rep, deadline):
    import torch
    from .harness import bench_ms, short_error
    records = []
    for case in cases:
        if time.perf_counter() > deadline:
            records.append(record(case, "step", note="skipped: the run's time budget was spent", section="decode"))
            continue
        try:
            fn = decode_fns(case["B"], case["context"])[case["impl"]]
            if isinstance(fn, BaseException):
                raise fn
            with torch.no_grad():
                ms, note = bench_ms(fn, warmup=warmup, rep=rep), ""
        except Exception as e:
            ms, note = None, short_error(e)
        records.append(record(case, "step", ms=ms, note=note, section="decode"))
        print(f"decode {case['impl']:38s} B={case['B']:3d} n={case['context']}  "
              + (f"{ms:.4f} ms" if ms is not None else note[:70]), flush=True)
        torch.cuda.empty_cache()
    return records


def main(argv=None) -> int:
    import argparse
    from .harness import pure_triton_fla
    pure_triton_fla()      # before fla is imported
    p = argparse.ArgumentParser(prog="python -m kernels.survey", description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help=f"write {PATH.name} (keeping other parts' records)")
    p.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of " + ",".join(PARTS))
    p.add_argument("--fla-T", default=",".join(map(str, FLA_T)), help="lengths at which fla is timed")
    p.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of the ops (fla tunes each "
                   "op for minutes on a new machine: a few ops per call); the others' records are kept")
    p.add_argument("--budget-s", type=float, default=500.0, help="wall-clock budget of the timings")
    p.add_argument("--quick", action="store_true", help=f"T in {T_QUICK}, fewer repetitions")
    args = p.parse_args(argv)
    parts = [s for s in args.parts.split(",") if s]
    if any(s not in PARTS for s in parts):
        raise SystemExit(f"--parts: choose from {PARTS}; got {parts}")
    fla_ts = tuple(int(t) for t in args.fla_T.split(",") if t)
    ops = tuple(o for o in args.ops.split(",") if o)
    if any(o not in OPS for o in ops):
        raise SystemExit(f"--ops: choose from {tuple(OPS)}; got {ops}")
    import torch
    if not torch.cuda.is_available():
        print("the survey needs a CUDA GPU; Chapter 12 draws the stored kernels/survey.json")
        return 2
    from .results import environment, load_results, write_results
    warmup, rep = (5, 20) if args.quick else (10, 50)
    start = time.perf_counter()
    deadline = start + args.budget_s
    kept, runs = [], []
    if args.write:
        try:
            old = load_results(PATH)
            kept = [dict(r, env=r.get("env", old["env"])) for r in old["records"] if not replaced_by(r, parts, ops)]
            runs = list(old["config"].get("runs", []))
        except FileNotFoundError:
            pass
    done: list = []
    config = dict(CONFIG, parts=parts, ops=list(ops), fla_T=list(fla_ts), quick=args.quick, warmup_ms=warmup, rep_ms=rep,
                  budget_s=args.budget_s,
                  fla_env={k: os.environ[k] for k in ("FLA_DISABLE_BACKEND_DISPATCH",)})

    this_run = dict(date=environment()["date"], device=environment()["device"], parts=parts, ops=list(ops))

    def write(records=()):
        if args.write:
            elapsed = round(time.perf_counter() - start, 1)
            cfg = dict(config, elapsed_s=elapsed, runs=runs + [dict(this_run, elapsed_s=elapsed)])
            write_results(PATH, "survey", cfg, kept + done + list(records), env=environment())

    ts = T_QUICK if args.quick else T_ALL
    if "train" in parts:
        done += run_train(train_cases(("train",), ts=ts, ops=ops), warmup=warmup, rep=rep, deadline=deadline,
                          write=write)
    if "decode" in parts:
        done += run_decode(decode_cases(), warmup=warmup, rep=rep, deadline=deadline)
        write()
    if "fla" in parts:
        done += run_train(train_cases(("fla",), fla_ts=fla_ts, ops=ops), warmup=warmup, rep=rep, deadline=deadline,
                          write=write)
    write()
    from .report import ratio_table
    print("\n" + ratio_table({"name": "survey", "records": [r for r in done if r.get("section") == "train"]}))
    print(f"\n{time.perf_counter() - start:.0f} s" + (f"; wrote {PATH}" if args.write else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
