"""MesaNet against the delta rule in associative recall, at equal key size (Chapter 10).

Chapter 6's recall experiment (:mod:`experiments.mqar`: the task, the one-layer models, the rate
grid and the seeds) with DeltaNet, Gated DeltaNet and MesaNet. MesaNet gets the same key and value
size as the delta-rule models (``mesa_dims="d_k"``): its two states ``H_t`` (``d_k × d_k``) and
``G_t`` (``d_v × d_k``) then hold twice their numbers, and the state size is reported beside every
accuracy. An earlier version of this comparison gave MesaNet the same *state* instead, which halves
its ``d_k``; at half the key size it came last, which measured the key size, not the update.

Two tasks, scored on the same trained models:

* **written once** (``N`` keys, each written once): the capacity regime, where a least-squares
  memory that fits every pair jointly should do at least as well as the delta rule's one-step
  corrections;
* **rewrites** (``N`` keys written ``R`` times, each time with a fresh value; the query asks for
  the latest): an ungated least-squares memory averages a key's old and new values (Chapter 10's
  equation for the average), while the delta rule erases the old one; MesaNet's gates can forget
  the old value only by forgetting everything as old.

**The claims** (:func:`claims`), fixed before the GPU run. The first is a measurement of the
models; the other two are hypotheses the run tests, and the chapter states whichever way they
come out:

1. at equal ``d_k`` MesaNet's state is twice the delta rule's;
2. written once, MesaNet's mean accuracy (over ``N``) is at least the better delta-rule model's
   minus 0.05, at every ``d_k``, in the mean over seeds;
3. with rewrites at the largest ``R``, the better delta-rule model beats MesaNet by at least 0.05
   at every ``d_k``, in every seed.

Entry points: :func:`cpu_config`, :func:`gpu_config`, :func:`run_seeds`, :func:`claims`,
:func:`load_stored` and ``python -m experiments.mesa_recall [--gpu] [--jobs N] [--write]``.
"""
from __future__ import annotations

from .common import MODEL_NAMES, claim, load_run, seeds_cli
from . import mqar

__all__ = ["MIXERS", "PAPER_CLAIM", "cpu_config", "gpu_config", "run_seeds", "summary", "claims",
           "plot_write_once", "plot_rewrites", "STORED", "COMMAND", "load_stored", "main"]

MIXERS = ("deltanet", "gated_deltanet", "mesanet")
DELTA = ("deltanet", "gated_deltanet")
STORED = "mqar_mesanet"          # experiments/results/mqar_mesanet.json: the GPU run
COMMAND = "python -m experiments.mesa_recall --gpu --jobs 16 --write"

#: MesaNet's paper's own claim, labelled as theirs.
PAPER_CLAIM = ("The MesaNet paper (von Oswald et al., 2025) reports that solving the in-context "
               "regression to optimality at every token gives lower perplexity than earlier recurrent "
               "models, Gated DeltaNet among them, and better scores on recall-heavy and long-context "
               "tasks, at the price of more computation per token; on synthetic in-context tasks it "
               "reports MesaNet matching or beating the other linear recurrent models.")


def cpu_config(**changes) -> mqar.RecallConfig:
    """The live setting: Chapter 6's CPU setting (:func:`experiments.mqar.cpu_config`) with the three
    mixers, every one at ``d_k = d_v = 8`` (MesaNet's state: 128 numbers, the others' 64)."""
    return mqar.cpu_config(**{"mixers": MIXERS, **changes})


def gpu_config(**changes) -> mqar.RecallConfig:
    """The stored setting: Chapter 6's GPU setting (:func:`experiments.mqar.gpu_config`) with the three
    mixers at ``d_k = d_v`` = 16 and 32 (MesaNet's states 512 and 2048 numbers, the others' 256 and
    1024): ``python -m experiments.mesa_recall --gpu --jobs 16 --write`` (9 grid runs, 18 seed runs;
    321 s on one H200 at ``--jobs 14``, 2026-11-29)."""
    return mqar.gpu_config(**{"mixers": MIXERS, "head_dims": (16, 32), "tune_head_dim": 16, **changes})


