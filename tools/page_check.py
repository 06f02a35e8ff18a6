"""The page check: what a reader sees in the BUILT book (_build/html), in headless Chromium.

    python tools/page_check.py                       # every page at 1280 px and 390 px
    python tools/page_check.py --page 05_delta       # pages whose path contains a string
    python tools/page_check.py --no-screenshots --report /tmp/r.json --summary /tmp/s.txt
    python tools/page_check.py --ignore caption --ignore length   # while chapters are being fixed

Every chapter and book page is served from a local HTTP server and rendered at each width (1280 px, a
laptop; 390 px, a phone) with everything a reader can open opened (hidden cells, toggles). After
MathJax has finished typesetting, it fails (exit status 1) on:

* overflow: an output block, code block, display equation, table or figure wider than the text column
  (it sticks out of ``article.bd-article``'s content box), or an element that scrolls or clips
  sideways (``scrollWidth > clientWidth``: a reader sees it clipped), or a page that scrolls sideways;
* math: a MathJax error (``mjx-merror``, an undefined macro, math left untypeset, MathJax not loaded);
* widgets: a widget shown twice (embedded widget state or views, ``.jupyter-widgets``), a live
  control without its static figure, or one image shown twice in a cell;
* captions (the book's convention, helpers' RULES and BOOK.md): a code cell whose output shows an
  image (``img``, or an ``svg`` that is not MathJax's) not followed at once by its caption, a
  paragraph starting ``Figure <chapter>.<k>:``; a caption (a paragraph starting ``Figure`` and, within
  a few words, a colon) not numbered that way; captions whose ``k`` do not run 1, 2, 3, ... in page
  order. ``<chapter>`` is the number the page's file name starts with (``05_delta_rule.html``: 5);
  a page whose name starts with no number (an appendix) may use any one label, a letter or a number,
  for all its captions;
* raw TeX: a ``$...$`` pair or a ``\\command`` in rendered text outside MathJax's output and outside
  code: prose, lists, tables, captions, the bibliography and cell outputs rendered as HTML or
  Markdown; in plain-text outputs (printed text) a ``$...$`` pair that holds TeX (a backslash, ``^``,
  ``_`` or a brace), as code's own ``$`` is legitimate there;
* a progress bar left in an output (tqdm's ``  0%|          | 0/1800 [...]``);
* an output over ``MAX_OUTPUT_LINES`` (30) lines: per code cell, the lines of its text outputs plus
  the rows, list items and paragraphs of its HTML and Markdown outputs;
* an empty sentence: `` .`` after a word (`` ... without .``), ``: .``, ``, .`` (an empty list
  before the period), in rendered text and text outputs.

It writes a full-page screenshot of every page at each width to ``--out`` (default
``_build/pagecheck/<width>/``), a JSON report (``--report``, default ``_build/pagecheck/report.json``)
listing page, width, kind, element, excess width and a text snippet, and a summary (counts per page
and kind, the worst offenders) to stdout and ``--summary``.

The browser is Debian's Chromium (``/usr/bin/chromium``, driven by Playwright's Python package; no
browser is downloaded). The book loads MathJax 3 from a CDN; the check never reaches the network: it
answers those requests from the MathJax 3 copy of the ``django-static-mathjax`` PyPI package and
blocks (and lists) any other outside request.
"""
from __future__ import annotations

import argparse
import functools
import http.server
import importlib.util
import json
import mimetypes
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WIDTHS = (1280, 390)
HEIGHT = 900
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
MATHJAX_CDN = "https://cdn.jsdelivr.net/npm/mathjax@3/"
SKIP_PAGES = {"genindex.html", "search.html", "py-modindex.html"}
MAX_OUTPUT_LINES = 30   # the most lines one code cell's output may take (a wall of output is a table or a figure)
try:  # the one line show_widget prints where the book cannot show the live control
    from lattn_core.notebook import LIVE_PREFIX
except Exception:  # pragma: no cover - the check also runs on a book without the package
    LIVE_PREFIX = "Live control ("

