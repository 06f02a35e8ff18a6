"""Chunkwise (gated) linear attention: ``chunk_linear_attn``, ``chunk_simple_gla``, ``chunk_gla``.

``op.py`` is the autograd op that calls the stages in order: ``prep.py`` (the vector gate's
per-chunk preparation), ``march.py`` (the forward march with the state on chip, and the per-chunk
states), ``backward.py`` (the state gradients, the per-chunk gradients, the gate's); ``tiles.py``
holds their own jit helpers (the rounding helpers are on the common floor, ``kernels/common``) and
``plan.py`` the measured launch choices. ``bench.py`` is the benchmark of record (``results.json``),
``NOTES.md`` the design, plan and measurements of today, ``HISTORY.md`` the rounds, ``lab/`` the
sweeps (their logs in ``lab/logs/``).
"""
from .op import chunk_gla, chunk_linear_attn, chunk_simple_gla

__all__ = ["chunk_linear_attn", "chunk_simple_gla", "chunk_gla"]
