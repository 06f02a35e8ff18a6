"""The benchmark harness's pure-Python parts: ratios, tables and plots read from a results dict."""
import math

import matplotlib
matplotlib.use("Agg")
import pytest
import torch

from kernels.benchmarks import harness

ENV = {"device": "test", "date": "today", "torch": "x", "triton": "y", "fla": "z"}


def _data():
    recs = []
    for T, B in ((2048, 32), (8192, 8), (32768, 1)):
        for p, ours, peer in (("fwd", 1.0, 2.0), ("fwdbwd", 3.0, None)):
            recs.append({"impl": "ours", "op": "op_a", "B": B, "T": T, "pass": p, "ms": ours})
            recs.append({"impl": "fla", "op": "op_a", "B": B, "T": T, "pass": p, "ms": peer,
                         "note": None if peer else "RuntimeError: refused"})
    return {"name": "bench_test", "env": ENV, "config": {}, "records": recs}


def test_ratio_table_divides_and_reports_refusals():
    lines = harness.ratio_table(_data()).splitlines()
    assert len(lines) == 1 + 6
    fwd = [l for l in lines if " fwd " in l]
    assert all(l.split()[6] == "0.50" for l in fwd)          # 1.0 / 2.0
    bwd = [l for l in lines if "fwdbwd" in l]
    assert all("n/a" in l and "refused" in l for l in bwd)


def test_plot_results_separates_token_counts():
    ax = harness.plot_results(_data(), pass_="fwd")
    labels = sorted(l.get_label() for l in ax.get_lines())
    # B·T = 65536 for the first two shapes and 32768 for the B = 1 point: two series per impl.
    assert len(labels) == 4 and any("32768" in l for l in labels)


def test_err_ratio_is_rms_relative():
    ref = torch.ones(100, dtype=torch.float64)
    assert harness.err_ratio(ref * 1.01, ref) == pytest.approx(0.01)
    assert harness.err_ratio(torch.full((3,), float("nan")), torch.ones(3)) == math.inf
