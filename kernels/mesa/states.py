"""Stage 1: the states ``H_c`` entering every chunk, by the gla family's chunked gated sums.

``H_t = e^{g_t} H_{t-1} + beta_t k_t k_t^T`` is gla's scalar-gated state ``S_t = e^{g_t} S_{t-1} +
key_t value_t^T`` with the keys ``beta_t k_t`` and the values ``k_t`` (a ``K x K`` state). So the
march, the segment split and its combine are gla's (:mod:`kernels.gla.march`), launched here with
what the solve needs: every chunk's entering state in float32 and, on request, the final state.
"""
from __future__ import annotations

import torch

from ..gla.march import _fwd_kernel, chunk_states, segment_entering_states

__all__ = ["h_states", "h_states_again"]


def h_states(kb, kk, g, h0, plan, output_final_state: bool):
    """``(hs, inits, ht)``: ``hs`` ``[B·H, NT, K, K]`` float32, the state of ``H`` entering every
    chunk; ``inits`` the state entering every segment of gla's split (``h0`` without a split), which
    :func:`h_states_again` starts from; ``ht`` ``[B, H, K, K]`` float32 or ``None``.

    ``kb`` = ``beta · k`` and ``kk`` = ``k`` in the plan's operand dtype; ``g`` ``[B, T, H]``;
    ``h0`` ``None`` or float32 ``[B, H, K, K]``; ``plan`` the gla plan of the ``K x K`` problem."""
    B, T, H, K = kk.shape
    BH, dev, f32 = B * H, kk.device, torch.float32
    dummy = torch.empty(1, dtype=f32, device=dev)
    if plan.NS > 1:       # gla's split: every segment's own sum, a sequential combine, then the chunks
        inits, ht = segment_entering_states(kb, kb, kk, g, h0, 1.0, plan, output_final_state)
        return h_states_again(kb, kk, g, inits, plan)[0], inits, ht
    # one segment: the chunk states and the final state in one march
    hs = torch.empty(BH, plan.NT, K, K, dtype=f32, device=dev)
    ht = torch.empty(B, H, K, K, dtype=f32, device=dev) if output_final_state else None
    _fwd_kernel[((K // plan.BK_s) * (K // plan.BV_s), BH)](
        kb, kb, kk, g, dummy, h0 if h0 is not None else dummy, ht if ht is not None else dummy, dummy, hs,
        dummy, 1.0, T, plan.NT, plan.SEG, 1, H=H, K=K, V=K, BT=plan.BT, BK=plan.BK_s, BV=plan.BV_s, GATE=1,
        HAS_H0=h0 is not None, COMPUTE_O=False, STORE_FINAL=ht is not None, STORE_DEC=False, STORE_H=True,
        IP=plan.IP, EMU=plan.EMU, num_warps=plan.warps_s, num_stages=plan.stages_s)
    return hs, h0, ht


def h_states_again(kb, kk, g, inits, plan):
    """``(hs, dec)``: the chunk states of :func:`h_states` recomputed from its ``inits`` (the
    backward's; gla's :func:`~kernels.gla.march.chunk_states`, parallel over segments), and the
    segments' log decays that gla's reverse combine reads."""
    assert plan.state_dtype == torch.float32, "the solve reads float32 chunk states"
    return chunk_states(kb, kb, kk, g, inits, 1.0, plan)
