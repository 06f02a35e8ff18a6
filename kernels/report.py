"""Showing a benchmark of record in the book: one call per chapter, nothing typed by hand.

:func:`show_benchmark` reads a family's results file (``kernels/<family>/results.json``, written by
``python -m kernels.<family>.bench --write``) and shows, in this order: the line naming the device,
date and library versions; the median times against ``T`` (one figure per pass); the ratio of our
time to the peer's per shape, with the family's goals marked met or not; the largest error of each
implementation (of each op, when the records hold several) against the float64 reference; and the
peer's recorded refusals. Chapters, the
benchmarks appendix and the README's numbers all come through here. :func:`show_family` is the
compact form the benchmarks appendix uses, one family per subsection: the device line, one figure
(:func:`benchmark_figure`: the passes stacked, one legend below) and one Markdown table
(:func:`goal_table`: one row per shape, both passes side by side, each ratio marked against its goal).

The goals in a results file's ``config["goals"]`` are our time over a peer's: either per pass,
``{"fwd": 1.0, ...}``, set against fla and marked only in a comparison with fla (``peer="fla"``), or
per peer, op and pass, ``{"by_peer": {"sdpa": {"attention": {"fwd": 1.1}}, "fla": {...}}}``, each
marked in the comparison with its own peer.
"""
from __future__ import annotations

import math

from .results import load_results

__all__ = ["show_benchmark", "ratio_table", "ratio_rows", "stored_goal", "goal_verdicts", "describe_verdicts", "plot_results",
           "series_colors", "env_line", "plot_tradeoff", "benchmark_figure", "goal_table", "error_lines",
           "plot_bars", "show_family", "roofline_rows", "roofline_table", "roofline_summary"]

# The implementation the stored goals compare us with (config["goals"]: our time / this one's).
GOALS_PEER = "fla"

# Record fields that are measurements or bookkeeping, not part of what was measured.
_NOT_KEY = {"impl", "ms", "err", "note", "wall_s", "err_T", "tflops", "max_abs_err", "ok", "env", "peak_mib", "gbps", "copy_fraction",
            "io_bytes"}


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def env_line(data: dict) -> str:
    """``measured on <device>, <date>; torch ..., triton ..., fla ...`` for a results dict (with the
    range of dates when its records come from several runs, each record then carrying its ``env``)."""
    env = data.get("env", {})
    dates = sorted({r["env"].get("date") for r in data.get("records", []) if isinstance(r.get("env"), dict)}
                   | ({env.get("date")} if any("env" in r for r in data.get("records", [])) else set()))
    when = f"{dates[0]} to {dates[-1]}" if len(dates) > 1 else env.get("date")
    return (f"measured on {env.get('device')}, {when}; torch {env.get('torch')}, "
            f"triton {env.get('triton')}, fla {env.get('fla')}")


def _key(r: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in r.items() if k not in _NOT_KEY))


def stored_goal(data: dict, peer: str, op, pass_):
    """The goal (our time over ``peer``'s) a results file sets for ``op`` and ``pass_``, or ``None``."""
    goals = (data.get("config") or {}).get("goals") or {}
    if "by_peer" in goals:
        return ((goals["by_peer"].get(peer) or {}).get(op) or {}).get(pass_)
    return goals.get(pass_) if peer == GOALS_PEER else None


def ratio_rows(data: dict, *, ours: str = "ours", peer: str = "fla") -> list:
    """One dict per measured shape and pass: the shape's fields, ``ours`` and ``peer`` ms, ``ratio``
    (``None`` where either time is missing), the goal for the op and pass against this ``peer``
    (:func:`stored_goal`) and the peer's note where it has no time."""
    by: dict = {}
    for r in data["records"]:
        if r.get("impl") in (ours, peer):
            by.setdefault(_key(r), {})[r["impl"]] = r
    rows = []
    for key, d in by.items():
        a, b = d.get(ours, {}).get("ms"), d.get(peer, {}).get("ms")
        first = d.get(ours) or d.get(peer)
        row = {k: v for k, v in first.items() if k not in _NOT_KEY}    # the fields, as stored
        row.update(ours=a, peer=b, ratio=a / b if _num(a) and _num(b) and b else None,
                   goal=stored_goal(data, peer, row.get("op"), row.get("pass")),
                   note=(d.get(peer, {}).get("note") or "") if not _num(b) else "")
        rows.append(row)
    return rows


def goal_verdicts(data: dict, *, select=None, ours: str = "ours", peer: str = "fla") -> list:
    """Per op and pass (in the file's order), the stored goal and which shapes meet it: a dict with
    ``op``, ``pass``, ``goal``, ``timed`` (the rows of :func:`ratio_rows` with both times), ``met`` and
    ``missed`` (those with our time at most / above ``goal`` times the peer's; empty without a goal,
    as against a peer the goals are not set for) and ``untimed`` (rows where the peer has no time,
    its note saying why). The chapters state their kernels' goals from these, never from typed numbers."""
    rows = [r for r in ratio_rows(data, ours=ours, peer=peer) if select is None or select(r)]
    out = []
    for key in dict.fromkeys((r.get("op"), r.get("pass")) for r in rows):
        block = [r for r in rows if (r.get("op"), r.get("pass")) == key]
        goal = next((r["goal"] for r in block if r["goal"] is not None), None)
        timed = [r for r in block if r["ratio"] is not None]
        out.append({"op": key[0], "pass": key[1], "goal": goal, "timed": timed,
                    "met": [r for r in timed if goal is not None and r["ratio"] <= goal],
                    "missed": [r for r in timed if goal is not None and r["ratio"] > goal],
                    "untimed": [r for r in block if r["ratio"] is None]})
    return out


def _span(rows) -> str:
    lo, hi = min(r["ratio"] for r in rows), max(r["ratio"] for r in rows)
    return f"ratio {lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"ratios {lo:.2f} to {hi:.2f}"


def _shapes(rows) -> str:
    seen = dict.fromkeys((r.get("B"), r.get("T")) for r in rows)
    return ", ".join(f"B = {b}, T = {t}" for b, t in seen)


def describe_verdicts(verdicts: list, *, peer: str = "fla") -> list:
    """One sentence per entry of :func:`goal_verdicts`: the goal, where it is met and where not (the
    shapes and the span of our time over the peer's), and where the peer recorded no time."""
    names = {"fwd": "forward", "fwdbwd": "forward + backward"}
    out = []
    for v in verdicts:
        head = f"{v['op']}, {names.get(v['pass'], v['pass'])}"
        if v["goal"] is not None:
            head += f" (goal: our time at most {v['goal']:g} x {peer}'s)"
        parts = []
        if v["goal"] is None and v["timed"]:
            parts.append(f"no goal set, {_span(v['timed'])}")
        if v["met"]:
            parts.append(f"met at {_shapes(v['met'])} ({_span(v['met'])})")
        if v["missed"]:
            parts.append(f"not met at {_shapes(v['missed'])} ({_span(v['missed'])})")
        if v["untimed"]:
            note = (v["untimed"][0]["note"] or "no record").split(" (see")[0]
            where = "any shape" if not (v["met"] or v["missed"]) else _shapes(v["untimed"])
            parts.append(f"no {peer} time at {where} ({peer} recorded: {note})")
        out.append(head + ": " + "; ".join(parts) + ".")
    return out


WIDTH = 79          # the widest line a report prints (the book's text column holds 80 characters)


def _wrap(text: str) -> str:
    import textwrap
    return "\n".join(textwrap.fill(line, WIDTH, subsequent_indent="  ") for line in text.splitlines())


def ratio_table(data: dict, *, ours: str = "ours", peer: str = "fla", goals: bool = True) -> str:
    """A text table of our median time over the peer's, per shape and pass, one block per op (the
    op and its goals in the block's heading; columns only for the fields that vary), at most
    :data:`WIDTH` characters wide."""
    rows = ratio_rows(data, ours=ours, peer=peer)
    if not rows:
        return "(no records)"
    fixed = {"pass", "ours", "peer", "ratio", "goal", "note", "op"}
    show_goal = goals and any(r["goal"] is not None for r in rows)
    fmt = lambda v: f"{v:.3f}" if _num(v) else "—"   # noqa: E731
    lines = []
    for op in dict.fromkeys(r.get("op") for r in rows):
        block = [r for r in rows if r.get("op") == op]
        cols = [c for c in ("B", "T") if any(c in r for r in block)]
        cols += sorted(c for c in {k for r in block for k in r} - fixed - set(cols)
                       if len({r.get(c) for r in block}) > 1)
        widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in block)) for c in cols}
        gl = {r["pass"]: r["goal"] for r in block if r["goal"] is not None}
        head = f"{op or data.get('name', '')}: our time / {peer}'s"
        if show_goal and gl:
            head += " (goals: " + ", ".join(f"{p} <= {g:g}" for p, g in gl.items()) + ")"
        lines += (["", head] if lines else [head])
        wp = max(8, len(peer) + 1)          # a peer's name may be longer than a time ("fla+sdpa")
        lines.append("  ".join(f"{c:>{widths[c]}}" for c in cols)
                     + f"  {'pass':<6}{ours:>8}{peer:>{wp}}{'ratio':>7}" + ("  goal" if show_goal else ""))
        for r in block:
            line = "  ".join(f"{str(r.get(c, '')):>{widths[c]}}" for c in cols)
            line += f"  {str(r.get('pass')):<6}{fmt(r['ours']):>8}{fmt(r['peer']):>{wp}}"
            line += f"{r['ratio']:>7.2f}" if r["ratio"] is not None else f"{'n/a':>7}"
            if show_goal and r["goal"] is not None:
                line += (f"  {'met' if r['ratio'] <= r['goal'] else 'NOT met'}" if r["ratio"] is not None
                         else f"  no {peer} time")
            lines.append(line)
    return "\n".join(lines)


def _series_records(data: dict, *, x: str, pass_, select) -> tuple[dict, int]:
    """``({label: [record, ...]}, main_tokens)``: the timed records of one series per implementation
    (and per op and other varying field when a file mixes several), and the file's most common token
    count ``B·T``."""
    recs = [r for r in data["records"] if (pass_ is None or r.get("pass") == pass_) and _num(r.get("ms"))
            and (select is None or select(r))]
    allr = [r for r in data["records"] if select is None or select(r)]
    vary = [k for k in sorted({k for r in allr for k in r} - _NOT_KEY - {x, "pass", "B"})
            if len({str(r.get(k)) for r in allr}) > 1]
    tokens = [(r.get("B") or 0) * (r.get("T") or 0) for r in allr]
    main = max(set(tokens), key=tokens.count) if tokens else 0
    series: dict = {}
    for r in recs:
        label = ", ".join([r["impl"]] + [str(r[k]) for k in vary if r.get(k) is not None])
        series.setdefault(label, []).append(r)
    return series, main


def _series(data: dict, *, x: str, pass_, select) -> dict:
    """``{label: [(x, ms, main_tokens)]}``: one series per implementation (and per op and other
    varying field when a file mixes several); ``main_tokens`` is False for points at another token
    count ``B·T`` than the file's most common one (the single long sequence, ``B = 1``)."""
    series, main = _series_records(data, x=x, pass_=pass_, select=select)
    return {label: [(r[x], r["ms"], (r.get("B") or 0) * (r.get("T") or 0) == main) for r in recs]
            for label, recs in series.items()}


# Implementations that are references, not a model (drawn in greys): a plain memory copy.
_REFERENCE_IMPLS = {"copy"}


def _model_of(record: dict, data: dict):
    """The palette's model key (:func:`lattn_core.palette.model_key`) of a timed record: PyTorch's
    SDPA is its own, every other implementation is the model of its op (or of the file, when the
    op is no model's name); ``None`` for a reference that is no model (a memory copy)."""
    from lattn_core.palette import model_key
    if record.get("impl") in _REFERENCE_IMPLS:
        return None
    for name in (record.get("impl"), record.get("op"), data.get("name")):
        if isinstance(name, str) and name != "ours":
            try:
                return model_key(name)
            except ValueError:
                continue
    return None


