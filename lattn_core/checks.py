"""State an identity, measure it, check it: the one way every chapter and test checks its equations.

``check_close`` compares two numbers/arrays and reports the measured maximum error against a stated
tolerance; ``check_symbolic`` asks SymPy whether two expressions (or matrices) are identical. Both
return an :class:`IdentityCheck` whose ``repr`` is a short human-readable verdict, never wider than
``LINE_WIDTH`` characters (so a notebook cell that ends with a check shows it, and it fits the
book's text column), and both raise ``AssertionError`` when the identity fails,
so a broken equation stops the notebook, the book build and the tests alike.
"""
from __future__ import annotations

import numbers
import textwrap
from dataclasses import dataclass

import numpy as np

# The longest line a check prints: 80 monospace characters fit the book's text column at 1280 px
# (_static/lattn.css; tools/page_check.py checks the built pages).
LINE_WIDTH = 79

__all__ = ["IdentityCheck", "check_close", "check_symbolic", "max_abs_error", "max_rel_error"]


@dataclass(frozen=True)
class IdentityCheck:
    """The outcome of checking one identity."""

    name: str
    kind: str            # "numeric" or "symbolic"
    error: float         # measured max error (0.0 for a symbolic identity that holds)
    tol: float           # the tolerance it was held to
    measure: str         # what ``error`` measures
    passed: bool

    def __repr__(self) -> str:
        """One line if it fits in ``LINE_WIDTH`` characters; else the name (wrapped at word
        boundaries) and then the verdict with the measured error and tolerance on its own line."""
        mark = "✓" if self.passed else "✗"
        if self.kind == "symbolic":
            verdict = "holds symbolically (SymPy simplifies lhs - rhs to 0)" if self.passed \
                else "does NOT hold symbolically"
        else:
            rel = "≤" if self.passed else ">"
            verdict = f"{self.measure} = {self.error:.2e} {rel} tol {self.tol:.0e}"
        line = f"{mark} {self.name}: {verdict}"
        if len(line) <= LINE_WIDTH:
            return line
        name = textwrap.wrap(f"{mark} {self.name}:", LINE_WIDTH, subsequent_indent="  ",
                             break_on_hyphens=False)
        return "\n".join(name + textwrap.wrap(verdict, LINE_WIDTH, initial_indent="  ",
                                               subsequent_indent="  "))

    __str__ = __repr__

    def _repr_html_(self) -> str:  # rendered in notebooks and the book
        color = "#1a7f37" if self.passed else "#cf222e"
        text = repr(self).replace("&", "&amp;").replace("<", "&lt;")
        return f'<pre style="color:{color};margin:0">{text}</pre>'


def max_abs_error(a, b) -> float:
    """max |a - b| over all entries (float64); inf if shapes differ or anything is non-finite."""
    a = np.asarray(a, dtype=np.complex128 if np.iscomplexobj(a) or np.iscomplexobj(b) else np.float64)
    b = np.asarray(b, dtype=a.dtype)
    if a.shape != b.shape:
        raise ValueError(f"cannot compare arrays of shapes {a.shape} and {b.shape}")
    if a.size == 0:
        return 0.0
    d = np.abs(a - b)
    if not np.all(np.isfinite(d)):
        return float("inf")
    return float(d.max())


def max_rel_error(a, b) -> float:
    """max |a - b| / max |b|: the error relative to the size of the reference ``b``."""
    scale = float(np.max(np.abs(np.asarray(b)))) if np.size(b) else 0.0
    err = max_abs_error(a, b)
    return err / scale if scale > 0 else err


def check_close(name: str, lhs, rhs, tol: float, *, relative: bool = False,
                raise_on_fail: bool = True) -> IdentityCheck:
    """Check ``lhs ≈ rhs`` numerically: the max absolute (or relative-to-``rhs``) error ≤ ``tol``.

    State ``tol`` with its reason at the call site (float64 round-off on a small problem is ~1e-12;
    a float32 kernel is ~1e-5; bf16 is ~1e-2). Raises ``AssertionError`` if the check fails (unless
    ``raise_on_fail=False``, used where a notebook *shows* a failing identity on purpose).
    """
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not tol > 0:
        raise ValueError(f"tol must be a positive number; got {tol!r}")
    err = max_rel_error(lhs, rhs) if relative else max_abs_error(lhs, rhs)
    measure = "max |lhs − rhs| / max |rhs|" if relative else "max |lhs − rhs|"
    result = IdentityCheck(name, "numeric", err, tol, measure, bool(err <= tol))
    if raise_on_fail and not result.passed:
        raise AssertionError(repr(result))
    return result


def check_symbolic(name: str, lhs, rhs, *, raise_on_fail: bool = True) -> IdentityCheck:
    """Check ``lhs == rhs`` exactly with SymPy (scalars or matrices of symbols)."""
    import sympy as sp

    diff = sp.Matrix(lhs) - sp.Matrix(rhs) if hasattr(lhs, "shape") or hasattr(rhs, "shape") \
        else sp.sympify(lhs) - sp.sympify(rhs)
    if isinstance(diff, sp.MatrixBase):
        ok = all(sp.simplify(sp.expand(e)) == 0 for e in diff)
    else:
        ok = sp.simplify(sp.expand(diff)) == 0
    result = IdentityCheck(name, "symbolic", 0.0 if ok else float("nan"), 0.0, "exact", bool(ok))
    if raise_on_fail and not result.passed:
        raise AssertionError(repr(result))
    return result
