"""The launch plan of the (gated) delta-rule kernels: measured defaults, as data.

:func:`plan_for` chooses every tile size, warp count and pipeline depth of one call; the stages
receive the plan and read nothing else. A field holding several :class:`~kernels.backend.Launch`
entries is a first-fit list (:func:`kernels.backend.launch`): the measured default first, then
fall-backs for GPUs or dtypes that need less shared memory. The sweeps behind every number are in
``kernels/delta/NOTES.md`` ("Plan"; the H200 rounds 3-8 in ``HISTORY.md``); :func:`plan_for`
accepts overrides (``plan_for(..., fwd_bv=32)``), which is how the tests and the lab's sweeps try
other values.

Other GPU classes (:data:`kernels.backend.GPU_CLASSES`), NOT measured on those GPUs: chosen to fit
the class's shared memory, checked by ``python -m kernels.compile delta --arch 75|80|89`` (resources
in ``kernels/delta/NOTES.md``, "Other GPUs"). An A100 or L4 (sm_80/sm_89, one plan for both, sized
for the L4's 99 KiB) keeps Hopper's tiles with the sequential kernels' pipelines capped at 2 stages
(3 stages of the V-block-16 march and of the V-block-64 backward march need 135 and 113 KiB), and
float32 at K = 128 computes the per-chunk gradients with batched PyTorch (``grads = "torch"``: the
WY backward's float32 ``[64, K]`` tiles need 112 KiB there; Hopper reaches the same path when that
kernel raises ``OutOfResources``). A T4
(sm_75) takes ``path = "torch"``: with Triton's products on the CUDA cores there (no tensor-core path
below sm_80) the per-chunk kernels hold several ``[64, K]`` and ``[64, 64]`` operands at once and spill
20-140 KB per thread, and the WY backward needs 80 KiB of shared memory at K = 128; the op runs the
differentiable PyTorch implementation on that device instead.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from ..backend import INTERPRET, Caps, Launch, device_caps, num_sms
from ..common.solve import CHUNK  # chunk length C (four 16-row blocks: the shared solve is written for it)

__all__ = ["DeltaPlan", "plan_for", "CHUNK", "HEAD_SIZES"]

HEAD_SIZES = (16, 32, 64, 128)


@dataclass(frozen=True)
class DeltaPlan:
    """Launches of one call. ``solve``: ``T = (I + A)^{-1}`` per chunk (``solve_kc`` key columns per
    step of the Gram products); ``wu``: ``W``, ``U`` and the scores (``wu_bk`` columns per product);
    ``fwd``: the training march (V-block ``fwd_bv``); ``march``: the inference march in T form (V-block
    ``march_bv``; ``march_scores_stored``: it reads the scores from ``march_scores`` instead of forming
    them; ``march_ranges``: chunk ranges whose per-chunk kernels overlap the march on a side stream;
    ``march_even``: no row masks when ``T`` is a multiple of 64); ``bwd``: the reverse march;
    ``dqk``, ``dwy``: the per-chunk backward kernels. ``t_form``: the inference forward in T form (else
    the training forward without saving states)."""
    solve: tuple
    solve_kc: int
    wu_bk: int
    wu: tuple
    fwd_bv: int
    fwd: tuple
    march_bv: int
    march: tuple
    march_scores_stored: bool
    march_scores_bk: int
    march_scores: tuple
    march_ranges: int
    march_even: bool
    bwd_bv: int
    bwd: tuple
    dqk_bk: int
    dqk_bv: int
    dqk: tuple
    dwy_bv: int
    dwy: tuple
    t_form: bool = True
    path: str = "triton"            # "torch": the class cannot run these kernels (the PyTorch implementation)
    grads: str = "triton"           # "torch": the per-chunk gradients by batched PyTorch (chunk_grads_torch)


def _bv(BH: int, V: int) -> int:
    """V-block of the sequential kernels: the largest of 64, 32 that still gives at least 128
    programs (about one per SM of an H100/H200), else 16 (round-4 sweeps: 64 at B·H = 512 and 128,
    32 at B·H = 32, 16 at B·H = 16, for the forward and the backward alike)."""
    for bv in (64, 32):
        if bv <= V and BH * (V // bv) >= 128:
            return bv
    return min(V, 16)


def _seq(dtype, K: int, BV: int, warps: int, stages: int) -> tuple:
    """A sequential kernel: ``warps``/``stages`` for 16-bit inputs, then fall-backs with one stage;
    float32 (IEEE products, twice the registers) keeps round 1's one stage."""
    nw = 8 if K * BV >= 2048 else 4
    first = (Launch(warps, stages),) if dtype != torch.float32 else ()
    return first + (Launch(nw, 1), Launch(8, 1))


def _par(K: int, V: int, warps: int = 0) -> tuple:
    """A kernel parallel over chunks (one stage: no loop worth pipelining)."""
    nw = warps or (4 if max(K, V) <= 64 else 8)
    return (Launch(nw, 1), Launch(8, 1))


