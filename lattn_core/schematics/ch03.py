"""Chapter 3's schematics: the chunkwise march of the gated kernels, and the levels into which the
GLA kernel sorts the pairs of a chunk.

The decay mask comes from :func:`lattn_core.decay_mask` and the levels from
:func:`lattn_core.chunk_pair_levels`; nothing is typed by hand.
"""
from __future__ import annotations

import numpy as np

from ..forget_gates import chunk_pair_levels, decay_mask
from .base import PALETTE, arrow, box, canvas, label, matrix

__all__ = ["draw_chunk_march", "draw_pair_levels"]


def draw_chunk_march(n: int = 16, chunk_size: int = 4, gamma: float = 0.85):
    """Left: the decay mask ``Γ`` of ``n`` tokens (constant gate ``gamma``) cut into chunks of
    ``chunk_size``; the diagonal blocks are the chunks' score blocks ``P_[c]``, the blocks left of them
    reach the queries through the state. Right: the march, one box per chunk at the height of its
    rows, the state ``S`` handed from chunk to chunk.

    Defined in Chapter 3 (Forget gates)."""
    if n % chunk_size:
        raise ValueError(f"n must be a multiple of chunk_size; got n = {n}, chunk_size = {chunk_size}")
    from matplotlib.patches import Rectangle

    nc = n // chunk_size
    fig, ax = canvas(6.4, 3.7, xlim=(-0.3, 10.6), ylim=(-1.0, 5.3))
    side, x0, y0 = 4.0, 0.3, 0.4
    cell = side / n
    tile = chunk_size * cell
    mask = decay_mask(np.full(n, gamma))
    mask[mask == 0] = np.nan
    matrix(ax, mask, x=x0, y=y0, cell=cell, cmap="Blues", vmin=0, vmax=1.8, blocks=chunk_size,
           block_color=PALETTE["mask"])
    for c in range(nc):                      # the diagonal blocks: within the chunk
        x, y = x0 + c * tile, y0 + side - (c + 1) * tile
        ax.add_patch(Rectangle((x, y), tile, tile, fill=False, edgecolor=PALETTE["highlight"], lw=1.8))
        label(ax, x + 0.3 * tile, y + 0.28 * tile, rf"$\mathbf{{P}}_{{[{c + 1}]}}$", fontsize=8,
              color=PALETTE["highlight"], bbox=dict(fc="white", ec="none", pad=0.5, alpha=0.85))
    if nc > 1:                               # one block left of the diagonal: through the state
        label(ax, x0 + tile / 2, y0 + side - 1.5 * tile, r"via $\mathbf{S}$", fontsize=7,
              color=PALETTE["state"], bbox=dict(fc="white", ec="none", pad=0.5, alpha=0.85))
    label(ax, x0 + side / 2, y0 + side + 0.35, rf"mask $\Gamma$ in chunks of C = {chunk_size}",
          fontsize=9)
    label(ax, x0 + side / 2, y0 - 0.3, "key position j", fontsize=8)
    label(ax, x0 - 0.2, y0 + side / 2, "query position i", fontsize=8, rotation=90)

    bx, bw = 5.8, 2.3                        # the march: one box per chunk, at its rows
    for c in range(nc):
        yc = y0 + side - (c + 0.5) * tile
        box(ax, bx, yc - 0.3 * tile, bw, 0.6 * tile, f"chunk {c + 1}", fontsize=8,
            color=PALETTE["light"])
        arrow(ax, (bx + bw, yc), (bx + bw + 0.8, yc), color=PALETTE["value"])
        label(ax, bx + bw + 0.9, yc, rf"$\mathbf{{O}}_{{[{c + 1}]}}$", fontsize=8, ha="left")
        if c + 1 < nc:
            arrow(ax, (bx + bw / 2, yc - 0.3 * tile), (bx + bw / 2, yc - 0.7 * tile),
                  color=PALETTE["state"], lw=1.6)
            label(ax, bx + bw / 2 + 0.15, yc - 0.5 * tile, r"$\mathbf{S}$", fontsize=8, ha="left",
                  color=PALETTE["state"])
    label(ax, bx + bw / 2, y0 + side + 0.35, "the march (one program)", fontsize=9)
    label(ax, bx + bw / 2, y0 - 0.3, r"$\mathbf{S}$ stays on chip", fontsize=8,
          color=PALETTE["state"])
    label(ax, 5.15, -0.75, r"red: $\mathbf{P}_{[c]}$, within a chunk; the rest of a chunk's rows"
          r" is read from $\mathbf{S}$", fontsize=7)
    return fig


