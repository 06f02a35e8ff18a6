"""Shared benchmark machinery: environment record, timing, error ratios, results JSON, plots.

Every benchmark writes ``kernels/results/<name>.json``::

    {"name": ..., "env": {device, date, torch, triton, fla, cuda, python}, "config": {...},
     "records": [{"impl": ..., "T": ..., "B": ..., "pass": "fwd"|"fwdbwd", "ms": median ms,
                  "err": {...}, "note": ...}, ...]}

and the book reads those files (``load_results``/``plot_results``): no measured number is typed by hand.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import platform
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"

__all__ = ["RESULTS_DIR", "environment", "bench_ms", "err_ratio", "write_results", "load_results",
           "plot_results", "results_table", "ratio_table"]


def environment() -> dict:
    """Device name, date and library versions, recorded next to every measurement."""
    import torch
    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
    }
    try:
        import triton
        env["triton"] = triton.__version__
    except Exception:
        env["triton"] = None
    try:
        from importlib.metadata import version
        env["fla"] = version("fla-core")
    except Exception:
        env["fla"] = None
    return env


def bench_ms(fn, *, warmup: int = 25, rep: int = 100) -> float:
    """Median time of ``fn()`` in milliseconds, with CUDA events (``triton.testing.do_bench``)."""
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def err_ratio(x, ref) -> float:
    """fla's error measure: RMS(x − ref) / RMS(ref), computed in float64."""
    import torch
    x = x.detach().to(torch.float64)
    ref = ref.detach().to(torch.float64)
    if not torch.isfinite(x).all():
        return float("inf")
    num = torch.sqrt(torch.mean((x - ref) ** 2)).item()
    den = torch.sqrt(torch.mean(ref ** 2)).item()
    return num / den if den > 0 else num


def write_results(name: str, config: dict, records: list, env: dict | None = None) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {"name": name, "env": env or environment(), "config": config, "records": records}
    path.write_text(json.dumps(payload, indent=1, sort_keys=False, default=float) + "\n")
    return path


def load_results(name: str) -> dict:
    """Load ``kernels/results/<name>.json`` (raises ``FileNotFoundError`` naming the benchmark)."""
    path = RESULTS_DIR / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"no stored results for benchmark {name!r} at {path}; run "
                                f"`python -m kernels.benchmarks.{name}` on a GPU to create them")
    return json.loads(path.read_text())


def results_table(data: dict, *, x: str = "T", pass_: str | None = None):
    """Rows ``(x, impl, pass, ms, err)`` of a results dict, for display."""
    rows = []
    for r in data["records"]:
        if pass_ is not None and r.get("pass") != pass_:
            continue
        rows.append((r.get(x), r["impl"], r.get("pass"), r.get("ms"), r.get("err"), r.get("note")))
    return rows


def _series_key(r: dict, many_ops: bool, many_tokens: bool) -> str:
    key = r["impl"]
    if many_ops and r.get("op") is not None:
        key = f"{r['op']}: {key}"
    if many_tokens and r.get("B") is not None and r.get("T") is not None:
        key += f" (B·T = {r['B'] * r['T']})"
    return key


def plot_results(data: dict, *, x: str = "T", pass_: str | None = None, ax=None, title: str | None = None):
    """Median ms vs ``x`` per implementation (log-log), captioned with device, date and versions.

    One line per implementation, and per op and per token count ``B·T`` when a file mixes several
    (e.g. the ``B = 1`` long-sequence point is its own series).
    """
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    recs = [r for r in data["records"] if (pass_ is None or r.get("pass") == pass_)
            and isinstance(r.get("ms"), (int, float)) and math.isfinite(r["ms"])]
    many_ops = len({r.get("op") for r in recs}) > 1
    many_tokens = len({(r.get("B") or 0) * (r.get("T") or 0) for r in recs}) > 1
    series: dict = {}
    for r in recs:
        series.setdefault(_series_key(r, many_ops, many_tokens), []).append((r[x], r["ms"]))
    for name, pts in series.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel("median time (ms)")
    env = data["env"]
    ax.set_title(title or data["name"])
    ax.legend(fontsize=7)
    ax.text(0.0, -0.2, f"{env['device']}, {env['date']}; torch {env['torch']}, triton {env['triton']}, "
            f"fla {env['fla']}", transform=ax.transAxes, fontsize=7, va="top")
    return ax


def ratio_table(data: dict, *, ours: str = "ours", peer: str = "fla") -> str:
    """A text table of our median time over the peer's, per (op, B, T, pass), from a results dict.

    Where the peer has no time (it refused or failed), the ratio column says so and the note is
    shortened into the last column.
    """
    rows = {}
    for r in data["records"]:
        if r.get("impl") not in (ours, peer):
            continue
        key = (r.get("op", data["name"]), r.get("B"), r.get("T"), r.get("pass"))
        rows.setdefault(key, {})[r["impl"]] = r
    lines = [f"{'op':<18}{'B':>4}{'T':>7}  {'pass':<7}{ours + ' ms':>10}{peer + ' ms':>10}{'ratio':>8}  note"]
    for (op, B, T, p), d in rows.items():
        a, b = d.get(ours, {}).get("ms"), d.get(peer, {}).get("ms")
        ratio = f"{a / b:.2f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "n/a"
        note = (d.get(peer, {}).get("note") or "") if ratio == "n/a" else ""
        fmt = lambda v: f"{v:.3f}" if isinstance(v, (int, float)) else "—"
        lines.append(f"{str(op):<18}{str(B):>4}{str(T):>7}  {str(p):<7}{fmt(a):>10}{fmt(b):>10}{ratio:>8}  {note[:70]}")
    return "\n".join(lines)
