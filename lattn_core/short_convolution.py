"""Short convolutions, and why linear attention puts one on its keys (Chapter 11).

A *short convolution* mixes every channel of a sequence with its own few previous values. For
``X`` of shape ``(n, d)`` (row ``t`` is token ``t``, 0-based here as everywhere in the package) and
``weight`` of shape ``(w, d)`` (``w`` taps, ``weight[0]`` for the current token)::

    y_t = sum_{i=0}^{w-1} weight[i] ⊙ x_{t-i},          x_t = 0 for t < 0,

causal and depthwise (each channel has its own ``w`` numbers and never sees another channel). The
models apply it to the projections of queries, keys and values, most often followed by SiLU
(``activation="silu"``). The forms, as for every model of the book:

- :func:`short_conv`, the definition: ``w`` shifted copies of ``X``, weighted and summed;
- :func:`short_conv_recurrent`: token by token with a cache of the last ``w - 1`` inputs, which is
  all a decoder keeps (the convolution's whole state; fla's ``causal_conv1d`` returns it as its
  final state);
- :func:`short_conv_parallel`, the matrix form: channel ``c`` is multiplied by the banded lower
  triangular Toeplitz matrix ``Psi_c = sum_i weight[i, c] J^i`` (:func:`conv_matrix`), ``J`` the
  down-shift (:func:`shift_matrix`);
- :func:`short_conv_chunkwise`: blocks of ``chunk_size`` tokens, each entered with the cache the
  previous block left;

and its backward in closed form, :func:`short_conv_grads` (the same taps run backwards in time for
the inputs, lagged products for the taps).

:func:`conv_weight_to_fla` and :func:`conv_weight_from_fla` convert to and from the layout of fla's
``causal_conv1d`` (``[d, w]``, the *last* column for the current token, as in
``torch.nn.functional.conv1d`` with left padding).

The chapter's argument, as functions it can execute:

- keys equal to values: :func:`tied_deltanet_state` is the closed form
  ``S_n = I - (I - b_1 k_1 k_1^T)(I - b_2 k_2 k_2^T)...(I - b_n k_n k_n^T)`` of DeltaNet's state when
  ``V = K`` (the identity minus Chapter 9's product of factors), and :func:`least_squares_state` the
  exact minimiser ``V^T K (K^T K + lam I)^{-1}`` of the test-time-training objective, which is
  ``I - lam (K^T K + lam I)^{-1}`` when ``V = K``; :func:`deltanet_states` runs the recurrence and
  :func:`identity_gap` measures how far a state is from (a multiple of) the identity;
  :func:`tied_state_curves` follows those gaps token by token;
- predicting the neighbour: :func:`readout` reads a state at every token and says which token of
  the sequence each reading resembles most (itself, or the one after it); :func:`context_recall`
  measures what a wider convolution adds, keys that carry the last two or three tokens.
"""
from __future__ import annotations

import numbers

import numpy as np

from ._validate import as_array, check_chunk_size, check_gate

__all__ = ["ACTIVATIONS", "silu", "short_conv", "short_conv_recurrent", "short_conv_parallel",
           "short_conv_chunkwise", "short_conv_grads", "shift_matrix", "conv_matrix", "conv_weight_to_fla",
           "conv_weight_from_fla", "shift_weight", "deltanet_states", "tied_deltanet_state",
           "least_squares_state", "identity_gap", "tied_state_curves", "readout", "lag_weights",
           "context_recall"]

ACTIVATIONS = (None, "silu", "swish")


# ---------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------
def _check_activation(activation):
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")
    return activation


def _conv_inputs(X, weight):
    X = as_array(X, "X", ("n", "d"))
    weight = as_array(weight, "weight", ("w", X.shape[1]))
    return X, weight


def _check_positive_int(x, name: str) -> int:
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 1:
        raise ValueError(f"{name} must be a positive integer; got {x!r}")
    return int(x)


