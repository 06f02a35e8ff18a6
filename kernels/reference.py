"""Differentiable PyTorch implementations: the CPU default of every op, and the GPU kernels' oracle.

Layout as in fla: ``q, k`` ``[B, T, H, K]``, ``v`` ``[B, T, H, V]``, scalar gates ``[B, T, H]``,
vector gates ``[B, T, H, K]``, states ``[B, H, K, V]`` (fla's orientation: ``S^T`` of the book's
``S``). Accumulation is float32 (float64 if the inputs are float64, which is how the tests build
references); ``o`` is returned in ``v``'s dtype, the final state in float32 (float64 for float64).

The chunkwise forms work only with *differences* of cumulative log gates inside a chunk, so they
never divide by a product of gates and stay finite for gates near 0 over long sequences.

:func:`delta_chunk` is one delta-rule chunk in closed form (Chapter 6's WY factors, pseudo-values,
outputs and leaving state) and :func:`delta_chunk_adjoint` its closed-form gradients: the chapter,
its tests and the delta family's PyTorch backward share them.

:func:`causal_conv1d_ref` puts the past inputs a decoding state holds in front of ``x`` along time,
so token ``t`` sees rows ``t - W + 1 .. t`` of ``concat(state, x)`` and the final state is the last
``W`` rows of the same concatenation (exact also when ``T < W - 1``).
"""
from __future__ import annotations

from collections import namedtuple

import torch
import torch.nn.functional as F

__all__ = ["attention_ref", "deltaformer_ref", "path_attn_ref", "path_rows_ref", "chunk_scalar_ref", "chunk_gla_ref", "recurrent_ref", "DeltaChunk", "delta_chunk",
           "delta_chunk_adjoint", "causal_conv1d_ref", "past_and_inputs", "chunk_mesa_net_ref"]


def _acc_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def attention_ref(q, k, v, scale: float, causal: bool = True, g=None) -> torch.Tensor:
    """Softmax attention ``softmax(scale q k^T + G_i - G_j + log M) v`` in float32 (float64 for
    float64 input); ``g``: ``None`` or log forget gates ``[B, T, H]`` with ``G = cumsum(g)`` (FoX)."""
    acc = _acc_dtype(q)
    qf, kf, vf = (x.to(acc).transpose(1, 2) for x in (q, k, v))       # [B, H, T, D]
    s = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    if g is not None:
        G = torch.cumsum(g.to(acc), dim=1).transpose(1, 2)             # [B, H, T]
        s = s + (G[..., :, None] - G[..., None, :])
    if causal:
        T = q.shape[1]
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
    o = torch.matmul(torch.softmax(s, dim=-1), vf)
    return o.transpose(1, 2).to(v.dtype)


def deltaformer_ref(q, k, v, beta=None, scale: float = 1.0) -> torch.Tensor:
    """DeltaFormer: causal softmax attention of ``q`` over ``k`` with the pseudo-values
    ``u = (I + Diag(β) P)^{-1} v`` as values, ``P`` the strictly causal row softmax of
    ``scale·k kᵀ`` (its first row empty); ``beta`` ``[B, T, H]`` or ``None`` (ones). The solve is
    a library triangular solve, differentiable; float32 (float64 for float64 input)."""
    acc = _acc_dtype(q)
    kf, vf = (x.to(acc).transpose(1, 2) for x in (k, v))                # [B, H, T, D]
    T = k.shape[1]
    s = torch.matmul(kf, kf.transpose(-1, -2)) * scale
    earlier = torch.ones(T, T, dtype=torch.bool, device=k.device).tril(-1)
    s = s.masked_fill(~earlier, float("-inf"))
    m = s.amax(-1, keepdim=True).clamp_min(torch.finfo(acc).min)       # the first row: no key at all
    p = torch.exp(s - m)
    total = p.sum(-1, keepdim=True)
    P = p / torch.where(total > 0, total, torch.ones_like(total))
    b = torch.ones(k.shape[:3], dtype=acc, device=k.device) if beta is None else beta.to(acc)
    N = torch.eye(T, dtype=acc, device=k.device) + b.transpose(1, 2)[..., None] * P
    u = torch.linalg.solve_triangular(N, vf, upper=False, unitriangular=True)
    return attention_ref(q, k, u.transpose(1, 2), scale, True).to(v.dtype)


