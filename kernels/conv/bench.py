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

import os
import sys

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")   # before fla is imported anywhere

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


def cases(quick=False):
    return [dict(op="conv", B=B, T=T, D=D, W=W) for B, T in (SHAPES_QUICK if quick else SHAPES_FULL) for D in DIMS]


def make_inputs(case):
    import torch
    B, T, D = case["B"], case["T"], case["D"]
    gen = torch.Generator(device="cuda").manual_seed(1000 * B + D)
    x = torch.randn(B, T, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    bound = W ** -0.5
    w = ((torch.rand(D, W, device="cuda", generator=gen) * 2 - 1) * bound).to(torch.bfloat16)
    return {"x": x, "weight": w}


def impls(case):
    from kernels.conv import causal_conv1d
    # check_values=False: fla checks no values (our value checks cost a host sync), so the times compare like for like
    out = {"ours": lambda x, weight: causal_conv1d(x, weight, activation="silu", check_values=False)[0]}
    try:
        from fla.modules.causal_conv1d import causal_conv1d as fla_conv
        out["fla"] = lambda x, weight: fla_conv(x, weight, activation="silu", backend="triton")[0]
    except Exception as e:   # recorded as the peer's note
        out["fla"] = e
    return out


def reference(case, x):
    from kernels.reference import causal_conv1d_ref
    return causal_conv1d_ref(x["x"], x["weight"], activation="silu")[0]


def grad_names(case):
    return ["x", "weight"]


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


GRAPH_LOG = "graph_timing.json"   # beside results.json: Chapter 10 reads it, so it ships with the package


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


RUN = dict(budget_s=480.0, err_T_max=ERR_T, token_inputs=("x",), out_like="x", yardsticks=copy_record,
           annotate=bandwidth)   # for harness.bench_main


if __name__ == "__main__":
    from kernels.harness import bench_main
    sys.exit(bench_main(sys.argv[1:], sys.modules[__name__]))
