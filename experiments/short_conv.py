"""Keys equal to values, and the short convolution that rescues them (Chapter 10's experiment).

The chapter argues (after Su's post on short convolutions) that test-time training learns nothing
when a layer's keys equal its values: the pairs ``(k_t, v_t)`` are then ``(k_t, k_t)`` and the best
state is the identity. A short convolution on the keys turns the pairs into ``(k_{t-1}, v_t)``-like
ones, "predict the neighbour", which is what recall needs. This experiment asks it of trained
one-layer DeltaNet models whose keys and values come from **one** projection of the token.

**The task** is Chapter 6's multi-query associative recall (:func:`experiments.mqar.make_mqar`):
``k_1 v_1 k_2 v_2 ... k_N v_N`` then some of the keys again, each to be answered with its value.
At a value token the layer must store "the key just before me ↦ me", a pair of neighbours.

**The models** (:class:`ConvAblationModel`) are Chapter 6's one-layer MQAR model with a DeltaNet
mixer (:class:`TiedDeltaNetMixer`, ``kernels.chunk_delta_rule``: its differentiable PyTorch path on
a CPU, its Triton kernel on a GPU) whose keys and values share one projection ``u_t = W x_t``:

    k_t = normalize(SiLU(conv_K(u)_t)),   v_t = normalize(SiLU(conv_V(u)_t)),
    q_t = normalize(SiLU(conv_Q(W_q x)_t)),

where each ``conv_*`` is a causal depthwise convolution of width ``conv_width`` or, where the variant
has none, the identity (SiLU and the normalisation are kept either way, so that a variant differs
from ``"none"`` by its convolution alone). With no convolution on K or V, ``k_t = v_t`` exactly.
Values are L2-normalised like the keys so that this holds (fla's layers leave values unnormalised).
The variants (:data:`VARIANTS`):

==========  ===================================================================================
``none``    K = V, no convolution
``q``       a convolution on Q only (still K = V)
``k``       a convolution on K only
``v``       a convolution on V only
``qkv``     a convolution on each of Q, K, V (what DeltaNet's layers do)
``untied``  no convolution, but K and V from two projections (``k_t != v_t``, both from ``x_t``)
==========  ===================================================================================

The convolutions are the book's op :func:`kernels.causal_conv1d` (fla's argument order and
layout: its differentiable PyTorch path on a CPU, the Triton kernel on a GPU), checked against
:func:`lattn_core.short_conv` in ``tests/test_kernel_conv.py``.
Their weights start as ``torch.nn.Conv1d``'s do (uniform in ``±1/sqrt(width)``), so no variant
starts with the shift built in. :func:`identity_gap` measures how far a trained layer's final
state is from the identity.

**How the setting was chosen.** The question, the task (Chapter 6's MQAR generator, unchanged) and
the variants were fixed before any model was trained. The CPU setting keeps Chapter 6's vocabulary
and sequence length and a state of ``16 x 16`` (head size 16, no smaller than the largest ``N``, so
that capacity is not what is measured). Its first run, 300 steps (set by timing training steps),
taught no variant the task, the one with a convolution on K included; 1500 steps did teach that
one. The number of steps was then set to 800: the fewest, of 500, 700, 800 and 1000, at which the
variants with a convolution on K (alone, and on Q, K, V) learned the task on each of seeds 0, 1
and 2; the other variants get the same budget. ``"untied"`` was moved to the GPU setting for time,
and the ``1/N`` guess (:func:`guess_baseline`) was added to the plot after the first runs put the
K = V models at that level. Nothing else was changed. The GPU setting is larger in every direction
(longer sequences, more pairs, more possible keys, a wider model, more steps, several seeds); it was
written before it was run on a GPU. In a one-layer model the outcome is close to structural: only a
convolution on the keys can put the previous token into a pair that a later query reads, so the
experiment measures that training finds that solution and that the other convolutions do not
substitute for it, not a subtle effect.

Entry points: :func:`train_model`, :func:`run_short_conv` (one seed, every variant),
:func:`run_seeds`, :func:`seed_summary`, :func:`plot_summary`, :func:`summary_sentences`,
:func:`load_stored` (the GPU runs in ``experiments/results/short_conv.json``), and
``python -m experiments.short_conv`` (``--gpu`` for the larger setting, ``--write`` to store it with
the device, date and versions; ``--gpu --device cpu --steps 2`` checks the GPU setting's code path
on a CPU: its evaluation batches of 1024 sequences of 256 tokens make that about a minute and a half
per seed on the book's 2-core machine, three seeds by default).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from .common import (TrainConfig, check_int, derived_seeds, fit, load_stored_runs, run_each_seed, seeds_cli,
                     summarize_seeds, torch_threads, train_each)
from .mqar import make_mqar

__all__ = ["VARIANTS", "CPU_VARIANTS", "NAMES", "guess_baseline", "STORED", "ShortConvolution", "TiedDeltaNetMixer", "ConvAblationModel", "identity_gap",
           "ShortConvConfig", "cpu_config", "gpu_config", "evaluate", "train_model", "run_short_conv",
           "run_seeds", "seed_summary", "check_claims", "plot_summary", "summary_sentences", "load_stored",
           "main"]

STORED = "short_conv"          # experiments/results/short_conv.json: the GPU runs
VARIANTS = ("none", "q", "k", "v", "qkv", "untied")
CPU_VARIANTS = VARIANTS[:5]    # the live run leaves out "untied" (time)
NAMES = {"none": "K = V, no conv", "q": "K = V, conv on Q", "k": "conv on K", "v": "conv on V",
         "qkv": "conv on Q, K, V", "untied": "K ≠ V, no conv"}
CONVS = {"none": "", "q": "q", "k": "k", "v": "v", "qkv": "qkv", "untied": ""}


class ShortConvolution(nn.Module):
    """A learned :func:`kernels.causal_conv1d` of width ``width`` on ``dim`` channels, no bias, its weight
    ``[dim, width]`` initialised as ``torch.nn.Conv1d``'s (uniform in ``±1/sqrt(width)``)."""

    def __init__(self, dim: int, width: int):
        super().__init__()
        self.width = check_int(width, "width", 1)
        bound = 1.0 / math.sqrt(width)
        self.weight = nn.Parameter(torch.empty(dim, width).uniform_(-bound, bound))

    def forward(self, x):
        import kernels
        return kernels.causal_conv1d(x, self.weight)[0]


