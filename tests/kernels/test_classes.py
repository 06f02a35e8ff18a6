"""The kernels on every GPU class the book's readers use: T4 (sm_75, Colab's free GPU), A100 (sm_80),
L4 (sm_89), H100/H200 (sm_90, where every plan was measured).

Checked on a CPU by asking for a class explicitly (``caps=``; :func:`kernels.backend.device_caps`
answers for a real GPU): the class table; bfloat16 rejected on a T4 with a ``ValueError`` naming the
argument, the dtype and the capability, by every op, before anything is planned or compiled; the
plans each class gets (Hopper's are pinned in the family test files); and the numbers the
non-Hopper plans compute. Those run the kernels with the class's tiles through Triton's interpreter
on CPU tensors (compiled on the GPU when there is one: a class's tiles are valid launches on any
newer GPU), against the float64 recurrence. Whether each class's launches compile and fit its
shared memory is ``tests/kernels/test_compile.py``.

Tolerances: float32 only here, RMS error ratio 1e-5 (``harness.err_ratio``), as in
``tests/kernels/test_gla.py``: IEEE float32 products and float32 accumulation over at most a few
hundred terms give ratios of order 1e-7; a wrong tile offset or mask gives order 1e-2 to 1. Where a
class routes an op to the PyTorch implementation, the result must be that implementation's, exactly.
"""
import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels import reference
from kernels.backend import GPU_CLASSES, HOPPER, Caps, check_dtypes, device_caps, gpu_class
from kernels.harness import err_ratio

T4, A100, L4 = GPU_CLASSES[75], GPU_CLASSES[80], GPU_CLASSES[89]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"      # CPU: the interpreter; CUDA: compiled
TOL32 = 1e-5


# --- the class table and the dtype check ----------------------------------------------------------
def test_gpu_classes():
    assert {a: (c.major, c.minor, c.smem // 1024) for a, c in GPU_CLASSES.items()} == {
        75: (7, 5, 64), 80: (8, 0, 163), 89: (8, 9, 99), 90: (9, 0, 227)}
    assert [c.arch for c in GPU_CLASSES.values()] == [75, 80, 89, 90]
    assert gpu_class(75) == T4 and gpu_class(80) == A100 and gpu_class(86) == L4 and gpu_class(89) == L4
    assert gpu_class(90) == HOPPER and gpu_class(100) == HOPPER and gpu_class(120) == HOPPER
    with pytest.raises(ValueError, match=r"compute capability must be 7.5 or newer.*7.0"):
        gpu_class(70)
    assert device_caps("cpu") == HOPPER       # off the GPU the plans answer for Hopper


def test_check_dtypes_names_argument_dtype_and_capability():
    f16, bf = torch.ones(2, dtype=torch.float16), torch.ones(2, dtype=torch.bfloat16)
    with pytest.raises(ValueError) as e:
        check_dtypes(T4, "cpu", q=bf)
    msg = str(e.value)
    assert msg.startswith("q is bfloat16") and "8.0 or newer" in msg and "compute capability 7.5" in msg
    assert "float16 or float32" in msg and "backend='torch'" in msg
    with pytest.raises(ValueError, match=r"^g is bfloat16"):
        check_dtypes(T4, "cpu", q=f16, g=bf, beta=None)
    check_dtypes(T4, "cpu", q=f16, g=torch.ones(2), beta=None)        # float16 and float32 run on a T4
    for caps in (A100, L4, HOPPER, Caps(12, 0, 99 * 1024)):
        check_dtypes(caps, "cpu", q=bf, g=bf)


def _qkv(dtype, B=1, T=70, H=2, K=32, V=32, device=DEVICE, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(B, T, H, K, generator=gen), torch.randn(B, T, H, K, generator=gen), \
        torch.randn(B, T, H, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, H, generator=gen) + 2.0)
    gv = F.logsigmoid(torch.randn(B, T, H, K, generator=gen) + 2.0)
    beta = torch.rand(B, T, H, generator=gen)
    k = F.normalize(k, dim=-1)
    return {n: x.to(device=device, dtype=dtype) for n, x in dict(q=q, k=k, v=v, g=g, gv=gv, beta=beta).items()}


OPS = {
    "flash_attention": lambda x, **kw: kernels.flash_attention(x["q"], x["k"], x["v"], **kw),
    "chunk_linear_attn": lambda x, **kw: kernels.chunk_linear_attn(x["q"], x["k"], x["v"], **kw),
    "chunk_simple_gla": lambda x, **kw: kernels.chunk_simple_gla(x["q"], x["k"], x["v"], x["g"], **kw),
    "chunk_gla": lambda x, **kw: kernels.chunk_gla(x["q"], x["k"], x["v"], x["gv"], **kw),
    "chunk_delta_rule": lambda x, **kw: kernels.chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], **kw),
    "chunk_gated_delta_rule": lambda x, **kw: kernels.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"],
                                                                             x["beta"], **kw),
}
FAMILY = {"flash_attention": "flash", "chunk_linear_attn": "gla", "chunk_simple_gla": "gla", "chunk_gla": "gla",
          "chunk_delta_rule": "delta", "chunk_gated_delta_rule": "delta"}


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_rejects_bfloat16_on_a_t4_before_planning(name, monkeypatch):
    """On a T4 (the op's device reports sm_75) the Triton path of every op raises the ValueError
    before its plan is asked for (so before anything is compiled); float16 passes the check, and
    bfloat16 with ``backend="torch"`` runs."""
    import importlib
    op = importlib.import_module(f"kernels.{FAMILY[name]}.op")
    monkeypatch.setattr(op, "device_caps", lambda device: T4)

    def no_plan(*a, **kw):
        raise AssertionError("planned before the dtype check")
    monkeypatch.setattr(op, "plan_for", no_plan)
    x = _qkv(torch.bfloat16)
    with pytest.raises(ValueError, match=r"^q is bfloat16, which needs compute capability 8.0 or newer \("
                                         r"this GPU: compute capability 7.5\)"):
        OPS[name](x, backend="triton")
    with pytest.raises(AssertionError, match="planned"):      # float16 gets past the check to the plan
        OPS[name](_qkv(torch.float16), backend="triton")
    out = OPS[name](x, backend="torch")
    assert (out if name == "flash_attention" else out[0]).dtype == torch.bfloat16


