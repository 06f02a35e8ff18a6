"""Multi-query associative recall (MQAR), the recall benchmark of Zoology (Arora et al., 2023).

A sequence starts with ``N`` key-value token pairs ``k_1 v_1 k_2 v_2 ... k_N v_N``; later, some of
those keys appear again as *queries*, and at each query position the model must output the value
that was paired with that key. Every position that is not a query is unscored.

This module holds the whole experiment of Chapter 6, in PyTorch, with its data made on the fly
(nothing is downloaded):

* :func:`make_mqar` — the seeded data generator (input ids, targets, mask of scored positions);
* :class:`MQARModel` — a one-layer model: embedding → one token-mixing layer (+ optional short MLP)
  → output head. The token mixers differ **only** in how they update their state, and all have
  the same state size (same number of heads, same ``d_k = d_v``):

  ======================  =========================================  ================================
  ``mixer``               state update                               op of :mod:`kernels`
  ======================  =========================================  ================================
  ``"linear"``            ``S_t = S_{t-1} + v_t k_t^T``              ``kernels.chunk_linear_attn``
  ``"decay"``             ``S_t = a_t S_{t-1} + v_t k_t^T``          ``kernels.chunk_simple_gla``
  ``"deltanet"``          ``S_t = S_{t-1}(I - b_t k_t k_t^T) + ...``  ``kernels.chunk_delta_rule``
  ``"gated_deltanet"``    ``S_t = a_t S_{t-1}(I - b_t k_t k_t^T) ..`` ``kernels.chunk_gated_delta_rule``
  ``"mesanet"``           ``G_t``, ``H_t`` gated sums; ``(H_t+Λ)^-1``  ``kernels.chunk_mesa_net``
  ======================  =========================================  ================================

  MesaNet (Chapter 9) holds two states per head, ``G_t`` (``d_v × d_k``) and ``H_t``
  (``d_k × d_k``); at the same state size it gets ``d_k = head_dim / 2`` and ``d_v = 3 head_dim / 2``
  (``d_k² + d_k d_v = head_dim²``), measured by :func:`state_size` like the others'. Its solve runs
  ``d_k`` conjugate-gradient steps, exact in exact arithmetic; more steps only divide round-off by
  round-off once the residual has vanished, which the gradient through the steps does not survive.

  The recurrences themselves are the ops of :mod:`kernels` (their differentiable PyTorch path on a
  CPU, the Triton kernels on a GPU); this module never writes a recurrence of its own.
* :func:`train_mqar`, :func:`evaluate_mqar`, :func:`run_mqar_sweep` — AdamW training with a fixed
  seed, accuracy on the scored positions, and accuracy against the number of key-value pairs;
  :func:`run_mqar_seeds` and :func:`seed_summary` — the sweep over several seeds (in parallel
  processes if asked) and its mean, range and per-``N`` winners; :func:`load_stored_large` — the
  GPU runs stored in ``experiments/results/mqar_large.json``.

Why a short convolution: with one layer, the state is written at every position ``t`` from the
token at ``t`` alone, unless the layer can also see the token before it. At a value position the
layer must write "the key just before me ↦ me"; a causal depthwise convolution of width 2 on the
``q, k, v`` projections (as DeltaNet and Gated DeltaNet use, with width 4) makes that possible. Every
mixer gets the same convolution, so the comparison stays one of update rules. With
``key_from_previous=True`` (the default of :class:`MQARConfig`) the key's convolution *starts* by
passing the previous token (it stays trainable): measured on the CPU setting, models that had to
discover this shift did so after a seed-dependent number of steps, and that timing, rather than the
update rule, decided which model scored best.
"""
from __future__ import annotations

import math
import time
from functools import partial
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from .common import (RESULTS_DIR, TrainConfig, check_int, derived_seeds, fit, load_stored_runs, mlp_block,
                     run_each_seed, summarize_seeds, torch_threads, window_means)

__all__ = ["MIXERS", "ALL_MIXERS", "MQARConfig", "make_mqar", "MQARModel", "TokenMixer", "state_size",
           "train_mqar", "evaluate_mqar", "run_mqar_sweep", "cpu_config", "gpu_config", "sweep_records",
           "run_mqar_seeds", "seed_summary", "plot_seed_summary", "STORED_LARGE", "load_stored_large",
           "MESANET_MIXERS", "STORED_MESANET", "load_stored_mesanet"]

