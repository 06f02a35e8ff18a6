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
    sigs = {
        "_wy_fwd_kernel": dict(k_ptr=P, v_ptr=P, beta_ptr=P, b_ptr="*fp32", w_ptr=P, u_ptr=P, t_ptr="*fp32",
                               T="i32", H="i32", NTC="i32"),
        "_state_fwd_kernel": dict(q_ptr=P, k_ptr=P, w_ptr=P, u_ptr=P, b_ptr="*fp32", o_ptr=P, h0_ptr="*fp32",
                                  ht_ptr="*fp32", hs_ptr=P, scale="fp32", T="i32", H="i32", NT="i32", NTC="i32"),
        "_state_bwd_kernel": dict(q_ptr=P, k_ptr=P, w_ptr=P, b_ptr="*fp32", do_ptr=P, dht_ptr="*fp32", dh_ptr=P,
                                  dh0_ptr="*fp32", scale="fp32", T="i32", H="i32", NT="i32", NTC="i32"),
        "_local_bwd_kernel": dict(q_ptr=P, k_ptr=P, v_ptr=P, beta_ptr=P, b_ptr="*fp32", w_ptr=P, u_ptr=P,
                                  t_ptr="*fp32", hs_ptr=P, dh_ptr=P, do_ptr=P, dq_ptr="*fp32", dk_ptr="*fp32",
                                  dv_ptr=P, dbeta_ptr="*fp32", db_ptr="*fp32", scale="fp32", T="i32", H="i32",
                                  NT="i32", NTC="i32"),
        "_state_terms_bwd_kernel": dict(w_ptr=P, u_ptr=P, b_ptr="*fp32", hs_ptr=P, dh_ptr=P, do_ptr=P,
                                        dq32_ptr="*fp32", dk32_ptr="*fp32", dq_ptr=P, dk_ptr=P, scale="fp32",
                                        T="i32", H="i32", NT="i32", NTC="i32"),
    }
    BVL = min(V, 32 if K >= 128 else 64)
    jobs = [("_wy_fwd_kernel", dict(K=K, V=V, PREC=prec, STORE_T=True), td._par_configs(K, V))]
    for BV in sorted({min(V, 64), 32 if V >= 32 else 16, 16}):
        jobs.append(("_state_fwd_kernel", dict(K=K, V=V, BV=BV, PREC=prec, HAS_H0=True, STORE_HT=True,
                                               STORE_HS=True), td._seq_configs(tdt, K, BV)))
        jobs.append(("_state_bwd_kernel", dict(K=K, V=V, BV=BV, PREC=prec, HAS_DHT=True),
                     td._seq_configs(tdt, K, BV)))
    jobs.append(("_local_bwd_kernel", dict(K=K, V=V, BV=BVL, PREC=prec, STATE_TERMS=False), td._par_configs(K, V)))
    jobs.append(("_state_terms_bwd_kernel", dict(K=K, V=V, BV=BVL, PREC=prec), td._par_configs(K, V)))
    for name, meta, configs in jobs:
        kern = getattr(td, name)
        sig = {n: ("constexpr" if n in meta else sigs[name][n]) for n in kern.arg_names}
        for cfg in configs:
            c = triton.compile(ASTSource(fn=kern, signature=sig, constexprs=meta), target=target,
                               options=dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"]))
            with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
                f.write(c.asm["ptx"])
            r = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", f.name, "-o", os.devnull],
                               capture_output=True, text=True)
            os.unlink(f.name)
            lines = [ln.split("info    : ")[-1].strip() for ln in r.stderr.splitlines()
                     if "Used" in ln or "spill" in ln]
            bv = meta.get("BV", "-")
            print(f"{name:24s} {dt} K={K} BV={bv!s:3s} warps={cfg['num_warps']} stages={cfg['num_stages']} "
                  f"smem={c.metadata.shared:6d}  " + " | ".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
