"""What the short convolution costs inside a DeltaNet layer (the question that matters: Chapter 11).

    python -m kernels.conv.bench_layer [--B 8] [--T 4096] [--hidden 2048] [--heads 16] [--reps 1]
                                       [--graph] [--write]

One DeltaNet layer as fla builds it, in bfloat16: ``q, k, v = x W_q, x W_k, x W_v`` (``hidden ->
heads · 128``), ``beta = sigmoid(x W_b)``, a short convolution with SiLU on each of q, k, v
(``causal_conv1d``, W = 4, no bias), L2-normalised q and k, ``kernels.chunk_delta_rule``, and the
output projection. Variants, each timed forward and forward + backward (gradients for ``x`` and every
weight), CUDA events through ``kernels.harness.bench_ms``:

- ``conv``: the short convolutions by our kernel (``kernels.conv.causal_conv1d``);
- ``conv-fla``: by fla's Triton ``causal_conv1d`` (when fla is importable);
- ``silu``: no convolution, SiLU alone on q, k, v (fla's layer with ``use_short_conv=False``);
- ``bare``: no convolution and no activation.

``bare`` is a lower bound for any variant that folds the convolution into the kernel that reads
``k`` (a folded kernel still does everything ``bare`` does, and the convolution's arithmetic on top),
so ``(conv − bare) / conv`` bounds from above what folding could save, and answers whether the conv
costs more than a few percent of the layer. ``--reps N`` times the variants interleaved, ``N`` rounds,
and keeps each variant's median (and every round's time); ``--graph`` replays each step from a CUDA
graph, so that host-side gaps between launches do not reach the timing (:func:`floor_check` found
the forward + backward of one eager run below what the convolutions' bytes need). It prints its
table, and with ``--write`` keeps it in
``kernels/conv/layer.json`` (device, date, versions), which ``NOTES.md`` and Chapter 11 read
(:func:`load`, :func:`table`).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def build(hidden, heads, head_dim, width, device, dtype, seed=0):
    import torch
    gen = torch.Generator(device=device).manual_seed(seed)
    D = heads * head_dim

    def lin(i, o):
        return (torch.randn(i, o, device=device, generator=gen) * i ** -0.5).to(dtype).requires_grad_()
    p = {"wq": lin(hidden, D), "wk": lin(hidden, D), "wv": lin(hidden, D), "wb": lin(hidden, heads),
         "wo": lin(D, hidden)}
    for n in "qkv":
        p["c" + n] = ((torch.rand(D, width, device=device, generator=gen) * 2 - 1) * width ** -0.5).to(dtype) \
            .requires_grad_()
    return p


def layer(x, p, variant, heads, head_dim, conv=None):
    """The layer's output ``[B, T, hidden]``; ``conv(x, weight) -> y`` is the short convolution + SiLU."""
    import torch.nn.functional as F
    import kernels
    B, T, _ = x.shape
    q, k, v = x @ p["wq"], x @ p["wk"], x @ p["wv"]
    if variant.startswith("conv"):
        q, k, v = conv(q, p["cq"]), conv(k, p["ck"]), conv(v, p["cv"])
    elif variant == "silu":
        q, k, v = F.silu(q), F.silu(k), F.silu(v)
    q, k, v = (t.view(B, T, heads, head_dim) for t in (q, k, v))
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    beta = (x @ p["wb"]).sigmoid()
    # check_values=False: fla checks no values (our value checks cost a host sync), so the times compare like for like
    o, _ = kernels.chunk_delta_rule(q, k, v, beta, check_values=False)
    return o.reshape(B, T, heads * head_dim) @ p["wo"]


def convs():
    from kernels.conv import causal_conv1d
    # check_values=False: fla checks no values (our value checks cost a host sync), so the times compare like for like
    out = {"conv": lambda x, w: causal_conv1d(x, w, activation="silu", check_values=False)[0]}
    try:
        from fla.modules.causal_conv1d import causal_conv1d as fla_conv
        out["conv-fla"] = lambda x, w: fla_conv(x, w, activation="silu", backend="triton")[0]
    except Exception as e:  # noqa: BLE001 - reported
        print(f"conv-fla: not run ({type(e).__name__}: {e})")
    return out


PATH = Path(__file__).resolve().parent / "layer.json"
NAMES = {"conv": "our causal_conv1d", "conv-fla": "fla's causal_conv1d", "silu": "SiLU alone, no conv",
         "bare": "neither"}


