"""Chapter 2's identities checked: the chunkwise form line by line, and the recall
experiment exactly as the chapter runs it (the rest of the chapter is in test_linear_attention.py)."""
import numpy as np
import pytest

import lattn_core as lc


@pytest.mark.parametrize("n,C,c", [(300, 64, 3), (300, 64, 4), (37, 5, 0), (37, 5, 7), (1, 1, 0)])
def test_chunkwise_form_is_a_state_read_plus_the_chunk_in_parallel(n, C, c):
    """(ch2-chunk): O_[c] = Q_[c] S_[c]^T + (Q_[c] K_[c]^T ⊙ M) V_[c] and S_[c+1] = S_[c] + V_[c]^T K_[c],
    with S_[c] the state entering chunk c (the last chunk may be short)."""
    rng = np.random.default_rng(n + C + c)
    Q, K, V = rng.normal(size=(n, 6)), rng.normal(size=(n, 6)), rng.normal(size=(n, 4))
    rows = slice(c * C, min((c + 1) * C, n))
    S_c = lc.linear_attention_state(K[: c * C], V[: c * C]) if c else np.zeros((4, 6))
    O_c = Q[rows] @ S_c.T + lc.linear_attention_parallel(Q[rows], K[rows], V[rows])
    # float64 sums of <= 300 products of O(1) numbers: round-off ~1e-13 on outputs of size ~100.
    lc.check_close("chunk rows of the parallel form", O_c, lc.linear_attention_parallel(Q, K, V)[rows], 1e-10)
    lc.check_close("chunk rows of the chunkwise form", O_c,
                   lc.linear_attention_chunkwise(Q, K, V, chunk_size=C)[rows], 1e-10)
    lc.check_close("state after the chunk", S_c + V[rows].T @ K[rows],
                   lc.linear_attention_state(K[: rows.stop], V[: rows.stop]), 1e-10)


def test_recall_experiment_as_in_the_chapter():
    """The chapter's run (d_k = d_v = 64, 3 seeds): the error grows with every length and matches
    sqrt((n-1)/d_k) within 5% of the largest value (means over 3 x n pairs); the cosine falls."""
    lengths = [4, 16, 64, 256, 1024, 4096]
    res = lc.recall_vs_length(lengths, 64, 64, n_seeds=3)
    theory = np.array([lc.recall_error_theory(n, 64)[0] for n in lengths])
    assert np.all(np.diff(res["rel_error"]) > 0) and np.all(np.diff(res["cosine"]) < 0)
    lc.check_close("recall error = sqrt((n-1)/d_k)", res["rel_error"], theory, 0.05, relative=True)
