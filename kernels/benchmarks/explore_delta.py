"""Exploration sweep for the delta-rule kernels (one GPU call, < 4 min on an H200).

    python -m kernels.benchmarks.explore_delta [--budget 200] [--out DIR] [--workers 12] [--quick]

Not a benchmark of record (that is ``bench_delta``): it finds where the time goes and which
variant of each expensive kernel is fastest, so that defaults can be chosen by a stated rule.

At two shapes (bf16, H = 16, K = V = 128; B = 32, T = 2048 and B = 2, T = 32768), gated delta rule:

1. **breakdown**: median ms (``harness.bench_ms``) of each of our stages called on its own
   (``_chunk_cumsum``, ``_wy_fwd``, ``_state_fwd``, ``_state_bwd``, ``_local_grads_triton``), their
   sum, and the end-to-end op (fwd without grad, fwd+bwd); fla's end-to-end fwd (gated) and fwd+bwd
   (delta rule: fla refuses its gated backward on Triton 3.6 Hopper); and a ``torch.profiler``
   per-kernel table of one call of each (ours with and without the split forward, fla's stages).
2. **variants** of every kernel through ``triton_delta.tuning(...)`` (list: ``_variants``): the
   per-chunk T/W/U kernels (warps, fused or separate W/U, column block), the two per-chunk backward
   kernels (K-block, V-block, warps), the sequential forward (fused or ``fwd_split=1``, V-block,
   stages at 4 warps) and the sequential backward (V-block, warps, stages). Every variant is checked
   against the default's results (``harness.err_ratio`` ≤ 1e-2, the bf16 tolerance of the tests);
   compile/launch errors are recorded, never fatal (but an illegal memory access poisons the CUDA
   context for everything after it, which is why risky variants come last).

Compiles are the slow part: a process pool (spawn) compiles every variant at a small shape with the
same specialisation (H = 16, T and chunk counts multiples of 16) while the main process measures
the breakdown; the main process then finds the kernels in Triton's on-disk cache. A ``--budget``
guard (seconds since start) skips what is left and still writes the JSON and the table.
Writes ``$OUT/explore_delta.json`` (or ``--out``), prints a compact table last.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

H, K, V = 16, 128, 128
SHAPES = [(32, 2048), (8, 8192), (2, 32768), (1, 32768)]
QUICK_SHAPES = [(4, 2048), (1, 8192)]
TOL = 1e-2          # bf16 tolerance of the tests (RMS ratio vs the default config's results)
BVS = (16, 32, 64, 128)
WARPS = (4, 8)
STAGES = (1, 2, 3)


def _variants():
    """Round 8d: the sources of the scores and the solve at small B·H (existing knobs): the march
    forming the scores itself (``mqk=2``), the doubling solve that writes the scores in the same
    kernel (``tsolve=1``), each at the default and at four chunk ranges.

    Rounds 8–8c timed a split inference march whose code was then removed (kernels/NOTES_delta.md,
    round 8): the march without output products writing every 4th chunk's entering state and
    ``v'``, and a parallel output kernel rebuilding the outputs from them
    (``explore_delta_round8.json``, ``…8b.json``, ``…8c.json``; 8c also timed the fused march
    with 4 stages, ``mt_stages=4``: no faster), and the chunk-128 march
    (``march_chunk128_round8.json``)."""
    out = []
    for tune in (dict(mqk=2), dict(tsolve=1), dict(tsolve=1, ts_warps=8)):
        out.append(("inf", tune))
        out.append(("inf", dict(tune, mt_seg=4)))
    return out


def _variants_round7g():
    """Round 7g: the march at V-blocks of 16 with 2 stages (two programs per SM) at one and two
    chunk ranges. (The run also timed V-blocks of 8, an allowance removed afterwards: Triton then
    issues ``mma.sync``, 1.4–3.7× the time.)

    The earlier sweeps of round 7 also timed variants whose code was then removed as slower (see
    kernels/NOTES_delta.md, round 7): the march transposed (``Sᵀ`` carried, every chained product
    from registers; ``explore_delta_round7.json``), the output products issued after the state
    update (7b), the tiles fetched by the tensor-memory accelerator (7c) and the march in three
    stacked products (``[K; Q] S`` and ``[T; P T] x``, 7d). Round 7b measured β read as float32
    (now the default); 7e–7g the chunk ranges (``mt_seg``) and the unmasked loop (``mt_even``).
    A last sweep (7h, ``explore_delta_round7h.json``) timed the march in "x form", ``o = e^{b}
    scale ⊙ (Q S) + (P T) x`` and ``S ← e^{b_C} S + W̃ᵀ x`` with ``P T`` and ``W̃ = Tᵀ (e^{b_C − b} ⊙
    K)`` formed per chunk (two products fewer on the chain, no ``v'``): 1.05–1.64× the time, code
    removed."""
    out = [("inf", dict(mt_seg=2, wu_bk=64, wu_warps=4))]
    for seg in (1, 2):
        out.append(("inf", dict(mt_bv=16, mt_stages=2, mt_seg=seg, wu_bk=64, wu_warps=4)))
    return out


def _variants_round7f():
    """Round 7f: the unmasked march loop against the masked one, and 2–4 chunk ranges with the
    scores kernel at 64-column blocks and 4 warps (small enough to sit beside the march)."""
    out = [("inf", dict(mt_seg=1)), ("inf", dict(mt_seg=1, mt_even=2))]
    for n in (2, 3, 4):
        out.append(("inf", dict(mt_seg=n, wu_bk=64, wu_warps=4)))
    out.append(("inf", dict(mt_seg=4)))
    return out


def _variants_round7e():
    """Round 7e: the segmented inference forward (``mt_seg``: the solve and scores of chunk range
    ``i + 1`` on a side stream while the march works through range ``i``), 1 to 32 ranges."""
    return [("inf", dict(mt_seg=n)) for n in (1, 2, 4, 16, 32)]


def _variants_round6c():
    """Round 6c (after 6): the march at the small-B·H V-blocks (16 at B·H = 16, 32 at B·H = 32)
    with fewer warps than a warpgroup (Triton then issues ``mma.sync`` products from registers
    instead of ``wgmma`` from shared memory) and with more, over stages."""
    out = []
    for bv in (16, 32):
        for nw in (1, 2, 8):
            for ns in (2, 3):
                out.append(("inf", dict(mt_bv=bv, mqk=1, mt_warps=nw, mt_stages=ns)))
    return out


def _variants_round6():
    """Round 6: the precision of the one-warp solve's off-diagonal block products (``kkt_oprec``)
    and its column block, then the inference forward with them. (The run,
    ``kernels/results/logs/explore_delta_round6.json``, also timed three knobs removed afterwards
    as slower: the round-5 row loop, ``kkt_tinv=2``; the off-diagonal Gram blocks formed after
    the diagonal inverses, ``kkt_glate=1``; a register cap, ``kkt_nreg``. See
    kernels/NOTES_delta.md.)"""
    out = [("solve", dict(kkt_oprec=1))]
    for op in (1, 2, 3):
        for kc in (128, 64):
            out.append(("solve", dict(kkt_oprec=op, kkt_bk=kc)))
    for op in (1, 2, 3):
        out.append(("inf", dict(kkt_oprec=op)))
    out.append(("wy", dict(kkt_oprec=1)))
    return out


def _variants_round5b():
    """Round 5b (after 5): the march's small-B·H settings and one-V-block-per-program warps again,
    and the two solves side by side. (This round also timed two variants whose code was then
    removed, never committed, as slower: the one-warp solve with its diagonal blocks inverted by
    doubling, 2.4× the time, and a march program owning two V-blocks at eight warps, about 1.5×;
    see kernels/NOTES_delta.md.)"""
    out = [("solve", dict(tsolve=2)), ("solve", dict(tsolve=1, ts_warps=4, ts_prec=1))]
    for nw in (4, 8):
        out.append(("inf", dict(tsolve=2, mt_bv=64, mt_warps=nw, mt_stages=2, mqk=2)))
    for bv, ns, qk in ((32, 3, 1), (32, 3, 2), (32, 2, 1), (16, 3, 1), (16, 2, 1)):
        out.append(("inf", dict(tsolve=2, mt_bv=bv, mt_warps=4, mt_stages=ns, mqk=qk)))
    out.append(("inf", dict(tform=2, tsolve=2)))
    return out


def _variants_round5():
    """Round 5: the inference forward in T form (``_tsolve_kernel`` + ``_march_t_kernel``) against
    the W/U form, over the march's V-block, warps, stages and where its scores come from; the
    doubling solve's warps and product precision against the one-warp 16×16-block solve."""
    out = [("solve", dict(tsolve=2))]
    for nw in (4, 8):
        for pr in (1, 2, 3):
            out.append(("solve", dict(tsolve=1, ts_warps=nw, ts_prec=pr)))
    out.append(("inf", dict(tform=2)))
    out.append(("inf", dict(tform=2, tsolve=2)))
    for ns in (1, 2, 3):
        for qk in (2, 1):
            out.append(("inf", dict(tform=1, mt_bv=128, mt_warps=8, mt_stages=ns, mqk=qk)))
    for bv, stages in ((64, (1, 2, 3)), (32, (2, 3)), (16, (2, 3))):
        for ns in stages:
            for qk in (1, 2):
                out.append(("inf", dict(tform=1, mt_bv=bv, mt_warps=4, mt_stages=ns, mqk=qk)))
    out.append(("inf", dict(tform=1, tsolve=2)))
    return out


def _variants_round4c():
    """(group, tune dict) in priority order. Round 4c (after 4b): the sequential backward with
    V-blocks of 16 (more programs at small B·H), and the per-chunk backward's blocks and warps
    again now that it reads the stored scores."""
    out = []
    for bv in (16, 32):
        for ns in (2, 3):
            out.append(("bwd", dict(bwd_bv=bv, bwd_warps=4, bwd_stages=ns)))
    for bk, nw in ((128, 8), (64, 8), (128, 4)):
        for bv in (32, 64):
            out.append(("local", dict(dqk_bk=bk, dqk_bv=bv, dqk_warps=nw)))
    for bv, nw in ((32, 4), (128, 4), (128, 8), (32, 8)):   # (32, 8): an illegal access in round 3
        out.append(("local", dict(dwy_bv=bv, dwy_warps=nw)))
    return out


def _variants_round4b():
    """Round 4b (after round 4 made the stored scores, ``aqk``, the default): the W/U kernel that
    now also forms the scores (warps, column block), and the training forward (which also writes
    the states and ``v'``) over V-blocks and stages."""
    out = []
    for bk in (64, 128):
        for nw in (4, 8):
            out.append(("wy", dict(wu_bk=bk, wu_warps=nw)))
    for bv in (16, 32, 64):
        for ns in (1, 2, 3):
            out.append(("fwdt", dict(fwd_bv=bv, fwd_warps=4, fwd_stages=ns)))
    return out


def _variants_round4():
    """Round 4 (kept for the record, ``--round 4``): the stored intra-chunk scores (``aqk``) in
    every kernel that reads them, ``U``/``W`` recomputed in the per-chunk backward (``dwy_rec``),
    and the sequential kernels' V-blocks and stages with and without the scores (the scores change
    their registers and shared memory, hence their occupancy). Risky configurations (one stage,
    eight warps in the sequential backward: illegal memory accesses in earlier rounds) come last."""
    out = []
    for qk in (1, 2):
        for nw in (4, 8):
            out.append(("wy", dict(aqk=qk, wu_warps=nw)))
    for kc in (32, 64):
        for nw in (1, 2):
            out.append(("wy", dict(kkt_bk=kc, kkt_warps=nw)))
    for qk in (1, 2):
        for rec in (1, 2):
            out.append(("local", dict(aqk=qk, dwy_rec=rec)))
    out.append(("local", dict(aqk=1, dwy_rec=1, dqk_warps=8)))
    out.append(("local", dict(aqk=1, dwy_rec=1, dwy_warps=8)))
    for ns in (2, 3, 1):
        for qk in (1, 2):
            for bv in (16, 32, 64):
                out.append(("fwd", dict(aqk=qk, fwd_bv=bv, fwd_warps=4, fwd_stages=ns)))
    for bv in (32, 64):
        out.append(("fwd", dict(aqk=1, fwd_bv=bv, fwd_warps=8, fwd_stages=1)))
    for ns in (2, 3):
        for qk in (1, 2):
            for bv in (32, 64):
                out.append(("bwd", dict(aqk=qk, bwd_bv=bv, bwd_warps=4, bwd_stages=ns)))
    for bv in (32, 64):
        out.append(("bwd", dict(aqk=1, bwd_bv=bv, bwd_warps=8, bwd_stages=1)))
    for bv in (32, 64):
        out.append(("bwd", dict(aqk=1, bwd_bv=bv, bwd_warps=4, bwd_stages=1)))
    return out


def _name(tune):
    return ",".join(f"{k}={v}" for k, v in tune.items())


# device and warm-up length of the compile workers: overridable only for a CPU smoke test of this
# script through the interpreter (tests/test_kernel_delta.py does not need it)
_DEVICE = os.environ.get("LATTN_EXPLORE_DEVICE", "cuda")
_WARM_T = int(os.environ.get("LATTN_EXPLORE_WARM_T", "1024"))


def _inputs(B, T, seed=0, device=None):
    device = device or _DEVICE
    import torch
    from .bench_delta import _make_inputs
    x = _make_inputs(B, T, device, torch.bfloat16, seed)
    x["beta"] = x["beta"].contiguous()
    return x


class _Stages:
    """Our stages at one shape, called one by one (the same calls as ``_ChunkDeltaFn``)."""

    def __init__(self, x):
        import torch
        import triton
        from kernels import triton_delta as td
        self.td = td
        self.x = x
        q, k, v, g, beta = (x[n] for n in ("q", "k", "v", "g", "beta"))
        B, T, _, _ = q.shape
        self.NT = triton.cdiv(T, td.CHUNK)
        self.scale = K ** -0.5
        self.b, self.bt = td._chunk_cumsum(g, beta, B, T, H, self.NT, with_beta=True)
        self.w, self.u, self.tm, self.a = td._wy_fwd(q, k, v, self.b, beta, self.scale)
        self.o, _, self.hs, self.vp = td._state_fwd(q, k, self.w, self.u, self.b, self.a, self.scale, None,
                                                    False, True)
        gen = torch.Generator(device=q.device).manual_seed(7)
        self.do = torch.randn(self.o.shape, device=q.device, generator=gen).to(q.dtype)
        self.dh, self.dh0, self.dvp = td._state_bwd(q, k, self.w, self.b, self.a, self.do, None, self.scale,
                                                    self.NT)

    def cumsum(self):
        x = self.x
        B, T = x["q"].shape[:2]
        return self.td._chunk_cumsum(x["g"], x["beta"], B, T, H, self.NT, with_beta=True)

    def wy(self):
        x = self.x
        return self.td._wy_fwd(x["q"], x["k"], x["v"], self.b, x["beta"], self.scale)

    def solve(self):
        x = self.x
        return self.td._solve_t(x["q"], x["k"], self.b, x["beta"], self.scale, False)[0]

    def infer(self):
        x = self.x
        return self.td._forward(x["q"], x["k"], x["v"], self.b, x["beta"], self.bt, self.scale, None, False,
                                False)[0]

    def state_fwd(self, train=False):
        x = self.x
        return self.td._state_fwd(x["q"], x["k"], self.w, self.u, self.b, self._a(), self.scale, None, False,
                                  train)

    def _a(self):
        """The stored scores when the (possibly tuned) ``aqk`` knob is on, else ``None``."""
        return self.a if self.td._switch("aqk", True) else None

    def state_bwd(self):
        x = self.x
        return self.td._state_bwd(x["q"], x["k"], self.w, self.b, self._a(), self.do, None, self.scale, self.NT)

    def local(self):
        x = self.x
        return self.td._local_grads_triton(x["q"], x["k"], x["v"], x["g"], x["beta"], self.b, self.w, self.u,
                                           self.tm, self._a(), self.hs, self.dh, self.do, self.vp, self.dvp,
                                           self.scale)


def _apply_tune(td, tune):
    return td.tuning(**tune)


def _run_group(st, group):
    if group == "wy":
        return st.wy()
    if group == "solve":
        return st.solve()
    if group == "inf":
        return st.infer()
    if group == "fwd":
        return st.state_fwd()[0]
    if group == "fwdt":
        return st.state_fwd(True)
    if group == "bwd":
        return st.state_bwd()
    return st.local()


def _outputs(group, res):
    if group == "wy":
        return {"w": res[0], "u": res[1], "T": res[2]}   # (the scores, res[3], may be None)
    if group == "solve":
        return {"T": res}
    if group == "inf":
        return {"o": res}
    if group == "fwd":
        return {"o": res}
    if group == "fwdt":
        return {"o": res[0], "hs": res[2], "vp": res[3]}
    if group == "bwd":
        return {"dh": res[0], "dh0": res[1], "dvp": res[2]}
    return {n: t for n, t in zip(("dq", "dk", "dv", "dbeta", "dg"), res) if t is not None}


def _warm(group, tune):
    """Worker: compile (and run once) one variant at a small shape with the same specialisation."""
    t0 = time.time()
    try:
        import torch
        from kernels import triton_delta as td
        st = _Stages(_inputs(1, _WARM_T, seed=1))
        with _apply_tune(td, tune):
            _run_group(st, group)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return {"ok": True, "s": round(time.time() - t0, 2)}
    except Exception as e:
        return {"ok": False, "s": round(time.time() - t0, 2), "error": _err(e)}


def _err(e):
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:240] if msg else ''}"


