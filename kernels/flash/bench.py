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
bf16 matrix-multiply rate (:func:`measure_config`).
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")   # before fla is imported anywhere

H, D, TOKENS = 16, 128, 65536
SHAPES_FULL = [(32, 2048), (8, 8192), (2, 32768), (1, 32768), (1, 65536)]     # (B, T)
SHAPES_QUICK = [(32, 2048), (1, 32768)]
OPS = ("attention", "forgetting")
# the targets: our time over the peer's, per peer, op and pass
GOALS = {"by_peer": {"sdpa": {"attention": {"fwd": 1.1, "fwdbwd": 1.3}},
                     "fla": {"attention": {"fwdbwd": 0.7}, "forgetting": {"fwd": 0.75, "fwdbwd": 0.6}}}}
CONFIG = dict(H=H, D=D, dtype="bfloat16", causal=True, goals=GOALS,
              inputs="q, k, v ~ N(0, 1); scale D^-0.5; forgetting: g = logsigmoid(N(0, 1)), float32 "
                     "or bfloat16 (the gates field)")
RUN = dict(ops=OPS, budget_s=540.0, err_T_max=8192, err_heads=2)   # for harness.bench_main


def cases(ops=OPS, quick=False):
    out = []
    for B, T in (SHAPES_QUICK if quick else SHAPES_FULL):
        for op in ops:
            for gates in ((None,) if op == "attention" else ("float32", "input dtype")):
                out.append(dict(op=op, B=B, T=T, **({} if gates is None else {"gates": gates})))
    return out


def make_inputs(case):
    import torch
    import torch.nn.functional as F
    B, T = case["B"], case["T"]
    gen = torch.Generator(device="cuda").manual_seed(1000 * B + T)
    x = {n: torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=gen) for n in "qkv"}
    if case["op"] == "forgetting":
        g = F.logsigmoid(torch.randn(B, T, H, device="cuda", generator=gen))
        x["g"] = g if case["gates"] == "float32" else g.to(torch.bfloat16)
    return x


def impls(case):
    import torch.nn.functional as F
    import kernels
    s = D ** -0.5
    # check_values=False: fla checks no values (our value checks cost a host sync), so the times compare like for like
    if case["op"] == "forgetting":
        out = {"ours": lambda q, k, v, g: kernels.parallel_forgetting_attn(q, k, v, g, scale=s, check_values=False)}
        try:
            from fla.ops.forgetting_attn import parallel_forgetting_attn
            out["fla"] = lambda q, k, v, g: parallel_forgetting_attn(q, k, v, g, scale=s)
        except Exception as e:   # recorded as fla's note
            out["fla"] = e
        return out
    out = {"ours": lambda q, k, v: kernels.flash_attention(q, k, v, scale=s, check_values=False),
           "sdpa": lambda q, k, v: F.scaled_dot_product_attention(
               q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=s).transpose(1, 2)}
    try:
        from fla.ops.attn import parallel_attn
        out["fla"] = lambda q, k, v: parallel_attn(q, k, v, scale=s)
    except Exception as e:
        out["fla"] = e
    return out


def flops(case):
    """The forward's operations: two products (``q kᵀ`` and ``p v``) of 2·D operations each over the
    ``T(T+1)/2`` visible (query, key) pairs, per batch element and head."""
    T = case["T"]
    return 4 * case["B"] * H * D * T * (T + 1) // 2


def measure_config():
    """The device's bfloat16 matrix-multiply rate (``torch.matmul``, 8192³, median), the yardstick
    for the kernels' ``tflops``."""
    import torch
    from kernels.harness import bench_ms
    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ms = bench_ms(lambda: a @ b, warmup=25, rep=100)
    return {"bf16_matmul_tflops": round(2 * n ** 3 / ms / 1e9, 1), "matmul_shape": [n, n, n]}


def reference(case, x):
    from kernels.reference import attention_ref
    return attention_ref(x["q"], x["k"], x["v"], D ** -0.5, True, g=x.get("g"))


def grad_names(case):
    return ["q", "k", "v"] + (["g"] if case["op"] == "forgetting" else [])


if __name__ == "__main__":
    from kernels.harness import bench_main
    sys.exit(bench_main(sys.argv[1:], sys.modules[__name__]))
