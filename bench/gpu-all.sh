#!/usr/bin/env bash
# One device call: the GPU tests, then the benchmarks, each stage under its own time limit, logs under $OUT.
#   run(command="source bench/gpu-prelude.sh; bash bench/gpu-all.sh [stages]", carry=[".whl"])
# stages (default: tests kernels): tests kernels lora runtime gluon conv gemm io norm switches eager chain verify
# host.
# KERNELS_ONLY passes --only to bench/kernels.py, KERNELS_ARGS more of its arguments (e.g. "--prefill-T 16384
# --name kernels-round2"), KERNELS_LIMIT its limit (s).
# `-v` makes xdist print one line per finished test, so a stage cut by its limit still shows which tests passed
# and failed; bench/kernels.py writes its results when cut.
# Budget seen on the H200 (2026-12-02): tests > 330 s with 14 workers (compile-bound: the fp32 prefill kernels with
# IEEE dots took minutes to compile, bench/results/2026-12-02-aot.md), kernels ~270 s, lora ~60 s.
# The device returns at most 8 files from $OUT: tests.log, bench.log and 3 result files per bench stage, so name
# at most two bench stages per call.
set -u
OUT=${OUT:-/tmp/gdn-out}
mkdir -p "$OUT"

# Run a command in a process group of its own and stop that group, by its id, after LIMIT seconds (TERM, then KILL):
# the command and every process it started (pytest's xdist workers), nothing else on the machine. A background job
# of this non-interactive shell is not a group leader, so setsid makes the job's pid its group id.
run_group() {  # run_group LIMIT CMD...
  local limit=$1 t=0 pgid
  shift
  setsid "$@" &
  pgid=$!
  while kill -0 "$pgid" 2>/dev/null && [ "$t" -lt "$limit" ]; do sleep 1; t=$((t + 1)); done
  if kill -0 -- "-$pgid" 2>/dev/null; then  # cut, or workers left behind by the command
    echo "stopping process group $pgid (limit ${limit} s)" >&2
    kill -TERM -- "-$pgid" 2>/dev/null; sleep 2; kill -KILL -- "-$pgid" 2>/dev/null
  fi
  wait "$pgid" 2>/dev/null
}
# the bench stages run under `timeout`, which signals only the process it started (and its own process group)