STORED_LARGE = "mqar_large"   # experiments/results/mqar_large.json: the GPU sweep the chapter shows on a CPU

MIXERS = ("linear", "decay", "deltanet", "gated_deltanet")
ALL_MIXERS = MIXERS + ("mesanet",)     # Chapter 9 adds MesaNet to the comparison
MESANET_MIXERS = ("deltanet", "gated_deltanet", "mesanet")   # Chapter 9's comparison
STORED_MESANET = "mqar_large_mesanet"  # experiments/results/mqar_large_mesanet.json: its GPU sweep

IGNORE = -100          # target at unscored positions (also masked out by ``mask``)
FILLER = 0             # the token that fills the query region between queries
GATE_TEMPERATURE = 16.0  # g = logsigmoid(W_g x) / 16, the gate normaliser of GLA (Yang et al., 2024)


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------


def make_mqar(vocab_size: int, num_kv_pairs: int, seq_len: int, batch: int, seed: int,
              num_queries: int | None = None, device=None):
    """A batch of MQAR sequences. Returns ``(inputs, targets, mask)``, each ``[batch, seq_len]``.

    Token ids: ``0`` is the filler, keys come from ``1 .. vocab_size//2 - 1`` and values from
    ``vocab_size//2 .. vocab_size - 1``, so a key is never a value. In each sequence the
    ``num_kv_pairs`` keys are distinct (so each query has one answer) and so are the values.

    Layout: positions ``0 .. 2N-1`` hold ``k_1 v_1 ... k_N v_N``; the remaining ``seq_len - 2N``
    positions hold ``num_queries`` (default ``N``) of those keys, chosen without replacement and
    placed at random positions, and the filler token elsewhere. ``targets`` holds the paired value
    at each query position and ``-100`` elsewhere; ``mask`` is ``True`` exactly at query positions.
    The same ``seed`` gives the same batch.
    """
    vocab_size = check_int(vocab_size, "vocab_size", 4)
    N = check_int(num_kv_pairs, "num_kv_pairs", 1)
    seq_len = check_int(seq_len, "seq_len", 1)
    batch = check_int(batch, "batch", 1)
    n_keys, n_vals = vocab_size // 2 - 1, vocab_size - vocab_size // 2
    if N > min(n_keys, n_vals):
        raise ValueError(f"num_kv_pairs must be <= {min(n_keys, n_vals)} for vocab_size={vocab_size} "
                         f"(distinct keys from 1..{vocab_size // 2 - 1}); got {N}")
    nq = N if num_queries is None else check_int(num_queries, "num_queries", 1)
    if nq > N:
        raise ValueError(f"num_queries must be <= num_kv_pairs = {N}; got {nq}")
    if seq_len < 2 * N + nq:
        raise ValueError(f"seq_len must be >= 2 * num_kv_pairs + num_queries = {2 * N + nq}; got {seq_len}")
    gen = torch.Generator().manual_seed(int(seed))
    # distinct keys and distinct values per row: the first N of a random permutation
    keys = torch.argsort(torch.rand(batch, n_keys, generator=gen), dim=1)[:, :N] + 1
    vals = torch.argsort(torch.rand(batch, n_vals, generator=gen), dim=1)[:, :N] + vocab_size // 2
    inputs = torch.full((batch, seq_len), FILLER, dtype=torch.long)
    targets = torch.full((batch, seq_len), IGNORE, dtype=torch.long)
    inputs[:, 0:2 * N:2] = keys
    inputs[:, 1:2 * N:2] = vals
    which = torch.argsort(torch.rand(batch, N, generator=gen), dim=1)[:, :nq]       # which pairs
    region = seq_len - 2 * N
    where = torch.argsort(torch.rand(batch, region, generator=gen), dim=1)[:, :nq] + 2 * N
    rows = torch.arange(batch).unsqueeze(1)
    inputs[rows, where] = keys.gather(1, which)
    targets[rows, where] = vals.gather(1, which)
    mask = targets != IGNORE
    if device is not None:
        inputs, targets, mask = inputs.to(device), targets.to(device), mask.to(device)
    return inputs, targets, mask


