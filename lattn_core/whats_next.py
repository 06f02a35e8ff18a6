"""Chapter 12: the whole family side by side, the memory of decoding, attention as a quadratic RNN.

* :data:`FAMILY`: one :class:`FamilyRow` per model of the book, naming its ``lattn_core`` forms, its
  recurrence, its attention-matrix form, what it keeps while decoding (a fixed state, or a cache that
  grows by a fixed number of entries per token), its costs and its chapters. :func:`family_table`
  checks every name against the code and joins the kernels' model map (``kernels.catalog``, handed in
  by the caller: this package imports nothing from :mod:`kernels`).
* :func:`carried_numbers` measures, from the recurrent form alone, how many numbers the past hands to
  the future: the rank of the Jacobian of the later outputs with respect to the earlier keys and
  values. It is the state size of a linear model and grows with the past for a softmax-like one.
* :class:`ModelConfig`, :data:`EXAMPLE_CONFIG` and :func:`decode_memory`: the bytes one sequence holds
  while decoding; :func:`kv_cache_step` and :func:`gated_delta_step`: one decoding step of softmax
  attention over a KV cache and of Gated DeltaNet's state (PyTorch, batched, any device).
* :func:`rereading_rnn`: the RNN that re-reads the whole history for every new token (constant space,
  quadratic time), with :class:`SoftmaxCell` (softmax attention is its special case) and
  :class:`StickBreakingCell`; :func:`stick_breaking_attention` is the latter's matrix form.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ._validate import as_array, check_qkv
from .softmax import _online_softmax_fold

__all__ = ["FamilyRow", "FAMILY", "family_inputs", "run_family", "carried_numbers", "family_table", "family_markdown", "kernel_sentence",
           "ModelConfig", "EXAMPLE_CONFIG", "published_config", "decode_memory", "kv_cache_step",
           "gated_delta_step",
           "rereading_rnn", "SoftmaxCell", "StickBreakingCell", "stick_breaking_attention",
           "FORM_KEYS"]

# The forms a model map row may name, in the order a join tries them.
FORM_KEYS = ("recurrent", "parallel", "chunkwise")


@dataclass(frozen=True)
class FamilyRow:
    """One model of the book.

    ``recurrent``/``parallel``/``chunkwise``: ``lattn_core`` function names (``None`` where the model
    has no such form). ``recurrence`` and ``matrix``: the definition and the attention-matrix form as
    plain text. ``cache_per_token(d_k, d_v)`` and ``state(d_k, d_v)``: numbers per head that decoding
    keeps per cached token and in a fixed state. ``train``/``decode``: the cost of training (the whole
    sequence) and of decoding one token, per head, as text; ``train_power``: the power of ``n`` in
    the training cost. ``inputs``: the name of the input recipe of :func:`family_inputs`.

    Defined in Chapter 12 (What's next).
    """
    name: str
    chapters: tuple
    notebooks: tuple
    recurrent: str
    parallel: str | None
    chunkwise: str | None
    recurrence: str
    matrix: str
    cache_per_token: Callable
    state: Callable
    state_text: str
    train: str
    decode: str
    train_power: int
    inputs: str
    ch7_row: str | None = None
    notes: str = ""

    @property
    def grows(self) -> bool:
        """True when decoding keeps a cache that grows with the context."""
        return self.cache_per_token(1, 1) > 0


def _zero(d_k, d_v):
    return 0


def _kv(d_k, d_v):
    return d_k + d_v


def _outer(d_k, d_v):
    return d_k * d_v


FAMILY = (
    FamilyRow("softmax attention", (1,), ("01_quadratic_cost",), "softmax_attention_recurrent",
              "softmax_attention", "softmax_attention_chunkwise",
              "oₜ = Σⱼ≤ₜ exp(qₜ·kⱼ) vⱼ / Σⱼ≤ₜ exp(qₜ·kⱼ)", "softmax(QKᵀ + log M) V",
              _kv, _zero, "n (d_k + d_v): every key and value", "O(n² d)", "O(n d)", 2, "softmax",
              ch7_row="softmax"),
    FamilyRow("linear attention", (2,), ("02_linear_attention",), "linear_attention_recurrent",
              "linear_attention_parallel", "linear_attention_chunkwise",
              "Sₜ = Sₜ₋₁ + vₜkₜᵀ", "(QKᵀ ⊙ M) V", _zero, _outer, "d_v d_k", "O(n d²)", "O(d²)", 1,
              "plain", ch7_row="linear"),
    FamilyRow("RetNet / scalar decay", (3,), ("03_forget_gates",), "decay_attention_recurrent",
              "decay_attention_parallel", "decay_attention_chunkwise",
              "Sₜ = γₜSₜ₋₁ + vₜkₜᵀ", "(QKᵀ ⊙ Γ) V", _zero, _outer, "d_v d_k", "O(n d²)", "O(d²)", 1,
              "scalar_gate", ch7_row="gated"),
    FamilyRow("GLA (vector gate)", (3,), ("03_forget_gates",), "gla_attention_recurrent",
              "gla_attention_parallel", "gla_attention_chunkwise",
              "Sₜ = Sₜ₋₁ Diag(γₜ) + vₜkₜᵀ", "the gated row, one decay per key channel",
              _zero, _outer, "d_v d_k", "O(n d²)", "O(d²)", 1, "vector_gate"),
    FamilyRow("DeltaNet", (5, 6), ("05_delta_rule", "06_inverse_trick"), "deltanet_recurrent",
              "deltanet_parallel", "deltanet_chunkwise",
              "Sₜ = Sₜ₋₁(I − βₜkₜkₜᵀ) + βₜvₜkₜᵀ",
              "(QKᵀ ⊙ M)(I + Diag(β)(KKᵀ ⊙ M⁻))⁻¹ Diag(β) V",
              _zero, _outer, "d_v d_k", "O(n d²)", "O(d²)", 1, "delta", ch7_row="DeltaNet"),
    FamilyRow("Gated DeltaNet", (6,), ("06_inverse_trick",), "gated_deltanet_recurrent",
              "gated_deltanet_parallel", "gated_deltanet_chunkwise",
              "Sₜ = αₜSₜ₋₁(I − βₜkₜkₜᵀ) + βₜvₜkₜᵀ",
              "(QKᵀ ⊙ Γ)(I + Diag(β)(KKᵀ ⊙ Γ⁻))⁻¹ Diag(β) V",
              _zero, _outer, "d_v d_k", "O(n d²)", "O(d²)", 1, "gated_delta", ch7_row="Gated DeltaNet"),
    FamilyRow("Comba", (6,), ("06_inverse_trick",), "comba_recurrent", "comba_parallel", "comba_chunkwise",
              "Sₜ = γₜSₜ₋₁ + ηₜ(vₜ − Sₜ₋₁kₜ)kₜᵀ", "Gated DeltaNet's, the gate outside the erase",
              _zero, _outer, "d_v d_k", "O(n d²)", "O(d²)", 1, "comba"),
    FamilyRow("DeltaProduct", (6,), ("06_inverse_trick",), "deltaproduct_recurrent", "deltaproduct_parallel",
              "deltaproduct_chunkwise",
              "n_h delta steps per token: Sₜ = Sₜ₋₁Πᵢ(I − βₜᵢkₜᵢkₜᵢᵀ) + …",
              "DeltaNet's on n_h n keys, one row in n_h read", _zero, _outer, "d_v d_k",
              "O(n_h n d²)", "O(n_h d²)", 1, "deltaproduct", notes="n_h delta steps per token"),
    FamilyRow("FoX (forget-gated softmax)", (7,), ("07_feeding_back",), "fox_attention_recurrent",
              "fox_attention_parallel", "fox_attention_chunkwise",
              "oₜ = Σⱼ≤ₜ exp(qₜ·kⱼ)Γₜⱼ vⱼ / Σⱼ≤ₜ exp(qₜ·kⱼ)Γₜⱼ", "softmax(QKᵀ + log Γ) V",
              lambda d_k, d_v: d_k + d_v + 1, _zero, "n (d_k + d_v + 1): a log decay per key",
              "O(n² d)", "O(n d)", 2, "scalar_gate"),
    FamilyRow("DeltaFormer", (8,), ("08_deltaformer",), "deltaformer_recurrent", "deltaformer_parallel",
              "deltaformer_chunkwise",
              "uₜ = vₜ − βₜΣⱼ<ₜ softmaxⱼ(kₜ·kⱼ)uⱼ, oₜ = Σⱼ≤ₜ softmaxⱼ(qₜ·kⱼ)uⱼ",
              "A(I + Diag(β)B)⁻¹ V, A, B softmaxes of QKᵀ, KKᵀ", _kv, _zero,
              "n (d_k + d_v): keys and pseudo-values", "O(n² d)", "O(n d)", 2, "deltaformer"),
    FamilyRow("PaTH", (9,), ("09_path",), "path_attention_recurrent", "path_attention_parallel",
              "path_attention_chunkwise",
              "oₜ = Σⱼ≤ₜ softmaxⱼ(qₜᵀEₜ⋯Eⱼ₊₁kⱼ) vⱼ, Eₛ = I − βₛwₛwₛᵀ",
              "softmax of Householder-carried scores", _kv, _zero,
              "n (d_k + d_v): keys carried by each new E", "O(n² d)", "O(n d)", 2, "path"),
    FamilyRow("MesaNet", (10,), ("10_mesanet",), "mesanet_recurrent", "mesanet_parallel", "mesanet_chunkwise",
              "Gₜ = γₜGₜ₋₁ + vₜkₜᵀ, Hₜ = γₜHₜ₋₁ + kₜkₜᵀ, oₜ = Gₜ(Hₜ + Λ)⁻¹qₜ",
              "(Q̂Kᵀ ⊙ Γ) V, q̂ₜ = (Hₜ + Λ)⁻¹qₜ", _zero,
              lambda d_k, d_v: d_k * d_v + d_k * (d_k + 1) // 2,
              "d_v d_k + d_k(d_k + 1)/2: G and the symmetric H", "O(m n d²)", "O(m d²)", 1, "mesa",
              notes="m conjugate-gradient steps per token"),
)


def _unit_rows(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def family_inputs(row: FamilyRow, n: int, d_k: int, d_v: int, rng) -> dict:
    """Keyword arguments of ``row``'s recurrent form for ``n`` tokens: queries and values ``N(0, 1)``;
    unit keys (the delta rule's stable range) scaled by ``d_k^-1/4`` for the softmax-like models;
    gates in ``[0.8, 1)``, write strengths in ``[0.5, 1]``; DeltaProduct gets two keys per token,
    PaTH unit directions with ``β = 1.99`` (nearly reflections: a factor that shrank a direction would leave
    old keys barely visible, and the rank hard to read), MesaNet ``λ = 0.5``.

    Defined in Chapter 12 (What's next)."""
    if not isinstance(row, FamilyRow):
        raise ValueError(f"row must be one of FAMILY's rows; got {type(row).__name__}")
    r = np.random.default_rng(rng)
    Q = r.normal(size=(n, d_k))
    K = _unit_rows(r.normal(size=(n, d_k)))
    V = r.normal(size=(n, d_v))
    gate = r.uniform(0.8, 1.0, size=n)
    beta = r.uniform(0.5, 1.0, size=n)
    kind = row.inputs
    if kind == "softmax":
        return dict(Q=Q, K=K * d_k ** 0.25, V=V)
    if kind == "plain":
        return dict(Q=Q, K=K, V=V)
    if kind == "scalar_gate":
        return dict(Q=Q, K=K * (d_k ** 0.25 if row.grows else 1.0), V=V, gamma=gate)
    if kind == "vector_gate":
        return dict(Q=Q, K=K, V=V, gamma=r.uniform(0.8, 1.0, size=(n, d_k)))
    if kind == "delta":
        return dict(Q=Q, K=K, V=V, beta=beta)
    if kind == "gated_delta":
        return dict(Q=Q, K=K, V=V, alpha=gate, beta=beta)
    if kind == "comba":
        return dict(Q=Q, K=K, V=V, gamma=gate, eta=beta)
    if kind == "deltaproduct":
        return dict(Q=Q, K=_unit_rows(r.normal(size=(n, 2, d_k))), V=r.normal(size=(n, 2, d_v)),
                    beta=r.uniform(0.5, 1.0, size=(n, 2)), alpha=gate)
    if kind == "deltaformer":
        return dict(Q=Q, K=K * d_k ** 0.25, V=V, normalize=True, beta=beta)
    if kind == "path":
        return dict(Q=Q, K=K * d_k ** 0.25, V=V, W=_unit_rows(r.normal(size=(n, d_k))),
                    beta=np.full(n, 1.99))
    if kind == "mesa":
        return dict(Q=Q, K=K, V=V, gamma=gate, lam=0.5)
    raise ValueError(f"row.inputs must name a recipe of family_inputs; got {kind!r}")


def run_family(row: FamilyRow, inputs: dict, form: str = "recurrent") -> np.ndarray:
    """Call ``row``'s ``form`` (``"recurrent"``, ``"parallel"`` or ``"chunkwise"``) of ``lattn_core``
    on ``inputs`` (from :func:`family_inputs`).

    Defined in Chapter 12 (What's next)."""
    if form not in FORM_KEYS:
        raise ValueError(f"form must be one of {FORM_KEYS}; got {form!r}")
    name = getattr(row, form)
    if name is None:
        raise ValueError(f"{row.name} has no {form} form in lattn_core")
    return getattr(importlib.import_module("lattn_core"), name)(**inputs)


def carried_numbers(row: FamilyRow, n_past: int, *, n_future: int = 24, d_k: int = 3, d_v: int = 3,
                    seed: int = 0, step: float = 1e-5, rtol: float = 1e-6, return_singular: bool = False):
    """How many numbers the first ``n_past`` tokens hand to the next ``n_future``, measured.

    Runs ``row``'s recurrent form on ``n_past + n_future`` tokens and builds the Jacobian of the later
    outputs with respect to every entry of the earlier tokens' inputs other than the queries (keys,
    values, gates, write strengths, directions; central differences of size
    ``step``: the truncation error is ``~step²``, far below ``rtol``). Whatever the past passes on
    must go through what the model keeps, so the Jacobian's rank (singular values above ``rtol``
    times the largest) is the number of independent numbers kept: the state's size for a linear
    model (once the past is long enough to fill it), and ``n_past`` times the entries cached per
    token for softmax-like models (while ``n_future · d_v`` is larger). Returns the rank (and the
    singular values with ``return_singular=True``).

    Defined in Chapter 12 (What's next).
    """
    for name, val in (("n_past", n_past), ("n_future", n_future), ("d_k", d_k), ("d_v", d_v)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < 1:
            raise ValueError(f"{name} must be a positive integer; got {val!r}")
    inputs = family_inputs(row, n_past + n_future, d_k, d_v, seed)
    later = lambda: run_family(row, inputs)[n_past:].ravel()    # noqa: E731
    cols = []
    n = n_past + n_future
    per_token = [k for k, x in inputs.items() if k != "Q" and np.ndim(x) >= 1 and np.shape(x)[0] == n]
    for name in per_token:
        X = inputs[name]
        for idx in np.ndindex(X[:n_past].shape):
            old = X[idx]
            X[idx] = old + step
            up = later()
            X[idx] = old - step
            down = later()
            X[idx] = old
            cols.append((up - down) / (2 * step))
    sv = np.linalg.svd(np.stack(cols, axis=1), compute_uv=False)
    rank = int(np.sum(sv > rtol * sv[0]))
    return (rank, sv) if return_singular else rank


def family_table(catalog_rows=(), *, d: int = 128, family=FAMILY) -> list:
    """The rows of the chapter's table, every name checked against ``lattn_core``.

    ``catalog_rows``: the rows of ``kernels.catalog.model_map()`` (or none); a model's op and kernel
    family come from the catalog row that names one of its ``lattn_core`` forms, ``None`` when no row
    does (a model without a kernel). Each returned dict holds the :class:`FamilyRow`'s fields that a
    reader sees, plus ``state_d`` / ``cache_d`` (numbers per head at ``d_k = d_v = d``), ``op``,
    ``family`` and ``chapters`` as ``(number, notebook)`` pairs. Raises :class:`LookupError` naming a
    ``lattn_core`` function that does not exist.

    Defined in Chapter 12 (What's next).
    """
    lc = importlib.import_module("lattn_core")
    rows = []
    for m in family:
        forms = {k: getattr(m, k) for k in FORM_KEYS}
        for form, fn in forms.items():
            if fn is not None and not (fn in lc.__all__ and callable(getattr(lc, fn, None))):
                raise LookupError(f"{m.name}: lattn_core has no public function {fn!r} ({form} form)")
        names = {fn for fn in forms.values() if fn is not None}
        match = [c for c in catalog_rows if names & {c.get(k) for k in FORM_KEYS}]
        op = match[0].get("op") if match else None
        rows.append(dict(model=m.name, recurrence=m.recurrence, matrix=m.matrix, ch7_row=m.ch7_row,
                         state_text=m.state_text, train=m.train, decode=m.decode, grows=m.grows,
                         state_d=m.state(d, d), cache_d=m.cache_per_token(d, d), notes=m.notes,
                         op=op, family=match[0].get("family") if match and op else None,
                         chapters=tuple(zip(m.chapters, m.notebooks)), **forms))
    return rows


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def kernel_sentence(rows) -> str:
    """One sentence on which models of :func:`family_table`'s ``rows`` have a Triton op in
    ``kernels``, naming those without one, and reading well when every model has one or none does.

    Defined in Chapter 12 (What's next)."""
    without = [r["model"] for r in rows if not r["op"]]
    n, k = len(rows), len(rows) - len(without)
    head = _count(n, "model", "models")
    if not without:
        return f"{head}, {'each' if n > 1 else 'it'} with a Triton op in kernels."
    names = without[0] if len(without) == 1 else ", ".join(without[:-1]) + " and " + without[-1]
    if k == 0:
        return f"{head}, none with a Triton op in kernels yet."
    return (f"{head}, {k} with a Triton op in kernels; {names} "
            f"{'has' if len(without) == 1 else 'have'} none yet.")


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def family_markdown(rows) -> str:
    """:func:`family_table`'s rows as a Markdown table of two columns that wrap on a narrow screen:
    the model with its chapters (links to their notebooks), and one cell that names, in turn, its
    recurrence, its attention matrix, what it keeps per head (at the ``d`` the rows were built
    with), what it costs to train and to decode, and its op in ``kernels`` (or "none").

    Defined in Chapter 12 (What's next)."""
    out = ["| model | recurrence, attention matrix, memory, cost, kernel |", "|:--|:--|"]
    for r in rows:
        chapters = ", ".join(f"[{ch}]({nb}.ipynb)" for ch, nb in r["chapters"])
        label = "Chapter" if len(r["chapters"]) == 1 else "Chapters"
        model = f"**{_cell(r['model'])}** ({label} {chapters})"
        if r["grows"]:
            keep = f"a cache of {r['cache_d']:,} numbers per token, {_cell(r['state_text'])}"
        else:
            keep = f"a state of {r['state_d']:,} numbers, {_cell(r['state_text'])}"
        cost = f"training {r['train']}, decoding {r['decode']} per token"
        if r["notes"] and r["notes"] not in r["recurrence"]:
            cost += f" ({_cell(r['notes'])})"
        kernel = f"`{r['op']}`" if r["op"] else "none"
        out.append(f"| {model} | **recurrence** {_cell(r['recurrence'])}; **matrix** {_cell(r['matrix'])}; "
                   f"**keeps** {keep}; **costs** {cost}; **kernel** {kernel} |")
    return "\n".join(out)


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a decoder: ``layers``, query ``heads`` of size ``head_dim``, ``kv_heads`` key-value
    heads (equal to ``heads`` for multi-head attention), ``d_model``, ``vocab``. Bytes per cached
    number (16-bit caches) and per state number (float32 states, as the book's ops return them).

    Defined in Chapter 12 (What's next)."""
    name: str
    layers: int
    d_model: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    cache_bytes: int = 2
    state_bytes: int = 4
    extra: dict = field(default_factory=dict)

    def params(self) -> int:
        """The usual count: ``12 · layers · d_model²`` (attention and a 4x MLP) plus tied
        embeddings ``vocab · d_model``."""
        return 12 * self.layers * self.d_model ** 2 + self.vocab * self.d_model


# Our example of a 1.3B-class decoder (the count of ModelConfig.params), not a published model.
EXAMPLE_CONFIG = ModelConfig("example 1.3B", layers=24, d_model=2048, heads=16, kv_heads=16, head_dim=128,
                             vocab=32000)


def published_config(name: str = "Llama-3-8B") -> ModelConfig:
    """A published model's attention shape from Chapter 7's list (:data:`lattn_core.feeding_back.
    MODEL_SHAPES`) as a :class:`ModelConfig` for :func:`decode_memory`: its layers, heads, key-value
    heads and head width (``d_model = heads · head_dim``; ``vocab`` 0, since only the attention
    layers' memory is counted, so :meth:`ModelConfig.params` does not describe it).

    Defined in Chapter 12 (What's next)."""
    from .feeding_back import MODEL_SHAPES
    shapes = {s.name: s for s in MODEL_SHAPES}
    if name not in shapes:
        raise ValueError(f"name must be one of {sorted(shapes)}; got {name!r}")
    s = shapes[name]
    return ModelConfig(s.name, layers=s.layers, d_model=s.heads * s.head_dim, heads=s.heads,
                       kv_heads=s.kv_heads, head_dim=s.head_dim, vocab=0, extra={"cite": s.cite})


def decode_memory(row: FamilyRow, config: ModelConfig, n, *, batch: int = 1, kv_heads: int | None = None):
    """Bytes that ``batch`` sequences hold for ``row``'s attention layers after ``n`` tokens (``n`` an
    int or an array): per layer and head, ``n · cache_per_token`` 16-bit numbers plus the fixed state
    in float32. A cache is kept per key-value head (``kv_heads``, default the config's); a state per
    query head.

    Defined in Chapter 12 (What's next)."""
    n = np.asarray(n)
    if np.any(n < 0):
        raise ValueError("n must be a non-negative token count")
    d = config.head_dim
    kv = config.kv_heads if kv_heads is None else kv_heads
    cache = row.cache_per_token(d, d) * n * kv * config.cache_bytes
    state = row.state(d, d) * config.heads * config.state_bytes
    out = batch * config.layers * (cache + state)
    return int(out) if out.ndim == 0 else out


def kv_cache_step(q, k_cache, v_cache, scale: float | None = None):
    """One decoding step of softmax attention: the new token's query ``q`` ``[B, H, D]`` reads the
    cache ``k_cache``, ``v_cache`` ``[B, H, n, D]`` (the new token's key and value already in it);
    returns ``o`` ``[B, H, D_v]``. PyTorch's ``scaled_dot_product_attention`` with one query row (no
    mask: the cache holds only the past). ``scale`` defaults to ``D^-1/2``.

    Defined in Chapter 12 (What's next)."""
    import torch.nn.functional as F
    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.dim() != 4 or k_cache.shape[:2] != q.shape[:2]:
        raise ValueError("q must be [B, H, D] and k_cache, v_cache [B, H, n, D] with the same B, H; got "
                         f"{tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    return F.scaled_dot_product_attention(q[:, :, None], k_cache, v_cache, scale=scale)[:, :, 0]


def gated_delta_step(S, q, k, v, alpha, beta):
    """One decoding step of Gated DeltaNet, in place: ``S`` ``[B, H, D_v, D_k]`` becomes
    ``α S (I − β k kᵀ) + β v kᵀ = α S + β (v − α S k) kᵀ`` (one read of the state, one rank-one
    write); returns ``o = S q`` ``[B, H, D_v]``. ``q``, ``k`` ``[B, H, D_k]``, ``v`` ``[B, H, D_v]``,
    ``alpha``, ``beta`` ``[B, H]``.

    Defined in Chapter 12 (What's next)."""
    import torch
    if S.dim() != 4 or q.shape != k.shape or q.shape != (*S.shape[:2], S.shape[3]) or \
            v.shape != S.shape[:3] or alpha.shape != S.shape[:2] or beta.shape != S.shape[:2]:
        raise ValueError("S must be [B, H, D_v, D_k], q and k [B, H, D_k], v [B, H, D_v], alpha and beta "
                         f"[B, H]; got {tuple(S.shape)}, {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}, {tuple(alpha.shape)}, {tuple(beta.shape)}")
    a = alpha[..., None]
    Sk = torch.einsum("bhvk,bhk->bhv", S, k)
    S.mul_(a[..., None])
    S.add_(torch.einsum("bhv,bhk->bhvk", beta[..., None] * (v - a * Sk), k))
    return torch.einsum("bhvk,bhk->bhv", S, q)


class SoftmaxCell:
    """Softmax attention as the cell of a re-reading RNN: the state is the running max, denominator
    and numerator of the online softmax; reading key ``k`` and value ``v`` with the current query
    ``q`` folds in ``exp(q·k)``. The order of reading does not matter.

    Defined in Chapter 12 (What's next)."""

    def start(self, q, d_v):
        return (np.float64(-np.inf), 0.0, np.zeros(d_v))

    def step(self, h, q, k, v):
        return _online_softmax_fold(*h, np.array([q @ k]), v[None])

    def read(self, h):
        return h[2] / h[1]


class StickBreakingCell:
    """Stick-breaking attention as a re-reading RNN: reading from the newest token back, each token
    takes the share ``σ(q·k)`` of the weight still unclaimed. State: the output so far and the
    unclaimed weight.

    Defined in Chapter 12 (What's next)."""

    def start(self, q, d_v):
        return (np.zeros(d_v), 1.0)

    def step(self, h, q, k, v):
        y, rest = h
        a = 1.0 / (1.0 + np.exp(-(q @ k)))
        return (y + rest * a * v, rest * (1.0 - a))

    def read(self, h):
        return h[0]


def rereading_rnn(Q, K, V, cell=None, *, backward: bool = True, counter: dict | None = None):
    """The RNN that re-reads the book: for every token ``i`` a fresh state (``cell.start(q_i)``) reads
    tokens ``i, i−1, …, 1`` (``backward``; else ``1, …, i``) with ``cell.step(h, q_i, k_j, v_j)``, and
    ``o_i = cell.read(h)``. Memory: one state, whatever ``n``; time: ``n(n+1)/2`` steps. ``cell``
    defaults to :class:`SoftmaxCell`, which makes this softmax attention. ``counter``, if given,
    gets ``"steps"``, the number of cell steps taken.

    Defined in Chapter 12 (What's next)."""
    Q, K, V = check_qkv(Q, K, V)
    cell = SoftmaxCell() if cell is None else cell
    n, d_v = V.shape
    out = np.empty((n, d_v))
    steps = 0
    for i in range(n):
        h = cell.start(Q[i], d_v)
        for j in (range(i, -1, -1) if backward else range(i + 1)):
            h = cell.step(h, Q[i], K[j], V[j])
            steps += 1
        out[i] = cell.read(h)
    if counter is not None:
        counter["steps"] = counter.get("steps", 0) + steps
    return out


def stick_breaking_attention(Q, K, V) -> np.ndarray:
    """Stick-breaking attention in matrix form: ``O = P V`` with
    ``P_ij = σ(s_ij) Π_{j<l≤i} (1 − σ(s_il))``, ``s = QKᵀ``, ``j ≤ i``; computed in log space
    (``log σ(s)`` and ``log(1 − σ(s)) = log σ(−s)``) from a reversed cumulative sum per row.

    Defined in Chapter 12 (What's next)."""
    Q, K, V = check_qkv(Q, K, V)
    S = as_array(Q @ K.T, "scores", (None, None))
    n = S.shape[0]
    log_a = -np.logaddexp(0.0, -S)            # log σ(s)
    log_rest = -np.logaddexp(0.0, S)          # log(1 − σ(s))
    lower = np.tril(np.ones((n, n), bool))
    log_rest = np.where(lower, log_rest, 0.0)
    # Σ_{l=j+1..i} log(1 − σ(s_il)): the suffix sum of row i after column j
    suffix = np.cumsum(log_rest[:, ::-1], axis=1)[:, ::-1] - log_rest
    P = np.where(lower, np.exp(log_a + suffix), 0.0)
    return P @ V