def _shade(color: str, k: int) -> str:
    """The ``k``-th shade of a hex colour: ``k = 0`` the colour itself, then alternately darker and
    lighter, further each time (the other implementations or settings of one model)."""
    rgb = [int(color[i:i + 2], 16) for i in (1, 3, 5)]
    if k:
        t = 1 - 0.75 ** ((k + 1) // 2)
        target = 0 if k % 2 else 255
        rgb = [round(c + (target - c) * t) for c in rgb]
    return "#" + "".join(f"{c:02X}" for c in rgb)


def series_colors(data: dict, *, x: str = "T", select=None) -> dict:
    """One colour per series label, the same in every pass's figure: the model's colour from the
    book's palette (:func:`lattn_core.palette.color_of`; SDPA its own, so softmax attention's kernel
    and PyTorch's differ), our implementation in the model's colour and the other implementations
    or settings of the same model in its shades (sorted by label); a reference that is no model (a
    memory copy) in greys."""
    from lattn_core.palette import color_of
    labels: dict = {}
    for p in (None, "fwd", "fwdbwd"):
        for label, recs in _series_records(data, x=x, pass_=p, select=select)[0].items():
            labels.setdefault(label, _model_of(recs[0], data))
    colors, used = {}, {}
    ours_first = sorted(labels, key=lambda lab: (not lab.startswith("ours"), lab))
    for label in ours_first:
        model = labels[label]
        k = used.get(model, 0)
        used[model] = k + 1
        colors[label] = _shade(color_of(model), k) if model else _shade("#7F7F7F", k)
    return colors


def plot_tradeoff(data: dict, *, op: str, param: str, err_key: str = "o", pass_: str = "fwd", ax=None,
                  title: str | None = None):
    """Error against time for a sweep: for every implementation, its records of ``op`` and ``pass_``
    as points (median ms, ``err[err_key]``) joined in the order of ``param`` and labelled with its
    value (say, MesaNet's ``cg`` steps). Linear axes; returns the axes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6.0, 4.0), layout="constrained")
    recs = [r for r in data["records"] if r.get("op") == op and r.get("pass") == pass_ and _num(r.get("ms"))
            and _num((r.get("err") or {}).get(err_key))]
    for impl in sorted({r["impl"] for r in recs}):
        pts = sorted((r[param], r["ms"], r["err"][err_key]) for r in recs if r["impl"] == impl)
        line, = ax.plot([p[1] for p in pts], [p[2] for p in pts], "o-", label=impl)
        for value, ms, err in pts:
            ax.annotate(str(value), (ms, err), textcoords="offset points", xytext=(4, 4), fontsize=7,
                        color=line.get_color())
    ax.set_xlabel(f"median ms ({pass_})")
    ax.set_ylabel(f"RMS error of {err_key} / RMS of the float64 reference")
    ax.set_title(title or f"{op}: error against time, labelled by {param}", fontsize=9)
    ax.legend(fontsize=8)
    return ax


def plot_results(data: dict, *, x: str = "T", pass_: str | None = None, ax=None, title: str | None = None,
                 select=None, colors: dict | None = None, legend: bool = True, env: bool = True,
                 names: dict | None = None, styles: dict | None = None):
    """Median ms against ``x`` (log-log), one line per implementation (and per op and per other
    varying field when a file mixes several), captioned with the device. Points at another token
    count than the file's usual one (the single long sequence) are drawn as hollow markers of the same
    colour, not joined to the line. ``colors`` (from :func:`series_colors`) keeps a series' colour the
    same across figures. ``names`` renames series in the legend (say, an op by its model's name) and
    ``styles`` gives a series a line style (say, ``"--"`` for a peer drawn in its model's colour).
    ``legend=False`` leaves the legend to the caller (one for a whole figure), ``env=False`` the
    device line under the axes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6.2, 4))
    series = _series(data, x=x, pass_=pass_, select=select)
    colors = colors or series_colors(data, x=x, select=select)
    odd = False
    for label, pts in sorted(series.items()):
        pts.sort()
        line = [(a, b) for a, b, m in pts if m]
        c = colors.get(label)
        ax.plot([p[0] for p in line], [p[1] for p in line], marker="o", label=(names or {}).get(label, label),
                color=c, linestyle=(styles or {}).get(label, "-"))
        other = [(a, b) for a, b, m in pts if not m]
        if other:
            odd = True
            ax.plot([p[0] for p in other], [p[1] for p in other], linestyle="none", marker="o",
                    markerfacecolor="none", color=c)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel("median time (ms)")
    ax.set_title(title or data.get("name", ""))
    if odd:
        ax.plot([], [], linestyle="none", marker="o", markerfacecolor="none", color="#555555",
                label="hollow: one long sequence (B = 1)")
    if legend:
        ax.legend(fontsize=7)
    if env:
        # wrapped to the axes' width: a line wider than the axes would make a constrained layout
        # shrink the axes to a sliver to leave room for it
        import textwrap
        ax.text(0.0, -0.2, textwrap.fill(env_line(data), 80), transform=ax.transAxes, fontsize=7,
                va="top")
    return ax


def _refusals(data: dict, peer: str) -> list:
    notes = {str(r.get("note")).split(" (see")[0] for r in data["records"]
             if r.get("impl") == peer and not _num(r.get("ms")) and r.get("note")}
    return sorted(notes)


def _stored(source, select=None):
    """The results ``source`` names (a family or a results dict), the records ``select`` keeps, after
    printing the device line; ``None`` after a line saying why when none are stored, and a line
    when ``select`` keeps no record. What :func:`show_benchmark` and :func:`show_family` show first."""
    try:
        data = load_results(source) if isinstance(source, str) else source
    except FileNotFoundError as exc:
        print(_wrap(str(exc)))
        return None
    if select is not None:
        data = dict(data, records=[r for r in data["records"] if select(r)])
    print(_wrap(env_line(data)))
    if not data["records"]:
        print("(no stored record matches)")
    return data


def show_benchmark(source, *, select=None, title: str | None = None, ours: str = "ours", peer="fla",
                   plot: bool = True):
    """Show a family's benchmark of record (``"flash"``, ``"gla"``, ``"delta"``) or a results dict.

    ``select(record) -> bool`` keeps a subset (say, one op). ``peer``: the implementation our time
    is divided by, or a sequence of them (``("sdpa", "fla")``: one ratio table per peer, the goals
    marked in fla's). Prints a line and returns ``None`` when no results are stored (a copy of the
    book without them); otherwise returns the results (the selected subset).
    """
    data = _stored(source, select)
    if data is None or not data["records"]:
        return data
    if plot:
        import matplotlib.pyplot as plt
        passes = [p for p in ("fwd", "fwdbwd") if any(r.get("pass") == p and _num(r.get("ms"))
                                                       for r in data["records"])]
        if passes:
            fig, axes = plt.subplots(1, len(passes), figsize=(5.6 * len(passes), 4.4), squeeze=False,
                                     layout="constrained")
            names = {"fwd": "forward", "fwdbwd": "forward + backward"}
            colors = series_colors(data)
            for ax, p in zip(axes[0], passes):
                plot_results(data, pass_=p, ax=ax, title=f"{title or data.get('name', '')}: {names[p]}",
                             colors=colors)
            plt.show()
    peers = (peer,) if isinstance(peer, str) else tuple(peer)
    for p in peers:
        if len(peers) > 1:
            print(f"\nour time over {p}'s:")
        print(ratio_table(data, ours=ours, peer=p))
    for who, e in _largest_errors(data).items():
        print(_wrap(f"largest RMS error ratio vs float64, {who}: "
                    + ", ".join(f"{k} {v:.2e}" for k, v in e.items())))
    for p in peers:
        for note in _refusals(data, p):
            print(_wrap(f"{p} recorded no time: {note}"))
    return data


# ---- the compact forms: one figure and one table per family (the benchmarks appendix, phone-width) ----

_PASS_NAMES = {"fwd": "forward", "fwdbwd": "forward + backward"}


def benchmark_figure(data: dict, *, title: str | None = None, select=None, passes=("fwd", "fwdbwd"),
                     width: float = 6.4):
    """The median times of a results dict against ``T``, one panel per pass *stacked* one above the
    other (legible on a narrow screen), every series in the same colour in both, and one legend below
    the panels. The device line is left to the caller (print :func:`env_line`). Returns the figure,
    or ``None`` when no pass has a time."""
    import matplotlib.pyplot as plt
    if select is not None:
        data = dict(data, records=[r for r in data["records"] if select(r)])
    passes = [p for p in passes if any(r.get("pass") == p and _num(r.get("ms")) for r in data["records"])]
    if not passes:
        return None
    fig, axes = plt.subplots(len(passes), 1, figsize=(width, 0.4 + 2.9 * len(passes)), squeeze=False,
                             layout="constrained", sharex=True)
    colors = series_colors(data)
    for ax, p in zip(axes[:, 0], passes):
        plot_results(data, pass_=p, ax=ax, colors=colors, legend=False, env=False,
                     title=f"{title or data.get('name', '')}: {_PASS_NAMES.get(p, p)}")
        ax.title.set_fontsize(10)
    for ax in axes[:-1, 0]:
        ax.set_xlabel("")
    axes[-1, 0].set_xlabel("sequence length T")
    handles, labels = {}, {}
    for ax in axes[:, 0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles), loc="outside lower center",
               ncol=min(2, len(handles)), fontsize=8, frameon=False)
    return fig


