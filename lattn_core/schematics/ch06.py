"""Chapter 6 (the inverse trick): how the delta-rule kernels cut their work.

``draw_chunk_blocks`` shows a 64-token chunk's matrix ``A`` and its inverse ``T = (I + A)^{-1}`` as
4 × 4 blocks of 16 × 16 and the order in which the kernel fills the blocks of ``T``;
``draw_delta_pipeline`` shows the stages of ``kernels.chunk_(gated_)delta_rule``: which run for every
chunk in parallel, which march through the chunks, and what the backward reads.
"""
from __future__ import annotations

from .base import PALETTE, arrow, box, canvas, label

__all__ = ["draw_chunk_blocks", "draw_delta_pipeline"]


def draw_chunk_blocks(n_blocks: int = 4, block: int = 16):
    """The chunk's ``A`` (left) and ``T = (I + A)^{-1}`` (right) as ``n_blocks`` × ``n_blocks``
    blocks of ``block`` × ``block`` tokens. ``A``'s diagonal blocks are strictly lower triangular,
    the blocks below them full, those above zero. In ``T`` the number in each block is the step at
    which the kernel has it: step 1 inverts every diagonal block by forward substitution (one loop
    for all of them), step ``s > 1`` the blocks ``s − 1`` below the diagonal by block substitution,
    ``T_IJ = −T_II Σ_R A_IR T_RJ``, which needs only blocks of earlier steps.

    Defined in Chapter 6 (The inverse trick)."""
    from matplotlib.patches import Polygon

    fig, ax = canvas(6.4, 3.3, xlim=(0, 12.8), ylim=(0, 6.6))
    size = 1.1
    y0 = 0.6
    lefts = {"A": 0.4, "T": 8.0}
    step_color = {1: PALETTE["highlight"], 2: PALETTE["state"], 3: PALETTE["query"],
                  4: PALETTE["value"]}
    for name, x0 in lefts.items():
        top = y0 + n_blocks * size
        for i in range(n_blocks):               # block row I = i + 1, drawn from the top
            for j in range(n_blocks):           # block column J = j + 1
                x, y = x0 + j * size, top - (i + 1) * size
                sub = f"{i + 1}{j + 1}"
                if j > i:
                    box(ax, x, y, size, size, "0", color="#ffffff", edge="#bbbbbb", fontsize=8)
                    continue
                if name == "A":
                    if i == j:                  # strictly lower: a triangle below the diagonal
                        box(ax, x, y, size, size, color="#ffffff", edge="#333333")
                        ax.add_patch(Polygon([(x, y + size), (x, y), (x + size, y)], closed=True,
                                             facecolor=PALETTE["key"], alpha=0.35, lw=0))
                        label(ax, x + 0.36 * size, y + 0.3 * size, rf"$\mathbf{{A}}_{{{sub}}}$",
                              fontsize=8)
                    else:
                        box(ax, x, y, size, size, rf"$\mathbf{{A}}_{{{sub}}}$",
                            color=PALETTE["key"], alpha=0.35, fontsize=8)
                else:
                    step = i - j + 1
                    c = step_color.get(step, PALETTE["mask"])
                    box(ax, x, y, size, size, color=c, alpha=0.3)
                    label(ax, x + size / 2, y + 0.62 * size, rf"$\mathbf{{T}}_{{{sub}}}$", fontsize=8)
                    label(ax, x + size / 2, y + 0.25 * size, f"step {step}", fontsize=6.5)
        # block sizes along the top edge
        label(ax, x0 + n_blocks * size / 2, top + 0.3, f"{n_blocks} × {n_blocks} blocks of "
              f"{block} × {block}", fontsize=7.5)
    label(ax, lefts["A"] + n_blocks * size / 2, y0 + n_blocks * size + 0.85,
          r"$\mathbf{A}$: built on chip, never written", fontsize=9)
    label(ax, lefts["T"] + n_blocks * size / 2, y0 + n_blocks * size + 0.85,
          r"$\mathbf{T} = (\mathbf{I}+\mathbf{A})^{-1}$: written once", fontsize=9)
    xa = lefts["A"] + n_blocks * size + 0.2
    arrow(ax, (xa, y0 + 2.6), (lefts["T"] - 0.2, y0 + 2.6), "solve", fontsize=8)
    label(ax, (xa + lefts["T"]) / 2, y0 + 1.75, "step 1: forward\nsubstitution\n"
          f"steps 2-{n_blocks}: block\nsubstitution", fontsize=7, color="#444444")
    return fig


