"""experiments.seed_sweep: the live settings (one per experiment, each a config its module accepts),
the sweep over seeds with a stand-in experiment (each seed's claims checked and kept), the words it
prints, the stored file and its settings check, and the seeds argument."""
import sys
import types
from dataclasses import dataclass, replace

import pytest

from experiments import seed_sweep as sw


def test_every_live_setting_is_its_modules_cpu_config():
    for name, (mod, changes, jobs) in sw.LIVE.items():
        cfg = sw.live_config(name)
        assert type(cfg).__module__ == mod and jobs >= 1
        assert all(getattr(cfg, k) == v for k, v in changes.items())
    assert sw.live_config("short_conv", steps=3).steps == 3
    with pytest.raises(ValueError, match="name must be one of"):
        sw.live_config("nope")


@dataclass(frozen=True)
class _Cfg:
    steps: int = 5

    def as_dict(self):
        return {"steps": self.steps}


def _fake(monkeypatch):
    """A stand-in experiment whose one claim holds on even seeds only."""
    mod = types.ModuleType("fake_exp")
    mod.cpu_config = lambda **ch: replace(_Cfg(), **ch)
    mod.run_seeds = lambda cfg, seeds, jobs=1: {"seed": seeds[0], "jobs": jobs}
    mod.claims = lambda run: [{"claim": "Even.", "holds": run["seed"] % 2 == 0, "measured": f"seed {run['seed']}"},
                              {"claim": "Always.", "holds": True, "measured": "yes"}]
    monkeypatch.setitem(sys.modules, "fake_exp", mod)
    monkeypatch.setitem(sw.LIVE, "fake", ("fake_exp", {"steps": 7}, 2))


def test_sweep_checks_each_seed_and_says_where_a_claim_failed(monkeypatch, tmp_path):
    _fake(monkeypatch)
    out = sw.sweep("fake", [4, 5, 6, 7])
    assert out["config"] == {"steps": 7} and out["seeds"] == [4, 5, 6, 7]
    assert [[c["holds"] for c in r["claims"]] for r in out["records"]] == [[True, True], [False, True]] * 2
    lines = sw.sweep_lines(out)
    assert lines == ["seeds 4-7 (4 seeds the book's cells do not use): every claim held in 2 of 4",
                     "*Even.* failed in 2 of 4 seeds: seed 5 (seed 5); seed 7 (seed 7)"]
    with pytest.raises(ValueError, match="seeds must be distinct"):
        sw.sweep("fake", [3, 3])
    # stored, read back, and checked against the live setting
    monkeypatch.setattr(sw, "RESULTS_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="python -m experiments.seed_sweep fake --seeds 21-40 --write"):
        sw.load_sweep("fake")
    assert sw.main(["fake", "--seeds", "4-5,9", "--write"]) == 0
    assert [r["seed"] for r in sw.load_sweep("fake")["records"]] == [4, 5, 9]


def test_a_stored_sweep_reads_back_with_its_settings_checked(monkeypatch, tmp_path):
    _fake(monkeypatch)
    monkeypatch.setattr(sw, "RESULTS_DIR", tmp_path)
    out = sw.sweep("fake", [4, 5])
    sw.results.write_results(tmp_path / "seeds_fake.json", "seeds_fake", out["config"], out["records"])
    data = sw.load_sweep("fake")
    assert data["same_as_live"] and [r["seed"] for r in data["records"]] == [4, 5]
    monkeypatch.setitem(sw.LIVE, "fake", ("fake_exp", {"steps": 8}, 2))
    assert not sw.load_sweep("fake")["same_as_live"]


def test_seeds_argument():
    assert sw._seeds_arg("21-23") == [21, 22, 23]
    assert sw._seeds_arg("3,7-8") == [3, 7, 8]


def test_sweep_markdown_says_what_is_stored_or_why_not(monkeypatch, tmp_path):
    _fake(monkeypatch)
    monkeypatch.setattr(sw, "RESULTS_DIR", tmp_path)
    assert sw.sweep_markdown("fake").startswith("No stored seed sweep") and \
        "`python -m experiments.seed_sweep fake --seeds 21-40 --write`" in sw.sweep_markdown("fake")
    out = sw.sweep("fake", [4, 5])
    sw.results.write_results(tmp_path / "seeds_fake.json", "seeds_fake", out["config"], out["records"],
                             env={"device": "cpu", "date": "2026-11-29 06:00 UTC", "torch": "2.13.0"})
    md = sw.sweep_markdown("fake")
    assert md == ("**The same claims on other seeds** (stored: cpu, 2026-11-29, torch 2.13.0): seeds 4-5 (2 seeds "
                  "the book's cells do not use): every claim held in 1 of 2.\n- *Even.* failed in 1 of 2 seeds: "
                  "seed 5 (seed 5).")
    monkeypatch.setitem(sw.LIVE, "fake", ("fake_exp", {"steps": 8}, 2))
    assert sw.sweep_markdown("fake").startswith("The stored seed sweep was made with another live setting")