def _profile(fn, n=3):
    """Per-kernel device time (ms per call) of ``fn`` with torch.profiler; {} on failure."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        is_dev = str(getattr(e, "device_type", "")).endswith("CUDA")
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = getattr(e, "self_cuda_time_total", 0)
        if is_dev and t > 0:
            out[e.key[:80]] = round(t / 1000.0 / n, 4)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=float(os.environ.get("BUDGET_S", 200)),
                   help="seconds; what is left after that is skipped (JSON and table still written)")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for explore_delta.json")
    p.add_argument("--workers", type=int, default=max(1, min(12, (os.cpu_count() or 4) - 3)))
    p.add_argument("--quick", action="store_true", help="small shapes (a smoke test)")
    p.add_argument("--round", default="8", choices=["4", "4b", "4c", "5", "5b", "6", "6c", "7e", "7f", "7g", "8"],
                   help="which round's variant list: 4 … 7g (kept for the record) or 8 (default)")
    p.add_argument("--fla", action="store_true", help="also time fla end to end (its autotuning is slow)")
    p.add_argument("--profile", action="store_true", help="torch.profiler per-kernel tables")
    args = p.parse_args(argv)
    start = time.time()
    left = lambda: args.budget - (time.time() - start)   # noqa: E731
    os.environ["FLA_DISABLE_BACKEND_DISPATCH"] = "1"
    import concurrent.futures as cf
    import multiprocessing as mp
    import torch
    import kernels
    from kernels import triton_delta as td
    from .harness import bench_ms, environment, err_ratio
    if not torch.cuda.is_available():
        print("explore_delta needs a CUDA GPU")
        return 2
    shapes = QUICK_SHAPES if args.quick else SHAPES
    variants = {"4": _variants_round4, "4b": _variants_round4b, "4c": _variants_round4c,
                "5": _variants_round5, "5b": _variants_round5b,
                "6": _variants_round6, "6c": _variants_round6c, "7e": _variants_round7e,
                "7f": _variants_round7f, "7g": _variants_round7g, "8": _variants}[args.round]()
    result = {"env": environment(), "budget_s": args.budget, "shapes": shapes, "H": H, "K": K, "V": V,
              "dtype": "bfloat16", "tol": TOL, "breakdown": {}, "profile": {}, "variants": [],
              "warm": {}, "skipped": []}

    # 1. compile every variant in worker processes while the main process measures the breakdown
    # one fresh process per variant: an illegal memory access poisons a CUDA context, and a reused
    # worker would then report every later variant as failed
    pool = cf.ProcessPoolExecutor(max_workers=args.workers, mp_context=mp.get_context("spawn"),
                                  max_tasks_per_child=1)
    # submit the function by its importable module name (this file may run as __main__)
    from kernels.benchmarks.explore_delta import _warm as warm_fn
    futures = [pool.submit(warm_fn, grp, tune) for grp, tune in variants]

    def bench(fn, fast=False):
        return round(bench_ms(fn, warmup=5 if fast else 10, rep=20 if fast else 50), 4)

    try:
        fla = {}
        try:
            if not args.fla:
                raise RuntimeError("not asked for (--fla)")
            from fla.ops.delta_rule import chunk_delta_rule
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule
            fla["gated"] = lambda q, k, v, g, beta: chunk_gated_delta_rule(q, k, v, g, beta, scale=K ** -0.5)[0]
            fla["delta"] = lambda q, k, v, g, beta: chunk_delta_rule(q, k, v, beta, scale=K ** -0.5)[0]
        except Exception as e:
            result["fla_error"] = _err(e)
        ours = lambda q, k, v, g, beta: kernels.chunk_gated_delta_rule(q, k, v, g, beta, backend="triton")[0]  # noqa

        def fwdbwd(fn, x):
            leaves = {n: t.detach().clone().requires_grad_(n != "g" or fn is not fla.get("delta"))
                      for n, t in x.items()}
            do = torch.randn_like(x["v"])
            ins = [t for t in leaves.values() if t.requires_grad]
            def step():
                o = fn(**leaves)
                torch.autograd.grad(o, ins, do)
            return step

        stages = {}
        for B, T in shapes:
            key = f"B{B}_T{T}"
            rec = result["breakdown"][key] = {}
            try:
                x = _inputs(B, T)
                st = stages[key] = _Stages(x)
                with torch.no_grad():
                    rec["cumsum"] = bench(st.cumsum)
                    rec["wy_fwd"] = bench(st.wy)
                    rec["solve"] = bench(st.solve)
                    rec["infer"] = bench(st.infer)
                    rec["state_fwd"] = bench(st.state_fwd)
                    rec["state_fwd_train"] = bench(lambda: st.state_fwd(True))
                    rec["state_bwd"] = bench(st.state_bwd)
                    rec["local_bwd(+dg)"] = bench(st.local)
                    rec["sum_fwd"] = round(rec["cumsum"] + rec["wy_fwd"] + rec["state_fwd"], 4)
                    rec["sum_fwdbwd"] = round(rec["cumsum"] + rec["wy_fwd"] + rec["state_fwd_train"]
                                              + rec["state_bwd"] + rec["local_bwd(+dg)"], 4)
                    rec["ours_fwd_e2e"] = bench(lambda: ours(**x))
                    if "gated" in fla:
                        rec["fla_gated_fwd_e2e"] = bench(lambda: fla["gated"](**x))
                        rec["fla_delta_fwd_e2e"] = bench(lambda: fla["delta"](**x))
                rec["ours_fwdbwd_e2e"] = bench(fwdbwd(ours, x))
                if "delta" in fla:
                    try:
                        rec["fla_delta_fwdbwd_e2e"] = bench(fwdbwd(fla["delta"], x))
                    except Exception as e:
                        rec["fla_delta_fwdbwd_error"] = _err(e)
                prof = result["profile"][key] = {}
                def old_form(x=x):
                    with td.tuning(tform=2, tsolve=2):
                        return ours(**x)
                for pname, fn in [("ours_fwd", lambda: ours(**x)), ("ours_fwd_round4", old_form),
                                  ("fla_delta_fwd", lambda: fla["delta"](**x)),
                                  ("fla_gated_fwd", lambda: fla["gated"](**x))]:
                    if not args.profile or (pname.startswith("fla") and not fla):
                        break
                    if left() < 60:
                        break
                    try:
                        with torch.no_grad() if pname.endswith("_fwd") else torch.enable_grad():
                            prof[pname] = _profile(fn)
                    except Exception as e:
                        prof[pname] = {"error": _err(e)}
            except Exception as e:
                rec["error"] = _err(e)
                traceback.print_exc()
            print(f"[{time.time() - start:6.1f}s] breakdown {key}: {rec}", flush=True)

        # 2. variants: wait for each compile, then time at both shapes against the default
        base = {}
        for key, st in stages.items():
            with torch.no_grad():
                for grp in sorted({g for g, _ in variants}):
                    base[key, grp] = {n: t.clone() for n, t in _outputs(grp, _run_group(st, grp)).items()}
                    base[key, grp, "ms"] = bench(lambda: _run_group(st, grp), fast=True)
        result["default_ms"] = {f"{k[0]}:{k[1]}": v for k, v in base.items() if len(k) == 3}
        for (grp, tune), fut in zip(variants, futures):
            name = _name(tune)
            if left() < 8:
                result["skipped"].append(f"{grp}:{name}")
                continue
            try:
                warm = fut.result(timeout=max(1.0, left() - 8))
            except cf.TimeoutError:
                result["skipped"].append(f"{grp}:{name}")
                continue
            except Exception as e:
                warm = {"ok": False, "error": _err(e)}
            result["warm"][f"{grp}:{name}"] = warm
            rec = {"group": grp, "tune": tune, "compile_s": warm.get("s")}
            if not warm["ok"]:
                rec["error"] = warm["error"]
            else:
                for key, st in stages.items():
                    if left() < 5:
                        rec.setdefault("partial", True)
                        break
                    try:
                        with torch.no_grad(), _apply_tune(td, tune):
                            outs = _outputs(grp, _run_group(st, grp))
                            err = max(err_ratio(outs[n], base[key, grp][n]) for n in outs)
                            ms = bench(lambda: _run_group(st, grp), fast=True)
                        rec[key] = {"ms": ms, "vs_default": round(ms / base[key, grp, "ms"], 3),
                                    "err_vs_default": float(f"{err:.3g}"), "ok": bool(err <= TOL)}
                    except Exception as e:
                        rec[key] = {"error": _err(e)}
            result["variants"].append(rec)
    finally:
        result["elapsed_s"] = round(time.time() - start, 1)
        procs = list((getattr(pool, "_processes", None) or {}).values())   # our own workers only
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            try:
                proc.terminate()
            except Exception:
                pass
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "explore_delta.json")
        with open(path, "w") as f:
            json.dump(result, f, indent=1, default=str)
        print(f"wrote {path}")
    _table(result)
    return 0


def _table(r):
    print(f"\n=== explore_delta ({r['elapsed_s']} s; skipped {len(r['skipped'])}) ===")
    for key, rec in r["breakdown"].items():
        print(f"-- breakdown {key} (ms): " + "  ".join(f"{k}={v}" for k, v in rec.items()))
    for key, prof in r["profile"].items():
        for pname, d in prof.items():
            items = list(d.items())[:8]
            print(f"-- profile {key} {pname} (ms/call): " + "  ".join(f"{k[:40]}={v}" for k, v in items))
    print("-- default ms: " + "  ".join(f"{k}={v}" for k, v in r.get("default_ms", {}).items()))
    for grp in ("solve", "inf", "wy", "fwd", "fwdt", "bwd", "local"):
        recs = [v for v in r["variants"] if v["group"] == grp]
        for key in r["breakdown"]:
            ok = [v for v in recs if isinstance(v.get(key), dict) and "ms" in v[key]]
            ok.sort(key=lambda v: v[key]["ms"])
            print(f"-- {grp} {key}: best 6 of {len(ok)} timed ({len(recs)} tried)")
            for v in ok[:6]:
                d = v[key]
                print(f"   {d['ms']:8.3f} ms  x{d['vs_default']:<6} err {d['err_vs_default']:<8} "
                      f"{'ok ' if d['ok'] else 'BAD'} {_name(v['tune'])}")
        bad = [v for v in recs if "error" in v]
        if bad:
            print(f"   {len(bad)} failed, e.g. {_name(bad[0]['tune'])}: {bad[0]['error'][:120]}")


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # the JSON and the table are out; do not wait for compile workers that may still be busy
    os._exit(rc or 0)
