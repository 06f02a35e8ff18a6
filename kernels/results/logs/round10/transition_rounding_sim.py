"""Round 10 (NOTES_delta.md): float64 simulation of the bf16 roundings of the transition form against
the W/U form, one head, K = V = 128, chunks of 64, inputs as in bench_delta. Usage:
    python transition_rounding_sim.py T [g|n] [beta_max]
Prints the RMS ratio of o and of the final state against the unrounded recurrence for both forms."""
import torch, torch.nn.functional as F, sys
torch.manual_seed(0)
T, K, V, C = int(sys.argv[1]) if len(sys.argv) > 1 else 8192, 128, 128, 64
gated = len(sys.argv) > 2 and sys.argv[2] == "g"
bmax = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
dd = torch.float64
q = torch.randn(T, K, dtype=dd); k = F.normalize(torch.randn(T, K, dtype=dd), dim=-1); v = torch.randn(T, V, dtype=dd)
beta = bmax * torch.sigmoid(torch.randn(T, dtype=dd))
g = F.logsigmoid(torch.randn(T, dtype=dd)) if gated else torch.zeros(T, dtype=dd)
q, k, v = (x.to(torch.bfloat16).to(dd) for x in (q, k, v))
scale = K ** -0.5
r = lambda x: x.to(torch.bfloat16).to(dd)
def run(form, rd):
    S = torch.zeros(K, V, dtype=dd); out = []
    for n in range(T // C):
        sl = slice(n * C, (n + 1) * C)
        Q, Kc, Vc, be, b = q[sl], k[sl], v[sl], beta[sl], g[sl].cumsum(0)
        G = (b[:, None] - b[None, :]); mask = torch.tril(torch.ones(C, C, dtype=torch.bool), -1)
        A = torch.where(mask, be[:, None] * (Kc @ Kc.T) * G.exp(), torch.zeros((), dtype=dd))
        Tm = rd(torch.linalg.inv(torch.eye(C, dtype=dd) + A))
        P = rd(torch.where(torch.tril(torch.ones(C, C, dtype=torch.bool)), scale * (Q @ Kc.T) * G.exp(), torch.zeros((), dtype=dd)))
        W = rd(Tm @ rd((be * b.exp())[:, None] * Kc)); U = rd(Tm @ rd(be[:, None] * Vc))
        Kt = (b[-1] - b).exp()[:, None] * Kc
        if form == "wu":
            vp = U - W @ rd(S)
            out.append((b.exp() * scale)[:, None] * (Q @ rd(S)) + P @ rd(vp))
            S = b[-1].exp() * S + rd(Kt).T @ rd(vp)
        else:
            M = rd(Kt.T @ W); Qh = rd((b.exp() * scale)[:, None] * Q - P @ W); Ut = rd((b[-1] - b).exp()[:, None] * U)
            Oi = rd(P @ U)
            Sb = rd(S)
            out.append(Qh @ Sb + Oi)
            S = b[-1].exp() * S - M @ Sb + Kc.T @ Ut
    return torch.cat(out), S
ident = lambda x: x
o0, S0 = run("wu", ident)
for f in ("wu", "a"):
    o, S = run(f, r)
    rms = lambda a, b: ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()
    print(f, "o", rms(r(o), o0), "S", rms(S, S0))
o1, _ = run("a", ident); print("exact a vs wu", ((o1-o0).abs().max()).item())
