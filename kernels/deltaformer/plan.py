"""The launch plan of the DeltaFormer kernels: measured defaults, as data.

The pseudo-values ``u`` are sequential in chunks of 64 tokens: chunk ``c`` needs the ``u`` of every
earlier chunk. The stage therefore walks the sequence in *spans* of ``span`` tokens. Inside a span
one program per (batch, head, block of value columns) solves its chunks one after another; the
contribution of all the earlier spans to a span's rows is folded in before that, by a launch with
one program per (row block, batch, head), fully parallel. A long span means few launches and much
serial work; a short one the reverse. The backward walks the same spans in reverse.

Measured on the H200 (``NOTES.md``, "Plan"; rounds 1 and 2 of ``HISTORY.md``;
``lab/logs/sweep_plan_round1.json``, ``lab/logs/sweep_fold_round2.json``), bf16, H = 16, D = 128:

- the span: 256 to 1024 tokens were the best measured at every benchmark shape (the whole sequence
  as one serial pass was 1.1x slower at B·H = 512 and 8x slower at B·H = 16). :func:`plan_for`
  takes the span that gives the parallel fold two programs per SM, down to a power of two, within
  [256, 1024];
- the forward fold: 64 x 64 tiles on 4 warps, 3 stages; the backward fold: 128 x 64 tiles on 8 warps,
  3 stages (each the best or within 2 % of it at all three shapes);
- the serial pass: 4 warps (8 were 1.2-1.9x slower), 2 stages; its value columns split in 4 blocks
  when there are fewer (batch, head) pairs than SMs (round 3, ``lab/logs/sweep_split_round3.json``: at
  B·H = 16 the forward stage took 0.85x and the adjoint 0.85x the time of one block; at B·H = 128
  and 512 a split only added work).

The flash-attention launches (the last stage, and the gradient of the key-key softmax) take the
flash family's own plans.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..backend import INTERPRET, Caps, device_caps, num_sms

__all__ = ["Tiles", "DeltaFormerPlan", "plan_for", "CHUNK"]

CHUNK = 64      #: tokens per triangular solve (the delta family's 16×16-block inverse of a 64×64 system)


@dataclass(frozen=True)
class Tiles:
    """A parallel fold's launch: rows per program, keys per block, warps, pipeline stages."""
    m: int
    n: int
    warps: int
    stages: int


@dataclass(frozen=True)
class DeltaFormerPlan:
    """``span``: tokens per sequential step (a multiple of :data:`CHUNK`); ``fold`` / ``later``: the
    forward's and the backward's parallel folds; ``chunk_n``, ``chunk_warps``, ``chunk_stages``:
    keys per block, warps and stages of the serial pass; ``chunk_split``: its blocks of value
    columns."""
    span: int
    fold: Tiles = field(default_factory=lambda: Tiles(64, 64, 4, 3))
    later: Tiles = field(default_factory=lambda: Tiles(128, 64, 8, 3))
    chunk_n: int = 64
    chunk_warps: int = 4
    chunk_stages: int = 2
    chunk_split: int = 1
    path: str = "triton"            # "torch": the class cannot run these kernels (the PyTorch implementation)


#: the interpreter: short spans and small tiles, so that the CPU tests run the parallel folds, the
#: serial pass and a split of the value columns
INTERPRETER_PLAN = dict(fold=Tiles(64, 32, 4, 1), later=Tiles(64, 32, 4, 1), chunk_n=32, chunk_split=2)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def plan_for(dtype, device, *, B: int, T: int, H: int, sms: int | None = None, caps: Caps | None = None,
             interpret: bool = INTERPRET) -> DeltaFormerPlan:
    """The plan for ``B·H`` sequences of ``T`` tokens of ``dtype`` on ``device`` of the GPU class ``caps``
    (default the device's; ``interpret`` and ``sms``, the multiprocessor count, may be given to see a
    GPU's decision without one). Everything after ``dtype, device`` is keyword-only, the order every
    family's ``plan_for`` shares; ``dtype`` is taken for that order and changes nothing (every dtype
    the op accepts takes the same plan). Hopper takes the measured tiles. An A100 or L4 (sm_80/sm_89, NOT
    measured there) takes 64 x 64 folds on 4 warps with 2 stages: the Hopper backward fold needs
    145 KiB of shared memory, more than an L4 block may use (``python -m kernels.compile
    deltaformer --arch 89``). A T4 (sm_75) takes the PyTorch implementation: with Triton's products
    on CUDA cores there, the serial pass spills tens of KiB and the folds exceed its 64 KiB."""
    whole = _round_up(max(T, 1), CHUNK)
    if interpret:
        return DeltaFormerPlan(span=min(2 * CHUNK, whole), **INTERPRETER_PLAN)
    caps = caps if caps is not None else device_caps(device)
    if caps.major < 8:
        return DeltaFormerPlan(span=whole, path="torch")
    small = {} if caps.major >= 9 else dict(fold=Tiles(64, 64, 4, 2), later=Tiles(64, 64, 4, 2))
    sms = sms if sms is not None else num_sms(device)
    BH = B * H
    need = CHUNK * -(-2 * sms // BH)
    span = min(max(1 << (need.bit_length() - 1), 256), 1024)
    split = 1 if BH >= sms else 4
    return DeltaFormerPlan(span=min(span, whole), chunk_split=split, **small)
