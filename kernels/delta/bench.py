"""Benchmark of record: our chunk_delta_rule / chunk_gated_delta_rule against fla's.

    python -m kernels.delta.bench [--quick] [--write] [--ops gated_delta_rule] [--budget-s S]

Shapes: bfloat16, H = 16, K = V = 128, B·T = 65,536 with T in {2048, 8192, 32768}, plus B = 1,
T = 32768. Passes: ``fwd`` (no gradients: our inference forward, T form) and ``fwdbwd``. Inputs
(never zeros): ``q, v ~ N(0, 1)``; ``k`` = L2-normalised ``N(0, 1)`` (normalised here, so both
implementations compute the same function); ``β = sigmoid(N(0, 1))`` in the input dtype;
``g = logsigmoid(N(0, 1))`` either float32 (``gates="float32"``, as fla's layers pass it) or in the
input dtype (``gates="input dtype"``); ``scale = K^-1/2``, no initial or final state.

Accuracy: batch 0, the first 8192 tokens, all heads, against the float64 chunkwise reference
(:func:`kernels.reference.chunk_scalar_ref`): ``o`` (inference forward), ``o_train`` and every
gradient (fla's RMS ratio). fla runs its pure Triton path; its refusals are recorded.
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")   # before fla is imported anywhere

H, K, V = 16, 128, 128
TOKENS = 65536
SHAPES_FULL = [(TOKENS // 2048, 2048), (TOKENS // 8192, 8192), (TOKENS // 32768, 32768), (1, 32768)]
SHAPES_QUICK = [(8, 2048), (1, 8192)]
OPS = ("delta_rule", "gated_delta_rule")
GOALS = {"fwd": 0.5, "fwdbwd": 1.0}          # ours / fla, median times
CONFIG = dict(H=H, K=K, V=V, dtype="bfloat16", tokens=TOKENS, goals=GOALS,
              inputs="q,v ~ N(0,1); k = l2norm(N(0,1)); beta = sigmoid(N) in bf16; g = logsigmoid(N), "
                     "float32 or bf16 (the gates field)")
RUN = dict(ops=OPS, err_T_max=8192)   # for harness.bench_main


def cases(ops=OPS, quick=False):
    out = []
    for op in ops:
        for B, T in (SHAPES_QUICK if quick else SHAPES_FULL):
            for gates in (("float32", "input dtype") if op == "gated_delta_rule" else (None,)):
                out.append(dict(op=op, B=B, T=T, **({} if gates is None else {"gates": gates})))
    return out


def make_inputs(case):
    import torch
    import torch.nn.functional as F
    B, T = case["B"], case["T"]
    gen = torch.Generator(device="cuda").manual_seed(T + B)
    bf = torch.bfloat16
    x = dict(q=torch.randn(B, T, H, K, device="cuda", generator=gen).to(bf),
             k=F.normalize(torch.randn(B, T, H, K, device="cuda", generator=gen), dim=-1).to(bf),
             v=torch.randn(B, T, H, V, device="cuda", generator=gen).to(bf),
             beta=torch.sigmoid(torch.randn(B, T, H, device="cuda", generator=gen)).to(bf))
    if case["op"] == "gated_delta_rule":
        g = F.logsigmoid(torch.randn(B, T, H, device="cuda", generator=gen))
        x["g"] = g if case["gates"] == "float32" else g.to(bf)
    return x


def impls(case):
    import kernels
    s = K ** -0.5
    # check_values=False: fla checks no values (our value checks cost a host sync), so the times compare like for like
    if case["op"] == "delta_rule":
        out = {"ours": lambda q, k, v, beta: kernels.chunk_delta_rule(q, k, v, beta, scale=s, check_values=False)[0]}
    else:
        out = {"ours": lambda q, k, v, beta, g: kernels.chunk_gated_delta_rule(q, k, v, g, beta, scale=s,
                                                                              check_values=False)[0]}
    try:
        if case["op"] == "delta_rule":
            from fla.ops.delta_rule import chunk_delta_rule
            out["fla"] = lambda q, k, v, beta: chunk_delta_rule(q, k, v, beta, scale=s)[0]
        else:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule
            out["fla"] = lambda q, k, v, beta, g: chunk_gated_delta_rule(q, k, v, g, beta, scale=s)[0]
    except Exception as e:
        out["fla"] = e
    return out


def reference(case, x):
    from kernels.reference import chunk_scalar_ref
    return chunk_scalar_ref(x["q"], x["k"], x["v"], x.get("g"), x["beta"], K ** -0.5)[0]


def grad_names(case):
    return ["q", "k", "v", "beta"] + (["g"] if case["op"] == "gated_delta_rule" else [])


if __name__ == "__main__":
    from kernels.harness import bench_main
    sys.exit(bench_main(sys.argv[1:], sys.modules[__name__]))
