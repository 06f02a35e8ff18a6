"""The model map: for each model of the book, its NumPy forms, its op, its kernel family and chapter.

:data:`MODELS` is the data, one record per model; :func:`model_map` checks every name in it against
the code (the ``lattn_core`` functions, the ``kernels`` op, the family's folder with its benchmark
and results file, the chapter's notebook) and returns the rows the book's appendix shows. A name
that does not exist raises :class:`LookupError`, so the map cannot drift from the code silently.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Model", "MODELS", "model_map", "family_measured"]

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent


@dataclass(frozen=True)
class Model:
    """One model: its ``lattn_core`` forms (``None`` where the model has none), its ``kernels`` op
    and family (``None`` where there is no kernel), and the chapters that treat it, as chapter
    numbers and the notebooks' names (``NN_name``, without ``.ipynb``)."""
    name: str
    recurrent: str | None
    parallel: str | None
    chunkwise: str | None
    op: str | None
    family: str | None
    chapters: tuple
    notebooks: tuple


MODELS = (
    Model("softmax attention", "softmax_attention_recurrent", "softmax_attention", "softmax_attention_chunkwise",
          "flash_attention", "flash", (1,), ("01_quadratic_cost",)),
    Model("linear attention", "linear_attention_recurrent", "linear_attention_parallel",
          "linear_attention_chunkwise", "chunk_linear_attn", "gla", (2,), ("02_linear_attention",)),
    Model("RetNet / scalar decay", "decay_attention_recurrent", "decay_attention_parallel",
          "decay_attention_chunkwise", "chunk_simple_gla", "gla", (3,), ("03_forget_gates",)),
    Model("GLA (vector gate)", "gla_attention_recurrent", "gla_attention_parallel", "gla_attention_chunkwise",
          "chunk_gla", "gla", (3,), ("03_forget_gates",)),
    Model("DeltaNet", "deltanet_recurrent", "deltanet_parallel", "deltanet_chunkwise",
          "chunk_delta_rule", "delta", (5, 6), ("05_delta_rule", "06_inverse_trick")),
    Model("Gated DeltaNet", "gated_deltanet_recurrent", "gated_deltanet_parallel", "gated_deltanet_chunkwise",
          "chunk_gated_delta_rule", "delta", (6,), ("06_inverse_trick",)),
    Model("Comba", "comba_recurrent", "comba_parallel", "comba_chunkwise", "chunk_comba", "delta", (6,),
          ("06_inverse_trick",)),
    Model("DeltaProduct", "deltaproduct_recurrent", "deltaproduct_parallel", "deltaproduct_chunkwise",
          "chunk_gated_delta_product", "delta", (6,), ("06_inverse_trick",)),
    Model("FoX (forget-gated softmax; ALiBi its constant gate)", "fox_attention_recurrent", "fox_attention_parallel",
          "fox_attention_chunkwise", "parallel_forgetting_attn", "flash", (7,), ("07_feeding_back",)),
    Model("DeltaFormer (the delta rule inside softmax)", "deltaformer_recurrent", "deltaformer_parallel",
          "deltaformer_chunkwise", "deltaformer_attn", "deltaformer", (8,), ("08_deltaformer",)),
    Model("PaTH (Householder products as position encoding)", "path_attention_recurrent", "path_attention_parallel",
          "path_attention_chunkwise", "parallel_path_attn", "path", (9,), ("09_path",)),
    Model("MesaNet (the regression solved exactly)", "mesanet_recurrent", "mesanet_parallel", "mesanet_chunkwise",
          "chunk_mesa_net", "mesa", (10,), ("10_mesanet",)),
)


def family_measured(folder) -> bool:
    """Whether a kernel family has its benchmark of record: ``True`` when ``results.json`` exists,
    ``False`` when it does not and the family's ``NOTES.md`` says so under a heading that starts
    "Not yet measured" (a family whose benchmark has not yet run on a GPU); else
    :class:`LookupError`, so a family is never silently untimed."""
    import re
    folder = Path(folder)
    if (folder / "results.json").is_file():
        return True
    notes = folder / "NOTES.md"
    if notes.is_file() and re.search(r"^#+ Not yet measured", notes.read_text(), re.M):
        return False
    raise LookupError(f"kernels/{folder.name}: no results.json, and NOTES.md does not say 'Not yet measured'")


