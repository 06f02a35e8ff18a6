"""NumPy references for *A Brief Executable History of Linear Attention*.

One head, the article's notation ("convention B"): ``Q, K`` are ``(n, d_k)``, ``V`` is ``(n, d_v)``,
the state ``S`` is ``(d_v, d_k)``, a read is ``o_t = S_t q_t``, a write adds ``v_t k_t^T``. Causal
always, no implicit ``1/sqrt(d)``, float64 in and out. See the book's notation page.
"""
from ._validate import as_array, check_chunk_size, check_gate, check_positive, check_qkv
from .checks import IdentityCheck, check_close, check_symbolic, max_abs_error, max_rel_error
from .masks import causal_mask, strict_causal_mask
from .rnn import attention_lookup, linear_rnn, linear_rnn_unrolled, rnn_input_gradient
from .softmax import attention_scores, softmax_attention, softmax_attention_recurrent
from .softmax import causal_block_mask, rms_norm, softmax_attention_chunkwise, softmax_attention_numerator

__all__ = [
    "as_array", "check_chunk_size", "check_gate", "check_positive", "check_qkv",
    "IdentityCheck", "check_close", "check_symbolic", "max_abs_error", "max_rel_error",
    "causal_mask", "strict_causal_mask",
    "linear_rnn", "linear_rnn_unrolled", "rnn_input_gradient", "attention_lookup",
    "attention_scores", "softmax_attention", "softmax_attention_recurrent",
    "softmax_attention_chunkwise", "softmax_attention_numerator", "rms_norm", "causal_block_mask",
]
from .linear_attention import (draw_random_features, elu_plus_one, linear_attention_chunkwise,
                               linear_attention_nocausal, linear_attention_parallel,
                               linear_attention_recurrent, linear_attention_state,
                               normalized_linear_attention, random_feature_error, random_feature_map,
                               recall_error_theory, recall_experiment, recall_vs_length)
from .forget_gates import (compose_affine, decay_attention_chunkwise, decay_attention_parallel, decay_attention_recurrent,
                           decay_attention_rescaled, decay_mask, decay_mask_naive,
                           elementwise_gate_attention_parallel, elementwise_gate_attention_recurrent,
                           gated_attention_scan, gla_attention_chunkwise, gla_attention_parallel,
                           gla_attention_recurrent, is_outer_product_gate, linear_recurrence_loop,
                           linear_recurrence_scan, matrix_gate_attention_parallel,
                           matrix_gate_attention_recurrent, outer_gate_attention_chunkwise,
                           pairwise_transitions, rope_decay_attention_complex,
                           rope_decay_attention_rotated, rope_rotate)
from . import forget_gates as _fg, linear_attention as _la  # noqa: E402

__all__ += list(_la.__all__) + list(_fg.__all__)
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
