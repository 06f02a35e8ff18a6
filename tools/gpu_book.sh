#!/usr/bin/env bash
# Run every chapter with nbval on a GPU machine, as a Colab reader would: from an install of the
# package built from this repository (a wheel, not this checkout), in a folder outside the checkout.
# Usage (on the GPU machine, from the repository root):  bash tools/gpu_book.sh [notebooks/NN_*.ipynb ...]
#   The Colab edition: bash tools/gpu_book.sh colab/*.ipynb (two calls side by side, each on some of the
#   chapters, do not collide: each works in its own folders; LOG_TAG names its log).
#   Wheels for what the machine lacks (nbval, ipykernel, ipywidgets and their needs) are taken from
#   .whl/nb/ and fla's from .whl/ when present. The log goes to $OUT/nbval_gpu_<date>.log (or /tmp).
#   BOOK_WHEELS=0 skips the wheels (a machine that has Jupyter already, e.g. to try this on a CPU).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_book}; mkdir -p "$out"
site=/tmp/book_site_$$; run=/tmp/book_run_$$
rm -rf "$site" "$run"; mkdir -p "$site" "$run/notebooks"
for w in "$repo"/.whl/nb/*.whl "$repo"/.whl/*.whl; do [ -e "$w" ] && echo "$w"; done > /tmp/wheels_$$.txt
if [ "${BOOK_WHEELS:-1}" = 1 ] && [ -s /tmp/wheels_$$.txt ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" $(cat /tmp/wheels_$$.txt) || exit 1
fi
python3 -m pip wheel -q --no-deps --no-build-isolation -w /tmp/book_dist_$$ "$repo" || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" /tmp/book_dist_$$/linear_attention_history-*.whl || exit 1
if [ $# -gt 0 ]; then nbs=("$@"); else nbs=("$repo"/notebooks/*.ipynb); fi
for nb in "${nbs[@]}"; do cp "$repo/${nb#$repo/}" "$run/notebooks/" 2>/dev/null || cp "$nb" "$run/notebooks/"; done
cd "$run"
export PYTHONPATH="$site" PYTHONUNBUFFERED=1 FLA_DISABLE_BACKEND_DISPATCH=1 MPLBACKEND=Agg
log="$out/nbval_gpu_$(date -u +%Y%m%d)${LOG_TAG:+_$LOG_TAG}.log"
{
  date -u; python3 -c "import torch, triton, kernels; gpu = torch.cuda.is_available(); print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name() if gpu else 'no GPU'); print('kernels from', kernels.__file__)"
  python3 -m pip list 2>/dev/null | grep -i -E "^(torch|triton|nbval|ipykernel|fla-core) " || true
  time python3 -m pytest -q notebooks/*.ipynb --nbval-lax --nbval-current-env -p no:cacheprovider --durations=20
} 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
