"""Chapter 1's schematic: the causal mask cut into FlashAttention's tiles.

Which tiles exist comes from :func:`lattn_core.causal_mask` and which are visited from
:func:`lattn_core.causal_block_mask` (nothing is typed by hand); one row of query blocks is
highlighted, with the online-softmax state carried from key block to key block along it.
"""
from __future__ import annotations

import numpy as np

from ..masks import causal_mask
from ..softmax import causal_block_mask
from .base import PALETTE, arrow, box, canvas, label, matrix

__all__ = ["draw_flash_tiling"]


def draw_flash_tiling(n: int = 16, chunk_size: int = 4, row_block: int = 2):
    """Left: the ``n x n`` causal mask ``M`` (white above the diagonal). Right: the same matrix cut
    into ``C x C`` tiles (``C = chunk_size``); visited tiles shaded, skipped ones hatched, and query
    block ``row_block`` walking its key blocks left to right with the state ``(m, Y, z)``.

    Defined in Chapter 1 (The quadratic cost)."""
    visits = causal_block_mask(n, chunk_size)
    nb = visits.shape[0]
    if not 0 <= row_block < nb:
        raise ValueError(f"row_block must be in [0, {nb}); got {row_block}")
    fig, ax = canvas(6.4, 3.6, xlim=(0, 10.6), ylim=(-0.9, 5.4))
    cell = 4.0 / n
    m = causal_mask(n).astype(float)
    m[m == 0] = np.nan

    # left: the mask
    matrix(ax, m, x=0.2, y=0.4, cell=cell, cmap="Greys", vmin=0, vmax=1.6)
    label(ax, 2.2, 4.85, "causal mask $M$", fontsize=9)
    label(ax, 2.2, 0.05, "key position j", fontsize=8)
    label(ax, -0.05, 2.4, "query i", fontsize=8, rotation=90)

    # right: tiles of C x C
    x0, y0 = 5.6, 0.4
    tile = chunk_size * cell
    for r in range(nb):
        for c in range(nb):
            h = min(chunk_size, n - r * chunk_size) * cell
            w = min(chunk_size, n - c * chunk_size) * cell
            x, y = x0 + c * tile, y0 + 4.0 - r * tile - h
            if visits[r, c]:
                diag = r == c
                box(ax, x, y, w, h, "" , fontsize=6,
                    color=PALETTE["highlight"] if r == row_block else PALETTE["query"],
                    alpha=0.35 if diag else 0.2)
                if diag:                       # the causal mask applies inside these tiles only
                    label(ax, x + w / 2, y + 0.18 * h, "masked", fontsize=6)
            else:
                from matplotlib.patches import Rectangle
                ax.add_patch(Rectangle((x, y), w, h, facecolor="white", edgecolor="#bbbbbb",
                                       hatch="///", lw=0.5))
    label(ax, x0 + 2.0, 4.85, f"tiles of C = {chunk_size}: "
          f"{int(visits.sum())} of {visits.size} visited", fontsize=9)
    label(ax, x0 + 2.0, 0.05, "key block c'", fontsize=8)
    label(ax, x0 - 0.25, 2.4, "query block c", fontsize=8, rotation=90)
    yc = y0 + 4.0 - row_block * tile - tile / 2
    for c in range(row_block):
        arrow(ax, (x0 + (c + 0.55) * tile, yc), (x0 + (c + 1.25) * tile, yc),
              color=PALETTE["highlight"], lw=1.4)
    state = r"$(\mathbf{m}, \mathbf{Y}, \mathbf{z})$"
    label(ax, x0 + 4.15, yc, f"state\n{state}\nstays on chip", ha="left", fontsize=8,
          color=PALETTE["highlight"])
    label(ax, x0 + 2.0, -0.55, "hatched: above the diagonal, never computed", fontsize=7)
    return fig
