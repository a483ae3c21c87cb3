#!/usr/bin/env bash
# One call on a two-GPU machine (nvidia-h200-x2) for the batch-invariant mode (issue 15) and
# tensor parallelism (issue 14), using both GPUs at once where the work is one-GPU:
#   1. GPU 0: scripts/bench_invariant_mm.py measures the invariant GEMM's tilings and writes the
#      fastest into bulkgen/model/invariant_tilings.json;  GPU 1: the invariant GPU tests.
#   2. GPU 0: bulk with bulkgen;  GPU 1: bulk with bulkgen-invariant (the tilings of step 1;
#      BENCH_GPU=1: the bench samples NVML's GPU 1, which CUDA_VISIBLE_DEVICES does not renumber).
#   3. Both GPUs: the tensor-parallel GPU tests.
# Results in $OUT (at most 8 files come back): mm.jsonl, invariant_tilings.json, inv_tests.log,
# bench.jsonl, tp_tests.log, log.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export NCCL_NVLS_ENABLE=0
OUT="${OUT:-/tmp/gpu_check_x2}"
WORK=/tmp/x2
mkdir -p "$OUT" "$WORK"/{inv,b0,b1,tp}
# The carried wheels, installed once: moved away, gpu_check.sh does not install them again in
# two jobs at once.
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site" && mv .whl /tmp/whl
fi
NUM_PROMPTS="${NUM_PROMPTS:-1024}"

(CUDA_VISIBLE_DEVICES=0 timeout 170 python3 scripts/bench_invariant_mm.py --ms 256,1024,2048 \
  --iters 10 --write-table > "$OUT/mm.jsonl" 2> "$WORK/mm.err") &
(CUDA_VISIBLE_DEVICES=1 OUT=$WORK/inv TESTS=1 BENCH=0 PYTEST_ARGS="--maxfail=10 \
  tests/test_invariant_matmul.py tests/test_invariant_attention.py \
  tests/test_invariant_sampling.py tests/test_invariant_model.py tests/test_gpu_batch_invariant.py" \
  timeout 170 scripts/gpu_check.sh > "$WORK/inv/out.txt" 2>&1) &
wait
cp bulkgen/model/invariant_tilings.json "$OUT/" 2> /dev/null
cp "$WORK/inv/gpu_tests.log" "$OUT/inv_tests.log"
grep summary "$OUT/mm.jsonl"; tail -3 "$WORK/mm.err"; tail -4 "$WORK/inv/out.txt"

(CUDA_VISIBLE_DEVICES=0 OUT=$WORK/b0 TESTS=0 timeout 150 scripts/gpu_check.sh --workloads bulk \
  --engines bulkgen --num-prompts "$NUM_PROMPTS" > "$WORK/b0/out.txt" 2>&1) &
(CUDA_VISIBLE_DEVICES=1 BENCH_GPU=1 OUT=$WORK/b1 TESTS=0 timeout 150 scripts/gpu_check.sh --workloads bulk \
  --engines bulkgen-invariant --num-prompts "$NUM_PROMPTS" > "$WORK/b1/out.txt" 2>&1) &
wait
cat "$WORK"/b0/bench.jsonl "$WORK"/b1/bench.jsonl | tee "$OUT/bench.jsonl"
grep -h '"error"' "$WORK"/b0/out.txt "$WORK"/b1/out.txt | cut -c1-1500

OUT=$WORK/tp TESTS=1 BENCH=0 PYTEST_ARGS="--maxfail=3 -o faulthandler_timeout=80 \
  tests/test_gpu_tensor_parallel.py" timeout "${TP_TIMEOUT:-95}" scripts/gpu_check.sh 2>&1 | tail -4
cp "$WORK/tp/gpu_tests.log" "$OUT/tp_tests.log"
