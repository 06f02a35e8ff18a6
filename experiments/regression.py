"""In-context linear regression, trained: the Mesa layer's own task (Chapter 10).

Each sequence draws its own linear map ``W`` (``d_y × d_x``, entries ``N(0, 1/d_x)``, so that a
target has unit variance per coordinate) and lists pairs ``(x_i, y_i)`` with ``x_i ~ N(0, I)`` and
``y_i = W x_i + σ ε_i`` (``ε_i ~ N(0, I)``; ``σ = 0`` is the clean task). After the ``t``-th pair
comes a query ``x'_t ~ N(0, I)`` whose answer is ``W x'_t`` (without noise), so the model's error
at query ``t`` is its error after ``t`` pairs. Tokens are vectors, ``[x_i, y_i, 0]`` for a pair and
``[x'_t, 0, 1]`` for a query (:func:`make_regression`); nothing is downloaded.

**The model** (:class:`RegressionModel`): a linear embedding, one token mixer of
:class:`experiments.mqar.TokenMixer` (no convolution: a pair is one token) and a linear read-out of
``y``; linear attention, DeltaNet and MesaNet differ only in the state update, all with
``d_k = d_v = head_dim`` (MesaNet's state is twice the others'). The mixer runs with
``qk_norm="nlms"``: the keys are normalised and the values divided by the key's norm (the
normalised-LMS write), the queries are left as they are, so that a state which maps unit keys to
scaled values predicts ``W x'`` from a raw query; a model must learn to route ``x`` into the keys
and queries, ``y`` into the values, and to write nothing at a query (its ``beta`` or its value).
It is trained on the mean squared error at the queries.

**The reference** (:func:`ridge_error`): the exact ridge regression on the pairs seen so far, with
``λ = σ² d_x`` (``1e-6`` on the clean task), on the same test sequences. With that ``λ`` it is the
posterior mean of ``W`` under the task's own prior (entries of variance ``1/d_x``), so no predictor
does better on average: the Mesa layer's ideal, and a floor for every model.

**The claims** (:func:`claims`), fixed before the GPU run, in every seed:

1. clean: over the queries after at least ``2 d_x`` pairs, MesaNet's mean error is at most half of
   DeltaNet's (the regression is solved once the pairs determine ``W``; the delta rule gets there
   one projection at a time);
2. noisy: after the last pair, MesaNet's error is below DeltaNet's (least squares averages the
   noise, a delta-rule write keeps part of each noisy value);
3. clean: after the last pair, DeltaNet's error is below linear attention's (the delta rule
   corrects what it has stored; linear attention only adds).

Entry points: :func:`make_regression`, :class:`RegressionModel`, :func:`train_regression`,
:func:`run_seeds`, :func:`summary`, :func:`claims`, :func:`plot_errors`, :func:`load_stored`, and
``python -m experiments.regression [--gpu] [--jobs N] [--write]``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from .common import (MODEL_COLORS, MODEL_NAMES, TunedConfig, check_int, claim, derived_seeds, fit, load_run,
                     loss_curves, seeds_cli, summarize_seeds, torch_threads, tune_and_run)
from .mqar import TokenMixer

__all__ = ["MIXERS", "PAPER_CLAIM", "make_regression", "ridge_error", "RegressionModel", "RegressionConfig",
           "cpu_config", "gpu_config", "unit", "train_regression", "run_one", "run_seeds", "summary", "claims",
           "plot_errors", "STORED", "COMMAND", "load_stored", "main"]

MIXERS = ("linear", "deltanet", "mesanet")
STORED = "regression"            # experiments/results/regression.json: the GPU run
COMMAND = "python -m experiments.regression --gpu --jobs 18 --write"

#: The Mesa layer's authors' own claim, labelled as theirs.
PAPER_CLAIM = ("The Mesa layer's authors (von Oswald et al., 2023; 2025) present it as the layer that "
               "solves in-context linear regression to optimality at every token, a ridge least-squares "
               "fit to the pairs so far, where a linear-attention layer amounts to one gradient step "
               "and the delta rule to one step per pair; they find Transformers trained on such tasks "
               "learn to approximate this solution.")


# ---------------------------------------------------------------------------------------------
# data and the exact reference
# ---------------------------------------------------------------------------------------------
def make_regression(d_x: int, d_y: int, n_pairs: int, batch: int, seed: int, noise: float = 0.0, device=None):
    """A batch of in-context regression sequences. Returns ``(inputs, targets, W, xs, ys, xq)``:
    ``inputs`` ``[batch, 2 n_pairs, d_x + d_y + 1]`` (pair ``t`` at position ``2t``, its query at
    ``2t + 1``), ``targets`` ``[batch, n_pairs, d_y]`` (``W x'_t``), the maps ``W`` ``[batch, d_y,
    d_x]``, the pairs ``xs``, ``ys`` and the queries ``xq``. The same ``seed`` gives the same batch."""
    d_x, d_y = check_int(d_x, "d_x", 1), check_int(d_y, "d_y", 1)
    n = check_int(n_pairs, "n_pairs", 1)
    batch = check_int(batch, "batch", 1)
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not noise >= 0:
        raise ValueError(f"noise must be a number >= 0; got {noise!r}")
    gen = torch.Generator().manual_seed(int(seed))
    W = torch.randn(batch, d_y, d_x, generator=gen) / d_x ** 0.5
    xs = torch.randn(batch, n, d_x, generator=gen)
    ys = torch.einsum("byx,bnx->bny", W, xs) + noise * torch.randn(batch, n, d_y, generator=gen)
    xq = torch.randn(batch, n, d_x, generator=gen)
    inputs = torch.zeros(batch, 2 * n, d_x + d_y + 1)
    inputs[:, 0::2, :d_x], inputs[:, 0::2, d_x:d_x + d_y] = xs, ys
    inputs[:, 1::2, :d_x], inputs[:, 1::2, -1] = xq, 1.0
    targets = torch.einsum("byx,bnx->bny", W, xq)
    out = (inputs, targets, W, xs, ys, xq)
    return tuple(t.to(device) for t in out) if device is not None else out


def ridge_error(xs, ys, xq, targets, lam: float) -> list[float]:
    """The exact ridge regression after each number of pairs ``t``: ``Ŵ_t = Y_tᵀ X_t (X_tᵀ X_t +
    λ I)^{-1}`` on the first ``t`` pairs, its prediction ``Ŵ_t x'_t`` against ``W x'_t``; the mean
    squared error per coordinate over the batch, one value per ``t`` (float64)."""
    if not lam > 0:
        raise ValueError(f"lam must be > 0; got {lam!r}")
    xs, ys, xq, targets = (t.detach().double().cpu() for t in (xs, ys, xq, targets))
    d_x = xs.shape[-1]
    H = torch.cumsum(torch.einsum("bni,bnj->bnij", xs, xs), 1) + lam * torch.eye(d_x, dtype=torch.float64)
    G = torch.cumsum(torch.einsum("bny,bnx->bnyx", ys, xs), 1)
    sol = torch.linalg.solve(H, xq.unsqueeze(-1))                            # (H_t + λI)^{-1} x'_t
    pred = (G @ sol).squeeze(-1)
    return ((pred - targets) ** 2).mean((0, 2)).tolist()


# ---------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------
class RegressionModel(nn.Module):
    """A linear embedding of ``[x, y, flag]`` → one token mixer (``qk_norm="nlms"``, no convolution)
    → a linear read-out of ``d_y`` numbers; ``forward(inputs)`` returns the predictions at the
    queries (the odd positions), ``[B, n_pairs, d_y]``."""

    def __init__(self, mixer: str, d_x: int, d_y: int, d_model: int = 32, head_dim: int = 8, backend=None):
        super().__init__()
        self.embed = nn.Linear(d_x + d_y + 1, d_model, bias=False)
        self.mix = TokenMixer(mixer, d_model, 1, head_dim, conv_width=1, backend=backend, qk_norm="nlms")
        self.head = nn.Linear(d_model, d_y)

    def forward(self, inputs):
        return self.head(self.mix(self.embed(inputs))[:, 1::2])


# ---------------------------------------------------------------------------------------------
# the setting and the runs
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RegressionConfig(TunedConfig):
    """The models (``mixers`` × ``noises``: the clean and the noisy task train separate models), the
    task (``d_x``, ``d_y``, ``n_pairs``), the width and the training; defaults: the CPU setting."""

    mixers: tuple = MIXERS
    noises: tuple = (0.0, 0.5)
    d_x: int = 8
    d_y: int = 8
    n_pairs: int = 32
    d_model: int = 32
    head_dim: int = 8
    steps: int = 400
    batch: int = 32
    lr: float = 1e-2
    lr_grid: tuple = (1e-2,)
    eval_on: str = "test"
    weight_decay: float = 0.0
    eval_batch: int = 512
    threads: int | None = 1
    backend: str | None = None
    loss_every: int = 10


def _check(cfg: RegressionConfig) -> None:
    if not cfg.mixers or any(m not in MIXERS for m in cfg.mixers):
        raise ValueError(f"mixers must be drawn from {MIXERS}; got {cfg.mixers!r}")
    if not cfg.noises or any(isinstance(s, bool) or not isinstance(s, (int, float)) or not s >= 0 for s in cfg.noises):
        raise ValueError(f"noises must be numbers >= 0; got {cfg.noises!r}")
    check_int(cfg.head_dim, "head_dim", 1)
    if cfg.head_dim < max(cfg.d_x, cfg.d_y):
        raise ValueError(f"head_dim must be >= d_x and d_y ({max(cfg.d_x, cfg.d_y)}) so that a head holds the "
                         f"regression; got {cfg.head_dim}")
    if cfg.d_model < cfg.d_x + cfg.d_y + 1:
        raise ValueError(f"d_model must be >= d_x + d_y + 1 = {cfg.d_x + cfg.d_y + 1}; got {cfg.d_model}")
    check_int(cfg.n_pairs, "n_pairs", 1)
    check_int(cfg.loss_every, "loss_every", 1)


def cpu_config(**changes) -> RegressionConfig:
    """The live setting: ``d_x = d_y = 8``, 32 pairs (64 tokens), ``d_k = d_v = 8``, noise σ = 0 and
    0.5, linear attention, DeltaNet and MesaNet, 400 steps of 32 sequences at one rate, ``1e-2``."""
    return replace(RegressionConfig(), **changes)


def gpu_config(**changes) -> RegressionConfig:
    """The stored setting: ``d_x = d_y = 16``, 64 pairs (128 tokens), ``d_k = d_v = 16``, width 64,
    1000 steps of 128 sequences; the rate per model (mixer and task) from ``(1e-3, 3e-3, 1e-2)`` on
    the held-out seed 1000, then seeds 0, 1, 2: ``python -m experiments.regression --gpu --jobs 18
    --write`` (18 grid runs, 18 seed runs, one wave of processes each; 67 s on one H200 at
    ``--jobs 12``, 2026-11-29)."""
    base = RegressionConfig(d_x=16, d_y=16, n_pairs=64, d_model=64, head_dim=16, steps=1000, batch=128, lr=3e-3,
                            lr_grid=(1e-3, 3e-3, 1e-2), eval_batch=1024, threads=1, device="cuda")
    return replace(base, **changes)


def _task(noise: float) -> str:
    return "clean" if noise == 0 else f"noise {noise:g}"


def unit(mixer: str, noise: float) -> str:
    """A model's name in a run's records, one per mixer and task: ``"deltanet/clean"``,
    ``"deltanet/noise 0.5"``."""
    return f"{mixer}/{_task(noise)}"


_EVAL_OFFSET, _VALID_OFFSET = 600_001, 800_001


def train_regression(mixer: str, noise: float, config: RegressionConfig | None = None, *, progress=None) -> dict:
    """Train one model (``mixer``) on the task with noise ``noise`` at ``config.lr`` and score it on
    one held-out batch of the stream ``config.eval_on``. Returns ``{mixer, noise, task, pairs (1 ..
    n_pairs), error (mean squared error per coordinate after each number of pairs), ridge (the exact
    ridge regression's, :func:`ridge_error` with ``λ = σ² d_x``, at least ``1e-6``, on the same
    sequences: the posterior mean, the best error on average), state_size, train_seconds,
    final_loss, loss_curves, model}``."""
    cfg = config or cpu_config()
    if mixer not in MIXERS:
        raise ValueError(f"mixer must be one of {MIXERS}; got {mixer!r}")
    _check(cfg)
    init_seed, data_seed, _ = derived_seeds(cfg.seed, _EVAL_OFFSET)
    eval_seed = derived_seeds(cfg.seed, _EVAL_OFFSET if cfg.eval_on == "test" else _VALID_OFFSET)[2]
    with torch_threads(cfg.threads):
        torch.manual_seed(init_seed)
        model = RegressionModel(mixer, cfg.d_x, cfg.d_y, cfg.d_model, cfg.head_dim, cfg.backend).to(cfg.device)

        def batch_loss(step):
            x, y = make_regression(cfg.d_x, cfg.d_y, cfg.n_pairs, cfg.batch, data_seed + step, noise,
                                   device=cfg.device)[:2]
            return F.mse_loss(model(x), y)
        losses, train_s = fit(model, cfg, batch_loss, progress=progress, label=dict(mixer=mixer))
        xe, ye, _, xs, ys, xq = make_regression(cfg.d_x, cfg.d_y, cfg.n_pairs, cfg.eval_batch, eval_seed, noise,
                                                device=cfg.device)
        model.eval()
        with torch.no_grad():
            err = ((model(xe) - ye) ** 2).mean((0, 2)).float().cpu().tolist()
        model.train()
        from .mqar import state_size
        size = state_size(model)
    tail = losses[-20:]
    return {"mixer": mixer, "noise": float(noise), "task": _task(noise), "pairs": list(range(1, cfg.n_pairs + 1)),
            "error": err, "ridge": ridge_error(xs, ys, xq, ye, max(noise ** 2 * cfg.d_x, 1e-6)),
            "state_size": size, "train_seconds": train_s, "final_loss": float(sum(tail) / max(1, len(tail))),
            "loss_curves": loss_curves(losses, [_task(noise)] * len(losses), cfg.loss_every), "model": model}


def run_one(config: RegressionConfig) -> dict:
    """Every model of ``config`` (mixers × noises) trained once at ``config.lr`` with ``config.seed``:
    ``{"records", "seconds"}`` without the models (module level, for spawned processes)."""
    t0 = time.perf_counter()
    recs = []
    for m in config.mixers:
        for s in config.noises:
            r = train_regression(m, s, config)
            r.pop("model")
            recs.append(r)
    return {"records": recs, "seconds": time.perf_counter() - t0}


def _score(record: dict) -> float:
    """The grid's score: minus the mean error over every number of pairs (higher is better)."""
    return -sum(record["error"]) / len(record["error"])


