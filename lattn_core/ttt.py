"""Test-time training (TTT): an optimizer run over the tokens is a recurrent network.

The state is the weight matrix ``S`` (``(d_v, d_k)``) of a model ``f(S; k) = S k``. Each token brings
a training pair ``(k_t, v_t)``; one step of gradient descent on a loss ``L(f(S; k_t), v_t)`` updates
the state, and the output is the updated model's prediction at the query::

    S_t = S_{t-1} - eta_t grad_S L(S_{t-1} k_t, v_t),        o_t = S_t q_t

The gradient is NOT written by hand here: :func:`ttt_recurrent` builds the loss as a PyTorch graph in
float64 and asks ``torch.autograd`` for it, and :func:`ttt_symbolic_step` asks SymPy to differentiate
the same loss on a symbolic state. Which recurrence comes out is then a checkable fact, not an
assumption. The named losses (``lam`` is an L2 weight, ``||.||_F`` the Frobenius norm):

==================== ================================================ ================================
``loss``             ``L(S; k, v)``                                   one SGD step gives
==================== ================================================ ================================
``"dot"``            ``-v . (S k)``                                   ``S + eta v k^T`` (linear attention)
``"dot+l2"``         ``-v . (S k) + lam/2 ||S||_F^2``                 ``(1 - eta lam) S + eta v k^T`` (decay)
``"squared"``        ``1/2 ||S k - v||^2``                            ``S + eta (v - S k) k^T`` (DeltaNet)
``"squared+frobenius"`` ``1/2 ||S k - v||^2 + lam/2 ||S||_F^2``      ``(1 - eta lam) S + eta (v - S k) k^T`` (Comba)
==================== ================================================ ================================

Two variants: momentum (as in Titans, ``Z_t = mu_t Z_{t-1} - eta_t grad``, ``S_t = S_{t-1} + Z_t``) and
mini-batch TTT (tokens in a block of ``batch_size`` all take their gradient at the state the block
started from, accumulating ``S_t = S_start - sum_{tau in block, tau <= t} eta_tau grad L_tau(S_start)``).

The model need not be linear. :func:`ttt_model_recurrent` runs the same loop for any differentiable
model ``f(S; k)`` whose weights ``S`` are a tuple of matrices, with the squared loss; :func:`ttt_mlp`
is the two-layer model ``f(S; k) = S2 tanh(S1 k)``, :func:`ttt_mlp_step` its gradient step written
by hand (the check on the autodiff), and :func:`ttt_nonlinear_regression` the in-context regression
of a nonlinear rule that shows what such a state can learn that no linear state can.
"""
from __future__ import annotations

import numbers

import numpy as np

from ._validate import as_array, check_gate, check_positive, check_qkv

__all__ = ["TTT_LOSSES", "ttt_loss", "ttt_recurrent", "ttt_symbolic_step", "ttt_regression_curve",
           "ttt_mlp", "ttt_mlp_init", "ttt_mlp_step", "ttt_model_recurrent", "ttt_nonlinear_regression",
           "affine_defect"]

TTT_LOSSES = ("dot", "dot+l2", "squared", "squared+frobenius")


class _TorchOps:
    @staticmethod
    def matvec(S, k):
        return S @ k

    @staticmethod
    def dot(a, b):
        return (a * b).sum()

    @staticmethod
    def frob2(S):
        return (S * S).sum()


class _SympyOps:
    @staticmethod
    def matvec(S, k):
        return S * k

    @staticmethod
    def dot(a, b):
        return (a.T * b)[0, 0]

    @staticmethod
    def frob2(S):
        return sum(e**2 for e in S)


