"""The common floor of ``kernels/`` (``kernels/common``), and what it gives every op: any head size
up to 256.

Each op runs its Triton path (the interpreter on a CPU, compiled on a GPU) at head sizes its
kernels do not tile (8, 24, 60, 100: zero-padded to the next tile) and at one over its largest tile
(200: the PyTorch path on the device), and is compared with its PyTorch path on the same inputs,
outputs, final states and every gradient. Both run in float32 with IEEE products (the interpreter
is exact; on a GPU the float32 kernels use IEEE products too), so the two agree to float32
round-off of sums over at most ``T`` or ``K`` terms: 1e-4 relative to the largest value is
100x that, while a wrong padding (a nonzero padded column, a scale taken from the padded size, a
state not cut back) changes results at O(1) (checked: ``test_padding_is_not_a_no_op``).
"""
import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels.common import MAX_HEAD, head_tile, pad_axis

DEVICES = (["cpu"] if kernels.INTERPRET else []) + (["cuda"] if torch.cuda.is_available() else [])
TOL = 1e-4


def test_head_tile():
    sizes = (16, 32, 64, 128)
    assert [head_tile("K", d, sizes) for d in (1, 8, 16, 17, 60, 64, 100, 128)] == [16, 16, 16, 32, 64, 64, 128, 128]
    assert head_tile("K", 129, sizes) is None and head_tile("K", MAX_HEAD, sizes) is None
    for bad in (0, MAX_HEAD + 1, 512):
        with pytest.raises(ValueError, match=r"K must be between 1 and 256; got"):
            head_tile("K", bad, sizes)


def test_pad_axis():
    x = torch.arange(6.0).reshape(2, 3)
    assert pad_axis(x, 3) is x and pad_axis(None, 4) is None
    y = pad_axis(x, 5)
    assert y.shape == (2, 5) and torch.equal(y[:, :3], x) and not y[:, 3:].any()
    z = pad_axis(x, 4, dim=0, value=1.0)
    assert z.shape == (4, 3) and torch.equal(z[:2], x) and torch.equal(z[2:], torch.ones(2, 3))
    with pytest.raises(ValueError, match="cannot pad"):
        pad_axis(x, 2)


