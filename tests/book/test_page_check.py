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
<p><em>Figure A.1: a figure, captioned right after its cell.</em></p>
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



# ---------------------------------------------------------------------------------------------
# What a reader reads: captions, raw TeX, progress bars, walls of output, empty sentences. Each
# detector has a page that must fail and a page of legitimate look-alikes that must pass.

def _cell(output_html, source="x = 1"):
    return (f'<div class="cell"><div class="cell_input"><div class="highlight"><pre>{source}</pre></div></div>'
            f'<div class="cell_output">{output_html}</div></div>')


IMG = '<img src="fig.png" width="60">'
TEXT = lambda t: f'<div class="output text_plain"><pre>{t}</pre></div>'
STDERR = lambda t: f'<div class="output stderr"><pre>{t}</pre></div>'
MARKDOWN = lambda t: f'<div class="output text_markdown">{t}</div>'
HTML = lambda t: f'<div class="output text_html">{t}</div>'
MATH = r'<span class="math notranslate nohighlight">\(\bQ^\top\)</span>'

NL = "\n"
THIRTY = NL.join(f"line {i}" for i in range(30))
ROWS = lambda n: "<table>" + "".join(f"<tr><td>{i}</td></tr>" for i in range(n)) + "</table>"

READING_OK = {
    # chapter 4's figures, numbered 4.1, 4.2 in page order; prose citing a figure is no caption
    "04_captions_ok.html": (
        "<p>Figure 4.1 shows the mask; the caption says what it is.</p>"
        + _cell(IMG)
        + "<p><em>Figure 4.1: the mask of " + MATH + ", with axes labelled.</em></p>"
        + "<p>Some prose between the figures.</p>"
        + _cell(IMG + TEXT("Live control (n) in Jupyter."))
        + "<p><em>Figure 4.2: a second figure, drawn with a live control.</em></p>"
        + r'<div class="math notranslate">\[\bQ = \sum_j a_j\]</div>'
        + _cell(TEXT("no figure here"))),
    # dollars and backslashes where they belong: code, typeset math, printed text that is no TeX
    "tex_ok.html": (
        "<p>Inline math " + MATH + r" is typeset; code keeps its own <code>$HOME</code> and <code>\n</code>.</p>"
        + r'<div class="highlight"><pre>c = "$\\alpha$"</pre></div>'
        + "<p>The rent is $5 and $10 a month (prices are not TeX).</p>"
        + _cell(TEXT("to $HOME/r.json" + NL + "$, $, $"))
        + _cell(MARKDOWN("<p>A Markdown output with " + MATH + " typeset.</p>"))),
    # no bar; percentages and pipes in a table are not one
    "progress_ok.html": (
        _cell(TEXT("| model | accuracy |" + NL + "| linear | 50% |" + NL + "trained 1800 steps in 12 s"))
        + _cell(STDERR("a warning, not a bar"))),
    # exactly 30 lines of text is allowed, and 30 rows of an HTML table
    "length_ok.html": _cell(TEXT(THIRTY)) + _cell(HTML(ROWS(30))),
    # sentences that end well, ellipses, decimals, paths, a value in math before its period
    "sentence_ok.html": (
        "<p>The value is " + MATH + ". Version 1.5 reads ./run.json and so on ... fine.</p>"
        + "<ul><li>a list item, then a period.</li></ul>"
        + _cell(TEXT(NL.join(["12 with a Triton op, 0 without.", "array([0. , 1. ])", "loading ...",
                              "ratio .25"])))),
}

READING_BAD = {
    "04_captions_bad.html": (
        _cell(IMG) + "<p>Prose right after a figure, no caption.</p>"
        + _cell(IMG) + "<p><em>Figure: a caption without its number.</em></p>"
        + _cell(IMG) + "<p><em>Figure 4.3: numbered 3 where 2 comes next.</em></p>"
        + _cell(IMG) + "<p><em>Figure 5.4: numbered in another chapter.</em></p>"),
    "tex_bad.html": (
        r"<p>Measured now: the matrix $\bB$ has no zero on its diagonal.</p>"
        + '<div class="citation"><span class="label">[1]</span><p>A paper on $O(n^2)$ attention.</p></div>'
        + r"<ul><li>a gate \alpha_t left raw in a list</li></ul>"
        + _cell(MARKDOWN(r"<p>a Markdown output with \gamma_t in it</p>"))
        + _cell(TEXT(r"the write strength $\beta_t$ printed raw"))),
    "progress_bad.html": _cell(STDERR("seed 0:   0%|          | 0/1800 [00:00&lt;?, ?step/s]")),
    "length_bad.html": _cell(TEXT(THIRTY + NL + "line 30")) + _cell(HTML(ROWS(31))),
    "sentence_bad.html": (
        "<p>The models that failed are .</p>"
        + "<p>The ones without a kernel: .</p>"
        + "<p>Kept: " + MATH + ", .</p>"
        + _cell(TEXT("12 with a Triton op in kernels, 0 without: ."))),
}


