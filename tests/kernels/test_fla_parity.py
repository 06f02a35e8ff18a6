"""fla's own checks, run on our ops (issue 36).

For every op that :mod:`kernels` shares with flash-linear-attention (fla), this module takes the
cases of fla's test files (``tests/ops/test_attn.py``, ``test_forgetting_attn.py``,
``test_linear_attn.py``, ``test_simple_gla.py``, ``test_gla.py``, ``test_delta.py``,
``test_gdn.py``, ``test_delta_product.py``, ``test_deltaformer.py``, ``test_path_attn.py``,
``test_mesa.py`` and ``tests/modules/test_conv.py``) and checks our op the way fla checks its
own: the same input construction (distributions, normalisation, gate ranges, dtypes, initial
states, upstream gradients), the same reference, and fla's tolerances with fla's error measure.

Structure
---------
* One table per op (``FLASH``, ``FOX``, ``LINEAR``, ...): each row is one fla case, written as
  data: the fla test it comes from, fla's shape, dtype and options, and the tolerance of every
  output and gradient fla compares. Every output and every input gradient of a case has a
  tolerance (where fla's test leaves one out, e.g. the outputs of ``test_conv_cache_backward``,
  it gets the same test's tolerance), so nothing is computed and left unchecked.
* One builder per op turns a row into inputs (built on the CPU from ``torch.manual_seed(42)``,
  then moved to the device), our call, the reference call and the upstream gradients.
* One helper (:func:`_check`) runs both sides, takes the gradients of every input with
  ``torch.autograd.grad`` (the upstream gradients as fla gives them), and compares everything
  with fla's measure, reporting every measure that fails, not just the first.

The measure is fla's ``fla.utils.testing.assert_close`` in its strict (non-CI) form, written out
here in a few lines (:func:`_compare`): a result passes if its largest absolute error is at most
``err_atol`` (``1e-6`` unless fla's test gives another), else its RMS error ratio
``rms(ref - ours) / (rms(ref) + 1e-8)`` must be below the tolerance. The difference is rounded
as fla forms it (in the operands' promoted dtype); the squares and means are taken in float64,
where fla takes them in that dtype too (a float16 square overflows past 256 and rounds a small
difference's square to a subnormal: the two ratios agree to 1e-6 in float32 and to a few percent
of the ratio in float16 / bfloat16). It is reimplemented rather
than imported because fla's ``assert_close`` turns failures into warnings when fla's CI variable
is set (``FLA_CI_ENV``), and importing it runs ``fla/__init__`` and ``fla.utils`` (Triton
probing, a warning on CPU); :func:`test_fla_measure_and_import_hygiene` checks, in a subprocess,
that the two measures agree and that loading fla changes no environment variable or torch
setting that :mod:`kernels` reads.

References
----------
fla's naive references from the released wheel ``fla-core==0.6.0`` (a test dependency,
``requirements.txt``), loaded file by file (:func:`_fla`): only the pure-PyTorch ``naive.py``
modules run, never fla's package ``__init__`` or its Triton kernels. Where fla's test compares
against one of fla's Triton ops (``fused_recurrent_*``, ``chunk_gated_delta_product_ref``), the
naive reference of the same math is used instead: ``naive_recurrent_linear_attn``,
``naive_recurrent_simple_gla``, ``naive_recurrent_gla``, ``delta_rule_recurrence`` (its fixed
``K**-0.5`` scale turned into fla's ``scale`` by pre-scaling ``q`` in float32),
``naive_recurrent_gated_delta_rule``, ``naive_recurrent_gated_delta_product``. fla has no naive
convolution in the package (its reference lives in the test file), so ``causal_conv1d`` is checked
against a float64 convolution written here as fla's test reference defines it
(:func:`_conv_ref64`), with fla's tolerance.

Which fla tests: ``test_attn.py``: ``test_parallel``, ``test_parallel_bwd_full_value_reduction``
(``flash_attention``), ``test_parallel_with_g`` (``parallel_forgetting_attn``);
``test_forgetting_attn.py::test_parallel``; ``test_linear_attn.py``, ``test_simple_gla.py``,
``test_gla.py``: ``test_chunk`` (and ``test_chunk_with_chunk_size``) and ``test_fused_recurrent``,
whose rows (float32 among them), initial states and naive reference apply to our chunked op
unchanged; ``test_delta.py``: ``test_chunk``, ``test_chunk_with_chunk_size``; ``test_gdn.py``:
``test_chunk``, ``test_chunk_with_chunk_size``, ``test_chunk_beta_sigmoid_in_kernel``,
``test_chunk_gate_in_kernel(_gqa)``, and, forward only as fla has them, ``test_fused_recurrent``,
``test_fused_recurrent_gate_in_kernel``, ``test_fused_recurrent_beta_sigmoid_in_kernel``;
``test_delta_product.py::test_chunk``; ``test_deltaformer.py::test_deltaformer_attn``;
``test_path_attn.py::test_parallel``; ``test_mesa.py::test_chunk``; ``test_conv.py``:
``test_conv``, ``test_conv_with_cache_prefill_fwd``, ``test_conv_cache_backward``,
``test_conv_cache_backward_no_final_state``, ``test_conv_dense_initial_state_backward_large_nt``,
``test_conv_non_contiguous_qkv``, ``test_conv_non_contiguous_dy`` (fla's ``backend`` parameter,
its Triton kernel or the causal-conv1d package, leaves the rows it duplicates once).

Packed sequences (fla's varlen tests)
------------------------------------
``VARLEN`` holds the rows of fla's varlen tests on the shared ops (``test_attn.py``,
``test_forgetting_attn.py``, ``test_path_attn.py``: ``test_parallel_varlen``;
``test_deltaformer.py::test_deltaformer_attn_varlen``; ``test_simple_gla.py``, ``test_gla.py``,
``test_delta.py``, ``test_gdn.py``, ``test_delta_product.py``, ``test_mesa.py``:
``test_chunk_varlen``; ``tests/modules/test_conv.py``: ``test_conv_varlen``,
``test_conv_varlen_initial_state_backward_random``, ``test_conv_varlen_with_cache_prefill_fwd``,
``test_conv_varlen_non_contiguous_qkv``; ``test_gdn.py::test_chunk_varlen_prefill``, forward only in
inference mode, which takes our op's inference path): ``N`` sequences packed
along time in one batch row, ``cu_seqlens`` in fla's dtype for that test (int32, or int64 where
fla builds a ``LongTensor``), initial states with ``N`` rows, empty sequences where fla has them
(``[0, 0, 16]``). As fla's tests do, the reference runs on one sequence at a time
(:func:`_per_sequence`) and the outputs and final states are joined. Where fla's varlen reference
is one of its fused-recurrent Triton ops (simple GLA, GLA, the delta rule; DeltaProduct's
``chunk_gated_delta_product_ref``), the naive recurrence of the same math runs on float32 copies,
as those kernels compute; Gated DeltaNet, MesaNet, attention, FoX and PaTH use fla's naive
references as its tests do. fla's MesaNet varlen test calls the op with its default 30 solver
steps (its other rows pass ``K``); ours has the same default. DeltaFormer's rows run both ways of
the rows above (``q = k`` against fla's reference; ``q != k`` against our float64 one). In the CPU
tiers the offsets shrink with ``T`` (:func:`_shrink_cu`: every sequence keeps its share, at least
one token). Shifting the reference's inner boundaries by one token fails every row with more than
one sequence (checked by hand when the rows were added: 41 of 41 in the PyTorch tier; the 18 of the
prefill and strided rows added later, 2026-11-29).
``tests/kernels/test_varlen.py`` checks, beside these, that every op returns packed what it
returns for each sequence alone.

Tiers
-----
* ``test_gpu`` (only where ``torch.cuda.is_available()``): every case at fla's full shapes on the
  default backend (the Triton kernels).
* ``test_cpu_torch`` (always): the PyTorch path (``backend="torch"``) at moderately reduced shapes.
* ``test_cpu_triton`` (always, where no GPU is present): the Triton kernels through Triton's
  interpreter (``backend="triton"``) at small shapes.

The CPU tiers run PyTorch on one thread (the ``one_thread`` fixture, restored after): fla's naive
references are thousands of small operations, each of which otherwise waits for the pool's second
thread, and on a shared 2-core machine that made the tiers 5-10x slower.

:func:`_shrink` gives the CPU shapes: head sizes (K = 60, 100, 256, ...), dtypes, gates, scales
and every other option stay as fla has them; ``T`` up to 256 (PyTorch) or 130 (interpreter)
stays, so odd lengths (63, 75, 100, 111, 192, 200) survive; a longer ``T`` becomes 192 / 128 if
fla's is a multiple of the 64-token chunk, else 200 / 100 (not a multiple, as fla's; MesaNet's
long rows take 128 / 100 in both tiers, for its naive reference's sake; DeltaProduct's ``T`` is
divided by its ``n`` steps a token, so the kernels' sequence stays that long; the convolution
keeps at most 64 tokens in the interpreter, long rows taking 64 / 50); ``B`` is at most 2
and ``B·H`` at most 4 (PyTorch) or 2 (interpreter), keeping a group of 2 where fla groups heads.
The interpreter's cost grows with the programs it runs one by one, so there a row shrunk from a
long ``T`` runs one batch and one head (two where grouped; one batch for the convolution), and
MesaNet, whose fla rows run ``K`` solver steps (128 at ``K = 128``), one head and one 64-token
chunk for its long rows (the ``T = 500`` row keeps two chunks); fla's short rows keep two batches
or heads, so the kernels' batch and head offsets are exercised. Convolution channels are at most
256 / 128.

Differences from fla's tests (forced by our API, API.md)
--------------------------------------------------------
* Grouped heads (fla's ``HQ > H`` for attention, FoX and PaTH; ``HV > H`` for Gated DeltaNet):
  our ops take them as fla's do (``kernels/common/heads.py``, ``share_heads``: the shared tensors
  repeated over each group inside the autograd graph), so the cases pass them unrepeated; the
  gradients reach the shared leaves summed over the group, exactly as fla's. Where fla's naive
  reference wants one head count (Gated DeltaNet's), it gets the repeated copies.
* ``use_qk_l2norm_in_kernel``, ``use_beta_sigmoid_in_kernel``/``allow_neg_eigval`` and
  ``use_gate_in_kernel`` (Gated DeltaNet's in-kernel gate ``g = -exp(A_log)·softplus(a + dt_bias)``):
  we have no in-kernel fusions, so the normalisation, the sigmoid (times 2) and the gate are
  computed in PyTorch in front of our op, differentiably (the leaves and their gradients are
  fla's: the logits, ``A_log``, ``dt_bias``).
* fla's ``chunk_size=`` variants (``test_chunk_with_chunk_size``: 16, 32, 64) collapse to one case:
  our chunk size is fixed.
* ``test_attn.py::test_parallel_with_g`` draws fla's gate logits ``g ~ N(0, 1)`` of either sign;
  our ``g`` are log forget gates ``<= 0`` (API.md, checked with ``ValueError``), so the case uses
  ``g = -|N(0, 1)|`` (the same magnitudes) against fla's ``naive_parallel_attn(g=...)``.
* DeltaFormer: fla's naive reference scores the pseudo-values ``q·k`` where ours (and the paper)
  use ``k·k`` (API.md). The fla reference is used with ``q = k`` (one leaf for both, whose gradient
  is ``dq + dk``; the conventions coincide there); at fla's shapes with ``q != k`` our op is checked
  against our float64 :func:`kernels.reference.deltaformer_ref` with fla's tolerances. fla's cases
  are float16 only; the ``q = k`` rows are also run in bfloat16 (our addition: DeltaFormer's
  bfloat16 gradients), against fla's reference on float32 copies rounded to bfloat16, as fla's
  ``test_attn`` builds its reference (fla's naive DeltaFormer runs its second stage in the input
  dtype, which in bfloat16 alone is off by more than the tolerance).
* fla's Triton GDN test ``test_fused_recurrent`` feeds float32 ``q, k`` and a lower-precision
  ``v``; ours share one dtype, so ``q, k`` are normalised and cast to ``v``'s dtype for both sides
  (as fla's reference gets them).
* Convolution: fla's cache is ``[B, D, W-1]`` padded with a zero column to its ``[B, D, W]``
  state, as ours; the final state is compared on its last ``W - 1`` slots as fla does
  (``torch.testing.assert_close``-style ``atol = rtol = 1e-3`` there). ``test_conv_non_contiguous_*``
  compare fla's op on strided inputs / upstream gradients with itself on contiguous ones; here ours
  on the strided ones is compared with the float64 reference.

Left out (and why)
------------------
* Decoding-step ops we do not have: ``attn_decoding_one_step``, ``mesa_net_decoding_one_step``
  (``test_mesa.py::test_decoding_one_step``), ``causal_conv1d_update`` (``test_conv_decoding*``,
  ``test_conv_varlen_decoding``, ``test_conv_decoding_with_cache``,
  ``test_conv_decoding_non_contiguous_x``).
* fla's other varlen tests: those of options or ops we do not have (``test_parallel_swa_varlen``,
  ``test_chunk_gate_in_kernel_varlen``, ``test_fused_recurrent_gate_in_kernel_varlen``,
  ``test_conv_varlen_decoding``, ``test_fused_chunk_varlen``, ``test_simple_gla.py::test_parallel_varlen``),
  of fla's fused-recurrent ops (``test_fused_recurrent_varlen``), of an fla internal
  (``test_attn.py::test_varlen_d_debug``), of fla's other convolution function
  (``test_fast_conv_varlen``: ``fast_causal_conv1d_fn``, which needs the causal-conv1d package).
* Options of fla's ops that ours do not have: sliding windows and attention sinks
  (``test_parallel_swa``, ``test_parallel_sink``), ``normalize=True`` linear attention
  (``test_naive_chunk``, ``test_normalize_*``), the ``state_v_first`` layout (``*_state_v_first``).
* Tests of fla internals or of fla ops other than the shared ones: ``parallel_simple_gla``
  (``test_simple_gla.py::test_parallel``, it returns fla's attention matrix ``A``),
  ``fused_chunk_*``, fla's gate function (``test_gdn.py::test_gate``), ``prepare_wy_repr``, the
  FlashQLA backend, the Blackwell autotune guard, DeltaFormer's internal ``u`` stage
  (``test_parallel_deltaformer_u``; its shapes are covered by the op-level row ``T = 192``),
  ``test_simple_gla_to_mamba2`` (mamba_ssm's kernels).
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels import reference as kref

f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32
HAS_CUDA = torch.cuda.is_available()


# ---------------------------------------------------------------------------------------------
# fla's naive references (fla-core 0.6.0), one file at a time: no fla package __init__, no Triton
# ---------------------------------------------------------------------------------------------
FLA_CORE_VERSION = "0.6.0"
_FLA_MODULES: dict = {}


def _fla_root() -> Path:
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("tests/kernels/test_fla_parity.py needs fla-core==0.6.0 (requirements.txt: "
                           "pip install fla-core==0.6.0 einops)")
    from importlib.metadata import version
    got = version("fla-core")
    if got != FLA_CORE_VERSION:
        raise RuntimeError(f"tests/kernels/test_fla_parity.py is written against fla-core=={FLA_CORE_VERSION}; "
                           f"found {got}")
    return Path(spec.submodule_search_locations[0])


def _fla(op: str):
    """``fla/ops/<op>/naive.py`` of the installed fla-core, executed as a private module."""
    if op not in _FLA_MODULES:
        path = _fla_root() / "ops" / op / "naive.py"
        spec = importlib.util.spec_from_file_location(f"_fla_naive_{op}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _FLA_MODULES[op] = module
    return _FLA_MODULES[op]


# ---------------------------------------------------------------------------------------------
# fla's error measure (fla.utils.testing, strict form), and the allclose fla uses for conv caches
# ---------------------------------------------------------------------------------------------
def _diff(ref, out):
    """``ref - out`` rounded as fla forms it (in the operands' promoted dtype), then in float64."""
    return (ref.detach() - out.detach()).double()


def abs_err(ref, out) -> float:
    return _diff(ref, out).abs().max().item()


def err_ratio(ref, out) -> float:
    base = ref.detach().double().square().mean().sqrt().item()
    return _diff(ref, out).square().mean().sqrt().item() / (base + 1e-8)


def _compare(name, ref, out, tol) -> str | None:
    """``None`` if ``out`` passes against ``ref``, else a line saying why. ``tol``: a ratio (fla's
    ``assert_close(name, ref, out, ratio)``), ``(ratio, err_atol)``, or ``("allclose", atol, rtol)``."""
    if out is None:
        return f"{name}: no result from our op (the reference has one)"
    if tuple(ref.shape) != tuple(out.shape):
        return f"{name}: shape {tuple(out.shape)}, the reference's is {tuple(ref.shape)}"
    if isinstance(tol, tuple) and tol[0] == "allclose":
        _, atol, rtol = tol
        r, o = ref.detach().double(), out.detach().double()
        bad = ((r - o).abs() > atol + rtol * r.abs()) | torch.isnan(o)
        if bad.any():
            return f"{name}: {int(bad.sum())} of {bad.numel()} entries outside atol={atol}, rtol={rtol}"
        return None
    ratio, atol = (tol, 1e-6) if not isinstance(tol, tuple) else tol
    a = abs_err(ref, out)
    if a <= atol:
        return None
    if torch.isnan(ref).any():
        return f"{name}: NaN in the reference"
    if torch.isnan(out).any():
        return f"{name}: NaN in our result"
    r = err_ratio(ref, out)
    if not r < ratio:
        return f"{name}: error ratio {r:.6f} >= {ratio} (max abs error {a:.3g})"
    return None


# ---------------------------------------------------------------------------------------------
# cases as data
# ---------------------------------------------------------------------------------------------
@dataclass
class Case:
    """One fla test case. ``dims``: fla's sizes (``B, T, H, D``, ``G`` the group of heads that share
    ``H``, or ``B, T, D, W`` for the convolution); ``opts``: everything else fla's row sets;
    ``tol``: the tolerance of every output and input gradient (``d`` + input name)."""
    op: str
    fla: str
    dims: dict
    dtype: torch.dtype
    opts: dict
    tol: dict
    ext: str = ""                       # marks a row that is ours, not fla's (e.g. a bfloat16 variant)

    @property
    def id(self) -> str:
        dims = "-".join(f"{k}{v}" for k, v in self.dims.items())
        opts = "-".join(f"{k}{v}" for k, v in self.opts.items())
        opts = opts.replace(", ", "_").replace("(", "").replace(")", "")
        dt = str(self.dtype).replace("torch.", "")
        return "-".join(x for x in (self.op, self.fla, dims, opts, dt, self.ext) if x)


def _tol(names, value, **special):
    t = {n: value for n in names.split()}
    t.update(special)
    return t


def _rows(op, fla, keys, rows, tol, dims=("B", "T", "H", "D"), group=None, **fixed):
    """Cases from fla's parametrize rows: ``keys`` names the row's fields in fla's order; fields in
    ``dims`` are sizes, ``dtype`` the dtype, the rest options. ``group``: (``H``, the grouped
    count's key) turns fla's second head count into the group size ``G``."""
    cases = []
    for row in rows:
        r = dict(zip(keys.split(), row))
        dtype = r.pop("dtype", fixed.get("dtype"))
        d = {k: r.pop(k) for k in dims if k in r}
        if group is not None:
            shared, grouped = group
            big = r.pop(grouped)
            d = {"B": d["B"], "T": d["T"], "H": d[shared], "G": big // d[shared], "D": d["D"]}
        opts = {**{k: v for k, v in fixed.items() if k != "dtype"}, **r}
        cases.append(Case(op, fla, d, dtype, opts, dict(tol)))
    return cases


# fla's test_attn.py / test_forgetting_attn.py: (B, T, H, HQ, D, scale), float16
_ATTN_ROWS = [(1, 63, 1, 1, 64, 1.0), (3, 111, 2, 2, 100, 1.0), (3, 1024, 2, 8, 60, 0.1),
              (3, 1024, 2, 8, 128, 0.1), (4, 2048, 2, 8, 64, 0.1)]
FLASH = (_rows("flash_attention", "test_parallel", "B T H HQ D scale", _ATTN_ROWS,
               _tol("o dq dk dv", 0.005), group=("H", "HQ"), dtype=f16)
         + _rows("flash_attention", "test_parallel_bwd_full_value_reduction", "B T H HQ D scale",
                 [(2, 256, 2, 2, 128, 0.1)], _tol("o dq dk dv", 0.005), group=("H", "HQ"), dtype=f16))
FOX = (_rows("parallel_forgetting_attn", "test_parallel", "B T H HQ D scale", _ATTN_ROWS,
             _tol("o dq dk dv dg", 0.005), group=("H", "HQ"), dtype=f16)
       + _rows("parallel_forgetting_attn", "test_attn_parallel_with_g", "B T H HQ D scale", _ATTN_ROWS[:3],
               _tol("o dq dk dv dg", 0.005), group=("H", "HQ"), dtype=f16))

LINEAR = (_rows("chunk_linear_attn", "test_chunk", "B T H D dtype",
                [(1, 63, 1, 64, f16), (2, 500, 3, 60, f16), (2, 1000, 3, 128, f16), (3, 1000, 4, 64, f16),
                 (2, 2048, 4, 256, f16)], _tol("o ht dq dk dv dh0", 0.001))
          + _rows("chunk_linear_attn", "test_fused_recurrent", "B T H D scale dtype",
                  [(1, 64, 1, 64, None, f32), (2, 512, 4, 60, None, f32), (3, 1024, 8, 128, 1., f32),
                   (3, 1024, 8, 128, 0.1, f32), (3, 1024, 8, 128, None, f32), (2, 2048, 8, 256, None, f16),
                   (2, 2048, 4, 256, None, f16)], _tol("o ht dq dk dv dh0", 0.001)))

SIMPLE_GLA = (_rows("chunk_simple_gla", "test_chunk", "B T H D scale gln dtype",
                    [(1, 63, 1, 64, 1, 1, f16), (2, 500, 3, 60, 1, 1, f16), (1, 1000, 4, 128, 1, 0.1, f16),
                     (2, 1000, 4, 128, 0.1, 1, f16), (3, 1000, 4, 128, 0.1, 10, f16),
                     (4, 2048, 8, 64, 0.1, 1, f16)], _tol("ht dq dk dv dg dh0", 0.005, o=0.004))
              + _rows("chunk_simple_gla", "test_chunk_with_chunk_size", "B T H D scale gln dtype",
                      [(1, 64, 2, 64, 0.1, 1.0, f16)], _tol("o ht dq dk dv dg dh0", 0.005))
              + _rows("chunk_simple_gla", "test_fused_recurrent", "B T H D scale gln dtype",
                      [(1, 63, 1, 64, 1, 1, f32), (2, 500, 4, 60, 1, 1, f32), (2, 1024, 8, 128, 1, 0.1, f32),
                       (2, 1024, 8, 128, 0.1, 1, f32), (2, 1024, 8, 128, 1, 10, f32),
                       (4, 2048, 8, 64, 0.1, 1, f32), (2, 1024, 8, 128, 1, 0.1, f16),
                       (2, 1024, 8, 128, 1, 10, f16)],
                      _tol("o ht dq dk dv dh0", 0.005, dg=(0.005, 2e-4))))

GLA = (_rows("chunk_gla", "test_chunk", "B T H D gln dtype",
             [(1, 63, 1, 64, 1, f16), (2, 1024, 4, 60, 1, f16), (2, 1024, 8, 128, 0.1, f16),
              (2, 1024, 8, 128, 1, f16), (2, 1024, 8, 128, 10, f16), (4, 2048, 8, 64, 1, f16),
              (1, 128, 4, 256, 1, f16), (1, 64, 2, 320, 1, f16), (1, 128, 4, 512, 1, bf16)],
             _tol("ht dq dk dv dg dh0", 0.005, o=0.004))
       + _rows("chunk_gla", "test_fused_recurrent", "B T H D gln dtype",
               [(1, 63, 1, 64, 1, f32), (2, 1024, 4, 60, 1, f32), (2, 1024, 8, 128, 0.1, f32),
                (2, 1024, 8, 128, 1, f32), (2, 1024, 8, 128, 10, f32), (4, 2048, 8, 64, 1, f32),
                (2, 1024, 8, 128, 0.1, f16), (2, 1024, 8, 128, 10, f16)],
               _tol("o ht dq dk dv dg dh0", 0.005)))

_DELTA_TOL = _tol("dq dk dv dbeta dh0", 0.008, o=0.006, ht=0.006)
DELTA = (_rows("chunk_delta_rule", "test_chunk", "B T H D scale l2in dtype",
               [(1, 63, 1, 64, 1, False, f16), (2, 100, 4, 60, 0.1, False, f16), (2, 1000, 3, 128, 0.1, False, f16),
                (2, 1024, 4, 128, 1, True, f16), (3, 2000, 4, 128, 0.1, False, f16),
                (4, 2048, 8, 64, 0.1, False, f16)], _DELTA_TOL)
         + _rows("chunk_delta_rule", "test_chunk_with_chunk_size", "B T H D scale dtype",
                 [(1, 64, 2, 32, 0.1, bf16)], _DELTA_TOL))

_GDN_TOL = _tol("o ht", 0.005, dq=0.008, dk=0.008, dv=0.008, dbeta=0.02, dg=0.02, dh0=0.008)
_GDN_GATE_TOL = {**_GDN_TOL, "dA_log": 0.02, "ddt_bias": 0.02}
GDN = (_rows("chunk_gated_delta_rule", "test_chunk", "B T H HV D scale gln mask_p l2in dtype",
             [(4, 1024, 4, 4, 128, 0.1, 1, 1.0, False, f16), (2, 75, 4, 4, 64, 1, 0.01, 0, False, f16),
              (2, 500, 3, 3, 60, 1, 1, 0, False, f16), (2, 1000, 3, 3, 64, 0.1, 1, 0.5, False, f16),
              (3, 1024, 4, 4, 100, 1, 0.1, 0, False, f16), (4, 1024, 4, 4, 128, 0.1, 1, 0, True, f16),
              (2, 1500, 4, 4, 128, 0.1, 10, 0, False, f16), (4, 2048, 8, 8, 64, 0.1, 1, 0, False, f16),
              (2, 256, 2, 4, 64, 1, 1, 0, False, f16), (2, 512, 2, 8, 64, 1, 0.1, 0, True, f16),
              (2, 1024, 4, 8, 128, 0.1, 1, 0, False, f16)], _GDN_TOL, group=("H", "HV"))
       + _rows("chunk_gated_delta_rule", "test_chunk_with_chunk_size", "B T H HV D scale gln dtype",
               [(1, 64, 2, 4, 32, 0.1, 1.0, f32)],
               _tol("o ht dq dk dv dh0", 0.005, dbeta=0.01, dg=0.01), group=("H", "HV"))
       + _rows("chunk_gated_delta_rule", "test_fused_recurrent", "B T H HV D scale gln dtype",
               [(1, 63, 1, 1, 64, 1, 1, f32), (2, 500, 4, 4, 60, 1, 1, f32), (2, 1000, 2, 8, 128, 1, 0.1, f32),
                (3, 1024, 2, 2, 128, 0.1, 1, f32), (4, 1024, 3, 3, 128, 1, 10, f32),
                (4, 2048, 4, 4, 64, 0.1, 1, f32), (2, 1024, 4, 4, 128, 1, 0.1, f16),
                (2, 1024, 4, 8, 128, 1, 10, f16)], _tol("o ht", 0.002), group=("H", "HV"))
       + _rows("chunk_gated_delta_rule", "test_chunk_beta_sigmoid_in_kernel", "B T H HV D scale l2in neg dtype",
               [(2, 500, 4, 4, 64, 1, False, False, f16), (3, 1024, 4, 4, 128, 0.1, True, True, f16),
                (2, 1024, 4, 8, 128, 0.1, False, True, f16), (4, 2048, 8, 8, 64, 0.1, True, False, f16)],
               {**_GDN_TOL, "dg": 0.008}, group=("H", "HV"))
       + _rows("chunk_gated_delta_rule", "test_chunk_gate_in_kernel", "B T H D scale dt_bias l2in dtype",
               [(2, 75, 4, 64, 1, True, True, f16), (2, 500, 3, 60, 1, False, False, f16),
                (2, 1000, 3, 64, 0.1, True, False, f16), (3, 1024, 4, 100, 1, True, True, f16),
                (4, 1024, 4, 128, 0.1, False, True, f16), (4, 2048, 8, 64, 0.1, True, False, f16)], _GDN_GATE_TOL)
       + _rows("chunk_gated_delta_rule", "test_chunk_gate_in_kernel_gqa", "B T H HV D scale dt_bias dtype",
               [(2, 256, 2, 4, 64, 1, True, f16), (2, 512, 1, 4, 64, 0.1, False, f16),
                (2, 512, 2, 8, 64, 1, True, f16), (2, 1024, 4, 8, 128, 0.1, True, f16)],
               _GDN_GATE_TOL, group=("H", "HV"))
       + _rows("chunk_gated_delta_rule", "test_fused_recurrent_gate_in_kernel", "B T H HV D scale dt_bias dtype",
               [(1, 64, 1, 1, 64, 1, False, f32), (2, 256, 2, 2, 64, 1, True, f32), (2, 512, 2, 4, 64, 0.1, True, f16),
                (3, 1000, 2, 8, 128, 1, False, f16), (4, 1024, 4, 4, 128, 0.1, True, f16)],
               _tol("o ht", 0.002), group=("H", "HV"))
       + _rows("chunk_gated_delta_rule", "test_fused_recurrent_beta_sigmoid_in_kernel", "B T H HV D scale neg dtype",
               [(1, 64, 1, 1, 64, 1, False, f32), (2, 512, 2, 4, 64, 0.1, True, f16),
                (3, 1000, 2, 8, 128, 1, True, f16), (4, 1024, 4, 4, 128, 0.1, False, f16)],
               _tol("o ht", 0.005), group=("H", "HV")))
for _c in GDN:      # fla's gate tests without a dt_bias compare no ddt_bias
    if _c.opts.get("dt_bias") is False:
        _c.tol.pop("ddt_bias", None)

DELTA_PRODUCT = _rows("chunk_gated_delta_product", "test_chunk", "B T H D scale n l2in dtype",
                      [(1, 63, 1, 64, 0.1, 1, False, f16), (2, 200, 3, 60, 0.1, 1, False, f16),
                       (2, 1000, 4, 64, 0.1, 2, False, f16), (2, 1024, 4, 64, 1, 2, True, f16),
                       (2, 1024, 6, 100, 1, 2, False, f16), (4, 1500, 8, 128, 0.1, 3, False, f16),
                       (2, 2048, 8, 128, 1, 3, False, f16), (2, 2048, 8, 128, 1, 3, True, f16)],
                      _tol("dq dk dv dh0", 0.008, o=0.005, ht=0.005, dbeta=0.02))

_DF_ROWS = [(2, 128, 2, 64, 512, f16), (1, 256, 4, 64, 512, f16), (2, 512, 4, 64, 512, f16),
            (4, 1024, 4, 128, 512, f16), (2, 192, 2, 64, 48, f16), (1, 384, 2, 64, 96, f16)]
DELTAFORMER = (_rows("deltaformer_attn", "test_deltaformer_attn", "B T H D C dtype", _DF_ROWS,
                     _tol("dqk dv dbeta", 0.008, o=0.006), ref="fla_q_eq_k")
               + _rows("deltaformer_attn", "test_deltaformer_attn", "B T H D C dtype", _DF_ROWS,
                       _tol("dq dk dv dbeta", 0.008, o=0.006), ref="ours_float64"))
for _c in _rows("deltaformer_attn", "test_deltaformer_attn", "B T H D C dtype", _DF_ROWS,
                _tol("dqk dv dbeta", 0.008, o=0.006), ref="fla_q_eq_k"):
    _c.dtype, _c.ext = bf16, "bf16-variant"
    DELTAFORMER.append(_c)

PATH = _rows("parallel_path_attn", "test_parallel", "B T H HQ D use_g dtype",
             [(5, 512, 2, 8, 128, True, bf16), (3, 1024, 2, 8, 64, True, bf16),
              (2, 2000, 1, 4, 64, False, bf16), (1, 4000, 1, 2, 128, False, bf16)],
             _tol("dq dk dv", 0.008, o=0.005, dg=0.02, dw=0.015, dbeta=0.02), group=("H", "HQ"))
for _c in PATH:
    if not _c.opts["use_g"]:
        _c.tol.pop("dg")

MESA = _rows("chunk_mesa_net", "test_chunk", "B T H D gate dtype",
             [(1, 63, 1, 64, (0.8, 0.99), f16), (2, 500, 4, 60, (0.8, 0.99), f16),
              (2, 1024, 8, 128, (0.8, 0.99), f16), (2, 1024, 8, 128, (0.01, 0.1), f16),
              (2, 1024, 8, 128, (1, 1), f16), (4, 2048, 8, 64, (0.8, 0.99), f16)],
             _tol("dq dk dv dbeta dg dh_kk0 dh_kv0", 0.008, o=0.006, h_kk=0.008, h_kv=0.008, dlamb=0.015))

_CONV_DIMS = ("B", "T", "D", "W")
_C3 = 1e-3
CONV = (_rows("causal_conv1d", "test_conv", "B T D W act bias res dtype",
              [(2, 64, 128, 3, "swish", True, True, f32), (2, 128, 128, 4, "swish", False, True, f32),
               (2, 64, 128, 3, "swish", True, False, f32), (2, 128, 128, 4, "swish", False, False, f32),
               (2, 500, 1024, 3, None, True, True, f32), (2, 1024, 1024, 4, None, False, True, f32),
               (2, 64, 128, 3, None, True, False, f16), (2, 128, 128, 4, None, False, False, f16)],
              _tol("y dx dweight dbias dresidual", _C3), dims=_CONV_DIMS)
        + _rows("causal_conv1d", "test_conv_with_cache_prefill_fwd", "B T D W act bias res dtype",
                [(2, 64, 128, 3, "swish", True, True, f32), (2, 128, 128, 4, "swish", False, True, f32),
                 (2, 64, 128, 3, "swish", True, False, f32), (2, 128, 128, 4, "swish", False, False, f32),
                 (2, 500, 1024, 3, None, True, True, f32), (2, 1024, 1024, 4, None, False, True, f32),
                 (2, 64, 128, 3, None, True, False, f16), (2, 128, 128, 4, None, False, False, f16),
                 (2, 2, 128, 4, "swish", True, True, f32), (2, 3, 128, 4, "swish", True, True, f32),
                 (2, 4, 128, 4, "swish", True, True, f32), (2, 2, 128, 3, "swish", True, True, f32)],
                {"y": _C3, "ht": ("allclose", 1e-3, 1e-3)}, dims=_CONV_DIMS)
        + _rows("causal_conv1d", "test_conv_cache_backward", "B T D W bias res act dtype",
                [(2, 64, 100, 3, True, True, "swish", f32), (2, 128, 128, 4, True, True, "swish", f32),
                 (3, 128, 128, 4, True, True, "swish", f32), (3, 128, 256, 4, True, True, "swish", f32),
                 (3, 128, 512, 4, True, True, "swish", f32), (2, 128, 1024, 4, True, True, "swish", f32),
                 (2, 128, 2048, 3, True, True, "swish", f32), (2, 128, 4096, 4, True, True, "swish", f32),
                 (2, 128, 8192, 4, True, True, "swish", f32), (1, 1, 128, 4, True, True, "swish", f32),
                 (2, 2, 128, 4, True, True, "swish", f32), (1, 1, 64, 3, True, True, "swish", f32)],
                _tol("y ht dx dweight dbias dresidual dcache", _C3), dims=_CONV_DIMS)
        + _rows("causal_conv1d", "test_conv_cache_backward_no_final_state", "B T D W bias res act dtype",
                [(2, 64, 100, 3, True, False, "swish", f32), (2, 128, 128, 4, True, False, "swish", f32),
                 (3, 128, 128, 4, False, False, "swish", f32), (2, 64, 256, 4, True, True, "swish", f32),
                 (2, 128, 512, 4, True, False, None, f32), (2, 64, 128, 3, True, False, "swish", f16)],
                _tol("y dx dweight dbias dresidual dcache", _C3), dims=_CONV_DIMS)
        + _rows("causal_conv1d", "test_conv_dense_initial_state_backward_large_nt", "B T D",
                [(1, 8192, 4096), (1, 8192, 8192)], _tol("y dx dweight dbias dh0", _C3), dims=_CONV_DIMS,
                W=4, act="swish", dtype=f32)
        + [c for sub in ("plain", "residual", "state") for c in _rows(
            "causal_conv1d", "test_conv_non_contiguous_qkv", "B T D W act bias dtype",
            [(2, 64, 128, 3, "swish", True, f32), (2, 128, 128, 4, "swish", False, f32),
             (2, 64, 128, 3, None, True, f16)],
            _tol("y dqkv dweight dbias" + {"plain": "", "residual": " dresidual", "state": " ht dh0"}[sub], _C3),
            dims=_CONV_DIMS, sub=sub)]
        + [c for cot in ("noncontiguous", "expanded") for c in _rows(
            "causal_conv1d", "test_conv_non_contiguous_dy", "B T D W act dtype",
            [(2, 64, 128, 4, None, f32), (2, 128, 128, 3, "silu", f32), (1, 15, 64, 2, None, bf16),
             (4, 300, 32, 4, "silu", bf16)], _tol("y dx dweight dh0", _C3), dims=_CONV_DIMS, dy=cot)])
for _c in CONV:      # rows without a bias or a residual have no such gradient
    if _c.opts.get("bias") is False:
        _c.tol.pop("dbias", None)
    if _c.opts.get("res") is False:
        _c.tol.pop("dresidual", None)

# fla's varlen cases (``test_*_varlen``: ``N`` sequences packed along time, ``B = 1``, ``cu_seqlens``):
# each is checked against fla's reference run on one sequence at a time, as fla's tests do
def _vrows(op, fla, keys, rows, tol, **fixed):
    """Varlen cases: ``keys`` in fla's order; ``cu`` (fla's offsets) sets ``T``; ``HQ``/``HV`` (a
    grouped head count) becomes the group size ``G``."""
    cases = []
    for row in rows:
        r = dict(zip(keys.split(), row))
        dtype = r.pop("dtype", fixed.get("dtype", f16))
        cu = tuple(r.pop("cu"))
        d = {"B": 1, "T": cu[-1], "H": r.pop("H")}
        big = r.pop("HQ", r.pop("HV", None))
        if big is not None:
            d["G"] = big // d["H"]
        d["D"] = r.pop("D")
        opts = {**{k: v for k, v in fixed.items() if k != "dtype"}, **r, "cu": cu}
        cases.append(Case(op, fla, d, dtype, opts, dict(tol)))
    return cases


_ATTN_CU = [(2, 2, 64, [0, 15]), (2, 8, 64, [0, 256, 500, 1000]), (2, 2, 100, [0, 15, 100, 300, 1200, 2000])]
_NAIVE_CU = [(4, 64, [0, 15]), (4, 64, [0, 256, 500, 1000]), (4, 100, [0, 15, 100, 300, 1200, 2000])]
VARLEN = (
    _vrows("flash_attention", "test_parallel_varlen", "H HQ D cu", _ATTN_CU, _tol("o dq dk dv", 0.005))
    + _vrows("parallel_forgetting_attn", "test_parallel_varlen", "H HQ D cu", _ATTN_CU,
             _tol("dq dk dv dg", 0.005, o=0.004))
    + _vrows("parallel_path_attn", "test_parallel_varlen", "H HQ D use_g cu",
             [(2, 4, 128, False, [0, 15, 333, 2048]), (2, 4, 128, True, [0, 15, 333, 2048]),
              (2, 4, 64, True, [0, 841, 889, 4096]), (2, 4, 64, False, [0, 841, 889, 2000, 3000, 4096]),
              (2, 16, 128, True, [0, 500, 1023, 2000, 3000, 4096])], _tol("o dq dk dv dw dbeta dg", 0.005))
    + [c for ref in ("ours_float64", "fla_q_eq_k") for c in _vrows(
        "deltaformer_attn", "test_deltaformer_attn_varlen", "H D cu",
        [(2, 64, [0, 63]), (4, 64, [0, 256, 500, 1000]), (4, 128, [0, 15, 100, 300, 1200, 2000]),
         (2, 128, [0, 100, 123, 300, 500, 800, 1000, 1500, 2048])],
        _tol("dq dk dqk dv dbeta", 0.008, o=0.006), ref=ref)]
    + _vrows("chunk_simple_gla", "test_chunk_varlen", "H D cu", _NAIVE_CU, _tol("ht dq dk dv dg dh0", 0.005, o=0.004))
    + _vrows("chunk_gla", "test_chunk_varlen", "H D cu", _NAIVE_CU[:1] + [(4, 64, [0, 0, 16])] + _NAIVE_CU[1:],
             _tol("ht dq dk dv dg dh0", 0.005, o=0.004))
    + _vrows("chunk_delta_rule", "test_chunk_varlen", "H D cu",
             [(2, 64, [0, 15]), (3, 60, [0, 111, 500]), (3, 64, [0, 256, 500, 900, 1000]),
              (4, 100, [0, 15, 100, 300, 1200, 1599, 1800, 2000])],
             _tol("dq dk dv dbeta dh0", 0.008, o=0.005, ht=0.005))
    + _vrows("chunk_gated_delta_rule", "test_chunk_varlen", "H HV D mask_p cu",
             [(4, 4, 60, 0, [0, 15]), (4, 4, 64, 0, [0, 256, 500, 1000]), (4, 4, 64, 0.5, [0, 256, 500, 1000]),
              (4, 4, 100, 0, [0, 15, 100, 300, 1200, 2000]), (2, 4, 64, 0, [0, 256, 500, 1000]),
              (2, 8, 64, 0, [0, 256, 500, 1000])],
             _tol("o ht", 0.005, dq=0.007, dk=0.008, dv=0.007, dbeta=0.015, dg=0.015, dh0=0.007))
    + _vrows("chunk_gated_delta_rule", "test_chunk_varlen_prefill", "H D mask_p cu",
             [(4, 60, 0, [0, 8192]), (4, 60, 0, [0, 15]), (4, 64, 0, [0, 256, 500, 1000]),
              (4, 64, 0.5, [0, 256, 500, 1000]), (4, 100, 0, [0, 15, 100, 300, 1200, 2000])], _tol("o ht", 0.005))
    + _vrows("chunk_gated_delta_product", "test_chunk_varlen", "H D n cu",
             [(2, 64, 3, [0, 63]), (2, 100, 2, [0, 63, 100, 500, 1000]), (2, 128, 2, [0, 100, 300, 800, 1500, 2000]),
              (2, 256, 3, [0, 100, 123, 300, 500, 800, 1000, 1500, 2048])],
             _tol("o ht", 0.005, dq=0.007, dk=0.008, dv=0.007, dbeta=0.015, dh0=0.007))
    + _vrows("chunk_mesa_net", "test_chunk_varlen", "H D gate cu",
             [(3, 50, (0.8, 0.99), [0, 15]), (4, 64, (0.8, 0.99), [0, 14, 121, 421, 500]),
              (4, 64, (0.01, 0.1), [0, 256, 500, 1000]), (4, 100, (1, 1), [0, 15, 100, 300, 1200, 2000])],
             _tol("h_kk h_kv dq dk dv", 0.008, o=0.006, dbeta=0.015, dlamb=0.015, dg=0.015, dh_kk0=0.007,
                  dh_kv0=0.007)))
for _c in VARLEN:       # rows without a forget gate have no dg; each DeltaFormer reference its own leaves
    if _c.opts.get("use_g") is False:
        _c.tol.pop("dg")
    if _c.op == "deltaformer_attn":
        for n in (("dq", "dk") if _c.opts["ref"] == "fla_q_eq_k" else ("dqk",)):
            _c.tol.pop(n)
for _c in _rows("causal_conv1d", "test_conv_varlen", "N T D W act bias res dtype",
                [(4, 500, 128, 3, "swish", True, True, f32), (4, 1024, 200, 4, "swish", False, True, f32),
                 (4, 500, 128, 3, None, True, False, f16), (4, 1024, 1024, 4, None, False, False, f16)],
                _tol("y dx dweight dbias dresidual", _C3), dims=("T", "D", "W")):
    _c.dims = {"B": 1, **_c.dims}
    for n, on in (("dbias", "bias"), ("dresidual", "res")):
        if not _c.opts[on]:
            _c.tol.pop(n)
    VARLEN.append(_c)
# test_conv_varlen_initial_state_backward_random: fla compares the gradients; y gets their tolerance
VARLEN += _rows("causal_conv1d", "test_conv_varlen_initial_state_backward_random", "T layout D",
                [(256, "split", 128), (128 * 32 + 8192, "packed", 4096), (128 * 32 + 8192, "packed", 8192)],
                _tol("y dx dweight dbias dh0", _C3), dims=("B", "T", "D", "W"), B=1, W=4, dtype=f32)
for _c in VARLEN[-3:]:
    _c.dims = {"B": 1, "T": _c.dims["T"], "D": _c.dims["D"], "W": 4}
    _c.opts = {"layout": _c.opts["layout"]}
# test_conv_varlen_with_cache_prefill_fwd (forward only; the last two rows have sequences shorter than
# the window, whose final state keeps slots of their cache) and test_conv_varlen_non_contiguous_qkv
# (plain, with a residual, with an initial state: fla's three parts of the test)
for _c in (_rows("causal_conv1d", "test_conv_varlen_with_cache_prefill_fwd", "N T D W act bias res dtype",
                 [(3, 128, 64, 4, "swish", True, True, f32), (4, 256, 128, 3, None, False, True, f32),
                  (2, 64, 128, 4, "swish", True, False, f16), (3, 200, 64, 3, None, False, False, f16),
                  (2, 3, 64, 4, "swish", True, True, f32), (2, 3, 64, 3, None, False, True, f32)],
                 {"y": _C3, "ht": ("allclose", 1e-3, 1e-3)}, dims=("T", "D", "W"))
           + [c for sub in ("plain", "residual", "state") for c in _rows(
               "causal_conv1d", "test_conv_varlen_non_contiguous_qkv", "N T D W act bias dtype",
               [(4, 128, 64, 3, "swish", True, f32), (4, 256, 128, 4, "swish", False, f32),
                (2, 64, 128, 3, None, True, f16)],
               _tol("y dqkv dweight dbias" + {"plain": "", "residual": " dresidual", "state": " ht dh0"}[sub], _C3),
               dims=("T", "D", "W"), sub=sub)]):
    _c.dims = {"B": 1, **_c.dims}
    if _c.opts.get("bias") is False:
        _c.tol.pop("dbias", None)
    VARLEN.append(_c)

TABLES = {"flash_attention": FLASH, "parallel_forgetting_attn": FOX, "chunk_linear_attn": LINEAR,
          "chunk_simple_gla": SIMPLE_GLA, "chunk_gla": GLA, "chunk_delta_rule": DELTA,
          "chunk_gated_delta_rule": GDN, "chunk_gated_delta_product": DELTA_PRODUCT,
          "deltaformer_attn": DELTAFORMER, "parallel_path_attn": PATH, "chunk_mesa_net": MESA,
          "causal_conv1d": CONV}
CASES = [c for table in TABLES.values() for c in table] + VARLEN


# ---------------------------------------------------------------------------------------------
# CPU shapes
# ---------------------------------------------------------------------------------------------
_TIERS = {   # T kept up to; T for a long multiple of 64, for another long one; B·H (B·H of a long row); channels
    "gpu": None,
    "torch": dict(t_max=256, t_mult=192, t_other=200, bh=4, bh_long=4, d_conv=256),
    "triton": dict(t_max=130, t_mult=128, t_other=100, bh=2, bh_long=1, d_conv=128),
}
_TIER_OPS = {
    # fla's naive MesaNet forms every H_t ([B, T, H, K, K]) and writes them one token at a time: its
    # backward on a CPU grows much faster than T, so long MesaNet rows shrink as in the interpreter
    ("torch", "chunk_mesa_net"): dict(t_mult=128, t_other=100),
    # fla runs its solves for max_CG_iteration = K steps (128 at K = 128): in the interpreter one
    # head, and a long row's T is one chunk (the T = 500 row keeps two)
    ("triton", "chunk_mesa_net"): dict(bh=1, t_mult=64),
    # the convolution kernels march token by token (no chunks): 64 tokens are two of their segments
    ("triton", "causal_conv1d"): dict(t_max=64, t_mult=64, t_other=50),
}


def _tier_params(case: Case, tier: str) -> dict:
    return {**_TIERS[tier], **_TIER_OPS.get((tier, case.op), {})}


def _shrink(case: Case, tier: str) -> dict:
    """The sizes a case runs at in a tier (fla's own on the GPU)."""
    d = dict(case.dims)
    if "cu" in case.opts:             # varlen: the offsets, scaled down with T below
        d["cu"] = case.opts["cu"]
    if _TIERS[tier] is None:
        return d
    d = _shrink_dims(case, d, _tier_params(case, tier))
    if "cu" in d:
        d["cu"] = _shrink_cu(d["cu"], d["T"])
    return d


def _shrink_cu(cu, total: int) -> tuple:
    """fla's offsets scaled to ``total`` tokens: every sequence keeps its share (one token at
    least, an empty one stays empty), the rounding left over goes to the longest."""
    if cu[-1] <= total:
        return tuple(cu)
    lengths = [b - a for a, b in zip(cu, cu[1:])]
    new = [0 if n == 0 else max(1, round(n * total / cu[-1])) for n in lengths]
    new[new.index(max(new))] += total - sum(new)
    return tuple([0] + [sum(new[:i + 1]) for i in range(len(new))])


def _shrink_dims(case: Case, d: dict, p: dict) -> dict:
    """The sizes of a row in a CPU tier with parameters ``p`` (:func:`_shrink`)."""
    T, bh = d["T"], p["bh"]
    if T > p["t_max"]:
        d["T"] = p["t_mult"] if T % 64 == 0 else p["t_other"]
        bh = min(bh, p["bh_long"])
    if case.op == "causal_conv1d":
        d["B"] = min(d["B"], 2 if bh > 1 else 1)
        d["D"] = min(d["D"], p["d_conv"])
        return d
    n = case.opts.get("n", 1)          # DeltaProduct: the kernels run n steps a token
    if n > 1 and "cu" not in d:       # (fla's varlen rows count tokens, the steps n a token beside)
        d["T"] = max(1, d["T"] // n)
    G = min(d.get("G", 1), 2)
    B = min(d["B"], 2, max(1, bh // G))
    H = max(1, min(d["H"], bh // (B * G)))
    d.update(B=B, H=H)
    if "G" in d:
        d["G"] = G
    return d


# ---------------------------------------------------------------------------------------------
# builders: a row and its sizes -> inputs, our call, the reference call, upstream gradients
# ---------------------------------------------------------------------------------------------
@dataclass
class Problem:
    leaves: dict          # input name -> leaf tensor on the device (requires_grad)
    ours: object          # backend -> {output name: tensor}
    ref: object           # () -> {output name: tensor}
    cots: dict | None     # output name -> upstream gradient (None: fla compares no gradients)


def _dev(tensors: dict, device) -> dict:
    """Move CPU-built tensors to the device and make them leaves that want a gradient."""
    return {n: t.to(device).requires_grad_(True) for n, t in tensors.items()}


def _rep(x, G: int):
    """Repeat the head axis (dim 2) ``G`` times, head ``h`` serving ``h·G .. h·G + G - 1``."""
    return x if G == 1 else x.repeat_interleave(G, dim=2)


def _build_attention(c: Case, d: dict, dev) -> Problem:
    B, T, H, G, D = d["B"], d["T"], d["H"], d["G"], d["D"]
    HQ, scale, fox = H * G, c.opts["scale"], c.op == "parallel_forgetting_attn"
    x = {"q": torch.randn(B, T, HQ, D, dtype=f16), "k": torch.randn(B, T, H, D, dtype=f16),
         "v": torch.randn(B, T, H, D, dtype=f16)}
    if c.fla == "test_attn_parallel_with_g":
        x["g"] = -torch.randn(B, T, HQ, dtype=f16).abs()          # fla: N(0, 1) logits; ours: <= 0
    elif fox:
        x["g"] = torch.randn(B, T, HQ, dtype=f16).uniform_(-0.1, -0.01)
    do = torch.randn(B, T, HQ, D, dtype=f16)
    L = _dev(x, dev)
    q, k, v, g = L["q"], L["k"], L["v"], L.get("g")

    def ours(backend):
        if fox:
            return {"o": kernels.parallel_forgetting_attn(q, k, v, g, scale, backend=backend)}
        return {"o": kernels.flash_attention(q, k, v, scale, backend=backend)}

    def ref():
        if c.fla == "test_attn_parallel_with_g":
            o, _ = _fla("attn").naive_parallel_attn(q.float(), k.float(), v.float(), scale=scale, g=g.float())
            return {"o": o.to(q.dtype)}
        if fox:
            return {"o": _fla("forgetting_attn").naive_forgetting_attn(q, k, v, g, scale)}
        o, _ = _fla("attn").naive_parallel_attn(q.float(), k.float(), v.float(), scale=scale)
        return {"o": o.to(q.dtype)}
    return Problem(L, ours, ref, {"o": do.to(dev)})


def _build_linear(c: Case, d: dict, dev) -> Problem:
    B, T, H, D, dt = d["B"], d["T"], d["H"], d["D"], c.dtype
    scale = c.opts.get("scale")
    x = {n: torch.randn(B, T, H, D, dtype=dt) for n in "qkv"}
    x["h0"] = torch.randn(B, H, D, D, dtype=f32)
    L = _dev(x, dev)
    cots = {"o": torch.randn_like(L["v"]), "ht": torch.randn_like(L["h0"])}
    q, k, v, h0 = L["q"], L["k"], L["v"], L["h0"]

    def ours(backend):
        o, ht = kernels.chunk_linear_attn(q, k, v, scale, h0, True, backend=backend)
        return {"o": o, "ht": ht}

    def ref():
        naive = _fla("linear_attn").naive_recurrent_linear_attn
        if c.fla == "test_chunk":     # fla: fused_recurrent on float32 copies
            o, ht = naive(q.float(), k.float(), v.float(), initial_state=h0, output_final_state=True, normalize=False)
        else:
            o, ht = naive(q, k, v, scale=scale, initial_state=h0, output_final_state=True, normalize=False)
        return {"o": o, "ht": ht}
    return Problem(L, ours, ref, cots)


def _build_simple_gla(c: Case, d: dict, dev) -> Problem:
    B, T, H, D, dt = d["B"], d["T"], d["H"], d["D"], c.dtype
    scale, gln = c.opts["scale"], c.opts["gln"]
    x = {n: torch.randn(B, T, H, D, dtype=dt) for n in "qkv"}
    if c.fla == "test_chunk":
        g_raw = torch.randn(B, T, H, dtype=f32)
        x["h0"] = torch.rand(B, H, D, D, dtype=f32)
        dht = torch.randn_like(x["h0"])
        x["g"] = F.logsigmoid(g_raw) / gln
        do = torch.randn_like(x["v"])
    elif c.fla == "test_chunk_with_chunk_size":
        x["g"] = F.logsigmoid(torch.randn(B, T, H, dtype=f32)) / gln
        x["h0"] = torch.randn(B, H, D, D, dtype=f32)
        do, dht = torch.randn_like(x["v"]), torch.randn_like(x["h0"])
    else:                             # test_fused_recurrent
        x["g"] = F.logsigmoid(torch.randn(B, T, H, dtype=dt)) / gln
        x["h0"] = torch.randn(B, H, D, D)
        dht, do = torch.randn_like(x["h0"]), torch.randn_like(x["v"])
    L = _dev(x, dev)
    q, k, v, g, h0 = (L[n] for n in ("q", "k", "v", "g", "h0"))

    def ours(backend):
        o, ht = kernels.chunk_simple_gla(q, k, v, g, scale, h0, True, backend=backend)
        return {"o": o, "ht": ht}

    def ref():
        o, ht = _fla("simple_gla").naive_recurrent_simple_gla(q, k, v, g, scale=scale, initial_state=h0,
                                                               output_final_state=True)
        return {"o": o, "ht": ht}
    return Problem(L, ours, ref, {"o": do.to(dev), "ht": dht.to(dev)})


def _build_gla(c: Case, d: dict, dev) -> Problem:
    B, T, H, D, dt = d["B"], d["T"], d["H"], d["D"], c.dtype
    gln = c.opts["gln"]
    x = {n: torch.rand(B, T, H, D, dtype=dt) for n in "qkv"}
    x["g"] = F.logsigmoid(torch.rand(B, T, H, D, dtype=dt)) / gln
    if c.fla == "test_chunk":
        x["h0"] = torch.rand(B, H, D, D, dtype=f32)
        do = torch.randn_like(x["v"])
        dht = torch.randn(B, H, D, D, dtype=f32)
    else:                             # test_fused_recurrent
        x["h0"] = torch.rand(B, H, D, D)
        do = torch.randn_like(x["v"])
        dht = torch.randn(B, H, D, D, dtype=dt)
    L = _dev(x, dev)
    q, k, v, g, h0 = (L[n] for n in ("q", "k", "v", "g", "h0"))

    def ours(backend):
        o, ht = kernels.chunk_gla(q, k, v, g, None, h0, True, backend=backend)
        return {"o": o, "ht": ht}

    def ref():
        o, ht = _fla("gla").naive_recurrent_gla(q, k, v, g, initial_state=h0, output_final_state=True)
        return {"o": o, "ht": ht}
    return Problem(L, ours, ref, {"o": do.to(dev), "ht": dht.to(dev)})


def _build_delta(c: Case, d: dict, dev) -> Problem:
    B, T, H, D, dt = d["B"], d["T"], d["H"], d["D"], c.dtype
    scale = c.opts["scale"]
    x = {n: torch.randn(B, T, H, D, dtype=dt) for n in "qkv"}
    x["beta"] = torch.randn(B, T, H, dtype=dt).sigmoid()
    x["h0"] = torch.randn(B, H, D, D, dtype=f32)
    L = _dev(x, dev)
    q, k, v, beta, h0 = (L[n] for n in ("q", "k", "v", "beta", "h0"))
    if c.fla == "test_chunk":
        cots = {"o": torch.rand_like(v), "ht": torch.rand_like(h0)}
    else:
        cots = {"o": torch.randn_like(v), "ht": torch.randn_like(h0)}

    def ours(backend):
        o, ht = kernels.chunk_delta_rule(F.normalize(q, p=2, dim=-1), F.normalize(k, p=2, dim=-1), v, beta, scale,
                                         h0, True, backend=backend)
        return {"o": o, "ht": ht}

    def ref():    # delta_rule_recurrence scales q by K**-0.5 itself: hand it q · scale · K**0.5, in float32
        hf = lambda t: t.transpose(1, 2)          # noqa: E731  [B, T, H, ...] -> [B, H, T, ...]
        qs = F.normalize(q, p=2, dim=-1).float() * (scale * D ** 0.5)
        o, ht = _fla("delta_rule").delta_rule_recurrence(hf(qs), hf(F.normalize(k, p=2, dim=-1)), hf(v), hf(beta),
                                                         initial_state=h0, output_final_state=True)
        return {"o": o.transpose(1, 2), "ht": ht}
    return Problem(L, ours, ref, cots)


def _gdn_gate(g_raw, A_log, dt_bias):
    """fla's Gated DeltaNet gate (``naive_gdn_gate``): ``g = -exp(A_log) · softplus(g_raw + dt_bias)``."""
    g = g_raw.float() + (dt_bias.float() if dt_bias is not None else 0.0)
    return -A_log.float().exp() * F.softplus(g)


def _build_gdn(c: Case, d: dict, dev) -> Problem:
    B, T, H, G, D, dt = d["B"], d["T"], d["H"], d.get("G", 1), d["D"], c.dtype
    HV, scale, o_ = H * G, c.opts["scale"], c.opts
    x, forward_only = {}, c.fla.startswith("test_fused_recurrent")   # fla compares o and ht only
    if c.fla == "test_chunk":
        x["q"], x["k"] = torch.rand(B, T, H, D, dtype=dt), torch.rand(B, T, H, D, dtype=dt)
        x["v"] = torch.rand(B, T, HV, D, dtype=dt)
        x["beta"] = torch.rand(B, T, HV, dtype=f32).sigmoid()
        g = F.logsigmoid(torch.rand(B, T, HV, dtype=f32)) / o_["gln"]
        x["g"] = g * (torch.rand_like(g) > o_["mask_p"])
        x["h0"] = torch.zeros(B, HV, D, D, dtype=f32)
    elif c.fla == "test_chunk_with_chunk_size":
        x["q"], x["k"] = torch.rand(B, T, H, D, dtype=dt), torch.rand(B, T, H, D, dtype=dt)
        x["v"] = torch.rand(B, T, HV, D, dtype=dt)
        x["beta"] = torch.rand(B, T, HV, dtype=f32).sigmoid()
        x["g"] = F.logsigmoid(torch.rand(B, T, HV, dtype=f32)) / o_["gln"]
        x["h0"] = torch.zeros(B, HV, D, D, dtype=f32)
    elif c.fla == "test_fused_recurrent":   # float32 q, k normalised, then cast to v's dtype
        x["q"], x["k"] = torch.randn(B, T, H, D, dtype=f32), torch.randn(B, T, H, D, dtype=f32)
        x["v"] = torch.randn(B, T, HV, D, dtype=dt)
        x["beta"] = torch.rand(B, T, HV, dtype=dt).sigmoid()
        x["g"] = F.logsigmoid(torch.rand(B, T, HV, dtype=f32)) / o_["gln"]
        x["h0"] = torch.randn(B, HV, D, D, dtype=f32)
    elif c.fla == "test_fused_recurrent_gate_in_kernel":
        x["q"], x["k"] = torch.randn(B, T, H, D, dtype=dt), torch.randn(B, T, H, D, dtype=dt)
        x["v"] = torch.randn(B, T, HV, D, dtype=dt)
        x["beta"] = torch.rand(B, T, HV, dtype=dt).sigmoid()
        x["g"] = torch.randn(B, T, HV, dtype=f32)                    # raw gate input
        x["A_log"] = torch.log(torch.empty(HV, dtype=f32).uniform_(1, 16))
        if o_["dt_bias"]:
            x["dt_bias"] = torch.randn(HV, dtype=f32)
        x["h0"] = torch.randn(B, HV, D, D, dtype=f32)
    elif c.fla == "test_fused_recurrent_beta_sigmoid_in_kernel":
        x["q"], x["k"] = torch.randn(B, T, H, D, dtype=dt), torch.randn(B, T, H, D, dtype=dt)
        x["v"] = torch.randn(B, T, HV, D, dtype=dt)
        x["beta"] = torch.randn(B, T, HV, dtype=dt)                  # logits
        x["g"] = F.logsigmoid(torch.rand(B, T, HV, dtype=f32))
        x["h0"] = torch.randn(B, HV, D, D, dtype=f32)
    elif c.fla == "test_chunk_beta_sigmoid_in_kernel":
        x["q"], x["k"] = torch.rand(B, T, H, D, dtype=dt), torch.rand(B, T, H, D, dtype=dt)
        x["v"] = torch.rand(B, T, HV, D, dtype=dt)
        x["beta"] = torch.randn(B, T, HV, dtype=f32)                  # logits
        x["g"] = F.logsigmoid(torch.rand(B, T, HV, dtype=f32))
        x["h0"] = torch.zeros(B, HV, D, D, dtype=f32)
    else:                             # test_chunk_gate_in_kernel(_gqa): the gate from raw inputs
        x["q"], x["k"] = torch.rand(B, T, H, D, dtype=dt), torch.rand(B, T, H, D, dtype=dt)
        x["v"] = torch.rand(B, T, HV, D, dtype=dt)
        x["beta"] = torch.rand(B, T, HV, dtype=f32).sigmoid()
        x["g"] = torch.randn(B, T, HV, dtype=f32)                    # raw gate input
        x["A_log"] = torch.randn(HV, dtype=f32)
        if o_["dt_bias"]:
            x["dt_bias"] = torch.randn(HV, dtype=f32)
        x["h0"] = torch.zeros(B, HV, D, D, dtype=f32)
    L = _dev(x, dev)
    if forward_only:
        cots = None
    else:
        cots = {"o": torch.randn_like(L["v"]), "ht": torch.randn_like(L["h0"])}

    def inputs(grouped=False):     # ours takes fla's grouped q, k; fla's naive reference wants them repeated
        q, k = (F.normalize(L[n] if grouped else _rep(L[n], G), p=2, dim=-1) for n in "qk")
        if forward_only:
            q, k = q.to(dt), k.to(dt)
        beta, g = L["beta"], L["g"]
        if "beta_sigmoid" in c.fla:
            beta = beta.sigmoid() * (2 if o_["neg"] else 1)
        if "A_log" in L:
            g = _gdn_gate(g, L["A_log"], L.get("dt_bias"))
        return q, k, L["v"], g, beta, L["h0"]

    def ours(backend):
        q, k, v, g, beta, h0 = inputs(grouped=True)
        o, ht = kernels.chunk_gated_delta_rule(q, k, v, g, beta, scale, h0, True, backend=backend)
        return {"o": o, "ht": ht}

    def ref():
        q, k, v, g, beta, h0 = inputs()
        o, ht = _fla("gated_delta_rule").naive_recurrent_gated_delta_rule(
            q=q, k=k, v=v, beta=beta, g=g, scale=scale, initial_state=h0, output_final_state=True)
        return {"o": o, "ht": ht}
    return Problem(L, ours, ref, cots)


def _build_delta_product(c: Case, d: dict, dev) -> Problem:
    B, T, H, D, dt = d["B"], d["T"], d["H"], d["D"], c.dtype
    scale, n = c.opts["scale"], c.opts["n"]
    x = {"q": torch.randn(B, T, H, D, dtype=dt), "k": torch.randn(B, T * n, H, D, dtype=dt),
         "v": torch.randn(B, T * n, H, D, dtype=dt), "beta": torch.rand(B, T * n, H, dtype=dt).sigmoid(),
         "h0": torch.zeros(B, H, D, D, dtype=f32)}
    L = _dev(x, dev)
    q, k, v, beta, h0 = (L[n_] for n_ in ("q", "k", "v", "beta", "h0"))
    cots = {"o": torch.randn_like(q), "ht": torch.randn_like(h0)}

    def ours(backend):
        o, ht = kernels.chunk_gated_delta_product(F.normalize(q, p=2, dim=-1), F.normalize(k, p=2, dim=-1), v, None,
                                                  beta, n, scale, h0, True, backend=backend)
        return {"o": o, "ht": ht}

    def ref():
        o, ht = _fla("gated_delta_product").naive_recurrent_gated_delta_product(
            F.normalize(q, p=2, dim=-1), F.normalize(k, p=2, dim=-1), v, None, beta, scale=scale,
            initial_state=h0, output_final_state=True, num_householder=n)
        return {"o": o, "ht": ht}
    return Problem(L, ours, ref, cots)


def _build_deltaformer(c: Case, d: dict, dev) -> Problem:
    B, T, H, D, dt = d["B"], d["T"], d["H"], d["D"], c.dtype
    x = {n: torch.randn(B, T, H, D, dtype=dt) for n in "qkv"}
    x["beta"] = torch.randn(B, T, H, dtype=dt).sigmoid()
    do = torch.randn(B, T, H, D, dtype=dt)
    same = c.opts["ref"] == "fla_q_eq_k"
    if same:                          # one leaf for q and k: the conventions of the pseudo-values coincide
        x["qk"] = x.pop("q")
        x.pop("k")
    L = _dev(x, dev)
    q, k = (L["qk"], L["qk"]) if same else (L["q"], L["k"])
    v, beta = L["v"], L["beta"]

    def ours(backend):
        return {"o": kernels.deltaformer_attn(q, k, v, beta, backend=backend)}

    def ref():
        if same and dt == bf16:       # our bfloat16 rows: fla's reference on float32 copies, as fla's test_attn
            return {"o": _fla("deltaformer").naive_deltaformer_attn(q.float(), k.float(), v.float(),
                                                                    beta.float()).to(dt)}
        if same:
            return {"o": _fla("deltaformer").naive_deltaformer_attn(q, k, v, beta)}
        return {"o": kref.deltaformer_ref(q.double(), k.double(), v.double(), beta.double(), scale=D ** -0.5)}
    return Problem(L, ours, ref, {"o": do.to(dev)})


def _build_path(c: Case, d: dict, dev) -> Problem:
    B, T, H, G, D, dt = d["B"], d["T"], d["H"], d["G"], d["D"], c.dtype
    HQ, scale = H * G, D ** -0.5
    x = {"q": torch.randn(B, T, HQ, D, dtype=dt), "k": torch.randn(B, T, H, D, dtype=dt),
         "v": torch.randn(B, T, H, D, dtype=dt),
         "w": F.normalize(torch.randn(B, T, H, D, dtype=f32), dim=-1, p=2),
         "beta": torch.empty(B, T, H, dtype=f32).uniform_(1.5, 2.0)}
    if c.opts["use_g"]:
        x["g"] = torch.empty(B, T, HQ, dtype=f32).uniform_(0.95, 1).log()
    do = torch.rand(B, T, HQ, D, dtype=dt)
    L = _dev(x, dev)
    q, k, v, w, beta, g = (L.get(n) for n in ("q", "k", "v", "w", "beta", "g"))

    def ours(backend):
        o, _ = kernels.parallel_path_attn(q, k, v, w, beta, g, scale, backend=backend)
        return {"o": o}

    def ref():
        gz = g if g is not None else torch.zeros(B, T, HQ, device=q.device, dtype=f32)
        return {"o": _fla("path_attn").naive_path_attn(q, k, v, w, beta, gz, scale)}
    return Problem(L, ours, ref, {"o": do.to(dev)})


def _build_mesa(c: Case, d: dict, dev) -> Problem:
    B, T, H, D, dt = d["B"], d["T"], d["H"], d["D"], c.dtype
    lo, hi = c.opts["gate"]
    x = {"q": torch.rand(B, T, H, D, dtype=dt) / 10,
         "k": F.normalize(torch.rand(B, T, H, D, dtype=f32), p=2, dim=-1).to(dt),
         "v": torch.rand(B, T, H, D, dtype=dt) / 10,
         "beta": torch.rand(B, T, H, dtype=dt).sigmoid(),
         "g": torch.rand(B, T, H, dtype=dt).float().uniform_(lo, hi).log(),
         "lamb": torch.rand(H, D, dtype=dt).sigmoid() * 0.75 + 0.25}
    do = torch.rand_like(x["v"])
    kr = F.normalize(torch.rand(B, H, D, dtype=dt), dim=-1, p=2)
    x["h_kk0"] = (kr.unsqueeze(-1) * kr.unsqueeze(-2)).float()
    x["h_kv0"] = torch.rand(B, H, D, D, dtype=f32)
    L = _dev(x, dev)
    cots = {"o": do.to(dev), "h_kk": torch.rand_like(L["h_kk0"]), "h_kv": torch.rand_like(L["h_kv0"])}
    q, k, v, beta, g, lamb, h_kk0, h_kv0 = (L[n] for n in ("q", "k", "v", "beta", "g", "lamb", "h_kk0", "h_kv0"))

    def ours(backend):
        o, h_kk, h_kv = kernels.chunk_mesa_net(q, k, v, g, beta, lamb, D, h_kk0, h_kv0, True, backend=backend)
        return {"o": o, "h_kk": h_kk, "h_kv": h_kv}

    def ref():
        o, h_kk, h_kv = _fla("mesa_net").naive_mesa_net_exact(q, k, v, g, lamb, beta, h_kk0, h_kv0)
        return {"o": o, "h_kk": h_kk, "h_kv": h_kv}
    return Problem(L, ours, ref, cots)


def _conv_ref64(x, weight, bias=None, residual=None, initial_state=None, activation=None):
    """The convolution in float64, written as fla's test reference defines it (``F.conv1d`` with
    ``W - 1`` past inputs in front, ``weight[:, -1]`` on the current token), as windows
    (``unfold``) dotted with the weights: PyTorch's depthwise ``conv1d`` takes seconds a call in
    float64 on a CPU. Independent of :mod:`kernels`. Returns ``(y, state)``, ``state`` the last
    ``W`` rows of ``concat(initial_state, x)`` as ``[B, D, W]``; both in ``x``'s dtype, as fla's
    reference returns them (computed wide, rounded once)."""
    B, T, D = x.shape
    W = weight.shape[1]
    past = initial_state.double() if initial_state is not None else x.new_zeros(B, D, W, dtype=torch.float64)
    full = torch.cat([past, x.double().transpose(1, 2)], dim=-1)                   # [B, D, W + T]
    y = torch.einsum("bdtw,dw->bdt", full[..., 1:].unfold(-1, W, 1), weight.double())   # [B, D, T]
    if bias is not None:
        y = y + bias.double()[:, None]
    if activation in ("silu", "swish"):
        y = F.silu(y)
    y = y.transpose(1, 2)
    if residual is not None:
        y = y + residual.double()
    return y.to(x.dtype), full[..., -W:].to(x.dtype)


def _build_conv(c: Case, d: dict, dev) -> Problem:
    B, T, D, W, dt, o_ = d["B"], d["T"], d["D"], d.get("W", c.opts.get("W")), c.dtype, c.opts
    act = o_.get("act")
    x, state, ht_slots, cots = {}, None, None, {}
    if c.fla == "test_conv":
        x["x"] = torch.randn(B, T, D).to(dt)
        x["weight"] = torch.randn(D, W).to(dt)
        if o_["bias"]:
            x["bias"] = torch.randn(D).to(dt)
        if o_["res"]:
            x["residual"] = x["x"].clone()
        cots["y"] = torch.randn(B, T, D).to(dt)
    elif c.fla == "test_conv_with_cache_prefill_fwd":
        x["x"] = torch.randn(B, T, D).to(dt)
        if o_["res"]:
            x["residual"] = torch.randn(B, T, D).to(dt)
        conv = torch.nn.Conv1d(D, D, W, groups=D, bias=o_["bias"], dtype=dt)      # ShortConvolution's init
        x["weight"] = conv.weight.detach()[:, 0].clone()
        if o_["bias"]:
            x["bias"] = conv.bias.detach().clone()
        x["cache"] = torch.randn(B, D, W - 1).to(dt)
        cots, ht_slots = None, slice(1, None)
    elif c.fla.startswith("test_conv_cache_backward"):
        x["x"] = torch.randn(B, T, D, dtype=dt)
        x["weight"] = torch.randn(D, W, dtype=dt)
        if o_["bias"]:
            x["bias"] = torch.randn(D, dtype=dt)
        if o_["res"]:
            x["residual"] = torch.randn(B, T, D, dtype=dt)
        x["cache"] = torch.randn(B, D, W - 1, dtype=dt)
        cots["y"] = torch.randn_like(x["x"])
        if c.fla == "test_conv_cache_backward":
            cots["ht"], ht_slots = torch.randn_like(x["cache"]), slice(1, None)
    elif c.fla == "test_conv_dense_initial_state_backward_large_nt":
        x["x"] = torch.randn(B, T, D, dtype=f32)
        x["weight"] = torch.randn(D, W, dtype=f32)
        x["bias"] = torch.randn(D, dtype=f32)
        x["h0"] = torch.zeros(B, D, W, dtype=f32)
        x["h0"][:, :, 1:] = torch.randn(B, D, W - 1, dtype=f32)
        cots["y"] = torch.randn_like(x["x"])
    elif c.fla == "test_conv_non_contiguous_qkv":
        x["qkv"] = torch.randn(B, T, 3 * D).to(dt)
        x["weight"] = torch.randn(D, W).to(dt)
        if o_["bias"]:
            x["bias"] = torch.randn(D).to(dt)
        if o_["sub"] == "residual":
            x["residual"] = x["qkv"][:, :, D:2 * D].clone()
        if o_["sub"] == "state":
            x["h0"] = torch.randn(B, D, W).to(dt)
            ht_slots = slice(None)
        cots["y"] = torch.randn(B, T, D).to(dt)
        if o_["sub"] == "state":
            cots["ht"] = torch.randn(B, D, W).to(dt)
    else:                             # test_conv_non_contiguous_dy
        x["weight"] = torch.randn(D, W, dtype=dt)
        x["h0"] = torch.randn(B, D, W, dtype=dt)
        x["x"] = torch.randn(B, T, D, dtype=dt)
        dy = torch.randn(B, T, D, dtype=dt)
        if o_["dy"] == "noncontiguous":           # the split -> conv -> cat pattern of fused QKV
            cots["y"] = torch.cat([dy, torch.zeros_like(dy), torch.zeros_like(dy)], dim=-1)[:, :, :D]
        else:                                     # what y.sum() hands back: stride 0 everywhere
            cots["y"] = torch.ones((), dtype=dt).expand(B, T, D)
    L = _dev(x, dev)
    if cots is not None:
        cots = {n: t.to(dev) for n, t in cots.items()}
    if "cache" in L:                  # fla's [B, D, W-1] cache as its (and our) [B, D, W] state: slot 0 unused
        state = lambda: torch.cat([L["cache"].new_zeros(B, D, 1), L["cache"]], dim=-1)   # noqa: E731
    elif "h0" in L:
        state = lambda: L["h0"]       # noqa: E731
    xin = (lambda: L["qkv"][:, :, D:2 * D]) if "qkv" in L else (lambda: L["x"])         # noqa: E731
    want_state = ht_slots is not None

    def pick(y, ht):
        out = {"y": y}
        if want_state:
            out["ht"] = ht[..., ht_slots]
        return out

    def ours(backend):
        y, ht = kernels.causal_conv1d(xin(), L["weight"], L.get("bias"), L.get("residual"),
                                      state() if state else None, want_state, act, backend=backend)
        return pick(y, ht)

    def ref():
        y, ht = _conv_ref64(xin(), L["weight"], L.get("bias"), L.get("residual"), state() if state else None, act)
        return pick(y, ht)
    return Problem(L, ours, ref, cots)


# ---------------------------------------------------------------------------------------------
# varlen builders: B = 1, the sequences packed along time at ``d["cu"]``; the reference runs fla's
# naive form on one sequence at a time, as fla's varlen tests do (where fla's reference is one of
# its fused-recurrent Triton ops, on float32 copies, as those compute; see the module's docstring)
# ---------------------------------------------------------------------------------------------
def _cu_tensor(cu, dev, dtype=torch.int32):
    return torch.tensor(cu, dtype=dtype, device=dev)


def _per_sequence(cu, one) -> dict:
    """``one(s, e, i)`` (sequence ``i`` at packed positions ``s .. e - 1``) for every sequence:
    outputs over time (``o``, ``y``) concatenated along it, final states stacked along the batch."""
    outs = [one(s, e, i) for i, (s, e) in enumerate(zip(cu, cu[1:]))]
    return {n: torch.cat([o[n] for o in outs], dim=1 if n in ("o", "y") else 0) for n in outs[0]}


def _f32(*ts):
    return [t.float() if t is not None else None for t in ts]


def _vl_attention(c: Case, d: dict, dev) -> Problem:
    T, H, G, D, cu = d["T"], d["H"], d.get("G", 1), d["D"], d["cu"]
    HQ, fox = H * G, c.op == "parallel_forgetting_attn"
    x = {"q": torch.randn(1, T, HQ, D, dtype=f16), "k": torch.randn(1, T, H, D, dtype=f16),
         "v": torch.randn(1, T, H, D, dtype=f16)}
    if fox:
        x["g"] = torch.rand(1, T, HQ, dtype=f16).uniform_(-0.1, -0.01)
    do = torch.randn(1, T, HQ, D, dtype=f16)
    L, cs = _dev(x, dev), _cu_tensor(cu, dev)

    def ours(backend):
        if fox:
            return {"o": kernels.parallel_forgetting_attn(L["q"], L["k"], L["v"], L["g"], backend=backend,
                                                          cu_seqlens=cs)}
        return {"o": kernels.flash_attention(L["q"], L["k"], L["v"], backend=backend, cu_seqlens=cs)}

    def one(s, e, i):
        q, k, v = (L[n][:, s:e] for n in "qkv")
        if fox:
            return {"o": _fla("forgetting_attn").naive_forgetting_attn(q, k, v, L["g"][:, s:e])}
        return {"o": _fla("attn").naive_parallel_attn(q.float(), k.float(), v.float())[0].to(f16)}
    return Problem(L, ours, lambda: _per_sequence(cu, one), {"o": do.to(dev)})


def _vl_path(c: Case, d: dict, dev) -> Problem:
    T, H, G, D, dt, cu = d["T"], d["H"], d["G"], d["D"], c.dtype, d["cu"]
    HQ, scale = H * G, D ** -0.5
    x = {"q": torch.randn(1, T, HQ, D, dtype=dt), "k": torch.randn(1, T, H, D, dtype=dt),
         "v": torch.randn(1, T, H, D, dtype=dt), "w": F.normalize(torch.randn(1, T, H, D, dtype=f32), dim=-1, p=2),
         "beta": torch.rand(1, T, H, dtype=f32).sigmoid()}
    if c.opts["use_g"]:
        x["g"] = torch.empty(1, T, HQ, dtype=f32).uniform_(0.95, 1).log()
    do = torch.randn(1, T, HQ, D, dtype=dt)
    L, cs = _dev(x, dev), _cu_tensor(cu, dev)

    def ours(backend):
        return {"o": kernels.parallel_path_attn(L["q"], L["k"], L["v"], L["w"], L["beta"], L.get("g"), scale,
                                                backend=backend, cu_seqlens=cs)[0]}

    def one(s, e, i):
        g = L["g"][:, s:e] if "g" in L else torch.zeros(1, e - s, HQ, device=dev, dtype=f32)
        return {"o": _fla("path_attn").naive_path_attn(*(L[n][:, s:e] for n in ("q", "k", "v", "w", "beta")),
                                                       g, scale)}
    return Problem(L, ours, lambda: _per_sequence(cu, one), {"o": do.to(dev)})


def _vl_deltaformer(c: Case, d: dict, dev) -> Problem:
    T, H, D, cu = d["T"], d["H"], d["D"], d["cu"]
    x = {n: torch.randn(1, T, H, D, dtype=f16) for n in "qkv"}
    x["beta"] = torch.randn(1, T, H, dtype=f16).sigmoid()
    do = torch.randn(1, T, H, D, dtype=f16)
    same = c.opts["ref"] == "fla_q_eq_k"
    if same:                          # one leaf for q and k, as in the rows above
        x["qk"] = x.pop("q")
        x.pop("k")
    L, cs = _dev(x, dev), _cu_tensor(cu, dev)
    q, k = (L["qk"], L["qk"]) if same else (L["q"], L["k"])

    def ours(backend):
        return {"o": kernels.deltaformer_attn(q, k, L["v"], L["beta"], backend=backend, cu_seqlens=cs)}

    def one(s, e, i):
        args = (q[:, s:e], k[:, s:e], L["v"][:, s:e], L["beta"][:, s:e])
        if same:
            return {"o": _fla("deltaformer").naive_deltaformer_attn(*args)}
        return {"o": kref.deltaformer_ref(*(t.double() for t in args), scale=D ** -0.5)}
    return Problem(L, ours, lambda: _per_sequence(cu, one), {"o": do.to(dev)})


def _vl_gla(c: Case, d: dict, dev) -> Problem:
    """``chunk_simple_gla`` (scalar gate) and ``chunk_gla`` (vector gate); fla's reference is its
    fused-recurrent op, here the naive recurrence on float32 copies."""
    T, H, D, dt, cu = d["T"], d["H"], d["D"], c.dtype, d["cu"]
    N, simple = len(cu) - 1, c.op == "chunk_simple_gla"
    draw = torch.randn if simple else torch.rand
    x = {n: draw(1, T, H, D, dtype=dt) for n in "qkv"}
    if simple:
        x["g"] = F.logsigmoid(torch.randn(1, T, H, dtype=dt))
        x["h0"] = torch.randn(N, H, D, D, dtype=f32)
        cots = {"o": torch.randn_like(x["v"]), "ht": torch.randn_like(x["h0"])}
    else:
        x["g"] = F.logsigmoid(torch.rand(1, T, H, D, dtype=dt))
        x["h0"] = torch.rand(N, H, D, D, dtype=f32)
        cots = {"o": torch.randn_like(x["v"]), "ht": torch.rand(N, H, D, D, dtype=f32)}
    L, cs = _dev(x, dev), _cu_tensor(cu, dev)
    q, k, v, g, h0 = (L[n] for n in ("q", "k", "v", "g", "h0"))

    def ours(backend):
        fn = kernels.chunk_simple_gla if simple else kernels.chunk_gla
        o, ht = fn(q, k, v, g, None, h0, True, backend=backend, cu_seqlens=cs)
        return {"o": o, "ht": ht}

    def one(s, e, i):
        args = _f32(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e])
        if simple:
            o, ht = _fla("simple_gla").naive_recurrent_simple_gla(*args, scale=D ** -0.5, initial_state=h0[i:i + 1],
                                                                   output_final_state=True)
        else:
            o, ht = _fla("gla").naive_recurrent_gla(*args, initial_state=h0[i:i + 1], output_final_state=True)
        return {"o": o.to(dt), "ht": ht}
    return Problem(L, ours, lambda: _per_sequence(cu, one), {n: t.to(dev) for n, t in cots.items()})


def _vl_delta(c: Case, d: dict, dev) -> Problem:
    """fla's reference is ``fused_recurrent_delta_rule``: here ``delta_rule_recurrence`` on float32
    copies (its ``K**-0.5`` is the default scale both sides take)."""
    T, H, D, dt, cu = d["T"], d["H"], d["D"], c.dtype, d["cu"]
    N = len(cu) - 1
    x = {"q": torch.randn(1, T, H, D, dtype=dt),
         "k": F.normalize(torch.randn(1, T, H, D, dtype=f32), p=2, dim=-1).to(dt),
         "v": torch.randn(1, T, H, D, dtype=dt), "beta": torch.randn(1, T, H, dtype=dt).sigmoid(),
         "h0": torch.randn(N, H, D, D, dtype=dt)}
    L, cs = _dev(x, dev), _cu_tensor(cu, dev)
    q, k, v, beta, h0 = (L[n] for n in ("q", "k", "v", "beta", "h0"))
    cots = {"o": torch.randn_like(v), "ht": torch.rand_like(h0)}

    def ours(backend):
        o, ht = kernels.chunk_delta_rule(q, k, v, beta, None, h0, True, backend=backend, cu_seqlens=cs)
        return {"o": o, "ht": ht}

    def one(s, e, i):
        hf = lambda t: t.transpose(1, 2)          # noqa: E731  [B, T, H, ...] -> [B, H, T, ...]
        qs, ks, vs, bs, h = _f32(q[:, s:e], k[:, s:e], v[:, s:e], beta[:, s:e], h0[i:i + 1])
        o, ht = _fla("delta_rule").delta_rule_recurrence(hf(qs), hf(ks), hf(vs), hf(bs), initial_state=h,
                                                         output_final_state=True)
        return {"o": o.transpose(1, 2).to(dt), "ht": ht}
    return Problem(L, ours, lambda: _per_sequence(cu, one), cots)


def _vl_gdn(c: Case, d: dict, dev) -> Problem:
    """fla's reference here is its naive recurrence itself, in the inputs' dtype, with ``q, k``
    repeated over the groups of value heads."""
    T, H, G, D, dt, cu = d["T"], d["H"], d.get("G", 1), d["D"], c.dtype, d["cu"]
    N, HV = len(cu) - 1, H * G
    prefill = c.fla == "test_chunk_varlen_prefill"   # forward only, in inference mode, beta in dt
    x = {"q": torch.randn(1, T, H, D, dtype=dt),
         "k": F.normalize(torch.randn(1, T, H, D, dtype=f32), p=2, dim=-1).to(dt),
         "v": torch.randn(1, T, HV, D, dtype=dt)}
    g = F.logsigmoid(torch.rand(1, T, HV, dtype=dt))
    x["g"] = g * (torch.rand_like(g) > c.opts["mask_p"])
    x["beta"] = torch.rand(1, T, HV, dtype=dt if prefill else f32).sigmoid()
    x["h0"] = torch.randn(N, HV, D, D, dtype=dt)
    L, cs = _dev(x, dev), _cu_tensor(cu, dev, torch.int64)
    q, k, v, g, beta, h0 = (L[n] for n in ("q", "k", "v", "g", "beta", "h0"))
    cots = None if prefill else {"o": torch.randn_like(v), "ht": torch.rand_like(h0)}

    def ours(backend):
        with torch.inference_mode(prefill):
            o, ht = kernels.chunk_gated_delta_rule(q, k, v, g, beta, None, h0, True, backend=backend,
                                                   cu_seqlens=cs)
        return {"o": o, "ht": ht}

    def one(s, e, i):
        o, ht = _fla("gated_delta_rule").naive_recurrent_gated_delta_rule(
            q=_rep(q[:, s:e], G), k=_rep(k[:, s:e], G), v=v[:, s:e], beta=beta[:, s:e], g=g[:, s:e],
            initial_state=h0[i:i + 1], output_final_state=True)
        return {"o": o, "ht": ht}
    return Problem(L, ours, lambda: _per_sequence(cu, one), cots)


def _vl_delta_product(c: Case, d: dict, dev) -> Problem:
    """fla's reference is its ``chunk_gated_delta_product_ref``: here the naive recurrence on
    float32 copies; each token's ``n`` steps (keys, values, β) follow its offsets times ``n``."""
    T, H, D, dt, cu, n = d["T"], d["H"], d["D"], c.dtype, d["cu"], c.opts["n"]
    N = len(cu) - 1
    x = {"q": F.normalize(torch.randn(1, T, H, D, dtype=dt), dim=-1, p=2),
         "k": F.normalize(torch.randn(1, T * n, H, D, dtype=dt), dim=-1, p=2),
         "v": torch.randn(1, T * n, H, D, dtype=dt), "beta": torch.rand(1, T * n, H, dtype=dt).sigmoid(),
         "h0": torch.randn(N, H, D, D, dtype=dt)}
    L, cs = _dev(x, dev), _cu_tensor(cu, dev, torch.int64)
    q, k, v, beta, h0 = (L[n_] for n_ in ("q", "k", "v", "beta", "h0"))
    cots = {"o": torch.randn_like(q), "ht": torch.rand_like(h0)}

    def ours(backend):
        o, ht = kernels.chunk_gated_delta_product(q, k, v, None, beta, n, 1.0, h0, True, backend=backend,
                                                  cu_seqlens=cs)
        return {"o": o, "ht": ht}

    def one(s, e, i):
        args = _f32(q[:, s:e], k[:, s * n:e * n], v[:, s * n:e * n], None, beta[:, s * n:e * n])
        o, ht = _fla("gated_delta_product").naive_recurrent_gated_delta_product(
            *args, scale=1.0, initial_state=h0[i:i + 1].float(), output_final_state=True, num_householder=n)
        return {"o": o.to(dt), "ht": ht}
    return Problem(L, ours, lambda: _per_sequence(cu, one), cots)


def _vl_mesa(c: Case, d: dict, dev) -> Problem:
    """fla's varlen row calls ``chunk_mesa_net`` with its default 30 solver steps (its other rows
    pass ``K``); ours takes the same default."""
    T, H, D, dt, cu = d["T"], d["H"], d["D"], c.dtype, d["cu"]
    N, (lo, hi) = len(cu) - 1, c.opts["gate"]
    x = {"q": torch.randn(1, T, H, D, dtype=dt) / 10,
         "k": F.normalize(torch.randn(1, T, H, D, dtype=f32), p=2, dim=-1).to(dt),
         "v": torch.randn(1, T, H, D, dtype=dt) / 10,
         "g": torch.rand(1, T, H, dtype=dt).float().uniform_(lo, hi).log(),
         "beta": torch.rand(1, T, H, dtype=dt).sigmoid(),
         "lamb": torch.rand(H, D, dtype=dt).sigmoid() * 0.75 + 0.25}
    kr = F.normalize(torch.rand(N, H, D, dtype=dt), dim=-1, p=2)
    x["h_kk0"] = (kr.unsqueeze(-1) * kr.unsqueeze(-2)).float()
    x["h_kv0"] = torch.rand(N, H, D, D, dtype=f32)
    L, cs = _dev(x, dev), _cu_tensor(cu, dev, torch.int64)
    cots = {"o": torch.rand_like(L["v"]) / 10, "h_kk": torch.rand_like(L["h_kk0"]), "h_kv": torch.rand_like(L["h_kv0"])}
    q, k, v, g, beta, lamb, h_kk0, h_kv0 = (L[n] for n in ("q", "k", "v", "g", "beta", "lamb", "h_kk0", "h_kv0"))

    def ours(backend):
        o, h_kk, h_kv = kernels.chunk_mesa_net(q, k, v, g, beta, lamb, h_kk_init=h_kk0, h_kv_init=h_kv0,
                                               output_final_state=True, backend=backend, cu_seqlens=cs)
        return {"o": o, "h_kk": h_kk, "h_kv": h_kv}

    def one(s, e, i):
        o, h_kk, h_kv = _fla("mesa_net").naive_mesa_net_exact(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], lamb,
                                                              beta[:, s:e], h_kk0[i:i + 1], h_kv0[i:i + 1])
        return {"o": o, "h_kk": h_kk, "h_kv": h_kv}
    return Problem(L, ours, lambda: _per_sequence(cu, one), cots)


def _vl_conv(c: Case, d: dict, dev) -> Problem:
    """fla's ``test_conv_varlen`` (``N`` sequences cut at random points past the 16th token),
    ``test_conv_varlen_initial_state_backward_random``, ``test_conv_varlen_with_cache_prefill_fwd``
    (forward only, each sequence with its cache; fla checks the final state's last ``W - 1`` slots)
    and ``test_conv_varlen_non_contiguous_qkv`` (``k``, a strided view of a fused ``qkv``), each
    sequence against the float64 reference alone."""
    T, D, W, dt, o_ = d["T"], d["D"], d["W"], c.dtype, c.opts
    x, cu_dtype, slots = {}, torch.int64, None
    if c.fla == "test_conv_varlen":
        cut = torch.arange(16, T)[torch.randperm(T - 16)[:o_["N"] - 1]]
        cu = torch.cat([torch.tensor([0]), cut, torch.tensor([T])]).sort()[0].tolist()
        act = o_["act"]
    elif "layout" in o_:              # fla's random two-way split, or 128 sequences of 32 tokens and one of 8192
        if o_["layout"] == "split":
            cu = [0, int(torch.randint(W, T - W, (1,))), T]
        else:                         # (a CPU tier's shorter T: as many short ones as fit in half of it)
            short = max(1, 32 * T // (128 * 32 + 8192))
            k = min(128, T // 2 // short)
            cu = [short * i for i in range(k + 1)] + [T]
        act, cu_dtype = "swish", torch.int32
    else:                             # N sequences of T // N tokens, the last taking the rest, as fla splits them
        lengths = [max(1, T // o_["N"])] * o_["N"]
        lengths[-1] += T - sum(lengths)
        cu = [0] + torch.tensor(lengths).cumsum(0).tolist()
        act, cu_dtype = o_["act"], torch.int32
    N = len(cu) - 1
    prefill = c.fla == "test_conv_varlen_with_cache_prefill_fwd"
    if c.fla == "test_conv_varlen_non_contiguous_qkv":
        x["qkv"] = torch.randn(1, T, 3 * D).to(dt)
    else:
        x["x"] = torch.randn(1, T, D).to(dt)
    if prefill:
        if o_["res"]:
            x["residual"] = torch.randn(1, T, D).to(dt)
        conv = torch.nn.Conv1d(D, D, W, groups=D, bias=o_["bias"], dtype=dt)      # ShortConvolution's init
        x["weight"] = conv.weight.detach()[:, 0].clone()
        if o_["bias"]:
            x["bias"] = conv.bias.detach().clone()
    else:
        x["weight"] = torch.randn(D, W).to(dt)
        if o_.get("bias", True):
            x["bias"] = torch.randn(D).to(dt)
    if o_.get("res") and not prefill:
        x["residual"] = x["x"].clone()
    if o_.get("sub") == "residual":
        x["residual"] = x["qkv"][:, :, D:2 * D].clone()
    if "layout" in o_ or prefill:     # [N, D, W] with slot 0 unused, as fla's [N, D, W-1] cache padded
        x["h0"] = torch.zeros(N, D, W, dtype=dt)
        x["h0"][:, :, 1:] = torch.randn(N, D, W - 1, dtype=dt)
        slots = slice(1, None) if prefill else None
    if o_.get("sub") == "state":      # fla's random [N, D, W] initial state; its final state compared whole
        x["h0"] = torch.randn(N, D, W).to(dt)
        slots = slice(None)
    dy = torch.randn(1, T, D).to(dt)
    L, cs = _dev(x, dev), _cu_tensor(cu, dev, cu_dtype)
    res, h0 = L.get("residual"), L.get("h0")
    xin = (lambda: L["qkv"][:, :, D:2 * D]) if "qkv" in L else (lambda: L["x"])   # noqa: E731

    def ours(backend):
        with torch.no_grad() if prefill else contextlib.nullcontext():
            y, ht = kernels.causal_conv1d(xin(), L["weight"], L.get("bias"), res, h0, slots is not None, act,
                                          backend=backend, cu_seqlens=cs)
        return {"y": y} if slots is None else {"y": y, "ht": ht[..., slots]}

    def one(s, e, i):
        y, ht = _conv_ref64(xin()[:, s:e], L["weight"], L.get("bias"), res[:, s:e] if res is not None else None,
                            h0[i:i + 1] if h0 is not None else None, act)
        return {"y": y} if slots is None else {"y": y, "ht": ht[..., slots]}
    return Problem(L, ours, lambda: _per_sequence(cu, one), None if prefill else {"y": dy.to(dev)})


VARLEN_BUILDERS = {"flash_attention": _vl_attention, "parallel_forgetting_attn": _vl_attention,
                   "parallel_path_attn": _vl_path, "deltaformer_attn": _vl_deltaformer,
                   "chunk_simple_gla": _vl_gla, "chunk_gla": _vl_gla, "chunk_delta_rule": _vl_delta,
                   "chunk_gated_delta_rule": _vl_gdn, "chunk_gated_delta_product": _vl_delta_product,
                   "chunk_mesa_net": _vl_mesa, "causal_conv1d": _vl_conv}


BUILDERS = {"flash_attention": _build_attention, "parallel_forgetting_attn": _build_attention,
            "chunk_linear_attn": _build_linear, "chunk_simple_gla": _build_simple_gla, "chunk_gla": _build_gla,
            "chunk_delta_rule": _build_delta, "chunk_gated_delta_rule": _build_gdn,
            "chunk_gated_delta_product": _build_delta_product, "deltaformer_attn": _build_deltaformer,
            "parallel_path_attn": _build_path, "chunk_mesa_net": _build_mesa, "causal_conv1d": _build_conv}


# ---------------------------------------------------------------------------------------------
# the one helper
# ---------------------------------------------------------------------------------------------
def _grads(outs: dict, p: Problem) -> dict:
    """``d<input>`` for every leaf: the gradient of ``sum_out <out, cot_out>`` (fla's loss)."""
    if p.cots is None:
        return {}
    names = list(p.cots)
    leaves = list(p.leaves.values())
    got = torch.autograd.grad([outs[n] for n in names], leaves,
                              grad_outputs=[p.cots[n].to(outs[n].dtype) for n in names], allow_unused=True)
    return {"d" + name: g for name, g in zip(p.leaves, got)}


@pytest.fixture
def one_thread():
    """PyTorch on one thread for the CPU tiers (restored after): fla's naive references are
    thousands of small ops, and on a shared 2-core machine each of them waits for the second
    thread of the pool (the tiers ran 5-10x slower on two threads under load)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _check(case: Case, tier: str):
    dims = _shrink(case, tier)
    dev = torch.device("cuda" if tier == "gpu" else "cpu")
    backend = None if tier == "gpu" else tier
    torch.manual_seed(42)
    p = (VARLEN_BUILDERS if "varlen" in case.fla else BUILDERS)[case.op](case, dims, dev)
    ours = p.ours(backend)
    ours.update(_grads(ours, p))
    ref = p.ref()
    ref.update(_grads(ref, p))
    ref = {n: t for n, t in ref.items() if t is not None}
    assert set(ref) == set(case.tol), f"the case's tolerances {sorted(case.tol)} do not cover {sorted(ref)}"
    failures = [msg for name in case.tol if (msg := _compare(name, ref[name], ours.get(name), case.tol[name]))]
    assert not failures, (f"{case.id} at {dims} ({tier}):\n  " + "\n  ".join(failures))


_IDS = [c.id for c in CASES]


@pytest.mark.skipif(not HAS_CUDA, reason="the GPU tier runs fla's full shapes on a CUDA device")
@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_gpu(case):
    _check(case, "gpu")


@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_cpu_torch(case, one_thread):
    _check(case, "torch")


@pytest.mark.skipif(not kernels.HAS_TRITON, reason="needs the triton package")
@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_cpu_triton(case, one_thread):
    if HAS_CUDA:
        pytest.skip("the interpreter tier runs on machines without a GPU (TRITON_INTERPRET is unset here)")
    _check(case, "triton")


def test_tables_are_fla_sized():
    """Every op of API.md that fla has is covered, with the head sizes fla's tests use."""
    assert set(TABLES) == {"flash_attention", "parallel_forgetting_attn", "chunk_linear_attn", "chunk_simple_gla",
                           "chunk_gla", "chunk_delta_rule", "chunk_gated_delta_rule",
                           "chunk_gated_delta_product", "deltaformer_attn", "parallel_path_attn", "chunk_mesa_net",
                           "causal_conv1d"}
    heads = {c.dims["D"] for c in CASES if c.op != "causal_conv1d"}
    assert {60, 64, 100, 128, 256} <= heads
    assert {f32, f16, bf16} <= {c.dtype for c in CASES}
    assert len(set(_IDS)) == len(_IDS)
    for c in CASES:         # the CPU tiers keep every head size and dtype, and shrink only sizes
        for tier in ("torch", "triton"):
            d = _shrink(c, tier)
            assert d["D"] == c.dims["D"] or c.op == "causal_conv1d"
            t_max = _tier_params(c, tier)["t_max"]
            assert d["T"] <= t_max and d["B"] <= 2
            if c.dims["T"] <= t_max and c.opts.get("n", 1) == 1:
                assert d["T"] == c.dims["T"]


def test_fla_measure_and_import_hygiene():
    """In a fresh interpreter: loading fla's naive references and ``fla.utils.testing`` after
    :mod:`kernels` changes no environment variable and no torch or Triton setting, and fla's
    ``get_err_ratio`` / ``get_abs_err`` agree with this module's measure."""
    root = Path(__file__).resolve().parents[2]
    code = textwrap.dedent(f"""
        import os, sys, warnings
        sys.path.insert(0, {str(root)!r}); sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
        import torch, triton, kernels
        def snap():
            return (dict(os.environ), torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                    torch.get_float32_matmul_precision(), torch.get_default_dtype(), torch.is_grad_enabled(),
                    torch.are_deterministic_algorithms_enabled(), torch.get_num_threads(),
                    str(torch.empty(0).device), triton.knobs.runtime.interpret, kernels.INTERPRET)
        before = snap()
        import test_fla_parity as t
        for op in ("attn", "forgetting_attn", "linear_attn", "simple_gla", "gla", "delta_rule", "gated_delta_rule",
                   "gated_delta_product", "deltaformer", "path_attn", "mesa_net"):
            t._fla(op)
        assert not [m for m in sys.modules if m == "fla" or m.startswith("fla.")], "a fla package module was imported"
        assert snap() == before, "loading fla's naive references changed a setting"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from fla.utils.testing import get_abs_err, get_err_ratio
        assert snap() == before, "importing fla.utils.testing changed a setting"
        torch.manual_seed(0)
        for dt in (torch.float32, torch.float16, torch.bfloat16):
            a = torch.randn(3, 70, 5).to(dt); b = (a.float() + 1e-3 * torch.randn(3, 70, 5)).to(dt)
            rel = 1e-6 if dt == torch.float32 else 3e-2
            assert abs(t.err_ratio(a, b) - get_err_ratio(a, b)) <= rel * get_err_ratio(a, b), dt
            assert t.abs_err(a, b) == get_abs_err(a, b), dt
        print("ok")
    """)
    # the repository first, then whatever path this process was given (fla-core may be installed there)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr
