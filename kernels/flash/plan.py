"""The launch plan of the flash-attention forward: measured defaults, as data.

One function, :func:`plan_for`, decides how a call is launched; the op passes its answer down and
nothing reads the environment. The numbers come from the H200 sweeps recorded in
``kernels/flash/NOTES.md`` ("Plans"; round 2 of ``HISTORY.md``, ``lab/logs/explore_flash.json``):

- causal float16/bfloat16, ``D = 128``, on Hopper: ``T <= 2048`` takes 64 x 64 tiles on 4 warps
  with 3 stages (two programs per SM overlap one's softmax with the other's products); longer ``T``
  with packed heads takes tensor-memory-accelerator (TMA) loads, 128 x 128 tiles, 8 warps, 3
  stages (TMA takes the K/V address arithmetic out of the registers);
- other 16-bit inputs with ``D >= 64`` and ``T >= 512`` on a GPU: Triton's autotuner over
  :data:`AUTOTUNE`;
- everything else (float32, small ``D``, short ``T``, the interpreter): one fixed tiling.

Other GPU classes (:data:`kernels.backend.GPU_CLASSES`; NOT measured on those GPUs, chosen to fit
and to compile without spills, checked by ``python -m kernels.compile flash --arch 75|80|89``): an
A100 or L4 (sm_80/sm_89: ``mma.sync`` tensor cores, 163 or 99 KiB of shared memory per block)
takes one fixed tiling per dtype, no TMA and no autotuning; a T4 (sm_75, 64 KiB) runs Triton's
products on CUDA cores (Triton 3.6 has no tensor-core path below sm_80, and no software pipelining
there) and takes small tiles that hold the accumulators in registers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..backend import INTERPRET, Caps, device_caps

__all__ = ["FlashPlan", "plan_for", "tma_compatible", "AUTOTUNE", "SHORT_T_MAX", "AMPERE", "TURING", "Blocks",
           "BackwardPlan", "backward_plan_for"]

#: Causal 16-bit D = 128 up to this length takes the short tiling; above it, the TMA kernel. The
#: sweep measured 1024 (short wins) and 4096 (TMA wins); the threshold sits between them.
SHORT_T_MAX = 2048

#: Autotuning candidates ``(BLOCK_M, BLOCK_N, warps, stages, HEADS_INNER)`` for 16-bit inputs with
#: D in {64, 128} and T >= 512 on a GPU. Hopper, D = 128: the q tile plus 2·BN·D·2 B of (k, v) per
#: stage fit 227 KiB of shared memory (BN = 128 with 3 stages: 32 + 192 KiB); BM = 128 on 8 warps keeps
#: the float32 accumulator at 64 registers per thread. The last one (80 KiB) was meant for GPUs with
#: about 100 KiB of shared memory; those now take :data:`AMPERE` (autotuning runs on Hopper only),
#: and it stays a candidate because Hopper's measured autotuning ran with it.
AUTOTUNE = ((128, 64, 8, 3, False), (128, 64, 8, 3, True), (128, 128, 8, 3, False),
            (128, 128, 8, 3, True), (128, 64, 8, 4, False), (64, 64, 4, 2, False))


#: sm_80/sm_89 (A100, L4), 16-bit inputs, every ``D`` and ``T``: 64 x 64 tiles on 4 warps, 2 stages
#: (compile check, bf16, sm_89: 56 KiB of shared memory at D = 128, 239 registers, no spills; 3 stages
#: would take 88 KiB, one program per SM of an L4). Float32 takes :func:`_fixed`'s tiling as on Hopper.
AMPERE = (64, 64, 4, 2)
#: sm_75 (T4), float16 and float32, every ``D``: 32 x 16 tiles on 4 warps. Triton multiplies on the
#: CUDA cores there (no tensor-core path below sm_80, stages ignored); these tiles keep every
#: accumulator in registers (compile check, sm_75, D = 128: float16 229 registers, float32 128, no
#: spills, 24/32 KiB of shared memory; 64 x 32 tiles spill at D = 128).
TURING = (32, 16, 4, 1)


@dataclass(frozen=True)
class FlashPlan:
    """How one call is launched. ``kind``: ``"tiles"`` (the fixed tiling below), ``"tma"`` (the
    same tiling with TMA loads) or ``"autotune"`` (Triton picks among :data:`AUTOTUNE`)."""
    kind: str
    block_m: int = 0
    block_n: int = 0
    num_warps: int = 4
    num_stages: int = 1
    heads_inner: bool = False


def _tma_compatible(x: torch.Tensor) -> bool:
    """Device-side TMA descriptors over ``[T, H·D]`` need packed heads and 16-byte aligned rows/base."""
    es = x.element_size()
    return (x.stride(-1) == 1 and x.stride(2) == x.shape[3] and (x.stride(1) * es) % 16 == 0
            and (x.stride(0) * es) % 16 == 0 and x.data_ptr() % 16 == 0)


def tma_compatible(*xs: torch.Tensor) -> bool:
    """Whether TMA descriptors can read every one of ``xs`` (``q, k, v``): :func:`plan_for`'s ``tma``."""
    return all(_tma_compatible(x) for x in xs)


