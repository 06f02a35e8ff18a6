#!/usr/bin/env bash
# Run one test file as N pytest processes at once, its collected tests dealt round-robin, so that
# Triton's cold compiles (CPU-bound, tens of seconds for float32 IEEE kernels) run side by side.
# Usage (on a GPU machine, from the repository root):
#   bash tools/gpu_pytest_split.sh N tests/kernels/test_path.py [more pytest selection args, e.g. -k expr]
# Logs: $OUT/split_<i>.log (or /tmp/split); exit status: the worst of the N.
set -u
n=$1; shift
out=${OUT:-/tmp/split}; mkdir -p "$out"
python3 -m pytest --collect-only -q -p no:cacheprovider "$@" 2>/dev/null | grep "::" > "$out/ids.txt"
echo "$(wc -l < "$out/ids.txt") tests in $n processes"
pids=()
for i in $(seq 0 $((n - 1))); do
  awk -v n="$n" -v i="$i" 'NR % n == i' "$out/ids.txt" > "$out/ids_$i.txt"
  mapfile -t ids < "$out/ids_$i.txt"
  [ ${#ids[@]} -eq 0 ] && continue
  python3 -m pytest -p no:cacheprovider -q -rA --durations=0 "${ids[@]}" > "$out/split_$i.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
grep -h -E "^(PASSED|FAILED|ERROR|SKIPPED)" "$out"/split_*.log | sort | uniq -c | sort -rn | head -5
exit $rc
