#!/usr/bin/env bash
# The families' GPU tests with each Colab GPU class's plans forced on the GPU at hand (issue 39: a T4,
# L4 or A100 cannot be lent, an H200 can run their launches; tests/conftest.py, --gpu-class).
# Usage (on a GPU machine, from the repository root):
#   bash tools/gpu_classes.sh N "75 80 89"        # N pytest processes per class, classes one after another
#   CLASS_S=270 bash tools/gpu_classes.sh ...      # each class cut after 270 s (its log says what ran)
# Per class: the tests of every family file that run on the GPU (ids with "cuda" or "gpu"), dealt over N
# processes by tools/gpu_pytest_split.sh (the `bigmem` ones alone, after); bfloat16 cases are skipped
# under 75 (a T4 has none; the ValueError is tested on every machine). One log per class:
# $OUT/gpu_class_<c>.log (or under /tmp/gpu_classes): a summary line, then each process's log.
set -u
n=${1:-12}; classes=${2:-"75 80 89"}
out=${OUT:-/tmp/gpu_classes}; mkdir -p "$out"
files="tests/kernels/test_flash.py tests/kernels/test_gla.py tests/kernels/test_delta.py tests/kernels/test_deltaformer.py
       tests/kernels/test_path.py tests/kernels/test_mesa.py tests/kernels/test_conv.py tests/kernels/test_common.py
       tests/kernels/test_classes.py"
rc=0
for c in $classes; do
  tmp=$(mktemp -d)
  { date -u; nvidia-smi -L 2>/dev/null; echo "--gpu-class $c, $n processes"; } > "$out/gpu_class_$c.log"
  PYTEST_ADDOPTS="--gpu-class $c" OUT=$tmp timeout "${CLASS_S:-0}" bash "$(dirname "$0")/gpu_pytest_split.sh" "$n" $files -k "cuda or gpu" \
    >> "$out/gpu_class_$c.log" 2>&1 || rc=$?
  { echo "exit $rc"; date -u; for f in "$tmp"/split_*.log; do echo "=== $(basename "$f")"; cat "$f"; done; } >> "$out/gpu_class_$c.log"
  rm -rf "$tmp"
done
exit $rc
