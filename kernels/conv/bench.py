"""Benchmark of record: the short convolution, our Triton kernels against fla's ``causal_conv1d`` and a copy.

    python -m kernels.conv.bench [--quick] [--write] [--budget-s S]

Shapes: bfloat16, W = 4, SiLU (the setting of fla's DeltaNet layers: ``ShortConvolution`` without
bias), D in {2048, 4096}, B·T = 65,536 tokens with (B, T) = (32, 2048), plus (8, 8192) without
``--quick``. Passes: ``fwd`` (no gradients) and ``fwdbwd`` (forward + backward for ``x`` and
``weight``, with its peak memory above the inputs).

The op is memory-bound, so every record carries its achieved bandwidth, ``gbps`` = bytes moved /
time, and the same run times a device-to-device copy of ``x`` (``x.clone()``, impl ``copy``, pass
``fwd``) as the yardstick. Bytes counted (``s`` bytes per element, ``N = B·T·D``): the forward
reads ``x`` and writes ``y``, ``2·N·s``; forward + backward adds the backward's unavoidable traffic,
reading ``x`` and ``dy`` and writing ``dx``, ``5·N·s`` in all (the weight, its gradient and partial
sums, ``O(D·W)`` per few hundred tokens, are not counted). A copy moves ``2·N·s``.

Inputs: ``x ~ N(0, 1)``, ``weight ~ U(-1/√W, 1/√W)`` (``nn.Conv1d``'s initialisation), both
bfloat16; upstream gradient ``N(0, 1)``. Accuracy: batch 0, the first min(T, 2048) tokens, all
channels, against the float64 reference (:func:`kernels.reference.causal_conv1d_ref`), fla's RMS
ratio, for ``y`` (inference and training forwards), ``dx`` and ``dweight``. fla runs its Triton
path (``backend="triton"``, ``FLA_DISABLE_BACKEND_DISPATCH=1``).

The loop is :func:`kernels.harness.run_benchmark`'s: the weight is not a ``[B, T, ...]`` input
(``token_inputs``), the copy is measured once per case (``yardsticks``) and every timed record gets
its bandwidth and its fraction of the copy's (``annotate``).
"""
from __future__ import annotations

import sys


from kernels.harness import CompileCases, Op, Surveyed, randn  # noqa: E402

W, TOKENS, ERR_T = 4, 65536, 2048
DIMS = (2048, 4096)
SHAPES_FULL = [(32, 2048), (8, 8192)]     # (B, T)
SHAPES_QUICK = [(32, 2048)]
# the targets: our time over the peer's, and the fraction of the copy's bandwidth to reach
GOALS = {"by_peer": {"fla": {"conv": {"fwd": 0.8, "fwdbwd": 1.0}}}}
COPY_FRACTION_GOAL = 0.7
CONFIG = dict(W=W, dtype="bfloat16", activation="silu", bias=False, goals=GOALS,
              copy_fraction_goal=COPY_FRACTION_GOAL,
              bytes="fwd: read x + write y (2 N s); fwdbwd: + read x, dy, write dx (5 N s); copy: 2 N s",
              inputs="x ~ N(0, 1), weight ~ U(-1/sqrt(W), 1/sqrt(W)), bfloat16; dy ~ N(0, 1)",
              peer="fla 0.6.0 fla.modules.causal_conv1d.causal_conv1d (backend='triton')")


# the family's op, described once: the benchmark below, the survey (x [B, T, H·D], the width W) and the
# compile check read it
OPS = (
    Op("conv", "causal_conv1d", "fla.modules.causal_conv1d.causal_conv1d", ("x", "weight"),
       ours=lambda fn, case: lambda x, weight: fn(x, weight, activation="silu", check_values=False)[0],
       peer=lambda fn, case: lambda x, weight: fn(x, weight, activation="silu", backend="triton")[0],
       survey=Surveyed(10, lambda B, T, heads, dim: dict(op="conv", B=B, T=T, D=heads * dim, W=W), {"conv_width": W})),
)


def cases(quick=False):
    return [dict(op="conv", B=B, T=T, D=D, W=W) for B, T in (SHAPES_QUICK if quick else SHAPES_FULL) for D in DIMS]


def make_inputs(case, *, device="cuda", dtype=None, seed=None):
    """``x`` (``[B, T, D]``, ``N(0, 1)``) and ``weight`` (``[D, W]``, ``U(-1/√W, 1/√W)``)."""
    import torch
    B, T, D = case["B"], case["T"], case["D"]
    dtype = torch.bfloat16 if dtype is None else dtype
    gen = torch.Generator(device=device).manual_seed(1000 * B + D if seed is None else seed)
    x = randn(B, T, D, gen=gen, dtype=dtype)
    bound = case["W"] ** -0.5
    w = ((torch.rand(D, case["W"], device=device, generator=gen) * 2 - 1) * bound).to(dtype)
    return {"x": x, "weight": w}


