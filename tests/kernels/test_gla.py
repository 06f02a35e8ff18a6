"""The Triton kernels of chunk_linear_attn, chunk_simple_gla and chunk_gla against float64 references.

On CPU the kernels run through Triton's interpreter (``backend="triton"``); with CUDA the same tests
also run compiled on the GPU, plus a few larger GPU-only shapes. The oracle is the token-by-token
recurrence :func:`kernels.reference.recurrent_ref` (the chunkwise references for the large GPU
shapes) evaluated in float64 on float64 copies of the same inputs; gradients come from autograd
through it. Errors are fla's RMS ratio ``RMS(x - ref) / RMS(ref)`` (``harness.err_ratio``).

Tolerances:
- float32, 1e-5: every accumulation is float32 and the dots run in IEEE float32 (``input_precision=
  "ieee"``); with at most a few hundred terms per sum the float32 rounding (unit roundoff 6e-8)
  gives ratios of order 1e-7, measured 1e-7 here, so 1e-5 leaves two orders of margin while still
  catching any wrong term (a wrong term gives ratios of order 1e-2 to 1).
- float16/bfloat16, 2e-2: inputs are rounded to 16 bits before both paths see them, but the kernel
  rounds matmul operands (gated keys, scores, the state) and its outputs and gradients to 16 bits
  (bfloat16 unit roundoff 2^-8 = 3.9e-3); a few such roundings in a chain give a few times 1e-3.
- harsh gates: the gate gradient is the reverse cumulative sum of ``q*dq - k*dk`` (plus
  ``sum_v S_T * dS_T``), terms that cancel exactly in exact arithmetic when the gates wipe the
  state; there the true ``dg`` is tiny and float32 leaves an absolute error of about unit roundoff
  times the size of the cancelling terms, so ``dg`` is checked against that scale (1e-5 of it).
"""
import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels.gla.op import chunk_gla_triton
from kernels.harness import err_ratio
from kernels.reference import chunk_gla_ref, chunk_scalar_ref, recurrent_ref

# The Triton kernels run on CPU tensors only under the interpreter, and on CUDA tensors only
# without it: on a GPU machine (TRITON_INTERPRET unset) the "cpu" parametrisation must not run.
DEVICES = (["cpu"] if kernels.INTERPRET else []) + (["cuda"] if torch.cuda.is_available() else [])
if not DEVICES:  # pragma: no cover - a CUDA machine with TRITON_INTERPRET unset always has "cuda"
    DEVICES = ["cpu"]
OPS = ["linear_attn", "simple_gla", "gla"]
TOL = {torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 2e-2}


def _inputs(op, B, T, H, K, V, dtype, device, *, h0=True, harsh=False, noncontig=False, seed=0, gdtype=None):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        if noncontig:   # a [B, H, T, D] buffer seen as [B, T, H, D]: strided, not contiguous
            x = torch.randn(shape[0], shape[2], shape[1], *shape[3:], generator=gen).transpose(1, 2)
            assert not x.is_contiguous()
            return x
        return torch.randn(*shape, generator=gen)

    q, k, v = rnd(B, T, H, K), rnd(B, T, H, K), rnd(B, T, H, V)
    if op == "linear_attn":
        g = None
    else:
        g = F.logsigmoid(rnd(B, T, H) if op == "simple_gla" else rnd(B, T, H, K))
        if harsh:   # per-step decays down to e^-100: the state is wiped within a token or two
            g = g * 40.0 - 5.0 * torch.rand(g.shape, generator=gen)
    s0 = torch.randn(B, H, K, V, generator=gen) if h0 else None
    cast = lambda x: None if x is None else x.to(device=device, dtype=dtype)  # noqa: E731
    s0 = None if s0 is None else s0.to(device)
    g = cast(g) if gdtype is None or g is None else g.to(device=device, dtype=gdtype)
    return cast(q), cast(k), cast(v), g, s0


def _triton(op, q, k, v, g, s0, fin, num_segments=None):
    return chunk_gla_triton(q, k, v, g, q.shape[-1] ** -0.5, s0, fin, num_segments=num_segments)


