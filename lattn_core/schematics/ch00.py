"""Chapter 0's schematic: an RNN passes its state along a relay; attention reads every past token.

Only structure is drawn (no numbers): the top row is the chain of states of a recurrence
``h_t = f(h_{t-1}, x_t)``, the bottom row one attention read ``o_n`` that looks at every earlier key
and value directly.
"""
from __future__ import annotations

from .base import PALETTE, arrow, box, canvas, label

__all__ = ["draw_relay_and_lookup"]


def draw_relay_and_lookup(n: int = 5):
    """Two rows over the same ``n`` tokens: the RNN's relay ``h_{t-1} -> h_t`` (each step waits for
    the one before) and attention's direct reads (the last token's query against every key).

    Defined in Chapter 0 (From RNNs to attention)."""
    if n < 2:
        raise ValueError(f"n must be at least 2 tokens; got {n}")
    fig, ax = canvas(6.4, 4.2, xlim=(0, 10.4), ylim=(0, 6.8))
    step = 8.0 / n
    xs = [1.6 + step * t + step / 2 for t in range(n)]
    w = min(1.3, 0.8 * step)
    names = [f"{t + 1}" for t in range(n - 2)] + ["n-1", "n"]

    # top: the relay
    label(ax, 0.1, 6.35, "RNN: a relay (step t waits for step t-1)", ha="left", fontsize=10)
    for t, x in enumerate(xs):
        box(ax, x - w / 2, 3.9, w, 0.7, f"$x_{{{names[t]}}}$", color=PALETTE["light"])
        box(ax, x - w / 2, 5.0, w, 0.8, f"$h_{{{names[t]}}}$", color=PALETTE["state"], alpha=0.35)
        arrow(ax, (x, 4.6), (x, 5.0))
        if t:
            gap = t == n - 2 and n > 3          # tokens left out between 3 and n-1
            arrow(ax, (xs[t - 1] + w / 2, 5.4), (x - w / 2, 5.4), color=PALETTE["state"], lw=1.4,
                  text="..." if gap else "", offset=(0, 0.05))
    box(ax, 0.35, 5.0, 0.8, 0.8, "$h_0$", color=PALETTE["state"], alpha=0.15)
    arrow(ax, (1.15, 5.4), (xs[0] - w / 2, 5.4), color=PALETTE["state"], lw=1.4)

    # bottom: attention's direct reads
    label(ax, 0.1, 3.15, "Attention: token n reads every earlier token directly", ha="left",
          fontsize=10)
    for t, x in enumerate(xs):
        box(ax, x - w / 2, 1.6, w, 0.7, f"$k_{{{names[t]}}}, v_{{{names[t]}}}$",
            color=PALETTE["key"], alpha=0.3, fontsize=7 if w < 1.2 else 8)
    qx = xs[-1]
    box(ax, qx - w / 2, 0.2, w, 0.7, "$q_n \\to o_n$", color=PALETTE["query"], alpha=0.3,
        fontsize=7 if w < 1.2 else 8)
    for x in xs:
        arrow(ax, (x, 1.6), (qx, 0.9), color=PALETTE["query"], lw=0.9)
    label(ax, 0.1, 0.55, "one weight per\nearlier token,\nno chain between", ha="left", fontsize=8)
    return fig
