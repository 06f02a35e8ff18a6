"""Write the back/forward links at the end of every chapter (its last text cell).

    python tools/chapter_links.py

Each chapter's last markdown cell ends with one line, "**Where to go from here.** Back to [the
chapter before](NN_name.ipynb); on to [the chapter after](NN_name.ipynb).", with the chapters' own
titles. Links name the notebook file, so they work in the built book, on Colab and in a clone. Run it
after adding or renaming a chapter; tests/book/test_notebooks.py checks the links.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
MARK = "**Where to go from here.**"


def title(nb) -> str:
    first = next(c for c in nb.cells if c.cell_type == "markdown").source
    return re.search(r"^# (.*)$", first, re.M).group(1)


def main() -> int:
    paths = sorted((ROOT / "notebooks").glob("*.ipynb"))
    books = [nbformat.read(p, as_version=4) for p in paths]
    titles = [title(nb) for nb in books]
    for i, (path, nb) in enumerate(zip(paths, books)):
        parts = []
        if i > 0:
            parts.append(f"back to [{titles[i - 1]}]({paths[i - 1].name})")
        if i + 1 < len(paths):
            parts.append(f"on to [{titles[i + 1]}]({paths[i + 1].name})")
        line = "; ".join(parts)
        last = [c for c in nb.cells if c.cell_type == "markdown"][-1]
        body = last.source.split("\n\n" + MARK)[0].rstrip()
        last.source = f"{body}\n\n{MARK} {line[0].upper()}{line[1:]}."
        nbformat.write(nb, path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
