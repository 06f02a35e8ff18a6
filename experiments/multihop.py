"""Following a chain of links: multi-hop retrieval (the DeltaFormer experiment).

The article says of DeltaFormer that its pseudo-values, attention run again and again over the keys
before the queries read them, make it remarkably good at multi-hop tasks, "for example code". This
experiment asks that of one layer, at a small scale, with a positive control that is known to be
able to answer two hops and a hand-set DeltaFormer as the ceiling:

====================  ============================================================================
``softmax``           one layer of causal softmax attention, ``softmax(scale · Q K^T) V``
                      (``kernels.flash_attention``): one look, so one hop; the negative control
``softmax2``          two layers of it: the positive control. The first layer can copy into every
                      copy statement ``f=c`` what the statement assigning ``c`` holds, the second
                      read it from the query: two hops by composing two lookups, as induction heads
                      compose (Olsson et al., 2022)
``deltaformer``       one layer of DeltaFormer, ``softmax(scale · Q K^T) (I + Diag(beta) B)^{-1} V``
                      with ``B`` the strictly causal row softmax of ``scale · K K^T`` and
                      ``beta_t = sigmoid(w_h · x_t + b_h)`` in (0, 1), per token and head
                      (``kernels.deltaformer_attn``)
``deltaformer_free``  the same with ``beta_t = w_h · x_t + b_h`` unconstrained, as
                      flash-linear-attention's ``DeltaFormerAttention`` layer passes it: with
                      ``beta = -1`` a chain's pseudo-values all carry its value with the sign ``+``
``deltanet``          DeltaNet (Chapter 5), the token mixer of :mod:`experiments.mqar` without its
                      short convolution (not in the default settings; kept for comparison)
====================  ============================================================================

Every mixer is one of the book's ops: on a CPU their differentiable PyTorch implementations
(:mod:`kernels.reference`), on a GPU their Triton kernels.

**The task** (:func:`make_variable_chains`), made in code, nothing downloaded, is *variable
tracking*: a short program of one-line statements. A statement either gives a variable a value
(``c=5``) or copies into a new variable one defined *earlier* (``f=c``); every variable is assigned
once. The statements form chains ``c=5, f=c, a=f, ...`` whose statements are interleaved at random
(each chain keeps its order). After the program come queries, one per chain, naming the chain's last
variable (``a?``); the answer is the value at the chain's root, ``h`` hops away for a chain of ``h``
statements. Every chain length of ``hops`` appears ``chains_per_hop`` times in each evaluation
program, so accuracy is measured per hop count on equally many queries; only the queries are scored.
Values are drawn independently per chain, so they repeat within a program: a model that follows no
link can still guess the program's most common value, and :func:`mode_baseline` computes how often
that guess is right on the evaluation batch, the floor to read the multi-hop accuracies against.

**Why this shape.** A statement is one token whose embedding is the sum of its parts
(:class:`StatementEmbedding`): its kind, its value, and the variables it names and reads, both
looked up in **one** table of variables and then passed through a learned map per role (``as_name``,
``as_read``). A link ``f=c -> c=5`` is then the same relation for every variable (the read role of
``c`` against its name role), which a key projection can learn once for all variables; with a
table per role (the first version of this experiment) every link had to be learned variable by
variable. Training follows a curriculum over the hop counts (:func:`curriculum_stage`): during the
first ``curriculum`` share of the steps, the programs hold chains of at most 1, then 2, ... hops, as
many chains as the full programs, and the full mix after that. The evaluation programs always hold
every hop count.

**The ceiling.** :func:`handset_accuracy` runs the same op, ``kernels.deltaformer_attn``, with
weights set by hand on the evaluation programs: queries and keys one-hot in the variables (a
statement's key holds the variable it names and the one it reads, a query's the one it asks for),
values one-hot in the values at ``x=v`` statements and zero elsewhere, the logits scaled by
:data:`HANDSET_SCALE`, and ``beta = -1`` at copy statements and 0 elsewhere (unconstrained, read
by the largest output) or ``beta`` just inside (0, 1) (read by the largest magnitude, since the
sign then flips with every hop). It is the normalised layer's finite-temperature version of
:func:`link_matrices`: one layer *can* answer every hop count of these programs.

**How the setting was chosen and what is claimed.** The task, the models and the claims of
:func:`claims` were fixed before the stored runs; the sizes were set for the time budgets (the
CPU cell in well under a minute on the book's 2-core machine; the GPU setting, the whole grid and
three seeds, in a few minutes on one H200). Every model has the same width, heads, MLP, embedding,
optimizer, data stream and evaluation batches; each gets its own learning rate, chosen from
``lr_grid`` by its mean accuracy over the hop counts on the evaluation programs of ``grid_seed``,
a seed no reported run uses (:func:`experiments.common.tune_and_run`). The margins of
:func:`claims` were set from pilot runs on other seeds, before the stored seeds were run.

Entry points: :func:`run_multihop` (one seed, every model at ``config.lr``), :func:`run_seeds` (the
grid, then the seeds), :func:`claims`, :func:`seed_summary`, :func:`load_stored` (the GPU runs in
``experiments/results/multihop.json``), and ``python -m experiments.multihop`` (``--gpu`` for the
larger setting, ``--jobs N`` processes, ``--write`` to store it with the device, date and versions).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from .common import (TunedConfig, check_int, derived_seeds, fit, load_run, claim, mlp_block, residual_stack,
                     seeds_cli, summarize_seeds, torch_threads, train_each, tune_and_run)

__all__ = ["MIXERS", "NAMES", "LAYERS", "HANDSET_SCALE", "MultihopConfig", "cpu_config", "gpu_config",
           "vocab_size", "sequence_length", "make_variable_chains", "token_text", "link_matrices",
           "mode_baseline", "curriculum_stage", "handset_accuracy", "link_weight", "beta_by_kind",
           "AttentionMixer",
           "StatementEmbedding", "MultihopModel", "train_model", "evaluate", "run_multihop",
           "run_seeds", "claims", "seed_summary", "plot_summary", "summary_sentences", "STORED",
           "COMMAND", "load_stored", "main"]

STORED = "multihop"             # experiments/results/multihop.json: the GPU runs
COMMAND = "python -m experiments.multihop --gpu --jobs 8 --write"
MIXERS = ("softmax", "softmax2", "deltaformer", "deltaformer_free", "deltanet")
NAMES = {"softmax": "softmax, 1 layer", "softmax2": "softmax, 2 layers (control)",
         "deltaformer": "DeltaFormer, β in (0, 1)", "deltaformer_free": "DeltaFormer, β free",
         "deltanet": "DeltaNet"}
LAYERS = {"softmax2": 2}        # every other model has one layer
HANDSET_SCALE = 12.0            # the hand-set layer's logit for a match (0 for a mismatch)
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


def curriculum_stage(step: int, steps: int, hops, chains_per_hop: int, curriculum: float):
    """The training programs of step ``step`` of ``steps``: ``(hops, chains_per_hop)``. During the
    first ``curriculum`` share of the steps the hop counts come in ``len(hops)`` equal stages:
    stage ``k`` uses the ``k`` smallest hop counts, with ``chains_per_hop · len(hops) // k`` chains
    of each (about as many chains as a full program, never more statements); after that, every hop
    count with ``chains_per_hop`` chains each. ``curriculum = 0``: the full programs throughout."""
    hops = tuple(sorted(_check_hops(hops)))
    c = check_int(chains_per_hop, "chains_per_hop", 1)
    if not (isinstance(curriculum, (int, float)) and not isinstance(curriculum, bool)
            and 0 <= curriculum <= 1):
        raise ValueError(f"curriculum must lie in [0, 1]; got {curriculum!r}")
    ramp = curriculum * steps
    if step >= ramp:
        return hops, c
    k = min(len(hops), 1 + int(step * len(hops) // ramp))
    return hops[:k], c * len(hops) // k


def handset_accuracy(inputs, targets, hop, hops, n_vars: int, n_values: int, *, free: bool = True,
                     scale: float = HANDSET_SCALE) -> list[float]:
    """Per hop count of ``hops``, the accuracy of a DeltaFormer layer with weights set by hand on
    the programs ``inputs`` (see the module's docstring): ``kernels.deltaformer_attn`` on one-hot
    queries and keys (the logits ``scale`` for a match), one-hot values, and ``beta = -1`` at copy
    statements, 0 elsewhere, read by the largest output (``free``), or ``beta = 0.999`` and
    ``0.001``, read by the largest magnitude (``free=False``, beta in (0, 1))."""
    import kernels
    parts = _parts(n_vars, n_values).to(inputs.device)[inputs]            # [B, T, 4]
    kind, name, read, val = parts.unbind(-1)
    one = lambda i, n: F.one_hot(i, n + 1)[..., :n].float()              # index n: none
    stmt = ((kind == 1) | (kind == 2))[..., None].float()
    k = (one(name, n_vars) + one(read, n_vars)) * stmt
    q = one(name, n_vars) * (kind == 3)[..., None].float()
    v = one(val, n_values)
    copy = (kind == 2).float()
    beta = -copy if free else 0.001 + 0.998 * copy
    o = kernels.deltaformer_attn(q[:, :, None], k[:, :, None], v[:, :, None], beta[:, :, None].contiguous(),
                                 scale=scale)[:, :, 0].float()
    pred = (o if free else o.abs()).argmax(-1)
    right = pred == targets
    return [float(right[hop == h].float().mean()) for h in hops]


# ---------------------------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------------------------
class AttentionMixer(nn.Module):
    """Causal multi-head softmax attention or DeltaFormer, with the projections' names of
    :class:`experiments.mqar.TokenMixer` (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` and, for
    DeltaFormer, ``b_proj``). The attention is the book's op, ``kernels.flash_attention`` or
    ``kernels.deltaformer_attn`` (scale ``head_dim^-1/2``): on a CPU their differentiable PyTorch
    implementations, on a GPU their Triton kernels; ``backend`` is passed to the op. DeltaFormer's
    ``beta`` is ``sigmoid(b_proj(x))`` per token and head, in (0, 1), or with ``free_beta`` the
    projection itself, unconstrained, as flash-linear-attention's layer passes it."""

    def __init__(self, mixer: str, d_model: int, n_heads: int, head_dim: int, backend=None,
                 free_beta: bool = False):
        super().__init__()
        if mixer not in ("softmax", "deltaformer"):
            raise ValueError(f"mixer must be 'softmax' or 'deltaformer'; got {mixer!r}")
        self.mixer, self.H, self.D, self.backend, self.free_beta = mixer, n_heads, head_dim, backend, free_beta
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
        """DeltaFormer's ``beta``, ``[B, T, H]``: in (0, 1), or unconstrained with ``free_beta``."""
        b = self.b_proj(x)
        return b if self.free_beta else torch.sigmoid(b)

    def forward(self, x):
        import kernels
        Bsz, T, _ = x.shape
        q, k, v = self.qkv(x)
        if self.mixer == "softmax":
            o = kernels.flash_attention(q, k, v, backend=self.backend)
        else:
            o = kernels.deltaformer_attn(q, k, v, self.beta(x).contiguous(), backend=self.backend)
        return self.o_proj(o.reshape(Bsz, T, -1))


class StatementEmbedding(nn.Module):
    """A statement's embedding: the sum of learned embeddings of its kind and its value, and of the
    variable it names and the variable it reads, both from **one** table of variables, each through
    a learned linear map of its role (``as_name``, ``as_read``): the relation between a name and a
    read is then one map for every variable. No position embedding."""

    def __init__(self, n_vars: int, n_values: int, d_model: int):
        super().__init__()
        self.register_buffer("parts", _parts(n_vars, n_values), persistent=False)
        self.kind = nn.Embedding(len(KINDS), d_model)
        self.var = nn.Embedding(n_vars + 1, d_model)           # index n_vars: none
        self.as_name = nn.Linear(d_model, d_model, bias=False)
        self.as_read = nn.Linear(d_model, d_model, bias=False)
        self.value = nn.Embedding(n_values + 1, d_model)

    def forward(self, ids):
        p = self.parts[ids]
        return (self.kind(p[..., 0]) + self.as_name(self.var(p[..., 1])) + self.as_read(self.var(p[..., 2]))
                + self.value(p[..., 3]))


class MultihopModel(nn.Module):
    """Embedding → ``LAYERS.get(mixer, 1)`` pre-norm blocks (token mixer, MLP; residual) → norm →
    logits over the values. The models differ only in the mixer (and the control in having two
    blocks); ``head_dim = d_model / n_heads``."""

    def __init__(self, mixer: str, n_vars: int, n_values: int, d_model: int = 64,
                 n_heads: int = 4, backend=None):
        super().__init__()
        if mixer not in MIXERS:
            raise ValueError(f"mixer must be one of {MIXERS}; got {mixer!r}")
        if d_model % n_heads:
            raise ValueError(f"d_model must be a multiple of n_heads; got {d_model} and {n_heads}")
        n_layers = LAYERS.get(mixer, 1)
        self.embed = StatementEmbedding(n_vars, n_values, d_model)
        self.norms = nn.ModuleList([nn.LayerNorm(d_model) for _ in range(n_layers)])
        if mixer == "deltanet":
            from .mqar import TokenMixer
            make = lambda: TokenMixer("deltanet", d_model, n_heads, d_model // n_heads, conv_width=1,
                                      backend=backend)
        else:
            kind = "softmax" if mixer.startswith("softmax") else "deltaformer"
            make = lambda: AttentionMixer(kind, d_model, n_heads, d_model // n_heads, backend,
                                          free_beta=mixer == "deltaformer_free")
        self.mixers = nn.ModuleList([make() for _ in range(n_layers)])
        self.mlps = nn.ModuleList([mlp_block(d_model) for _ in range(n_layers)])
        self.norm_out = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_values)

    def forward(self, ids):
        x = residual_stack(self.embed(ids), self.norms, self.mixers, self.mlps)
        return self.head(self.norm_out(x))


# ---------------------------------------------------------------------------------------------
# training and evaluation
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MultihopConfig(TunedConfig):
    """Everything that defines one run. The defaults are the CPU setting (:func:`cpu_config`)."""

    mixers: tuple = ("softmax2", "deltaformer_free")
    hops: tuple = (1, 2, 3)
    chains_per_hop: int = 2
    n_vars: int = 26
    n_values: int = 8
    d_model: int = 64
    n_heads: int = 4
    curriculum: float = 0.5
    steps: int = 400
    batch: int = 64
    lr: float = 3e-3
    lr_grid: tuple = ()
    grid_seed: int = 100
    eval_batch: int = 512
    backend: str | None = None


def cpu_config(**changes) -> MultihopConfig:
    """The setting the chapter trains live on a CPU: the positive control and DeltaFormer with fla's
    free beta, one seed at one learning rate (the GPU setting's grid carries the comparison);
    chains of 1 to 3 hops, two of each length (12 statements, 6 queries, 19 tokens), 26
    variables, 8 values."""
    return replace(MultihopConfig(), **changes)


def gpu_config(**changes) -> MultihopConfig:
    """The setting of the stored runs, for one GPU: every model but DeltaNet, chains of 1 to 4 hops,
    two of each length (20 statements and 8 queries, 29 tokens), 32 variables, 8 values, five
    times the CPU setting's steps of twice its batch, a learning-rate grid of three rates per model
    on ``grid_seed`` and then the seeds. ``python -m experiments.multihop --gpu --jobs 8 --write``
    runs it for seeds 0-2 on the GPU's Triton kernels."""
    base = MultihopConfig(mixers=("softmax", "softmax2", "deltaformer", "deltaformer_free"),
                          hops=(1, 2, 3, 4), chains_per_hop=2, n_vars=32, n_values=8, steps=2000,
                          batch=128, lr_grid=(1e-3, 3e-3, 1e-2), eval_batch=1024, threads=2,
                          device="cuda")          # 2 CPU threads a process: 8 share 16 cores
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
    mix = model.mixers[0]
    if len(model.mixers) != 1 or not isinstance(mix, AttentionMixer) or mix.mixer != "deltaformer":
        raise ValueError("model must be a one-layer DeltaFormer MultihopModel")
    with torch.no_grad():
        k = mix.qkv(model.norms[0](model.embed(ids)))[1].double().cpu().numpy()
    k = k * mix.D ** -0.25
    got, even = [], []
    for b in range(ids.shape[0]):
        _, links, _ = link_matrices(ids[b].cpu(), n_vars, n_values)
        t, j = links.nonzero()
        B = np.max([deltaformer_matrices(k[b, :, h], k[b, :, h], normalize=True)[1]
                    for h in range(k.shape[2])], axis=0)               # the best head per entry
        got.append(B[t, j])
        even.append(1.0 / t)
    return float(np.concatenate(got).mean()), float(np.concatenate(even).mean())


def beta_by_kind(model: MultihopModel, ids, n_vars: int, n_values: int) -> dict:
    """What a trained one-layer DeltaFormer's ``beta`` does on the programs ``ids``: per head, its
    mean at copy statements (``"copy"``) and at ``x=v`` statements (``"value"``). The hand-set
    layer has ``-1`` and ``0`` (beta free), or nearly ``1`` and ``0`` (beta in (0, 1)).
    ``ValueError`` for a model that is not a one-layer DeltaFormer."""
    mix = model.mixers[0]
    if len(model.mixers) != 1 or not isinstance(mix, AttentionMixer) or mix.mixer != "deltaformer":
        raise ValueError("model must be a one-layer DeltaFormer MultihopModel")
    kind = _parts(n_vars, n_values).to(ids.device)[ids][..., 0]
    with torch.no_grad():
        beta = mix.beta(model.norms[0](model.embed(ids)))                 # [B, T, H]
    return {name: [float(v) for v in beta[kind == k].mean(0)] for name, k in (("copy", 2), ("value", 1))}


def _check_config(cfg: MultihopConfig) -> None:
    for m in cfg.mixers:
        if m not in MIXERS:
            raise ValueError(f"mixers must be drawn from {MIXERS}; got {m!r}")
    sequence_length(cfg.hops, cfg.chains_per_hop)
    curriculum_stage(0, cfg.steps, cfg.hops, cfg.chains_per_hop, cfg.curriculum)


def train_model(mixer: str, config: MultihopConfig | None = None, *, progress=None) -> dict:
    """Train one model (the curriculum of :func:`curriculum_stage`) and score it per hop count.
    Returns ``mixer``, ``hops``, ``accuracy`` (one per hop count), ``loss`` (the evaluation
    cross-entropy), ``baseline`` (:func:`mode_baseline`) and ``ceiling``, ``ceiling_sigmoid``
    (:func:`handset_accuracy` with beta free and in (0, 1)) on the same evaluation batch, ``beta``
    (:func:`beta_by_kind`, DeltaFormer only, else ``None``), the training ``losses``,
    ``train_seconds`` and the ``model`` itself. ``progress``: an optional tqdm
    bar to advance."""
    cfg = config or cpu_config()
    if mixer not in MIXERS:
        raise ValueError(f"mixer must be one of {MIXERS}; got {mixer!r}")
    _check_config(cfg)
    init_seed, data_seed, eval_seed = _seeds(cfg.seed)
    data = dict(n_vars=cfg.n_vars, n_values=cfg.n_values, device=cfg.device)
    with torch_threads(cfg.threads):
        torch.manual_seed(init_seed)
        model = MultihopModel(mixer, cfg.n_vars, cfg.n_values, cfg.d_model, cfg.n_heads,
                              cfg.backend).to(cfg.device)

        def batch_loss(step):
            hops, c = curriculum_stage(step, cfg.steps, cfg.hops, cfg.chains_per_hop, cfg.curriculum)
            x, y, _ = make_variable_chains(hops=hops, chains_per_hop=c, batch=cfg.batch,
                                           seed=data_seed + step, **data)
            m = y != IGNORE
            return F.cross_entropy(model(x)[m], y[m])
        losses, train_s = fit(model, cfg, batch_loss, progress=progress, label=dict(model=mixer))
        x, y, h = make_variable_chains(hops=cfg.hops, chains_per_hop=cfg.chains_per_hop,
                                       batch=cfg.eval_batch, seed=eval_seed, **data)
        acc, ce = evaluate(model, x, y, h, cfg.hops)
        base = mode_baseline(x, y, h, cfg.hops, cfg.n_vars, cfg.n_values)
        ceil = {free: handset_accuracy(x, y, h, cfg.hops, cfg.n_vars, cfg.n_values, free=free)
                for free in (True, False)}
        beta = beta_by_kind(model, x, cfg.n_vars, cfg.n_values) if mixer.startswith("deltaformer") else None
    return {"mixer": mixer, "hops": list(cfg.hops), "accuracy": acc, "loss": ce,
            "baseline": base, "ceiling": ceil[True], "ceiling_sigmoid": ceil[False], "beta": beta,
            "losses": losses, "train_seconds": train_s, "model": model}


def run_multihop(config: MultihopConfig | None = None, *, keep_models: bool = False,
                 loss_every: int = 10, progress: bool = False) -> dict:
    """Every mixer of ``config`` (default :func:`cpu_config`), one seed, at ``config.lr``. Returns
    ``{"config", "records": [{mixer, seed, hops, accuracy, loss, baseline, ceiling,
    ceiling_sigmoid, train_seconds, final_loss, losses}], "accuracy": {mixer: [...]}, "seconds"}``;
    ``losses`` are window means of ``loss_every`` steps (the models too, under ``"models"``, with
    ``keep_models``). ``progress``: a tqdm bar."""
    cfg = config or cpu_config()
    _check_config(cfg)
    return train_each(cfg, cfg.mixers, "mixer", train_model, keep_models=keep_models, loss_every=loss_every,
                      progress=progress)


def _grid_score(record: dict) -> float:
    """What a learning rate is chosen by: the mean accuracy over the hop counts (held out)."""
    return sum(record["accuracy"]) / len(record["accuracy"])


def run_seeds(config: MultihopConfig, seeds, *, jobs: int = 1, pieces=None) -> dict:
    """The learning-rate grid ``config.lr_grid`` for every mixer on ``config.grid_seed`` (chosen by
    the mean accuracy over the hop counts), then every seed at each mixer's chosen rate
    (:func:`experiments.common.tune_and_run`; with an empty grid, every mixer at ``config.lr``);
    ``jobs`` pieces (one mixer, one seed or rate) at a time in their own processes. Returns
    ``{"config" (with "seeds" and "lr_choice"), "grid" (the grid's records, each with its "score"),
    "records" (one per mixer and seed), "seconds": {seed: seconds}}``."""
    _check_config(config)
    return tune_and_run(config, seeds, run_multihop, split=("mixers",), score=_grid_score, jobs=jobs, pieces=pieces)


def _per_seed(records: list[dict], mixer: str, field: str = "accuracy") -> list[list[float]]:
    return [r[field] for r in sorted(records, key=lambda r: r.get("seed", 0)) if r["mixer"] == mixer]


def claims(run: dict) -> list[dict]:
    """What the chapter says of a run (:func:`run_seeds`' result or the stored runs), each claim
    with whether it holds and what was measured (:func:`experiments.common.claim`). The
    criteria were fixed before the stored runs, the margins from pilot runs on seeds 10-13 (see the
    module's docstring). A claim about a model the run does not hold is left out; "every seed"
    means every seed of the run, "the guess" :func:`mode_baseline` on the same programs.

    1. Every model learns the one-hop lookup: at least 0.9 at one hop in every seed.
    2. The positive control, two layers of softmax attention, follows two hops: at least 0.3 above
       the guess at two hops in every seed.
    3. One layer of softmax attention does not follow links: at least 0.3 below the positive
       control at two hops in every seed (when the run holds both), and within 0.05 of the guess
       at every hop count from three on, in the mean over the seeds.
    4. The hand-set DeltaFormer layer answers at least 0.99 of the queries at every hop count,
       with beta free and with beta in (0, 1), on every seed's evaluation programs.
    5. One layer of DeltaFormer with beta free, as fla's layer passes it, follows the links: at
       least 0.2 above the guess at every hop count beyond one, in every seed.
    6. It does so with a negative beta at the copy statements: in every seed some head's mean beta
       there is below -0.5.
    7. One layer of DeltaFormer with beta in (0, 1) does not: at least 0.3 below the one with beta
       free at two hops in every seed (when the run holds both), and within 0.05 of the guess at
       every hop count from three on, in the mean over the seeds.
    """
    recs = run["records"]
    hops = list(run["config"]["hops"])
    present = list(dict.fromkeys(r["mixer"] for r in recs))
    n = len({r.get("seed", 0) for r in recs})
    every = "in every seed" if n > 1 else "in the one seed"
    fmt = lambda xs: ", ".join(f"{x:.3f}" for x in xs)
    base = _per_seed(recs, present[0], "baseline")
    acc = {m: _per_seed(recs, m) for m in present}
    at = lambda m, h: [a[hops.index(h)] for a in acc[m]]                 # per seed, at h hops
    over = lambda m, h: [a - b[hops.index(h)] for a, b in zip(at(m, h), base)]
    far = [h for h in hops if h >= 3]
    mean_gap = lambda m: max((abs(sum(over(m, h)) / n) for h in far), default=0.0)
    out = []
    one = {m: at(m, 1) for m in present} if 1 in hops else {}
    if one:
        out.append(claim(f"Every model learns the one-hop lookup (at least 0.9 at one hop {every}).",
                              min(min(v) for v in one.values()) >= 0.9,
                              "; ".join(f"{NAMES[m]} {fmt(v)}" for m, v in one.items())))
    if 2 in hops and "softmax2" in present:
        out.append(claim(
            "Two layers of softmax attention, the positive control, follow two hops (at least 0.3 above the "
            f"most-common-value guess at two hops {every}).",
            min(over("softmax2", 2)) >= 0.3, f"above the guess by {fmt(over('softmax2', 2))}"))

    def no_links(m, ref, text):
        parts, measured, ok = [], [], True
        if 2 in hops and ref in present:
            below = [a - b for a, b in zip(at(ref, 2), at(m, 2))]
            parts.append(f"at least 0.3 below {NAMES[ref]} at two hops {every}")
            measured.append(f"below it by {fmt(below)}")
            ok &= min(below) >= 0.3
        if far:
            parts.append("within 0.05 of the guess at every hop count from three on, in the mean")
            measured.append(f"largest |mean - guess| there {mean_gap(m):.3f}")
            ok &= mean_gap(m) <= 0.05
        if parts:
            out.append(claim(f"{text} ({'; '.join(parts)}).", ok, "; ".join(measured)))
    if "softmax" in present:
        no_links("softmax", "softmax2", "One layer of softmax attention does not follow links")
    ceil = [min(r["ceiling"] + r["ceiling_sigmoid"]) for r in recs if r["mixer"] == present[0]]
    out.append(claim(
        "A DeltaFormer layer with weights set by hand answers at least 0.99 of the queries at every hop "
        "count, with β free and with β in (0, 1): one layer can hold the solution.",
        min(ceil) >= 0.99, f"lowest accuracy {min(ceil):.3f}"))
    if "deltaformer_free" in present:
        gaps = [min(a - b for a, b, h in zip(acc_s, b_s, hops) if h > 1)
                for acc_s, b_s in zip(acc["deltaformer_free"], base)]
        out.append(claim(
            "One layer of DeltaFormer with β free, as flash-linear-attention's layer passes it, follows the "
            f"links (at least 0.2 above the guess at every hop count beyond one {every}).",
            min(gaps) >= 0.2, f"smallest margin per seed {fmt(gaps)}"))
        neg = [min(r["beta"]["copy"]) for r in recs if r["mixer"] == "deltaformer_free"]
        out.append(claim(
            f"It learns a negative β at the copy statements ({every} some head's mean β there is "
            "below -0.5).",
            max(neg) < -0.5, f"lowest head mean per seed {fmt(neg)}"))
    if "deltaformer" in present:
        no_links("deltaformer", "deltaformer_free", "One layer of DeltaFormer with β in (0, 1) does not")
    return out


def seed_summary(records: list[dict]) -> dict:
    """Per mixer, over the seeds of ``records``: the mean, smallest and largest accuracy at each
    hop count, and per hop count the number of seeds each mixer was best in (ties count for all);
    with ``baseline`` and ``ceiling``, the means over the seeds of :func:`mode_baseline` and of the
    hand-set layer's accuracy (beta free). Returns ``{"hops", "seeds", "mean", "min", "max",
    "first", "baseline", "ceiling"}``."""
    out = summarize_seeds(records, "mixer", "hops")
    for field in ("baseline", "ceiling"):
        by_seed = {r.get("seed", 0): r[field] for r in records if field in r}
        out[field] = [sum(c) / len(c) for c in zip(*by_seed.values())] if by_seed else None
    return out


from lattn_core.palette import color_of  # noqa: E402  (the book's one colour per model)
COLORS = {m: color_of(m) for m in NAMES}   # one colour per model in every figure of the experiment


def plot_summary(summary: dict, ax, title: str):
    """Mean accuracy against the number of hops per mixer, the band from the worst to the best
    seed, the no-link guess (:func:`mode_baseline`) dotted and the hand-set layer dashed, on the
    matplotlib axes ``ax``."""
    for m in summary["mean"]:
        ax.plot(summary["hops"], summary["mean"][m], "o-", color=COLORS[m], label=NAMES[m])
        ax.fill_between(summary["hops"], summary["min"][m], summary["max"][m], color=COLORS[m], alpha=0.2)
    ax.plot(summary["hops"], summary["baseline"], ":", color="gray", label="most common value")
    if summary.get("ceiling"):
        ax.plot(summary["hops"], summary["ceiling"], "--", color="k", lw=1, label="DeltaFormer set by hand")
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
    ``seeds`` and the chosen rates, ``lr_choice``, the ``grid``, ``records``), with
    ``same_as_gpu_config``: whether they were run with the settings :func:`gpu_config` has now
    (:func:`experiments.common.load_run`). Raises ``FileNotFoundError`` when this copy of the book
    has none."""
    return load_run(STORED, gpu_config, COMMAND, only="mixers")


def main(argv=None) -> int:
    """``python -m experiments.multihop [--gpu] [--seeds ...] [--jobs N] [--only M ...] [--device D]
    [--steps N] [--write]`` (:func:`experiments.common.seeds_cli`): the learning-rate grid, then the
    seeds."""
    return seeds_cli(argv, description="multi-hop retrieval: softmax attention with one and two layers, "
                                       "DeltaFormer with beta in (0, 1) and free",
                     stored=STORED, cpu_config=cpu_config, gpu_config=gpu_config, run_seeds=run_seeds,
                     only="mixers",
                     describe=lambda r: f"seed {r['seed']} {r['mixer']:>16} lr {r['lr']:g}: " + "  ".join(
                         f"h={h}: {a:.3f}" for h, a in zip(r["hops"], r["accuracy"])))


if __name__ == "__main__":
    raise SystemExit(main())