def reference(case, x):
    from kernels.reference import causal_conv1d_ref
    return causal_conv1d_ref(x["x"], x["weight"], activation="silu")[0]


def moved_bytes(case, pass_, elem=2):
    n = case["B"] * case["T"] * case["D"] * elem
    return {"fwd": 2 * n, "fwdbwd": 5 * n, "copy": 2 * n}[pass_]


def copy_record(case, x, warmup, rep):
    """The yardstick: a device-to-device copy of ``x`` (``x.clone()``), timed in the same run."""
    from kernels.harness import bench_ms
    rec = dict(impl="copy", **case, **{"pass": "fwd"}, ms=None, err=None, note="x.clone()")
    rec["ms"] = bench_ms(lambda: x["x"].clone(), warmup=warmup, rep=rep)
    rec["gbps"] = round(moved_bytes(case, "copy") / rec["ms"] / 1e6, 1)
    print(f"copy  {case}  {rec['gbps']:.0f} GB/s", flush=True)
    return [rec]


def bandwidth(case, rec, yardsticks):
    rec["gbps"] = round(moved_bytes(case, rec["pass"]) / rec["ms"] / 1e6, 1)
    rec["copy_fraction"] = round(rec["gbps"] / yardsticks[0]["gbps"], 3)


GRAPH_LOG = "graph_timing.json"   # beside results.json: Chapter 11 reads it, so it ships with the package


def launched_vs_graphed(log=None, gbps=None) -> list:
    """The forward + backward as launched from Python and replayed from a CUDA graph
    (``lab/graph_timing.py``'s log, default the stored one, ``graph_timing.json`` beside ``results.json``): per shape and way, the median ms and its
    fraction of the copy's bandwidth (``5·N·s`` bytes; ``gbps`` default the median copy of the
    benchmark of record). A graph replays the same kernels without the host, so where launched is
    slower than graphed the step waits for the host, not for memory."""
    import json
    import statistics
    from pathlib import Path
    from kernels.results import load_results
    if log is None:
        path = Path(__file__).parent / GRAPH_LOG
        if not path.exists():
            raise FileNotFoundError(f"no stored log at {path}; run `python -m kernels.conv.lab.graph_timing "
                                    "--write` on a GPU to create it")
        log = json.loads(path.read_text())
    if gbps is None:
        gbps = statistics.median(r["gbps"] for r in load_results("conv")["records"] if r["impl"] == "copy")
    return [dict(B=r["B"], T=r["T"], D=r["D"], how=r["how"], ms=r["median"], low=r["low"], high=r["high"],
                 copy_fraction=moved_bytes(r, "fwdbwd") / r["median"] / 1e6 / gbps) for r in log["rows"]]


def _compile_cases(caps, quick, half, halves):
    """(dtype, D, W, activation, bias/residual/state/final state): the benchmark's setting, then others
    (the marching forward up to W = 4, the tiled one at W = 8)"""
    import torch
    f32, bf = torch.float32, half
    cases = [(bf, 2048, 4, "silu", False), (bf, 4096, 4, "silu", True), (bf, 2048, 4, None, False),
             (bf, 512, 8, "silu", True)]
    if not quick:
        cases += [(dt, D, W, a, o) for dt in halves + (f32,) for D, W in ((64, 2), (200, 3), (512, 8))
                  for a in (None, "silu") for o in (False, True)]
    return cases


def _compile_run(case, caps):
    import torch
    from kernels.conv.op import causal_conv1d_triton
    dt, D, W, act, opts = case
    x = torch.randn(2, 300, D, dtype=dt, requires_grad=True)
    w = torch.randn(D, W, dtype=dt, requires_grad=True)
    b, r, s = ((torch.randn(*sh, dtype=dt, requires_grad=True) if opts else None)
               for sh in ((D,), (2, 300, D), (2, D, W)))
    y, ht = causal_conv1d_triton(x, w, b, r, s, opts, act, caps=caps)
    loss = y.float().sum() + (ht.float().sum() if ht is not None else 0)
    torch.autograd.grad(loss, [t for t in (x, w, b, r, s) if t is not None])


# the compile check's calls (kernels.compile): the forward, the final state and the backward
COMPILE = CompileCases(("kernels.conv.forward", "kernels.conv.backward"), _compile_cases, _compile_run)

RUN = dict(budget_s=480.0, err_T_max=ERR_T, token_inputs=("x",), out_like="x", yardsticks=copy_record,
           annotate=bandwidth)   # for harness.bench_main


if __name__ == "__main__":
    from kernels.harness import bench_main
    sys.exit(bench_main(sys.argv[1:], sys.modules[__name__]))
