"""NumPy references for *A Brief Executable History of Linear Attention*.

One head, the article's notation ("convention B"): ``Q, K`` are ``(n, d_k)``, ``V`` is ``(n, d_v)``,
the state ``S`` is ``(d_v, d_k)``, a read is ``o_t = S_t q_t``, a write adds ``v_t k_t^T``. Causal
always, no implicit ``1/sqrt(d)``, float64 in and out. See the book's notation page.
"""
from ._validate import as_array, check_chunk_size, check_gate, check_positive, check_qkv
from .checks import IdentityCheck, check_close, check_symbolic, max_abs_error, max_rel_error
from .masks import causal_mask, strict_causal_mask
from .softmax import attention_scores, softmax_attention, softmax_attention_recurrent

__all__ = [
    "as_array", "check_chunk_size", "check_gate", "check_positive", "check_qkv",
    "IdentityCheck", "check_close", "check_symbolic", "max_abs_error", "max_rel_error",
    "causal_mask", "strict_causal_mask",
    "attention_scores", "softmax_attention", "softmax_attention_recurrent",
]
from .delta import (comba_recurrent, comba_to_gated_deltanet, cumulative_alpha_breakdown,  # noqa: E402
                    deltanet_chunkwise, deltanet_parallel, deltanet_recurrent, deltaproduct_recurrent,
                    forward_substitution, gated_deltanet_chunkwise, gated_deltanet_parallel,
                    gated_deltanet_recurrent, gated_deltanet_to_comba, gated_deltanet_via_cumulative_alpha,
                    overwrite_experiment)

__all__ += [
    "forward_substitution", "deltanet_recurrent", "deltanet_parallel", "deltanet_chunkwise",
    "gated_deltanet_recurrent", "gated_deltanet_parallel", "gated_deltanet_chunkwise",
    "comba_recurrent", "comba_to_gated_deltanet", "gated_deltanet_to_comba", "deltaproduct_recurrent",
    "gated_deltanet_via_cumulative_alpha", "cumulative_alpha_breakdown", "overwrite_experiment",
]
from .ttt import TTT_LOSSES, ttt_loss, ttt_recurrent, ttt_regression_curve, ttt_symbolic_step  # noqa: E402

__all__ += ["TTT_LOSSES", "ttt_loss", "ttt_recurrent", "ttt_symbolic_step", "ttt_regression_curve"]
