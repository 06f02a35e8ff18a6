"""Compile the delta-rule kernels for an H100/H200 (sm_90a) *without a GPU* and report, per kernel
and config, shared memory, registers and register spills (from ``ptxas -v``).

    TRITON_INTERPRET=0 python -m kernels.benchmarks.ptxas_delta [--dtype bf16|fp16|fp32] [--kv 128]

(``TRITON_INTERPRET=0`` is needed on a machine without a GPU: importing ``kernels`` would otherwise
switch Triton to its interpreter, and interpreted kernels cannot be compiled.)

A tuning aid: spills and shared-memory needs are properties of the compiled code, not timings. A
kernel whose shared memory exceeds the device limit (227 KB on H100/H200) fails to launch;
``triton_delta`` then falls back (see ``_launch`` and the backward's ``OutOfResources`` path).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import tempfile


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--kv", type=int, default=128, choices=[16, 32, 64, 128], help="K = V head size")
    p.add_argument("--grid", action="store_true",
                   help="also the per-chunk kernels' variants swept by kernels.benchmarks.explore_delta")
    p.add_argument("--only", default="", help="compile only the kernels whose name contains this")
    args = p.parse_args(argv)
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from kernels import triton_delta as td
    if td.INTERPRET:
        print("run with TRITON_INTERPRET=0 (see the module docstring)")
        return 2

    target = GPUTarget("cuda", 90, 32)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    dt, K = args.dtype, args.kv
    V = K
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dt]
    prec = td._precision(tdt)
    P = "*" + dt
    F = "*fp32"
    wy = dict(q_ptr=P, k_ptr=P, v_ptr=P, beta_ptr=P, b_ptr=F, w_ptr=P, u_ptr=P, t_ptr=P, a_ptr=P, scale="fp32",
              T="i32", H="i32", NTC="i32", N0="i32")
    sigs = {
        "_kkt_solve_kernel": wy,
        "_wu_fwd_kernel": wy,
        "_tsolve_kernel": dict(q_ptr=P, k_ptr=P, beta_ptr=P, b_ptr=F, t_ptr=P, a_ptr=P, scale="fp32", T="i32",
                               H="i32", NTC="i32", N0="i32"),
        "_march_t_kernel": dict(q_ptr=P, k_ptr=P, v_ptr=P, beta_ptr=F, b_ptr=F, t_ptr=P, a_ptr=P, o_ptr=P,
                                h0_ptr=F, ht_ptr=F, scale="fp32", T="i32", H="i32", NT="i32", NTC="i32",
                                N0="i32", N1="i32"),
        "_state_fwd_kernel": dict(q_ptr=P, k_ptr=P, w_ptr=P, u_ptr=P, b_ptr=F, a_ptr=P, o_ptr=P, h0_ptr=F,
                                  ht_ptr=F, hs_ptr=P, vp_ptr=P, scale="fp32", T="i32", H="i32", NT="i32",
                                  NTC="i32"),
        "_state_bwd_kernel": dict(q_ptr=P, k_ptr=P, w_ptr=P, b_ptr=F, a_ptr=P, do_ptr=P, dht_ptr=F, dh_ptr=P,
                                  dh0_ptr=F, dvp_ptr=P, scale="fp32", T="i32", H="i32", NT="i32", NTC="i32"),
        "_state_vp_fwd_kernel": dict(k_ptr=P, w_ptr=P, u_ptr=P, b_ptr=F, vp_ptr=P, h0_ptr=F,
                                     ht_ptr=F, hs_ptr=P, T="i32", H="i32", NT="i32", NTC="i32"),
        "_out_fwd_kernel": dict(q_ptr=P, k_ptr=P, vp_ptr=P, b_ptr=F, hs_ptr=P, o_ptr=P, scale="fp32",
                                T="i32", H="i32", NT="i32", NTC="i32"),
        "_bwd_dqk_kernel": dict(q_ptr=P, k_ptr=P, b_ptr=F, a_ptr=P, hs_ptr=P, dh_ptr=P, do_ptr=P, vp_ptr=P, dvp_ptr=P,
                                dq_ptr=P, dk_ptr=F, dw_ptr=P, db_ptr=F, scale="fp32", T="i32", H="i32",
                                NT="i32", NTC="i32"),
        "_bwd_wy_kernel": dict(k_ptr=P, v_ptr=P, beta_ptr=P, b_ptr=F, w_ptr=P, u_ptr=P, t_ptr=P, dvp_ptr=P,
                               dw_ptr=P, dkp_ptr=F, dbp_ptr=F, dk_ptr=P, dv_ptr=P, dbeta_ptr=F, db_ptr=F,
                               T="i32", H="i32", NTC="i32"),
    }
    BK = min(64, K)
    cfg = lambda nw, ns=1: [dict(num_warps=nw, num_stages=ns)]
    jobs = [("_kkt_solve_kernel", dict(K=K, V=V, BK=BK, KC=K, PREC=prec, FUSE_WU=False, QK=True, **td._kkt_opts(tdt)), cfg(1)),
            ("_wu_fwd_kernel", dict(K=K, V=V, BK=K, PREC=prec, QK=False, WU=True), cfg(8 if K >= 128 else 4)),  # default
            ("_wu_fwd_kernel", dict(K=K, V=V, BK=K, PREC=prec, QK=True, WU=True), cfg(8 if K >= 128 else 4)),
            ("_wu_fwd_kernel", dict(K=K, V=V, BK=BK, PREC=prec, QK=True, WU=True), cfg(4)),
            ("_wu_fwd_kernel", dict(K=K, V=V, BK=BK, PREC=prec, QK=True, WU=False), cfg(4)),  # segmented scores
            ("_kkt_solve_kernel", dict(K=K, V=V, BK=BK, KC=K, PREC=prec, FUSE_WU=True, QK=True, **td._kkt_opts(tdt)), cfg(4))]
    sprec = "ieee" if dt == "fp32" else "tf32"
    for qk in (False, True):
        for nw in (4, 8):
            jobs.append(("_tsolve_kernel", dict(K=K, PREC=prec, SPREC=sprec, QK=qk), cfg(nw)))
    for BV, nw in ((V, 8), (min(V, 64), 4), (min(V, 32), 4), (min(V, 16), 4)):
        for has_a in (False, True):
            for ns in (1, 2, 3):
                jobs.append(("_march_t_kernel", dict(K=K, V=V, BV=BV, PREC=prec, HAS_H0=True, STORE_HT=True,
                                                     HAS_A=has_a, EVEN=True), cfg(nw, ns)))
    # each kernel with and without the stored scores (HAS_A, the ``aqk`` knob), at the V-blocks the
    # heuristics pick
    for has_a in (True, False):
        for BV in sorted({min(V, 64), min(V, 32), min(V, 16)}):
            for ns in (2, 3):
                jobs.append(("_state_fwd_kernel", dict(K=K, V=V, BV=BV, PREC=prec, HAS_H0=True, STORE_HT=True,
                                                       STORE_HS=True, HAS_A=has_a),
                             td._seq_configs(tdt, K, BV, nw16=4, ns16=ns)))
        for BVB in sorted({min(V, 64), min(V, 32)}):
            for ns in (2, 3):                      # stages at large / small batch × heads
                jobs.append(("_state_bwd_kernel", dict(K=K, V=V, BV=BVB, PREC=prec, HAS_DHT=True, HAS_A=has_a),
                             td._seq_configs(tdt, K, BVB, nw16=4, ns16=ns)))
        jobs.append(("_bwd_dqk_kernel", dict(K=K, V=V, BK=BK, BV=min(V, 64), PREC=prec, HAS_A=has_a),
                     td._par_configs(BK, V, nw=4)))
    for rec in (True, False):
        jobs.append(("_bwd_wy_kernel", dict(K=K, V=V, BV=min(V, 64), NK=K // BK, PREC=prec, REC=rec),
                     td._par_configs(K, V, nw=4)))
    jobs.append(("_state_vp_fwd_kernel", dict(K=K, V=V, BV=min(V, 32), PREC=prec, HAS_H0=True, STORE_HT=True),
                 td._seq_configs(tdt, K, min(V, 32), nw16=4, ns16=3)))
    jobs.append(("_out_fwd_kernel", dict(K=K, V=V, BV=min(V, 64), PREC=prec), td._par_configs(K, min(V, 64))))
    if args.grid:   # the per-chunk kernels' variants swept by explore_delta
        for nw in (1, 2, 4, 8):
            for kc in sorted({min(K, 32), min(K, 64), K}):
                jobs.append(("_kkt_solve_kernel", dict(K=K, V=V, BK=BK, KC=kc, PREC=prec, FUSE_WU=False, QK=True, **td._kkt_opts(tdt)),
                             cfg(nw)))
        for nw in (2, 4, 8):
            for bk in sorted({min(32, K), BK}):
                jobs.append(("_wu_fwd_kernel", dict(K=K, V=V, BK=bk, PREC=prec, QK=True, WU=True), cfg(nw)))
        for nw in (4, 8):
            for bk in sorted({BK, K}):
                for bv in sorted({min(V, 32), min(V, 64)}):
                    jobs.append(("_bwd_dqk_kernel", dict(K=K, V=V, BK=bk, BV=bv, PREC=prec, HAS_A=True), cfg(nw)))
            for bv in sorted({min(V, 32), min(V, 64)}):
                jobs.append(("_bwd_wy_kernel", dict(K=K, V=V, BV=bv, NK=K // BK, PREC=prec, REC=True), cfg(nw)))
    seen = set()
    for name, meta, configs in jobs:
        if args.only not in name:
            continue
        kern = getattr(td, name)
        sig = {n: ("constexpr" if n in meta else sigs[name][n]) for n in kern.arg_names}
        for cfg in configs:
            key = (name, tuple(sorted(meta.items())), cfg["num_warps"], cfg["num_stages"])
            if key in seen:
                continue
            seen.add(key)
            try:
                # pointers are 16-byte aligned as Triton's launcher assumes for torch tensors (the
                # runtime sizes are not specialised, see triton_delta._NO_SPEC)
                attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kern.arg_names)
                         if str(sig[n]).startswith("*")}
                c = triton.compile(ASTSource(fn=kern, signature=sig, constexprs=meta, attrs=attrs), target=target,
                               options=dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"]))
            except Exception as e:   # report and go on: a variant that does not compile is a result
                print(f"{name:24s} {meta.get('BV', '-')} warps={cfg['num_warps']} stages={cfg['num_stages']} "
                      f"COMPILE ERROR {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
                continue
            with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
                f.write(c.asm["ptx"])
            r = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", f.name, "-o", os.devnull],
                               capture_output=True, text=True)
            os.unlink(f.name)
            lines = [ln.split("info    : ")[-1].strip() for ln in r.stderr.splitlines()
                     if "Used" in ln or "spill" in ln]
            tile = " ".join(f"{k}={int(meta[k]) if isinstance(meta[k], bool) else meta[k]}"
                            for k in ("BK", "KC", "BV", "FUSE_WU", "QK", "WU", "HAS_A", "REC", "SPREC") if k in meta)
            print(f"{name:20s} {dt} K={K} {tile:18s} warps={cfg['num_warps']} stages={cfg['num_stages']} "
                  f"smem={c.metadata.shared:6d}  " + " | ".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
