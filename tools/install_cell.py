"""Write the install cell (the second cell) of every chapter notebook from _config.yml's repository URL.

    python tools/install_cell.py           # rewrite cell 2 of notebooks/*.ipynb (outputs stay empty)
    python tools/install_cell.py --check   # exit 1 if a notebook's install cell differs

The cell runs before this book's packages exist, so it is self-contained: on Colab, and only when
``lattn_core`` or ``kernels`` cannot be imported, it pip-installs the repository; if that fails (the
URL is still a placeholder, no network) it prints what to do instead of raising. Run this after
changing ``repository.url`` in _config.yml; tests/test_notebooks.py checks every notebook against it.
Every line stays within 79 characters (what fits the book's text column at 1280 px).
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

TEMPLATE = '''\
# On Colab, install this book's packages unless they can be imported already.
# REPO is the book's repository (repository.url in _config.yml).
import os, subprocess, sys
from importlib.util import find_spec
REPO = "{url}"
need = [p for p in ("lattn_core", "kernels") if find_spec(p) is None]
if need and "google.colab" in sys.modules:
    cmd = [sys.executable, "-m", "pip", "install", "-q", f"git+{{REPO}}"]
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0")  # fail rather than ask
    if subprocess.run(cmd, env=env).returncode != 0:
        print(f"Could not install {{REPO}}.\\n"
              "Set REPO above to the book's repository and run this cell\\n"
              "again, or clone the repository and install it by hand:\\n"
              "  !git clone <repository URL> book && pip install -q -e book\\n"
              "then Runtime > Restart session; run the notebook from the top.")
elif need:
    print(f"{{need}} not importable: run `pip install -e .` in the book's repo")'''


def repository_url(root: Path = ROOT) -> str:
    config = yaml.safe_load((root / "_config.yml").read_text())
    return config["repository"]["url"].rstrip("/")


def cell_source(url: str | None = None) -> str:
    """The install cell's source for ``url`` (default: the one in _config.yml)."""
    return TEMPLATE.format(url=url or repository_url())


def main(argv: list[str]) -> int:
    check = "--check" in argv
    source = cell_source()
    stale = []
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        cell = nb.cells[1]
        if cell.cell_type == "code" and cell.source == source:
            continue
        stale.append(path.name)
        if check:
            continue
        if cell.cell_type != "code" or "google.colab" not in cell.source:
            raise SystemExit(f"{path.name}: cell 2 is not an install cell; fix it by hand")
        cell.source = source
        cell.outputs, cell.execution_count = [], None
        tags = cell.metadata.setdefault("tags", [])
        if "hide-input" not in tags:
            tags.append("hide-input")
        nbformat.write(nb, path)
    verb = "differ" if check else "rewritten"
    print(f"{len(stale)} install cell(s) {verb}: {', '.join(stale) or '-'}")
    return 1 if (check and stale) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