def _check_state(state, w: int, d: int):
    """The cache of the last ``w - 1`` inputs, ``(w - 1, d)`` in time order (last row the newest);
    ``None`` means zeros (no token before the first)."""
    if state is None or w == 1:
        if state is not None and np.size(state) != 0:
            raise ValueError(f"initial_state must have shape (0, {d}) for a width-1 convolution; "
                             f"got shape {np.shape(state)}")
        return np.zeros((w - 1, d))
    return as_array(state, "initial_state", (w - 1, d))


# ---------------------------------------------------------------------------------------------
# the convolution, four ways
# ---------------------------------------------------------------------------------------------
def silu(x) -> np.ndarray:
    """``SiLU(x) = x · sigmoid(x)`` (also called swish) elementwise, float64, stable for large
    ``|x|``. ``x``: a real, finite, non-empty array of any shape.

    Defined in Chapter 11 (Short convolutions)."""
    x = as_array(x, "x", None)
    return x * np.where(x >= 0, 1.0 / (1.0 + np.exp(-np.abs(x))),
                        np.exp(-np.abs(x)) / (1.0 + np.exp(-np.abs(x))))


def _act(Y, activation):
    return silu(Y) if activation in ("silu", "swish") else Y


def short_conv(X, weight, *, activation=None) -> np.ndarray:
    """The causal depthwise convolution ``y_t = sum_{i<w} weight[i] ⊙ x_{t-i}`` (API.md), the
    definition: ``w`` copies of ``X``, copy ``i`` moved down by ``i`` rows (zeros before the first
    token), weighted channel by channel and summed.

    ``X``: ``(n, d)``; ``weight``: ``(w, d)``, ``weight[0]`` for the current token; ``activation``:
    ``None`` or ``"silu"`` (``"swish"``), applied after the sum as the models do. Returns ``(n, d)``.

    Defined in Chapter 11 (Short convolutions).
    """
    X, weight = _conv_inputs(X, weight)
    _check_activation(activation)
    n = X.shape[0]
    Y = np.zeros_like(X)
    for i in range(min(weight.shape[0], n)):
        Y[i:] += weight[i] * X[:n - i]
    return _act(Y, activation)


def short_conv_recurrent(X, weight, *, activation=None, initial_state=None, return_state: bool = False):
    """The decoding form: one token at a time, keeping only the last ``w - 1`` inputs.

    ``initial_state``: that cache, ``(w - 1, d)`` in time order (last row the newest), default
    zeros. Returns ``Y`` ``(n, d)``, or ``(Y, state)`` with ``return_state=True``: the cache after
    the last token, which continues the sequence exactly (:func:`short_conv_chunkwise` relies on it).

    Defined in Chapter 11 (Short convolutions).
    """
    X, weight = _conv_inputs(X, weight)
    _check_activation(activation)
    w, d = weight.shape
    cache = _check_state(initial_state, w, d).copy()       # x_{t-w+1}, ..., x_{t-1}
    Y = np.empty_like(X)
    for t in range(X.shape[0]):
        window = np.vstack([cache, X[t:t + 1]])           # x_{t-w+1}, ..., x_t
        Y[t] = np.sum(weight[::-1] * window, axis=0)      # weight[0] meets the newest row
        cache = window[1:]
    Y = _act(Y, activation)
    return (Y, cache) if return_state else Y


def short_conv_grads(X, weight, dY) -> tuple[np.ndarray, np.ndarray]:
    """The backward of :func:`short_conv` (no activation), in closed form: for an upstream
    gradient ``dY`` (``(n, d)``),

        dX_s = sum_i weight[i] ⊙ dY_{s+i}      (the same taps, run backwards in time: Psi_c^T),
        dW_i = sum_t dY_t ⊙ x_{t-i}            (each tap's gradient: a lagged product summed),

    with ``dY_t = 0`` for ``t >= n``. Returns ``(dX, dW)`` of the shapes of ``X`` and ``weight``:
    what a kernel's backward computes (checked against autograd in the tests).

    Defined in Chapter 11 (Short convolutions)."""
    X, weight = _conv_inputs(X, weight)
    dY = as_array(dY, "dY", X.shape)
    n = X.shape[0]
    dX = np.zeros_like(X)
    dW = np.zeros_like(weight)
    for i in range(min(weight.shape[0], n)):
        dX[:n - i] += weight[i] * dY[i:]
        dW[i] = np.sum(dY[i:] * X[:n - i], axis=0)
    return dX, dW