# ---------------------------------------------------------------------------------------------
# the models
# ---------------------------------------------------------------------------------------------
class TiedDeltaNetMixer(nn.Module):
    """One DeltaNet layer whose keys and values share a projection (see the module docstring);
    ``variant`` picks where the short convolutions sit. ``n_heads`` heads of size ``head_dim``,
    ``beta_t = sigmoid(W_b x_t)`` per head, ``scale = 1`` (keys and queries are unit vectors)."""

    def __init__(self, variant: str, d_model: int, n_heads: int, head_dim: int, conv_width: int = 4,
                 backend=None):
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}; got {variant!r}")
        self.variant, self.H, self.D, self.backend = variant, n_heads, head_dim, backend
        inner = n_heads * head_dim
        self.q_proj = nn.Linear(d_model, inner, bias=False)
        self.kv_proj = nn.Linear(d_model, inner, bias=False)             # keys and values: u_t
        self.v_proj = nn.Linear(d_model, inner, bias=False) if variant == "untied" else None
        self.convs = nn.ModuleDict({c: ShortConvolution(inner, conv_width) for c in CONVS[variant]})
        self.b_proj = nn.Linear(d_model, n_heads)
        self.o_proj = nn.Linear(inner, d_model, bias=False)

    def _branch(self, name, t):
        if name in self.convs:
            t = self.convs[name](t)
        t = F.silu(t).reshape(t.shape[0], t.shape[1], self.H, self.D)
        return F.normalize(t, dim=-1)

    def qkv(self, x):
        """``q, k, v`` as the layer feeds them to the delta rule, ``[B, T, H, head_dim]`` each."""
        u = self.kv_proj(x)
        q = self._branch("q", self.q_proj(x))
        k = self._branch("k", u)
        v = self._branch("v", self.v_proj(x) if self.v_proj is not None else u)
        return q, k, v

    def forward(self, x, output_final_state: bool = False):
        import kernels
        q, k, v = self.qkv(x)
        beta = torch.sigmoid(self.b_proj(x))
        o, S = kernels.chunk_delta_rule(q, k, v, beta, scale=1.0, output_final_state=output_final_state,
                                        backend=self.backend)
        o = self.o_proj(o.reshape(x.shape[0], x.shape[1], -1))
        return (o, S) if output_final_state else o