def run_seeds(config: RegressionConfig, seeds, *, jobs: int = 1, pieces=None) -> dict:
    """:func:`experiments.common.tune_and_run` for every model of ``config`` (one per mixer and
    task, named by :func:`unit`), the grid scored by the mean error over every number of pairs on
    the validation stream. Returns ``{"config", "grid", "records", "seconds"}``."""
    _check(config)
    return tune_and_run(config, seeds, run_one, split=("mixers", "noises"), label=unit, score=_score, jobs=jobs, pieces=pieces)


# ---------------------------------------------------------------------------------------------
# what a run shows
# ---------------------------------------------------------------------------------------------
def summary(run: dict) -> dict:
    """Per model (unit), over the seeds: the mean, smallest and largest error after each number of
    pairs (:func:`experiments.common.summarize_seeds`, lower is better), with ``by_seed[unit][seed]``,
    ``ridge[task]`` (the exact ridge regression's error, the mean over the seeds), ``mixers``,
    ``tasks`` and ``state_size`` per unit."""
    recs = run["records"]
    out = summarize_seeds(recs, "unit", "pairs", value_key="error", higher_is_better=False)
    out["mixers"] = list(dict.fromkeys(r["mixer"] for r in recs))
    out["tasks"] = list(dict.fromkeys(r["task"] for r in recs))
    out["state_size"] = {r["unit"]: r["state_size"] for r in recs}
    out["by_seed"], ridge = {}, {}
    for r in recs:
        out["by_seed"].setdefault(r["unit"], {})[r["seed"]] = r["error"]
        ridge.setdefault(r["task"], {})[r["seed"]] = r["ridge"]
    out["ridge"] = {t: [sum(c) / len(c) for c in zip(*by.values())] for t, by in ridge.items()}
    return out


