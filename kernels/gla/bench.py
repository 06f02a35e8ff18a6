"""Benchmark of record: our chunk_linear_attn / chunk_simple_gla / chunk_gla against fla's.

    python -m kernels.gla.bench [--quick] [--write] [--ops gla,...] [--budget-s S]

Shapes: bfloat16, H = 16, K = V = 128, B·T = 65,536 tokens with T in {2048, 8192, 32768}, plus
B = 1, T = 32768. Passes: ``fwd`` (no gradients) and ``fwdbwd`` (forward + backward). Inputs:
q, k, v ~ N(0, 1) (keys not L2-normalised, as in fla's tests), log gates ``g = logsigmoid(N(0, 1))``
(``[B, T, H]`` for simple GLA, ``[B, T, H, K]`` for GLA), scale ``K ** -0.5``, no initial or final
state. Gated ops are timed twice: with float32 log gates (``gates="float32"``, what fla's layers
pass) and with gates in the input dtype (``gates="input dtype"``).

Accuracy: batch 0, the first ``min(T, 8192)`` tokens, all heads, against the float64 chunkwise
references of :mod:`kernels.reference` (fla's RMS ratio). fla runs its pure Triton path
(``FLA_DISABLE_BACKEND_DISPATCH=1``); its refusals are recorded, not worked around.
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")   # before fla is imported anywhere

H, K, V = 16, 128, 128
SHAPES_FULL = [(32, 2048), (8, 8192), (2, 32768), (1, 32768)]     # (B, T)
SHAPES_QUICK = [(32, 2048)]
OPS = ("linear_attn", "simple_gla", "gla")
GOALS = {"fwd": 1.0, "fwdbwd": 1.0}          # ours / fla, median times
CONFIG = dict(H=H, K=K, V=V, dtype="bfloat16", goals=GOALS,
              inputs="q,k,v ~ N(0,1) (keys not normalised); g = logsigmoid(N(0,1)), float32 or bfloat16 "
                     "(the gates field); scale K^-0.5; no initial/final state")
RUN = dict(ops=OPS, err_T_max=8192)   # for harness.bench_main


def cases(ops=OPS, quick=False):
    out = []
    for B, T in (SHAPES_QUICK if quick else SHAPES_FULL):
        for op in ops:
            for gates in ((None,) if op == "linear_attn" else ("float32", "input dtype")):
                out.append(dict(op=op, B=B, T=T, **({} if gates is None else {"gates": gates})))
    return out


def make_inputs(case):
    import torch
    import torch.nn.functional as F
    B, T = case["B"], case["T"]
    gen = torch.Generator(device="cuda").manual_seed(1000 * B + T)
    x = {n: torch.randn(B, T, H, d, device="cuda", dtype=torch.bfloat16, generator=gen)
         for n, d in (("q", K), ("k", K), ("v", V))}
    if case["op"] != "linear_attn":
        shape = (B, T, H) if case["op"] == "simple_gla" else (B, T, H, K)
        g = F.logsigmoid(torch.randn(*shape, device="cuda", generator=gen))
        x["g"] = g if case["gates"] == "float32" else g.to(torch.bfloat16)
    return x


def impls(case):
    import kernels
    s = K ** -0.5
    # check_values=False: fla checks no values (our value checks cost a host sync), so the times compare like for like
    ours = {"linear_attn": lambda q, k, v: kernels.chunk_linear_attn(q, k, v, scale=s, check_values=False)[0],
            "simple_gla": lambda q, k, v, g: kernels.chunk_simple_gla(q, k, v, g, scale=s, check_values=False)[0],
            "gla": lambda q, k, v, g: kernels.chunk_gla(q, k, v, g, scale=s, check_values=False)[0]}
    out = {"ours": ours[case["op"]]}
    try:
        from fla.ops.gla import chunk_gla
        from fla.ops.linear_attn import chunk_linear_attn
        from fla.ops.simple_gla import chunk_simple_gla
        out["fla"] = {"linear_attn": lambda q, k, v: chunk_linear_attn(q, k, v, scale=s, normalize=False)[0],
                      "simple_gla": lambda q, k, v, g: chunk_simple_gla(q, k, v, g=g, scale=s)[0],
                      "gla": lambda q, k, v, g: chunk_gla(q, k, v, g, scale=s)[0]}[case["op"]]
    except Exception as e:
        out["fla"] = e
    return out


def reference(case, x):
    from kernels import reference as ref
    if case["op"] == "gla":
        return ref.chunk_gla_ref(x["q"], x["k"], x["v"], x["g"], K ** -0.5)[0]
    return ref.chunk_scalar_ref(x["q"], x["k"], x["v"], x.get("g"), None, K ** -0.5)[0]


def grad_names(case):
    return ["q", "k", "v"] + ([] if case["op"] == "linear_attn" else ["g"])


if __name__ == "__main__":
    from kernels.harness import bench_main
    sys.exit(bench_main(sys.argv[1:], sys.modules[__name__]))
