"""Chapter 12's schematic: an RNN that reads each token once against one that re-reads the history."""
from __future__ import annotations

from .base import PALETTE, arrow, box, canvas, label

__all__ = ["draw_rereading"]


def draw_rereading(n: int = 4):
    """Top: an ordinary RNN, one state carried along the tokens, each token read once. Bottom: the
    re-reading RNN: for every new token ``i`` a fresh state reads tokens ``i, i−1, …, 1`` (one row
    per output), with ``q_i`` in hand; ``n(n+1)/2`` reads, one state at a time. The two panels are
    stacked, so that the figure stays legible on a narrow screen.

    Defined in Chapter 12 (What's next)."""
    if not isinstance(n, int) or not 2 <= n <= 6:
        raise ValueError(f"n must be an integer in [2, 6]; got {n!r}")
    w = 1.55 * (n + 1) + 1.6                      # the re-reading rows set the width
    top = n + 1.4                                 # the ordinary RNN sits above the re-reading rows
    fig, ax = canvas(6.4, 6.4 * (top + 3.6) / (w + 0.4), xlim=(-0.4, w), ylim=(-0.7, top + 2.9))
    s = 2.0
    # top: x_1..x_n along the bottom of the panel, the state walks right
    x_left = (w - (s * (n - 1) + 1.0)) / 2
    label(ax, w / 2, top + 2.65, "an RNN: each token read once", fontsize=10)
    for j in range(n):
        x = x_left + s * j
        box(ax, x, top - 0.3, 1.0, 0.7, f"x{j + 1}", color=PALETTE["light"], fontsize=10)
        box(ax, x, top + 1.0, 1.0, 0.7, "h", color=PALETTE["state"], alpha=0.35, fontsize=10)
        arrow(ax, (x + 0.5, top + 0.4), (x + 0.5, top + 1.0))
        label(ax, x + 0.5, top + 2.1, f"o{j + 1}", fontsize=9)
        arrow(ax, (x + 0.5, top + 1.7), (x + 0.5, top + 1.95))
        if j:
            arrow(ax, (x - s + 1.0, top + 1.35), (x, top + 1.35))
    # bottom: row i re-reads tokens i..1 with q_i, from a fresh state
    x0 = 0.5
    label(ax, w / 2, n + 0.1, "re-reading: each token re-reads the past", fontsize=10)
    for i in range(n):
        y = n - 1 - i
        label(ax, x0 - 0.1, y + 0.3, f"q{i + 1}", fontsize=9, ha="right", color=PALETTE["query"])
        for r, j in enumerate(range(i, -1, -1)):
            x = x0 + 0.2 + 1.55 * r
            box(ax, x, y, 1.15, 0.6, f"k{j + 1},v{j + 1}", fontsize=8,
                color=PALETTE["key"] if r == 0 else PALETTE["light"], alpha=0.6)
            if r:
                arrow(ax, (x - 0.4, y + 0.3), (x, y + 0.3), lw=0.8)
        xe = x0 + 0.2 + 1.55 * (i + 1)
        arrow(ax, (xe - 0.4, y + 0.3), (xe, y + 0.3), lw=0.8, color=PALETTE["state"])
        label(ax, xe + 0.15, y + 0.3, f"o{i + 1}", fontsize=9, ha="left")
    label(ax, w / 2, -0.45, "one state at a time; n(n+1)/2 reads", fontsize=9)
    return fig