def plan_for(dtype, device, *, B: int, T: int, H: int, K: int, V: int, caps: Caps | None = None,
             interpret: bool = INTERPRET, **overrides) -> DeltaPlan:
    """The plan for inputs of ``dtype`` (``q, k: [B, T, H, K]``, ``v: [B, T, H, V]``) on ``device`` of
    the GPU class ``caps`` (default: ``device``'s, :func:`kernels.backend.device_caps`); everything
    after ``dtype, device`` is keyword-only, the order every family's ``plan_for`` shares.
    ``interpret`` is taken for that shared order and changes nothing: the interpreter runs the same
    plan. ``overrides``: field values to use instead of the measured ones; the launch lists that
    depend on an overridden size follow it."""
    caps = caps if caps is not None else device_caps(device)
    known = {f.name for f in fields(DeltaPlan)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise ValueError(f"plan overrides: unknown field(s) {bad}; expected some of {sorted(known)}")
    for name in ("solve_kc", "wu_bk", "fwd_bv", "march_bv", "march_scores_bk", "bwd_bv", "dqk_bk", "dqk_bv", "dwy_bv"):
        if name in overrides:
            lim = K if name in ("solve_kc", "dqk_bk") else min(K, V) if name in ("wu_bk", "march_scores_bk") else V
            if overrides[name] not in HEAD_SIZES or overrides[name] > lim:
                raise ValueError(f"plan overrides: {name} must be one of {HEAD_SIZES} and at most {lim}; "
                                 f"got {overrides[name]}")
    if overrides.get("march_ranges", 1) < 1:
        raise ValueError(f"plan overrides: march_ranges must be >= 1; got {overrides['march_ranges']}")
    o = overrides.get
    # A100/L4: Hopper's choices with at most 2 pipeline stages in the sequential kernels (their
    # pipelined [64, K] tiles need more than the L4's 99 KiB at 3); not measured there
    smax = 2 if caps.major == 8 else 3
    BH = B * H
    half = dtype != torch.float32
    device = torch.device(device)
    fwd_bv, march_bv, bwd_bv = o("fwd_bv", _bv(BH, V)), o("march_bv", _bv(BH, V)), o("bwd_bv", _bv(BH, V))
    # the inference march: V-block 64 forms the scores itself (two programs per head, 2 stages, two
    # programs per SM fit); narrower blocks read them stored and pipeline 3 stages (round 5). When it
    # is a single partial wave (small batch × heads), two chunk ranges, the second's per-chunk
    # kernels on a side stream (round 7f/g: 0.95-0.96x the time of one range; 4 no better)
    ranges = o("march_ranges", 2 if (device.type == "cuda" and BH * (V // march_bv) <= num_sms(device)) else 1)
    wu_bk = o("wu_bk", min(K, V))
    # the scores of a segmented march in 64-column blocks on 4 warps, so that their programs fit
    # beside the march's on its SMs (round 7f/g)
    scores_bk = o("march_scores_bk", min(K, V, 64) if ranges > 1 else wu_bk)
    dqk_bk = o("dqk_bk", min(K, 64))
    plan = DeltaPlan(
        # one warp for 16-bit inputs: the 16x16 tiles of the solve are replicated across warps, so
        # more warps only add reduction traffic (round 3: 0.40 vs 0.95 ms); float32 needs 4
        solve=_par(K, K, 1 if half else 4), solve_kc=o("solve_kc", K),
        # whole head-size column blocks on 8 warps at head size 128 (round 4b: 0.90x of 64 on 4)
        wu_bk=wu_bk, wu=_par(K, V, 8 if wu_bk >= 128 else 4),
        # 4 warps; one stage with V-blocks of 64 (the pipelined loads' shared memory would leave one
        # program per SM), else 3 (round 4)
        fwd_bv=fwd_bv, fwd=_seq(dtype, K, fwd_bv, 4, min(1 if fwd_bv >= 64 else 3, smax)),
        march_bv=march_bv,
        march=_seq(dtype, K, march_bv, 8 if K * march_bv >= 128 * 128 else 4, min(2 if march_bv >= 64 else 3, smax)),
        march_scores_stored=V // march_bv > 2, march_scores_bk=scores_bk,
        march_scores=_par(K, V, 8 if scores_bk >= 128 else 4), march_ranges=ranges, march_even=True,
        bwd_bv=bwd_bv, bwd=_seq(dtype, K, bwd_bv, 4, smax),
        # 4 warps for 16-bit inputs (round 3: 0.84x and 0.90x the time at 8 warps)
        dqk_bk=dqk_bk, dqk_bv=min(V, 64), dqk=_par(dqk_bk, V, 4 if half else 0),
        dwy_bv=min(V, 64), dwy=_par(K, V, 4 if half else 0),
        # T4: the PyTorch implementation (module docstring)
        path="torch" if caps.major < 8 else "triton",
        grads="torch" if (caps.major == 8 and not half and K >= 128) else "triton")
    return replace(plan, **overrides) if overrides else plan
