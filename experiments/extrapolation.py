"""Train short, test long: what a forget gate buys softmax attention (the length-extrapolation experiment).

Small softmax-attention models are trained on sequences of ``train_len`` tokens and scored on
sequences up to four times longer. They differ only in what they add to the attention scores:

==========  ==========================================================================
``nope``    nothing: no position encoding at all (the causal mask is the only order)
``alibi``   ALiBi's fixed bias ``-slope_h (i - j)``, slopes :func:`lattn_core.alibi_slopes`
``fox``     FoX's learned bias ``log Γ_ij = sum_{tau=j+1..i} log f_tau``, a forget gate
            ``f_t = sigmoid(w_h · x_t + b_h)`` per head computed from the token (data dependent)
==========  ==========================================================================

**The task** (:func:`make_recency_recall`), made in code, nothing downloaded: *recall with segment
boundaries*. A stream of *write* tokens, each naming a key and a value (``n_keys · n_values`` write
tokens: the pair is one token), keys drawn at random so every key is rewritten again and again;
here and there a *reset* token ``|`` that ends a segment; and here and there a *query* token naming
a key that has been written somewhere before. The answer is the value of that key's most recent
write **since the last reset**, or *none* (an extra class) when the key has not been written since
it: its older writes belong to a finished segment. Only query positions are scored. Two things are
needed, and they do not change with the length: prefer the recent write of a key over its stale
ones (recency, which ALiBi's fixed decay supplies as well as FoX's), and ignore everything before
the last reset, however recent (a boundary, which a gate computed from the token can close at the
reset and a fixed slope cannot). With ``reset_prob = 0`` there are no resets and no *none*
answers: the pure recency task of the first version of this experiment, which could not tell FoX's
gate from ALiBi's slopes.

**How the setting was chosen and what is claimed.** The task was designed for the question before
any run; the sizes were set to fit the time budgets (the CPU cell in well under a minute on the
book's 2-core machine; the GPU setting, the whole grid and three seeds, in a few minutes on one
H200) and not tuned to favour any model. Every model has the same width, depth, heads, optimizer,
data stream and evaluation batches; each gets its own learning rate, chosen from ``lr_grid`` by its
accuracy at ``train_len`` on the evaluation sequences of ``grid_seed``, a seed no reported run uses
(:func:`experiments.common.tune_and_run`: NoPE's best shot at the training length is part of
the protocol). FoX's gate starts near 1 (bias ``+3``, gate ``≈ 0.95``, as a gate that starts by
remembering). The claims of :func:`claims` and their margins were fixed from pilot runs on other
seeds, before the stored seeds were run.

Entry points: :func:`run_extrapolation` (one seed, every encoding at ``config.lr``),
:func:`run_seeds` (the grid, then the seeds), :func:`claims`, :func:`seed_summary`,
:func:`load_stored` (the GPU runs in ``experiments/results/extrapolation.json``), and
``python -m experiments.extrapolation`` (``--gpu`` for the larger setting, ``--jobs N`` processes,
``--write`` to store it with the device, date and versions).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from .common import (TunedConfig, check_int, derived_seeds, fit, load_run, claim, mlp_block, residual_stack,
                     seeds_cli, summarize_seeds, torch_threads, train_each, tune_and_run)

__all__ = ["ENCODINGS", "ExtrapolationConfig", "cpu_config", "gpu_config", "make_recency_recall",
           "vocab_size", "reset_token", "token_text", "attention_bias", "SoftmaxAttention",
           "RecallTransformer", "train_model", "evaluate", "reset_gates", "run_extrapolation", "run_seeds",
           "claims", "seed_summary", "NAMES", "COLORS", "plot_summary", "summary_sentences", "STORED",
           "COMMAND", "load_stored", "main"]

STORED = "extrapolation"        # experiments/results/extrapolation.json: the GPU runs
COMMAND = "python -m experiments.extrapolation --gpu --jobs 8 --write"
ENCODINGS = ("nope", "alibi", "fox")
NAMES = {"nope": "NoPE", "alibi": "ALiBi", "fox": "FoX"}     # as the book writes them
IGNORE = -100                   # target at positions that are not scored
BOS = 0                         # the first token of every sequence
FOX_GATE_BIAS = 3.0             # f_t = sigmoid(w · x + b) starts near sigmoid(3) ≈ 0.95




# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------
def vocab_size(n_keys: int, n_values: int) -> int:
    """``1 + n_keys · n_values + n_keys + 1``: BOS, one write token per (key, value), one query per
    key, the reset token."""
    return 1 + check_int(n_keys, "n_keys", 1) * check_int(n_values, "n_values", 2) + n_keys + 1


def reset_token(n_keys: int, n_values: int) -> int:
    """The id of the reset token ``|``, the last of the vocabulary."""
    return vocab_size(n_keys, n_values) - 1


def make_recency_recall(n_keys: int, n_values: int, seq_len: int, batch: int, seed: int,
                        query_prob: float = 0.25, reset_prob: float = 0.0, device=None):
    """A batch of recall sequences with segment boundaries: ``(inputs, targets)``, both
    ``[batch, seq_len]`` long.

    Token ids: ``0`` is BOS (position 0); ``1 + key · n_values + value`` writes ``value`` under
    ``key``; ``1 + n_keys · n_values + key`` queries ``key``; :func:`reset_token` ends a segment.
    Position 1 is a write; at every later position the token is, with probability ``reset_prob``, a
    reset; else, with probability ``query_prob``, a query for a key drawn uniformly from all keys;
    else a write with a uniform key and value. ``targets`` holds, at query positions, the value of
    the queried key's most recent write since the last reset (BOS counts as one), or ``n_values``
    (*none*) when it has no write since then; ``-100`` elsewhere. So every segment poses the same
    questions, and a *none* key of a later segment usually has stale writes before its reset. The
    same ``seed`` gives the same batch (generated on the CPU, then moved to ``device``).
    """
    n_keys, n_values = check_int(n_keys, "n_keys", 1), check_int(n_values, "n_values", 2)
    seq_len, batch = check_int(seq_len, "seq_len", 2), check_int(batch, "batch", 1)
    if not (isinstance(query_prob, (int, float)) and 0 < query_prob < 1):
        raise ValueError(f"query_prob must lie in (0, 1); got {query_prob!r}")
    if not (isinstance(reset_prob, (int, float)) and 0 <= reset_prob < 1):
        raise ValueError(f"reset_prob must lie in [0, 1); got {reset_prob!r}")
    gen = torch.Generator().manual_seed(int(seed))
    T = seq_len
    query = torch.rand(batch, T, generator=gen) < query_prob
    reset = torch.rand(batch, T, generator=gen) < reset_prob
    query &= ~reset
    query[:, :2] = False                                   # BOS, then a write
    reset[:, :2] = False
    key = torch.randint(n_keys, (batch, T), generator=gen)
    val = torch.randint(n_values, (batch, T), generator=gen)
    qkey = torch.randint(n_keys, (batch, T), generator=gen)
    # last[b, t, k]: the position of the latest write of key k at or before t (-1: none yet)
    pos = torch.arange(T).expand(batch, T)
    wrote = F.one_hot(key, n_keys).bool() & ~(query | reset)[..., None] & (pos > 0)[..., None]
    last = torch.where(wrote, pos[..., None], -1).cummax(dim=1).values
    before = torch.cat([torch.full_like(last[:, :1], -1), last[:, :-1]], dim=1)   # strictly before t
    src = before.gather(2, qkey[..., None])[..., 0]             # where the key was last written
    cut = torch.where(reset, pos, -1).cummax(dim=1).values      # the last reset at or before t
    inputs = torch.where(query, 1 + n_keys * n_values + qkey, 1 + key * n_values + val)
    inputs = torch.where(reset, reset_token(n_keys, n_values), inputs)
    inputs[:, 0] = BOS
    answer = torch.where(src > cut, val.gather(1, src.clamp(min=0)), n_values)
    targets = torch.where(query, answer, IGNORE)
    if device is not None:
        inputs, targets = inputs.to(device), targets.to(device)
    return inputs, targets


def token_text(ids, n_keys: int, n_values: int) -> list[str]:
    """Readable tokens of one sequence: ``"BOS"``, ``"c=3"`` (write value 3 under key c; keys are
    letters), ``"c?"`` (query key c), ``"|"`` (reset)."""
    n_keys, n_values = check_int(n_keys, "n_keys", 1), check_int(n_values, "n_values", 2)
    if n_keys > 26:
        raise ValueError(f"n_keys must be <= 26 to name keys by letters; got {n_keys}")
    out = []
    for tok in (int(t) for t in ids):
        if tok == BOS:
            out.append("BOS")
        elif 0 < tok <= n_keys * n_values:
            key, val = divmod(tok - 1, n_values)
            out.append(f"{chr(97 + key)}={val}")
        elif n_keys * n_values < tok <= n_keys * n_values + n_keys:
            out.append(f"{chr(97 + tok - 1 - n_keys * n_values)}?")
        elif tok == reset_token(n_keys, n_values):
            out.append("|")
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
    For ``fox`` a forget gate per head, ``log f_t = logsigmoid(w_h · x_t + b_h)``."""

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
    """Embedding → ``n_layers`` pre-norm blocks (attention, MLP) → norm → logits over the values and
    *none* (``n_values + 1`` classes). No position embedding of any kind: position enters only
    through ``encoding``'s bias."""

    def __init__(self, encoding: str, vocab: int, n_values: int, d_model: int = 64,
                 n_heads: int = 4, n_layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.attn = nn.ModuleList([SoftmaxAttention(d_model, n_heads, encoding)
                                   for _ in range(n_layers)])
        self.mlp = nn.ModuleList([mlp_block(d_model) for _ in range(n_layers)])
        self.norms = nn.ModuleList([nn.LayerNorm(d_model) for _ in range(n_layers)])
        self.norm_out = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_values + 1)

    def forward(self, ids):
        x = residual_stack(self.embed(ids), self.norms, self.attn, self.mlp)
        return self.head(self.norm_out(x))


