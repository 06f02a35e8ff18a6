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
@pytest.mark.parametrize("op", ["flash_attention", "chunk_delta_rule", "chunk_mesa_net", "chunk_gla"])
def test_over_the_largest_tile(device, op):
    """Up to 256 every op runs: over its kernels' largest tile, the PyTorch path on the device
    (GLA tiles 256, so its K = 200 is padded)."""
    outs = _compare(op, 200, 24, device, T=20)
    for i, (a, b) in enumerate(zip(outs["triton"], outs["torch"])):
        assert _rel(a, b) <= TOL, f"{op} K=200: result {i}: {_rel(a, b):.2e}"


def test_padding_is_not_a_no_op():
    """The comparison above can fail: a nonzero padded key column changes the outputs at O(1)."""
    x, call = _inputs("chunk_delta_rule", 1, 20, 1, 60, 24, "cpu", seed=1)
    q, k, v, beta, h0 = x
    o = call(q, k, v, beta, h0, backend="torch")[0]
    q2, k2 = pad_axis(q, 64, value=1.0), pad_axis(k, 64, value=1.0)
    o2 = call(q2, k2, v, beta, pad_axis(pad_axis(h0, 64, -2), 24), backend="torch")[0]
    assert _rel(o2, o) > 0.05
