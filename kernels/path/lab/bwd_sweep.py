"""Lab: where the two backward passes' time goes, and which launches fit them (issue 41, PaTH).

At B = 32, T = 2048 and B = 1, T = 32768 (bfloat16, H = 16, K = V = 128, w and β in float32):

Written against the walk at commit 26165b7 (before windows and the two-kernel per-block backward):
its variants no longer match today's source. It measured:

- the per-block backward (``local.local_backward``) under warps × key-column blocks (the plan's
  ``local_bwd`` launch and ``local_kb``; the run of record, ``logs/bwd_sweep_h200.json``, swept
  ``local``, which launched the per-block backward until the plan gave it its own field);
- the main backward pass (``backward._path_bwd_kernel``) as is, on 4 warps, and in variants built
  from its source at run time (``atomics_cost.variant``): ``no sums`` (the per-pair float32 tiles
  ``dK̂, dV, W M, U Mᵀ`` not written at all: a masked store that never fires, the products kept),
  ``no sums, no scratch`` (also the scratch of X and dS not written: the products and tile loads alone).
  Wrong gradients in the variants; time only.

    python kernels/path/lab/bwd_sweep.py [out.json]
"""
import dataclasses
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from atomics_cost import ms, save, stage_inputs, variant  # noqa: E402

import kernels.path.backward as product  # noqa: E402
from kernels.backend import Launch  # noqa: E402
from kernels.path.local import local_backward  # noqa: E402

SHAPES = [(32, 2048), (1, 32768)]
H, D = 16, 128
ADD = 'tl.atomic_add(base + r[:, None] * D + tl.arange(0, D)[None, :], x, sem="relaxed")'
NEVER = "tl.store(base + r[:, None] * D + tl.arange(0, D)[None, :], x, mask=(r < 0)[:, None])"
MPUT = ('@triton.jit\ndef _probs(', '@triton.jit\ndef _mput_tile(base, row0, x, R: tl.constexpr, D: tl.constexpr):\n'
        '    r = row0 + tl.arange(0, R)\n'
        '    tl.store(base + r[:, None] * D + tl.arange(0, D)[None, :], x.to(base.dtype.element_ty), '
        'mask=(r < 0)[:, None])\n\n\n@triton.jit\ndef _probs(')
VARIANTS = {
    "no sums": variant("nosums", [(ADD, NEVER)]),
    "no sums, no scratch": variant("noscratch", [(ADD, NEVER), MPUT, ("_put_tile(xs_base", "_mput_tile(xs_base"),
                                                 ("_put_tile(dzs_base", "_mput_tile(dzs_base")]),
}


def main(out=None):
    rows = []
    for B, T in SHAPES:
        x = stage_inputs(B, T)
        q, k, v, w, beta, plan, scale = (x[n] for n in ("q", "k", "v", "w", "beta", "plan", "scale"))
        qt, kh, u, wt, aloc, tm, o, lse, do = (x[n] for n in ("qt", "kh", "u", "wt", "aloc", "tm", "o", "lse", "do"))
        dqt, dkh, gw, hu, daloc, dv, dG = product.path_backward(qt, kh, u, wt, aloc, v, do, o, lse, None, scale, plan)
        ref = local_backward(q, k, w, beta, tm, dqt, dkh, gw, hu, daloc, plan, torch.float32)
        rec = dict(B=B, T=T, H=H, D=D, plan_local_bwd=str(plan.local_bwd[0]), plan_bwd=str(plan.bwd[0]))
        for warps in (4, 8, 16):
            for kb in (32, 64):
                p2 = dataclasses.replace(plan, local_bwd=(Launch(warps, 1),), local_kb=kb)
                name = f"local_ms[w{warps} kb{kb}]"
                run = lambda: local_backward(q, k, w, beta, tm, dqt, dkh, gw, hu, daloc, p2,  # noqa: E731
                                             torch.float32)
                try:
                    got = run()
                    same = max(float((a.float() - b.float()).abs().max() / b.float().abs().max())
                               for a, b in zip(got, ref))
                    rec[name] = ms(run)
                    rec[name.replace("_ms", "_maxdiff")] = round(same, 6)
                except Exception as e:  # noqa: BLE001 - a launch that does not fit: recorded
                    rec[name] = f"{type(e).__name__}: {str(e)[:80]}"
                print(name, rec[name], flush=True)
        bwd = lambda mod, p: mod.path_backward(qt, kh, u, wt, aloc, v, do, o, lse, None, scale, p)  # noqa: E731
        rec["backward_ms[as is]"] = ms(lambda: bwd(product, plan))
        p4 = dataclasses.replace(plan, bwd=(Launch(4, 1),))
        try:
            rec["backward_ms[4 warps]"] = ms(lambda: bwd(product, p4))
        except Exception as e:  # noqa: BLE001
            rec["backward_ms[4 warps]"] = f"{type(e).__name__}: {str(e)[:80]}"
        for name, mod in VARIANTS.items():
            rec[f"backward_ms[{name}]"] = ms(lambda: bwd(mod, plan))
        print(json.dumps(rec), flush=True)
        rows.append(rec)
        del x
        torch.cuda.empty_cache()
    return save(out, rows, torch.cuda.get_device_name())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