def shift_matrix(n: int, lag: int = 1) -> np.ndarray:
    """``J^lag``: the ``(n, n)`` matrix that moves a sequence down by ``lag`` rows (``(J x)_t =
    x_{t-1}``, a zero first row); ones on the ``lag``-th subdiagonal, ``J^0 = I``.

    Defined in Chapter 11 (Short convolutions)."""
    n = _check_positive_int(n, "n")
    if isinstance(lag, bool) or not isinstance(lag, numbers.Integral) or lag < 0:
        raise ValueError(f"lag must be a non-negative integer; got {lag!r}")
    return np.eye(n, k=-int(lag))


def conv_matrix(w, n: int) -> np.ndarray:
    """The ``(n, n)`` banded lower-triangular Toeplitz matrix ``Psi = sum_i w_i J^i`` of one
    channel's taps ``w`` (shape ``(taps,)``, ``w[0]`` for the current token): ``Psi[t, s] =
    w[t - s]`` when ``0 <= t - s < taps``, else 0.

    Defined in Chapter 11 (Short convolutions)."""
    w = as_array(w, "w", ("taps",))
    n = _check_positive_int(n, "n")
    return sum(w[i] * shift_matrix(n, i) for i in range(min(len(w), n)))


def short_conv_parallel(X, weight, *, activation=None) -> np.ndarray:
    """The matrix form: column ``c`` of ``Y`` is ``Psi_c`` times column ``c`` of ``X``, with
    ``Psi_c = conv_matrix(weight[:, c], n)`` (one ``n x n`` banded Toeplitz matrix per channel).

    Defined in Chapter 11 (Short convolutions)."""
    X, weight = _conv_inputs(X, weight)
    _check_activation(activation)
    n, d = X.shape
    Y = np.stack([conv_matrix(weight[:, c], n) @ X[:, c] for c in range(d)], axis=1)
    return _act(Y, activation)


def short_conv_chunkwise(X, weight, *, activation=None, chunk_size: int = 64) -> np.ndarray:
    """Blocks of ``chunk_size`` tokens (any positive int; need not divide ``n``): each block is
    convolved with the cache of ``w - 1`` inputs the block before it left (zeros for the first),
    as a long sequence is processed piece by piece.

    Defined in Chapter 11 (Short convolutions)."""
    X, weight = _conv_inputs(X, weight)
    _check_activation(activation)
    C = check_chunk_size(chunk_size)
    w, d = weight.shape
    state = np.zeros((w - 1, d))
    out = []
    for s in range(0, X.shape[0], C):
        Y, state = short_conv_recurrent(X[s:s + C], weight, initial_state=state, return_state=True)
        out.append(Y)
    return _act(np.vstack(out), activation)


def conv_weight_to_fla(weight) -> np.ndarray:
    """``(w, d)`` with ``weight[0]`` for the current token → fla's ``causal_conv1d`` layout
    ``(d, w)`` with the last column for the current token (``torch.nn.functional.conv1d`` with
    ``w - 1`` zeros of left padding and ``groups=d``).

    Defined in Chapter 11 (Short convolutions)."""
    weight = as_array(weight, "weight", ("w", "d"))
    return weight[::-1].T.copy()


def conv_weight_from_fla(weight) -> np.ndarray:
    """The inverse of :func:`conv_weight_to_fla`: ``(d, w)``, last column current → ``(w, d)``.

    Defined in Chapter 11 (Short convolutions)."""
    weight = as_array(weight, "weight", ("d", "w"))
    return weight.T[::-1].copy()