def draw_pair_levels(chunk_size: int = 16, pair=(13, 9)):
    """The pairs ``i > j`` of a chunk coloured by their level (:func:`lattn_core.chunk_pair_levels`),
    with one pair, its block of ``2h`` rows and its reference row ``rho`` marked.

    Defined in Chapter 3 (Forget gates)."""
    from matplotlib.patches import Rectangle

    levels = chunk_pair_levels(chunk_size).astype(float)
    i, j = pair
    if not 0 <= j < i < chunk_size:
        raise ValueError(f"pair must satisfy 0 <= j < i < chunk_size; got {pair}")
    lv = int(levels[i, j])
    h = 2 ** (lv - 1)
    start = (i // (2 * h)) * 2 * h
    rho = start + h - 1
    shown = np.where(levels > 0, levels, np.nan)
    fig, ax = canvas(6.4, 3.5, xlim=(-0.4, 10.6), ylim=(-0.6, 5.2))
    side, x0, y0 = 4.2, 0.3, 0.3
    cell = side / chunk_size
    top = y0 + side
    matrix(ax, shown, x=x0, y=y0, cell=cell, cmap="viridis", vmin=1, vmax=levels.max(), text=True)
    for r in range(chunk_size):              # the diagonal (exponent 0, no level)
        ax.add_patch(Rectangle((x0 + r * cell, top - (r + 1) * cell), cell, cell,
                               facecolor=PALETTE["light"], edgecolor="#cccccc", lw=0.4))
    # the pair's block of 2h rows: i in its second half, j in its first
    ax.add_patch(Rectangle((x0 + start * cell, top - (start + 2 * h) * cell), 2 * h * cell,
                           2 * h * cell, fill=False, edgecolor=PALETTE["key"], lw=1.4, ls="--"))
    ax.add_patch(Rectangle((x0 + j * cell, top - (i + 1) * cell), cell, cell, fill=False,
                           edgecolor=PALETTE["highlight"], lw=2.0))
    ax.add_patch(Rectangle((x0, top - (rho + 1) * cell), (rho + 1) * cell, cell, fill=False,
                           edgecolor=PALETTE["state"], lw=1.6))
    label(ax, x0 + side / 2, top + 0.35, f"levels of the pairs, C = {chunk_size}", fontsize=9)
    label(ax, x0 + side / 2, y0 - 0.3, "key row j", fontsize=8)
    label(ax, x0 - 0.25, y0 + side / 2, "query row i", fontsize=8, rotation=90)

    tx = 5.1
    n_lv = int(levels.max())
    lines = [
        (f"pair (i, j) = ({i}, {j}), red: level l = {lv}", PALETTE["highlight"]),
        (f"dashed: its block of 2h = {2 * h} rows (h = {h})", PALETTE["key"]),
        (rf"purple: reference row $\rho$ = {rho}, j $\leq \rho <$ i", PALETTE["state"]),
        (rf"$e^{{b_{{{i}}}-b_{{{j}}}}} = e^{{b_{{{i}}}-b_{{{rho}}}}}\, e^{{b_{{{rho}}}-b_{{{j}}}}}$,"
         " both exponents $\\leq 0$", "#111111"),
        (f"each level: one product of two C x d_k matrices", "#111111"),
        (f"C = {chunk_size}: {n_lv} levels; "
         f"C = 64 (the kernel): {int(chunk_pair_levels(64).max())}", "#111111"),
    ]
    for r, (text, color) in enumerate(lines):
        label(ax, tx, top - 0.3 - r * 0.62, text, fontsize=7.5, ha="left", color=color)
    return fig
