#!/usr/bin/env bash
# Run experiments' GPU commands side by side on one machine, each under a time limit, and collect what
# they wrote. A command cut off by the limit leaves its finished pieces in
# experiments/results/<name>.pieces.jsonl; run the same command again (with that file in place) and it
# resumes. Usage (on the GPU machine, from the repository root):
#   bash tools/gpu_experiments.sh SECONDS "python -m experiments.mqar --gpu --jobs 16 --write" [...]
# Each command's output goes to $OUT/<module>_<i>.log (or /tmp/gpu_experiments); every results file and
# pieces file the commands changed is copied to $OUT/results/.
set -u
limit=$1; shift
repo=$(cd "$(dirname "$0")/.." && pwd); cd "$repo"
out=${OUT:-/tmp/gpu_experiments}; mkdir -p "$out/results"
export PYTHONPATH=$repo PYTHONUNBUFFERED=1 FLA_DISABLE_BACKEND_DISPATCH=1
stamp=$(mktemp); touch "$stamp"
{ nvidia-smi -L 2>/dev/null; ${PY:-python3} -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; }
i=0
for c in "$@"; do
  i=$((i + 1)); name=$(echo "$c" | sed -n 's/.*-m experiments\.\([a-z_]*\).*/\1/p')
  ( { date -u; echo "+ $c"; timeout "$limit" bash -c "$c"; echo "exit $?"; date -u; } > "$out/${name:-cmd}_$i.log" 2>&1 ) &
done
wait
for f in experiments/results/*.json experiments/results/*.pieces.jsonl; do
  [ -e "$f" ] && [ "$f" -nt "$stamp" ] && cp "$f" "$out/results/"
done
date -u; tail -n 5 "$out"/*.log
