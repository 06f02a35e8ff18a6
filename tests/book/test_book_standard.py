"""The book's standard, read from its sources (issue 38): what every chapter notebook and the
notation appendix must hold, checked without running anything.

* Every chapter shows a NumPy reference on the page: a ``show_source`` of a ``lattn_core`` object
  (not only of ``kernels`` code, not of a helper).
* The notation appendix gives each symbol one meaning (the rules are in the docstrings below).
* Figure captions in the notebooks are numbered ``*Figure <chapter>.<k>: ``, ``k`` = 1, 2, 3, ...
* No chapter leaves a progress bar: no tqdm in a notebook, no ``progress=`` switched on by a
  chapter, and every ``progress`` switch in the code off by default.
* Every public ``lattn_core`` function or class that says ``Defined in Chapter N (<title>).`` names
  a chapter of ``_toc.yml`` that mentions it, and ``<title>`` begins that chapter's title.

A chapter is a notebook ``notebooks/NN_*.ipynb`` listed in ``_toc.yml``; its number is ``NN``.
"""
import ast
import importlib
import inspect
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------------------------
# The chapters


def _toc_files(node):
    if isinstance(node, dict):
        if "file" in node:
            yield node["file"]
        for v in node.values():
            yield from _toc_files(v)
    elif isinstance(node, list):
        for v in node:
            yield from _toc_files(v)


