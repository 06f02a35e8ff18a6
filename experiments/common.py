"""What the experiments share: input checks, CPU threads, per-run seeds, loss windows, stored runs.

Each experiment (:mod:`experiments.mqar`, :mod:`experiments.extrapolation`, ...) trains small models once
per seed with a configuration dataclass that has ``as_dict()`` and a ``gpu_config()``; its GPU runs
live in ``experiments/results/<name>.json`` with the device, date and library versions
(:func:`kernels.results.write_results`).
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn

__all__ = ["RESULTS_DIR", "TrainConfig", "mlp_block", "residual_stack", "fit", "check_int", "check_seeds", "torch_threads", "derived_seeds", "window_means",
           "summarize_seeds", "train_each", "map_jobs", "run_each_seed", "load_stored_runs", "merge_stored",
           "seeds_cli", "MODEL_COLORS", "MODEL_NAMES", "claim", "failed_claims", "assert_claims", "claims_markdown",
           "loss_curves", "TunedConfig", "stored_config", "tune_then_seeds", "seed_records", "grid_rows", "load_tuned",
           "merge_tuned", "tuned_cli", "run_grid_and_seeds", "grid_lines", "load_current", "tune_and_run"]

RESULTS_DIR = Path(__file__).resolve().parent / "results"

#: The colour of each model, from the book's one palette (lattn_core.palette), and the name a figure
#: or a sentence gives each model.
from lattn_core.palette import color_of  # noqa: E402
MODEL_COLORS = {m: color_of(m) for m in ("linear", "decay", "deltanet", "gated_deltanet", "mesanet")}
MODEL_NAMES = {"linear": "linear attention", "decay": "decay", "deltanet": "DeltaNet",
               "gated_deltanet": "Gated DeltaNet", "mesanet": "MesaNet"}


@dataclass(frozen=True)
class TrainConfig:
    """The training settings every experiment's configuration shares (each subclasses it, adds its
    task and model fields and overrides the defaults it trains with)."""

    steps: int = 600
    batch: int = 32
    lr: float = 3e-3
    weight_decay: float = 0.01
    eval_batch: int = 256
    seed: int = 0
    threads: int | None = 2
    device: str = "cpu"

    def as_dict(self) -> dict:
        return asdict(self)


def mlp_block(d_model: int, width: int = 4) -> nn.Sequential:
    """The experiments' feed-forward block: LayerNorm, ``d_model -> width * d_model``, GELU, back."""
    return nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, width * d_model), nn.GELU(),
                         nn.Linear(width * d_model, d_model))


def residual_stack(x, norms, mixers, mlps):
    """The pre-norm residual stack: per layer ``x + mixer(norm(x))``, then ``x + mlp(x)`` (the MLP
    block carries its own norm)."""
    for norm, mix, mlp in zip(norms, mixers, mlps):
        x = x + mix(norm(x))
        x = x + mlp(x)
    return x


def fit(model, cfg, batch_loss, *, progress=None, label: dict | None = None, log_every: int = 25):
    """The experiments' training loop: AdamW (``cfg.lr``, ``cfg.weight_decay``), a one-cycle schedule
    warming up over the first 10 % of ``cfg.steps`` (a constant rate below 20 steps: PyTorch's
    schedule divides by zero when its warm-up ends at step 0), gradients clipped at norm 1.
    ``batch_loss(step)`` draws step ``step``'s batch and returns its loss. ``progress``: an optional
    tqdm bar, advanced every step, its postfix ``label`` plus the loss every ``log_every`` steps.
    Returns ``(losses, seconds)``."""
    import time
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = (torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.steps, pct_start=0.1)
             if cfg.steps >= 20 else None)
    kept = []                  # the losses stay on the device until the end: no wait for it per step
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        loss = batch_loss(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if sched is not None:
            sched.step()
        kept.append(loss.detach())
        if progress is not None:
            progress.update(1)
            if log_every and step % log_every == 0:
                progress.set_postfix(**(label or {}), loss=f"{float(kept[-1]):.3f}")
    losses = torch.stack(kept).float().cpu().tolist() if kept else []
    return losses, time.perf_counter() - t0


def check_int(x, name: str, low: int) -> int:
    """``x`` if it is an integer ``>= low`` (not a bool); else ``ValueError`` naming ``name``."""
    if isinstance(x, bool) or not isinstance(x, int) or x < low:
        raise ValueError(f"{name} must be an integer >= {low}; got {x!r}")
    return x


def check_seeds(seeds) -> list:
    """``seeds`` as a list, if it is a non-empty list of distinct integers; else ``ValueError``."""
    seeds = list(seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds) \
            or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be a non-empty list of distinct integers; got {seeds!r}")
    return seeds


@contextlib.contextmanager
def torch_threads(n):
    """Run with ``n`` PyTorch CPU threads (``None``: leave as is), restoring the old setting after."""
    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(old)


def derived_seeds(seed: int, eval_offset: int) -> tuple[int, int, int]:
    """Deterministic seeds for (model init, training data, evaluation data) from one ``seed``. None
    depends on the model compared, so every model starts from the same seed, sees the same training
    stream and is scored on the same evaluation batches. ``eval_offset`` keeps the evaluation stream
    apart from the training stream (each experiment fixes its own, so stored runs reproduce)."""
    base = 1_000_003 * int(seed)
    return int(seed), base + 1, base + eval_offset


def window_means(x: list, w: int) -> list:
    """Means of ``x`` over consecutive windows of ``w`` (the last may be shorter)."""
    return [float(sum(x[i:i + w]) / len(x[i:i + w])) for i in range(0, len(x), w)]


def train_each(cfg, names, key: str, train_model, *, keep_models: bool = False, loss_every: int = 10,
               progress: bool = False) -> dict:
    """One seed of an experiment: ``train_model(name, cfg[, progress=bar])`` for every model
    ``name`` in ``names`` (a record with ``"model"`` and ``"losses"``). Returns ``{"config",
    "records", "accuracy": {name: record["accuracy"]}, "seconds"}``; each record gains ``seed``,
    ``final_loss`` (the mean of the last 20 losses) and ``losses`` as window means of
    ``loss_every`` steps, under ``key`` its name; the models under ``"models"`` with
    ``keep_models``. ``progress``: one tqdm bar over every model's steps."""
    import time
    check_int(loss_every, "loss_every", 1)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=cfg.steps * len(names), desc=f"seed {cfg.seed}", unit="step", mininterval=0.5)
    t0 = time.perf_counter()
    records, models = [], {}
    try:
        for name in names:
            r = train_model(name, cfg, progress=bar) if progress else train_model(name, cfg)
            models[name] = r.pop("model")
            tail = r["losses"][-20:]
            r.update(seed=cfg.seed, final_loss=float(sum(tail) / len(tail)),
                     losses=window_means(r["losses"], loss_every))
            records.append(r)
    finally:
        if bar is not None:
            bar.close()
    out = {"config": cfg.as_dict(), "records": records,
           "accuracy": {r[key]: r["accuracy"] for r in records},
           "seconds": time.perf_counter() - t0}
    if keep_models:
        out["models"] = models
    return out


