"""Train short, test long: what a forget gate buys softmax attention (Chapter 7's experiment).

Small softmax-attention models are trained on sequences of ``train_len`` tokens and scored on
sequences up to four times longer. They differ only in what they add to the attention scores:

==========  ==========================================================================
``nope``    nothing: no position encoding at all (the causal mask is the only order)
``alibi``   ALiBi's fixed bias ``-slope_h (i - j)``, slopes :func:`lattn_core.alibi_slopes`
``fox``     FoX's learned bias ``log Γ_ij = sum_{tau=j+1..i} log f_tau``, a forget gate
            ``f_t = sigmoid(w_h . x_t + b_h)`` per head computed from the token (data dependent)
==========  ==========================================================================

**The task** (:func:`make_recency_recall`), made in code, nothing downloaded. A stream of *write*
tokens, each naming a key and a value (``n_keys · n_values`` write tokens: the pair is one token),
keys drawn at random so every key is rewritten again and again; here and there a *query* token
names a key that has been written, and the answer is the value of that key's **most recent**
write. Only query positions are scored. The most recent write of the queried key is a few dozen
tokens back at most, whatever the length, but the number of stale writes of the same key grows in
proportion to the length: a model must prefer the recent match over the old ones, so recency is the
whole task. A gate that decays the past does exactly that, and its decay is the same at every
position; a model without a position signal must work out recency from what the causal mask lets
it see, and what it learns at ``train_len`` tokens need not hold at four times that.

**How the setting was chosen.** The task was designed for the question before any run, to need
recency and nothing else; the sizes were set once to fit the time budgets (the CPU setting trains
the three models in about half a minute on the book's 2-core machine; the GPU setting, several
seeds, in a few minutes on one H100 or H200) and not tuned to favour any model. Every model has
the same width, depth, heads, optimizer, data stream and evaluation batches; FoX's gate starts
near 1 (bias ``+3``, gate ``≈ 0.95``, as a gate that starts by remembering).

Entry points: :func:`run_extrapolation` (one seed, every encoding), :func:`run_seeds`,
:func:`seed_summary`, :func:`load_stored` (the GPU runs in
``experiments/results/extrapolation.json``), and ``python -m experiments.extrapolation`` (``--gpu``
for the larger setting, ``--write`` to store it with the device, date and versions).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from .common import (TrainConfig, check_int, derived_seeds, fit, load_stored_runs, mlp_block, residual_stack,
                     run_each_seed, seeds_cli, summarize_seeds, torch_threads, train_each)

__all__ = ["ENCODINGS", "ExtrapolationConfig", "cpu_config", "gpu_config", "make_recency_recall",
           "vocab_size", "token_text", "attention_bias", "SoftmaxAttention", "RecallTransformer",
           "train_model", "evaluate", "run_extrapolation", "run_seeds", "seed_summary",
           "NAMES", "plot_summary", "summary_sentences", "STORED", "load_stored", "main"]

STORED = "extrapolation"        # experiments/results/extrapolation.json: the GPU runs
ENCODINGS = ("nope", "alibi", "fox")
NAMES = {"nope": "NoPE", "alibi": "ALiBi", "fox": "FoX"}     # as the book writes them
IGNORE = -100                   # target at positions that are not scored
BOS = 0                         # the first token of every sequence
FOX_GATE_BIAS = 3.0             # f_t = sigmoid(w . x + b) starts near sigmoid(3) ≈ 0.95




# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------
def vocab_size(n_keys: int, n_values: int) -> int:
    """``1 + n_keys · n_values + n_keys``: BOS, one write token per (key, value), one query per key."""
    return 1 + check_int(n_keys, "n_keys", 1) * check_int(n_values, "n_values", 2) + n_keys


def make_recency_recall(n_keys: int, n_values: int, seq_len: int, batch: int, seed: int,
                        query_prob: float = 0.25, device=None):
    """A batch of recency-recall sequences: ``(inputs, targets)``, both ``[batch, seq_len]`` long.

    Token ids: ``0`` is BOS (position 0); ``1 + key · n_values + value`` writes ``value`` under
    ``key``; ``1 + n_keys · n_values + key`` queries ``key``. Position 1 is a write; at every later
    position the token is, with probability ``query_prob``, a query for a key drawn uniformly from
    the keys written before it, else a write with a uniform key and value. ``targets`` holds the
    value of the queried key's most recent write at query positions and ``-100`` elsewhere. The
    same ``seed`` gives the same batch (generated on the CPU, then moved to ``device``).
    """
    n_keys, n_values = check_int(n_keys, "n_keys", 1), check_int(n_values, "n_values", 2)
    seq_len, batch = check_int(seq_len, "seq_len", 2), check_int(batch, "batch", 1)
    if not (isinstance(query_prob, (int, float)) and 0 < query_prob < 1):
        raise ValueError(f"query_prob must lie in (0, 1); got {query_prob!r}")
    gen = torch.Generator().manual_seed(int(seed))
    T = seq_len
    query = torch.rand(batch, T, generator=gen) < query_prob
    query[:, :2] = False                                   # BOS, then a write
    key = torch.randint(n_keys, (batch, T), generator=gen)
    val = torch.randint(n_values, (batch, T), generator=gen)
    pick = torch.rand(batch, T, n_keys, generator=gen)
    # last[b, t, k]: the position of the latest write of key k at or before t (-1: none yet)
    pos = torch.arange(T).expand(batch, T)
    wrote = F.one_hot(key, n_keys).bool() & ~query[..., None] & (pos > 0)[..., None]
    last = torch.where(wrote, pos[..., None], -1).cummax(dim=1).values
    before = torch.cat([torch.full_like(last[:, :1], -1), last[:, :-1]], dim=1)   # strictly before t
    qkey = torch.where(before >= 0, pick, -1.0).argmax(dim=-1)   # uniform over the written keys
    src = before.gather(2, qkey[..., None])[..., 0]             # where the answer was written
    inputs = torch.where(query, 1 + n_keys * n_values + qkey, 1 + key * n_values + val)
    inputs[:, 0] = BOS
    targets = torch.where(query, val.gather(1, src.clamp(min=0)), IGNORE)
    if device is not None:
        inputs, targets = inputs.to(device), targets.to(device)
    return inputs, targets


def token_text(ids, n_keys: int, n_values: int) -> list[str]:
    """Readable tokens of one sequence: ``"BOS"``, ``"c=3"`` (write value 3 under key c; keys are
    letters), ``"c?"`` (query key c)."""
    n_keys, n_values = check_int(n_keys, "n_keys", 1), check_int(n_values, "n_values", 2)
    if n_keys > 26:
        raise ValueError(f"n_keys must be <= 26 to name keys by letters; got {n_keys}")
    out = []
    for tok in (int(t) for t in ids):
        if tok == BOS:
            out.append("BOS")
        elif tok <= n_keys * n_values:
            key, val = divmod(tok - 1, n_values)
            out.append(f"{chr(97 + key)}={val}")
        elif tok <= n_keys * n_values + n_keys:
            out.append(f"{chr(97 + tok - 1 - n_keys * n_values)}?")
        else:
            raise ValueError(f"ids must be tokens of vocab_size({n_keys}, {n_values}); got {tok}")
    return out


# ---------------------------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------------------------
def attention_bias(encoding: str, T: int, n_heads: int, log_gates=None, device=None):
    """The additive bias of the scores, ``-inf`` above the diagonal (the causal mask included).

    ``nope``: 0 on and below the diagonal, ``[T, T]``. ``alibi``: ``-slope_h (i - j)``,
    ``[n_heads, T, T]``. ``fox``: ``c_i - c_j`` with ``c = cumsum(log_gates)`` over time,
    ``log_gates`` ``[B, n_heads, T]`` (log forget gates, ``<= 0``), giving ``[B, n_heads, T, T]``.
    """
    i = torch.arange(T, device=device)
    dist = (i[:, None] - i[None, :]).float()
    causal = dist >= 0
    if encoding == "nope":
        return torch.zeros(T, T, device=device).masked_fill(~causal, float("-inf"))
    if encoding == "alibi":
        from lattn_core import alibi_slopes
        slopes = torch.tensor(alibi_slopes(n_heads), dtype=torch.float32, device=device)
        return (-slopes[:, None, None] * dist).masked_fill(~causal, float("-inf"))
    if encoding == "fox":
        if log_gates is None:
            raise ValueError("fox needs log_gates of shape [B, n_heads, T]")
        c = torch.cumsum(log_gates, dim=-1)
        return (c[..., :, None] - c[..., None, :]).masked_fill(~causal, float("-inf"))
    raise ValueError(f"encoding must be one of {ENCODINGS}; got {encoding!r}")


class SoftmaxAttention(nn.Module):
    """Causal multi-head softmax attention with the bias of ``encoding`` (scale ``head_dim^-1/2``).
    For ``fox`` a forget gate per head, ``log f_t = logsigmoid(w_h . x_t + b_h)``."""

    def __init__(self, d_model: int, n_heads: int, encoding: str):
        super().__init__()
        if encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}; got {encoding!r}")
        if d_model % n_heads:
            raise ValueError(f"d_model must be a multiple of n_heads; got {d_model} and {n_heads}")
        self.H, self.D, self.encoding = n_heads, d_model // n_heads, encoding
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        if encoding == "fox":
            self.gate = nn.Linear(d_model, n_heads)
            nn.init.constant_(self.gate.bias, FOX_GATE_BIAS)

    def log_gates(self, x):
        """``[B, H, T]`` log forget gates of ``fox`` (``None`` for the other encodings)."""
        if self.encoding != "fox":
            return None
        return F.logsigmoid(self.gate(x)).transpose(1, 2)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, T, 3, self.H, self.D).permute(2, 0, 3, 1, 4)
        bias = attention_bias(self.encoding, T, self.H, self.log_gates(x), device=x.device)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype))
        return self.out(o.transpose(1, 2).reshape(B, T, -1))


class RecallTransformer(nn.Module):
    """Embedding → ``n_layers`` pre-norm blocks (attention, MLP) → norm → logits over the values.
    No position embedding of any kind: position enters only through ``encoding``'s bias."""

    def __init__(self, encoding: str, vocab: int, n_values: int, d_model: int = 64,
                 n_heads: int = 4, n_layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.attn = nn.ModuleList([SoftmaxAttention(d_model, n_heads, encoding)
                                   for _ in range(n_layers)])
        self.mlp = nn.ModuleList([mlp_block(d_model) for _ in range(n_layers)])
        self.norms = nn.ModuleList([nn.LayerNorm(d_model) for _ in range(n_layers)])
        self.norm_out = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_values)

    def forward(self, ids):
        x = residual_stack(self.embed(ids), self.norms, self.attn, self.mlp)
        return self.head(self.norm_out(x))


