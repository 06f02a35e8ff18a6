"""Run a chapter notebook's code cells in order, as a script, where Jupyter is not installed.

    python tools/run_notebook.py notebooks/07_feeding_back.ipynb [...]

Used on the lent GPU machines, which have PyTorch, Triton, matplotlib and IPython but no Jupyter
kernel: every code cell runs in one namespace (figures go to the Agg backend, ``display`` prints),
and the first failing cell stops the run with its traceback and a non-zero exit. It checks what
nbval checks with ``--nbval-lax``: that every cell runs.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback


def run(path: str) -> bool:
    import matplotlib
    matplotlib.use("Agg")
    from IPython.display import display
    cells = [c for c in json.load(open(path))["cells"] if c["cell_type"] == "code"]
    ns = {"display": display, "__name__": "__main__"}
    t0 = time.perf_counter()
    for i, c in enumerate(cells):
        src = "".join(c["source"])
        if src.lstrip().startswith(("!", "%")):
            continue
        try:
            exec(compile(src, f"{os.path.basename(path)}[code cell {i}]", "exec"), ns)
        except Exception:
            traceback.print_exc()
            print(f"FAILED {path}: code cell {i}")
            return False
    print(f"ok {path}: {len(cells)} code cells in {time.perf_counter() - t0:.1f} s")
    return True


if __name__ == "__main__":
    sys.exit(0 if all([run(p) for p in sys.argv[1:]]) else 1)
