"""Chapter 0 ("From RNNs to attention"), its small models: a linear RNN (sequential by definition)
and attention as a lookup.

``linear_rnn`` runs ``h_t = a h_{t-1} + b x_t`` token by token; ``linear_rnn_unrolled`` writes the same
states as one matrix product with the weights ``a^{t-j} b`` (what unrolling the recurrence gives);
``rnn_input_gradient`` measures, with torch autograd, how much ``h_T`` still depends on ``x_1``;
``attention_lookup`` retrieves values by similarity of one query to every key.
"""
from __future__ import annotations

import numpy as np

from ._validate import as_array, check_positive

__all__ = ["linear_rnn", "linear_rnn_unrolled", "rnn_input_gradient", "attention_lookup"]


def _check_scalar(x, name: str) -> float:
    arr = as_array(np.reshape(x, (1,)) if np.ndim(x) == 0 else x, name, (1,))
    return float(arr[0])


def linear_rnn(x, a, b=1.0, h0=None) -> np.ndarray:
    """States of ``h_t = a h_{t-1} + b x_t`` for ``t = 1..n`` (a loop: step ``t`` needs step ``t-1``).

    ``x``: ``(n, d)`` inputs; ``a``, ``b``: scalars; ``h0``: ``(d,)`` initial state (default zeros).
    Returns the ``(n, d)`` states ``h_1..h_n``.

    Defined in Chapter 0 (From RNNs to attention).
    """
    x = as_array(x, "x", ("n", "d"))
    a, b = _check_scalar(a, "a"), _check_scalar(b, "b")
    h = np.zeros(x.shape[1]) if h0 is None else as_array(h0, "h0", (x.shape[1],)).copy()
    out = np.empty_like(x)
    for t in range(x.shape[0]):      # token by token: step t needs h_{t-1}
        h = a * h + b * x[t]         # (ch0-linear-rnn)
        out[t] = h
    return out


def linear_rnn_unrolled(x, a, b=1.0, h0=None) -> np.ndarray:
    """The same states unrolled: ``h_t = a^t h_0 + sum_{j<=t} a^{t-j} b x_j``, one matrix product.

    The ``(n, n)`` weight matrix ``W_{tj} = a^{t-j} b`` (``j <= t``) mixes all inputs at once, which
    is what makes training parallel when the recurrence is linear.

    Defined in Chapter 0 (From RNNs to attention).
    """
    x = as_array(x, "x", ("n", "d"))
    a, b = _check_scalar(a, "a"), _check_scalar(b, "b")
    n = x.shape[0]
    t = np.arange(1, n + 1)
    expo = t[:, None] - t[None, :]        # t - j: the steps input j has travelled
    # W_tj = a^(t-j) b for j <= t, 0 above the diagonal (no input from the future)
    power = np.power(a, np.maximum(expo, 0).astype(float))
    W = np.where(expo >= 0, b * power, 0.0)
    out = W @ x                           # every h_t at once (ch0-unrolled)
    if h0 is not None:                    # plus a^t h_0
        h0 = as_array(h0, "h0", (x.shape[1],))
        out = out + np.power(a, t.astype(float))[:, None] * h0[None, :]
    return out


def rnn_input_gradient(a, T: int, b=1.0, nonlinearity: str = "linear") -> float:
    """``|∂h_T / ∂x_1|`` for the scalar RNN ``h_t = f(a h_{t-1} + b x_t)``, measured with autograd.

    ``nonlinearity`` is ``"linear"`` (``f`` = identity; the exact answer is ``|a^{T-1} b|``) or
    ``"tanh"``. Inputs are fixed (``x_t = 0.5``), so the measurement is deterministic.

    Defined in Chapter 0 (From RNNs to attention).
    """
    import torch
    a, b = _check_scalar(a, "a"), _check_scalar(b, "b")
    if isinstance(T, bool) or not isinstance(T, (int, np.integer)) or T < 1:
        raise ValueError(f"T must be a positive integer; got {T!r}")
    if nonlinearity not in ("linear", "tanh"):
        raise ValueError(f"nonlinearity must be 'linear' or 'tanh'; got {nonlinearity!r}")
    x = torch.full((int(T),), 0.5, dtype=torch.float64, requires_grad=True)
    h = torch.zeros((), dtype=torch.float64)
    for t in range(int(T)):              # (ch0-rnn): a chain of T steps
        h = a * h + b * x[t]
        if nonlinearity == "tanh":       # the classic RNN: tanh after each step
            h = torch.tanh(h)
    (g,) = torch.autograd.grad(h, x)     # back through the chain (ch0-chain)
    return float(abs(g[0]))              # |dh_T / dx_1|


def attention_lookup(q, K, V, temperature=1.0):
    """Soft key-value retrieval: weights ``softmax(K q / temperature)`` and the output ``weights @ V``.

    ``q``: ``(d_k,)``; ``K``: ``(m, d_k)``; ``V``: ``(m, d_v)``; a smaller ``temperature`` sharpens
    the weights towards the best-matching key. Returns ``(output (d_v,), weights (m,))``.

    Defined in Chapter 0 (From RNNs to attention).
    """
    K = as_array(K, "K", ("m", "d_k"))
    q = as_array(q, "q", (K.shape[1],))
    V = as_array(V, "V", (K.shape[0], "d_v"))
    tau = float(check_positive(np.reshape(temperature, (1,)), "temperature", (1,))[0])
    s = K @ q / tau             # one score q.k_j / kappa per key
    w = np.exp(s - s.max())     # minus the top score: no overflow, same weights
    w /= w.sum()                # the softmax: weights sum to one (ch0-lookup)
    return w @ V, w             # the weighted average of the values
