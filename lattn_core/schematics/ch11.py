"""Chapter 11 (short convolutions): which pairs test-time training learns from, and the band of a
short convolution's matrix."""
from __future__ import annotations

import numpy as np

from .base import PALETTE, arrow, box, canvas, label, matrix

__all__ = ["draw_training_pairs", "draw_conv_band"]


def draw_training_pairs(n: int = 5):
    """Two rows of tokens ``x_1 .. x_n``. Top: with ``K = V`` each token's pair is itself, ``k_t ↦
    v_t = k_t`` (a loop on every token). Bottom: a convolution on the keys that passes the previous
    token makes the pair ``k_{t-1} ↦ v_t`` (an arrow from each token to the next).

    Defined in Chapter 11 (Short convolutions)."""
    from matplotlib.patches import FancyArrowPatch

    fig, ax = canvas(6.4, 2.9, xlim=(0, 11), ylim=(0, 5.0))
    w, h, gap = 1.3, 0.75, 0.75
    x0 = 11 / 2 - (n * w + (n - 1) * gap) / 2
    rows = ((3.1, r"$\mathbf{K} = \mathbf{V}$: every pair is $(\mathbf{k}_t, \mathbf{k}_t)$, "
                  "the identity fits them all", "self"),
            (0.95, r"a shift on $\mathbf{K}$: pairs $(\mathbf{k}_{t-1}, \mathbf{v}_t)$, "
                   "predict the next token", "next"))
    for y, title, kind in rows:
        label(ax, 5.5, y + h + 0.85, title, fontsize=9)
        for t in range(n):
            x = x0 + t * (w + gap)
            box(ax, x, y, w, h, rf"$\mathbf{{x}}_{t + 1}$", color=PALETTE["light"], fontsize=10)
            if kind == "self":
                ax.add_patch(FancyArrowPatch((x + 0.35 * w, y + h), (x + 0.65 * w, y + h),
                                             connectionstyle="arc3,rad=-1.6", arrowstyle="-|>",
                                             mutation_scale=9, color=PALETTE["key"], lw=1.1))
            elif t + 1 < n:
                arrow(ax, (x + w, y + h / 2), (x + w + gap, y + h / 2), color=PALETTE["key"], lw=1.1)
    label(ax, 5.5, 0.3, r"arrow: key $\rightarrow$ value of one training pair", fontsize=8,
          color=PALETTE["key"])
    return fig


def draw_conv_band(n: int = 8, width: int = 4):
    """The ``n x n`` matrix ``Psi = sum_i psi_i J^i`` of one channel of a width-``width`` causal
    convolution: the diagonal carries ``psi_0`` (the current token), the ``i``-th subdiagonal
    ``psi_i``, everything else is zero (drawn white).

    Defined in Chapter 11 (Short convolutions)."""
    fig, ax = canvas(6.4, 3.4, xlim=(0, 10), ylim=(0, 5.2))
    M = np.full((n, n), np.nan)
    for i in range(width):
        for t in range(i, n):
            M[t, t - i] = width - i
    cell = 0.55
    x, y = 0.6, 0.3
    matrix(ax, M, x=x, y=y, cell=cell, cmap="Oranges", vmin=0, vmax=width + 1)
    top = y + n * cell
    for i in range(width):
        for t in range(i, n):
            label(ax, x + (t - i + 0.5) * cell, top - (t + 0.5) * cell, rf"$\psi_{i}$", fontsize=7)
    label(ax, x + n * cell / 2, top + 0.3, r"$\mathbf{\Psi}$: rows $t$ (outputs), columns $s$ (inputs)",
          fontsize=8)
    tx = x + n * cell + 0.5
    lines = [r"$y_t = \psi_0 x_t + \psi_1 x_{t-1} + \dots$",
             rf"width {width}: {width} diagonals",
             "zero above the diagonal: causal",
             "one such matrix per channel",
             r"$\psi_1 = 1$, others $0$: the shift $\mathbf{J}$"]
    for r, text in enumerate(lines):
        label(ax, tx, top - 0.5 - 0.7 * r, text, fontsize=8, ha="left")
    return fig
