"""Benchmark of record: PaTH attention, our Triton kernels against fla's ``parallel_path_attn``.

    python -m kernels.path.bench [--quick] [--write] [--budget-s S]

Shapes: bfloat16, H = 16, K = V = 128, B·T = 65,536 tokens with T in {2048, 8192}, plus B = 1 at
T = 32768. Passes: ``fwd`` (no gradients) and ``fwdbwd`` (forward + backward, with its peak memory).

Inputs as fla's PaTH layer makes them: q, k, v ~ N(0, 1) in bfloat16, ``w`` an L2-normalised
N(0, 1) direction and ``beta = 2 · sigmoid(N(0, 1))``, both in float32 (fla asserts float32), or
both in the input dtype (the ``wb`` field: fla refuses those, and the record says so). No forget
gate in the timed cases. Scale ``K^-0.5``. Accuracy: batch 0, the first min(T, 2048) tokens, heads
0-1, against the float64 reference (:func:`kernels.reference.path_attn_ref`, a ``T × T`` triangular
solve), fla's RMS ratio. fla runs its pure Triton path (``FLA_DISABLE_BACKEND_DISPATCH=1``).
"""
from __future__ import annotations

import sys


from kernels.harness import (CompileCases, Op, Surveyed, in_dtype, randn, scale_of, sigmoid_of_normal,  # noqa: E402
                             unit_rows)

H, D, TOKENS = 16, 128, 65536
SHAPES_FULL = [(32, 2048), (8, 8192), (1, 32768)]     # (B, T)
SHAPES_QUICK = [(32, 2048), (1, 32768)]
# the targets: our time over the peer's
GOALS = {"by_peer": {"fla": {"path": {"fwd": 0.7, "fwdbwd": 0.8}}}}
CONFIG = dict(H=H, D=D, dtype="bfloat16", causal=True, goals=GOALS,
              inputs="q, k, v ~ N(0, 1); scale D^-0.5; w = normalize(N(0, 1)), beta = 2 sigmoid(N(0, 1)), "
                     "float32 or bfloat16 (the wb field)",
              peer="fla 0.6.0 parallel_path_attn")
RUN = dict(budget_s=540.0, err_T_max=2048, err_heads=2)   # for harness.bench_main
# the family's op, described once: the benchmark below, the survey and the compile check read it
OPS = (
    Op("path", "parallel_path_attn", "fla.ops.path_attn.parallel_path_attn", ("q", "k", "v", "w", "beta"),
       ours=lambda fn, case: lambda q, k, v, w, beta: fn(q, k, v, w, beta, scale=scale_of(q), check_values=False)[0],
       peer=lambda fn, case: lambda q, k, v, w, beta: fn(q, k, v, w, beta, scale=scale_of(q))[0],
       survey=Surveyed(8, lambda B, T, heads, dim: dict(op="path", B=B, T=T, H=heads, D=dim, wb="float32"))),
)


def cases(quick=False):
    out = [dict(op="path", B=B, T=T, wb="float32") for B, T in (SHAPES_QUICK if quick else SHAPES_FULL)]
    return out + [dict(op="path", B=32, T=2048, wb="input dtype")]


def make_inputs(case, *, device="cuda", dtype=None, seed=None):
    """``q, k, v`` (``[B, T, H, D]``), the L2-normalised direction ``w`` and ``beta = 2 sigmoid(N(0, 1))``,
    both in the case's ``wb`` dtype."""
    import torch
    B, T, heads, dim = case["B"], case["T"], case.get("H", H), case.get("D", D)
    dtype = torch.bfloat16 if dtype is None else dtype
    gen = torch.Generator(device=device).manual_seed(1000 * B + T if seed is None else seed)
    x = {n: randn(B, T, heads, dim, gen=gen, dtype=dtype) for n in "qkv"}
    w = unit_rows(B, T, heads, dim, gen=gen)
    beta = 2 * sigmoid_of_normal(B, T, heads, gen=gen)
    x["w"], x["beta"] = in_dtype(w, case["wb"], dtype), in_dtype(beta, case["wb"], dtype)
    return x


def flops(case):
    """The forward's operations: over the ``T²/2`` block pairs' tokens, the scores, ``p v``, and the
    two products that carry the queries across a block (``X Wᵀ`` and ``(X Wᵀ) U``), 2·D each."""
    T = case["T"]
    return 4 * case["B"] * H * D * T * T


def reference(case, x):
    from kernels.reference import path_attn_ref
    return path_attn_ref(x["q"], x["k"], x["v"], x["w"], x["beta"], None, scale_of(x["q"]))


def _compile_cases(caps, quick, half, halves):
    """(dtype, K, V, T, w/β dtype, gate dtype or None): the benchmark's head size, with and without the FoX gate"""
    import torch
    f32, bf = torch.float32, half
    # T = 2650: 42 blocks, windows of 4 with a partial last one on Hopper (plan.default_window_blocks)
    cases = [(bf, 128, 128, 300, f32, None), (bf, 128, 128, 300, bf, f32), (f32, 64, 64, 100, f32, f32),
             (bf, 128, 128, 2650, f32, f32)]
    if not quick:
        cases += [(dt, K, V, 100, dt, None) for dt in halves + (f32,) for K, V in ((16, 16), (32, 128), (128, 64))]
    return cases


def _compile_run(case, caps):
    import torch
    from kernels.path.op import parallel_path_attn_triton
    dt, K, V, T, wdt, gate = case
    q = torch.randn(1, T, 2, K, dtype=dt, requires_grad=True)
    v = torch.randn(1, T, 2, V, dtype=dt, requires_grad=True)
    w = torch.randn(1, T, 2, K, dtype=wdt, requires_grad=True)
    beta = torch.rand(1, T, 2, dtype=wdt, requires_grad=True)
    g = None if gate is None else (-torch.rand(1, T, 2)).to(gate).requires_grad_()
    o = parallel_path_attn_triton(q, q, v, w, beta, g, 0.1, caps=caps)
    torch.autograd.grad(o.float().sum(), [q, v, w, beta] + ([] if g is None else [g]))


# the compile check's calls (kernels.compile): the shared solve and gates, the per-block stage, the walk,
# the windows and their backward passes
COMPILE = CompileCases(("kernels.common.solve", "kernels.common.gates", "kernels.path.local", "kernels.path.forward",
                        "kernels.path.backward", "kernels.path.windows"), _compile_cases, _compile_run)


if __name__ == "__main__":
    from kernels.harness import bench_main
    sys.exit(bench_main(sys.argv[1:], sys.modules[__name__]))
