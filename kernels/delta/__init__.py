"""The (gated) delta rule: ``chunk_delta_rule`` and ``chunk_gated_delta_rule``, and (Gated)
DeltaProduct, ``chunk_gated_delta_product``, which is the gated delta rule run on every token's steps,
and Comba, ``chunk_comba``, which is the gated delta rule after Chapter 6's change of variables.

``op.py`` is the autograd op that calls the stages in order: the per-chunk triangular solve
``T = (I + A)^{-1}`` (on the common floor, ``kernels/common/solve.py``, reused by other families),
``wy.py`` (the WY/UT factors and the scores), ``march.py`` (the sequential pass, training and
inference forms), ``backward.py``; ``comba.py`` is Comba's change of variables and ``plan.py`` holds
the measured launch choices. ``bench.py`` is the benchmark of record (``results.json``),
``NOTES.md`` the design, plan and measurements of today, ``HISTORY.md`` every round of measurement,
``lab/logs/`` the logs the rounds cite.
"""
from .op import chunk_comba, chunk_delta_rule, chunk_gated_delta_product, chunk_gated_delta_rule

__all__ = ["chunk_delta_rule", "chunk_gated_delta_rule", "chunk_gated_delta_product", "chunk_comba"]
