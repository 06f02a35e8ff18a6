"""Chapter 10 (MesaNet): how the chunked conjugate-gradient form cuts its work.

``draw_mesanet_chunks`` shows the three passes of :func:`lattn_core.mesanet_cg` (and of fla's
``chunk_mesa_net``): the gated sums ``H`` and ``G`` at every chunk boundary, carried chunk after
chunk; then every chunk's conjugate-gradient steps, in parallel, each reading only its own boundary
``H`` and its own keys; then the output read with the solved queries and the boundary ``G``.
"""
from __future__ import annotations

from .base import PALETTE, arrow, box, canvas, label

__all__ = ["draw_mesanet_chunks"]


def draw_mesanet_chunks(n_chunks: int = 4):
    """``n_chunks`` chunks of tokens from left to right. Top: the boundary states (sequential over
    chunks). Middle: each chunk's ``m`` conjugate-gradient steps, with the iterate, residual and
    direction of every token kept on chip (parallel over chunks). Bottom: the outputs.

    Defined in Chapter 10 (MesaNet)."""
    fig, ax = canvas(6.4, 4.0, xlim=(0, 12.8), ylim=(0, 8.0))
    w, gap = 2.8, 0.4
    xs = [0.3 + c * (w + gap) for c in range(n_chunks)]
    y_state, y_cg, y_out = 6.1, 2.75, 0.3
    hs, hc, ho = 1.0, 1.75, 1.0
    for c, x in enumerate(xs):
        box(ax, x, y_state, w, hs, f"H, G at the start\nof chunk {c + 1}", color=PALETTE["state"],
            alpha=0.25, fontsize=7)
        box(ax, x, y_cg, w, hc, f"chunk {c + 1}: m steps of\nconjugate gradients,\n"
            "iterates on chip", color=PALETTE["key"], alpha=0.25, fontsize=7)
        box(ax, x, y_out, w, ho, r"read with $\hat{q}_t$:" + "\nboundary G + chunk",
            color=PALETTE["value"], alpha=0.25, fontsize=7)
        arrow(ax, (x + w / 2, y_state), (x + w / 2, y_cg + hc))
        arrow(ax, (x + w / 2, y_cg), (x + w / 2, y_out + ho))
    for a, b in zip(xs[:-1], xs[1:]):
        arrow(ax, (a + w, y_state + hs / 2), (b, y_state + hs / 2))
    label(ax, 6.4, y_state + hs + 0.4, "1. one pass over the chunks: the gated sums "
          "(Chapter 3), sequential", fontsize=7.5, color="#444444")
    label(ax, 6.4, (y_state + y_cg + hc) / 2, "2. every chunk at once, from its boundary H: "
          "each step is a gated read with p as queries", fontsize=7, color="#444444",
          bbox=dict(facecolor="white", edgecolor="none", pad=1.0))
    label(ax, 6.4, (y_cg + y_out + ho) / 2, "3. the outputs, from the boundary G and the "
          r"solved queries $\hat{q}_t$", fontsize=7, color="#444444",
          bbox=dict(facecolor="white", edgecolor="none", pad=1.0))
    return fig