def draw_delta_pipeline():
    """The stages of the delta-rule op on a GPU. Forward for training: the within-chunk cumulative
    log gate ``b``, ``T`` for every chunk, then ``W``, ``Ũ`` and the chunk's scores for every chunk
    (all parallel over chunks), then the march that carries the state on chip from chunk to chunk.
    Without gradients the march applies ``T`` itself (the T form) and ``W``, ``Ũ`` are never formed.
    Backward: a reverse march carries the state's gradient, then every chunk's gradients follow in
    parallel from what the forward saved.

    Defined in Chapter 6 (The inverse trick)."""
    fig, ax = canvas(6.4, 3.7, xlim=(0, 12.8), ylim=(0, 7.4))
    w, h = 2.95, 1.55
    xs = [0.1, 3.3, 6.5, 9.7]
    yf, yi, yb = 4.95, 2.7, 0.3
    stages = [
        ("cumulative gate $b$\nper chunk\n(common.solve.\nchunk_cumsum)", PALETTE["light"]),
        (r"$\mathbf{T} = (\mathbf{I}+\mathbf{A})^{-1}$" + "\nevery chunk\n(common.solve.\nsolve_chunks)",
         PALETTE["key"]),
        (r"$\mathbf{W}$, $\tilde{\mathbf{U}}$, scores" + "\nevery chunk\n(wy.wy_factors)",
         PALETTE["key"]),
        ("march: state on chip,\nchunk after chunk\n(march.state_forward)", PALETTE["state"]),
    ]
    for x, (text, color) in zip(xs, stages):
        box(ax, x, yf, w, h, text, color=color, alpha=0.3, fontsize=6.8)
    for a, b in zip(xs[:-1], xs[1:]):
        arrow(ax, (a + w, yf + h / 2), (b, yf + h / 2))
    label(ax, (xs[1] + xs[2] + w) / 2, yf + h + 0.35, "parallel over chunks", fontsize=8,
          color="#444444")
    label(ax, xs[3] + w / 2, yf + h + 0.35, "sequential over chunks", fontsize=8, color="#444444")
    label(ax, xs[0] + w / 2, yf + h + 0.35, "forward (training)", fontsize=8, weight="bold")
    # inference: T goes straight to the march in T form
    box(ax, xs[3], yi, w, h, "march in T form\n(no gradient asked for)\n(march.inference_forward)",
        color=PALETTE["state"], alpha=0.15, fontsize=6.8)
    arrow(ax, (xs[1] + w / 2, yf), (xs[3], yi + h / 2), style="-|>", color="#666666")
    label(ax, xs[1] + 1.0, yi + 0.35, "inference:\nskip W, Ũ", fontsize=7, color="#666666")
    # backward: reverse march, then per-chunk gradients
    box(ax, xs[3], yb, w, h, "reverse march:\nstate gradient on chip\n(backward.state_grads)",
        color=PALETTE["highlight"], alpha=0.2, fontsize=6.8)
    box(ax, xs[2] - 0.3, yb, w, h, "gradients of every\nchunk, in parallel\n"
        "(backward.chunk_grads)", color=PALETTE["highlight"], alpha=0.2, fontsize=6.8)
    arrow(ax, (xs[3], yb + h / 2), (xs[2] - 0.3 + w, yb + h / 2))
    label(ax, xs[0] + 1.5, yb + h + 0.35, "backward (training)", fontsize=8, weight="bold")
    label(ax, xs[0] + 1.5, yb + h / 2, "reads what the forward saved:\n"
          r"$\mathbf{T}$, $\mathbf{W}$, scores, the state" + "\nentering every chunk, "
          r"$\mathbf{U}$", fontsize=6.8, color="#444444")
    return fig
