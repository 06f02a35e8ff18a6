"""Input validation shared by every op of :mod:`kernels` (``ValueError`` naming the argument).

Every op checks its inputs here before it picks a backend, so the CPU path and the kernels see
the same contract: fla's layout (``q, k`` ``[B, T, H, K]``, ``v`` ``[B, T, H, V]``), one device,
one floating dtype among float32/float16/bfloat16, gates and states of the stated shapes.
"""
from __future__ import annotations

import torch

__all__ = ["check_qkv", "check_gate_tensor", "check_state", "default_scale", "check_linear"]

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _shape(t) -> str:
    return "[" + ", ".join(str(s) for s in t) + "]"


def check_qkv(q, k, v, *, same_kv_dim: bool = False):
    """Validate fla-layout inputs: ``q, k`` ``[B, T, H, K]``, ``v`` ``[B, T, H, V]``.

    Same device, a floating dtype among float32/float16/bfloat16, and one dtype for all three.
    Returns ``(B, T, H, K, V)``.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor of shape [B, T, H, D]; got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape [B, T, H, D] (4-D); got {_shape(t.shape)}")
        if t.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be float32, float16 or bfloat16; got {t.dtype}")
        if t.numel() == 0:
            raise ValueError(f"{name} must be non-empty; got shape {_shape(t.shape)}")
    B, T, H, K = q.shape
    if tuple(k.shape) != (B, T, H, K):
        raise ValueError(f"k must have the shape of q, [B, T, H, K] = {_shape(q.shape)}; got {_shape(k.shape)}")
    if tuple(v.shape[:3]) != (B, T, H):
        raise ValueError(f"v must have shape [B, T, H, V] = [{B}, {T}, {H}, V]; got {_shape(v.shape)}")
    V = v.shape[3]
    if same_kv_dim and V != K:
        raise ValueError(f"v must have the head size of q and k (V = K = {K}); got V = {V}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device; got {q.device}, {k.device}, {v.device}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    return B, T, H, K, V


def check_gate_tensor(g, name: str, shape: tuple, like: torch.Tensor, *, nonpositive: bool = False,
                      check_values: bool = True):
    """Validate a gate tensor's shape/device/dtype; ``nonpositive`` checks log gates ``g <= 0``.

    The value check needs a device sync, so it runs only on CPU tensors or when ``check_values``.
    """
    if not isinstance(g, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape {_shape(shape)}; got {type(g).__name__}")
    if tuple(g.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {_shape(shape)}; got {_shape(g.shape)}")
    if g.device != like.device:
        raise ValueError(f"{name} must be on {like.device} like q; got {g.device}")
    if g.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name} must be float32, float16 or bfloat16; got {g.dtype}")
    if check_values and not g.is_cuda:
        if not torch.isfinite(g).all():
            raise ValueError(f"{name} contains NaN or inf")
        if nonpositive and (g > 0).any():
            raise ValueError(f"{name} holds log decays and must be <= 0; found max {g.max().item():g}")
    return g


def check_state(initial_state, B: int, H: int, K: int, V: int, like: torch.Tensor):
    """``initial_state`` is ``None`` or a ``[B, H, K, V]`` tensor on ``like``'s device."""
    if initial_state is None:
        return None
    if not isinstance(initial_state, torch.Tensor) or tuple(initial_state.shape) != (B, H, K, V):
        got = _shape(initial_state.shape) if isinstance(initial_state, torch.Tensor) else type(initial_state).__name__
        raise ValueError(f"initial_state must have shape [B, H, K, V] = [{B}, {H}, {K}, {V}]; got {got}")
    if initial_state.device != like.device:
        raise ValueError(f"initial_state must be on {like.device} like q; got {initial_state.device}")
    return initial_state


def default_scale(scale, K: int) -> float:
    if scale is None:
        return K ** -0.5
    scale = float(scale)
    if not (scale > 0 and scale < float("inf")):
        raise ValueError(f"scale must be a positive finite number; got {scale!r}")
    return scale


def check_linear(q, k, v, scale, initial_state, g=None, g_shape: str = "scalar", beta=None) -> float:
    """Validate the inputs of a linear-attention op (gates, ``beta``, state); returns the scale."""
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
