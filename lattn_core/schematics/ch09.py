"""Chapter 9 (PaTH): one factor as a mirror, a key carried through the factors, and the kernel's walk.

``draw_reflection`` shows one factor ``E = I − β w wᵀ`` (unit ``w``) acting on a vector in the plane:
``β = 2`` reflects it in the mirror orthogonal to ``w``, ``β = 1`` projects it onto the mirror, and
every ``β`` moves it along ``w`` only. ``draw_transport`` carries a key ``k_j`` through the factors
between ``j`` and ``i`` (``R_{tj} k_j`` at every token ``t``) until query ``i`` reads it.
``draw_block_walk`` shows the two stages of ``kernels.parallel_path_attn``. The vectors are computed
with :func:`lattn_core.path.householder_product`, the function the chapter checks.
"""
from __future__ import annotations

import numpy as np

from ..path import householder_product
from .base import PALETTE, arrow, box, canvas, label

__all__ = ["draw_reflection", "draw_transport", "draw_block_walk"]


def _factor(w, beta):
    """``E = I − β w wᵀ`` through the book's product (two tokens, the first one switched off)."""
    w = np.asarray(w, dtype=float)
    return householder_product(np.stack([np.zeros_like(w), w]), np.array([0.0, beta]), 1, 0)


def _vec(ax, start, v, color, lw=1.6, **kw):
    ax.annotate("", xy=(start[0] + v[0], start[1] + v[1]), xytext=start,
                arrowprops=dict(arrowstyle="-|>", color=color, lw=lw, shrinkA=0, shrinkB=0, **kw))


def draw_reflection(angle: float = 0.35, x=(1.9, 1.1)):
    """One factor with a unit direction ``w`` at ``angle`` (radians) from the horizontal acting on the
    vector ``x``: the mirror (the line orthogonal to ``w``), ``w`` itself, ``x``, and ``E x`` for
    ``β = 1`` (the projection onto the mirror) and ``β = 2`` (the reflection), with the path of
    ``E x`` as ``β`` runs from 0 to 2 (a segment along ``w``).

    Defined in Chapter 9 (PaTH)."""
    fig, ax = canvas(6.4, 3.6, xlim=(-3.2, 3.6), ylim=(-1.75, 2.1))
    w = np.array([np.cos(angle), np.sin(angle)])
    x = np.asarray(x, dtype=float)
    mirror = np.array([-w[1], w[0]])
    ax.plot(*np.stack([-2.1 * mirror, 2.1 * mirror]).T, color=PALETTE["mask"], lw=1.2, ls="--")
    label(ax, *(2.05 * mirror + np.array([0.25, 0.0])), "mirror: the line\northogonal to $\\mathbf{w}$",
          fontsize=8, ha="left", color=PALETTE["mask"])
    _vec(ax, (0, 0), 1.0 * w, PALETTE["state"])
    label(ax, *(1.0 * w + np.array([0.05, -0.22])), "$\\mathbf{w}$", fontsize=10, color=PALETTE["state"])
    images = {b: _factor(w, b) @ x for b in (1.0, 2.0)}
    ax.plot(*np.stack([x, images[2.0]]).T, color=PALETTE["highlight"], lw=0.8, ls=":")
    _vec(ax, (0, 0), x, PALETTE["key"])
    label(ax, *(x + np.array([0.12, 0.12])), "$\\mathbf{x}$", fontsize=10, ha="left", color=PALETTE["key"])
    _vec(ax, (0, 0), images[2.0], PALETTE["highlight"])
    label(ax, *(images[2.0] + np.array([0.0, -0.25])),
          "$\\beta = 2$: $\\mathbf{E}\\mathbf{x}$, the reflection", fontsize=8, color=PALETTE["highlight"])
    ax.plot(*images[1.0], "o", color=PALETTE["highlight"], ms=4)
    label(ax, *(images[1.0] + np.array([-0.12, 0.05])), "$\\beta = 1$: the projection\nonto the mirror",
          fontsize=8, ha="right", color=PALETTE["highlight"])
    label(ax, 0.2, -1.6, "$\\mathbf{E} = \\mathbf{I} - \\beta\\,\\mathbf{w}\\mathbf{w}^\\top$, "
          "$|\\mathbf{w}| = 1$: as $\\beta$ runs from 0 to 2, $\\mathbf{E}\\mathbf{x}$ moves along "
          "the dotted segment", fontsize=8)
    return fig


