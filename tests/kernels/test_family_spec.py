"""Each kernel family describes its ops once, in its ``bench.py`` (the records of
:mod:`kernels.harness`): ``OPS`` (per op its name, the ``kernels`` op, fla's counterpart, both calls,
the inputs it differentiates, its survey entry), ``make_inputs`` and ``COMPILE`` (the compile
check's modules and calls). The benchmark, the survey (``kernels/survey.py``) and the compile check
(``kernels/compile.py``) read that description and hold none of their own; checked here on the CPU:
every family declares the same fields, the survey's ops are the families' surveyed ops with their
inputs from the families' makers, the compile check runs the family's declared calls, every
op's inputs and our call run at a tiny shape, and every family's ``plan_for`` takes its arguments in
one order."""
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernels
from kernels import harness

ROOT = Path(__file__).resolve().parents[2]
FIELDS = ("OPS", "make_inputs", "COMPILE", "cases", "reference", "CONFIG", "RUN")
TINY = dict(B=2, T=12, H=2, K=8, V=8, D=8)       # conv's D is its channels: 16 below


def _bench(family):
    return importlib.import_module(f"kernels.{family}.bench")


def _tiny(case):
    return dict(case, **{k: v for k, v in TINY.items() if k != "D"}, D=16 if case["op"] == "conv" else TINY["D"])


def test_the_families_are_the_folders():
    folders = {p.name for p in (ROOT / "kernels").iterdir() if (p / "op.py").exists()}
    assert set(kernels.FAMILIES) == folders and len(kernels.FAMILIES) == len(folders)


@pytest.mark.parametrize("family", kernels.FAMILIES)
def test_every_family_declares_the_same_fields(family):
    import triton
    from kernels.backend import GPU_CLASSES
    bench = _bench(family)
    missing = [f for f in FIELDS if not hasattr(bench, f)]
    assert not missing, (family, missing)
    assert isinstance(bench.OPS, tuple) and bench.OPS and all(isinstance(o, harness.Op) for o in bench.OPS)
    names = [o.name for o in bench.OPS]
    assert len(set(names)) == len(names), names
    for op in bench.OPS:
        assert op.kernel in kernels.__all__ and callable(getattr(kernels, op.kernel)), op
        assert op.grads and "." in op.fla and callable(op.ours) and callable(op.peer), op
        assert op.survey is None or (isinstance(op.survey, harness.Surveyed) and callable(op.survey.case)), op
    assert {c["op"] for c in bench.cases(quick=True)} <= set(harness.benched(bench.OPS))
    if "ops" in bench.RUN:          # the benchmark's --ops: the ops it times
        assert tuple(bench.RUN["ops"]) == harness.benched(bench.OPS)
    # the compile check's declaration: modules holding jit kernels, calls for every class
    spec = bench.COMPILE
    assert isinstance(spec, harness.CompileCases) and callable(spec.run)
    for name in spec.modules:
        mod = importlib.import_module(name)
        assert any(isinstance(o, triton.runtime.jit.KernelInterface) for o in vars(mod).values()), name
    for caps in GPU_CLASSES.values():
        half = torch.bfloat16 if caps.major >= 8 else torch.float16
        quick = spec.cases(caps, True, half, (half, torch.float16))
        assert quick and len(spec.cases(caps, False, half, (half, torch.float16))) >= len(quick)


@pytest.mark.parametrize("family", kernels.FAMILIES)
def test_every_plan_for_takes_one_argument_order(family):
    """``plan_for(dtype, device, *, <shapes and case arguments>, caps=None, interpret=INTERPRET,
    **overrides)`` in every family (and the flash backward's ``backward_plan_for``): ``dtype`` and
    ``device`` the only positional parameters, everything else keyword-only, ``caps`` and
    ``interpret`` the last named ones, ``**overrides`` (where a family has it) the very last."""
    from kernels.backend import INTERPRET
    plan = importlib.import_module(f"kernels.{family}.plan")
    fns = [plan.plan_for] + ([plan.backward_plan_for] if family == "flash" else [])
    P = inspect.Parameter
    for fn in fns:
        params = list(inspect.signature(fn).parameters.values())
        where = f"kernels.{family}.plan.{fn.__name__}{inspect.signature(fn)}"
        assert [(p.name, p.kind, p.default) for p in params[:2]] == \
            [("dtype", P.POSITIONAL_OR_KEYWORD, P.empty), ("device", P.POSITIONAL_OR_KEYWORD, P.empty)], where
        rest = params[2:]
        if rest and rest[-1].kind is P.VAR_KEYWORD:
            assert rest[-1].name == "overrides", where
            rest = rest[:-1]
        assert rest and all(p.kind is P.KEYWORD_ONLY for p in rest), where
        assert [(p.name, p.default) for p in rest[-2:]] == [("caps", None), ("interpret", INTERPRET)], where