def ttt_loss(loss: str, S, k, v, lam=0.0, *, ops=_TorchOps):
    """The named TTT loss ``L(S; k, v)`` for the linear model ``f(S; k) = S k`` (see the module table).

    Written once, for any array type that ``ops`` knows (PyTorch tensors by default; SymPy matrices
    with ``ops=_SympyOps``), so the autodiff and the symbolic derivations differentiate the same loss.

    Defined in Chapter 4 (Test-time training).
    """
    if loss not in TTT_LOSSES:
        raise ValueError(f"loss must be one of {TTT_LOSSES} or a callable; got {loss!r}")
    pred = ops.matvec(S, k)
    if loss.startswith("dot"):
        value = -ops.dot(v, pred)
    else:
        r = pred - v
        value = ops.dot(r, r) / 2
    if "+" in loss:
        value = value + lam / 2 * ops.frob2(S)
    return value


def _per_token(x, name, n, default, *, low=0.0, high=np.inf, low_inclusive=False, high_inclusive=False):
    """A scalar or an ``(n,)`` array in the given range, returned as ``(n,)`` float64."""
    if x is None:
        return np.full(n, float(default))
    arr = np.asarray(x, dtype=np.float64) if not isinstance(x, numbers.Number) else np.float64(x)
    if np.ndim(arr) == 0:
        arr = check_gate(arr, name, (), low=low, high=high, low_inclusive=low_inclusive,
                         high_inclusive=high_inclusive)
        return np.full(n, float(arr))
    return check_gate(arr, name, (n,), low=low, high=high, low_inclusive=low_inclusive,
                      high_inclusive=high_inclusive)


def ttt_recurrent(Q, K, V, loss="squared", eta=1.0, *, lam=0.0, momentum=0.0, batch_size: int = 1,
                  initial_state=None, return_state: bool = False, return_states: bool = False):
    """Run test-time training over the tokens and read each updated model at its query.

    ``Q, K``: ``(n, d_k)``; ``V``: ``(n, d_v)``. ``loss``: a name from :data:`TTT_LOSSES` or a callable
    ``loss(S, k, v) -> torch scalar`` (float64 tensors, ``S`` of shape ``(d_v, d_k)``). ``eta``
    (learning rate, positive) and ``lam`` (L2 weight, ``>= 0``; only for the ``+l2`` / ``+frobenius``
    losses) are scalars or ``(n,)`` arrays. ``momentum``: ``mu`` in ``[0, 1)``, scalar or ``(n,)``;
    with ``mu > 0``: ``Z_t = mu_t Z_{t-1} - eta_t grad``, ``S_t = S_{t-1} + Z_t`` (Titans' momentum).
    ``batch_size``: mini-batch TTT (gradients at the block-start state; 1 is plain online SGD; cannot
    be combined with momentum). ``initial_state``: ``(d_v, d_k)``, default zeros.

    The gradient of each step comes from ``torch.autograd`` in float64. Returns ``O`` ``(n, d_v)``;
    ``(O, S_n)`` with ``return_state=True``; ``(O, states)`` with ``return_states=True``, ``states``
    of shape ``(n, d_v, d_k)`` holding every ``S_t`` (the training trajectory).

    Defined in Chapter 4 (Test-time training).
    """
    import torch

    Q, K, V = check_qkv(Q, K, V)
    n, d_k = K.shape
    d_v = V.shape[1]
    if not callable(loss) and loss not in TTT_LOSSES:
        raise ValueError(f"loss must be one of {TTT_LOSSES} or a callable; got {loss!r}")
    eta = _per_token(eta, "eta", n, 1.0)
    lam = _per_token(lam, "lam", n, 0.0, low_inclusive=True)
    mu = _per_token(momentum, "momentum", n, 0.0, high=1.0, low_inclusive=True)
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer; got {batch_size!r}")
    if batch_size > 1 and np.any(mu > 0):
        raise ValueError("momentum and batch_size > 1 cannot be combined; use one of them")
    if isinstance(loss, str) and "+" not in loss and np.any(lam != 0):
        raise ValueError(f"lam is only used by the '+l2' / '+frobenius' losses; loss {loss!r} got lam != 0")
    S0 = np.zeros((d_v, d_k)) if initial_state is None else as_array(initial_state, "initial_state", (d_v, d_k))

    t64 = lambda x: torch.as_tensor(x, dtype=torch.float64)
    Kt, Vt = t64(K), t64(V)

    def grad_at(S, t):                   # the gradient of L_t at S, by autodiff
        Sg = S.detach().clone().requires_grad_(True)
        if callable(loss):
            value = loss(Sg, Kt[t], Vt[t])
        else:
            value = ttt_loss(loss, Sg, Kt[t], Vt[t], float(lam[t]))
        (g,) = torch.autograd.grad(value, Sg)
        return g

    S = t64(S0).clone()
    Z = torch.zeros_like(S)                          # the momentum buffer Z_t
    O = np.empty((n, d_v))
    states = np.empty((n, d_v, d_k)) if return_states else None
    start_state = S
    for t in range(n):
        if batch_size == 1:              # online SGD, with momentum if mu > 0
            step = -float(eta[t]) * grad_at(S, t)
            Z = float(mu[t]) * Z + step
            S = S + Z
        else:                            # mini-batch: gradients at the block start
            if t % batch_size == 0:
                start_state = S
            S = S - float(eta[t]) * grad_at(start_state, t)
        O[t] = S.numpy() @ Q[t]                      # o_t = S_t q_t
        if return_states:
            states[t] = S.numpy()
    if return_states:
        return O, states
    return (O, S.numpy().copy()) if return_state else O


