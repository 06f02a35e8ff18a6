"""Results files: where each benchmark's records live, how they are written and read, and the
environment recorded beside every measurement.

``kernels/<family>/results.json`` is a family's benchmark of record (written by
:func:`kernels.harness.run_benchmark`, read by :mod:`kernels.report` and the chapters)::

    {"name": ..., "env": {device, date, torch, triton, fla, cuda, python}, "config": {...},
     "records": [...]}

This module imports nothing else of the package, so the harness (which writes) and the report
(which reads) both stand on it.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent

__all__ = ["environment", "results_path", "write_results", "load_results"]


def environment() -> dict:
    """Device name, date and library versions, recorded next to every measurement."""
    import torch
    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
    }
    try:
        import triton
        env["triton"] = triton.__version__
    except Exception:
        env["triton"] = None
    try:
        from importlib.metadata import version
        env["fla"] = version("fla-core")
    except Exception:
        env["fla"] = None
    return env


def results_path(family: str) -> Path:
    """``kernels/<family>/results.json``: the benchmark of record of one kernel family."""
    return PACKAGE_DIR / family / "results.json"


def write_results(path, name: str, config: dict, records: list, env: dict | None = None) -> Path:
    """Write one results file (``path`` may be a family name or a file path)."""
    path = results_path(path) if isinstance(path, str) and os.sep not in path and not path.endswith(".json") \
        else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"name": name, "env": env or environment(), "config": config, "records": records}
    path.write_text(json.dumps(payload, indent=1, sort_keys=False, default=float) + "\n")
    return path


def load_results(family_or_path) -> dict:
    """Load a family's results file (``"flash"``, ``"gla"``, ``"delta"``) or any results file by path;
    ``FileNotFoundError`` names the benchmark that creates it."""
    if isinstance(family_or_path, str) and os.sep not in family_or_path and not family_or_path.endswith(".json"):
        path = results_path(family_or_path)
        hint = f"run `python -m kernels.{family_or_path}.bench --write` on a GPU to create them"
    else:
        path, hint = Path(family_or_path), "no such results file"
    if not path.exists():
        raise FileNotFoundError(f"no stored results at {path}; {hint}")
    return json.loads(path.read_text())
