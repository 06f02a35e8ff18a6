"""Bad input to :mod:`kernels` raises the same ``ValueError`` on every backend and device
(``kernels/validate.py``).

- A required argument (a gate, ``beta``, ``w``, ``lamb``, ``x``, ``weight``) passed as ``None`` or
  as a non-tensor raises a ``ValueError`` naming it and its shape, on the PyTorch path and on the
  Triton path alike (before, one path crashed with ``AttributeError`` and the other silently ran
  another model).
- Python arguments of the wrong type (``scale``, ``output_final_state``, ``check_values``,
  ``activation``) raise ``ValueError`` too, not ``TypeError``.
- The value checks (gate ranges, NaN/inf, ``lamb > 0``, a symmetric ``h_kk_init``) run on every
  device. A GPU cannot run here, so tensors that *report* ``is_cuda`` (a subclass) stand in for one:
  before, every value check was skipped for them. What differs on a real GPU is only where the
  reductions run: one op call reads its value checks back with exactly one host transfer and
  nothing else (counted: calls of ``kernels.validate._to_host``, and ``aten._local_scalar_dense``,
  which every ``.item()``, ``bool()`` or ``float()`` of a tensor dispatches).
- ``check_values=False`` skips the value checks and only those.
- :class:`kernels.validate.ValueChecks` itself, on CPU and ``meta`` tensors (the device-side half
  of a GPU call: the stacked reductions stay on the device until the one read).
"""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import kernels
import kernels.validate as validate
from kernels.validate import ValueChecks

B, T, H, K, V, N = 1, 5, 2, 16, 16, 2      # N: DeltaProduct's Householder steps per token


def _inputs():
    """Good inputs of every op with values to check, as keyword arguments (float32, CPU)."""
    gen = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen)                                   # noqa: E731
    q, k, v = r(B, T, H, K), F.normalize(r(B, T, H, K), dim=-1), r(B, T, H, V)
    g, beta = F.logsigmoid(r(B, T, H)), torch.sigmoid(r(B, T, H))
    hkk = r(B, H, K, K)
    return {
        "parallel_forgetting_attn": dict(q=q, k=k, v=v, g=g),
        "chunk_simple_gla": dict(q=q, k=k, v=v, g=g),
        "chunk_gla": dict(q=q, k=k, v=v, g=F.logsigmoid(r(B, T, H, K))),
        "chunk_delta_rule": dict(q=q, k=k, v=v, beta=beta),
        "chunk_gated_delta_rule": dict(q=q, k=k, v=v, g=g, beta=beta),
        "chunk_gated_delta_product": dict(q=q, k=F.normalize(r(B, T * N, H, K), dim=-1), v=r(B, T * N, H, V),
                                          g=g, beta=torch.sigmoid(r(B, T * N, H)), num_householder=N),
        "chunk_comba": dict(q=q, k=k, v=v, g=g, beta=beta),
        "deltaformer_attn": dict(q=q, k=k, v=v, beta=beta),
        "parallel_path_attn": dict(q=q, k=k, v=v, w=F.normalize(r(B, T, H, K), dim=-1), beta=2 * beta, g=g),
        "chunk_mesa_net": dict(q=q, k=k, v=v, g=g, beta=beta, lamb=torch.ones(H, K),
                               h_kk_init=hkk @ hkk.transpose(-1, -2)),
        "causal_conv1d": dict(x=r(B, T, 8), weight=r(8, 4)),
    }


def _call(op, args, **kw):
    return getattr(kernels, op)(**args, **kw)


def _set(t, value, index=3):
    t = t.clone()
    t.view(-1)[index] = value
    return t


