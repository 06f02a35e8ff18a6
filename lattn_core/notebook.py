"""Small conveniences shared by the chapter notebooks (so no notebook writes them again).

``setup()`` fixes plotting defaults and reports where the notebook runs; ``show_widget`` draws a
figure at its default setting (what the rendered book shows, since it has no kernel) and then an
ipywidgets control that redraws it; ``time_cpu`` measures a function on this machine, live.
"""
from __future__ import annotations

import time

import numpy as np

__all__ = ["setup", "on_gpu", "gpu_dtype", "show_widget", "time_cpu"]


def on_gpu() -> bool:
    """True when PyTorch sees a CUDA device (then chapters run and time their Triton kernels)."""
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def gpu_dtype():
    """The 16-bit dtype the chapters' GPU cells use: bfloat16 where the GPU has bf16 tensor cores
    (compute capability 8.0 or newer: A100, L4, H100/H200), float16 otherwise (a Colab T4)."""
    import torch
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8:
        return torch.bfloat16
    return torch.float16


def setup(seed: int = 0, *, quiet: bool = False) -> dict:
    """Plot defaults, print options and a one-line report of the machine. Returns that report."""
    import platform
    import matplotlib as mpl
    mpl.rcParams.update({"figure.figsize": (6.4, 3.6), "figure.dpi": 110, "axes.grid": True,
                         "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
                         "savefig.bbox": "tight"})
    np.set_printoptions(precision=4, suppress=True, linewidth=110)
    info = {"python": platform.python_version(), "numpy": np.__version__, "gpu": on_gpu(), "device": "cpu"}
    try:
        import torch
        torch.manual_seed(seed)
        info["torch"] = torch.__version__
        if info["gpu"]:
            info["device"] = torch.cuda.get_device_name()
    except Exception:
        info["torch"] = None
    if not quiet:
        where = f"GPU: {info['device']}" if info["gpu"] else "CPU only (GPU sections show stored results)"
        print(f"python {info['python']}, numpy {info['numpy']}, torch {info['torch']}; {where}")
    return info


def show_widget(draw, **controls):
    """Draw ``draw(**defaults)`` once as a static figure, then attach ipywidgets controls.

    ``controls`` maps each keyword of ``draw`` to an ipywidgets control (its ``value`` is the
    default). The static figure is what the rendered book shows; in a live notebook the control
    below it redraws the figure. Returns the interactive widget (or ``None`` without ipywidgets).
    """
    import matplotlib.pyplot as plt
    defaults = {name: ctrl.value for name, ctrl in controls.items()}
    draw(**defaults)
    plt.show()
    try:
        import ipywidgets as widgets
        from IPython.display import display
    except Exception:  # pragma: no cover - ipywidgets is in requirements.txt
        return None

    def _redraw(**kw):
        draw(**kw)
        plt.show()

    w = widgets.interactive(_redraw, **controls)
    display(w)
    return w


def time_cpu(fn, *args, repeats: int = 5, min_time: float = 0.02, **kwargs) -> float:
    """Median wall-clock seconds of ``fn(*args, **kwargs)`` on this machine (measured now).

    Each of ``repeats`` samples loops until ``min_time`` seconds have passed and reports the mean
    per call, so short functions are not dominated by timer resolution.
    """
    samples = []
    for _ in range(repeats):
        count, start = 0, time.perf_counter()
        while True:
            fn(*args, **kwargs)
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                break
        samples.append(elapsed / count)
    return float(np.median(samples))
