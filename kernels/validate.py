"""Input validation shared by every op of :mod:`kernels` (``ValueError`` naming the argument).

Every op checks its inputs here before it picks a backend, so the PyTorch path and the kernels
see one contract, on every device. The checks come in two kinds.

Structure, always: every tensor argument is a ``torch.Tensor`` (a required one passed as ``None``
is named with its expected shape), of fla's layout (``q, k`` ``[B, T, H, K]``, ``v``
``[B, T, H, V]``, gates and states of the stated shapes), on ``q``'s device, of a floating dtype
among float32/float16/bfloat16; Python arguments (``scale``, ``output_final_state``, ...) of the
right type and range. None of this reads a tensor's values, so none of it waits for the device.

Values, with ``check_values=True`` (every op's default), on every device: gates finite and in their
range (log decays ``g <= 0``, ``beta`` in its interval, MesaNet's ``lamb > 0``), PaTH's ``w``
finite, MesaNet's ``h_kk_init`` finite and symmetric. Reading values from a GPU costs a host
sync, so an op gathers all of its value checks in one :class:`ValueChecks`: one fused min/max
reduction per tensor (``torch.aminmax``; NaN propagates into both), stacked into one small tensor
on the inputs' device and read back with **one** host transfer (:func:`_to_host`) per op call;
the decisions and messages are then plain Python on those numbers. The same code runs on a CPU
and on a GPU: only where the small tensor lives differs. ``check_values=False`` skips the value
checks (never the structure checks); the benchmarks pass it, since fla checks no values.
"""
from __future__ import annotations

import math
import numbers
import textwrap

import torch

__all__ = ["check_tensor", "check_qkv", "check_gate_tensor", "check_beta_range", "check_state", "check_flag",
           "default_scale", "check_linear", "ValueChecks", "documents_checks", "QKV_CHECKED"]

#: The structure checks every attention op makes of its main inputs (:func:`check_qkv`).
QKV_CHECKED = ("``q, k`` ``[B, T, H, K]`` and ``v`` ``[B, T, H, V]``: tensors, non-empty, of one dtype "
               "among float32/float16/bfloat16, on one device")

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _shape(t) -> str:
    return "[" + ", ".join(str(s) for s in t) + "]"


def _got(x) -> str:
    """How a message names a non-tensor argument: ``None`` or its type."""
    return "None" if x is None else type(x).__name__