def _rel(a, b):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def _inputs(op, B, T, H, K, V, device, seed):
    """Inputs of each op in fla's layout (float32), and the call taking them and a backend."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)                                   # noqa: E731
    q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, H, V)
    g = F.logsigmoid(r(B, T, H) + 3)
    beta = torch.rand(B, T, H, generator=gen)
    h0 = r(B, H, K, V)
    kn = F.normalize(k, dim=-1)
    if op == "flash_attention":
        x, call = [q, k, v], lambda q, k, v, backend: [kernels.flash_attention(q, k, v, backend=backend)]
    elif op == "parallel_forgetting_attn":
        x = [q, k, v, g]
        call = lambda *a, backend: [kernels.parallel_forgetting_attn(*a, backend=backend)]        # noqa: E731
    elif op == "deltaformer_attn":
        x = [q, kn, v, beta]
        call = lambda *a, backend: [kernels.deltaformer_attn(*a, backend=backend)]                # noqa: E731
    elif op == "parallel_path_attn":
        w = F.normalize(r(B, T, H, K), dim=-1)
        x = [q, k, v, w, 2 * beta, g]
        call = lambda *a, backend: [kernels.parallel_path_attn(*a, backend=backend)[0]]           # noqa: E731
    elif op == "chunk_linear_attn":
        x = [q, k, v, h0]
        call = lambda q, k, v, h0, backend: list(kernels.chunk_linear_attn(          # noqa: E731
            q, k, v, initial_state=h0, output_final_state=True, backend=backend))
    elif op == "chunk_simple_gla":
        x = [q, k, v, g, h0]
        call = lambda q, k, v, g, h0, backend: list(kernels.chunk_simple_gla(         # noqa: E731
            q, k, v, g, initial_state=h0, output_final_state=True, backend=backend))
    elif op == "chunk_gla":
        gv = F.logsigmoid(r(B, T, H, K) + 3)
        x = [q, k, v, gv, h0]
        call = lambda q, k, v, g, h0, backend: list(kernels.chunk_gla(                # noqa: E731
            q, k, v, g, initial_state=h0, output_final_state=True, backend=backend))
    elif op == "chunk_delta_rule":
        x = [q, kn, v, beta, h0]
        call = lambda q, k, v, b, h0, backend: list(kernels.chunk_delta_rule(         # noqa: E731
            q, k, v, b, initial_state=h0, output_final_state=True, backend=backend))
    elif op == "chunk_gated_delta_rule":
        x = [q, kn, v, g, beta, h0]
        call = lambda q, k, v, g, b, h0, backend: list(kernels.chunk_gated_delta_rule(  # noqa: E731
            q, k, v, g, b, initial_state=h0, output_final_state=True, backend=backend))
    elif op == "chunk_mesa_net":
        lamb = torch.rand(H, K, generator=gen) + 0.5
        x = [q / 4, kn, v, g, beta, lamb, 0.1 * h0]
        call = lambda q, k, v, g, b, lam, h0, backend: list(kernels.chunk_mesa_net(    # noqa: E731
            q, k, v, g, b, lam, max_CG_iteration=K + 8, h_kv_init=h0, output_final_state=True,
            backend=backend))
    else:
        raise AssertionError(op)
    return [t.to(device) for t in x], call


OPS = ["flash_attention", "parallel_forgetting_attn", "deltaformer_attn", "parallel_path_attn", "chunk_linear_attn",
       "chunk_simple_gla", "chunk_gla", "chunk_delta_rule", "chunk_gated_delta_rule", "chunk_mesa_net"]


def _compare(op, K, V, device, T=37):
    x, call = _inputs(op, 2, T, 2, K, V, device, seed=K * 7 + V)
    outs = {}
    for backend in ("torch", "triton"):
        leaves = [t.detach().clone().requires_grad_(True) for t in x]
        res = [o for o in call(*leaves, backend=backend) if o is not None]
        gen = torch.Generator().manual_seed(5)
        loss = sum((o * torch.randn(o.shape, generator=gen).to(o.device)).sum() for o in res)
        loss.backward()
        outs[backend] = res + [t.grad for t in leaves]
    return outs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("K,V", [(60, 24), (8, 100)])
def test_any_head_size(device, op, K, V):
    """Zero padding to the tiles: the Triton path equals the PyTorch path at odd head sizes."""
    outs = _compare(op, K, V, device)
    for i, (a, b) in enumerate(zip(outs["triton"], outs["torch"])):
        assert a.shape == b.shape, (op, i, a.shape, b.shape)
        assert _rel(a, b) <= TOL, f"{op} K={K} V={V}: result {i}: {_rel(a, b):.2e}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op,K", [("flash_attention", 200), ("chunk_delta_rule", 200), ("chunk_mesa_net", 200),
                                  ("chunk_gla", 200), ("chunk_gla", 320), ("chunk_simple_gla", 512)])
def test_over_the_largest_tile(device, op, K):
    """Up to 256 every op runs, and the gla family's up to 1024 (fla's GLA tests pass 320 and 512):
    over a family's largest tile, the PyTorch path on the device (GLA tiles 256, so its K = 200 is
    padded)."""
    outs = _compare(op, K, 24, device, T=20)
    for i, (a, b) in enumerate(zip(outs["triton"], outs["torch"])):
        assert _rel(a, b) <= TOL, f"{op} K={K}: result {i}: {_rel(a, b):.2e}"


def test_padding_is_not_a_no_op():
    """The comparison above can fail: a nonzero padded key column changes the outputs at O(1)."""
    x, call = _inputs("chunk_delta_rule", 1, 20, 1, 60, 24, "cpu", seed=1)
    q, k, v, beta, h0 = x
    o = call(q, k, v, beta, h0, backend="torch")[0]
    q2, k2 = pad_axis(q, 64, value=1.0), pad_axis(k, 64, value=1.0)
    o2 = call(q2, k2, v, beta, pad_axis(pad_axis(h0, 64, -2), 24), backend="torch")[0]
    assert _rel(o2, o) > 0.05


# ---------------------------------------------------------------------------------------------
# The shared stages, each on its own: the triangular solve, the cumulative gates, the online
# softmax step and the operand roundings (kernels/common/{solve,gates,softmax,tiles}.py).
# ---------------------------------------------------------------------------------------------
import triton                         # noqa: E402
import triton.language as tl          # noqa: E402

from kernels.common.gates import cumulative_gates                      # noqa: E402
from kernels.common.softmax import LOG2E, online_softmax_step         # noqa: E402
from kernels.common.solve import CHUNK, chunk_cumsum, solve_chunks     # noqa: E402
from kernels.common.tiles import round_operand, round_store            # noqa: E402


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T,H", [(1, 3), (600, 5), (256, 20)])
def test_cumulative_gates(device, T, H):
    """The gate scan (forward and reverse, [B, T, H] and [B, H, T] input, several tiles of 256 steps,
    more heads than one block of 16) against float64 cumsum. A float32 running sum of T terms is off
    by at most T·2^-24 of its largest partial sum (the worst case of T roundings); that is the bound."""
    gen = torch.Generator().manual_seed(T)
    g = F.logsigmoid(1 + 2 * torch.randn(2, T, H, generator=gen)).to(device)
    G = cumulative_gates(g)
    ref = torch.cumsum(g.double(), 1)
    assert G.dtype == torch.float32 and G.shape == g.shape
    assert _rel(G, ref) <= T * 2 ** -24
    R = cumulative_gates(g.transpose(1, 2).contiguous(), reverse=True, out_dtype=torch.bfloat16, time_dim=2)
    ref_r = g.double().flip(1).cumsum(1).flip(1)
    assert R.dtype == torch.bfloat16 and R.shape == g.shape
    # bfloat16 output: half an ulp is 2^-9 of the value; 2^-8 of the largest bounds every entry
    assert _rel(R, ref_r) <= 2 ** -8


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gated", [False, True])
def test_solve_chunks(device, dtype, gated):
    """``T = (I + A)^{-1}`` of every chunk, ``A_ij = β_i e^{b_i − b_j} k_i·k_j`` (j < i, ``b`` the
    within-chunk cumulative log gate from ``chunk_cumsum``), against float64 ``torch.linalg.inv``;
    T = 150 gives two whole chunks and a ragged one. Unit keys and β ≤ 1 keep ``I + A`` well
    conditioned (entries of T stay O(1)): float32 with IEEE products matches to ~1e-6 (bound 1e-5);
    16-bit keys are exact in float32, ``A`` is formed in TF32 (1e-3 of a term) and T is stored in
    the keys' dtype (bfloat16, 2^-9): bound 1e-2."""
    from kernels.delta.plan import plan_for
    B, T, H, K = 1, 150, 2, 32
    gen = torch.Generator().manual_seed(3)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1).to(dtype).to(device)
    beta = torch.rand(B, T, H, generator=gen).to(dtype).to(device)
    g = F.logsigmoid(2 + torch.randn(B, T, H, generator=gen)).to(device) if gated else None
    NT = triton.cdiv(T, CHUNK)
    b, bt = chunk_cumsum(g, beta, B, T, H, NT)
    assert bt is None and b.shape == (B * H, NT * CHUNK) and b.dtype == torch.float32
    plan = plan_for(dtype, torch.device(device), B=B, T=T, H=H, K=K, V=K)
    tm = solve_chunks(k, b, beta, plan)
    assert tm.shape == (B * H, NT * CHUNK, CHUNK) and tm.dtype == dtype
    kd, bd = k.double().cpu(), beta.double().cpu()
    gd = g.double().cpu() if gated else torch.zeros(B, T, H, dtype=torch.float64)
    for h in range(H):
        for c in range(NT):
            r = slice(c * CHUNK, min(T, (c + 1) * CHUNK))
            n = r.stop - r.start
            bc = gd[0, r, h].cumsum(0)
            assert torch.allclose(b[h, c * CHUNK:c * CHUNK + n].double().cpu(), bc, atol=1e-5)
            A = torch.tril(bd[0, r, h, None] * torch.exp(bc[:, None] - bc[None, :]) * (kd[0, r, h] @ kd[0, r, h].T), -1)
            ref = torch.linalg.inv(torch.eye(n, dtype=torch.float64) + A)
            got = tm[h, c * CHUNK:c * CHUNK + n, :n].double().cpu()
            assert (got - ref).abs().max().item() <= (1e-5 if dtype == torch.float32 else 1e-2), (h, c)


