"""Chapter 7 (feeding back): how softmax attention shrank its cache, and what FoX adds to it.

``draw_kv_sharing`` shows multi-head, grouped-query and multi-query attention as query heads wired
to the key-value heads they read (the cache holds only the latter); ``draw_fox_decode`` shows one
decoding step of FoX: the forget gate adds ``log gamma_t`` to the log decay of every cached token,
the new token joins undecayed, and the query reads the cache with the decays added to its scores.
The decays drawn come from :func:`lattn_core.log_decay_mask`.
"""
from __future__ import annotations

import numpy as np

from ..forget_gates import log_decay_mask
from .base import PALETTE, arrow, box, canvas, label

__all__ = ["draw_kv_sharing", "draw_fox_decode"]


def draw_kv_sharing(n_heads: int = 8, groups=(8, 2, 1)):
    """Three panels, one per entry of ``groups`` (the number of key-value heads): ``n_heads``
    query heads on top, the key-value heads below, each query head wired to the key-value head it
    reads. The cache stores only the key-value heads: ``2 · H_kv · d`` numbers per token and layer.

    Defined in Chapter 7 (Feeding back)."""
    if any(n_heads % g for g in groups):
        raise ValueError(f"every entry of groups must divide n_heads = {n_heads}; got {groups}")
    names = {n_heads: "MHA", 1: "MQA"}
    fig, ax = canvas(6.4, 3.0, xlim=(0, 12.9), ylim=(-0.2, 5.8))
    panel_w, gap = 3.9, 0.45
    for p, g in enumerate(groups):
        x0 = 0.1 + p * (panel_w + gap)
        w = panel_w / n_heads
        per = n_heads // g
        for h in range(n_heads):                       # query heads
            box(ax, x0 + h * w + 0.04, 3.6, w - 0.08, 0.6, color=PALETTE["query"], alpha=0.35)
        kv_w = panel_w / g
        for k in range(g):                             # key-value heads, under their group
            kx = x0 + k * kv_w + 0.06
            box(ax, kx, 1.3, kv_w - 0.12, 0.7, "k, v" if kv_w > 0.9 else "", fontsize=7,
                color=PALETTE["key"], alpha=0.35)
            for h in range(k * per, (k + 1) * per):
                arrow(ax, (x0 + (h + 0.5) * w, 3.6), (kx + (kv_w - 0.12) / 2, 2.0),
                      color=PALETTE["mask"], style="-", lw=0.6)
        kind = names.get(g, "GQA")
        label(ax, x0 + panel_w / 2, 4.95, f"{kind}\n{n_heads} query heads, {g} k-v "
              f"head{'s' if g > 1 else ''}", fontsize=7.5)
        label(ax, x0 + panel_w / 2, 0.85, f"cache/token/layer: {2 * g}·d", fontsize=7.5,
              color=PALETTE["highlight"])
        label(ax, x0 + panel_w / 2, 0.25, f"{per} query head{'s' if per > 1 else ''} per k-v head",
              fontsize=7, color="#444444")
    return fig


def draw_fox_decode(gamma=(0.9, 0.5, 0.95, 0.2, 0.9, 0.8)):
    """One decoding step of FoX at ``t = len(gamma)``: the cache of tokens ``1..t-1`` with their
    log decays before the step, the gate adding ``log gamma_t`` to each, the new token appended
    with decay 0, and the read ``softmax_j(q_t.k_j + log Γ_tj)``. The decays are the last two rows of
    :func:`lattn_core.log_decay_mask` of ``gamma``.

    Defined in Chapter 7 (Feeding back)."""
    g = np.asarray(gamma, dtype=float)
    t = len(g)
    if t < 2:
        raise ValueError(f"gamma must hold at least 2 gates; got {t}")
    logG = log_decay_mask(g)
    before, after = logG[t - 2, :t - 1], logG[t - 1, :t]     # log Γ at steps t-1 and t
    fig, ax = canvas(6.4, 3.3, xlim=(0, 12.8), ylim=(0, 6.6))
    cw, x0 = 1.45, 2.4
    label(ax, 1.15, 5.55, "cache at\nstep t−1:\nkey, value,\nlog decay", fontsize=7)
    label(ax, 1.15, 2.4, "cache at\nstep t:\nkey, value,\nlog decay", fontsize=7)
    for j in range(t):
        x = x0 + j * cw
        if j < t - 1:
            box(ax, x, 5.0, cw - 0.15, 1.1, f"$k_{j + 1}, v_{j + 1}$\n{before[j]:.2f}",
                color=PALETTE["key"], alpha=0.25, fontsize=7)
            arrow(ax, (x + (cw - 0.15) / 2, 5.0), (x + (cw - 0.15) / 2, 2.95),
                  color=PALETTE["state"])
        new = j == t - 1
        box(ax, x, 1.85, cw - 0.15, 1.1, f"$k_{j + 1}, v_{j + 1}$\n{after[j]:.2f}",
            color=PALETTE["value"] if new else PALETTE["key"], alpha=0.35 if new else 0.25,
            fontsize=7)
    label(ax, x0 + (t - 1) * cw / 2, 3.95, rf"every $\log\Gamma$ += $\log\gamma_t$ = {np.log(g[-1]):.2f}",
          fontsize=7.5, color=PALETTE["state"],
          bbox=dict(fc="white", ec="none", pad=0.5, alpha=0.9))
    label(ax, x0 + (t - 0.5) * cw, 3.95, "new token:\nlog Γ = 0", fontsize=7, color=PALETTE["value"])
    label(ax, x0 + t * cw / 2, 0.95, r"read: $\mathrm{softmax}_j(q_t \cdot k_j + \log\Gamma_{tj})$,"
          " one pass over the cache (online softmax)", fontsize=7.5)
    label(ax, x0 + t * cw / 2, 0.35, "the forget gate acts on the cache's weights, as it acts on"
          " a linear-attention state", fontsize=7, color="#444444")
    return fig
