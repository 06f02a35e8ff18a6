"""experiments.common's shared pieces that no single experiment's tests cover alone: the claims form
every experiment's ``claims(run)`` returns, and the one protocol (``tune_and_run``: a learning-rate
grid on a held-out seed, then the seeds), its stored runs (``load_run``, ``load_current``,
``grid_rows``, ``grid_lines``) and its command line (``seeds_cli``), on a fake experiment whose
'training' is a formula with a known best rate per model; last, every experiment module's GPU
command against its command line."""
import importlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import experiments.common as common
from experiments.common import (TunedConfig, grid_lines, grid_rows, load_current, load_run, seeds_cli,
                                stored_config, tune_and_run)

EXPERIMENTS = ("mqar", "mesa_recall", "regression", "multihop", "extrapolation", "state_tracking", "short_conv")


# ------------------------------------------------------------------ claims
def test_claim_form_and_checks():
    c = common.claim("PaTH learns.", 1, "0.99")
    assert c == {"claim": "PaTH learns.", "holds": True, "measured": "0.99"}
    assert common.claim("x", 0.0, 3)["holds"] is False and common.claim("x", 0.0, 3)["measured"] == "3"
    with pytest.raises(ValueError, match="text must be a non-empty"):
        common.claim("", True, "")
    good, bad = common.claim("A holds.", True, "1.0"), common.claim("B holds.", False, "0.2")
    assert common.failed_claims([good, bad]) == [bad]
    assert common.assert_claims([good]) == [good]
    assert common.assert_claims([good, bad], which=[0]) == [good, bad]
    with pytest.raises(AssertionError) as err:
        common.assert_claims([good, bad])
    assert "B holds. (measured: 0.2)" in str(err.value) and "A holds." not in str(err.value)
    md = common.claims_markdown([good, bad])
    assert md.splitlines() == ["- **holds**: A holds. (measured: 1.0)", "- **does not hold**: B holds. (measured: 0.2)"]
    assert common.claims_verdict([good, good]) == "Every one of the 2 claims holds in the stored runs."
    verdict = common.claims_verdict([good, bad], "seed 7")
    assert verdict.startswith("**A negative result:** 1 of the 2 claims does not hold in seed 7")
    assert "2 of the 2 claims do not hold" in common.claims_verdict([bad, bad])
    assert "*B holds.*" in verdict and "A holds." not in verdict
    with pytest.raises(ValueError, match="at least one claim"):
        common.claims_verdict([])


# ------------------------------------------------------------------ a fake experiment
@dataclass(frozen=True)
class FakeConfig(TunedConfig):
    mixers: tuple = ("a", "b")
    sizes: tuple = (4, 8)
    lr_grid: tuple = (1e-3, 1e-2, 1e-1)
    grid_seed: int = 99
    eval_on: str = "test"


BEST = {"a": 1e-2, "b": 1e-1}       # each fake mixer scores best at this rate


def fake_run(cfg: FakeConfig, keep_models: bool = False) -> dict:
    """'Training' every (mixer, size) of ``cfg``: accuracy 1 at the mixer's best rate, a quarter less
    per decade away, 0.01 less on the validation stream, the second entry 0.001 less per unit of
    the seed (module level: the processes of jobs > 1 import it)."""
    recs, models = [], {}
    for m in cfg.mixers:
        for n in cfg.sizes:
            acc = 1.0 - abs(math.log10(cfg.lr / BEST[m])) / 4 - (0.01 if cfg.eval_on == "validation" else 0.0)
            recs.append({"mixer": m, "size": n, "seed": cfg.seed, "eval_on": cfg.eval_on,
                         "accuracy": [acc, acc - 0.001 * cfg.seed], "train_seconds": 0.5})
            models[f"{m}{n}"] = f"net {m}{n} seed {cfg.seed}"
    out = {"records": recs, "seconds": 0.5 * len(recs)}
    if keep_models:
        out["models"] = models
    return out


def _run(cfg=FakeConfig(), seeds=(0, 1), **kw):
    return tune_and_run(cfg, list(seeds), fake_run, split=("mixers", "sizes"), label=lambda m, n: f"{m}{n}", **kw)