# ---------------------------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------------------------
class ShortConv(nn.Module):
    """Causal depthwise convolution over time: ``y_t = sum_i w_i ⊙ x_{t-i}``, ``x`` is ``[B, T, D]``."""

    def __init__(self, dim: int, width: int, start: str = "current"):
        super().__init__()
        self.width = width
        self.weight = nn.Parameter(torch.zeros(dim, 1, width))
        with torch.no_grad():   # start by passing the current token ("current") or the one before ("previous")
            self.weight[:, 0, -1 if start == "current" else -2] = 1.0
            self.weight.add_(0.1 * torch.randn_like(self.weight))

    def forward(self, x):
        x = x.transpose(1, 2)                                            # [B, D, T]
        y = F.conv1d(F.pad(x, (self.width - 1, 0)), self.weight, groups=x.shape[1])
        return y.transpose(1, 2)


class TokenMixer(nn.Module):
    """One multi-head linear-attention-family layer; ``mixer`` picks the state update (see module doc).

    All mixers: ``q, k, v`` projections, a causal short convolution, L2-normalised ``q`` and ``k``,
    ``n_heads`` heads of size ``head_dim`` (``d_k = d_v = head_dim``), an output projection. The
    decay mixers add a log-gate ``g = logsigmoid(W_g x) / 16`` per head (scalar, data dependent);
    the delta mixers add ``beta = sigmoid(W_b x)`` per head. ``backend`` is passed to the op.
    """

    def __init__(self, mixer: str, d_model: int, n_heads: int, head_dim: int, conv_width: int = 2,
                 backend=None, key_from_previous: bool = False):
        super().__init__()
        if mixer not in ALL_MIXERS:
            raise ValueError(f"mixer must be one of {ALL_MIXERS}; got {mixer!r}")
        if mixer == "mesanet" and head_dim % 2:
            raise ValueError(f"head_dim must be even for mesanet (d_k = head_dim / 2); got {head_dim}")
        self.mixer, self.H, self.backend = mixer, n_heads, backend
        self.dk, self.dv = (head_dim // 2, 3 * head_dim // 2) if mixer == "mesanet" else (head_dim, head_dim)
        widths = (n_heads * self.dk, n_heads * self.dk, n_heads * self.dv)                 # q, k, v
        self.q_proj = nn.Linear(d_model, widths[0], bias=False)
        self.k_proj = nn.Linear(d_model, widths[1], bias=False)
        self.v_proj = nn.Linear(d_model, widths[2], bias=False)
        starts = ("current", "previous" if key_from_previous else "current", "current")    # q, k, v
        self.convs = nn.ModuleList([ShortConv(w, conv_width, st) for w, st in zip(widths, starts)]) \
            if conv_width > 1 else None
        self.o_proj = nn.Linear(widths[2], d_model, bias=False)
        self.gated = mixer in ("decay", "gated_deltanet", "mesanet")
        self.delta = mixer in ("deltanet", "gated_deltanet", "mesanet")
        if self.gated:
            self.g_proj = nn.Linear(d_model, n_heads)
        if self.delta:
            self.b_proj = nn.Linear(d_model, n_heads)
        if mixer == "mesanet":   # Λ = softplus(·) per head and key channel, starting at 1
            self.lamb_raw = nn.Parameter(torch.full((n_heads, self.dk), math.log(math.e - 1.0)))

    def qkv(self, x):
        B, T, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.convs is not None:
            q, k, v = (F.silu(c(t)) for c, t in zip(self.convs, (q, k, v)))
        q, k, v = (t.reshape(B, T, self.H, -1) for t in (q, k, v))
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        return q, k, v

    def forward(self, x, output_final_state: bool = False):
        import kernels
        q, k, v = self.qkv(x)
        kw = dict(scale=1.0, output_final_state=output_final_state, backend=self.backend)
        if self.gated:
            # GLA's gate temperature: logsigmoid / 16 keeps forget gates near 1 (≈ 0.96 at logit 0)
            g = F.logsigmoid(self.g_proj(x)) / GATE_TEMPERATURE           # [B, T, H], log gate <= 0
        if self.delta:
            beta = torch.sigmoid(self.b_proj(x))                         # [B, T, H], in (0, 1)
        if self.mixer == "linear":
            o, S = kernels.chunk_linear_attn(q, k, v, **kw)
        elif self.mixer == "decay":
            o, S = kernels.chunk_simple_gla(q, k, v, g, **kw)
        elif self.mixer == "deltanet":
            o, S = kernels.chunk_delta_rule(q, k, v, beta, **kw)
        elif self.mixer == "gated_deltanet":
            o, S = kernels.chunk_gated_delta_rule(q, k, v, g, beta, **kw)
        else:   # MesaNet has no scale; its state is the pair (H, G)
            from kernels.mesa.op import KEY_SIZES, VALUE_SIZES
            # the Triton kernel tiles d_k in KEY_SIZES; the narrow heads of equal state size (d_k = 4
            # or 8) take the op's PyTorch path on every device
            tiled = self.dk in KEY_SIZES and self.dv in VALUE_SIZES
            o, h_kk, h_kv = kernels.chunk_mesa_net(q, k, v, g, beta, F.softplus(self.lamb_raw),
                                                   max_CG_iteration=self.dk,
                                                   output_final_state=output_final_state,
                                                   backend=self.backend if tiled else "torch")
            S = (h_kk, h_kv)
        o = self.o_proj(o.reshape(x.shape[0], x.shape[1], -1))
        return (o, S) if output_final_state else o


class MQARModel(nn.Module):
    """Embedding → token mixer (residual) → optional short MLP (residual) → norm → head over the vocab."""

    def __init__(self, mixer: str, vocab_size: int, d_model: int = 32, n_heads: int = 1,
                 head_dim: int = 8, mlp: bool = False, conv_width: int = 2, backend=None,
                 key_from_previous: bool = True):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.mix = TokenMixer(mixer, d_model, n_heads, head_dim, conv_width, backend, key_from_previous)
        self.mlp = mlp_block(d_model, 2) if mlp else None
        self.norm_out = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, ids):
        x = self.embed(ids)
        x = x + self.mix(self.norm1(x))
        if self.mlp is not None:
            x = x + self.mlp(x)
        return self.head(self.norm_out(x))


