"""The Colab edition (colab/*.ipynb, written by tools/colab_edition.py), read as a notebook viewer reads it.

* ``colab/`` is exactly what the tool writes from ``notebooks/`` (regenerating gives the same bytes);
* every math span of every text cell, found by MyST's own Markdown parser (the book's settings),
  renders on its own with KaTeX and with MathJax 3 (tools/mathcheck/render.js, in Node; both from npm,
  installed by ``make setup``): no undefined macro, nothing defined in one span for another;
* no MyST is left: no role, target, labelled ``$$``, directive or colon fence;
* each badge, in the book's notebooks and in the Colab edition, opens a file of this repository;
  hidden cells are folded; the install cell tries its three routes and is a no-op where this book's
  packages import;
* the wheel carries every data file a module or a notebook names, and the first chapter's Colab
  edition runs from that wheel alone, with Colab's ipywidgets (7.7.1), outside the checkout.

Each check is also run on a bad input, to show that it can fail.
"""
from __future__ import annotations

import ast
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
import types
import zipfile
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import colab_edition as ce  # noqa: E402
import install_cell  # noqa: E402

MATHCHECK = ROOT / "tools" / "mathcheck"
WIDGETS = ROOT / ".colab-widgets"     # ipywidgets 7.7.1 (Colab's), installed by `make setup`
CONFIG = ce.load_config()
COLAB = sorted((ROOT / ce.COLAB_DIR).glob("*.ipynb"))
BOOK = ce.book_notebooks()
PACKAGES = ("lattn_core", "kernels", "experiments")


# ----------------------------------------------------------------------------------------------
# The checker: a notebook as a viewer reads it
# ----------------------------------------------------------------------------------------------

def _parser():
    """MyST's markdown-it parser with the book's extensions (what the rendered book reads)."""
    from markdown_it.renderer import RendererHTML
    from myst_parser.config.main import MdParserConfig
    from myst_parser.parsers.mdit import create_md_parser
    parse = CONFIG["parse"]
    return create_md_parser(MdParserConfig(enable_extensions=set(parse["myst_enable_extensions"]),
                                           dmath_double_inline=parse.get("myst_dmath_double_inline", False)),
                            RendererHTML)


def _tokens(tokens):
    for token in tokens:
        yield token
        if token.children:
            yield from _tokens(token.children)


MATH_TOKENS = {"math_inline": False, "math_inline_double": True, "math_block": True,
               "math_block_label": True, "amsmath": True}


def read_as_viewer(markdown_cells: list[str]) -> tuple[list[dict], list[str]]:
    """The math spans of some text cells (``{"tex", "display", "where"}``) and the MyST found in
    them (a list of messages)."""
    md = _parser()
    spans, myst = [], []
    for i, text in enumerate(markdown_cells):
        for token in _tokens(md.parse(text)):
            where = f"text cell {i}"
            if token.type in MATH_TOKENS:
                spans.append({"tex": token.content, "display": MATH_TOKENS[token.type], "where": where})
            if token.type == "math_block_label":
                myst.append(f"{where}: labelled equation $$ ... $$ ({token.info})")
            elif token.type == "amsmath":
                myst.append(f"{where}: bare amsmath environment {token.meta.get('environment')}")
            elif token.type == "myst_role":
                myst.append(f"{where}: role {{{token.meta['name']}}}`{token.content}`")
            elif token.type == "myst_target":
                myst.append(f"{where}: target ({token.content})=")
            elif token.type == "colon_fence" or (token.type == "fence" and token.info.startswith("{")):
                myst.append(f"{where}: directive {token.info}")
        for line in text.splitlines():      # what markdown-it reads as plain text, a reader sees raw
            if re.search(r"\{[a-z][\w:-]*\}`|^\s*\(\S+\)=\s*$|\$\$\s*\(\S+\)\s*$", line):
                myst.append(f"text cell {i}: MyST left in {line.strip()[:60]!r}")
    return spans, sorted(set(myst))