# A/B of one switch: bench/runtime.py --only ONLY with VAR=0 and VAR=1, two interleaved rounds; prints the table rows
ab() {  # ab VAR TAG ONLY
  local var=$1 tag=$2 only=$3 r on d
  for r in 1 2; do for on in 0 1; do d="$OUT/$tag$on$r"; mkdir -p "$d"
    env "$var=$on" timeout 100 python bench/runtime.py --only "$only" --steps 100 --deadline 80 --out "$d" \
      >> "$OUT/bench.log" 2>&1; rm -f "$d"/*.png "$d"/*.json
    echo "$var=$on round $r"; grep "^| ours\|^| static" "$d"/*.md; done; done
}

stages=${*:-tests kernels}
for s in $stages; do
  case $s in
    tests)   raw=$(mktemp)
             # GPU_TESTS (paths or node ids) and GPU_K (a -k expression) narrow the selection, GPU_TEST_LIMIT (s)
             # a cut run would leave its xdist workers running on the GPU: run_group stops them before anything is timed
             run_group "${GPU_TEST_LIMIT:-330}" python -m pytest -v -m gpu -n "${GPU_WORKERS:-14}" -p no:cacheprovider \
               --tb=short ${GPU_K:+-k "$GPU_K"} ${GPU_TESTS:-tests/} > "$raw" 2>&1
             grep -v "PytestBenchmarkWarning\|warner(" "$raw" > "$OUT/tests.log"; rm -f "$raw"
             grep -E "FAILED|ERROR" "$OUT/tests.log" | head -40; tail -3 "$OUT/tests.log" ;;
    kernels) mkdir -p "$OUT/k"; timeout "${KERNELS_LIMIT:-300}" python bench/kernels.py --out "$OUT/k" \
               ${KERNELS_ONLY:+--only "$KERNELS_ONLY"} ${KERNELS_ARGS:-} >> "$OUT/bench.log" 2>&1
             tail -40 "$OUT/bench.log" ;;
    lora)    mkdir -p "$OUT/l"; timeout 200 python bench/lora.py --out "$OUT/l" >> "$OUT/bench.log" 2>&1
             tail -30 "$OUT/bench.log" ;;
    runtime) mkdir -p "$OUT/r"; timeout 270 python bench/runtime.py --deadline 225 --out "$OUT/r" >> "$OUT/bench.log" 2>&1
             tail -60 "$OUT/bench.log" ;;
    # the Gluon state pass (Tuning.state_gluon, on): its GPU tests, then the prefill pass by pass with it and
    # without it beside FLA at issue 18's three lengths
    gluon)   timeout 200 python -m pytest -q -m gpu -n "${GPU_WORKERS:-14}" -p no:cacheprovider \
               tests/test_triton_gdn.py -k "gluon" > "$OUT/tests-gluon.log" 2>&1; tail -3 "$OUT/tests-gluon.log"
             mkdir -p "$OUT/p"; timeout 200 python bench/passes.py --T 4096,16384,65536 --out "$OUT/p" \
               --variant "triton=state_gluon:False" --name passes-gluon >> "$OUT/bench.log" 2>&1
             grep "whole\|state" "$OUT/bench.log" | tail -20 ;;
    # the conv update in the in-projection's epilogue (glue triton.Tuning.conv_in_gemm, off): its GPU tests, then
    # the decode step (bench/runtime.py's static rows, 100 steps) without it and with it, twice each, interleaved
    conv)    timeout 200 python -m pytest -q -m gpu -n "${GPU_WORKERS:-14}" -p no:cacheprovider \
               tests/test_glue_gemm.py -k "conv or layer" > "$OUT/tests-conv.log" 2>&1; tail -3 "$OUT/tests-conv.log"
             ab GDN_TRT_CONV_IN_GEMM c static
             # with it on, the fused launch at N = 64 in the step (gemm_step.py sets the table's in_proj row; the
             # fused path takes it whatever its ratio to cuBLAS, late trigger forced): the table's, wider K steps,
             # wider N-tiles, the table's with TMA tiles (row ranges, 64,16,64,8,8,1,1, spill 120 B with the
             # epilogue compiled for sm_90: left out)
             mkdir -p "$OUT/g"; GDN_TRT_CONV_IN_GEMM=1 timeout 150 python bench/gemm_step.py --n 64 --out "$OUT/g" \
               --launches "64,64,64,4,4,1,0,1;64,64,128,4,4,1,0,1;64,128,64,4,8,1,0,1;64,64,64,4,4,1,0,1,1" \
               >> "$OUT/bench.log" 2>&1; rm -f "$OUT/g"/*.json; cat "$OUT/g"/*.md | tail -6 ;;
    # the three switches written without a device in one call: their GPU tests (each with the switch on and off),
    # then bench/switches.py (off, each alone, all on; two interleaved rounds in one process; about 4 min)
    switches) timeout 240 python -m pytest -q -m gpu -n "${GPU_WORKERS:-14}" -p no:cacheprovider \
               tests/test_glue_gemm.py tests/test_decode_norm.py tests/test_graph_io.py tests/test_graphs.py \
               tests/test_step_context.py > "$OUT/tests-switches.log" 2>&1; tail -3 "$OUT/tests-switches.log"
             mkdir -p "$OUT/s"; timeout 330 python bench/switches.py --out "$OUT/s" >> "$OUT/bench.log" 2>&1
             rm -f "$OUT/s"/*.json; cat "$OUT/s"/*.md | tail -60 ;;
    # the decode's gated norm in the GDN decode kernel's epilogue (plugins/glue/decode_norm.py): its GPU tests, the
    # static decode step with it off and on (two interleaved rounds), then everything written without a device on at
    # once (the conv in in_proj, the norm in the decode, the graph's io by address) against all off (switches.py)
    norm)    timeout 200 python -m pytest -q -m gpu -n "${GPU_WORKERS:-14}" -p no:cacheprovider \
               tests/test_decode_norm.py > "$OUT/tests-norm.log" 2>&1; tail -3 "$OUT/tests-norm.log"
             ab GDN_TRT_NORM_IN_DECODE n static
             mkdir -p "$OUT/a"; timeout 150 python bench/switches.py --only off,all --out "$OUT/a" \
               >> "$OUT/bench.log" 2>&1
             rm -f "$OUT/a"/*.json "$OUT/a"/*.png; cat "$OUT/a"/*.md | tail -20 ;;
    # the decode graph's input and output by address (runtime/graph_io.py): its GPU tests, then `ours` (run(x) with
    # its copies) and `static` (in place) with it off and on, two interleaved rounds, and the host phases with it on
    io)      timeout 200 python -m pytest -q -m gpu -n "${GPU_WORKERS:-14}" -p no:cacheprovider tests/test_graph_io.py \
               tests/test_graphs.py tests/test_step_context.py > "$OUT/tests-io.log" 2>&1; tail -3 "$OUT/tests-io.log"
             ab GDN_TRT_GRAPH_IO i ours,static
             GDN_TRT_GRAPH_IO=1 timeout 100 python bench/host_profile.py --n 1,64,256 --steps 200 --top 1 \
               2>&1 | grep "^decode" ;;
    # the skinny GEMM's sweep at the M buckets of GEMM_M (default 1,8,64) with the TMA launches among the
    # candidates (gemm.Config.tma), beside cuBLAS; the table is not rewritten (run --apply-from on its JSON after)
    gemm)    mkdir -p "$OUT/gs"; timeout 280 python bench/gemm.py --sweep --m "${GEMM_M:-1,8,64}" --deadline 200 \
               --out "$OUT/gs" >> "$OUT/bench.log" 2>&1; rm -f "$OUT/gs"/*.png
             grep "True\|cuBLAS" "$OUT/gs"/*sweep.md | tail -30 ;;
    # the fold kernel's GPU tests (runtime/fold.py, stack.FOLD_KERNEL, on), then where the host time of the eager
    # verify and prefill steps goes (3.3 and 5.7 ms of enqueue against 0.96 and 2.8 ms of device time on the H200):
    # phases, the calls that wait for the GPU, device allocations, accept's fold both ways, cProfile (about 1.5 min
    # once the verify and prefill kernels are compiled; a cold Triton cache adds their compiles)
    eager)   timeout 120 python -m pytest -q -m gpu -p no:cacheprovider tests/test_fold.py > "$OUT/tests-fold.log" 2>&1
             tail -3 "$OUT/tests-fold.log"
             timeout 240 python bench/host_profile.py --eager "verify 64x4,prefill 4096" --steps 30 --top 30 \
               > "$OUT/eager.log" 2>&1; grep "^verify\|^prefill\|^  [^ ]" "$OUT/eager.log" | head -40 ;;
    # the step's launch structure with streaming kernels beside the step itself (bench/chain_floor.py)
    chain)   mkdir -p "$OUT/c"; timeout 300 python bench/chain_floor.py --n 8,64,256 --out "$OUT/c" \
               > "$OUT/chain.log" 2>&1; grep "^N=" "$OUT/chain.log" ;;
    # verify steps from CUDA graphs (SessionOptions.verify_graphs, on): their GPU tests, then the verify row of
    # bench/runtime.py with the graph (ours) beside the eager one (veager) and Hugging Face's
    verify)  timeout 200 python -m pytest -q -m gpu -n "${GPU_WORKERS:-14}" -p no:cacheprovider tests/test_graphs.py \
               tests/test_step_context.py tests/test_hf_hybrid.py > "$OUT/tests-verify.log" 2>&1
             grep -E "FAILED|ERROR" "$OUT/tests-verify.log" | head -20; tail -3 "$OUT/tests-verify.log"
             mkdir -p "$OUT/v"; timeout 200 python bench/runtime.py --only ours,veager,hf --cases "verify 64x4" \
               --deadline 150 --out "$OUT/v" >> "$OUT/bench.log" 2>&1; grep "^- verify\|^| ours\|^| veager" "$OUT/v"/*.md ;;
    # where a decode step's host time goes at each N (bench/host_profile.py: phases, the bare replay, cProfile,
    # graphs of in_proj's GEMM alone, then the kernels of one replay per bucket)
    host)    timeout 300 python bench/host_profile.py --n 1,8,64,256 --steps 200 --top 6 > "$OUT/host.log" 2>&1
             grep "^decode\|^linear\|^skinny\|^copy" "$OUT/host.log" ;;
    *) echo "unknown stage $s (tests kernels lora runtime gluon conv gemm io norm switches eager chain verify host)"
       exit 2 ;;
  esac
done
