"""Benchmark of record: causal softmax attention, our Triton forward against PyTorch SDPA and fla.

    python -m kernels.flash.bench [--quick] [--write]      # --write: kernels/flash/results.json

Shapes: bf16, H = 16, D = 128, B = 65536 // T (B·T = 65,536 tokens), T from 1024 to 16384, causal,
forward only (the backward recomputes attention in PyTorch until the family has a Triton one).
Implementations: ``ours`` (:func:`kernels.flash_attention`), ``sdpa``
(``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` on ``[B, H, T, D]`` views of
the same tensors, PyTorch's default backend) and ``fla`` (``fla.ops.attn.parallel_attn``).
Accuracy: batch 0, heads 0-1, against the float64 reference (:func:`kernels.reference.attention_ref`).
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")   # before fla is imported anywhere

H, D, TOKENS = 16, 128, 65536
T_FULL, T_QUICK = (1024, 2048, 4096, 8192, 16384), (1024, 2048)
GOALS = {"fwd": 1.0}          # ours / fla, median times
CONFIG = dict(H=H, D=D, tokens=TOKENS, dtype="bfloat16", causal=True, goals=GOALS,
              inputs="q, k, v ~ N(0, 1); scale D^-0.5")
RUN = dict(budget_s=300.0, passes=("fwd",), err_T_max=16384, err_heads=2)   # for harness.bench_main


def cases(quick=False):
    return [dict(op="attention", B=TOKENS // T, T=T, H=H, D=D, dtype="bfloat16")
            for T in (T_QUICK if quick else T_FULL)]


def make_inputs(case):
    import torch
    gen = torch.Generator(device="cuda").manual_seed(case["T"])
    return {n: torch.randn(case["B"], case["T"], H, D, device="cuda", dtype=torch.bfloat16, generator=gen)
            for n in ("q", "k", "v")}


def impls(case):
    import torch.nn.functional as F
    import kernels
    scale = D ** -0.5
    out = {"ours": lambda q, k, v: kernels.flash_attention(q, k, v, scale=scale, backend="triton"),
           "sdpa": lambda q, k, v: F.scaled_dot_product_attention(
               q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=scale).transpose(1, 2)}
    try:
        from fla.ops.attn import parallel_attn
        out["fla"] = lambda q, k, v: parallel_attn(q, k, v, scale=scale)
    except Exception as e:   # recorded as fla's note
        out["fla"] = e
    return out


def reference(case, x):
    from kernels.reference import attention_ref
    return attention_ref(x["q"], x["k"], x["v"], D ** -0.5, True)


def grad_names(case):
    return []                 # forward only


if __name__ == "__main__":
    from kernels.harness import bench_main
    sys.exit(bench_main(sys.argv[1:], sys.modules[__name__]))
