"""Drawing primitives shared by the chapters' schematics.

Every function draws on a given matplotlib ``Axes`` in data coordinates and returns what it drew, so
a chapter composes a diagram from a few calls. :func:`canvas` makes an axes without ticks or frame
in a fixed aspect, sized for the book's text column.
"""
from __future__ import annotations

import numpy as np

__all__ = ["canvas", "box", "arrow", "label", "matrix", "PALETTE"]

#: The colours the schematics use (colour-blind-safe, the matplotlib defaults' first ones).
PALETTE = {"query": "#1f77b4", "key": "#ff7f0e", "value": "#2ca02c", "state": "#9467bd",
           "mask": "#7f7f7f", "highlight": "#d62728", "light": "#eeeeee"}


def canvas(width: float = 6.4, height: float = 3.2, xlim=(0, 10), ylim=(0, 5)):
    """A figure with one frameless axes, ``xlim`` × ``ylim`` data units, equal aspect.

    Used throughout the book."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(width, height))
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig, ax


def box(ax, x: float, y: float, w: float, h: float, text: str = "", *, color: str = "#ffffff",
        edge: str = "#333333", fontsize: float = 9, alpha: float = 1.0, lw: float = 1.0):
    """A rectangle with its lower-left corner at ``(x, y)`` and ``text`` centred in it.

    Used throughout the book."""
    from matplotlib.patches import Rectangle
    r = Rectangle((x, y), w, h, facecolor=color, edgecolor=edge, alpha=alpha, lw=lw)
    ax.add_patch(r)
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)
    return r


def arrow(ax, start, end, text: str = "", *, color: str = "#333333", fontsize: float = 8, offset=(0, 0.15),
          style: str = "-|>", lw: float = 1.0):
    """An arrow from ``start`` to ``end`` with an optional ``text`` beside its middle.

    Used throughout the book."""
    from matplotlib.patches import FancyArrowPatch
    a = FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=10, color=color, lw=lw,
                        shrinkA=2, shrinkB=2)
    ax.add_patch(a)
    if text:
        mx, my = (start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1]
        ax.text(mx, my, text, ha="center", va="bottom", fontsize=fontsize, color=color)
    return a


def label(ax, x: float, y: float, text: str, *, fontsize: float = 9, ha: str = "center", va: str = "center",
          color: str = "#111111", **kw):
    """Text at ``(x, y)`` (a thin wrapper, so every schematic uses the same sizes).

    Used throughout the book."""
    return ax.text(x, y, text, fontsize=fontsize, ha=ha, va=va, color=color, **kw)


def matrix(ax, values, x: float = 0.0, y: float = 0.0, cell: float = 0.25, *, blocks=None, cmap: str = "Blues",
           vmin=None, vmax=None, block_color: str = "#d62728", grid: bool = True, text: bool = False):
    """Draw a matrix as a grid of coloured cells, row 0 at the top, its top-left corner at
    ``(x, y + rows·cell)``. ``blocks``: a block size (or a list of split points) whose boundaries are
    outlined, e.g. the chunks of a chunkwise computation. Masked entries (``np.nan``) stay white.
    ``text``: write each entry's value in its cell (small matrices only).

    Used throughout the book."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    v = np.asarray(values, dtype=float)
    rows, cols = v.shape
    finite = v[np.isfinite(v)]
    lo = vmin if vmin is not None else (finite.min() if finite.size else 0.0)
    hi = vmax if vmax is not None else (finite.max() if finite.size else 1.0)
    cm = plt.get_cmap(cmap)
    top = y + rows * cell
    for r in range(rows):
        for c in range(cols):
            val = v[r, c]
            face = "#ffffff" if not np.isfinite(val) else cm(0.15 + 0.85 * (val - lo) / (hi - lo or 1.0))
            ax.add_patch(Rectangle((x + c * cell, top - (r + 1) * cell), cell, cell, facecolor=face,
                                   edgecolor="#cccccc" if grid else face, lw=0.4))
            if text and np.isfinite(val):
                ax.text(x + (c + 0.5) * cell, top - (r + 0.5) * cell, f"{val:.2g}", ha="center", va="center",
                        fontsize=6)
    if blocks is not None:
        cuts = list(range(0, max(rows, cols) + 1, blocks)) if isinstance(blocks, int) else [0, *blocks]
        for p in cuts:
            if p <= cols:
                ax.plot([x + p * cell] * 2, [top, top - rows * cell], color=block_color, lw=1.2)
            if p <= rows:
                ax.plot([x, x + cols * cell], [top - p * cell] * 2, color=block_color, lw=1.2)
    ax.add_patch(Rectangle((x, y), cols * cell, rows * cell, fill=False, edgecolor="#333333", lw=1.0))
    return (x, y, cols * cell, rows * cell)
