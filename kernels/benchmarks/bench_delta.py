"""Benchmark: our Triton (gated) delta rule vs flash-linear-attention (fla), on a GPU.

    python -m kernels.benchmarks.bench_delta [--quick] [--write]

For op ∈ {delta_rule, gated_delta_rule}, bfloat16, H = 16, K = V = 128, B·T = 65,536 with
T ∈ {2048, 8192, 32768}, plus B = 1, T = 32768; pass ∈ {fwd, fwdbwd}: median ms
(``harness.bench_ms``) of ``kernels.chunk_*`` (``backend="triton"``) and of
``fla.ops.delta_rule.chunk_delta_rule`` / ``fla.ops.gated_delta_rule.chunk_gated_delta_rule``
(``FLA_DISABLE_BACKEND_DISPATCH=1`` is set before fla is imported, so fla runs its own Triton path).

Inputs (never zeros): ``q, v ~ N(0, 1)``; ``k`` = L2-normalised ``N(0, 1)`` (normalised here, so
both implementations compute the same function: no in-kernel l2norm); ``β = sigmoid(N(0, 1))``;
``g = logsigmoid(N(0, 1))`` (log decays, mean decay ≈ 0.5 per token: a harsh but typical gate);
``scale = K^-1/2``, no initial state, no final state. All in bfloat16.

Accuracy: for every shape, a ``B = 1`` slice of the same inputs is run through each implementation
and through ``kernels.reference.chunk_scalar_ref`` on float64 copies (with autograd for the
gradients, for an upstream gradient ``do ~ N(0, 1)``); ``err`` holds ``harness.err_ratio`` (fla's
RMS ratio) for ``o`` and each gradient (targets: ≤ 0.005 for outputs, ≤ 0.02 for gate gradients),
and ``o_infer`` for the output of a call without gradients (the timed ``fwd`` pass: our inference
forward runs in T form, ``triton_delta._tform_fwd``).

fla may refuse a backward pass on some Triton/GPU combinations; each fla call is wrapped and a
failure is recorded as ``{"ms": null, "note": <error>}``, never worked around.
Records: ``{impl, op, T, B, H, K, V, dtype, pass, ms, err, note}``; ``--write`` stores them with
``harness.write_results("bench_delta", ...)``. The summary table (ours/fla ratios) prints last.
"""
from __future__ import annotations

import argparse
import os
import sys