# ------------------------------------------------------------------ the protocol
def test_the_grid_picks_each_models_best_rate_on_the_held_out_seed_then_runs_the_seeds():
    seen = []

    def spy(cfg, **kw):
        seen.append((cfg.mixers, cfg.sizes, cfg.seed, cfg.lr, cfg.eval_on))
        return fake_run(cfg, **kw)
    run = tune_and_run(FakeConfig(), [0, 1], spy, split=("mixers", "sizes"), label=lambda m, n: f"{m}{n}")
    lrs = FakeConfig.lr_grid
    grid_calls = [((m,), (n,), 99, lr, "validation") for m in "ab" for n in (4, 8) for lr in lrs]
    seed_calls = [((m,), (n,), s, BEST[m], "test") for s in (0, 1) for m in "ab" for n in (4, 8)]
    assert seen == grid_calls + seed_calls                    # one piece per unit, the first split field outermost
    assert [(r["unit"], r["lr"], r["seed"], r["phase"], r["eval_on"]) for r in run["grid"]] == [
        (f"{m}{n}", lr, 99, "grid", "validation") for m in "ab" for n in (4, 8) for lr in lrs]
    assert [(r["unit"], r["lr"], r["seed"], r["phase"], r["eval_on"]) for r in run["records"]] == [
        (f"{m}{n}", BEST[m], s, "seed", "test") for s in (0, 1) for m in "ab" for n in (4, 8)]
    # the default score: the mean accuracy of the grid record (seed 99 lowers the second entry by 0.099)
    for r in run["grid"]:
        assert r["score"] == pytest.approx(1.0 - abs(math.log10(r["lr"] / BEST[r["mixer"]])) / 4 - 0.01 - 0.0495)
    cfg = run["config"]
    assert [(c["unit"], c["mixers"], c["sizes"], c["lr"], c["tuned_by"]) for c in cfg["lr_choice"]] == [
        (f"{m}{n}", m, n, BEST[m], f"{m}{n}") for m in "ab" for n in (4, 8)]
    assert cfg["lr_choice"][0]["scores"] == [r["score"] for r in run["grid"][:3]]
    assert cfg["seeds"] == [0, 1] and cfg["jobs"] == 1 and cfg["lr_grid"] == list(lrs) and cfg["grid_seed"] == 99
    assert not {"seed", "lr", "eval_on"} & set(cfg)
    assert run["seconds"] == {0: 2.0, 1: 2.0}                    # each seed: its pieces summed
    assert "models" not in run


def test_tune_at_shares_a_rate_and_small_grids_are_not_run():
    run = _run(tune_at={"sizes": 8})
    assert {r["unit"] for r in run["grid"]} == {"a8", "b8"}
    rows = {c["unit"]: c for c in run["config"]["lr_choice"]}
    assert rows["a4"]["tuned_by"] == "a8" and rows["a4"]["scores"] is None and rows["a4"]["lr"] == BEST["a"]
    assert rows["b8"]["tuned_by"] == "b8" and len(rows["b8"]["scores"]) == 3
    with pytest.raises(ValueError, match="tune_at: sizes = 16 must be one of the values"):
        _run(tune_at={"sizes": 16})
    one = _run(FakeConfig(lr_grid=(3e-3,), grid_seed=0), seeds=[0, 5])   # a one-rate grid: no held-out seed to keep
    assert one["grid"] == [] and all(r["lr"] == 3e-3 for r in one["records"]) and len(one["records"]) == 8
    assert all(c["scores"] is None and c["tuned_by"] is None for c in one["config"]["lr_choice"])
    empty = _run(FakeConfig(lr_grid=(), lr=0.25), seeds=[0])
    assert empty["grid"] == [] and {r["lr"] for r in empty["records"]} == {0.25}
    assert grid_rows(empty) == [] and grid_lines(empty["config"]) == []


def test_scores_ties_nan_and_tuples():
    def chosen(values):
        """The rate chosen when the grid's score at the j-th rate is values[j]."""
        at = dict(zip(FakeConfig.lr_grid, values))
        run = tune_and_run(FakeConfig(mixers=("a",), sizes=(4,)), [0], fake_run, split=("mixers", "sizes"),
                           score=lambda r: at[r["lr"]])
        return run["config"]["lr_choice"][0]["lr"]
    assert chosen([0.5, 0.5, 0.4]) == 1e-3                        # a tie goes to the earlier rate
    assert chosen([0.4, 0.5, 0.5]) == 1e-2
    assert chosen([0.2, float("nan"), 0.1]) == 1e-3               # NaN is the worst score
    assert chosen([float("nan"), float("nan"), 0.0]) == 1e-1
    assert chosen([(0.5, -0.3), (0.5, -0.1), (0.4, 0.0)]) == 1e-2  # a tuple: later entries break ties