def map_jobs(fn, work, jobs: int = 1) -> list:
    """``[fn(w) for w in work]``, ``jobs`` at a time: each call in its own process when ``jobs > 1``
    (spawned, since CUDA cannot be used in a forked child; ``fn`` must then be a module-level
    function and ``work`` and the results picklable). A GPU is shared by the processes, so times
    measured inside them are those of concurrent runs."""
    check_int(jobs, "jobs", 1)
    work = list(work)
    if jobs == 1 or len(work) <= 1:
        return [fn(w) for w in work]
    import concurrent.futures as cf
    import multiprocessing as mp
    with cf.ProcessPoolExecutor(max_workers=min(jobs, len(work)), mp_context=mp.get_context("spawn")) as ex:
        return list(ex.map(fn, work))


def run_each_seed(config, seeds, run_one, *, jobs: int = 1, split: str | None = None) -> dict:
    """``run_one(config with seed s)`` for every seed. Returns ``{"config" (with "seeds" in place
    of "seed"), "records" (all seeds'), "seconds": {seed: seconds}}``.

    With ``split``, the name of the config's tuple of models (e.g. ``"variants"``), each seed runs
    as one piece per model (``config`` with ``split=(model,)``), which gives the same records
    provided ``run_one`` seeds every model alike; ``jobs > 1`` runs the pieces in that many
    processes (:func:`map_jobs`; ``run_one`` module-level) and stores ``jobs`` in the config. A
    seed's ``seconds`` is then the sum of its pieces'."""
    from dataclasses import replace
    seeds = check_seeds(seeds)
    check_int(jobs, "jobs", 1)
    if jobs > 1 and split is None:
        raise ValueError("jobs > 1 needs split, the config field that names the models")
    pieces = [(s, replace(config, seed=s)) for s in seeds]
    if split is not None:
        pieces = [(s, replace(c, **{split: (m,)})) for s, c in pieces for m in getattr(config, split)]
    runs = map_jobs(run_one, [c for _, c in pieces], jobs)
    records, seconds = [], {}
    for (s, _), run in zip(pieces, runs):
        records += run["records"]
        seconds[s] = seconds.get(s, 0.0) + run["seconds"]
    cfg = config.as_dict()
    cfg.pop("seed")
    cfg["seeds"] = seeds
    if jobs > 1:
        cfg["jobs"] = min(jobs, len(pieces))
    return {"config": cfg, "records": records, "seconds": seconds}


def summarize_seeds(records: list[dict], model_key: str, x_key: str, value_key: str = "accuracy",
                    higher_is_better: bool = True) -> dict:
    """Per model (``record[model_key]``), over the seeds of ``records``: the mean, smallest and
    largest ``record[value_key]`` (default ``accuracy``) at each point of ``record[x_key]``, and per
    point in how many seeds each model came first (the highest value, or the lowest with
    ``higher_is_better=False``; ties count for every model that shares the best). Returns
    ``{x_key, "seeds", "mean", "min", "max", "first"}``, the last four keyed by model."""
    if not records:
        raise ValueError("records must hold at least one record")
    xs = records[0][x_key]
    if any(r[x_key] != xs for r in records):
        raise ValueError(f"records must all be scored at the same {x_key}")
    seeds = sorted({r.get("seed", 0) for r in records})
    models = list(dict.fromkeys(r[model_key] for r in records))
    acc = {}
    for r in records:
        acc.setdefault(r[model_key], {})[r.get("seed", 0)] = r[value_key]
    for m in models:
        if sorted(acc[m]) != seeds:
            raise ValueError(f"records must hold every seed for every {model_key}; {m!r} has seeds "
                             f"{sorted(acc[m])}")
    out = {x_key: list(xs), "seeds": seeds, "mean": {}, "min": {}, "max": {},
           "first": {m: [0] * len(xs) for m in models}}
    for m in models:
        cols = list(zip(*(acc[m][s] for s in seeds)))          # one tuple of seeds per point
        out["mean"][m] = [sum(c) / len(c) for c in cols]
        out["min"][m] = [min(c) for c in cols]
        out["max"][m] = [max(c) for c in cols]
    pick = max if higher_is_better else min
    for s in seeds:
        for i in range(len(xs)):
            best = pick(acc[m][s][i] for m in models)
            for m in models:
                out["first"][m][i] += acc[m][s][i] == best
    return out