# Runs in the page after MathJax has typeset. Returns the findings (a list of plain objects).
DETECTOR_JS = r"""
async (args) => {
  const livePrefix = args.livePrefix, chapter = args.chapter, maxLines = args.maxOutputLines;
  // Open what a reader can open: hidden cells (details) and sphinx-togglebutton toggles.
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  document.querySelectorAll('.toggle-hidden').forEach(e => e.classList.remove('toggle-hidden'));
  document.querySelectorAll('button.toggle-button[aria-expanded="false"]').forEach(b => b.click());
  // MathJax's hidden MathML for screen readers is clipped to 1 px but counts in scrollWidth.
  const hide = document.createElement('style');
  hide.textContent = 'mjx-assistive-mml { display: none !important; }';
  document.head.appendChild(hide);
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));

  const TOL = 1.5;   // px: sub-pixel rounding
  const findings = [];
  const article = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
  const acs = getComputedStyle(article);
  const ar = article.getBoundingClientRect();
  const col = { left: ar.left + parseFloat(acs.paddingLeft), right: ar.right - parseFloat(acs.paddingRight) };

  const texOf = new Map();
  const mj = window.MathJax;
  if (mj && mj.startup && mj.startup.document && mj.startup.document.math) {
    for (const item of mj.startup.document.math) if (item.typesetRoot) texOf.set(item.typesetRoot, item.math);
  }
  const IGNORE = 'mjx-assistive-mml, .headerlink, .copybtn, script, style, .visually-hidden, .sr-only';
  const visible = el => {
    if (el.closest(IGNORE)) return false;
    const r = el.getBoundingClientRect();
    if (r.width <= 0 || r.height <= 0) return false;
    const s = getComputedStyle(el);
    return s.visibility !== 'hidden' && s.display !== 'none' && s.position !== 'fixed';
  };
  const clipsX = el => ['auto', 'scroll', 'hidden', 'clip'].includes(getComputedStyle(el).overflowX);
  const kindOf = el => {
    if (el.closest('mjx-container, div.math, span.math, .MathJax')) return 'equation';
    if (el.closest('.cell_output, .output')) return 'output';
    if (el.closest('pre, div.highlight, .cell_input, code')) return 'code';
    if (el.closest('table') || (el.querySelector && el.querySelector('table'))) return 'table';
    if (el.closest('img, figure, svg')) return 'figure';
    return 'other';
  };
  const cellIndex = el => {
    const cell = el.closest('div.cell');
    if (!cell) return null;
    return Array.from(article.querySelectorAll('div.cell')).indexOf(cell) + 1;
  };
  const where = el => {
    let sec = el.closest('section[id]');
    const parts = [];
    const c = cellIndex(el);
    if (c) parts.push('code cell ' + c + (el.closest('.cell_output') ? ' output' : ' source'));
    if (sec) parts.push('§' + sec.id);
    return parts.join(', ');
  };
  const describe = el => {
    let s = el.tagName.toLowerCase();
    if (el.id) s += '#' + el.id;
    const cls = (typeof el.className === 'string' ? el.className : '').trim().split(/\s+/).filter(Boolean).slice(0, 3);
    if (cls.length) s += '.' + cls.join('.');
    return s;
  };
  const snippet = el => {
    const host = el.closest('mjx-container') || (el.querySelector && el.querySelector('mjx-container'));
    if (host && texOf.has(host)) return 'TeX: ' + texOf.get(host).trim().replace(/\s+/g, ' ').slice(0, 200);
    const pre = longestLine(el);
    if (pre !== null) return pre.replace(/\s+$/, '').slice(0, 200);
    let text = (el.innerText || el.textContent || '').replace(/\s+/g, ' ').trim();
    if (!text && el.tagName === 'IMG') text = 'img ' + (el.getAttribute('src') || '');
    return text.slice(0, 200);
  };
  const longestLine = el => {  // the longest line of the code/text block el is or holds, or null
    const pre = el.closest('pre') || (el.querySelector && el.querySelector('pre'));
    if (!pre) return null;
    return (pre.textContent || '').split('\n').reduce((a, b) => (b.length > a.length ? b : a), '');
  };
  const add = (el, kind, problem, excess, extra) => {
    const f = { kind, problem, where: where(el), element: describe(el), excess_px: Math.round(excess),
                snippet: snippet(el) };
    const line = longestLine(el);
    if (line !== null) f.line_chars = line.replace(/\s+$/, '').length;
    findings.push(Object.assign(f, extra || {}));
  };

  // 1. Overflow. (a) Elements that scroll or clip sideways: the outermost one is reported.
  const all = Array.from(article.querySelectorAll('*')).filter(visible);
  const clippers = [];
  const mathInternal = el => el.tagName.startsWith('MJX-') && el.tagName !== 'MJX-CONTAINER';
  for (const el of all) {
    // MathJax's own parts (stretchy extenders, ...) clip on purpose; their container is measured.
    if (mathInternal(el) || !clipsX(el) || el.scrollWidth <= el.clientWidth + TOL) continue;
    if (clippers.some(c => c.contains(el))) continue;
    clippers.push(el);
    add(el, kindOf(el), 'scrolls or is clipped sideways', el.scrollWidth - el.clientWidth,
        { width_px: Math.round(el.scrollWidth), column_px: Math.round(col.right - col.left) });
  }
  // (b) Elements that stick out of the text column (outermost; content of a clipper excluded).
  const stickers = [];
  for (const el of all) {
    const r = el.getBoundingClientRect();
    const excess = Math.max(r.right - col.right, col.left - r.left);
    if (excess <= TOL) continue;
    let p = el.parentElement, inside = false;
    while (p && p !== article) { if (clipsX(p) || stickers.includes(p)) { inside = true; break; } p = p.parentElement; }
    if (inside) continue;
    stickers.push(el);
    add(el, kindOf(el), 'wider than the text column', excess,
        { width_px: Math.round(r.width), column_px: Math.round(col.right - col.left) });
  }
  // (c) The page itself scrolls sideways.
  const pageExcess = document.documentElement.scrollWidth - window.innerWidth;
  if (pageExcess > TOL) findings.push({ kind: 'page', problem: 'the page scrolls sideways', where: '',
    element: 'html', excess_px: Math.round(pageExcess), snippet: '' });

  // 2. Math.
  const mathEls = article.querySelectorAll('div.math, span.math');
  if (mathEls.length && !(mj && mj.startup && mj.startup.document)) {
    findings.push({ kind: 'math', problem: 'MathJax did not load', where: '', element: 'script',
      excess_px: 0, snippet: mathEls.length + ' math elements untypeset' });
  } else {
    for (const el of mathEls) if (!el.querySelector('mjx-container') && el.textContent.trim())
      add(el, 'math', 'math left untypeset', 0);
    for (const el of document.querySelectorAll('mjx-merror, [data-mjx-error]')) if (!el.closest('mjx-assistive-mml'))
      add(el, 'math', 'MathJax error: ' + (el.getAttribute('data-mjx-error') || el.textContent).slice(0, 120), 0);
    if (mj && mj.startup && mj.startup.document) for (const item of mj.startup.document.math) {
      if (!item.root || !item.root.walkTree) continue;
      item.root.walkTree(node => {
        if (node.isKind && node.isKind('merror')) return;  // reported through mjx-merror above
        if (node.isKind && node.isKind('mtext') && node.attributes && node.attributes.get('mathcolor') === 'red') {
          const text = (node.childNodes || []).map(c => (c.getText ? c.getText() : c.text) || '').join('');
          if (text.startsWith('\\') && item.typesetRoot)
            add(item.typesetRoot, 'math', 'undefined TeX macro ' + text, 0);
        }
      });
    }
  }

  // 3. Widgets: the rendered book shows a widget's figure once and one line instead of the control.
  for (const el of document.querySelectorAll('script[type="application/vnd.jupyter.widget-state+json"]'))
    findings.push({ kind: 'widget', problem: 'embedded widget state (draws the widget again)', where: '',
      element: 'script[widget-state]', excess_px: 0, snippet: el.textContent.slice(0, 120) });
  for (const el of document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"], .jupyter-widgets, .widget-area, .jupyter-widgets-view'))
    add(el, 'widget', 'widget view in the page', 0);
  for (const cell of article.querySelectorAll('div.cell')) {
    const srcs = Array.from(cell.querySelectorAll('.cell_output img')).map(i => i.getAttribute('src'));
    const twice = srcs.filter((s, i) => srcs.indexOf(s) !== i);
    if (twice.length) add(cell, 'widget', 'the same image twice in one cell', 0, { snippet: twice[0] });
    const live = Array.from(cell.querySelectorAll('.cell_output pre, .cell_output p'))
      .some(p => p.textContent.trim().startsWith(livePrefix));
    if (live && !srcs.length) add(cell, 'widget', 'live control without its static figure', 0);
  }

  // 4. What a reader reads: captions, raw TeX, progress bars, walls of output, empty sentences.
  const CODE = 'pre, code, kbd, samp, .highlight, .cell_input, script, style';
  const MATH = 'mjx-container, mjx-assistive-mml, .math, .MathJax';
  // The text of a block as a reader reads it, with math and code replaced by a placeholder (so
  // "the value $x$." reads "the value ⟨m⟩.", never "the value .").
  const BLOCKS = 'p, li, td, th, dt, dd, h1, h2, h3, h4, h5, h6, caption, figcaption, blockquote, div.citation, span.label';
  const readText = el => {
    let out = '';
    const walk = node => {
      for (const c of node.childNodes) {
        if (c.nodeType === 3) { out += c.textContent; continue; }
        if (c.nodeType !== 1) continue;
        if (c.matches(MATH)) { out += '⟨m⟩'; continue; }
        if (c.matches(CODE)) { out += '⟨c⟩'; continue; }
        if (c.matches('.headerlink, .copybtn, .visually-hidden, .sr-only')) continue;
        if (c.matches(BLOCKS) && c !== el) continue;   // its own block, read on its own
        walk(c);
      }
    };
    walk(el);
    return out.replace(/\s+/g, ' ').trim();
  };
  const inOutput = el => el.closest('.cell_output, .output');
  const textOutputs = Array.from(article.querySelectorAll('.cell_output pre, .output pre'))
    .filter(p => !p.closest('.cell_input'));
  const proseBlocks = Array.from(article.querySelectorAll(BLOCKS))
    .filter(b => !b.closest(CODE) && !b.closest(MATH) && !b.closest('.cell_input'));

  // 4a. Captions.
  const CAPTION_START = /^Figure\b[^:]{0,40}:/;            // a caption: "Figure ..." and soon a colon
  const NUMBERED = /^Figure ([0-9]+|[A-Z])\.([0-9]+): \S/;
  const isCaption = el => el && el.tagName === 'P' && !inOutput(el) && CAPTION_START.test(readText(el));
  const captions = Array.from(article.querySelectorAll('p')).filter(isCaption);
  let label = chapter, k = 0;
  for (const cap of captions) {
    const text = readText(cap), m = text.match(NUMBERED);
    k += 1;   // every caption is a figure in page order, numbered or not
    if (!m) { add(cap, 'caption', 'caption not numbered "Figure <chapter>.<k>: "', 0, { snippet: text.slice(0, 120) }); continue; }
    if (label === null) label = m[1];
    if (m[1] !== String(label))
      add(cap, 'caption', `caption numbered in chapter ${m[1]}, not ${label}`, 0, { snippet: text.slice(0, 120) });
    else if (Number(m[2]) !== k)
      add(cap, 'caption', `caption numbered ${m[1]}.${m[2]}, expected ${label}.${k} (1, 2, 3, ... in page order)`, 0,
          { snippet: text.slice(0, 120) });
  }
  for (const cell of article.querySelectorAll('div.cell')) {
    // a figure: an image of the output (not an icon of a button, such as the copy button, not math)
    const imgs = Array.from(cell.querySelectorAll('.cell_output img, .cell_output svg'))
      .filter(i => !i.closest(MATH) && !i.closest('button, .copybtn, a.headerlink')
                   && !(i.tagName.toLowerCase() === 'svg' && i.parentElement.closest('svg')));
    if (!imgs.length) continue;
    const next = cell.nextElementSibling;
    if (!isCaption(next))   // (a caption that is there but misnumbered is reported above)
      add(cell, 'caption', 'figure without its caption ("Figure <chapter>.<k>: ..." right after the cell)', 0,
          { snippet: 'img ' + (imgs[0].getAttribute('src') || imgs[0].tagName).slice(0, 80) + ', then: ' +
                     (next ? readText(next).slice(0, 80) : '(nothing)') });
  }

  // 4b. Raw TeX in rendered text; in printed text, only a $ pair that holds TeX.
  const DOLLARS = /\$(?=\S)[^$]{1,300}?\S\$|\$\S\$/;
  const currency = s => /^\$\d[\d.,]*\s/.test(s);
  const COMMAND = /\\[A-Za-z]+/;
  for (const b of proseBlocks) {
    const text = readText(b);
    const d = text.match(DOLLARS), c = text.match(COMMAND);
    if (d && !currency(d[0])) add(b, 'tex', 'raw TeX ($...$) in the page', 0, { snippet: text.slice(0, 160) });
    else if (c) add(b, 'tex', 'raw TeX (' + c[0] + ') in the page', 0, { snippet: text.slice(0, 160) });
  }
  for (const pre of textOutputs) {
    const m = (pre.textContent || '').match(/\$[^$\n]*[\\^_{][^$\n]*\$/);
    if (m) add(pre, 'tex', 'raw TeX ($...$) printed in an output', 0, { snippet: m[0].slice(0, 160) });
  }

  // 4c. Progress bars.
  const BAR = /\d{1,3}%\|[^\n]*?\|?\s*\d+\/\d+/;
  for (const out of article.querySelectorAll('.cell_output, .output')) {
    if (out.parentElement && out.parentElement.closest('.cell_output, .output')) continue;
    const m = (out.innerText || out.textContent || '').match(BAR);
    if (m) add(out, 'progress', 'a progress bar left in the output', 0, { snippet: m[0].slice(0, 120) });
  }

  // 4d. Walls of output.
  for (const cell of article.querySelectorAll('div.cell')) {
    let lines = 0;
    for (const pre of cell.querySelectorAll('.cell_output pre'))
      lines += (pre.textContent || '').replace(/\n+$/, '').split('\n').length;
    for (const o of cell.querySelectorAll('.cell_output .text_html, .cell_output .text_markdown'))
      lines += o.querySelectorAll('tr, li, p').length;
    if (lines > maxLines)
      add(cell, 'length', `an output of ${lines} lines (over ${maxLines}): a figure, or a table in an appendix`, 0,
          { snippet: (cell.querySelector('.cell_output') || cell).innerText.slice(0, 120) });
  }

  // 4e. Empty sentences: " ." after a word, ": .", ", ." (an empty list before the period).
  const EMPTY = /[\w)\]⟩]\s+\.(?=\s|$)|[:,;]\s*\.(?=\s|$)/;
  for (const b of proseBlocks) {
    const text = readText(b), m = text.match(EMPTY);
    if (m) add(b, 'sentence', 'an empty sentence ("' + m[0].trim() + '")', 0,
               { snippet: text.slice(Math.max(0, m.index - 80), m.index + 20) });
  }
  for (const pre of textOutputs) {
    for (const line of (pre.textContent || '').split('\n')) {
      const m = line.match(/[A-Za-z)]\s+\.(?=\s|$)|[:,;]\s*\.(?=\s|$)/);
      if (m) { add(pre, 'sentence', 'an empty sentence ("' + m[0].trim() + '") printed in an output', 0,
                   { snippet: line.slice(Math.max(0, m.index - 80), m.index + 20) }); break; }
    }
  }
  hide.remove();
  return findings;
}
"""