def shift_weight(d: int, lag: int = 1, width: int | None = None) -> np.ndarray:
    """The weight of a pure shift by ``lag`` tokens in every channel: ``(width, d)`` (default
    ``width = lag + 1``), one in row ``lag``, zeros elsewhere. With ``lag = 1`` the convolution
    turns the keys ``k_t`` into ``k_{t-1}``: the one-tap shift.

    Defined in Chapter 11 (Short convolutions)."""
    d = _check_positive_int(d, "d")
    if isinstance(lag, bool) or not isinstance(lag, numbers.Integral) or lag < 0:
        raise ValueError(f"lag must be a non-negative integer; got {lag!r}")
    width = lag + 1 if width is None else _check_positive_int(width, "width")
    if width <= lag:
        raise ValueError(f"width must be greater than lag = {lag}; got {width}")
    W = np.zeros((width, d))
    W[lag] = 1.0
    return W


# ---------------------------------------------------------------------------------------------
# keys equal to values: what test-time training learns
# ---------------------------------------------------------------------------------------------
def _beta(beta, n):
    return np.ones(n) if beta is None else check_gate(beta, "beta", (n,), low=0.0, high=2.0)


def deltanet_states(K, V, beta=None) -> np.ndarray:
    """Every state of DeltaNet, ``S_t = S_{t-1} + beta_t (v_t - S_{t-1} k_t) k_t^T`` from
    ``S_0 = 0``: an ``(n, d_v, d_k)`` array, ``[t]`` the state after token ``t``.

    Defined in Chapter 11 (Short convolutions)."""
    K = as_array(K, "K", ("n", "d_k"))
    V = as_array(V, "V", (K.shape[0], "d_v"))
    beta = _beta(beta, K.shape[0])
    S = np.zeros((V.shape[1], K.shape[1]))
    out = np.empty((K.shape[0],) + S.shape)
    for t, (k, v) in enumerate(zip(K, V)):
        S = S + beta[t] * np.outer(v - S @ k, k)
        out[t] = S
    return out


def tied_deltanet_state(K, beta=None) -> np.ndarray:
    """DeltaNet's state after ``V = K``, in closed form: with ``S_t - I = (S_{t-1} - I)(I -
    beta_t k_t k_t^T)`` and ``S_0 - I = -I``,
    ``S_n = I - (I - beta_1 k_1 k_1^T)(I - beta_2 k_2 k_2^T) ... (I - beta_n k_n k_n^T)``.
    ``K``: ``(n, d)``; ``beta``: ``(n,)`` in ``(0, 2]``, default ones. Returns ``(d, d)``.

    Defined in Chapter 11 (Short convolutions)."""
    K = as_array(K, "K", ("n", "d"))
    beta = _beta(beta, K.shape[0])
    d = K.shape[1]
    P = np.eye(d)
    for k, b in zip(K, beta):
        P = P @ (np.eye(d) - b * np.outer(k, k))
    return np.eye(d) - P


def least_squares_state(K, V, lam: float) -> np.ndarray:
    """The exact minimiser of ``sum_t ||S k_t - v_t||^2 + lam ||S||_F^2``: ``V^T K (K^T K +
    lam I)^{-1}`` (``(d_v, d_k)``; ``lam > 0``). What an exact test-time trainer (MesaNet, Chapter 10)
    holds after the tokens of ``K, V``; with ``V = K`` it is ``I - lam (K^T K + lam I)^{-1}``.

    Defined in Chapter 11 (Short convolutions)."""
    K = as_array(K, "K", ("n", "d_k"))
    V = as_array(V, "V", (K.shape[0], "d_v"))
    lam = float(check_gate(lam, "lam", (), low=0.0, high=np.inf, high_inclusive=False))
    H = K.T @ K + lam * np.eye(K.shape[1])
    return np.linalg.solve(H, K.T @ V).T             # H symmetric: (V^T K H^{-1})^T = H^{-1} K^T V


def identity_gap(S, *, scaled: bool = False) -> float:
    """How far a square state is from the identity: ``||S - c I||_F / ||c I||_F`` with ``c = 1``, or
    with ``scaled=True`` the best multiple ``c = tr(S) / d`` (for linear attention, whose state
    grows with the number of tokens). 0 means the state is (a multiple of) the identity and holds
    nothing about the sequence beyond that multiple; ``inf`` when ``c = 0``.

    Defined in Chapter 11 (Short convolutions)."""
    S = as_array(S, "S", ("d", "d"))
    if S.shape[0] != S.shape[1]:
        raise ValueError(f"S must be square, shape (d, d); got {S.shape}")
    d = S.shape[0]
    c = np.trace(S) / d if scaled else 1.0
    if c == 0:
        return float("inf")
    return float(np.linalg.norm(S - c * np.eye(d)) / (abs(c) * np.sqrt(d)))


