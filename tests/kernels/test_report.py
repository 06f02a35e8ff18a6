"""The benchmark reporting of the book (kernels.report) and the harness's error measure, on a
results dict built here: ratios, goals, refusals and plots are read from the records, not typed."""
import math

import matplotlib
matplotlib.use("Agg")
import pytest
import torch

from kernels import harness, report, results

ENV = {"device": "test", "date": "today", "torch": "x", "triton": "y", "fla": "z"}


def _data():
    recs = []
    for T, B in ((2048, 32), (8192, 8), (32768, 1)):
        for gates in ("float32", "input dtype"):
            for p, ours, peer in (("fwd", 1.0, 2.0), ("fwdbwd", 3.0, None)):
                recs.append({"impl": "ours", "op": "op_a", "B": B, "T": T, "gates": gates, "pass": p, "ms": ours,
                             "err": {"o": 1e-3}})
                recs.append({"impl": "fla", "op": "op_a", "B": B, "T": T, "gates": gates, "pass": p, "ms": peer,
                             "note": None if peer else "RuntimeError: refused"})
    return {"name": "bench_test", "env": ENV, "config": {"goals": {"fwd": 0.4, "fwdbwd": 1.0}}, "records": recs}


def test_ratio_table_divides_marks_goals_and_reports_refusals():
    table = report.ratio_table(_data())
    lines = table.splitlines()
    assert max(map(len, lines)) <= report.WIDTH              # fits the book's text column
    assert lines[0] == "op_a: our time / fla's (goals: fwd <= 0.4, fwdbwd <= 1)"
    assert "gates" in lines[1] and len(lines) == 2 + 12       # the varying field gets a column
    fwd = [l for l in lines[2:] if " fwd " in l]
    assert len(fwd) == 6 and all("0.50" in l and "NOT met" in l for l in fwd)   # 1.0 / 2.0 > 0.4
    bwd = [l for l in lines[2:] if "fwdbwd" in l]
    assert all("n/a" in l and "no fla time" in l for l in bwd)
    rows = report.ratio_rows(_data())
    assert {r["ratio"] for r in rows if r["pass"] == "fwd"} == {0.5}
    assert all(r["note"] == "RuntimeError: refused" for r in rows if r["pass"] == "fwdbwd")


def test_plot_results_keeps_colours_and_marks_the_long_sequence():
    """One line per implementation and gate dtype in both passes, in the same colour in both figures
    (the fwdbwd figure lacks fla's series: a colour must not shift); the B = 1 point (another token
    count) is a hollow marker of its series, not a series of its own."""
    data = _data()
    colors = report.series_colors(data)
    lines = {}
    for p in ("fwd", "fwdbwd"):
        ax = report.plot_results(data, pass_=p, colors=colors)
        drawn = {l.get_label(): l for l in ax.get_lines() if not l.get_label().startswith("_")}
        lines[p] = {k: v.get_color() for k, v in drawn.items() if not k.startswith("hollow")}
        assert "hollow: one long sequence (B = 1)" in drawn
        full = [l for l in ax.get_lines() if l.get_label() == "ours, float32"][0]
        assert len(full.get_xdata()) == 2          # the two shapes with B·T = 65536 joined; B = 1 apart
    assert set(lines["fwd"]) == {"ours, float32", "ours, input dtype", "fla, float32", "fla, input dtype"}
    assert set(lines["fwdbwd"]) == {"ours, float32", "ours, input dtype"}
    assert all(lines["fwdbwd"][k] == lines["fwd"][k] for k in lines["fwdbwd"])


def test_show_benchmark_prints_env_table_errors_refusals(capsys):
    data = report.show_benchmark(_data(), plot=False)
    out = capsys.readouterr().out
    assert data is not None and "measured on test, today" in out and "NOT met" in out
    assert "largest RMS error ratio vs float64, ours: o 1.00e-03" in out
    assert "fla recorded no time: RuntimeError: refused" in out
    assert report.show_benchmark("no_such_family") is None


def test_show_benchmark_several_peers_marks_goals_only_against_fla(capsys):
    """Chapter 1 divides our time by SDPA's and by fla's: one table per peer; the stored goals (our
    time over fla's) are marked in fla's table only, and the errors are reported per op."""
    data = _data()
    extra = [dict(r, impl="sdpa", ms=0.5 if r["pass"] == "fwd" else None, err={"o": 2e-3},
                  note=None if r["pass"] == "fwd" else "skipped")
             for r in data["records"] if r["impl"] == "ours"]
    # the longest shape is another op, so that the errors are reported per implementation and op
    data = dict(data, records=[dict(r, op="op_b") if r["T"] == 32768 else r for r in data["records"] + extra])
    assert all(r["goal"] is None for r in report.ratio_rows(data, peer="sdpa"))
    assert {r["goal"] for r in report.ratio_rows(data, peer="fla")} == {0.4, 1.0}
    report.show_benchmark(data, peer=("sdpa", "fla"), plot=False)
    out = capsys.readouterr().out
    sdpa_part, fla_part = out.split("our time over sdpa's:")[1].split("our time over fla's:")
    assert "goal" not in sdpa_part.split("largest")[0] and "2.00" in sdpa_part      # 1.0 / 0.5, no goal
    assert "NOT met" in fla_part and "0.50" in fla_part
    assert "largest RMS error ratio vs float64, ours, op_a: o 1.00e-03" in out       # several ops: per op
    assert "largest RMS error ratio vs float64, sdpa, op_b: o 2.00e-03" in out
    assert "sdpa recorded no time: skipped" in out and "fla recorded no time: RuntimeError: refused" in out


