"""Benchmark of record: DeltaFormer's attention, our Triton kernels against fla's pseudo-value stage + SDPA.

    python -m kernels.deltaformer.bench [--quick] [--write] [--budget-s S]

Shapes: bfloat16, H = 16, K = V = 128, B·T = 65,536 tokens with T in {2048, 8192}, plus B = 1 at
T = 32768. Passes: ``fwd`` (no gradients) and ``fwdbwd`` (forward + backward, with its peak memory).

Implementations (``op = "deltaformer"``, β = sigmoid(N(0, 1)) in float32, what fla's layer passes,
or in the input dtype: the ``beta`` field):
- ``ours``: :func:`kernels.deltaformer_attn`;
- ``fla+sdpa``: the peer. fla 0.6.0's ``deltaformer_attn`` finishes with the separately compiled
  ``flash-attn`` package, which the device does not have, and its module imports
  ``fla.layers.utils``, which ``fla-core`` does not ship (only its variable-length path uses it).
  So the peer is fla's own pseudo-value stage, ``ParallelDeltaformerFunction`` (its Triton forward
  with torch's triangular solve, and its backward), loaded from ``fla-core``'s file with that one
  unused import stubbed, followed by torch SDPA (PyTorch's default backend) for the last attention.
  The stage is called with ``k`` in the place of ``q``: fla scores the pseudo-values ``q·k``, the
  article and our op ``k·k``; with ``k`` in both places the two compute the same function and the
  same work.
Inputs q, k, v ~ N(0, 1), scale K^-0.5 (fla's stage fixes it at K^-0.5). Accuracy: batch 0, the first
min(T, 8192) tokens, heads 0-1, against the float64 reference (:func:`kernels.reference.deltaformer_ref`),
fla's RMS ratio. fla runs its pure Triton path (``FLA_DISABLE_BACKEND_DISPATCH=1``).
"""
from __future__ import annotations

import os
import sys


from kernels.harness import (CompileCases, Op, Surveyed, causal_sdpa, in_dtype, randn, scale_of,  # noqa: E402
                             sigmoid_of_normal)

H, D, TOKENS = 16, 128, 65536
SHAPES_FULL = [(32, 2048), (8, 8192), (1, 32768)]     # (B, T)
SHAPES_QUICK = [(32, 2048), (1, 32768)]
# the targets: our time over the peer's
GOALS = {"by_peer": {"fla+sdpa": {"deltaformer": {"fwd": 0.6, "fwdbwd": 0.8}}}}
CONFIG = dict(H=H, D=D, dtype="bfloat16", causal=True, goals=GOALS,
              inputs="q, k, v ~ N(0, 1); scale D^-0.5; beta = sigmoid(N(0, 1)) in float32 or bfloat16 "
                     "(the beta field)",
              peer="fla 0.6.0 ParallelDeltaformerFunction (pseudo-values, k in q's place) + torch SDPA")
RUN = dict(budget_s=540.0, err_T_max=8192, err_heads=2)   # for harness.bench_main


def _peer(fn, case):
    """fla's pseudo-value stage (``fn()``, :func:`fla_pseudo_values`) with ``k`` in ``q``'s place, then SDPA."""
    stage = fn()
    return lambda q, k, v, beta: causal_sdpa(q, k, stage.apply(k, k, v, beta, 512, None))


# the family's op, described once: the benchmark below, the survey and the compile check read it
OPS = (
    Op("deltaformer", "deltaformer_attn", "kernels.deltaformer.bench.fla_pseudo_values", ("q", "k", "v", "beta"),
       ours=lambda fn, case: lambda q, k, v, beta: fn(q, k, v, beta, scale=scale_of(q), check_values=False),
       peer=_peer, peer_impl="fla+sdpa",
       survey=Surveyed(7, lambda B, T, heads, dim: dict(op="deltaformer", B=B, T=T, H=heads, D=dim, beta="float32"))),
)


def cases(quick=False):
    return [dict(op="deltaformer", B=B, T=T, beta=beta) for B, T in (SHAPES_QUICK if quick else SHAPES_FULL)
            for beta in ("float32", "input dtype")]


