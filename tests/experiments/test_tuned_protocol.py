"""experiments.common's tuned protocol (a rate grid on a held-out seed, then the seeds), its stored
files and command line, and the claim helpers, on a fake experiment whose 'training' is a formula."""
import json
from dataclasses import dataclass

import pytest

import experiments.common as common
from experiments.common import (TunedConfig, claim, claims_markdown, failed_claims, grid_rows, merge_tuned,
                                seed_records, stored_config, tune_then_seeds, tuned_cli)


@dataclass(frozen=True)
class FakeConfig(TunedConfig):
    mixers: tuple = ("a", "b")
    lr_grid: tuple = (1e-3, 1e-2, 1e-1)


BEST = {"a": 1e-2, "b": 1e-1}


def fake_run(cfg: FakeConfig) -> dict:
    """'Training': accuracy peaks at the mixer's best rate, shifted by the stream scored and the seed."""
    import math
    recs = []
    for m in cfg.mixers:
        acc = 1.0 - abs(math.log10(cfg.lr / BEST[m])) / 4 - (0.01 if cfg.eval_on == "validation" else 0.0)
        recs.append({"mixer": m, "accuracy": [acc, acc - 0.001 * cfg.seed], "train_seconds": 0.0})
    return {"records": recs, "seconds": 0.0}


UNITS = {m: {"mixers": (m,)} for m in ("a", "b")}


def test_the_grid_picks_each_models_best_rate_on_the_held_out_seed():
    run = tune_then_seeds(FakeConfig(grid_seed=99), [0, 1], fake_run, UNITS)
    assert run["config"]["chosen_lr"] == BEST
    grid = [r for r in run["records"] if r["phase"] == "grid"]
    assert [(r["unit"], r["lr"], r["seed"]) for r in grid] == [(u, lr, 99) for u in "ab" for lr in (1e-3, 1e-2, 1e-1)]
    seeds = seed_records(run)
    assert [(r["seed"], r["unit"], r["lr"]) for r in seeds] == [(0, "a", 1e-2), (0, "b", 1e-1),
                                                               (1, "a", 1e-2), (1, "b", 1e-1)]
    assert all(r["accuracy"][0] == 1.0 for r in seeds)                 # test stream, not the validation one
    assert all(r["accuracy"][0] < 1.0 for r in grid)
    # the score: the mean of the two accuracies, the second lowered by 0.001 per unit of the seed (99)
    assert grid_rows(run)[1] == {"unit": "b", "lrs": [1e-3, 1e-2, 1e-1],
                                 "scores": [pytest.approx(0.49 - 0.0495), pytest.approx(0.74 - 0.0495),
                                            pytest.approx(0.99 - 0.0495)], "chosen": 1e-1}
    cfg = run["config"]
    assert cfg["seeds"] == [0, 1] and cfg["jobs"] == 1 and cfg["lr_grid"] == [1e-3, 1e-2, 1e-1]
    assert not {"seed", "lr", "eval_on"} & set(cfg)


def test_tuned_by_shares_a_rate_and_one_rate_skips_the_grid():
    run = tune_then_seeds(FakeConfig(), [0], fake_run, UNITS, tuned_by={"a": "b", "b": "b"})
    assert run["config"]["chosen_lr"] == {"a": 1e-1, "b": 1e-1}
    assert {r["unit"] for r in run["records"] if r["phase"] == "grid"} == {"b"}
    run = tune_then_seeds(FakeConfig(lr_grid=(3e-3,)), [0, 5], fake_run, UNITS)
    assert all(r["phase"] == "seed" and r["lr"] == 3e-3 for r in run["records"]) and len(run["records"]) == 4


def test_nan_scores_count_as_worst_and_ties_keep_the_first_rate():
    def run_nan(cfg):
        acc = float("nan") if cfg.lr == 1e-1 else 0.5
        return {"records": [{"mixer": cfg.mixers[0], "accuracy": [acc]}], "seconds": 0.0}
    run = tune_then_seeds(FakeConfig(), [0], run_nan, UNITS)
    assert run["config"]["chosen_lr"] == {"a": 1e-3, "b": 1e-3}