# --- the plans of the other classes (Hopper's are pinned in tests/kernels/test_gla, test_delta, test_flash) ------------
def test_gla_plans_per_class():
    from dataclasses import asdict
    from kernels.gla.plan import plan_for
    bf, f16, f32 = torch.bfloat16, torch.float16, torch.float32

    def p(gate, K, dtype, caps, V=None):
        return plan_for(dtype, "cpu", gate=gate, B=2, T=4096, H=8, K=K, V=V or K, caps=caps, interpret=False)
    fma = dict(BV_f=32, warps_f=8, stages_f=1, BK_s=32, BV_s=16, warps_s=4, stages_s=1, BV_dv=32, warps_dv=8,
               BK_dq=32, BV_dq=32, warps_dq=8)
    for caps in (A100, L4):
        for gate in (0, 1, 2):
            h, o = asdict(p(gate, 128, bf, HOPPER)), asdict(p(gate, 128, bf, caps))
            # the vector gate's prep kernel: 32 columns on 4 warps (the fields are unused without it)
            assert {k: (h[k], o[k]) for k in h if h[k] != o[k]} == {"BK_p": (128, 32), "warps_p": (8, 4)}
            assert p(gate, 256, bf, caps).BV_dv == 32 and p(gate, 256, bf, HOPPER).BV_dv == 64
            got = asdict(p(gate, 128, f32, caps))                               # float32: CUDA-core tiles
            assert {k: got[k] for k in fma} == fma and got["path"] == "triton"
    for gate in (0, 1):                      # T4: CUDA-core tiles where q, k fit, else PyTorch
        got = asdict(p(gate, 128, f16, T4))
        # two stages for the forward march: one faulted when forced on the H200 (kernels/gla/NOTES.md)
        assert {k: got[k] for k in fma} == dict(fma, stages_f=2) and got["path"] == "triton"
        assert p(gate, 64, f32, T4).path == "triton"
        assert p(gate, 128, f32, T4).path == "torch" and p(gate, 256, f16, T4).path == "torch"
    assert p(2, 64, f16, T4).path == "torch"                                   # the vector gate
    assert all(p(g, K, dt, c).path == "triton" for g in (0, 1, 2) for K in (64, 256) for dt in (bf, f32)
               for c in (A100, L4, HOPPER))


def test_delta_plans_per_class():
    from dataclasses import asdict
    from kernels.delta.plan import plan_for
    bf, f32 = torch.bfloat16, torch.float32
    seq = ("fwd", "march", "bwd")
    for B, H, T in ((8, 16, 8192), (1, 2, 4096), (64, 4, 130)):
        for caps in (A100, L4):
            h, o = asdict(plan_for(bf, "cpu", B=B, T=T, H=H, K=128, V=128, caps=HOPPER)), \
                asdict(plan_for(bf, "cpu", B=B, T=T, H=H, K=128, V=128, caps=caps))
            assert {k for k in h if h[k] != o[k]} <= set(seq)          # only the pipelines differ
            for name in seq:                                            # capped at 2 stages, warps kept
                assert [(c["num_warps"], min(c["num_stages"], 2)) for c in h[name]] == \
                       [(c["num_warps"], c["num_stages"]) for c in o[name]]
            assert o["path"] == "triton" and o["grads"] == "triton"
            assert plan_for(f32, "cpu", B=B, T=T, H=H, K=128, V=128, caps=caps).grads == "torch"
            assert plan_for(f32, "cpu", B=B, T=T, H=H, K=64, V=128, caps=caps).grads == "triton"
        assert plan_for(f32, "cpu", B=B, T=T, H=H, K=128, V=128, caps=HOPPER).grads == "triton"   # Hopper: on OutOfResources
        assert plan_for(torch.float16, "cpu", B=B, T=T, H=H, K=32, V=32, caps=T4).path == "torch"


