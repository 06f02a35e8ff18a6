"""Every kernel launch of the families in ``FAMILIES`` (six of the seven; PaTH's launches are checked
by running ``python -m kernels.compile path`` by hand) compiles for every GPU class the book's
readers use, on a CPU: T4 (sm_75, Colab's free GPU), A100 (sm_80), L4 (sm_89) and H100/H200 (sm_90a).

``python -m kernels.compile <family> --quick --arch <A>`` (in a fresh process: the interpreter must
be off to compile) runs each family's Triton path with that class's launch plan and the launches
captured, compiles every distinct one with Triton and assembles it with ``ptxas``. This catches what
the interpreter accepts but the GPU compiler rejects. What is checked, per launch: no compile error
and ``ptxas`` accepts the PTX; shared memory within the class's per-block limit
(:data:`kernels.backend.GPU_CLASSES`: 64, 163, 99, 227 KiB); the products the class has: Hopper
``wgmma`` for 16-bit inputs (except the delta rule's one-warp solve: 16×16 blocks on one warp,
``mma.sync``), ``mma.sync`` and never ``wgmma`` or TMA on sm_80/sm_89, CUDA-core FMAs only and no
bfloat16 on sm_75 (Triton 3.6 has no tensor-core path there); the production flash-attention plans
for long sequences use TMA on Hopper. Where a class's plan routes an op to the PyTorch path (the
vector gate and the delta rule on a T4), no launch is captured for it, and the plan says so.

The checks can fail: a class given too little shared memory (``--smem``) fails the run, and
bfloat16 on a T4 stops it with the ops' ``ValueError`` before anything is compiled.

The 28 runs (7 families × 4 classes, and the two failure runs) start together, as many at a time as
there are CPUs. They take minutes on 2 cores with an empty Triton cache (PaTH's float32 kernels
alone compile for 20-50 s each), so their reports are kept: ``tests/kernels/compile_cache.json`` holds
every run's output together with :func:`kernels.compile.source_key`, a digest of the kernels'
sources and Triton's version. While the key matches, the assertions below run on the kept
reports (a fresh clone of an unchanged tree compiles nothing); any change to a shipped kernel
module, or another Triton, changes the key, and the fixture compiles everything again and
rewrites the file (commit it with the change). The kept reports are the compiler's own output
for exactly these sources; the checks on them are the same either way.
"""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ("flash", "gla", "delta", "deltaformer", "conv", "mesa", "path")
CACHE = Path(__file__).resolve().parent / "compile_cache.json"
# the short convolution's kernels: elementwise and reductions, no matrix products anywhere
CONV_KERNELS = {"_conv_march_kernel", "_conv_fwd_kernel", "_final_state_kernel", "_march_bwd_kernel", "_dz_kernel",
                "_dx_kernel", "_sum_rows_kernel", "_state_grad_kernel"}
# elementwise kernels (no products, so no tensor-core instructions to expect): the gate sums and
# chunk_comba's change of variables (kernels/delta/comba.py) and MesaNet's keys (kernels/mesa/prep.py)
ELEMENTWISE = {"_gate_cumsum_kernel", "_bwd_delta_kernel", "_cumsum_kernel", "_map_fwd_kernel", "_map_bwd_kernel",
               "_prep_fwd_kernel", "_prep_bwd_kernel"}
ARCHS = (90, 89, 80, 75)
SMEM = {75: 64 * 1024, 80: 163 * 1024, 89: 99 * 1024, 90: 227 * 1024}      # GPU_CLASSES, written out
# the two runs that must fail: an L4 given 32 KiB of shared memory (flash's 64 x 64 tiles at D = 128
# need 56 KiB), and bfloat16 inputs on a T4
FAILING = {"small_smem": ("flash", "--arch", "89", "--smem", "32768"),
           "bf16_on_t4": ("delta", "--arch", "75", "--dtype", "bf16")}


def _run(args):
    res = subprocess.run([sys.executable, "-m", "kernels.compile", *args, "--quick"], capture_output=True,
                         text=True, cwd=ROOT, env=dict(os.environ, TRITON_INTERPRET="0"), timeout=1500)
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    return res.returncode, rows, res.stderr


