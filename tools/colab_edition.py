"""Write the Colab edition of every chapter: ``colab/NN_name.ipynb`` from ``notebooks/NN_name.ipynb``.

    python tools/colab_edition.py           # (re)write colab/*.ipynb (outputs empty)
    python tools/colab_edition.py --check   # exit 1 if a file differs from what this writes
    python tools/colab_edition.py --check-built _build/html
                                            # exit 1 if the rendered book numbers an equation
                                            # otherwise than the Colab edition (make pagecheck)

The rendered book reads MyST; a notebook viewer (Colab, Jupyter, VS Code, GitHub's preview) reads
plain Markdown with ``$``-math and knows nothing of ``_config.yml``. Each chapter's Colab edition
is the book's notebook with

* every math span self-contained: the MathJax macros of ``_config.yml``
  (``sphinx.config.mathjax3_config.tex.macros``, the one list) expanded inside the span, the way
  MathJax itself substitutes them (macros with arguments too), and ``<`` followed by a letter
  spaced (``< i``) so that no viewer mistakes it for an HTML tag;
* labelled display equations (``$$ ... $$ (label)``, ``{math}`` with ``:label:``) carrying
  ``\\tag{N}`` with the rendered book's number (Sphinx numbers them through the whole book in the
  order of ``_toc.yml``), and ``{eq}`` references written as that number, ``(N)`` (a link when the
  equation lives on another page);
* citations as author-year text linking to the book's bibliography page (``{cite}`` and
  ``{cite:p}`` as the book shows them, ``[Su, 2025]``; ``{cite:t}`` as ``Su [2025]``), from
  ``book/references.bib``; ``{doc}`` and ``{ref}`` as links into the rendered book; ``(label)=``
  targets dropped; admonitions as block quotes, ``{figure}``/``{image}`` as images; any other
  MyST role or directive stops the tool with a message (teach it here);
* the install cell replaced by ``tools/install_cell.py``'s Colab cell (three routes: an uploaded
  wheel, the repository, the package index); cells tagged ``hide-input``/``hide-cell`` folded
  (Colab's ``cellView: form`` with a ``# @title``, and Jupyter's ``source_hidden``; a
  ``hide-cell`` also ``outputs_hidden``); macros inside ``$``-math of a code cell's string literals
  expanded too (a ``display(Markdown(...))`` output is math a viewer renders);
* notebook metadata asking Colab for a GPU runtime (``accelerator``, ``colab.gpuType``).

The rendered book's address is ``html.baseurl`` of ``_config.yml`` when set, else the GitHub
Pages address of ``repository.url`` (``https://OWNER.github.io/REPO/``).
tests/book/test_colab_edition.py checks that ``colab/`` is what this writes, and reads it as a viewer
would (KaTeX and MathJax on every span, no MyST left, badges naming files that exist).
"""
from __future__ import annotations

import copy
import json
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import install_cell  # noqa: E402  (tools/ is not a package; the install cells' one source)

NOTEBOOK_DIR = "notebooks"
COLAB_DIR = "colab"
GPU_TYPE = "T4"          # what a free Colab account gets; L4 and A100 run the chapters too
ADMONITIONS = {"note", "warning", "tip", "important", "caution", "attention", "danger", "error",
               "hint", "seealso", "admonition"}
HIDDEN_TITLE = "Hidden in the book: double-click to show the code"


class MystError(ValueError):
    """MyST syntax this tool does not know how to write as plain Markdown."""


# ----------------------------------------------------------------------------------------------
# The book's configuration
# ----------------------------------------------------------------------------------------------

def load_config(root: Path = ROOT) -> dict:
    return yaml.safe_load((root / "_config.yml").read_text())


def config_macros(config: dict) -> dict:
    """``{name: (body, nargs, default)}`` from MathJax's macro table in ``_config.yml``.

    MathJax accepts ``name: "body"``, ``name: ["body", n]`` and ``name: ["body", n, "default of
    #1"]`` (an optional first argument in ``[...]``)."""
    raw = config["sphinx"]["config"]["mathjax3_config"]["tex"]["macros"]
    macros = {}
    for name, value in raw.items():
        if isinstance(value, str):
            macros[name] = (value, 0, None)
        elif isinstance(value, list) and 2 <= len(value) <= 3:
            macros[name] = (value[0], int(value[1]), value[2] if len(value) == 3 else None)
        else:
            raise ValueError(f"_config.yml: macro {name!r}: {value!r} is not a MathJax macro")
    return macros


