#!/usr/bin/env bash
# Run the GPU tests and the benchmarks of record of the book's kernels on a CUDA machine.
# Usage: bash kernels/run_gpu.sh [tests|bench|all] [families...]      (families: flash gla delta deltaformer path mesa conv)
#   With fla-core wheels in .whl/ (pip download --no-deps -d .whl fla-core==0.6.0 einops), they are
#   installed into /tmp/site first so the benchmarks time fla's pure-Triton kernels side by side.
#   Results go to kernels/<family>/results.json; logs and copies to $OUT when it is set.
#   Autotuning results (fla's) are cached on disk, so a second run on the same machine skips them.
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}; shift || true
families=${*:-"flash gla delta deltaformer path mesa conv"}
out=${OUT:-/tmp/gpu_out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 FLA_DISABLE_BACKEND_DISPATCH=1 TRITON_CACHE_AUTOTUNING=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
python3 -c "import fla; print('fla', fla.__version__)" 2>&1 | tail -1
rc=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  tests=""
  for f in $families; do tests="$tests tests/kernels/test_$f.py"; done
  python3 -m pytest -q $tests -p no:cacheprovider --durations=10 ${PYTEST_XDIST:-} 2>&1 | tee "$out/gpu_tests.log" | tail -25
  rc=${PIPESTATUS[0]}
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  for f in $families; do
    timeout 560 python3 -m "kernels.$f.bench" --write 2>&1 | tee "$out/bench_$f.log" | tail -40
    cp -f "kernels/$f/results.json" "$out/results_$f.json" 2>/dev/null || true
  done
fi
exit $rc
