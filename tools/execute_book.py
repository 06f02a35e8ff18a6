"""Execute the book's notebooks into Jupyter Book's execution cache, in parallel.

    python tools/execute_book.py [notebooks/NN_*.ipynb ...]

``jupyter-book build`` (``execute_notebooks: cache`` in ``_config.yml``) executes every notebook whose
code is not in its cache, one after another. This fills the cache first with one process per CPU
(jupyter-cache's local parallel executor, each notebook in its own folder as the build would run
it), so that the build finds every notebook executed. A notebook that fails stops the script with
its traceback and exit status 1, as the build would. ``make book`` runs it.
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "_build" / ".jupyter_cache"


def main(argv=None) -> int:
    from jupyter_cache import get_cache
    from jupyter_cache.executors import load_executor
    args = sys.argv[1:] if argv is None else argv
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    timeout = int(config.get("execute", {}).get("timeout", 300))
    paths = [Path(p).resolve() for p in args] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    cache = get_cache(str(CACHE))
    for p in paths:
        cache.add_nb_to_project(str(p))
    executor = load_executor("local-parallel", cache)
    uris = [str(p) for p in paths]
    result = executor.run_and_cache(filter_uris=uris, timeout=timeout, allow_errors=False)
    failed = result.excepted + result.errored
    for uri in failed:
        record = cache.get_project_record(uri)
        print(f"FAILED {uri}\n{record.traceback or ''}", file=sys.stderr)
    print(f"executed {len(result.succeeded)}, failed {len(failed)}, "
          f"{len(paths) - len(result.succeeded) - len(failed)} already in the cache")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