H, K, V = 16, 128, 128
TOKENS = 65536
SHAPES = [(TOKENS // 2048, 2048), (TOKENS // 8192, 8192), (TOKENS // 32768, 32768), (1, 32768)]
QUICK_SHAPES = [(8, 2048), (1, 8192)]
OPS = ("delta_rule", "gated_delta_rule")


def _make_inputs(B, T, device, dtype, seed):
    import torch
    import torch.nn.functional as F
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, T, H, K, device=device, generator=gen)
    k = F.normalize(torch.randn(B, T, H, K, device=device, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, device=device, generator=gen)
    beta = torch.sigmoid(torch.randn(B, T, H, device=device, generator=gen))
    g = F.logsigmoid(torch.randn(B, T, H, device=device, generator=gen))
    return {n: x.to(dtype) for n, x in dict(q=q, k=k, v=v, beta=beta, g=g).items()}


def _ours(op):
    import kernels
    if op == "delta_rule":
        return lambda q, k, v, g, beta: kernels.chunk_delta_rule(q, k, v, beta, backend="triton")[0]
    return lambda q, k, v, g, beta: kernels.chunk_gated_delta_rule(q, k, v, g, beta, backend="triton")[0]


def _fla(op):
    os.environ["FLA_DISABLE_BACKEND_DISPATCH"] = "1"
    if op == "delta_rule":
        from fla.ops.delta_rule import chunk_delta_rule
        return lambda q, k, v, g, beta: chunk_delta_rule(q, k, v, beta, scale=K ** -0.5)[0]
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    return lambda q, k, v, g, beta: chunk_gated_delta_rule(q, k, v, g, beta, scale=K ** -0.5)[0]


def _grad_names(op):
    return ["q", "k", "v", "beta"] + (["g"] if op == "gated_delta_rule" else [])


def _reference(op, x):
    """float64 chunkwise reference on a B = 1 slice: o and gradients for ``do``."""
    import torch
    from kernels import reference
    r = {n: t.detach().double().requires_grad_(True) for n, t in x.items()}
    o, _ = reference.chunk_scalar_ref(r["q"], r["k"], r["v"], r["g"] if op == "gated_delta_rule" else None,
                                      r["beta"], K ** -0.5)
    gen = torch.Generator(device=o.device).manual_seed(123)
    do = torch.randn(o.shape, device=o.device, dtype=torch.float64, generator=gen)
    names = _grad_names(op)
    grads = torch.autograd.grad(o, [r[n] for n in names], do)
    return o.detach(), do, dict(zip(names, grads))


def _accuracy(fn, op, x, ref):
    import torch
    from .harness import err_ratio
    o_ref, do, g_ref = ref
    names = _grad_names(op)
    leaves = {n: t.detach().clone().requires_grad_(n in names) for n, t in x.items()}
    o = fn(**leaves)
    err = {"o": err_ratio(o, o_ref)}
    with torch.no_grad():     # the inference forward (the timed "fwd" pass) may take another path
        err["o_infer"] = err_ratio(fn(**x), o_ref)
    try:
        grads = torch.autograd.grad(o, [leaves[n] for n in names], do.to(o.dtype))
        err.update({"d" + n: err_ratio(gr, g_ref[n]) for n, gr in zip(names, grads)})
    except Exception as e:  # fla's backward may refuse: keep the forward error
        err["bwd_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return err


def _time(fn, op, x, pass_, quick):
    import torch
    from .harness import bench_ms
    names = _grad_names(op)
    warm, rep = (5, 20) if quick else (10, 50)
    if pass_ == "fwd":
        with torch.no_grad():
            return bench_ms(lambda: fn(**x), warmup=warm, rep=rep)
    leaves = {n: t.detach().clone().requires_grad_(n in names) for n, t in x.items()}
    do = torch.randn_like(x["v"])
    ins = [leaves[n] for n in names]
    def step():
        o = fn(**leaves)
        torch.autograd.grad(o, ins, do)
    return bench_ms(step, warmup=warm, rep=rep)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="two small shapes, fewer repetitions")
    p.add_argument("--write", action="store_true", help="store records in kernels/results/bench_delta.json")
    args = p.parse_args(argv)

    os.environ["FLA_DISABLE_BACKEND_DISPATCH"] = "1"   # before any fla import
    import torch
    if not torch.cuda.is_available():
        print("bench_delta needs a CUDA GPU (the Triton kernels are timed compiled)", file=sys.stderr)
        return 2
    from .harness import environment, write_results
    dev, dtype = "cuda", torch.bfloat16
    shapes = QUICK_SHAPES if args.quick else SHAPES
    records = []
    for op in OPS:
        impls = {"ours": _ours(op)}
        try:
            impls["fla"] = _fla(op)
        except Exception as e:
            print(f"fla unavailable: {type(e).__name__}: {e}", file=sys.stderr)
        for B, T in shapes:
            x = _make_inputs(B, T, dev, dtype, seed=T + B)
            x1 = {n: t[:1].contiguous() for n, t in x.items()}
            ref = _reference(op, x1)
            for impl, fn in impls.items():
                try:
                    err = _accuracy(fn, op, x1, ref)
                except Exception as e:
                    err = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                for pass_ in ("fwd", "fwdbwd"):
                    rec = dict(impl=impl, op=op, T=T, B=B, H=H, K=K, V=V, dtype="bfloat16", **{"pass": pass_},
                               ms=None, err=err, note=None)
                    try:
                        rec["ms"] = _time(fn, op, x, pass_, args.quick)
                    except Exception as e:
                        msg = str(e).strip().splitlines()
                        rec["note"] = f"{type(e).__name__}: {msg[0][:300] if msg else ''}"
                    records.append(rec)
                    ms = f"{rec['ms']:.3f} ms" if rec["ms"] is not None else "failed"
                    print(f"{op:17s} {impl:4s} B={B:3d} T={T:6d} {pass_:6s} {ms:>12s}  "
                          f"err={ {k: (round(v, 5) if isinstance(v, float) else v) for k, v in err.items()} }"
                          + (f"  note={rec['note']}" if rec["note"] else ""), flush=True)
            del x, x1, ref
            torch.cuda.empty_cache()
    if args.write:
        path = write_results("bench_delta", dict(H=H, K=K, V=V, dtype="bfloat16", tokens=TOKENS,
                                                 shapes=shapes, quick=args.quick,
                                                 inputs="q,v~N(0,1); k=l2norm(N(0,1)); beta=sigmoid(N); "
                                                        "g=logsigmoid(N)"), records, environment())
        print(f"wrote {path}")
    # summary: ours / fla
    print("\nsummary (median ms; ratio = ours / fla; targets fwd ≤ 0.5, fwdbwd ≤ 1.0)")
    print(f"{'op':17s} {'B':>3s} {'T':>6s} {'pass':6s} {'ours':>9s} {'fla':>9s} {'ratio':>7s}")
    for op in OPS:
        for B, T in shapes:
            for pass_ in ("fwd", "fwdbwd"):
                ms = {r["impl"]: r["ms"] for r in records
                      if r["op"] == op and r["T"] == T and r["B"] == B and r["pass"] == pass_}
                o, f = ms.get("ours"), ms.get("fla")
                ratio = f"{o / f:7.3f}" if (o and f) else "    n/a"
                fmt = lambda v: f"{v:9.3f}" if v is not None else "      n/a"
                print(f"{op:17s} {B:3d} {T:6d} {pass_:6s} {fmt(o)} {fmt(f)} {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