def ttt_symbolic_step(loss: str, d_v: int = 2, d_k: int = 2):
    """One TTT step on a symbolic state, the gradient taken by SymPy.

    Returns ``(S_new, syms)`` where ``S_new = S - eta * dL/dS`` (a ``d_v x d_k`` SymPy matrix) and
    ``syms`` holds the symbols ``S`` (matrix), ``k``, ``v`` (column vectors), ``eta``, ``lam``.

    Defined in Chapter 4 (Test-time training).
    """
    import sympy as sp

    if loss not in TTT_LOSSES:
        raise ValueError(f"loss must be one of {TTT_LOSSES}; got {loss!r}")
    for name, d in (("d_v", d_v), ("d_k", d_k)):
        if isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1:
            raise ValueError(f"{name} must be a positive integer; got {d!r}")
    S = sp.Matrix(d_v, d_k, lambda i, j: sp.Symbol(f"s{i + 1}{j + 1}"))
    k = sp.Matrix(d_k, 1, lambda i, _: sp.Symbol(f"k{i + 1}"))
    v = sp.Matrix(d_v, 1, lambda i, _: sp.Symbol(f"v{i + 1}"))
    eta, lam = sp.symbols("eta lambda", positive=True)
    L = ttt_loss(loss, S, k, v, lam, ops=_SympyOps)
    grad = S.applyfunc(lambda s: sp.diff(L, s))
    return S - eta * grad, {"S": S, "k": k, "v": v, "eta": eta, "lam": lam, "loss": L}


def ttt_regression_curve(loss="squared", eta=1.0, *, lam=0.0, momentum=0.0, batch_size: int = 1, n: int = 200,
                         d_k: int = 16, d_v: int = 8, noise: float = 0.0, seed: int = 0) -> np.ndarray:
    """How well TTT compresses a stream generated by a hidden linear rule, step by step.

    Draws a rule ``W`` (``(d_v, d_k)``, entries ``N(0, 1/d_k)``), ``n`` unit keys and values
    ``v_t = W k_t + noise * N(0, 1)``, runs :func:`ttt_recurrent` with the given loss and settings, and
    returns the relative test error ``E ||(S_t - W) k||^2 / E ||W k||^2`` of every state ``S_t``
    over 256 fresh unit keys: an ``(n,)`` array (``inf`` where the state overflowed).

    Defined in Chapter 4 (Test-time training).
    """
    for name, x in (("n", n), ("d_k", d_k), ("d_v", d_v)):
        if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 1:
            raise ValueError(f"{name} must be a positive integer; got {x!r}")
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(d_v, d_k)) / np.sqrt(d_k)
    K = rng.normal(size=(n, d_k))
    K /= np.linalg.norm(K, axis=1, keepdims=True)
    V = K @ W.T + noise * rng.normal(size=(n, d_v))
    K_test = rng.normal(size=(256, d_k))
    K_test /= np.linalg.norm(K_test, axis=1, keepdims=True)
    _, states = ttt_recurrent(K, K, V, loss, eta, lam=lam, momentum=momentum, batch_size=batch_size,
                              return_states=True)
    with np.errstate(over="ignore", invalid="ignore"):
        err = np.einsum("tvk,mk->tmv", states - W, K_test)
        rel = (err ** 2).sum(-1).mean(-1) / ((K_test @ W.T) ** 2).sum(-1).mean()
    return np.where(np.isfinite(rel), rel, np.inf)


