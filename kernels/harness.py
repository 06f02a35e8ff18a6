"""The benchmark harness every family's ``bench.py`` runs on: timing, errors, records, results files.

A family's benchmark of record is ``python -m kernels.<family>.bench [--quick] [--write]``. It
describes *what* to time (cases, input makers, implementations, a float64 reference) and hands it
to :func:`run_benchmark`, which does the rest the same way for every family:

* for every case, the accuracy of every implementation against the float64 reference on a slice of
  the inputs (fla's RMS error ratio, :func:`err_ratio`, for the output and each gradient);
* the median time of the forward (without gradients) and of forward + backward
  (``torch.autograd.grad`` of the output against a fixed upstream gradient), CUDA events through
  ``triton.testing.do_bench``;
* a failing implementation (fla refuses some backward passes on Triton 3.6 / Hopper) is recorded as
  ``{"ms": null, "note": <error>}``, never worked around;
* a wall-clock budget, checked before every timing, so that one run stays bounded;
* the results file ``kernels/<family>/results.json``::

      {"name": ..., "env": {device, date, torch, triton, fla, cuda, python}, "config": {...},
       "records": [{"impl", "op", "B", "T", <case fields>, "pass", "ms", "err", "note",
                    "peak_mib" (forward + backward only), "io_bytes", "tflops"}, ...]}

  rewritten after every case, so a killed run keeps what it measured;
* the roofline's yardsticks, measured in the same run (:func:`measure_device`: the copy bandwidth and
  the bf16 matrix-multiply rate, in the config), and per record the bytes the pass cannot avoid
  moving (:func:`io_bytes`) and, where the family counts operations (``flops(case)``), the achieved
  rate: :func:`kernels.report.roofline_table` says how far each time is from its floor (runs from
  2026-11-29 on; the files written before hold neither).

Results files are read and written by :mod:`kernels.results` (which also records the environment);
the book shows them through :mod:`kernels.report`; no measured number is typed by hand.

Each family describes its ops once, in its ``bench.py``, with the records defined here; the
benchmark, the survey (:mod:`kernels.survey`) and the compile check (:mod:`kernels.compile`) read
that description and hold none of their own:

* ``OPS``: one :class:`Op` per op the family times: its name in the cases and records, the
  :mod:`kernels` op, fla's counterpart, how each is called, the inputs it differentiates and its
  entry in the survey (:class:`Surveyed`: the book's chapter and the case of ``make_inputs`` at the
  survey's shapes);
* ``make_inputs(case, *, device="cuda", dtype=None, seed=None)``: the inputs of a case (``B``,
  ``T`` and the family's fields; ``H``, ``K``, ``V`` or ``D`` default to the benchmark's), from the
  shared makers below (:func:`randn`, :func:`unit_rows`, :func:`log_gates`, :func:`sigmoid_of_normal`,
  :func:`in_dtype`);
* ``COMPILE``: its :class:`CompileCases`, the calls whose kernel launches the compile check captures.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .results import environment, load_results, results_path, write_results

__all__ = ["bench_ms", "kernel_times", "err_ratio", "run_benchmark", "bench_main", "bench_impls", "short_error", "Op",
           "Surveyed", "CompileCases", "benched", "op_named", "resolve", "our_fn", "peer_fn", "op_impls", "causal_sdpa", "randn", "unit_rows",
           "log_gates", "sigmoid_of_normal", "in_dtype", "scale_of"]


#: fla's switch to its pure-Triton kernels (no dispatch to other backends): every comparison of the
#: book is pure Triton against pure Triton
FLA_PURE_TRITON = {"FLA_DISABLE_BACKEND_DISPATCH": "1"}


def pure_triton_fla() -> dict:
    """Set fla's pure-Triton switch (unless the caller's environment sets it) before fla is first
    imported; every benchmark, the survey and the layer benchmark call this first. Returns the
    switch as set, which the results files record."""
    for k, v in FLA_PURE_TRITON.items():
        os.environ.setdefault(k, v)
    return {k: os.environ[k] for k in FLA_PURE_TRITON}


def bench_ms(fn, *, warmup: int = 25, rep: int = 100) -> float:
    """Median time of ``fn()`` in milliseconds, with CUDA events (``triton.testing.do_bench``)."""
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def kernel_times(fn, n: int = 10, *, width: int = 48) -> dict:
    """Where ``fn()``'s device time goes: ``{kernel name (first width characters): ms per call}``,
    the device time of every kernel it launches averaged over ``n`` calls (``torch.profiler``, after
    one call outside the profile for compiles and caches), largest first. Lab use: the families'
    profiles of a step (``kernels/gla/lab/sweep.py``, ``kernels/path/lab/stage_profile.py``)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    out: dict = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
        if t:
            key = ev.key[:width]
            out[key] = out.get(key, 0.0) + t / n / 1000.0
    return {k: round(v, 4) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def measure_device() -> dict:
    """The two yardsticks of a roofline, measured on the current CUDA device in the benchmark's own
    run: the bfloat16 matrix-multiply rate (``torch.matmul``, 8192³, median) and the copy bandwidth
    (``x.clone()`` of 1 GiB, bytes read plus bytes written over the median time). Every family's
    benchmark records them in its config (:func:`bench_main`); :func:`kernels.report.roofline_rows`
    reads them."""
    import torch
    if not torch.cuda.is_available():
        raise ValueError("measure_device needs a CUDA device (it times the GPU's matmul and copy)")
    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ms = bench_ms(lambda: a @ b, warmup=25, rep=100)
    del a, b
    x = torch.empty(2 ** 29, device="cuda", dtype=torch.float16)
    copy_ms = bench_ms(lambda: x.clone(), warmup=10, rep=50)
    return {"bf16_matmul_tflops": round(2 * n ** 3 / ms / 1e9, 1), "matmul_shape": [n, n, n],
            "copy_gbps": round(2 * x.nbytes / copy_ms / 1e6, 1), "copy_bytes": 2 * x.nbytes}


def io_bytes(pass_: str, inputs: dict, out, grad_names=()) -> int:
    """The bytes a pass cannot avoid moving through memory, counted from the tensors themselves:
    the forward (``"fwd"``) reads every input once and writes the output; forward + backward
    (``"fwdbwd"``) also reads the inputs again, reads the output's gradient (the output's size) and
    writes the gradients of ``grad_names``. Saved intermediates, scratch and re-reads are not
    counted: a kernel's time over ``io_bytes / copy bandwidth`` is how far it is from the memory
    roofline (:func:`kernels.report.roofline_rows`)."""
    if pass_ not in ("fwd", "fwdbwd"):
        raise ValueError(f"pass_ must be 'fwd' or 'fwdbwd'; got {pass_!r}")
    size = {n: t.numel() * t.element_size() for n, t in inputs.items()}
    unknown = [n for n in grad_names if n not in size]
    if unknown:
        raise ValueError(f"grad_names must name inputs; {unknown} are not among {sorted(size)}")
    o = out.numel() * out.element_size()
    total = sum(size.values()) + o
    if pass_ == "fwdbwd":
        total += sum(size.values()) + o + sum(size[n] for n in grad_names)
    return int(total)


def err_ratio(x, ref) -> float:
    """fla's error measure: RMS(x − ref) / RMS(ref), computed in float64."""
    import torch
    x = x.detach().to(torch.float64)
    ref = ref.detach().to(torch.float64)
    if not torch.isfinite(x).all():
        return float("inf")
    num = torch.sqrt(torch.mean((x - ref) ** 2)).item()
    den = torch.sqrt(torch.mean(ref ** 2)).item()
    return num / den if den > 0 else num


def short_error(e: BaseException, n: int = 300) -> str:
    """``Type: first line of the message``, at most ``n`` characters (for a record's note)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:n]


# --- what a family declares (its bench.py) ----------------------------------------------------------

@dataclass(frozen=True)
class Surveyed:
    """An op's entry in the survey (:mod:`kernels.survey`): ``chapter``, where the book treats it (the
    survey's order); ``case(B, T, heads, dim)``, the case of the family's ``make_inputs`` at the
    survey's shapes (``heads`` heads of size ``dim``); ``config``, what the survey records of it in
    its config (DeltaProduct's steps per token, the convolution's width)."""
    chapter: int
    case: Callable
    config: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Op:
    """One op of a family, described once (the family's ``bench.py``, ``OPS``).

    ``name``: the op in the family's cases and records (``"gated_delta_rule"``); ``kernel``: the
    :mod:`kernels` op it runs, also its name in the survey (``"chunk_gated_delta_rule"``); ``fla``:
    fla's counterpart, ``"module.attribute"``; ``grads``: the inputs it differentiates (those of a
    case's inputs that are present); ``ours(fn, case)`` and ``peer(fn, case)``: ``f(**inputs) -> o``
    calling our op (``fn``, with ``check_values=False``: fla checks no values and ours cost a host
    sync, so the times compare like for like) and fla's counterpart (``fn``, the object ``fla``
    names); ``peer_impl``: the peer's name in the records; ``survey``: its :class:`Surveyed` entry
    (``None``: not in the survey); ``benched``: whether the benchmark of record times it
    (DeltaProduct and Comba are timed by the survey only)."""
    name: str
    kernel: str
    fla: str
    grads: tuple
    ours: Callable
    peer: Callable
    survey: Surveyed | None = None
    peer_impl: str = "fla"
    benched: bool = True


@dataclass(frozen=True)
class CompileCases:
    """The launches :mod:`kernels.compile` captures for a family: ``modules``, the dotted names of the
    modules whose jit kernels the calls launch; ``cases(caps, quick, half, halves)``, the calls'
    parameters for the GPU class ``caps`` (``half``: the class's 16-bit dtype, bfloat16 from sm_80
    and float16 below unless forced; ``halves``: the class's 16-bit dtypes; ``quick``: the
    benchmark's shapes and one of each other path); ``run(case, caps)``, one call of the family's
    Triton path on CPU tensors with the class's plans, forward and backward."""
    modules: tuple
    cases: Callable
    run: Callable


def benched(ops) -> tuple:
    """The names of the ops the benchmark of record times (its ``--ops``)."""
    return tuple(o.name for o in ops if o.benched)


def op_named(ops, name: str) -> Op:
    """The :class:`Op` of ``ops`` called ``name`` (a case's ``op``)."""
    for o in ops:
        if o.name == name:
            return o
    raise ValueError(f"op must be one of {tuple(o.name for o in ops)}; got {name!r}")


def resolve(dotted: str):
    """The object a ``"module.attribute"`` name names (importing the module)."""
    import importlib
    module, _, attr = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def our_fn(op: Op, case: dict):
    """``f(**inputs) -> o`` running our op on ``case``, or the exception raised looking it up."""
    try:
        import kernels
        fn = getattr(kernels, op.kernel)
    except Exception as e:          # recorded as the op's note
        return e
    return op.ours(fn, case)


def peer_fn(op: Op, case: dict):
    """``f(**inputs) -> o`` running fla's counterpart on ``case``, or the exception raised importing
    it (recorded as the peer's note)."""
    try:
        return op.peer(resolve(op.fla), case)
    except Exception as e:
        return e


def op_impls(ops, case: dict) -> dict:
    """``{"ours": f, <peer_impl>: f}`` for ``case`` (see :func:`run_benchmark`'s ``impls``)."""
    op = op_named(ops, case["op"])
    return {"ours": our_fn(op, case), op.peer_impl: peer_fn(op, case)}


def causal_sdpa(q, k, v):
    """Causal softmax attention by ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch's
    default backend) on ``[B, H, T, D]`` views of ``[B, T, H, D]`` tensors, scale ``D^-1/2``."""
    import torch.nn.functional as F
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                          scale=scale_of(q)).transpose(1, 2)


def scale_of(q) -> float:
    """The attention scale of queries ``q``: ``K^-1/2``."""
    return q.shape[-1] ** -0.5


# the shared input makers: ``gen`` a torch.Generator (the tensor on its device), or None (the global
# generator, on the CPU); float32 unless ``dtype`` is given

def randn(*shape, gen=None, dtype=None):
    """``N(0, 1)`` of ``shape``."""
    import torch
    return torch.randn(*shape, device=None if gen is None else gen.device, generator=gen, dtype=dtype)


def unit_rows(*shape, gen=None):
    """L2-normalised ``N(0, 1)`` rows (the delta rule's keys, PaTH's ``w``), float32."""
    import torch.nn.functional as F
    return F.normalize(randn(*shape, gen=gen), dim=-1)


def log_gates(*shape, gen=None):
    """Log forget gates ``logsigmoid(N(0, 1))``, float32."""
    import torch.nn.functional as F
    return F.logsigmoid(randn(*shape, gen=gen))


def sigmoid_of_normal(*shape, gen=None):
    """``sigmoid(N(0, 1))`` (the delta rule's and DeltaFormer's ``beta``), float32."""
    import torch
    return torch.sigmoid(randn(*shape, gen=gen))


def in_dtype(t, field: str, dtype):
    """A float32 tensor as a case's dtype field says: ``"float32"`` as it is, ``"input dtype"`` in
    ``dtype``."""
    if field not in ("float32", "input dtype"):
        raise ValueError(f"a dtype field is 'float32' or 'input dtype'; got {field!r}")
    return t if field == "float32" else t.to(dtype)


def _slice(x: dict, err_T: int, heads, token_inputs=None) -> dict:
    """Batch element 0, the first ``err_T`` tokens and ``heads`` of every ``[B, T, ...]`` input (those
    named in ``token_inputs``, default all; the others, e.g. a convolution's weight, whole)."""
    out = {}
    for n, t in x.items():
        if token_inputs is not None and n not in token_inputs:
            out[n] = t.contiguous()
            continue
        t = t[:1, :err_T]
        if heads is not None and t.dim() >= 3:
            t = t[:, :, :heads]
        out[n] = t.contiguous()
    return out


def run_benchmark(name: str, *, cases, make_inputs, impls, reference, grad_names, passes=("fwd", "fwdbwd"),
                  path=None, config=None, quick=False, budget_s=400.0, err_T_max=8192, err_heads=None,
                  extra_err=None, keep=None, flops=None, token_inputs=None, out_like="v", yardsticks=None,
                  annotate=None):
    """Time and check every implementation on every case; returns the records (see the module doc).

    ``cases``: dicts with at least ``op``, ``B`` and ``T`` (every other key is recorded with the
    measurement, e.g. ``gates="float32"``). ``make_inputs(case)`` returns a dict of ``[B, T, ...]``
    tensors, the keyword arguments of every implementation. ``impls(case)`` returns
    ``{impl_name: fn}`` with ``fn(**inputs) -> o`` (``[B, T, H, V]``); a name whose value is an
    exception (an import that failed) is recorded as refused. ``reference(case, inputs64)`` returns
    the float64 output on a slice (batch 0, the first ``err_T_max`` tokens, the first
    ``err_heads`` heads), differentiable; ``grad_names(case)`` names the inputs whose gradients
    are checked and timed. ``extra_err(case, fn, inputs_slice, o_ref)`` may add error entries.
    ``path``: write the results file there after every case; ``keep(record) -> bool`` keeps those
    records of the file already there (a run of some ops of a family leaves the others' records; the
    file's env then names the latest run, and each kept record carries its own ``env``).
    ``flops(case)``: the forward's floating-point operations; each timed record then also gets
    ``tflops``, its achieved rate (forward + backward counted as 3.5 forwards: the backward's five
    products per tile against the forward's two, FlashAttention's convention).

    For ops whose inputs are not all ``[B, T, ...]`` or that are memory-bound: ``token_inputs`` names
    the inputs sliced for the accuracy check (default all); ``out_like`` the input whose shape the
    output has (the upstream gradient of the timed backward; without it, the sliced output's);
    ``yardsticks(case, inputs, warmup, rep)`` returns records measured once per case before the
    implementations (e.g. a device-to-device copy); ``annotate(case, record, yardstick_records)``
    adds fields to every timed record (e.g. the achieved bandwidth).
    """
    pure_triton_fla()
    import torch
    warmup, rep = (5, 20) if quick else (10, 50)
    records, t_start = [], time.perf_counter()
    kept = []
    if path is not None and keep is not None:
        try:
            old = load_results(path)
            kept = [dict(r, env=r.get("env", old["env"])) for r in old["records"] if keep(r)]
        except FileNotFoundError:
            pass
    skipped = f"skipped: the run's time budget ({budget_s:g} s) was spent"

    def over_budget():
        return time.perf_counter() - t_start > budget_s

    def write():
        cfg = dict(config or {}, warmup_ms=warmup, rep_ms=rep, err_T_max=err_T_max, err_heads=err_heads,
                   budget_s=budget_s, elapsed_s=round(time.perf_counter() - t_start, 1), quick=quick,
                   fla_env=pure_triton_fla())
        return write_results(path, name, cfg, kept + records)

    for case in cases:
        x = make_inputs(case)
        err_T = min(case["T"], err_T_max)
        names = grad_names(case)
        xs = _slice(x, err_T, err_heads, token_inputs)
        extra = yardsticks(case, x, warmup, rep) if yardsticks is not None else []
        records += extra
        x64 = {n: t.detach().double().requires_grad_(n in names) for n, t in xs.items()}
        gen = torch.Generator(device=next(iter(x.values())).device).manual_seed(1234)
        o_ref = reference(case, x64)
        do_ref = torch.randn(o_ref.shape, device=o_ref.device, dtype=torch.float64, generator=gen)
        g_ref = dict(zip(names, torch.autograd.grad(o_ref, [x64[n] for n in names], do_ref))) if names else {}
        o_ref = o_ref.detach()
        do_full = torch.randn(x[out_like].shape if out_like in x else o_ref.shape, device=o_ref.device,
                              dtype=next(iter(x.values())).dtype, generator=gen)
        o_shape = do_full if out_like in x else None     # the whole output's size, for io_bytes
        for impl, fn in impls(case).items():
            base = dict(impl=impl, **case, err_T=err_T)
            if isinstance(fn, BaseException):
                records += [dict(base, **{"pass": p, "ms": None, "err": None, "note": short_error(fn)})
                            for p in passes]
                continue
            t_impl = time.perf_counter()
            err, note = {}, ""
            try:   # accuracy on the slice: the inference forward, then the training forward + gradients
                with torch.no_grad():
                    err["o"] = err_ratio(fn(**xs), o_ref)
                if extra_err is not None:
                    err.update(extra_err(case, fn, xs, o_ref))
                if "fwdbwd" in passes and names:
                    leaves = {n: t.detach().clone().requires_grad_(n in names) for n, t in xs.items()}
                    o = fn(**leaves)
                    err["o_train"] = err_ratio(o, o_ref)   # the forward that saves for the backward
                    grads = torch.autograd.grad(o, [leaves[n] for n in names], do_ref.to(o.dtype))
                    err.update({"d" + n: err_ratio(gr, g_ref[n]) for n, gr in zip(names, grads)})
            except Exception as e:   # e.g. fla refusing its backward: keep what was measured
                note = "accuracy check: " + short_error(e)
            for p in passes:
                rec = dict(base, **{"pass": p, "ms": None, "err": err or None, "note": note})
                try:
                    if over_budget():
                        raise RuntimeError(skipped)
                    if p == "fwd":
                        with torch.no_grad():
                            rec["ms"] = bench_ms(lambda: fn(**x), warmup=warmup, rep=rep)
                    else:
                        leaves = {n: t.detach().clone().requires_grad_(n in names) for n, t in x.items()}
                        ins = [leaves[n] for n in names]

                        def step():
                            return torch.autograd.grad(fn(**leaves), ins, do_full)
                        rec["ms"] = bench_ms(step, warmup=warmup, rep=rep)
                        # the memory one training step holds above its inputs (outputs, saved
                        # tensors, gradients, workspace): linear in T unless a T x T tensor exists
                        torch.cuda.synchronize()
                        torch.cuda.reset_peak_memory_stats()
                        base = torch.cuda.memory_allocated()
                        step()
                        torch.cuda.synchronize()
                        rec["peak_mib"] = round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)
                        del leaves, ins
                except Exception as e:
                    rec["note"] = short_error(e)
                if annotate is not None and rec["ms"]:
                    annotate(case, rec, extra)
                if flops is not None and rec["ms"]:
                    rec["tflops"] = round(flops(case) * (3.5 if p == "fwdbwd" else 1.0) / rec["ms"] / 1e9, 1)
                if rec["ms"] and o_shape is not None:
                    rec["io_bytes"] = io_bytes(p, x, o_shape, names if p == "fwdbwd" else ())
                rec["wall_s"] = round(time.perf_counter() - t_impl, 1)
                records.append(rec)
                torch.cuda.empty_cache()
            shown = {k: round(v, 5) for k, v in err.items() if isinstance(v, float)}
            print(f"{impl:5s} {case}  " + "  ".join(
                f"{r['pass']} {r['ms']:.3f} ms" if r["ms"] is not None else f"{r['pass']} -" for r in records[-len(passes):])
                + f"  err {shown} {note} [{time.perf_counter() - t_impl:.1f} s; "
                  f"{time.perf_counter() - t_start:.0f} s total]", flush=True)
        del x, xs, x64
        torch.cuda.empty_cache()
        if path is not None:
            write()
    if path is not None:
        print(f"wrote {write()}")
    from .report import ratio_table
    peers = [i for i in dict.fromkeys(r["impl"] for r in records) if i != "ours"]
    print("\n" + ratio_table({"name": name, "records": records}, peer=peers[0] if len(peers) == 1 else "fla"))
    return records


