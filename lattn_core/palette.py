"""One colour per model for the whole book: every figure draws a model in the colour given here.

``MODEL_COLORS`` maps each model's key (the names the experiments use: ``"deltanet"``,
``"gated_deltanet"``, ``"path"``, ...) to a hex colour, no two alike; :func:`color_of` also takes
the names a figure or a table writes (``"Gated DeltaNet"``, ``"RetNet / scalar decay"``,
``"FoX (forget-gated softmax)"``, ``"chunk_delta_rule"``, ...) and raises ``ValueError`` for a
model it does not know, so a new model gets its colour here before a figure draws it.

The colours: the six of Okabe and Ito's colour-blind-safe set that read on white for the models
drawn most often together (softmax, linear, decay, DeltaNet, Gated DeltaNet, MesaNet), then colours
from Paul Tol's and ColorBrewer's colour-blind-aware sets chosen by search so that the models a
figure draws together stay apart also as a reader with red-green or blue-yellow colour blindness
sees them (``DRAWN_TOGETHER`` lists those figures; tests/core/test_palette.py measures the
distances). No set of a dozen colours is safe for every reader, so the figure with every kernel
should also tell its lines apart by marker or line style. Grey and black stay free for reference
lines (chance, a bound, a hand-set model).
"""
from __future__ import annotations

import re

__all__ = ["MODEL_COLORS", "MODEL_ALIASES", "DRAWN_TOGETHER", "model_key", "color_of"]

#: One colour per model, in the order the book meets them.
MODEL_COLORS = {
    # Chapter 1: softmax attention; PyTorch's scaled_dot_product_attention where kernels are timed
    "softmax": "#D55E00",
    "sdpa": "#882255",
    # Chapter 2
    "linear": "#0072B2",
    # Chapter 3: scalar decay (RetNet's constant gate, Mamba2's data-dependent one), GLA
    "decay": "#56B4E9",
    "gla": "#666633",
    # Chapter 4: test-time training with a two-layer fast model
    "ttt_mlp": "#004488",
    # Chapters 5 and 6
    "deltanet": "#009E73",
    "gated_deltanet": "#E69F00",
    "comba": "#8C510A",
    "gated_delta_product": "#663333",
    # Chapter 7: decay inside softmax, and no position encoding at all
    "fox": "#762A83",
    "alibi": "#9970AB",
    "nope": "#F4A582",
    # Chapter 8: DeltaFormer, its variant with a free write strength, and two-layer softmax
    "deltaformer": "#999933",
    "deltaformer_free": "#313695",
    "softmax2": "#AA4499",
    # Chapter 9: PaTH, RoPE (and RoPE at PaTH's depth), PaTH under the interventions of
    # experiments.state_tracking.diagnose_path
    "path": "#92C5DE",
    "rope": "#117733",
    "rope_deep": "#44AA99",
    "path_beta2": "#542788",
    "path_log_length": "#E7298A",
    "path_both": "#B15928",
    "path_float64": "#FDB863",
    # Chapter 10
    "mesanet": "#CC79A7",
    # Chapter 11: the short convolution (its kernel), and the variants of experiments.short_conv
    "short_conv": "#332288",
    "short_conv_none": "#6A3D9A",
    "short_conv_untied": "#CC3311",
    "short_conv_k": "#225555",
    "short_conv_q": "#DDAA33",
    "short_conv_v": "#CAB2D6",
    "short_conv_qkv": "#5AAE61",
    # Chapter 12: stick-breaking attention
    "stick_breaking": "#225522",
}

#: Other names of the models: the names figures and tables write, the kernels' op names. Looked up
#: after lower-casing, dropping a trailing parenthesis and turning spaces and hyphens into ``_``.
MODEL_ALIASES = {
    "softmax_attention": "softmax", "flash_attention": "softmax", "flash": "softmax", "attention": "softmax",
    "linear_attention": "linear", "chunk_linear_attn": "linear", "linear_attn": "linear",
    "retnet": "decay", "mamba2": "decay", "scalar_decay": "decay", "retnet_/_scalar_decay": "decay",
    "simple_gla": "decay", "chunk_simple_gla": "decay",
    "chunk_gla": "gla",
    "ttt": "ttt_mlp",
    "delta_rule": "deltanet", "chunk_delta_rule": "deltanet",
    "gated_delta_rule": "gated_deltanet", "chunk_gated_delta_rule": "gated_deltanet", "gdn": "gated_deltanet",
    "chunk_comba": "comba",
    "deltaproduct": "gated_delta_product", "gated_deltaproduct": "gated_delta_product",
    "chunk_gated_delta_product": "gated_delta_product",
    "forgetting": "fox", "forgetting_attention": "fox", "parallel_forgetting_attn": "fox",
    "deltaformer_attn": "deltaformer",
    "parallel_path_attn": "path",
    "mesa": "mesanet", "mesa_net": "mesanet", "chunk_mesa_net": "mesanet", "mesa_cg": "mesanet",
    "mesa_cg_stiff": "mesanet",
    "causal_conv1d": "short_conv", "short_convolution": "short_conv", "conv": "short_conv",
    "stick_breaking_attention": "stick_breaking",
}

#: Models that one figure of the book draws together (tests/core/test_palette.py keeps them
#: apart, also as colour-blind readers see them).
DRAWN_TOGETHER = {
    "every kernel (Chapter 12)": ("softmax", "sdpa", "linear", "decay", "gla", "deltanet", "gated_deltanet",
                                  "gated_delta_product", "comba", "fox", "deltaformer", "path", "mesanet",
                                  "short_conv"),
    "recall (Chapters 6 and 10)": ("linear", "decay", "deltanet", "gated_deltanet", "mesanet"),
    "extrapolation (Chapter 7)": ("nope", "alibi", "fox"),
    "multi-hop (Chapter 8)": ("softmax", "softmax2", "deltaformer", "deltaformer_free", "deltanet"),
    "state tracking (Chapter 9)": ("path", "rope", "nope", "rope_deep"),
    "PaTH's interventions (Chapter 9)": ("path", "path_beta2", "path_log_length", "path_both", "path_float64"),
    "short convolutions (Chapter 11)": ("short_conv_none", "short_conv_untied", "short_conv_k", "short_conv_q",
                                        "short_conv_v", "short_conv_qkv"),
    "test-time training (Chapter 4)": ("linear", "deltanet", "ttt_mlp"),
}


def _key(name: str) -> str:
    key = re.sub(r"\s*\(.*\)\s*$", "", name.strip()).strip().lower()
    return re.sub(r"[\s\-]+", "_", key)


def model_key(name: str) -> str:
    """The key in ``MODEL_COLORS`` of the model ``name`` (a key, or one of its other names in
    ``MODEL_ALIASES``, any case; a trailing parenthesis is ignored). Raises ``ValueError`` for a name
    that is no model of the book's.

    Used throughout the book."""
    if not isinstance(name, str):
        raise ValueError(f"a model's name is a string; got {name!r}")
    if name in MODEL_COLORS:
        return name
    key = _key(name)
    key = MODEL_ALIASES.get(key, key)
    if key in MODEL_COLORS:
        return key
    raise ValueError(f"no colour for {name!r}: lattn_core.palette.MODEL_COLORS knows "
                     f"{', '.join(MODEL_COLORS)} (and the names in MODEL_ALIASES); add the model there")


def color_of(name: str) -> str:
    """The colour of the model ``name`` (see :func:`model_key` for the names it takes). Raises
    ``ValueError`` for a name that is no model of the book's.

    Used throughout the book."""
    return MODEL_COLORS[model_key(name)]
