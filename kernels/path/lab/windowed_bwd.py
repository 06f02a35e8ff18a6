"""Lab: the blueprint of PaTH's round-3 backward, in float64 PyTorch, checked against autograd.

The backward's gradients of the block-level quantities (``dQ̃``, ``dK̂`` and ``dP_b`` for every
block's product ``P_b = I − W_bᵀ U_b``) from the gradient ``dS`` of the scores, computed the windowed
way ``NOTES.md`` ("Open") plans, with no step that touches a pair of blocks more than the flash
backward does, then compared with autograd through the scores written the direct way (what today's
kernels compute). Nothing here is fast; it fixes the algebra (every transpose) before any kernel.

Blocks of ``C`` tokens, windows of ``m`` blocks. For a query block ``i`` in window ``a`` and a key
block ``l`` in an earlier window ``w``:

- ``Q^a_i = Q̃_i P_{i−1} ⋯ P_{s(a)}``: the queries pulled to their window's start (the in-window walk);
- ``K̄_l = K̂_l (P_{e(w)} ⋯ P_{l+1})ᵀ``: the keys pushed to their window's end;
- ``Π_v = P_{e(v)} ⋯ P_{s(v)}``: a window's product, and ``X_{i,w} = Q^a_i Π_{a−1} ⋯ Π_{w+1}``;
- ``S_il = X_{i,w} K̄_lᵀ``.

The passes (each a kernel to be):

1. **window prepare**: ``Π_v`` and ``K̄`` (O(T · m · C · K));
2. **cross-window, query-major**, per query block, windows walked down then up:
   down ``X_w`` (``X ← X Π_{w+1}``) and ``G_w = Σ_{l∈w} dS_il K̄_l`` (one product per pair);
   up the Horner sum ``R_{v+1} = R_v Π_vᵀ + G_v`` with ``M_v += X_vᵀ R_v`` (one ``K × K`` sum per
   query block and window) and ``dQ^a_i = R_a``;
3. **cross-window, key-major**, per key block: ``dK̄_l = Σ_i dS_ilᵀ X_{i,w}``, with ``X`` recomputed
   as ``Q^a_i Φ`` from a running ``Φ = Π_{a−1} ⋯ Π_{w+1}`` (``Φ ← Π_a Φ`` per window): no atomics;
4. **in-window**: today's walk limited to the window, its Horner sum started from ``dQ^a_i``
   instead of zero (so ``dQ̃_i`` and the blocks' ``M_l`` take the cross-window part with them);
5. **key push backward**: ``dK̂_l += dK̄_l (P_{e(w)} ⋯ P_{l+1})`` and, for ``l < b ≤ e(w)``,
   ``dP_b += E_bᵀ Z_{l,b}`` with ``E_b = dK̄_l P_{e(w)} ⋯ P_{b+1}`` and ``Z_{l,b}`` the keys pushed
   to block ``b``'s start;
6. **window products backward**: ``dP_b += (P_{e(v)} ⋯ P_{b+1})ᵀ M_v (P_{b−1} ⋯ P_{s(v)})ᵀ``.

``dP_b`` then goes to ``dW_b = −U_b dP_bᵀ`` and ``dU_b = −W_b dP_b`` (``P_b = I − W_bᵀ U_b``), what
the per-block backward already takes (``gw = W M``, ``hu = U Mᵀ``).

    python kernels/path/lab/windowed_bwd.py     # asserts, prints the largest relative differences
"""
import torch

torch.set_default_dtype(torch.float64)


def row_transport(Pb, lo, hi):
    """``P_{hi−1} ⋯ P_{lo}`` (the identity when ``hi <= lo``): ``X`` times it is ``X`` carried back
    across blocks ``hi−1, …, lo``, one ``X ← X P_b`` at a time, as the kernels' walks do."""
    K = Pb.shape[-1]
    out = torch.eye(K)
    for b in reversed(range(lo, hi)):
        out = out @ Pb[b]
    return out


def direct_scores(Qt, Kh, Pb, C):
    """The scores of query block ``i`` and key block ``l < i``: ``Q̃_i P_{i−1} ⋯ P_{l+1} K̂_lᵀ``
    (``[NB, NB, C, C]``, zero where ``l >= i``): what today's walk computes."""
    NB = Qt.shape[0]
    S = torch.zeros(NB, NB, C, C)
    for i in range(NB):
        for l in range(i):
            # X_{i,l} = Q̃_i P_{i−1} ⋯ P_{l+1}: the rows carried back, X ← X P_b block by block
            X = Qt[i] @ row_transport(Pb, l + 1, i)
            S[i, l] = X @ Kh[l].T
    return S


