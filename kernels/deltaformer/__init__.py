"""DeltaFormer: the delta rule inside softmax attention (Chapter 8).

``op.py`` holds the public op (``deltaformer_attn``), ``pseudo.py`` the stage that is new here (the
pseudo-values ``u = (I + Diag(β) P)^{-1} v`` chunk by chunk, and their adjoint), ``plan.py`` the
launch choices, ``bench.py`` the benchmark of record (``results.json``), ``NOTES.md`` the design,
plan and measurements of today, ``HISTORY.md`` the rounds that led there, ``lab/`` the sweeps (their
logs in ``lab/logs/``). The online softmax and the 64×64 triangular solve's steps are the common
floor's (``kernels/common``); both attention passes are the flash family's.
"""
from .op import deltaformer_attn

__all__ = ["deltaformer_attn"]