def owner_repo(config: dict) -> str:
    url = config["repository"]["url"].rstrip("/")
    m = re.fullmatch(r"https://github\.com/([\w.-]+/[\w.-]+?)(?:\.git)?", url)
    if not m:
        raise ValueError(f"repository.url {url!r} is not a GitHub repository")
    return m.group(1)


def branch(config: dict) -> str:
    return config["repository"].get("branch", "main")


def book_url(config: dict) -> str:
    """The rendered book's address, ending in ``/``."""
    base = (config.get("html") or {}).get("baseurl")
    if base:
        return base.rstrip("/") + "/"
    owner, repo = owner_repo(config).split("/")
    return f"https://{owner}.github.io/{repo}/"


def colab_url(config: dict, path: str) -> str:
    """The address that opens ``path`` (relative to the repository root) on Colab."""
    return f"https://colab.research.google.com/github/{owner_repo(config)}/blob/{branch(config)}/{path}"


BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"


def badge(config: dict, notebook_name: str) -> str:
    """The *Open in Colab* badge of a chapter: it opens the chapter's Colab edition."""
    return f"[![Open In Colab]({BADGE_IMAGE})]({colab_url(config, f'{COLAB_DIR}/{notebook_name}')})"


BADGE = re.compile(r"\[!\[Open In Colab\]\(" + re.escape(BADGE_IMAGE) + r"\)\]\(([^)\s]+)\)")


# ----------------------------------------------------------------------------------------------
# TeX: macro expansion
# ----------------------------------------------------------------------------------------------

_CONTROL = re.compile(r"\\([A-Za-z]+|.)", re.S)


def _tex_argument(tex: str, i: int) -> tuple[str, int]:
    """One TeX argument at ``tex[i:]``: a balanced ``{...}`` group (its inside) or one token."""
    while i < len(tex) and tex[i] in " \t\n":
        i += 1
    if i >= len(tex):
        raise ValueError(f"a macro argument is missing at the end of {tex!r}")
    if tex[i] == "{":
        depth, j = 0, i
        while j < len(tex):
            if tex[j] == "\\":
                j += 2
                continue
            if tex[j] == "{":
                depth += 1
            elif tex[j] == "}":
                depth -= 1
                if depth == 0:
                    return tex[i + 1:j], j + 1
            j += 1
        raise ValueError(f"unbalanced braces in {tex!r}")
    m = _CONTROL.match(tex, i)
    if m:
        return m.group(), m.end()
    return tex[i], i + 1


def _one_token(text: str) -> str | None:
    """``text`` when it is one TeX token or one braced group, else ``None``."""
    text = text.strip()
    if len(text) == 1 or (_CONTROL.fullmatch(text) is not None):
        return text
    if text.startswith("{"):
        try:
            inside, end = _tex_argument(text, 0)
        except ValueError:
            return None
        return text if end == len(text) else None
    return None


def expand_macros(tex: str, macros: dict, _depth: int = 0) -> str:
    """``tex`` with every macro of ``macros`` (see :func:`config_macros`) replaced by its body,
    ``#1``...``#9`` by the arguments, and expanded again inside the result.

    MathJax and KaTeX expand a macro where it stands as one token: ``\\tilde\\bk`` puts a tilde
    on all of ``\\boldsymbol{k}``, and so does ``x_\\bk``. Written out, a body of several tokens
    is therefore braced, ``{\\boldsymbol{k}}``, which renders the same. A body that starts with
    ``\\operatorname`` is left unbraced (a brace would make the operator an ordinary symbol and
    lose its spacing; it is never a lone argument). A space is kept after a body that ends in a
    control word when a letter follows (``\\mu x`` stays two tokens)."""
    if _depth > 32:
        raise ValueError(f"macro expansion does not terminate in {tex!r}")
    out, i = [], 0
    while i < len(tex):
        m = _CONTROL.match(tex, i) if tex[i] == "\\" else None
        if m is None:
            out.append(tex[i])
            i += 1
            continue
        name, i = m.group(1), m.end()
        if name not in macros:
            out.append(m.group())
            continue
        body, nargs, default = macros[name]
        args = []
        if nargs and default is not None:
            if i < len(tex) and tex[i] == "[":
                close = tex.index("]", i)
                args.append(tex[i + 1:close])
                i = close + 1
            else:
                args.append(default)
        while len(args) < nargs:
            arg, i = _tex_argument(tex, i)
            args.append(arg)
        text = re.sub(r"#([1-9])", lambda a: args[int(a.group(1)) - 1], body)
        text = expand_macros(text, macros, _depth + 1)
        if _one_token(text) is None and not text.startswith("\\operatorname"):
            text = "{" + text + "}"
        elif re.search(r"\\[A-Za-z]+$", text) and i < len(tex) and tex[i].isalpha():
            text += " "
        out.append(text)
    return "".join(out)


