#!/usr/bin/env bash
# Run tests as N pytest processes at once, the collected tests dealt round-robin, so that Triton's cold
# compiles (CPU-bound, tens of seconds for float32 IEEE kernels) run side by side; then the tests marked
# `bigmem` (tens of GB of GPU memory each) in one process, alone, so that they neither starve nor are
# starved by the others (ten processes beside a 99 GB test ran out of memory: book/logs/kernel_tests_gpu_20261129.log).
# Usage (on a GPU machine, from the repository root):
#   bash tools/gpu_pytest_split.sh N tests/kernels/test_path.py [more pytest selection args, e.g. -k expr]
# Options for every process (not only the collection) go in PYTEST_ADDOPTS, e.g. PYTEST_ADDOPTS="--gpu-class 75".
# Logs: $OUT/split_<i>.log and $OUT/split_bigmem.log (or under /tmp/split), one line per test as it ends
# (-v), so a process cut off by a time limit still says what ran; exit status: the worst of them.
set -u
n=$1; shift
out=${OUT:-/tmp/split}; mkdir -p "$out"
python3 -m pytest --collect-only -q -p no:cacheprovider -m "not bigmem" "$@" 2>/dev/null | grep "::" > "$out/ids.txt"
python3 -m pytest --collect-only -q -p no:cacheprovider -m bigmem "$@" 2>/dev/null | grep "::" > "$out/ids_bigmem.txt"
echo "$(wc -l < "$out/ids.txt") tests in $n processes, then $(wc -l < "$out/ids_bigmem.txt") alone"
pids=()
for i in $(seq 0 $((n - 1))); do
  awk -v n="$n" -v i="$i" 'NR % n == i' "$out/ids.txt" > "$out/ids_$i.txt"
  mapfile -t ids < "$out/ids_$i.txt"
  [ ${#ids[@]} -eq 0 ] && continue
  python3 -m pytest -p no:cacheprovider -v -rA --durations=0 "${ids[@]}" > "$out/split_$i.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
mapfile -t ids < "$out/ids_bigmem.txt"
if [ ${#ids[@]} -gt 0 ]; then
  python3 -m pytest -p no:cacheprovider -v -rA --durations=0 "${ids[@]}" > "$out/split_bigmem.log" 2>&1 || rc=$?
fi
grep -h -o -E " (PASSED|FAILED|ERROR|SKIPPED)( |$)" "$out"/split_*.log | sort | uniq -c
exit $rc