def test_protocol_arguments_are_checked():
    with pytest.raises(ValueError, match="grid_seed must not be one of the seeds"):
        _run(FakeConfig(grid_seed=1), seeds=[0, 1])
    with pytest.raises(ValueError, match="lr_grid must hold distinct positive learning rates"):
        _run(FakeConfig(lr_grid=(1e-3, -1.0)))
    with pytest.raises(ValueError, match="lr_grid must hold distinct positive learning rates"):
        _run(FakeConfig(lr_grid=(1e-3, 1e-3)))
    with pytest.raises(ValueError, match="seeds must be a non-empty list of distinct integers"):
        _run(seeds=[1, 1])
    with pytest.raises(ValueError, match="jobs must be an integer >= 1"):
        _run(jobs=0)
    with pytest.raises(ValueError, match="split must name config fields that each hold at least one value"):
        _run(FakeConfig(sizes=()))
    with pytest.raises(ValueError, match="label must give every unit its own name"):
        tune_and_run(FakeConfig(), [0], fake_run, split=("mixers", "sizes"), label=lambda m, n: m)
    with pytest.raises(ValueError, match="run_piece must return one record per unit"):
        tune_and_run(FakeConfig(), [0], fake_run, split=("mixers",))       # sizes not split: two records a piece


def test_runs_in_processes_equal_runs_in_turn_and_models_come_back():
    a = _run(seeds=[0, 3])
    b = _run(seeds=[0, 3], jobs=2, keep_models=True)
    assert a["grid"] == b["grid"] and a["records"] == b["records"] and b["config"]["jobs"] == 2
    assert b["models"] == {s: {f"{m}{n}": f"net {m}{n} seed {s}" for m in "ab" for n in (4, 8)} for s in (0, 3)}


def test_grid_rows_and_lines():
    run = tune_and_run(FakeConfig(sizes=(4,)), [0], fake_run, split=("mixers", "sizes"), label=lambda m, n: m)
    rows = grid_rows(run)
    assert [(r["unit"], r["lrs"], r["chosen"]) for r in rows] == [("a", [1e-3, 1e-2, 1e-1], 1e-2),
                                                                  ("b", [1e-3, 1e-2, 1e-1], 1e-1)]
    assert rows[1]["scores"] == [r["score"] for r in run["grid"] if r["unit"] == "b"]
    lines = grid_lines(run["config"], {"a": "model A", "b": "B"})
    assert len(lines) == 2 and lines[1].startswith("        B: 0.001 ") and lines[1].endswith("0.1 0.941*")
    assert lines[0].count("*") == 1 and re.search(r"0\.01 \d\.\d{3}\*", lines[0])
    assert grid_lines(run["config"], str.upper, digits=1)[0].startswith("  A: 0.001 0.7   0.01 0.9*")
    # a tuple score is shown by its first entry
    cfg = dict(run["config"], lr_choice=[dict(c, scores=[[0.25, -1.0]] * 3) for c in run["config"]["lr_choice"]])
    assert "0.001 0.250 " in grid_lines(cfg)[0]


def test_stored_config_drops_the_single_runs_fields():
    cfg = stored_config(FakeConfig(seed=4, lr=0.5, eval_on="validation"))
    assert not {"seed", "lr", "eval_on"} & set(cfg) and cfg["mixers"] == ["a", "b"] and cfg["lr_grid"] == [1e-3, 1e-2, 1e-1]


def test_a_cut_off_run_resumes_from_its_pieces(tmp_path):
    """With ``pieces``, each finished piece is kept; a second run with the same settings runs only
    the pieces the file lacks and returns what one run at once returns; other settings run anew."""
    calls = []

    def counting(cfg, keep_models=False):
        calls.append((cfg.mixers[0], cfg.sizes[0], cfg.seed, cfg.lr))
        return fake_run(cfg)

    path = tmp_path / "fake.pieces.jsonl"
    whole = _run(pieces=path)
    assert len(path.read_text().splitlines()) == 4 * 3 + 4 * 2       # the grid's pieces, then the seeds'
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:9]) + "\n" + lines[9][:20])     # cut off after nine, mid-line
    resumed = tune_and_run(FakeConfig(), [0, 1], counting, split=("mixers", "sizes"),
                           label=lambda m, n: f"{m}{n}", pieces=path)
    assert len(calls) == 20 - 9 and resumed["records"] == whole["records"] and resumed["grid"] == whole["grid"]
    assert resumed["config"] == whole["config"]
    calls.clear()
    tune_and_run(FakeConfig(steps=2), [0, 1], counting, split=("mixers", "sizes"), label=lambda m, n: f"{m}{n}",
                 pieces=path)
    assert len(calls) == 20                                                # another setting: nothing read back
    with pytest.raises(ValueError, match="not with keep_models"):
        _run(pieces=path, keep_models=True)