def test_fla_counterparts_resolve():
    """Every op's peer is a name that exists (fla's module and attribute; DeltaFormer's, our loader)."""
    pytest.importorskip("fla")
    for family in kernels.FAMILIES:
        for op in _bench(family).OPS:
            assert harness.resolve(op.fla) is not None, op.fla
    with pytest.raises((ImportError, AttributeError)):
        harness.resolve("fla.ops.no_such_module.chunk_nothing")


@pytest.mark.parametrize("family", kernels.FAMILIES)
def test_benchmark_inputs_impls_and_our_call_on_cpu(family):
    """Every benchmark case, at a tiny shape on the CPU: the inputs are [B, T, ...] (the weight and
    MesaNet's lamb apart), hold every input the op differentiates, the implementations are ours and
    the peer (flash's attention: and SDPA), and ours (its PyTorch path) matches the float64 reference."""
    bench = _bench(family)
    impls = harness.bench_impls(bench)
    for case in bench.cases(quick=True):
        case = _tiny(case)
        op = harness.op_named(bench.OPS, case["op"])
        x = bench.make_inputs(case, device="cpu", dtype=torch.float32)
        assert set(op.grads) <= set(x), (case, set(x))
        for n, t in x.items():
            if n not in ("weight", "lamb"):
                assert t.shape[:2] == (case["B"], case["T"]), (case, n, t.shape)
        fns = impls(case)
        assert list(fns)[0] == "ours" and op.peer_impl in fns, (case, list(fns))
        assert set(fns) == {"ours", op.peer_impl} | ({"sdpa"} if case["op"] == "attention" else set())
        o = fns["ours"](**x)
        x64 = {n: t.double() for n, t in x.items()}
        ref = bench.reference(case, x64)
        assert o.shape == ref.shape and torch.isfinite(o).all(), case
        tol = 1e-4 if case.get("cg", TINY["K"]) >= TINY["K"] else 0.5     # CG is exact after K steps
        assert harness.err_ratio(o, ref) < tol, (case, harness.err_ratio(o, ref))


def test_the_benchmarks_inputs_are_reproducible():
    """A case's inputs depend on the case and the seed only (the benchmark's default seed)."""
    bench = _bench("delta")
    case = _tiny(dict(op="gated_delta_rule", B=2, T=12, gates="float32"))
    a, b = (bench.make_inputs(case, device="cpu", dtype=torch.float32) for _ in range(2))
    assert all(torch.equal(a[n], b[n]) for n in a)
    c = bench.make_inputs(case, device="cpu", dtype=torch.float32, seed=5)
    assert not torch.equal(a["q"], c["q"])
    with pytest.raises(ValueError, match="dtype field"):
        bench.make_inputs(dict(case, gates="float16"), device="cpu")


