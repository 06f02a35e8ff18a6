"""The launch plan of the chunkwise (gated) linear-attention kernels: measured defaults, as data.

:func:`plan_for` is the only place where tile sizes, warps, stages and the sequence split are
chosen; every stage receives the plan. The numbers and the sweeps behind them are in
``kernels/gla/NOTES.md`` (H200, bf16, K = V = 128): 64-token chunks everywhere; the forward march
holds ``S[K, BV]`` with ``BV = 64`` (32 at ``K = 256``), 8 warps at ``K·BV >= 64·128`` for the
ungated and scalar-gated march, 4 warps and 2 stages for the vector gate's lean march (round 3); the
vector gate's prep kernel takes the whole ``K = 128`` on 8 warps for 16-bit inputs (round 4); the
sequence is split into segments when the march would not fill one wave of the GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
import triton

from ..backend import INTERPRET, num_sms

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
    BV_dv: int
    BK_dq: int
    BV_dq: int
    warps_dq: int
    BK_p: int
    warps_p: int
    gate_pieces: int          # bfloat16 pieces of a float32 gate in the prep kernel's sums (prep.py)
    IP: str                   # tl.dot input precision: "ieee" for float32 inputs, else tensor cores
    EMU: bool                 # under the interpreter: 16-bit operand roundings emulated in float32
    state_dtype: torch.dtype  # per-chunk states kept for the backward


def gate_code(g) -> int:
    if g is None:
        return 0
    return 1 if g.dim() == 3 else 2


def plan_for(gate: int, B: int, T: int, H: int, K: int, V: int, dtype, device, *, num_segments=None,
             interpret: bool = INTERPRET, **overrides) -> GlaPlan:
    """The plan for one call; ``num_segments`` forces the forward's sequence split, ``overrides``
    replace measured fields (tests and the lab's sweeps)."""
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
    if num_segments is None:
        # split the sequence only when the marches would not fill one wave of the GPU (the forward
        # programs run one per SM); then aim at about two waves, with segments of >= 4 chunks.
        # Each split costs one extra read of k, v (and g).
        sms = num_sms(device)
        ns, progs = 1, B * H * (V // BV_f)
        if progs < sms and NT >= 8:
            ns = min((2 * sms) // progs, NT // 4)
        num_segments = max(1, ns)
    num_segments = max(1, min(int(num_segments), NT))
    SEG = triton.cdiv(NT, num_segments)
    plan = GlaPlan(gate=gate, BT=BT, NT=NT, SEG=SEG, NS=triton.cdiv(NT, SEG), BV_f=BV_f, warps_f=warps_f,
                   stages_f=stages_f, BK_s=min(K, 64), BV_s=min(V, 64), BV_dv=min(V, 64), BK_dq=min(K, 64),
                   BV_dq=min(V, 64), warps_dq=8 if min(K, 64) >= 64 else 4, BK_p=128 if wide else min(K, 64), warps_p=8 if wide else 4,
                   gate_pieces={torch.bfloat16: 1, torch.float16: 2}.get(dtype, 3),
                   IP="ieee" if dtype == torch.float32 else "tf32", EMU=bool(interpret),
                   state_dtype=torch.float32 if dtype == torch.float32 else dtype)
    tunable = {f.name for f in fields(GlaPlan)} - {"gate", "NT", "SEG", "NS"}
    bad = sorted(set(overrides) - tunable)
    if bad:
        raise ValueError(f"plan overrides: unknown or derived field(s) {bad}")
    return replace(plan, **overrides) if overrides else plan