# (op, argument, how to make it bad, the message): the value checks of every op
VALUE_CASES = [
    ("parallel_forgetting_attn", "g", lambda g: g.abs() + 0.1, r"^g holds log decays and must be <= 0; found"),
    ("parallel_forgetting_attn", "g", lambda g: _set(g, float("nan")), r"^g contains NaN or inf"),
    ("chunk_simple_gla", "g", lambda g: _set(g, 0.5), r"^g holds log decays and must be <= 0; found min .*, max 0.5"),
    ("chunk_simple_gla", "g", lambda g: _set(g, float("-inf")), r"^g contains NaN or inf"),
    ("chunk_gla", "g", lambda g: _set(g, 1e-3), r"^g holds log decays and must be <= 0"),
    ("chunk_gla", "g", lambda g: _set(g, float("inf")), r"^g contains NaN or inf"),
    ("chunk_delta_rule", "beta", lambda b: _set(b, 2.5), r"^beta must lie in \[0, 2\] elementwise"),
    ("chunk_delta_rule", "beta", lambda b: _set(b, -0.1), r"^beta must lie in \[0, 2\] elementwise.*min -0.1"),
    ("chunk_delta_rule", "beta", lambda b: _set(b, float("nan")), r"^beta contains NaN or inf"),
    ("chunk_gated_delta_rule", "g", lambda g: g.abs(), r"^g holds log decays"),
    ("chunk_gated_delta_rule", "beta", lambda b: b + 2, r"^beta must lie in \[0, 2\]"),
    ("chunk_gated_delta_product", "g", lambda g: _set(g, 0.25), r"^g holds log decays"),
    ("chunk_gated_delta_product", "beta", lambda b: _set(b, 3.0), r"^beta must lie in \[0, 2\]"),
    ("chunk_comba", "g", lambda g: _set(g, float("nan")), r"^g contains NaN or inf"),
    ("chunk_comba", "beta", lambda b: _set(b, 2.5), r"^beta must lie in \[0, 2\]"),
    ("deltaformer_attn", "beta", lambda b: _set(b, float("inf")), r"^beta contains NaN or inf"),
    ("parallel_path_attn", "w", lambda w: _set(w, float("nan")), r"^w contains NaN or inf"),
    ("parallel_path_attn", "beta", lambda b: _set(b, 2.5), r"^beta must lie in \[0, 2\]"),
    ("parallel_path_attn", "g", lambda g: _set(g, 0.1), r"^g holds log decays"),
    ("chunk_mesa_net", "g", lambda g: -g, r"^g holds log decays"),
    ("chunk_mesa_net", "beta", lambda b: _set(b, -0.5), r"^beta must be >= 0 elementwise"),
    ("chunk_mesa_net", "lamb", lambda lam: _set(lam, 0.0), r"^lamb must be > 0 elementwise \(shape \[H, K\] = \[2, 16\]\); found min 0"),
    ("chunk_mesa_net", "lamb", lambda lam: _set(lam, float("nan")), r"^lamb contains NaN or inf"),
    ("chunk_mesa_net", "h_kk_init", lambda h: _set(h, h.view(-1)[1] + 1.0), r"^h_kk_init must be symmetric"),
    ("chunk_mesa_net", "h_kk_init", lambda h: _set(h, float("nan"), 0), r"^h_kk_init contains NaN or inf"),
]


class FakeCuda(torch.Tensor):
    """A CPU tensor that reports ``is_cuda`` (what the old checks looked at to skip themselves)."""

    @property
    def is_cuda(self):
        return True


def _bad(op, arg, make):
    args = _inputs()[op]
    args[arg] = make(args[arg])
    return args


@pytest.mark.parametrize("op,arg,make,msg", VALUE_CASES)
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_value_checks_on_cpu(op, arg, make, msg, backend):
    with pytest.raises(ValueError, match=msg):
        _call(op, _bad(op, arg, make), backend=backend)


@pytest.mark.parametrize("op,arg,make,msg", VALUE_CASES)
def test_value_checks_on_every_device(op, arg, make, msg):
    """Tensors that report ``is_cuda`` get the same value checks (before, all were skipped)."""
    args = {n: (t.as_subclass(FakeCuda) if isinstance(t, torch.Tensor) else t)
            for n, t in _bad(op, arg, make).items()}
    assert args["q"].is_cuda
    with pytest.raises(ValueError, match=msg):
        _call(op, args, backend="torch")


class _CountScalarReads(TorchDispatchMode):
    """Counts ``aten._local_scalar_dense``: a device-to-host read of one number (a sync on a GPU)."""

    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads += 1
        return func(*args, **(kwargs or {}))


class _Validated(Exception):
    """Raised in place of the backend choice: validation is over, nothing else runs."""


def _stop_after_validation(monkeypatch):
    import kernels.conv.op, kernels.delta.op, kernels.deltaformer.op, kernels.flash.op  # noqa: E401
    import kernels.gla.op, kernels.mesa.op, kernels.path.op  # noqa: E401

    def stop(backend, x):
        raise _Validated
    for fam in ("conv", "delta", "deltaformer", "flash", "gla", "mesa", "path"):
        monkeypatch.setattr(getattr(kernels, fam).op, "resolve_backend", stop)