def state_size(model: MQARModel) -> int:
    """Numbers in the recurrent state per sequence, *measured*: run the mixer on one short sequence
    with ``output_final_state=True`` and count the entries of the final state (``H · d_k · d_v``;
    MesaNet's two states together, ``H (d_k² + d_k d_v)``)."""
    mix = model.mix
    x = torch.zeros(1, 3, mix.q_proj.in_features, device=mix.q_proj.weight.device)
    with torch.no_grad():
        _, S = mix(x, output_final_state=True)
    return int(sum(s[0].numel() for s in S) if isinstance(S, tuple) else S[0].numel())


# ---------------------------------------------------------------------------------------------
# training and evaluation
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MQARConfig(TrainConfig):
    """Everything that defines one sweep.

    The CPU defaults train each of the four models (one head, ``d_k = d_v = 8``: a state of 64
    numbers) for 600 steps of 32 sequences of 64 tokens, about half a minute for the whole sweep on a
    quiet 2-core machine; there are 31 possible keys, more than ``d_k``, so they cannot all be
    orthogonal. ``threads=1``: for ops this
    small, one PyTorch thread measured faster than two on the book's 2-core machine.
    """

    mixers: tuple = MIXERS
    kv_pairs: tuple = (4, 8, 12, 16, 20)
    vocab_size: int = 64
    seq_len: int = 64
    d_model: int = 32
    n_heads: int = 1
    head_dim: int = 8
    mlp: bool = False
    conv_width: int = 2
    key_from_previous: bool = True
    lr: float = 1e-2
    weight_decay: float = 0.1
    eval_batch: int = 512
    threads: int | None = 1
    backend: str | None = None


def cpu_config(**changes) -> MQARConfig:
    """The small setting the notebook trains live on a CPU."""
    return replace(MQARConfig(), **changes)