def claims(run: dict) -> list[dict]:
    """Chapter 10's claims about a run (see the module docstring), each as
    :func:`experiments.common.claim`; a claim whose models or task the run lacks is left out."""
    s = summary(run)
    cfg = run["config"]
    seeds, pairs = s["seeds"], s["pairs"]
    noisy = [t for t in s["tasks"] if t != "clean"]
    have = set(s["mixers"])
    out = []
    if {"mesanet", "deltanet"} <= have and "clean" in s["tasks"]:
        start = 2 * cfg["d_x"]
        idx = [i for i, p in enumerate(pairs) if p >= start] or [len(pairs) - 1]
        m = lambda u, sd: sum(s["by_seed"][u][sd][i] for i in idx) / len(idx)
        ratio = {sd: m("mesanet/clean", sd) / m("deltanet/clean", sd) for sd in seeds}
        worst = max(ratio.values())
        out.append(claim(f"Clean pairs: after at least {start} pairs (2 d_x), MesaNet's mean error is at most half "
                         "of DeltaNet's, in every seed.", worst <= 0.5,
                         f"MesaNet / DeltaNet: at most {worst:.3f} over {len(seeds)} seeds (MesaNet "
                         f"{sum(m('mesanet/clean', sd) for sd in seeds) / len(seeds):.4f}, DeltaNet "
                         f"{sum(m('deltanet/clean', sd) for sd in seeds) / len(seeds):.4f} in the mean)"))
    for t in noisy:
        if {"mesanet", "deltanet"} <= have:
            gap = {sd: s["by_seed"][f"deltanet/{t}"][sd][-1] - s["by_seed"][f"mesanet/{t}"][sd][-1] for sd in seeds}
            worst = min(gap.values())
            out.append(claim(f"Noisy pairs ({t}): after the last pair ({pairs[-1]}), MesaNet's error is below "
                             "DeltaNet's, in every seed.", worst > 0,
                             f"DeltaNet minus MesaNet: at least {worst:+.4f} (means: MesaNet "
                             f"{s['mean'][f'mesanet/{t}'][-1]:.4f}, DeltaNet {s['mean'][f'deltanet/{t}'][-1]:.4f}, "
                             f"exact ridge {s['ridge'][t][-1]:.4f})"))
    if {"deltanet", "linear"} <= have and "clean" in s["tasks"]:
        gap = {sd: s["by_seed"]["linear/clean"][sd][-1] - s["by_seed"]["deltanet/clean"][sd][-1] for sd in seeds}
        worst = min(gap.values())
        out.append(claim(f"Clean pairs: after the last pair ({pairs[-1]}), DeltaNet's error is below linear "
                         "attention's, in every seed.", worst > 0,
                         f"linear attention minus DeltaNet: at least {worst:+.4f} (means: DeltaNet "
                         f"{s['mean']['deltanet/clean'][-1]:.4f}, linear attention "
                         f"{s['mean']['linear/clean'][-1]:.4f})"))
    return out


