"""MesaNet (Chapter 10): ``chunk_mesa_net``, the per-token regression solved by conjugate gradients.

``op.py`` holds the public op and its autograd function, read as three stages: ``states.py`` (the
states of ``H`` entering every chunk, by the gla family's chunked gated sums), ``solve.py`` (the
conjugate-gradient solve, one program per chunk and head), then gla's ``chunk_simple_gla`` for the
outputs. The differentiable PyTorch implementation (the CPU path and the oracle, with an exact
solve) is :func:`kernels.reference.chunk_mesa_net_ref`. ``plan.py`` holds the launch choices, ``bench.py`` the benchmark of record
(``results.json``), ``NOTES.md`` the design and what is measured today, ``HISTORY.md`` the rounds,
``lab/`` the sweeps (their logs in ``lab/logs/``).
"""
from .op import chunk_mesa_net

__all__ = ["chunk_mesa_net"]