def path_attn_ref(q, k, v, w, beta, g=None, scale: float = 1.0) -> torch.Tensor:
    """PaTH attention: causal softmax of ``scale · (A + G_i − G_j)`` times ``v`` (fla's convention:
    the forget-gate bias inside the scale), with the scores in
    the article's closed form ``A = (Q Kᵀ ⊙ M) − (Q Wᵀ ⊙ M)(I + Diag(β)(W Wᵀ ⊙ M⁻))^{-1}
    Diag(β)(W Kᵀ ⊙ M⁻)`` (``lattn_core.path_attention_scores``); ``w`` ``[B, T, H, K]``, ``beta``
    ``[B, T, H]``, ``g`` ``None`` or log forget gates ``[B, T, H]`` (PaTH-FoX, ``G = cumsum(g)``).
    One library triangular solve of a ``T × T`` system per head (``O(T³)``: the CPU path and the
    kernels' oracle at test sizes), differentiable; float32 (float64 for float64 input)."""
    acc = _acc_dtype(q)
    qf, kf, vf, wf = (x.to(acc).transpose(1, 2) for x in (q, k, v, w))     # [B, H, T, D]
    T = q.shape[1]
    b = beta.to(acc).transpose(1, 2)[..., None]                          # [B, H, T, 1]
    below = torch.ones(T, T, dtype=torch.bool, device=q.device).tril(-1)
    lower = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    N = torch.eye(T, dtype=acc, device=q.device) + (b * torch.matmul(wf, wf.transpose(-1, -2))).masked_fill(~below, 0)
    rhs = (b * torch.matmul(wf, kf.transpose(-1, -2))).masked_fill(~below, 0)
    Y = torch.linalg.solve_triangular(N, rhs, upper=False, unitriangular=True)
    A = torch.matmul(qf, kf.transpose(-1, -2)).masked_fill(~lower, 0) \
        - torch.matmul(torch.matmul(qf, wf.transpose(-1, -2)).masked_fill(~lower, 0), Y)
    if g is not None:
        G = torch.cumsum(g.to(acc), dim=1).transpose(1, 2)               # [B, H, T]
        A = A + (G[..., :, None] - G[..., None, :])
    s = (A * scale).masked_fill(~lower, float("-inf"))
    o = torch.matmul(torch.softmax(s, dim=-1), vf)
    return o.transpose(1, 2).to(v.dtype)


def path_rows_ref(q, k, v, w, beta, g=None, scale: float = 1.0, rows=(0,)) -> torch.Tensor:
    """PaTH's outputs for a few query ``rows`` only, in float64 on the CPU, with ``O(T d)`` memory:
    each row's query is carried back token by token, ``y ← H_j y`` (``H_j = I − β_j w_j w_jᵀ`` is
    symmetric, so ``q_iᵀ H_i ⋯ H_{j+1} k_j = y_jᵀ k_j`` with ``y_i = q_i``), never forming a
    ``T × T`` matrix. For checking the far end of sequences too long for :func:`path_attn_ref`.
    Same arguments as :func:`path_attn_ref`; returns ``[B, len(rows), H, V]`` float64."""
    rows = [int(i) for i in rows]
    B, T, H, _ = q.shape
    if not rows or min(rows) < 0 or max(rows) >= T:
        raise ValueError(f"rows must be indices in [0, {T}); got {rows}")
    f64 = [None if x is None else x.detach().to("cpu", torch.float64) for x in (q, k, v, w, beta, g)]
    qf, kf, vf, wf, bf, gf = f64
    idx = torch.tensor(rows)
    y = torch.zeros(B, len(rows), H, q.shape[-1], dtype=torch.float64)   # carried queries
    s = torch.full((B, len(rows), H, T), float("-inf"), dtype=torch.float64)
    for j in range(max(rows), -1, -1):
        start = idx == j
        if start.any():
            y[:, start] = qf[:, j][:, None]
        live = idx >= j
        s[:, live, :, j] = scale * (y[:, live] * kf[:, j][:, None]).sum(-1)
        y = y - bf[:, j][:, None, :, None] * (y * wf[:, j][:, None]).sum(-1, keepdim=True) * wf[:, j][:, None]
    if gf is not None:
        G = torch.cumsum(gf, dim=1)                                       # [B, T, H]
        s = s + scale * (G[:, idx][..., None] - G.transpose(1, 2)[:, None])
    return torch.einsum("brht,bthv->brhv", torch.softmax(s, dim=-1), vf)