def _check(ok: bool, what: str):
    if not ok:
        raise LookupError(f"model map: {what}")


def model_map(models=MODELS, *, root=None, check_notebooks: bool | None = None) -> list:
    """The rows of the model map, after checking every name in ``models`` against the code.

    Each row is a dict: ``model``, ``recurrent``, ``parallel``, ``chunkwise`` (``lattn_core``
    names or ``None``), ``op`` (a ``kernels`` name or ``None``), ``family``, ``folder``
    (``kernels/<family>/``), ``bench`` (the command that writes the benchmark of record),
    ``results`` (its file; ``None`` while the family is not yet measured, see
    :func:`family_measured`), ``chapters`` and ``notebooks``. Raises :class:`LookupError` naming the
    first thing that does not exist: a ``lattn_core`` function, a ``kernels`` op, the family's
    ``op.py``/``bench.py``/``results.json``, or (with ``check_notebooks``) the chapter's notebook under
    ``root`` (default: this repository's checkout), whose name must start with the chapter's number.
    ``check_notebooks`` defaults to whether ``root`` has a ``notebooks`` folder: a checkout has one,
    the installed package (a reader's ``pip install``, Colab) has none. A family without ``results.json`` must say in its
    ``NOTES.md`` that it is not yet measured.
    """
    import kernels
    import lattn_core
    root = Path(root) if root is not None else REPO_ROOT
    if check_notebooks is None:
        check_notebooks = (root / "notebooks").is_dir()
    rows = []
    for m in models:
        forms = {"recurrent": m.recurrent, "parallel": m.parallel, "chunkwise": m.chunkwise}
        _check(any(forms.values()), f"{m.name} names no lattn_core form")
        for form, fn in forms.items():
            if fn is not None:
                _check(fn in lattn_core.__all__ and callable(getattr(lattn_core, fn, None)),
                       f"{m.name}: lattn_core has no public function {fn!r} ({form} form)")
        _check((m.op is None) == (m.family is None), f"{m.name}: an op needs a family and a family an op")
        row = dict(model=m.name, **forms, op=m.op, family=m.family, folder=None, bench=None, results=None,
                   chapters=tuple(m.chapters), notebooks=tuple(m.notebooks))
        if m.op is not None:
            _check(m.op in kernels.__all__ and callable(getattr(kernels, m.op, None)),
                   f"{m.name}: kernels has no public op {m.op!r}")
            folder = PACKAGE_DIR / m.family
            for name in ("op.py", "bench.py"):
                _check((folder / name).is_file(), f"{m.name}: no kernels/{m.family}/{name}")
            try:
                measured = family_measured(folder)
            except LookupError as e:
                raise LookupError(f"model map: {m.name}: {e}") from None
            family = importlib.import_module(f"kernels.{m.family}")
            _check(getattr(family, m.op, None) is getattr(kernels, m.op),
                   f"{m.name}: kernels.{m.op} is not the op of kernels.{m.family}")
            row.update(folder=f"kernels/{m.family}/", bench=f"python -m kernels.{m.family}.bench --write",
                       results=f"kernels/{m.family}/results.json" if measured else None)
        _check(len(m.chapters) == len(m.notebooks) > 0, f"{m.name}: one notebook per chapter")
        for ch, nb in zip(m.chapters, m.notebooks):
            _check(nb.startswith(f"{int(ch):02d}_"), f"{m.name}: notebook {nb!r} is not chapter {ch}'s")
            if check_notebooks:
                _check((root / "notebooks" / f"{nb}.ipynb").is_file(), f"{m.name}: no notebooks/{nb}.ipynb")
        rows.append(row)
    return rows
