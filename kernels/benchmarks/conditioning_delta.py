"""How well-conditioned inputs must be for a bf16 delta rule: output and final-state error of our
inference forward (T form and W/U form, both solves) and of fla's, against the float64 chunkwise
reference, at K = V = 128, T = 2049, for keys clustered around one direction (``base + 0.3·noise``,
normalised) with β = 2 (every step a reflection) and β = 1, and for one repeated key with β = 2.

    python -m kernels.benchmarks.conditioning_delta      (a CUDA GPU; fla optional)

Writes ``$OUT/conditioning_delta.json`` (or the working folder). Used to set the bound of
``tests/test_kernel_delta.py::test_gpu_inference_forms`` (kernels/NOTES_delta.md, round 5): with
reflections the bf16 error of every implementation, fla's included, is ≈ 0.03 instead of ≈ 0.004.
"""
from __future__ import annotations

import json
import os


def main():
    os.environ["FLA_DISABLE_BACKEND_DISPATCH"] = "1"
    import torch
    import torch.nn.functional as F
    import kernels
    from kernels import reference, triton_delta as td
    from kernels.benchmarks.harness import environment, err_ratio
    if not torch.cuda.is_available():
        print("conditioning_delta needs a CUDA GPU")
        return 2
    out = {"env": environment(), "cases": {}}
    T, K, V = 2049, 128, 128
    for B, H in ((4, 64), (1, 4)):
        for spread, beta_v in ((0.3, 2.0), (0.3, 1.0), (1e9, 2.0)):
            gen = torch.Generator().manual_seed(5)
            base = torch.randn(1, 1, H, K, generator=gen, dtype=torch.float64)
            noise = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)
            k = F.normalize(base + spread * noise, dim=-1)
            q = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)
            v = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64)
            beta = torch.full((B, T, H), beta_v, dtype=torch.float64)
            h0 = torch.randn(B, H, K, V, generator=gen, dtype=torch.float64).cuda()
            x = [t.cuda().bfloat16() for t in (q, k, v, beta)]
            r = [t.double() for t in x]
            ro, rht = reference.chunk_scalar_ref(r[0], r[1], r[2], None, r[3], K ** -0.5, h0, True)
            res = {}
            with torch.no_grad():
                for name, kw in (("tform", {}), ("wu", dict(tform=2)), ("tform_tsolve", dict(tsolve=1)),
                                 ("solve_ieee", dict(kkt_oprec=1)), ("solve_tf32", dict(kkt_oprec=3))):
                    with td.tuning(**kw):
                        o, ht = kernels.chunk_delta_rule(*x, initial_state=h0.float(), output_final_state=True,
                                                         backend="triton")
                    res[name] = {"o": err_ratio(o, ro), "ht": err_ratio(ht, rht)}
                try:
                    from fla.ops.delta_rule import chunk_delta_rule
                    o, ht = chunk_delta_rule(*x, scale=K ** -0.5, initial_state=h0.float(), output_final_state=True)
                    res["fla"] = {"o": err_ratio(o, ro), "ht": err_ratio(ht, rht)}
                except Exception as e:   # fla not installed: ours only
                    res["fla"] = f"{type(e).__name__}: {str(e)[:120]}"
            key = f"B{B}_H{H}_" + ("one_key" if spread > 1e6 else f"spread{spread}") + f"_beta{beta_v}"
            out["cases"][key] = res
            print(key, res, flush=True)
    path = os.path.join(os.environ.get("OUT", "."), "conditioning_delta.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
