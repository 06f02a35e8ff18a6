"""The house rules of the repository, checked: the NumPy foundation stands on nothing above it,
launch choices are data (no kernel module reads the environment to choose a launch),
``kernels/`` shows the library first (the lab apart), each family's NOTES.md says today first (its
rounds in HISTORY.md), and every lab keeps scripts and the logs its claims cite, in one layout."""
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


PROLOGUE_NAME = re.compile(r"^i_[a-z]+$")


def _program_id_bindings(root):
    """(file, line, name) for every name a statement binds from an expression that calls
    ``program_id`` (``x = tl.program_id(0)``, ``x = tl.program_id(1).to(tl.int64)``,
    ``x = tl.program_id(0) * BR + tl.arange(0, BR)``, tuple targets, annotated and augmented
    assignments, ``:=``), in every kernel module outside a lab."""
    import ast

    def calls_program_id(node):
        return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "program_id"
                   for n in ast.walk(node))

    out = []
    for path in sorted((root / "kernels").rglob("*.py")):
        if "lab" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
                targets, value = [node.target], node.value
            else:
                continue
            if value is None or not calls_program_id(value):
                continue
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        out.append((str(path.relative_to(root)), n.lineno, n.id))
    return out


def test_kernel_prologues_speak_one_dialect():
    """One naming dialect for kernel prologues, fla's (``fla/ops``): a program id, and an index that
    a statement computes from one, is named ``i_`` + what it counts (``i_b``, ``i_h``, ``i_bh``,
    ``i_t``, ``i_k``, ``i_v``, ``i_m``, ``i_mbh``, ...); offsets built from it are a separate
    statement (``o_r = i_r * BR + tl.arange(0, BR)``), never the program id itself."""
    found = _program_id_bindings(ROOT)
    # the walk sees every floor: a broken walk must not pass by finding nothing
    assert {f.split("/")[1] for f, _, _ in found} >= FAMILIES | {"common"}, sorted({f for f, _, _ in found})
    bad = [f"{f}:{line}: {name}" for f, line, name in found if not PROLOGUE_NAME.match(name)]
    assert not bad, "program ids outside the i_<what> dialect:\n" + "\n".join(bad)


def test_kernel_offsets_use_one_prefix():
    """Offset vectors are ``o_*`` (fla's prefix: ``o_t``, ``o_k``, ``o_dv``), never Triton's
    tutorial ``offs_*`` beside them: no kernel module outside a lab names anything ``offs_*``."""
    import ast
    bad = []
    for path in sorted((ROOT / "kernels").rglob("*.py")):
        if "lab" in path.relative_to(ROOT).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.id if isinstance(node, ast.Name) else node.arg if isinstance(node, ast.arg) else None
            if name and name.startswith("offs_"):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert not bad, bad


# --- the notes and the lab -----------------------------------------------------------------------

def _tracked(*paths):
    res = subprocess.run(["git", "ls-files", "--", *paths], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    return [ROOT / f for f in res.stdout.split()]


def _families():
    return sorted(p for p in (ROOT / "kernels").iterdir() if (p / "op.py").exists())


def test_every_lab_holds_scripts_and_their_logs_apart():
    """One lab layout: ``lab/*.py`` are the scripts, ``lab/logs/`` holds what they (and the GPU runs
    the notes cite) wrote; nothing else lies in a lab, and no script hides among the logs."""
    bad = []
    for d in _families():
        for f in _tracked(str((d / "lab").relative_to(ROOT))):
            rel = f.relative_to(d / "lab")
            ok = (len(rel.parts) == 1 and f.suffix == ".py") or (rel.parts[0] == "logs" and f.suffix != ".py")
            if not ok:
                bad.append(str(f.relative_to(ROOT)))
    assert not bad, bad


def test_every_lab_log_is_cited():
    """A log stays only while a claim cites it: its name appears in the family's NOTES.md or
    HISTORY.md, or in code, a test or a notebook (a pattern such as ``bench_gla_round5_*.log``
    counts for the files it matches)."""
    import fnmatch
    texts = [f.read_text() for f in _tracked("kernels", "tests", "tools", "lattn_core", "experiments",
                                            "notebooks", "book")
             if f.suffix in (".py", ".md", ".ipynb") and "/lab/logs/" not in str(f)]
    patterns = {m for t in texts for m in re.findall(r"[\w.-]*\*[\w.*-]*\.(?:log|json|txt|jsonl)", t)}
    uncited = []
    for d in _families():
        for log in _tracked(str((d / "lab" / "logs").relative_to(ROOT))):
            if not any(log.name in t for t in texts) and not any(fnmatch.fnmatch(log.name, p) for p in patterns):
                uncited.append(str(log.relative_to(ROOT)))
    assert not uncited, f"logs no claim cites (delete them, or cite them): {uncited}"


def test_notes_cite_only_logs_that_exist():
    """Every ``lab/logs/<name>`` that a family's NOTES.md names is there (HISTORY.md may name logs
    that git history holds; it says where)."""
    missing = []
    for d in _families():
        for name in re.findall(r"(?<![\w/])lab/logs/([\w.*-]+\w)", (d / "NOTES.md").read_text()):
            if not list((d / "lab" / "logs").glob(name)):
                missing.append(f"{d.name}: lab/logs/{name}")
    assert not missing, missing


def test_notes_say_today_first_and_history_keeps_the_rounds():
    """NOTES.md is today's state, short enough to read: the op(s), the design, the plan, the
    measurements, how to reproduce them, what is open, in that order (a derivation may follow as an
    appendix), at most 240 lines before the appendix. The rounds live in HISTORY.md beside it."""
    order = ("op", "design", "plan", "measure", "reproduce", "open")
    for d in _families():
        text = (d / "NOTES.md").read_text()
        body = text.split("\n## Appendix")[0]
        assert len(body.splitlines()) <= 240, (d.name, len(body.splitlines()))
        heads = [h.lower() for h in re.findall(r"^## (.+)$", body, re.M)]
        at = [next((i for i, h in enumerate(heads) if word in h), None) for word in order]
        assert None not in at and at == sorted(at), (d.name, heads)
        assert not re.search(r"^#+ .*\bRound \d", body, re.M), f"{d.name}: a round's diary in NOTES.md"
        assert (d / "HISTORY.md").exists(), d / "HISTORY.md"


def test_no_package_code_or_chapter_reads_the_lab():
    """What the book reads ships outside ``lab/``: no string a shipped module uses (docstrings and
    comments aside) and no chapter's code names a path under a lab."""
    import ast
    import json
    bad = []
    for path in [*(ROOT / "kernels").rglob("*.py"), *(ROOT / "lattn_core").rglob("*.py"),
                 *(ROOT / "experiments").rglob("*.py")]:
        if "lab" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                    and re.search(r"(^|/)lab/", node.value):
                bad.append(f"{path.relative_to(ROOT)}: {node.value!r}")
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            src = "".join(cell["source"])
            if cell["cell_type"] == "code" and re.search(r"(^|[/'\"])lab/", src, re.M):
                bad.append(f"{nb.name}: a code cell names lab/")
    assert not bad, bad