def chapters() -> dict:
    """``{number: path}`` of every chapter notebook in ``_toc.yml``."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    out = {}
    for f in _toc_files(toc):
        m = re.match(r"notebooks/(\d+)_", f)
        if m:
            out[int(m.group(1))] = ROOT / (f + ".ipynb")
    return out


CHAPTERS = chapters()


def cells(path, kind=None):
    nb = json.loads(Path(path).read_text())
    return [c for c in nb["cells"] if kind is None or c["cell_type"] == kind]


def source(cell) -> str:
    s = cell["source"]
    return "".join(s) if isinstance(s, list) else s


def code_tree(path) -> ast.Module:
    """Every code cell of a notebook as one module (IPython magics and shell lines left out)."""
    body = []
    for c in cells(path, "code"):
        text = "\n".join(l for l in source(c).splitlines() if not l.lstrip().startswith(("%", "!")))
        try:
            body.extend(ast.parse(text).body)
        except SyntaxError:
            continue
    return ast.Module(body=body, type_ignores=[])


def test_the_chapters_are_found():
    assert len(CHAPTERS) >= 12 and 0 in CHAPTERS, CHAPTERS
    assert all(p.exists() for p in CHAPTERS.values())


# ---------------------------------------------------------------------------------------------
# a. Every chapter shows a lattn_core reference with show_source.

# lattn_core modules that are no model's reference: showing them does not count.
HELPER_MODULES = ("lattn_core.checks", "lattn_core.notebook", "lattn_core._validate", "lattn_core.palette",
                  "lattn_core.distribution", "lattn_core.schematics")


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _aliases(tree):
    """What each name imported in the notebook stands for (``lc`` -> ``lattn_core``, ...)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _resolve(dotted: str):
    """The object a dotted path names, importing modules as needed; ``None`` if it does not exist."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for p in parts[i:]:
                obj = getattr(obj, p)
        except AttributeError:
            return None
        return obj
    return None


def shown_sources(path):
    """``[(what the notebook wrote, resolved dotted path, module of the object)]`` for every
    ``show_source(x, ...)`` call of the notebook."""
    tree = code_tree(path)
    alias = _aliases(tree)
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        f = node.func
        fname = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        if fname != "show_source":
            continue
        written = _dotted(node.args[0])
        if written is None:
            out.append((ast.unparse(node.args[0]), None, None))
            continue
        head, _, rest = written.partition(".")
        full = alias.get(head, head) + ("." + rest if rest else "")
        obj = _resolve(full)
        module = getattr(inspect.getmodule(obj), "__name__", None) if obj is not None else None
        out.append((written, full, module))
    return out


def is_reference(module) -> bool:
    return bool(module) and module.startswith("lattn_core.") and not module.startswith(HELPER_MODULES)


@pytest.mark.parametrize("number", sorted(CHAPTERS))
def test_every_chapter_shows_a_lattn_core_reference(number):
    """Every chapter introduces a model (Chapter 0 the RNN and attention as a lookup,
    ``lattn_core.rnn``; Chapter 12 the re-reading RNN and stick-breaking attention,
    ``lattn_core.whats_next``), so none is exempt: each shows at least one NumPy reference of
    ``lattn_core`` with ``show_source``, as it shows its kernels."""
    shown = shown_sources(CHAPTERS[number])
    refs = [s for s in shown if is_reference(s[2])]
    assert refs, (f"Chapter {number} ({CHAPTERS[number].name}) shows no lattn_core reference with "
                  f"show_source; it shows {[s[0] for s in shown] or 'nothing'}")


def test_show_source_resolution_sees_lattn_core_and_kernels():
    tree = ast.parse("import lattn_core as lc\nfrom lattn_core import path as lp\n"
                     "from lattn_core.notebook import show_source\nimport kernels.flash.op as fop\n"
                     "show_source(lc.deltanet_recurrent)\nshow_source(lp.path_attention_recurrent, 'a')\n"
                     "show_source(fop)\nshow_source(lc.check_close)\n")
    alias = _aliases(tree)
    assert alias["lc"] == "lattn_core" and alias["lp"] == "lattn_core.path" and alias["fop"] == "kernels.flash.op"
    mods = [getattr(inspect.getmodule(_resolve(x)), "__name__", None)
            for x in ("lattn_core.deltanet_recurrent", "lattn_core.path.path_attention_recurrent",
                      "lattn_core.check_close")]
    assert mods == ["lattn_core.delta", "lattn_core.path", "lattn_core.checks"]
    assert [is_reference(m) for m in mods] == [True, True, False]
    assert not is_reference("kernels.flash.op")


# ---------------------------------------------------------------------------------------------
# b. The notation appendix: one symbol, one meaning.
#
# The list under "## Every symbol, one meaning" in book/notation.md is parsed entry by entry
# ("- <symbols>: <meaning> (Chapter N)"). An entry's symbols are the $...$ groups before its first
# ": " outside math, split at top-level commas and semicolons; a group "X = ..." declares X.
# Symbols are compared after normalisation: the book's macros expanded (_config.yml), spacing and
# "\boldsymbol X" / "\boldsymbol{X}" unified, and a subscript that is only a token index (t, i, j,
# l, s, tau, or several of them: _t, _{ij}, _{i,l}) dropped, so S_t, S_i and S are one symbol while
# S_0, S^star, b_C, K_beta are others. The appendix fails when
#   1. a symbol is declared by two entries;
#   2. an entry names in its meaning a symbol that another entry declares: a $X$ or $X = ...$
#      followed by " the" ("$\boldsymbol R_i$ the product from the first token"), or a "$X = ...$"
#      between semicolons ("...; $\bW = [\bw_1,\dots,\bw_n]^\top$; ..."), with X a symbol of
#      another entry (an equation that only uses X, "$\bS_t = \boldsymbol F_t\odot\bS_{t-1}$", does
#      not name it);
#   3. an entry gives its symbols a second meaning: (a) a clause of its meaning starts "in
#      Chapter(s) N" (after ";", "." or "(", not "in Chapter N's"), (b) its symbols are qualified by
#      a model ("$A$, $B$ in DeltaFormer: ..."), or (c) its meaning speaks of another chapter's
#      version of one of its own symbols ("Chapter 8's $H_t$ ...");
#   4. under "## Local names that reuse a letter", a local name is a symbol of the table: a name is
#      a $...$ group that is a single symbol and is defined there (it is followed by " is", " are",
#      " names", " the", or "," and the next name of a list, or is the left side of "="), not a
#      mention such as "Chapter 10's $J$".

INDEX = r"(?:[ijtls]|\\tau)"
STRIP_INDEX = re.compile(r"_(?:\{" + INDEX + r"(?:,?" + INDEX + r")*\}|" + INDEX + r"(?![A-Za-z]))")


def _macros():
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text())
    return cfg["sphinx"]["config"]["mathjax3_config"]["tex"]["macros"]


MACROS = _macros()


def normalize(tex: str) -> str:
    s = tex
    for name in sorted(MACROS, key=len, reverse=True):
        s = re.sub(r"\\" + name + r"(?![A-Za-z])", lambda m, r=MACROS[name]: r, s)
    s = re.sub(r"\\(boldsymbol|mathbf|mathrm|bar|hat|tilde|mathcal)\s*(\\[A-Za-z]+|[A-Za-z0-9])",
               lambda m: "\\" + m.group(1) + "{" + m.group(2) + "}", s)
    s = re.sub(r"\s+", "", s)
    s = STRIP_INDEX.sub("", s)
    return s


def _split_top(s: str, seps=",;") -> list:
    out, depth, cur = [], 0, ""
    for ch in s:
        depth += ch in "{([" 
        depth -= ch in "})]"
        if ch in seps and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [p.strip() for p in out if p.strip()]


def _lhs(group: str):
    parts = _split_top(group, "=")
    return parts[0] if len(parts) > 1 else None


def _outside_math_colon(entry: str) -> int:
    inside = False
    for i, ch in enumerate(entry):
        if ch == "$":
            inside = not inside
        elif ch == ":" and not inside and entry[i + 1:i + 2] in (" ", ""):
            return i
    return -1


def notation_entries(text: str) -> list:
    """``[{"text", "symbols", "head", "meaning", "chapter"}]`` of the "Every symbol" list."""
    sec = text.split("## Every symbol, one meaning", 1)[1].split("\n## ", 1)[0]
    items, cur = [], None
    for line in sec.splitlines():
        if line.startswith("- "):
            cur = line[2:]
            items.append(cur)
        elif cur is not None and line.startswith("  ") and line.strip():
            items[-1] += " " + line.strip()
        elif not line.strip():
            cur = None
    entries = []
    for item in items:
        colon = _outside_math_colon(item)
        head, meaning = (item[:colon], item[colon + 1:]) if colon >= 0 else (item, "")
        symbols = []
        for g in re.findall(r"\$([^$]+)\$", head):
            for part in _split_top(g):
                lhs = _lhs(part)
                symbols.append(normalize(lhs if lhs is not None else part))
        ch = re.findall(r"\(Chapters? (\d+)", item)
        entries.append({"text": item, "head": head, "meaning": meaning, "symbols": symbols,
                        "chapter": int(ch[-1]) if ch else None})
    return entries


def notation_problems(text: str) -> list:
    entries = notation_entries(text)
    problems = []
    owner = {}
    for e in entries:
        for s in dict.fromkeys(e["symbols"]):
            if s in owner and owner[s] is not e:
                problems.append(f"1. ${s}$ is declared by two entries: '{owner[s]['head'].strip()}' and "
                                f"'{e['head'].strip()}'")
            owner.setdefault(s, e)
    for e in entries:
        for m in re.finditer(r"\$([^$]+)\$", e["meaning"]):
            g, before, after = m.group(1), e["meaning"][:m.start()], e["meaning"][m.end():]
            lhs = _lhs(g)
            named = re.match(r"\s+the\b", after) or (lhs is not None and re.search(r";\s*$", before)
                                                     and re.match(r"\s*;", after))
            if not named:
                continue
            s = normalize(lhs if lhs is not None else g)
            other = owner.get(s)
            if other is not None and other is not e:
                problems.append(f"2. '{e['head'].strip()}' (Chapter {e['chapter']}) names ${g}$, the symbol "
                                f"of '{other['head'].strip()}' (Chapter {other['chapter']})")
        m = re.search(r"(?:^|[;.(]\s*)in Chapters? \d+(?:(?:,| and) \d+)*(?!'s)\b", e["meaning"])
        if m:
            problems.append(f"3a. '{e['head'].strip()}' gives a second meaning: '...{m.group(0).strip()}...'")
        m = re.search(r"\$\s+in\s+[A-Z]\w*", e["head"])
        if m:
            problems.append(f"3b. '{e['head'].strip()}' qualifies its symbols by a model: '{m.group(0)[1:].strip()}'")
        for m in re.finditer(r"Chapter (\d+)'s((?:\s+[\w-]+){0,3})\s+\$([^$]+)\$", e["meaning"]):
            if normalize(m.group(3)) in e["symbols"] and int(m.group(1)) != e["chapter"]:
                problems.append(f"3c. '{e['head'].strip()}' speaks of another chapter's ${m.group(3)}$: "
                                f"'{m.group(0)}'")
    symbols = set(owner)
    local = text.split("## Local names that reuse a letter", 1)
    if len(local) == 2:
        sec = local[1].split("\n## ", 1)[0]
        bullets = re.split(r"\n- ", "\n" + sec)[1:]
        for b in bullets:
            b = " ".join(b.split())
            for m in re.finditer(r"\$([^$]+)\$", b):
                g, before, after = m.group(1), b[:m.start()], b[m.end():]
                lhs = _lhs(g)
                name = lhs if lhs is not None else g
                if lhs is None and not re.match(r"\s*(is|are|names|the)\b|\s*,\s*(and\s+)?\$", after):
                    continue
                if re.search(r"Chapter \d+'s(\s+[\w-]+){0,3}\s*$", before):
                    continue
                s = normalize(name)
                if not re.fullmatch(r"(\\[A-Za-z]+\{\\?[A-Za-z]+\}|\\?[A-Za-z]+)(_\{?[^{}]*\}?)?(\^\{?[^{}]*\}?)?", s):
                    continue
                if s in symbols:
                    problems.append(f"4. the local name ${g}$ ({b[:40]}...) is the table's ${s}$ "
                                    f"('{owner[s]['head'].strip()}'): rename it")
    return problems


def test_the_notation_appendix_gives_each_symbol_one_meaning():
    problems = notation_problems((ROOT / "book" / "notation.md").read_text())
    assert not problems, "book/notation.md:\n" + "\n".join(problems)


def test_the_notation_rules_catch_what_they_claim():
    ok = ("## Every symbol, one meaning\n\n"
          "- $n$: number of tokens (Chapter 0)\n"
          "- $\\bq_t, \\bk_t$; $\\bQ, \\bK$: query, key (Chapter 0)\n"
          "- $\\bS_t$: the state (Chapter 2)\n"
          "- $\\bS_0$, $\\bS^\\star$: the state entering a chunk; the rule (Chapter 6)\n"
          "- $\\boldsymbol F_t$: a gate (Chapter 3)\n"
          "- $\\boldsymbol r_t$, $\\boldsymbol s_t$: factors, $\\boldsymbol F_t = \\boldsymbol r_t\\boldsymbol s_t^\\top$ (Chapter 3)\n"
          "- $m$: conjugate-gradient steps (Chapter 9; in Chapter 11's cost column)\n"
          "- $\\bh_i^{(s)}$: a state ($\\bh_t$ of Chapter 0 is another) (Chapter 11)\n"
          "- $\\bh_t$: a hidden state (Chapter 0)\n\n"
          "## Local names that reuse a letter\n\n"
          "- Chapter 7: $\\mathrm d\\bS$ is a gradient (the state $\\bS$ does not appear).\n"
          "- Chapter 9: $\\boldsymbol Y_t = x$; Chapter 10's $\\boldsymbol J$ is the down-shift.\n")
    assert notation_problems(ok) == [], notation_problems(ok)
    bad = ok.replace("- $\\bh_t$: a hidden state (Chapter 0)\n",
                     "- $\\bh_t$: a hidden state (Chapter 0)\n"
                     "- $\\boldsymbol{S}_i$: another state (Chapter 5)\n"                          # 1
                     "- $\\bw_t$: a direction; $\\boldsymbol F_t = \\bI - \\bw_t\\bw_t^\\top$ the factor (Chapter 8)\n"  # 2
                     "- $\\nu$: a channel (Chapter 3); in Chapter 9, a condition number (Chapter 3)\n"  # 3a
                     "- $\\bA$, $\\bB$ in DeltaFormer: two matrices (Chapter 7)\n"                   # 3b
                     "- $\\boldsymbol G_t$: a sum; Chapter 8's $\\boldsymbol G_t$ is another (Chapter 9)\n"  # 3c
                     ).replace("$\\boldsymbol Y_t = x$", "$\\bS_t = x$")                            # 4
    found = notation_problems(bad)
    for rule in ("1.", "2.", "3a.", "3b.", "3c.", "4."):
        assert any(p.startswith(rule) for p in found), (rule, found)


def test_normalisation():
    assert normalize(r"\bS_t") == normalize(r"\boldsymbol{S}") == normalize(r"\boldsymbol S_i") == r"\boldsymbol{S}"
    assert normalize(r"\boldsymbol{R}_{ij}") == normalize(r"\boldsymbol R_t") == r"\boldsymbol{R}"
    assert normalize(r"\bS_0") != normalize(r"\bS_t") != normalize(r"\bS^\star")
    assert normalize(r"\bG") == r"\boldsymbol{\Gamma}" != normalize(r"\boldsymbol{G}_t")
    assert normalize(r"b_C") != normalize(r"b_i") == "b"
    assert normalize(r"\bK_\beta") != normalize(r"\bK")
    assert normalize(r"\boldsymbol X_{i,l}") == r"\boldsymbol{X}"


# ---------------------------------------------------------------------------------------------
# c. Figure captions in the notebooks.

CAPTION_START = re.compile(r"^\s*\**_?Figure\b")
CAPTION = re.compile(r"^\*Figure (\d+)\.(\d+): \S")


@pytest.mark.parametrize("number", sorted(CHAPTERS))
def test_figure_captions_are_numbered_in_order(number):
    """Every markdown cell that starts as a caption (``*Figure``, ``Figure``, ``**Figure``) is
    ``*Figure <chapter>.<k>: ...`` with ``<chapter>`` the notebook's number and ``k`` = 1, 2, 3, ...
    in the order of the cells."""
    bad, k = [], 0
    for c in cells(CHAPTERS[number], "markdown"):
        text = source(c)
        if not CAPTION_START.match(text):
            continue
        k += 1
        m = CAPTION.match(text.lstrip())
        first = text.strip().splitlines()[0][:70]
        if not m:
            bad.append(f"not numbered: {first!r}")
        elif (int(m.group(1)), int(m.group(2))) != (number, k):
            bad.append(f"numbered {m.group(1)}.{m.group(2)}, expected {number}.{k}: {first!r}")
    assert not bad, f"Chapter {number} ({CHAPTERS[number].name}), {len(bad)} of {k} captions:\n" + "\n".join(bad)


# ---------------------------------------------------------------------------------------------
# d. No progress bars.

def _progress_defaults():
    """(where, default) of every ``progress`` parameter of the code's functions."""
    out = []
    for pkg in ("experiments", "lattn_core", "kernels"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "lab" in path.relative_to(ROOT / pkg).parts[:-1]:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                a = node.args
                pos = a.posonlyargs + a.args
                defaults = dict(zip([x.arg for x in pos][len(pos) - len(a.defaults):], a.defaults))
                defaults.update({x.arg: d for x, d in zip(a.kwonlyargs, a.kw_defaults)})
                for name in [x.arg for x in pos + a.kwonlyargs]:
                    if name == "progress":
                        d = defaults.get(name)
                        out.append((f"{path.relative_to(ROOT)}:{node.lineno} {node.name}",
                                    None if d is None else ast.literal_eval(d) if isinstance(d, ast.Constant) else ast.unparse(d)))
    return out


def test_progress_is_off_by_default_in_the_code():
    found = _progress_defaults()
    assert found, "the experiments take a progress switch; the test must see it"
    on = [(w, d) for w, d in found if d not in (False, None)]
    assert not on, f"a progress bar on by default: {on}"


@pytest.mark.parametrize("number", sorted(CHAPTERS))
def test_no_chapter_draws_a_progress_bar(number):
    tree = code_tree(CHAPTERS[number])
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            if any(m and m.split(".")[0] == "tqdm" for m in mods):
                bad.append(f"imports tqdm: {ast.unparse(node)}")
        elif isinstance(node, ast.Call):
            f = node.func
            fname = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if fname in ("tqdm", "trange"):
                bad.append(f"draws a bar: {ast.unparse(node)[:80]}")
            for kw in node.keywords:
                if kw.arg == "progress" and not (isinstance(kw.value, ast.Constant) and kw.value.value in (False, None)):
                    bad.append(f"switches progress on: {ast.unparse(node)[:80]}")
    assert not bad, f"Chapter {number} ({CHAPTERS[number].name}): {bad}"


# ---------------------------------------------------------------------------------------------
# e. "Defined in Chapter N (<title>)." names a chapter that teaches the name.

def _title(path) -> str:
    for c in cells(path, "markdown"):
        for line in source(c).splitlines():
            m = re.match(r"#\s+Chapter\s+\d+\s*:\s*(.+)", line)
            if m:
                return m.group(1).strip()
    return ""


def _defined_in():
    """``(where it is defined, its public names, (chapter, title))`` once per object."""
    from tests.core.test_defined_in import back_links, public_objects
    names, objs = {}, {}
    for m, name, obj in public_objects():
        names.setdefault(id(obj), set()).add(name)
        objs[id(obj)] = obj
    for key, obj in objs.items():
        for link in back_links(obj):
            if link is not None:
                yield f"{obj.__module__}.{obj.__qualname__}", names[key], link


def test_defined_in_names_a_chapter_that_teaches_the_name():
    """The chapter exists (a notebook of _toc.yml with that number), mentions the name (or another
    public name of the same object) as a word of its cells, and its title begins with the title the
    docstring gives."""
    texts = {n: "\n".join(source(c) for c in cells(p)) for n, p in CHAPTERS.items()}
    titles = {n: _title(p) for n, p in CHAPTERS.items()}
    problems = []
    seen = 0
    for where, names, (number, title) in _defined_in():
        seen += 1
        if number not in CHAPTERS:
            problems.append(f"{where}: Chapter {number} is no notebook of _toc.yml")
            continue
        if not any(re.search(r"(?<![\w])" + re.escape(n) + r"\b", texts[number]) for n in names):
            problems.append(f"{where}: Chapter {number} ({CHAPTERS[number].name}) never mentions it")
        if not titles[number].lower().startswith(title.lower()):
            problems.append(f"{where}: Chapter {number} is titled {titles[number]!r}, not {title!r}")
    assert seen > 100, seen
    assert not problems, f"{len(problems)} back-links of {seen} are wrong:\n" + "\n".join(problems)
