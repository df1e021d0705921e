#!/usr/bin/env bash
# One device call: the GPU tests, then the benchmarks, each stage under its own time limit, logs under $OUT.
#   run(command="source bench/gpu-prelude.sh; bash bench/gpu-all.sh [stages]", carry=[".whl"])
# stages (default: tests kernels): tests kernels lora runtime; KERNELS_ONLY passes --only to bench/kernels.py.
# `-v` makes xdist print one line per finished test, so a stage cut by its limit still shows which tests passed
# and failed; bench/kernels.py writes its results when cut.
# Budget seen on the H200 (2026-12-02): tests > 330 s with 14 workers (compile-bound: the fp32 prefill kernels with
# IEEE dots took minutes to compile, bench/results/2026-12-02-aot.md), kernels ~270 s, lora ~60 s.
# The device returns at most 8 files from $OUT: tests.log, bench.log and 3 result files per bench stage, so name
# at most two bench stages per call.
set -u
OUT=${OUT:-/tmp/gdn-out}
mkdir -p "$OUT"
stages=${*:-tests kernels}
for s in $stages; do
  case $s in
    tests)   # GPU_TESTS (paths or node ids) and GPU_K (a -k expression) narrow the selection, GPU_TEST_LIMIT (s)
             timeout "${GPU_TEST_LIMIT:-330}" python -m pytest -v -m gpu -n "${GPU_WORKERS:-14}" -p no:cacheprovider --tb=short \
               ${GPU_K:+-k "$GPU_K"} ${GPU_TESTS:-tests/} 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" > "$OUT/tests.log"
             # a cut run leaves its xdist workers running on the GPU: stop them before anything is timed
             pkill -9 -f "pytest|sys.stdin.readline" 2>/dev/null; sleep 2
             grep -E "FAILED|ERROR" "$OUT/tests.log" | head -40; tail -3 "$OUT/tests.log" ;;
    kernels) mkdir -p "$OUT/k"; timeout 300 python bench/kernels.py --out "$OUT/k" ${KERNELS_ONLY:+--only "$KERNELS_ONLY"} >> "$OUT/bench.log" 2>&1
             tail -40 "$OUT/bench.log" ;;
    lora)    mkdir -p "$OUT/l"; timeout 200 python bench/lora.py --out "$OUT/l" >> "$OUT/bench.log" 2>&1
             tail -30 "$OUT/bench.log" ;;
    runtime) mkdir -p "$OUT/r"; timeout 200 python bench/runtime.py --out "$OUT/r" >> "$OUT/bench.log" 2>&1
             tail -20 "$OUT/bench.log" ;;
    *) echo "unknown stage $s (tests kernels lora runtime)"; exit 2 ;;
  esac
done
