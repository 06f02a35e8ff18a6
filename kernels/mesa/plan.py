"""The launch plan of the MesaNet kernels: defaults, as data (the solve's launch timed on the H200).

:func:`plan_for` is the only place where the family's launch choices are made; every stage receives
the plan. Three stages share it (``kernels/mesa/NOTES.md``):

* the states of ``H`` entering every chunk are the gla family's chunked gated sums, planned by
  :func:`kernels.gla.plan.plan_for` (``states``: its plan for the ``K x K`` problem, with the
  per-chunk states kept in float32, which the solve reads);
* the conjugate-gradient solve (``kernels/mesa/solve.py``): one program per (chunk, batch·head),
  64 tokens (gla's chunk, :data:`CHUNK`), the whole ``K`` at once; 8 warps at ``K = 128`` (its
  ``[64, 128]`` float32 iterates ``x``, ``r``, ``p``, ``Hp`` need 4 x 64 registers per thread on 4
  warps, over the 255 a thread has) and 4 below;
* the outputs ``o = G_t^T x_t`` are gla's ``chunk_simple_gla`` with its own plan.

The solve's warps and stages were first chosen by the compile check (fewest spills) and then timed
(``lab/plan_sweep.py``, ``lab/logs/plan_sweep.json``; ``NOTES.md``): at K = 128, 4 warps are about
1 % faster than 8 and 16 warps twice as slow; stages change nothing (the CG loop loads nothing).
The default stays at 8, the plan every GPU test and the benchmark of record ran.

``operand``: the dtype of the solve's matrix-product operands and of the tensors handed to the gla
stages. float16 for 16-bit inputs (bfloat16 keys and values convert to it exactly in its range, and
it keeps 3 more mantissa bits than bfloat16; fla, too, casts q and k to float16); float32 (IEEE
products) for float32 inputs. Below sm_80 the plan's ``path`` is ``"torch"`` (the PyTorch
implementation): the family has not been compiled or timed there.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..backend import INTERPRET, Caps, device_caps
from ..gla.plan import SMALL_HEAD, GlaPlan, plan_for as gla_plan_for

__all__ = ["MesaPlan", "plan_for", "CHUNK", "KEY_SIZES"]

CHUNK = 64                      #: tokens per chunk: the gla family's chunk (its per-chunk states)
KEY_SIZES = (16, 32, 64, 128)   #: K the solve kernel tiles (the whole K x K state on chip)


@dataclass(frozen=True)
class MesaPlan:
    """``BT`` chunk; ``warps_cg``/``stages_cg`` the solve's launch; ``operand`` its product dtype;
    ``IP`` ``tl.dot`` precision of float32 operands; ``EMU`` 16-bit roundings emulated under the
    interpreter; ``states`` gla's plan of the ``H`` states; ``path`` ``"torch"`` where the class
    cannot run these kernels."""
    BT: int
    warps_cg: int
    stages_cg: int
    operand: torch.dtype
    IP: str
    EMU: bool
    states: GlaPlan
    path: str = "triton"


def plan_for(dtype, device, *, B: int, T: int, H: int, K: int, num_segments: int | None = None,
             caps: Caps | None = None, interpret: bool = INTERPRET, **overrides) -> MesaPlan:
    """The plan for inputs of ``dtype`` ``[B, T, H, K]`` on ``device`` of the GPU class ``caps``
    (default: the device's); everything after ``dtype, device`` is keyword-only, the order every
    family's ``plan_for`` shares. ``num_segments`` forces gla's sequence split of the states' march;
    ``overrides`` replace fields (``warps_cg``, ``stages_cg``: tests and the lab's sweeps)."""
    caps = caps if caps is not None else device_caps(device)
    # float16 products for 16-bit inputs, but float32 for heads narrower than gla's SMALL_HEAD (the
    # tensor-core path returned wrong gradients at K = 32 on the H200: kernels/gla/NOTES.md)
    operand = torch.float32 if dtype == torch.float32 or K < SMALL_HEAD else torch.float16
    states = gla_plan_for(operand, device, gate=1, B=B, T=T, H=H, K=K, V=K, num_segments=num_segments,
                          caps=caps, interpret=interpret, state_dtype=torch.float32)
    plan = MesaPlan(BT=CHUNK, warps_cg=8 if K >= 128 else 4, stages_cg=1, operand=operand,
                    IP="ieee" if operand == torch.float32 else "tf32", EMU=bool(interpret), states=states,
                    path="triton" if (caps.major >= 8 or interpret) else "torch")
    assert states.BT == CHUNK, "the solve reads gla's per-chunk states: one chunk size for both"
    tunable = {"warps_cg", "stages_cg"}
    bad = sorted(set(overrides) - tunable)
    if bad:
        raise ValueError(f"plan overrides: unknown or derived field(s) {bad}; tunable: {sorted(tunable)}")
    return replace(plan, **overrides) if overrides else plan

