"""Small conveniences shared by the chapter notebooks (so no notebook writes them again).

``setup()`` fixes plotting defaults and reports where the notebook runs; ``show_widget`` draws a
figure at its default setting (what the rendered book shows, since it has no kernel) and then
ipywidgets controls that redraw that figure in place when the notebook runs (the rendered book shows
one line saying so instead); ``time_cpu`` and ``peak_bytes`` measure a function's time and memory on
this machine, live.
"""
from __future__ import annotations

import time

import numpy as np

from .checks import LINE_WIDTH

__all__ = ["setup", "on_gpu", "gpu_dtype", "show_widget", "live_control_note", "time_cpu", "peak_bytes",
           "source_lines", "show_source"]


def on_gpu() -> bool:
    """True when PyTorch sees a CUDA device (then chapters run and time their Triton kernels).

    Used throughout the book."""
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def gpu_dtype():
    """The 16-bit dtype the chapters' GPU cells use: bfloat16 where the GPU has bf16 tensor cores
    (compute capability 8.0 or newer: A100, L4, H100/H200), float16 otherwise (a Colab T4).

    Used throughout the book."""
    import torch
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8:
        return torch.bfloat16
    return torch.float16


def setup(seed: int = 0, *, quiet: bool = False) -> dict:
    """Plot defaults, print options and a one-line report of the machine. Returns that report.

    Without a GPU it also sets ``TRITON_INTERPRET=1``, so that the chapters' Triton kernels run
    through Triton's interpreter: the variable must be set before anything imports Triton, and a
    chapter that trains a torch model first would otherwise have PyTorch import it.

    Used throughout the book."""
    import os
    import platform
    if not on_gpu():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import matplotlib as mpl
    mpl.rcParams.update({"figure.figsize": (6.4, 3.6), "figure.dpi": 110, "axes.grid": True,
                         "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
                         "savefig.bbox": "tight"})
    # printed arrays wrap at LINE_WIDTH, the widest text line that fits the book's column
    np.set_printoptions(precision=4, suppress=True, linewidth=LINE_WIDTH)
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
        versions = f"python {info['python']}, numpy {info['numpy']}, torch {info['torch']}"
        line = f"{versions}; {where}"
        print(line if len(line) <= LINE_WIDTH else f"{versions}\n{where}")
    return info


WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"
LIVE_PREFIX = "Live control ("   # how the book's line starts (tools/page_check.py looks for it)


def live_control_note(controls) -> str:
    """The one line the rendered book shows where a live notebook shows the controls.

    At most ``LINE_WIDTH`` characters (the controls' names are left out if they make it longer).

    Used throughout the book.
    """
    names = ", ".join(getattr(c, "description", "") or name for name, c in controls.items())
    line = f"{LIVE_PREFIX}{names}) when this notebook runs in Jupyter or Colab."
    if len(line) > LINE_WIDTH:
        line = f"{LIVE_PREFIX.rstrip(' (')} when this notebook runs in Jupyter or Colab."
    return line


def _new_figures(before):
    import matplotlib.pyplot as plt
    new = [plt.figure(num) for num in plt.get_fignums() if num not in before]
    return new or ([plt.gcf()] if plt.get_fignums() else [])


def _cell_number():
    """The execution count of the cell running now in IPython, or ``None`` outside IPython."""
    try:
        from IPython import get_ipython
    except Exception:  # pragma: no cover - IPython comes with Jupyter
        return None
    shell = get_ipython()
    return None if shell is None else shell.execution_count