# ------------------------------------------------------------------ stored runs and the command line
def _cli(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    run_seeds = lambda cfg, seeds, jobs=1, pieces=None: _run(cfg, seeds, jobs=jobs, pieces=pieces)
    return dict(description="fake", stored="fake", cpu_config=FakeConfig, gpu_config=FakeConfig,
                run_seeds=run_seeds, describe=lambda r: f"{r['unit']} {r['accuracy'][0]:.2f}", only="mixers")


def test_the_command_line_runs_writes_and_reads_back(tmp_path, monkeypatch, capsys):
    kw = _cli(tmp_path, monkeypatch)
    with pytest.raises(FileNotFoundError, match="experiments/results/fake_cpu.json; run `make it`"):
        load_run("fake_cpu", FakeConfig, "make it")
    assert seeds_cli(["--seeds", "0", "1", "--write"], **kw) == 0
    assert not (tmp_path / "fake_cpu.pieces.jsonl").exists()            # kept while running, gone once written
    out = capsys.readouterr().out
    assert "learning-rate grid on seed 99" in out and out.count("*") == 1 + 4 and "a4 1.00" in out and "wrote" in out
    data = load_run("fake_cpu", FakeConfig, "make it")
    run = _run()
    assert data["same_as_gpu_config"] and data["env"]["torch"]
    assert json.loads(json.dumps(run["config"])) == data["config"]
    assert [r["unit"] for r in data["grid"]] == [r["unit"] for r in run["grid"]]
    assert [(r["unit"], r["seed"]) for r in data["records"]] == [(r["unit"], r["seed"]) for r in run["records"]]
    assert grid_rows(data) == json.loads(json.dumps(grid_rows(run)))
    assert not load_run("fake_cpu", lambda: FakeConfig(steps=7), "make it")["same_as_gpu_config"]
    # load_current: the run when it is of today's settings, else None and the command that makes it
    assert load_current(lambda: load_run("fake_cpu", FakeConfig, "c"), "fake_cpu", "c") is not None
    assert load_current(lambda: load_run("fake_cpu", lambda: FakeConfig(steps=7), "c"), "fake_cpu", "make it") is None
    assert "made with other" in capsys.readouterr().out
    assert load_current(lambda: load_run("nothing", FakeConfig, "c"), "nothing", "make it") is None
    assert "No experiments/results/nothing.json" in capsys.readouterr().out
    # a file of an earlier format (no lr_choice) loads, as made with other settings, every record a seed's
    (tmp_path / "old.json").write_text(json.dumps({"name": "old", "env": {}, "config": stored_config(FakeConfig()),
                                                   "records": [{"seed": 0, "accuracy": [1.0]}]}))
    old = load_run("old", FakeConfig, "c")
    assert not old["same_as_gpu_config"] and old["grid"] == [] and len(old["records"]) == 1
    assert grid_rows(old) == [] and grid_lines(old["config"]) == []
    with pytest.raises(SystemExit, match="--only: choose from"):
        seeds_cli(["--only", "c"], **kw)


def test_only_merges_with_the_stored_models_and_refuses_other_settings(tmp_path, monkeypatch, capsys):
    kw = _cli(tmp_path, monkeypatch)
    assert seeds_cli(["--seeds", "0", "1", "--only", "b", "--write"], **kw) == 0
    assert [c["unit"] for c in load_run("fake_cpu", FakeConfig, "c")["config"]["lr_choice"]] == ["b4", "b8"]
    part = load_run("fake_cpu", FakeConfig, "c", only="mixers")          # a run made so far for b only
    assert not part["same_as_gpu_config"] and part["missing"] == ["a"]
    assert load_run("fake_cpu", FakeConfig, "c")["missing"] == []      # without `only`: not asked
    with pytest.raises(ValueError, match="only must name the config field that lists the models; got 'seed'"):
        load_run("fake_cpu", FakeConfig, "c", only="seed")
    capsys.readouterr()
    assert load_current(lambda: part, "fake_cpu", "cmd") is None       # shown only once complete
    said = " ".join(capsys.readouterr().out.split())
    assert "not made yet: a." in said and "to add them: cmd --only a" in said
    assert seeds_cli(["--seeds", "0", "1", "--only", "a", "--write"], **kw) == 0
    data = load_run("fake_cpu", FakeConfig, "c")
    run = _run()
    assert data["same_as_gpu_config"] and data["config"]["mixers"] == ["a", "b"]
    assert data["config"]["lr_choice"] == json.loads(json.dumps(run["config"]["lr_choice"]))   # as one run of both
    assert [(r["unit"], r["lr"]) for r in data["grid"]] == [(r["unit"], r["lr"]) for r in run["grid"]]
    assert [(r["seed"], r["unit"]) for r in data["records"]] == [(r["seed"], r["unit"]) for r in run["records"]]
    assert all(r["env"]["torch"] for r in data["grid"] + data["records"])
    assert seeds_cli(["--seeds", "0", "1", "--only", "b", "--write"], **kw) == 0      # a model run again replaces its own
    assert len(load_run("fake_cpu", FakeConfig, "c")["records"]) == 8
    with pytest.raises(ValueError, match="other settings or seeds"):
        seeds_cli(["--seeds", "0", "2", "--only", "a", "--write"], **kw)
    with pytest.raises(ValueError, match="other settings or seeds"):
        seeds_cli(["--seeds", "0", "1", "--steps", "3", "--only", "a", "--write"], **kw)
    assert seeds_cli(["--seeds", "5", "--write"], **kw) == 0                      # without --only: in place of the file
    assert load_run("fake_cpu", FakeConfig, "c")["config"]["seeds"] == [5]
    capsys.readouterr()


# ------------------------------------------------------------------ every experiment module
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_each_experiments_gpu_command_is_what_its_command_line_takes(name, monkeypatch, capsys):
    """The module's COMMAND (what its load_stored, its chapter and its tests' skip messages name) is
    ``python -m experiments.<name>`` with arguments its command line accepts (without CUDA it then
    stops before training, saying so); every GPU command its tests name is that one; a stored file
    of it, when present, loads."""
    mod = importlib.import_module(f"experiments.{name}")
    prefix = f"python -m experiments.{name} "
    assert mod.COMMAND.startswith(prefix + "--gpu ") and "--write" in mod.COMMAND.split()
    monkeypatch.setattr(common.torch.cuda, "is_available", lambda: False)
    assert mod.main(mod.COMMAND[len(prefix):].split()) == 2
    assert capsys.readouterr().out.strip() == "--gpu needs a CUDA GPU"
    text = (Path(__file__).parent / f"test_{name}.py").read_text()
    assert set(re.findall(rf"python -m experiments\.{name} --gpu[^)\"`]*", text)) <= {mod.COMMAND}
    if (common.RESULTS_DIR / f"{mod.STORED}.json").exists():
        data = mod.load_stored()
        assert isinstance(data["same_as_gpu_config"], bool) and data["records"] and data["env"]
    else:
        with pytest.raises(FileNotFoundError, match=re.escape(mod.COMMAND)):
            mod.load_stored()


def test_grid_edges_names_the_choices_at_either_end_that_beat_their_neighbour():
    """grid_edges on constructed configs: a unit whose largest rate scores strictly best and one whose
    smallest does are named with the edge; a choice inside the grid, or one at the edge only by a tie
    with its neighbour, is not; no such unit (or a grid of two rates) gives None. Tuple scores count
    by their first entry."""
    from experiments.common import grid_edges
    row = lambda unit, scores, lr: {"unit": unit, "scores": scores, "lr": lr}
    cfg = {"lr_grid": [0.001, 0.003, 0.01], "lr_choice": [
        row("a", [0.1, 0.2, 0.3], 0.01),            # largest, strictly best: named
        row("b", [(0.5, 1.0), (0.4, 0.0), (0.3, 0.0)], 0.001),   # smallest, by the first entry
        row("c", [0.1, 0.3, 0.2], 0.003),           # inside
        row("d", [0.2, 0.2, 0.2], 0.001),           # a three-way tie broken toward the edge
        row("e", None, 0.01)]}                      # not tuned
    got = grid_edges(cfg, {"a": "A", "b": "B", "c": "C", "d": "D"})
    assert got.startswith("2 of the 4 grids chose a rate at the edge of the grid: A at the largest (0.01); "
                          "B at the smallest (0.001).")
    assert grid_edges({**cfg, "lr_choice": cfg["lr_choice"][2:]}) is None
    assert grid_edges({"lr_grid": [0.001, 0.01], "lr_choice": [row("a", [0.1, 0.2], 0.01)]}) is None