# ---------------------------------------------------------------------------------------------
# training and evaluation
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExtrapolationConfig(TrainConfig):
    """Everything that defines one run. The defaults are the CPU setting (:func:`cpu_config`)."""

    encodings: tuple = ENCODINGS
    train_len: int = 64
    eval_lens: tuple = (64, 128, 192, 256)
    n_keys: int = 8
    n_values: int = 8
    query_prob: float = 0.25
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    steps: int = 250
    eval_batch: int = 128


def cpu_config(**changes) -> ExtrapolationConfig:
    """The setting the chapter trains live on a CPU: trained at 64 tokens, scored up to 256."""
    return replace(ExtrapolationConfig(), **changes)


def gpu_config(**changes) -> ExtrapolationConfig:
    """The larger setting for one GPU: wider and trained longer, at 256 tokens, scored up to 1024;
    more keys and values. ``python -m experiments.extrapolation --gpu --write`` runs it for seeds
    0-4 (designed for a few minutes on one H100/H200)."""
    base = ExtrapolationConfig(train_len=256, eval_lens=(256, 512, 768, 1024), n_keys=16,
                               n_values=16, d_model=128, n_heads=4, n_layers=2, steps=1000,
                               batch=128, lr=1e-3, eval_batch=128, threads=None, device="cuda")
    return replace(base, **changes)




