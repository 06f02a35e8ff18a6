"""How :mod:`kernels` runs: which backend an op takes, Triton's interpreter on a CPU, launch plans.

Backends
--------
``backend=None`` (default) picks compiled Triton when the inputs live on a CUDA device and the
differentiable PyTorch implementation (:mod:`kernels.reference`) otherwise. ``backend="torch"``
forces the PyTorch path anywhere. ``backend="triton"`` forces the Triton kernel; on a machine
without a GPU it runs through Triton's interpreter (``TRITON_INTERPRET=1``, which :mod:`kernels`
sets at import time when no CUDA device is present), which is how the CPU tests exercise the
kernel code itself.

Launch plans
------------
Every family chooses its tile sizes, warps and pipeline stages in one function of its ``plan.py``
(measured defaults, as data). A plan entry that names several :class:`Launch` configurations is a
first-fit list: :func:`launch` takes the first one the GPU compiler accepts (a configuration that
needs more shared memory or registers than the GPU has raises ``OutOfResources`` and is skipped).
Nothing here reads the environment to choose a launch.

Device classes
--------------
Every family's ``plan_for`` has one order: ``plan_for(dtype, device, *, <the family's shapes and
case arguments>, caps=None, interpret=INTERPRET, **overrides)``, everything after ``dtype, device``
keyword-only, ``**overrides`` where the family has tunable fields (``tests/kernels/test_family_spec.py``
holds every family to it). It takes the GPU's class, :class:`Caps` (compute capability and the
shared memory one block may use), from the inputs' device (:func:`device_caps`) or given explicitly
(``caps=``), which is how the compile check and the tests ask for any class on a CPU. The classes
the plans know are :data:`GPU_CLASSES`: Colab's T4 (sm_75), A100 (sm_80), L4 (sm_89) and the Hopper
H100/H200 (sm_90), where every plan was measured. Off the GPU :func:`device_caps` answers Hopper
(as :func:`num_sms` answers 132). :func:`check_dtypes` rejects inputs a class cannot run (bfloat16
below sm_80) with a ``ValueError`` before anything is compiled.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple

import torch

__all__ = ["HAS_TRITON", "INTERPRET", "resolve_backend", "Launch", "launch", "num_sms", "Caps", "GPU_CLASSES",
           "HOPPER", "device_caps", "gpu_class", "check_dtypes", "apply_interpreter_fixes"]

try:  # Triton is optional: on a machine without it every op still runs through PyTorch.
    import triton  # noqa: F401
    HAS_TRITON = True
except Exception:  # pragma: no cover - depends on the machine
    HAS_TRITON = False

#: Set once, when :mod:`kernels` is first imported (Triton reads it when a kernel is decorated).
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False")

_BACKENDS = (None, "auto", "torch", "triton")


def resolve_backend(backend, x: torch.Tensor) -> str:
    """Return ``"torch"`` or ``"triton"`` for tensor ``x`` and the requested ``backend``."""
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of None, 'auto', 'torch', 'triton'; got {backend!r}")
    if backend in (None, "auto"):
        return "triton" if (x.is_cuda and HAS_TRITON) else "torch"
    if backend == "triton":
        if not HAS_TRITON:
            raise ValueError("backend='triton' needs the triton package, which is not installed")
        if not x.is_cuda and not INTERPRET:
            raise ValueError("backend='triton' on CPU tensors needs Triton's interpreter: set "
                             "TRITON_INTERPRET=1 before importing kernels (it is set automatically "
                             "when no CUDA device is present)")
        if x.is_cuda and INTERPRET:
            raise ValueError("TRITON_INTERPRET=1 is set, so Triton cannot compile for the GPU; "
                             "unset it before importing kernels, or move the inputs to the CPU")
    return backend


@dataclass(frozen=True)
class Launch:
    """One launch configuration of a kernel: warps per program and software-pipeline stages."""
    num_warps: int
    num_stages: int = 1


_FIT: dict = {}


def launch(kernel, grid, args, meta: dict, configs):
    """Launch ``kernel[grid](*args, **meta)`` with the first of ``configs`` (:class:`Launch`) that fits.

    The first configuration is the measured default; later ones are fall-backs for GPUs with less
    shared memory or for dtypes that need more registers. The choice is remembered per kernel and
    compile-time signature. The interpreter ignores warps and stages.
    """
    configs = tuple(configs)
    key = (getattr(getattr(kernel, "fn", kernel), "__name__", str(kernel)),
           tuple(sorted((k, str(v)) for k, v in meta.items())),
           tuple(str(a.dtype) for a in args if isinstance(a, torch.Tensor)), configs)
    fit = _FIT.get(key)
    if fit is not None:
        return kernel[grid](*args, **meta, num_warps=fit.num_warps, num_stages=fit.num_stages)
    from triton.runtime.errors import OutOfResources
    err = None
    for cfg in configs:
        try:
            out = kernel[grid](*args, **meta, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        except OutOfResources as e:   # too much shared memory / registers for this configuration
            err = e
            continue
        _FIT[key] = cfg
        return out
    raise err


_SMS: dict = {}


def num_sms(device) -> int:
    """Streaming multiprocessors of a CUDA ``device`` (132 on an H100/H200 SXM, used off the GPU)."""
    device = torch.device(device)
    if device.type != "cuda":
        return 132
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


class Caps(NamedTuple):
    """A GPU class as the plans see it: compute capability ``major.minor`` and ``smem``, the bytes of
    shared memory one block may use (the opt-in maximum, ``cudaDevAttrMaxSharedMemoryPerBlockOptin``)."""
    major: int
    minor: int
    smem: int

    @property
    def arch(self) -> int:
        """``10·major + minor``: 75, 80, 89, 90 (the ``sm_`` number)."""
        return 10 * self.major + self.minor


#: The classes the plans know, by ``sm_`` number (CUDA's per-block opt-in shared-memory limits):
#: T4 (Colab's free GPU: Turing, Triton runs its products on CUDA cores, no bfloat16), A100 (Colab's
#: paid GPU), L4 (Colab's paid GPU; sm_86 boards have the same limit), H100/H200 (Hopper: where every
#: plan was measured).
GPU_CLASSES = {75: Caps(7, 5, 64 * 1024), 80: Caps(8, 0, 163 * 1024), 89: Caps(8, 9, 99 * 1024),
               90: Caps(9, 0, 227 * 1024)}
HOPPER = GPU_CLASSES[90]

_CAPS: dict = {}


def gpu_class(arch: int) -> Caps:
    """The known class of an ``sm_`` number: the nearest one at or below it (sm_86 is sm_80's
    architecture with sm_89's shared memory, so it takes the smaller limit), Hopper for newer GPUs;
    ``ValueError`` below sm_75 (Triton has no code path for older GPUs)."""
    if arch < 75:
        raise ValueError(f"compute capability must be 7.5 or newer for the Triton kernels; got "
                         f"{arch // 10}.{arch % 10} (use backend='torch')")
    if 86 <= arch < 90:
        return GPU_CLASSES[89]
    return GPU_CLASSES[max(a for a in GPU_CLASSES if a <= arch)]


def device_caps(device) -> Caps:
    """The :class:`Caps` of ``device`` (cached per CUDA device). A CUDA device reports its compute
    capability and its per-block shared-memory limit; anything else (a CPU, where the interpreter
    runs and the compile check asks for the GPU's decision) answers :data:`HOPPER`."""
    device = torch.device(device)
    if device.type != "cuda":
        return HOPPER
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _CAPS:
        major, minor = torch.cuda.get_device_capability(idx)
        known = gpu_class(10 * major + minor)
        smem = getattr(torch.cuda.get_device_properties(idx), "shared_memory_per_block_optin", 0) or known.smem
        _CAPS[idx] = Caps(major, minor, int(smem))
    return _CAPS[idx]


def _device_name(device, caps: Caps) -> str:
    """``"<GPU name>, compute capability 7.5"``; the name only when ``caps`` are the device's own
    (the tests and the compile check ask for classes that are not the machine's)."""
    device = torch.device(device)
    if device.type == "cuda":
        try:
            if device_caps(device) == caps:
                return f"{torch.cuda.get_device_name(device)}, compute capability {caps.major}.{caps.minor}"
        except Exception:  # pragma: no cover - the name is a courtesy
            pass
    return f"compute capability {caps.major}.{caps.minor}"


def check_dtypes(caps: Caps, device=None, **tensors):
    """``ValueError`` when a tensor's dtype cannot run on the class ``caps``: bfloat16 needs
    compute capability 8.0 (a T4 has no bfloat16 arithmetic; Triton would emulate every
    conversion on its CUDA cores, untested). Called by every op's Triton path before it plans or
    compiles anything; ``tensors`` are named as the op names its arguments (``None`` skipped)."""
    if caps.major >= 8:
        return
    for name, t in tensors.items():
        if t is not None and t.dtype == torch.bfloat16:
            raise ValueError(f"{name} is bfloat16, which needs compute capability 8.0 or newer (this GPU: "
                             f"{_device_name(device if device is not None else t.device, caps)}); pass "
                             f"float16 or float32 inputs, or backend='torch'")


def apply_interpreter_fixes():
    """Three gaps of Triton 3.6's interpreter with NumPy 2 that compiled code does not have.

    1. ``range(n)`` with a runtime scalar bound: the interpreter holds scalars as 1-element arrays
       and calls ``int(array)``, which NumPy 2 rejects; we give ``tl.tensor`` an ``__index__`` that
       reads the element (inside the interpreter's per-launch patch scope).
    2. ``tl.dot`` on bfloat16 multiplies the raw ``uint16`` bit patterns; we widen bfloat16
       operands to float32 first (exact), which is what tensor cores do before accumulating.
    3. ``x.to(tl.bfloat16)`` truncates (round toward zero) in the interpreter, a biased rounding
       whose errors pile up along the recurrence; the GPU rounds to nearest even, and so do we.

    Idempotent (each patch carries the flag ``_lattn_fix``); applied once, below, when interpreting.
    """
    import numpy as np
    import triton.language as tl
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


if INTERPRET and HAS_TRITON:
    apply_interpreter_fixes()
