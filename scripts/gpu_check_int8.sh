#!/usr/bin/env bash
# Device calls (one H200) for the int8 KV cache (--kv-cache-dtype int8); its GPU tests first ran
# at d3151d6 (2026-12-02):
#   tests: its GPU tests (kernels against the torch reference at the 8B shape, the engine on CUDA
#      against the CPU reference and bf16 KV, batch invariance) and the fp8 ones beside them;
#   tune: tune_decode.py --kv-cache-dtype int8 --write-table (int8's own decode launches; until
#      then it took fp8's; measured at 0315086), before the benches;
#   kernels: bench_attention.py over bf16, fp8 and int8 caches (decode at 32/256 rows, prefill);
#   accuracy: gpu_check_fp8.sh's step of that name (fp8_accuracy.py, every mode and text set on
#      the demo model, whose wheel comes in two parts over two calls: scripts/demo_parts.sh);
#   trt (TRT_PROMPTS requests, default 500): bf16, FP8 KV and int8 KV engines, auto rows;
#   ab: the int8 KV engine on trt again with each of its two switches off (BULKGEN_INT8_F16_ASM=0:
#      int8->f16 by cvt instead of the PTX byte trick; BULKGEN_INT8_V_SLOTS_INNER=0: value rows).
# Results go to $OUT; STEPS picks (each step has its own timeout).
#   GIT_COMMIT=abc1234 STEPS="tests tune" scripts/gpu_check_int8.sh
#   GIT_COMMIT=abc1234 STEPS="kernels accuracy trt" scripts/gpu_check_int8.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/gpu_check_int8}"
WORK=/tmp/int8check
STEPS="${STEPS:-tests tune}"
mkdir -p "$OUT" "$WORK"/{tests,trt}
want() { [[ " $STEPS " == *" $1 "* ]]; }

if want tune; then
  timeout 300 python3 scripts/tune_decode.py --kv-cache-dtype int8 --write-table 2>&1 \
    | grep -v -i warn | tee "$OUT/tune.txt" | tail -2
  cp bulkgen/model/attention/decode_tilings.json "$OUT/" 2> /dev/null
fi
if want tests; then
  OUT=$WORK/tests TESTS=1 BENCH=0 PYTEST_ARGS="--maxfail=10 tests/test_int8_widen.py tests/test_kv_layout.py tests/test_kv_int8.py \
    tests/test_kv_int8_kernels.py tests/test_kv_fp8.py tests/test_kv_fp8_kernels.py \
    tests/test_invariant_attention.py" timeout 300 scripts/gpu_check.sh > /dev/null 2>&1
  { tail -3 "$WORK/tests/gpu_tests.log"; grep -E "FAILED|^E " "$WORK/tests/gpu_tests.log" | head -40; } \
    | tee "$OUT/tests.txt"
fi
if want kernels; then
  timeout 240 python3 scripts/bench_attention.py --kv-cache-dtype auto,fp8,int8 2>&1 \
    | grep -v -i warn | tee "$OUT/attention.jsonl" | tail -4
fi
if want accuracy; then
  OUT="$OUT" STEPS=accuracy scripts/gpu_check_fp8.sh
fi
if want trt; then
  OUT=$WORK/trt TESTS=0 timeout 400 scripts/gpu_check.sh --workloads trt \
    --engines bulkgen,bulkgen-fp8kv,bulkgen-int8kv --num-prompts "${TRT_PROMPTS:-500}" \
    > "$WORK/trt/out.txt" 2>&1
  cat "$WORK/trt/bench.jsonl" 2> /dev/null | tee -a "$OUT/bench.jsonl"
  grep -h '"error"' "$WORK/trt/out.txt" | cut -c1-1500 | tee -a "$OUT/log.txt"
fi
if want ab; then
  for switch in BULKGEN_INT8_F16_ASM BULKGEN_INT8_V_SLOTS_INNER; do
    rm -f "$WORK/trt/bench.jsonl"
    env "$switch=0" OUT=$WORK/trt TESTS=0 timeout 200 scripts/gpu_check.sh --workloads trt \
      --engines bulkgen-int8kv --num-prompts "${TRT_PROMPTS:-500}" > "$WORK/trt/out.txt" 2>&1
    cat "$WORK/trt/bench.jsonl" 2> /dev/null | tee -a "$OUT/bench.jsonl"
    grep -h '"error"' "$WORK/trt/out.txt" | cut -c1-1500 | tee -a "$OUT/log.txt"
  done
fi