def test_err_ratio_is_rms_relative():
    ref = torch.ones(100, dtype=torch.float64)
    assert harness.err_ratio(ref * 1.01, ref) == pytest.approx(0.01)
    assert harness.err_ratio(torch.full((3,), float("nan")), torch.ones(3)) == math.inf


@pytest.mark.parametrize("family", ["flash", "gla", "delta"])
def test_stored_results_have_env_goals_and_fla(family):
    """Every family's benchmark of record is in the repository, with its device and versions, its
    goals, and fla side by side (a time or a recorded refusal for every fla record)."""
    data = results.load_results(family)
    assert {"device", "date", "torch", "triton", "fla"} <= set(data["env"])
    assert data["config"]["goals"]
    fla = [r for r in data["records"] if r["impl"] == "fla"]
    assert fla and all(isinstance(r.get("ms"), float) or r.get("note") for r in fla)


@pytest.mark.parametrize("family", ["flash", "gla", "delta"])
def test_bench_command_line(family, capsys, monkeypatch):
    """Each family's benchmark of record parses its command line, refuses unknown ops, and on a machine
    without a GPU says where the stored results are instead of timing anything."""
    import importlib
    bench = importlib.import_module(f"kernels.{family}.bench")
    if family != "flash":
        with pytest.raises(SystemExit, match="--ops"):
            harness.bench_main(["--ops", "no_such_op"], bench)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert harness.bench_main(["--quick"], bench) == 2
    assert f"show_benchmark('{family}')" in capsys.readouterr().out
    cases = bench.cases(quick=True)
    assert cases and all({"op", "B", "T"} <= set(c) for c in cases)


def test_goal_verdicts_and_their_sentences():
    """The verdicts the chapters state: per op and pass, which shapes meet the stored goal, which
    miss it, where fla has no time; and one sentence each, built from them."""
    data = _data()
    v = report.goal_verdicts(data)
    assert [(x["op"], x["pass"], x["goal"]) for x in v] == [("op_a", "fwd", 0.4), ("op_a", "fwdbwd", 1.0)]
    fwd, bwd = v
    assert not fwd["met"] and len(fwd["missed"]) == 6 and not fwd["untimed"]
    assert not (bwd["met"] or bwd["missed"]) and len(bwd["untimed"]) == 6
    s = report.describe_verdicts(v)
    assert s[0].startswith("op_a, forward (goal: our time at most 0.4 x fla's): not met at B = 32")
    assert "(ratio 0.50)" in s[0]
    assert s[1].endswith("no fla time at any shape (fla recorded: RuntimeError: refused).")
    only_long = report.goal_verdicts(data, select=lambda r: r["B"] == 1)
    assert {(r["B"], r["T"]) for r in only_long[0]["missed"]} == {(1, 32768)}


def test_goal_verdicts_without_a_goal_keep_every_ratio():
    """Against a peer the goals are not set for (SDPA), nothing is met or missed, every ratio is
    kept in ``timed``."""
    v = report.goal_verdicts(_data(), peer="fla")
    data = dict(_data(), config={})                       # a file without goals
    (fwd, _) = report.goal_verdicts(data)
    assert fwd["goal"] is None and not (fwd["met"] or fwd["missed"]) and len(fwd["timed"]) == 6
    assert len(v[0]["timed"]) == 6


def test_goals_per_peer_and_op():
    """A file may set goals per peer, op and pass (flash: against SDPA and against fla, FoX only
    against fla); each is marked in its own peer's table and nowhere else."""
    data = _data()
    data["records"] += [dict(r, op="op_b") for r in data["records"]]
    data["config"]["goals"] = {"by_peer": {"sdpa": {"op_a": {"fwd": 1.1}},
                                           "fla": {"op_a": {"fwdbwd": 0.7}, "op_b": {"fwd": 0.75}}}}
    assert report.stored_goal(data, "sdpa", "op_a", "fwd") == 1.1
    assert report.stored_goal(data, "sdpa", "op_b", "fwd") is None
    assert report.stored_goal(data, "fla", "op_a", "fwd") is None
    fla = {(r["op"], r["pass"]): r["goal"] for r in report.ratio_rows(data, peer="fla")}
    assert fla[("op_a", "fwdbwd")] == 0.7 and fla[("op_b", "fwd")] == 0.75 and fla[("op_a", "fwd")] is None
    sdpa = [dict(r, impl="sdpa") for r in data["records"] if r["impl"] == "fla"]
    data["records"] += sdpa
    assert {(r["op"], r["pass"]): r["goal"] for r in report.ratio_rows(data, peer="sdpa")}[("op_a", "fwd")] == 1.1