def load_stored_runs(name: str, gpu_config, command: str, ignore=("seeds",)) -> dict:
    """The stored runs ``experiments/results/<name>.json`` (``env``, ``config``, ``records``) with
    ``same_as_gpu_config``: whether they were run with the settings ``gpu_config()`` has now (the
    seed and the ``ignore`` fields aside, on both sides: a run with a learning-rate grid stores
    the chosen ``lr`` per model in place of the one rate). ``FileNotFoundError`` naming ``command`` (what writes
    them) when this copy has none."""
    from kernels import results
    path = RESULTS_DIR / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"no stored runs at {path}; run `{command}` on a GPU to create them")
    data = results.load_results(path)
    want = json.loads(json.dumps(gpu_config().as_dict()))
    want.pop("seed")
    want = {k: v for k, v in want.items() if k not in ignore}
    have = {k: v for k, v in data["config"].items() if k not in ignore}
    data["same_as_gpu_config"] = have == want
    return data


def merge_stored(old: dict | None, new: dict, split: tuple[str, str], base_models) -> dict:
    """The records of ``new`` (``{"config", "records", "env"}``, one run) merged into the stored
    file ``old`` (or ``None``): a record of ``old`` is kept when ``new`` has none for its seed and
    model (``split = (config field, record key)``, e.g. ``("variants", "variant")``), and only
    when both were run with the same settings, the seeds, ``jobs`` and the models aside (else
    ``ValueError``, so that runs of different settings are never mixed). Every record keeps the
    ``env`` of its own run; the config lists the union of the seeds and, in ``base_models``'
    order, of the models."""
    field, key = split
    env = new["env"]
    recs = [dict(r, env=r.get("env", env)) for r in new["records"]]
    cfg = json.loads(json.dumps(new["config"]))            # as it will read back: lists, not tuples
    if old is not None:
        strip = lambda c: {k: v for k, v in c.items() if k not in ("seeds", "jobs", field)}
        if strip(old["config"]) != strip(cfg):
            raise ValueError("the stored runs were made with other settings; move the file away to start anew")
        done = {(r["seed"], r[key]) for r in recs}
        recs = [dict(r, env=r.get("env", old["env"])) for r in old["records"]
                if (r["seed"], r[key]) not in done] + recs
    models = {r[key] for r in recs}
    cfg["seeds"] = sorted({r["seed"] for r in recs})
    cfg[field] = [m for m in base_models if m in models]
    recs.sort(key=lambda r: (r["seed"], list(base_models).index(r[key])))
    return {"config": cfg, "records": recs}


