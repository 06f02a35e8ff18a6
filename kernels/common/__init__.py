"""The common floor of ``kernels/``: stages and helpers that more than one family uses, under public
names, each with its own tests (``tests/kernels/test_common.py``). A family imports from here,
never from another family's private names.

- :mod:`.heads`: any head size up to 256 on every op (zero padding to the kernels' tiles).
"""
from .heads import GLA_MAX_HEAD, MAX_HEAD, head_tile, pad_axis

__all__ = ["MAX_HEAD", "GLA_MAX_HEAD", "head_tile", "pad_axis"]