def self_contained_math(tex: str, macros: dict) -> str:
    """A math span's TeX as a viewer needs it: macros expanded, and ``<`` before a letter, ``/``
    or ``!`` spaced (no change to the mathematics; an HTML tag to a careless Markdown parser)."""
    return re.sub(r"<(?=[A-Za-z/!])", "< ", expand_macros(tex, macros))


# ----------------------------------------------------------------------------------------------
# MyST Markdown: the pieces
# ----------------------------------------------------------------------------------------------

@dataclass
class Piece:
    """One piece of a Markdown text. ``kind``: ``text``, ``code`` (a fence or an inline span,
    verbatim), ``math`` (``$``/``$$`` inline; ``delim`` says which), ``display`` (a ``$$`` block;
    ``label`` may be set), ``role`` (``name``, ``body``), ``directive`` (``name``, ``args``,
    ``options``, ``body``, ``fence``), ``target`` (``(label)=``)."""
    kind: str
    text: str = ""
    name: str = ""
    body: str = ""
    label: str | None = None
    delim: str = ""
    args: str = ""
    options: dict = field(default_factory=dict)


_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,}|:{3,})(?P<info>.*)$")
_DIRECTIVE = re.compile(r"^\{(?P<name>[\w:-]+)\}\s*(?P<args>.*)$")
_TARGET = re.compile(r"^ {0,3}\((?P<label>[^()\s]+)\)=\s*$")
_DISPLAY_END = re.compile(r"^(?P<body>.*?)\$\$\s*(?:\((?P<label>[^()\s]+)\))?\s*$", re.S)
_AMSMATH = re.compile(r"^ {0,3}\\begin\{(equation|multline|gather|align|alignat|flalign)\*?\}")


def split_markdown(text: str) -> list[Piece]:
    """``text`` cut into :class:`Piece` s, block by block and then inline, following MyST's rules
    for the syntax the book uses (dollarmath with labels, double-dollar inline math, colon fences)."""
    pieces: list[Piece] = []
    lines = text.splitlines(keepends=True)
    buf: list[str] = []

    def flush():
        if buf:
            pieces.extend(_split_inline("".join(buf)))
            buf.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line.rstrip("\n"))
        if fence and not (fence["fence"][0] == ":" and not fence["info"].startswith("{")):
            flush()
            mark, info = fence["fence"], fence["info"].strip()
            j = i + 1
            while j < len(lines) and not re.fullmatch(
                    rf" {{0,3}}{re.escape(mark[0])}{{{len(mark)},}}\s*", lines[j].rstrip("\n")):
                j += 1
            inner = lines[i + 1:j]
            whole = "".join(lines[i:j + 1])
            i = j + 1
            directive = _DIRECTIVE.match(info)
            if directive is None:
                pieces.append(Piece("code", whole))
                continue
            options, k = {}, 0
            while k < len(inner) and re.match(r"^:[\w-]+:", inner[k]):
                key, _, value = inner[k].strip()[1:].partition(":")
                options[key] = value.strip()
                k += 1
            pieces.append(Piece("directive", whole, name=directive["name"], args=directive["args"],
                                options=options, body="".join(inner[k:]).strip("\n"), delim=mark))
            continue
        if _TARGET.match(line.rstrip("\n")):
            flush()
            pieces.append(Piece("target", line, label=_TARGET.match(line.rstrip("\n"))["label"]))
            i += 1
            continue
        if _AMSMATH.match(line):
            raise MystError(f"a bare amsmath environment ({line.strip()}): write it inside $$ ... $$")
        stripped = line.lstrip(" ")
        if stripped.startswith("$$") and len(line) - len(stripped) <= 3:
            flush()
            rest, j = stripped[2:], i
            while True:
                end = _DISPLAY_END.match(rest) if "$$" in rest else None
                if end:
                    break
                j += 1
                if j >= len(lines):
                    raise MystError(f"a $$ block without its closing $$: {line.strip()}")
                rest += lines[j]
            newline = "\n" if lines[j].endswith("\n") else ""
            pieces.append(Piece("display", "".join(lines[i:j + 1]), body=end["body"],
                                label=end["label"], delim=newline))
            i = j + 1
            continue
        buf.append(line)
        i += 1
    flush()
    return pieces