def _shape_text(row: dict, fields) -> str:
    def val(v):
        return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)
    bt = " × ".join(val(row[f]) for f in ("B", "T") if f in fields and row.get(f) is not None)
    rest = [f"{f} {val(row[f])}" for f in fields if f not in ("B", "T") and row.get(f) is not None]
    return ", ".join(([bt] if bt else []) + rest)


def _breakable(op) -> str:
    """A long op name that may break after an underscore (a zero-width space), so that it wraps in
    a phone's narrow table column instead of widening the table."""
    return str(op).replace("_", "_\u200b") if len(str(op)) > 16 else str(op)


def goal_table(data: dict, *, ours: str = "ours", peer="fla", select=None) -> str:
    """A compact Markdown table of our median time over the peer's, three columns that fit a phone:
    the shape (``B × T`` and the fields that vary within the op), the forward and the forward +
    backward side by side, each ratio marked against the stored goal (``met`` / ``not met``). Each
    op opens with a row naming it, the peer and its goals. ``peer`` may be a sequence (one block
    per peer and op); an op the peer never timed is left out."""
    peers = (peer,) if isinstance(peer, str) else tuple(peer)
    head = ["| shape (B × T) | fwd | fwd + bwd |", "|:--|--:|--:|"]
    body = []
    for p in peers:
        rows = [r for r in ratio_rows(data, ours=ours, peer=p) if select is None or select(r)]
        rows = [r for r in rows if r.get("pass") in _PASS_NAMES]
        for op in dict.fromkeys(r.get("op") for r in rows):
            block = [r for r in rows if r.get("op") == op]
            if not any(r["ratio"] is not None for r in block):
                continue
            fields = [c for c in ("B", "T") if any(c in r for r in block)]
            fields += sorted(c for c in {k for r in block for k in r}
                             - {"pass", "ours", "peer", "ratio", "goal", "note", "op", "B", "T"}
                             if len({str(r.get(c)) for r in block}) > 1)
            goals = {r["pass"]: r["goal"] for r in block if r["goal"] is not None}
            name = f"**{_breakable(op)}** over {p}"
            if goals:
                name += " (goals: " + ", ".join(f"{'fwd + bwd' if k == 'fwdbwd' else k} ≤ {g:g}"
                                                for k, g in goals.items()) + ")"
            body.append(f"| {name} | | |")
            for shape in dict.fromkeys(_shape_text(r, fields) for r in block):
                cells = []
                for pass_ in ("fwd", "fwdbwd"):
                    r = next((r for r in block if r["pass"] == pass_ and _shape_text(r, fields) == shape), None)
                    if r is None or r["ratio"] is None:
                        cells.append("—")
                    elif r["goal"] is None:
                        cells.append(f"{r['ratio']:.2f}")
                    else:
                        cells.append(f"{r['ratio']:.2f} " + ("met" if r["ratio"] <= r["goal"] else "**not met**"))
                body.append(f"| {shape} | {cells[0]} | {cells[1]} |")
    if not body:
        return "(no records with both times)"
    return "\n".join(head + body)