class ConvAblationModel(nn.Module):
    """Embedding → :class:`TiedDeltaNetMixer` (pre-norm, residual) → norm → head over the vocabulary:
    Chapter 6's one-layer MQAR model with the mixer of this chapter."""

    def __init__(self, variant: str, vocab_size: int, d_model: int = 32, n_heads: int = 1,
                 head_dim: int = 16, conv_width: int = 4, backend=None):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.norm = nn.LayerNorm(d_model)
        self.mix = TiedDeltaNetMixer(variant, d_model, n_heads, head_dim, conv_width, backend)
        self.norm_out = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, ids):
        x = self.embed(ids)
        x = x + self.mix(self.norm(x))
        return self.head(self.norm_out(x))


def identity_gap(model: ConvAblationModel, ids) -> float:
    """How far the trained layer's final state is from the identity, ``||S_T - I||_F / ||I||_F``
    (:func:`lattn_core.identity_gap`), averaged over the sequences of ``ids`` and the heads. The
    state comes from ``kernels.chunk_delta_rule(..., output_final_state=True)``."""
    with torch.no_grad():
        _, S = model.mix(model.norm(model.embed(ids)), output_final_state=True)   # [B, H, D, D]
    eye = torch.eye(S.shape[-1], device=S.device, dtype=S.dtype)
    gap = torch.linalg.matrix_norm(S - eye) / math.sqrt(S.shape[-1])
    return float(gap.mean())


# ---------------------------------------------------------------------------------------------
# training and evaluation
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShortConvConfig(TrainConfig):
    """Everything that defines one run. The defaults are the CPU setting (:func:`cpu_config`)."""

    variants: tuple = CPU_VARIANTS
    kv_pairs: tuple = (4, 8, 12, 16)
    vocab_size: int = 64
    seq_len: int = 64
    d_model: int = 32
    n_heads: int = 1
    head_dim: int = 16
    conv_width: int = 4
    steps: int = 800
    lr: float = 1e-2
    weight_decay: float = 0.1
    threads: int | None = 1
    backend: str | None = None


def cpu_config(**changes) -> ShortConvConfig:
    """The setting the chapter trains live on a CPU: Chapter 6's MQAR (64 tokens, 31 possible
    keys), N from 4 to 16 pairs, one head of size 16, convolutions of width 4, the five variants
    of :data:`CPU_VARIANTS` (``"untied"`` only in the GPU setting), 800 steps each."""
    return replace(ShortConvConfig(), **changes)


def gpu_config(**changes) -> ShortConvConfig:
    """The larger setting for one GPU: every variant (``"untied"`` too), 256 tokens, 127 possible
    keys, N from 8 to 64 pairs, width 128 with two heads of size 64, 3000 steps of 128 sequences
    at a learning rate of ``3e-3``.
    ``python -m experiments.short_conv --gpu --seeds 0 1 2 --jobs 18 --write`` runs it on the GPU's Triton
    kernels (the delta rule's and the convolution's)."""
    base = ShortConvConfig(variants=VARIANTS, kv_pairs=(8, 16, 32, 48, 64), vocab_size=256,
                           seq_len=256, d_model=128, n_heads=2, head_dim=64, steps=3000,
                           batch=128, lr=3e-3, eval_batch=1024, threads=None, device="cuda")
    return replace(base, **changes)


def _seeds(seed: int) -> tuple[int, int, int]:
    """(model init, training data, evaluation data) from one ``seed``, the same for every variant."""
    return derived_seeds(seed, 700_001)


def _check_config(cfg: ShortConvConfig) -> None:
    for v in cfg.variants:
        if v not in VARIANTS:
            raise ValueError(f"variants must be drawn from {VARIANTS}; got {v!r}")
    check_int(cfg.conv_width, "conv_width", 1)
    for N in cfg.kv_pairs:
        make_mqar(cfg.vocab_size, N, cfg.seq_len, 1, 0)          # raises for an impossible N


def guess_baseline(kv_pairs) -> list[float]:
    """``1/N`` for every ``N`` of ``kv_pairs``: the expected accuracy of a model that knows which
    ``N`` values occurred in the sequence but not which key each belongs to, and answers every
    query with one of them at random (a state that records which tokens it has seen, and nothing
    about their order, can reach this)."""
    return [1.0 / check_int(N, "kv_pairs", 1) for N in kv_pairs]


