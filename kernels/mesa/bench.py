"""Benchmark of record: MesaNet, our kernels against fla's ``chunk_mesa_net`` at the same CG count.

    python -m kernels.mesa.bench [--quick] [--write] [--ops mesa,mesa_cg] [--budget-s S]

Shapes: bfloat16, H = 16, K = V = 128 (fla's kernel needs V = K), B·T = 65,536 tokens with T in
{2048, 8192}, plus B = 1 at T = 32768; ``max_CG_iteration`` = 30 (op ``mesa``, the targets:
forward at most 0.6x and forward + backward at most 0.8x fla's time). Op ``mesa_cg``: the
trade-off of error and time against the iteration count (``cg`` in 5, 10, 20, 30) at B = 32,
T = 2048, for both. Op ``mesa_cg_stiff``: the same sweep with ``lamb`` in [0.02, 0.05] (uniform per
channel), where ``H_t + Λ`` is ill conditioned and the steps matter (at ``mesa_cg``'s ``lamb`` our
CG reaches the bf16 floor by 5 steps, ``HISTORY.md``, round 2). Passes: ``fwd`` (no gradients) and ``fwdbwd``.

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

import sys


from kernels.harness import (CompileCases, Op, Surveyed, benched, log_gates, randn, sigmoid_of_normal,  # noqa: E402
                             unit_rows)

H, D, TOKENS = 16, 128, 65536
SHAPES_FULL = [(32, 2048), (8, 8192), (1, 32768)]     # (B, T)
SHAPES_QUICK = [(32, 2048), (1, 32768)]
SWEEP = (5, 10, 20, 30)                              # max_CG_iteration of op mesa_cg, at (32, 2048)


def _lamb(q, lamb):
    """``lamb`` as the op takes it, ``[H, K]``: the input's (``[1, 1, H, K]``), or ones where the case
    has none (the survey's)."""
    import torch
    return lamb[0, 0] if lamb is not None else torch.ones(q.shape[2], q.shape[3], device=q.device, dtype=torch.float32)


def _ours(fn, case):
    return lambda q, k, v, g, beta, lamb=None: fn(q, k, v, g, beta, _lamb(q, lamb), max_CG_iteration=case["cg"],
                                                  check_values=False)[0]


def _peer(fn, case):
    return lambda q, k, v, g, beta, lamb=None: fn(q, k, v, g, beta, _lamb(q, lamb), max_CG_iteration=case["cg"])[0]


def _op(name, survey=None):
    return Op(name, "chunk_mesa_net", "fla.ops.mesa_net.chunk_mesa_net", ("q", "k", "v", "g", "beta", "lamb"),
              ours=_ours, peer=_peer, survey=survey)


# the family's op, described once (its three cases of the benchmark): the benchmark below, the survey
# (lamb = 1, not an input) and the compile check read it
OPS = (_op("mesa", Surveyed(9, lambda B, T, heads, dim: dict(op="mesa", B=B, T=T, H=heads, D=dim, cg=30,
                                                             lamb="ones"))),
       _op("mesa_cg"), _op("mesa_cg_stiff"))
GOALS = {"by_peer": {"fla": {"mesa": {"fwd": 0.6, "fwdbwd": 0.8}}}}
CONFIG = dict(H=H, K=D, V=D, dtype="bfloat16", goals=GOALS,
              inputs="q, k = normalize(N(0, 1)) bf16; v ~ N(0, 1) bf16; g = logsigmoid(N(0, 1)), "
                     "beta = sigmoid(N(0, 1)), lamb = softplus(U(0, 1)) + 0.25 (op mesa_cg_stiff: "
                     "0.02 + 0.03 U(0, 1)), float32; no states",
              reference="float64 exact solve (torch.linalg.solve per token)",
              peer="fla 0.6.0 chunk_mesa_net")
RUN = dict(ops=benched(OPS), budget_s=540.0, err_T_max=1024, err_heads=2)   # for harness.bench_main


def cases(ops=None, quick=False):
    ops = ops or benched(OPS)
    out = []
    if "mesa" in ops:
        out += [dict(op="mesa", B=B, T=T, cg=30) for B, T in (SHAPES_QUICK if quick else SHAPES_FULL)]
    for op in ("mesa_cg", "mesa_cg_stiff"):
        if op in ops:
            out += [dict(op=op, B=32, T=2048, cg=n) for n in ((5, 30) if quick else SWEEP)]
    return out


def make_inputs(case, *, device="cuda", dtype=None, seed=None):
    """L2-normalised ``q, k`` and ``v`` (``[B, T, H, D]``), ``g`` and ``beta`` (``[B, T, H]``, float32),
    and ``lamb`` (``[1, 1, H, D]``, float32; none where the case's ``lamb`` is ``"ones"``: the op then
    takes ones, not differentiated)."""
    import torch
    import torch.nn.functional as F
    B, T, heads, dim = case["B"], case["T"], case.get("H", H), case.get("D", D)
    dtype = torch.bfloat16 if dtype is None else dtype
    gen = torch.Generator(device=device).manual_seed(1000 * B + T if seed is None else seed)
    x = {"q": unit_rows(B, T, heads, dim, gen=gen).to(dtype), "k": unit_rows(B, T, heads, dim, gen=gen).to(dtype),
         "v": randn(B, T, heads, dim, gen=gen).to(dtype)}
    x["g"] = log_gates(B, T, heads, gen=gen)
    x["beta"] = sigmoid_of_normal(B, T, heads, gen=gen)
    if case.get("lamb") != "ones":
        u = torch.rand(heads, dim, device=device, generator=gen)
        lamb = 0.02 + 0.03 * u if case["op"] == "mesa_cg_stiff" else F.softplus(u) + 0.25
        x["lamb"] = lamb[None, None]
    return x


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


def _compile_cases(caps, quick, half, halves):
    """(dtype, K, V, T, num_segments, states, gate dtype): the benchmark's K = V = 128 with and without
    gla's sequence split, initial and final states; then float32, float16, small or unequal heads"""
    import torch
    f16, f32, bf = torch.float16, torch.float32, half
    cases = [(bf, 128, 128, 300, ns, st, gd) for ns in (None, 3) for st in (False, True) for gd in (f32, bf)]
    if not quick:
        cases += [(dt, K, V, 100, None, True, f32) for dt in (f16, f32) for K, V in ((16, 16), (32, 128), (64, 256))]
    return cases


def _compile_run(case, caps):
    import torch
    from kernels.mesa.op import chunk_mesa_net_triton
    dt, K, V, T, ns, st, gd = case
    B, H = 1, 2
    q = torch.randn(B, T, H, K, dtype=dt, requires_grad=True)
    k = unit_rows(B, T, H, K).to(dt).requires_grad_()
    v = torch.randn(B, T, H, V, dtype=dt, requires_grad=True)
    g = (-torch.rand(B, T, H)).to(gd).requires_grad_()
    beta = torch.rand(B, T, H, dtype=gd, requires_grad=True)
    lamb = (torch.rand(H, K) + 0.25).requires_grad_()
    h0 = torch.eye(K).expand(B, H, K, K).contiguous().requires_grad_() if st else None
    hv0 = torch.randn(B, H, K, V, requires_grad=True) if st else None
    o, hk, hv = chunk_mesa_net_triton(q, k, v, g, beta, lamb, 30, h0, hv0, st, caps=caps,
                                      plan={"num_segments": ns})
    loss = o.float().sum() + (hk.sum() + hv.sum() if st else 0)
    leaves = [q, k, v, g, beta, lamb] + ([h0, hv0] if st else [])
    torch.autograd.grad(loss, leaves, allow_unused=True)


# the compile check's calls (kernels.compile): MesaNet's keys, states and solve, and gla's state march and
# output kernels it runs on, forward and backward
COMPILE = CompileCases(("kernels.mesa.prep", "kernels.mesa.solve", "kernels.gla.march",
                        "kernels.gla.backward", "kernels.gla.prep"), _compile_cases, _compile_run)


if __name__ == "__main__":
    from kernels.harness import bench_main
    sys.exit(bench_main(sys.argv[1:], sys.modules[__name__]))
