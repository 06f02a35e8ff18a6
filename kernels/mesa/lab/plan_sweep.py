"""Lab: time the solve's launch options, the plan's only free choices (``warps_cg``, ``stages_cg``).

    python -m kernels.mesa.lab.plan_sweep [--write] [--shape B T] [--rounds 3]

``plan.py``'s defaults (8 warps at K = 128, one stage) were chosen by the compile check (fewest
spills), not by time. This sweep times them: the benchmark's inputs (``kernels.mesa.bench``, op
``mesa``, bf16, H = 16, K = V = 128, float32 gates and ``lamb``) at B = 32, T = 2048, 30 CG steps,
the whole op forward and forward + backward under every option, interleaved over three rounds
(medians). The CG loop loads nothing (its operands stay in registers), so stages should not matter;
the sweep checks that too. Every option's output is compared with the default's (they run the same
arithmetic in the same order per row, so they should agree to the last bit). ``--write`` keeps the
table in ``lab/logs/plan_sweep.json``.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

OPTIONS = [dict(warps_cg=w, stages_cg=s) for w in (4, 8, 16) for s in (1, 2)]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    import torch
    from kernels.harness import bench_ms
    from kernels.results import environment
    from kernels.mesa import bench
    from kernels.mesa.op import chunk_mesa_net_triton
    B, T = (int(argv[argv.index("--shape") + i]) for i in (1, 2)) if "--shape" in argv else (32, 2048)
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 3
    case = dict(op="mesa", B=B, T=T, cg=30)
    inp = bench.make_inputs(case)
    inp["lamb"] = inp["lamb"][0, 0]           # the benchmark keeps it [1, 1, H, K] for its slicing
    names = ("q", "k", "v", "g", "beta", "lamb")
    leaves = {n: inp[n].detach().clone().requires_grad_() for n in names}
    do = torch.randn_like(inp["v"])

    def fwd(opt):
        with torch.no_grad():
            return chunk_mesa_net_triton(*(inp[n] for n in names), 30, plan=opt)[0]

    def fwdbwd(opt):
        o = chunk_mesa_net_triton(*(leaves[n] for n in names), 30, plan=opt)[0]
        return torch.autograd.grad(o, list(leaves.values()), do)

    ref = fwd({})
    rows, times, t0 = [], {}, time.time()
    for opt in OPTIONS:
        try:
            same = bool(torch.equal(fwd(opt), ref))
            fwdbwd(opt)
            rows.append(dict(opt, same_output=same, note=None))
        except Exception as e:  # noqa: BLE001 - recorded (e.g. out of resources)
            rows.append(dict(opt, same_output=None, note=f"{type(e).__name__}: {str(e)[:160]}"))
    for _ in range(rounds):
        for row in rows:
            if row["note"]:
                continue
            opt = {k: row[k] for k in ("warps_cg", "stages_cg")}
            key = (row["warps_cg"], row["stages_cg"])
            times.setdefault(key, {"fwd": [], "fwdbwd": []})
            times[key]["fwd"].append(bench_ms(lambda: fwd(opt)))
            times[key]["fwdbwd"].append(bench_ms(lambda: fwdbwd(opt)))
    for row in rows:
        t = times.get((row["warps_cg"], row["stages_cg"]))
        if t:
            for p in ("fwd", "fwdbwd"):
                row[f"{p}_ms"] = statistics.median(t[p])
                row[f"{p}_all"] = t[p]
        print(f"warps {row['warps_cg']:2d} stages {row['stages_cg']}: "
              + (f"fwd {row['fwd_ms']:.3f} ms  fwdbwd {row['fwdbwd_ms']:.3f} ms  same output {row['same_output']}"
                 if t else row["note"]), flush=True)
    print(f"{time.time() - t0:.0f} s")
    if "--write" in argv:
        path = Path(__file__).parent / "logs" / "plan_sweep.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps({"env": environment(), "case": case, "rows": rows}, indent=1) + "\n")
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