def bench_main(argv, module):
    """The command line of a family's ``bench.py`` (``module``): ``--quick``, ``--write``, ``--budget-s``
    and, when the family has several ops (``RUN["ops"]``), ``--ops`` (a run of some ops keeps the
    others' records in the results file). ``module`` provides ``OPS`` (its :class:`Op` records: the
    implementations and the differentiated inputs of every case), ``cases(ops, quick)`` (or
    ``cases(quick)``), ``make_inputs``, ``reference``, ``CONFIG`` (recorded with the results) and
    ``RUN`` (``ops``, ``budget_s`` and keywords of :func:`run_benchmark`); and optionally
    ``impls(case)`` (other implementations beside ours and the peer: flash's SDPA) and ``flops(case)``
    (see :func:`run_benchmark`). The device's yardsticks (:func:`measure_device`: the bf16
    matrix-multiply rate and the copy bandwidth) are measured in the same run and recorded in the
    config."""
    import argparse
    kw = dict(module.RUN)
    ops, budget_s = kw.pop("ops", None), kw.pop("budget_s", 500.0)
    family = Path(module.__file__).resolve().parent.name
    p = argparse.ArgumentParser(prog=f"python -m kernels.{family}.bench", description=module.__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
    p.add_argument("--write", action="store_true", help=f"write kernels/{family}/results.json")
    if ops:
        p.add_argument("--ops", default=",".join(ops), help="comma-separated subset of " + ",".join(ops))
    p.add_argument("--budget-s", type=float, default=budget_s, help="wall-clock budget of the timings")
    args = p.parse_args(argv)
    chosen = [o for o in args.ops.split(",") if o] if ops else None
    if ops and any(o not in ops for o in chosen):
        raise SystemExit(f"--ops: choose from {tuple(ops)}; got {chosen}")
    import torch
    if not torch.cuda.is_available():
        print(f"the benchmark needs a CUDA GPU; the stored results: kernels.report.show_benchmark({family!r})")
        return 2
    config = dict(module.CONFIG, **({"ops": chosen} if ops else {}))
    config.update(measure_device())
    run_benchmark(family, cases=module.cases(chosen, args.quick) if ops else module.cases(args.quick),
                  make_inputs=module.make_inputs, impls=bench_impls(module), reference=module.reference,
                  grad_names=lambda case: list(op_named(module.OPS, case["op"]).grads),
                  path=family if args.write else None, quick=args.quick,
                  keep=(lambda r: r.get("op") not in chosen) if ops else None, budget_s=args.budget_s,
                  config=config, flops=getattr(module, "flops", None), **kw)
    return 0


def bench_impls(module):
    """A family benchmark's ``impls(case)``: its own where it defines one, else ours and the peer of
    the case's op (:func:`op_impls`)."""
    return getattr(module, "impls", None) or (lambda case: op_impls(module.OPS, case))