def test_plot_tradeoff_one_line_per_implementation_in_sweep_order():
    """Each implementation's points are its records of the op and pass, ordered by the swept
    parameter, at (ms, err[err_key]); other ops, passes and records without a time are left out."""
    import matplotlib.pyplot as plt
    recs = [dict(op="s", impl=i, cg=c, **{"pass": p}, ms=m, err={"o": e})
            for i, c, p, m, e in [("ours", 10, "fwd", 2.0, 0.1), ("ours", 5, "fwd", 1.0, 0.3),
                                  ("fla", 5, "fwd", 1.5, 0.4), ("fla", 10, "fwdbwd", 9.0, 0.2),
                                  ("fla", 20, "fwd", None, 0.1)]]
    recs.append(dict(op="other", impl="ours", cg=1, **{"pass": "fwd"}, ms=0.5, err={"o": 0.9}))
    ax = report.plot_tradeoff({"records": recs}, op="s", param="cg")
    lines = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.get_lines()}
    assert lines == {"ours": ([1.0, 2.0], [0.3, 0.1]), "fla": ([1.5], [0.4])}
    plt.close("all")


def test_goal_table_is_one_row_per_shape_with_both_passes():
    """The appendix's compact table: a Markdown table of three columns, a row naming each op, its
    peer and goals, then one row per shape, the forward and the forward + backward side by side, each
    ratio marked against its goal; the shape names only the fields that vary; a block where the peer
    never has a time is left out."""
    table = report.goal_table(_data())
    lines = table.splitlines()
    assert lines[0] == "| shape (B × T) | fwd | fwd + bwd |"
    assert lines[2] == "| **op_a** over fla (goals: fwd ≤ 0.4, fwd + bwd ≤ 1) | | |"
    body = lines[3:]
    assert len(body) == 6                                   # 3 shapes x 2 gate dtypes, passes side by side
    assert body[0] == "| 32 × 2,048, gates float32 | 0.50 **not met** | — |"      # 1.0 / 2.0 > 0.4; no fla bwd
    assert all("0.50 **not met**" in l and l.endswith("| — |") for l in body)
    sdpa = [dict(r, impl="sdpa") for r in _data()["records"] if r["impl"] == "fla"]
    two = dict(_data(), records=_data()["records"] + sdpa)
    rows = report.goal_table(two, peer=("sdpa", "fla")).splitlines()[2:]
    assert len(rows) == 14 and rows[0] == "| **op_a** over sdpa | | |"      # no goal against sdpa
    assert rows[1].endswith("| 0.50 | — |") and "over fla (goals" in rows[7]
    none = dict(_data(), records=[r for r in _data()["records"] if r["impl"] == "ours"])
    assert report.goal_table(none) == "(no records with both times)"


def test_show_family_prints_two_lines_and_one_figure(capsys, monkeypatch):
    """The compact form: the device line (wrapped), one stacked figure with one legend below, and
    the rest as one Markdown block (the table, the largest errors, the refusals)."""
    import matplotlib.pyplot as plt
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *a, **k: shown.extend(a))
    plt.close("all")
    figs = []
    monkeypatch.setattr(plt, "show", lambda *a, **k: figs.extend(plt.get_fignums()))
    data = report.show_family(_data())
    out = capsys.readouterr().out
    assert data is not None and out.strip().startswith("measured on test, today") and len(out.splitlines()) <= 2
    assert len(figs) == 1
    fig = plt.figure(figs[0])
    assert len(fig.axes) == 2 and all(ax.get_legend() is None for ax in fig.axes) and len(fig.legends) == 1
    assert fig.get_size_inches()[0] <= 7.5
    md = shown[0].data
    assert "| **op_a** over fla" in md and "ours 1.0e-03 (o)" in md and "fla: RuntimeError: refused" in md
    assert report.show_family("no_such_family") is None


def test_plot_bars_one_bar_per_impl_and_shape():
    recs = [{"impl": i, "op": "c", "B": 1, "T": T, "pass": p, "ms": 1.0, "copy_fraction": f}
            for i, f in (("ours", 0.8), ("fla", 0.5)) for T in (8, 16) for p in ("fwd", "fwdbwd")]
    ax = report.plot_bars({"records": recs}, value="copy_fraction")
    assert len(ax.patches) == 8 and len(ax.get_yticklabels()) == 4
    assert {round(b.get_width(), 2) for b in ax.patches} == {0.8, 0.5}
    assert ax.get_xlabel() == "copy fraction"