def make_inputs(case, *, device="cuda", dtype=None, seed=None):
    """``q, k, v`` (``[B, T, H, D]``) and ``beta`` (``[B, T, H]``, in the case's ``beta`` dtype)."""
    import torch
    B, T, heads, dim = case["B"], case["T"], case.get("H", H), case.get("D", D)
    dtype = torch.bfloat16 if dtype is None else dtype
    gen = torch.Generator(device=device).manual_seed(1000 * B + T if seed is None else seed)
    x = {n: randn(B, T, heads, dim, gen=gen, dtype=dtype) for n in "qkv"}
    x["beta"] = in_dtype(sigmoid_of_normal(B, T, heads, gen=gen), case["beta"], dtype)
    return x


def fla_pseudo_values():
    """fla's ``ParallelDeltaformerFunction`` from ``fla-core``'s own file (see the module doc)."""
    import importlib.util
    import types
    import warnings
    import fla
    if "fla.layers.utils" not in sys.modules:          # only fla's variable-length path uses it
        stub = types.ModuleType("fla.layers.utils")
        stub.pad_input = stub.unpad_input = None
        sys.modules["fla.layers.utils"] = stub
    folder = os.path.join(os.path.dirname(fla.__file__), "ops", "deltaformer")
    if "fla.ops.deltaformer" not in sys.modules:      # the package, without its __init__ (which
        pkg = types.ModuleType("fla.ops.deltaformer")  # imports the flash-attn front end)
        pkg.__path__ = [folder]
        sys.modules["fla.ops.deltaformer"] = pkg
    path = os.path.join(folder, "parallel.py")
    spec = importlib.util.spec_from_file_location("fla.ops.deltaformer.parallel", path)
    mod = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")               # "Flash Attention is not installed"
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    return mod.ParallelDeltaformerFunction


def flops(case):
    """The forward's operations: the pseudo-values (``k kᵀ`` and ``P u`` over the ``T(T−1)/2`` earlier
    pairs) and the attention (``q kᵀ`` and ``p u`` over the ``T(T+1)/2`` visible pairs), 2·D each."""
    T = case["T"]
    return 4 * case["B"] * H * D * T * T


def reference(case, x):
    from kernels.reference import deltaformer_ref
    return deltaformer_ref(x["q"], x["k"], x["v"], x["beta"], scale_of(x["q"]))


def _compile_cases(caps, quick, half, halves):
    """(dtype, K, V, B·H, T, β dtype): the benchmark's head size with the column split (B·H = 2) and
    without it (B·H = 256), several spans (T = 3000) and one (T = 100)"""
    import torch
    f32, bf = torch.float32, half
    cases = [(bf, 128, 128, (1, 2), 3000, f32), (bf, 128, 128, (128, 2), 300, bf), (f32, 64, 64, (1, 2), 100, f32)]
    if not quick:
        cases += [(dt, K, V, (1, 2), 300, dt) for dt in halves + (f32,) for K, V in ((16, 16), (32, 128), (128, 64))]
    return cases


def _compile_run(case, caps):
    import torch
    from kernels.deltaformer.op import deltaformer_attn_triton
    dt, K, V, (B, H), T, bdt = case
    q = torch.randn(B, T, H, K, dtype=dt, requires_grad=True)
    v = torch.randn(B, T, H, V, dtype=dt, requires_grad=True)
    beta = torch.rand(B, T, H, dtype=bdt, requires_grad=True)
    o = deltaformer_attn_triton(q, q, v, beta, 0.1, caps=caps)
    torch.autograd.grad(o.float().sum(), [q, v, beta])


# the compile check's calls (kernels.compile): the pseudo-values and flash's attention, forward and backward
COMPILE = CompileCases(("kernels.deltaformer.pseudo", "kernels.flash.forward", "kernels.flash.backward"),
                       _compile_cases, _compile_run)


if __name__ == "__main__":
    from kernels.harness import bench_main
    sys.exit(bench_main(sys.argv[1:], sys.modules[__name__]))