def test_protocol_arguments_are_checked():
    with pytest.raises(ValueError, match="grid_seed \\(0\\) must not be one of the seeds"):
        tune_then_seeds(FakeConfig(grid_seed=0), [0, 1], fake_run, UNITS)
    with pytest.raises(ValueError, match="lr_grid must be a non-empty tuple of distinct rates > 0"):
        tune_then_seeds(FakeConfig(lr_grid=(1e-3, -1.0)), [0], fake_run, UNITS)
    with pytest.raises(ValueError, match="lr_grid must be"):
        tune_then_seeds(FakeConfig(lr_grid=()), [0], fake_run, UNITS)
    with pytest.raises(ValueError, match="seeds must be a non-empty list of distinct integers"):
        tune_then_seeds(FakeConfig(), [1, 1], fake_run, UNITS)
    with pytest.raises(ValueError, match="tuned_by must map every unit to a unit"):
        tune_then_seeds(FakeConfig(), [0], fake_run, UNITS, tuned_by={"a": "c", "b": "b"})
    with pytest.raises(ValueError, match="units must name at least one model"):
        tune_then_seeds(FakeConfig(), [0], fake_run, {})
    with pytest.raises(ValueError, match="jobs must be an integer >= 1"):
        tune_then_seeds(FakeConfig(), [0], fake_run, UNITS, jobs=0)


def test_runs_in_processes_equal_runs_in_turn():
    a = tune_then_seeds(FakeConfig(), [0, 3], fake_run, UNITS, jobs=1)
    b = tune_then_seeds(FakeConfig(), [0, 3], fake_run, UNITS, jobs=2)
    assert a["records"] == b["records"] and b["config"]["jobs"] == 2


def test_merging_keeps_the_other_models_and_refuses_other_settings():
    full = tune_then_seeds(FakeConfig(), [0, 1], fake_run, UNITS)
    only_b = tune_then_seeds(FakeConfig(mixers=("b",)), [0, 1], fake_run, {"b": UNITS["b"]})
    old = dict(full, env={"device": "old"})
    for r in old["records"]:
        r["mixer"] = r["unit"]
    merged = merge_tuned(old, dict(only_b, env={"device": "new"}), "mixers", ("a", "b"))
    assert merged["config"]["mixers"] == ["a", "b"] and merged["config"]["chosen_lr"] == BEST
    assert {(r["unit"], r["env"]["device"]) for r in merged["records"]} == {("a", "old"), ("b", "new")}
    other = tune_then_seeds(FakeConfig(mixers=("b",), steps=7), [0, 1], fake_run, {"b": UNITS["b"]})
    with pytest.raises(ValueError, match="other settings or seeds"):
        merge_tuned(old, dict(other, env={}), "mixers", ("a", "b"))
    assert merge_tuned(None, dict(only_b, env={}), "mixers", ("a", "b"))["config"]["mixers"] == ["b"]


def test_stored_config_drops_the_single_runs_fields():
    cfg = stored_config(FakeConfig(seed=4, lr=0.5, eval_on="validation"))
    assert "seed" not in cfg and "lr" not in cfg and "eval_on" not in cfg and cfg["mixers"] == ["a", "b"]


def test_the_command_line_runs_writes_and_merges(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    run = lambda cfg, seeds, jobs=1: tune_then_seeds(cfg, seeds, fake_run,
                                                      {m: UNITS[m] for m in cfg.mixers}, jobs=jobs)
    kw = dict(description="fake", stored="fake", cpu_config=FakeConfig, gpu_config=FakeConfig, run_seeds=run,
              describe=lambda r: f"{r['unit']} {r['accuracy'][0]:.2f}")
    assert tuned_cli(["--seeds", "0", "1", "--only", "b", "--write"], **kw) == 0
    assert tuned_cli(["--seeds", "0", "1", "--only", "a", "--write"], **kw) == 0
    out = capsys.readouterr().out
    assert "grid" in out and "-> 0.01" in out and "wrote" in out
    data = json.loads((tmp_path / "fake_cpu.json").read_text())
    assert data["config"]["chosen_lr"] == BEST and data["config"]["mixers"] == ["a", "b"]
    assert {r["unit"] for r in data["records"]} == {"a", "b"} and data["env"]
    with pytest.raises(SystemExit, match="--only: choose from"):
        tuned_cli(["--only", "c"], **kw)


def test_claim_helpers():
    c = [claim("x holds", True, "1.0"), claim("y holds", 0, "2.0")]
    assert c[1] == {"claim": "y holds", "holds": False, "measured": "2.0"}
    assert failed_claims(c) == [c[1]]
    text = claims_markdown(c)
    assert "**holds**: x holds (measured: 1.0)" in text and "**does not hold**: y holds" in text
    with pytest.raises(ValueError, match="text must be a non-empty string"):
        claim("", True, "")
