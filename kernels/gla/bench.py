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

import sys


from kernels.harness import CompileCases, Op, Surveyed, benched, in_dtype, log_gates, randn, scale_of  # noqa: E402

H, K, V = 16, 128, 128
SHAPES_FULL = [(32, 2048), (8, 8192), (2, 32768), (1, 32768)]     # (B, T)
SHAPES_QUICK = [(32, 2048)]


def _ours_gated(fn, case):
    return lambda q, k, v, g: fn(q, k, v, g, scale=scale_of(q), check_values=False)[0]


def _survey(op, chapter, gated=True):
    return Surveyed(chapter, lambda B, T, heads, dim: dict(op=op, B=B, T=T, H=heads, K=dim, V=dim,
                                                           **({"gates": "float32"} if gated else {})))


# the family's ops, described once: the benchmark below, the survey and the compile check read them
OPS = (
    Op("linear_attn", "chunk_linear_attn", "fla.ops.linear_attn.chunk_linear_attn", ("q", "k", "v"),
       ours=lambda fn, case: lambda q, k, v: fn(q, k, v, scale=scale_of(q), check_values=False)[0],
       peer=lambda fn, case: lambda q, k, v: fn(q, k, v, scale=scale_of(q), normalize=False)[0],
       survey=_survey("linear_attn", 2, gated=False)),
    Op("simple_gla", "chunk_simple_gla", "fla.ops.simple_gla.chunk_simple_gla", ("q", "k", "v", "g"),
       ours=_ours_gated, peer=lambda fn, case: lambda q, k, v, g: fn(q, k, v, g=g, scale=scale_of(q))[0],
       survey=_survey("simple_gla", 3)),
    Op("gla", "chunk_gla", "fla.ops.gla.chunk_gla", ("q", "k", "v", "g"),
       ours=_ours_gated, peer=lambda fn, case: lambda q, k, v, g: fn(q, k, v, g, scale=scale_of(q))[0],
       survey=_survey("gla", 3)),
)
GOALS = {"fwd": 1.0, "fwdbwd": 1.0}          # ours / fla, median times
CONFIG = dict(H=H, K=K, V=V, dtype="bfloat16", goals=GOALS,
              inputs="q,k,v ~ N(0,1) (keys not normalised); g = logsigmoid(N(0,1)), float32 or bfloat16 "
                     "(the gates field); scale K^-0.5; no initial/final state")
RUN = dict(ops=benched(OPS), err_T_max=8192)   # for harness.bench_main


def cases(ops=None, quick=False):
    out = []
    for B, T in (SHAPES_QUICK if quick else SHAPES_FULL):
        for op in ops or benched(OPS):
            for gates in ((None,) if op == "linear_attn" else ("float32", "input dtype")):
                out.append(dict(op=op, B=B, T=T, **({} if gates is None else {"gates": gates})))
    return out


def flops(case):
    """The chunked forward's matrix products per head and chunk of ``C = 64`` tokens: the scores
    ``Q Kᵀ`` and ``A V`` inside the chunk (``C·K`` and ``C·V`` multiply-adds a token), the read of the
    state ``Q S`` and its update ``Kᵀ V`` (``K·V`` each a token); two operations a multiply-add. The
    gates' elementwise work is not counted."""
    dk, dv = case.get("K", K), case.get("V", V)
    return 2 * case["B"] * case["T"] * case.get("H", H) * (64 * (dk + dv) + 2 * dk * dv)


def make_inputs(case, *, device="cuda", dtype=None, seed=None):
    """``q, k, v`` (``[B, T, H, K]``, ``V`` for ``v``) and, gated, ``g`` (``[B, T, H]``, GLA's
    ``[B, T, H, K]``) in the case's ``gates`` dtype."""
    import torch
    B, T, heads, dk, dv = case["B"], case["T"], case.get("H", H), case.get("K", K), case.get("V", V)
    dtype = torch.bfloat16 if dtype is None else dtype
    gen = torch.Generator(device=device).manual_seed(1000 * B + T if seed is None else seed)
    x = {n: randn(B, T, heads, d, gen=gen, dtype=dtype) for n, d in (("q", dk), ("k", dk), ("v", dv))}
    if case["op"] != "linear_attn":
        shape = (B, T, heads) if case["op"] == "simple_gla" else (B, T, heads, dk)
        x["g"] = in_dtype(log_gates(*shape, gen=gen), case["gates"], dtype)
    return x


def reference(case, x):
    from kernels import reference as ref
    if case["op"] == "gla":
        return ref.chunk_gla_ref(x["q"], x["k"], x["v"], x["g"], scale_of(x["q"]))[0]
    return ref.chunk_scalar_ref(x["q"], x["k"], x["v"], x.get("g"), None, scale_of(x["q"]))[0]


def _compile_cases(caps, quick, half, halves):
    """(gate kind, dtype, K, V, T, num_segments, gate dtype)"""
    import torch
    f16, f32, bf = torch.float16, torch.float32, half
    cases = [(g, bf, 128, 128, 300, ns, gd) for g in (0, 1, 2) for ns in (None, 3)
             for gd in ((f32, bf) if g else (None,))]
    if caps.major < 9:   # float32 takes other tiles off Hopper: the widest head size it runs in Triton
        kf = 128 if caps.major >= 8 else 64
        cases += [(1, f32, kf, kf, 300, None, f32)]
    if not quick:
        cases += [(1, f32, 64, 64, 100, None, f32), (2, f32, 64, 64, 100, 2, f32), (1, f16, 16, 16, 100, None, f16),
                  (2, f16, 16, 16, 100, None, f16), (2, bf, 256, 256, 100, None, bf), (2, bf, 32, 16, 100, 2, f32)]
    return cases


def _compile_run(case, caps):
    import torch
    from kernels.gla.op import chunk_gla_triton
    gate, dt, K, V, T, ns, gdt = case
    B, H = 1, 2
    q = torch.randn(B, T, H, K, dtype=dt, requires_grad=True)
    v = torch.randn(B, T, H, V, dtype=dt, requires_grad=True)
    g = None if gate == 0 else (-torch.rand(B, T, H, *((K,) if gate == 2 else ()))).to(gdt).requires_grad_()
    h0 = torch.randn(B, H, K, V, requires_grad=True)
    o, ht = chunk_gla_triton(q, q, v, g, 0.1, h0, True, num_segments=ns, caps=caps)
    torch.autograd.grad((o.float().sum() + ht.sum()), [q, v, h0] + ([g] if g is not None else []),
                        allow_unused=True)


# the compile check's calls (kernels.compile): no, scalar and vector gates, float32 and 16-bit gates,
# with and without the sequence split, then other dtypes and head sizes
COMPILE = CompileCases(("kernels.gla.prep", "kernels.gla.march", "kernels.gla.backward"), _compile_cases, _compile_run)


if __name__ == "__main__":
    from kernels.harness import bench_main
    sys.exit(bench_main(sys.argv[1:], sys.modules[__name__]))