def render_spans(spans: list[dict]) -> list[dict]:
    """Each span rendered on its own by KaTeX and by MathJax: ``{"katex", "mathjax"}``, an error
    message or ``None``."""
    node = shutil.which("node")
    assert node, "Node.js is missing: run `make setup`"
    assert (MATHCHECK / "node_modules" / "katex").is_dir() and \
        (MATHCHECK / "node_modules" / "mathjax-full").is_dir(), \
        "KaTeX and MathJax are missing from tools/mathcheck/node_modules: run `make setup`"
    run = subprocess.run([node, str(MATHCHECK / "render.js")], input=json.dumps(spans),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert len(out) == len(spans)
    return out


def math_errors(spans: list[dict]) -> list[str]:
    errors = []
    for span, result in zip(spans, render_spans(spans)):
        for engine in ("katex", "mathjax"):
            if result[engine]:
                errors.append(f"{span['where']}: {engine}: {result[engine][:120]} in {span['tex'][:60]!r}")
    return errors


def badge_target(source: str) -> str | None:
    """The repository path the first badge of ``source`` opens on Colab (``None``: no badge, or
    a badge that does not open this repository's branch)."""
    m = ce.BADGE.search(source)
    prefix = ce.colab_url(CONFIG, "")
    if not m or not m.group(1).startswith(prefix):
        return None
    return m.group(1)[len(prefix):]


def markdown_of(path: Path) -> list[str]:
    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown"]


# ----------------------------------------------------------------------------------------------
# The Colab edition
# ----------------------------------------------------------------------------------------------

def test_one_colab_edition_per_chapter():
    assert BOOK and [p.name for p in COLAB] == [p.name for p in BOOK], \
        "colab/ must hold one file per chapter: run `python tools/colab_edition.py`"


def test_colab_edition_is_what_the_tool_writes():
    want = ce.expected_files()
    stale = [p.name for p, text in want.items() if not p.is_file() or p.read_bytes() != text.encode()]
    assert not stale, f"colab/ is out of date for {stale}: run `python tools/colab_edition.py`"


def test_every_math_span_renders_on_its_own_with_katex_and_mathjax():
    started = time.perf_counter()
    spans, errors = [], []
    for path in COLAB:
        found, _ = read_as_viewer(markdown_of(path))
        for span in found:
            span["where"] = f"{path.name} {span['where']}"
        spans += found
    errors = math_errors(spans)
    assert len(spans) > 1000, f"only {len(spans)} math spans found"
    assert not errors, f"{len(errors)} of {len(spans)} spans fail:\n" + "\n".join(errors[:30])
    assert time.perf_counter() - started < 60


def test_no_myst_is_left():
    found = []
    for path in COLAB:
        _, myst = read_as_viewer(markdown_of(path))
        found += [f"{path.name}: {m}" for m in myst]
    assert not found, "\n".join(found[:30])


def test_the_checks_catch_a_bad_cell():
    """An undefined macro (the book's own, outside the Colab edition), a raw role, a labelled
    equation, a target and a directive are all caught; the same text made by the tool passes."""
    bad = ("(sec-x)=\n## A section\n\nThe state $\\bS\\in\\R^{d}$ and {eq}`ch2-linear-attn`, "
           "{cite}`su2025linear`.\n\n$$\nx = \\softmax(y)\n$$ (eq-x)\n\n```{note}\nA $\\bQ$ note.\n```\n")
    spans, myst = read_as_viewer([bad])
    errors = math_errors(spans)
    assert any("Undefined control sequence" in e and "\\bS" in e for e in errors), errors
    assert any(e.startswith("text cell 0: katex") for e in errors) and \
        any(e.startswith("text cell 0: mathjax") for e in errors), errors
    for what in ("role {eq}", "role {cite}", "target (sec-x)=", "labelled equation", "directive {note}"):
        assert any(what in m for m in myst), (what, myst)
    book = ce.load_book()
    fixed = bad.replace("{eq}`ch2-linear-attn`", "").replace("$$ (eq-x)", "$$")
    good = ce.plain_markdown(fixed, book, "notebooks/02_linear_attention")
    spans, myst = read_as_viewer([good])
    assert len(spans) == 3 and not myst and not math_errors(spans), (good, myst)


def test_the_book_notebooks_themselves_fail_the_viewer_checks():
    """What the Colab edition fixes: the book's own notebooks, read by a viewer, have undefined
    macros (defined only in _config.yml) and raw MyST."""
    spans, myst = [], []
    for path in BOOK:
        found, left = read_as_viewer(markdown_of(path))
        spans += found
        myst += left
    undefined = [e for e in math_errors(spans) if "Undefined control sequence" in e]
    assert len(undefined) > len(spans) // 10, (len(undefined), len(spans))
    assert any("role {eq}" in m for m in myst) and any("labelled equation" in m for m in myst)


def test_a_definition_in_one_span_is_not_used_by_another():
    spans = [{"tex": "\\newcommand{\\bZ}{Z}\\bZ", "display": False, "where": "a"},
             {"tex": "\\bZ", "display": False, "where": "b"},
             {"tex": "\\gdef\\bY{Y}\\bY", "display": False, "where": "c"},
             {"tex": "\\bY", "display": False, "where": "d"}]
    errors = math_errors(spans)
    for where in "abcd":
        assert any(e.startswith(f"{where}: mathjax") for e in errors), errors
    assert any(e.startswith("b: katex") for e in errors) and any(e.startswith("d: katex") for e in errors)


def test_badges_open_files_of_this_repository():
    for path in BOOK + COLAB:
        target = badge_target(nbformat.read(path, as_version=4).cells[0].source)
        assert target == f"{ce.COLAB_DIR}/{path.name}", f"{path.name}: the badge opens {target}"
        assert (ROOT / target).is_file(), f"{path.name}: the badge opens {target}, which does not exist"
    assert badge_target("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
                        "(https://colab.research.google.com/github/someone/else/blob/main/x.ipynb)") is None
    missing = ce.badge(CONFIG, "99_missing.ipynb")
    assert not (ROOT / badge_target(missing)).is_file()


def test_hidden_cells_are_folded():
    for book_path, path in zip(BOOK, COLAB):
        book_cells = nbformat.read(book_path, as_version=4).cells
        cells = nbformat.read(path, as_version=4).cells
        assert len(cells) == len(book_cells)
        for i, (b, c) in enumerate(zip(book_cells, cells)):
            tags = b.metadata.get("tags", [])
            hidden = "hide-input" in tags or "hide-cell" in tags
            assert (c.metadata.get("cellView") == "form") == hidden, f"{path.name} cell {i}"
            if hidden:
                assert c.source.startswith("# @title "), f"{path.name} cell {i}"
                assert c.metadata["jupyter"].get("outputs_hidden", False) == ("hide-cell" in tags)
        assert nbformat.read(path, as_version=4).metadata["accelerator"] == "GPU"


def test_no_macro_left_in_the_math_of_code_cells():
    pattern = re.compile(r"\\\\?(%s)(?![A-Za-z])" % "|".join(map(re.escape, ce.config_macros(CONFIG))))
    left = []
    for path in COLAB:
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
            if cell.cell_type != "code":
                continue
            for start, end, _ in ce.string_literals(cell.source):
                for span in re.findall(r"\$[^$]+\$", cell.source[start:end]):
                    if pattern.search(span):
                        left.append(f"{path.name} cell {i}: {span}")
    assert not left, left


# ----------------------------------------------------------------------------------------------
# The tool's parts
# ----------------------------------------------------------------------------------------------

def test_macros_come_from_config_and_expand_like_mathjax():
    macros = ce.config_macros(CONFIG)
    assert ce.expand_macros("\\bQ\\bK^\\top", macros) == "{\\boldsymbol{Q}}{\\boldsymbol{K}}^\\top"
    assert ce.expand_macros("\\tilde\\bk_t", macros) == "\\tilde{\\boldsymbol{k}}_t"   # as MathJax reads it
    assert ce.expand_macros("\\Diag(\\beta)", macros) == "\\operatorname{Diag}(\\beta)"
    assert ce.expand_macros("\\bQx \\bQ x", macros) == "\\bQx {\\boldsymbol{Q}} x"   # \bQx is not \bQ
    more = dict(macros, norm=("\\left\\Vert #1\\right\\Vert", 1, None), pair=("(#1, #2)", 2, None),
                sub=("#1_{#2}", 2, "x"), vmu=("\\mu", 0, None), nS=("\\norm{\\bS}", 0, None))
    assert ce.expand_macros("\\norm{\\bS \\bk}^2", more) == \
        "{\\left\\Vert {\\boldsymbol{S}} {\\boldsymbol{k}}\\right\\Vert}^2"
    assert ce.expand_macros("\\pair a{b c}", more) == "{(a, b c)}"
    assert ce.expand_macros("\\sub{t} \\sub[y]{t}", more) == "{x_{t}} {y_{t}}"
    assert ce.expand_macros("\\nS", more) == "{\\left\\Vert {\\boldsymbol{S}}\\right\\Vert}"
    assert ce.expand_macros("\\vmu x", more) == "\\mu x" and ce.expand_macros("\\vmu{}x", more) == "\\mu{}x"
    assert ce.expand_macros("\\vmu\\vmu", more) == "\\mu\\mu" and ce.expand_macros("\\vmu y", more) == "\\mu y"
    with pytest.raises(ValueError):
        ce.expand_macros("\\loop", dict(macros, loop=("\\loop", 0, None)))
    assert ce.self_contained_math("j<i, k<\\bQ", macros) == "j< i, k<{\\boldsymbol{Q}}"


def test_code_cells_keep_their_escaping():
    macros = ce.config_macros(CONFIG)
    code = ('x = f"$\\\\bB$ has {n:.2f} $\\\\bQ_{i}$"  # $\\\\bQ$ in a comment\n'
            'y = r"$\\bS$" + "$\\\\R^d$" + \'plain\'\n')
    out = ce.code_with_math_expanded(code, macros)
    assert 'f"${{\\\\boldsymbol{{B}}}}$ has {n:.2f} $\\\\bQ_{i}$"' in out      # a field: left alone
    assert 'r"${\\boldsymbol{S}}$"' in out and '"${\\\\mathbb{R}}^d$"' in out
    assert "# $\\\\bQ$ in a comment" in out
    namespace = {"n": 1.0, "i": 0}
    exec(out.split("  #")[0] + "\n" + out.splitlines()[1], namespace)
    assert namespace["x"].startswith("${\\boldsymbol{B}}$ has 1.00")
    assert namespace["y"] == "${\\boldsymbol{S}}$${\\mathbb{R}}^d$plain"


def test_myst_becomes_plain_markdown():
    book = ce.load_book()
    doc = "notebooks/02_linear_attention"
    cites = ce.plain_markdown("{cite}`su2025linear,vaswani2017attention` and {cite:t}`katharopoulos2020transformers`",
                              book, doc)
    bib = f"{book.url}book/bibliography.html"
    assert cites == (f"[[Su, 2025]({bib}#cite-su2025linear), [Vaswani *et al.*, 2017]({bib}#cite-vaswani2017attention)] "
                     f"and [Katharopoulos *et al.* [2020]]({bib}#cite-katharopoulos2020transformers)")
    number, where = book.equations["notation-qkv"]
    assert where == "book/notation"
    assert ce.plain_markdown("{eq}`notation-qkv`", book, doc) == \
        f"[({number})]({book.url}book/notation.html#equation-notation-qkv)"
    first_ch1 = min((n, label) for label, (n, d) in book.equations.items() if d.startswith("notebooks/01"))
    assert ce.plain_markdown(f"{{eq}}`{first_ch1[1]}`", book, doc) == f"[({first_ch1[0]})](01_quadratic_cost.ipynb)"
    assert ce.plain_markdown("see the {doc}`../book/notation`", book, doc) == \
        f"see the [Notation]({book.url}book/notation.html)"
    note = ce.plain_markdown(":::{note}\nA $\\bQ$ note.\n:::\n", book, doc)
    assert note == "> **Note**\n>\n> A ${\\boldsymbol{Q}}$ note.\n"
    figure = ce.plain_markdown("```{figure} ../_static/x.png\n:alt: an x\n\nThe caption.\n```\n", book, doc)
    assert figure.startswith(f"![an x](https://raw.githubusercontent.com/{ce.owner_repo(CONFIG)}/")
    assert "_static/x.png)" in figure and "*The caption.*" in figure
    tagged = ce.plain_markdown("$$\nx = \\bQ\n$$ (ch2-linear-attn)\n", book, doc)
    assert tagged == f"$$\nx = {{\\boldsymbol{{Q}}}}\n\\tag{{{book.equations['ch2-linear-attn'][0]}}}\n$$\n"
    assert ce.plain_markdown("(lbl)=\n# Title\n", book, doc) == "# Title\n"
    assert ce.plain_markdown("`{eq}` and `$\\bQ$` are code", book, doc) == "`{eq}` and `$\\bQ$` are code"
    for unknown in ("{numref}`fig-x`", "```{list-table}\n```\n", "{eq}`no-such-label`", "{cite}`nokey`"):
        with pytest.raises(ce.MystError):
            ce.plain_markdown(unknown, book, doc)


def test_equations_are_numbered_through_the_book_in_toc_order():
    """Sphinx (numfig, no numbered toctree) counts labelled equations through the whole book:
    the notation page's first, then each chapter's, in _toc.yml's order."""
    book = ce.load_book()
    numbers = sorted(book.equations.values())
    assert [n for n, _ in numbers] == list(range(1, len(numbers) + 1))
    docs = [d for _, d in numbers]
    order = ce._toc_docs(__import__("yaml").safe_load((ROOT / "_toc.yml").read_text()))
    assert docs == sorted(docs, key=order.index)
    assert docs[0] == "book/notation"


def test_numbers_are_compared_with_the_rendered_book(tmp_path):
    """``--check-built`` (run by ``make pagecheck``) reads Sphinx's equation numbers from the
    built pages; here on pages written to match, then with one number off."""
    book = ce.load_book()
    pages = {}
    for label, (number, doc) in sorted(book.equations.items(), key=lambda kv: kv[1]):
        from docutils.nodes import make_id
        pages.setdefault(doc, []).append(f'<div id="{make_id("equation-" + label)}"><span class="eqno">'
                                         f'({number + (label == "ch2-linear-attn")})</span></div>')
    for doc, parts in pages.items():
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f"{doc}.html").write_text("\n".join(parts))
    wrong = ce.built_numbers_differ(tmp_path)
    n = book.equations["ch2-linear-attn"][0]
    assert wrong == [f"notebooks/02_linear_attention: (ch2-linear-attn) is ({n + 1}) in the book, ({n}) in the "
                     "Colab edition"], wrong


