"""The launch plan of the chunkwise (gated) linear-attention kernels: measured defaults, as data.

:func:`plan_for` is the only place where tile sizes, warps, stages and the sequence split are
chosen; every stage receives the plan. The numbers and the sweeps behind them are in
``kernels/gla/NOTES.md`` (H200, bf16, K = V = 128): 64-token chunks everywhere; the forward march
holds ``S[K, BV]`` with ``BV = 64`` (32 at ``K = 256``), 8 warps at ``K·BV >= 64·128`` for the
ungated and scalar-gated march, 4 warps and 2 stages for the vector gate's lean march (round 3); the
vector gate's prep kernel takes the whole ``K = 128`` on 8 warps for 16-bit inputs (round 4); the
sequence is split into segments when the march would not fill one wave of the GPU.

Other GPU classes (:data:`kernels.backend.GPU_CLASSES`), NOT measured on those GPUs: chosen to fit
the class's shared memory, checked by ``python -m kernels.compile gla --arch 75|80|89`` (resources
in ``kernels/gla/NOTES.md``, "Other GPUs"). An A100 or L4 (sm_80/sm_89, one plan for both, sized for
the L4's 99 KiB) keeps Hopper's tiles for 16-bit inputs except the vector gate's prep kernel (32
columns on 4 warps: 6-9 KB of spills on sm_80 and sm_89, against 14-57 KB for Hopper's whole K
on 8 warps and for 64 columns) and the dv kernel's V-block at K = 256 (32: 64 needs 104 KiB); float32 (IEEE products on the CUDA cores, twice the bytes) takes
:func:`_fma_tiles`, one pipeline stage. A T4 (sm_75, 64 KiB) multiplies on the CUDA cores for every
dtype (Triton 3.6 has no tensor-core path below sm_80) and takes :func:`_fma_tiles` where the chunk's
``[64, K]`` q and k tiles fit (``K`` x element size <= 256 bytes: float16 up to K = 128, float32 up to
64); elsewhere, and for the vector gate (the prep kernel's unrolled levels need over 500 KB of
spilled registers per thread there, beyond CUDA's 512 KiB of local memory), the plan's ``path`` is
``"torch"``: the op runs the differentiable PyTorch implementation on that device.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
import triton

from ..backend import INTERPRET, Caps, device_caps, num_sms

__all__ = ["GlaPlan", "plan_for", "gate_code"]


@dataclass(frozen=True)
class GlaPlan:
    """Tiles and launches of one call (``BT`` chunk, ``NT`` chunks, ``SEG`` chunks per segment, ``NS``
    segments; ``*_f`` the forward march, ``*_s`` the state-only marches, ``*_p`` the vector gate's
    prep kernel, ``BV_dv`` / ``BK_dq``, ``BV_dq`` the parallel backward kernels)."""
    gate: int                 # 0 none, 1 scalar [B, T, H], 2 vector [B, T, H, K]
    BT: int
    NT: int
    SEG: int
    NS: int
    BV_f: int
    warps_f: int
    stages_f: int
    BK_s: int
    BV_s: int
    warps_s: int              # the state-only marches (segment contributions, chunk states, dh)
    stages_s: int
    BV_dv: int
    warps_dv: int
    BK_dq: int
    BV_dq: int
    warps_dq: int
    BK_p: int
    warps_p: int
    gate_pieces: int          # bfloat16 pieces of a float32 gate in the prep kernel's sums (prep.py)
    IP: str                   # tl.dot input precision: "ieee" for float32 inputs, else tensor cores
    EMU: bool                 # under the interpreter: 16-bit operand roundings emulated in float32
    state_dtype: torch.dtype  # per-chunk states kept for the backward
    path: str = "triton"      # "torch": the class cannot run these kernels (the PyTorch implementation)
    upcast: bool = False      # 16-bit heads narrower than 64: run the float32 kernels (NOTES, "small heads")


#: 16-bit inputs with K or V below this run the float32 kernels: on the H200 the tensor-core kernels at
#: K = 32 returned wrong gradients (and one launch an illegal address), see HISTORY.md, "Small heads"
SMALL_HEAD = 64


def gate_code(g) -> int:
    if g is None:
        return 0
    return 1 if g.dim() == 3 else 2


def _fma_tiles(K: int, V: int) -> dict:
    """Tiles for products on the CUDA cores (float32 off Hopper; everything on a T4): narrow blocks,
    8 warps for the wide ones, one stage (compile check, sm_75, float16, K = V = 128: the state-only
    marches 164-202 registers without spills, dq/dk 600-1300 bytes of spills; the forward march and
    dv, whose ``[64, K] x [K, 64]`` scores no tiling of V shrinks, spill 12-15 KB per thread, the
    least among the tilings tried; the vector gate's float32 prep kernel, 32 columns on 8 warps,
    spills 32 KB on sm_89, the least of 16-128 columns on 4-8 warps, as Hopper's spills 66 KB)."""
    w = 8 if K >= 64 else 4
    return dict(BV_f=min(V, 32), warps_f=w, stages_f=1, BK_s=min(K, 32), BV_s=min(V, 16), warps_s=4, stages_s=1,
                BV_dv=min(V, 32), warps_dv=w, BK_dq=min(K, 32), BV_dq=min(V, 32), warps_dq=w, BK_p=min(K, 32),
                warps_p=w)


def _other_class(caps: Caps, gate: int, K: int, V: int, dtype, hopper: dict):
    """``(tiles, path)`` for a class other than Hopper (module docstring; not measured there)."""
    if caps.major >= 8:      # A100, L4: one plan, sized for the L4's 99 KiB
        if dtype == torch.float32:
            return _fma_tiles(K, V), "triton"
        return dict(hopper, BK_p=min(K, 32), warps_p=4, BV_dv=min(V, 32) if K >= 256 else hopper["BV_dv"]), "triton"
    # T4: CUDA-core products; the [64, K] q and k tiles must leave room in 64 KiB
    itemsize = torch.empty((), dtype=dtype).element_size()
    path = "torch" if gate == 2 or K * itemsize > 256 else "triton"
    # stages_f = 2: compiled for sm_75 the forward march is the same kernel as with one stage (same
    # shared memory, registers and spills: no pipelining below sm_80); forced on the H200 (sm_90) one
    # stage stopped with an illegal memory access at float16, K = V = 128 and two ran right
    # (lab/t4_fault.py, lab/logs/t4_fault_h200_20261129.log)
    return dict(_fma_tiles(K, V), stages_f=2), path


def plan_for(dtype, device, *, gate: int, B: int, T: int, H: int, K: int, V: int, num_segments: int | None = None,
             caps: Caps | None = None, interpret: bool = INTERPRET, **overrides) -> GlaPlan:
    """The plan for inputs of ``dtype`` (``q, k: [B, T, H, K]``, ``v: [B, T, H, V]``, the gate
    :func:`gate_code` ``gate``) on ``device`` of the GPU class ``caps`` (default: ``device``'s,
    :func:`kernels.backend.device_caps`); everything after ``dtype, device`` is keyword-only, the
    order every family's ``plan_for`` shares. ``num_segments`` forces the forward's sequence split,
    ``overrides`` replace measured fields (tests and the lab's sweeps)."""
    caps = caps if caps is not None else device_caps(device)
    BT = 64
    NT = triton.cdiv(T, BT)
    BV_f = min(V, 64 if K <= 128 else 32)
    warps_f = 4 if K * BV_f <= 64 * 64 else 8
    # 3 stages, but 2 at K = 256 (3 stages of q, k, g and the scores need more than the 227 KB of
    # shared memory of an H100/H200 for the vector gate)
    stages_f = 2 if K >= 256 else 3
    if gate == 2:   # the lean march after the prep kernel (round 3)
        warps_f, stages_f = 4, 2
    # prep kernel: the whole K = 128 in one step on 8 warps for 16-bit inputs (round-3 sweep: about
    # 0.8x the time of 64 columns on 4 warps); elsewhere unmeasured
    wide = K == 128 and dtype != torch.float32
    tiles = dict(BV_f=BV_f, warps_f=warps_f, stages_f=stages_f, BK_s=min(K, 64), BV_s=min(V, 64), warps_s=4,
                 stages_s=3, BV_dv=min(V, 64), warps_dv=4 if K <= 64 else 8, BK_dq=min(K, 64), BV_dq=min(V, 64),
                 warps_dq=8 if min(K, 64) >= 64 else 4, BK_p=128 if wide else min(K, 64), warps_p=8 if wide else 4)
    path = "triton"
    if caps.major < 9:      # other classes (module docstring): not measured there
        tiles, path = _other_class(caps, gate, K, V, dtype, tiles)
    if num_segments is None:
        # split the sequence only when the marches would not fill one wave of the GPU (the forward
        # programs run one per SM); then aim at about two waves, with segments of >= 4 chunks.
        # Each split costs one extra read of k, v (and g).
        sms = num_sms(device)
        ns, progs = 1, B * H * (V // tiles["BV_f"])
        if progs < sms and NT >= 8:
            ns = min((2 * sms) // progs, NT // 4)
        num_segments = max(1, ns)
    num_segments = max(1, min(int(num_segments), NT))
    SEG = triton.cdiv(NT, num_segments)
    plan = GlaPlan(gate=gate, BT=BT, NT=NT, SEG=SEG, NS=triton.cdiv(NT, SEG), **tiles,
                   gate_pieces={torch.bfloat16: 1, torch.float16: 2}.get(dtype, 3),
                   IP="ieee" if dtype == torch.float32 else "tf32", EMU=bool(interpret),
                   state_dtype=torch.float32 if dtype == torch.float32 else dtype, path=path,
                   upcast=dtype != torch.float32 and min(K, V) < SMALL_HEAD)
    tunable = {f.name for f in fields(GlaPlan)} - {"gate", "NT", "SEG", "NS"}
    bad = sorted(set(overrides) - tunable)
    if bad:
        raise ValueError(f"plan overrides: unknown or derived field(s) {bad}")
    return replace(plan, **overrides) if overrides else plan