def _leaves(*xs):
    return [None if x is None else x.detach().requires_grad_(True) for x in xs]


def _run_and_grad(fn, ins, do, dht, fin):
    o, ht = fn(*ins)
    loss = (o.to(torch.float64) * do).sum()
    if fin:
        loss = loss + (ht.to(torch.float64) * dht).sum()
    loss.backward()
    return o, ht, [None if x is None else x.grad for x in ins]


def _compare(op, q, k, v, g, s0, fin, *, tol, ref="recurrent", num_segments=None, dg_abs=False):
    """Run the Triton op and the float64 reference; assert outputs, final state and all grads."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5
    gen = torch.Generator().manual_seed(1)
    do = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64).to(q.device)
    dht = torch.randn(B, H, K, V, generator=gen, dtype=torch.float64).to(q.device) if fin else None

    ins = _leaves(q, k, v, g, s0)
    o, ht, grads = _run_and_grad(lambda q, k, v, g, s0: _triton(op, q, k, v, g, s0, fin, num_segments),
                                 ins, do, dht, fin)
    ins64 = _leaves(*(None if x is None else x.detach().to(torch.float64) for x in (q, k, v, g, s0)))

    def reference(q, k, v, g, s0):
        if ref == "recurrent":
            return recurrent_ref(q, k, v, g, None, scale, s0, fin)
        if op == "gla":
            return chunk_gla_ref(q, k, v, g, scale, s0, fin)
        return chunk_scalar_ref(q, k, v, g, None, scale, s0, fin)

    o64, ht64, grads64 = _run_and_grad(reference, ins64, do, dht, fin)

    assert o.dtype == v.dtype and o.shape == (B, T, H, V)
    assert err_ratio(o, o64) <= tol, f"o: {err_ratio(o, o64):.3g} > {tol}"
    if fin:
        assert ht.dtype == torch.float32 and ht.shape == (B, H, K, V)
        assert err_ratio(ht, ht64) <= tol, f"final state: {err_ratio(ht, ht64):.3g} > {tol}"
    else:
        assert ht is None
    for name, x, gr, gr64 in zip(("dq", "dk", "dv", "dg", "dh0"), (q, k, v, g, s0), grads, grads64):
        if x is None:
            continue
        assert gr is not None and gr.shape == x.shape and gr.dtype == x.dtype, name
        assert torch.isfinite(gr).all(), name
        if name == "dg" and dg_abs:
            # dg is a difference of terms of the size of q*dq and k*dk (see the module docstring)
            scale_terms = max((q.double() * grads[0].double()).abs().max().item(),
                              (k.double() * grads[1].double()).abs().max().item(), 1.0)
            if fin:
                scale_terms = max(scale_terms, (ht.double() * dht).sum(-1).abs().max().item())
            err = (gr.double() - gr64).abs().max().item()
            assert err <= 1e-5 * scale_terms, f"dg: {err:.3g} > 1e-5 * {scale_terms:.3g}"
        else:
            assert err_ratio(gr, gr64) <= tol, f"{name}: {err_ratio(gr, gr64):.3g} > {tol}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("T", [1, 5, 63, 65, 130])
def test_odd_lengths_float32(device, op, T):
    q, k, v, g, s0 = _inputs(op, 1, T, 2, 16, 16, torch.float32, device)
    _compare(op, q, k, v, g, s0, True, tol=TOL[torch.float32])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("h0,fin", [(False, False), (False, True), (True, False)])
def test_state_options(device, op, h0, fin):
    q, k, v, g, s0 = _inputs(op, 2, 65, 2, 16, 16, torch.float32, device, h0=h0, seed=2)
    _compare(op, q, k, v, g, s0, fin, tol=TOL[torch.float32])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("h0,fin,T,ns", [(True, True, 130, 3), (False, False, 200, 2)])
def test_segment_split(device, op, h0, fin, T, ns):
    """The sequence split (segment states, combine, per-segment marches; forward and the backward's
    state-gradient march) gives the same results, also with a shorter last segment (T=200: 4 chunks
    of 64 in 2 segments; 13 GLA steps of 16)."""
    q, k, v, g, s0 = _inputs(op, 1, T, 2, 16, 16, torch.float32, device, h0=h0, seed=3)
    _compare(op, q, k, v, g, s0, fin, tol=TOL[torch.float32], num_segments=ns)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["simple_gla", "gla"])
def test_harsh_gates(device, op):
    q, k, v, g, s0 = _inputs(op, 1, 130, 2, 16, 16, torch.float32, device, harsh=True, seed=4)
    assert g.min() < -60
    _compare(op, q, k, v, g, s0, True, tol=TOL[torch.float32], dg_abs=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision(device, op, dtype):
    q, k, v, g, s0 = _inputs(op, 1, 65, 2, 16, 16, dtype, device, seed=5)
    _compare(op, q, k, v, g, s0, True, tol=TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_small_heads_run_in_float32(device, op):
    """16-bit inputs with K or V below 64 take the float32 kernels (plan.SMALL_HEAD, NOTES "small
    heads"): the output and gradients are the float32 run's on the same values, cast back exactly."""
    from kernels.gla.plan import gate_code, plan_for
    q, k, v, g, s0 = _inputs(op, 1, 40, 2, 32, 64, torch.bfloat16, device, seed=9)
    assert plan_for(q.dtype, q.device, gate=gate_code(g), B=1, T=40, H=2, K=32, V=64).upcast
    assert not plan_for(q.dtype, q.device, gate=gate_code(g), B=1, T=40, H=2, K=64, V=64).upcast
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    f32 = [t.detach().float().requires_grad_() for t in (q, k, v)]
    o, _ = chunk_gla_triton(*leaves, g, 0.5, s0)
    o32, _ = chunk_gla_triton(*f32, g, 0.5, s0)
    assert o.dtype == torch.bfloat16 and torch.equal(o, o32.to(torch.bfloat16))
    do = torch.randn_like(o32)
    grads = torch.autograd.grad(o, leaves, do.to(o.dtype))
    grads32 = torch.autograd.grad(o32, f32, do.to(o.dtype).float())
    for a, b in zip(grads, grads32):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b.to(torch.bfloat16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_noncontiguous_and_mixed_head_sizes(device, op):
    q, k, v, g, s0 = _inputs(op, 1, 33, 2, 32, 16, torch.float32, device, noncontig=True, seed=6)
    assert not q.is_contiguous() and not v.is_contiguous()
    _compare(op, q, k, v, g, s0, True, tol=TOL[torch.float32])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_public_op_dispatches_to_triton(device, op):
    """kernels.<op>(..., backend="triton") runs this kernel; backend="torch" agrees with it."""
    q, k, v, g, s0 = _inputs(op, 1, 20, 2, 16, 16, torch.float32, device, seed=7)
    fn = {"linear_attn": kernels.chunk_linear_attn, "simple_gla": kernels.chunk_simple_gla,
          "gla": kernels.chunk_gla}[op]
    args = (q, k, v) if g is None else (q, k, v, g)
    o_tr, ht_tr = fn(*args, initial_state=s0, output_final_state=True, backend="triton")
    o_ker, ht_ker = _triton(op, q, k, v, g, s0, True)
    assert torch.equal(o_tr, o_ker) and torch.equal(ht_tr, ht_ker)
    o_th, ht_th = fn(*args, initial_state=s0, output_final_state=True, backend="torch")
    assert err_ratio(o_tr, o_th) <= 1e-5 and err_ratio(ht_tr, ht_th) <= 1e-5


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("K,V", [(1100, 16), (16, 2000)])
def test_bad_head_sizes_raise(op, K, V):
    """Over 1024 raises; every size up to it runs (fla's GLA tests pass 320 and 512; the kernels tile
    up to 256, the PyTorch path on the device takes the rest: tests/kernels/test_common.py)."""
    q, k, v, g, _ = _inputs(op, 1, 4, 1, K, V, torch.float32, DEVICES[-1], h0=False)
    fn = {"linear_attn": kernels.chunk_linear_attn, "simple_gla": kernels.chunk_simple_gla,
          "gla": kernels.chunk_gla}[op]
    args = (q, k, v) if g is None else (q, k, v, g)
    with pytest.raises(ValueError, match="between 1 and 1024"):
        fn(*args, backend="triton")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU-only shapes (compiled kernels)")
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,num_segments", [(2049, None), (2049, 5), (1000, None)])
def test_gpu_large(op, dtype, T, num_segments):
    q, k, v, g, s0 = _inputs(op, 1, T, 2, 128, 128, dtype, "cuda", seed=8)
    _compare(op, q, k, v, g, s0, True, tol=TOL[dtype], ref="chunk", num_segments=num_segments)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU-only shapes (compiled kernels)")
@pytest.mark.parametrize("op", OPS)
def test_gpu_head_size_256(op):
    """The largest head size compiles and fits the GPU's shared memory (2 pipeline stages there)."""
    q, k, v, g, s0 = _inputs(op, 1, 200, 2, 256, 256, torch.bfloat16, "cuda", seed=9)
    _compare(op, q, k, v, g, s0, True, tol=TOL[torch.bfloat16], ref="chunk")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op,T", [("simple_gla", 1024), ("gla", 1024)])
def test_gate_gradient_long_bf16(device, op, T):
    """dg stays as accurate as dq, dk over a long sequence in bfloat16.

    dg_t is a sum over all later positions of q*dq - k*dk. Summed naively over the sequence, the
    16-bit rounding errors of those terms add up (growing like sqrt(T)) while dg itself does not
    grow: round 1 measured dg err ratios of 0.09-0.2 on the GPU at T >= 2048 against 0.003 for dq.
    The kernel takes the part from later chunks from the chunk's state and state gradient instead
    (see _dg_kernel), so only one chunk's terms are summed, and forms the in-chunk terms so that
    pairs of positions that cancel in exact arithmetic cancel in float32 too (the diagonal pair is
    left out; the other pairs use the same rounded factors on both sides). Under the interpreter
    the matmul operands, stored states and outputs are rounded to bfloat16 as on the GPU
    (``round_operand``), so this test sees the same error mechanism on CPU. Bounds: 1e-2, and at most 3x the
    error of dq and dk. Measured: dg/dq about 1.2x (simple_gla) and 1.7x (gla); with the chunk
    carry alone (diagonal pairs computed twice) 4.5x and 4x, with the round-1 sequence-long suffix
    sum 0.036 for simple_gla — both fail.
    """
    q, k, v, g, _ = _inputs(op, 1, T, 1, 32, 32, torch.bfloat16, device, h0=False, seed=11)
    do = torch.randn(1, T, 1, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(device)
    _, _, grads = _run_and_grad(lambda q, k, v, g: _triton(op, q, k, v, g, None, False),
                                _leaves(q, k, v, g), do, None, False)
    ref = chunk_gla_ref if op == "gla" else (lambda q, k, v, g, *a: chunk_scalar_ref(q, k, v, g, None, *a))
    _, _, grads64 = _run_and_grad(lambda q, k, v, g: ref(q, k, v, g, 32 ** -0.5, None, False),
                                  _leaves(*(x.detach().double() for x in (q, k, v, g))), do, None, False)
    err = {n: err_ratio(a, b) for n, a, b in zip(("dq", "dk", "dv", "dg"), grads, grads64)}
    assert max(err["dq"], err["dk"], err["dv"]) <= TOL[torch.bfloat16], err
    assert err["dg"] <= 1e-2 and err["dg"] <= 3 * max(err["dq"], err["dk"]), err


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("harsh,T,ns", [(False, 130, None), (True, 130, None), (False, 200, 2)])
def test_gla_forward(device, harsh, T, ns):
    """chunk_gla (the prep stage + the lean march) against the float64 recurrence: outputs, final
    state and all gradients (the backward reads the forward's saved scores), T not a multiple of 64,
    with an initial state, harsh gates (down to e^-100 per step: dg checked on the scale of its
    cancelling terms, see the module docstring) and the split sequence (ns=2). float32, tolerance
    1e-5 as above."""
    q, k, v, g, s0 = _inputs("gla", 1, T, 2, 16, 16, torch.float32, device, harsh=harsh, seed=12)
    if harsh:
        assert g.min() < -60
    _compare("gla", q, k, v, g, s0, True, tol=TOL[torch.float32], num_segments=ns, dg_abs=harsh)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["simple_gla", "gla"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_float32_gates_with_half_inputs(device, op, dtype):
    """float32 log gates (what fla's layers pass) with 16-bit q, k, v: the same bound as 16-bit gates
    (the gates are summed exactly either way; the 16-bit roundings of the operands set the error)."""
    q, k, v, g, s0 = _inputs(op, 1, 130, 2, 16, 16, dtype, device, seed=14, gdtype=torch.float32)
    assert g.dtype == torch.float32 and q.dtype == dtype
    _compare(op, q, k, v, g, s0, True, tol=TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,gdtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                          (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("harsh", [False, True])
def test_gla_prep_outputs(device, dtype, gdtype, harsh):
    """The prep stage's outputs against their definitions, computed independently by brute force in
    float64 (per chunk of 64: b = cumulative sum of g inside the chunk):
    qg = scale q e^{b}, kg = k e^{b_C - b}, dch = b_C, As_ij = scale sum_d q_id k_jd e^{b_id - b_jd}
    (j <= i, else 0). K = 32 (the kernel's K-slices) and T = 150 (a partial last chunk).
    Tolerances: float32 1e-5 (float32 sums of at most 64 terms: float32 gates are summed from three
    bfloat16 pieces, and a sum that dropped the last piece would be off by |b|·2^-17, about 2e-4
    relative in e^b at |b| = 30, and fail); bfloat16 2e-2 on the ratios (outputs rounded to
    bfloat16, relative 2^-9, and the level factors rounded before their product); with harsh gates
    most entries underflow to 0 in both, which the ratio tolerates."""
    from kernels.gla.plan import plan_for
    from kernels.gla.prep import prepare_vector_gate
    B, T, H, K = 1, 150, 2, 32
    q, k, _, g, _ = _inputs("gla", B, T, H, K, 16, dtype, device, h0=False, harsh=harsh, seed=13, gdtype=gdtype)
    scale = K ** -0.5
    plan = plan_for(dtype, q.device, gate=2, B=B, T=T, H=H, K=K, V=16)
    BT, NT = plan.BT, plan.NT
    qg, kg, dch, As = prepare_vector_gate(q, k, g, scale, plan)
    tol = TOL[dtype]
    pad = NT * BT - T
    q64, k64, g64 = (F.pad(x.double().cpu(), (0, 0, 0, 0, 0, pad)) for x in (q, k, g))
    qc, kc, gc = (x.reshape(B, NT, BT, H, K).permute(0, 3, 1, 2, 4).reshape(B * H, NT, BT, K) for x in (q64, k64, g64))
    b = gc.cumsum(2)
    bC = b[:, :, -1:, :]
    want_qg = (scale * qc * b.exp()).reshape(B, H, NT * BT, K).permute(0, 2, 1, 3)[:, :T]
    want_kg = (kc * (bC - b).exp()).reshape(B, H, NT * BT, K).permute(0, 2, 1, 3)[:, :T]
    diff = b[:, :, :, None, :] - b[:, :, None, :, :]                       # [BH, NT, i, j, K]
    causal = torch.ones(BT, BT, dtype=torch.bool).tril()[None, None, :, :, None]
    w = torch.where(causal, diff.clamp(max=0.0), torch.tensor(float("-inf"), dtype=torch.float64)).exp()
    want_A = scale * (qc[:, :, :, None, :] * kc[:, :, None, :, :] * w).sum(-1)
    got_A = As.double().cpu().reshape(B * H, NT, BT, BT)
    rows = (torch.arange(NT * BT) < T).reshape(NT, BT)                     # rows past T are not used
    assert err_ratio(qg.cpu(), want_qg.reshape(B, T, H, K)) <= tol
    assert err_ratio(kg.cpu(), want_kg.reshape(B, T, H, K)) <= tol
    assert err_ratio(dch.cpu(), bC[:, :, 0, :]) <= 1e-5                     # float32 sums of the gates
    assert err_ratio(got_A[:, rows], want_A[:, rows]) <= tol
    assert torch.isfinite(got_A).all()
