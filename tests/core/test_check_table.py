"""A section's checks in one compact table (lattn_core.checks.check_table / CheckTable): it renders
as HTML and as aligned text, holds every check it is given, shows a failing check as ✗, and leaves
the checks' own raising unchanged. (Its contrast in the book's light and dark themes and its fit on
a phone are measured in a browser: tests/book/test_page_check.py.)"""
import re
from html.parser import HTMLParser

import numpy as np
import pytest
import sympy as sp

from lattn_core.checks import (LINE_WIDTH, CheckTable, IdentityCheck, check_close, check_symbolic,
                               check_table)

LONG = "chunkwise form (ch2-chunkwise) = recurrent form (ch2-recurrent) at chunk length 16, d_k = 8"


def _checks():
    x = sp.Symbol("x")
    return [check_close("recurrent = parallel", np.ones(4), np.ones(4) + 3e-16, 1e-12),
            check_close(LONG, [1.0, 2.0], [1.0, 2.0], 1e-12, relative=True),
            check_symbolic("(x + 1)^2 = x^2 + 2x + 1", (x + 1) ** 2, x**2 + 2 * x + 1),
            check_close("a <b> & c: shown failing on purpose", 1.0, 2.0, 1e-3, raise_on_fail=False)]


class _Cells(HTMLParser):
    """The text of every row's cells (as at 1280 px: the copy of the measure that a phone shows
    under the identity is hidden), the inline style of each cell, and those hidden copies."""

    def __init__(self):
        super().__init__()
        self.rows, self.styles, self.caption, self._in, self.phone_measures = [], [], "", None, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "span" and a.get("class") == "lattn-check-measure":
            assert "display:none" in a.get("style", "")
            self._in = "phone"
            self.phone_measures.append("")
        elif tag == "tr":
            self.rows.append([])
            self.styles.append([])
        elif tag in ("td", "th"):
            self.rows[-1].append("")
            self.styles[-1].append(a.get("style", ""))
            self._in = "cell"
        elif tag == "caption":
            self._in = "caption"

    def handle_endtag(self, tag):
        if tag in ("td", "th", "caption"):
            self._in = None
        elif tag == "span" and self._in == "phone":
            self._in = "cell"

    def handle_data(self, data):
        if self._in == "phone":
            self.phone_measures[-1] += data
        elif self._in == "cell":
            self.rows[-1][-1] += data
        elif self._in == "caption":
            self.caption += data


def _parse(table):
    p = _Cells()
    p.feed(table._repr_html_())
    return p


def test_it_holds_every_check_in_order():
    checks = _checks()
    tbl = check_table(*checks, title="Section 2.3")
    assert isinstance(tbl, CheckTable) and list(tbl) == checks and len(tbl) == 4 and tbl[2] is checks[2]
    # lists and tables flatten; a collector filled one by one is the same table
    col = CheckTable(title="Section 2.3")
    assert col.add(checks[0]) is checks[0], "add returns the check, so a cell can keep using it"
    col.add(checks[1:3], CheckTable(checks[3]))
    assert list(col) == checks
    with pytest.raises(TypeError):
        CheckTable("not a check")


def test_the_html_has_one_row_per_check_with_its_columns():
    checks = _checks()
    p = _parse(check_table(*checks, title="Section 2.3: the forms agree"))
    assert p.caption == "Section 2.3: the forms agree"
    head, body, foot = p.rows[0], p.rows[1:-1], p.rows[-1]
    assert head == ["identity", "what is measured", "error", "tolerance", "✓/✗"]
    assert len(body) == len(checks)
    for row, c in zip(body, checks):
        assert row[0] == c.name                                     # escaped in the page, intact to a reader
        assert row[4] == ("✓" if c.passed else "✗")
        if c.kind == "numeric":
            assert row[1] == c.measure
            assert float(row[2]) == pytest.approx(c.error, rel=1e-2)
            assert float(row[3]) == pytest.approx(c.tol)
        else:
            assert "SymPy" in row[1] and row[3] == "exact"
    assert "4 checks, 1 fails" in foot[0]
    assert p.phone_measures == [row[1] for row in body], "a phone shows each measure under its identity"
    raw = check_table(*checks)._repr_html_()
    assert "<b>" not in raw and "a &lt;b&gt; &amp; c" in raw