def error_lines(data: dict) -> list:
    """One short line per implementation (and op, when the records hold several): its largest RMS
    error ratio against the float64 reference over every output, and which output it was."""
    return [f"{who} {max(e.values()):.1e} ({max(e, key=e.get)})"
            for who, e in _largest_errors(data).items()]


def _largest_errors(data: dict) -> dict:
    """``{who: {output: largest RMS error ratio}}`` over the records, ``who`` the implementation (and
    the op, when the records hold several): what :func:`show_benchmark` and :func:`error_lines` print."""
    errs: dict = {}
    per_op = len({r.get("op") for r in data["records"]}) > 1
    for r in data["records"]:
        who = f"{r['impl']}, {r.get('op')}" if per_op else r["impl"]
        for k, v in (r.get("err") or {}).items():
            if _num(v):
                errs.setdefault(who, {}).setdefault(k, 0.0)
                errs[who][k] = max(errs[who][k], v)
    return errs


def plot_bars(data: dict, *, value: str = "copy_fraction", select=None, ax=None, xlabel: str | None = None,
              impls=None):
    """Horizontal bars of a per-record field (say ``copy_fraction``), one group per shape and pass
    (the fields that vary), one colour per implementation. Returns the axes."""
    import matplotlib.pyplot as plt
    recs = [r for r in data["records"] if _num(r.get(value)) and (select is None or select(r))]
    impls = list(impls or dict.fromkeys(r["impl"] for r in recs))
    fields = [c for c in sorted({k for r in recs for k in r} - _NOT_KEY - {"pass"})
              if len({str(r.get(c)) for r in recs}) > 1]
    groups = list(dict.fromkeys((r.get("pass"), _shape_text(r, fields)) for r in recs))
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 0.5 + 0.42 * len(groups) * max(1, len(impls))),
                             layout="constrained")
    # the palette's colours, as series_colors gives them: our implementation in the model's colour,
    # a peer's in its shades, a reference that is no model (a copy) in greys
    from lattn_core.palette import color_of
    used: dict = {}
    colors = {}
    for impl in sorted(impls, key=lambda i: i != "ours"):
        model = _model_of(next(r for r in recs if r["impl"] == impl), data)
        k = used.get(model, 0)
        used[model] = k + 1
        colors[impl] = _shade(color_of(model), k) if model else _shade("#7F7F7F", k)
    h = 0.8 / max(1, len(impls))
    for j, impl in enumerate(impls):
        ys, xs = [], []
        for i, (p, shape) in enumerate(groups):
            r = next((r for r in recs if r["impl"] == impl and r.get("pass") == p
                      and _shape_text(r, fields) == shape), None)
            if r is not None:
                ys.append(i + (j - (len(impls) - 1) / 2) * h)
                xs.append(r[value])
        ax.barh(ys, xs, height=h, label=impl, color=colors[impl])
    ax.set_yticks(range(len(groups)), [f"{_PASS_NAMES.get(p, p)}\n{shape}" for p, shape in groups], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel or value.replace("_", " "))
    ax.legend(fontsize=8, loc="lower right")
    return ax