def _compile_all():
    jobs = {(f, a): (f, "--arch", str(a)) for a in ARCHS for f in FAMILIES}
    jobs.update(FAILING)
    # the slowest first (PaTH, then GLA off Hopper), so that the pool ends together
    order = sorted(jobs, key=lambda j: (j[0] != "path", j[0] != "gla", j[1] == 90) if isinstance(j, tuple)
                   else (True, True, True))
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        futures = {j: pool.submit(_run, jobs[j]) for j in order}
        return {j: f.result() for j, f in futures.items()}


def _job_name(j) -> str:
    return j if isinstance(j, str) else f"{j[0]} {j[1]}"


@pytest.fixture(scope="module")
def runs():
    triton = pytest.importorskip("triton")
    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("this triton build has no NVIDIA backend tools (ptxas)")
    from kernels.compile import source_key
    key = source_key()
    jobs = [(f, a) for a in ARCHS for f in FAMILIES] + list(FAILING)
    if CACHE.exists():
        kept = json.loads(CACHE.read_text())
        if kept.get("key") == key and set(kept["runs"]) == {_job_name(j) for j in jobs}:
            return {j: tuple(kept["runs"][_job_name(j)]) for j in jobs}
    out = _compile_all()
    CACHE.write_text(json.dumps({"key": key, "note": "tests/kernels/test_compile.py's compile reports for this key",
                                 "runs": {_job_name(j): [rc, rows, err[-3000:]] for j, (rc, rows, err) in out.items()}},
                                indent=0) + "\n")
    return out


def test_cache_key_follows_the_sources(tmp_path):
    """The key changes with any shipped kernel module (here: one byte of the common floor), so a
    kept report never stands for other sources."""
    import shutil
    import subprocess as sp
    copy = tmp_path / "kernels"
    shutil.copytree(ROOT / "kernels", copy, ignore=shutil.ignore_patterns("lab", "__pycache__", "*.json"))
    code = "import sys; sys.path.insert(0, sys.argv[1]); from kernels.compile import source_key; print(source_key())"
    a = sp.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=tmp_path).stdout
    (copy / "common" / "tiles.py").write_text((copy / "common" / "tiles.py").read_text() + "\n")
    b = sp.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=tmp_path).stdout
    assert a and b and a != b


def _launches(runs, family, arch):
    rc, rows, err = runs[(family, arch)]
    assert rc == 0, (err[-3000:], [r for r in rows if "error" in r or not r.get("fits", True)])
    head, rows = rows[0], rows[1:]
    assert head == {"family": family, "arch": arch, "launches": len(rows)}, head
    for r in rows:
        assert "error" not in r and r["ptxas_rc"] == 0, r
        assert r["fits"] and r["smem_limit"] == SMEM[arch] and r["shared"] <= SMEM[arch], r
        half = r["dtype"] in ("bf16", "fp16")
        if arch == 90:
            if half and r["kernel"] not in {"_solve_kernel"} | ELEMENTWISE | CONV_KERNELS:
                assert r["wgmma"], r
        elif arch in (80, 89):
            assert not r["wgmma"] and not r["tma"], r
            if half and r["kernel"] not in ELEMENTWISE | CONV_KERNELS:
                assert r["mma_sync"], r
        else:   # sm_75: products on the CUDA cores, no bfloat16 anywhere
            assert not (r["wgmma"] or r["mma_sync"] or r["tma"]) and r["dtype"] != "bf16", r
    return rows


