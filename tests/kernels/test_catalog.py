"""The model map (kernels.catalog): every name it lists exists in the code, and a bogus one is caught."""
import dataclasses

import pytest

from kernels import catalog


def test_model_map_validates_and_covers_the_books_models():
    rows = catalog.model_map()
    by = {r["model"]: r for r in rows}
    assert len(rows) == len(catalog.MODELS) == 12
    assert by["DeltaFormer (the delta rule inside softmax)"]["op"] == "deltaformer_attn"
    assert by["softmax attention"]["family"] == "flash" and by["softmax attention"]["chapters"] == (1,)
    assert by["GLA (vector gate)"]["bench"] == "python -m kernels.gla.bench --write"
    assert by["Gated DeltaNet"]["results"] == "kernels/delta/results.json"
    assert by["PaTH (Householder products as position encoding)"]["bench"] == "python -m kernels.path.bench --write"
    # Comba's op is the delta family's (the gated delta rule after the change of variables)
    assert by["Comba"]["op"] == "chunk_comba" and by["Comba"]["family"] == "delta"
    assert all(r["recurrent"] and r["parallel"] and r["chunkwise"] and r["op"] for r in rows), \
        [r["model"] for r in rows if not (r["parallel"] and r["chunkwise"] and r["op"])]
    assert by["DeltaProduct"]["op"] == "chunk_gated_delta_product" and by["DeltaProduct"]["family"] == "delta"


@pytest.mark.parametrize("change", [dict(recurrent="deltanet_recurent"), dict(chunkwise="no_such_form"),
                                    dict(op="chunk_delta_rul"), dict(family="gla"), dict(family=None),
                                    dict(notebooks=("05_no_such_chapter", "06_inverse_trick")),
                                    dict(chapters=(4, 6))],
                         ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_model_map_raises_for_a_bogus_name(change):
    deltanet = next(m for m in catalog.MODELS if m.name == "DeltaNet")
    with pytest.raises(LookupError):
        catalog.model_map((dataclasses.replace(deltanet, **change),))


def test_missing_family_file_is_caught(tmp_path, monkeypatch):
    """A family folder without its results file (say, a benchmark never written) is reported."""
    for family in ("flash", "gla", "delta"):
        (tmp_path / family).mkdir()
        for name in ("op.py", "bench.py"):
            (tmp_path / family / name).write_text("")
    monkeypatch.setattr(catalog, "PACKAGE_DIR", tmp_path)
    with pytest.raises(LookupError, match="results.json"):
        catalog.model_map()



def test_a_family_not_yet_measured_has_no_results_file(tmp_path, monkeypatch):
    """A family whose NOTES.md says it is not yet measured is listed without a results file; without
    that heading, a missing results file is an error."""
    for family in ("flash", "gla", "delta"):
        (tmp_path / family).mkdir()
        for name in ("op.py", "bench.py", "results.json"):
            (tmp_path / family / name).write_text("")
    (tmp_path / "delta" / "results.json").unlink()
    (tmp_path / "delta" / "NOTES.md").write_text("# delta\n\n## Not yet measured on a GPU\n")
    monkeypatch.setattr(catalog, "PACKAGE_DIR", tmp_path)
    deltanet = next(m for m in catalog.MODELS if m.name == "DeltaNet")
    assert catalog.model_map((deltanet,))[0]["results"] is None
    assert catalog.family_measured(tmp_path / "gla") is True
    (tmp_path / "delta" / "NOTES.md").write_text("# delta\n")
    with pytest.raises(LookupError, match="Not yet measured"):
        catalog.model_map((deltanet,))


def test_installed_package_without_notebooks(tmp_path):
    """Outside a checkout (the installed package has no notebooks folder, as on Colab) the map skips
    the notebook check; asked to check there, it names the missing notebook."""
    rows = catalog.model_map(root=tmp_path)
    assert len(rows) == len(catalog.MODELS)
    with pytest.raises(LookupError, match="no notebooks/"):
        catalog.model_map(root=tmp_path, check_notebooks=True)