def _pad_time(x, C):
    T = x.shape[1]
    pad = (-T) % C
    if pad == 0:
        return x
    widths = [0, 0] * (x.dim() - 2) + [0, pad]
    return F.pad(x, widths)


def chunk_scalar_ref(q, k, v, g=None, beta=None, scale: float = 1.0, initial_state=None,
                     output_final_state: bool = False, chunk_size: int = 64):
    """Chunkwise linear attention with an optional scalar log gate ``g`` and optional delta rule.

    Per head, in fla's orientation (``S`` is ``[K, V]``)::

        S_t = a_t S_{t-1}                                  (a_t = exp(g_t); 1 if g is None)
        S_t = S_t + k_t v_t^T                              if beta is None
        S_t = S_t + beta_t k_t (v_t - S_t^T k_t)^T         otherwise (the (gated) delta rule)
        o_t = scale * S_t^T q_t

    Covers ``chunk_linear_attn`` (g, beta None), ``chunk_simple_gla`` (beta None),
    ``chunk_delta_rule`` (g None) and ``chunk_gated_delta_rule``. Inside a chunk the delta rule's
    pseudo-values come from the UT/WY form ``(I + A)^{-1}``, with ``A`` strictly lower triangular.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    acc = _acc_dtype(q)
    C = max(1, min(chunk_size, T))    # a sequence shorter than a chunk is one chunk of its own length
    NT = (T + C - 1) // C
    # [B, H, NT, C, D] in the accumulation dtype; padded tokens have k = v = 0, g = 0.
    def blocks(x):
        x = _pad_time(x.to(acc), C)
        return x.reshape(B, NT, C, H, -1).permute(0, 3, 1, 2, 4)
    qc, kc, vc = blocks(q) * scale, blocks(k), blocks(v)
    if g is not None:
        gc = blocks(g.unsqueeze(-1)).squeeze(-1)                       # [B, H, NT, C]
        b = gc.cumsum(-1)                                              # within-chunk cumulative log gate
    else:
        b = torch.zeros(B, H, NT, C, dtype=acc, device=q.device)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    diff = b.unsqueeze(-1) - b.unsqueeze(-2)                          # b_i - b_j
    decay = torch.where(causal, diff, torch.full_like(diff, float("-inf"))).exp()  # Γ inside a chunk
    if beta is not None:
        betac = blocks(beta.unsqueeze(-1)).squeeze(-1)                 # [B, H, NT, C]
        strict = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)
        A = (kc @ kc.transpose(-1, -2)) * decay * betac.unsqueeze(-1)
        A = A.masked_fill(~strict, 0.0)
        eye = torch.eye(C, dtype=acc, device=q.device)
        # (I + A)^{-1}: unit lower triangular, solved rather than inverted.
        U = torch.linalg.solve_triangular(eye + A, vc * betac.unsqueeze(-1), upper=False, unitriangular=True)
        W = torch.linalg.solve_triangular(eye + A, kc * (betac * b.exp()).unsqueeze(-1), upper=False,
                                          unitriangular=True)
    attn = (qc @ kc.transpose(-1, -2)) * decay                         # [B, H, NT, C, C]
    S = torch.zeros(B, H, K, V, dtype=acc, device=q.device) if initial_state is None \
        else initial_state.to(acc).clone()
    outs = []
    for n in range(NT):
        bn = b[:, :, n]                                                # [B, H, C]
        if beta is not None:
            vn = U[:, :, n] - W[:, :, n] @ S                           # pseudo-values
        else:
            vn = vc[:, :, n]
        o = (qc[:, :, n] * bn.exp().unsqueeze(-1)) @ S + attn[:, :, n] @ vn
        outs.append(o)
        last = bn[..., -1:]                                            # b_C (padding adds log 1 = 0)
        S = S * last.exp().unsqueeze(-1) + (kc[:, :, n] * (last - bn).exp().unsqueeze(-1)).transpose(-1, -2) @ vn
    o = torch.stack(outs, dim=2).reshape(B, H, NT * C, V)[:, :, :T].transpose(1, 2)
    return o.to(v.dtype), (S if output_final_state else None)


def chunk_gla_ref(q, k, v, g, scale: float = 1.0, initial_state=None, output_final_state: bool = False,
                  chunk_size: int = 16):
    """Chunkwise GLA: ``S_t = Diag(exp(g_t)) S_{t-1} + k_t v_t^T``, ``o_t = scale * S_t^T q_t``.

    ``g`` is ``[B, T, H, K]``. The intra-chunk scores need the per-dimension decay between every
    pair ``(i, j)``, ``sum_d q_id k_jd exp(b_id - b_jd)``, formed from differences only (stable).
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    acc = _acc_dtype(q)
    C = chunk_size
    NT = (T + C - 1) // C
    def blocks(x):
        x = _pad_time(x.to(acc), C)
        return x.reshape(B, NT, C, H, -1).permute(0, 3, 1, 2, 4)
    qc, kc, vc, gc = blocks(q) * scale, blocks(k), blocks(v), blocks(g)
    b = gc.cumsum(-2)                                                  # [B, H, NT, C, K]
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    diff = b.unsqueeze(-2) - b.unsqueeze(-3)                          # [.., C_i, C_j, K]: b_i - b_j
    diff = diff.masked_fill(~causal.unsqueeze(-1), float("-inf"))
    attn = torch.einsum("bhnik,bhnjk,bhnijk->bhnij", qc, kc, diff.exp())
    S = torch.zeros(B, H, K, V, dtype=acc, device=q.device) if initial_state is None \
        else initial_state.to(acc).clone()
    outs = []
    for n in range(NT):
        bn = b[:, :, n]                                                # [B, H, C, K]
        o = (qc[:, :, n] * bn.exp()) @ S + attn[:, :, n] @ vc[:, :, n]
        outs.append(o)
        last = bn[:, :, -1:, :]                                        # [B, H, 1, K]
        S = S * last.transpose(-1, -2).exp() + (kc[:, :, n] * (last - bn).exp()).transpose(-1, -2) @ vc[:, :, n]
    o = torch.stack(outs, dim=2).reshape(B, H, NT * C, V)[:, :, :T].transpose(1, 2)
    return o.to(v.dtype), (S if output_final_state else None)


