"""Packed sequences of different lengths (fla's ``cu_seqlens``) on every op.

fla's ops take ``cu_seqlens``: the inputs hold ``N`` sequences packed along time, ``q`` ``[1, T,
H, K]``, sequence ``n`` at positions ``cu_seqlens[n] .. cu_seqlens[n+1] - 1``, each with its own
initial and final state (``[N, ...]``). Our kernels run a batch of equal lengths. :func:`varlen`
gives an op the argument all the same, without touching a kernel:

1. **group** the sequences by length (:func:`length_groups`): each group holds the sequences whose
   lengths lie within a factor of two of its longest (all those of at most one chunk, 64 tokens,
   together), so padding at most doubles the tokens a group runs and a sequence of 32K tokens and
   one of 100 never share a row;
2. **pad** each group into a batch ``[n, T_group, ...]``, the sequences from position 0, the tail
   filled with zeros (:func:`gather_padded`), and its states ``[n, ...]`` taken from the inputs';
3. **run** the op on the batch, which is what the op already does correctly;
4. **unpad**: the outputs of the real positions go back to their packed places
   (:func:`scatter_packed`), the final states to their sequences' rows.

Why zeros in the tail are safe: the ops are causal, so a padded position never reaches an earlier
one; the output of a padded position is dropped. The final state sees the tail, and there a zero
key (``k``, and ``w`` for PaTH, whose ``β = 0`` there too) writes nothing and a zero log gate
decays nothing, so every state leaves the tail as it entered it: linear attention and its gated
forms, the delta rule and its relatives, MesaNet's ``H`` and ``G``. The convolution's state is
its last ``W`` inputs, which the tail would overwrite, so the convolution takes its final state
from the real inputs instead (:func:`last_inputs`, through the op's ``final_state`` hook). A
zero query with a zero key also keeps MesaNet's solve finite (a zero right-hand side stops
conjugate gradients at once) and softmax attention's rows finite.

Gradients flow through the gathers and the scatter (autograd), so the padded entries'
gradients are simply dropped. The cost is the padding (at most twice a group's tokens, plus up to
one chunk a sequence) and one launch of the op per group; a kernel that reads the offsets itself,
as fla's do, would save both (not built).
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Callable

import torch

__all__ = ["check_cu_seqlens", "host_offsets", "length_groups", "gather_padded", "scatter_packed", "last_inputs",
           "VarlenSpec", "varlen", "SHORT"]

SHORT = 64   #: sequences of at most this many tokens (one chunk of the chunked kernels) share a group


def check_cu_seqlens(cu_seqlens, T: int) -> list[int]:
    """The offsets of ``cu_seqlens`` as host integers, after a ``ValueError`` naming ``cu_seqlens``
    unless it is a 1-D integer tensor of ``N + 1 >= 2`` non-decreasing offsets from 0 to ``T``
    (the packed length). One host sync."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise ValueError(f"cu_seqlens must be a 1-D integer torch.Tensor of offsets [0, ..., T]; got "
                         f"{type(cu_seqlens).__name__}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D with N + 1 >= 2 offsets [0, ..., T]; got shape "
                         f"{list(cu_seqlens.shape)}")
    if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype.is_complex or cu_seqlens.dtype == torch.bool:
        raise ValueError(f"cu_seqlens must hold integers (int32 or int64, as fla's); got {cu_seqlens.dtype}")
    offs = [int(x) for x in cu_seqlens.tolist()]
    if offs[0] != 0 or offs[-1] != T:
        raise ValueError(f"cu_seqlens must run from 0 to the packed length T = {T}; got {offs[0]} .. {offs[-1]}")
    if any(b < a for a, b in zip(offs, offs[1:])):
        raise ValueError("cu_seqlens must be non-decreasing (sequence n spans cu_seqlens[n] .. "
                         "cu_seqlens[n+1] - 1)")
    return offs


def length_groups(lengths, short: int = SHORT) -> list[list[int]]:
    """The sequences (indices into ``lengths``) in groups that run as one batch: longest first,
    each group every remaining sequence longer than half its longest, and all those of at most
    ``short`` tokens in one group. So a group's padded tokens are under twice its real ones (or
    ``short`` a sequence), and there are at most ``log2(max / short) + 2`` groups."""
    order = sorted(range(len(lengths)), key=lambda n: -lengths[n])
    groups, i = [], 0
    while i < len(order):
        top = lengths[order[i]]
        j = i + 1
        while j < len(order) and (lengths[order[j]] * 2 > top or top <= short):
            j += 1
        groups.append(order[i:j])
        i = j
    return groups