def gpu_config(**changes) -> MQARConfig:
    """A larger setting for a GPU (still one layer): d_k = d_v = 16 (a state of 256 numbers), up to
    64 pairs in 256 tokens, 127 possible keys, 3000 steps of 128 sequences: about three minutes on an
    H200. Its runs there, five seeds, are stored in ``experiments/results/mqar_large.json``
    (``--large --seeds 0 1 2 3 4 --jobs 5 --write``). At
    d_k = 64, its first version, every model recalled practically every pair up to N = 64 on the H200
    (``experiments/results/mqar_large_dk64_round10.json``), so the setting could not tell the update
    rules apart; with 16 key dimensions N exceeds d_k up to four times, as in the CPU setting."""
    base = MQARConfig(kv_pairs=(8, 16, 32, 48, 64), vocab_size=256, seq_len=256, d_model=128, n_heads=1,
                      head_dim=16, mlp=False, steps=3000, batch=128, lr=3e-3, eval_batch=1024,
                      threads=None, device="cuda")
    return replace(base, **changes)




def _seeds(seed: int) -> tuple[int, int, int]:
    """Deterministic seeds for (model init, training data, evaluation data) from one ``seed``.

    None depends on the mixer, so every model starts from the same seed, sees the *same* training
    stream and is scored on the *same* evaluation batches.
    """
    return derived_seeds(seed, 500_000)


