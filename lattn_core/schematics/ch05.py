"""Chapter 5 (the delta rule): erase, then write, drawn on a small state."""
from __future__ import annotations

import numpy as np

from .base import PALETTE, arrow, canvas, label, matrix

__all__ = ["draw_erase_then_write"]


def draw_erase_then_write(d_v: int = 3, d_k: int = 4, j: int = 1, seed: int = 3):
    """One DeltaNet step with beta = 1 and the key k_t along coordinate axis j (counted from 0), so
    that "the state along k_t" is column j: the state before, after the erase (the same step with a
    zero value), and after the write. Every matrix is computed by :func:`lattn_core.ttt_recurrent`
    with the squared loss (DeltaNet, Chapter 4's table); nothing is typed.

    Defined in Chapter 5 (The delta rule)."""
    from matplotlib.patches import Rectangle

    from ..ttt import ttt_recurrent

    rng = np.random.default_rng(seed)
    K = rng.normal(size=(4, d_k))
    K /= np.linalg.norm(K, axis=1, keepdims=True)
    V = rng.normal(size=(4, d_v))
    _, S_prev = ttt_recurrent(K, K, V, "squared", 1.0, return_state=True)   # some history
    k = np.eye(d_k)[j]
    v = np.round(rng.normal(size=d_v), 1)
    step = lambda value: ttt_recurrent(k[None], k[None], value[None], "squared", 1.0,
                                       initial_state=S_prev, return_state=True)[1]
    S_erased, S_next = step(np.zeros(d_v)), step(v)
    lim = float(np.max(np.abs([S_prev, S_erased, S_next])))

    cell = 0.8
    fig, ax = canvas(6.4, 2.6, xlim=(0, 12.4), ylim=(-0.1, 4.8))
    xs = [0.2, 4.6, 9.0]
    titles = [r"$\mathbf{S}_{t-1}$", r"erased: $\mathbf{S}_{t-1}(\mathbf{I}-\mathbf{k}_t\mathbf{k}_t^\top)$",
              r"written: $\mathbf{S}_t$ (+ $\mathbf{v}_t\mathbf{k}_t^\top$)"]
    y0 = 1.4
    for x, S, title in zip(xs, (S_prev, S_erased, S_next), titles):
        matrix(ax, S, x=x, y=y0, cell=cell, cmap="PuOr", vmin=-lim, vmax=lim, text=True)
        # the column along k_t = e_j
        ax.add_patch(Rectangle((x + j * cell, y0), cell, d_v * cell, fill=False,
                               edgecolor=PALETTE["highlight"], lw=1.8))
        label(ax, x + d_k * cell / 2, y0 + d_v * cell + 0.45, title, fontsize=8)
        reading = S @ k
        label(ax, x + d_k * cell / 2, y0 - 0.45,
              r"$\mathbf{S}\mathbf{k}_t$ = [" + ", ".join(f"{r:.2f}" for r in reading) + "]",
              fontsize=7, color=PALETTE["highlight"])
    mid = y0 + d_v * cell / 2
    arrow(ax, (xs[0] + d_k * cell + 0.1, mid), (xs[1] - 0.1, mid), "erase", fontsize=8)
    arrow(ax, (xs[1] + d_k * cell + 0.1, mid), (xs[2] - 0.1, mid), "write", fontsize=8)
    label(ax, 6.2, 0.15, rf"$\mathbf{{k}}_t$ = coordinate axis {j + 1} (column {j + 1}, outlined), "
          r"$\mathbf{v}_t$ = [" + ", ".join(f"{x:.1f}" for x in v) + r"], $\beta_t = 1$", fontsize=8)
    return fig