# ------------------------------------------------------------------ a model that is not linear

def _mlp_weights(S):
    """``S = (S1, S2)`` as float64 arrays ``(d_h, d_k)`` and ``(d_v, d_h)``, real and finite."""
    if isinstance(S, np.ndarray) or not isinstance(S, (tuple, list)) or len(S) != 2:
        raise ValueError(f"S must be a pair (S1, S2) of weight matrices (d_h, d_k) and (d_v, d_h); "
                         f"got {type(S).__name__}")
    S1 = as_array(S[0], "S1", ("d_h", "d_k"))
    return S1, as_array(S[1], "S2", ("d_v", S1.shape[0]))


def ttt_mlp(S, X):
    """The two-layer model ``f(S; x) = S2 tanh(S1 x)`` with weights ``S = (S1, S2)``.

    ``S1``: ``(d_h, d_k)``, ``S2``: ``(d_v, d_h)``; ``X``: one input ``(d_k,)`` or rows ``(m, d_k)``.
    Works on NumPy arrays (checked: real, finite, those shapes) and on PyTorch tensors (then it is
    differentiable, and unchecked: :func:`ttt_model_recurrent` calls it inside its autodiff loop on
    inputs it has checked).

    Defined in Chapter 4 (Test-time training).
    """
    if type(X).__module__.startswith("torch"):
        import torch
        S1, S2 = S
        return torch.tanh(X @ S1.T) @ S2.T
    S1, S2 = _mlp_weights(S)
    X = as_array(X, "X", (S1.shape[1],) if np.ndim(X) == 1 else ("m", S1.shape[1]))
    return np.tanh(X @ S1.T) @ S2.T


def ttt_mlp_init(d_k: int, d_v: int, d_h: int, *, scale: float = 1.0, seed: int = 0) -> tuple:
    """Initial weights of :func:`ttt_mlp`: ``S1`` with entries ``scale * N(0, 1)`` and ``S2 = 0``.

    The model starts by predicting zero; ``S1`` must not be zero too, or no gradient ever reaches it.

    Defined in Chapter 4 (Test-time training).
    """
    for name, x in (("d_k", d_k), ("d_v", d_v), ("d_h", d_h)):
        if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 1:
            raise ValueError(f"{name} must be a positive integer; got {x!r}")
    rng = np.random.default_rng(seed)
    return scale * rng.normal(size=(d_h, d_k)), np.zeros((d_v, d_h))


def ttt_mlp_step(S, k, v, eta: float) -> tuple:
    """One SGD step on ``1/2 ||f(S; k) - v||^2`` for :func:`ttt_mlp`, with the gradient by hand.

    With ``a = tanh(S1 k)`` and the error ``e = v - S2 a``::

        S2' = S2 + eta e a^T
        S1' = S1 + eta ((S2^T e) * (1 - a * a)) k^T      (* entrywise; S2 is the old one)

    Written independently of :func:`ttt_model_recurrent`, which asks autodiff for the same step.
    ``k``: ``(d_k,)``, ``v``: ``(d_v,)``, real and finite; ``eta > 0``.

    Defined in Chapter 4 (Test-time training).
    """
    S1, S2 = _mlp_weights(S)
    k, v = as_array(k, "k", (S1.shape[1],)), as_array(v, "v", (S2.shape[0],))
    eta = float(check_positive(eta, "eta", ()))
    a = np.tanh(S1 @ k)
    e = v - S2 @ a
    return S1 + eta * np.outer((S2.T @ e) * (1 - a * a), k), S2 + eta * np.outer(e, a)


