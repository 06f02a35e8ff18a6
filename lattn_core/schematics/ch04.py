"""Chapter 4 (test-time training): the optimizer drawn as a recurrent network."""
from __future__ import annotations

from .base import PALETTE, arrow, box, canvas, label

__all__ = ["draw_optimizer_rnn", "draw_minibatch"]


def draw_optimizer_rnn():
    """Two tokens of test-time training drawn as an RNN: the state is the model's weights, the input
    is the pair (k_t, v_t), the update is one gradient step of the loss, the output is the updated
    model applied to the query.

    Defined in Chapter 4 (Test-time training)."""
    fig, ax = canvas(6.4, 3.0, xlim=(0, 12.8), ylim=(0, 6))
    state_w, state_h = 1.7, 1.0
    xs = [0.2, 5.5, 10.9]                      # the states S_{t-1}, S_t, S_{t+1}
    names = [r"$\mathbf{S}_{t-1}$", r"$\mathbf{S}_{t}$", r"$\mathbf{S}_{t+1}$"]
    y = 2.4
    for x, name in zip(xs, names):
        box(ax, x, y, state_w, state_h, name, color=PALETTE["state"], alpha=0.25, fontsize=11)
    label(ax, xs[0] + state_w / 2, y - 0.35, "weights of f", fontsize=8)
    steps = [("t", xs[0], xs[1]), ("t+1", xs[1], xs[2])]
    for tok, x0, x1 in steps:
        gx, gw = x0 + state_w + 0.35, x1 - x0 - state_w - 0.7
        box(ax, gx, y - 0.05, gw, state_h + 0.1, "gradient step\n"
            + r"$-\eta\,\nabla\mathcal{L}(\mathbf{f}(\mathbf{S};\mathbf{k}),\mathbf{v})$",
            color=PALETTE["light"], fontsize=8)
        arrow(ax, (x0 + state_w, y + state_h / 2), (gx, y + state_h / 2))
        arrow(ax, (gx + gw, y + state_h / 2), (x1, y + state_h / 2))
        # the training pair comes in from below
        arrow(ax, (gx + gw / 2, 0.55), (gx + gw / 2, y - 0.05), color=PALETTE["key"])
        label(ax, gx + gw / 2, 0.3, rf"input $(\mathbf{{k}}_{{{tok}}}, \mathbf{{v}}_{{{tok}}})$",
              fontsize=9, color=PALETTE["key"])
        # the output: the updated model read at the query
        xo = x1 + state_w / 2
        arrow(ax, (xo, y + state_h), (xo, 4.55), color=PALETTE["query"])
        label(ax, xo, 4.85, rf"$\mathbf{{o}}_{{{tok}}} = \mathbf{{f}}(\mathbf{{S}}_{{{tok}}};"
              rf"\mathbf{{q}}_{{{tok}}})$", fontsize=9, color=PALETTE["query"])
    label(ax, 6.4, 5.7, "state = model weights; update = one step of the optimizer", fontsize=9)
    return fig


def draw_minibatch(m: int = 4, n_blocks: int = 2):
    """Mini-batch TTT: every token of a block takes its gradient at the state the block started
    from (the arrows), so the block's gradients are independent and computed in parallel; only the
    step from block to block is sequential.

    Defined in Chapter 4 (Test-time training)."""
    fig, ax = canvas(6.4, 2.6, xlim=(0, 12.8), ylim=(0, 5.2))
    tok_w, gap = 0.85, 0.2
    x = 0.3
    y_state, y_tok = 3.6, 0.9
    for blk in range(n_blocks):
        start = r"$\mathbf{S}_{s}$" if blk == 0 else r"$\mathbf{S}_{s+%d}$" % (m * blk)
        box(ax, x, y_state, 1.3, 0.9, start, color=PALETTE["state"], alpha=0.25, fontsize=10)
        sx = x + 0.65
        if blk == 0:
            label(ax, sx - 0.1, 2.2, "every\ngradient\ntaken here", fontsize=7,
                  color=PALETTE["state"], ha="right")
        x += 1.7
        for i in range(m):
            tx = x + i * (tok_w + gap)
            tok = "s+%d" % (m * blk + i + 1)
            box(ax, tx, y_tok, tok_w, 0.8, r"$\nabla\mathcal{L}_{%s}$" % tok, color=PALETTE["light"],
                fontsize=8)
            arrow(ax, (sx, y_state), (tx + tok_w / 2, y_tok + 0.8), color=PALETTE["state"], lw=0.8)
        end = x + m * (tok_w + gap) - gap
        box(ax, x - 0.1, y_tok - 0.35, end - x + 0.2, 1.5, "", edge=PALETTE["mask"], color="none",
            lw=0.8)
        label(ax, (x + end) / 2, y_tok - 0.6, f"block {blk + 1}: {m} gradients in parallel", fontsize=8)
        x = end + 0.45
        if blk < n_blocks - 1:
            arrow(ax, (sx + 0.65, y_state + 0.45), (x, y_state + 0.45), "sum of the block's steps",
                  fontsize=8)
    return fig