# ----------------------------------------------------------------------------------------------
# The install cell of the Colab edition
# ----------------------------------------------------------------------------------------------

def test_every_colab_edition_has_the_install_cell():
    source = install_cell.colab_cell_source()
    for path in COLAB:
        cells = nbformat.read(path, as_version=4).cells
        assert cells[1].source == source, path.name
        assert "hide-input" in cells[1].metadata["tags"]
    assert max(len(line) for line in source.splitlines()) <= 79
    assert re.findall(r"https?://[^\"'\s]+", source) == [install_cell.repository_url()]


@pytest.mark.parametrize("case", ["ours", "wheel", "wheel-fails", "repo", "index", "nothing", "foreign"])
def test_install_cell_routes(case, tmp_path, monkeypatch, capsys):
    """The cell as on a bare runtime: which pip commands it runs, in which order, and what it says."""
    import importlib.util
    source = install_cell.colab_cell_source()
    repo = install_cell.repository_url()
    calls = []
    ok = {"ours": set(), "wheel": {"wheel"}, "wheel-fails": {"git"}, "repo": {"git"}, "index": {"index"},
          "nothing": set(), "foreign": {"git"}}[case]

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        target = cmd[-1]
        kind = "wheel" if target.endswith(".whl") else "git" if target.startswith("git+") else "index"
        assert kwargs["env"]["GIT_TERMINAL_PROMPT"] == "0"
        return types.SimpleNamespace(returncode=0 if kind in ok else 1)

    foreign = tmp_path / "foreign"
    (foreign / "kernels").mkdir(parents=True)
    (foreign / "kernels" / "__init__.py").write_text("# another project's kernels\n")
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        if name in PACKAGES and case != "ours":
            if case == "foreign" and name == "kernels":
                return importlib.util.spec_from_file_location("kernels", foreign / "kernels" / "__init__.py")
            return None
        return real_find_spec(name, *args)

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.chdir(tmp_path)
    if case in ("wheel", "wheel-fails"):
        (tmp_path / "linear_attention_history-0.1.0-py3-none-any.whl").write_bytes(b"")
    exec(compile(source, "install cell", "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out
    targets = [c[-1] for c in calls]
    assert all(c[:5] == [sys.executable, "-m", "pip", "install", "-q"] for c in calls), calls
    if case == "ours":
        assert calls == [] and out == "", "installs although this book's packages import"
        return
    wheel = "linear_attention_history-0.1.0-py3-none-any.whl"
    expected = {"wheel": [wheel], "wheel-fails": [wheel, f"git+{repo}"], "repo": [f"git+{repo}"],
                "foreign": [f"git+{repo}"], "index": [f"git+{repo}", "linear-attention-history"],
                "nothing": [f"git+{repo}", "linear-attention-history"]}[case]
    assert targets == expected, targets
    if case == "nothing":
        assert "Could not install" in out and "python -m build" in out and "Upload" in out, out
    else:
        route = {"wheel": "the uploaded wheel", "wheel-fails": "the repository", "repo": "the repository",
                 "foreign": "the repository", "index": "the package index"}[case]
        assert f"from {route}" in out, out


def test_our_packages_say_so_and_warn_when_a_name_is_shared():
    import warnings

    import experiments
    import kernels
    import lattn_core
    from lattn_core.distribution import DISTRIBUTION, is_ours, warn_if_shared
    for module in (lattn_core, kernels, experiments):
        assert is_ours(module), module.__name__
        assert f'__distribution__ = "{DISTRIBUTION}"' in Path(module.__file__).read_text()
    assert not is_ours(types.ModuleType("kernels"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert warn_if_shared("kernels", {"kernels": ["kernels", "linear_attention_history"]}) == ["kernels"]
        assert warn_if_shared("experiments", {"experiments": ["linear-attention-history"]}) == []
    assert len(caught) == 1 and "also installed by kernels" in str(caught[0].message)


# ----------------------------------------------------------------------------------------------
# The wheel, and a chapter run from it
# ----------------------------------------------------------------------------------------------

def _repository_files() -> list[str]:
    run = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return [f for f in run.stdout.splitlines() if (ROOT / f).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel of this working tree, built from a copy of its files (no stale build/ folder)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for f in _repository_files():
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                          "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    wheels = list((tmp / "dist").glob("linear_attention_history-*.whl"))
    assert len(wheels) == 1, wheels
    print(f"wheel built in {time.perf_counter() - started:.1f} s")
    return wheels[0]


DATA_NAME = re.compile(r"[\w./{}*-]*\.(?:json|md|csv|txt|npz|npy|pt|yml|yaml|bib|png|svg)\b")


def named_files(sources: list[tuple[str, str]]) -> dict:
    """``{file name or pattern: where}`` for every data file named by a string (not a docstring)
    of some Python sources; an f-string's fields become ``*``. A bare ``*.json`` names nothing."""
    names = {}
    for where, code in sources:
        tree = ast.parse(code)
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            text = None
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                text = node.value
            elif isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "*" for v in node.values)
            for name in DATA_NAME.findall(text or ""):
                name = name.lstrip("./").replace("{", "*").replace("}", "*")
                if re.search(r"[A-Za-z0-9]", name.rsplit(".", 1)[0].split("/")[-1].replace("*", "")) or "/" in name:
                    names.setdefault(name, where)
    return names


def files_named(name: str, files: list[str]) -> list[str]:
    return [f for f in files if fnmatch.fnmatch(f, name) or fnmatch.fnmatch(f, "*/" + name)]


def missing_from_wheel(names: dict, files: list[str], shipped: set) -> list[str]:
    out = []
    for name, where in sorted(names.items()):
        for f in files_named(name, files):
            if f not in shipped:
                out.append(f"{f} (named {name!r} in {where})")
    return out


def test_the_wheel_carries_every_file_the_book_reads(wheel):
    files = _repository_files()
    sources = [(f, (ROOT / f).read_text()) for f in files
               if f.endswith(".py") and f.split("/")[0] in PACKAGES]
    for path in BOOK:
        sources += [(path.name, "\n".join(line for line in c.source.splitlines()
                                          if not line.lstrip().startswith(("!", "%"))))
                    for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    names = named_files(sources)
    assert "graph_timing.json" in names and "experiments/results/*.json" in names, sorted(names)
    shipped = set(zipfile.ZipFile(wheel).namelist())
    assert not missing_from_wheel(names, files, shipped), missing_from_wheel(names, files, shipped)
    # the same check on a wheel without Chapter 11's log fails
    without = missing_from_wheel(names, files, shipped - {"kernels/conv/graph_timing.json"})
    assert "kernels/conv/graph_timing.json (named 'graph_timing.json' in kernels/conv/bench.py)" \
        in without and all(m.startswith("kernels/conv/graph_timing.json ") for m in without), without


EXECUTE = """\
import sys, nbclient, nbformat
nb = nbformat.read(sys.argv[1], as_version=4)
nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": "."}}).execute()
nbformat.write(nb, sys.argv[2])"""

PROVENANCE = """\
import json, sys, lattn_core, kernels, experiments, ipywidgets
print("PROVENANCE " + json.dumps({"files": [m.__file__ for m in (lattn_core, kernels, experiments)],
                                  "ipywidgets": ipywidgets.__version__, "path": sys.path}))"""


def test_first_chapter_runs_from_the_wheel_with_colabs_ipywidgets(wheel, tmp_path):
    """The first chapter's Colab edition, executed top to bottom by nbclient in a folder outside
    the checkout, with PYTHONPATH holding only the installed wheel and ipywidgets 7.7.1 (the
    venv's site-packages still give NumPy, PyTorch, Jupyter); its install cell must be a no-op."""
    assert (WIDGETS / "ipywidgets").is_dir(), "ipywidgets 7.7.1 is missing from .colab-widgets: run `make setup`"
    started = time.perf_counter()
    site = tmp_path / "site"
    run = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                          "--no-index", "--target", str(site), str(wheel)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    chapter = COLAB[0]
    nb = nbformat.read(chapter, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PROVENANCE))
    work = tmp_path / "run"
    work.mkdir()
    nbformat.write(nb, work / chapter.name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(PYTHONPATH=os.pathsep.join([str(site), str(WIDGETS)]), MPLBACKEND="Agg", PYTHONNOUSERSITE="1")
    run = subprocess.run([sys.executable, "-c", EXECUTE, chapter.name, "executed.ipynb"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    done = nbformat.read(work / "executed.ipynb", as_version=4)
    install_out = "".join(o.get("text", "") for o in done.cells[1].outputs)
    assert install_out == "", f"the install cell did something: {install_out}"
    text = "".join(o.get("text", "") for o in done.cells[-1].outputs)
    prov = json.loads(text.split("PROVENANCE ", 1)[1])
    assert all(f.startswith(str(site)) for f in prov["files"]), prov["files"]
    assert prov["ipywidgets"] == "7.7.1"
    checkouts = [p for p in prov["path"] if Path(p or ".").resolve() != site and
                 (Path(p or work) / "lattn_core").is_dir()]
    assert not checkouts, f"a checkout is on the kernel's path: {checkouts}"
    print(f"{chapter.name} from the wheel in {time.perf_counter() - started:.1f} s")
