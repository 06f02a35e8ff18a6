"""Each chapter's live experiment on seeds the book never uses: does every claim hold?

A chapter trains its experiment live on a CPU with one seed and asserts the claims it makes about
that run. A claim the book states must hold on other seeds too, so this module runs the same live
setting on a range of other seeds, checks each claim on each seed, and stores the verdicts with the
device, date and versions (``experiments/results/seeds_<name>.json``); the chapter reports how many
seeds every claim held in, and names the claims and seeds where one did not.

    python -m experiments.seed_sweep short_conv --seeds 21-40 --write

:data:`LIVE` names each experiment's live setting: the config and the ``run_seeds`` arguments of
the chapter's live cell (the chapters read their config from here, so the sweep and the cell cannot
drift apart). :func:`sweep` runs it, :func:`load_sweep` reads a stored one, :func:`sweep_lines`
says it in words and :func:`sweep_markdown` is what a chapter prints.
"""
from __future__ import annotations

import argparse
import importlib
import time

from kernels import results

from .common import RESULTS_DIR, failed_claims, stored_config

__all__ = ["LIVE", "live_config", "sweep", "load_sweep", "sweep_lines", "sweep_markdown", "main"]

#: experiment -> (module, the live cell's ``cpu_config`` changes, the live cell's ``jobs``)
LIVE = {
    "mqar": ("experiments.mqar", {}, 1),
    "extrapolation": ("experiments.extrapolation", {"threads": 1}, 3),
    "multihop": ("experiments.multihop", {"mixers": ("softmax2", "deltaformer", "deltaformer_free"), "threads": 1}, 3),
    "state_tracking": ("experiments.state_tracking", {}, 2),
    "regression": ("experiments.regression", {}, 1),
    "short_conv": ("experiments.short_conv", {}, 2),
}


def _entry(name: str):
    if name not in LIVE:
        raise ValueError(f"name must be one of {sorted(LIVE)}; got {name!r}")
    mod, changes, jobs = LIVE[name]
    return importlib.import_module(mod), changes, jobs


def live_config(name: str, **changes):
    """The config of the chapter's live cell for experiment ``name`` (``changes`` on top)."""
    mod, base, _ = _entry(name)
    return mod.cpu_config(**{**base, **changes})


def sweep(name: str, seeds, *, progress: bool = False) -> dict:
    """The live setting of ``name`` trained once per seed of ``seeds`` (``run_seeds(config, [seed])``
    with the live cell's ``jobs``), each run's claims checked. Returns ``{"config", "seeds",
    "records"}``, a record per seed: ``{"seed", "seconds", "claims": [{"claim", "holds",
    "measured"}]}``."""
    mod, _, jobs = _entry(name)
    cfg = live_config(name)
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"seeds must be distinct non-negative integers; got {seeds}")
    records = []
    for s in seeds:
        t0 = time.perf_counter()
        cl = mod.claims(mod.run_seeds(cfg, [s], jobs=jobs))
        records.append({"seed": s, "seconds": time.perf_counter() - t0,
                        "claims": [{k: c[k] for k in ("claim", "holds", "measured")} for c in cl]})
        if progress:
            bad = failed_claims(cl)
            print(f"seed {s}: {len(cl) - len(bad)} of {len(cl)} claims hold", flush=True)
    return {"config": stored_config(cfg), "seeds": seeds, "records": records}


def load_sweep(name: str) -> dict:
    """``experiments/results/seeds_<name>.json`` (``FileNotFoundError`` naming the command), with
    ``same_as_live``: whether it was run with the live setting the chapter has now."""
    path = RESULTS_DIR / f"seeds_{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"no seed sweep of {name} at {path}; run "
                                f"`python -m experiments.seed_sweep {name} --seeds 21-40 --write`")
    data = results.load_results(path)
    data["same_as_live"] = data["config"] == stored_config(live_config(name))
    return data


def sweep_lines(data: dict) -> list[str]:
    """A stored sweep in words: how many seeds every claim held in, then each claim that failed
    somewhere with its seeds and what was measured there."""
    recs = data["records"]
    seeds = [r["seed"] for r in recs]
    all_hold = [r["seed"] for r in recs if all(c["holds"] for c in r["claims"])]
    span = f"{min(seeds)}-{max(seeds)}" if seeds == list(range(min(seeds), max(seeds) + 1)) else \
        ", ".join(map(str, seeds))
    out = [f"seeds {span} ({len(seeds)} seeds the book's cells do not use): every claim held in "
           f"{len(all_hold)} of {len(seeds)}"]
    failed = {}
    for r in recs:
        for c in r["claims"]:
            if not c["holds"]:
                failed.setdefault(c["claim"], []).append((r["seed"], c["measured"]))
    for claim, where in failed.items():
        out.append(f"*{claim}* failed in {len(where)} of {len(seeds)} seeds: "
                   + "; ".join(f"seed {s} ({m})" for s, m in where))
    return out


def sweep_markdown(name: str) -> str:
    """What a chapter prints under its live claims: the stored sweep of ``name`` in words
    (:func:`sweep_lines`) with its device and date; or why there is none to show (no file, or one
    made with another live setting) and the command that makes it."""
    command = f"python -m experiments.seed_sweep {name} --seeds 21-40 --write"
    try:
        data = load_sweep(name)
    except FileNotFoundError:
        return f"No stored seed sweep of this experiment in this copy of the book (`{command}` makes it)."
    if not data["same_as_live"]:
        return (f"The stored seed sweep was made with another live setting than this page's; `{command}` "
                "makes it anew.")
    lines = sweep_lines(data)
    env = data["env"]
    return (f"**The same claims on other seeds** (stored: {env['device']}, {env['date'][:10]}, torch "
            f"{env['torch']}): " + lines[0] + "." + "".join(f"\n- {line}." for line in lines[1:]))


def _seeds_arg(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    return out


def main(argv=None) -> int:
    """``python -m experiments.seed_sweep NAME --seeds 21-40 [--write]``."""
    p = argparse.ArgumentParser(prog="python -m experiments.seed_sweep", description=__doc__.splitlines()[0])
    p.add_argument("name", choices=sorted(LIVE))
    p.add_argument("--seeds", type=_seeds_arg, default=list(range(21, 41)),
                   help="seeds as 21-40 or 21,23,30-32 (default 21-40)")
    p.add_argument("--write", action="store_true", help="store the sweep in experiments/results/")
    args = p.parse_args(argv)
    out = sweep(args.name, args.seeds, progress=True)
    for line in sweep_lines(out):
        print(line)
    if args.write:
        print("wrote", results.write_results(RESULTS_DIR / f"seeds_{args.name}.json", f"seeds_{args.name}",
                                              out["config"], out["records"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
