"""Fixes for Triton's CPU interpreter, shared by every kernel module (applied only when interpreting).

The book's CPU tests run the Triton kernels through ``TRITON_INTERPRET=1``. Triton 3.6's
interpreter, with NumPy 2, differs from the compiled GPU path in three ways that would make those
tests fail or see different rounding than the GPU; :func:`apply_interpreter_fixes` patches them.
"""
import triton.language as tl

__all__ = ["apply_interpreter_fixes"]


def apply_interpreter_fixes():
    """Three gaps of Triton 3.6's interpreter with NumPy 2 that compiled code does not have.

    1. ``range(n)`` with a runtime scalar bound: the interpreter holds scalars as 1-element arrays
       and calls ``int(array)``, which NumPy 2 rejects; we give ``tl.tensor`` an ``__index__`` that
       reads the element (inside the interpreter's per-launch patch scope).
    2. ``tl.dot`` on bfloat16 multiplies the raw ``uint16`` bit patterns; we widen bfloat16
       operands to float32 first (exact), which is what tensor cores do before accumulating.
    3. ``x.to(tl.bfloat16)`` truncates (round toward zero) in the interpreter, a biased rounding
       whose errors pile up along the recurrence; the GPU rounds to nearest even, and so do we.

    Idempotent (each patch carries the flag ``_lattn_fix``); the kernel modules call it only when
    interpreting.
    """
    import numpy as np
    import triton.runtime.interpreter as interp

    orig_patch = getattr(interp, "_patch_lang_tensor", None)
    if orig_patch is not None and not getattr(orig_patch, "_lattn_fix", False):
        def patched(tensor, scope):
            orig_patch(tensor, scope)
            scope.set_attr(tensor, "__index__",
                           lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))
        patched._lattn_fix = True
        interp._patch_lang_tensor = patched

    builder = getattr(interp, "InterpreterBuilder", None)
    orig_dot = getattr(builder, "create_dot", None)
    if orig_dot is not None and not getattr(orig_dot, "_lattn_fix", False):
        def widen(h):
            if h.dtype == tl.bfloat16 or getattr(h.dtype, "scalar", None) == tl.bfloat16:
                bits = np.asarray(h.data).astype(np.uint32) << np.uint32(16)
                return interp.TensorHandle(bits.view(np.float32), tl.float32)
            return h

        def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
            return orig_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)
        create_dot._lattn_fix = True
        builder.create_dot = create_dot

    orig_cast = getattr(builder, "cast_impl", None)
    if orig_cast is not None and not getattr(orig_cast, "_lattn_fix", False):
        def cast_impl(self, src, dst_type):
            if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
                bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32)
                rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
                return interp.TensorHandle(rounded.astype(np.uint16), tl.bfloat16)
            return orig_cast(self, src, dst_type)
        cast_impl._lattn_fix = True
        builder.cast_impl = cast_impl
