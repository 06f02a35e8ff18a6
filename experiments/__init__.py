"""Experiments that train small PyTorch models (the recall benchmark of Chapter 6, ...), apart from
the NumPy references of :mod:`lattn_core` and built on the ops of :mod:`kernels`. Data are made in
code; stored GPU runs live in ``experiments/results/``."""