def evaluate(model: ConvAblationModel, inputs, targets, mask) -> float:
    """Accuracy on the scored (query) positions: the argmax over the vocabulary is the value."""
    was = model.training
    model.eval()
    with torch.no_grad():
        pred = model(inputs).argmax(-1)
    model.train(was)
    return float((pred[mask] == targets[mask]).float().mean())


def train_model(variant: str, config: ShortConvConfig | None = None, *, progress=None) -> dict:
    """Train one variant on fresh MQAR batches (step ``s`` uses ``N = kv_pairs[s % len]``, as in
    Chapter 6) and score it on one held-out batch per ``N``. Returns ``variant``, ``kv_pairs``,
    ``accuracy`` (one per ``N``), ``identity_gap`` (of the final state, on the largest ``N``'s
    evaluation batch), the training ``losses``, ``train_seconds`` and the ``model``."""
    cfg = config or cpu_config()
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}; got {variant!r}")
    _check_config(cfg)
    init_seed, data_seed, eval_seed = _seeds(cfg.seed)
    with torch_threads(cfg.threads):
        torch.manual_seed(init_seed)
        model = ConvAblationModel(variant, cfg.vocab_size, cfg.d_model, cfg.n_heads, cfg.head_dim,
                                  cfg.conv_width, cfg.backend).to(cfg.device)

        def batch_loss(step):
            N = cfg.kv_pairs[step % len(cfg.kv_pairs)]
            x, y, m = make_mqar(cfg.vocab_size, N, cfg.seq_len, cfg.batch, data_seed + step,
                                device=cfg.device)
            return F.cross_entropy(model(x)[m], y[m])
        losses, train_s = fit(model, cfg, batch_loss, progress=progress, label=dict(model=variant))
        acc = []
        for i, N in enumerate(cfg.kv_pairs):
            xe, ye, me = make_mqar(cfg.vocab_size, N, cfg.seq_len, cfg.eval_batch, eval_seed + i,
                                   device=cfg.device)
            acc.append(evaluate(model, xe, ye, me))
        gap = identity_gap(model, xe)
    return {"variant": variant, "kv_pairs": list(cfg.kv_pairs), "accuracy": acc, "identity_gap": gap,
            "losses": losses, "train_seconds": train_s, "model": model}


def run_short_conv(config: ShortConvConfig | None = None, *, keep_models: bool = False,
                   loss_every: int = 20, progress: bool = False) -> dict:
    """Every variant of ``config`` (default :func:`cpu_config`), one seed
    (:func:`experiments.common.train_each`). Returns ``{"config", "records": [{variant, seed,
    kv_pairs, accuracy, identity_gap, train_seconds, final_loss, losses}], "accuracy": {variant:
    [...]}, "seconds"}``; ``losses`` are window means of ``loss_every`` steps (20: a multiple of the
    cycle through the ``N`` of both settings, so every window averages every ``N`` alike); the
    models too, under ``"models"``, with ``keep_models``. ``progress``: a tqdm bar."""
    cfg = config or cpu_config()
    _check_config(cfg)
    return train_each(cfg, cfg.variants, "variant", train_model, keep_models=keep_models,
                      loss_every=loss_every, progress=progress)


def run_seeds(config: ShortConvConfig, seeds, *, progress: bool = False, jobs: int = 1) -> dict:
    """:func:`run_short_conv` once per seed (:func:`experiments.common.run_each_seed`), or with
    ``jobs > 1`` once per variant and seed, that many at a time in their own processes (the same
    records: every variant of a seed starts from the same seeds). Returns ``{"config" (with
    "seeds", and "jobs" when above 1), "records" (one per variant and seed), "seconds": {seed:
    seconds}}``."""
    if jobs == 1:
        return run_each_seed(config, seeds, lambda c: run_short_conv(c, progress=progress))
    return run_each_seed(config, seeds, run_short_conv, jobs=jobs, split="variants")


def seed_summary(records: list[dict]) -> dict:
    """Per variant, over the seeds of ``records``: the mean, smallest and largest accuracy at each
    ``N``, per ``N`` the number of seeds each variant was best in (ties count for all), and
    ``identity_gap``, the mean over the seeds of the final state's distance from the identity.
    Returns ``{"kv_pairs", "seeds", "mean", "min", "max", "first", "identity_gap"}``."""
    out = summarize_seeds(records, "variant", "kv_pairs")
    gaps = {}
    for r in records:
        gaps.setdefault(r["variant"], []).append(r["identity_gap"])
    out["identity_gap"] = {v: sum(g) / len(g) for v, g in gaps.items()}
    return out


