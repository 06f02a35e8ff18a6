"""Benchmark of record: our chunk_delta_rule / chunk_gated_delta_rule against fla's; the family's
four ops described once (``OPS``: DeltaProduct and Comba are timed by the survey, ``kernels.survey``).

    python -m kernels.delta.bench [--quick] [--write] [--ops gated_delta_rule] [--budget-s S]

Shapes: bfloat16, H = 16, K = V = 128, B·T = 65,536 with T in {2048, 8192, 32768}, plus B = 1,
T = 32768. Passes: ``fwd`` (no gradients: our inference forward, T form) and ``fwdbwd``. Inputs
(never zeros): ``q, v ~ N(0, 1)``; ``k`` = L2-normalised ``N(0, 1)`` (normalised here, so both
implementations compute the same function); ``β = sigmoid(N(0, 1))`` in the input dtype;
``g = logsigmoid(N(0, 1))`` either float32 (``gates="float32"``, as fla's layers pass it) or in the
input dtype (``gates="input dtype"``); ``scale = K^-1/2``, no initial or final state. (The survey's
cases ask for β in float32, ``beta="float32"``; DeltaProduct's ``k``, ``v`` and β have ``n`` rows per
token.)

Accuracy: batch 0, the first 8192 tokens, all heads, against the float64 chunkwise reference
(:func:`kernels.reference.chunk_scalar_ref`): ``o`` (inference forward), ``o_train`` and every
gradient (fla's RMS ratio). fla runs its pure Triton path; its refusals are recorded.
"""
from __future__ import annotations

import sys


from kernels.harness import (CompileCases, Op, Surveyed, benched, in_dtype, log_gates, randn, scale_of,  # noqa: E402
                             sigmoid_of_normal, unit_rows)