def draw_transport(n_steps: int = 5, seed: int = 2):
    """A key ``k_j`` in the plane carried through ``n_steps`` factors ``E_{j+1}, …, E_i`` (random unit
    directions, ``β`` between 1.6 and 2): each circle shows ``R_{tj} k_j`` at token ``t`` with the mirror
    of ``E_t`` dashed; at token ``i`` the query ``q_i`` reads it, ``A_ij = q_iᵀ R_ij k_j``.

    Defined in Chapter 9 (PaTH)."""
    from matplotlib.patches import Circle
    rng = np.random.default_rng(seed)
    ang = rng.uniform(0, np.pi, size=n_steps + 1)
    W = np.stack([np.cos(ang), np.sin(ang)], axis=1)
    W[0] = 0.0                                           # token j's own factor plays no part
    beta = np.r_[0.0, rng.uniform(1.6, 2.0, size=n_steps)]
    k = np.array([0.95, 0.3])
    q = np.array([0.2, 0.9])
    width = 1.9 * (n_steps + 1)
    fig, ax = canvas(7.2, 3.0, xlim=(-0.3, width - 0.3), ylim=(-2.05, 1.4))
    r = 0.72
    for t in range(n_steps + 1):
        cx = 1.9 * t + 0.6
        ax.add_patch(Circle((cx, 0), r, fill=False, color="#bbbbbb", lw=0.8))
        carried = householder_product(W, beta, t, 0) @ k
        if t:
            m = np.array([-W[t, 1], W[t, 0]])
            ax.plot([cx - r * m[0], cx + r * m[0]], [-r * m[1], r * m[1]], color=PALETTE["mask"], lw=0.8,
                    ls="--")
            arrow(ax, (cx - 1.9 + r + 0.05, 0.95), (cx - r - 0.05, 0.95), f"$\\mathbf{{E}}_{{j+{t}}}$"
                  if t < n_steps else "$\\mathbf{E}_i$", color=PALETTE["state"], fontsize=8, offset=(0, 0.05))
        _vec(ax, (cx, 0), 0.68 * carried, PALETTE["key"])
        name = ("$\\mathbf{k}_j$" if t == 0 else "$\\mathbf{R}_{ij}\\mathbf{k}_j$" if t == n_steps
                else f"$\\mathbf{{R}}_{{j+{t},j}}\\mathbf{{k}}_j$")
        label(ax, cx, -r - 0.22, name, fontsize=8, color=PALETTE["key"])
        label(ax, cx, -r - 0.62, "token $j$" if t == 0 else "token $i$" if t == n_steps else f"$j+{t}$",
              fontsize=7.5)
    cx = 1.9 * n_steps + 0.6
    _vec(ax, (cx, 0), 0.68 * q, PALETTE["query"])
    label(ax, cx + 0.68 * q[0] + 0.05, 0.68 * q[1] + 0.12, "$\\mathbf{q}_i$", fontsize=9, ha="left",
          color=PALETTE["query"])
    score = q @ householder_product(W, beta, n_steps, 0) @ k
    label(ax, width / 2 - 0.3, -1.85, f"$A_{{ij}} = \\mathbf{{q}}_i^\\top\\mathbf{{R}}_{{ij}}\\mathbf{{k}}_j"
          f" = {score:.2f}$; each factor moves the key along its own $\\mathbf{{w}}_t$ only",
          fontsize=8)
    return fig


def draw_block_walk(n_blocks: int = 5):
    """Blocks ``0 .. n_blocks − 1`` of 64 tokens in a row; the last holds the query block ``i``.
    Stage 1 (top line) runs for every block at once. Stage 2 follows the queries of block ``i``:
    their own scores come from stage 1 (``A_loc``); then, at each earlier block ``l``, last first,
    the carried queries ``X`` take their scores against the block's keys pushed to its end,
    ``X K̂_lᵀ`` (into the online softmax), and cross the block, ``X ← X − (X W_lᵀ) Y_l``, before
    moving on to block ``l − 1``.

    Defined in Chapter 9 (PaTH)."""
    fig, ax = canvas(6.4, 3.4, xlim=(0, 13), ylim=(0, 7.2))
    w, h, gap = 2.0, 1.2, 0.6
    x0 = (13 - (n_blocks * w + (n_blocks - 1) * gap)) / 2
    y = 2.6
    i = n_blocks - 1
    label(ax, 6.5, 6.85, r"stage 1, every block $b$ at once: $\mathbf{T}_b$ (the delta family's solve), "
          r"$\mathbf{Y}_b = \mathbf{T}_b\,\mathrm{Diag}(\beta_b)\mathbf{W}_b$, "
          r"$\hat{\mathbf{K}}_b$, $\mathbf{A}_{\mathrm{loc}}$", fontsize=7.5)
    label(ax, 6.5, 6.2, rf"stage 2, the queries of block $i = {i}$ walk back, last block first",
          fontsize=8.5)
    xs = [x0 + t * (w + gap) for t in range(n_blocks)]
    for t, x in enumerate(xs):
        if t == i:
            box(ax, x, y, w, h, r"queries" "\n" r"own: $\mathbf{A}_{\mathrm{loc}}$",
                color="#d6e6f5", fontsize=7.5)
        else:
            box(ax, x, y, w, h, rf"$\hat{{\mathbf{{K}}}}_{t},\ \mathbf{{W}}_{t},\ \mathbf{{Y}}_{t}$",
                color=PALETTE["light"], fontsize=8)
            label(ax, x + w / 2, y - 0.45, rf"scores $\mathbf{{X}}\hat{{\mathbf{{K}}}}_{t}^\top$",
                  fontsize=7.5, color=PALETTE["key"])
        label(ax, x + w / 2, y + h + 0.3, f"block {t}", fontsize=8)
    for t in range(i, 0, -1):                         # arrows from block t to block t − 1
        text = r"$\mathbf{X} = \mathbf{X}_{i,i-1}$" if t == i else f"cross {t}"
        arrow(ax, (xs[t] + w / 2 - 0.3, y + h + 0.85), (xs[t - 1] + w / 2 + 0.3, y + h + 0.85), text,
              color=PALETTE["query"], fontsize=7, offset=(0, 0.08))
    label(ax, 6.5, 1.05, r"cross block $l$: $\mathbf{X} \leftarrow \mathbf{X} - "
          r"(\mathbf{X}\mathbf{W}_l^\top)\,\mathbf{Y}_l$, that is $\mathbf{X}\,\mathbf{P}_l$, "
          r"$\mathbf{P}_l = \mathbf{I} - \mathbf{W}_l^\top\mathbf{Y}_l$ the block's product of factors",
          fontsize=7.5)
    label(ax, 6.5, 0.4, "every score goes into the online softmax (Chapter 1); "
          "nothing of size T x T is written", fontsize=7.5, color=PALETTE["mask"])
    return fig
