"""What the experiments share: input checks, CPU threads, per-run seeds, loss windows, claims, and
one protocol with its stored runs and command line.

Each experiment (:mod:`experiments.mqar`, :mod:`experiments.extrapolation`, ...) has a configuration
dataclass (a :class:`TunedConfig`) with ``as_dict()``, a ``cpu_config()`` and a ``gpu_config()``, and
runs :func:`tune_and_run`: a learning-rate grid per model on one held-out seed, then every seed at
each model's chosen rate. :func:`seeds_cli` is its command line; its GPU run lives in
``experiments/results/<name>.json`` with the device, date and library versions
(:func:`kernels.results.write_results`), the grid and the chosen rates with it; :func:`load_run`
reads it back and tells whether it was made with today's ``gpu_config()``, :func:`load_current`
is a chapter's way to it, and :func:`grid_rows` and :func:`grid_lines` show its grid.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn

__all__ = ["RESULTS_DIR", "TrainConfig", "mlp_block", "residual_stack", "fit", "check_int", "check_seeds",
           "torch_threads", "derived_seeds", "window_means", "summarize_seeds", "train_each", "MODEL_COLORS",
           "MODEL_NAMES", "claim", "failed_claims", "assert_claims", "claims_markdown", "loss_curves",
           "TunedConfig", "stored_config", "tune_and_run", "grid_rows", "grid_lines", "grid_edges", "load_run",
           "load_current", "seeds_cli", "claims_verdict"]

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


def claims_verdict(claims: list[dict], where: str = "the stored runs") -> str:
    """One Markdown sentence on ``claims`` as measured ``where``: that every one holds, or how many
    do not and which, as a negative result. The chapters print it under a stored run's claims in
    place of asserting them: the claims were fixed before the run, so a claim the run does not
    support is reported, not revised to fit."""
    bad = failed_claims(claims)
    if not claims:
        raise ValueError("claims must hold at least one claim")
    if not bad:
        return f"Every one of the {len(claims)} claims holds in {where}."
    verb = "does" if len(bad) == 1 else "do"
    return (f"**A negative result:** {len(bad)} of the {len(claims)} claims {verb} not hold in {where} (marked "
            "above): " + " ".join(f"*{c['claim']}*" for c in bad) + " The claims were fixed before these runs "
            "were made; they are reported as measured, not revised to fit.")


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
# the protocol: a learning-rate grid on a held-out seed, then the seeds at each model's chosen rate
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TunedConfig(TrainConfig):
    """A training configuration whose learning rate is chosen per model by :func:`tune_and_run`:
    each model is trained once per rate of ``lr_grid`` with the seed ``grid_seed`` (never a
    reported seed), then every reported seed at the model's chosen rate. A grid of one rate is not
    run (that rate is every model's); an empty one means ``lr``, the rate of a single run. An
    experiment with a validation stream of its own adds a field ``eval_on`` (``"validation"`` or
    ``"test"``), which :func:`tune_and_run` sets for each run."""

    lr_grid: tuple = ()
    grid_seed: int = 1000


def stored_config(config) -> dict:
    """``config`` as a run of :func:`tune_and_run` stores it: its settings as JSON reads them back,
    without the single run's ``seed``, ``lr`` and ``eval_on`` (the run adds ``seeds``, ``jobs``
    and ``lr_choice``)."""
    cfg = json.loads(json.dumps(config.as_dict()))
    for k in ("seed", "lr", "eval_on"):
        cfg.pop(k, None)
    return cfg


@contextlib.contextmanager
def _runner(jobs: int):
    """``run(fn, work, done=None) -> [fn(w) for w in work]``, ``jobs`` at a time in spawned processes
    (CUDA cannot be used in a forked child; ``fn`` must then be module-level and ``work`` and the
    results picklable), calling ``done(i, result)`` as each piece finishes. One pool serves every
    call inside the ``with``, so that each process compiles its kernels once. A GPU is shared by the processes: times measured in them are of concurrent runs."""
    check_int(jobs, "jobs", 1)
    if jobs == 1:
        def one_by_one(fn, work, done=None):
            out = []
            for i, w in enumerate(work):
                out.append(fn(w))
                if done is not None:
                    done(i, out[i])
            return out
        yield one_by_one
        return
    import concurrent.futures as cf
    import multiprocessing as mp
    import sys
    import time
    t0 = time.perf_counter()

    def run(fn, work, done=None):
        out, futures = [None] * len(work), {}
        for i, w in enumerate(work):
            futures[ex.submit(fn, w)] = i
        for n, f in enumerate(cf.as_completed(futures), 1):   # one line per piece: a long run shows its pace
            i = futures[f]
            out[i] = f.result()
            if done is not None:
                done(i, out[i])
            print(f"  piece {n}/{len(work)} done at {time.perf_counter() - t0:.0f} s", file=sys.stderr,
                  flush=True)
        return out

    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as ex:
        yield run


def _piece_key(cfg) -> str:
    return json.dumps(asdict(cfg), sort_keys=True, default=str)


def _resumed(run, path: Path, fn, work):
    """``run(fn, work)`` for the pieces that the file ``path`` does not hold yet, each result
    appended to it as it finishes; the others read back from it (a last line cut off mid-write is
    ignored). Every result passes through JSON."""
    keys = [_piece_key(w) for w in work]
    held = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            held[row["key"]] = row["out"]
    todo = [i for i, k in enumerate(keys) if k not in held]
    if len(todo) < len(work):
        print(f"  {len(work) - len(todo)} of {len(work)} pieces read back from {path.name}", flush=True)
    outs = [held.get(k) for k in keys]

    def done(j, out):
        i = todo[j]
        line = json.dumps({"key": keys[i], "out": out})
        outs[i] = json.loads(line)["out"]
        with path.open("a") as f:
            f.write(line + "\n")

    run(fn, [work[i] for i in todo], done)
    return outs


def _mean_accuracy(record: dict) -> float:
    acc = record["accuracy"]
    return float(sum(acc) / len(acc))


def _ranked(x):
    """A score as the grid compares it: a number, or a tuple of them (ties broken by the later
    entries), with NaN as the worst value."""
    if isinstance(x, (tuple, list)):
        return tuple(_ranked(v) for v in x)
    x = float(x)
    return -math.inf if math.isnan(x) else x


def tune_and_run(config, seeds, run_piece, *, split, label=None, score=None, tune_at: dict | None = None,
                 jobs: int = 1, keep_models: bool = False, pieces=None) -> dict:
    """The protocol of every experiment: a learning-rate grid per model on one held-out seed, then
    every seed at each model's chosen rate.

    **The models** (*units*): one per combination of values of the config's tuple fields named in
    ``split`` (e.g. ``("mixers", "head_dims")``; the first field outermost), named
    ``label(*values)`` (default: the values joined by ``/``, so a one-field split names a unit by
    its value). ``run_piece(config)`` trains one unit, ``config`` with each ``split`` field cut to
    its one value (module-level when ``jobs > 1``), and returns ``{"records": [...], "seconds"}``.

    1. **The grid**: each tuned unit once per rate of ``config.lr_grid`` with ``seed =
       config.grid_seed`` (not one of ``seeds``, so that the rates are chosen on data,
       initialisations and evaluation batches no reported run uses; a config with an ``eval_on``
       field runs with ``eval_on="validation"``). Its rate is the one whose record (with its
       ``unit``, ``lr``, ``seed`` and ``phase``) has the best ``score(record)`` (default: the mean
       of ``record["accuracy"]``; higher is better; a number or a tuple of them, later entries
       breaking ties; NaN counts as worst; an exact tie goes to the earlier rate of the grid). ``tune_at``, ``{field: value}``, tunes only the units with those
       values, and gives every unit the rate of the unit that differs from it only there (e.g. a
       mixer's rate chosen at one head size, used at every head size). A grid of fewer than two
       rates is not run: every unit gets its one rate, or ``config.lr`` when it is empty.
    2. **The seeds**: every unit once per seed at its chosen rate (``eval_on="test"``).

    ``jobs > 1`` runs that many pieces at once, each in its own process (the records are those of
    one process: every piece is seeded alike). With ``keep_models``, the seeds' pieces are called
    with ``keep_models=True`` and the ``"models"`` they return come back under ``"models"``,
    ``{seed: {name: model}}``.

    ``pieces``: a file (JSON lines) that keeps each piece's result as it finishes, keyed by the
    piece's whole config; a piece the file already holds is read back, not run again, so a run cut
    off by a time limit resumes where it stopped (:func:`seeds_cli` keeps one beside the results
    with ``--write``). Every result then passes through JSON, kept or not, so that a resumed run
    equals one made at once. Not with ``keep_models``.

    Returns ``{"config", "grid", "records", "seconds"}``. ``config``: :func:`stored_config` with
    ``seeds``, ``jobs`` and ``lr_choice``, one row per unit ``{"unit", <its split values>, "lr",
    "scores", "tuned_by"}`` (``scores``: the grid's score at each rate of ``lr_grid`` for a tuned
    unit, else ``None``; ``tuned_by``: the unit whose grid chose the rate, ``None`` without a
    grid). ``grid`` and ``records`` (the seeds'): every record of the pieces with ``unit``, ``lr``,
    ``seed`` and ``phase`` (``"grid"`` or ``"seed"``), a grid record with its ``score`` too.
    ``seconds``: ``{seed: seconds}``, each seed's pieces' seconds summed. :func:`seeds_cli`
    stores the run, :func:`load_run` reads it back in the same form."""
    import itertools
    from dataclasses import fields, replace
    seeds = check_seeds(seeds)
    check_int(jobs, "jobs", 1)
    grid = tuple(config.lr_grid)
    if any(isinstance(x, bool) or not isinstance(x, (int, float)) or not x > 0 for x in grid) \
            or len(set(grid)) != len(grid):
        raise ValueError(f"lr_grid must hold distinct positive learning rates; got {config.lr_grid!r}")
    check_int(config.grid_seed, "grid_seed", 0)
    if len(grid) > 1 and config.grid_seed in seeds:
        raise ValueError(f"grid_seed must not be one of the seeds {seeds} (it is the held-out seed); "
                         f"got {config.grid_seed}")
    split = (split,) if isinstance(split, str) else tuple(split)
    values = [tuple(getattr(config, f)) for f in split]
    if not split or not all(values):
        raise ValueError(f"split must name config fields that each hold at least one value; got {split!r}")
    label = label or (lambda *vs: "/".join(map(str, vs)))
    units = {label(*vs): dict(zip(split, vs)) for vs in itertools.product(*values)}
    if len(units) != math.prod(map(len, values)):
        raise ValueError("label must give every unit its own name")
    tune_at = dict(tune_at or {})
    for f, v in tune_at.items():
        if f not in split or v not in getattr(config, f):
            raise ValueError(f"tune_at: {f} = {v!r} must be one of the values of a split field; "
                             f"the split is {dict(zip(split, values))}")
    tuned_by = {u: label(*{**vals, **tune_at}.values()) for u, vals in units.items()}
    tuned = [u for u in units if u in set(tuned_by.values())] if len(grid) > 1 else []
    score = score or _mean_accuracy
    stream = lambda which: {"eval_on": which} if "eval_on" in {f.name for f in fields(config)} else {}

    def piece(u, **changes):
        return replace(config, **{f: (v,) for f, v in units[u].items()}, **changes)

    grid_work = [(u, lr) for u in tuned for lr in grid]
    seed_work = [(u, s) for s in seeds for u in units]
    piece_fn = functools.partial(run_piece, keep_models=True) if keep_models else run_piece
    if pieces is not None and keep_models:
        raise ValueError("pieces keeps results as JSON, which cannot hold models: not with keep_models")
    grid_recs, recs, seconds, kept = [], [], {}, {}
    with _runner(jobs) as pool:
        run = pool if pieces is None else functools.partial(_resumed, pool, Path(pieces))
        outs = run(run_piece, [piece(u, seed=config.grid_seed, lr=lr, **stream("validation")) for u, lr in grid_work])
        for (u, lr), out in zip(grid_work, outs):
            if len(out["records"]) != 1:
                raise ValueError(f"run_piece must return one record per unit; got {len(out['records'])} for {u}")
            rec = dict(out["records"][0], unit=u, lr=lr, seed=config.grid_seed, phase="grid")
            grid_recs.append(dict(rec, score=_ranked(score(rec))))
        scores = {u: [r["score"] for r in grid_recs if r["unit"] == u] for u in tuned}
        best = {u: grid[max(range(len(grid)), key=lambda j: (scores[u][j], -j))] for u in tuned}
        chosen = {u: best[tuned_by[u]] if tuned else (grid[0] if grid else config.lr) for u in units}
        outs = run(piece_fn, [piece(u, seed=s, lr=chosen[u], **stream("test")) for u, s in seed_work])
        for (u, s), out in zip(seed_work, outs):
            recs += [dict(r, unit=u, lr=chosen[u], seed=s, phase="seed") for r in out["records"]]
            seconds[s] = seconds.get(s, 0.0) + out["seconds"]
            if keep_models:
                kept.setdefault(s, {}).update(out["models"])
    cfg = stored_config(config)
    cfg.update(seeds=seeds, jobs=jobs, lr_choice=[
        {"unit": u, **vals, "lr": chosen[u], "scores": scores.get(u) if tuned else None,
         "tuned_by": tuned_by[u] if tuned else None} for u, vals in units.items()])
    out = {"config": cfg, "grid": grid_recs, "records": recs, "seconds": seconds}
    if keep_models:
        out["models"] = kept
    return out


def grid_rows(run: dict) -> list[dict]:
    """The learning-rate grid of a run of :func:`tune_and_run` (or one read back by
    :func:`load_run`), one row per tuned unit: ``{"unit", "lrs", "scores", "chosen"}`` (the rates
    of ``lr_grid``, the held-out score at each, the chosen rate). No rows when it had no grid, nor for
    a stored file of an earlier format (no ``lr_choice``)."""
    cfg = run["config"]
    return [{"unit": row["unit"], "lrs": list(cfg["lr_grid"]), "scores": row["scores"], "chosen": row["lr"]}
            for row in cfg.get("lr_choice", []) if row["scores"] is not None]


def grid_lines(config: dict, names=None, digits: int = 3) -> list[str]:
    """The learning-rate grid of a run's ``config`` (:func:`grid_rows`), one line per tuned unit:
    its name (``names[unit]`` for a dict, ``names(unit)`` for a function, default the unit's label),
    then each rate with its held-out score (a tuple score by its first entry), the chosen rate
    marked ``*``."""
    rows = grid_rows({"config": config})
    name = (names.get if isinstance(names, dict) else names) or str
    width = max((len(name(r["unit"])) for r in rows), default=0)
    first = lambda s: s[0] if isinstance(s, (tuple, list)) else s
    return [f"  {name(r['unit']):>{width}}: " + "  ".join(
        f"{lr:g} {first(s):.{digits}f}{'*' if lr == r['chosen'] else ' '}" for lr, s in zip(r["lrs"], r["scores"]))
        for r in rows]


def grid_edges(config: dict, names=None) -> str | None:
    """A sentence on the units of a run's learning-rate grid (:func:`grid_rows`) whose chosen rate is
    the grid's largest or smallest: for them the best rate may lie outside the grid, so the grid
    bounds what the comparison can say. ``None`` when every choice is inside the grid (or there is no
    grid of three rates or more). ``names`` as for :func:`grid_lines`."""
    rows = [r for r in grid_rows({"config": config}) if len(r["lrs"]) >= 3]
    name = (names.get if isinstance(names, dict) else names) or str
    first = lambda sc: sc[0] if isinstance(sc, (tuple, list)) else sc
    ends = {"largest": [], "smallest": []}
    for r in rows:
        by_lr = sorted(zip(r["lrs"], map(first, r["scores"])))
        for end, (edge, inner) in (("largest", (by_lr[-1], by_lr[-2])), ("smallest", (by_lr[0], by_lr[1]))):
            if r["chosen"] == edge[0] and edge[1] > inner[1]:      # strictly better than its neighbour
                ends[end].append(name(r["unit"]))
    parts = [f"{', '.join(units)} at the {end} ({(max if end == 'largest' else min)(rows[0]['lrs']):g})"
             for end, units in ends.items() if units]
    if not parts:
        return None
    n = sum(map(len, ends.values()))
    return (f"{n} of the {len(rows)} grids chose a rate at the edge of the grid: " + "; ".join(parts)
            + ". For those the best rate may lie beyond it; the grid bounds what the comparison can say.")


def load_run(name: str, gpu_config, command: str, only: str | None = None) -> dict:
    """The stored run ``experiments/results/<name>.json`` as :func:`tune_and_run` returned it
    (``config``, ``grid``, ``records``: the seeds'), with its ``env``, ``same_as_gpu_config``:
    whether it was made with the settings ``gpu_config()`` has now (its seeds, jobs and chosen
    rates aside), and ``missing``: with ``only`` (the config field of the models, as the command's
    ``--only`` takes them), the models of ``gpu_config()`` a run made so far with ``--only`` lacks,
    its settings otherwise today's (a long setting run a few models per GPU call; else ``[]``). A
    file of an earlier format (no ``lr_choice``) reads back as made with other settings, every
    record among the seeds'. ``FileNotFoundError`` naming ``command``, the line that makes it, when
    this copy of the book has none."""
    from kernels import results
    path = RESULTS_DIR / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"no stored runs at experiments/results/{name}.json; run `{command}` on a GPU "
                                "to create them")
    data = results.load_results(path)
    have = {k: v for k, v in data["config"].items() if k not in ("seeds", "jobs", "lr_choice")}
    full = stored_config(gpu_config())
    if only is not None and not isinstance(full.get(only), (list, tuple)):
        raise ValueError(f"only must name the config field that lists the models; got {only!r}")
    data["same_as_gpu_config"] = "lr_choice" in data["config"] and have == full
    data["missing"] = []
    if only is not None and "lr_choice" in data["config"] and not data["same_as_gpu_config"]:
        rest = lambda c: {k: v for k, v in c.items() if k != only}
        made = list(have.get(only, ()))
        if rest(have) == rest(full) and set(made) < set(full[only]):
            data["missing"] = [m for m in full[only] if m not in made]
    data["grid"] = [r for r in data["records"] if r.get("phase") == "grid"]
    data["records"] = [r for r in data["records"] if r.get("phase") != "grid"]
    return data


def load_current(load_stored, name: str, command: str):
    """``load_stored()`` (an experiment's stored GPU run, :func:`load_run`) if the file exists and
    was made with the settings ``gpu_config()`` has now; else ``None``, after printing why and
    ``command``, the line that makes it."""
    try:
        data = load_stored()
    except FileNotFoundError:
        data = None
        print(f"No experiments/results/{name}.json in this copy of the book.")
    if data is not None and data.get("missing"):
        print(f"The stored experiments/results/{name}.json holds today's setting for\n"
              f"some models only; not made yet: {', '.join(map(str, data['missing']))}. Not shown until\n"
              f"complete; to add them: {command} --only {' '.join(map(str, data['missing']))}")
        data = None
    elif data is not None and not data["same_as_gpu_config"]:
        print(f"The stored experiments/results/{name}.json was made with other\n"
              "settings (an earlier version of the experiment): not shown.")
        data = None
    if data is None:
        print(f"To make the stored runs, run on a machine with a CUDA GPU:\n  {command}")
    return data


def _merge_runs(old: dict, new: dict, field: str, base: tuple) -> dict:
    """The run ``new`` (``{"config", "records", "env"}`` as stored: the grid's records and the seeds'
    together), made on some values of the config field ``field``, merged into the stored file
    ``old``: ``old``'s records and chosen rates are kept for the units ``new`` did not run, provided
    both were made with the same settings and seeds (else ``ValueError``: runs of other settings are
    never mixed). Every record keeps the ``env`` of its own run; ``field`` lists the union of the
    values, in ``base``'s order; rows and records in the order of one run of the union."""
    strip = lambda c: {k: v for k, v in c.items() if k not in ("jobs", "lr_choice", field)}
    if "lr_choice" not in old["config"] or strip(old["config"]) != strip(new["config"]):
        raise ValueError("the stored runs were made with other settings or seeds; move the file away to start anew")
    cfg = json.loads(json.dumps(new["config"]))
    done = {row["unit"] for row in cfg["lr_choice"]}
    rows = [row for row in old["config"]["lr_choice"] if row["unit"] not in done] + cfg["lr_choice"]
    cfg[field] = [v for v in base if v in {row[field] for row in rows}]
    keys = [k for k in rows[0] if k not in ("unit", "lr", "scores", "tuned_by")]     # the split fields, in order
    pos = {row["unit"]: tuple(list(cfg[k]).index(row[k]) for k in keys) for row in rows}
    cfg["lr_choice"] = sorted(rows, key=lambda row: pos[row["unit"]])
    recs = [dict(r, env=r.get("env", old["env"])) for r in old["records"] if r["unit"] not in done] \
        + [dict(r, env=r.get("env", new["env"])) for r in new["records"]]
    grid = list(cfg["lr_grid"])
    recs.sort(key=lambda r: (0, pos[r["unit"]], grid.index(r["lr"])) if r["phase"] == "grid"
              else (1, r["seed"], pos[r["unit"]]))
    return {"config": cfg, "records": recs}


def seeds_cli(argv, *, description: str, stored: str, cpu_config, gpu_config, run_seeds, describe, only: str,
              gpu_seeds=(0, 1, 2)) -> int:
    """Every experiment's command line: ``[--gpu] [--seeds ...] [--jobs N] [--only M ...] [--device D]
    [--steps N] [--write]``. ``--gpu`` takes ``gpu_config()`` (else ``cpu_config()``); ``--device``
    and ``--steps`` override it (``--gpu --device cpu --steps 2`` checks the GPU setting's code path
    on a CPU); ``run_seeds(config, seeds, jobs=N)`` runs the grid and the seeds
    (:func:`tune_and_run`; default ``gpu_seeds`` with ``--gpu``, ``[0]`` without); the grid is
    printed by :func:`grid_lines` and each seed record by ``describe(record)``. ``--only`` runs some
    of the values of the config field ``only`` (the models). ``--write`` stores the run, the grid's
    records and the seeds', in ``experiments/results/<stored>.json`` (``<stored>_cpu.json`` without
    ``--gpu``) with the device, date and versions; with ``--only``, merged with what the file holds
    for the other models (:func:`_merge_runs`), so that a long setting can be run a few models per
    call; without, in place of the file. While a ``--write`` run goes, each finished piece is kept
    in ``<stored>.pieces.jsonl`` beside it (``tune_and_run``'s ``pieces``): the same command, run
    again after a time limit cut it off, resumes; the file goes once the results are written."""
    import argparse
    import time
    from dataclasses import replace
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--gpu", action="store_true", help="the larger setting (gpu_config), on CUDA")
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help=f"the seeds run at the chosen rates (default: {list(gpu_seeds)} with --gpu, [0] without)")
    p.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own process")
    p.add_argument("--only", nargs="+", default=None,
                   help=f"run only these {only}; --write keeps the stored runs of the others")
    p.add_argument("--device", default=None, help="run the chosen setting on this device instead")
    p.add_argument("--steps", type=int, default=None, help="override the number of steps")
    p.add_argument("--write", action="store_true",
                   help=f"store the run in experiments/results/{stored}.json (--gpu) or {stored}_cpu.json")
    args = p.parse_args(argv)
    cfg = gpu_config() if args.gpu else cpu_config()
    base = tuple(getattr(cfg, only))
    if args.only:
        if any(m not in base for m in args.only):
            raise SystemExit(f"--only: choose from {base}; got {args.only}")
        cfg = replace(cfg, **{only: tuple(m for m in base if m in args.only)})
    if args.device is not None:
        cfg = replace(cfg, device=args.device)
    if args.steps is not None:
        cfg = replace(cfg, steps=check_int(args.steps, "steps", 1))
    if cfg.device == "cuda" and not torch.cuda.is_available():
        print("--gpu needs a CUDA GPU")
        return 2
    seeds = args.seeds if args.seeds is not None else (list(gpu_seeds) if args.gpu else [0])
    t0 = time.perf_counter()
    name = stored if args.gpu else f"{stored}_cpu"
    path = RESULTS_DIR / f"{name}.json"
    pieces = RESULTS_DIR / f"{name}.pieces.jsonl" if args.write else None   # a cut-off run resumes
    out = run_seeds(cfg, seeds, jobs=args.jobs, pieces=pieces)
    lines = grid_lines(out["config"])
    if lines:
        print(f"learning-rate grid on seed {cfg.grid_seed}, held-out score per rate (* chosen):", *lines, sep="\n")
    for r in out["records"]:
        print(describe(r) + f"  ({r['train_seconds']:.0f} s)")
    print(f"{len(seeds)} seeds" + (f" after a grid of {len(cfg.lr_grid)} rates" if lines else "")
          + f": {time.perf_counter() - t0:.0f} s")
    if args.write:
        from kernels import results
        new = {"config": out["config"], "records": out["grid"] + out["records"], "env": results.environment()}
        if args.only and path.exists():
            new = _merge_runs(results.load_results(path), new, only, base)
        print("wrote", results.write_results(path, name, new["config"], new["records"]))
        pieces.unlink(missing_ok=True)
    return 0