def _seeds(seed: int) -> tuple[int, int, int]:
    """(model init, training data, evaluation data) from one ``seed``; the same for every
    encoding, so the models start alike, see one training stream and are scored on one set."""
    return derived_seeds(seed, 700_001)


def evaluate(model: RecallTransformer, inputs, targets) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) over the scored (query) positions."""
    was = model.training
    model.eval()
    with torch.no_grad():
        logits = model(inputs)
    model.train(was)
    m = targets != IGNORE
    acc = float((logits[m].argmax(-1) == targets[m]).float().mean())
    return acc, float(F.cross_entropy(logits[m], targets[m]))


def train_model(encoding: str, config: ExtrapolationConfig | None = None) -> dict:
    """Train one model at ``train_len`` and score it at every ``eval_lens``. Returns ``encoding``,
    ``accuracy`` and ``loss`` (one per length), the training ``losses``, ``train_seconds`` and the
    ``model`` itself."""
    cfg = config or cpu_config()
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {ENCODINGS}; got {encoding!r}")
    init_seed, data_seed, eval_seed = _seeds(cfg.seed)
    V = vocab_size(cfg.n_keys, cfg.n_values)
    data = dict(n_keys=cfg.n_keys, n_values=cfg.n_values, query_prob=cfg.query_prob, device=cfg.device)
    with torch_threads(cfg.threads):
        torch.manual_seed(init_seed)
        model = RecallTransformer(encoding, V, cfg.n_values, cfg.d_model, cfg.n_heads,
                                  cfg.n_layers).to(cfg.device)

        def batch_loss(step):
            x, y = make_recency_recall(seq_len=cfg.train_len, batch=cfg.batch, seed=data_seed + step,
                                       **data)
            m = y != IGNORE
            return F.cross_entropy(model(x)[m], y[m])
        losses, train_s = fit(model, cfg, batch_loss)
        acc, ce = [], []
        for i, L in enumerate(cfg.eval_lens):
            x, y = make_recency_recall(seq_len=L, batch=cfg.eval_batch, seed=eval_seed + i, **data)
            a, c = evaluate(model, x, y)
            acc.append(a)
            ce.append(c)
    return {"encoding": encoding, "eval_lens": list(cfg.eval_lens), "accuracy": acc, "loss": ce,
            "losses": losses, "train_seconds": train_s, "model": model}




def run_extrapolation(config: ExtrapolationConfig | None = None, *, keep_models: bool = False,
                      loss_every: int = 10) -> dict:
    """Every encoding of ``config`` (default :func:`cpu_config`), one seed. Returns ``{"config",
    "records": [{encoding, seed, eval_lens, accuracy, loss, train_seconds, final_loss, losses}],
    "accuracy": {encoding: [...]}, "seconds"}``; ``losses`` are window means of ``loss_every``
    steps (the models too, under ``"models"``, with ``keep_models``)."""
    cfg = config or cpu_config()
    for e in cfg.encodings:
        if e not in ENCODINGS:
            raise ValueError(f"encodings must be drawn from {ENCODINGS}; got {e!r}")
    if max(cfg.eval_lens) < cfg.train_len:
        raise ValueError("eval_lens must reach train_len or beyond")
    return train_each(cfg, cfg.encodings, "encoding", train_model, keep_models=keep_models,
                      loss_every=loss_every)


def run_seeds(config: ExtrapolationConfig, seeds, *, jobs: int = 1) -> dict:
    """:func:`run_extrapolation` once per seed, or with ``jobs > 1`` once per encoding and seed,
    that many at a time in their own processes (the same records: every encoding of a seed starts
    from the same seeds). Returns ``{"config" (with "seeds", and "jobs" when above 1), "records"
    (one per encoding and seed), "seconds": {seed: seconds, summed over its pieces}}``."""
    return run_each_seed(config, seeds, run_extrapolation, jobs=jobs,
                         split="encodings" if jobs != 1 else None)


def seed_summary(records: list[dict]) -> dict:
    """Per encoding, over the seeds of ``records``: the mean, smallest and largest accuracy at each
    evaluation length, and per length the number of seeds each encoding was best in (ties count for
    all). Returns ``{"eval_lens", "seeds", "mean", "min", "max", "first"}``."""
    return summarize_seeds(records, "encoding", "eval_lens")


def plot_summary(summary: dict, ax, train_len: int, title: str):
    """Mean accuracy against the evaluation length per encoding, the band from the worst to the best
    seed, and a dotted line at the training length, on the matplotlib axes ``ax``."""
    for enc in ENCODINGS:
        line, = ax.plot(summary["eval_lens"], summary["mean"][enc], "o-", label=NAMES[enc])
        ax.fill_between(summary["eval_lens"], summary["min"][enc], summary["max"][enc],
                        color=line.get_color(), alpha=0.2)
    ax.axvline(train_len, color="gray", ls=":", lw=1)
    ax.set_xlabel("evaluation length n (tokens)")
    ax.set_ylabel("accuracy at the queries")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)


def summary_sentences(summary: dict):
    """The result in words, from a :func:`seed_summary`: one line per evaluation length (the best
    mean, its lead over the second, in how many seeds it was best, the third), the fall of each
    encoding's mean from the first length to the last, and a sentence stating those falls.
    Returns ``(lines, drop, sentence)``."""
    lens, mean = summary["eval_lens"], summary["mean"]
    seeds = len(summary["seeds"])
    out = []
    for i, L in enumerate(lens):
        order = sorted(ENCODINGS, key=lambda e: -mean[e][i])
        best, second = order[0], order[1]
        out.append(f"n = {L}: {NAMES[best]} {mean[best][i]:.3f}, "
                   f"{mean[best][i] - mean[second][i]:+.3f} over {NAMES[second]}, best in "
                   f"{summary['first'][best][i]} of {seeds} seeds; {NAMES[order[2]]} {mean[order[2]][i]:.3f}")
    drop = {e: mean[e][0] - mean[e][-1] for e in ENCODINGS}
    tail = ("From the training length to four times it, mean accuracy falls "
            + ", ".join(f"by {drop[e]:.3f} for {NAMES[e]}" for e in ENCODINGS) + ".")
    return out, drop, tail


def load_stored() -> dict:
    """The stored GPU runs (``experiments/results/extrapolation.json``: ``env``, ``config`` with its
    ``seeds``, ``records``), with ``same_as_gpu_config``: whether they were run with the settings
    :func:`gpu_config` has now. Raises ``FileNotFoundError`` when this copy of the book has none."""
    return load_stored_runs(STORED, gpu_config, "python -m experiments.extrapolation --gpu --write")


def main(argv=None) -> int:
    """``python -m experiments.extrapolation [--gpu] [--seeds ...] [--device D] [--steps N] [--write]``
    (:func:`experiments.common.seeds_cli`)."""
    return seeds_cli(argv, description="Chapter 7: train short, test long (NoPE, ALiBi, FoX)",
                     stored=STORED, cpu_config=cpu_config, gpu_config=gpu_config, run_seeds=run_seeds,
                     gpu_seeds=[0, 1, 2, 3, 4],
                     describe=lambda r: f"seed {r['seed']} {r['encoding']:>5}: " + "  ".join(
                         f"n={L}: {a:.3f}" for L, a in zip(r["eval_lens"], r["accuracy"])))


if __name__ == "__main__":
    raise SystemExit(main())