def _fixed(T: int, D: int, dtype: torch.dtype, interpret: bool) -> FlashPlan:
    if interpret:
        # the interpreter is exact and slow: small tiles (BM = 2·BN exercises two diagonal blocks)
        return FlashPlan("tiles", 32, 16, 4, 1)
    if dtype == torch.float32:
        # IEEE float32 products run on CUDA cores; tiles that do not spill registers on sm_90
        return FlashPlan("tiles", 64, 32, 8, 2) if D <= 64 else FlashPlan("tiles", 32, 16, 8, 2)
    if D <= 32 or T <= 256:
        return FlashPlan("tiles", 64, 64, 4, 3)
    return FlashPlan("tiles", 128, 64, 8, 3)


def plan_for(dtype, device, *, B: int, T: int, H: int, K: int, V: int, causal: bool, tma: bool = False,
             caps: Caps | None = None, interpret: bool = INTERPRET) -> FlashPlan:
    """The plan for inputs of ``dtype`` (``q, k: [B, T, H, K]``, ``v: [B, T, H, V]``) on ``device`` of
    the GPU class ``caps`` (default: the device's, :func:`kernels.backend.device_caps`); everything
    after ``dtype, device`` is keyword-only, the order every family's ``plan_for`` shares. ``tma``:
    TMA descriptors can read ``q, k, v`` (:func:`tma_compatible`: packed heads, 16-byte aligned rows
    and base; the ops pass it from their tensors), without which no TMA plan is chosen.
    ``interpret`` and ``caps`` may be given to see a GPU's decision on a machine without a GPU (the
    compile check and the tests do)."""
    caps = caps if caps is not None else device_caps(device)
    half = dtype in (torch.float16, torch.bfloat16)
    if not interpret and caps.major < 9:   # other classes: one fixed tiling (not measured there)
        if caps.major < 8:
            return FlashPlan("tiles", *TURING)
        return FlashPlan("tiles", *AMPERE) if half else _fixed(T, K, dtype, False)
    # Hopper (the short and TMA plans were measured there; TMA needs sm_90)
    if not interpret and causal and half and K == 128 and V == 128:
        if T <= SHORT_T_MAX:
            return FlashPlan("tiles", 64, 64, 4, 3)
        # whole query tiles only: those lengths were measured on the H200
        if T % 128 == 0 and tma:
            return FlashPlan("tma", 128, 128, 8, 3)
    if not interpret and half and K >= 64 and T >= 512:
        return FlashPlan("autotune")
    return _fixed(T, K, dtype, interpret)


# --- the backward ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Blocks:
    """One backward kernel's launch: ``block_m`` queries by ``block_n`` keys per step."""
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class BackwardPlan:
    """The backward's three launches: ``delta_m`` rows per program of the ``δ = do·o`` pass; the
    dk/dv pass (a key block per program, ``block_n`` a multiple of ``block_m``) and the dq pass (a
    query block per program, ``block_m`` a multiple of ``block_n``)."""
    dkdv: Blocks
    dq: Blocks
    delta_m: int = 64


#: Hopper, 16-bit inputs, the measured defaults (NOTES.md, "Plans"; ``lab/logs/sweep_backward.json``,
#: with and without the bias). The dq pass: 128 queries by 64 keys on 8 warps, 3 stages. The dk/dv
#: pass keeps two ``[BN, D]`` float32 accumulators: up to ``T = SHORT_T_MAX`` 64 x 64 tiles on 4 warps
#: (128 registers a thread for them at ``D = 128``), above it 128 keys a program on 8 warps, 3 stages
#: (fewer programs, each streaming more queries past its keys).
HOPPER_BWD_SHORT = BackwardPlan(dkdv=Blocks(64, 64, 4, 2), dq=Blocks(128, 64, 8, 3))
HOPPER_BWD_LONG = BackwardPlan(dkdv=Blocks(64, 128, 8, 3), dq=Blocks(128, 64, 8, 3))
#: sm_80/sm_89 (A100, L4): 64 x 64 tiles on 4 warps, 2 stages, for both passes (not measured there;
#: chosen to fit their shared memory, compile-checked by ``python -m kernels.compile flash``).
AMPERE_BWD = BackwardPlan(dkdv=Blocks(64, 64, 4, 2), dq=Blocks(64, 64, 4, 2))
#: sm_75 and float32 (CUDA-core products, no pipelining there): small tiles that do not spill.
SMALL_BWD = BackwardPlan(dkdv=Blocks(16, 16, 8, 1), dq=Blocks(16, 16, 8, 1), delta_m=32)


def backward_plan_for(dtype, device, *, B: int, T: int, H: int, K: int, V: int, caps: Caps | None = None,
                      interpret: bool = INTERPRET) -> BackwardPlan:
    """The backward's launch for inputs of ``dtype`` and these shapes on ``device`` of the GPU class
    ``caps`` (as :func:`plan_for`, in its order; of the shapes only ``T`` decides today)."""
    caps = caps if caps is not None else device_caps(device)
    if interpret or caps.major < 8 or dtype == torch.float32:
        return SMALL_BWD
    if caps.major < 9:
        return AMPERE_BWD
    return HOPPER_BWD_SHORT if T <= SHORT_T_MAX else HOPPER_BWD_LONG