# --- the numbers the other classes' plans compute ------------------------------------------------
def _reference64(x, g, beta, scale, h0, fs):
    r = {n: t.detach().double().requires_grad_(True) for n, t in dict(x, h0=h0).items() if t is not None}
    o, ht = reference.recurrent_ref(r["q"], r["k"], r["v"], g and r[g], beta and r[beta], scale, r.get("h0"), fs)
    return o, ht, r


def _compare(fn, x, g, beta, *, tol=TOL32, seed=3):
    """Outputs, final state and every gradient of ``fn`` against the float64 recurrence."""
    keep = {n: x[n] for n in ("q", "k", "v") + tuple(n for n in (g, beta) if n)}
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in keep.items()}
    K, V = x["q"].shape[-1], x["v"].shape[-1]
    gen = torch.Generator().manual_seed(seed)
    h0 = torch.randn(x["q"].shape[0], x["q"].shape[2], K, V, generator=gen).to(DEVICE).requires_grad_(True)
    o, ht = fn(leaves, h0)
    ro, rht, r = _reference64(leaves, g, beta, K ** -0.5, h0, True)
    do = torch.randn(ro.shape, generator=gen, dtype=torch.float64).to(DEVICE)
    dht = torch.randn(rht.shape, generator=gen, dtype=torch.float64).to(DEVICE)
    ((o.double() * do).sum() + (ht.double() * dht).sum()).backward()
    ((ro * do).sum() + (rht * dht).sum()).backward()
    assert err_ratio(o, ro) <= tol and err_ratio(ht, rht) <= tol
    for n, t in dict(leaves, h0=h0).items():
        assert err_ratio(t.grad, r[n].grad) <= tol, n


@pytest.mark.parametrize("arch,gate,K", [(75, 0, 64), (75, 1, 64), (89, 2, 32)])
def test_gla_class_tiles_compute_the_recurrence(arch, gate, K):
    """A T4's CUDA-core tiles (float32 runs in Triton there up to K = 64; V-blocks 32 and 16, key
    blocks 32, a three-segment split) and an L4's float32 vector gate (prep in 32-column slices)."""
    from kernels.gla.op import chunk_gla_triton
    caps = GPU_CLASSES[arch]
    x = _qkv(torch.float32, T=150, K=K, V=K)
    g = {0: None, 1: "g", 2: "gv"}[gate]
    keep = dict(x)

    def run(leaves, h0):
        return chunk_gla_triton(leaves["q"], leaves["k"], leaves["v"], leaves.get(g) if g else None,
                                K ** -0.5, h0, True, num_segments=3 if gate < 2 else None, caps=caps)
    _compare(run, keep, g, None)


def test_t4_takes_the_pytorch_path_for_the_vector_gate_and_the_delta_rule(monkeypatch):
    """Where a T4's plan says ``path = "torch"`` the op returns the PyTorch implementation's result
    (no kernel launched: every kernel module's launcher would raise), differentiable."""
    from kernels.delta import op as dop
    from kernels.delta.op import delta_rule_triton
    from kernels.gla import op as gop
    from kernels.gla.op import chunk_gla_triton
    for mod in (gop, dop):
        monkeypatch.setattr(mod.ChunkGLAFunction if mod is gop else mod.ChunkDeltaFunction, "apply",
                            staticmethod(lambda *a: (_ for _ in ()).throw(AssertionError("kernel launched"))))
    x = {n: t.requires_grad_(True) for n, t in _qkv(torch.float16, T=100).items()}
    o, ht = chunk_gla_triton(x["q"], x["k"], x["v"], x["gv"], 0.2, None, True, caps=T4)
    ro, rht = reference.chunk_gla_ref(x["q"], x["k"], x["v"], x["gv"], 0.2, None, True)
    assert torch.equal(o, ro) and torch.equal(ht, rht) and o.dtype == torch.float16
    o, ht = delta_rule_triton(x["q"], x["k"], x["v"], x["g"], x["beta"], 0.2, None, True, caps=T4)
    ro, rht = reference.chunk_scalar_ref(x["q"], x["k"], x["v"], x["g"], x["beta"], 0.2, None, True)
    assert torch.equal(o, ro) and torch.equal(ht, rht)
    o.float().sum().backward()
    assert all(x[n].grad is not None for n in ("q", "k", "v", "g", "beta"))


def test_delta_gradients_by_pytorch_when_the_plan_says_so(monkeypatch):
    """``grads = "torch"`` (an A100 or L4 at float32, K = 128: the WY backward does not fit) takes
    the batched-PyTorch per-chunk gradients without trying the kernels; same gradients (float32)."""
    from kernels.delta import op
    from kernels.delta.op import delta_rule_triton
    x = _qkv(torch.float32, T=100)

    def run(leaves, h0):
        return delta_rule_triton(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], 32 ** -0.5,
                                 h0, True, plan={"grads": "torch"}, caps=L4)
    monkeypatch.setattr(op, "chunk_grads", lambda *a, **kw: (_ for _ in ()).throw(AssertionError("kernels tried")))
    _compare(run, x, "g", "beta", tol=2e-4)    # the delta rule's float32 bound (tests/kernels/test_delta.py)
