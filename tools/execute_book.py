"""Execute the book's notebooks into Jupyter Book's execution cache, in parallel.

    python tools/execute_book.py [notebooks/NN_*.ipynb ...]

``jupyter-book build`` (``execute_notebooks: cache`` in ``_config.yml``) executes every notebook whose
code is not in its cache, one after another. This fills the cache first with one process per CPU
(jupyter-cache's local parallel executor, each notebook in its own folder as the build would run
it), so that the build finds every notebook executed. A notebook that fails stops the script with
its traceback and exit status 1, as the build would. ``make book`` runs it.

Kernels started side by side can race for the same TCP port (jupyter_client picks a free port, and
another kernel binds it first; the loser dies before its first cell, ``Address already in use``).
jupyter-cache reports such a notebook as *errored*, apart from one whose cell raised (*excepted*).
An errored notebook is run once more, alone; a cell that raised is never run again.
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
    succeeded, excepted, errored = result.succeeded, result.excepted, result.errored
    if errored:
        print(f"{len(errored)} kernel(s) did not start beside the others; running alone: "
              + ", ".join(Path(u).name for u in errored), file=sys.stderr)
        again = load_executor("local-serial", cache).run_and_cache(
            filter_uris=errored, timeout=timeout, allow_errors=False)
        succeeded = succeeded + again.succeeded
        excepted, errored = excepted + again.excepted, again.errored
    failed = excepted + errored
    for uri in failed:
        record = cache.get_project_record(uri)
        print(f"FAILED {uri}\n{record.traceback or ''}", file=sys.stderr)
    print(f"executed {len(succeeded)}, failed {len(failed)}, "
          f"{len(paths) - len(succeeded) - len(failed)} already in the cache")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
