"""State an identity, measure it, check it: the one way every chapter and test checks its equations.

``check_close`` compares two numbers/arrays and reports the measured maximum error against a stated
tolerance; ``check_symbolic`` asks SymPy whether two expressions (or matrices) are identical. Both
return an :class:`IdentityCheck` whose ``repr`` is a short human-readable verdict, never wider than
``LINE_WIDTH`` characters (so a notebook cell that ends with a check shows it, and it fits the
book's text column), and both raise ``AssertionError`` when the identity fails,
so a broken equation stops the notebook, the book build and the tests alike.

A section's checks are shown together in one compact table, :func:`check_table` (or a
:class:`CheckTable` filled as the section goes): identity, what is measured, the error, the
tolerance and ✓/✗, as HTML in a notebook and the book and as aligned text in its ``repr``. Every
check in it was executed, and raised, when it was made; the table only shows them.
"""
from __future__ import annotations

import html
import numbers
import textwrap
from dataclasses import dataclass

import numpy as np

# The longest line a check prints: 80 monospace characters fit the book's text column at 1280 px
# (_static/lattn.css; tools/page_check.py checks the built pages).
LINE_WIDTH = 79

__all__ = ["IdentityCheck", "CheckTable", "check_table", "check_close", "check_symbolic", "max_abs_error",
           "max_rel_error"]

# The mark's colours, from the book's theme (pydata-sphinx-theme: light and dark each have their own,
# both over 4.5:1 on the page's background), else JupyterLab's, else a green and a red that read on
# white. Everything else in a check's HTML takes the text colour of wherever it is shown.
MARK_COLORS = {True: "var(--pst-color-success, var(--jp-success-color0, #1a7f37))",
               False: "var(--pst-color-danger, var(--jp-error-color0, #cf222e))"}


@dataclass(frozen=True)
class IdentityCheck:
    """The outcome of checking one identity.

    Used throughout the book."""

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
        # the text in the page's own colour (readable in a light and a dark theme); the mark coloured
        text = html.escape(repr(self), quote=False)
        mark = "✓" if self.passed else "✗"
        text = f'<span style="color:{MARK_COLORS[self.passed]};font-weight:bold">{mark}</span>' + text[1:]
        return f'<pre class="lattn-check" style="margin:0;background:transparent">{text}</pre>'

    # the columns of a check table (CheckTable)
    def _measure(self) -> str:
        if self.kind == "symbolic":
            return "SymPy lhs − rhs"
        return self.measure

    def _error_text(self) -> str:
        if self.kind == "symbolic":
            return "0" if self.passed else "≠ 0"
        return f"{self.error:.2e}"

    def _tol_text(self) -> str:
        return "exact" if self.kind == "symbolic" else f"{self.tol:.0e}"


def max_abs_error(a, b) -> float:
    """max |a - b| over all entries (float64); inf if shapes differ or anything is non-finite.

    Used throughout the book."""
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
    """max |a - b| / max |b|: the error relative to the size of the reference ``b``.

    Used throughout the book."""
    scale = float(np.max(np.abs(np.asarray(b)))) if np.size(b) else 0.0
    err = max_abs_error(a, b)
    return err / scale if scale > 0 else err


