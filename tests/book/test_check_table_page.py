"""A check table (lattn_core.checks.check_table) as a reader sees it in the book: in headless
Chromium, styled by the book's own theme (pydata-sphinx-theme and sphinx-book-theme, MyST-NB's
and the book's CSS), in the light and the dark theme, at 1280 px and 390 px. Every piece of text
in it has a contrast of at least 4.5:1 with what is behind it (WCAG AA for normal text), and the
page check finds nothing wider than the text column.

Needs Debian's Chromium at /usr/bin/chromium and playwright (requirements.txt)."""
import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest
import sympy as sp

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("page_check", ROOT / "tools" / "page_check.py")
page_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(page_check)


def _theme_css():
    """The stylesheets the built book links, from the installed theme packages."""
    import myst_nb
    import pydata_sphinx_theme
    import sphinx_book_theme
    pst = Path(pydata_sphinx_theme.__file__).parent / "theme" / "pydata_sphinx_theme" / "static" / "styles"
    sbt = Path(sphinx_book_theme.__file__).parent / "theme" / "sphinx_book_theme" / "static" / "styles"
    return [pst / "pydata-sphinx-theme.css", sbt / "sphinx-book-theme.css",
            Path(myst_nb.__file__).parent / "static" / "mystnb.css", ROOT / "_static" / "lattn.css"]


def _outputs():
    from lattn_core.checks import check_close, check_symbolic, check_table
    x = sp.Symbol("x")
    checks = [check_close("chunkwise form (ch2-chunkwise) = recurrent form (ch2-recurrent), chunk 16",
                          np.ones(4), np.ones(4) + 3e-16, 1e-12),
              check_close("relative error of the float32 kernel", [1.0, 2.0], [1.0, 2.0 + 1e-7], 1e-5,
                          relative=True),
              check_symbolic("(x + 1)^2 = x^2 + 2x + 1", (x + 1) ** 2, x**2 + 2 * x + 1),
              check_close("shown failing on purpose", 1.0, 2.0, 1e-3, raise_on_fail=False)]
    return [check_table(*checks, title="Section 2.3: the three forms agree")._repr_html_(),
            checks[0]._repr_html_(), checks[3]._repr_html_()]


def _page(theme: str, css_names) -> str:
    links = "".join(f'<link rel="stylesheet" href="{n}">' for n in css_names)
    cells = "".join('<div class="cell docutils container"><div class="cell_output docutils container">'
                    f'<div class="output text_html">{h}</div></div></div>' for h in _outputs())
    return (f'<!doctype html><html lang="en" data-theme="{theme}" data-mode="{theme}"><head>'
            '<meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">'
            f'{links}</head><body><div class="bd-container"><div class="bd-main"><div class="bd-content">'
            '<div class="bd-article-container"><article class="bd-article"><section id="checks">'
            f'<h1>Checks</h1><p>Some prose before the table.</p>{cells}</section></article></div></div></div>'
            '</div></body></html>')


CONTRAST_JS = r"""
() => {
  const rgb = s => { const m = s.match(/rgba?\(([^)]+)\)/); if (!m) return null;
    const p = m[1].split(',').map(Number); return { r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1 }; };
  const lum = c => { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b); };
  const over = (top, bottom) => ({ r: top.r * top.a + bottom.r * (1 - top.a), g: top.g * top.a + bottom.g * (1 - top.a),
                                   b: top.b * top.a + bottom.b * (1 - top.a), a: 1 });
  const background = el => {   // what is painted behind el: its own and its ancestors' backgrounds, composed
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c && c.a > 0) { layers.push(c); if (c.a >= 1) break; }
    }
    let acc = { r: 255, g: 255, b: 255, a: 1 };  // the canvas, if nothing paints
    for (let i = layers.length - 1; i >= 0; i--) acc = over(layers[i], acc);
    return acc;
  };
  const out = [];
  const root = document.querySelector('article');
  const walker = document.createTreeWalker(root.querySelector('.cell') ? root : root, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (!n.textContent.trim() || !n.parentElement.closest('.cell_output')) continue;
    if (!n.parentElement.getClientRects().length) continue;   // not shown at this width
    const el = n.parentElement;
    const fg0 = rgb(getComputedStyle(el).color), bg = background(el);
    const fg = over(fg0, bg);
    const L1 = lum(fg), L2 = lum(bg);
    out.push({ text: n.textContent.trim().slice(0, 40), tag: el.tagName.toLowerCase(),
               ratio: (Math.max(L1, L2) + 0.05) / (Math.min(L1, L2) + 0.05),
               fg: getComputedStyle(el).color, bg: `rgb(${Math.round(bg.r)}, ${Math.round(bg.g)}, ${Math.round(bg.b)})` });
  }
  return { texts: out, page: getComputedStyle(document.body).backgroundColor };
}
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = tmp_path_factory.mktemp("checktable")
    names = []
    for path in _theme_css():
        assert path.is_file(), path
        shutil.copy(path, site / path.name)
        names.append(path.name)
    for theme in ("light", "dark"):
        (site / f"{theme}.html").write_text(_page(theme, names))
    (site / "index.html").write_text('<meta http-equiv="refresh" content="0; url=light.html">')
    return site


@pytest.mark.parametrize("width", [1280, 390])
@pytest.mark.parametrize("theme", ["light", "dark"])
def test_every_text_of_a_check_table_has_contrast(site, theme, width):
    from playwright.sync_api import sync_playwright
    server, base = page_check.serve(site)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=page_check.CHROMIUM, headless=True,
                                        args=page_check.CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.goto(base + f"{theme}.html", wait_until="load")
            found = page.evaluate(CONTRAST_JS)
            browser.close()
    finally:
        server.shutdown()
    page_rgb = [int(v) for v in found["page"].split("(")[1].split(")")[0].split(",")[:3]]
    assert (max(page_rgb) < 64) == (theme == "dark"), f"the {theme} theme did not apply: {found['page']}"
    texts = found["texts"]
    assert {"✓", "✗"} <= {t["text"] for t in texts}, texts
    # the measure shows once: in its column at 1280 px, under the identity on a phone
    assert any(t["text"] == "what is measured" for t in texts) == (width > 800)
    low = [t for t in texts if t["ratio"] < 4.5]
    assert not low, f"{theme}: text below 4.5:1 contrast: {low}"


def test_a_check_table_fits_the_column_on_a_phone(site):
    report = page_check.check_pages(site, ["light.html", "dark.html"], widths=(1280, 390), shots=None)
    assert report["failures"] == [], [(f["page"], f["width"], f["element"], f["excess_px"], f["snippet"][:60])
                                      for f in report["failures"]]
