"""The notebook helpers of lattn_core.notebook, run in a real kernel, and the book's widget rendering.

``show_widget`` must put ONE figure in the cell's outputs (at the defaults) and one widget bundle
whose ``text/plain`` is the one line the rendered book shows; moving a control must redraw that same
figure in place (a display update, no second figure). The book's configuration must keep the widget
view out of the HTML and drop the embedded widget state (tools/book_ext.py).
"""
import base64
import sys
from pathlib import Path

import pytest
import yaml
from nbformat.v4 import new_code_cell, new_notebook

ROOT = Path(__file__).resolve().parents[2]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

CELLS = [
    "import matplotlib.pyplot as plt\nimport ipywidgets as widgets\n"
    "from lattn_core.notebook import show_widget, live_control_note",
    "def draw(a=1.0, n=3):\n"
    "    fig, ax = plt.subplots(figsize=(3, 2))\n"
    "    ax.plot(range(n), [a * i for i in range(n)])\n"
    "    ax.set_title(f'a = {a}, n = {n}')",
    "w = show_widget(draw, a=widgets.FloatSlider(value=1.0, min=0.0, max=2.0, description='slope a'),\n"
    "                n=widgets.IntSlider(value=3, min=2, max=9));",
    "w.children[0].value = 2.0",
    "print(live_control_note(dict(a=w.children[0], n=w.children[1])))",
]


def _png(output):
    return base64.b64decode(output["data"]["image/png"])


@pytest.fixture(scope="module")
def executed():
    """Run the cells one by one in a kernel; keep the widget cell's figure before the control moves."""
    from nbclient import NotebookClient

    nb = new_notebook(cells=[new_code_cell(src) for src in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}})
    snapshots = {}
    with client.setup_kernel():
        for i, cell in enumerate(nb.cells):
            client.execute_cell(cell, i)
            snapshots[i] = [dict(o) for o in nb.cells[2].outputs]
            if i == 2:
                snapshots["png_default"] = _png(nb.cells[2].outputs[0])
        client.set_widgets_metadata()
    return nb, snapshots, client


def test_show_widget_outputs_one_figure_and_one_widget_line(executed):
    nb, snapshots, _ = executed
    outs = snapshots[2]  # the widget cell's outputs right after it ran
    kinds = [sorted(o.get("data", {})) for o in outs]
    assert len(outs) == 2, f"expected [figure, widget bundle], got {kinds}"
    figure, bundle = outs
    assert "image/png" in figure["data"], kinds
    assert set(bundle["data"]) == {"text/plain", WIDGET_VIEW}, kinds
    line = bundle["data"]["text/plain"]
    assert "\n" not in line.strip() and "live" in line.lower() and "slope a" in line, line
    assert line == nb.cells[4].outputs[0]["text"].strip(), "the line is live_control_note's"
    assert bundle["data"][WIDGET_VIEW]["model_id"]
    # no other cell shows a figure or a widget
    for i, cell in enumerate(nb.cells):
        if i != 2:
            assert not any("image/png" in o.get("data", {}) or WIDGET_VIEW in o.get("data", {})
                           for o in cell.outputs), f"cell {i} shows a figure or widget"


def test_moving_a_control_redraws_the_same_figure_in_place(executed):
    nb, snapshots, _ = executed
    outs = nb.cells[2].outputs
    assert len(outs) == 2 and "image/png" in outs[0]["data"], "the redraw must not add an output"
    assert _png(outs[0]) != snapshots["png_default"], "the figure was not redrawn after the control moved"
    assert nb.cells[3].outputs == [], "the redraw must update the figure above, not print a new one"


def test_widget_state_holds_no_second_figure(executed):
    """The widgets' own state (what an embedding would draw) has no Output widget with a figure."""
    nb, _, client = executed
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    assert state, "the kernel created no widget at all"
    models = {s["model_name"] for s in state.values()}
    assert "OutputModel" not in models, models
    assert any(m in models for m in ("FloatSliderModel", "IntSliderModel")), models