_ROLE = re.compile(r"\{(?P<name>[\w:-]+)\}(?P<ticks>`+)(?P<body>.+?)(?P=ticks)", re.S)


def _split_inline(text: str) -> list[Piece]:
    pieces: list[Piece] = []
    plain: list[str] = []

    def emit(piece):
        if plain:
            pieces.append(Piece("text", "".join(plain)))
            plain.clear()
        pieces.append(piece)

    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            plain.append(text[i:i + 2])
            i += 2
            continue
        if c == "{":
            m = _ROLE.match(text, i)
            if m:
                emit(Piece("role", m.group(), name=m["name"], body=m["body"]))
                i = m.end()
                continue
        if c == "`":
            ticks = re.match(r"`+", text[i:]).group()
            close = text.find(ticks, i + len(ticks))
            while close != -1 and text[close + len(ticks):close + len(ticks) + 1] == "`":
                close = text.find(ticks, close + len(ticks) + 1)
            if close != -1:
                emit(Piece("code", text[i:close + len(ticks)]))
                i = close + len(ticks)
                continue
        if c == "$":
            delim = "$$" if text.startswith("$$", i) else "$"
            j = i + len(delim)
            close = -1
            while j < len(text):
                if text[j] == "\\":
                    j += 2
                    continue
                if text.startswith(delim, j):
                    close = j
                    break
                if text.startswith("\n\n", j) or re.match(r"\n[ \t]*\n", text[j:]):
                    break
                j += 1
            if close > i + len(delim):
                emit(Piece("math", text[i:close + len(delim)], body=text[i + len(delim):close], delim=delim))
                i = close + len(delim)
                continue
        plain.append(c)
        i += 1
    if plain:
        pieces.append(Piece("text", "".join(plain)))
    return pieces


# ----------------------------------------------------------------------------------------------
# The book's pages: equation numbers, page titles, targets, the bibliography
# ----------------------------------------------------------------------------------------------

def _toc_docs(node) -> list[str]:
    """Every document of ``_toc.yml`` in Sphinx's order: a document, then what it lists."""
    docs = []
    if isinstance(node, dict):
        for key in ("root", "file"):
            if isinstance(node.get(key), str):
                docs.append(node[key])
        for key in ("parts", "chapters", "sections"):
            for item in node.get(key, []) or []:
                docs += _toc_docs(item)
    return docs


def _doc_path(root: Path, doc: str) -> Path:
    for suffix in (".ipynb", ".md"):
        if (root / f"{doc}{suffix}").is_file():
            return root / f"{doc}{suffix}"
    raise FileNotFoundError(f"_toc.yml lists {doc}, which has no .ipynb or .md")


def _doc_markdown(path: Path) -> list[str]:
    if path.suffix == ".ipynb":
        return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown"]
    return [path.read_text()]


def _walk_pieces(pieces):
    """Every piece, and those inside directives whose body is Markdown."""
    for piece in pieces:
        yield piece
        if piece.kind == "directive" and piece.name != "math":
            yield from _walk_pieces(split_markdown(piece.body))


