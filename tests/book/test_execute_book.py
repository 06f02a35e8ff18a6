"""tools/execute_book.py: a notebook whose kernel did not start beside the others is run once more,
alone; a notebook whose cell raised fails the build at once and is never run again.

jupyter-cache's executors are replaced by fakes that record what they were asked to run, so the
test needs no kernel: it checks the script's decisions, not Jupyter.
"""
from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import execute_book  # noqa: E402


class FakeCache:
    def __init__(self):
        self.added = []

    def add_nb_to_project(self, uri):
        self.added.append(uri)

    def get_project_record(self, uri):
        return types.SimpleNamespace(traceback=f"traceback of {Path(uri).name}")


def run_script(monkeypatch, tmp_path, parallel, serial):
    """Run ``main`` on three notebooks; ``parallel`` / ``serial`` map a notebook's name to 0
    (succeeded), 1 (a cell raised) or 2 (the kernel did not start). Returns (exit status, the
    names each executor was asked to run)."""
    paths = [tmp_path / f"{n}.ipynb" for n in ("a", "b", "c")]
    calls = {"local-parallel": [], "local-serial": []}
    outcome = {"local-parallel": parallel, "local-serial": serial}

    def load_executor(name, cache):
        def run_and_cache(filter_uris, timeout, allow_errors):
            assert allow_errors is False
            names = [Path(u).stem for u in filter_uris]
            calls[name].append(names)
            got = {k: [u for u in filter_uris if outcome[name][Path(u).stem] == k] for k in (0, 1, 2)}
            return types.SimpleNamespace(succeeded=got[0], excepted=got[1], errored=got[2])
        return types.SimpleNamespace(run_and_cache=run_and_cache)

    fake_cache = FakeCache()
    monkeypatch.setitem(sys.modules, "jupyter_cache",
                        types.SimpleNamespace(get_cache=lambda path: fake_cache))
    monkeypatch.setitem(sys.modules, "jupyter_cache.executors",
                        types.SimpleNamespace(load_executor=load_executor))
    status = execute_book.main([str(p) for p in paths])
    return status, calls


def test_all_succeed_runs_each_notebook_once(monkeypatch, tmp_path):
    status, calls = run_script(monkeypatch, tmp_path, {"a": 0, "b": 0, "c": 0}, {})
    assert status == 0
    assert calls == {"local-parallel": [["a", "b", "c"]], "local-serial": []}


def test_a_kernel_that_did_not_start_is_run_again_alone(monkeypatch, tmp_path, capsys):
    status, calls = run_script(monkeypatch, tmp_path, {"a": 0, "b": 2, "c": 0}, {"b": 0})
    assert status == 0
    assert calls["local-serial"] == [["b"]]
    assert "executed 3, failed 0" in capsys.readouterr().out


def test_a_kernel_that_fails_again_fails_the_build(monkeypatch, tmp_path, capsys):
    status, calls = run_script(monkeypatch, tmp_path, {"a": 0, "b": 2, "c": 0}, {"b": 2})
    assert status == 1
    assert "FAILED" in capsys.readouterr().err


def test_a_cell_that_raised_is_not_run_again(monkeypatch, tmp_path, capsys):
    status, calls = run_script(monkeypatch, tmp_path, {"a": 1, "b": 2, "c": 0}, {"a": 0, "b": 0})
    assert status == 1
    assert calls["local-serial"] == [["b"]], "only the notebook whose kernel died is re-run"
    err = capsys.readouterr().err
    assert "FAILED" in err and "traceback of a.ipynb" in err and "traceback of b.ipynb" not in err


@pytest.mark.parametrize("bad", [1, 2])
def test_a_failure_in_the_second_run_is_reported(monkeypatch, tmp_path, bad):
    status, _ = run_script(monkeypatch, tmp_path, {"a": 2, "b": 0, "c": 0}, {"a": bad})
    assert status == 1