def seeds_cli(argv, *, description: str, stored: str, cpu_config, gpu_config, run_seeds, gpu_seeds: list,
              describe, split: tuple[str, str] | None = None, jobs: bool = False) -> int:
    """The command line every experiment shares: ``[--gpu] [--seeds ...] [--device D] [--steps N]
    [--write]``. ``--gpu`` takes ``gpu_config()`` (else ``cpu_config()``); ``--device`` and
    ``--steps`` override the chosen setting (``--gpu --device cpu --steps 2`` checks the GPU
    setting's code path on a CPU); one run per seed (default ``gpu_seeds`` with ``--gpu``, seed 0
    without), one line per record by ``describe(record)``; ``--write`` stores the records in
    ``experiments/results/<stored>.json`` (``<stored>_cpu.json`` without ``--gpu``) with the device,
    date and versions.

    With ``split = (config field, record key)`` (an experiment that can run each model of a seed
    on its own, :func:`run_each_seed`), ``--jobs N`` runs that many pieces at once and ``--only
    M ...`` runs some of the models; ``--write`` then merges with the stored file
    (:func:`merge_stored`), so that a long setting can be run a few pieces per call.

    With ``jobs`` and no ``split`` (an experiment whose ``run_seeds`` takes ``jobs``: a
    learning-rate grid, then the seeds), ``--jobs N`` is passed on and ``--write`` writes the run as
    it is: the grid and the chosen rates are stored in its config."""
    import argparse
    import time
    from dataclasses import replace
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--gpu", action="store_true", help="the larger setting (gpu_config), on CUDA")
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help=f"one run per seed (default: {gpu_seeds} with --gpu, [0] without)")
    p.add_argument("--device", default=None, help="run the chosen setting on this device instead")
    p.add_argument("--steps", type=int, default=None, help="override the number of steps")
    p.add_argument("--write", action="store_true",
                   help=f"store the records in experiments/results/{stored}.json (--gpu) or {stored}_cpu.json")
    if split or jobs:
        p.add_argument("--jobs", type=int, default=1,
                       help="pieces (one model of one seed each) run at once, each in its own process")
    if split:
        p.add_argument("--only", nargs="+", default=None,
                       help=f"run only these {split[0]}; --write keeps the stored records of the others")
    args = p.parse_args(argv)
    cfg = gpu_config() if args.gpu else cpu_config()
    base_models = tuple(getattr(cfg, split[0])) if split else ()
    if split and args.only:
        if any(m not in base_models for m in args.only):
            raise SystemExit(f"--only: choose from {base_models}; got {args.only}")
        cfg = replace(cfg, **{split[0]: tuple(m for m in base_models if m in args.only)})
    if args.device is not None:
        cfg = replace(cfg, device=args.device)
    if args.steps is not None:
        cfg = replace(cfg, steps=check_int(args.steps, "steps", 1))
    if cfg.device == "cuda" and not torch.cuda.is_available():
        print("--gpu needs a CUDA GPU")
        return 2
    seeds = args.seeds if args.seeds is not None else (list(gpu_seeds) if args.gpu else [0])
    t0 = time.perf_counter()
    out = run_seeds(cfg, seeds, jobs=args.jobs) if (split or jobs) else run_seeds(cfg, seeds)
    for row in out["config"].get("lr_search", []):
        print(f"grid (seed {out['config']['grid_seed']}): {row['model']:>16} lr {row['lr']:g}: "
              f"score {row['score']:.3f}")
    if "lr_search" in out["config"]:
        print("chosen rates:", ", ".join(f"{m} {lr:g}" for m, lr in out["config"]["lr"].items()))
    for r in out["records"]:
        print(describe(r) + f"  ({r['train_seconds']:.0f} s)")
    print(f"{len(seeds)} seeds: {time.perf_counter() - t0:.0f} s")
    if args.write:
        from kernels import results
        name = stored if args.gpu else f"{stored}_cpu"
        path = RESULTS_DIR / f"{name}.json"
        config, records = out["config"], out["records"]
        if split:
            old = results.load_results(path) if path.exists() else None
            merged = merge_stored(old, dict(out, env=results.environment()), split, base_models)
            config, records = merged["config"], merged["records"]
        print("wrote", results.write_results(path, name, config, records))
    return 0