@dataclass
class Book:
    """What the Colab edition needs to know of the whole book."""
    config: dict
    macros: dict
    url: str
    equations: dict      # label -> (number, doc)
    titles: dict         # doc -> its page title
    targets: dict        # label -> (doc, the title of what follows it)
    bibliography: str    # the doc holding the {bibliography} directive
    references: dict     # key -> (authors' last names, year)
    cite_id: str         # Sphinx's id of a bibliography entry, a format string of {key}


@lru_cache(maxsize=None)
def load_book(root: Path = ROOT) -> Book:
    config = load_config(root)
    docs = _toc_docs(yaml.safe_load((root / "_toc.yml").read_text()))
    equations, titles, targets, bibliography, number = {}, {}, {}, None, 0
    for doc in docs:
        pending = []
        for text in _doc_markdown(_doc_path(root, doc)):
            for piece in _walk_pieces(split_markdown(text)):
                label = None
                if piece.kind == "display" and piece.label:
                    label = piece.label
                elif piece.kind == "directive" and piece.name == "math" and piece.options.get("label"):
                    label = piece.options["label"]
                elif piece.kind == "directive" and piece.name == "bibliography":
                    bibliography = doc
                elif piece.kind == "target":
                    pending.append(piece.label)
                elif piece.kind == "text" and pending:
                    heading = re.search(r"^#+\s+(.*?)\s*$", piece.text, re.M)
                    for target in pending:
                        targets[target] = (doc, heading.group(1) if heading else target)
                    pending = []
                if piece.kind == "text" and doc not in titles:
                    heading = re.search(r"^#\s+(.*?)\s*$", piece.text, re.M)
                    if heading:
                        titles[doc] = heading.group(1)
                if label:
                    if label in equations:
                        raise MystError(f"equation label {label!r} is defined twice")
                    number += 1
                    equations[label] = (number, doc)
    if bibliography is None:
        raise MystError("no page of _toc.yml holds a {bibliography} directive")
    return Book(config=config, macros=config_macros(config), url=book_url(config), equations=equations,
                titles=titles, targets=targets, bibliography=bibliography,
                references=_references(root, config),
                cite_id=(config["sphinx"]["config"].get("bibtex_cite_id") or ""))


def _references(root: Path, config: dict) -> dict:
    from pybtex.database import parse_file
    from pybtex.richtext import Text
    refs = {}
    for bibfile in config.get("bibtex_bibfiles", []):
        for key, entry in parse_file(str(root / bibfile)).entries.items():
            people = entry.persons.get("author") or entry.persons.get("editor") or []
            names = [Text(*p.rich_last_names).render_as("text") for p in people]
            refs[key] = (names, entry.fields.get("year", "n.d."))
    return refs


def _page_url(book: Book, doc: str, anchor: str = "") -> str:
    return f"{book.url}{doc}.html" + (f"#{anchor}" if anchor else "")


def _authors(names: list[str], full: bool) -> str:
    if len(names) == 1 or (full and len(names) == 2):
        return " and ".join(names)
    if len(names) == 2:
        return f"{names[0]} and {names[1]}"
    if full:
        return ", ".join(names[:-1]) + ", and " + names[-1]
    return f"{names[0]} *et al.*"


def _cite(book: Book, role: str, body: str) -> str:
    kind = role.partition(":")[2] or "p"
    links = []
    for key in (k.strip() for k in body.split(",")):
        if key not in book.references:
            raise MystError(f"{{cite}}`{key}`: no such key in the bibliography")
        names, year = book.references[key]
        anchor = ""
        if book.cite_id:
            from docutils.nodes import make_id
            anchor = make_id(book.cite_id.format(key=key, bibliography_count=1))
        url = _page_url(book, book.bibliography, anchor)
        full = kind.endswith("s")
        who = _authors(names, full) if names else key
        if kind in ("p", "ps"):
            links.append(f"[{who}, {year}]({url})")
        elif kind in ("t", "ts"):
            links.append(f"[{who} [{year}]]({url})")
        elif kind in ("author", "authors"):
            links.append(f"[{who}]({url})")
        elif kind == "year":
            links.append(f"[{year}]({url})")
        else:
            raise MystError(f"{{{role}}}: this citation style is not supported by tools/colab_edition.py")
    joined = ", ".join(links)
    return f"[{joined}]" if kind in ("p", "ps") else joined