def windowed_grads(Qt, Kh, Pb, dS, C, m):
    """``(dQ̃, dK̂, dP)`` of ``Σ dS ⊙ S`` by passes 1-6 of the module's docstring."""
    NB, _, K = Qt.shape
    NW = -(-NB // m)
    s = lambda v: v * m                      # noqa: E731 - a window's first block
    e = lambda v: min(NB, (v + 1) * m) - 1   # noqa: E731 - and its last
    win = lambda b: b // m                   # noqa: E731
    # 1. window prepare: Π_v (X ↦ X Π_v crosses the whole window), the keys pushed to its end
    Pi = [row_transport(Pb, s(v), e(v) + 1) for v in range(NW)]
    Kbar = torch.stack([Kh[l] @ row_transport(Pb, l + 1, e(win(l)) + 1).T for l in range(NB)])
    # Q^a_i: queries pulled to their window's start (the in-window walk's end point)
    Qa = torch.stack([Qt[i] @ row_transport(Pb, s(win(i)), i) for i in range(NB)])
    dQa = torch.zeros_like(Qt)
    M = torch.zeros(NW, K, K)
    dKbar = torch.zeros_like(Kh)
    # 2. cross-window, query-major
    for i in range(NB):
        a = win(i)
        X, G = {}, {}
        x = Qa[i]
        for w in range(a - 1, -1, -1):       # down: X_w = X_{w+1} Π_{w+1}
            if w < a - 1:
                x = x @ Pi[w + 1]
            X[w] = x
            G[w] = sum(dS[i, l] @ Kbar[l] for l in range(s(w), e(w) + 1))
        r = torch.zeros(C, K)                # up: R_0 = 0, R_{v+1} = R_v Π_vᵀ + G_v, M_v += X_vᵀ R_v
        for v in range(0, a):
            M[v] += X[v].T @ r
            r = r @ Pi[v].T + G[v]
        dQa[i] = r
    # 3. cross-window, key-major, with X recomputed from a running Φ
    for l in range(NB):
        w = win(l)
        phi = torch.eye(K)                   # Φ = Π_{a−1} ⋯ Π_{w+1}, X = Q^a Φ
        for a in range(w + 1, NW):
            if a > w + 1:
                phi = Pi[a - 1] @ phi
            for i in range(s(a), e(a) + 1):
                dKbar[l] += dS[i, l].T @ (Qa[i] @ phi)
    # 4. in-window: the walk limited to the window, its Horner sum started from dQ^a_i
    dQt = torch.zeros_like(Qt)
    dKh = torch.zeros_like(Kh)
    dP = torch.zeros_like(Pb)
    for i in range(NB):
        a = win(i)
        X = {}
        x = Qt[i]
        for l in range(i - 1, s(a) - 1, -1):   # down: X_{i,l}, then cross block l
            X[l] = x
            dKh[l] += dS[i, l].T @ x
            x = x @ Pb[l]
        r = dQa[i]                              # up from the window's start
        for l in range(s(a), i):
            # X_{i,l} P_l is the row entering block l from above; dP_l = (X_{i,l})ᵀ R (row form)
            dP[l] += X[l].T @ r
            r = r @ Pb[l].T + dS[i, l] @ Kh[l]
        dQt[i] = r
    # 5. key push backward: K̄_l = K̂_l (P_e ⋯ P_{l+1})ᵀ = K̂_l P_{l+1}ᵀ ⋯ P_eᵀ
    for l in range(NB):
        w = win(l)
        z = {}
        zc = Kh[l]
        for b in range(l + 1, e(w) + 1):        # Z_{l,b}: keys at block b's start
            z[b] = zc
            zc = zc @ Pb[b].T
        E = dKbar[l]
        for b in range(e(w), l, -1):            # E_b = dK̄_l P_e ⋯ P_{b+1}; then cross b
            dP[b] += E.T @ z[b]
            E = E @ Pb[b]
        dKh[l] += E
    # 6. window products backward: Π_v = P_e ⋯ P_{b+1} · P_b · P_{b−1} ⋯ P_s
    for v in range(NW):
        for b in range(s(v), e(v) + 1):
            left = row_transport(Pb, b + 1, e(v) + 1)     # applied before P_b in X @ Π_v
            right = row_transport(Pb, s(v), b)            # applied after
            dP[b] += left.T @ M[v] @ right.T
    return dQt, dKh, dP


def check(NB=12, C=8, K=6, m=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    Qt = torch.randn(NB, C, K, generator=g, requires_grad=True)
    Kh = torch.randn(NB, C, K, generator=g, requires_grad=True)
    Wd = torch.nn.functional.normalize(torch.randn(NB, C, K, generator=g), dim=-1)
    # a block product of C reflections-like factors: P_b = I − W_bᵀ U_b with U_b random-ish
    Ub = 0.3 * torch.randn(NB, C, K, generator=g)
    Pb = (torch.eye(K) - Wd.transpose(1, 2) @ Ub).requires_grad_(True)
    S = direct_scores(Qt, Kh, Pb, C)
    dS = torch.randn(S.shape, generator=g) * (S != 0)
    (S * dS).sum().backward()
    got = windowed_grads(Qt.detach(), Kh.detach(), Pb.detach(), dS, C, m)
    out = {}
    for name, a, b in zip(("dQ̃", "dK̂", "dP"), got, (Qt.grad, Kh.grad, Pb.grad)):
        out[name] = float((a - b).abs().max() / b.abs().max())
    return out


if __name__ == "__main__":
    for NB, m in ((12, 3), (10, 4), (7, 7), (9, 1)):
        d = check(NB=NB, m=m)
        print(f"NB = {NB:2d} blocks, windows of m = {m}:", "  ".join(f"{k} {v:.1e}" for k, v in d.items()))
        assert max(d.values()) < 1e-12, d
    print("windowed gradients = autograd of the direct scores (float64, to 1e-12)")
