"""The launch plan of the PaTH kernels: measured defaults, as data.

Blocks are 64 tokens (:data:`CHUNK`, the delta family's solve is written for it), for the queries
and the keys alike. The forward pass is one program per (query block, batch·head); the backward's
main pass is *persistent*: ``slots`` programs walk the (query block, batch·head) pairs longest
first, and each owns a slot of scratch where its first sweep leaves the carried queries for its
second (``NOTES.md``). Products that carry queries over whole blocks run in the *transport* dtype:
float16 for 16-bit inputs (three more mantissa bits than bfloat16, as fla does), float32 otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..backend import INTERPRET, Caps, Launch, device_caps, num_sms

__all__ = ["PathPlan", "plan_for", "CHUNK"]

CHUNK = 64      #: tokens per block (the delta family's 16×16-block inverse of a 64×64 system)


@dataclass(frozen=True)
class _SolvePlan:
    """What :func:`kernels.common.solve.solve_chunks` reads from a plan."""
    solve: tuple
    solve_kc: int


@dataclass(frozen=True)
class PathPlan:
    """``transport``: dtype of the carried queries and of ``K̂, U, W``; ``precision``: the passes'
    ``tl.dot`` precision; ``local_precision``: the per-block stage's; ``fwd``, ``bwd``, ``local``
    (the per-block preparation), ``local_bwd`` (its backward): launches; ``slots_per_sm``:
    persistent backward programs per SM; ``rows``: query rows per program of the passes (64, or
    128: two 64-blocks, half the tile reads and atomics per query);
    ``local_kb``: the per-block backward's key-column block (``None``: ``min(K, 64)``);
    ``window_blocks``: blocks per window of the forward and backward (0: none; ``windows.py``), a
    multiple of ``rows // 64``; ``forward_windows``: the forward across the windows too (``False``: it
    walks every block, and the backward prepares the windows itself; untimed, for
    ``lab/windows_sweep.py``); ``local_scratch``: bytes of the per-block backward's matrices per
    launch (heads beyond it go in further launches); ``cross``: the launch of the two cross-window
    passes (``windows.py``; the main pass's, the fastest of round 4's sweep: ``NOTES.md``, "Open");
    ``cross_keys``: keys per program of the key-major cross-window pass (64, or ``rows``);
    ``cross_queries``: the query rows it streams past them a step (64, or ``rows``; ``None``: ``rows``);
    ``cross_carry``: the key pass carries its key block across each window (``K̃ = K̄ Φᵀ``, four
    products a pair) instead of carrying the queries (``X = Q^a Φ``, five); ``path``: ``"torch"`` where the class cannot run these kernels."""
    transport: torch.dtype
    precision: str
    local_precision: str
    fwd: tuple = field(default_factory=lambda: (Launch(4, 2), Launch(4, 1)))
    bwd: tuple = field(default_factory=lambda: (Launch(8, 1), Launch(4, 1)))
    local: tuple = field(default_factory=lambda: (Launch(8, 1), Launch(4, 1)))
    local_bwd: tuple = field(default_factory=lambda: (Launch(8, 1), Launch(4, 1)))
    slots_per_sm: int = 2
    rows: int = 64
    local_kb: int | None = None
    window_blocks: int = 0
    forward_windows: bool = True
    local_scratch: int = 1 << 31
    cross: tuple = field(default_factory=lambda: (Launch(8, 1), Launch(4, 1)))
    cross_keys: int = 64
    cross_queries: int | None = None
    cross_carry: bool = False
    path: str = "triton"

    def solve_plan(self, K: int, w_dtype) -> _SolvePlan:
        """The common floor's solve (``kernels/common/solve.py``) on ``w``: one warp for 16-bit
        ``w``, four for float32 (the delta family's measured choice)."""
        warps = 1 if w_dtype != torch.float32 else 4
        return _SolvePlan(solve=(Launch(warps, 1), Launch(4, 1)), solve_kc=K)


HOPPER_SMEM = 227 * 1024     #: the class every default was measured on (kernels.backend.GPU_CLASSES)


def default_window_blocks(T: int | None, rows: int) -> int:
    """Blocks of 64 rows per window on Hopper with 16-bit inputs, from the sequence length ``T``:
    none up to 32 blocks (T ≤ 2048: the windowed forward took longer there, and forward + backward
    gained little), else the largest power of two (a multiple of ``rows // 64``) not above
    ``sqrt(T / 64)``: the best of 4, 8 and 16 at T = 2048, 8192 and 32768 in ``lab/windows_sweep.py``
    (``lab/logs/windows_sweep_h200.json``)."""
    if T is None:
        return 0
    nt = -(-T // 64)
    if nt <= 32:
        return 0
    wb = 1 << (int(nt ** 0.5).bit_length() - 1)
    return max(wb, rows // 64)


def plan_for(dtype, device, *, K: int | None = None, T: int | None = None, rows: int | None = None,
             window_blocks: int | None = None, caps: Caps | None = None, interpret: bool = INTERPRET) -> PathPlan:
    """The plan for inputs of ``dtype`` and head size ``K`` on ``device`` of the GPU class ``caps``
    (default: the device's); everything after ``dtype, device`` is keyword-only, the order every
    family's ``plan_for`` shares. ``rows``: query rows per program of the passes (default 128, which takes
    8 warps in the forward: at 4 its two ``[128, K]`` float32 accumulators spill, compile check).

    At ``K = 16`` with 16-bit inputs the default is 64 rows and the per-block stage takes IEEE
    products, as float32 inputs do. With 128 rows and float16 transport at ``K = 16`` the
    backward's gradients came back NaN (IEEE per-block products, on 4 or 8 warps) or the per-block
    backward stopped with an illegal memory access (TF32 products), on the H200 (Triton 3.6). With
    64 rows, or with float32 transport, every gradient was within fla's tolerances
    (``lab/k16_diag.py``, ``lab/logs/k16_diag_h200.log``, ``NOTES.md``)."""
    half = dtype != torch.float32
    small_half = half and K == 16
    rows_asked = rows is not None
    rows = (64 if small_half else 128) if rows is None else rows
    if rows not in (64, 128):
        raise ValueError(f"rows must be 64 or 128; got {rows!r}")
    if window_blocks is not None and not (isinstance(window_blocks, int) and window_blocks >= 0
                                         and window_blocks % (rows // 64) == 0):
        raise ValueError(f"window_blocks must be 0 (no windows) or a positive multiple of rows // 64 = "
                         f"{rows // 64}; got {window_blocks!r}")
    transport = torch.float16 if half else torch.float32
    prec = "ieee" if (not half or interpret) else "tf32"
    local_prec = "ieee" if (interpret or not half) else "tf32"
    if interpret:
        return PathPlan(transport, prec, local_prec, rows=rows, window_blocks=window_blocks or 0)
    caps = caps if caps is not None else device_caps(device)
    if caps.major < 8:
        return PathPlan(transport, prec, local_prec, path="torch")
    local_kb = None
    if caps.smem < HOPPER_SMEM:
        # the compile check (tests/kernels/test_compile.py) against the classes' shared memory: on an
        # L4 (99 KiB) the backward's 128-row tiles need 112 KiB (float16, K = 128) to 144 KiB
        # (float32, K = 64), so 64 rows unless asked; on an L4 and an A100 (163 KiB) the per-block
        # backward's float32 column blocks of 64 need 176 KiB, so blocks of 32 on an A100; on an L4
        # it needs 112 KiB or more whatever the block (its 64 x 64 float32 matrices), so float32
        # inputs take the PyTorch path there
        small = caps.smem < 128 * 1024
        if small and not half:
            return PathPlan(transport, prec, local_prec, path="torch")
        if small and not rows_asked:
            rows = 64
        if transport == torch.float32:
            # on an A100 at K = 128 the float32 tiles do not fit either: the forward's first launch
            # needs 176 KiB, the backward's 208 KiB (sm_80 compile, lab/f32_compile.py,
            # lab/logs/a100_f32_k128_compile_cpu.log; its kernels took over 5 minutes to compile, and
            # forced on the H200 the test did not finish in 300 s), so K above 64 takes PyTorch
            if (K or 128) > 64:
                return PathPlan(transport, prec, local_prec, path="torch")
            local_kb = 32
    fwd = (Launch(8, 2), Launch(8, 1)) if rows == 128 else (Launch(4, 2), Launch(4, 1))
    if small_half:
        local_prec = "ieee"
    # the per-block backward on Hopper with 16-bit inputs: 4 warps, 0.85 of 8 warps' time at B = 32,
    # T = 2048 and B = 1, T = 32768, the same gradients bit for bit (lab/bwd_sweep.py,
    # lab/logs/bwd_sweep_h200.json); 16 warps take 2.6x; key-column blocks of 32 are slower
    hopper_half = half and caps.smem >= HOPPER_SMEM
    local_bwd = (Launch(4, 1), Launch(8, 1)) if hopper_half else (Launch(8, 1), Launch(4, 1))
    # windows of blocks (windows.py) only where they were timed: Hopper, 16-bit inputs (the cross-window
    # key-major pass needs 144 KiB of shared memory at K = 128, over an L4's)
    if window_blocks is None:
        window_blocks = default_window_blocks(T, rows) if hopper_half else 0
    return PathPlan(transport, prec, local_prec, fwd=fwd, rows=rows, local_kb=local_kb, local_bwd=local_bwd,
                    window_blocks=window_blocks)


def backward_slots(plan: PathPlan, device, work: int) -> int:
    """Persistent programs of the backward's main pass: ``slots_per_sm`` per SM, at most ``work``."""
    sms = 4 if INTERPRET else num_sms(device)
    return max(1, min(work, plan.slots_per_sm * sms))
