"""``causal_conv1d``: the short causal depthwise convolution of Chapter 11 (fla's argument order).

Read top to bottom: check the inputs, pick the backend, plan the launches, then the stages.

1. the forward (:func:`kernels.conv.forward.conv_forward`): ``y = act(conv(x) + bias) + residual``,
   one program per tile of tokens × channels, the state standing in for the inputs before the
   first token;
2. the final state (:func:`kernels.conv.forward.final_state`), when asked for: the last ``W`` rows
   of ``concat(initial_state, x)`` along time.

The gradients (:mod:`kernels.conv.backward`) recompute ``z`` and the activation's derivative: ``dx``
by the transposed convolution, ``dweight`` and ``dbias`` as per-program partial sums reduced in a
fixed order, the initial state's by a small kernel of its own, ``dresidual = dy``.

The state convention (fla's): ``initial_state[b, :, i]``, ``i < W``, is the input ``W - i`` tokens
before the first, so slot ``W - 1`` is the newest; the convolution of token ``t < W - 1`` reads slots
``W + t - j`` for its lags ``j > t`` (slot 0 is never read: it is kept only so that the state is the
last ``W`` inputs). A decoder that feeds a sequence in pieces passes each piece's final state to the
next and gets the outputs of one run.
"""
from __future__ import annotations

import torch

from ..backend import check_dtypes, device_caps, resolve_backend
from ..validate import _got, _shape, check_flag, check_tensor, documents_checks
from .backward import conv_backward, state_grad
from .forward import ACTIVATION_CODES, conv_forward, final_state
from ..reference import causal_conv1d_ref
from .plan import MAX_WIDTH, plan_for
from ..common.varlen import VarlenSpec, last_inputs, varlen

__all__ = ["causal_conv1d", "causal_conv1d_triton", "check_conv_inputs"]

_FLOAT = (torch.float32, torch.float16, torch.bfloat16)