# ---------------------------------------------------------------------------------------------
# claims: what a chapter says of a run, as code
# ---------------------------------------------------------------------------------------------
def claim(text: str, holds, measured: str) -> dict:
    """One claim a chapter makes about a run: the sentence ``text`` (fixed before the run), whether it
    ``holds`` on this run, and what was ``measured`` (the numbers the verdict rests on, formatted
    from the run). Every experiment's ``claims(run)`` returns a list of these."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"text must be a non-empty string; got {text!r}")
    return {"claim": text, "holds": bool(holds), "measured": str(measured)}


def failed_claims(claims: list[dict]) -> list[dict]:
    """The claims of ``claims`` that do not hold (an assertion cell asserts this is empty)."""
    return [c for c in claims if not c["holds"]]


def assert_claims(claims: list[dict], which=None) -> list[dict]:
    """``claims`` unchanged when every one (or every one at the indices ``which``) holds; else
    ``AssertionError`` naming those that do not, each with what was measured: the assertion cell of
    a chapter and the tests call it."""
    idx = range(len(claims)) if which is None else which
    bad = failed_claims([claims[i] for i in idx])
    if bad:
        raise AssertionError("claims that do not hold:\n" + "\n".join(
            f"- {c['claim']} (measured: {c['measured']})" for c in bad))
    return claims


def claims_markdown(claims: list[dict]) -> str:
    """``claims`` as a Markdown list: each sentence, whether it holds, and the measurement."""
    return "\n".join(f"- {'**holds**' if c['holds'] else '**does not hold**'}: {c['claim']} "
                     f"(measured: {c['measured']})" for c in claims)


# ---------------------------------------------------------------------------------------------
# loss curves labelled by what each step trained on
# ---------------------------------------------------------------------------------------------
def loss_curves(losses: list, labels: list, every: int) -> list[dict]:
    """The training losses as one curve per task setting: ``labels[s]`` names what step ``s``
    trained on (e.g. ``"N=8 R=2"``). For each label, in order of first appearance, its own steps
    are cut into windows of ``every`` (the last may be shorter) and each window gives one point:
    ``{"label", "every", "step": [last step of each window], "loss": [mean loss of the window]}``.
    A point therefore never mixes settings, and its step says where in training it sits."""
    check_int(every, "every", 1)
    if len(losses) != len(labels):
        raise ValueError(f"labels must name every step: {len(labels)} labels for {len(losses)} losses")
    steps_of = {}
    for s, lab in enumerate(labels):
        steps_of.setdefault(lab, []).append(s)
    out = []
    for lab, steps in steps_of.items():
        wins = [steps[i:i + every] for i in range(0, len(steps), every)]
        out.append({"label": lab, "every": every, "step": [w[-1] for w in wins],
                    "loss": [float(sum(losses[s] for s in w) / len(w)) for w in wins]})
    return out


# ---------------------------------------------------------------------------------------------
# a learning-rate grid on a held-out seed, then the seeds at each model's chosen rate
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TunedConfig(TrainConfig):
    """A training configuration whose learning rate is chosen per model: ``lr_grid`` (each model is
    trained once per rate, with the seed ``grid_seed``, and scored on a validation stream), then
    every seed at the model's chosen rate, scored on the test stream. ``eval_on`` is which stream a
    run scores (``"validation"`` or ``"test"``); ``lr`` is the rate of a single run."""

    lr_grid: tuple = (1e-3, 3e-3, 1e-2)
    grid_seed: int = 1000
    eval_on: str = "test"


def _check_tuned(config) -> None:
    grid = tuple(config.lr_grid)
    if not grid or any(isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0 for lr in grid) \
            or len(set(grid)) != len(grid):
        raise ValueError(f"lr_grid must be a non-empty tuple of distinct rates > 0; got {config.lr_grid!r}")
    if config.eval_on not in ("validation", "test"):
        raise ValueError(f"eval_on must be 'validation' or 'test'; got {config.eval_on!r}")
    check_int(config.grid_seed, "grid_seed", 0)


def stored_config(config) -> dict:
    """``config`` as a tuned run stores it: its settings, without the single run's ``seed``, ``lr``
    and ``eval_on`` (the run adds ``seeds``, ``jobs`` and ``chosen_lr``), as JSON reads it back."""
    cfg = json.loads(json.dumps(config.as_dict()))
    for k in ("seed", "lr", "eval_on"):
        cfg.pop(k, None)
    return cfg


@contextlib.contextmanager
def _runner(jobs: int):
    """``run(fn, work) -> [fn(w) for w in work]``, ``jobs`` at a time in spawned processes (one pool
    for every call inside the ``with``, so that each process compiles its kernels once)."""
    check_int(jobs, "jobs", 1)
    if jobs == 1:
        yield lambda fn, work: [fn(w) for w in work]
        return
    import concurrent.futures as cf
    import multiprocessing as mp
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as ex:
        yield lambda fn, work: list(ex.map(fn, work))


def _mean_accuracy(record: dict) -> float:
    acc = record["accuracy"]
    return float(sum(acc) / len(acc))


def tune_then_seeds(config, seeds, run_one, units: dict, *, jobs: int = 1, score=None, tuned_by: dict | None = None) -> dict:
    """The protocol of every tuned experiment. ``units`` maps a model's label to the config fields
    that make a run of that model alone (e.g. ``{"deltanet@16": {"mixers": ("deltanet",),
    "head_dims": (16,)}}``); ``run_one(config)`` trains it and returns ``{"records": [one record],
    "seconds"}``.

    1. **The grid**: each tuned unit once per rate of ``config.lr_grid``, with the seed
       ``config.grid_seed`` (not one of ``seeds``), scored on the validation stream
       (``eval_on="validation"``) by ``score(record)`` (default: the mean of ``record["accuracy"]``;
       higher is better, NaN counts as worst). A unit's chosen rate is its best (the first in the
       grid's order on a tie). ``tuned_by`` maps each unit to the unit whose grid sets its rate
       (default: itself), so that, e.g., a model's rate can be chosen at one size and used at
       every size. A grid of one rate is not run: that rate is every unit's.
    2. **The seeds**: every unit once per seed at its chosen rate, scored on the test stream.

    ``jobs > 1`` runs that many pieces at once in their own processes (a GPU is shared by them, so
    the times measured are those of concurrent runs). Returns ``{"config": stored_config(config) with
    "seeds", "jobs" and "chosen_lr" ({unit: rate}), "records": the grid's (``phase="grid"``) then
    the seeds' (``phase="seed"``), each with ``unit``, ``lr``, ``seed``, ``phase`` and ``score``,
    "seconds": wall time}``."""
    import math
    import time
    from dataclasses import replace
    seeds = check_seeds(seeds)
    check_int(jobs, "jobs", 1)
    _check_tuned(config)
    if not units:
        raise ValueError("units must name at least one model")
    tuned_by = dict(tuned_by or {u: u for u in units})
    if set(tuned_by) != set(units) or not set(tuned_by.values()) <= set(units):
        raise ValueError("tuned_by must map every unit to a unit")
    if config.grid_seed in seeds:
        raise ValueError(f"grid_seed ({config.grid_seed}) must not be one of the seeds {seeds}: the "
                         "rates are chosen on a seed the results do not use")
    score = score or _mean_accuracy
    safe = lambda r: (lambda x: -math.inf if math.isnan(x) else x)(float(score(r)))
    t0 = time.perf_counter()
    tuned = [u for u in units if u in set(tuned_by.values())]
    grid = [] if len(config.lr_grid) == 1 else \
        [(lab, lr, replace(config, seed=config.grid_seed, lr=lr, eval_on="validation", **units[lab]))
         for lab in tuned for lr in config.lr_grid]
    records, best = [], {lab: config.lr_grid[0] for lab in tuned}
    with _runner(jobs) as run:
        for (lab, lr, _), out in zip(grid, run(run_one, [c for *_, c in grid])):
            for r in out["records"]:
                records.append(dict(r, unit=lab, lr=lr, seed=config.grid_seed, phase="grid", score=safe(r)))
        for lab in tuned:
            mine = [r for r in records if r["unit"] == lab]
            if mine:
                best[lab] = max(mine, key=lambda r: r["score"])["lr"]     # max keeps the first of ties
        chosen = {u: best[tuned_by[u]] for u in units}
        pieces = [(lab, s, replace(config, seed=s, lr=chosen[lab], eval_on="test", **ov))
                  for s in seeds for lab, ov in units.items()]
        for (lab, s, _), out in zip(pieces, run(run_one, [c for *_, c in pieces])):
            for r in out["records"]:
                records.append(dict(r, unit=lab, lr=chosen[lab], seed=s, phase="seed", score=safe(r)))
    cfg = stored_config(config)
    cfg.update(seeds=seeds, jobs=min(jobs, max(len(grid), len(pieces))), chosen_lr=chosen)
    return {"config": cfg, "records": records, "seconds": time.perf_counter() - t0}


def seed_records(run: dict) -> list[dict]:
    """The records of a tuned run's seeds (the grid's left out)."""
    return [r for r in run["records"] if r["phase"] == "seed"]


def grid_rows(run: dict) -> list[dict]:
    """The learning-rate grid of a tuned run, one row per unit: ``{"unit", "lrs", "scores",
    "chosen"}`` (the rates in the grid's order, the validation score of each, the chosen rate)."""
    rows = {}
    for r in run["records"]:
        if r["phase"] == "grid":
            row = rows.setdefault(r["unit"], {"unit": r["unit"], "lrs": [], "scores": []})
            row["lrs"].append(r["lr"])
            row["scores"].append(r["score"])
    for u, row in rows.items():
        row["chosen"] = run["config"]["chosen_lr"][u]
    return list(rows.values())


_TUNED_IGNORE = ("seeds", "jobs", "chosen_lr")


def load_tuned(name: str, gpu_config, command: str) -> dict:
    """The stored tuned run ``experiments/results/<name>.json`` (``env``, ``config``, ``records``)
    with ``same_as_gpu_config``: whether it was run with the settings ``gpu_config()`` has now (its
    seeds, jobs and chosen rates aside). ``FileNotFoundError`` naming ``command`` when this copy of
    the book has none."""
    from kernels import results
    path = RESULTS_DIR / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"no stored runs at {path}; run `{command}` on a GPU to create them")
    data = results.load_results(path)
    have = {k: v for k, v in data["config"].items() if k not in _TUNED_IGNORE}
    data["same_as_gpu_config"] = have == stored_config(gpu_config())
    return data