def _resolve_doc(current_doc: str, target: str) -> str:
    """A ``{doc}`` target, relative to the current document or absolute from the book's root."""
    if target.startswith("/"):
        return target.lstrip("/")
    parts = (Path(current_doc).parent / target).parts
    out: list[str] = []
    for part in parts:
        if part == "..":
            out.pop()
        elif part != ".":
            out.append(part)
    return "/".join(out)


def _explicit(body: str) -> tuple[str | None, str]:
    """``text <target>`` -> (text, target); ``target`` -> (None, target)."""
    m = re.fullmatch(r"(?P<text>.*?)\s*<(?P<target>[^<>]+)>", body.strip(), re.S)
    return (m["text"], m["target"]) if m else (None, body.strip())


# ----------------------------------------------------------------------------------------------
# Markdown: MyST to plain Markdown
# ----------------------------------------------------------------------------------------------

def plain_markdown(text: str, book: Book, doc: str) -> str:
    """A MyST Markdown text of document ``doc`` (e.g. ``notebooks/02_linear_attention``) as plain
    Markdown with self-contained math (see the module's docstring)."""
    out = []
    for piece in split_markdown(text):
        out.append(_piece_markdown(piece, book, doc))
    return "".join(out)


def _tagged_display(body: str, label: str | None, book: Book, newline: str) -> str:
    tex = self_contained_math(body.strip("\n"), book.macros)
    if label is not None:
        if label not in book.equations:
            raise MystError(f"equation label {label!r} is not in any page of _toc.yml")
        tex += f"\n\\tag{{{book.equations[label][0]}}}"
    return f"$$\n{tex}\n$${newline}"


def _piece_markdown(piece: Piece, book: Book, doc: str) -> str:
    kind = piece.kind
    if kind in ("text", "code"):
        return piece.text
    if kind == "math":
        return f"{piece.delim}{self_contained_math(piece.body, book.macros)}{piece.delim}"
    if kind == "display":
        return _tagged_display(piece.body, piece.label, book, piece.delim)
    if kind == "target":
        return ""
    if kind == "role":
        return _role_markdown(piece, book, doc)
    if kind == "directive":
        return _directive_markdown(piece, book, doc)
    raise AssertionError(kind)


def _role_markdown(piece: Piece, book: Book, doc: str) -> str:
    name, body = piece.name, piece.body
    if name == "eq":
        label = body.strip()
        if label not in book.equations:
            raise MystError(f"{{eq}}`{label}`: no display equation has this label")
        number, where = book.equations[label]
        if where == doc:
            return f"({number})"
        if where.startswith(f"{NOTEBOOK_DIR}/"):      # another chapter: its Colab edition
            return f"[({number})]({Path(where).name}.ipynb)"
        from docutils.nodes import make_id
        return f"[({number})]({_page_url(book, where, make_id('equation-' + label))})"
    if name == "cite" or name.startswith("cite:"):
        return _cite(book, name, body)
    if name == "doc":
        text, target = _explicit(body)
        target_doc = _resolve_doc(doc, target)
        title = text or book.titles.get(target_doc)
        if title is None:
            raise MystError(f"{{doc}}`{body}`: no page {target_doc} in _toc.yml")
        return f"[{title}]({_page_url(book, target_doc)})"
    if name == "ref":
        text, label = _explicit(body)
        if label not in book.targets:
            raise MystError(f"{{ref}}`{body}`: no target ({label})=")
        where, title = book.targets[label]
        return f"[{text or title}]({_page_url(book, where, label)})"
    if name == "math":
        return f"${self_contained_math(body, book.macros)}$"
    raise MystError(f"the MyST role {{{name}}} is not supported by tools/colab_edition.py: "
                    "teach it there")