def check_claims(accuracy: dict, kv_pairs, *, learned: float = 0.8, near_guess: float = 0.05) -> None:
    """What Chapter 10 says of a run, checked: every variant with a convolution on K (``"k"``,
    ``"qkv"``) reaches ``learned`` accuracy at every ``N``, and every other variant present stays
    within ``near_guess`` of :func:`guess_baseline`. ``accuracy`` maps a variant to its accuracy at
    each ``N`` of ``kv_pairs`` (one run's, or the worst seed's for the first claim and each seed's
    for the second). Raises ``AssertionError`` naming the variant that breaks a claim."""
    guess = guess_baseline(kv_pairs)
    for v, acc in accuracy.items():
        if len(acc) != len(guess):
            raise ValueError(f"accuracy[{v!r}] must have one value per N of kv_pairs ({len(guess)}); "
                             f"got {len(acc)}")
        if v in ("k", "qkv"):
            assert min(acc) >= learned, f"{v}: accuracy {min(acc):.3f} < {learned} at some N"
        else:
            gap = max(abs(a - g) for a, g in zip(acc, guess))
            assert gap < near_guess, f"{v}: {gap:.3f} from the 1/N guess (allowed {near_guess})"


def plot_summary(summary: dict, ax, title: str):
    """Mean accuracy against the number of pairs ``N`` per variant, with the band from the worst
    to the best seed, and :func:`guess_baseline` dotted, on the matplotlib axes ``ax``."""
    for v in summary["mean"]:
        line, = ax.plot(summary["kv_pairs"], summary["mean"][v], "o-", label=NAMES[v])
        ax.fill_between(summary["kv_pairs"], summary["min"][v], summary["max"][v],
                        color=line.get_color(), alpha=0.2)
    ax.plot(summary["kv_pairs"], guess_baseline(summary["kv_pairs"]), ":", color="gray",
            label="1/N (a value of the sequence)")
    ax.set_xticks(summary["kv_pairs"])
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("number of key-value pairs N")
    ax.set_ylabel("accuracy at the queries")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)


def summary_sentences(summary: dict) -> list[str]:
    """The result in words, from a :func:`seed_summary`: one line per variant (best first, by the
    mean accuracy over every ``N``) with its mean accuracy at each ``N`` and its final state's
    distance from the identity."""
    mean, gaps = summary["mean"], summary["identity_gap"]
    overall = {v: sum(a) / len(a) for v, a in mean.items()}
    out = []
    for v in sorted(mean, key=lambda v: -overall[v]):
        accs = ", ".join(f"{a:.2f}" for a in mean[v])
        out.append(f"{NAMES[v]}: accuracy {accs} at N = "
                   f"{', '.join(map(str, summary['kv_pairs']))}; state's distance from I "
                   f"{gaps[v]:.2f}")
    return out


def load_stored() -> dict:
    """The stored GPU runs (``experiments/results/short_conv.json``: ``env``, ``config`` with its
    ``seeds``, ``records``), with ``same_as_gpu_config``: whether they were run with the settings
    :func:`gpu_config` has now. Raises ``FileNotFoundError`` when this copy of the book has none."""
    return load_stored_runs(STORED, gpu_config,
                            "python -m experiments.short_conv --gpu --seeds 0 1 2 --jobs 18 --write",
                            ignore=("seeds", "jobs"))


def main(argv=None) -> int:
    """``python -m experiments.short_conv [--gpu] [--seeds ...] [--device D] [--steps N] [--write]``
    (:func:`experiments.common.seeds_cli`)."""
    return seeds_cli(argv, description="Chapter 10: keys equal to values and the short convolution "
                                       "(MQAR, one DeltaNet layer, convolutions on Q, K, V)",
                     stored=STORED, cpu_config=cpu_config, gpu_config=gpu_config, run_seeds=run_seeds,
                     gpu_seeds=[0, 1, 2],
                     describe=lambda r: f"seed {r['seed']} {r['variant']:>6}: " + "  ".join(
                         f"N={N}: {a:.3f}" for N, a in zip(r["kv_pairs"], r["accuracy"]))
                     + f"  |S-I| {r['identity_gap']:.2f}", split=("variants", "variant"))


if __name__ == "__main__":
    raise SystemExit(main())
