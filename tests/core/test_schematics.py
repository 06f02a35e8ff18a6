"""The schematics' drawing primitives draw what they say, and every chapter's schematic draws
without error and with text on it (a figure that silently draws nothing must fail)."""
import importlib
import inspect
import pkgutil

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pytest

import lattn_core.schematics as sch
from lattn_core.schematics import base


def test_matrix_draws_one_cell_per_entry_and_outlines_blocks():
    fig, ax = base.canvas()
    m = np.tril(np.ones((8, 8)))
    m[m == 0] = np.nan
    base.matrix(ax, m, blocks=4)
    cells = [p for p in ax.patches if p.get_width() == 0.25]
    assert len(cells) == 64
    assert len(ax.lines) == 2 * 3          # block boundaries at 0, 4, 8 in both directions
    plt.close(fig)


def test_box_and_arrow_carry_their_text():
    fig, ax = base.canvas()
    base.box(ax, 1, 1, 2, 1, "state")
    base.arrow(ax, (3, 1.5), (5, 1.5), "write")
    assert {t.get_text() for t in ax.texts} == {"state", "write"}
    plt.close(fig)


CHAPTER_MODULES = sorted(m.name for m in pkgutil.iter_modules(sch.__path__) if m.name.startswith("ch"))


@pytest.mark.parametrize("module", CHAPTER_MODULES)
def test_chapter_schematics_draw(module):
    """Every public ``draw_*`` function of a chapter's module returns a figure with text on it."""
    mod = importlib.import_module(f"lattn_core.schematics.{module}")
    fns = [f for n, f in inspect.getmembers(mod, inspect.isfunction) if n.startswith("draw_") and f.__module__ == mod.__name__]
    assert fns, f"{module} has no draw_* function"
    for fn in fns:
        fig = fn()
        texts = [t for ax in fig.axes for t in ax.texts] + [t for t in fig.texts]
        assert texts and fig.axes, f"{module}.{fn.__name__} drew no text"
        plt.close(fig)