def recurrent_ref(q, k, v, g=None, beta=None, scale: float = 1.0, initial_state=None,
                  output_final_state: bool = False):
    """Token-by-token definition of all five ops (the slow oracle the tests compare against).

    ``g``: ``None``, ``[B, T, H]`` (scalar gate) or ``[B, T, H, K]`` (vector gate); ``beta``:
    ``None`` (plain write) or ``[B, T, H]`` (delta rule).
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    acc = _acc_dtype(q)
    S = torch.zeros(B, H, K, V, dtype=acc, device=q.device) if initial_state is None \
        else initial_state.to(acc).clone()
    outs = []
    for t in range(T):
        qt, kt, vt = (x[:, t].to(acc) for x in (q, k, v))              # [B, H, D]
        if g is not None:
            gt = g[:, t].to(acc)
            S = S * (gt.exp().unsqueeze(-1).unsqueeze(-1) if gt.dim() == 2 else gt.exp().unsqueeze(-1))
        if beta is not None:
            bt = beta[:, t].to(acc).unsqueeze(-1)
            u = bt * (vt - torch.einsum("bhkv,bhk->bhv", S, kt))
        else:
            u = vt
        S = S + kt.unsqueeze(-1) * u.unsqueeze(-2)
        outs.append(torch.einsum("bhkv,bhk->bhv", S, qt * scale))
    o = torch.stack(outs, dim=1)
    return o.to(v.dtype), (S if output_final_state else None)


DeltaChunk = namedtuple("DeltaChunk", "gamma A T W Ut U P Kd O S_next")
DeltaChunk.__doc__ = """The quantities of one (gated) delta-rule chunk, Chapter 6's (ch6-d-wy) and (ch6-d-chunk).

