"""Flash attention: causal (or full) softmax attention with the online softmax on chip.

``op.py`` is the public op, ``plan.py`` the measured launch choices, ``forward.py`` the forward
kernel (its ``online_softmax_step`` is the block update other families reuse), ``bench.py`` the
benchmark of record (``results.json``), ``NOTES.md`` the design and measurements, ``lab/`` the sweeps.
"""
from .op import flash_attention

__all__ = ["flash_attention"]