def load(path=PATH) -> dict:
    """The stored run: ``{"env", "args", "rows": [{variant, fwd_ms, fwdbwd_ms, share_fwd,
    share_fwdbwd}]}``; ``FileNotFoundError`` naming the command that writes it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no {path.name}: run `python -m kernels.conv.bench_layer --write` on a GPU")
    return json.loads(path.read_text())


def table(data: dict) -> str:
    """The stored run as a text table: per variant its times and its share over ``bare``."""
    a = data["args"]
    lines = [f"DeltaNet layer, B={a['B']} T={a['T']} hidden={a['hidden']} heads={a['heads']}x{a['head_dim']} "
             f"W={a['width']} bf16",
             ("replayed from CUDA graphs" if a.get("graph") else "as launched")
             + (f", medians of {a['reps']} interleaved rounds" if a.get("reps", 1) > 1 else ""),
             f"{'variant':22s} {'fwd ms':>7s} {'fwd+bwd':>8s} {'share':>6s} {'share':>8s}",
             f"{'':22s} {'':>7s} {'ms':>8s} {'fwd':>6s} {'fwd+bwd':>8s}"]
    for r in data["rows"]:
        lines.append(f"{NAMES.get(r['variant'], r['variant']):22s} {r['fwd_ms']:7.3f} {r['fwdbwd_ms']:8.3f} "
                     f"{100 * r['share_fwd']:5.1f}% {100 * r['share_fwdbwd']:7.1f}%")
    return "\n".join(lines)


def copy_bandwidth(results=None) -> float:
    """The device-to-device copy's bandwidth (GB/s) in the conv benchmark of record: the median over
    its ``copy`` records (measured in the same run as the kernels)."""
    import statistics
    from kernels.results import load_results
    data = load_results("conv") if results is None else results
    return statistics.median(r["gbps"] for r in data["records"] if r["impl"] == "copy")


def byte_floor(data: dict, gbps: float) -> dict:
    """The least time (ms) the layer's three convolutions (q, k, v, each ``B·T × heads·head_dim``)
    can add over ``bare`` at ``gbps``: each reads its input and writes its output in the forward
    (``2·N·s`` bytes, ``s`` = 2 for bf16) and reads ``x`` and ``dy`` and writes ``dx`` in the backward
    (``3·N·s`` more). The SiLU is fused, so it adds no bytes."""
    a = data["args"]
    n_bytes = a["B"] * a["T"] * a["heads"] * a["head_dim"] * 2
    return {"fwd": 3 * 2 * n_bytes / gbps / 1e6, "fwdbwd": 3 * 5 * n_bytes / gbps / 1e6}


def floor_check(data: dict, gbps: float) -> list:
    """Per convolution variant and pass: ``{variant, pass, extra_ms, floor_ms, below}``, where
    ``extra_ms`` is the variant's time over ``bare`` and ``below`` says it is less than
    :func:`byte_floor` allows (a timing that cannot be the convolutions' whole cost)."""
    floor = byte_floor(data, gbps)
    bare = next(r for r in data["rows"] if r["variant"] == "bare")
    out = []
    for r in data["rows"]:
        if r["variant"] not in ("conv", "conv-fla"):
            continue
        for pass_ in ("fwd", "fwdbwd"):
            extra = r[f"{pass_}_ms"] - bare[f"{pass_}_ms"]
            out.append(dict(variant=r["variant"], pass_=pass_, extra_ms=extra, floor_ms=floor[pass_],
                            below=extra < floor[pass_]))
    return out


def graphed(fn):
    """``fn`` captured once as a CUDA graph (after warm-up on a side stream, as capture requires);
    returns ``(replay, out)``: a callable that replays it and the captured call's output, which
    every replay overwrites in place (the step allocates from the graph's pool)."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kernels.conv.bench_layer", description=__doc__.split("\n\n")[0])
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--reps", type=int, default=1, help="rounds of the variants, interleaved")
    ap.add_argument("--graph", action="store_true", help="time each step replayed from a CUDA graph")
    ap.add_argument("--write", action="store_true", help=f"keep the table in {PATH}")
    args = ap.parse_args(argv)
    if args.reps < 1:
        raise ValueError(f"--reps must be at least 1; got {args.reps}")
    from kernels.harness import pure_triton_fla
    pure_triton_fla()      # before fla is imported
    import statistics
    import torch
    if not torch.cuda.is_available():
        print("this lab needs a CUDA GPU")
        return 2
    from kernels.harness import bench_ms
    from kernels.results import environment
    dt = torch.bfloat16
    p = build(args.hidden, args.heads, args.head_dim, args.width, "cuda", dt)
    x = torch.randn(args.B, args.T, args.hidden, device="cuda", dtype=dt, requires_grad=True)
    do = torch.randn(args.B, args.T, args.hidden, device="cuda", dtype=dt)
    variants = dict(convs(), silu=None, bare=None)
    steps = {}
    for name, conv in variants.items():
        def fwd(name=name, conv=conv):
            with torch.no_grad():
                return layer(x, p, name, args.heads, args.head_dim, conv)

        def step(name=name, conv=conv):
            o = layer(x, p, name, args.heads, args.head_dim, conv)
            return torch.autograd.grad(o, [x] + list(p.values()), do, allow_unused=True)
        steps[name] = (graphed(fwd)[0], graphed(step)[0]) if args.graph else (fwd, step)
    times = {name: {"fwd": [], "fwdbwd": []} for name in steps}
    for _ in range(args.reps):
        for name, (fwd, step) in steps.items():
            times[name]["fwd"].append(bench_ms(fwd))
            times[name]["fwdbwd"].append(bench_ms(step))
    rows = [{"variant": name, "fwd_ms": statistics.median(t["fwd"]), "fwdbwd_ms": statistics.median(t["fwdbwd"]),
             "fwd_ms_all": t["fwd"], "fwdbwd_ms_all": t["fwdbwd"]} for name, t in times.items()]
    bare = next(r for r in rows if r["variant"] == "bare")
    print(f"B={args.B} T={args.T} hidden={args.hidden} heads={args.heads}x{args.head_dim} W={args.width} bf16"
          f"{', CUDA graphs' if args.graph else ''}; medians of {args.reps} interleaved round(s)")
    print(f"{'variant':10s} {'fwd ms':>9s} {'fwd+bwd ms':>11s}  share over bare (fwd, fwd+bwd)")
    for r in rows:
        r["share_fwd"] = (r["fwd_ms"] - bare["fwd_ms"]) / r["fwd_ms"]
        r["share_fwdbwd"] = (r["fwdbwd_ms"] - bare["fwdbwd_ms"]) / r["fwdbwd_ms"]
        print(f"{r['variant']:10s} {r['fwd_ms']:9.3f} {r['fwdbwd_ms']:11.3f}  "
              f"{100 * r['share_fwd']:5.1f}%  {100 * r['share_fwdbwd']:5.1f}%")
    if args.write:
        PATH.write_text(json.dumps({"env": environment(), "args": vars(args), "rows": rows}, indent=1) + "\n")
        print("wrote", PATH)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
