"""DeltaFormer: the delta rule inside softmax attention (Chapter 7).

``op.py`` holds the public op (``deltaformer_attn``), ``pseudo.py`` the stage that is new here (the
pseudo-values ``u = (I + Diag(β) P)^{-1} v`` chunk by chunk, and their adjoint), ``plan.py`` the
launch choices, ``bench.py`` the benchmark of record (``results.json``), ``NOTES.md`` the design and
measurements, ``lab/`` the sweeps. The online softmax and both attention passes are the flash
family's; the 64×64 triangular solve is the delta family's.
"""
from .op import deltaformer_attn

__all__ = ["deltaformer_attn"]