# ---------------------------------------------------------------------------------------------
# training and evaluation
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExtrapolationConfig(TunedConfig):
    """Everything that defines one run. The defaults are the CPU setting (:func:`cpu_config`)."""

    encodings: tuple = ENCODINGS
    train_len: int = 64
    eval_lens: tuple = (64, 128, 192, 256)
    n_keys: int = 8
    n_values: int = 8
    query_prob: float = 0.25
    reset_prob: float = 1 / 24
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    steps: int = 200
    lr_grid: tuple = ()
    grid_seed: int = 100
    eval_batch: int = 128


def cpu_config(**changes) -> ExtrapolationConfig:
    """The setting the chapter trains live on a CPU: trained at 64 tokens, scored up to 256, a reset
    every 24 tokens on average, one learning rate for every encoding (the GPU setting's grid
    carries the comparison)."""
    return replace(ExtrapolationConfig(), **changes)


def gpu_config(**changes) -> ExtrapolationConfig:
    """The setting of the stored runs, for one GPU: trained at 128 tokens, scored up to 512, 16
    keys and 16 values, a reset every 32 tokens on average, five times the CPU setting's steps of
    twice its batch, a learning-rate grid of three rates per encoding on ``grid_seed``, then the
    seeds. ``python -m experiments.extrapolation --gpu --jobs 8 --write`` runs it for seeds 0-2."""
    base = ExtrapolationConfig(train_len=128, eval_lens=(128, 256, 384, 512), n_keys=16, n_values=16,
                               reset_prob=1 / 32, steps=1000, batch=64, lr_grid=(1e-3, 3e-3, 1e-2),
                               threads=2, device="cuda")     # 2 CPU threads a process: 8 share 16 cores
    return replace(base, **changes)


