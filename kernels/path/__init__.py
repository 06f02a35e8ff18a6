"""PaTH attention: Householder products as position encoding (Chapter 9).

``op.py`` holds the public op (``parallel_path_attn``), ``local.py`` the per-block stage (each
block's UT transform through the common floor's triangular solve: queries pulled back to the
block's start, keys pushed to its end, the block's own scores), ``forward.py`` the flash-style pass
that carries queries backwards over whole blocks, ``backward.py`` its gradients, ``plan.py`` the
launch choices, ``bench.py`` the benchmark of record (``results.json``), ``NOTES.md`` the design and
measurements of today, ``HISTORY.md`` the rounds, ``lab/`` the sweeps (their logs in ``lab/logs/``).
The online softmax and the cumulative gates are the common floor's (``kernels/common``).
"""
from .op import parallel_path_attn

__all__ = ["parallel_path_attn"]
