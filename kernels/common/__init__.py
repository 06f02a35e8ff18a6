"""The common floor of ``kernels/``: stages and helpers that more than one family uses, under public
names, each with its own tests (``tests/kernels/test_common.py``). A family imports from here,
never from another family's private names.

- :mod:`.heads`: any head size up to 256 on every op (zero padding to the kernels' tiles), and
  fla's grouped heads (``share_heads``).
- :mod:`.norm`: fla's ``use_qk_l2norm_in_kernel`` (``q``, ``k`` to unit length in front of the
  delta-rule and MesaNet kernels).
- :mod:`.varlen`: fla's ``cu_seqlens`` (sequences of different lengths packed along ``T``) on
  every op (padded batches by length, ``tests/kernels/test_varlen.py``).
- :mod:`.solve`, :mod:`.gates`, :mod:`.softmax`, :mod:`.tiles`: the Triton stages two families
  share (the chunks' triangular solve, the gate scan, the online-softmax step, operand roundings).
"""
from .heads import GLA_MAX_HEAD, MAX_HEAD, head_tile, pad_axis, share_heads
from .norm import l2norm, qk_l2norm
from .varlen import VarlenSpec, check_cu_seqlens, varlen

__all__ = ["MAX_HEAD", "GLA_MAX_HEAD", "head_tile", "pad_axis", "share_heads", "VarlenSpec", "check_cu_seqlens",
           "varlen", "l2norm", "qk_l2norm"]
