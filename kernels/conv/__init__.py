"""Short convolutions: fla's ``causal_conv1d`` (Chapter 11).

``op.py`` holds the public op (``causal_conv1d``) and its input checks, ``forward.py`` the forward
and the final state, ``backward.py`` the gradients (the transposed convolution, the taps' and bias's
partial sums and their reduction, the initial state's gradient), ``plan.py`` the launch choices,
``bench.py`` the benchmark of record (``results.json``), ``bench_layer.py`` the layer's
(``layer.json``), ``graph_timing.json`` the step as launched and as replayed from a CUDA graph
(Chapter 11 reads it), ``NOTES.md`` the design, plan and measurements of today and what is open,
``HISTORY.md`` the rounds, ``lab/`` the sweeps and timings (their logs in ``lab/logs/``). The
differentiable PyTorch form (the CPU path and the oracle) is
:func:`kernels.reference.causal_conv1d_ref`, beside the other families' references.
"""
from .op import causal_conv1d

__all__ = ["causal_conv1d"]
