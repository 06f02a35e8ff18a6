"""The public ops of :mod:`kernels`: validation and backend dispatch, fla's names and layout.

Each op validates its inputs (``ValueError`` naming the argument and the expected shape), picks a
backend (see :mod:`kernels._common`) and runs either the Triton kernel (``kernels/triton_*.py``) or
the differentiable PyTorch implementation (:mod:`kernels.reference`).
"""
from __future__ import annotations

import torch

from . import reference
from ._common import check_gate_tensor, check_qkv, check_state, default_scale, resolve_backend

__all__ = ["flash_attention", "chunk_linear_attn", "chunk_simple_gla", "chunk_gla",
           "chunk_delta_rule", "chunk_gated_delta_rule"]


def _check_head_size(name: str, d: int, lo: int = 16, hi: int = 256):
    if d < lo or d > hi:
        raise ValueError(f"{name} must be between {lo} and {hi} for the Triton kernel; got {d}")


def flash_attention(q, k, v, scale=None, causal: bool = True, backend=None):
    """Softmax attention ``softmax(scale · q kᵀ + log M) v``; returns ``o`` (``[B, T, H, V]``).

    ``q, k``: ``[B, T, H, D]``; ``v``: ``[B, T, H, D]`` (same head size ``D``, 16 to 128 for the
    Triton kernel). ``scale`` defaults to ``D ** -0.5``.

    The Triton kernel is forward-only: its backward recomputes attention with PyTorch in float32
    (an O(T^2)-memory backward; a fused Triton backward is future work).
    """
    B, T, H, K, V = check_qkv(q, k, v, same_kv_dim=True)
    scale = default_scale(scale, K)
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False; got {causal!r}")
    if resolve_backend(backend, q) == "torch":
        return reference.attention_ref(q, k, v, scale, causal)
    if K not in (16, 32, 64, 128):
        raise ValueError(f"the head size D (last axis of q, k, v) must be one of 16, 32, 64, 128 for "
                         f"the Triton flash_attention kernel; got {K}")
    from .triton_flash import flash_attention_triton
    return flash_attention_triton(q, k, v, scale, causal)


def _prepare_linear(q, k, v, scale, initial_state, g=None, g_shape="scalar", beta=None):
    B, T, H, K, V = check_qkv(q, k, v)
    scale = default_scale(scale, K)
    if g is not None:
        shape = (B, T, H) if g_shape == "scalar" else (B, T, H, K)
        check_gate_tensor(g, "g", shape, q, nonpositive=True)
    if beta is not None:
        check_gate_tensor(beta, "beta", (B, T, H), q)
        if not beta.is_cuda and ((beta < 0) | (beta > 2)).any():
            raise ValueError("beta must lie in [0, 2] elementwise (2 allows negative eigenvalues)")
    check_state(initial_state, B, H, K, V, q)
    return scale


def chunk_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False, backend=None):
    """Causal linear attention ``S_t = S_{t-1} + k_t v_tᵀ``, ``o_t = scale · S_tᵀ q_t``.

    As ``fla.ops.linear_attn.chunk_linear_attn(..., normalize=False)``. Returns ``(o, final_state)``.
    """
    scale = _prepare_linear(q, k, v, scale, initial_state)
    if resolve_backend(backend, q) == "torch":
        return reference.chunk_scalar_ref(q, k, v, None, None, scale, initial_state, output_final_state)
    from .triton_gla import chunk_simple_gla_triton
    return chunk_simple_gla_triton(q, k, v, None, scale, initial_state, output_final_state)


def chunk_simple_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, backend=None):
    """Scalar-gated linear attention ``S_t = exp(g_t) S_{t-1} + k_t v_tᵀ`` (``g``: ``[B, T, H]``, ≤ 0)."""
    scale = _prepare_linear(q, k, v, scale, initial_state, g, "scalar")
    if resolve_backend(backend, q) == "torch":
        return reference.chunk_scalar_ref(q, k, v, g, None, scale, initial_state, output_final_state)
    from .triton_gla import chunk_simple_gla_triton
    return chunk_simple_gla_triton(q, k, v, g, scale, initial_state, output_final_state)


def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, backend=None):
    """Gated linear attention ``S_t = Diag(exp(g_t)) S_{t-1} + k_t v_tᵀ`` (``g``: ``[B, T, H, K]``, ≤ 0)."""
    scale = _prepare_linear(q, k, v, scale, initial_state, g, "vector")
    if resolve_backend(backend, q) == "torch":
        return reference.chunk_gla_ref(q, k, v, g, scale, initial_state, output_final_state)
    from .triton_gla import chunk_gla_triton
    return chunk_gla_triton(q, k, v, g, scale, initial_state, output_final_state)


def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False, backend=None):
    """DeltaNet ``S_t = S_{t-1} + β_t k_t (v_t − S_{t-1}ᵀ k_t)ᵀ`` (``beta``: ``[B, T, H]``).

    As in fla, ``k`` is used as given: L2-normalise it first for a contractive update.
    """
    scale = _prepare_linear(q, k, v, scale, initial_state, beta=beta)
    if resolve_backend(backend, q) == "torch":
        return reference.chunk_scalar_ref(q, k, v, None, beta, scale, initial_state, output_final_state)
    from .triton_delta import chunk_gated_delta_rule_triton
    return chunk_gated_delta_rule_triton(q, k, v, None, beta, scale, initial_state, output_final_state)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           backend=None):
    """Gated DeltaNet ``S_t = exp(g_t) S_{t-1}``, then the delta update with ``β_t`` (``g, beta``: ``[B, T, H]``)."""
    scale = _prepare_linear(q, k, v, scale, initial_state, g, "scalar", beta=beta)
    if resolve_backend(backend, q) == "torch":
        return reference.chunk_scalar_ref(q, k, v, g, beta, scale, initial_state, output_final_state)
    from .triton_delta import chunk_gated_delta_rule_triton
    return chunk_gated_delta_rule_triton(q, k, v, g, beta, scale, initial_state, output_final_state)