def plot_errors(s: dict, task: str, ax, title: str | None = None):
    """Error against the number of pairs seen (log scale) on ``task``, one line per model in the
    book's colours (the mean over the seeds, the band from the smallest to the largest seed), and
    the exact ridge regression dashed (clipped at a fifth of the lowest model error)."""
    for m in s["mixers"]:
        u = f"{m}/{task}"
        ax.plot(s["pairs"], s["mean"][u], color=MODEL_COLORS[m], label=MODEL_NAMES[m])
        ax.fill_between(s["pairs"], s["min"][u], s["max"][u], color=MODEL_COLORS[m], alpha=0.15)
    ax.plot(s["pairs"], s["ridge"][task], "--", color="black", lw=1, label="exact ridge regression")
    ax.set_yscale("log")
    low = min(min(s["min"][f"{m}/{task}"]) for m in s["mixers"])     # the ridge may go far below: clip it
    ax.set_ylim(bottom=max(low / 5, 1e-6))
    ax.set_xlabel("pairs seen")
    ax.set_ylabel("squared error per coordinate")
    ax.set_title(title or task, fontsize=10)
    ax.legend(fontsize=8)
    return ax


def load_stored() -> dict:
    """The stored GPU run (``experiments/results/regression.json``) with ``same_as_gpu_config``;
    ``FileNotFoundError`` naming the command that writes it when this copy of the book has none."""
    return load_run(STORED, gpu_config, COMMAND, only="mixers")


def describe(r: dict) -> str:
    """One line for a record: seed, model, task, error after a few numbers of pairs."""
    n = len(r["pairs"])
    at = sorted({0, n // 4, n // 2, n - 1})
    return (f"seed {r['seed']} {r['mixer']:>9} {r['task']:>9} lr={r['lr']:g}: "
            + "  ".join(f"t={r['pairs'][i]}: {r['error'][i]:.4f} (ridge {r['ridge'][i]:.4f})" for i in at))


def main(argv=None) -> int:
    """``python -m experiments.regression [--gpu] [--seeds ...] [--jobs N] [--only M ...] [--device D]
    [--steps N] [--write]`` (:func:`experiments.common.seeds_cli`)."""
    return seeds_cli(argv, description="Chapter 10: trained in-context linear regression (linear attention, "
                                       "DeltaNet, MesaNet), clean and noisy",
                     stored=STORED, cpu_config=cpu_config, gpu_config=gpu_config, run_seeds=run_seeds,
                     describe=describe, only="mixers")


if __name__ == "__main__":
    raise SystemExit(main())
