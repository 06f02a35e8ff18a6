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
    (which records whether it is on) and the benchmarks (fla's pure-Triton switch) touch os.environ."""
    allowed = {"__init__.py", "backend.py", "compile.py", "bench.py", "harness.py"}
    for path in (ROOT / "kernels").rglob("*.py"):
        if "lab" in path.parts or path.name in allowed:
            continue
        assert "os.environ" not in path.read_text(), path


def test_kernels_without_lab_is_small():
    files = [p for p in (ROOT / "kernels").rglob("*") if p.is_file() and "lab" not in p.parts
             and "__pycache__" not in p.parts]
    assert len(files) < 40, sorted(str(p.relative_to(ROOT)) for p in files)
    for family in ("flash", "gla", "delta"):
        d = ROOT / "kernels" / family
        for name in ("__init__.py", "op.py", "plan.py", "bench.py", "NOTES.md", "results.json"):
            assert (d / name).exists(), d / name