def test_io_bytes_counts_inputs_output_and_gradients():
    """The forward reads every input and writes the output; forward + backward also reads the inputs
    again and the output's gradient, and writes the named gradients. Exact byte counts."""
    x = {"q": torch.zeros(2, 8, 3, 4, dtype=torch.bfloat16), "g": torch.zeros(2, 8, 3),    # 384 B, 192 B
         "v": torch.zeros(2, 8, 3, 5, dtype=torch.bfloat16)}                                # 480 B
    o = torch.zeros(2, 8, 3, 5, dtype=torch.bfloat16)                                        # 480 B
    assert harness.io_bytes("fwd", x, o) == 384 + 192 + 480 + 480
    assert harness.io_bytes("fwdbwd", x, o, ("q", "v")) == 2 * (384 + 192 + 480 + 480) + 384 + 480
    with pytest.raises(ValueError, match="pass_ must be"):
        harness.io_bytes("bwd", x, o)
    with pytest.raises(ValueError, match="grad_names must name inputs"):
        harness.io_bytes("fwdbwd", x, o, ("k",))


def test_roofline_rows_take_the_larger_floor():
    """Time to move the bytes at the copy's bandwidth against time of the operations at the matmul
    rate: the larger is the floor, and its share of the measured time is ``of_roofline``; records of
    other implementations or without the fields give no row; a file without the yardsticks raises."""
    recs = [{"impl": "ours", "op": "a", "B": 1, "T": 64, "D": 8, "pass": "fwd", "ms": 2.0, "io_bytes": 1e9},  # io 1 ms
            {"impl": "ours", "op": "b", "B": 1, "T": 64, "pass": "fwd", "ms": 4.0, "io_bytes": 1e6,
             "tflops": 250.0},                                                   # 1e12 operations: 2 ms at 500
            {"impl": "fla", "op": "a", "B": 1, "T": 64, "pass": "fwd", "ms": 1.0, "io_bytes": 1e9},
            {"impl": "ours", "op": "c", "B": 1, "T": 64, "pass": "fwd", "ms": 1.0}]
    data = {"name": "t", "env": ENV, "config": {"copy_gbps": 1000.0, "bf16_matmul_tflops": 500.0}, "records": recs}
    rows = report.roofline_rows(data)
    assert [r["op"] for r in rows] == ["a", "b"]
    assert rows[0]["io_ms"] == pytest.approx(1.0) and rows[0]["flop_ms"] is None
    assert rows[0]["of_roofline"] == pytest.approx(0.5)
    assert rows[1]["flop_ms"] == pytest.approx(2.0) and rows[1]["bound_ms"] == pytest.approx(2.0)
    assert rows[1]["of_roofline"] == pytest.approx(0.5)
    text = report.roofline_table(data)
    assert "copy 1000 GB/s" in text and len(text.splitlines()) == 4
    assert " D=8 " in text.splitlines()[2]        # the fields that tell records apart
    with pytest.raises(ValueError, match="copy_gbps"):
        report.roofline_rows({"config": {}, "records": recs})


def test_roofline_summary_ranges_and_floors():
    """One row per family and op: the range of ``of_roofline`` over shapes per pass, marked with the
    floor that bounds most of them; a family without the yardsticks (or without a file) is named
    under the table, not dropped silently."""
    recs = [{"impl": "ours", "op": "a", "B": 1, "T": 64, "pass": "fwd", "ms": 2.0, "io_bytes": 1e9},   # 0.50, bytes
            {"impl": "ours", "op": "a", "B": 2, "T": 64, "pass": "fwd", "ms": 4.0, "io_bytes": 1e9},   # 0.25, bytes
            {"impl": "ours", "op": "a", "B": 1, "T": 64, "pass": "fwdbwd", "ms": 4.0, "io_bytes": 1e6,
             "tflops": 250.0}]                                                    # 2 ms of products: 0.50
    good = {"config": {"copy_gbps": 1000.0, "bf16_matmul_tflops": 500.0}, "records": recs}
    text = report.roofline_summary({"fam": good, "old": {"config": {}, "records": recs}, "none": None})
    lines = text.splitlines()
    assert lines[2] == "| a (fam) | 0.25–0.50 (bytes) | 0.50 (products) |"
    assert lines[-1].startswith("No yardsticks in the benchmark of record of: old, none")
    assert report.roofline_summary({"old": None}).startswith("(no results file")
    with pytest.raises(ValueError, match="families must be a dict"):
        report.roofline_summary([good])


def test_measure_device_needs_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        harness.measure_device()