@pytest.mark.parametrize("arch", ARCHS)
def test_flash_compiles(runs, arch):
    from kernels.flash.plan import AMPERE, AMPERE_BWD, HOPPER_BWD_LONG, HOPPER_BWD_SHORT, SMALL_BWD, TURING
    rows = _launches(runs, "flash", arch)
    fwd = [r for r in rows if r["kernel"] == "_attn_fwd_kernel"]
    bwd = [r for r in rows if r["kernel"] in ("_bwd_dkdv_kernel", "_bwd_dq_kernel")]
    assert {r["kernel"] for r in rows} == {"_attn_fwd_kernel", "_bwd_delta_kernel", "_bwd_dkdv_kernel",
                                           "_bwd_dq_kernel", "_cumsum_kernel"}
    assert {r["constexprs"]["HAS_BIAS"] for r in fwd} == {False, True}      # FoX's bias compiles too
    tiles = {(r["constexprs"]["BLOCK_M"], r["constexprs"]["BLOCK_N"], r["num_warps"], r["num_stages"])
             for r in fwd}
    bwd_tiles = {(r["kernel"], r["constexprs"]["BLOCK_M"], r["constexprs"]["BLOCK_N"], r["num_warps"],
                  r["num_stages"]) for r in bwd}

    def plan_tiles(*plans):
        return {(k, *getattr(p, part).__dict__.values()) for p in plans
                for k, part in (("_bwd_dkdv_kernel", "dkdv"), ("_bwd_dq_kernel", "dq"))}
    if arch == 90:
        kinds = {(r["constexprs"].get("BLOCK_M"), r["constexprs"].get("BLOCK_N"), r["constexprs"].get("TMA"))
                 for r in fwd if r["dtype"] == "bf16" and r["constexprs"]["DK"] == 128 and r["constexprs"]["CAUSAL"]}
        assert {(64, 64, False), (128, 128, True)} <= kinds, kinds     # the short tiling and the TMA plan
        tma = [r for r in fwd if r["constexprs"].get("TMA")]
        assert tma and all(r["tma"] and r["spill_bytes"] == 0 for r in tma), tma
        assert plan_tiles(HOPPER_BWD_SHORT, HOPPER_BWD_LONG, SMALL_BWD) == bwd_tiles, bwd_tiles
        assert all(r["wgmma"] for r in bwd if r["dtype"] == "bf16")
        # the dk/dv pass at D = 128 keeps two [BN, 128] float32 accumulators and spills a little
        # (kernels/flash/NOTES.md, "Plans"): bounded here so that a change that spills more is seen
        assert all(r["spill_bytes"] <= 1024 for r in bwd), [(r["constexprs"], r["spill_bytes"]) for r in bwd]
    elif arch in (80, 89):      # one fixed 16-bit tiling, float32 as on Hopper, nothing autotuned
        assert AMPERE in tiles and (32, 16, 8, 2) in tiles and len(tiles) == 2, tiles
        assert all(r["spill_bytes"] == 0 for r in fwd), fwd
        assert plan_tiles(AMPERE_BWD, SMALL_BWD) == bwd_tiles, bwd_tiles
        assert all(r["spill_bytes"] <= 1024 for r in bwd), [(r["constexprs"], r["spill_bytes"]) for r in bwd]
    else:                       # one tiling for every dtype and head size, no spills
        assert tiles == {TURING} and all(r["spill_bytes"] == 0 for r in fwd), fwd
        assert plan_tiles(SMALL_BWD) == bwd_tiles
        assert all(r["spill_bytes"] <= 64 for r in bwd), [(r["constexprs"], r["spill_bytes"]) for r in bwd]


@pytest.mark.parametrize("arch", ARCHS)
def test_gla_compiles(runs, arch):
    rows = _launches(runs, "gla", arch)
    names = {r["kernel"] for r in rows}
    assert {"_fwd_kernel", "_combine_kernel", "_bwd_dh_kernel", "_bwd_dv_kernel", "_bwd_dqdk_kernel",
            "_dg_kernel"} <= names, names
    preps = [r for r in rows if r["kernel"] == "_gla_prep_kernel"]
    if arch == 75:      # the vector gate takes the PyTorch path on a T4 (kernels/gla/plan.py)
        assert not preps
        assert {r["dtype"] for r in rows} == {"fp16", "fp32"}
    else:
        # the prep stage with float32 gates (split into bfloat16 pieces) and with 16-bit gates
        assert len(preps) >= 2 and all(r["wgmma" if arch == 90 else "mma_sync"] for r in preps)


@pytest.mark.parametrize("arch", ARCHS)
def test_delta_compiles(runs, arch):
    rows = _launches(runs, "delta", arch)
    names = {r["kernel"] for r in rows}
    if arch == 75:      # the delta rule takes the PyTorch path on a T4 (kernels/delta/plan.py)
        assert rows == []
        return
    assert {"_gate_cumsum_kernel", "_solve_kernel", "_wu_fwd_kernel", "_state_fwd_kernel", "_march_t_kernel",
            "_state_bwd_kernel", "_bwd_dqk_kernel", "_bwd_wy_kernel"} <= names, names
    if arch != 90:      # pipelines capped at 2 stages off Hopper
        assert max(r["num_stages"] for r in rows if r["kernel"] != "_gate_cumsum_kernel") <= 2


