"""Benchmark of record: MesaNet, our kernels against fla's ``chunk_mesa_net`` at the same CG count.

    python -m kernels.mesa.bench [--quick] [--write] [--ops mesa,mesa_cg] [--budget-s S]

Shapes: bfloat16, H = 16, K = V = 128 (fla's kernel needs V = K), B·T = 65,536 tokens with T in
{2048, 8192}, plus B = 1 at T = 32768; ``max_CG_iteration`` = 30 (op ``mesa``, the targets:
forward at most 0.6x and forward + backward at most 0.8x fla's time). Op ``mesa_cg``: the
trade-off of error and time against the iteration count (``cg`` in 5, 10, 20, 30) at B = 32,
T = 2048, for both. Op ``mesa_cg_stiff``: the same sweep with ``lamb`` in [0.02, 0.05] (uniform per
channel), where ``H_t + Λ`` is ill conditioned and the steps matter (at ``mesa_cg``'s ``lamb`` our
CG reaches the bf16 floor by 5 steps, ``NOTES.md``). Passes: ``fwd`` (no gradients) and ``fwdbwd``.

Inputs as fla's documentation makes them and MesaNet's layers use them: q, k L2-normalised
N(0, 1) rows in bfloat16, v ~ N(0, 1) bfloat16, log decays ``g = logsigmoid(N(0, 1))``,
``beta = sigmoid(N(0, 1))`` and ``lamb = softplus(U(0, 1)) + 0.25`` in float32; no initial or
final states. ``lamb`` travels as ``[1, 1, H, K]`` so that the harness's slicing (batch 0, the
first tokens, the first heads) cuts its head axis with the others'.

Accuracy: batch 0, the first min(T, 1024) tokens, heads 0-1, against the float64 *exact* solve
(:func:`kernels.reference.chunk_mesa_net_ref` with ``exact=True``; gradients by autograd through
``torch.linalg.solve``): the errors hold the CG truncation and the arithmetic both, fla's RMS
ratio. fla runs its pure Triton path (``FLA_DISABLE_BACKEND_DISPATCH=1``).
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")   # before fla is imported anywhere

H, D, TOKENS = 16, 128, 65536
SHAPES_FULL = [(32, 2048), (8, 8192), (1, 32768)]     # (B, T)
SHAPES_QUICK = [(32, 2048), (1, 32768)]
SWEEP = (5, 10, 20, 30)                              # max_CG_iteration of op mesa_cg, at (32, 2048)
OPS = ("mesa", "mesa_cg", "mesa_cg_stiff")
GOALS = {"by_peer": {"fla": {"mesa": {"fwd": 0.6, "fwdbwd": 0.8}}}}
CONFIG = dict(H=H, K=D, V=D, dtype="bfloat16", goals=GOALS,
              inputs="q, k = normalize(N(0, 1)) bf16; v ~ N(0, 1) bf16; g = logsigmoid(N(0, 1)), "
                     "beta = sigmoid(N(0, 1)), lamb = softplus(U(0, 1)) + 0.25 (op mesa_cg_stiff: "
                     "0.02 + 0.03 U(0, 1)), float32; no states",
              reference="float64 exact solve (torch.linalg.solve per token)",
              peer="fla 0.6.0 chunk_mesa_net")
RUN = dict(ops=OPS, budget_s=540.0, err_T_max=1024, err_heads=2)   # for harness.bench_main


def cases(ops=OPS, quick=False):
    out = []
    if "mesa" in ops:
        out += [dict(op="mesa", B=B, T=T, cg=30) for B, T in (SHAPES_QUICK if quick else SHAPES_FULL)]
    for op in ("mesa_cg", "mesa_cg_stiff"):
        if op in ops:
            out += [dict(op=op, B=32, T=2048, cg=n) for n in ((5, 30) if quick else SWEEP)]
    return out


def make_inputs(case):
    import torch
    import torch.nn.functional as F
    B, T = case["B"], case["T"]
    gen = torch.Generator(device="cuda").manual_seed(1000 * B + T)

    def rows():
        return F.normalize(torch.randn(B, T, H, D, device="cuda", generator=gen), dim=-1).to(torch.bfloat16)
    x = {"q": rows(), "k": rows(), "v": torch.randn(B, T, H, D, device="cuda", generator=gen).to(torch.bfloat16)}
    x["g"] = F.logsigmoid(torch.randn(B, T, H, device="cuda", generator=gen))
    x["beta"] = torch.sigmoid(torch.randn(B, T, H, device="cuda", generator=gen))
    u = torch.rand(H, D, device="cuda", generator=gen)
    lamb = 0.02 + 0.03 * u if case["op"] == "mesa_cg_stiff" else F.softplus(u) + 0.25
    x["lamb"] = lamb[None, None]
    return x


def impls(case):
    from kernels.mesa import chunk_mesa_net
    n = case["cg"]
    # check_values=False: fla checks no values (our value checks cost a host sync), so the times compare like for like
    out = {"ours": lambda q, k, v, g, beta, lamb: chunk_mesa_net(q, k, v, g, beta, lamb[0, 0],
                                                                 max_CG_iteration=n, check_values=False)[0]}
    try:
        from fla.ops.mesa_net import chunk_mesa_net as fla_mesa
        out["fla"] = lambda q, k, v, g, beta, lamb: fla_mesa(q, k, v, g, beta, lamb[0, 0], max_CG_iteration=n)[0]
    except Exception as e:   # recorded as the peer's note
        out["fla"] = e
    return out


def flops(case):
    """The solve's products, which dominate: per token and CG iteration ``P Kᵀ`` and ``A K`` over the
    64-token chunk (2·64·D multiply-adds) and ``P H_c`` (D²), two operations each."""
    return 2 * case["B"] * case["T"] * H * case["cg"] * (2 * 64 * D + D * D)


def step_costs(data: dict, op: str = "mesa_cg") -> dict:
    """From a results file's iteration sweep (``op``'s records at one shape): per ``(impl, pass)``
    the least-squares line of the median time against the CG count, ``{"per_step_ms", "rest_ms",
    "steps"}``: what one step costs and what the rest of the pass costs (its time at zero steps).
    Pairs with fewer than two timed counts are left out."""
    import numpy as np
    pts = {}
    for r in data["records"]:
        if r.get("op") == op and r.get("ms"):
            pts.setdefault((r["impl"], r["pass"]), []).append((r["cg"], r["ms"]))
    out = {}
    for key, xy in pts.items():
        if len({c for c, _ in xy}) < 2:
            continue
        c, ms = np.array(xy, dtype=float).T
        slope, icept = np.polyfit(c, ms, 1)
        out[key] = {"per_step_ms": float(slope), "rest_ms": float(icept), "steps": sorted(int(x) for x in c)}
    return out


def reference(case, x):
    from kernels.reference import chunk_mesa_net_ref
    return chunk_mesa_net_ref(x["q"], x["k"], x["v"], x["g"], x["beta"], x["lamb"][0, 0], exact=True)[0]


def grad_names(case):
    return ["q", "k", "v", "g", "beta", "lamb"]


if __name__ == "__main__":
    from kernels.harness import bench_main
    sys.exit(bench_main(sys.argv[1:], sys.modules[__name__]))
