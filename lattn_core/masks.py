"""Masks in the article's notation: ``M`` (causal, with diagonal) and ``M^-`` (strictly causal)."""
from __future__ import annotations

import numpy as np

__all__ = ["causal_mask", "strict_causal_mask"]


def _check_n(n) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive integer; got {n!r}")
    return int(n)


def causal_mask(n: int) -> np.ndarray:
    """``M``: the ``(n, n)`` lower-triangular 0/1 matrix, ``M_ij = 1`` for ``j <= i``.

    Defined in Chapter 1 (The quadratic cost)."""
    return np.tril(np.ones((_check_n(n),) * 2))


def strict_causal_mask(n: int) -> np.ndarray:
    """``M^-``: the ``(n, n)`` strictly lower-triangular 0/1 matrix, ``M^-_ij = 1`` for ``j < i``.

    Defined in Chapter 1 (The quadratic cost)."""
    return np.tril(np.ones((_check_n(n),) * 2), k=-1)
