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

import os
import sys

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")   # before fla is imported anywhere

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


def cases(quick=False):
    out = [dict(op="path", B=B, T=T, wb="float32") for B, T in (SHAPES_QUICK if quick else SHAPES_FULL)]
    return out + [dict(op="path", B=32, T=2048, wb="input dtype")]


def make_inputs(case):
    import torch
    B, T = case["B"], case["T"]
    gen = torch.Generator(device="cuda").manual_seed(1000 * B + T)
    x = {n: torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=gen) for n in "qkv"}
    w = torch.nn.functional.normalize(torch.randn(B, T, H, D, device="cuda", generator=gen), dim=-1)
    beta = 2 * torch.sigmoid(torch.randn(B, T, H, device="cuda", generator=gen))
    dt = torch.float32 if case["wb"] == "float32" else torch.bfloat16
    x["w"], x["beta"] = w.to(dt), beta.to(dt)
    return x


def impls(case):
    import kernels
    s = D ** -0.5
    # check_values=False: fla checks no values (our value checks cost a host sync), so the times compare like for like
    out = {"ours": lambda q, k, v, w, beta: kernels.parallel_path_attn(q, k, v, w, beta, scale=s,
                                                                        check_values=False)[0]}
    try:
        from fla.ops.path_attn import parallel_path_attn as fla_path
        out["fla"] = lambda q, k, v, w, beta: fla_path(q, k, v, w, beta, scale=s)[0]
    except Exception as e:   # recorded as the peer's note
        out["fla"] = e
    return out


def flops(case):
    """The forward's operations: over the ``T²/2`` block pairs' tokens, the scores, ``p v``, and the
    two products that carry the queries across a block (``X Wᵀ`` and ``(X Wᵀ) U``), 2·D each."""
    T = case["T"]
    return 4 * case["B"] * H * D * T * T


def reference(case, x):
    from kernels.reference import path_attn_ref
    return path_attn_ref(x["q"], x["k"], x["v"], x["w"], x["beta"], None, D ** -0.5)


def grad_names(case):
    return ["q", "k", "v", "w", "beta"]


if __name__ == "__main__":
    from kernels.harness import bench_main
    sys.exit(bench_main(sys.argv[1:], sys.modules[__name__]))
