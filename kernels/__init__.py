"""PyTorch ops backed by Triton kernels, with fla's names, argument order and layout.

One folder per kernel family: ``flash/`` (softmax attention, and FoX's forget-gated form), ``gla/`` (linear attention with no,
scalar or vector gates), ``delta/`` (the plain and gated delta rule, DeltaProduct and Comba), ``deltaformer/`` (the delta rule inside softmax
attention), ``path/`` (PaTH: Householder products as position encoding), ``mesa/`` (MesaNet's
regression solved by conjugate gradients), ``conv/`` (the short causal convolution of Chapter 11);
:data:`FAMILIES` lists them. Each holds its op, its stages, its launch plan, its ``bench.py`` with the
results, its ``NOTES.md`` (today), ``HISTORY.md`` (the rounds) and a ``lab/`` (scripts; their logs
in ``lab/logs/``). ``common/`` holds the stages two families share.

A family describes its ops once, in its ``bench.py`` (the records of :mod:`kernels.harness`):
``OPS`` (per op the :mod:`kernels` op, fla's counterpart, how both are called, the inputs it
differentiates and its entry in the survey), ``make_inputs`` (the inputs of a case) and ``COMPILE``
(the modules holding its kernels and the calls the compile check captures). The benchmark of
record, ``survey`` and ``compile`` read that description; a new family adds its folder and its name
to :data:`FAMILIES`, and touches none of them.

Shared here: ``backend`` (which backend an op takes, Triton's interpreter, first-fit launches),
``validate`` (input checks), ``reference`` (the differentiable PyTorch implementations: the CPU
path and the kernels' oracle), ``harness`` (the benchmark runner, the records a family declares and
the shared input makers), ``report`` (showing a benchmark
in the book), ``compile`` (the compile-without-GPU check, for every GPU class), ``catalog`` (the
model map) and ``survey`` (one benchmark of every op at one set of shapes, Chapter 12). Every plan takes the GPU's class (``backend.device_caps``: T4, A100, L4 or Hopper, where the
plans were measured); bfloat16 on a T4 raises ``ValueError`` before anything is compiled.

On a machine without a CUDA device, importing this package sets ``TRITON_INTERPRET=1`` (before any
kernel is decorated) so that ``backend="triton"`` can run the kernels through Triton's interpreter;
the default on CPU tensors is the differentiable PyTorch implementation in :mod:`kernels.reference`.
"""
__distribution__ = "linear-attention-history"  # only this book's packages say so (lattn_core.distribution)
import os as _os

try:
    import torch as _torch
    if not _torch.cuda.is_available():
        _os.environ.setdefault("TRITON_INTERPRET", "1")
except Exception:  # pragma: no cover
    pass

from lattn_core.distribution import warn_if_shared as _warn_if_shared  # noqa: E402

_warn_if_shared("kernels")

from .backend import HAS_TRITON, INTERPRET, resolve_backend  # noqa: E402
from .conv import causal_conv1d  # noqa: E402
from .delta import chunk_comba, chunk_delta_rule, chunk_gated_delta_product, chunk_gated_delta_rule  # noqa: E402
from .deltaformer import deltaformer_attn  # noqa: E402
from .flash import flash_attention, parallel_forgetting_attn  # noqa: E402
from .gla import chunk_gla, chunk_linear_attn, chunk_simple_gla  # noqa: E402
from .mesa import chunk_mesa_net  # noqa: E402
from .path import parallel_path_attn  # noqa: E402

#: the kernel families, one folder each, in the book's order (of their first chapter)
FAMILIES = ("flash", "gla", "delta", "deltaformer", "path", "mesa", "conv")

__all__ = ["flash_attention", "parallel_forgetting_attn", "chunk_linear_attn", "chunk_simple_gla", "chunk_gla",
           "chunk_delta_rule", "chunk_gated_delta_rule", "chunk_gated_delta_product", "chunk_comba", "deltaformer_attn", "parallel_path_attn", "chunk_mesa_net", "causal_conv1d", "HAS_TRITON", "INTERPRET", "resolve_backend"]
