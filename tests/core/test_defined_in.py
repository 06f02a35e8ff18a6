"""Every public function and class of lattn_core names where the book teaches it (d2l's "Defined in"
back-link): a line ``Defined in Chapter N (<title>).`` in its docstring, or, for a helper no chapter
teaches (input validation, the checks, notebook conveniences, the palette, drawing primitives),
``Used throughout the book``. Whether that chapter exists and mentions the name is checked against
the notebooks in tests/book/test_book_standard.py.

Public means listed in a module's ``__all__``; only functions and classes carry a docstring, so a
public constant (``FAMILY``, ``MODEL_SHAPES``, ``PALETTE``, ...) is exempt."""
import importlib
import inspect
import pkgutil
import re

import lattn_core

DEFINED = re.compile(r"^Defined in Chapter (\d+) \(([^()]+(?:\([^()]*\)[^()]*)*)\)\.$")
THROUGHOUT = re.compile(r"^Used throughout the book\b.*\.$")


def public_objects():
    """(module name, public name, object) of every function and class in an ``__all__`` of lattn_core."""
    mods = ["lattn_core"] + [m.name for m in pkgutil.walk_packages(lattn_core.__path__, "lattn_core.")]
    for m in mods:
        mod = importlib.import_module(m)
        for name in getattr(mod, "__all__", ()):
            obj = getattr(mod, name)
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__.startswith("lattn_core"):
                yield m, name, obj


def back_links(obj):
    """The docstring's back-link lines: (chapter, title) for a "Defined in", None for "Used throughout"."""
    doc = inspect.cleandoc(obj.__doc__ or "")
    links = []
    for line in doc.splitlines():
        line = line.strip()
        m = DEFINED.match(line)
        if m:
            links.append((int(m.group(1)), m.group(2)))
        elif THROUGHOUT.match(line):
            links.append(None)
    return links


def test_every_public_function_and_class_names_its_chapter():
    missing, several = [], []
    seen = 0
    for m, name, obj in public_objects():
        seen += 1
        links = back_links(obj)
        if not links:
            missing.append(f"{m}.{name}")
        elif len(links) > 1:
            several.append(f"{m}.{name}: {links}")
    assert seen > 150, seen
    assert not missing, f"{len(missing)} public names without 'Defined in Chapter N (title).': {missing}"
    assert not several, f"one back-link each: {several}"


def test_the_back_link_is_its_own_paragraph_at_the_end():
    """So the API page's first paragraph stays the summary, and a reader finds the link in one place."""
    for m, name, obj in public_objects():
        doc = inspect.cleandoc(obj.__doc__ or "")
        paragraphs = [p.strip() for p in doc.split("\n\n") if p.strip()]
        assert len(paragraphs) >= 2, f"{m}.{name}: the back-link is the whole docstring"
        assert back_links(type("X", (), {"__doc__": paragraphs[-1]})), \
            f"{m}.{name}: the back-link is not the last paragraph"


def test_the_format_is_recognised():
    assert DEFINED.match("Defined in Chapter 9 (PaTH).").groups() == ("9", "PaTH")
    assert DEFINED.match("Defined in Chapter 12 (What's next).")
    assert not DEFINED.match("Defined in chapter 9.")
    assert not DEFINED.match("Defined in Chapter nine (PaTH).")
    assert THROUGHOUT.match("Used throughout the book.")