def check_close(name: str, lhs, rhs, tol: float, *, relative: bool = False,
                raise_on_fail: bool = True) -> IdentityCheck:
    """Check ``lhs ≈ rhs`` numerically: the max absolute (or relative-to-``rhs``) error ≤ ``tol``.

    State ``tol`` with its reason at the call site (float64 round-off on a small problem is ~1e-12;
    a float32 kernel is ~1e-5; bf16 is ~1e-2). Raises ``AssertionError`` if the check fails (unless
    ``raise_on_fail=False``, used where a notebook *shows* a failing identity on purpose).

    Used throughout the book.
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
    """Check ``lhs == rhs`` exactly with SymPy (scalars or matrices of symbols).

    Used throughout the book."""
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


class CheckTable:
    """The checks of one section in one compact table: identity, what is measured, the error, the
    tolerance and ✓/✗, one row per check, in the order they were made.

    Each check is made (and raises on failure) by :func:`check_close` or :func:`check_symbolic` as
    before; the table only gathers them, so ``tbl.add(check_close(...))`` returns the check it adds,
    and :meth:`close` / :meth:`symbolic` make and add one in a call. A notebook cell that ends with
    ``tbl`` shows it: as HTML in Jupyter and the book (the text in the page's colours, so it reads in
    a light and a dark theme; only the marks coloured), as aligned text, at most ``LINE_WIDTH``
    characters wide, in its ``repr``. A check made with ``raise_on_fail=False`` (a notebook showing
    a failing identity on purpose) shows ✗; the table itself never raises.

    Used throughout the book."""

    def __init__(self, *checks, title: str | None = None):
        self.title = title
        self.checks: list[IdentityCheck] = []
        self.add(*checks)

    def add(self, *checks):
        """Add checks (or lists or tables of them); returns the check when given one, else ``self``."""
        for c in checks:
            if isinstance(c, IdentityCheck):
                self.checks.append(c)
            elif isinstance(c, (CheckTable, list, tuple)):
                self.add(*c)
            else:
                raise TypeError(f"a check table holds IdentityCheck results; got {type(c).__name__}")
        return checks[0] if len(checks) == 1 and isinstance(checks[0], IdentityCheck) else self

    def close(self, name: str, lhs, rhs, tol: float, **kwargs) -> IdentityCheck:
        """:func:`check_close` (it raises on failure as always), added to the table."""
        return self.add(check_close(name, lhs, rhs, tol, **kwargs))

    def symbolic(self, name: str, lhs, rhs, **kwargs) -> IdentityCheck:
        """:func:`check_symbolic` (it raises on failure as always), added to the table."""
        return self.add(check_symbolic(name, lhs, rhs, **kwargs))

    def __iter__(self):
        return iter(self.checks)

    def __len__(self) -> int:
        return len(self.checks)

    def __getitem__(self, i):
        return self.checks[i]

    @property
    def passed(self) -> bool:
        """Whether every check in the table holds."""
        return all(c.passed for c in self.checks)

    def summary(self) -> str:
        """One line: how many checks, and how many fail."""
        n, bad = len(self.checks), sum(not c.passed for c in self.checks)
        if not n:
            return "no checks"
        if not bad:
            return f"{n} check{'s' if n > 1 else ''}, all hold" if n > 1 else "1 check, it holds"
        return f"{n} checks, {bad} fail{'s' if bad == 1 else ''} (✗)" if n > 1 else "1 check, it fails (✗)"

    # -- text -------------------------------------------------------------------------------------
    _HEAD = ("identity", "measured", "error", "tol", "")
    _MEASURE_W = 15      # "max |lhs − rhs|"; the relative measure and SymPy's wrap to a second line

    def __repr__(self) -> str:
        rows = [(c.name, c._measure(), c._error_text(), c._tol_text(), "✓" if c.passed else "✗")
                for c in self.checks]
        err_w = max([len(self._HEAD[2])] + [len(r[2]) for r in rows])
        tol_w = max([len(self._HEAD[3])] + [len(r[3]) for r in rows])
        meas_w = self._MEASURE_W
        name_w = LINE_WIDTH - (meas_w + err_w + tol_w + 1 + 4 * 2)
        out = []
        if self.title:
            out += textwrap.wrap(self.title, LINE_WIDTH)

        def line(name, meas, err, tol, mark):
            return (f"{name:<{name_w}}  {meas:<{meas_w}}  {err:>{err_w}}  {tol:>{tol_w}}  {mark}").rstrip()

        out.append(line(*self._HEAD))
        out.append("─" * LINE_WIDTH)
        for name, meas, err, tol, mark in rows:
            names = textwrap.wrap(name, name_w, subsequent_indent="  ", break_on_hyphens=False) or [""]
            meas_lines = textwrap.wrap(meas, meas_w, break_on_hyphens=False) or [""]
            for i in range(max(len(names), len(meas_lines))):
                first = i == 0
                out.append(line(names[i] if i < len(names) else "",
                                meas_lines[i] if i < len(meas_lines) else "",
                                err if first else "", tol if first else "", mark if first else ""))
        out.append("─" * LINE_WIDTH)
        out.append(self.summary())
        return "\n".join(out)

    __str__ = __repr__

    # -- HTML -------------------------------------------------------------------------------------
    def _repr_html_(self) -> str:
        esc = lambda t: html.escape(str(t), quote=False)
        rule = "1px solid var(--pst-color-border, rgba(128, 128, 128, 0.5))"
        cell = f"padding:0.15em 0.4em;border:none;border-bottom:{rule};vertical-align:top;text-align:left;" \
               "background:transparent;color:inherit"
        # a name or a measure breaks anywhere rather than widen the table on a phone
        text = cell + ";overflow-wrap:anywhere"
        num = cell + ";text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums"
        head = ("identity", "what is measured", "error", "tolerance", "✓/✗")
        # On a phone the book's CSS (_static/lattn.css) hides the measure's column and shows the
        # measure under the identity instead (class lattn-check-measure), so four narrow columns
        # remain; everywhere else (Jupyter, Colab, the book at 1280 px) the five columns show.
        measure_col = ' class="lattn-check-measure-col"'
        parts = ['<table class="lattn-check-table" style="border-collapse:collapse;border:none;margin:0.25em 0;'
                 'font-size:0.85em;line-height:1.35;width:auto;max-width:100%;background:transparent;'
                 'color:inherit">']
        if self.title:
            parts.append(f'<caption style="caption-side:top;text-align:left;font-weight:bold;padding:0 0.4em 0.2em;'
                         f'color:inherit">{esc(self.title)}</caption>')
        parts.append("<thead><tr>" + "".join(
            f'<th scope="col"{measure_col if i == 1 else ""} '
            f'style="{text if i < 2 else num};font-weight:bold">{esc(h)}</th>'
            for i, h in enumerate(head)) + "</tr></thead><tbody>")
        for c in self.checks:
            mark = "✓" if c.passed else "✗"
            verdict = "holds" if c.passed else "fails"
            parts.append(
                f'<tr style="background:transparent"><td style="{text}">{esc(c.name)}'
                f'<span class="lattn-check-measure" style="display:none">{esc(c._measure())}</span></td>'
                f'<td{measure_col} style="{text}">{esc(c._measure())}</td>'
                f'<td style="{num}">{esc(c._error_text())}</td><td style="{num}">{esc(c._tol_text())}</td>'
                f'<td style="{cell};text-align:center;font-weight:bold;color:{MARK_COLORS[c.passed]}" '
                f'title="{verdict}" aria-label="{verdict}">{mark}</td></tr>')
        parts.append(f'</tbody><tfoot><tr style="background:transparent"><td colspan="5" '
                     f'style="{cell};border-bottom:none;font-style:italic">{esc(self.summary())}</td></tr>'
                     '</tfoot></table>')
        return "".join(parts)


def check_table(*checks, title: str | None = None) -> CheckTable:
    """The checks given (``IdentityCheck`` results, or lists of them) in one compact table; see
    :class:`CheckTable`. Each check raised when it failed, as always; the table only shows them.

    Used throughout the book."""
    return CheckTable(*checks, title=title)