@triton.jit
def _softmax_rows_kernel(q_ptr, k_ptr, v_ptr, o_ptr, T, qk_scale, D: tl.constexpr, BM: tl.constexpr,
                         BN: tl.constexpr):
    """One program: BM queries against T keys (all visible) by online_softmax_step, key block by
    key block; writes the normalised output."""
    o_m = tl.arange(0, BM)
    o_d = tl.arange(0, D)
    q = tl.load(q_ptr + o_m[:, None] * D + o_d[None, :])
    acc = tl.zeros([BM, D], dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    for start in range(0, T, BN):
        o_n = start + tl.arange(0, BN)
        k = tl.load(k_ptr + o_n[:, None] * D + o_d[None, :], mask=(o_n < T)[:, None], other=0.0)
        v = tl.load(v_ptr + o_n[:, None] * D + o_d[None, :], mask=(o_n < T)[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
        s = tl.where((o_n < T)[None, :], s, float("-inf"))
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, v, qk_scale, "ieee")
    tl.store(o_ptr + o_m[:, None] * D + o_d[None, :], acc / l_i[:, None])


@pytest.mark.parametrize("device", DEVICES)
def test_online_softmax_step(device):
    """Folding 70 keys in blocks of 16 (a ragged last block) equals softmax(scale·q kᵀ) v in float64;
    float32 with IEEE products: ~1e-7, bound 1e-5 (a wrong rescale of acc or l fails at O(1))."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, 16, generator=gen) for n in (16, 70, 70))
    o = torch.empty(16, 16)
    q, k, v, o = (t.to(device) for t in (q, k, v, o))
    scale = 0.3
    _softmax_rows_kernel[(1,)](q, k, v, o, 70, scale * LOG2E, D=16, BM=16, BN=16)
    ref = torch.softmax(scale * q.double() @ k.double().T, -1) @ v.double()
    assert _rel(o, ref) <= 1e-5


@triton.jit
def _round_kernel(x_ptr, y_ptr, z_ptr, N: tl.constexpr, DT: tl.constexpr, EMU: tl.constexpr):
    o = tl.arange(0, N)
    x = tl.load(x_ptr + o)
    tl.store(y_ptr + o, round_operand(x, DT, EMU).to(tl.float32))
    tl.store(z_ptr + o, round_store(x, z_ptr.dtype.element_ty, EMU))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rounding_helpers(device, dtype):
    """round_operand and round_store round to nearest-even in the 16-bit dtype, as the GPU's cast
    does (torch's .to(dtype) is round-to-nearest-even): equal bit for bit, including the halfway
    cases where a truncating cast (the interpreter's own bfloat16 cast) would differ."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(256, generator=gen) * 100
    # halfway cases of bfloat16: 1 + 2^-8 and 1 + 3·2^-8 (ties to even go down, then up)
    x[:2] = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8])
    x = x.to(device)
    y = torch.empty_like(x)
    z = torch.empty(256, dtype=dtype, device=device)
    tdt = tl.float16 if dtype == torch.float16 else tl.bfloat16
    _round_kernel[(1,)](x, y, z, N=256, DT=tdt, EMU=bool(kernels.INTERPRET))
    assert torch.equal(y, x.to(dtype).float())
    assert torch.equal(z, x.to(dtype))


# ---------------------------------------------------------------------------------------------
# fla's use_qk_l2norm_in_kernel (kernels/common/norm.py)
# ---------------------------------------------------------------------------------------------
from kernels.common import l2norm            # noqa: E402


def test_l2norm_is_flas_formula():
    """``x / sqrt(Σ x² + 1e-6)`` in float32, in ``x``'s dtype: equal to float64's to float32
    round-off (2^-20 relative, a few roundings of a sum of 64 squares); the epsilon shows on a
    tiny vector (norm 1e-4: the result is 1/sqrt(1 + 100) of F.normalize's, not F.normalize's)."""
    x = torch.randn(3, 5, 64, dtype=torch.float64)
    ref = x / torch.sqrt(x.square().sum(-1, keepdim=True) + 1e-6)
    assert _rel(l2norm(x.float()), ref) <= 2 ** -20
    assert l2norm(x.to(torch.bfloat16)).dtype == torch.bfloat16
    tiny = torch.zeros(64)
    tiny[0] = 1e-4
    assert abs(l2norm(tiny)[0].item() - 1 / (1 + 100) ** 0.5) < 1e-6
    assert not l2norm(torch.zeros(2, 8)).any()          # a zero vector stays zero (no NaN)


NORM_OPS = ["chunk_delta_rule", "chunk_gated_delta_rule", "chunk_comba", "chunk_gated_delta_product", "chunk_mesa_net"]


def _norm_call(op, q, k, rest, flag, backend="torch"):
    fn = getattr(kernels, op)
    v, g, beta, lamb, h0 = rest
    kw = dict(backend=backend, use_qk_l2norm_in_kernel=flag)
    if op == "chunk_delta_rule":
        return fn(q, k, v, beta, initial_state=h0, output_final_state=True, **kw)
    if op in ("chunk_gated_delta_rule", "chunk_comba"):
        return fn(q, k, v, g, beta, initial_state=h0, output_final_state=True, **kw)
    if op == "chunk_gated_delta_product":
        return fn(q, k, v, g, beta, 1, initial_state=h0, output_final_state=True, **kw)
    return fn(q, k, v, g, beta, lamb, h_kv_init=h0, output_final_state=True, **kw)


@pytest.mark.parametrize("op", NORM_OPS)
def test_use_qk_l2norm_in_kernel(op):
    """The flag equals normalising ``q`` and ``k`` with :func:`l2norm` first: outputs, states and
    the gradients reaching the raw ``q`` and ``k``, to float32 round-off (1e-5); and without it the
    result differs at O(1) (the raw keys have norms near 4), so the flag is not ignored."""
    gen = torch.Generator().manual_seed(11)
    B, T, H, K = 1, 40, 2, 16
    q, k = torch.randn(B, T, H, K, generator=gen), torch.randn(B, T, H, K, generator=gen)
    rest = (torch.randn(B, T, H, K, generator=gen), F.logsigmoid(torch.randn(B, T, H, generator=gen) + 3),
            torch.rand(B, T, H, generator=gen), torch.rand(H, K, generator=gen) + 0.5,
            0.1 * torch.randn(B, H, K, K, generator=gen))
    outs = {}
    for flag in (True, False):
        q1, k1 = q.clone().requires_grad_(), k.clone().requires_grad_()
        qn, kn = (l2norm(q1), l2norm(k1)) if not flag else (q1, k1)
        res = [o for o in _norm_call(op, qn, kn, rest, flag) if o is not None]
        loss = sum((o * torch.cos(torch.arange(o.numel()).reshape(o.shape).float())).sum() for o in res)
        outs[flag] = res + list(torch.autograd.grad(loss, (q1, k1)))
    for i, (a, b) in enumerate(zip(outs[True], outs[False])):
        assert _rel(a, b) <= 1e-5, f"{op} result {i}: {_rel(a, b):.2e}"
    raw = _norm_call(op, q, k, rest, False)[0]
    assert _rel(raw, outs[True][0]) > 0.05
    with pytest.raises(ValueError, match="use_qk_l2norm_in_kernel must be a bool"):
        _norm_call(op, q, k, rest, 1)


# ---------------------------------------------------------------------------------------------
# fla's grouped heads (kernels/common/heads.py, share_heads)
# ---------------------------------------------------------------------------------------------
from kernels.common import share_heads       # noqa: E402


def test_share_heads():
    q, k = torch.randn(1, 3, 6, 4), torch.randn(1, 3, 2, 4)
    (k6,) = share_heads(q, "q", k=k)
    assert k6.shape == (1, 3, 6, 4) and all(torch.equal(k6[:, :, h], k[:, :, h // 3]) for h in range(6))
    assert share_heads(q, "q", k=q)[0] is q and share_heads(q, "q", g=None)[0] is None
    assert share_heads(None, "q", k=k)[0] is k
    with pytest.raises(ValueError, match=r"k must have the 6 heads of q \(axis 2\) or a whole divisor of them "
                                         r"\(fla's grouped heads\); got 4"):
        share_heads(q, "q", k=torch.randn(1, 3, 4, 4), v=torch.randn(1, 3, 4, 4))
    with pytest.raises(ValueError, match=r"beta must have the heads of k \(2, axis 2: the shared tensors have one "
                                         r"head count\); got 1"):
        share_heads(q, "q", k=k, beta=torch.rand(1, 3, 1))


def _grouped(op, G, gen):
    """``(leaves, call)`` for ``op`` with shared heads (``G`` to a group) and ``call(leaves, expand)``,
    which with ``expand`` repeats the shared tensors itself (the op then sees one head count)."""
    B, T, H, K = 1, 20, 2, 16
    r = lambda *s: torch.randn(*s, generator=gen)                                   # noqa: E731
    rep = lambda x, e: x.repeat_interleave(G, dim=2) if e else x                   # noqa: E731
    if op in ("flash_attention", "parallel_forgetting_attn"):
        x = [r(B, T, H * G, K), r(B, T, H, K), r(B, T, H, K), F.logsigmoid(r(B, T, H * G) + 3)]
        if op == "flash_attention":
            return x[:3], lambda L, e: [kernels.flash_attention(L[0], rep(L[1], e), rep(L[2], e))]
        return x, lambda L, e: [kernels.parallel_forgetting_attn(L[0], rep(L[1], e), rep(L[2], e), L[3])]
    if op == "parallel_path_attn":
        x = [r(B, T, H * G, K), r(B, T, H, K), r(B, T, H, K), F.normalize(r(B, T, H, K), dim=-1),
             torch.rand(B, T, H, generator=gen) * 2, F.logsigmoid(r(B, T, H * G) + 3)]
        return x, lambda L, e: [kernels.parallel_path_attn(L[0], *(rep(t, e) for t in L[1:5]), L[5])[0]]
    x = [r(B, T, H, K), F.normalize(r(B, T, H, K), dim=-1), r(B, T, H * G, K), F.logsigmoid(r(B, T, H * G) + 3),
         torch.rand(B, T, H * G, generator=gen), r(B, H * G, K, K)]
    fn = getattr(kernels, op)
    return x, lambda L, e: list(fn(rep(L[0], e), rep(L[1], e), *L[2:5], initial_state=L[5], output_final_state=True))


@pytest.mark.parametrize("op", ["flash_attention", "parallel_forgetting_attn", "parallel_path_attn",
                                "chunk_gated_delta_rule", "chunk_comba"])
def test_grouped_heads(op):
    """Shared heads equal their explicit repetition: outputs and every gradient (the shared
    tensors' summed over their groups) bit for bit, since the op computes the same thing; a head
    count that is no divisor raises the op's ValueError."""
    x, call = _grouped(op, 3, torch.Generator().manual_seed(2))
    res = {}
    for e in (False, True):
        L = [t.clone().requires_grad_(True) for t in x]
        outs = call(L, e)
        loss = sum((o * torch.sin(torch.arange(o.numel()).reshape(o.shape).float())).sum() for o in outs)
        res[e] = outs + list(torch.autograd.grad(loss, L))
    for i, (a, b) in enumerate(zip(res[False], res[True])):
        assert a.shape == b.shape and torch.equal(a, b), (op, i)
    bad = [t.clone() for t in x]
    shared = 2 if op in ("chunk_gated_delta_rule", "chunk_comba") else 1   # q, k (GVA) or k (GQA)
    i = 0 if shared == 2 else 1
    bad[i] = torch.randn(*bad[i].shape[:2], 4, *bad[i].shape[3:])        # 4 heads: no divisor of 6
    with pytest.raises(ValueError, match=r"must have the heads of [qk] \(4, axis 2"):
        call(bad, False)
