"""Lab: what the backward's float32 atomics cost (issue 41's "measure first" for PaTH).

Times each stage of ``parallel_path_attn`` at the benchmark's shapes (bfloat16, H = 16, K = V = 128,
w and β in float32, no gate), and the main backward pass (``backward._path_bwd_kernel``) in three
variants built from its own source at run time (nothing here is a second copy kept in the repository):

- ``as is``: the product;
- ``stores``: every ``tl.atomic_add`` made a plain ``tl.store`` (wrong sums, same products, same
  bytes written once per pair: the atomics' serialisation and read-modify-write removed);
- ``no M``: only the up sweep's two ``M`` tiles (``W_l M_l``, ``U_l M_lᵀ``) made plain stores.

The gap between ``as is`` and ``stores`` bounds what a design without the per-pair atomics could
save in this pass; the products and the scratch round trip stay. Also printed: the pass's products
(12 of ``128 × 64 × 128`` per pair of a 128-row query block and a 64-token key block) as a rate.

    python kernels/path/lab/atomics_cost.py [out.json]
"""
import importlib.util
import inspect
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton

import kernels.path.backward as product
from kernels.harness import measure_device
from kernels.path.forward import path_forward
from kernels.path.local import local_backward, prepare_blocks
from kernels.path.plan import plan_for

SHAPES = [(32, 2048), (8, 8192), (1, 32768)]
H, D = 16, 128


def variant(name, edits):
    """``kernels.path.backward`` with ``edits`` (old, new) applied to its source, imported from a
    temporary file (relative imports made absolute)."""
    src = inspect.getsource(product).replace("from ..", "from kernels.").replace("from .", "from kernels.path.")
    for old, new in edits:
        assert old in src, old
        src = src.replace(old, new)
    path = Path(tempfile.mkdtemp()) / f"path_bwd_{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"path_bwd_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


STORE = [("tl.atomic_add(", "tl.store("), (', sem="relaxed")', ")")]
VARIANTS = {
    "as is": product,
    "stores": variant("stores", STORE),
    "no M": variant("noM", [("_add_tile(gw_ptr", "_put_tile(gw_ptr"), ("_add_tile(hu_ptr", "_put_tile(hu_ptr")]),
}


def ms(f):
    return round(triton.testing.do_bench(f, warmup=5, rep=30), 3)


def stage_inputs(B, T):
    """The benchmark's inputs at ``(B, T)`` (seeded by the shape), prepared and run forward as
    ``op.py`` does; ``do`` a random output gradient. A dict of every tensor a stage reads."""
    g = torch.Generator(device="cuda").manual_seed(B * 100000 + T)
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    w = torch.nn.functional.normalize(torch.randn(B, T, H, D, device="cuda", generator=g), dim=-1)
    beta = 2 * torch.sigmoid(torch.randn(B, T, H, device="cuda", generator=g))
    plan = plan_for(q.dtype, q.device)
    scale = D ** -0.5
    w = w.to(plan.transport)            # as op.py passes it to every stage
    qt, kh, u, wt, aloc, tm = prepare_blocks(q, k, w, beta, plan)
    o, lse = path_forward(qt, kh, u, wt, aloc, v, None, scale, plan)
    return dict(q=q, k=k, v=v, w=w, beta=beta, plan=plan, scale=scale, qt=qt, kh=kh, u=u, wt=wt, aloc=aloc,
                tm=tm, o=o, lse=lse, do=torch.randn_like(o))


def save(out, rows, device):
    """The run's record (device, versions, date, rows), written to ``out`` when given."""
    res = dict(device=device, torch=torch.__version__, triton=triton.__version__,
               date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), rows=rows)
    if out:
        Path(out).write_text(json.dumps(res, indent=1))
    return res


def main(out=None):
    dev = measure_device()
    rows = []
    for B, T in SHAPES:
        t0 = time.perf_counter()
        x = stage_inputs(B, T)
        q, k, v, w, beta, plan, scale = (x[n] for n in ("q", "k", "v", "w", "beta", "plan", "scale"))
        qt, kh, u, wt, aloc, tm, o, lse, do = (x[n] for n in ("qt", "kh", "u", "wt", "aloc", "tm", "o", "lse", "do"))
        rec = dict(B=B, T=T, H=H, D=D)
        rec["prepare_ms"] = ms(lambda: prepare_blocks(q, k, w, beta, plan))
        rec["forward_ms"] = ms(lambda: path_forward(qt, kh, u, wt, aloc, v, None, scale, plan))
        grads = product.path_backward(qt, kh, u, wt, aloc, v, do, o, lse, None, scale, plan)
        dqt, dkh, gw, hu, daloc, dv, dG = grads
        rec["local_backward_ms"] = ms(lambda: local_backward(q, k, w, beta, tm, dqt, dkh, gw, hu, daloc, plan,
                                                             torch.float32))
        for name, mod in VARIANTS.items():
            rec[f"backward_ms[{name}]"] = ms(lambda: mod.path_backward(qt, kh, u, wt, aloc, v, do, o, lse, None,
                                                                       scale, plan))
        nq = triton.cdiv(T, 128)
        pairs = B * H * sum(2 * i for i in range(nq))   # (128-row query block, 64-key block before it)
        rec["pairs"] = pairs
        rec["atomic_adds"] = pairs * 64 * (3 * D + D)       # dK̂, W M, U Mᵀ (K) and dV (V) per pair
        rec["products_tflop"] = round(pairs * 12 * 2 * 128 * 64 * 128 / 1e12, 3)
        rec["products_rate_tflops"] = round(rec["products_tflop"] / rec["backward_ms[as is]"] * 1e3, 1)
        rec["wall_s"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(rec), flush=True)
        rows.append(rec)
        del x, q, k, v, w, beta, qt, kh, u, wt, aloc, tm, o, lse, do, grads
        torch.cuda.empty_cache()
    return save(out, rows, dev)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