def check_conv_inputs(x, weight, bias, residual, initial_state, output_final_state, activation):
    """``ValueError`` naming the argument unless: ``x`` ``[B, T, D]`` (non-empty), ``weight``
    ``[D, W]`` with ``1 <= W <= MAX_WIDTH``, ``bias`` ``[D]``, ``residual`` ``[B, T, D]``,
    ``initial_state`` ``[B, D, W]`` (each optional but ``x`` and ``weight``), float32/float16/bfloat16
    on one device; ``activation`` ``None``, ``"silu"`` or ``"swish"``; ``output_final_state`` a bool.
    Returns ``(B, T, D, W)``."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor of shape [B, T, D]; got {_got(x)}")
    if x.dim() != 3 or x.numel() == 0:
        raise ValueError(f"x must have shape [B, T, D] (3-D, non-empty); got {_shape(x.shape)}")
    if x.dtype not in _FLOAT:
        raise ValueError(f"x must be float32, float16 or bfloat16; got {x.dtype}")
    B, T, D = x.shape
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[0] != D:
        got = _shape(weight.shape) if isinstance(weight, torch.Tensor) else _got(weight)
        raise ValueError(f"weight must have shape [D, W] = [{D}, W] (fla's layout: weight[:, -1] multiplies the "
                         f"current token); got {got}")
    W = weight.shape[1]
    if not 1 <= W <= MAX_WIDTH:
        raise ValueError(f"weight's width W (its last axis) must be in [1, {MAX_WIDTH}]; got {W}")
    check_tensor(weight, "weight", (D, W), x, names="[D, W]", like_name="x")
    if bias is not None:
        check_tensor(bias, "bias", (D,), x, names="[D]", like_name="x")
    if residual is not None:
        check_tensor(residual, "residual", (B, T, D), x, names="[B, T, D]", like_name="x")
    if initial_state is not None:
        check_tensor(initial_state, "initial_state", (B, D, W), x, names="[B, D, W]", like_name="x")
    if not (activation is None or isinstance(activation, str)) or activation not in ACTIVATION_CODES:
        raise ValueError(f"activation must be None, 'silu' or 'swish'; got {activation!r}")
    check_flag(output_final_state, "output_final_state")
    return B, T, D, W


def _packed_final_state(call, lens):
    """The final states of a padded batch of packed sequences: the last ``W`` real inputs of each
    (the padding would have pushed them out of the kernel's)."""
    return last_inputs(call["x"], lens, call["weight"].shape[1], call.get("initial_state"))


@varlen(VarlenSpec(tokens=("x", "residual"), states=("initial_state",), final_state={1: _packed_final_state}))
@documents_checks(f"``x`` ``[B, T, D]`` (non-empty) and ``weight`` ``[D, W]`` with ``1 <= W <= {MAX_WIDTH}`` (both "
                  "required), ``bias`` ``None`` or ``[D]``, ``residual`` ``None`` or ``[B, T, D]``, "
                  "``initial_state`` ``None`` or ``[B, D, W]``: float32/float16/bfloat16 tensors on one "
                  "device; ``activation`` ``None``, ``'silu'`` or ``'swish'``; ``output_final_state`` a bool",
                  None)
def causal_conv1d(x, weight, bias=None, residual=None, initial_state=None, output_final_state=False,
                  activation=None, backend=None, *, check_values=True):
    """The causal depthwise convolution of fla's ``causal_conv1d`` (Canon form with ``residual``):

        y_t = act(sum_{j<W} weight[:, W-1-j] ⊙ x_{t-j} + bias) + residual_t,

    ``x_{t-j}`` for ``t < j`` read from ``initial_state`` (slot ``W + t - j``; zeros without one).
    ``x``: ``[B, T, D]`` (any strides); ``weight``: ``[D, W]``, ``W`` in 1..8, ``weight[:, -1]`` the
    current token's tap (``lattn_core.conv_weight_to_fla`` converts from the book's ``(w, d)``);
    ``bias``: ``[D]``; ``residual``: ``[B, T, D]``, added after the activation; ``initial_state``:
    ``[B, D, W]``, slot ``W - 1`` the newest past input; ``activation``: ``None`` or ``"silu"``
    (``"swish"``). Returns ``(y, final_state)``: ``y`` ``[B, T, D]`` in ``x``'s dtype; the final
    state, with ``output_final_state``, the last ``W`` inputs of ``concat(initial_state, x)`` as
    ``[B, D, W]`` in ``x``'s dtype (exact for any ``T``, also ``T < W - 1``), else ``None``.
    Differentiable in ``x``, ``weight``, ``bias``, ``residual`` and ``initial_state``.
    """
    check_conv_inputs(x, weight, bias, residual, initial_state, output_final_state, activation)
    check_flag(check_values, "check_values")     # no values to check (no argument has a restricted range)
    if resolve_backend(backend, x) == "torch":
        return causal_conv1d_ref(x, weight, bias, residual, initial_state, output_final_state, activation)
    return causal_conv1d_triton(x, weight, bias, residual, initial_state, output_final_state, activation)


def _unit_channel_stride(t):
    """``t`` itself when its channels are contiguous (any batch and time strides), else a copy."""
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


class CausalConv1dFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, residual, initial_state, output_final_state, activation, plan):
        ctx.set_materialize_grads(False)
        y = conv_forward(x, weight, bias, residual, initial_state, activation, plan)
        ht = final_state(x, initial_state, weight.shape[1], plan) if output_final_state else None
        ctx.save_for_backward(x, weight, bias, initial_state)
        ctx.activation, ctx.plan = activation, plan
        ctx.residual_dtype = residual.dtype if residual is not None else None
        return y, ht

    @staticmethod
    def backward(ctx, dy, dht):
        x, weight, bias, state = ctx.saved_tensors
        plan, act = ctx.plan, ctx.activation
        need = ctx.needs_input_grad
        dy = torch.zeros_like(x) if dy is None else _unit_channel_stride(dy)   # only the final state was used
        dht = dht.contiguous() if dht is not None else None
        dx, dw, db = conv_backward(x, weight, bias, state, dy, dht, act, plan, need_dw=need[1],
                                   need_db=bias is not None and need[2])
        ds = state_grad(x, weight, bias, state, dy, dht, act, plan) if state is not None and need[4] else None
        dr = dy.to(ctx.residual_dtype) if ctx.residual_dtype is not None and need[3] else None
        return dx, dw, db, dr, ds, None, None, None


def causal_conv1d_triton(x, weight, bias=None, residual=None, initial_state=None, output_final_state=False,
                         activation=None, *, plan=None, caps=None):
    """The Triton path, inputs already validated except the dtypes the GPU class can run (``caps``,
    default the inputs' device's). ``plan``: a :class:`~kernels.conv.plan.ConvPlan`, or a dict of
    overrides of the default plan (the tests cross tile borders this way)."""
    caps = caps if caps is not None else device_caps(x.device)
    check_dtypes(caps, x.device, x=x, weight=weight, bias=bias, residual=residual, initial_state=initial_state)
    B, T, D = x.shape
    if plan is None or isinstance(plan, dict):
        plan = plan_for(x.dtype, x.device, B=B, T=T, D=D, W=weight.shape[1], caps=caps, **(plan or {}))
    x, residual = _unit_channel_stride(x), _unit_channel_stride(residual)
    weight, bias = weight.contiguous(), bias.contiguous() if bias is not None else None
    initial_state = initial_state.contiguous() if initial_state is not None else None
    return CausalConv1dFunction.apply(x, weight, bias, residual, initial_state, bool(output_final_state),
                                      activation, plan)