def test_a_cell_ending_in_show_widget_shows_the_controls_once():
    """A cell whose last line is ``show_widget(...)`` without ``;`` has the returned box as its
    value: the controls (and the book's one line) appear once in that cell, and a later cell that
    shows the box again still can."""
    from nbclient import NotebookClient

    cells = [CELLS[0], CELLS[1],
             "w = None\nshow_widget(draw, a=widgets.FloatSlider(value=1.0, description='slope a'))",
             "w = _\nw"]
    nb = new_notebook(cells=[new_code_cell(src) for src in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    bundles = lambda cell: [o for o in cell.outputs if WIDGET_VIEW in o.get("data", {})]  # noqa: E731
    shown = bundles(nb.cells[2])
    assert len(shown) == 1, [sorted(o.get("data", {})) for o in nb.cells[2].outputs]
    assert shown[0]["data"]["text/plain"].startswith("Live control (slope a)")
    assert sum("image/png" in o.get("data", {}) for o in nb.cells[2].outputs) == 1
    assert len(bundles(nb.cells[3])) == 1, "a later cell can show the controls again"


def test_book_config_hides_widget_views_and_state():
    from myst_nb.core.render import get_mime_priority

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    sphinx = config["sphinx"]
    overrides = [tuple(o) for o in sphinx["config"]["nb_mime_priority_overrides"]]
    html = get_mime_priority("html", overrides)
    assert WIDGET_VIEW not in html and "text/plain" in html, html
    assert "book_ext" in sphinx.get("local_extensions", {}), "tools/book_ext.py is not loaded"
    assert (ROOT / sphinx["local_extensions"]["book_ext"] / "book_ext.py").exists()


def test_book_ext_drops_widget_state_and_scripts():
    from types import SimpleNamespace

    from myst_nb.sphinx_ import NbMetadataCollector
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import book_ext
    finally:
        sys.path.remove(str(ROOT / "tools"))
    env = SimpleNamespace(docname="notebooks/x")
    NbMetadataCollector.add_js_file(env, "notebooks/x", "ipywidgets_state", None, {"type": WIDGET_STATE})
    NbMetadataCollector.add_js_file(env, "notebooks/x", "ipywidgets_0", "require.js", {})
    NbMetadataCollector.add_js_file(env, "notebooks/x", "other", "other.js", {})
    book_ext.drop_widget_state(SimpleNamespace(env=env), None)
    assert list(NbMetadataCollector.get_js_files(env, "notebooks/x")) == ["other"]


# --- check lines (lattn_core.checks): no line wider than the book's text column at 1280 px ----------

NAMES = ["short", "TTT[squared] (autodiff) = DeltaNet with beta = eta",
         "kernels.chunk_delta_rule (torch backend), head 0 = lc.deltanet_recurrent(q, k, v, beta)",
         "eigenvalues of I − βkkᵀ, β = 0.5: {1 − β, 1, ..., 1} " * 3,
         "an_unbreakable_identifier_" * 6]


@pytest.mark.parametrize("name", NAMES, ids=range(len(NAMES)))
@pytest.mark.parametrize("form", ["close", "relative", "failing", "symbolic"])
def test_check_lines_fit_the_text_column(name, form):
    import sympy as sp

    import lattn_core as lc
    from lattn_core.checks import LINE_WIDTH

    assert LINE_WIDTH <= 80, "80 monospace characters is what fits the column at 1280 px"
    if form == "symbolic":
        x = sp.Symbol("x")
        result = lc.check_symbolic(name, (x + 1) ** 2, x**2 + 2 * x + 1)
    else:
        result = lc.check_close(name, [1.0, 2.0], [1.0, 2.0 + 3e-13] if form != "failing" else [1.0, 5.0],
                                1e-12, relative=form == "relative", raise_on_fail=False)
    text = repr(result)
    lines = text.split("\n")
    assert all(len(line) <= LINE_WIDTH for line in lines), [len(line) for line in lines]
    assert text.startswith("✓" if result.passed else "✗")
    assert "".join(name.split()) in "".join(text.split()), "the name must survive the wrapping"
    if form != "symbolic":
        assert f"{result.error:.2e}" in lines[-1] and f"tol {result.tol:.0e}" in lines[-1], \
            "the measured error and the tolerance stay together on one line"
    html = result._repr_html_()
    import re
    shown = re.sub(r"<[^>]+>", "", html).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    assert shown == text, "the HTML shows the repr, its mark coloured"
    assert "color:" not in html.split(">", 1)[0], "the text keeps the page's colour (light and dark themes)"
    if len(f"✓ {name}: ") < 40:
        assert len(lines) == 1, "a short check stays on one line"


def test_setup_output_fits_the_text_column(capsys):
    import numpy as np

    from lattn_core.checks import LINE_WIDTH
    from lattn_core.notebook import setup

    setup()
    printed = capsys.readouterr().out
    assert all(len(line) <= LINE_WIDTH for line in printed.splitlines()), printed
    assert all(len(line) <= LINE_WIDTH for line in str(np.random.default_rng(0).normal(size=(4, 30))).splitlines())


def test_source_lines_cuts_real_source_between_markers():
    """The excerpt helper the kernel sections use: the lines between two markers of a real kernel,
    dedented, and a clear error when a marker is missing (an excerpt cannot drift from the code)."""
    from kernels.delta.march import _march_t_kernel
    from lattn_core.notebook import source_lines
    lines = source_lines(_march_t_kernel, "for n in range(N0, N1)", "S = tl.dot(tl.trans(k)")
    assert lines[0].startswith("for n in range(N0, N1)") and lines[-1].lstrip().startswith("S = tl.dot(")
    assert all(not l.startswith(" " * 8) or l.startswith(" " * 4) for l in lines)
    with pytest.raises(ValueError, match="start marker"):
        source_lines(_march_t_kernel, "no such line")
    with pytest.raises(ValueError, match="stop marker"):
        source_lines(_march_t_kernel, "for n in range(N0, N1)", "no such line")


def test_show_source_breaks_long_lines_to_the_column(capsys):
    """``show_source`` prints a kernel excerpt within the book's column: a line wider than
    ``LINE_WIDTH`` is broken inside its brackets (still valid Python), a trailing comment moves
    above its code, and the heading says lines were broken; ``width=None`` prints them as they are."""
    import ast
    from kernels.gla.march import _fwd_kernel
    from lattn_core.checks import LINE_WIDTH
    from lattn_core.notebook import show_source, source_lines
    start, stop = "# q goes to the tensor cores", "o_c += tl.dot"
    raw = source_lines(_fwd_kernel, start, stop)
    assert max(map(len, raw)) > LINE_WIDTH, "the excerpt no longer needs breaking: pick another"
    show_source(_fwd_kernel, start, stop)
    head, *body = capsys.readouterr().out.splitlines()
    assert "long lines broken" in head
    assert max(map(len, body)) <= LINE_WIDTH, [l for l in body if len(l) > LINE_WIDTH]
    strip = lambda lines: "".join("".join(l.split()) for l in lines if not l.lstrip().startswith("#"))  # noqa: E731
    assert strip(body) == strip(l.split("  # ")[0] for l in raw), "breaking changed the code"
    # still Python: the excerpt starts one block deeper than it ends
    ast.parse("if 1:\n    if 1:\n" + "\n".join("    " + l for l in body))
    show_source(_fwd_kernel, start, stop, width=None)
    head, *body = capsys.readouterr().out.splitlines()
    assert body == raw and "broken" not in head