def _dtype_names(dtypes) -> str:
    names = [str(d).replace("torch.", "") for d in dtypes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def check_tensor(t, name: str, shape: tuple, like: torch.Tensor, *, names: str | None = None,
                 like_name: str = "q", dtypes=_FLOAT_DTYPES):
    """The structure of one tensor argument: a ``torch.Tensor`` of ``shape`` (``names`` spells it,
    as ``"[B, T, H]"``, in the message) on ``like``'s device, of one of ``dtypes`` (``None``: any)."""
    spec = f"{names} = {_shape(shape)}" if names else _shape(shape)
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape {spec}; got {_got(t)}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {spec}; got {_shape(t.shape)}")
    if t.device != like.device:
        raise ValueError(f"{name} must be on {like.device} like {like_name}; got {t.device}")
    if dtypes is not None and t.dtype not in dtypes:
        raise ValueError(f"{name} must be {_dtype_names(dtypes)}; got {t.dtype}")
    return t


def check_qkv(q, k, v, *, same_kv_dim: bool = False):
    """Validate fla-layout inputs: ``q, k`` ``[B, T, H, K]``, ``v`` ``[B, T, H, V]``.

    Same device, a floating dtype among float32/float16/bfloat16, and one dtype for all three.
    Returns ``(B, T, H, K, V)``.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor of shape [B, T, H, D]; got {_got(t)}")
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


def _to_host(stats: torch.Tensor) -> list:
    """The one device-to-host read of an op call's value checks (a sync on a GPU)."""
    return stats.tolist()


class ValueChecks:
    """The value checks of one op call, gathered and then run together.

    Each ``finite``/``bounds``/``symmetric`` call queues reductions (torch ops on the tensor's own
    device: nothing is read yet) and a rule over their results; :meth:`run` stacks every queued
    result into one float64 tensor (:meth:`stats`), reads it with one :func:`_to_host` and raises
    the ``ValueError`` of the first rule that fails, in the order the rules were added. A tensor's
    min and max come from one ``torch.aminmax`` shared by all of its rules. ``enabled=False``
    (an op's ``check_values=False``) queues nothing and reads nothing.
    """

    def __init__(self, enabled: bool = True):
        self.enabled = check_flag(enabled, "check_values")
        self._stats: list = []        # 0-d tensors on the inputs' device
        self._minmax: dict = {}       # id(tensor) -> (tensor, index of its min; max follows)
        self._rules: list = []        # (is_bad(values), message(values))

    def _push(self, *stats) -> int:
        i = len(self._stats)
        self._stats.extend(stats)
        return i

    def _minmax_of(self, t: torch.Tensor) -> int:
        held = self._minmax.get(id(t))
        if held is None:
            with torch.no_grad():
                lo, hi = torch.aminmax(t.detach())
            held = self._minmax[id(t)] = (t, self._push(lo, hi))
        return held[1]

    def finite(self, t: torch.Tensor, name: str):
        """No NaN or inf in ``t`` (NaN makes both extremes NaN; an inf is one of them)."""
        if self.enabled:
            i = self._minmax_of(t)
            self._rules.append((lambda s: not (math.isfinite(s[i]) and math.isfinite(s[i + 1])),
                                lambda s: f"{name} contains NaN or inf"))

    def bounds(self, t: torch.Tensor, text: str, *, lo=None, hi=None, lo_open: bool = False):
        """Every entry of ``t`` ``>= lo`` (``> lo`` with ``lo_open``) and ``<= hi``; the message is
        ``text`` and the extremes found."""
        if self.enabled:
            i = self._minmax_of(t)

            def bad(s):
                mn, mx = s[i], s[i + 1]
                low_ok = lo is None or (mn > lo if lo_open else mn >= lo)
                return not (low_ok and (hi is None or mx <= hi))
            self._rules.append((bad, lambda s: f"{text}; found min {s[i]:g}, max {s[i + 1]:g}"))

    def symmetric(self, t: torch.Tensor, name: str, *, rtol: float, atol: float):
        """``t`` equals its transpose in the last two axes to ``|t - tᵀ| <= atol·max(1, max|t|) +
        rtol·|tᵀ|`` (``torch.allclose``'s test with ``atol`` relative to the entries' size)."""
        if self.enabled:
            i = self._minmax_of(t)
            with torch.no_grad():
                d = t.detach()
                tt = d.transpose(-1, -2)
                j = self._push(((d - tt).abs() - rtol * tt.abs()).amax())

            def bad(s):
                size = max(1.0, abs(s[i]), abs(s[i + 1]))
                return not s[j] <= atol * size          # NaN fails too
            self._rules.append((bad, lambda s: f"{name} must be symmetric in its last two axes"))

    def stats(self) -> torch.Tensor | None:
        """Every queued reduction result, stacked into one float64 tensor on the inputs' device."""
        if not self._stats:
            return None
        return torch.stack([s.to(torch.float64) for s in self._stats])

    def run(self):
        """Read the queued results once and raise the first failing rule's ``ValueError``."""
        stats = self.stats()
        if stats is None or stats.device.type == "meta":      # meta tensors hold no values
            return
        if stats.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the value checks read the inputs back to the host, which a CUDA graph "
                               "capture cannot do: pass check_values=False to ops inside a capture")
        values = _to_host(stats)
        for is_bad, message in self._rules:
            if is_bad(values):
                raise ValueError(message(values))