def show_family(source, *, title: str | None = None, peer="fla", select=None, ours: str = "ours"):
    """A family's benchmark of record in compact form (the benchmarks appendix): the device line, the
    figure of :func:`benchmark_figure`, then one Markdown block with the table of :func:`goal_table`,
    the largest errors and the peers' recorded refusals. Prints a line and returns ``None`` when no
    results are stored; otherwise returns the (selected) results."""
    from IPython.display import Markdown, display
    import matplotlib.pyplot as plt
    data = _stored(source, select)
    if data is None or not data["records"]:
        return data
    if benchmark_figure(data, title=title) is not None:
        plt.show()
    peers = (peer,) if isinstance(peer, str) else tuple(peer)
    md = [goal_table(data, ours=ours, peer=peers)]
    errs = error_lines(data)
    if errs:
        md.append("Largest RMS error over the float64 reference's RMS: " + "; ".join(errs) + ".")
    notes = [f"{p}: {n}" for p in peers for n in _refusals(data, p)]
    if notes:
        md.append("Recorded without a time: " + "; ".join(notes) + ".")
    display(Markdown("\n\n".join(md)))
    return data


def roofline_rows(data: dict, *, impl: str = "ours") -> list:
    """How far each timed record of ``impl`` is from the device's roofline, from a results file whose
    config holds the run's own yardsticks (:func:`kernels.harness.measure_device`: ``copy_gbps``,
    ``bf16_matmul_tflops``). Per record: ``io_ms``, the time to move its ``io_bytes``
    (:func:`kernels.harness.io_bytes`) at the copy's bandwidth; ``flop_ms``, the time of its
    operations at the matrix-multiply rate (from ``tflops``, where the family counts operations);
    ``bound_ms``, the larger; and ``of_roofline = bound_ms / ms`` (1: at the roofline). Records or
    files without the fields (runs before 2026-11-29) give no row. Raises ``ValueError`` when the
    config lacks the copy bandwidth."""
    cfg = data.get("config", {})
    gbps, mm = cfg.get("copy_gbps"), cfg.get("bf16_matmul_tflops")
    if not _num(gbps):
        raise ValueError("data's config has no copy_gbps: the run predates kernels.harness.measure_device")
    rows = []
    for r in data["records"]:
        if r.get("impl") != impl or not _num(r.get("ms")) or not _num(r.get("io_bytes")):
            continue
        io_ms = r["io_bytes"] / gbps / 1e6
        flop_ms = r["tflops"] * r["ms"] / mm if _num(r.get("tflops")) and _num(mm) else None
        bound = max(io_ms, flop_ms or 0.0)
        row = {k: v for k, v in r.items() if k not in _NOT_KEY}
        row.update(ms=r["ms"], io_ms=io_ms, flop_ms=flop_ms, bound_ms=bound, of_roofline=bound / r["ms"])
        rows.append(row)
    return rows


