"""experiments.common's shared pieces that no single experiment's tests cover alone: the claims
form every experiment's ``claims(run)`` returns (``claim``, ``assert_claims``,
``claims_markdown``), the learning-rate grid then seeds (``tune_and_run``) on a fake experiment
whose best rate is known, and the merging of stored runs (``merge_stored``)."""
from dataclasses import asdict, dataclass

import pytest

from experiments import common


# ------------------------------------------------------------------ claims
def test_claim_form_and_checks():
    c = common.claim("PaTH learns.", 1, "0.99")
    assert c == {"claim": "PaTH learns.", "holds": True, "measured": "0.99"}
    assert common.claim("x", 0.0, 3)["holds"] is False and common.claim("x", 0.0, 3)["measured"] == "3"
    with pytest.raises(ValueError, match="text must be a non-empty"):
        common.claim("", True, "")
    good, bad = common.claim("A holds.", True, "1.0"), common.claim("B holds.", False, "0.2")
    assert common.assert_claims([good]) == [good]
    with pytest.raises(AssertionError) as err:
        common.assert_claims([good, bad])
    assert "B holds. (measured: 0.2)" in str(err.value) and "A holds." not in str(err.value)
    md = common.claims_markdown([good, bad])
    assert md.splitlines() == ["- **holds**: A holds. (measured: 1.0)", "- **does not hold**: B holds. (measured: 0.2)"]


# ------------------------------------------------------------------ grid, then seeds
@dataclass(frozen=True)
class Fake:
    models: tuple = ("a", "b")
    lr_grid: tuple = (1e-3, 1e-2, 1e-1)
    grid_seed: int = 99
    seed: int = 0
    lr: float = 1e-3

    def as_dict(self):
        return asdict(self)


BEST = {"a": 1e-2, "b": 1e-1}     # each fake model scores best at this rate


def fake_piece(cfg, keep_models=False):
    (m,) = cfg.models
    rec = {"model": m, "seed": cfg.seed, "lr": cfg.lr, "score": -abs(cfg.lr - BEST[m])}
    out = {"records": [rec], "seconds": 1.0}
    if keep_models:
        out["models"] = {m: f"net {m} {cfg.seed}"}
    return out


def test_tune_and_run_picks_each_models_rate_on_the_held_out_seed():
    seen = []

    def piece(cfg, **kw):
        seen.append((cfg.models[0], cfg.seed, cfg.lr))
        return fake_piece(cfg, **kw)
    run = common.tune_and_run(Fake(), [0, 1], piece, split=("models",), score=lambda r: r["score"])
    grid = [(m, 99, lr) for m in "ab" for lr in Fake.lr_grid]
    assert seen == grid + [("a", 0, 1e-2), ("b", 0, 1e-1), ("a", 1, 1e-2), ("b", 1, 1e-1)]
    choice = run["config"]["lr_choice"]
    assert [(c["models"], c["lr"]) for c in choice] == [("a", 1e-2), ("b", 1e-1)]
    assert choice[0]["scores"] == pytest.approx([-9e-3, 0.0, -9e-2])
    assert [(r["model"], r["seed"], r["lr"]) for r in run["records"]] == [
        ("a", 0, 1e-2), ("b", 0, 1e-1), ("a", 1, 1e-2), ("b", 1, 1e-1)]
    assert run["config"]["seeds"] == [0, 1] and "seed" not in run["config"] and "jobs" not in run["config"]
    assert run["seconds"] == {0: 2.0, 1: 2.0}
    kept = common.tune_and_run(Fake(), [0], fake_piece, split=("models",), score=lambda r: r["score"],
                               keep_models=True)
    assert kept["models"] == {0: {"a": "net a 0", "b": "net b 0"}}


def test_tune_and_run_ties_one_rate_and_bad_input():
    # ties go to the earlier rate of the grid
    flat = common.tune_and_run(Fake(), [0], fake_piece, split=("models",), score=lambda r: 0)
    assert [c["lr"] for c in flat["config"]["lr_choice"]] == [1e-3, 1e-3]
    # a one-rate grid skips the grid: no held-out runs, no scores
    seen = []
    one = common.tune_and_run(Fake(lr_grid=(0.5,)), [3], lambda c: seen.append(c.seed) or fake_piece(c),
                              split=("models",), score=lambda r: r["score"])
    assert seen == [3, 3] and [c["scores"] for c in one["config"]["lr_choice"]] == [None, None]
    with pytest.raises(ValueError, match="grid_seed must not be one of seeds"):
        common.tune_and_run(Fake(), [0, 99], fake_piece, split=("models",), score=lambda r: 0)
    with pytest.raises(ValueError, match="lr_grid must be a non-empty tuple of positive rates"):
        common.tune_and_run(Fake(lr_grid=()), [0], fake_piece, split=("models",), score=lambda r: 0)
    with pytest.raises(ValueError, match="lr_grid must be a non-empty tuple of positive rates"):
        common.tune_and_run(Fake(lr_grid=(1e-3, -1.0)), [0], fake_piece, split=("models",), score=lambda r: 0)
    with pytest.raises(ValueError, match="seeds must be a non-empty list"):
        common.tune_and_run(Fake(), [], fake_piece, split=("models",), score=lambda r: 0)


# ------------------------------------------------------------------ merging stored runs
def test_merge_stored_keeps_other_pieces_and_refuses_other_settings():
    cfg = {"steps": 2, "variants": ["k"], "seeds": [0]}
    old = {"env": {"date": "old"}, "config": cfg,
           "records": [{"seed": 0, "variant": "k", "acc": 1}, {"seed": 0, "variant": "none", "acc": 2}]}
    new = {"env": {"date": "new"}, "config": dict(cfg, seeds=[0, 1]),
           "records": [{"seed": 0, "variant": "none", "acc": 3}, {"seed": 1, "variant": "k", "acc": 4}]}
    merged = common.merge_stored(old, new, ("variants", "variant"), ("none", "k"))
    assert [(r["seed"], r["variant"], r["acc"], r["env"]["date"]) for r in merged["records"]] == [
        (0, "none", 3, "new"), (0, "k", 1, "old"), (1, "k", 4, "new")]
    assert merged["config"]["seeds"] == [0, 1] and merged["config"]["variants"] == ["none", "k"]
    assert common.merge_stored(None, new, ("variants", "variant"), ("none", "k"))["config"]["seeds"] == [0, 1]
    with pytest.raises(ValueError, match="other settings"):
        common.merge_stored(old, dict(new, config=dict(cfg, steps=3)), ("variants", "variant"), ("none", "k"))
