"""Following a chain of links: multi-hop retrieval with one layer (Chapter 7's second experiment).

The article says of DeltaFormer that its pseudo-values, attention run again and again over the keys
before the queries read them, make it good at multi-hop tasks, "for example code". This experiment
asks that of one layer, at a small scale, against the two models DeltaFormer is built from:

===============  ==============================================================================
``softmax``      causal softmax attention, ``softmax(scale · Q K^T) V``
                 (``kernels.flash_attention``)
``deltaformer``  DeltaFormer, ``softmax(scale · Q K^T) (I + Diag(beta) B)^{-1} V`` with
                 ``B`` the strictly causal row softmax of ``scale · K K^T`` (its first row
                 empty) and ``beta_t = sigmoid(w_h . x_t + b_h)`` per token and head
                 (``kernels.deltaformer_attn``: on a CPU a batched triangular solve in PyTorch,
                 the matrix form of :func:`lattn_core.deltaformer`)
``deltanet``     DeltaNet (Chapter 5), the token mixer of :mod:`experiments.mqar` with no short
                 convolution: L2-normalised ``q, k``, ``beta_t = sigmoid(...)``, the recurrence
                 of ``kernels.chunk_delta_rule``
===============  ==============================================================================

Every mixer is one of the book's ops: on a CPU their differentiable PyTorch implementations
(:mod:`kernels.reference`), on a GPU their Triton kernels.

**The task** (:func:`make_variable_chains`), made in code, nothing downloaded, is *variable
tracking*: a short program of one-line statements. A statement either gives a variable a value
(``c=5``) or copies into a new variable one defined *earlier* (``f=c``); every variable is assigned
once. The statements form chains ``c=5, f=c, a=f, ...`` whose statements are interleaved at random
(each chain keeps its order: a variable can only be copied once it exists). After the program come
queries, one per chain, naming the chain's last variable (``a?``); the answer is the value at the
chain's root, and the query is ``h`` hops away from it for a chain of ``h`` statements: one hop is a
plain lookup (``c=5 … c?``), two hops need the link ``f=c`` and then ``c=5``, and so on. Every
chain length of ``hops`` appears ``chains_per_hop`` times in each sequence, so accuracy is measured
per hop count on equally many queries. Only the queries are scored. Values are drawn independently
per chain, so they repeat within a program: a model that follows no link can still guess the most
common value of the program, and :func:`mode_baseline` computes how often that guess is right on
the evaluation batch, the floor to read the multi-hop accuracies against.

Why this shape: a link always points back to a statement that came before it, as in a program, and
each statement is one token, whose embedding is the sum of learned embeddings of its parts (the
variable it names, the variable or value it reads, its kind), the same for every model. A single
softmax-attention layer can find the statement that defines the queried variable (one hop) but then
has no second look: its scores depend on the query and one token at a time. DeltaFormer's
pseudo-value of ``f=c`` is its value minus ``beta`` times what ``f=c``'s key finds among the earlier
keys, which can be ``c=5``'s pseudo-value, and so on back along the chain; DeltaNet's update reads
its state at the new key before writing in the same way (Chapter 5), through a state of fixed size.
Whether training finds such a solution is what the experiment measures.

**How the setting was chosen.** The task and the models were fixed before any run, with the
question above; the sizes were set to fit the time budgets (the CPU setting trains the three models
in about half a minute on the book's 2-core machine; the GPU setting, several seeds, in a few
minutes on one H100/H200). Every model has the same width, heads, MLP, embedding, optimizer, data
stream and evaluation batches. Two things were changed after the first runs, both so that every
model learns the one-hop lookup, none for one model: the values were first drawn distinct within a
program, and then softmax attention and DeltaFormer failed to learn even the one-hop lookup in some
seeds within the CPU budget (with repeated values the most common value is a signal from the first
steps, which trains the path from values to the output); a learning rate of ``1e-2`` (MQAR's) did
the same. The number of steps was then set from the time budget.

Entry points: :func:`run_multihop` (one seed, every model), :func:`run_seeds`,
:func:`seed_summary`, :func:`load_stored` (the GPU runs in ``experiments/results/multihop.json``),
and ``python -m experiments.multihop`` (``--gpu`` for the larger setting, ``--write`` to store it
with the device, date and versions).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from .common import (TrainConfig, check_int, derived_seeds, fit, load_stored_runs, mlp_block, residual_stack,
                     run_each_seed, seeds_cli, summarize_seeds, torch_threads, train_each)

__all__ = ["MIXERS", "NAMES", "MultihopConfig", "cpu_config", "gpu_config", "vocab_size",
           "sequence_length", "make_variable_chains", "token_text", "link_matrices", "mode_baseline",
           "link_weight", "AttentionMixer",
           "StatementEmbedding", "MultihopModel", "train_model", "evaluate", "run_multihop",
           "run_seeds", "seed_summary", "plot_summary", "summary_sentences", "STORED",
           "load_stored", "main"]

STORED = "multihop"             # experiments/results/multihop.json: the GPU runs
MIXERS = ("softmax", "deltaformer", "deltanet")
NAMES = {"softmax": "softmax attention", "deltaformer": "DeltaFormer", "deltanet": "DeltaNet"}
IGNORE = -100                   # target at positions that are not scored
BOS = 0                         # the first token of every sequence
KINDS = ("bos", "value", "copy", "query")


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------
def vocab_size(n_vars: int, n_values: int) -> int:
    """``1 + n_vars · n_values + n_vars² + n_vars``: BOS, one token per ``x=value``, one per
    ``x=y`` (a variable copied into another; ``x = y`` never occurs but keeps the layout simple),
    one query ``x?`` per variable."""
    n_vars, n_values = check_int(n_vars, "n_vars", 2), check_int(n_values, "n_values", 2)
    return 1 + n_vars * n_values + n_vars * n_vars + n_vars


def _check_hops(hops) -> tuple:
    hops = tuple(hops) if isinstance(hops, (list, tuple)) else hops
    if not isinstance(hops, tuple) or not hops or any(
            isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in hops) \
            or len(set(hops)) != len(hops):
        raise ValueError(f"hops must be a non-empty sequence of distinct integers >= 1; got {hops!r}")
    return hops


def sequence_length(hops, chains_per_hop: int) -> int:
    """Tokens per sequence: BOS, one statement per link of every chain, one query per chain."""
    hops = _check_hops(hops)
    c = check_int(chains_per_hop, "chains_per_hop", 1)
    return 1 + c * sum(hops) + c * len(hops)


def make_variable_chains(n_vars: int, n_values: int, hops, chains_per_hop: int, batch: int,
                         seed: int, device=None):
    """A batch of variable-tracking programs: ``(inputs, targets, hop)``, each ``[batch, T]`` long
    with ``T = sequence_length(hops, chains_per_hop)``.

    Token ids: ``0`` is BOS (position 0); ``1 + x · n_values + v`` is ``x=v`` (variable ``x`` gets
    the value ``v``); ``1 + n_vars · n_values + x · n_vars + y`` is ``x=y`` (``x`` gets the value of
    ``y``); ``1 + n_vars · n_values + n_vars² + x`` is the query ``x?``. Each sequence has
    ``chains_per_hop`` chains of each length ``h`` in ``hops``: a chain of length ``h`` is
    ``x_1=v, x_2=x_1, ..., x_h=x_{h-1}`` over ``h`` distinct variables (all variables of a sequence
    are distinct, so ``n_vars`` must be at least the number of statements), with ``v`` uniform in
    ``0..n_values-1``. The statements of all chains are interleaved uniformly at random, each chain
    in its own order; then come the queries ``x_h?``, one per chain, in random order. ``targets``
    holds the chain's value at query positions and ``-100`` elsewhere; ``hop`` holds ``h`` at query
    positions and 0 elsewhere. The same ``seed`` gives the same batch (made on the CPU, then moved
    to ``device``).
    """
    n_vars, n_values = check_int(n_vars, "n_vars", 2), check_int(n_values, "n_values", 2)
    hops = _check_hops(hops)
    c = check_int(chains_per_hop, "chains_per_hop", 1)
    batch = check_int(batch, "batch", 1)
    lengths = torch.tensor([h for h in hops for _ in range(c)])          # one entry per chain
    n_chains, n_stmt = len(lengths), int(lengths.sum())
    if n_vars < n_stmt:
        raise ValueError(f"n_vars must be at least the number of statements per sequence, "
                         f"{n_stmt} for hops={hops} and chains_per_hop={c}; got {n_vars}")
    gen = torch.Generator().manual_seed(int(seed))
    offset = torch.cumsum(lengths, 0) - lengths                         # first statement of chain
    names = torch.argsort(torch.rand(batch, n_vars, generator=gen), dim=1)[:, :n_stmt]
    values = torch.randint(n_values, (batch, n_chains), generator=gen)
    # interleave: a random order of the chain labels (each label as often as its chain is long);
    # the k-th occurrence of a label is that chain's k-th statement
    labels = torch.repeat_interleave(torch.arange(n_chains), lengths)
    order = torch.argsort(torch.rand(batch, n_stmt, generator=gen), dim=1)
    chain = labels[order]                                              # [batch, n_stmt]
    step = (F.one_hot(chain, n_chains).cumsum(1).gather(2, chain[..., None])[..., 0] - 1)
    var = names.gather(1, offset[chain] + step)                        # the variable assigned
    prev = names.gather(1, offset[chain] + (step - 1).clamp(min=0))    # the variable copied
    base_copy = 1 + n_vars * n_values
    stmt = torch.where(step == 0, 1 + var * n_values + values.gather(1, chain),
                       base_copy + var * n_vars + prev)
    qorder = torch.argsort(torch.rand(batch, n_chains, generator=gen), dim=1)   # chain per query
    last = names.gather(1, offset[qorder] + lengths[qorder] - 1)
    queries = base_copy + n_vars * n_vars + last
    inputs = torch.cat([torch.full((batch, 1), BOS), stmt, queries], dim=1)
    ignore = torch.full((batch, 1 + n_stmt), IGNORE)
    targets = torch.cat([ignore, values.gather(1, qorder)], dim=1)
    hop = torch.cat([torch.zeros(batch, 1 + n_stmt, dtype=torch.long), lengths[qorder]], dim=1)
    if device is not None:
        inputs, targets, hop = inputs.to(device), targets.to(device), hop.to(device)
    return inputs, targets, hop


def _parts(n_vars: int, n_values: int) -> torch.Tensor:
    """``[vocab, 4]`` long: per token id its kind (index into :data:`KINDS`), the variable it
    names (assigned or queried; ``n_vars`` for none), the variable it reads (``n_vars`` for none)
    and the value it gives (``n_values`` for none)."""
    V = vocab_size(n_vars, n_values)
    parts = torch.empty(V, 4, dtype=torch.long)
    parts[0] = torch.tensor([0, n_vars, n_vars, n_values])
    ids = torch.arange(V)
    lit = (ids >= 1) & (ids < 1 + n_vars * n_values)
    cop = (ids >= 1 + n_vars * n_values) & (ids < 1 + n_vars * n_values + n_vars * n_vars)
    qry = ids >= 1 + n_vars * n_values + n_vars * n_vars
    r = ids[lit] - 1
    parts[lit] = torch.stack([torch.full_like(r, 1), r // n_values, torch.full_like(r, n_vars),
                              r % n_values], 1)
    r = ids[cop] - 1 - n_vars * n_values
    parts[cop] = torch.stack([torch.full_like(r, 2), r // n_vars, r % n_vars,
                              torch.full_like(r, n_values)], 1)
    r = ids[qry] - 1 - n_vars * n_values - n_vars * n_vars
    parts[qry] = torch.stack([torch.full_like(r, 3), r, torch.full_like(r, n_vars),
                              torch.full_like(r, n_values)], 1)
    return parts


def token_text(ids, n_vars: int, n_values: int) -> list[str]:
    """Readable tokens of one sequence: ``"BOS"``, ``"c=5"``, ``"f=c"``, ``"f?"`` (variables are
    letters, so ``n_vars <= 26``)."""
    n_vars, n_values = check_int(n_vars, "n_vars", 2), check_int(n_values, "n_values", 2)
    if n_vars > 26:
        raise ValueError(f"n_vars must be <= 26 to name variables by letters; got {n_vars}")
    parts = _parts(n_vars, n_values)
    out = []
    for tok in (int(t) for t in ids):
        if not 0 <= tok < len(parts):
            raise ValueError(f"ids must be tokens of vocab_size({n_vars}, {n_values}); got {tok}")
        kind, name, read, val = parts[tok].tolist()
        out.append({0: lambda: "BOS", 1: lambda: f"{chr(97 + name)}={val}",
                    2: lambda: f"{chr(97 + name)}={chr(97 + read)}",
                    3: lambda: f"{chr(97 + name)}?"}[kind]())
    return out


def link_matrices(ids, n_vars: int, n_values: int):
    """The matrices of a DeltaFormer that follows the links of one program exactly (NumPy, float64):
    ``A[i, j] = 1`` where token ``i`` queries the variable statement ``j`` assigns; ``B[t, j] = 1``
    where statement ``t`` copies the variable statement ``j`` assigns; ``V[j]`` the one-hot value
    (length ``n_values``) of an ``x=v`` statement, zero for every other token. These are the
    normalised matrices' limit when every softmax puts all its weight on the one matching token
    (and ``beta_t`` switches ``B``'s row off where nothing matches). ``ids``: one sequence, ``[T]``.
    Returns ``(A, B, V)``, ``(T, T)``, ``(T, T)``, ``(T, n_values)``."""
    import numpy as np
    ids = torch.as_tensor(ids)
    if ids.dim() != 1:
        raise ValueError(f"ids must be one sequence, [T]; got shape {tuple(ids.shape)}")
    p = _parts(n_vars, n_values)[ids].numpy()
    T = len(p)
    A, B, V = np.zeros((T, T)), np.zeros((T, T)), np.zeros((T, n_values))
    where = {}                                     # variable -> the statement that assigns it
    for t, (kind, name, read, val) in enumerate(p):
        if kind == 1:
            V[t, val] = 1.0
        if kind == 2:
            if read not in where:
                raise ValueError(f"ids: statement {t} copies a variable not assigned before it")
            B[t, where[read]] = 1.0
        if kind in (1, 2):
            where[name] = t
        if kind == 3 and name in where:
            A[t, where[name]] = 1.0
    return A, B, V


# ---------------------------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------------------------
class AttentionMixer(nn.Module):
    """Causal multi-head softmax attention or DeltaFormer, with the projections' names of
    :class:`experiments.mqar.TokenMixer` (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` and, for
    DeltaFormer, ``b_proj``: ``beta = sigmoid(b_proj(x))`` per token and head). The attention is
    the book's op, ``kernels.flash_attention`` or ``kernels.deltaformer_attn`` (scale
    ``head_dim^-1/2``): on a CPU their differentiable PyTorch implementations, on a GPU their
    Triton kernels; ``backend`` is passed to the op."""

    def __init__(self, mixer: str, d_model: int, n_heads: int, head_dim: int, backend=None):
        super().__init__()
        if mixer not in ("softmax", "deltaformer"):
            raise ValueError(f"mixer must be 'softmax' or 'deltaformer'; got {mixer!r}")
        self.mixer, self.H, self.D, self.backend = mixer, n_heads, head_dim, backend
        inner = n_heads * head_dim
        self.q_proj = nn.Linear(d_model, inner, bias=False)
        self.k_proj = nn.Linear(d_model, inner, bias=False)
        self.v_proj = nn.Linear(d_model, inner, bias=False)
        self.o_proj = nn.Linear(inner, d_model, bias=False)
        if mixer == "deltaformer":
            self.b_proj = nn.Linear(d_model, n_heads)

    def qkv(self, x):
        """``q, k, v`` as ``[B, T, H, D]`` (fla's layout, as the ops take them)."""
        Bsz, T, _ = x.shape
        return [p(x).reshape(Bsz, T, self.H, self.D) for p in (self.q_proj, self.k_proj, self.v_proj)]

    def beta(self, x):
        """DeltaFormer's ``beta``, ``[B, T, H]`` in (0, 1)."""
        return torch.sigmoid(self.b_proj(x))

    def forward(self, x):
        import kernels
        Bsz, T, _ = x.shape
        q, k, v = self.qkv(x)
        if self.mixer == "softmax":
            o = kernels.flash_attention(q, k, v, backend=self.backend)
        else:
            o = kernels.deltaformer_attn(q, k, v, self.beta(x), backend=self.backend)
        return self.o_proj(o.reshape(Bsz, T, -1))


class StatementEmbedding(nn.Module):
    """A statement's embedding: the sum of learned embeddings of its kind, the variable it names,
    the variable it reads and the value it gives (:func:`_parts`); no position embedding."""

    def __init__(self, n_vars: int, n_values: int, d_model: int):
        super().__init__()
        self.register_buffer("parts", _parts(n_vars, n_values), persistent=False)
        self.kind = nn.Embedding(len(KINDS), d_model)
        self.name = nn.Embedding(n_vars + 1, d_model)
        self.read = nn.Embedding(n_vars + 1, d_model)
        self.value = nn.Embedding(n_values + 1, d_model)

    def forward(self, ids):
        p = self.parts[ids]
        return (self.kind(p[..., 0]) + self.name(p[..., 1]) + self.read(p[..., 2])
                + self.value(p[..., 3]))


class MultihopModel(nn.Module):
    """Embedding → one pre-norm token mixer (residual) → MLP (residual) → norm → logits over the
    values. The three models differ only in the mixer; ``head_dim = d_model / n_heads``."""

    def __init__(self, mixer: str, n_vars: int, n_values: int, d_model: int = 64,
                 n_heads: int = 4, backend=None):
        super().__init__()
        if mixer not in MIXERS:
            raise ValueError(f"mixer must be one of {MIXERS}; got {mixer!r}")
        if d_model % n_heads:
            raise ValueError(f"d_model must be a multiple of n_heads; got {d_model} and {n_heads}")
        self.embed = StatementEmbedding(n_vars, n_values, d_model)
        self.norm = nn.LayerNorm(d_model)
        if mixer == "deltanet":
            from .mqar import TokenMixer
            self.mix = TokenMixer("deltanet", d_model, n_heads, d_model // n_heads, conv_width=1,
                                  backend=backend)
        else:
            self.mix = AttentionMixer(mixer, d_model, n_heads, d_model // n_heads, backend)
        self.mlp = mlp_block(d_model)
        self.norm_out = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_values)

    def forward(self, ids):
        x = residual_stack(self.embed(ids), [self.norm], [self.mix], [self.mlp])
        return self.head(self.norm_out(x))


# ---------------------------------------------------------------------------------------------
# training and evaluation
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MultihopConfig(TrainConfig):
    """Everything that defines one run. The defaults are the CPU setting (:func:`cpu_config`)."""

    mixers: tuple = MIXERS
    hops: tuple = (1, 2, 3, 4)
    chains_per_hop: int = 2
    n_vars: int = 26
    n_values: int = 8
    d_model: int = 64
    n_heads: int = 4
    batch: int = 64
    eval_batch: int = 512
    backend: str | None = None


def cpu_config(**changes) -> MultihopConfig:
    """The setting the chapter trains live on a CPU: chains of 1 to 4 hops, two of each length
    (20 statements, 8 queries, 29 tokens), 26 variables, 8 values."""
    return replace(MultihopConfig(), **changes)


def gpu_config(**changes) -> MultihopConfig:
    """The larger setting for one GPU: chains of 1 to 6 hops, four of each length (84 statements
    and 24 queries, 109 tokens), 128 variables, 16 values, a wider model (head size 32: DeltaNet's
    state per head holds fewer associations than a program has statements) trained five times
    longer at the CPU setting's learning rate. ``python -m experiments.multihop --gpu --write``
    runs it for seeds 0-2 on the GPU's Triton kernels."""
    base = MultihopConfig(hops=(1, 2, 3, 4, 5, 6), chains_per_hop=4, n_vars=128, n_values=16,
                          d_model=128, n_heads=4, steps=3000, batch=128, lr=3e-3, eval_batch=1024,
                          threads=None, device="cuda")
    return replace(base, **changes)


def _seeds(seed: int) -> tuple[int, int, int]:
    """(model init, training data, evaluation data) from one ``seed``; the same for every mixer,
    so the models start alike, see one training stream and are scored on one set."""
    return derived_seeds(seed, 900_001)


def evaluate(model: MultihopModel, inputs, targets, hop, hops) -> tuple[list, float]:
    """(accuracy per hop count of ``hops``, mean cross-entropy) over the scored (query) positions."""
    was = model.training
    model.eval()
    with torch.no_grad():
        logits = model(inputs)
    model.train(was)
    m = targets != IGNORE
    right = logits.argmax(-1) == targets
    acc = [float(right[hop == h].float().mean()) for h in hops]
    return acc, float(F.cross_entropy(logits[m].float(), targets[m]))


def mode_baseline(inputs, targets, hop, hops, n_vars: int, n_values: int) -> list[float]:
    """Per hop count of ``hops``, the expected accuracy of a guess that follows no link at all:
    a value that occurs most often among the program's ``x=v`` statements, one of the tied ones
    at random. A model that can look up one statement but not follow a link can reach this at
    every hop count beyond the first, since values repeat across chains."""
    parts = _parts(n_vars, n_values).to(inputs.device)[inputs]          # [B, T, 4]
    lit = (parts[..., 0] == 1).long()
    counts = (F.one_hot(parts[..., 3], n_values + 1)[..., :n_values] * lit[..., None]).sum(1)
    top = counts == counts.max(-1, keepdim=True).values                 # [B, n_values]
    credit = top.float() / top.sum(-1, keepdim=True)
    q = targets != IGNORE
    got = torch.zeros_like(targets, dtype=torch.float)
    got[q] = credit.gather(1, targets.clamp(min=0))[q]
    return [float(got[hop == h].mean()) for h in hops]


def link_weight(model: MultihopModel, ids, n_vars: int, n_values: int) -> tuple[float, float]:
    """How much of its pre-attention a trained DeltaFormer gives the link: for every copy
    statement ``x=y`` of the programs ``ids`` (``[batch, T]``), the weight its row of ``B`` puts on
    the statement that assigns ``y``, in the head that puts the most there. ``B`` is computed from
    the layer's keys by :func:`lattn_core.deltaformer_matrices` (normalised, the keys scaled by
    ``head_dim^-1/4`` so that their products carry the layer's scale). Returns the mean of that
    weight over the copy statements and, for comparison, the mean ``1 / t`` that a row spread
    evenly over its ``t`` earlier tokens would give."""
    import numpy as np

    from lattn_core import deltaformer_matrices
    if not isinstance(model.mix, AttentionMixer) or model.mix.mixer != "deltaformer":
        raise ValueError("model must be a 'deltaformer' MultihopModel")
    with torch.no_grad():
        k = model.mix.qkv(model.norm(model.embed(ids)))[1].double().cpu().numpy()
    k = k * model.mix.D ** -0.25
    got, even = [], []
    for b in range(ids.shape[0]):
        _, links, _ = link_matrices(ids[b].cpu(), n_vars, n_values)
        t, j = links.nonzero()
        B = np.max([deltaformer_matrices(k[b, :, h], k[b, :, h], normalize=True)[1]
                    for h in range(k.shape[2])], axis=0)               # the best head per entry
        got.append(B[t, j])
        even.append(1.0 / t)
    return float(np.concatenate(got).mean()), float(np.concatenate(even).mean())


def _check_config(cfg: MultihopConfig) -> None:
    for m in cfg.mixers:
        if m not in MIXERS:
            raise ValueError(f"mixers must be drawn from {MIXERS}; got {m!r}")
    sequence_length(cfg.hops, cfg.chains_per_hop)


def train_model(mixer: str, config: MultihopConfig | None = None, *, progress=None) -> dict:
    """Train one model and score it per hop count. Returns ``mixer``, ``hops``, ``accuracy`` (one
    per hop count), ``loss`` (the evaluation cross-entropy), ``baseline`` (:func:`mode_baseline`
    on the same evaluation batch), the training ``losses``, ``train_seconds`` and the ``model``
    itself. ``progress``: an optional tqdm bar to advance."""
    cfg = config or cpu_config()
    if mixer not in MIXERS:
        raise ValueError(f"mixer must be one of {MIXERS}; got {mixer!r}")
    _check_config(cfg)
    init_seed, data_seed, eval_seed = _seeds(cfg.seed)
    data = dict(n_vars=cfg.n_vars, n_values=cfg.n_values, hops=cfg.hops,
                chains_per_hop=cfg.chains_per_hop, device=cfg.device)
    with torch_threads(cfg.threads):
        torch.manual_seed(init_seed)
        model = MultihopModel(mixer, cfg.n_vars, cfg.n_values, cfg.d_model, cfg.n_heads,
                              cfg.backend).to(cfg.device)

        def batch_loss(step):
            x, y, _ = make_variable_chains(batch=cfg.batch, seed=data_seed + step, **data)
            m = y != IGNORE
            return F.cross_entropy(model(x)[m], y[m])
        losses, train_s = fit(model, cfg, batch_loss, progress=progress, label=dict(model=mixer))
        x, y, h = make_variable_chains(batch=cfg.eval_batch, seed=eval_seed, **data)
        acc, ce = evaluate(model, x, y, h, cfg.hops)
        base = mode_baseline(x, y, h, cfg.hops, cfg.n_vars, cfg.n_values)
    return {"mixer": mixer, "hops": list(cfg.hops), "accuracy": acc, "loss": ce,
            "baseline": base, "losses": losses, "train_seconds": train_s, "model": model}


def run_multihop(config: MultihopConfig | None = None, *, keep_models: bool = False,
                 loss_every: int = 10, progress: bool = False) -> dict:
    """Every mixer of ``config`` (default :func:`cpu_config`), one seed. Returns ``{"config",
    "records": [{mixer, seed, hops, accuracy, loss, baseline, train_seconds, final_loss, losses}],
    "accuracy": {mixer: [...]}, "seconds"}``; ``losses`` are window means of ``loss_every`` steps
    (the models too, under ``"models"``, with ``keep_models``). ``progress``: a tqdm bar."""
    cfg = config or cpu_config()
    _check_config(cfg)
    return train_each(cfg, cfg.mixers, "mixer", train_model, keep_models=keep_models, loss_every=loss_every,
                      progress=progress)


def run_seeds(config: MultihopConfig, seeds, *, progress: bool = False) -> dict:
    """:func:`run_multihop` once per seed. Returns ``{"config" (with "seeds"), "records" (one per
    mixer and seed), "seconds": {seed: wall seconds}}``."""
    return run_each_seed(config, seeds, lambda c: run_multihop(c, progress=progress))


def seed_summary(records: list[dict]) -> dict:
    """Per mixer, over the seeds of ``records``: the mean, smallest and largest accuracy at each
    hop count, and per hop count the number of seeds each mixer was best in (ties count for all);
    with ``baseline``, the mean over the seeds of :func:`mode_baseline`. Returns ``{"hops",
    "seeds", "mean", "min", "max", "first", "baseline"}``."""
    out = summarize_seeds(records, "mixer", "hops")
    by_seed = {r.get("seed", 0): r["baseline"] for r in records}
    out["baseline"] = [sum(c) / len(c) for c in zip(*by_seed.values())]
    return out


def plot_summary(summary: dict, ax, title: str):
    """Mean accuracy against the number of hops per mixer, the band from the worst to the best
    seed, and the no-link guess (:func:`mode_baseline`) dotted, on the matplotlib axes ``ax``."""
    for m in summary["mean"]:
        line, = ax.plot(summary["hops"], summary["mean"][m], "o-", label=NAMES[m])
        ax.fill_between(summary["hops"], summary["min"][m], summary["max"][m],
                        color=line.get_color(), alpha=0.2)
    ax.plot(summary["hops"], summary["baseline"], ":", color="gray",
            label="most common value")
    ax.set_xticks(summary["hops"])
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("hops from the query to the value")
    ax.set_ylabel("accuracy at the queries")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)


def summary_sentences(summary: dict) -> list[str]:
    """The result in words, from a :func:`seed_summary`: one line per hop count with every mixer's
    mean accuracy (best first), in how many seeds the best one came first (with more than one
    seed), and the no-link guess (:func:`mode_baseline`)."""
    mean, seeds = summary["mean"], len(summary["seeds"])
    out = []
    for i, h in enumerate(summary["hops"]):
        order = sorted(mean, key=lambda m: -mean[m][i])
        first = (f" ({NAMES[order[0]]} first in {summary['first'][order[0]][i]} of {seeds} seeds)"
                 if seeds > 1 else "")
        out.append(f"{h} hop{'s' if h > 1 else ''}: "
                   + ", ".join(f"{NAMES[m]} {mean[m][i]:.3f}" for m in order)
                   + f"{first}; most common value {summary['baseline'][i]:.3f}")
    return out


def load_stored() -> dict:
    """The stored GPU runs (``experiments/results/multihop.json``: ``env``, ``config`` with its
    ``seeds``, ``records``), with ``same_as_gpu_config``: whether they were run with the settings
    :func:`gpu_config` has now. Raises ``FileNotFoundError`` when this copy of the book has none."""
    return load_stored_runs(STORED, gpu_config, "python -m experiments.multihop --gpu --write")


def main(argv=None) -> int:
    """``python -m experiments.multihop [--gpu] [--seeds ...] [--device D] [--steps N] [--write]``
    (:func:`experiments.common.seeds_cli`)."""
    return seeds_cli(argv, description="Chapter 7: multi-hop retrieval with one layer (softmax attention, "
                                       "DeltaFormer, DeltaNet)",
                     stored=STORED, cpu_config=cpu_config, gpu_config=gpu_config, run_seeds=run_seeds,
                     gpu_seeds=[0, 1, 2],
                     describe=lambda r: f"seed {r['seed']} {r['mixer']:>11}: " + "  ".join(
                         f"h={h}: {a:.3f}" for h, a in zip(r["hops"], r["accuracy"])))


if __name__ == "__main__":
    raise SystemExit(main())
