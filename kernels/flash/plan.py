"""The launch plan of the flash-attention forward: measured defaults, as data.

One function, :func:`plan_for`, decides how a call is launched; the op passes its answer down and
nothing reads the environment. The numbers come from the H200 sweeps recorded in
``kernels/flash/NOTES.md`` (round 2, ``lab/explore_flash.json``):

- causal float16/bfloat16, ``D = 128``, on Hopper: ``T <= 2048`` takes 64 x 64 tiles on 4 warps
  with 3 stages (two programs per SM overlap one's softmax with the other's products); longer ``T``
  with packed heads takes tensor-memory-accelerator (TMA) loads, 128 x 128 tiles, 8 warps, 3
  stages (TMA takes the K/V address arithmetic out of the registers);
- other 16-bit inputs with ``D >= 64`` and ``T >= 512`` on a GPU: Triton's autotuner over
  :data:`AUTOTUNE`;
- everything else (float32, small ``D``, short ``T``, the interpreter): one fixed tiling.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..backend import INTERPRET

__all__ = ["FlashPlan", "plan_for", "AUTOTUNE", "SHORT_T_MAX"]

#: Causal 16-bit D = 128 up to this length takes the short tiling; above it, the TMA kernel. The
#: sweep measured 1024 (short wins) and 4096 (TMA wins); the threshold sits between them.
SHORT_T_MAX = 2048

#: Autotuning candidates ``(BLOCK_M, BLOCK_N, warps, stages, HEADS_INNER)`` for 16-bit inputs with
#: D in {64, 128} and T >= 512 on a GPU. Hopper, D = 128: the q tile plus 2·BN·D·2 B of (k, v) per
#: stage fit 227 KiB of shared memory (BN = 128 with 3 stages: 32 + 192 KiB); BM = 128 on 8 warps keeps
#: the float32 accumulator at 64 registers per thread. The last one (80 KiB) is for GPUs with about
#: 100 KiB of shared memory (a Colab L4).
AUTOTUNE = ((128, 64, 8, 3, False), (128, 64, 8, 3, True), (128, 128, 8, 3, False),
            (128, 128, 8, 3, True), (128, 64, 8, 4, False), (64, 64, 4, 2, False))


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


def plan_for(q, k, v, causal: bool, *, interpret: bool = INTERPRET, hopper: bool | None = None) -> FlashPlan:
    """The plan for these inputs. ``interpret`` and ``hopper`` may be given to see the GPU decision
    on a machine without a GPU (the compile check and the tests do)."""
    B, T, H, D = q.shape
    if hopper is None:   # the short and TMA plans were measured on Hopper (TMA needs sm_90)
        hopper = (not interpret and q.is_cuda and torch.cuda.get_device_capability(q.device)[0] >= 9)
    if not interpret and hopper and causal and q.dtype in (torch.float16, torch.bfloat16) and D == 128:
        if T <= SHORT_T_MAX:
            return FlashPlan("tiles", 64, 64, 4, 3)
        # whole query tiles only: those lengths were measured on the H200
        if T % 128 == 0 and all(_tma_compatible(x) for x in (q, k, v)):
            return FlashPlan("tma", 128, 128, 8, 3)
    if not interpret and q.dtype in (torch.float16, torch.bfloat16) and D >= 64 and T >= 512:
        return FlashPlan("autotune")
    return _fixed(T, D, q.dtype, interpret)
