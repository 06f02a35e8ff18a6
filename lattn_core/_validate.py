"""One input-validation helper for every reference in :mod:`lattn_core`.

Every public function converts its inputs through these helpers, so a wrong rank, a size that does
not match, a NaN or a gate outside its range always raises the same kind of ``ValueError``: it names
the argument and says what shape or range was expected.
"""
from __future__ import annotations

import numbers

import numpy as np

__all__ = ["as_array", "check_qkv", "check_gate", "check_chunk_size", "check_positive", "check_int",
           "check_symbolic_finite"]


def _fmt_shape(shape) -> str:
    inner = ", ".join(str(s) for s in shape)
    return f"({inner},)" if len(shape) == 1 else f"({inner})"


def as_array(x, name: str, shape: tuple | None, *, finite: bool = True) -> np.ndarray:
    """Convert ``x`` to a float64 array and check its shape.

    ``shape`` is a tuple whose entries are ints (that size is required), ``None`` (any size) or
    strings (a symbolic name shown in the error message; any size); ``shape=None`` takes any number
    of axes. Complex input raises (even with a zero imaginary part: NumPy would drop it with only a
    warning), so do NaN and inf unless ``finite=False``, and empty arrays. Returns a float64
    ``ndarray``.

    Used throughout the book.
    """
    spec = "any shape" if shape is None else f"shape {_fmt_shape(shape)}"
    try:
        raw = np.asarray(x)
        arr = None if np.iscomplexobj(raw) else np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a real array of {spec}; "
                         f"could not convert it to float64 ({exc})") from None
    if arr is None:
        raise ValueError(f"{name} must be real: got a complex array of {spec} ({raw.dtype})")
    if shape is None:
        shape = arr.shape
    if arr.ndim != len(shape):
        raise ValueError(f"{name} must have shape {_fmt_shape(shape)} ({len(shape)}-D); "
                         f"got a {arr.ndim}-D array of shape {arr.shape}")
    for axis, (want, got) in enumerate(zip(shape, arr.shape)):
        if isinstance(want, numbers.Integral) and got != want:
            raise ValueError(f"{name} must have shape {_fmt_shape(shape)}; "
                             f"axis {axis} has size {got}, expected {want}")
    if arr.size == 0 or 0 in arr.shape:
        raise ValueError(f"{name} must be non-empty with shape {_fmt_shape(shape)}; got shape {arr.shape}")
    if finite and not np.all(np.isfinite(arr)):
        bad = "NaN" if np.isnan(arr).any() else "inf"
        raise ValueError(f"{name} contains {bad}; all entries must be finite")
    return arr


def check_qkv(Q, K, V):
    """Validate the (Q, K, V) triple of a single head.

    ``Q`` and ``K`` must be ``(n, d_k)``, ``V`` must be ``(n, d_v)``, all finite. Returns float64
    copies ``(Q, K, V)``.

    Used throughout the book.
    """
    K = as_array(K, "K", ("n", "d_k"))
    n, d_k = K.shape
    Q = as_array(Q, "Q", (n, d_k))
    V = as_array(V, "V", (n, "d_v"))
    return Q, K, V


def check_gate(g, name: str, shape: tuple, *, low: float = 0.0, high: float = 1.0,
               low_inclusive: bool = False, high_inclusive: bool = True) -> np.ndarray:
    """Validate a gate (forget factor, learning rate, ...) of a given shape and range.

    The default range is ``(0, 1]``, the convention for forget gates in this book. Returns float64.

    Used throughout the book.
    """
    arr = as_array(g, name, shape)
    lo_ok = arr >= low if low_inclusive else arr > low
    hi_ok = arr <= high if high_inclusive else arr < high
    if not (np.all(lo_ok) and np.all(hi_ok)):
        interval = ("[" if low_inclusive else "(") + f"{low:g}, {high:g}" + ("]" if high_inclusive else ")")
        worst = arr[~(lo_ok & hi_ok)].ravel()[0]
        raise ValueError(f"{name} must lie in {interval} elementwise; found {worst!r}")
    return arr


def check_positive(x, name: str, shape: tuple) -> np.ndarray:
    """Validate a strictly positive array (a scalar if ``shape == ()``).

    Used throughout the book."""
    return check_gate(x, name, shape, low=0.0, high=np.inf, high_inclusive=False)


def check_int(x, name: str, low: int = 1) -> int:
    """An integer ``>= low`` (``bool`` is not one); returns it as an ``int``.

    Used throughout the book."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < low:
        raise ValueError(f"{name} must be an integer >= {low}; got {x!r}")
    return int(x)


def check_symbolic_finite(x, name: str):
    """``x`` (a SymPy matrix, or anything SymPy can read as one, or a sequence of expressions) with
    no NaN and no infinity among its entries; symbols pass, whatever they stand for. Returns the
    entries as a list of SymPy expressions.

    Used throughout the book."""
    import sympy as sp
    entries = list(x) if isinstance(x, (list, tuple)) else list(sp.Matrix(x))
    entries = [sp.sympify(e) for e in entries]
    bad = (sp.nan, sp.oo, -sp.oo, sp.zoo)
    for e in entries:
        if e.has(*bad):
            raise ValueError(f"{name} contains NaN or an infinity ({e}); numeric entries must be finite")
    return entries


def check_chunk_size(chunk_size) -> int:
    """``chunk_size`` must be a positive integer (it need not divide ``n``).

    Used throughout the book."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer; got {chunk_size!r}")
    return int(chunk_size)