def show_widget(draw, **controls):
    """Draw ``draw(**defaults)`` once, then show live controls that redraw that same figure.

    ``controls`` maps each keyword of ``draw`` to an ipywidgets control (its ``value`` is the
    default); ``draw`` makes its figure with pyplot and returns nothing. The figure is displayed
    once, at the defaults, with a display id. The controls are displayed as one mime bundle: a
    running notebook (Jupyter, Colab) shows the widget, and moving a control redraws the figure in
    place (the display is updated, never a second figure); its ``text/plain`` is one line, from
    :func:`live_control_note`, which is what the rendered book shows instead (``_config.yml`` takes
    the widget mime type out of the HTML priority and does not embed widget state). Returns the
    box of controls (or ``None`` without ipywidgets); a cell that ends in the call, without ``;``,
    still shows the controls once.

    Used throughout the book.
    """
    import matplotlib.pyplot as plt
    from IPython.display import display

    defaults = {name: ctrl.value for name, ctrl in controls.items()}
    before = set(plt.get_fignums())
    draw(**defaults)
    figures = _new_figures(before)
    handles = [display(fig, display_id=True) for fig in figures]
    for fig in figures:
        plt.close(fig)
    try:
        import ipywidgets as widgets
    except Exception:  # pragma: no cover - ipywidgets is in requirements.txt
        return None

    note = live_control_note(controls)

    class LiveControls(widgets.VBox):
        """The controls; displayed, they are the widget plus the book's one-line note."""

        def _repr_mimebundle_(self, **kwargs):
            view = {"version_major": 2, "version_minor": 0, "model_id": self.model_id}
            return {"text/plain": note, WIDGET_VIEW_MIME: view}

        def _ipython_display_(self, **kwargs):  # ipywidgets 7 (Colab) displays through this
            # IPython displays through this method first (display() and a cell's value alike). A
            # cell that ends in show_widget(...) without ';' has the returned box as its value,
            # which would show the controls, and the book's line, a second time: within the cell
            # that showed them, the box is shown once (a later cell can show it again).
            cell = _cell_number()
            if cell is not None and cell == getattr(self, "_shown_in", None):
                return
            self._shown_in = cell
            display(self._repr_mimebundle_(), raw=True)

    box = LiveControls(list(controls.values()))

    def _redraw(change=None):
        kw = {name: ctrl.value for name, ctrl in controls.items()}
        seen = set(plt.get_fignums())
        draw(**kw)
        new = _new_figures(seen)
        for handle, fig in zip(handles, new):
            if handle is not None:
                handle.update(fig)
        for fig in new:
            plt.close(fig)

    for ctrl in controls.values():
        ctrl.observe(_redraw, names="value")
    box.redraw = _redraw
    display(box)
    return box


def time_cpu(fn, *args, repeats: int = 5, min_time: float = 0.02, **kwargs) -> float:
    """Median wall-clock seconds of ``fn(*args, **kwargs)`` on this machine (measured now).

    Each of ``repeats`` samples loops until ``min_time`` seconds have passed and reports the mean
    per call, so short functions are not dominated by timer resolution.

    Used throughout the book.
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


def peak_bytes(fn, *args, **kwargs) -> int:
    """Peak bytes allocated during one call of ``fn(*args, **kwargs)``, from Python's allocator
    tracer (``tracemalloc``; NumPy reports its arrays to it), measured on this machine, now.

    Used throughout the book."""
    import tracemalloc
    tracemalloc.start()
    try:
        fn(*args, **kwargs)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def source_lines(obj, start: str | None = None, stop: str | None = None) -> list[str]:
    """The lines of ``obj``'s source (a function, a Triton kernel, a module) from the first line that
    contains ``start`` through the first later line that contains ``stop`` (the whole source without
    them), dedented. ``ValueError`` names a marker that is not in the source, so an excerpt shown in
    the book cannot silently drift from the code.

    Used throughout the book."""
    import inspect
    import textwrap
    fn = getattr(obj, "fn", obj)            # a triton.jit kernel keeps the Python function in .fn
    lines = inspect.getsource(fn).splitlines()
    i = 0
    if start is not None:
        hits = [n for n, line in enumerate(lines) if start in line]
        if not hits:
            raise ValueError(f"start marker {start!r} is not in the source of {fn.__qualname__}")
        i = hits[0]
    j = len(lines) - 1
    if stop is not None:
        hits = [n for n, line in enumerate(lines) if stop in line and n >= i]
        if not hits:
            raise ValueError(f"stop marker {stop!r} is not in the source of {fn.__qualname__} after {start!r}")
        j = hits[0]
    return textwrap.dedent("\n".join(lines[i:j + 1])).splitlines()


def _shallowest_comma(code: str, limit: int) -> int:
    """Index of the ``", "`` before ``limit`` nested in the fewest brackets (the last of those), or
    -1: breaking there keeps a call's arguments whole where it can."""
    depth, best, best_depth = 0, -1, None
    for i, ch in enumerate(code[:limit]):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and code[i + 1: i + 2] == " " and depth > 0:
            if best_depth is None or depth <= best_depth:
                best, best_depth = i, depth
    return best


