"""The house rules of the repository, checked: the NumPy foundation stands on nothing above it,
launch choices are data (no kernel module reads the environment to choose a launch), and
``kernels/`` shows the library first (the lab apart)."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_lattn_core_imports_nothing_from_kernels_or_experiments():
    code = ("import sys, lattn_core, lattn_core.notebook; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('kernels', 'experiments')); "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    for path in (ROOT / "lattn_core").glob("*.py"):
        assert not re.search(r"^\s*(from|import)\s+(kernels|experiments)\b", path.read_text(), re.M), path


def test_no_shipped_kernel_module_reads_the_environment():
    """Only the package's entry (which turns the interpreter on when there is no GPU), the backend
    (which records whether it is on) and the benchmarks (fla's pure-Triton switch; ``bench*.py``,
    and survey.py, the benchmark of every op) touch os.environ."""
    allowed = {"__init__.py", "backend.py", "compile.py", "harness.py", "survey.py"}
    for path in (ROOT / "kernels").rglob("*.py"):
        if "lab" in path.parts or path.name in allowed or path.name.startswith("bench"):
            continue
        assert "os.environ" not in path.read_text(), path


def test_kernels_without_lab_is_small():
    """A reader opening ``kernels/`` sees the library: a dozen shared modules, and per family
    folder its op, stages, plan, benchmark, results and notes (at most a dozen files), the lab apart."""
    shared = [p for p in (ROOT / "kernels").iterdir() if p.is_file()]
    assert len(shared) <= 12, sorted(p.name for p in shared)
    families = sorted(p for p in (ROOT / "kernels").iterdir() if (p / "op.py").exists())
    assert [p.name for p in families] == ["conv", "delta", "deltaformer", "flash", "gla", "mesa", "path"]
    for d in families:
        files = [p for p in d.rglob("*") if p.is_file() and "lab" not in p.parts and "__pycache__" not in p.parts]
        assert len(files) <= 12, sorted(str(p.relative_to(ROOT)) for p in files)
        for name in ("__init__.py", "op.py", "plan.py", "bench.py", "NOTES.md"):
            assert (d / name).exists(), d / name


def test_every_family_has_its_benchmark_of_record_or_says_it_has_none():
    """A family's ``results.json`` is written only by its benchmark on a GPU. Until that has run, its
    NOTES.md must say so under a heading that starts "Not yet measured" (kernels.catalog.family_measured,
    which the model map and the book use too), and never both."""
    from kernels.catalog import family_measured
    for d in sorted(p for p in (ROOT / "kernels").iterdir() if (p / "op.py").exists()):
        says_untimed = re.search(r"^#+ Not yet measured", (d / "NOTES.md").read_text(), re.M) is not None
        assert family_measured(d) != says_untimed, f"{d.name}: results.json and 'Not yet measured' both"


def _kernel_imports():
    """(file, imported module path under kernels, names) for every ``from ..x import a, b`` of the
    shipped kernel modules (the lab apart)."""
    import ast
    out = []
    for path in (ROOT / "kernels").rglob("*.py"):
        if "lab" in path.parts:
            continue
        rel = path.relative_to(ROOT / "kernels")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 1:
                base = list(rel.parts[:-1])[:len(rel.parts) - node.level]
                target = base + (node.module.split(".") if node.module else [])
                out.append((rel, target, [a.name for a in node.names]))
    return out


FAMILIES = {"conv", "delta", "deltaformer", "flash", "gla", "mesa", "path"}


def test_no_family_imports_another_familys_private_name():
    """Stages two families use live on the common floor (kernels/common) under public names; a
    family may call another's public stage, never a private one (a name starting with _)."""
    bad = [(str(f), ".".join(t), n) for f, t, names in _kernel_imports() for n in names
           if f.parts[0] in FAMILIES and t and t[0] in FAMILIES and t[0] != f.parts[0] and n.startswith("_")]
    assert not bad, bad


def test_common_floor_imports_no_family():
    """kernels/common stands under every family: it imports none of them."""
    bad = [(str(f), ".".join(t)) for f, t, _ in _kernel_imports() if f.parts[0] == "common" and t and t[0] in FAMILIES]
    assert not bad, bad
