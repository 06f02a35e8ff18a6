"""The launch plan of the short-convolution kernels: defaults, as data (measured on the H200).

The op is memory-bound. The forward, at widths up to 4, marches: one program per segment of
``march_seg`` tokens × ``march_bd`` channels, each input row read once. The other kernels walk tiles
of ``BT`` tokens × ``BD`` channels of ``[B, T, D]`` tensors, reading the ``W - 1`` earlier rows a
tile needs a second time from the L1/L2 caches: the forward at wider widths is one program per
tile. The backward marches too at widths up to 4 (``bwd_march_seg`` tokens × ``bwd_march_bd``
channels per program, ``x`` and ``dy`` read once, ``dz`` kept on chip); at wider widths it first writes
``dz`` with programs that each walk ``bwd_steps`` consecutive tiles of one channel block, then forms
``dx`` from ``dz`` with the forward's tiles. Either way the weight and bias gradients leave one
partial sum per program, reduced by a second, deterministic kernel (no atomics).
The small kernels (final state, the initial state's gradient) take one program per (channel block,
batch). Everything stays in registers; no shared memory is asked for, so every GPU class takes the
same plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import triton

from ..backend import INTERPRET, Caps, Launch, device_caps

__all__ = ["ConvPlan", "plan_for", "MAX_WIDTH", "MIN_PROGRAMS"]

MAX_WIDTH = 8       #: the widest convolution the kernels unroll (fla's models use 2 to 4)
_POW2 = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class ConvPlan:
    """``march``: the marching forward and backward at widths up to 4 (else the tiled ones),
    ``march_seg × march_bd`` the forward's segment, ``bwd_march_seg × bwd_march_bd`` the backward's; ``fwd_bt × fwd_bd``: the tiled forward's tile and the ``dx`` pass's;
    ``bwd_bt × bwd_bd``: the backward's, ``bwd_steps`` tiles per program; ``small_bd``: channels
    per program of the state kernels; ``red_bp × red_bn``: the partial-sum reduction's tile
    (partials × columns); ``fwd_march``, ``bwd_march``, ``fwd``, ``bwd``, ``small``: launches."""
    march: bool = True
    march_seg: int = 32
    march_bd: int = 256
    bwd_march_seg: int = 512
    bwd_march_bd: int = 1024
    fwd_bt: int = 16
    fwd_bd: int = 128
    bwd_bt: int = 4
    bwd_bd: int = 128
    bwd_steps: int = 64
    small_bd: int = 128
    red_bp: int = 32
    red_bn: int = 128
    # measured on the H200 (lab/sweep.py, log not kept, HISTORY.md records it; bf16, SiLU, W = 4, D = 2048): the forward's
    # 16 x 128 tile on 2 warps, within 2 % of the fastest of 36 tilings (32 x 128 on 2 warps, which spills
    # with a bias, a residual and a state), and the split backward's 4 x 128 tiles, 64 per program, on
    # 4 warps, within 2 % of the fastest of 72 (8 x 128, which spills in float32); the lab's fused
    # backward was at best 2x slower. Other widths (not measured) take 8 warps in the tiled forward: 2 and 4 spill at W = 3.
    # the marching forward (lab/sweep_march.py, lab/logs/sweep_march.json; bf16, SiLU, W = 4, D = 2048 and
    # 4096, B·T = 65,536): 32 tokens x 256 channels on 2 warps, the best of 45 configurations over both
    # shapes, at 0.81 of the tiled forward's time and 0.84-0.86 of a copy's bandwidth
    # the marching backward (lab/sweep_march_backward.py, lab/logs/sweep_march_backward.json; same setting):
    # 512 tokens x 1024 channels on 8 warps, the best of 24 configurations at both shapes, at 0.35
    # of the two-pass backward's time and 0.70-0.72 of a copy's bandwidth by its one-pass count
    fwd_march: tuple = field(default_factory=lambda: (Launch(2, 1),))
    bwd_march: tuple = field(default_factory=lambda: (Launch(8, 1),))
    fwd: tuple = field(default_factory=lambda: (Launch(2, 1),))
    bwd: tuple = field(default_factory=lambda: (Launch(4, 1),))
    small: tuple = field(default_factory=lambda: (Launch(4, 1),))


#: the fewest programs the marching backward's grid should have: about two per SM of the H200 (132 SMs).
#: Not measured: the sweep's shapes (B · T = 65,536) fill the GPU at the default segment.
MIN_PROGRAMS = 256


def _fill_grid(plan: ConvPlan, B: int, T: int, D: int) -> ConvPlan:
    """Halve the marching backward's segment (down to 64), then its channel block (down to 256, with
    the warps halved alongside so each thread keeps four channels), while its grid is under
    :data:`MIN_PROGRAMS` programs."""
    seg, bd, launches = plan.bwd_march_seg, plan.bwd_march_bd, plan.bwd_march
    grid = lambda: B * triton.cdiv(T, seg) * triton.cdiv(D, bd)      # noqa: E731
    while grid() < MIN_PROGRAMS and seg > 64 and triton.cdiv(T, seg) < triton.cdiv(T, seg // 2):
        seg //= 2
    while grid() < MIN_PROGRAMS and bd > 256:
        bd //= 2
        launches = tuple(replace(ln, num_warps=max(1, ln.num_warps // 2)) for ln in launches)
    return replace(plan, bwd_march_seg=seg, bwd_march_bd=bd, bwd_march=launches)


def _pow2_at_most(n: int, cap: int) -> int:
    return min(cap, triton.next_power_of_2(max(1, n)))


def plan_for(dtype, device, *, B: int | None = None, T: int, D: int, W: int = 4, caps: Caps | None = None,
             interpret: bool = INTERPRET, **overrides) -> ConvPlan:
    """The plan for ``[B, T, D]`` inputs of ``dtype`` and width ``W`` on ``device`` (GPU class ``caps``, default the
    device's; every class takes the same plan). Everything after ``dtype, device`` is keyword-only, the
    order every family's ``plan_for`` shares. With ``B`` given, the marching backward's segment and
    channel block shrink (to 64 × 256 at the least) until its grid has :data:`MIN_PROGRAMS` programs. ``overrides``: field values to use instead (the tests
    and the lab's sweeps try other tiles this way); block sizes must be powers of two.

    Under the interpreter the tiles cover the whole (small) test shapes, up to 64 × 64, so that a
    test costs few interpreted programs; the tests override them to cross tile borders."""
    known = {f.name for f in fields(ConvPlan)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise ValueError(f"plan overrides: unknown field(s) {bad}; expected some of {sorted(known)}")
    for name in ("march_bd", "bwd_march_bd", "fwd_bt", "fwd_bd", "bwd_bt", "bwd_bd", "small_bd", "red_bp", "red_bn"):
        if name in overrides and overrides[name] not in _POW2:
            raise ValueError(f"plan overrides: {name} must be a power of two in {_POW2}; got {overrides[name]!r}")
    for name in ("march_seg", "bwd_march_seg"):
        if name in overrides and overrides[name] not in _POW2[2:]:
            raise ValueError(f"plan overrides: {name} must be a power of two in {_POW2[2:]} (four rows per step); "
                             f"got {overrides[name]!r}")
    if "bwd_steps" in overrides and (not isinstance(overrides["bwd_steps"], int) or overrides["bwd_steps"] < 1):
        raise ValueError(f"plan overrides: bwd_steps must be a positive int; got {overrides['bwd_steps']!r}")
    if interpret:
        bt, bd = _pow2_at_most(T, 64), _pow2_at_most(D, 64)
        plan = ConvPlan(march_seg=max(4, bt), march_bd=bd, bwd_march_seg=max(4, bt), bwd_march_bd=bd, fwd_bt=bt, fwd_bd=bd, bwd_bt=bt, bwd_bd=bd, bwd_steps=1,
                        small_bd=bd, red_bp=8, red_bn=64)
    else:
        caps = caps if caps is not None else device_caps(device)
        plan = ConvPlan() if W == 4 else ConvPlan(fwd=(Launch(8, 1),))
        # short sequences: fewer tiles per backward program, so that B · T / (bwd_bt · steps) programs
        # along time still fill the GPU
        steps = max(1, min(plan.bwd_steps, triton.cdiv(T, plan.bwd_bt)))
        plan = replace(plan, bwd_steps=steps)
        if B is not None:
            plan = _fill_grid(plan, B, T, D)
    return replace(plan, **overrides)
