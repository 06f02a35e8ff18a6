"""Chapter 9 (PaTH): how the kernel walks a query block back over the blocks before it.

``draw_block_walk`` shows the two stages of ``kernels.parallel_path_attn``: every 64-token block on
its own (the block's UT factor and what it gives), then, for one block of queries, the walk over
the earlier key blocks, last first, with the scores taken before each crossing.
"""
from __future__ import annotations

from .base import PALETTE, arrow, box, canvas, label

__all__ = ["draw_block_walk"]


def draw_block_walk(n_blocks: int = 5):
    """Blocks ``0 .. n_blocks − 1`` of 64 tokens in a row; the last holds the query block ``i``.
    Stage 1 (top line) runs for every block at once. Stage 2 follows the queries of block ``i``:
    their own scores come from stage 1 (``A_loc``); then, at each earlier block ``l``, last first,
    the carried queries ``X`` take their scores against the block's keys pushed to its end,
    ``X K̂_lᵀ`` (into the online softmax), and cross the block, ``X ← X − (X W_lᵀ) U_l``, before
    moving on to block ``l − 1``.

    Defined in Chapter 9 (PaTH)."""
    fig, ax = canvas(6.4, 3.4, xlim=(0, 13), ylim=(0, 7.2))
    w, h, gap = 2.0, 1.2, 0.6
    x0 = (13 - (n_blocks * w + (n_blocks - 1) * gap)) / 2
    y = 2.6
    i = n_blocks - 1
    label(ax, 6.5, 6.85, r"stage 1, every block at once: $\mathbf{T}$ (the delta family's solve), "
          r"$\mathbf{U} = \mathbf{T}\,\mathrm{Diag}(\beta)\mathbf{W}$, $\tilde{\mathbf{Q}}$, "
          r"$\hat{\mathbf{K}}$, $\mathbf{A}_{\mathrm{loc}}$", fontsize=7.5)
    label(ax, 6.5, 6.2, rf"stage 2, the queries of block $i = {i}$ walk back, last block first",
          fontsize=8.5)
    xs = [x0 + t * (w + gap) for t in range(n_blocks)]
    for t, x in enumerate(xs):
        if t == i:
            box(ax, x, y, w, h, r"queries $\tilde{\mathbf{Q}}_i$" "\n" r"own: $\mathbf{A}_{\mathrm{loc}}$",
                color="#d6e6f5", fontsize=7.5)
        else:
            box(ax, x, y, w, h, rf"$\hat{{\mathbf{{K}}}}_{t},\ \mathbf{{W}}_{t},\ \mathbf{{U}}_{t}$",
                color=PALETTE["light"], fontsize=8)
            label(ax, x + w / 2, y - 0.45, rf"scores $\mathbf{{X}}\hat{{\mathbf{{K}}}}_{t}^\top$",
                  fontsize=7.5, color=PALETTE["key"])
        label(ax, x + w / 2, y + h + 0.3, f"block {t}", fontsize=8)
    for t in range(i, 0, -1):                         # arrows from block t to block t − 1
        text = r"$\mathbf{X} = \tilde{\mathbf{Q}}_i$" if t == i else f"cross {t}"
        arrow(ax, (xs[t] + w / 2 - 0.3, y + h + 0.85), (xs[t - 1] + w / 2 + 0.3, y + h + 0.85), text,
              color=PALETTE["query"], fontsize=7, offset=(0, 0.08))
    label(ax, 6.5, 1.05, r"cross block $l$: $\mathbf{X} \leftarrow \mathbf{X} - "
          r"(\mathbf{X}\mathbf{W}_l^\top)\,\mathbf{U}_l$, that is $\mathbf{X}\,(\mathbf{I} - "
          r"\mathbf{W}_l^\top\mathbf{U}_l)$, the block's product of factors", fontsize=7.5)
    label(ax, 6.5, 0.4, "every score goes into the online softmax (Chapter 1); "
          "nothing of size T x T is written", fontsize=7.5, color=PALETTE["mask"])
    return fig
