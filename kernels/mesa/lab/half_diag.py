"""Lab (diagnosis): which gradient goes wrong with 16-bit inputs on the GPU, and in which stage."""
import torch
import tests.kernels.test_mesa as tm
from kernels.mesa.plan import plan_for
from kernels.mesa.states import h_states, h_states_again

bf = torch.bfloat16
DEV = "cuda" if torch.cuda.is_available() else "cpu"
cases = {  # name: (B, T, H, K, V, dtype, states, final)
    "f32": (1, 100, 2, 32, 64, torch.float32, True, True),
    "failing": (1, 100, 2, 32, 64, bf, True, True),
    "no_final": (1, 100, 2, 32, 64, bf, True, False),
    "no_states": (1, 100, 2, 32, 64, bf, False, False),
    "K64": (1, 100, 2, 64, 64, bf, True, True),
    "T128": (1, 128, 2, 32, 64, bf, True, True),
    "V32": (1, 100, 2, 32, 32, bf, True, True),
    "T64": (1, 64, 2, 32, 64, bf, True, True),
    "fp16": (1, 100, 2, 32, 64, torch.float16, True, True),
}
for name, (B, T, H, K, V, dt, st, fin) in cases.items():
    inputs = tm.make_inputs(B, T, H, K, V, dt, DEV, states=st, gate_dtype=torch.float32, seed=7)
    outs, grads = tm.run(tm.ours(30, fin), inputs, final=fin)
    outs64, grads64 = tm.run(tm.exact(fin), tm.as64(inputs), final=fin, like=outs)
    e = {n: round(tm.err_ratio(grads[n].cpu(), grads64[n].cpu()), 4) for n in grads64}
    eo = [round(tm.err_ratio(a.cpu(), b.cpu()), 4) for a, b in zip(outs, outs64) if b is not None]
    bad_rows = ""
    if "dq" in grads and e["dq"] > 0.01:
        d = (grads["dq"].double().cpu() - grads64["dq"].cpu()).norm(dim=-1)[0]   # [T, H]
        r = d / grads64["dq"].cpu().norm(dim=-1)[0].clamp_min(1e-9)
        bad = (r > 0.05).nonzero()
        bad_rows = f" dq bad (t, h): first {bad[:3].tolist()} count {len(bad)} of {r.numel()}"
    print(name, "outs", eo, "grads", e, bad_rows, flush=True)

# the failing case's stages
B, T, H, K, V, dt, st, fin = cases["failing"]
q, k, v, g, beta, lamb, hkk, hkv = tm.make_inputs(B, T, H, K, V, dt, DEV, states=True, seed=7)
plan = plan_for(q.dtype, q.device, B=B, T=T, H=H, K=K)
od = plan.operand
kk = k.to(od).contiguous()
kb = (beta.unsqueeze(-1).float() * k.float()).to(od).contiguous()
hs, inits, ht = h_states(kb, kk, g.contiguous(), hkk.float().contiguous(), plan.states, True)
hs2 = h_states_again(kb, kk, g.contiguous(), inits, plan.states)
print("plan", plan.states.NS, plan.states.NT, "hs vs hs_again max diff", (hs - hs2).abs().max().item(),
      "scale", hs.abs().max().item())
# the chunk states against a float64 march
Hs = hkk.double().clone()
kb64, k64, g64 = kb.double(), kk.double(), g.double()
ref = []
for t in range(T):
    if t % 64 == 0:
        ref.append(Hs.clone())
    Hs = torch.exp(g64[:, t])[..., None, None] * Hs + kb64[:, t, :, :, None] * k64[:, t, :, None, :]
ref = torch.stack(ref, 2).reshape(B * H, -1, K, K)
print("hs vs float64 march", (hs.double() - ref).abs().max().item(), "again", (hs2.double() - ref).abs().max().item())
