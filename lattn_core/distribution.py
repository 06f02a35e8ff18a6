"""Which installed distribution owns this book's top-level packages.

The book installs three top-level packages, ``lattn_core``, ``kernels`` and ``experiments``, from one
distribution, ``linear-attention-history``. ``kernels`` and ``experiments`` are also the names of other
projects on the package index (Hugging Face's ``kernels`` among them): installed into the same
environment, the later install writes its files over the earlier one's in ``site-packages/kernels/``.
Each of the three ``__init__.py`` says ``__distribution__ = "linear-attention-history"``, which no other
project's does, and ``kernels`` and ``experiments`` call :func:`warn_if_shared` when imported.
"""
from __future__ import annotations

import warnings
from functools import lru_cache

DISTRIBUTION = "linear-attention-history"


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


@lru_cache(maxsize=1)
def _claims() -> dict:
    from importlib.metadata import packages_distributions
    return packages_distributions()


def other_distributions(top_level: str, claims: dict | None = None) -> list[str]:
    """The installed distributions other than this book's that also install ``top_level``
    (``claims``: top-level name -> distributions, default what is installed)."""
    claims = (_claims() if claims is None else claims).get(top_level, [])
    return sorted({d for d in claims if _normal(d) != DISTRIBUTION})


def warn_if_shared(top_level: str, claims: dict | None = None) -> list[str]:
    """Warn (a ``RuntimeWarning``) when another installed distribution also installs the top-level
    package ``top_level``: whichever was installed last has overwritten the other's files. Returns
    the names of those distributions."""
    others = other_distributions(top_level, claims)
    if others:
        warnings.warn(
            f"the top-level package {top_level!r} of {DISTRIBUTION} is also installed by "
            f"{', '.join(others)}; in one environment the later install overwrites the other's "
            f"files. Install {DISTRIBUTION} in an environment of its own (a fresh virtual "
            "environment, or a fresh Colab runtime).", RuntimeWarning, stacklevel=3)
    return others


def is_ours(module) -> bool:
    """Whether an imported module is one of this book's top-level packages."""
    return getattr(module, "__distribution__", None) == DISTRIBUTION