def run_seeds(config: mqar.RecallConfig, seeds, *, jobs: int = 1, pieces=None) -> dict:
    """:func:`experiments.mqar.run_seeds`: the rate grid on the held-out seed, then the seeds."""
    return mqar.run_seeds(config, seeds, jobs=jobs, pieces=pieces)


summary = mqar.summary
plot_write_once = mqar.plot_write_once
plot_rewrites = mqar.plot_rewrites


def claims(run: dict) -> list[dict]:
    """Chapter 10's claims about a run (see the module docstring), each as
    :func:`experiments.common.claim`. The run must hold MesaNet and at least one delta-rule model."""
    s = mqar.summary(run)
    have = [m for m in DELTA if m in s["mixers"]]
    if "mesanet" not in s["mixers"] or not have:
        raise ValueError(f"run must hold mesanet and one of {DELTA}; it has {s['mixers']}")
    dims, seeds = s["head_dims"], s["seeds"]
    N, Rs, once = mqar._rewrite_setting(s)
    out = []
    ratio = {h: s["state_size"][f"mesanet@{h}"] / s["state_size"][f"{have[0]}@{h}"] for h in dims}
    out.append(claim("At equal d_k MesaNet's state (H and G) is twice the delta rule's.",
                     all(r == 2 for r in ratio.values()),
                     ", ".join(f"{s['state_size'][f'mesanet@{h}']} against {s['state_size'][f'{have[0]}@{h}']} "
                               f"numbers (d_k = {h})" for h in dims)))
    if once:
        idx = [mqar._at(s, p) for p in once]
        wo = lambda u: sum(s["mean"][u][i] for i in idx) / len(idx)
        gap = {h: wo(f"mesanet@{h}") - max(wo(f"{m}@{h}") for m in have) for h in dims}
        worst = min(gap, key=gap.get)
        out.append(claim(f"Written once (N = {', '.join(str(p[0]) for p in once)}), MesaNet recalls at least as well "
                         "as the better delta-rule model, less 0.05, at every d_k (mean over N and seeds).",
                         gap[worst] >= -0.05,
                         "MesaNet minus the better delta-rule model: "
                         + ", ".join(f"{gap[h]:+.3f} (d_k = {h})" for h in dims)))
    if N is not None:
        top = max(Rs)
        i = mqar._at(s, (N, top))
        gaps = {(h, sd): max(s["by_seed"][f"{m}@{h}"][sd][i] for m in have) - s["by_seed"][f"mesanet@{h}"][sd][i]
                for h in dims for sd in seeds}
        worst = min(gaps.values())
        names = " and ".join(MODEL_NAMES[m] for m in have)
        out.append(claim(f"With rewrites ({N} keys written {top} times), the better of {names} recalls the latest "
                         "value better than MesaNet by at least 0.05 at every d_k, in every seed.", worst >= 0.05,
                         f"smallest margin {worst:+.3f} over {len(seeds)} seeds; mean margins "
                         + ", ".join(f"{sum(gaps[h, sd] for sd in seeds) / len(seeds):+.3f} (d_k = {h})"
                                     for h in dims)))
    return out


def load_stored() -> dict:
    """The stored GPU run (``experiments/results/mqar_mesanet.json``) with ``same_as_gpu_config``;
    ``FileNotFoundError`` naming the command that writes it when this copy of the book has none."""
    return load_run(STORED, gpu_config, COMMAND, only="mixers")


def main(argv=None) -> int:
    """``python -m experiments.mesa_recall [--gpu] [--seeds ...] [--jobs N] [--only M ...] [--device D]
    [--steps N] [--write]`` (:func:`experiments.common.seeds_cli`)."""
    return seeds_cli(argv, description="Chapter 10: MesaNet against the delta rule in associative recall at "
                                       "equal d_k (written once and with rewrites)",
                     stored=STORED, cpu_config=cpu_config, gpu_config=gpu_config, run_seeds=run_seeds,
                     describe=mqar.describe, only="mixers")


if __name__ == "__main__":
    raise SystemExit(main())