def _reading_page(body):
    return HEAD + f'<section id="reading"><h1>Reading</h1>{body}</section>' + TAIL


@pytest.fixture(scope="module")
def reading(tmp_path_factory):
    site = tmp_path_factory.mktemp("reading")
    (site / "fig.png").write_bytes(PNG)
    for name, body in {**READING_OK, **READING_BAD}.items():
        (site / name).write_text(_reading_page(body))
    return page_check.check_pages(site, sorted({**READING_OK, **READING_BAD}), widths=(1280, 390), shots=None)


def _problems(report, page, kind=None):
    return [f for f in report["failures"] if f["page"] == page and (kind is None or f["kind"] == kind)]


@pytest.mark.parametrize("page", sorted(READING_OK))
def test_legitimate_content_passes_the_reading_detectors(reading, page):
    assert _problems(reading, page) == []


def test_chapter_of_a_page():
    assert page_check.chapter_of("notebooks/05_delta_rule.html") == 5
    assert page_check.chapter_of("notebooks/12_whats_next.html") == 12
    assert page_check.chapter_of("book/benchmarks.html") is None


@pytest.mark.parametrize("width", [1280, 390])
def test_uncaptioned_and_misnumbered_figures_fail(reading, width):
    found = [f for f in _problems(reading, "04_captions_bad.html", "caption") if f["width"] == width]
    problems = [f["problem"] for f in found]
    assert sum("figure without its caption" in p for p in problems) == 1, found   # prose after it
    assert sum("not numbered" in p for p in problems) == 1, found                 # "Figure: ..."
    assert any("expected 4.2" in p for p in problems), found
    assert any("chapter 5, not 4" in p for p in problems), found


def test_raw_tex_fails(reading):
    found = [f for f in _problems(reading, "tex_bad.html", "tex") if f["width"] == 1280]
    snippets = " | ".join(f["snippet"] for f in found)
    for raw in ("$\\bB$", "$O(n^2)$", "\\alpha_t", "\\gamma_t", "$\\beta_t$"):
        assert raw in snippets, (raw, found)


def test_a_leftover_progress_bar_fails(reading):
    found = _problems(reading, "progress_bad.html", "progress")
    assert found and "0%|" in found[0]["snippet"] and "0/1800" in found[0]["snippet"], found


def test_a_wall_of_output_fails(reading):
    found = [f for f in _problems(reading, "length_bad.html", "length") if f["width"] == 1280]
    assert sorted(f["problem"].split(" lines")[0] for f in found) == ["an output of 31"] * 2, found
    assert page_check.MAX_OUTPUT_LINES == 30


def test_an_empty_sentence_fails(reading):
    found = [f for f in _problems(reading, "sentence_bad.html", "sentence") if f["width"] == 1280]
    snippets = [f["snippet"] for f in found]
    assert any("failed are ." in s for s in snippets), found
    assert any("kernel: ." in s for s in snippets), found
    assert any(", ." in s for s in snippets), found
    assert any("0 without: ." in s and "printed" in f["problem"] for s, f in zip(snippets, found)), found


def test_ignore_lists_a_kind_apart_without_failing(tmp_path):
    """``--ignore KIND`` (for a merge while chapters are being fixed): the run passes, and says what
    it did not check."""
    (tmp_path / "index.html").write_text('<meta http-equiv="refresh" content="0; url=length_bad.html">')
    (tmp_path / "length_bad.html").write_text(_reading_page(READING_BAD["length_bad.html"]))
    args = ["--html", str(tmp_path), "--out", str(tmp_path / "out"), "--no-screenshots", "--widths", "1280"]
    assert page_check.main(args) == 1
    assert page_check.main(args + ["--ignore", "length"]) == 0
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "NOT checked this run (--ignore), found: length 2" in summary
