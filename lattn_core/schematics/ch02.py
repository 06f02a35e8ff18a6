"""Chapter 2's schematics: the two association orders of linear attention, the state as a memory
written by outer products, and the chunkwise march that the kernel runs.

The shapes are drawn to scale for the sizes given; the state's colours in
:func:`draw_state_memory` are the entries of :func:`lattn_core.linear_attention_state` for seeded
random keys and values (nothing typed by hand).
"""
from __future__ import annotations

import numpy as np

from ..linear_attention import linear_attention_state
from .base import PALETTE, arrow, box, canvas, label, matrix

__all__ = ["draw_association_orders", "draw_state_memory", "draw_chunkwise_march"]


def _operand(ax, x, y_mid, rows, cols, unit, text, color, *, fontsize=8):
    """A matrix drawn as a box of ``rows x cols`` units, vertically centred on ``y_mid``; returns
    its right edge."""
    h, w = rows * unit, cols * unit
    box(ax, x, y_mid - h / 2, w, h, text, color=color, alpha=0.35, fontsize=fontsize)
    return x + w


def draw_association_orders(n: int = 12, d_k: int = 3, d_v: int = 3):
    """Top: ``(Q K^T) V`` builds the ``n x n`` score matrix. Bottom: ``Q (K^T V)`` builds a
    ``d_k x d_v`` matrix first. Boxes are to scale (one unit per row or column).

    Defined in Chapter 2 (Linear attention)."""
    if min(n, d_k, d_v) < 1:
        raise ValueError(f"n, d_k, d_v must be positive; got {n}, {d_k}, {d_v}")
    unit = 3.0 / max(n, d_k, d_v)
    fig, ax = canvas(6.4, 4.6, xlim=(0, 11.0), ylim=(-0.6, 7.6))
    q, k, v, s = PALETTE["query"], PALETTE["key"], PALETTE["value"], PALETTE["state"]
    sp = 0.35

    def times(x, y):
        label(ax, x + sp / 2, y, "$\\cdot$", fontsize=12)
        return x + sp

    # top row: (Q K^T) V
    y = 5.6
    label(ax, 0.0, 7.35, "$(QK^\\top)\\,V$: the $n\\times n$ scores first, "
          "$O(n^2 d)$ time, $O(n^2)$ memory", ha="left", fontsize=9)
    x = _operand(ax, 0.2, y, n, d_k, unit, "$Q$", q)
    x = times(x, y)
    x = _operand(ax, x, y, d_k, n, unit, "$K^\\top$", k)
    label(ax, x + 0.45, y, "=", fontsize=11)
    x = _operand(ax, x + 0.9, y, n, n, unit, "$QK^\\top$\n$n\\times n$", PALETTE["mask"])
    x = times(x, y)
    x = _operand(ax, x, y, n, d_v, unit, "$V$", v)
    label(ax, x + 0.45, y, "=", fontsize=11)
    _operand(ax, x + 0.9, y, n, d_v, unit, "$O$", v)

    # bottom row: Q (K^T V)
    y = 1.7
    label(ax, 0.0, 3.65, "$Q\\,(K^\\top V)$: a $d_k\\times d_v$ matrix first, "
          "$O(n\\, d_k d_v)$ time, $O(d_k d_v)$ extra memory", ha="left", fontsize=9)
    x = _operand(ax, 0.2, y, n, d_k, unit, "$Q$", q)
    x = times(x, y)
    label(ax, x + 0.1, y, "(", fontsize=18)
    x = _operand(ax, x + 0.3, y, d_k, n, unit, "$K^\\top$", k)
    x = times(x, y)
    x = _operand(ax, x, y, n, d_v, unit, "$V$", v)
    label(ax, x + 0.15, y, ")", fontsize=18)
    label(ax, x + 0.65, y, "=", fontsize=11)
    x = _operand(ax, x + 1.0, y, n, d_k, unit, "$Q$", q)
    x = times(x, y)
    x = _operand(ax, x, y, d_k, d_v, unit, "", s)
    label(ax, x - d_v * unit / 2, y - d_k * unit / 2 - 0.3, "$K^\\top V$", fontsize=8)
    label(ax, x + 0.45, y, "=", fontsize=11)
    _operand(ax, x + 0.9, y, n, d_v, unit, "$O$", v)
    label(ax, 0.0, -0.35, f"drawn for n = {n}, d_k = {d_k}, d_v = {d_v}; "
          "the causal mask is left out here", ha="left", fontsize=7)
    return fig