def test_a_failing_check_shows_a_cross_and_the_table_does_not_raise():
    bad = check_close("1 = 2", 1.0, 2.0, 1e-3, raise_on_fail=False)
    tbl = check_table(check_close("1 = 1", 1.0, 1.0, 1e-12), bad)
    assert not tbl.passed and not bad.passed
    body = _parse(tbl).rows[1:-1]
    assert [r[4] for r in body] == ["✓", "✗"]
    text = repr(tbl).splitlines()
    assert any(l.startswith("1 = 2") and l.endswith("✗") for l in text)
    assert text[-1] == "2 checks, 1 fails (✗)"


def test_checks_still_raise_as_before():
    with pytest.raises(AssertionError, match="1 = 2"):
        check_close("1 = 2", 1.0, 2.0, 1e-3)
    x = sp.Symbol("x")
    with pytest.raises(AssertionError):
        check_symbolic("x = x + 1", x, x + 1)
    tbl = CheckTable()
    with pytest.raises(AssertionError):
        tbl.close("1 = 2", 1.0, 2.0, 1e-3)
    with pytest.raises(AssertionError):
        tbl.symbolic("x = x + 1", x, x + 1)
    assert len(tbl) == 0, "a check that raised is not shown as if it had been made"
    assert isinstance(tbl.close("1 = 1", 1.0, 1.0, 1e-12), IdentityCheck) and tbl.passed


def test_the_marks_alone_are_coloured_and_by_the_theme():
    """The text takes the page's colour, so it reads in the light and the dark theme; the marks use
    the theme's success and danger colours (each theme has its own; a fallback for Jupyter)."""
    raw = check_table(*_checks())._repr_html_()
    p = _parse(check_table(*_checks()))
    for row, styles in zip(p.rows, p.styles):
        for text, style in zip(row, styles):
            colors = re.findall(r"(?<![-\w])color:\s*([^;]+)", style)
            if text in ("✓", "✗"):
                want = "--pst-color-success" if text == "✓" else "--pst-color-danger"
                assert colors and colors[-1].strip().startswith(f"var({want}"), (text, style)
            else:
                assert all(c.strip() == "inherit" for c in colors), (text, style)
    # no background of its own that could be light-only, no hard-coded colour outside a var() fallback
    outside_var = re.sub(r"var\([^()]*(\([^()]*\)[^()]*)*\)", "", raw)
    assert not re.search(r"#[0-9a-fA-F]{3,6}\b|rgb\(", outside_var), outside_var


def test_the_text_is_aligned_and_fits_the_column():
    checks = _checks()
    text = repr(check_table(*checks, title="Section 2.3: " + "the forms agree " * 8))
    lines = text.splitlines()
    assert max(map(len, lines)) <= LINE_WIDTH <= 90
    head = next(l for l in lines if l.startswith("identity"))
    cols = [head.index(h) for h in ("measured", "error", "tol")]
    rows = [l for l in lines if l.endswith(("✓", "✗"))]
    assert len(rows) == len(checks), "one line with the verdict per check"
    ends = {len(r) for r in rows}
    assert len(ends) == 1, "the marks line up"
    for r in rows:
        assert r[cols[0] - 2:cols[0]] == "  ", "the identity column ends where the measure begins"
    # a long name wraps inside its column, indented, and survives whole
    rule = [i for i, l in enumerate(lines) if set(l) == {"─"}]
    names = "".join(l[:cols[0]] for l in lines[rule[0] + 1:rule[1]])
    assert "".join(LONG.split()) in "".join(names.split())
    assert f"{checks[0].error:.2e}" in text and "1e-12" in text
    # on a phone: no line depends on being wider than the column; every line is short enough to wrap
    # at a space (the book's CSS wraps output lines there)
    assert all(" " in l.strip() or len(l) <= 40 for l in lines if l.strip("─"))


def test_an_empty_table_and_a_single_check():
    assert repr(CheckTable()).splitlines()[-1] == "no checks"
    one = check_table(check_close("1 = 1", 1.0, 1.0, 1e-12))
    assert repr(one).splitlines()[-1] == "1 check, it holds"
    assert "<table" in one._repr_html_() and "1 = 1" in one._repr_html_()
    body = _parse(one).rows[1:-1]
    assert len(body) == 1 and body[0][4] == "✓"
