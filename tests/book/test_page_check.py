"""tools/page_check.py finds what it claims to find: run it on a deliberately broken page and on a
clean one, in the same headless Chromium and MathJax 3 the book check uses.

Needs Debian's Chromium at /usr/bin/chromium (`make test` installs it) and the Python packages of
requirements.txt (playwright, django-static-mathjax).
"""
import base64
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("page_check", ROOT / "tools" / "page_check.py")
page_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(page_check)

PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")

HEAD = r"""<!doctype html><html><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
  body { margin: 0; font-family: sans-serif; }
  article.bd-article { max-width: 600px; padding: 0 20px; }
  pre { overflow: auto; font-family: monospace; font-size: 13px; padding: 8px; margin: 0; }
  div.math, span.math { display: flex; max-width: 100%; overflow: hidden; }
  span.math { display: inline-flex; }
  div.math mjx-container { flex-grow: 1; overflow: auto; }
</style>
<script>window.MathJax = {tex: {macros: {bQ: "\\boldsymbol{Q}"}},
                          options: {processHtmlClass: "math"}};</script>
<script defer src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"></script>
</head><body class="tex2jax_ignore mathjax_ignore"><article class="bd-article">
"""
TAIL = "</article></body></html>\n"

CLEAN = HEAD + r"""
<section id="fine"><h1>A clean page</h1>
<p>Some text with <span class="math notranslate">\(\bQ^\top x\)</span> inline.</p>
<div class="cell"><div class="cell_input"><div class="highlight"><pre>short = 1</pre></div></div>
<div class="cell_output"><div class="output text_plain"><pre>a short output line</pre></div>
<img src="fig.png" width="100"></div></div>
<div class="math notranslate">\[\bQ = \sum_j a_j\]</div>
<details><summary>hidden solution</summary><pre>also_short = 2</pre></details>
</section>""" + TAIL

LONG_SUM = " + ".join(f"a_{{{i}}} b_{{{i}}}" for i in range(60))
BROKEN = HEAD + rf"""
<section id="broken"><h1>A broken page</h1>
<div class="cell"><div class="cell_input"><div class="highlight"><pre>x = "{'y' * 150}"</pre></div></div>
<div class="cell_output"><div class="output text_plain"><pre>{'0.1234 ' * 40}</pre></div>
<div class="output text_html"><table><tr>{'<td>wide_table_cell</td>' * 30}</tr></table></div>
<img src="fig.png" width="50"><img src="fig.png" width="50"></div></div>
<div class="math notranslate" id="wide">\[{LONG_SUM}\]</div>
<div class="math notranslate" id="macro">\[\notamacro{{x}} + \bQ\]</div>
<div class="math notranslate" id="error">\[a^1^2\]</div>
<div class="math notranslate" id="untypeset">\[\frac{{1}}{{2\]</div>
<details><summary>hidden solution</summary><pre>hidden_line = "{'z' * 150}"</pre></details>
<script type="application/vnd.jupyter.widget-state+json">{{"state": {{}}}}</script>
<div class="jupyter-widgets">a slider</div>
</section>""" + TAIL


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    (site / "clean.html").write_text(CLEAN)
    (site / "broken.html").write_text(BROKEN)
    (site / "index.html").write_text('<meta http-equiv="refresh" content="0; url=clean.html">')
    (site / "fig.png").write_bytes(PNG)
    pages = page_check.find_pages(site)
    assert pages == ["broken.html", "clean.html"], "redirect pages are not checked"
    shots = site / "shots"
    result = page_check.check_pages(site, pages, widths=(1280, 390), shots=shots)
    result["shots"] = shots
    return result


def _found(report, page, width):
    return [f for f in report["failures"] if f["page"] == page and f["width"] == width]


@pytest.mark.parametrize("width", [1280, 390])
def test_clean_page_passes(report, width):
    assert _found(report, "clean.html", width) == []
    assert (report["shots"] / str(width) / "clean.png").stat().st_size > 0


@pytest.mark.parametrize("width", [1280, 390])
def test_broken_page_fails_on_every_kind(report, width):
    found = _found(report, "broken.html", width)
    def has(kind, problem_part, snippet_part=""):
        return any(f["kind"] == kind and problem_part in f["problem"] and snippet_part in f["snippet"]
                   for f in found)
    assert has("code", "sideways", 'x = "yyy'), found            # a code line too long
    assert has("code", "sideways", "hidden_line"), found         # also inside a closed <details>
    assert has("output", "sideways", "0.1234"), found             # a text output too wide
    assert has("output", "wider than the text column", "wide_table_cell"), found  # an HTML table
    assert has("equation", "sideways", "TeX: a_{0} b_{0} + a_{1}"), found           # a display equation too wide
    assert has("math", "undefined TeX macro \\notamacro"), found
    assert has("math", "MathJax error"), found
    assert has("math", "math left untypeset", "frac"), found
    assert has("widget", "embedded widget state"), found
    assert has("widget", "widget view"), found
    assert has("widget", "the same image twice"), found
    code = next(f for f in found if f["kind"] == "code" and 'x = "yyy' in f["snippet"])
    assert code["excess_px"] > 100 and code["line_chars"] == 156, code
    assert report["blocked_requests"] == {}, "MathJax must come from the local copy, nothing else"


def test_summary_names_pages_kinds_and_offenders(report):
    text = page_check.summarize(report)
    assert "broken.html" in text and "clean.html" not in text.split("worst offenders")[0]
    assert "worst offenders" in text and "equation" in text and "widget" in text