def ttt_model_recurrent(Q, K, V, model, initial_state, eta=1.0, *, return_states: bool = False):
    """TTT with any differentiable model: the article's general recurrence, squared loss.

    ``S_t = S_{t-1} - eta_t grad_S 1/2 ||f(S_{t-1}; k_t) - v_t||^2``, ``o_t = f(S_t; q_t)``, where the
    weights ``S`` are a tuple of matrices (``initial_state``) and ``model(S, x)`` computes ``f(S; x)``
    for one input ``x`` ``(d_k,)`` from PyTorch tensors (e.g. :func:`ttt_mlp`). The gradient comes from
    ``torch.autograd`` in float64; nothing about the model is assumed (in particular not linearity).
    ``eta``: positive, scalar or ``(n,)``. Returns ``O`` ``(n, d_v)``; with ``return_states=True``
    ``(O, states)``, ``states`` a tuple holding, for each weight matrix, its value after every token
    (shape ``(n, *matrix.shape)``).

    Defined in Chapter 4 (Test-time training).
    """
    import torch

    Q, K, V = check_qkv(Q, K, V)
    n = K.shape[0]
    if not callable(model):
        raise ValueError(f"model must be a callable model(S, x); got {model!r}")
    if isinstance(initial_state, np.ndarray) or not isinstance(initial_state, (tuple, list)) \
            or not initial_state:
        raise ValueError("initial_state must be a non-empty tuple of weight matrices")
    S0 = [as_array(W, f"initial_state[{i}]", ("rows", "cols")) for i, W in enumerate(initial_state)]
    eta = _per_token(eta, "eta", n, 1.0)
    t64 = lambda x: torch.as_tensor(x, dtype=torch.float64)
    Qt, Kt, Vt = t64(Q), t64(K), t64(V)
    S = [t64(W).clone() for W in S0]
    out = model(tuple(S), Qt[0])
    if tuple(out.shape) != (V.shape[1],):
        raise ValueError(f"model(S, x) must return a vector of shape ({V.shape[1]},) (d_v); "
                         f"got shape {tuple(out.shape)}")
    O = np.empty((n, V.shape[1]))
    states = tuple(np.empty((n, *W.shape)) for W in S0) if return_states else None
    for t in range(n):
        Sg = [W.detach().clone().requires_grad_(True) for W in S]
        r = model(tuple(Sg), Kt[t]) - Vt[t]
        grads = torch.autograd.grad((r * r).sum() / 2, Sg)
        S = [W.detach() - float(eta[t]) * g for W, g in zip(Sg, grads)]
        with torch.no_grad():
            O[t] = model(tuple(S), Qt[t]).numpy()
        if return_states:
            for store, W in zip(states, S):
                store[t] = W.numpy()
    return (O, states) if return_states else O