def _fit_code_line(line: str, width: int) -> list[str]:
    """One source line as lines of at most ``width`` characters where it can be broken: a trailing
    comment that does not fit goes on its own line above the code, a comment is refilled, and code
    breaks after a ``", "`` that fits (inside brackets, where Python continues a line: the one
    nested in the fewest brackets, the last of those), the continuation indented four more. A
    line with no such break stays whole."""
    import textwrap
    if len(line) <= width:
        return [line]
    indent = line[: len(line) - len(line.lstrip())]
    body = line.strip()
    if body.startswith("#"):
        return textwrap.wrap(body.lstrip("# "), width, initial_indent=indent + "# ",
                             subsequent_indent=indent + "# ")
    code, sep, comment = body.partition("  # ")
    if sep and "#" not in code and "'" not in code and '"' not in code:
        return _fit_code_line(indent + "# " + comment.strip(), width) + \
            _fit_code_line(indent + code.rstrip(), width)
    out, rest, first = [], body, True
    while True:
        pre = indent if first else indent + " " * 4
        if len(pre) + len(rest) <= width:
            out.append(pre + rest)
            return out
        cut = _shallowest_comma(rest, width - len(pre))
        if cut <= 0:
            out.append(pre + rest)
            return out
        out.append(pre + rest[: cut + 1])
        rest, first = rest[cut + 2:], False


def _fit_lines(lines: list[str], width: int) -> list[str]:
    """:func:`_fit_code_line` for every line, except that a comment too wide for ``width`` is
    refilled together with the comment lines that continue it (same indent)."""
    import textwrap
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        indent = line[: len(line) - len(line.lstrip())]
        if line.lstrip().startswith("#") and len(line) > width:
            j = i + 1
            while j < len(lines) and lines[j].startswith(indent + "#"):
                j += 1
            text = " ".join(part.strip().lstrip("#").strip() for part in lines[i:j])
            out += textwrap.wrap(text, width, initial_indent=indent + "# ",
                                 subsequent_indent=indent + "# ")
            i = j
        else:
            out += _fit_code_line(line, width)
            i += 1
    return out


def show_source(obj, start: str | None = None, stop: str | None = None, *,
                width: int | None = LINE_WIDTH) -> None:
    """Print an excerpt of real source (:func:`source_lines`), headed by where it comes from. Lines
    wider than ``width`` (default: the book's column) are broken as :func:`_fit_lines` says, and
    the heading then says so; ``width=None`` prints the lines as they are.

    Used throughout the book."""
    import inspect
    fn = getattr(obj, "fn", obj)
    lines = source_lines(obj, start, stop)
    shown = _fit_lines(lines, width) if width else lines
    from pathlib import Path
    path = Path(inspect.getsourcefile(fn)).resolve()
    root = Path(__file__).resolve().parents[1]           # the repository (or site-packages)
    where = str(path.relative_to(root)) if path.is_relative_to(root) else path.name
    note = ", long lines broken" if shown != lines else ""
    head = f"# {fn.__module__}.{fn.__qualname__} ({where}{note})"
    if width and len(head) > width:     # the heading, too, within the column: the name, then where
        head = f"# {fn.__module__}.{fn.__qualname__}\n# ({where}{note})"
    print(head)
    print("\n".join(shown))