def _seeds(seed: int) -> tuple[int, int, int]:
    """(model init, training data, evaluation data) from one ``seed``; the same for every
    encoding, so the models start alike, see one training stream and are scored on one set."""
    return derived_seeds(seed, 700_001)


def evaluate(model: RecallTransformer, inputs, targets) -> dict:
    """Over the scored (query) positions: ``accuracy``, ``loss`` (mean cross-entropy), and the
    accuracy on the queries whose answer is *none* (``acc_none``; the class ``n_values``) and on
    those whose answer is a value (``acc_value``); ``nan`` where there is none of a kind."""
    was = model.training
    model.eval()
    with torch.no_grad():
        logits = model(inputs)
    model.train(was)
    m = targets != IGNORE
    none = targets == logits.shape[-1] - 1
    right = logits.argmax(-1) == targets
    share = lambda sel: float(right[sel].float().mean()) if sel.any() else float("nan")
    return {"accuracy": share(m), "loss": float(F.cross_entropy(logits[m], targets[m])),
            "acc_none": share(m & none), "acc_value": share(m & ~none)}


def reset_gates(model: RecallTransformer, inputs, n_keys: int, n_values: int) -> list:
    """How FoX's gates treat the reset token: for the ``(layer, head)`` whose mean forget gate at
    the reset tokens of ``inputs`` is lowest, ``[that mean, the same head's mean gate at every
    other token]``. A gate that closes at a boundary and stays open elsewhere reads like
    ``[0.01, 0.9]``. ``ValueError`` for a model without FoX's gates or inputs without a reset."""
    if model.attn[0].encoding != "fox":
        raise ValueError("model must have the 'fox' encoding")
    at = inputs == reset_token(n_keys, n_values)
    if not at.any():
        raise ValueError("inputs must hold at least one reset token")
    best = None
    with torch.no_grad():
        x = model.embed(inputs)
        for norm, attn, mlp in zip(model.norms, model.attn, model.mlp):
            g = attn.log_gates(norm(x)).exp()                          # [B, H, T]
            for h in range(g.shape[1]):
                pair = [float(g[:, h][at].mean()), float(g[:, h][~at].mean())]
                best = pair if best is None or pair[0] < best[0] else best
            x = x + attn(norm(x))
            x = x + mlp(x)
    return best


