"""Every kernel launch of the three families compiles for a Hopper GPU (sm_90a), on a CPU.

``python -m kernels.compile <family> --quick`` (in a fresh process: the interpreter must be off to
compile) runs each family's host code with the launches captured, compiles every distinct one
with Triton and assembles it with ``ptxas``. This catches what the interpreter accepts but the GPU
compiler rejects. What is checked, per launch: no compile error and ``ptxas`` accepts the PTX;
shared memory within the 227 KiB a block may use on an H100/H200; 16-bit products on Hopper
tensor cores (``wgmma``), except the delta rule's one-warp solve (16×16 blocks on one warp:
``mma.sync``); the production flash-attention plans for long sequences use TMA.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _compile(family):
    triton = pytest.importorskip("triton")
    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("this triton build has no NVIDIA backend tools (ptxas)")
    res = subprocess.run([sys.executable, "-m", "kernels.compile", family, "--quick"], capture_output=True,
                         text=True, cwd=ROOT, env=dict(os.environ, TRITON_INTERPRET="0"), timeout=900)
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert res.returncode == 0, (res.stderr[-3000:], [r for r in rows if "error" in r])
    for r in rows:
        assert "error" not in r and r["ptxas_rc"] == 0, r
        assert r["shared"] <= 227 * 1024, r
        if r["dtype"] in ("bf16", "fp16") and r["kernel"] not in ("_solve_kernel", "_gate_cumsum_kernel"):
            assert r["wgmma"], r
    return rows


def test_flash_compiles():
    rows = _compile("flash")
    kinds = {(r["constexprs"].get("BLOCK_M"), r["constexprs"].get("BLOCK_N"), r["constexprs"].get("TMA"))
             for r in rows if r["dtype"] == "bf16" and r["constexprs"]["D"] == 128 and r["constexprs"]["CAUSAL"]}
    assert {(64, 64, False), (128, 128, True)} <= kinds, kinds     # the short tiling and the TMA plan
    tma = [r for r in rows if r["constexprs"].get("TMA")]
    assert tma and all(r["tma"] and r["spill_bytes"] == 0 for r in tma), tma


def test_gla_compiles():
    rows = _compile("gla")
    names = {r["kernel"] for r in rows}
    assert {"_gla_prep_kernel", "_fwd_kernel", "_combine_kernel", "_bwd_dh_kernel", "_bwd_dv_kernel",
            "_bwd_dqdk_kernel", "_dg_kernel"} <= names, names
    # the prep stage with float32 gates (split into bfloat16 pieces) and with 16-bit gates
    preps = [r for r in rows if r["kernel"] == "_gla_prep_kernel"]
    assert len(preps) >= 2 and all(r["wgmma"] for r in preps)


def test_delta_compiles():
    rows = _compile("delta")
    names = {r["kernel"] for r in rows}
    assert {"_gate_cumsum_kernel", "_solve_kernel", "_wu_fwd_kernel", "_state_fwd_kernel", "_march_t_kernel",
            "_state_bwd_kernel", "_bwd_dqk_kernel", "_bwd_wy_kernel"} <= names, names