@pytest.mark.parametrize("arch", ARCHS)
def test_deltaformer_compiles(runs, arch):
    rows = _launches(runs, "deltaformer", arch)
    if arch == 75:      # DeltaFormer takes the PyTorch path on a T4 (kernels/deltaformer/plan.py)
        assert rows == []
        return
    names = {r["kernel"] for r in rows}
    assert {"_fold_earlier_kernel", "_pseudo_values_kernel", "_fold_later_kernel", "_adjoint_chunks_kernel",
            "_attn_fwd_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel"} <= names, names
    # the serial pass ran with its value columns split (B·H = 2) and whole (B·H = 256)
    assert {r["constexprs"]["BV"] for r in rows if r["kernel"] == "_pseudo_values_kernel"} >= {32, 128}


def test_compile_check_fails_on_too_little_shared_memory(runs):
    """The shared-memory check bites: the L4's flash plan compiled against a 32 KiB limit fails."""
    rc, rows, err = runs["small_smem"]
    bad = [r for r in rows[1:] if not r["fits"]]
    assert rc == 1 and bad and all(r["shared"] > 32768 and r["smem_limit"] == 32768 for r in bad), (rc, rows)


def test_compile_check_rejects_bfloat16_on_t4(runs):
    """bfloat16 cases on sm_75 stop at the ops' ValueError, before anything is compiled."""
    rc, rows, err = runs["bf16_on_t4"]
    assert rc == 2 and len(rows) == 1, (rc, rows, err[-2000:])
    msg = rows[0]["rejected"]
    assert "bfloat16" in msg and "8.0" in msg and "7.5" in msg, msg


@pytest.mark.parametrize("arch", ARCHS)
def test_conv_compiles(runs, arch):
    """Every stage of the short convolution compiles on every class, with no products (it has none to
    make) and no spills: a memory-bound kernel that spills pays for it in the bandwidth it is judged by."""
    rows = _launches(runs, "conv", arch)
    assert {r["kernel"] for r in rows} == CONV_KERNELS, {r["kernel"] for r in rows}
    assert not any(r["wgmma"] or r["mma_sync"] for r in rows)
    assert all(r["spill_bytes"] == 0 for r in rows), [(r["kernel"], r["spill_bytes"]) for r in rows if r["spill_bytes"]]


@pytest.mark.parametrize("arch", ARCHS)
def test_mesa_compiles(runs, arch):
    """MesaNet's stages compile where the plan runs them (sm_80 and up; a T4 takes the PyTorch path):
    gla's state march and output kernels, and the conjugate-gradient solve, whose products are on the
    tensor cores (its operands are float16 by design, NOTES.md)."""
    rows = _launches(runs, "mesa", arch)
    if arch == 75:
        assert rows == []
        return
    names = {r["kernel"] for r in rows}
    assert {"_cg_kernel", "_fwd_kernel"} <= names, names
    solve = [r for r in rows if r["kernel"] == "_cg_kernel"]
    assert all(r["wgmma" if arch == 90 else "mma_sync"] for r in solve), solve


@pytest.mark.parametrize("arch", ARCHS)
def test_path_compiles(runs, arch):
    """PaTH's stages compile where its plan runs them (sm_80 and up; a T4 takes the PyTorch path):
    the shared triangular solve, the per-block stage and its backward (two kernels), the walk and its
    backward, and the cumulative gates of PaTH-FoX; on Hopper also the windows' kernels (the plan takes
    windows only there, from T > 2048: the compile case at T = 2650); 16-bit products on the tensor cores."""
    rows = _launches(runs, "path", arch)
    if arch == 75:
        assert rows == []
        return
    names = {r["kernel"] for r in rows}
    assert {"_gate_cumsum_kernel", "_solve_kernel", "_prepare_kernel", "_path_fwd_kernel", "_path_bwd_kernel",
            "_local_bwd_matrices_kernel", "_local_bwd_columns_kernel", "_cumsum_kernel"} <= names, names
    windows = {"_window_prep_kernel", "_cross_q_kernel", "_cross_k_kernel", "_key_push_bwd_kernel",
               "_window_products_bwd_kernel"}
    assert (windows <= names) if arch == 90 else not (windows & names), names