def train_model(encoding: str, config: ExtrapolationConfig | None = None) -> dict:
    """Train one model at ``train_len`` and score it at every ``eval_lens``. Returns ``encoding``,
    ``eval_lens``, per length ``accuracy``, ``loss``, ``acc_none`` and ``acc_value``
    (:func:`evaluate`), ``reset_gate`` (:func:`reset_gates` on the evaluation sequences of the
    training length; ``None`` but for FoX, or without resets), the training ``losses``,
    ``train_seconds`` and the ``model`` itself."""
    cfg = config or cpu_config()
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {ENCODINGS}; got {encoding!r}")
    init_seed, data_seed, eval_seed = _seeds(cfg.seed)
    V = vocab_size(cfg.n_keys, cfg.n_values)
    data = dict(n_keys=cfg.n_keys, n_values=cfg.n_values, query_prob=cfg.query_prob,
                reset_prob=cfg.reset_prob, device=cfg.device)
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
        scores, gate = [], None
        for i, L in enumerate(cfg.eval_lens):
            x, y = make_recency_recall(seq_len=L, batch=cfg.eval_batch, seed=eval_seed + i, **data)
            scores.append(evaluate(model, x, y))
            if encoding == "fox" and L == cfg.train_len and cfg.reset_prob > 0:
                gate = reset_gates(model, x, cfg.n_keys, cfg.n_values)
    out = {"encoding": encoding, "eval_lens": list(cfg.eval_lens)}
    out.update({k: [sc[k] for sc in scores] for k in ("accuracy", "loss", "acc_none", "acc_value")})
    out.update(reset_gate=gate, losses=losses, train_seconds=train_s, model=model)
    return out