def evaluate_mqar(model: MQARModel, inputs, targets, mask) -> float:
    """Accuracy on the scored (query) positions: the argmax over the vocabulary equals the value."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        pred = model(inputs).argmax(-1)
    model.train(was_training)
    return float((pred[mask] == targets[mask]).float().mean().item())


def train_mqar(mixer: str, config: MQARConfig | None = None, *, progress=None, log_every: int = 25):
    """Train one model on freshly generated MQAR batches and score it at every ``config.kv_pairs``.

    Training data: step ``s`` draws a batch with ``N = kv_pairs[s % len(kv_pairs)]`` pairs from
    ``make_mqar(..., seed=data_seed + s)`` (one model sees every difficulty, as in Zoology's mixed
    training sets). Evaluation: one held-out batch per ``N`` with its own seed. Returns a dict with
    the loss curve, ``accuracy`` (one per ``N``), the measured state size and the wall time.
    ``progress`` is an optional tqdm bar to advance. Runs with ``config.threads`` CPU threads.
    """
    cfg = config or MQARConfig()
    if mixer not in ALL_MIXERS:
        raise ValueError(f"mixer must be one of {ALL_MIXERS}; got {mixer!r}")
    with torch_threads(cfg.threads):
        return _train(mixer, cfg, progress, log_every)


def _train(mixer: str, cfg: MQARConfig, progress, log_every: int) -> dict:
    init_seed, data_seed, eval_seed = _seeds(cfg.seed)
    torch.manual_seed(init_seed)
    model = MQARModel(mixer, cfg.vocab_size, cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.mlp,
                      cfg.conv_width, cfg.backend, cfg.key_from_previous).to(cfg.device)

    def batch_loss(step):
        N = cfg.kv_pairs[step % len(cfg.kv_pairs)]
        x, y, m = make_mqar(cfg.vocab_size, N, cfg.seq_len, cfg.batch, data_seed + step, device=cfg.device)
        return F.cross_entropy(model(x)[m], y[m])
    losses, train_s = fit(model, cfg, batch_loss, progress=progress, label=dict(mixer=mixer), log_every=log_every)
    acc = []
    for i, N in enumerate(cfg.kv_pairs):
        xe, ye, me = make_mqar(cfg.vocab_size, N, cfg.seq_len, cfg.eval_batch, eval_seed + i,
                               device=cfg.device)
        acc.append(evaluate_mqar(model, xe, ye, me))
    return {"mixer": mixer, "kv_pairs": list(cfg.kv_pairs), "accuracy": acc, "losses": losses,
            "state_size": state_size(model), "train_seconds": train_s, "model": model}


def run_mqar_sweep(config: MQARConfig | None = None, *, large: bool = False, progress: bool = True,
                   keep_models: bool = False) -> dict:
    """Accuracy against the number of key-value pairs, for every mixer, at one state size.

    ``config`` defaults to :func:`cpu_config` (or :func:`gpu_config` when ``large=True``). Returns
    ``{"config": ..., "results": [{mixer, num_kv_pairs, accuracy, state_size, train_seconds,
    final_loss}, ...], "accuracy": {mixer: [acc per kv setting]}, "seconds": total}``.
    Uses ``config.threads`` CPU threads while it runs (restored afterwards).
    """
    cfg = config or (gpu_config() if large else cpu_config())
    for m in cfg.mixers:
        if m not in ALL_MIXERS:
            raise ValueError(f"mixers must be drawn from {ALL_MIXERS}; got {m!r}")
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=cfg.steps * len(cfg.mixers), desc="MQAR sweep",
                   unit="step", mininterval=0.5)
    t0 = time.perf_counter()
    results = []
    try:
        for mixer in cfg.mixers:
            r = train_mqar(mixer, cfg, progress=bar)
            r["final_loss"] = float(sum(r["losses"][-20:]) / len(r["losses"][-20:]))
            if not keep_models:
                r.pop("model")
            results.append(r)
    finally:
        if bar is not None:
            bar.close()
    acc = {r["mixer"]: r["accuracy"] for r in results}
    return {"config": cfg.as_dict(), "results": results, "accuracy": acc,
            "seconds": time.perf_counter() - t0}




def sweep_records(sweep: dict, loss_every: int = 10) -> list[dict]:
    """The JSON records of a sweep (one per mixer), as stored by ``python -m experiments.mqar
    --write``: accuracy per number of pairs, state size, training seconds, final loss, and the
    training-loss curves: ``losses``, the mean over each window of ``loss_every`` consecutive steps
    (training cycles through the ``N`` of ``kv_pairs``, one per step, so with a window that is a
    multiple of that cycle every point averages every ``N`` alike), and ``losses_by_n``, for each ``N``
    the curve of its own steps, averaged over windows of ``loss_every`` of them."""
    check_int(loss_every, "loss_every", 1)
    out = []
    for r in sweep["results"]:
        kv = list(r["kv_pairs"])
        out.append({"mixer": r["mixer"], "kv_pairs": kv, "accuracy": list(r["accuracy"]),
                    "state_size": r["state_size"], "train_seconds": r["train_seconds"],
                    "final_loss": r["final_loss"], "loss_every": loss_every,
                    "losses": window_means(r["losses"], loss_every),
                    "losses_by_n": {str(N): window_means(r["losses"][i::len(kv)], loss_every)
                                    for i, N in enumerate(kv)}})
    return out


def _one_piece(config: MQARConfig, loss_every: int) -> dict:
    """Worker of :func:`run_mqar_seeds`: one sweep of ``config`` as ``{"records", "seconds"}`` (top
    level, so that a spawned process can import it)."""
    sweep = run_mqar_sweep(config, progress=False)
    recs = sweep_records(sweep, loss_every)
    for r in recs:
        r["seed"] = config.seed
    return {"records": recs, "seconds": sweep["seconds"]}


def run_mqar_seeds(config: MQARConfig, seeds, *, jobs: int = 1, loss_every: int = 10) -> dict:
    """The sweep of ``config`` once per seed in ``seeds`` (:func:`experiments.common.run_each_seed`).
    With ``jobs > 1`` each (seed, mixer) is a piece of its own, ``jobs`` pieces at a time in their
    own processes (every mixer of a seed starts from the same derived seeds, so the records are
    those of the seeds run in turn; a GPU is shared by the processes, so their ``train_seconds``
    are those of concurrent runs). Returns ``{"config": ..., "records": [... one per mixer and
    seed, with "seed"], "seconds": {seed: seconds, summed over its pieces}}``; ``config["seeds"]``
    and ``config["jobs"]`` (pieces at once) replace its single ``seed``."""
    check_int(loss_every, "loss_every", 1)      # before any training, not after it
    out = run_each_seed(config, seeds, partial(_one_piece, loss_every=loss_every), jobs=jobs,
                        split="mixers" if jobs != 1 else None)
    out["config"].setdefault("jobs", 1)
    return out


def seed_summary(records: list[dict]) -> dict:
    """Per mixer, over the seeds of ``records`` (as stored by :func:`run_mqar_seeds`): the mean,
    smallest and largest accuracy at each N, and per N how many seeds each mixer came first in
    (ties counted for every mixer that shares the best accuracy).
    Returns ``{"kv_pairs", "seeds", "mean", "min", "max", "first"}`` (the last four keyed by mixer)."""
    return summarize_seeds(records, "mixer", "kv_pairs")


def plot_seed_summary(summary: dict, ax=None, title: str | None = None):
    """Accuracy against the number of pairs ``N``, one line per mixer: the mean over the seeds, with
    the band between the smallest and largest seed (``summary`` from :func:`seed_summary`)."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(5.6, 3.8))
    for mx in summary["mean"]:
        line, = ax.plot(summary["kv_pairs"], summary["mean"][mx], "o-", label=mx)
        ax.fill_between(summary["kv_pairs"], summary["min"][mx], summary["max"][mx], color=line.get_color(),
                        alpha=0.2)
    ax.set_xlabel("number of key-value pairs N")
    ax.set_ylabel("accuracy at query positions")
    ax.set_ylim(0, 1.02)
    ax.set_title(title or f"MQAR, {len(summary['seeds'])} seeds (band: smallest to largest)")
    ax.legend(fontsize=8)
    return ax


