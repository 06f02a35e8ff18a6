"""What the experiments share: input checks, CPU threads, per-run seeds, loss windows, stored runs.

Each experiment (:mod:`experiments.mqar`, :mod:`experiments.extrapolation`) trains small models once
per seed with a configuration dataclass that has ``as_dict()`` and a ``gpu_config()``; its GPU runs
live in ``experiments/results/<name>.json`` with the device, date and library versions
(:func:`kernels.harness.write_results`).
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

__all__ = ["RESULTS_DIR", "check_int", "torch_threads", "derived_seeds", "window_means", "load_stored_runs"]

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def check_int(x, name: str, low: int) -> int:
    """``x`` if it is an integer ``>= low`` (not a bool); else ``ValueError`` naming ``name``."""
    if isinstance(x, bool) or not isinstance(x, int) or x < low:
        raise ValueError(f"{name} must be an integer >= {low}; got {x!r}")
    return x


@contextlib.contextmanager
def torch_threads(n):
    """Run with ``n`` PyTorch CPU threads (``None``: leave as is), restoring the old setting after."""
    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(old)


def derived_seeds(seed: int, eval_offset: int) -> tuple[int, int, int]:
    """Deterministic seeds for (model init, training data, evaluation data) from one ``seed``. None
    depends on the model compared, so every model starts from the same seed, sees the same training
    stream and is scored on the same evaluation batches. ``eval_offset`` keeps the evaluation stream
    apart from the training stream (each experiment fixes its own, so stored runs reproduce)."""
    base = 1_000_003 * int(seed)
    return int(seed), base + 1, base + eval_offset


def window_means(x: list, w: int) -> list:
    """Means of ``x`` over consecutive windows of ``w`` (the last may be shorter)."""
    return [float(sum(x[i:i + w]) / len(x[i:i + w])) for i in range(0, len(x), w)]


def load_stored_runs(name: str, gpu_config, command: str, ignore=("seeds",)) -> dict:
    """The stored runs ``experiments/results/<name>.json`` (``env``, ``config``, ``records``) with
    ``same_as_gpu_config``: whether they were run with the settings ``gpu_config()`` has now (the
    seed and the ``ignore`` fields aside). ``FileNotFoundError`` naming ``command`` (what writes
    them) when this copy has none."""
    from kernels import harness
    path = RESULTS_DIR / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"no stored runs at {path}; run `{command}` on a GPU to create them")
    data = harness.load_results(path)
    want = json.loads(json.dumps(gpu_config().as_dict()))
    want.pop("seed")
    have = {k: v for k, v in data["config"].items() if k not in ignore}
    data["same_as_gpu_config"] = have == want
    return data