States are in fla's orientation, ``[K, V]`` (the book's ``S₀ᵀ``, ``S_nextᵀ``). ``gamma``: ``Γ ⊙ M``
(``Γ_ij = e^{b_i − b_j}`` on and below the diagonal, 0 above); ``A``: ``(Diag(β) K Kᵀ ⊙ Γ) ⊙ M⁻``;
``T``: ``(I + A)⁻¹``; ``W``: ``T Diag(β ⊙ e^b) K``; ``Ut``: ``Ũ = T Diag(β) V``; ``U``: the
pseudo-values ``Ũ − W S₀ᵀ``; ``P``: the scores ``Q Kᵀ ⊙ Γ ⊙ M``; ``Kd``: ``Diag(e^{b_C − b}) K``, the
keys decayed to the chunk's end; ``O``: ``Diag(e^b) Q S₀ᵀ + P U``; ``S_next``: ``e^{b_C} S₀ᵀ + Kdᵀ U``
(``None`` when not asked for)."""


def delta_chunk(q, k, v, b, beta, S0, *, state: bool = True) -> DeltaChunk:
    """One chunk of the gated delta rule in closed form (Chapter 6, (ch6-d-wy) and (ch6-d-chunk)).

    ``q``, ``k``: ``[..., C, K]``; ``v``: ``[..., C, V]``; ``b``: ``[..., C]``, the cumulative log
    gate *inside* the chunk (``b_i = Σ_{s ≤ i} log α_s``; ``None`` for DeltaNet, all zeros);
    ``beta``: ``[..., C]``; ``S0``: ``[..., K, V]``, the state entering the chunk in fla's orientation
    (the book's ``S₀ᵀ``). Leading dimensions (batch, heads, chunks) broadcast. No scale: the caller
    scales ``q``. Every exponent is ``b_i − b_j`` (``j ≤ i``), ``b_i`` or ``b_C − b_i``, never
    positive. ``T = (I + A)⁻¹`` comes from a unit-triangular solve, not a general inverse.
    Differentiable; ``state=False`` skips the leaving state (``S_next`` is then ``None``).

    One function for the chunk algebra: the chapter's derivation, its tests and the delta family's
    PyTorch backward (:func:`kernels.delta.backward.chunk_grads_torch`) all call it.
    """
    C = k.shape[-2]
    if b is None:
        b = torch.zeros(k.shape[:-1], dtype=k.dtype, device=k.device)
    causal = torch.ones(C, C, dtype=torch.bool, device=k.device).tril()
    strict = causal.tril(-1)
    diff = b.unsqueeze(-1) - b.unsqueeze(-2)                                   # b_i − b_j
    gamma = torch.where(causal, diff, torch.zeros_like(diff)).exp() * causal   # Γ ⊙ M, no e^{positive}
    A = (k @ k.transpose(-1, -2)) * gamma * beta.unsqueeze(-1) * strict
    eye = torch.eye(C, dtype=A.dtype, device=A.device)
    T = torch.linalg.solve_triangular(eye + A, eye.expand(A.shape), upper=False, unitriangular=True)
    W = T @ (k * (beta * b.exp()).unsqueeze(-1))
    Ut = T @ (v * beta.unsqueeze(-1))
    U = Ut - W @ S0
    P = (q @ k.transpose(-1, -2)) * gamma
    Kd = k * (b[..., -1:] - b).exp().unsqueeze(-1)
    O = (q * b.exp().unsqueeze(-1)) @ S0 + P @ U
    S_next = b[..., -1:].exp().unsqueeze(-1) * S0 + Kd.transpose(-1, -2) @ U if state else None
    return DeltaChunk(gamma, A, T, W, Ut, U, P, Kd, O, S_next)


def delta_chunk_adjoint(q, b, chunk: DeltaChunk, S0, dO, dS_next) -> dict:
    """The closed-form chunk gradients of Chapter 6, (ch6-d-adjoint) and (ch6-d-dA), for the loss
    ``<O, dO> + <S_next, dS_next>`` of one :func:`delta_chunk` (same arguments and orientation).

    Returns ``dU``, ``dS0`` (the entering state's gradient, ``[..., K, V]``), and, with
    ``Y = Diag(β) V`` and ``X = Diag(β ⊙ e^b) K`` (so ``Ũ = T Y``, ``W = T X``), ``dY``, ``dX`` and
    ``dA`` (strictly lower). Written from the formulas, not by autograd: the tests compare the two.
    """
    if b is None:
        b = torch.zeros(q.shape[:-1], dtype=q.dtype, device=q.device)
    C = q.shape[-2]
    strict = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)
    mT = lambda x: x.transpose(-1, -2)   # noqa: E731
    dU = mT(chunk.P) @ dO + chunk.Kd @ dS_next
    dS0 = (b[..., -1:].exp().unsqueeze(-1) * dS_next + mT(q * b.exp().unsqueeze(-1)) @ dO
           - mT(chunk.W) @ dU)
    dY = mT(chunk.T) @ dU
    dX = -dY @ mT(S0)
    dA = -(dY @ mT(chunk.Ut) + dX @ mT(chunk.W)) * strict
    return {"dU": dU, "dS0": dS0, "dY": dY, "dX": dX, "dA": dA}


# ---------------------------------------------------------------------------------------------
# the short causal convolution (Chapter 11): one concatenation and W shifted, weighted slices
# ---------------------------------------------------------------------------------------------
def past_and_inputs(x, initial_state, dtype):
    """``concat(state, x)`` along time, ``[B, W + T, D]`` in ``dtype``: row ``i < W`` is state slot
    ``i`` (slot ``W - 1`` the newest past input), row ``W + t`` is ``x_t``; zeros without a state."""
    return torch.cat([initial_state.to(dtype).transpose(1, 2), x.to(dtype)], dim=1)


def causal_conv1d_ref(x, weight, bias=None, residual=None, initial_state=None, output_final_state=False,
                      activation=None):
    """``y_t = act(sum_{j<W} weight[:, W-1-j] ⊙ x_{t-j} + bias) + residual_t`` with ``x_{t-j}`` for
    ``t < j`` taken from ``initial_state`` (slot ``W + t - j``) or zero; returns ``(y, final_state)``,
    ``y`` in ``x``'s dtype, ``final_state`` (the last ``W`` rows of ``concat(state, x)``, ``[B, D, W]``
    in ``x``'s dtype) or ``None``. Arithmetic in float32, or float64 for float64 ``x`` (the oracle).
    No validation (the op validates); differentiable in every tensor argument."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    B, T, D = x.shape
    W = weight.shape[1]
    past = initial_state if initial_state is not None else x.new_zeros(B, D, W, dtype=acc)
    xc = past_and_inputs(x, past, acc)                        # [B, W + T, D]
    w = weight.to(acc)
    z = sum(w[:, W - 1 - j] * xc[:, W - j:W - j + T] for j in range(W))
    if bias is not None:
        z = z + bias.to(acc)
    if activation in ("silu", "swish"):
        z = F.silu(z)
    if residual is not None:
        z = z + residual.to(acc)
    ht = xc[:, T:].transpose(1, 2).to(x.dtype).contiguous() if output_final_state else None
    return z.to(x.dtype), ht


# ---------------------------------------------------------------------------------------------
# MesaNet (Chapter 10): the gated sums of Chapter 3, and a conjugate-gradient solve per token
# ---------------------------------------------------------------------------------------------
def _mesa_chunks(x, C, acc):
    """``[B, T, H, ...]`` -> ``[B, H, N, C, ...]`` in ``acc``, zero-padded to ``N·C`` tokens."""
    x = _pad_time(x.to(acc), C)
    return x.reshape(x.shape[0], x.shape[1] // C, C, *x.shape[2:]).movedim(3, 1)


def chunk_mesa_net_ref(q, k, v, g, beta, lamb, max_CG_iteration: int = 30, h_kk_init=None, h_kv_init=None,
                       output_final_state: bool = False, *, exact: bool = False, chunk_size: int = 64):
    """MesaNet in chunks of ``chunk_size`` tokens, in PyTorch, differentiable:
    ``H_t = e^{g_t} H_{t-1} + beta_t k_t k_tᵀ``, ``G_t = e^{g_t} G_{t-1} + beta_t k_t v_tᵀ``,
    ``x_t = (H_t + Diag(lamb_h))^{-1} q_t``, ``o_t = G_tᵀ x_t``; returns ``(o, h_kk, h_kv)``.

    The solve: ``max_CG_iteration`` conjugate-gradient steps from zero, every token in lockstep, each
    product ``H_t p_t`` from the chunk's entering state and the chunk's own keys (never forming
    ``H_t``), with the kernel's guards (a row stops at its dtype's roundoff or where its curvature is
    not positive). Its gradient is the exact solve's, as the kernels' (implicit differentiation, not
    autograd through the iterations, whose derivative in the directions that break ``H_t``'s symmetry
    is not the solve's): ``x = x* + S(q − (H_t + Λ) x*)`` with ``x*`` the CG iterate (no graph) and
    ``S`` a map whose value is zero (so ``x`` is the iterate itself, step for step the kernel's) and
    whose backward is a CG solve of the output gradient (:class:`_ResidualSolve`): the residual
    carries every input's gradient, ``(H_t + Λ)^{-1}`` applied to it, and ``h_kk_init`` gets fla's
    ``−y xᵀ``.
    ``exact=True``: every ``H_t`` formed
    (``[B, H, T, K, K]``) and solved by ``torch.linalg.solve``, whose gradient is the exact one (the
    float64 oracle of the tests). The outputs are :func:`kernels.reference.chunk_scalar_ref` (gated
    linear attention) with the queries ``x``, keys ``beta·k`` and values ``v``. Inputs are validated
    by the caller (:func:`kernels.chunk_mesa_net`). Arithmetic in float32 (float64 for float64
    inputs); ``o`` in ``v``'s dtype, states in the arithmetic dtype.
    """
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    B, T, H, K = q.shape
    C = int(chunk_size)
    qc, kc = _mesa_chunks(q, C, acc), _mesa_chunks(k, C, acc)                         # [B, H, N, C, K]
    gc = _mesa_chunks(g.unsqueeze(-1), C, acc)[..., 0]                           # [B, H, N, C]
    bc = _mesa_chunks(beta.unsqueeze(-1), C, acc)[..., 0]
    N = qc.shape[2]
    b = gc.cumsum(-1)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    W = torch.exp(torch.where(causal, b[..., :, None] - b[..., None, :], float("-inf"))) * bc[..., None, :]
    to_end = kc * (bc * torch.exp(b[..., -1:] - b))[..., None]             # beta_j k_j decayed to the chunk's end
    Hc = h_kk_init.to(acc) if h_kk_init is not None else q.new_zeros(B, H, K, K, dtype=acc)
    Hs = []
    for n in range(N):                                                      # the states entering each chunk
        Hs.append(Hc)
        Hc = torch.exp(b[:, :, n, -1])[..., None, None] * Hc + to_end[:, :, n].transpose(-1, -2) @ kc[:, :, n]
    Hs = torch.stack(Hs, 2)                                                 # [B, H, N, K, K]
    eb = torch.exp(b)[..., None]
    lam = lamb.to(acc)[None, :, None, None, :]                             # [1, H, 1, 1, K]
    if exact:
        Ht = eb[..., None] * Hs[:, :, :, None] + torch.einsum("bhnij,bhnjk,bhnjl->bhnikl", W, kc, kc)
        x = torch.linalg.solve(Ht + torch.diag_embed(lam.expand(Ht.shape[:-1])), qc[..., None])[..., 0]
    else:
        def operator(eb, Hs, kc, W, lam):
            def apply_A(P):   # (H_t + Λ) p_t on rows: p_tᵀ H_tᵀ, H_t as a column operator (its gradient -y xᵀ)
                return (P * eb) @ Hs.transpose(-1, -2) + ((P @ kc.transpose(-1, -2)) * W) @ kc + lam * P
            return apply_A
        fixed = operator(*(t.detach() for t in (eb, Hs, kc, W, lam)))
        iters = int(max_CG_iteration)
        with torch.no_grad():
            x0 = _cg(fixed, qc.detach(), iters)
        x = x0 + _ResidualSolve.apply(qc - operator(eb, Hs, kc, W, lam)(x0), fixed, iters)
    x = x.movedim(1, 3).reshape(B, N * C, H, K)[:, :T]                     # back to [B, T, H, K]
    kb = k.to(acc) * beta.to(acc).unsqueeze(-1)
    o, Gc = chunk_scalar_ref(x, kb, v.to(acc), g.to(acc), None, 1.0, h_kv_init, output_final_state, C)
    if not output_final_state:
        return o.to(v.dtype), None, None
    return o.to(v.dtype), Hc, Gc


class _ResidualSolve(torch.autograd.Function):
    """``S(r)``: zero in the forward (the iterate ``x*`` stands as the solution); its backward is CG
    on the output gradient with the fixed (symmetric) operator, ``d r = (H + Λ)^{-1} d x``: the
    implicit derivative of the solve at ``x*``, as the kernels' backward."""

    @staticmethod
    def forward(ctx, r, apply_A, iterations):
        ctx.apply_A, ctx.iterations = apply_A, iterations
        return torch.zeros_like(r)

    @staticmethod
    def backward(ctx, dx):
        with torch.no_grad():
            return _cg(ctx.apply_A, dx, ctx.iterations), None, None


def _cg(apply_A, rhs, iterations: int):
    """CG from zero on the rows of ``rhs`` (``[..., K]``), ``iterations`` steps, in lockstep. A row
    stops (its step sizes become 0) once its squared residual falls below ``eps²`` times its
    right-hand side's (``eps`` the dtype's unit roundoff): past that point the steps are rounding
    noise, and their ratios of vanishing numbers would send ``inf``/NaN into autograd's gradient."""
    def dot(a, c):
        return (a * c).sum(-1, keepdim=True)

    def ratio(num, den, ok):      # num / den where ok, else 0 (and no 0/0 in the gradient)
        return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(num))

    x = torch.zeros_like(rhs)
    r = rhs
    p = r
    rr = dot(r, r)
    floor = rr.detach() * torch.finfo(rhs.dtype).eps ** 2
    for _ in range(iterations):
        Ap = apply_A(p)
        live = rr > floor
        pAp = dot(p, Ap)
        alpha = ratio(rr, pAp, live & (pAp > 0))
        x = x + alpha * p
        r = r - alpha * Ap
        rr_new = dot(r, r)
        p = r + ratio(rr_new, rr, live) * p
        rr = rr_new
    return x
