"""Chapter 12's schematic: an RNN that reads each token once against one that re-reads the history."""
from __future__ import annotations

from .base import PALETTE, arrow, box, canvas, label

__all__ = ["draw_rereading"]


def draw_rereading(n: int = 4):
    """Left: an ordinary RNN, one state carried along the tokens, each token read once. Right: the
    re-reading RNN: for every new token ``i`` a fresh state reads tokens ``i, i−1, …, 1`` (one row
    per output), with ``q_i`` in hand; ``n(n+1)/2`` reads, one state at a time.

    Defined in Chapter 12 (What's next)."""
    if not isinstance(n, int) or not 2 <= n <= 6:
        raise ValueError(f"n must be an integer in [2, 6]; got {n!r}")
    w = 2.2 * n + 3.2
    fig, ax = canvas(7.6, 3.8, xlim=(0, 2 * w + 0.6), ylim=(-0.6, n + 2.0))
    s = 2.0
    # left: x_1..x_n along the bottom, the state walks right
    label(ax, w / 2, n + 1.6, "an RNN: each token read once", fontsize=9)
    for j in range(n):
        x = 0.6 + s * j
        box(ax, x, 0, 1.0, 0.7, f"x{j + 1}", color=PALETTE["light"])
        box(ax, x, 1.4, 1.0, 0.7, "h", color=PALETTE["state"], alpha=0.35)
        arrow(ax, (x + 0.5, 0.7), (x + 0.5, 1.4))
        label(ax, x + 0.5, 2.6, f"o{j + 1}", fontsize=8)
        arrow(ax, (x + 0.5, 2.1), (x + 0.5, 2.45))
        if j:
            arrow(ax, (x - s + 1.0, 1.75), (x, 1.75))
    # right: row i re-reads tokens i..1 with q_i, from a fresh state
    x0 = w + 0.8
    label(ax, x0 + w / 2, n + 1.6, "re-reading: each token re-reads the past", fontsize=9)
    for i in range(n):
        y = n - i
        label(ax, x0 - 0.1, y + 0.25, f"q{i + 1}", fontsize=8, ha="right", color=PALETTE["query"])
        for r, j in enumerate(range(i, -1, -1)):
            x = x0 + 0.3 + 1.4 * r
            box(ax, x, y, 1.0, 0.5, f"k{j + 1},v{j + 1}", fontsize=6,
                color=PALETTE["key"] if r == 0 else PALETTE["light"], alpha=0.6)
            if r:
                arrow(ax, (x - 0.4, y + 0.25), (x, y + 0.25), lw=0.8)
        xe = x0 + 0.3 + 1.4 * (i + 1)
        arrow(ax, (xe - 0.4, y + 0.25), (xe, y + 0.25), lw=0.8, color=PALETTE["state"])
        label(ax, xe + 0.15, y + 0.25, f"o{i + 1}", fontsize=8, ha="left")
    label(ax, x0 + w / 2, -0.35, "one state at a time; n(n+1)/2 reads", fontsize=8)
    return fig