def _directive_markdown(piece: Piece, book: Book, doc: str) -> str:
    name = piece.name
    if name == "math":
        return _tagged_display(piece.body, piece.options.get("label"), book, "\n")
    if name in ADMONITIONS:
        title = piece.args if name == "admonition" else (piece.args or name.capitalize())
        inner = plain_markdown(piece.body, book, doc).strip("\n")
        quoted = "\n".join(f"> {line}".rstrip() for line in f"**{title}**\n\n{inner}".splitlines())
        return quoted + "\n"
    if name in ("figure", "image"):
        src = piece.args.strip()
        if not re.match(r"https?://", src):
            rel = _resolve_doc(doc, src)
            src = f"https://raw.githubusercontent.com/{owner_repo(book.config)}/{branch(book.config)}/{rel}"
        caption = plain_markdown(piece.body, book, doc).strip()
        alt = piece.options.get("alt", caption.splitlines()[0] if caption else "")
        image = f"![{alt}]({src})"
        return image + (f"\n\n*{caption}*\n" if caption else "\n")
    raise MystError(f"the MyST directive {{{name}}} is not supported by tools/colab_edition.py: "
                    "teach it there")


# ----------------------------------------------------------------------------------------------
# Code cells: macros inside the math of string literals
# ----------------------------------------------------------------------------------------------

_STRING_START = re.compile(r"(?P<prefix>[rRbBuUfF]{0,2})(?P<quote>'''|\"\"\"|'|\")")


def string_literals(code: str) -> list[tuple[int, int, str]]:
    """``(start, end, prefix)`` of the body of every string literal of Python ``code`` (comments
    and IPython ``!``/``%`` lines skipped), in order. Not a Python tokenizer: enough to find
    the literals whose text a cell displays."""
    found, i = [], 0
    while i < len(code):
        c = code[i]
        if c == "#":
            i = code.find("\n", i)
            i = len(code) if i == -1 else i
            continue
        m = _STRING_START.match(code, i)
        if m and (i == 0 or not (code[i - 1].isalnum() or code[i - 1] == "_")):
            prefix, quote = m["prefix"].lower(), m["quote"]
            start = j = m.end()
            while j < len(code) and not code.startswith(quote, j):
                if code[j] == "\\":
                    j += 1
                elif code[j] == "\n" and len(quote) == 1:
                    break
                j += 1
            found.append((start, j, prefix))
            i = j + len(quote)
            continue
        if c.isalnum() or c == "_":
            m = re.match(r"\w+", code[i:])
            i += m.end()
            continue
        i += 1
    return found


def code_with_math_expanded(code: str, macros: dict) -> str:
    """``code`` with the macros inside ``$...$`` of its string literals expanded, written back in
    the literal's own escaping (``\\\\`` unless raw, ``{{``/``}}`` in an f-string)."""
    out, last = [], 0
    for start, end, prefix in string_literals(code):
        body = code[start:end]
        raw, fmt = "r" in prefix, "f" in prefix

        def fix(m):
            tex = m.group(1) if raw else m.group(1).replace("\\\\", "\\")
            new = expand_macros(tex, macros)
            if new == tex:
                return m.group()
            if not raw:
                new = new.replace("\\", "\\\\")
            if fmt:
                new = new.replace("{", "{{").replace("}", "}}")
            return f"${new}$"

        out.append(code[last:start])
        # in an f-string, only spans without a replacement field
        out.append(re.sub(r"\$([^${}]+)\$" if fmt else r"\$([^$]+)\$", fix, body))
        last = end
    out.append(code[last:])
    return "".join(out)


# ----------------------------------------------------------------------------------------------
# Notebooks
# ----------------------------------------------------------------------------------------------

def _hide(cell, tag: str) -> None:
    meta = cell.metadata
    meta["cellView"] = "form"
    jupyter = meta.setdefault("jupyter", {})
    jupyter["source_hidden"] = True
    if tag == "hide-cell":
        jupyter["outputs_hidden"] = True
    if re.match(r"#\s*@title\b", cell.source):
        return
    first, _, rest = cell.source.partition("\n")
    if tag == "hide-input" and re.match(r"#\s*\S", first):   # its opening comment is its title
        title = first.lstrip("#").strip()
        cell.source = f"# @title {title[0].upper()}{title[1:]}\n{rest}"
    else:                                                   # a solution's comment would tell
        cell.source = f"# @title {HIDDEN_TITLE}\n{cell.source}"