def _positions(starts, lens, T_pad: int, device):
    """``(pos, valid)``: ``[n, T_pad]`` packed positions of each group row, and which are real."""
    starts = torch.tensor(starts, device=device, dtype=torch.long)
    lens = torch.tensor(lens, device=device, dtype=torch.long)
    t = torch.arange(T_pad, device=device)
    return starts[:, None] + t, t < lens[:, None]


def gather_padded(x: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``x`` ``[1, T, ...]`` (packed) to ``[n, T_pad, ...]``: row ``r`` holds ``x[0, pos[r]]`` where
    ``valid[r]``, zeros after (differentiable)."""
    flat = pos.clamp(max=x.shape[1] - 1).reshape(-1)
    out = x[0].index_select(0, flat).reshape(*pos.shape, *x.shape[2:])
    mask = valid.reshape(*valid.shape, *([1] * (x.dim() - 2)))
    return torch.where(mask, out, torch.zeros((), dtype=x.dtype, device=x.device))


def scatter_packed(pieces, places, T: int) -> torch.Tensor:
    """The inverse of the gathers: ``pieces`` (each ``[m_i, ...]``, the real rows of one group) and
    ``places`` (each ``[m_i]``, their packed positions, together every position ``0 .. T-1`` once)
    to ``[1, T, ...]`` (differentiable)."""
    cat, where = torch.cat(pieces), torch.cat(places)
    inverse = torch.empty_like(where)
    inverse[where] = torch.arange(T, device=where.device)
    return cat.index_select(0, inverse).unsqueeze(0)


def last_inputs(x_pad: torch.Tensor, lens, width: int, initial_state=None) -> torch.Tensor:
    """The convolution's final state of each row of ``x_pad`` ``[n, T_pad, D]`` whose first
    ``lens[r]`` positions are real: the last ``width`` inputs of ``concat(initial_state, x)``
    along time, ``[n, D, width]`` (``initial_state`` ``[n, D, width]``, zeros without one)."""
    from ..reference import past_and_inputs      # concat(state, x), the reference's own
    n, _, D = x_pad.shape
    past = initial_state if initial_state is not None else x_pad.new_zeros(n, D, width)
    seq = past_and_inputs(x_pad, past, x_pad.dtype)
    idx = torch.tensor(lens, device=x_pad.device, dtype=torch.long)[:, None] + torch.arange(width, device=x_pad.device)
    return seq.gather(1, idx[:, :, None].expand(n, width, D)).transpose(1, 2)


@dataclass(frozen=True)
class VarlenSpec:
    """How one op meets :func:`varlen`: ``tokens``, its arguments laid out ``[B, T, ...]`` (padded
    with zeros); ``states``, its per-sequence arguments ``[B, ...]`` (``N`` rows with
    ``cu_seqlens``); ``returns``, what each output is: ``"tokens"`` (``[B, T, ...]``), ``"state"``
    (``[B, ...]``, or ``None``), or the op returns one tensor when ``returns`` is ``"tokens"``
    alone (a string); ``final_state`` (optional): ``(padded call arguments, lengths) -> state``
    for the output at that index, for a state the padding would change (the convolution's);
    ``check`` (optional): ``arguments -> None``, a ``ValueError`` for calls that packing cannot
    serve (attention that is not causal sees the padding)."""

    tokens: tuple
    states: tuple = ()
    returns: tuple | str = ("tokens", "state")
    final_state: dict = field(default_factory=dict)
    check: Callable | None = None


def varlen(spec: VarlenSpec):
    """Give an op fla's keyword ``cu_seqlens`` (see the module docstring): ``None`` (the default)
    calls the op unchanged; offsets ``[0, ..., T]`` run its ``N`` packed sequences of ``[1, T, ...]``
    inputs, each from its own row of the ``[N, ...]`` states, and return ``[1, T, ...]`` outputs
    and ``[N, ...]`` final states."""

    def wrap(op: Callable):
        sig = inspect.signature(op)

        @functools.wraps(op)
        def call(*args, cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
            if cu_seqlens is None and cu_seqlens_cpu is None:
                return op(*args, **kwargs)
            bound = sig.bind(*args, **kwargs)
            return _run_packed(op, spec, bound.arguments, cu_seqlens, cu_seqlens_cpu)

        params = list(sig.parameters.values())
        params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None)
                   for n in ("cu_seqlens", "cu_seqlens_cpu")]
        call.__signature__ = sig.replace(parameters=params)
        call.__doc__ = (call.__doc__ or "").rstrip() + (
            "\n\n    ``cu_seqlens`` (keyword, as fla's): ``None``, or the offsets ``[0, ..., T]`` of ``N`` "
            "sequences packed\n    along ``T`` (inputs ``[1, T, ...]``, states ``[N, ...]``; "
            ":mod:`kernels.common.varlen`);\n    ``cu_seqlens_cpu``, fla's host copy of them, "
            "is taken too (checked equal).\n    ")
        call.varlen_spec = spec
        return call
    return wrap


def host_offsets(cu_seqlens, cu_seqlens_cpu, T: int) -> list[int]:
    """The offsets as host integers from ``cu_seqlens``, fla's host copy ``cu_seqlens_cpu``, or both
    (then a ``ValueError`` unless they agree: a stale copy would put every output in the wrong place)."""
    if cu_seqlens is None:
        return check_cu_seqlens(cu_seqlens_cpu, T)
    offs = check_cu_seqlens(cu_seqlens, T)
    if cu_seqlens_cpu is not None and check_cu_seqlens(cu_seqlens_cpu, T) != offs:
        raise ValueError("cu_seqlens_cpu must hold the same offsets as cu_seqlens (it is fla's host copy of them)")
    return offs


def _run_packed(op, spec: VarlenSpec, arguments: dict, cu_seqlens, cu_seqlens_cpu=None):
    if spec.check is not None:
        spec.check(arguments)
    first = spec.tokens[0]
    x0 = arguments.get(first)
    if not isinstance(x0, torch.Tensor) or x0.dim() < 2:
        raise ValueError(f"{first} must be a tensor [1, T, ...] of packed sequences when cu_seqlens is given; "
                         f"got {type(x0).__name__ if not isinstance(x0, torch.Tensor) else list(x0.shape)}")
    T = x0.shape[1]
    for name in spec.tokens:
        t = arguments.get(name)
        if t is None or not isinstance(t, torch.Tensor):
            continue
        if t.dim() < 2 or t.shape[0] != 1 or t.shape[1] != T:
            raise ValueError(f"with cu_seqlens, {name} must be [1, T, ...] (the sequences packed along T = {T}); "
                             f"got {list(t.shape)}")
    offs = host_offsets(cu_seqlens, cu_seqlens_cpu, T)
    N = len(offs) - 1
    for name in spec.states:
        s = arguments.get(name)
        if isinstance(s, torch.Tensor) and (s.dim() < 1 or s.shape[0] != N):
            raise ValueError(f"with cu_seqlens, {name} must have one row per sequence: [N, ...] with N = "
                             f"len(cu_seqlens) - 1 = {N}; got {list(s.shape)}")
    if N == 1:                      # one sequence: the op as it is
        return op(**arguments)
    lens = [b - a for a, b in zip(offs, offs[1:])]
    single = isinstance(spec.returns, str)
    kinds = (spec.returns,) if single else spec.returns
    tokens_out = {i: ([], []) for i, k in enumerate(kinds) if k == "tokens"}
    states_out = {i: [] for i, k in enumerate(kinds) if k == "state"}
    seq_order = []
    device = x0.device
    for group in length_groups(lens):
        glens = [lens[n] for n in group]
        pos, valid = _positions([offs[n] for n in group], glens, max(max(glens), 1), device)
        call = dict(arguments)
        for name in spec.tokens:
            if isinstance(call.get(name), torch.Tensor):
                call[name] = gather_padded(call[name], pos, valid)
        rows = torch.tensor(group, device=device)
        for name in spec.states:
            if isinstance(call.get(name), torch.Tensor):
                call[name] = call[name].index_select(0, rows.to(call[name].device))
        out = op(**call)
        out = (out,) if single else tuple(out)
        for i, (pieces, places) in tokens_out.items():
            pieces.append(out[i][valid])
            places.append(pos[valid])
        for i, got in states_out.items():
            hook = spec.final_state.get(i)
            got.append(hook(call, glens) if hook is not None and out[i] is not None else out[i])
        seq_order.extend(group)
    result = []
    inverse = torch.empty(N, dtype=torch.long)
    inverse[torch.tensor(seq_order)] = torch.arange(N)
    for i, kind in enumerate(kinds):
        if kind == "tokens":
            result.append(scatter_packed(*tokens_out[i], T))
        elif any(s is None for s in states_out[i]):
            result.append(None)
        else:
            result.append(torch.cat(states_out[i]).index_select(0, inverse.to(states_out[i][0].device)))
    return result[0] if single else tuple(result)
