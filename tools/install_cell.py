"""The install cells: the book's (the second cell of every chapter notebook) and the Colab edition's.

    python tools/install_cell.py           # rewrite cell 2 of notebooks/*.ipynb (outputs stay empty)
    python tools/install_cell.py --check   # exit 1 if a notebook's install cell differs

Both run before this book's packages exist, so they are self-contained, and both come from
``repository.url`` of _config.yml. The book's cell (:func:`cell_source`) runs where the book is read
from a checkout: on Colab, and only when ``lattn_core`` or ``kernels`` cannot be imported, it
pip-installs the repository, and prints what to do if that fails. The Colab edition's cell
(:func:`colab_cell_source`, which tools/colab_edition.py puts in ``colab/*.ipynb``) is a reader's
way in from a bare runtime: unless all three packages import already and are this book's (their
``__init__.py`` says ``__distribution__ = "linear-attention-history"``; another project's
``kernels`` does not), it tries, in order, a wheel the reader uploaded to the session, the
repository, and the package index, says which one it used, and says what to do when none worked.
Run this after changing ``repository.url``, then ``python tools/colab_edition.py``;
tests/book/test_notebooks.py and tests/book/test_colab_edition.py check both against it. Every line stays
within 79 characters (what fits the book's text column at 1280 px).
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

DISTRIBUTION = "linear-attention-history"
WHEEL_GLOB = DISTRIBUTION.replace("-", "_") + "-*.whl"
PACKAGES = ("lattn_core", "kernels", "experiments")

COLAB_TEMPLATE = '''\
# @title Install this book's packages (skipped where they import already)
# Tries, in order: a wheel uploaded to this session (Files > Upload), the
# book's repository, then the package index. Nothing here needs editing.
import glob, importlib, os, subprocess, sys
from importlib.util import find_spec
REPO = "{url}"
DIST = "linear-attention-history"
WHEEL = "linear_attention_history-*.whl"
PACKAGES = ("lattn_core", "kernels", "experiments")


def ours(name):
    \"\"\"True when `name` imports as this book's package, not another's.\"\"\"
    spec = find_spec(name)
    if spec is None or not spec.origin:
        return False
    with open(spec.origin, encoding="utf-8") as f:
        return f'__distribution__ = "{DIST}"' in f.read()


if not all(ours(p) for p in PACKAGES):
    found = glob.glob(f"/content/{WHEEL}") + glob.glob(WHEEL)
    found = sorted(set(found), key=os.path.getmtime)[-1:]  # the newest
    routes = [(f"the uploaded wheel {w}", w) for w in found]
    routes += [(f"the repository {REPO}", f"git+{REPO}"),
               ("the package index (PyPI)", DIST)]
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0")  # fail rather than ask
    for route, target in routes:
        pip = [sys.executable, "-m", "pip", "install", "-q", target]
        if subprocess.run(pip, env=env).returncode == 0:
            importlib.invalidate_caches()
            print(f"Installed {DIST} from {route}.")
            if any(p in sys.modules for p in PACKAGES):
                print("Now restart the session (Runtime > Restart session)"
                      " and run the notebook again from the top.")
            break
    else:
        print(f"Could not install {DIST}: no wheel uploaded, and neither\\n"
              f"{REPO} nor the package index could be reached.\\n"
              "Build a wheel in a clone of the repository (python -m build\\n"
              f"--wheel), upload dist/{WHEEL} (Files > Upload)\\n"
              "and run this cell again.")'''


def repository_url(root: Path = ROOT) -> str:
    config = yaml.safe_load((root / "_config.yml").read_text())
    return config["repository"]["url"].rstrip("/")


def cell_source(url: str | None = None) -> str:
    """The install cell's source for ``url`` (default: the one in _config.yml)."""
    return TEMPLATE.format(url=url or repository_url())


def colab_cell_source(url: str | None = None) -> str:
    """The Colab edition's install cell for ``url`` (default: the one in _config.yml)."""
    source = COLAB_TEMPLATE.replace("{url}", url or repository_url())
    assert f'DIST = "{DISTRIBUTION}"' in source and f'WHEEL = "{WHEEL_GLOB}"' in source
    return source


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