def _unit_tokens(n: int, d: int, rng) -> np.ndarray:
    X = rng.normal(size=(n, d))
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def tied_state_curves(n: int = 64, d: int = 16, *, beta: float = 1.0, lam: float = 1e-2,
                      seed: int = 0) -> dict:
    """Write ``n`` random unit tokens with ``K = V`` into three states and measure, after every
    token, how far each is from the identity (:func:`identity_gap`):

    - ``"deltanet"``: DeltaNet with a constant ``beta`` (``||S_t - I|| / ||I||``);
    - ``"least squares"``: the exact regularised solution (:func:`least_squares_state`, ``lam``);
    - ``"linear"``: linear attention, ``S_t = sum_j k_j k_j^T``, against its best multiple of the
      identity.

    Returns ``{"t": 1..n, "deltanet", "least squares", "linear"}``, each an ``(n,)`` array, and the
    tokens ``"X"``.

    Defined in Chapter 11 (Short convolutions)."""
    n, d = _check_positive_int(n, "n"), _check_positive_int(d, "d")
    beta = float(check_gate(beta, "beta", (), low=0.0, high=2.0))
    rng = np.random.default_rng(seed)
    X = _unit_tokens(n, d, rng)
    states = deltanet_states(X, X, np.full(n, beta))
    out = {"t": np.arange(1, n + 1), "X": X,
           "deltanet": np.array([identity_gap(S) for S in states]),
           "least squares": np.array([identity_gap(least_squares_state(X[:t], X[:t], lam))
                                      for t in range(1, n + 1)]),
           "linear": np.array([identity_gap(X[:t].T @ X[:t], scaled=True) for t in range(1, n + 1)])}
    return out


# ---------------------------------------------------------------------------------------------
# predicting the neighbour
# ---------------------------------------------------------------------------------------------
def readout(S, X) -> dict:
    """Read the state ``S`` (``(d, d)``) at every token but the last, ``o_j = S x_j``, and compare
    each reading with every token of the sequence ``X`` (``(n, d)``) by cosine similarity.

    Returns ``{"cos": (n - 1, n) array, "match": (n - 1,) index of the most similar token,
    "self": fraction of readings most similar to x_j itself, "next": fraction most similar to
    x_{j+1}}``: a state that learned the identity reads back the query; one that learned the
    neighbour pairs reads the token that followed it.

    Defined in Chapter 11 (Short convolutions)."""
    X = as_array(X, "X", ("n", "d"))
    S = as_array(S, "S", (X.shape[1], X.shape[1]))
    n = X.shape[0]
    if n < 2:
        raise ValueError(f"X must hold at least 2 tokens; got shape {X.shape}")
    O = X[:-1] @ S.T
    norms = np.linalg.norm(O, axis=1, keepdims=True) * np.linalg.norm(X, axis=1)[None, :]
    cos = np.divide(O @ X.T, norms, out=np.zeros((n - 1, n)), where=norms > 0)
    match = np.argmax(cos, axis=1)
    j = np.arange(n - 1)
    return {"cos": cos, "match": match, "self": float(np.mean(match == j)),
            "next": float(np.mean(match == j + 1))}


def lag_weights(width: int, d: int, *, shift: int = 0) -> np.ndarray:
    """A hand-set depthwise convolution that gives each lag its own block of channels: the ``d``
    channels are cut into ``width - shift`` contiguous groups and group ``g`` passes the token
    ``g + shift`` steps back (weight ``1`` at lag ``g + shift``, 0 elsewhere). Shape ``(width, d)``.

    With ``shift = 1`` a key ``k_t`` carries pieces of ``x_{t-1}, ..., x_{t-width+1}``; with
    ``shift = 0`` (width one less) a query ``q_t`` carries the same pieces of ``x_t, ..., x_{t-width+2}``,
    so ``q_t = k_{t+1}``: reading the state at ``t`` finds what was written at ``t + 1``.

    Defined in Chapter 11 (Short convolutions)."""
    width, d = _check_positive_int(width, "width"), _check_positive_int(d, "d")
    if shift not in (0, 1):
        raise ValueError(f"shift must be 0 or 1; got {shift!r}")
    groups = width - shift
    if groups < 1 or groups > d:
        raise ValueError(f"width - shift must lie in [1, d = {d}]; got {groups}")
    W = np.zeros((width, d))
    for g, cols in enumerate(np.array_split(np.arange(d), groups)):
        W[g + shift, cols] = 1.0
    return W