def roofline_table(data: dict, *, impl: str = "ours") -> str:
    """:func:`roofline_rows` as text: one line per op, shape and pass; ``case`` names the record's
    other fields (``D=4096``, ``wb=float32``) where the family's cases have them."""
    rows = roofline_rows(data, impl=impl)
    cfg = data["config"]
    head = (f"{impl}: time against the roofline (copy {cfg['copy_gbps']:.0f} GB/s, bf16 matmul "
            f"{cfg.get('bf16_matmul_tflops', float('nan')):.0f} TFLOP/s, measured in the run)")
    shown = {"op", "B", "T", "pass", "ms", "io_ms", "flop_ms", "bound_ms", "of_roofline"}
    cases = [" ".join(f"{k}={v}" for k, v in r.items() if k not in shown) for r in rows]
    width = max([4] + [len(c) for c in cases])
    lines = [head, f"{'op':24s} {'B':>3s} {'T':>6s} {'case':{width}s} {'pass':7s} {'ms':>8s} {'io ms':>8s} "
                   f"{'flop ms':>8s} {'of roofline':>11s}"]
    for r, case in zip(rows, cases):
        flop = f"{r['flop_ms']:8.3f}" if r["flop_ms"] is not None else f"{'-':>8s}"
        lines.append(f"{r.get('op', ''):24s} {r.get('B', ''):>3} {r.get('T', ''):>6} {case:{width}s} {r['pass']:7s} "
                     f"{r['ms']:8.3f} {r['io_ms']:8.3f} {flop} {r['of_roofline']:11.2f}")
    return "\n".join(lines)


def roofline_summary(families: dict) -> str:
    """Every family's distance from its roofline in one compact Markdown table (three columns, to
    fit a phone): per family and op, the range over the benchmark's shapes of ``of_roofline``
    (:func:`roofline_rows`; 1 is at the roofline) for the forward and for forward + backward, each
    marked with the floor that bounds it at most shapes (*bytes*: the copy's bandwidth; *products*:
    the matrix-multiply rate). ``families`` maps a family's name to its results (``None`` for a
    family with no file); families whose run predates the yardsticks are named under the table."""
    if not isinstance(families, dict):
        raise ValueError(f"families must be a dict of family name -> results (or None); got {type(families).__name__}")
    head = ["| op (family) | fwd | fwd + bwd |", "|:--|--:|--:|"]
    body, without = [], []
    for name, data in families.items():
        try:
            rows = roofline_rows(data) if data is not None else None
        except ValueError:
            rows = None
        if not rows:
            without.append(name)
            continue
        for op in dict.fromkeys(r.get("op") for r in rows):
            cells = []
            for pass_ in ("fwd", "fwdbwd"):
                sel = [r for r in rows if r.get("op") == op and r["pass"] == pass_]
                if not sel:
                    cells.append("—")
                    continue
                lo, hi = min(r["of_roofline"] for r in sel), max(r["of_roofline"] for r in sel)
                by_flops = sum(r["flop_ms"] is not None and r["flop_ms"] >= r["io_ms"] for r in sel)
                floor = "products" if 2 * by_flops > len(sel) else "bytes"
                span = f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}"
                cells.append(f"{span} ({floor})")
            body.append(f"| {_breakable(op)} ({name}) | {cells[0]} | {cells[1]} |")
    text = "\n".join(head + body) if body else "(no results file holds the roofline's yardsticks)"
    if without:
        text += ("\n\nNo yardsticks in the benchmark of record of: " + ", ".join(without)
                 + " (a run before the benchmarks measured them, or no file).")
    return text