def merge_tuned(old: dict | None, new: dict, field: str, base_models) -> dict:
    """The tuned run ``new`` (``{"config", "records", "env"}``, run on some of the models of the
    config field ``field``) merged into the stored file ``old`` (or ``None``): ``old``'s records
    and chosen rates are kept for the units ``new`` did not run, provided both were run with the
    same settings and seeds (else ``ValueError``: runs of different settings are never mixed).
    Every record keeps the ``env`` of its own run; ``field`` lists the union of the models in
    ``base_models``' order."""
    env = new["env"]
    recs = [dict(r, env=r.get("env", env)) for r in new["records"]]
    cfg = json.loads(json.dumps(new["config"]))
    chosen = dict(cfg["chosen_lr"])
    if old is not None:
        strip = lambda c: {k: v for k, v in c.items() if k not in ("jobs", "chosen_lr", field)}
        if strip(old["config"]) != strip(cfg):
            raise ValueError("the stored runs were made with other settings or seeds; move the file away "
                             "to start anew")
        done = {r["unit"] for r in recs}
        recs = [dict(r, env=r.get("env", old["env"])) for r in old["records"] if r["unit"] not in done] + recs
        chosen = {**{u: lr for u, lr in old["config"]["chosen_lr"].items() if u not in done}, **chosen}
    models = {r.get("mixer") for r in recs}
    cfg[field] = [m for m in base_models if m in models]
    cfg["chosen_lr"] = chosen
    return {"config": cfg, "records": recs}