def load_stored_large() -> dict:
    """The stored GPU sweeps (``experiments/results/mqar_large.json``: ``env``, ``config`` with its
    ``seeds``, ``records`` one per mixer and seed) with ``same_as_gpu_config``: whether they were run
    with the settings ``gpu_config()`` has now (the seed aside). Raises ``FileNotFoundError`` when
    this copy of the book has none."""
    return load_stored_runs(STORED_LARGE, gpu_config, "python -m experiments.mqar --large --seeds 0 1 2 3 4 "
                            "--jobs 5 --write", ignore=("seeds", "jobs"))


def load_stored_mesanet() -> dict:
    """Chapter 9's stored GPU sweeps (``experiments/results/mqar_large_mesanet.json``): the GPU setting
    with the mixers of :data:`MESANET_MIXERS`, as :func:`load_stored_large` reads Chapter 6's.
    Raises ``FileNotFoundError`` naming the command that writes them."""
    return load_stored_runs(STORED_MESANET, lambda: gpu_config(mixers=MESANET_MIXERS),
                            "python -m experiments.mqar --large --mesanet --seeds 0 1 2 --jobs 9 --write",
                            ignore=("seeds", "jobs"))


def main(argv=None) -> int:
    """Run a sweep from the command line, once per ``--seeds``; ``--write`` stores it in
    ``experiments/results/<name>.json`` with the device, date and library versions."""
    import argparse
    from kernels import results
    p = argparse.ArgumentParser(description="MQAR sweep of Chapter 6 (four update rules, one state size)")
    p.add_argument("--large", action="store_true", help="the GPU setting (gpu_config) instead of the CPU one")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="one sweep per seed (default: 0)")
    p.add_argument("--jobs", type=int, default=1, help="pieces (one mixer of one seed) run at once, each in its own process")
    p.add_argument("--mesanet", action="store_true", help=f"Chapter 9's mixers {MESANET_MIXERS} instead of "
                                                          "Chapter 6's four")
    p.add_argument("--write", action="store_true", help=f"store the records (experiments/results/{STORED_LARGE}.json "
                                                        f"for --large, {STORED_MESANET}.json with --mesanet, "
                                                        "mqar_small.json otherwise)")
    args = p.parse_args(argv)
    cfg = gpu_config() if args.large else cpu_config()
    if args.mesanet:
        cfg = replace(cfg, mixers=MESANET_MIXERS)
    if cfg.device == "cuda" and not torch.cuda.is_available():
        print("--large needs a CUDA GPU")
        return 2
    t0 = time.perf_counter()
    out = run_mqar_seeds(cfg, args.seeds, jobs=args.jobs)
    for r in out["records"]:
        print(f"seed {r['seed']} {r['mixer']:>15}: "
              + "  ".join(f"N={N}: {a:.3f}" for N, a in zip(r["kv_pairs"], r["accuracy"]))
              + f"  ({r['train_seconds']:.0f} s)")
    print(f"{len(args.seeds)} sweeps, {out['config']['jobs']} at a time: {time.perf_counter() - t0:.0f} s")
    if args.write:
        name = (STORED_MESANET if args.mesanet else STORED_LARGE) if args.large else "mqar_small"
        path = results.write_results(RESULTS_DIR / f"{name}.json", name, out["config"], out["records"])
        print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
