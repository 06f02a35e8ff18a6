"""Experiments that train small PyTorch models (the recall benchmark of Chapter 6, ...), apart from
the NumPy references of :mod:`lattn_core` and built on the ops of :mod:`kernels`. Data are made in
code; stored GPU runs live in ``experiments/results/``."""
__distribution__ = "linear-attention-history"  # only this book's packages say so (lattn_core.distribution)

from lattn_core.distribution import warn_if_shared as _warn_if_shared  # noqa: E402

_warn_if_shared("experiments")