@pytest.mark.parametrize("op", sorted(_inputs()))
def test_one_host_read_per_call(op, monkeypatch):
    """All of an op call's value checks come back in one transfer, and no check reads a number
    any other way (so on a GPU the call syncs once); ``check_values=False`` reads nothing."""
    transfers = []
    real = validate._to_host
    monkeypatch.setattr(validate, "_to_host", lambda s: transfers.append(s.shape) or real(s))
    _stop_after_validation(monkeypatch)
    args = _inputs()[op]
    for check_values, expect in ((True, 0 if op == "causal_conv1d" else 1), (False, 0)):
        transfers.clear()
        with _CountScalarReads() as mode, pytest.raises(_Validated):
            _call(op, args, check_values=check_values)
        assert mode.reads == 0, (op, check_values, mode.reads)
        assert len(transfers) == expect, (op, check_values, transfers)


@pytest.mark.parametrize("op,arg,make,msg", VALUE_CASES)
def test_check_values_false_skips_values_only(op, arg, make, msg, monkeypatch):
    """With ``check_values=False`` bad values pass validation; bad shapes still raise."""
    _stop_after_validation(monkeypatch)
    args = _bad(op, arg, make)
    with pytest.raises(_Validated):
        _call(op, args, check_values=False)
    args[arg] = args[arg][..., :1]      # (PaTH's beta [B, T, 1]: one head where k has two, said so)
    with pytest.raises(ValueError, match=rf"^{arg} must have (shape \[|the heads of k)"):
        _call(op, args, check_values=False)


# (op, argument, the message): required arguments; each is passed as None and as a float
REQUIRED = [
    ("parallel_forgetting_attn", "g", r"^g must be a torch.Tensor of shape \[1, 5, 2\]; got "),
    ("chunk_simple_gla", "g", r"^g must be a torch.Tensor of shape \[1, 5, 2\]; got "),
    ("chunk_gla", "g", r"^g must be a torch.Tensor of shape \[1, 5, 2, 16\]; got "),
    ("chunk_delta_rule", "beta", r"^beta must be a torch.Tensor of shape \[1, 5, 2\]; got "),
    ("chunk_gated_delta_rule", "g", r"^g must be a torch.Tensor of shape \[1, 5, 2\]; got "),
    ("chunk_gated_delta_rule", "beta", r"^beta must be a torch.Tensor of shape \[1, 5, 2\]; got "),
    ("chunk_gated_delta_product", "beta",
     r"^beta must be a torch.Tensor of shape \[B, T·num_householder, H\] = \[1, 10, 2\]; got "),
    ("chunk_comba", "g", r"^g must be a torch.Tensor of shape \[1, 5, 2\]; got |beta \(η\) must be"),
    ("chunk_comba", "beta", r"^beta must be a torch.Tensor of shape \[1, 5, 2\]; got |beta \(η\) must be"),
    ("parallel_path_attn", "w", r"^w must be a torch.Tensor of shape \[1, 5, 2, 16\]; got "),
    ("parallel_path_attn", "beta", r"^beta must be a torch.Tensor of shape \[1, 5, 2\]; got "),
    ("chunk_mesa_net", "g", r"^g must be a torch.Tensor of shape \[1, 5, 2\]; got "),
    ("chunk_mesa_net", "beta", r"^beta must be a torch.Tensor of shape \[1, 5, 2\]; got "),
    ("chunk_mesa_net", "lamb", r"^lamb must be a torch.Tensor of shape \[2, 16\]; got "),
    ("deltaformer_attn", "q", r"^q must be a torch.Tensor of shape \[B, T, H, D\]; got "),
    ("causal_conv1d", "x", r"^x must be a torch.Tensor of shape \[B, T, D\]; got "),
    ("causal_conv1d", "weight", r"^weight must have shape \[D, W\] = \[8, W\] .*; got "),
]


@pytest.mark.parametrize("op,arg,msg", REQUIRED)
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("value", [None, 0.5])
def test_required_arguments(op, arg, msg, backend, value):
    args = _inputs()[op]
    args[arg] = value
    with pytest.raises(ValueError, match=msg):
        _call(op, args, backend=backend)