def tuned_cli(argv, *, description: str, stored: str, cpu_config, gpu_config, run_seeds, describe,
              gpu_seeds=(0, 1, 2), field: str = "mixers") -> int:
    """The command line of a tuned experiment: ``[--gpu] [--seeds ...] [--jobs N] [--only M ...]
    [--device D] [--steps N] [--write]``. ``--gpu`` takes ``gpu_config()`` (else ``cpu_config()``);
    ``--device`` and ``--steps`` override it (``--gpu --device cpu --steps 2`` checks the GPU
    setting's code path on a CPU); ``run_seeds(config, seeds, jobs=N)`` runs the grid and the
    seeds (default ``gpu_seeds`` with ``--gpu``, ``[0]`` without), and one line per seed record is
    printed by ``describe(record)``. ``--only`` runs some of the models of the config field
    ``field``; ``--write`` stores the run in ``experiments/results/<stored>.json``
    (``<stored>_cpu.json`` without ``--gpu``) with the device, date and versions, merged with what is
    stored for the other models (:func:`merge_tuned`)."""
    import argparse
    import time
    from dataclasses import replace
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--gpu", action="store_true", help="the larger setting (gpu_config), on CUDA")
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help=f"the seeds run at the chosen rates (default: {list(gpu_seeds)} with --gpu, [0] without)")
    p.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own process")
    p.add_argument("--only", nargs="+", default=None, help=f"run only these {field}")
    p.add_argument("--device", default=None, help="run the chosen setting on this device instead")
    p.add_argument("--steps", type=int, default=None, help="override the number of steps")
    p.add_argument("--write", action="store_true",
                   help=f"store the run in experiments/results/{stored}.json (--gpu) or {stored}_cpu.json")
    args = p.parse_args(argv)
    cfg = gpu_config() if args.gpu else cpu_config()
    base_models = tuple(getattr(cfg, field))
    if args.only:
        if any(m not in base_models for m in args.only):
            raise SystemExit(f"--only: choose from {base_models}; got {args.only}")
        cfg = replace(cfg, **{field: tuple(m for m in base_models if m in args.only)})
    if args.device is not None:
        cfg = replace(cfg, device=args.device)
    if args.steps is not None:
        cfg = replace(cfg, steps=check_int(args.steps, "steps", 1))
    if cfg.device == "cuda" and not torch.cuda.is_available():
        print("--gpu needs a CUDA GPU")
        return 2
    seeds = args.seeds if args.seeds is not None else (list(gpu_seeds) if args.gpu else [0])
    t0 = time.perf_counter()
    out = run_seeds(cfg, seeds, jobs=args.jobs)
    for row in grid_rows(out):
        print(f"grid {row['unit']:>20}: " + "  ".join(f"{lr:g}: {s:.3f}" for lr, s in zip(row["lrs"], row["scores"]))
              + f"  -> {row['chosen']:g}")
    for r in seed_records(out):
        print(describe(r) + f"  ({r['train_seconds']:.0f} s)")
    print(f"{len(seeds)} seeds after a grid of {len(cfg.lr_grid)} rates: {time.perf_counter() - t0:.0f} s")
    if args.write:
        from kernels import results
        name = stored if args.gpu else f"{stored}_cpu"
        path = RESULTS_DIR / f"{name}.json"
        old = results.load_results(path) if path.exists() else None
        merged = merge_tuned(old, dict(out, env=results.environment()), field, base_models)
        print("wrote", results.write_results(path, name, merged["config"], merged["records"]))
    return 0


# ---------------------------------------------------------------------------------------------
# the grid-and-seeds runner of the multi-hop and extrapolation experiments (Chapters 7 and 8)
# ---------------------------------------------------------------------------------------------
def run_grid_and_seeds(config, seeds, run_one, *, split: str, score, jobs: int = 1) -> dict:
    """The experiments' protocol: a learning-rate grid per model on one held-out seed, then every
    seed at each model's chosen rate.

    ``config`` has ``lr_grid`` (a tuple of rates; empty: no grid, every model at ``config.lr``) and
    ``grid_seed`` (the seed of the grid runs; it must not be one of ``seeds``, so that the rates
    are chosen on data, initialisations and evaluation batches that no reported run uses). ``split``
    names the config's tuple of models; ``run_one(config)`` trains the one model of
    ``config.<split>`` (module-level when ``jobs > 1``: :func:`map_jobs` runs the pieces in that
    many processes) and returns ``{"records": [record], "seconds"}``. ``score(record)`` is the
    held-out score the rate is chosen by (higher is better; a tie goes to the smaller rate).

    Returns ``{"config", "records", "seconds": {seed: seconds}}``: every record gains ``lr``; the
    config has ``seeds`` in place of ``seed``, ``lr`` as ``{model: chosen rate}`` and
    ``lr_search``, one row ``{"model", "lr", "score", "accuracy"}`` per grid run (and ``jobs`` when
    above 1)."""
    from dataclasses import replace
    seeds = check_seeds(seeds)
    check_int(jobs, "jobs", 1)
    models = tuple(getattr(config, split))
    grid = tuple(config.lr_grid)
    if any(isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0 for lr in grid):
        raise ValueError(f"lr_grid must hold positive learning rates; got {grid!r}")
    search = []
    if grid:
        if config.grid_seed in seeds:
            raise ValueError(f"grid_seed must not be one of the seeds {seeds}; got {config.grid_seed}")
        work = [(m, lr) for m in models for lr in grid]
        runs = map_jobs(run_one, [replace(config, seed=config.grid_seed, lr=lr, **{split: (m,)})
                                  for m, lr in work], jobs)
        for (m, lr), run in zip(work, runs):
            rec = run["records"][0]
            search.append({"model": m, "lr": lr, "score": float(score(rec)), "accuracy": rec["accuracy"]})
        chosen = {}
        for m in models:
            rows = [r for r in search if r["model"] == m]
            chosen[m] = max(rows, key=lambda r: (r["score"], -r["lr"]))["lr"]
    else:
        chosen = {m: config.lr for m in models}
    pieces = [(s, m) for s in seeds for m in models]
    runs = map_jobs(run_one, [replace(config, seed=s, lr=chosen[m], **{split: (m,)}) for s, m in pieces], jobs)
    records, seconds = [], {}
    for (s, m), run in zip(pieces, runs):
        records += [dict(r, lr=chosen[m]) for r in run["records"]]
        seconds[s] = seconds.get(s, 0.0) + run["seconds"]
    cfg = config.as_dict()
    cfg.pop("seed")
    cfg["seeds"] = seeds
    cfg["lr"] = chosen
    cfg["lr_search"] = search
    if jobs > 1:
        cfg["jobs"] = min(jobs, len(pieces))
    return {"config": cfg, "records": records, "seconds": seconds}