def context_recall(width: int, *, n_phrases: int = 12, n_hubs: int = 3, d: int = 64,
                   seed: int = 0) -> dict:
    """What a wider convolution adds: keys that carry the last ``width - 1`` tokens.

    The sequence is ``n_phrases`` phrases ``(a_i, h_i, s_i)`` of three distinct random unit tokens,
    where the middle token ``h_i`` is one of only ``n_hubs`` tokens, so every hub is followed by
    several different successors: the pair "previous token → token" is ambiguous, the context
    ``(a_i, h_i) → s_i`` is not. DeltaNet (``beta = 1``) writes ``(k_t, x_t)`` with keys
    ``k_t = short_conv(X, lag_weights(width, d, shift=1))`` (L2-normalised) and is read at every hub
    with ``q = short_conv(X, lag_weights(width - 1, d))`` (normalised; ``q_t = k_{t+1}``). A reading
    counts as right when the most similar token of the sequence is the hub's successor ``s_i``.

    Returns ``{"width", "accuracy", "latest": the accuracy of answering every hub with the
    successor of its most recent occurrence (what a key that sees only the hub can do at best)}``.
    ``2 <= width <= d + 1`` (the key's ``width - 1`` lags each need a channel group of the ``d``);
    ``n_phrases``, ``n_hubs <= n_phrases`` and ``d`` positive integers.

    Defined in Chapter 11 (Short convolutions)."""
    width = _check_positive_int(width, "width")
    if width < 2:
        raise ValueError(f"width must be at least 2 (a key needs the previous token); got {width}")
    d = _check_positive_int(d, "d")
    if width > d + 1:
        raise ValueError(f"width must be at most d + 1 = {d + 1} (each of the key's width - 1 lags needs "
                         f"a group of channels); got {width}")
    n_phrases, n_hubs = _check_positive_int(n_phrases, "n_phrases"), _check_positive_int(n_hubs, "n_hubs")
    if n_hubs > n_phrases:
        raise ValueError(f"n_hubs must be <= n_phrases = {n_phrases}; got {n_hubs}")
    rng = np.random.default_rng(seed)
    hubs = _unit_tokens(n_hubs, d, rng)
    others = _unit_tokens(2 * n_phrases, d, rng)
    which = rng.permutation(np.arange(n_phrases) % n_hubs)            # every hub used
    X = np.stack([row for i in range(n_phrases)
                  for row in (others[2 * i], hubs[which[i]], others[2 * i + 1])])
    unit = lambda A: A / np.maximum(np.linalg.norm(A, axis=1, keepdims=True), 1e-300)
    K = unit(short_conv(X, lag_weights(width, d, shift=1)))
    Q = unit(short_conv(X, lag_weights(width - 1, d)))
    K[0] = 0.0                                   # the first key sees only zeros: write nothing
    O = deltanet_states(K, X)[-1] @ Q.T          # read the final state at every position
    hub_pos = 3 * np.arange(n_phrases) + 1
    cos = (O.T[hub_pos] @ X.T) / np.maximum(np.linalg.norm(O.T[hub_pos], axis=1, keepdims=True), 1e-300)
    right = np.argmax(cos, axis=1) == hub_pos + 1
    last = {h: i for i, h in enumerate(which)}   # the phrase of each hub's latest occurrence
    latest = np.mean([last[which[i]] == i for i in range(n_phrases)])
    return {"width": width, "accuracy": float(np.mean(right)), "latest": float(latest)}
