"""Chapter 8 (DeltaFormer): how one layer follows a chain of links before any query reads.

``draw_deltaformer_chain`` shows a five-statement program, ``c=5, x=2, f=c, a=f, a?``, as the
0/1 matrices of a DeltaFormer that follows its links exactly: ``B`` links each copy's key to the
key of the statement it copies (keys against earlier keys), ``P`` links the query to the statement
it asks about (queries against keys). Under each token it writes the pseudo-value ``u_t``, computed
by :func:`lattn_core.delta_attention` (with ``P = I`` it returns the pseudo-values), so the value of
``c`` is seen travelling down the chain with the sign ``(-beta)^(h-1)``, and the query's output.
"""
from __future__ import annotations

import numpy as np

from ..feeding_back import delta_attention
from .base import PALETTE, box, label, canvas

__all__ = ["draw_deltaformer_chain"]

# the program: (text, the earlier statement whose key this one's key matches, or None)
_PROGRAM = (("c=5", None), ("x=2", None), ("f=c", 0), ("a=f", 2), ("a?", None))


def draw_deltaformer_chain(beta: float = 1.0):
    """The program ``c=5, x=2, f=c, a=f, a?`` as DeltaFormer's links: arcs above the tokens are the
    nonzero entries of ``B`` (a copy's key finds the key of the statement it copies), the arc below
    is the query's entry of ``P``; under each token, its pseudo-value ``u_t = v_t - beta sum_j
    B_tj u_j`` (a multiple of the one-hot vector ``e_5`` or ``e_2``), and the query's output. The
    write strength ``beta`` is the same at every token (the copies' rows of ``B`` are the only
    nonzero ones, so ``beta`` acts only there).

    Defined in Chapter 8 (DeltaFormer)."""
    n = len(_PROGRAM)
    B = np.zeros((n, n))
    for t, (_, src) in enumerate(_PROGRAM):
        if src is not None:
            B[t, src] = 1.0
    V = np.zeros((n, 8))
    V[0, 5], V[1, 2] = 1.0, 1.0                   # the values of c=5 and x=2, one-hot
    U = delta_attention(np.eye(n), B, V, np.full(n, float(beta)))   # P = I: the pseudo-values
    P = np.zeros((n, n))
    P[4, 3] = 1.0                                 # a? reads the statement that assigns a
    O = delta_attention(P, B, V, np.full(n, float(beta)))

    def as_text(row):
        nz = np.flatnonzero(np.abs(row) > 1e-12)
        sub = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")
        return " + ".join(f"{row[i]:+.3g}·e{str(i).translate(sub)}" for i in nz) if nz.size else "0"

    fig, ax = canvas(6.4, 3.4, xlim=(0, 12.8), ylim=(0, 6.8))
    w, gap, y = 1.7, 0.75, 3.0
    xs = [0.9 + t * (w + gap) for t in range(n)]
    for t, (text, _) in enumerate(_PROGRAM):
        query = t == n - 1
        box(ax, xs[t], y, w, 0.9, text, color=PALETTE["query"] if query else PALETTE["key"],
            alpha=0.25, fontsize=10)
        label(ax, xs[t] + w / 2, y - 0.45, "output" if query else f"$u_{t + 1}$", fontsize=8.5,
              color="#444444")
        label(ax, xs[t] + w / 2, y - 1.0, as_text(O[t] if query else U[t]), fontsize=9,
              color=PALETTE["highlight"] if query else PALETTE["value"])
    for t, s in zip(*np.nonzero(B)):
        ax.annotate("", xy=(xs[s] + w / 2, y + 0.9), xytext=(xs[t] + w / 2, y + 0.9),
                    arrowprops=dict(arrowstyle="-|>", color=PALETTE["key"], lw=1.2,
                                    connectionstyle="arc3,rad=0.45", shrinkA=2, shrinkB=2))
    for t, s in zip(*np.nonzero(P)):
        ax.annotate("", xy=(xs[s] + w / 2, y - 1.3), xytext=(xs[t] + w / 2, y - 1.3),
                    arrowprops=dict(arrowstyle="-|>", color=PALETTE["query"], lw=1.2,
                                    connectionstyle="arc3,rad=-0.5", shrinkA=2, shrinkB=2))
    label(ax, 6.4, 6.35, "B (keys against keys): a copy finds the statement it copies",
          fontsize=9, color=PALETTE["key"])
    label(ax, 6.4, 5.7, rf"$u_t = v_t - \beta\,\Sigma_j B_{{tj}}u_j$, $\beta = {beta:g}$",
          fontsize=9, color="#444444")
    label(ax, 6.4, 0.3, "P (queries against keys): a? finds the statement assigning a",
          fontsize=9, color=PALETTE["query"])
    return fig