def colab_notebook(path: Path, root: Path = ROOT) -> nbformat.NotebookNode:
    """The Colab edition of the book's notebook ``path``."""
    book = load_book(root)
    doc = path.relative_to(root).with_suffix("").as_posix()
    nb = copy.deepcopy(nbformat.read(path, as_version=4))
    book_install = install_cell.cell_source(install_cell.repository_url(root))
    installs = [c for c in nb.cells if c.cell_type == "code" and c.source == book_install]
    if len(installs) != 1:
        raise ValueError(f"{path.name}: expected one install cell (tools/install_cell.py), found {len(installs)}")
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = plain_markdown(cell.source, book, doc)
        elif cell.cell_type == "code":
            if cell is installs[0]:
                cell.source = install_cell.colab_cell_source(install_cell.repository_url(root))
            else:
                cell.source = code_with_math_expanded(cell.source, book.macros)
            cell.outputs, cell.execution_count = [], None
            tags = cell.metadata.get("tags", [])
            for tag in ("hide-cell", "hide-input"):
                if tag in tags:
                    _hide(cell, tag)
                    break
    first = nb.cells[0]
    if not BADGE.search(first.source):
        raise ValueError(f"{path.name}: the first cell has no Open in Colab badge")
    note = (f"*The Colab edition of this chapter, written from `{path.relative_to(root).as_posix()}` by "
            f"`tools/colab_edition.py`; the rendered book is at <{book.url}>.*")
    first.source = BADGE.sub(lambda m: badge(book.config, path.name) + "\n\n" + note, first.source, count=1)
    nb.metadata["accelerator"] = "GPU"
    nb.metadata["colab"] = {"name": path.name, "provenance": [], "gpuType": GPU_TYPE}
    return nb


def notebook_text(nb) -> str:
    return nbformat.writes(nb) + "\n"


def book_notebooks(root: Path = ROOT) -> list[Path]:
    return sorted((root / NOTEBOOK_DIR).glob("*.ipynb"))


def expected_files(root: Path = ROOT) -> dict:
    """``{path of a Colab edition: its text}`` for every chapter of the book."""
    return {root / COLAB_DIR / p.name: notebook_text(colab_notebook(p, root)) for p in book_notebooks(root)}


def built_numbers_differ(html: Path, root: Path = ROOT) -> list[str]:
    """Each labelled equation whose number in the rendered book (``html``, Sphinx's output) is not
    the one the Colab edition gives it, or that the rendered page lacks."""
    from docutils.nodes import make_id
    book, pages, wrong = load_book(root), {}, []
    for label, (number, doc) in sorted(book.equations.items(), key=lambda kv: kv[1]):
        page = pages.setdefault(doc, (html / f"{doc}.html").read_text())
        at = page.find(f'id="{make_id("equation-" + label)}"')
        shown = re.search(r'<span class="eqno">\((\d+)\)', page[at:]) if at >= 0 else None
        if shown is None or int(shown.group(1)) != number:
            wrong.append(f"{doc}: ({label}) is ({shown.group(1) if shown else '?'}) in the book, "
                         f"({number}) in the Colab edition")
    return wrong


def main(argv: list[str]) -> int:
    if "--check-built" in argv:
        wrong = built_numbers_differ(Path(argv[argv.index("--check-built") + 1]))
        print("\n".join(wrong) or "every equation has the same number in the book and its Colab edition")
        return 1 if wrong else 0
    check = "--check" in argv
    want = expected_files()
    have = {p: p.read_text() for p in sorted((ROOT / COLAB_DIR).glob("*.ipynb"))}
    stale = sorted(p.name for p in want if have.get(p) != want[p])
    extra = sorted(p.name for p in have if p not in want)
    if check:
        for name in stale:
            print(f"{COLAB_DIR}/{name} differs from what tools/colab_edition.py writes")
        for name in extra:
            print(f"{COLAB_DIR}/{name} has no chapter in {NOTEBOOK_DIR}/")
        return 1 if (stale or extra) else 0
    (ROOT / COLAB_DIR).mkdir(exist_ok=True)
    for path in want:
        if path.name in stale:
            path.write_text(want[path])
    for name in extra:
        (ROOT / COLAB_DIR / name).unlink()
    print(f"{len(stale)} written, {len(extra)} removed, {len(want) - len(stale)} unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