H, K, V = 16, 128, 128
TOKENS = 65536
SHAPES_FULL = [(TOKENS // 2048, 2048), (TOKENS // 8192, 8192), (TOKENS // 32768, 32768), (1, 32768)]
SHAPES_QUICK = [(8, 2048), (1, 8192)]
NUM_HOUSEHOLDER = 2      # DeltaProduct's steps per token in the survey


def _gated(fn, case):    # chunk_gated_delta_rule's and chunk_comba's call
    return lambda q, k, v, g, beta: fn(q, k, v, g, beta, scale=scale_of(q), check_values=False)[0]


def _survey(op, chapter, config=None, **fields):    # the survey's cases: beta in float32
    return Surveyed(chapter, lambda B, T, heads, dim: dict(op=op, B=B, T=T, H=heads, K=dim, V=dim, beta="float32",
                                                           **fields), config or {})


# the family's ops, described once: the benchmark below, the survey and the compile check read them
OPS = (
    Op("delta_rule", "chunk_delta_rule", "fla.ops.delta_rule.chunk_delta_rule", ("q", "k", "v", "beta"),
       ours=lambda fn, case: lambda q, k, v, beta: fn(q, k, v, beta, scale=scale_of(q), check_values=False)[0],
       peer=lambda fn, case: lambda q, k, v, beta: fn(q, k, v, beta, scale=scale_of(q))[0],
       survey=_survey("delta_rule", 5)),
    Op("gated_delta_rule", "chunk_gated_delta_rule", "fla.ops.gated_delta_rule.chunk_gated_delta_rule",
       ("q", "k", "v", "beta", "g"), ours=_gated,
       peer=lambda fn, case: lambda q, k, v, g, beta: fn(q, k, v, g, beta, scale=scale_of(q))[0],
       survey=_survey("gated_delta_rule", 6, gates="float32")),
    # n, the steps per token: the rows of k over those of q
    Op("gated_delta_product", "chunk_gated_delta_product", "fla.ops.gated_delta_product.chunk_gated_delta_product",
       ("q", "k", "v", "beta", "g"),
       ours=lambda fn, case: lambda q, k, v, g, beta: fn(q, k, v, g, beta, k.shape[1] // q.shape[1], scale=scale_of(q),
                                                         check_values=False)[0],
       peer=lambda fn, case: lambda q, k, v, g, beta: fn(q, k, v, g, beta, k.shape[1] // q.shape[1],
                                                         scale=scale_of(q))[0],
       survey=_survey("gated_delta_product", 6, {"num_householder": NUM_HOUSEHOLDER}, n=NUM_HOUSEHOLDER,
                      gates="float32"), benched=False),
    # fla's form reads with a vector p; p = k is the same amount of work (beta is Comba's eta)
    Op("comba", "chunk_comba", "fla.ops.comba.chunk_comba", ("q", "k", "v", "beta", "g"), ours=_gated,
       peer=lambda fn, case: lambda q, k, v, g, beta: fn(q, k, v, k, g, beta, scale=scale_of(q))[0],
       survey=_survey("comba", 6, gates="float32"), benched=False),
)
GOALS = {"fwd": 0.5, "fwdbwd": 1.0}          # ours / fla, median times
CONFIG = dict(H=H, K=K, V=V, dtype="bfloat16", tokens=TOKENS, goals=GOALS,
              inputs="q,v ~ N(0,1); k = l2norm(N(0,1)); beta = sigmoid(N) in bf16; g = logsigmoid(N), "
                     "float32 or bf16 (the gates field)")
RUN = dict(ops=benched(OPS), err_T_max=8192)   # for harness.bench_main


def cases(ops=None, quick=False):
    out = []
    for op in ops or benched(OPS):
        for B, T in (SHAPES_QUICK if quick else SHAPES_FULL):
            for gates in (("float32", "input dtype") if op == "gated_delta_rule" else (None,)):
                out.append(dict(op=op, B=B, T=T, **({} if gates is None else {"gates": gates})))
    return out


def make_inputs(case, *, device="cuda", dtype=None, seed=None):
    """``q`` (``[B, T, H, K]``), L2-normalised ``k``, ``v`` and ``beta`` (``n`` rows per token for
    DeltaProduct: ``[B, T n, ...]``; ``beta`` in the case's ``beta`` dtype, default the input dtype)
    and, gated, ``g`` (``[B, T, H]``, in the case's ``gates`` dtype)."""
    import torch
    B, T, heads, dk, dv = case["B"], case["T"], case.get("H", H), case.get("K", K), case.get("V", V)
    dtype = torch.bfloat16 if dtype is None else dtype
    gen = torch.Generator(device=device).manual_seed(T + B if seed is None else seed)
    rows = T * case.get("n", 1)
    x = dict(q=randn(B, T, heads, dk, gen=gen).to(dtype), k=unit_rows(B, rows, heads, dk, gen=gen).to(dtype),
             v=randn(B, rows, heads, dv, gen=gen).to(dtype),
             beta=in_dtype(sigmoid_of_normal(B, rows, heads, gen=gen), case.get("beta", "input dtype"), dtype))
    if case["op"] != "delta_rule":
        x["g"] = in_dtype(log_gates(B, T, heads, gen=gen), case["gates"], dtype)
    return x


def reference(case, x):
    from kernels.reference import chunk_scalar_ref
    return chunk_scalar_ref(x["q"], x["k"], x["v"], x.get("g"), x["beta"], scale_of(x["q"]))[0]


def _compile_cases(caps, quick, half, halves):
    """(dtype, K, V, gated, batch × heads, plan overrides): B·H = 256 takes V-blocks of 64, B·H = 2
    blocks of 16 with stored scores; two chunk ranges take the narrow scores configuration"""
    import torch
    f16, f32, bf = torch.float16, torch.float32, half
    cases = [(bf, 128, 128, gated, (64, 4), {}) for gated in (False, True)]
    cases += [(bf, 128, 128, True, (1, 2), {"march_ranges": 2, "march_scores_bk": 64})]
    if caps.major < 9:   # float32 off Hopper (per-chunk gradients by PyTorch at K = 128 there)
        cases += [(f32, 128, 128, True, (1, 2), {})]
    if not quick:
        cases += [(dt, K, V, True, (1, 2), {}) for dt in (f16, f32) for K, V in ((16, 16), (64, 128), (128, 64))]
    return cases


def _compile_run(case, caps):
    import torch
    from kernels.delta import comba
    from kernels.delta.op import delta_rule_triton
    dt, K, V, gated, (B, H), over = case
    T = 130
    q = torch.randn(B, T, H, K, dtype=dt, requires_grad=True)
    k = unit_rows(B, T, H, K).to(dt).requires_grad_()
    v = torch.randn(B, T, H, V, dtype=dt, requires_grad=True)
    beta = torch.rand(B, T, H, dtype=dt, requires_grad=True)
    g = -torch.rand(B, T, H, requires_grad=True) if gated else None
    with torch.no_grad():          # the inference forward (T form)
        delta_rule_triton(q, k, v, g, beta, 0.1, None, True, plan=dict(over), caps=caps)
    o, ht = delta_rule_triton(q, k, v, g, beta, 0.1, None, True, plan=dict(over), caps=caps)
    torch.autograd.grad(o.float().sum() + ht.sum(), [q, k, v, beta] + ([g] if gated else []))
    if gated and caps.major >= 8:  # chunk_comba's change of variables (sm_75 runs the delta rule in PyTorch)
        mapped = comba.comba_map(k, v, g, beta)
        torch.autograd.grad(sum(t.float().sum() for t in mapped), [k, v, g, beta])


# the compile check's calls (kernels.compile): the delta rule plain and gated, inference and training,
# at the benchmark's head size, the plan's variants, then other dtypes and head sizes
COMPILE = CompileCases(("kernels.common.solve", "kernels.delta.wy", "kernels.delta.march", "kernels.delta.backward",
                        "kernels.delta.comba"), _compile_cases, _compile_run)


if __name__ == "__main__":
    from kernels.harness import bench_main
    sys.exit(bench_main(sys.argv[1:], sys.modules[__name__]))
