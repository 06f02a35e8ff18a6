"""Flash attention: causal (or full) softmax attention with the online softmax on chip, and FoX.

``op.py`` holds the public ops (``flash_attention``, ``parallel_forgetting_attn``: one autograd
function, the FoX bias optional), ``plan.py`` the measured launch choices, ``forward.py`` the forward
kernel (its block update, ``online_softmax_step``, is on the common floor, ``kernels/common/softmax.py``,
which other families reuse), ``backward.py`` the
backward kernels (probabilities recomputed from the saved log-sum-exp), ``bench.py`` the benchmark
of record (``results.json``), ``NOTES.md`` the design, plans and measurements of today,
``HISTORY.md`` the rounds, ``lab/`` the sweeps (their logs in ``lab/logs/``).
"""
from .op import flash_attention, parallel_forgetting_attn

__all__ = ["flash_attention", "parallel_forgetting_attn"]