def documents_checks(always: str, values: str | None):
    """Append to an op's docstring the paragraph that says exactly what it checks: ``always`` (the
    structure checks) and ``values`` (the value checks, ``None`` when the op has none)."""
    if values is None:
        tail = ("``check_values`` changes nothing here: no argument of this op has a restricted range "
                "of values.")
    else:
        tail = (f"With ``check_values=True`` (the default), on every device, also: {values}; one "
                "reduction per tensor and one host sync per call. ``check_values=False`` skips these "
                "value checks only (the benchmarks pass it: fla checks no values).")
    text = ("Checked (``ValueError`` naming the argument and the expected shape or range), the same on "
            f"every backend and device. Always: {always}. {tail}")
    para = textwrap.fill(text, width=96, initial_indent="    ", subsequent_indent="    ",
                         break_on_hyphens=False, break_long_words=False)

    def attach(fn):
        fn.__doc__ = fn.__doc__.rstrip() + "\n\n" + para + "\n    "
        return fn
    return attach


def check_gate_tensor(g, name: str, shape: tuple, like: torch.Tensor, *, checks: ValueChecks,
                      nonpositive: bool = False):
    """A gate (or any float tensor whose values matter): :func:`check_tensor`'s structure, then into
    ``checks`` its finiteness and, with ``nonpositive``, ``g <= 0`` (log decays)."""
    check_tensor(g, name, shape, like)
    checks.finite(g, name)
    if nonpositive:
        checks.bounds(g, f"{name} holds log decays and must be <= 0", hi=0.0)
    return g


def check_beta_range(beta, checks: ValueChecks, why: str):
    """``beta`` in ``[0, 2]`` elementwise (the delta rule's and PaTH's step sizes)."""
    checks.bounds(beta, f"beta must lie in [0, 2] elementwise ({why})", lo=0.0, hi=2.0)


def check_state(initial_state, B: int, H: int, K: int, V: int, like: torch.Tensor):
    """``initial_state`` is ``None`` or a ``[B, H, K, V]`` tensor on ``like``'s device."""
    if initial_state is not None:
        check_tensor(initial_state, "initial_state", (B, H, K, V), like, names="[B, H, K, V]", dtypes=None)
    return initial_state


def check_flag(value, name: str) -> bool:
    """A Python ``bool`` argument (``output_final_state``, ``causal``)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool (True or False); got {value!r}")
    return value


def default_scale(scale, K: int) -> float:
    """``scale``: ``None`` (``K ** -0.5``) or a positive finite real number."""
    if scale is None:
        return K ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) \
            or not (float(scale) > 0 and math.isfinite(float(scale))):
        raise ValueError(f"scale must be a positive finite number (or None for K ** -0.5); got {scale!r}")
    return float(scale)


def check_linear(q, k, v, scale, initial_state, output_final_state, *, g=None, g_shape=None, beta=None,
                 with_beta: bool = False, check_values: bool = True) -> float:
    """Validate the inputs of a linear-attention op; returns the scale.

    ``g_shape``: ``None`` (the op has no gate), ``"scalar"`` (``g`` ``[B, T, H]``) or ``"vector"``
    (``[B, T, H, K]``); with it ``g`` is required. ``with_beta``: the op has a required ``beta``
    ``[B, T, H]``. Structure always; with ``check_values``, ``g`` finite and ``<= 0``, ``beta``
    finite and in ``[0, 2]``, one host read for both.
    """
    B, T, H, K, V = check_qkv(q, k, v)
    scale = default_scale(scale, K)
    checks = ValueChecks(check_values)
    if g_shape is not None:
        shape, names = ((B, T, H), "[B, T, H]") if g_shape == "scalar" else ((B, T, H, K), "[B, T, H, K]")
        check_gate_tensor(g, "g", shape, q, nonpositive=True, checks=checks)
    if with_beta:
        check_gate_tensor(beta, "beta", (B, T, H), q, checks=checks)
        check_beta_range(beta, checks, "2 allows negative eigenvalues")
    check_state(initial_state, B, H, K, V, q)
    check_flag(output_final_state, "output_final_state")
    checks.run()
    return scale