def test_the_survey_reads_the_families():
    """The survey's ops are exactly the ops the families enter in it, in the book's order (chapters
    never decrease), with each op's differentiated inputs and fla's name as its family declares
    them; its inputs are its family's make_inputs at the op's case, and our op runs on them."""
    from kernels import survey
    declared = {}
    for family in kernels.FAMILIES:
        bench = _bench(family)
        for op in bench.OPS:
            if op.survey is not None:
                assert op.kernel not in declared, f"{op.kernel} entered twice"
                declared[op.kernel] = (bench, op)
    assert set(survey.OPS) == set(declared) and set(survey.FLA_NAMES) == set(declared)
    chapters = [declared[name][1].survey.chapter for name in survey.OPS]
    assert chapters == sorted(chapters), list(zip(survey.OPS, chapters))
    assert survey.CONFIG["fla_names"] == {name: op.fla for name, (_, op) in declared.items()}
    for name, (bench, op) in declared.items():
        assert survey.OPS[name] == op.grads and survey.FLA_NAMES[name] == op.fla
        B, T, heads, dim = 2, 10, 2, 8
        x = survey.make_inputs(name, B, T, heads=heads, dim=dim, device="cpu", dtype=torch.float32)
        case = op.survey.case(B, T, heads, dim)
        mine = bench.make_inputs(case, device="cpu", dtype=torch.float32, seed=7 * T + B)
        assert set(x) == set(mine) and all(torch.equal(x[n], mine[n]) for n in x), name
        assert [n for n in op.grads if n in x], name         # something to differentiate
        assert torch.isfinite(survey.our_fn(name)(**x)).all(), name
        assert callable(survey.fla_fn(name)) or isinstance(survey.fla_fn(name), Exception)


def test_the_compile_check_runs_the_familys_declared_calls(monkeypatch):
    """kernels.compile asks the family's COMPILE for its calls with the class's 16-bit dtypes and
    runs each with the class's capabilities, capturing the launches of its modules."""
    from kernels import backend, compile as kc
    from kernels.backend import GPU_CLASSES
    seen = []
    stub = harness.CompileCases((), lambda caps, quick, half, halves: seen.append((caps, quick, half, halves)) or [1, 2],
                                lambda case, caps: seen.append((case, caps)))
    monkeypatch.setattr(backend, "INTERPRET", False)
    monkeypatch.setattr(_bench("conv"), "COMPILE", stub)
    assert kc.family_launches("conv", True, GPU_CLASSES[89]) == []
    t4 = GPU_CLASSES[75]
    kc.family_launches("conv", False, t4)
    assert seen == [(GPU_CLASSES[89], True, torch.bfloat16, (torch.bfloat16, torch.float16)),
                    (1, GPU_CLASSES[89]), (2, GPU_CLASSES[89]),
                    (t4, False, torch.float16, (torch.float16,)), (1, t4), (2, t4)]
    with pytest.raises(SystemExit, match="unknown family"):
        kc.family_launches("no_such_family")


def test_the_compile_key_follows_the_familys_declaration(tmp_path):
    """The compile check's cache key covers each family's bench.py (its compile cases live there),
    and not the other benchmarks (bench_*.py), the survey or the results' reading and drawing."""
    import shutil
    copy = tmp_path / "kernels"
    shutil.copytree(ROOT / "kernels", copy, ignore=shutil.ignore_patterns("lab", "__pycache__", "*.json"))
    code = "import sys; sys.path.insert(0, sys.argv[1]); from kernels.compile import source_key; print(source_key())"

    def key():
        res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=tmp_path)
        assert res.stdout.strip(), res.stderr[-2000:]
        return res.stdout

    a = key()
    (copy / "survey.py").write_text((copy / "survey.py").read_text() + "\n")
    (copy / "conv" / "bench_layer.py").write_text((copy / "conv" / "bench_layer.py").read_text() + "\n")
    for name in ("report.py", "results.py", "catalog.py"):
        (copy / name).write_text((copy / name).read_text() + "\n")
    b = key()
    (copy / "gla" / "bench.py").write_text((copy / "gla" / "bench.py").read_text() + "\n")
    c = key()
    assert a == b != c


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.profiler's device times need a CUDA device")
def test_kernel_times_sums_each_kernel_per_call():
    """harness.kernel_times (the labs' profile of a step): a call of two kernels, one timed twice as
    long as the other by doing it twice, comes back as two names, the repeated one first, with
    positive times per call."""
    a = torch.randn(2048, 2048, device="cuda")
    fn = lambda: (a @ a, a @ a, a.exp())   # noqa: E731
    got = harness.kernel_times(fn, n=3)
    assert len(got) >= 2 and all(v > 0 for v in got.values()), got
    first = next(iter(got))
    assert "gemm" in first.lower() or "sgemm" in first.lower() or "cutlass" in first.lower(), got