def _check_config(cfg: ExtrapolationConfig) -> None:
    for e in cfg.encodings:
        if e not in ENCODINGS:
            raise ValueError(f"encodings must be drawn from {ENCODINGS}; got {e!r}")
    if max(cfg.eval_lens) < cfg.train_len:
        raise ValueError("eval_lens must reach train_len or beyond")
    if len(cfg.lr_grid) > 1 and cfg.train_len not in cfg.eval_lens:
        raise ValueError("eval_lens must hold train_len when there is an lr_grid (the rate is chosen there)")


def run_extrapolation(config: ExtrapolationConfig | None = None, *, keep_models: bool = False,
                      loss_every: int = 10) -> dict:
    """Every encoding of ``config`` (default :func:`cpu_config`), one seed, at ``config.lr``.
    Returns ``{"config", "records": [{encoding, seed, eval_lens, accuracy, loss, acc_none,
    acc_value, reset_gate, train_seconds, final_loss, losses}], "accuracy": {encoding: [...]},
    "seconds"}``; ``losses`` are window means of ``loss_every`` steps (the models too, under
    ``"models"``, with ``keep_models``)."""
    cfg = config or cpu_config()
    _check_config(cfg)
    return train_each(cfg, cfg.encodings, "encoding", train_model, keep_models=keep_models,
                      loss_every=loss_every)


def _grid_score(record: dict) -> float:
    """What a learning rate is chosen by: the accuracy at the training length (held out)."""
    return record["accuracy"][record["eval_lens"].index(record["train_len"])]


def _run_one(config: ExtrapolationConfig) -> dict:
    """:func:`run_extrapolation` with each record told its training length (for :func:`_grid_score`)."""
    out = run_extrapolation(config)
    for r in out["records"]:
        r["train_len"] = config.train_len
    return out


def run_seeds(config: ExtrapolationConfig, seeds, *, jobs: int = 1, pieces=None) -> dict:
    """The learning-rate grid ``config.lr_grid`` for every encoding on ``config.grid_seed``
    (chosen by the accuracy at ``train_len``), then every seed at each encoding's chosen rate
    (:func:`experiments.common.tune_and_run`; with an empty grid, every encoding at
    ``config.lr``); ``jobs`` pieces (one encoding, one seed or rate) at a time in their own
    processes, which gives the same records as one process (every piece is seeded alike).
    Returns ``{"config" (with "seeds" and "lr_choice"), "grid" (the grid's records, each with its
    "score"), "records" (one per encoding and seed), "seconds": {seed: seconds, summed over its
    pieces}}``."""
    _check_config(config)
    return tune_and_run(config, seeds, _run_one, split=("encodings",), score=_grid_score, jobs=jobs, pieces=pieces)


def seed_summary(records: list[dict], field: str = "accuracy") -> dict:
    """Per encoding, over the seeds of ``records``: the mean, smallest and largest ``field``
    (``accuracy``, ``acc_none`` or ``acc_value``) at each evaluation length, and per length the
    number of seeds each encoding was best in (ties count for all). Returns ``{"eval_lens",
    "seeds", "mean", "min", "max", "first"}``."""
    if field not in ("accuracy", "acc_none", "acc_value"):
        raise ValueError(f"field must be 'accuracy', 'acc_none' or 'acc_value'; got {field!r}")
    return summarize_seeds([dict(r, accuracy=r[field]) for r in records], "encoding", "eval_lens")


from lattn_core.palette import color_of  # noqa: E402  (the book's one colour per model)
COLORS = {enc: color_of(enc) for enc in NAMES}     # one colour per encoding in every figure