@pytest.mark.parametrize("op", sorted(_inputs()))
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_python_arguments(op, backend):
    """Wrong Python arguments raise ``ValueError`` naming them, not ``TypeError`` or nothing."""
    args = _inputs()[op]
    if op not in ("causal_conv1d", "chunk_mesa_net"):      # neither takes a scale
        for scale in ([1.0], "0.5", True, float("nan"), 0.0):
            with pytest.raises(ValueError, match=r"^scale must be a positive finite number"):
                _call(op, args, scale=scale, backend=backend)
    if op == "causal_conv1d":
        with pytest.raises(ValueError, match=r"^activation must be None, 'silu' or 'swish'; got \['silu'\]"):
            _call(op, args, activation=["silu"], backend=backend)
    if op not in ("parallel_forgetting_attn", "deltaformer_attn", "parallel_path_attn"):   # fla's have none
        for flag in (None, "yes", 1):
            with pytest.raises(ValueError, match=r"^output_final_state must be a bool"):
                _call(op, args, output_final_state=flag, backend=backend)
    with pytest.raises(ValueError, match=r"^check_values must be a bool"):
        _call(op, args, check_values="no", backend=backend)


def test_flash_attention_flags():
    q = torch.randn(1, 5, 2, 16)
    with pytest.raises(ValueError, match=r"^causal must be a bool"):
        kernels.flash_attention(q, q, q, causal=1)
    with pytest.raises(ValueError, match=r"^check_values must be a bool"):
        kernels.flash_attention(q, q, q, check_values=None)
    with pytest.raises(ValueError, match=r"^scale must be a positive finite number"):
        kernels.flash_attention(q, q, q, scale=[0.5])


# ------------------------------------------------------------------------------------------------
# ValueChecks itself


def test_value_checks_stack_one_tensor_on_the_device():
    """One ``aminmax`` per tensor, shared by its rules; the results stacked into one float64
    tensor on the inputs' own device, the rules decided on the numbers read back."""
    for device in ("cpu", "meta"):
        g = torch.full((3, 4), -1.0, device=device, dtype=torch.bfloat16)
        beta = torch.full((3,), 0.5, device=device)
        c = ValueChecks()
        c.finite(g, "g")
        c.bounds(g, "g must be <= 0", hi=0.0)
        c.finite(beta, "beta")
        c.bounds(beta, "beta in [0, 2]", lo=0.0, hi=2.0)
        s = c.stats()
        assert s.shape == (4,) and s.dtype == torch.float64 and s.device.type == device
    assert c.stats().device.type == "meta"


def test_value_checks_read_nothing_on_meta(monkeypatch):
    """Meta tensors hold no values: nothing is read (on a GPU the same stacked tensor is read once)."""
    monkeypatch.setattr(validate, "_to_host", lambda s: pytest.fail("read a meta tensor"))
    c = ValueChecks()
    c.finite(torch.empty(3, device="meta"), "g")
    c.run()


def test_value_checks_decisions():
    def first_error(build):
        c = ValueChecks()
        build(c)
        try:
            c.run()
        except ValueError as e:
            return str(e)
        return None

    x = torch.tensor([0.0, 1.0, 2.0])
    assert first_error(lambda c: c.bounds(x, "x in [0, 2]", lo=0.0, hi=2.0)) is None
    assert first_error(lambda c: c.bounds(x, "x in (0, 2]", lo=0.0, lo_open=True)) == \
        "x in (0, 2]; found min 0, max 2"
    assert first_error(lambda c: c.bounds(x, "x <= 1", hi=1.0)) == "x <= 1; found min 0, max 2"
    # rules in the order added: the first failing one speaks
    y = torch.tensor([float("nan"), 5.0])
    assert first_error(lambda c: (c.finite(y, "y"), c.bounds(y, "y <= 0", hi=0.0))) == "y contains NaN or inf"
    assert first_error(lambda c: (c.bounds(x, "x <= 1", hi=1.0), c.finite(y, "y"))).startswith("x <= 1")
    assert first_error(lambda c: c.finite(torch.tensor([1.0, -float("inf")]), "z")) == "z contains NaN or inf"
    # symmetric: allclose's test, atol relative to the largest entry; NaN is not symmetric
    a = torch.randn(2, 5, 5, dtype=torch.float64)
    s = 1e3 * (a + a.transpose(-1, -2))
    assert first_error(lambda c: c.symmetric(s, "s", rtol=1e-5, atol=1e-6)) is None
    s2 = s.clone()
    s2[0, 0, 1] += 1.0                 # far above 1e-5 relative and 1e-6 of the largest entry
    assert first_error(lambda c: c.symmetric(s2, "s", rtol=1e-5, atol=1e-6)) == \
        "s must be symmetric in its last two axes"
    s3 = s.clone()
    s3[1, 2, 3] = float("nan")
    assert first_error(lambda c: c.symmetric(s3, "s", rtol=1e-5, atol=1e-6)) is not None
    # disabled: nothing queued, nothing read
    c = ValueChecks(False)
    c.finite(y, "y")
    assert c.stats() is None
    c.run()