def ttt_nonlinear_regression(n: int = 400, *, d_k: int = 2, d_v: int = 2, d_h: int = 16,
                             eta: float = 0.05, eta_linear: float = 0.5, rule_width: int = 8,
                             rule_scale: float = 4.0, n_test: int = 1024, seed: int = 0) -> dict:
    """In-context regression of a nonlinear rule, by a linear state and by a two-layer one.

    Draws a hidden rule ``v = R2 tanh(R1 k)`` (``R1`` ``(rule_width, d_k)`` with entries
    ``rule_scale * N(0, 1)``, ``R2`` ``(d_v, rule_width)`` with entries ``N(0, 1/rule_width)``), ``n``
    unit keys and their values, and runs two TTT layers over the pairs: the squared-loss linear one
    (DeltaNet, :func:`ttt_recurrent`, rate ``eta_linear``) and :func:`ttt_mlp` (``d_h`` hidden units,
    :func:`ttt_model_recurrent`, rate ``eta``, from :func:`ttt_mlp_init`). Returns ``{"linear": (n,),
    "mlp": (n,), "floor": float}``: the relative test error ``E ||f(S_t; k) - v||^2 / E ||v||^2`` of
    every state over ``n_test`` fresh unit keys, and the smallest error any linear state ``S k`` reaches
    on those keys (least squares), which no linear TTT can go below.

    Defined in Chapter 4 (Test-time training).
    """
    for name, x in (("n", n), ("d_k", d_k), ("d_v", d_v), ("d_h", d_h), ("rule_width", rule_width),
                    ("n_test", n_test)):
        if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 1:
            raise ValueError(f"{name} must be a positive integer; got {x!r}")
    rng = np.random.default_rng(seed)
    rule = (rule_scale * rng.normal(size=(rule_width, d_k)),
            rng.normal(size=(d_v, rule_width)) / np.sqrt(rule_width))

    def unit_keys(m):
        X = rng.normal(size=(m, d_k))
        return X / np.linalg.norm(X, axis=1, keepdims=True)

    K, K_test = unit_keys(n), unit_keys(n_test)
    V, V_test = ttt_mlp(rule, K), ttt_mlp(rule, K_test)
    scale = (V_test ** 2).sum(-1).mean()
    _, lin_states = ttt_recurrent(K, K, V, "squared", eta_linear, return_states=True)
    S_init = ttt_mlp_init(d_k, d_v, d_h, seed=seed + 1)
    _, (S1s, S2s) = ttt_model_recurrent(K, K, V, ttt_mlp, S_init, eta, return_states=True)
    with np.errstate(over="ignore", invalid="ignore"):
        lin = np.einsum("tvk,mk->tmv", lin_states, K_test) - V_test
        mlp = np.einsum("tvh,tmh->tmv", S2s, np.tanh(np.einsum("thk,mk->tmh", S1s, K_test))) - V_test
        curves = {name: (e ** 2).sum(-1).mean(-1) / scale for name, e in (("linear", lin), ("mlp", mlp))}
    best, *_ = np.linalg.lstsq(K_test, V_test, rcond=None)
    floor = float(((K_test @ best - V_test) ** 2).sum(-1).mean() / scale)
    return {**{k: np.where(np.isfinite(c), c, np.inf) for k, c in curves.items()}, "floor": floor}


def affine_defect(step, S_a, S_b, a: float = 2.0, b: float = -3.0) -> float:
    """How far a state update ``g = step`` is from affine (the definition of a *linear* RNN).

    An affine map satisfies ``g(a S_a + b S_b) = a g(S_a) + b g(S_b) + (1 - a - b) g(0)`` for all
    states and numbers ``a, b``; this returns the largest entry of the difference of the two sides
    (0 up to round-off for DeltaNet's update, not for a nonlinear model's). A state is an array or
    a tuple of arrays (the weights of a model with several matrices); ``step`` takes and returns
    states of that kind. States and ``a, b`` must be real and finite.

    Defined in Chapter 4 (Test-time training).
    """
    several = isinstance(S_a, (tuple, list))

    def states(S, name):
        parts = S if several else (S,)
        return [as_array(x, f"{name}[{i}]" if several else name, None) for i, x in enumerate(parts)]
    A, B = states(S_a, "S_a"), states(S_b, "S_b")
    if len(A) != len(B) or any(x.shape != y.shape for x, y in zip(A, B)):
        raise ValueError("S_a and S_b must be states of the same shapes")
    a, b = float(as_array(a, "a", ())), float(as_array(b, "b", ()))

    def g(Ws):
        out = step(tuple(Ws) if several else Ws[0])
        return [np.asarray(x, dtype=np.float64) for x in (out if several else (out,))]

    mixed = g([a * x + b * y for x, y in zip(A, B)])
    ga, gb, g0 = g(A), g(B), g([np.zeros_like(x) for x in A])
    return float(max(np.max(np.abs(m - (a * p + b * q + (1 - a - b) * r)))
                     for m, p, q, r in zip(mixed, ga, gb, g0)))
