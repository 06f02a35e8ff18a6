"""Hygiene of every chapter notebook, and of the citations used across the book.

Each notebook must be listed in _toc.yml, stored without outputs, valid nbformat 4, start with the
Colab badge that opens its Colab edition (colab/<name>, derived from repository.url in _config.yml),
install this repository on Colab, have a hidden executed solution, a widget and exactly one level-1 heading. Every {cite}
key used anywhere in the book must exist in book/references.bib.
"""
import json
import re
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CODE_WIDTH = 81   # characters of code the text column shows at 1280 px (the page check measures it)
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
REPO_URL = CONFIG["repository"]["url"].rstrip("/")
BRANCH = CONFIG["repository"].get("branch", "main")


def _tool(name):
    """A module of tools/ (not a package), loaded from its file."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    import sys
    sys.modules.setdefault(name, module)   # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return sys.modules[name]


install_cell = _tool("install_cell")  # the install cell's one source
colab_edition = _tool("colab_edition")  # the badge's one source


def _toc_files(node):
    if isinstance(node, dict):
        for key, val in node.items():
            if key in ("file", "root") and isinstance(val, str):
                yield val
            else:
                yield from _toc_files(val)
    elif isinstance(node, list):
        for item in node:
            yield from _toc_files(item)


TOC_FILES = set(_toc_files(yaml.safe_load((ROOT / "_toc.yml").read_text())))


def _markdown_lines_outside_fences(source):
    fence = False
    for line in source.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
            continue
        if not fence:
            yield line


def _load(path):
    return nbformat.read(path, as_version=4)


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found in notebooks/"


def test_repository_url_shape():
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", REPO_URL), REPO_URL


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
class TestNotebook:
    def test_file_name(self, path):
        assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", path.name), path.name

    def test_listed_in_toc(self, path):
        rel = path.relative_to(ROOT).with_suffix("").as_posix()
        assert rel in TOC_FILES, f"{rel} is not listed in _toc.yml"

    def test_valid_nbformat_and_kernel(self, path):
        nb = _load(path)
        nbformat.validate(nb)
        # nbformat 4.5 cells carry an id; a cell without one draws a MissingIDFieldWarning on every read
        # and a future nbformat will refuse it
        # (read the raw JSON: nbformat.read adds the ids it finds missing)
        missing = [i for i, cell in enumerate(json.loads(path.read_text())["cells"]) if "id" not in cell]
        assert not missing, f"cells {missing} have no id: nbformat.write(nbformat.read(path, 4), path)"
        assert nb.nbformat == 4
        assert nb.metadata.get("kernelspec", {}).get("name") == "python3"

    def test_code_lines_fit_the_column(self, path):
        """No code line wider than CODE_WIDTH characters: the page check measured a line of 84
        overflowing the text column at 1280 px by 6 px, and the column holds 81."""
        nb = _load(path)
        wide = [(i, len(line)) for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
                for line in cell.source.splitlines() if len(line) > CODE_WIDTH]
        assert not wide, f"code lines over {CODE_WIDTH} characters (cell, length): {wide}"

    def test_stored_without_outputs(self, path):
        nb = _load(path)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                assert cell.outputs == [], f"cell {i} has stored outputs"
                assert cell.execution_count is None, f"cell {i} has an execution count"

    def test_colab_badge_first(self, path):
        """The badge opens the chapter's Colab edition, colab/<name> (tests/book/test_colab_edition.py
        checks that file and its badge)."""
        nb = _load(path)
        first = nb.cells[0]
        assert first.cell_type == "markdown"
        owner_repo = REPO_URL.removeprefix("https://github.com/")
        colab = f"https://colab.research.google.com/github/{owner_repo}/blob/{BRANCH}/colab/{path.name}"
        badge = f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab})"
        assert badge == colab_edition.badge(CONFIG, path.name)
        assert first.source.lstrip().startswith(badge), f"first cell must start with {badge}"

    def test_install_cell(self, path):
        """Cell 2 is tools/install_cell.py's cell for _config.yml's URL, hidden, and stored empty."""
        nb = _load(path)
        cell = nb.cells[1]
        assert cell.cell_type == "code"
        assert "hide-input" in cell.metadata.get("tags", [])
        urls = re.findall(r"https?://[^\"'\s]+", cell.source)
        assert urls == [REPO_URL], f"install URL(s) {urls} must be exactly [{REPO_URL}]"
        assert max(len(line) for line in cell.source.splitlines()) <= 79, \
            "an install cell line is wider than the book's text column at 1280 px (79 characters)"
        assert cell.source == install_cell.cell_source(REPO_URL), \
            "install cell differs from tools/install_cell.py's (run: python tools/install_cell.py)"

    @pytest.mark.parametrize("importable", [False, True], ids=["missing", "importable"])
    @pytest.mark.parametrize("pip_ok", [False, True], ids=["pip-fails", "pip-ok"])
    def test_install_cell_behaviour_on_colab(self, path, importable, pip_ok, monkeypatch, capsys):
        """Run the cell as on Colab: it pip-installs the configured URL only when the packages are
        missing, never raises, and prints what to do when pip fails."""
        import importlib.util
        import subprocess
        import sys
        import types

        calls = []

        def fake_run(cmd, **kwargs):
            calls.append((cmd, kwargs))
            return types.SimpleNamespace(returncode=0 if pip_ok else 1)

        real_find_spec = importlib.util.find_spec
        monkeypatch.setattr(subprocess, "run", fake_run)
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: real_find_spec(name, *a) if importable or
                            name not in ("lattn_core", "kernels") else None)
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
        exec(compile(_load(path).cells[1].source, path.name, "exec"), {})
        out = capsys.readouterr().out
        if importable:
            assert calls == [] and out == "", "installs although the packages are importable"
            return
        assert len(calls) == 1, calls
        cmd, kwargs = calls[0]
        assert cmd[0] == sys.executable and cmd[1:4] == ["-m", "pip", "install"], cmd
        assert cmd[-1] == f"git+{REPO_URL}", cmd
        assert kwargs.get("check") is not True and kwargs["env"].get("GIT_TERMINAL_PROMPT") == "0"
        if pip_ok:
            assert out == ""
        else:
            assert REPO_URL in out and "git clone" in out and "pip install" in out, out

    def test_hidden_solution_and_widget(self, path):
        nb = _load(path)
        hidden = [c for c in nb.cells if c.cell_type == "code" and "hide-cell" in c.metadata.get("tags", [])]
        assert hidden, "needs at least one hide-cell tagged solution cell"
        assert all(re.search(r"\bassert\b|check_close|check_symbolic", c.source) for c in hidden), \
            "every hidden solution must end in a check"
        assert any("show_widget(" in c.source for c in nb.cells if c.cell_type == "code")

    def test_links_back_and_forward(self, path):
        """The chapter's last text cell links to the chapter before it and the one after it (by file,
        so the link works on the web, on Colab and in a clone); the first and the last chapter link
        one way."""
        i = NOTEBOOKS.index(path)
        last = [c for c in _load(path).cells if c.cell_type == "markdown"][-1].source
        links = set(re.findall(r"\]\((\d\d_[a-z0-9_]+\.ipynb)\)", last))
        want = {p.name for p in NOTEBOOKS[max(i - 1, 0):i + 2] if p != path}
        assert links == want, (f"last text cell links to {sorted(links)}; expected {sorted(want)} "
                               "(python tools/chapter_links.py writes them)")

    def test_headings(self, path):
        nb = _load(path)
        levels = []
        for cell in nb.cells:
            if cell.cell_type != "markdown":
                continue
            for line in _markdown_lines_outside_fences(cell.source):
                m = re.match(r"(#{1,6})\s", line)
                if m:
                    levels.append(len(m.group(1)))
        assert levels.count(1) == 1 and levels[0] == 1, f"exactly one level-1 heading, first; got {levels}"
        for prev, cur in zip(levels, levels[1:]):
            assert cur <= prev + 1, f"heading levels skip from {prev} to {cur}"
        title = [c for c in nb.cells if c.cell_type == "markdown"][0].source
        num = int(path.name[:2])
        assert re.search(rf"^# Chapter {num}: \S", title, re.M), "title must read '# Chapter N: Title'"


CITE = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]+)`")


def _cited_keys():
    sources = []
    for path in NOTEBOOKS:
        sources += [(path, c.source) for c in _load(path).cells if c.cell_type == "markdown"]
    for path in sorted((ROOT / "book").glob("*.md")):
        sources.append((path, path.read_text()))
    keys = []
    for path, text in sources:
        for group in CITE.findall(text):
            keys += [(path.name, k.strip()) for k in group.split(",") if k.strip()]
    return keys


def test_every_cite_key_is_in_references_bib():
    bib = (ROOT / "book" / "references.bib").read_text()
    defined = set(re.findall(r"^@\w+\{([^,\s]+),", bib, re.M))
    used = _cited_keys()
    assert used, "no citations found at all"
    missing = sorted({f"{where}: {k}" for where, k in used if k not in defined})
    assert not missing, f"cite keys missing from references.bib: {missing}"


def test_references_bib_has_no_duplicate_keys():
    bib = (ROOT / "book" / "references.bib").read_text()
    keys = re.findall(r"^@\w+\{([^,\s]+),", bib, re.M)
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    assert not dupes, f"duplicate keys in references.bib: {dupes}"


def test_identities_page_points_at_existing_tests():
    """Every `tests/<file>.py::<name>` cited in book/identities.md names a test that exists."""
    text = (ROOT / "book" / "identities.md").read_text()
    refs = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", text)
    assert refs, "identities.md cites no tests"
    for file, name in refs:
        path = ROOT / file
        assert path.exists(), f"{file} does not exist"
        assert re.search(rf"^\s*def {name}\(|^class {name}\b", path.read_text(), re.M), f"{file}::{name} not found"


GENERIC_REFS = re.compile(r"^(experiment|exercises?( \d+( and \d+)?)?|summary|the kernel)$", re.I)


def test_identities_page_names_existing_sections():
    """Every section an entry of book/identities.md names in italics, ``(*name; name*)``, is a heading
    (or the bold lead of a paragraph) of that chapter's notebook, compared without case; ``N / name``
    names a section of chapter N. Generic words (experiment, exercise 2, summary) are not checked."""
    text = (ROOT / "book" / "identities.md").read_text()
    by_chapter = {int(p.name[:2]): p for p in NOTEBOOKS}
    heads = {}
    for ch, path in by_chapter.items():
        found = []
        for c in _load(path).cells:
            if c.cell_type == "markdown":
                found += re.findall(r"^#+\s+(.*?)\s*$", c.source, re.M)
                found += [b.rstrip(".") for b in re.findall(r"^\*\*([^*]+)\*\*", c.source, re.M)]
        heads[ch] = [h.lower() for h in found]
    sections = re.split(r"^## (Chapter \d+|Chapters 5 and 6 together)\s*$", text, flags=re.M)
    missing, checked = [], 0
    for title, body in zip(sections[1::2], sections[2::2]):
        if not re.fullmatch(r"Chapter \d+", title):     # "Chapters 5 and 6 together": no one chapter
            continue
        chapter = int(title.split()[1])
        for item in re.findall(r"^- (.*)$", body, re.M):
            paren = re.findall(r"\(([^()]*\*[^()]*)\)\.?$", item.split(" Test:")[0])
            if not paren:
                continue
            for span in re.findall(r"\*([^*]+)\*", paren[-1]):
                for ref in (r.strip() for r in span.split(";")):
                    ch, name = chapter, ref
                    m = re.match(r"^(\d+) / (.*)$", ref)
                    if m:
                        ch, name = int(m.group(1)), m.group(2)
                    if GENERIC_REFS.match(name):
                        continue
                    checked += 1
                    if not any(name.lower() in h for h in heads[ch]):
                        missing.append(f"Chapter {chapter}: *{ref}*")
    assert checked > 50, checked
    assert not missing, f"identities.md names sections no notebook has: {missing}"


def test_bold_symbol_macros_are_defined():
    """Every two-letter bold macro (``\\bQ``, ``\\bk``, ...) used in the book is defined in _config.yml.

    MathJax renders an undefined macro as red text without any build warning, so this is the only
    place such a typo is caught.
    """
    macros = set(CONFIG["sphinx"]["config"]["mathjax3_config"]["tex"]["macros"])
    texts = [(p.name, p.read_text()) for p in sorted((ROOT / "book").glob("*.md"))]
    for path in NOTEBOOKS:
        texts += [(path.name, c.source) for c in _load(path).cells if c.cell_type == "markdown"]
    missing = set()
    for name, text in texts:
        for cmd in re.findall(r"\\(b[A-Za-z])(?![A-Za-z])", text):
            if cmd not in macros and cmd != "bf":
                missing.add(f"{name}: \\{cmd}")
    assert not missing, f"undefined bold macros (add them to _config.yml): {sorted(missing)}"


def test_book_pages_code_lines_fit_the_column():
    """The code cells of the book's MyST pages (book/*.md) within CODE_WIDTH characters, as the
    chapters' (the API page once held a line 164 px too wide)."""
    wide = []
    for page in sorted((ROOT / "book").glob("*.md")):
        inside = False
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if line.startswith("```"):
                inside = line.startswith("```{code-cell}")
                continue
            if inside and len(line) > CODE_WIDTH:
                wide.append(f"{page.name}:{n} ({len(line)})")
    assert not wide, wide
