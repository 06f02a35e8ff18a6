"""A small Sphinx extension of this book (loaded through ``sphinx.local_extensions`` in _config.yml).

The chapters' live controls (``lattn_core.notebook.show_widget``) need a kernel, which the rendered
book does not have: the page shows the figure at its default setting and one line saying the control
is live when the notebook runs. ``_config.yml`` takes the widget mime type out of the HTML render
priority (so that line, the bundle's ``text/plain``, is what the page shows); this extension drops the
ipywidgets state that myst-nb would otherwise embed in every page with a widget (a
``application/vnd.jupyter.widget-state+json`` script plus the widget JavaScript from a CDN), which
could draw a stale copy of the controls and their output a second time.
"""
from __future__ import annotations

WIDGET_JS_PREFIX = "ipywidgets"   # myst-nb's keys: "ipywidgets_state", "ipywidgets_0", ...


def drop_widget_state(app, doctree) -> None:
    """``doctree-read``: forget the widget state and widget scripts myst-nb noted for this page."""
    try:
        from myst_nb.sphinx_ import NbMetadataCollector
    except ImportError:  # pragma: no cover - myst-nb is what jupyter-book builds with
        return
    js_files = NbMetadataCollector.get_js_files(app.env, app.env.docname)
    for key in [k for k in js_files if k.startswith(WIDGET_JS_PREFIX)]:
        del js_files[key]


def setup(app):
    app.connect("doctree-read", drop_widget_state)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