def grid_lines(config: dict, names: dict) -> list[str]:
    """The learning-rate grid of a stored run (:func:`run_grid_and_seeds`' config), one line per
    model: its name from ``names``, then each rate with its held-out score, the chosen one marked
    ``*``."""
    width = max(len(names[m]) for m in config["lr"])
    return [f"  {names[m]:>{width}}: " + "  ".join(
        f"{r['lr']:g} {r['score']:.3f}{'*' if r['lr'] == lr else ' '}"
        for r in config["lr_search"] if r["model"] == m) for m, lr in config["lr"].items()]


def load_current(load_stored, name: str, command: str):
    """``load_stored()`` (an experiment's stored GPU runs) if the file exists and was made with the
    settings ``gpu_config()`` has now; else ``None``, after printing why and ``command``, the line
    that makes it."""
    try:
        data = load_stored()
    except FileNotFoundError:
        data = None
        print(f"No experiments/results/{name}.json in this copy of the book.")
    if data is not None and not data["same_as_gpu_config"]:
        print(f"The stored experiments/results/{name}.json was made with other\n"
              "settings (an earlier version of the experiment): not shown.")
        data = None
    if data is None:
        print(f"To make the stored runs, run on a machine with a CUDA GPU:\n  {command}")
    return data


def tune_and_run(config, seeds, run_piece, *, split: tuple, score, jobs: int = 1, keep_models: bool = False) -> dict:
    """A learning-rate grid on one held-out seed, then every seed at each model's chosen rate.

    A *model* is one combination of values of the config's tuple fields named in ``split`` (e.g.
    ``("cups", "models")``); a *piece* is ``run_piece(config)`` with each of those fields cut to one
    value (module-level for ``jobs > 1``: :func:`map_jobs`), which returns ``{"records": [...]}``
    with one record. Stage 1 runs every model at every rate of ``config.lr_grid`` with
    ``seed = config.grid_seed`` (a seed outside ``seeds``, so its training stream and its evaluation
    batches, the held-out set, are never the reported ones) and keeps, per model, the rate whose
    record has the highest ``score(record)`` (any comparable value; ties go to the earlier rate of
    the grid). With a one-rate grid, stage 1 is skipped. Stage 2 runs every model at its chosen rate
    for every seed. Each stage's pieces run ``jobs`` at a time.

    Returns ``{"config", "records" (stage 2's, one per model and seed, each with its "lr"),
    "seconds": {seed: summed piece seconds}}``; the config is ``config.as_dict()`` with ``seeds``
    in place of ``seed`` and ``lr_choice``: per model, its values of the ``split`` fields, the
    grid's scores (``None`` without stage 1) and the chosen ``lr``. With ``keep_models``, stage 2's
    pieces are called with ``keep_models=True`` and their ``"models"`` come back under
    ``"models"``, ``{seed: {name: model}}``."""
    from dataclasses import replace
    seeds = check_seeds(seeds)
    check_int(jobs, "jobs", 1)
    grid = tuple(config.lr_grid)
    if not grid or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not x > 0 for x in grid):
        raise ValueError(f"lr_grid must be a non-empty tuple of positive rates; got {grid!r}")
    if config.grid_seed in seeds:
        raise ValueError(f"grid_seed must not be one of seeds (it is the held-out seed); got {config.grid_seed}")
    import itertools
    models = list(itertools.product(*(tuple(getattr(config, f)) for f in split)))

    def piece(values, **changes):
        return replace(config, **{f: (v,) for f, v in zip(split, values)}, **changes)

    lr_choice = []
    if len(grid) > 1:
        runs = map_jobs(run_piece, [piece(m, seed=config.grid_seed, lr=lr) for m in models for lr in grid], jobs)
        for i, m in enumerate(models):
            scores = [score(runs[i * len(grid) + j]["records"][0]) for j in range(len(grid))]
            best = max(range(len(grid)), key=lambda j: (scores[j], -j))
            lr_choice.append({**dict(zip(split, m)), "scores": scores, "lr": grid[best]})
    else:
        lr_choice = [{**dict(zip(split, m)), "scores": None, "lr": grid[0]} for m in models]
    work = [(s, piece(m, seed=s, lr=c["lr"])) for s in seeds for m, c in zip(models, lr_choice)]
    if keep_models:
        from functools import partial
        run_piece = partial(run_piece, keep_models=True)
    runs = map_jobs(run_piece, [c for _, c in work], jobs)
    records, seconds, kept = [], {}, {}
    for (s, _), run in zip(work, runs):
        records += run["records"]
        seconds[s] = seconds.get(s, 0.0) + run["seconds"]
        if keep_models:
            kept.setdefault(s, {}).update(run["models"])
    cfg = config.as_dict()
    cfg.pop("seed")
    cfg["seeds"] = seeds
    cfg["lr_choice"] = lr_choice
    if jobs > 1:
        cfg["jobs"] = jobs
    out = {"config": cfg, "records": records, "seconds": seconds}
    if keep_models:
        out["models"] = kept
    return out