def plot_summary(summary: dict, ax, train_len: int, title: str, ylabel: str = "accuracy at the queries"):
    """Mean accuracy against the evaluation length per encoding, the band from the worst to the best
    seed, and a dotted line at the training length, on the matplotlib axes ``ax``."""
    for enc in summary["mean"]:
        ax.plot(summary["eval_lens"], summary["mean"][enc], "o-", color=COLORS[enc], label=NAMES[enc])
        ax.fill_between(summary["eval_lens"], summary["min"][enc], summary["max"][enc],
                        color=COLORS[enc], alpha=0.2)
    ax.axvline(train_len, color="gray", ls=":", lw=1)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("evaluation length n (tokens)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)


def summary_sentences(summary: dict) -> list[str]:
    """The result in words, from a :func:`seed_summary`: one line per evaluation length with every
    encoding's mean (best first) and in how many seeds the best one came first."""
    lens, mean = summary["eval_lens"], summary["mean"]
    seeds = len(summary["seeds"])
    out = []
    for i, L in enumerate(lens):
        order = sorted(mean, key=lambda e: -mean[e][i])
        first = (f" ({NAMES[order[0]]} best in {summary['first'][order[0]][i]} of {seeds} seeds)"
                 if seeds > 1 else "")
        out.append(f"n = {L}: " + ", ".join(f"{NAMES[e]} {mean[e][i]:.3f}" for e in order) + first)
    return out


def claims(run: dict) -> list[dict]:
    """What the chapter says of a run (:func:`run_seeds`' result or the stored runs), each claim
    with whether it holds and what was measured (:func:`experiments.common.claim`). The
    criteria were fixed before the stored runs, the margins from pilot runs on seeds 10-12 (see the
    module's docstring). A claim about an encoding the run does not hold is left out; "every
    seed" means every seed of the run, "the first" and "the last length" the run's first and last
    evaluation lengths (the training length and four times it).

    1. FoX and ALiBi extrapolate: from the first length to the last FoX's accuracy falls by at
       most 0.05 and ALiBi's by at most 0.1, in every seed.
    2. The boundary separates them: FoX beats ALiBi at every length in every seed, and by more at
       the last length than at the first, in the mean over the seeds.
    3. FoX answers both kinds of query: at least 0.99 on those whose answer is *none* and at least
       0.9 on those whose answer is a value, at every length in every seed.
    4. FoX's gate learns the boundary: in every seed some head's mean gate at the reset token is
       below 0.1 while the same head's mean gate elsewhere is above 0.5.
    5. NoPE under-fits already at the training length: below FoX there in every seed (its rate,
       in a run with a grid, chosen there); the measured gap is its in-distribution gap.
    6. NoPE falls from the first length to the last by more than 0.1, and by more than FoX, in
       every seed.
    7. The grid gives NoPE its best shot: even at the rate of the grid best for NoPE at the last
       length (chosen with hindsight), NoPE there is below FoX at FoX's chosen rate, on the grid
       seed (only in a run with a grid).
    """
    recs = run["records"]
    present = list(dict.fromkeys(r["encoding"] for r in recs))
    seeds = sorted({r.get("seed", 0) for r in recs})
    n = len(seeds)
    every = "in every seed" if n > 1 else "in the one seed"
    by = {e: [r for s in seeds for r in recs if r["encoding"] == e and r.get("seed", 0) == s] for e in present}
    fmt = lambda xs: ", ".join(f"{x:.3f}" for x in xs)
    fall = {e: [r["accuracy"][0] - r["accuracy"][-1] for r in by[e]] for e in present}
    out = []
    limit = {"fox": 0.05, "alibi": 0.1}
    biased = [e for e in limit if e in present]
    if biased:
        out.append(claim(
            f"{' and '.join(NAMES[e] for e in biased)} extrapolate: from the training length to four times it "
            + " and ".join(f"{NAMES[e]}'s accuracy falls by at most {limit[e]}" for e in biased) + f" {every}.",
            all(max(fall[e]) <= limit[e] for e in biased),
            "; ".join(f"{NAMES[e]}'s fall {fmt(fall[e])}" for e in biased)))
    if "fox" in present and "alibi" in present:
        lead = [[f - a for f, a in zip(rf["accuracy"], ra["accuracy"])]
                for rf, ra in zip(by["fox"], by["alibi"])]
        first, last = sum(x[0] for x in lead) / n, sum(x[-1] for x in lead) / n
        out.append(claim(
            "Segment boundaries separate FoX's gate from ALiBi's slopes: FoX beats ALiBi at every length "
            f"{every}, "
            "and by more at four times the training length than at it, in the mean.",
            min(min(x) for x in lead) > 0 and last > first,
            f"FoX's smallest lead per seed {fmt([min(x) for x in lead])}; mean lead {first:.3f} at the "
            f"training length, {last:.3f} at four times it"))
    if "fox" in present:
        none = [min(r["acc_none"]) for r in by["fox"]]
        value = [min(r["acc_value"]) for r in by["fox"]]
        out.append(claim(
            "FoX answers both kinds of query: at least 0.99 on those whose answer is none and at least 0.9 on "
            f"those whose answer is a value, at every length {every}.",
            min(none) >= 0.99 and min(value) >= 0.9,
            f"FoX's lowest per seed on none {fmt(none)}, on values {fmt(value)}"))
        gates = [r.get("reset_gate") for r in by["fox"]]
        if all(gates):
            out.append(claim(
                f"FoX's gate learns the boundary: {every} some head's mean gate at the reset token is "
                "below 0.1 "
                "while the same head's mean gate elsewhere is above 0.5.",
                all(g[0] < 0.1 and g[1] > 0.5 for g in gates),
                "; ".join(f"{g[0]:.3f} at resets, {g[1]:.3f} elsewhere" for g in gates)))
    if "fox" in present and "nope" in present:
        gap = [rf["accuracy"][0] - rn["accuracy"][0] for rf, rn in zip(by["fox"], by["nope"])]
        out.append(claim(
            f"NoPE under-fits already at the training length: below FoX there {every}.",
            min(gap) > 0, f"FoX minus NoPE at the training length {fmt(gap)}"))
        out.append(claim(
            "NoPE falls from the training length to four times it by more than 0.1, and by more than FoX, "
            f"{every}.",
            all(a > max(0.1, b) for a, b in zip(fall["nope"], fall["fox"])),
            f"NoPE's fall {fmt(fall['nope'])}; FoX's {fmt(fall['fox'])}"))
        grid = run.get("grid") or []
        chosen = {row["unit"]: row["lr"] for row in run["config"].get("lr_choice", [])}
        nope_rows = [r for r in grid if r["encoding"] == "nope"]
        fox_rows = [r for r in grid if r["encoding"] == "fox" and r["lr"] == chosen.get("fox")]
        if nope_rows and fox_rows:
            best = max(r["accuracy"][-1] for r in nope_rows)
            out.append(claim(
                "The grid gives NoPE its best shot: even at the rate best for NoPE at four times the training "
                "length (chosen with hindsight), NoPE there is below FoX at FoX's chosen rate (grid seed).",
                best < fox_rows[0]["accuracy"][-1],
                f"NoPE's best {best:.3f} against FoX's {fox_rows[0]['accuracy'][-1]:.3f}"))
    return out


def load_stored() -> dict:
    """The stored GPU runs (``experiments/results/extrapolation.json``: ``env``, ``config`` with its
    ``seeds`` and the chosen rates, ``lr_choice``, the ``grid``, ``records``), with
    ``same_as_gpu_config``: whether they were run with the settings :func:`gpu_config` has now
    (:func:`experiments.common.load_run`). Raises ``FileNotFoundError`` when this copy of the book
    has none."""
    return load_run(STORED, gpu_config, COMMAND, only="encodings")


def main(argv=None) -> int:
    """``python -m experiments.extrapolation [--gpu] [--seeds ...] [--jobs N] [--only E ...] [--device D]
    [--steps N] [--write]`` (:func:`experiments.common.seeds_cli`): the learning-rate grid, then the
    seeds."""
    return seeds_cli(argv, description="train short, test long, with segment boundaries (NoPE, ALiBi, FoX)",
                     stored=STORED, cpu_config=cpu_config, gpu_config=gpu_config, run_seeds=run_seeds,
                     only="encodings",
                     describe=lambda r: f"seed {r['seed']} {r['encoding']:>5} lr {r['lr']:g}: " + "  ".join(
                         f"n={L}: {a:.3f}" for L, a in zip(r["eval_lens"], r["accuracy"])))


if __name__ == "__main__":
    raise SystemExit(main())
