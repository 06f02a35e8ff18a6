"""Stage 1: the states ``H_c`` entering every chunk, by the gla family's chunked gated sums.

``H_t = e^{g_t} H_{t-1} + beta_t k_t k_t^T`` is gla's scalar-gated state ``S_t = e^{g_t} S_{t-1} +
key_t value_t^T`` with the keys ``beta_t k_t`` and the values ``k_t`` (a ``K x K`` state). So the
march, the segment split and its combine are gla's (:mod:`kernels.gla.march`), launched here with
what the solve needs: every chunk's entering state in float32 and, on request, the final state.
"""
from __future__ import annotations

import torch

from ..gla.march import chunk_states, chunk_states_and_final, segment_entering_states

__all__ = ["h_states", "h_states_again"]


def h_states(kb, kk, g, h0, plan, output_final_state: bool):
    """``(hs, inits, ht)``: ``hs`` ``[B·H, NT, K, K]`` float32, the state of ``H`` entering every
    chunk; ``inits`` the state entering every segment of gla's split (``h0`` without a split), which
    :func:`h_states_again` starts from; ``ht`` ``[B, H, K, K]`` float32 or ``None``.

    ``kb`` = ``beta · k`` and ``kk`` = ``k`` in the plan's operand dtype; ``g`` ``[B, T, H]``;
    ``h0`` ``None`` or float32 ``[B, H, K, K]``; ``plan`` the gla plan of the ``K x K`` problem."""
    assert plan.gate == 1, "H's gate is a scalar per token"
    if plan.NS > 1:       # gla's split: every segment's own sum, a sequential combine, then the chunks
        inits, ht = segment_entering_states(kb, kb, kk, g, h0, 1.0, plan, output_final_state)
        return h_states_again(kb, kk, g, inits, plan)[0], inits, ht
    # one segment: the chunk states and the final state in one march
    hs, ht = chunk_states_and_final(kb, kb, kk, g, h0, 1.0, plan, output_final_state)
    return hs, h0, ht


def h_states_again(kb, kk, g, inits, plan):
    """``(hs, dec)``: the chunk states of :func:`h_states` recomputed from its ``inits`` (the
    backward's; gla's :func:`~kernels.gla.march.chunk_states`, parallel over segments), and the
    segments' log decays that gla's reverse combine reads."""
    assert plan.state_dtype == torch.float32, "the solve reads float32 chunk states"
    return chunk_states(kb, kb, kk, g, inits, 1.0, plan)
