"""Packed sequences (fla's ``cu_seqlens``) on every op (``kernels/common/varlen.py``).

The claim: an op given ``N`` sequences packed along ``T`` with their offsets returns what it
returns for each sequence alone: the outputs at each sequence's positions, its final state from its
own initial state, and the same gradients for every input. So each op runs once packed and once
per sequence (the sequences of lengths 5, 70, 0, 130, 33 and 1: two groups, one of a single
chunk, a ragged chunk in each, an empty sequence whose final state is its initial one), and
everything is compared, both on the PyTorch path and on the Triton path (the interpreter on a
CPU). Both runs do the same arithmetic on each sequence (a sequence starts at position 0 of its
padded row, so its chunks are the same), so they agree to float32 round-off: 1e-5 relative to the
largest value. A wrong state row, a padded tail that writes into the state, a position sent back to
the wrong place or a gradient lost in the gathers are all O(1) (``test_the_check_can_fail``).
"""
import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels.common.varlen import SHORT, check_cu_seqlens, last_inputs, length_groups

DEVICES = (["cpu"] if kernels.INTERPRET else []) + (["cuda"] if torch.cuda.is_available() else [])
LENS = (5, 70, 0, 130, 33, 1)
TOL = 1e-5


def _rel(a, b):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def _case(op, T, N, device, seed=0, H=2, K=16, V=32):
    """``(per-token inputs [1, T, ...], per-sequence states [N, ...], call)`` for ``op`` in float32;
    ``call(tokens, states, backend, cu_seqlens)`` returns a list of outputs (tensors or ``None``)."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)                                      # noqa: E731
    q, k, v = r(1, T, H, K), F.normalize(r(1, T, H, K), dim=-1), r(1, T, H, V)
    g = F.logsigmoid(r(1, T, H) + 3)
    beta = torch.rand(1, T, H, generator=gen)
    h0 = r(N, H, K, V)
    if op == "flash_attention":
        tok, st = [q, k, v], []
        call = lambda t, s, be, cu: [kernels.flash_attention(*t, backend=be, cu_seqlens=cu)]  # noqa: E731
    elif op == "parallel_forgetting_attn":
        tok, st = [q, k, v, g], []
        call = lambda t, s, be, cu: [kernels.parallel_forgetting_attn(*t, backend=be, cu_seqlens=cu)]  # noqa: E731
    elif op == "deltaformer_attn":
        tok, st = [q, k, v, beta], []
        call = lambda t, s, be, cu: [kernels.deltaformer_attn(*t, backend=be, cu_seqlens=cu)]  # noqa: E731
    elif op == "parallel_path_attn":
        w = F.normalize(r(1, T, H, K), dim=-1)
        tok, st = [q, k, v, w, 2 * beta, g], []
        call = lambda t, s, be, cu: list(kernels.parallel_path_attn(*t, backend=be, cu_seqlens=cu))  # noqa: E731
    elif op in ("chunk_linear_attn", "chunk_simple_gla", "chunk_gla", "chunk_delta_rule",
                "chunk_gated_delta_rule", "chunk_comba"):
        gate = {"chunk_simple_gla": [g], "chunk_gla": [F.logsigmoid(r(1, T, H, K) + 3)],
                "chunk_gated_delta_rule": [g], "chunk_comba": [g]}.get(op, [])
        tok = [q, k, v] + gate + ([beta] if "delta" in op or op == "chunk_comba" else [])
        st = [h0]
        fn = getattr(kernels, op)
        call = lambda t, s, be, cu: list(fn(*t, initial_state=s[0], output_final_state=True,  # noqa: E731
                                            backend=be, cu_seqlens=cu))
    elif op == "chunk_mesa_net":
        lamb = torch.rand(H, K, generator=gen) + 0.5
        hkk = r(N, H, K, K)
        hkk = 0.1 * hkk @ hkk.transpose(-1, -2)          # symmetric, positive semi-definite
        tok, st = [q / 4, k, v, g, beta], [hkk, 0.1 * h0]
        call = lambda t, s, be, cu: list(kernels.chunk_mesa_net(                          # noqa: E731
            *t, lamb.to(t[0].device), max_CG_iteration=K + 8, h_kk_init=s[0], h_kv_init=s[1],
            output_final_state=True, backend=be, cu_seqlens=cu))
    elif op == "causal_conv1d":
        D, W = 24, 4
        x, wt, bias, res = r(1, T, D), r(D, W), r(D), r(1, T, D)
        tok, st = [x, res], [r(N, D, W)]
        call = lambda t, s, be, cu: list(kernels.causal_conv1d(                           # noqa: E731
            t[0], wt.to(t[0].device), bias.to(t[0].device), t[1], s[0], True, "silu", backend=be,
            cu_seqlens=cu))
    elif op == "chunk_gated_delta_product":
        n = 2          # the n steps of a token side by side ([1, T, n, ...]), so that slicing T slices them
        kk, vv = F.normalize(r(1, T, n, H, K), dim=-1), r(1, T, n, H, V)
        bb = torch.rand(1, T, n, H, generator=gen)
        steps = lambda x: x.reshape(1, -1, *x.shape[3:])                                   # noqa: E731
        tok, st = [q, kk, vv, g, bb], [h0]
        call = lambda t, s, be, cu: list(kernels.chunk_gated_delta_product(               # noqa: E731
            t[0], steps(t[1]), steps(t[2]), t[3], steps(t[4]), n,
            initial_state=s[0], output_final_state=True, backend=be, cu_seqlens=cu))
    else:
        raise AssertionError(op)
    return [t.to(device) for t in tok], [s.to(device) for s in st], call


OPS = ["flash_attention", "parallel_forgetting_attn", "deltaformer_attn", "parallel_path_attn", "chunk_linear_attn",
       "chunk_simple_gla", "chunk_gla", "chunk_delta_rule", "chunk_gated_delta_rule", "chunk_comba",
       "chunk_gated_delta_product", "chunk_mesa_net", "causal_conv1d"]


def _grads(outs, leaves, seed=7):
    """Gradients of a fixed random projection of the outputs (``None`` outputs skipped)."""
    gen = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.randn(o.shape, generator=gen).to(o.device)).sum() for o in outs if o is not None)
    return torch.autograd.grad(loss, leaves, allow_unused=True)


def _packed_and_alone(op, backend, device, lens=LENS):
    T, N = sum(lens), len(lens)
    tok, st, call = _case(op, T, N, device)
    offs = [0]
    for n in lens:
        offs.append(offs[-1] + n)
    cu = torch.tensor(offs, device=device)
    # packed
    leaves = [t.clone().requires_grad_(True) for t in tok + st]
    outs = call(leaves[:len(tok)], leaves[len(tok):], backend, cu)
    packed = outs, _grads(outs, leaves)
    # one sequence at a time; an empty one has no outputs and keeps its initial states
    leaves2 = [t.clone().requires_grad_(True) for t in tok + st]
    per_seq = []
    for i, (a, b) in enumerate(zip(offs, offs[1:])):
        if a == b:
            per_seq.append(None)
            continue
        t_i = [t[:, a:b] for t in leaves2[:len(tok)]]
        s_i = [s[i:i + 1] for s in leaves2[len(tok):]]
        per_seq.append(call(t_i, s_i, backend, None))
    kinds = ["tokens"] + ["state"] * (len(packed[0]) - 1)
    alone = []
    for j, kind in enumerate(kinds):
        parts = [p[j] for p in per_seq if p is not None]
        if parts[0] is None:
            alone.append(None)
        elif kind == "tokens":
            alone.append(torch.cat(parts, dim=1))
        else:                      # states: the empty sequence keeps its own initial state
            rows, it = [], iter(parts)
            for i, p in enumerate(per_seq):
                rows.append(next(it) if p is not None else _initial_of(op, j, leaves2[len(tok):], i))
            alone.append(torch.cat(rows))
    return packed, (alone, _grads(alone, leaves2)), lens


def _initial_of(op, j, states, i):
    """The final state output ``j`` of ``op`` for an empty sequence ``i``: its initial state."""
    s = states[j - 1] if op == "chunk_mesa_net" else states[0]
    return s[i:i + 1]                    # in the graph: its gradient is the final state's


@pytest.mark.parametrize("device", DEVICES + ["torch-path"])
@pytest.mark.parametrize("op", OPS)
def test_packed_equals_one_sequence_at_a_time(op, device):
    backend, device = ("torch", "cpu") if device == "torch-path" else ("triton", device)
    (outs, grads), (outs1, grads1), _ = _packed_and_alone(op, backend, device)
    assert len(outs) == len(outs1)
    for i, (a, b) in enumerate(zip(outs, outs1)):
        assert (a is None) == (b is None), (op, i)
        if a is not None:
            assert a.shape == b.shape, (op, i, a.shape, b.shape)
            assert _rel(a, b) <= TOL, f"{op} output {i}: {_rel(a, b):.2e}"
    for i, (a, b) in enumerate(zip(grads, grads1)):
        assert a is not None and b is not None, (op, "gradient", i)
        assert _rel(a, b) <= TOL, f"{op} gradient {i}: {_rel(a, b):.2e}"


def test_the_check_can_fail():
    """A packed call that lets the state run on from one sequence into the next (no cu_seqlens,
    the states of the first sequence) differs from one sequence at a time at O(1)."""
    tok, st, call = _case("chunk_delta_rule", 40, 2, "cpu")
    o_run_on = call(tok, [st[0][:1]], "torch", None)[0]
    o_a = call([t[:, :20] for t in tok], [st[0][:1]], "torch", None)[0]
    o_b = call([t[:, 20:] for t in tok], [st[0][1:]], "torch", None)[0]
    assert _rel(o_run_on, torch.cat([o_a, o_b], 1)) > 0.05


def test_one_sequence_is_the_plain_call():
    tok, st, call = _case("chunk_gla", 50, 1, "cpu")
    a = call(tok, st, "torch", torch.tensor([0, 50]))
    b = call(tok, st, "torch", None)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_length_groups():
    lens = [5, 70, 0, 130, 33, 1, 4000, 2100, 1999, 64, 65]
    groups = length_groups(lens)
    assert sorted(n for g in groups for n in g) == list(range(len(lens)))
    for g in groups:
        top = max(lens[n] for n in g)
        assert top <= SHORT or all(2 * lens[n] > top for n in g), (g, [lens[n] for n in g])
    # padded tokens: under twice the real ones plus one chunk a sequence
    padded = sum(max(lens[n] for n in g) * len(g) for g in groups)
    assert padded < 2 * sum(lens) + SHORT * len(lens)
    assert [sorted(lens[n] for n in g) for g in groups] == [[2100, 4000], [1999], [70, 130], [33, 64, 65], [0, 1, 5]]


def test_last_inputs():
    x = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(2, 5, 3)
    s0 = -torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4) - 1
    got = last_inputs(x, [5, 2], 4, s0)
    full0 = torch.cat([s0[0].T, x[0]])          # [9, 3]
    full1 = torch.cat([s0[1].T, x[1, :2]])      # [6, 3]
    assert torch.equal(got[0], full0[-4:].T) and torch.equal(got[1], full1[-4:].T)
    assert torch.equal(last_inputs(x, [0, 1], 4)[0], torch.zeros(3, 4))


@pytest.mark.parametrize("bad,match", [
    (torch.tensor([0.0, 3.0, 10.0]), "integers"),
    (torch.tensor([[0, 10]]), "1-D"),
    (torch.tensor([0]), "1-D"),
    (torch.tensor([1, 10]), "from 0 to the packed length T = 10"),
    (torch.tensor([0, 9]), "from 0 to the packed length T = 10"),
    (torch.tensor([0, 6, 4, 10]), "non-decreasing"),
    ([0, 10], "torch.Tensor"),
])
def test_bad_cu_seqlens(bad, match):
    with pytest.raises(ValueError, match=match):
        check_cu_seqlens(bad, 10)
    tok, st, call = _case("chunk_delta_rule", 10, 2, "cpu")
    with pytest.raises(ValueError, match="cu_seqlens"):
        call(tok, st, "torch", bad)


def test_bad_shapes_with_cu_seqlens():
    tok, st, call = _case("chunk_delta_rule", 10, 3, "cpu")
    cu = torch.tensor([0, 4, 4, 10])
    with pytest.raises(ValueError, match=r"initial_state must have one row per sequence: \[N, \.\.\.\] with N = "
                                         r"len\(cu_seqlens\) - 1 = 2; got \[3, 2, 16, 32\]"):
        call(tok, st, "torch", torch.tensor([0, 4, 10]))
    two = [torch.cat([t, t]) for t in tok]
    with pytest.raises(ValueError, match=r"with cu_seqlens, q must be \[1, T, \.\.\.\]"):
        call(two, st, "torch", cu)
    short_v = [tok[0], tok[1], tok[2][:, :9], tok[3]]
    with pytest.raises(ValueError, match=r"with cu_seqlens, v must be \[1, T, \.\.\.\].*T = 10"):
        call(short_v, st, "torch", cu)
    q, k, v = tok[:3]
    with pytest.raises(ValueError, match="causal must be True with cu_seqlens"):
        kernels.flash_attention(q, k, v, causal=False, cu_seqlens=cu)
    with pytest.raises(ValueError, match="num_householder must be an integer >= 1"):
        kernels.chunk_gated_delta_product(q, k, v, None, tok[3], 0, cu_seqlens=cu)
    with pytest.raises(ValueError, match="cu_seqlens must run from 0 to the packed length T = 10"):
        kernels.chunk_gated_delta_product(q, torch.cat([k, k], 1), torch.cat([v, v], 1), None,
                                          torch.cat([tok[3], tok[3]], 1), 2, cu_seqlens=torch.tensor([0, 20]))


def test_host_copy():
    """fla's ``cu_seqlens_cpu``: alone it serves as the offsets; beside ``cu_seqlens`` it must agree."""
    tok, st, call = _case("chunk_gla", 50, 2, "cpu")
    q, k, v, g = tok
    cu = torch.tensor([0, 20, 50])
    a = kernels.chunk_gla(q, k, v, g, initial_state=st[0], output_final_state=True, cu_seqlens=cu)
    b = kernels.chunk_gla(q, k, v, g, initial_state=st[0], output_final_state=True, cu_seqlens_cpu=cu)
    c = kernels.chunk_gla(q, k, v, g, initial_state=st[0], output_final_state=True, cu_seqlens=cu,
                          cu_seqlens_cpu=cu.clone())
    assert all(torch.equal(x, y) and torch.equal(x, z) for x, y, z in zip(a, b, c))
    with pytest.raises(ValueError, match="cu_seqlens_cpu must hold the same offsets as cu_seqlens"):
        kernels.chunk_gla(q, k, v, g, initial_state=st[0], cu_seqlens=cu, cu_seqlens_cpu=torch.tensor([0, 30, 50]))


def test_signature_and_doc():
    import inspect
    for op in OPS:
        fn = getattr(kernels, op)
        for name in ("cu_seqlens", "cu_seqlens_cpu"):
            p = inspect.signature(fn).parameters[name]
            assert p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is None, (op, name)
            assert name in fn.__doc__, (op, name)