def draw_state_memory(d_k: int = 6, d_v: int = 4, n: int = 5, seed: int = 0):
    """The state ``S_n`` (``d_v x d_k``) as the sum of ``n`` outer products ``v_t k_t^T`` (one
    write drawn), and a read ``o = S q``. Colours: entries of :func:`linear_attention_state`.

    Defined in Chapter 2 (Linear attention)."""
    rng = np.random.default_rng(seed)
    K = rng.normal(size=(n, d_k))
    V = rng.normal(size=(n, d_v))
    S = linear_attention_state(K, V)
    S_prev = linear_attention_state(K[:-1], V[:-1])
    lim = float(np.abs(S).max())
    cell = 0.32
    fig, ax = canvas(6.4, 2.9, xlim=(0, 12.0), ylim=(-0.3, 5.0))
    y = 1.2

    label(ax, 0.0, 4.7, f"write: $S_t = S_{{t-1}} + v_t k_t^\\top$  (here t = {n})", ha="left",
          fontsize=9)
    matrix(ax, S_prev, x=0.2, y=y, cell=cell, cmap="RdBu", vmin=-lim, vmax=lim)
    label(ax, 0.2 + d_k * cell / 2, y - 0.35, "$S_{t-1}$", fontsize=8)
    label(ax, 2.45, y + d_v * cell / 2, "+", fontsize=12)
    matrix(ax, V[-1:].T, x=2.8, y=y, cell=cell, cmap="Greens")
    label(ax, 2.8 + cell / 2, y - 0.35, "$v_t$", fontsize=8)
    matrix(ax, K[-1:], x=3.3, y=y + d_v * cell + 0.15, cell=cell, cmap="Oranges")
    label(ax, 3.3 + d_k * cell + 0.3, y + d_v * cell + 0.15 + cell / 2, "$k_t^\\top$",
          fontsize=8)
    label(ax, 5.7, y + d_v * cell / 2, "=", fontsize=12)
    matrix(ax, S, x=6.1, y=y, cell=cell, cmap="RdBu", vmin=-lim, vmax=lim)
    label(ax, 6.1 + d_k * cell / 2, y - 0.35, f"$S_t$: {d_v} x {d_k} = $d_v\\times d_k$",
          fontsize=8)

    # the read
    x_r = 8.6
    label(ax, x_r, 4.7, "read: $o_t = S_t\\,q_t$", ha="left", fontsize=9)
    box(ax, x_r, y, d_k * cell * 0.5, d_v * cell, "$S_t$", color=PALETTE["state"], alpha=0.35)
    box(ax, x_r + d_k * cell * 0.5 + 0.2, y - 0.4, cell, d_k * cell * 0.6 + 0.4, "$q_t$",
        color=PALETTE["query"], alpha=0.35, fontsize=7)
    arrow(ax, (x_r + d_k * cell * 0.5 + 0.3 + cell, y + d_v * cell / 2),
          (x_r + d_k * cell * 0.5 + 1.1 + cell, y + d_v * cell / 2))
    box(ax, x_r + d_k * cell * 0.5 + 1.2 + cell, y, cell, d_v * cell, "", color=PALETTE["value"],
        alpha=0.35)
    label(ax, x_r + d_k * cell * 0.5 + 1.2 + 1.5 * cell, y - 0.35, "$o_t$", fontsize=8)
    label(ax, 0.0, 0.1, "fixed size whatever t is: every write lands in the same "
          "$d_v\\times d_k$ cells", ha="left", fontsize=7)
    return fig


def draw_chunkwise_march(n_chunks: int = 4):
    """The chunkwise form: the sequence in chunks of ``C`` tokens; inside a chunk the parallel form,
    across chunks the state, carried from one chunk to the next (on chip in the kernel).

    Defined in Chapter 2 (Linear attention)."""
    if n_chunks < 2:
        raise ValueError(f"n_chunks must be at least 2; got {n_chunks}")
    fig, ax = canvas(6.4, 2.7, xlim=(0, 11.0), ylim=(0, 4.6))
    w, gap = 1.9, 0.75
    xs = [0.3 + i * (w + gap) for i in range(n_chunks)]
    for i, x in enumerate(xs):
        box(ax, x, 0.4, w, 1.0, f"chunk {i + 1}\n$C$ tokens: $q, k, v$", color=PALETTE["light"],
            fontsize=7)
        box(ax, x, 2.0, w, 1.2, "$Q S^\\top$\n$+ (Q K^\\top\\odot M)V$", color=PALETTE["query"],
            alpha=0.2, fontsize=7)
        arrow(ax, (x + w / 2, 1.4), (x + w / 2, 2.0))
        arrow(ax, (x + w / 2, 3.2), (x + w / 2, 3.75))
        label(ax, x + w / 2, 3.95, f"$O$ of chunk {i + 1}", fontsize=7)
        if i:
            arrow(ax, (xs[i - 1] + w, 2.6), (x, 2.6), "$S$", color=PALETTE["state"], lw=1.6,
                  offset=(0, 0.05))
    label(ax, 0.3, 4.4, "the state $S$ crosses each chunk boundary once "
          "(in the kernel it never leaves the chip)",
          ha="left", fontsize=7, color=PALETTE["state"])
    label(ax, 0.3, 0.15, "in each chunk, after its output: $S \\leftarrow S + V^\\top K$ "
          "(the chunk's rows of $V$ and $K$)", ha="left", fontsize=7, color=PALETTE["state"])
    return fig