def chapter_of(rel: str):
    """The chapter a page's figures are numbered in: the number its file name starts with
    (``notebooks/05_delta_rule.html``: 5), or ``None`` for a page without one (an appendix)."""
    import re
    m = re.match(r"(\d+)_", Path(rel).name)
    return int(m.group(1)) if m else None


def mathjax_root() -> Path:
    """The MathJax 3 tree (es5/...) shipped by the django-static-mathjax package."""
    spec = importlib.util.find_spec("mathjax")
    for base in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(base) / "static" / "mathjax"
        if (candidate / "es5" / "tex-mml-chtml.js").exists():
            return candidate
    raise SystemExit("page_check: MathJax 3 not found; install it with "
                     "`pip install django-static-mathjax` (requirements.txt lists it)")


def find_pages(html: Path, only: list[str] | None = None) -> list[str]:
    """Every chapter and book page of the build (relative paths), not indexes or redirects."""
    pages = []
    for path in sorted(html.rglob("*.html")):
        rel = path.relative_to(html).as_posix()
        if rel.split("/")[0].startswith("_") or path.name in SKIP_PAGES:
            continue
        head = path.read_text(errors="replace")[:4000].lower()
        if 'http-equiv="refresh"' in head:
            continue
        if only and not any(s in rel for s in only):
            continue
        pages.append(rel)
    return pages


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(directory: Path):
    handler = functools.partial(_Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def full_page_screenshot(page, path: Path, band: int = 4000) -> None:
    """A screenshot of the whole page. Chromium draws a single capture taller than ~16k px blank
    past that height, so a tall page is taken in bands and pasted together."""
    width, height = page.evaluate("""() => [
        Math.ceil(document.documentElement.scrollWidth),
        Math.ceil(Math.max(document.documentElement.scrollHeight, document.body.scrollHeight))]""")
    if height <= band:
        page.screenshot(path=str(path), full_page=True)
        return
    import io

    from PIL import Image
    canvas = Image.new("RGB", (width, height), "white")
    for top in range(0, height, band):
        png = page.screenshot(full_page=True, clip={"x": 0, "y": top, "width": width,
                                                    "height": min(band, height - top)})
        canvas.paste(Image.open(io.BytesIO(png)).convert("RGB"), (0, top))
    canvas.save(path)


def check_pages(html: Path, pages: list[str], widths=WIDTHS, shots: Path | None = None,
                chromium: str = CHROMIUM, timeout_s: float = 90.0) -> dict:
    """Render ``pages`` (paths under ``html``) at each width; return the report dict."""
    from playwright.sync_api import sync_playwright

    if not Path(chromium).exists():
        raise SystemExit(f"page_check: no browser at {chromium} (apt-get install -y chromium)")
    mj_root = mathjax_root()
    server, base = serve(html)
    blocked: dict[str, set] = defaultdict(set)
    failures, rendered = [], []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
            for width in widths:
                context = browser.new_context(viewport={"width": width, "height": HEIGHT},
                                              device_scale_factor=1, service_workers="block")
                current = {"page": ""}

                def route(r, _request=None, current=current):
                    url = r.request.url
                    if url.startswith(base) or url.startswith("data:"):
                        return r.continue_()
                    if url.startswith(MATHJAX_CDN):
                        rel = url[len(MATHJAX_CDN):].split("?")[0].split("#")[0]
                        target = (mj_root / rel).resolve()
                        if target.is_file() and mj_root.resolve() in target.parents:
                            ctype = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
                            return r.fulfill(path=str(target), content_type=ctype,
                                             headers={"Access-Control-Allow-Origin": "*"})
                    blocked[url].add(current["page"])
                    return r.abort()

                context.route("**/*", route)
                page = context.new_page()
                page.set_default_timeout(timeout_s * 1000)
                for rel in pages:
                    current["page"] = rel
                    t0 = time.perf_counter()
                    page.goto(base + rel, wait_until="load")
                    page.evaluate("""async () => {
                        const mj = window.MathJax;
                        if (mj && mj.startup && mj.startup.promise) await mj.startup.promise;
                        if (document.fonts) await document.fonts.ready;
                    }""")
                    found = page.evaluate(DETECTOR_JS, {"livePrefix": LIVE_PREFIX,
                                                        "chapter": chapter_of(rel),
                                                        "maxOutputLines": MAX_OUTPUT_LINES})
                    for f in found:
                        failures.append({"page": rel, "width": width, **f})
                    shot = None
                    if shots is not None:
                        shot = shots / str(width) / (rel.replace("/", "__").removesuffix(".html") + ".png")
                        shot.parent.mkdir(parents=True, exist_ok=True)
                        full_page_screenshot(page, shot)
                    rendered.append({"page": rel, "width": width, "failures": len(found),
                                     "seconds": round(time.perf_counter() - t0, 2),
                                     "screenshot": str(shot) if shot else None})
                context.close()
            browser.close()
    finally:
        server.shutdown()
    return {"html": str(html), "widths": list(widths), "pages": pages, "rendered": rendered,
            "failures": failures,
            "blocked_requests": {u: sorted(v) for u, v in sorted(blocked.items())}}


def summarize(report: dict, worst: int = 15) -> str:
    fails = report["failures"]
    lines = [f"page check: {len(report['pages'])} pages x widths {report['widths']}: "
             f"{len(fails)} failure(s)"]
    if not fails and report.get("ignored"):
        lines.append("every page passes what was checked (see what was NOT checked below)")
    elif not fails:
        lines.append("every page passes: nothing wider than the text column, no MathJax error, "
                     "no widget shown twice, every figure captioned and numbered, no raw TeX, "
                     "progress bar, wall of output or empty sentence")
    kinds = sorted({f["kind"] for f in fails})
    if fails:
        by_page = defaultdict(Counter)
        for f in fails:
            by_page[(f["page"], f["width"])][f["kind"]] += 1
        lines.append("")
        lines.append("failures per page and width, by kind (" + ", ".join(kinds) + "):")
        for (page, width), counts in sorted(by_page.items()):
            detail = ", ".join(f"{k} {counts[k]}" for k in kinds if counts[k])
            lines.append(f"  {page:45s} {width:5d}px  {sum(counts.values()):4d}  ({detail})")
        lines.append("")
        lines.append(f"worst offenders (largest excess width, top {worst}):")
        ranked = sorted((f for f in fails if f["excess_px"] > 0), key=lambda f: -f["excess_px"])
        for f in ranked[:worst]:
            lines.append(f"  +{f['excess_px']:4d}px  {f['width']:4d}px  {f['page']}  {f['kind']}: "
                         f"{f['where'] or f['element']}  | {f['snippet'][:90]}")
        other = [f for f in fails if f["excess_px"] == 0]
        if other:
            lines.append("")
            lines.append("what else a reader meets (math, widgets, captions, raw TeX, progress bars, "
                         "walls of output, empty sentences):")
            for f in other[:60]:
                lines.append(f"  {f['width']:4d}px  {f['page']}  {f['problem']}: "
                             f"{f['where'] or f['element']}  | {f['snippet'][:90]}")
    if report.get("ignored"):
        counts = Counter(f["kind"] for f in report["ignored"])
        lines.append("")
        lines.append("NOT checked this run (--ignore), found: " +
                     ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
    if report.get("blocked_requests"):
        lines.append("")
        lines.append("outside requests blocked (not failures; the page may look different online):")
        for url, pages in list(report["blocked_requests"].items())[:10]:
            lines.append(f"  {url}  ({len(pages)} page(s))")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--html", type=Path, default=ROOT / "_build" / "html")
    ap.add_argument("--out", type=Path, default=ROOT / "_build" / "pagecheck",
                    help="screenshots go to OUT/<width>/")
    ap.add_argument("--report", type=Path, default=None, help="JSON report (default OUT/report.json)")
    ap.add_argument("--summary", type=Path, default=None, help="summary text (default OUT/summary.txt)")
    ap.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS))
    ap.add_argument("--page", action="append", help="only pages whose path contains this (repeatable)")
    ap.add_argument("--no-screenshots", action="store_true")
    ap.add_argument("--chromium", default=CHROMIUM)
    ap.add_argument("--ignore", action="append", default=[], metavar="KIND",
                    help="list findings of this kind (caption, tex, progress, length, sentence, math, "
                         "widget, output, code, ...) apart, without failing on them (repeatable)")
    args = ap.parse_args(argv)

    if not (args.html / "index.html").exists():
        print(f"page_check: no built book at {args.html} (run `make book` first)", file=sys.stderr)
        return 2
    pages = find_pages(args.html, args.page)
    if not pages:
        print("page_check: no pages to check", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    report = check_pages(args.html, pages, args.widths,
                         None if args.no_screenshots else args.out, args.chromium)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    if args.ignore:
        report["ignored"] = [f for f in report["failures"] if f["kind"] in args.ignore]
        report["failures"] = [f for f in report["failures"] if f["kind"] not in args.ignore]
    args.out.mkdir(parents=True, exist_ok=True)
    report_path = args.report or args.out / "report.json"
    summary_path = args.summary or args.out / "summary.txt"
    report_path.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    text = summarize(report)
    summary_path.write_text(text + "\n")
    print(text)
    print(f"\nreport: {report_path}; summary: {summary_path}"
          + ("" if args.no_screenshots else f"; screenshots: {args.out}/<width>/") +
          f" ({report['seconds']} s)")
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
