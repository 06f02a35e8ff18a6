#!/usr/bin/env bash
# Run the GPU correctness tests and the benchmarks of the book's kernels on a CUDA machine.
# Usage: bash kernels/benchmarks/run_gpu.sh [tests|bench|all] [bench names...]
#   With fla-core wheels in .whl/ (pip download --no-deps -d .whl fla-core==0.6.0 einops), they are
#   installed into /tmp/site first so the benchmarks time fla's pure-Triton kernels side by side.
#   Results are written to kernels/results/*.json; logs and copies go to $OUT when it is set.
set -uo pipefail
cd "$(dirname "$0")/../.."
what=${1:-all}; shift || true
benches=${*:-"bench_flash bench_gla bench_delta"}
out=${OUT:-/tmp/gpu_out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 FLA_DISABLE_BACKEND_DISPATCH=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
python3 -c "import fla; print('fla', fla.__version__)" 2>&1 | tail -1
rc=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  python3 -m pytest -q -x tests/test_kernel_*.py -p no:cacheprovider 2>&1 | tee "$out/gpu_tests.log" | tail -25
  rc=${PIPESTATUS[0]}
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  for b in $benches; do
    [ -f "kernels/benchmarks/$b.py" ] || { echo "no $b"; continue; }
    timeout 420 python3 -m "kernels.benchmarks.$b" --write 2>&1 | tee "$out/$b.log" | tail -30
    cp -f "kernels/results/$b.json" "$out/" 2>/dev/null || true
  done
fi
exit $rc
