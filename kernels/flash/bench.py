"""Benchmark of record: causal softmax attention and FoX, our Triton kernels against torch SDPA and fla.

    python -m kernels.flash.bench [--quick] [--write] [--ops attention,forgetting] [--budget-s S]

Shapes: bfloat16, H = 16, K = V = 128, B·T = 65,536 tokens with T in {2048, 8192, 32768}, plus B = 1
at T = 32768 and 65536 (where the peak memory of a training step shows whether it grows like T or
like T²). Passes: ``fwd`` (no gradients) and ``fwdbwd`` (forward + backward, with its peak memory).

Ops and implementations:
- ``attention``: ``ours`` (:func:`kernels.flash_attention`), ``sdpa``
  (``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` on ``[B, H, T, D]`` views of
  the same tensors, PyTorch's default backend) and ``fla`` (``fla.ops.attn.parallel_attn``);
- ``forgetting`` (FoX): ``ours`` (:func:`kernels.parallel_forgetting_attn`) and ``fla``
  (``fla.ops.forgetting_attn.parallel_forgetting_attn``), with log forget gates
  ``g = logsigmoid(N(0, 1))`` in float32 (what fla's layers pass) and in the input dtype.
Inputs q, k, v ~ N(0, 1), scale K^-0.5. Accuracy: batch 0, the first min(T, 8192) tokens, heads
0-1, against the float64 reference (:func:`kernels.reference.attention_ref`), fla's RMS ratio.
fla runs its pure Triton path (``FLA_DISABLE_BACKEND_DISPATCH=1``); its refusals are recorded.
Each record's ``tflops`` is its achieved rate (:func:`flops`); the config holds the device's measured
bf16 matrix-multiply rate and copy bandwidth (:func:`kernels.harness.measure_device`).
"""
from __future__ import annotations

import sys


from kernels.harness import (CompileCases, Op, Surveyed, benched, causal_sdpa, in_dtype, log_gates,  # noqa: E402
                             op_impls, randn, scale_of)

H, D, TOKENS = 16, 128, 65536
SHAPES_FULL = [(32, 2048), (8, 8192), (2, 32768), (1, 32768), (1, 65536)]     # (B, T)
SHAPES_QUICK = [(32, 2048), (1, 32768)]
# the family's ops, described once: the benchmark below, the survey and the compile check read them
OPS = (
    Op("attention", "flash_attention", "fla.ops.attn.parallel_attn", ("q", "k", "v"),
       ours=lambda fn, case: lambda q, k, v: fn(q, k, v, scale=scale_of(q), check_values=False),
       peer=lambda fn, case: lambda q, k, v: fn(q, k, v, scale=scale_of(q)),
       survey=Surveyed(1, lambda B, T, heads, dim: dict(op="attention", B=B, T=T, H=heads, D=dim))),
    Op("forgetting", "parallel_forgetting_attn", "fla.ops.forgetting_attn.parallel_forgetting_attn",
       ("q", "k", "v", "g"),
       ours=lambda fn, case: lambda q, k, v, g: fn(q, k, v, g, scale=scale_of(q), check_values=False),
       peer=lambda fn, case: lambda q, k, v, g: fn(q, k, v, g, scale=scale_of(q)),
       survey=Surveyed(7, lambda B, T, heads, dim: dict(op="forgetting", B=B, T=T, H=heads, D=dim, gates="float32"))),
)
# the targets: our time over the peer's, per peer, op and pass
GOALS = {"by_peer": {"sdpa": {"attention": {"fwd": 1.1, "fwdbwd": 1.3}},
                     "fla": {"attention": {"fwdbwd": 0.7}, "forgetting": {"fwd": 0.75, "fwdbwd": 0.6}}}}
CONFIG = dict(H=H, D=D, dtype="bfloat16", causal=True, goals=GOALS,
              inputs="q, k, v ~ N(0, 1); scale D^-0.5; forgetting: g = logsigmoid(N(0, 1)), float32 "
                     "or bfloat16 (the gates field)")
RUN = dict(ops=benched(OPS), budget_s=540.0, err_T_max=8192, err_heads=2)   # for harness.bench_main


def cases(ops=None, quick=False):
    out = []
    for B, T in (SHAPES_QUICK if quick else SHAPES_FULL):
        for op in ops or benched(OPS):
            for gates in ((None,) if op == "attention" else ("float32", "input dtype")):
                out.append(dict(op=op, B=B, T=T, **({} if gates is None else {"gates": gates})))
    return out


def make_inputs(case, *, device="cuda", dtype=None, seed=None):
    """``q, k, v`` (``[B, T, H, D]``) and, for FoX, ``g`` (``[B, T, H]``, in the case's ``gates`` dtype)."""
    import torch
    B, T, heads, dim = case["B"], case["T"], case.get("H", H), case.get("D", D)
    dtype = torch.bfloat16 if dtype is None else dtype
    gen = torch.Generator(device=device).manual_seed(1000 * B + T if seed is None else seed)
    x = {n: randn(B, T, heads, dim, gen=gen, dtype=dtype) for n in "qkv"}
    if case["op"] == "forgetting":
        x["g"] = in_dtype(log_gates(B, T, heads, gen=gen), case["gates"], dtype)
    return x


def impls(case):
    """Ours and fla's; for softmax attention also SDPA (PyTorch's default backend), between them."""
    out = op_impls(OPS, case)
    if case["op"] == "attention":
        out = {"ours": out["ours"], "sdpa": causal_sdpa, "fla": out["fla"]}
    return out


def flops(case):
    """The forward's operations: two products (``q kᵀ`` and ``p v``) of 2·D operations each over the
    ``T(T+1)/2`` visible (query, key) pairs, per batch element and head."""
    T = case["T"]
    return 4 * case["B"] * H * D * T * (T + 1) // 2


def reference(case, x):
    from kernels.reference import attention_ref
    return attention_ref(x["q"], x["k"], x["v"], scale_of(x["q"]), True, g=x.get("g"))


def _compile_cases(caps, quick, half, halves):
    """(dtype, head size, causal, T, FoX gates dtype or None)"""
    import torch
    f16, f32, bf = torch.float16, torch.float32, half
    cases = [(bf, 128, True, T, gate) for T in (1024, 4096) for gate in (None, f32)]
    cases += [(f32, 128, True, 100, f32), (f16, 16, False, 100, None), (bf, 64, True, 1024, None)]
    if not quick:
        cases += [(dt, D, c, T, None) for dt in halves + (f32,) for D in (16, 32, 64, 128)
                  for c in (True, False) for T in (100, 4096)]
    return cases


def _compile_run(case, caps):
    import torch
    from kernels.flash.op import flash_attention_triton
    dt, D, causal, T, gate = case
    q = torch.randn(1, T, 2, D, dtype=dt, requires_grad=True)
    g = None if gate is None else (-torch.rand(1, T, 2)).to(gate).requires_grad_()
    o = flash_attention_triton(q, q, q, 0.1, causal, g, caps=caps)
    torch.autograd.grad(o.float().sum(), [q] + ([] if g is None else [g]))


# the compile check's calls (kernels.compile): forward and backward, with and without FoX's bias, at the
# benchmark's head size and the lengths of the short and long plans, then other dtypes and head sizes
COMPILE = CompileCases(("kernels.flash.forward", "kernels.flash.backward", "kernels.common.gates"),
                       _compile_cases, _compile_run)


if __name__ == "__main__":
    from kernels.harness import bench_main
    sys.exit(bench_main(sys.argv[1:], sys.modules[__name__]))
