"""The launch plan of the short-convolution kernels: defaults, as data (measured on the H200).

The op is memory-bound. The forward, at widths up to 4, marches: one program per segment of
``march_seg`` tokens × ``march_bd`` channels, each input row read once. The other kernels walk tiles
of ``BT`` tokens × ``BD`` channels of ``[B, T, D]`` tensors, reading the ``W - 1`` earlier rows a
tile needs a second time from the L1/L2 caches: the forward at wider widths is one program per
tile; the backward first writes ``dz`` with
programs that each walk ``bwd_steps`` consecutive tiles of one channel block, so that the weight and
bias gradients they accumulate in registers leave one partial sum per ``bwd_bt · bwd_steps`` tokens
(reduced by a second, deterministic kernel, no atomics), then forms ``dx`` from ``dz`` with the
forward's tiles (``lab/fused_backward.py`` recomputes ``dz`` instead of storing it: slower).
The small kernels (final state, the initial state's gradient) take one program per (channel block,
batch). Everything stays in registers; no shared memory is asked for, so every GPU class takes the
same plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import triton

from ..backend import INTERPRET, Caps, Launch, device_caps

__all__ = ["ConvPlan", "plan_for", "MAX_WIDTH"]

MAX_WIDTH = 8       #: the widest convolution the kernels unroll (fla's models use 2 to 4)
_POW2 = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class ConvPlan:
    """``march``: the marching forward at widths up to 4 (else the tiled one), ``march_seg ×
    march_bd`` its segment; ``fwd_bt × fwd_bd``: the tiled forward's tile and the ``dx`` pass's;
    ``bwd_bt × bwd_bd``: the backward's, ``bwd_steps`` tiles per program; ``small_bd``: channels
    per program of the state kernels; ``red_bp × red_bn``: the partial-sum reduction's tile
    (partials × columns); ``fwd_march``, ``fwd``, ``bwd``, ``small``: launches."""
    march: bool = True
    march_seg: int = 32
    march_bd: int = 256
    fwd_bt: int = 16
    fwd_bd: int = 128
    bwd_bt: int = 4
    bwd_bd: int = 128
    bwd_steps: int = 64
    small_bd: int = 128
    red_bp: int = 32
    red_bn: int = 128
    # measured on the H200 (lab/sweep.py, log not kept, NOTES.md records it; bf16, SiLU, W = 4, D = 2048): the forward's
    # 16 x 128 tile on 2 warps, within 2 % of the fastest of 36 tilings (32 x 128 on 2 warps, which spills
    # with a bias, a residual and a state), and the split backward's 4 x 128 tiles, 64 per program, on
    # 4 warps, within 2 % of the fastest of 72 (8 x 128, which spills in float32); the lab's fused
    # backward was at best 2x slower. Other widths (not measured) take 8 warps in the tiled forward: 2 and 4 spill at W = 3.
    # the marching forward (lab/sweep_march.py, lab/logs/sweep_march.json; bf16, SiLU, W = 4, D = 2048 and
    # 4096, B·T = 65,536): 32 tokens x 256 channels on 2 warps, the best of 45 configurations over both
    # shapes, at 0.81 of the tiled forward's time and 0.84-0.86 of a copy's bandwidth
    fwd_march: tuple = field(default_factory=lambda: (Launch(2, 1),))
    fwd: tuple = field(default_factory=lambda: (Launch(2, 1),))
    bwd: tuple = field(default_factory=lambda: (Launch(4, 1),))
    small: tuple = field(default_factory=lambda: (Launch(4, 1),))


def _pow2_at_most(n: int, cap: int) -> int:
    return min(cap, triton.next_power_of_2(max(1, n)))


def plan_for(dtype, device, *, T: int, D: int, W: int = 4, interpret: bool = INTERPRET, caps: Caps | None = None,
             **overrides) -> ConvPlan:
    """The plan for ``[B, T, D]`` inputs of ``dtype`` and width ``W`` on ``device`` (GPU class ``caps``, default the
    device's; every class takes the same plan). ``overrides``: field values to use instead (the tests
    and the lab's sweeps try other tiles this way); block sizes must be powers of two.

    Under the interpreter the tiles cover the whole (small) test shapes, up to 64 × 64, so that a
    test costs few interpreted programs; the tests override them to cross tile borders."""
    known = {f.name for f in fields(ConvPlan)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise ValueError(f"plan overrides: unknown field(s) {bad}; expected some of {sorted(known)}")
    for name in ("march_bd", "fwd_bt", "fwd_bd", "bwd_bt", "bwd_bd", "small_bd", "red_bp", "red_bn"):
        if name in overrides and overrides[name] not in _POW2:
            raise ValueError(f"plan overrides: {name} must be a power of two in {_POW2}; got {overrides[name]!r}")
    if "march_seg" in overrides and overrides["march_seg"] not in _POW2[2:]:
        raise ValueError(f"plan overrides: march_seg must be a power of two in {_POW2[2:]} (four rows per step); "
                         f"got {overrides['march_seg']!r}")
    if "bwd_steps" in overrides and (not isinstance(overrides["bwd_steps"], int) or overrides["bwd_steps"] < 1):
        raise ValueError(f"plan overrides: bwd_steps must be a positive int; got {overrides['bwd_steps']!r}")
    if interpret:
        bt, bd = _pow2_at_most(T, 64), _pow2_at_most(D, 64)
        plan = ConvPlan(march_seg=max(4, bt), march_bd=bd, fwd_bt=bt, fwd_bd=bd, bwd_bt=bt, bwd_bd=bd, bwd_steps=1,
                        small_bd=bd, red_bp=8, red_bn=64)
    else:
        caps = caps if caps is not None else device_caps(device)
        plan = ConvPlan() if W == 4 else ConvPlan(fwd=(Launch(8, 1),))
        # short sequences: fewer tiles per backward program, so that B · T / (bwd_bt · steps) programs
        # along time still fill the GPU
        steps = max(1, min(plan.bwd_steps, triton.cdiv(T, plan.bwd_bt)))
        plan = replace(plan, bwd_steps=steps)
    return replace(plan, **overrides)
