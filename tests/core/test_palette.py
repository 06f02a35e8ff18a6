"""One colour per model across the book (lattn_core.palette): every model has its own colour, the
models one figure draws together stay apart (also for colour-blind readers), unknown names are
refused, and every per-model colour mapping in lattn_core, experiments and kernels draws from it."""
import ast
import importlib
import itertools
import math
from pathlib import Path

import pytest

from lattn_core import palette
from lattn_core.palette import DRAWN_TOGETHER, MODEL_ALIASES, MODEL_COLORS, color_of, model_key

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("lattn_core", "experiments", "kernels")


def _srgb_to_linear(h):
    c = [int(h[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    return [x / 12.92 if x <= 0.04045 else ((x + 0.055) / 1.055) ** 2.4 for x in c]


def _lab(lin):
    """CIELAB (D65) of linear sRGB."""
    x = (0.4124 * lin[0] + 0.3576 * lin[1] + 0.1805 * lin[2]) / 0.95047
    y = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    z = (0.0193 * lin[0] + 0.1192 * lin[1] + 0.9505 * lin[2]) / 1.08883
    f = lambda t: t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116
    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


# Machado, Oliveira and Fernandes (2009), severity 1: how a reader with protanopia, deuteranopia or
# tritanopia sees a colour (matrices on linear sRGB).
CVD = {
    "protanopia": ((0.152286, 1.052583, -0.204868), (0.114503, 0.786281, 0.099216), (-0.003882, -0.048116, 1.051998)),
    "deuteranopia": ((0.367322, 0.860646, -0.227968), (0.280085, 0.672501, 0.047413), (-0.011820, 0.042940, 0.968881)),
    "tritanopia": ((1.255528, -0.076749, -0.178779), (-0.078411, 0.930809, 0.147602), (0.004733, 0.691367, 0.303900)),
}


def _seen(h, kind=None):
    lin = _srgb_to_linear(h)
    if kind is not None:
        m = CVD[kind]
        lin = [min(1.0, max(0.0, sum(m[i][j] * lin[j] for j in range(3)))) for i in range(3)]
    return _lab(lin)


def delta_e(a, b, kind=None) -> float:
    """CIE76 colour difference as a reader with normal vision (or colour blindness ``kind``) sees it."""
    return math.dist(_seen(a, kind), _seen(b, kind))


def test_every_model_has_its_own_colour():
    assert all(isinstance(c, str) and len(c) == 7 and c.startswith("#") for c in MODEL_COLORS.values())
    seen = {}
    for model, c in MODEL_COLORS.items():
        assert c.upper() not in seen, f"{model} and {seen[c.upper()]} share the colour {c}"
        seen[c.upper()] = model


def test_no_model_is_grey_or_black():
    # grey and black stay free for reference lines (chance, a bound, a hand-set model)
    for model, c in MODEL_COLORS.items():
        r, g, b = (int(c[i:i + 2], 16) for i in (1, 3, 5))
        assert max(r, g, b) > 0, model
        assert not (r == g == b), f"{model} is grey ({c}); grey is for reference lines"


def test_the_models_the_book_draws_have_colours():
    for name in ("softmax", "linear", "decay", "RetNet", "mamba2", "GLA", "deltanet", "Gated DeltaNet",
                 "DeltaProduct", "chunk_gated_delta_product", "comba", "DeltaFormer", "deltaformer_free",
                 "FoX (forget-gated softmax)", "ALiBi", "NoPE", "RoPE", "PaTH", "MesaNet", "ttt_mlp",
                 "short_conv", "short_conv_qkv", "flash_attention", "sdpa", "softmax attention",
                 "linear attention", "RetNet / scalar decay", "GLA (vector gate)", "stick_breaking"):
        assert color_of(name) in MODEL_COLORS.values(), name
    assert color_of("RetNet") == color_of("mamba2") == color_of("decay") == color_of("chunk_simple_gla")
    assert color_of("Gated DeltaNet") == color_of("chunk_gated_delta_rule") == MODEL_COLORS["gated_deltanet"]
    assert color_of("flash_attention") == MODEL_COLORS["softmax"] != color_of("sdpa")


def test_the_family_and_the_model_map_have_colours():
    from kernels.catalog import MODELS
    from lattn_core.whats_next import FAMILY
    names = [row.name for row in FAMILY] + [m.name for m in MODELS] + [m.op for m in MODELS if m.op]
    for name in names:
        color_of(name)
    # the twelve models of the family table are twelve colours
    assert len({color_of(row.name) for row in FAMILY}) == len(FAMILY)


@pytest.mark.parametrize("bad", ["", "transformer", "deltanett", "C0", None, 3])
def test_an_unknown_model_is_refused(bad):
    with pytest.raises(ValueError):
        color_of(bad)
    with pytest.raises(ValueError):
        model_key(bad)


def test_aliases_point_at_models():
    for alias, key in MODEL_ALIASES.items():
        assert key in MODEL_COLORS, (alias, key)
        assert alias not in MODEL_COLORS, f"{alias} is both a model and an alias"


@pytest.mark.parametrize("figure", sorted(DRAWN_TOGETHER))
def test_models_drawn_together_stay_apart(figure):
    """Every pair of models one figure draws: at least 10 CIE76 units apart as readers with normal
    vision and with each of the three colour blindnesses see them (10 is clearly distinguishable for
    lines side by side; no palette of a dozen colours does much better for every reader), and at
    least 15 apart with normal vision."""
    models = DRAWN_TOGETHER[figure]
    for m in models:
        assert m in MODEL_COLORS, (figure, m)
    for a, b in itertools.combinations(models, 2):
        ca, cb = MODEL_COLORS[a], MODEL_COLORS[b]
        assert delta_e(ca, cb) >= 15, (figure, a, b, delta_e(ca, cb))
        for kind in CVD:
            assert delta_e(ca, cb, kind) >= 10, (figure, kind, a, b, delta_e(ca, cb, kind))


def test_any_two_models_differ_visibly():
    for a, b in itertools.combinations(MODEL_COLORS, 2):
        assert delta_e(MODEL_COLORS[a], MODEL_COLORS[b]) >= 8, (a, b)


# ---------------------------------------------------------------------------------------------
# Every per-model colour mapping in the code comes from the palette.

def _sources():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "lab" in path.relative_to(ROOT / pkg).parts[:-1]:
                continue   # kernel families' exploration notes are not the book's plotting code
            yield path


def _color_assignments(tree):
    """(name, node, module_level) of every assignment of a dict to a constant (an upper-case name or
    attribute) containing COLOR: ``COLORS``, ``MODEL_COLORS``, ``INTERVENTION_COLORS``, ... (the
    schematics' ``PALETTE`` colours roles, query, key, value, not models)."""
    module_level = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        for t in targets:
            name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else None
            if name and name.isupper() and "COLOR" in name and isinstance(node.value, (ast.Dict, ast.DictComp, ast.Call)):
                yield name, node, id(node) in module_level


def test_color_dicts_in_the_code_draw_from_the_palette():
    found = []
    for path in _sources():
        if path == ROOT / "lattn_core" / "palette.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        for name, node, top in _color_assignments(tree):
            where = f"{path.relative_to(ROOT)}:{node.lineno} {name}"
            if isinstance(node.value, ast.Dict) and node.value.keys and all(
                    isinstance(k, ast.Constant) and not isinstance(k.value, str) for k in node.value.keys):
                continue   # keyed by something other than a name (checks.MARK_COLORS: passed or not)
            literals = [n.value for n in ast.walk(node.value) if isinstance(n, ast.Constant)
                        and isinstance(n.value, str) and (n.value.startswith("#") or
                                                          (len(n.value) == 2 and n.value[0] == "C"))]
            assert not literals, f"{where}: colours typed in ({literals}); take them from lattn_core.palette"
            calls = {n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
                     for n in ast.walk(node.value) if isinstance(n, ast.Call)}
            names = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
            assert calls & {"color_of"} or names & {"MODEL_COLORS"}, \
                f"{where}: a colour mapping that does not come from lattn_core.palette"
            if top:
                module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                mapping = getattr(importlib.import_module(module), name)
                if isinstance(mapping, dict):
                    values = list(mapping.values())
                    assert set(values) <= set(MODEL_COLORS.values()), where
                    assert len(set(values)) == len(values), f"{where}: two entries share a colour"
            found.append(where)
    # the experiments' figures hold at least these (the test must be able to see them)
    for expected in ("experiments/common.py", "experiments/multihop.py", "experiments/extrapolation.py",
                     "experiments/short_conv.py", "experiments/state_tracking.py"):
        assert any(f.startswith(expected) for f in found), (expected, found)


def test_the_experiments_colour_their_models_by_the_palette():
    import experiments.common as common
    import experiments.extrapolation as extrapolation
    import experiments.multihop as multihop
    import experiments.short_conv as short_conv
    import experiments.state_tracking as state_tracking
    for key, c in common.MODEL_COLORS.items():
        assert c == color_of(key)
    for mod in (extrapolation, multihop, state_tracking):
        for key, c in mod.COLORS.items():
            assert c == color_of(key), (mod.__name__, key)
    for key, c in short_conv.COLORS.items():
        assert c == color_of(f"short_conv_{key}")
    assert state_tracking.INTERVENTION_COLORS["none"] == color_of("path")


def test_kernel_figures_colour_series_by_model():
    from kernels.report import series_colors
    ops = ["flash_attention", "chunk_linear_attn", "chunk_simple_gla", "chunk_gla", "chunk_delta_rule",
           "chunk_gated_delta_rule", "chunk_gated_delta_product", "chunk_comba", "parallel_forgetting_attn",
           "deltaformer_attn", "parallel_path_attn", "chunk_mesa_net", "causal_conv1d"]
    recs = [dict(impl="ours", op=op, T=T, B=65536 // T, ms=1.0, **{"pass": "fwd"})
            for op in ops for T in (512, 1024)]
    recs += [dict(impl="sdpa", op="flash_attention", T=T, B=65536 // T, ms=1.0, **{"pass": "fwd"})
             for T in (512, 1024)]
    colors = series_colors({"name": "survey", "records": recs})
    assert len(colors) == len(ops) + 1
    for op in ops:
        assert colors[f"ours, {op}"] == color_of(op), op
    assert colors["sdpa, flash_attention"] == color_of("sdpa")
    assert len(set(colors.values())) == len(colors)
    # one model's other implementations: shades of its colour, each its own
    recs = [dict(impl=impl, op="delta_rule", T=T, B=1, ms=1.0, dtype=dt, **{"pass": "fwd"})
            for impl in ("ours", "fla") for dt in ("float32", "bf16") for T in (512, 1024)]
    colors = series_colors({"name": "delta", "records": recs})
    assert colors["ours, float32"] == color_of("deltanet") or colors["ours, bf16"] == color_of("deltanet")
    assert len(set(colors.values())) == 4


def test_palette_module_is_importable_on_its_own():
    # experiments and kernels import it; it imports nothing of the book's
    tree = ast.parse(Path(palette.__file__).read_text())
    imported = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert all((getattr(n, "module", None) or "") in ("__future__", "re") or
               all(a.name == "re" for a in getattr(n, "names", [])) for n in imported)
