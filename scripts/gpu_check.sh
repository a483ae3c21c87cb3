#!/usr/bin/env bash
# Everything the GPU path must prove, in one device call: GPU tests (Triton kernels against the
# torch reference, the engine on CUDA against transformers, async == sync on the 8B shape), then
# scripts/bench.py. Results and logs go to $OUT (the device tool brings them back).
#   scripts/gpu_check.sh                      # tests + default benchmark
#   TESTS=0 scripts/gpu_check.sh --workloads blog --engines bulkgen,bulkgen-sync
# Bench lines name their commit (scripts/bench_commit.py): GIT_COMMIT if set, typed from this
# side, never from the device's git (older than the files it gets); unset, a stale copy's lines
# read HEAD-dirty-tree-TREE, where `git log --format='%h %T' | grep TREE` here names the commit.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/gpu_check}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu,clocks.sm --format=csv
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
# Wheels the GPU machine lacks (xgrammar and its dependencies for structured output, jsonschema
# for its tests) travel in .whl (git-ignored; carry it; scripts/make_carry.sh builds it):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl xgrammar==0.2.9 \
#     apache-tvm-ffi pydantic pydantic-core annotated-types typing-inspection typing_extensions \
#     jsonschema attrs jsonschema-specifications referencing rpds-py
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
# Installed once a call: gpu_check_fp8.sh moves .whl away after its first tests.
if [ -d /tmp/site ]; then export PYTHONPATH="$PYTHONPATH:/tmp/site"; fi
# Without the carry folders a call loses minutes to failures (2026-12-01: every bench without a
# tokenizer, the tests at collection without jsonschema): stop at once, saying what is missing.
if [ "${BENCH:-1}" = 1 ] && [ ! -f .carry/tokenizer.json ]; then
  echo "gpu_check.sh: .carry/tokenizer.json missing: run scripts/make_carry.sh here and carry" \
    '[".carry", ".whl"]' >&2
  exit 2
fi
wheels_needed='(structured| tests )'  # the structured-output tests, or the whole suite
if [ "${TESTS:-1}" = 1 ] && [[ " ${PYTEST_ARGS:-tests} " =~ $wheels_needed ]] \
  && ! python3 -c "import jsonschema, xgrammar" 2> /dev/null; then
  echo "gpu_check.sh: jsonschema / xgrammar missing (.whl not carried?): run" \
    'scripts/make_carry.sh here and carry [".carry", ".whl"]' >&2
  exit 2
fi
status=0
# A hung test (a collective waiting for a peer) fails alone instead of using up the call.
TIMEOUT_ARGS=""
if python3 -c "import pytest_timeout" 2> /dev/null; then TIMEOUT_ARGS="--timeout=${TEST_TIMEOUT_S:-240}"; fi
if [ "${TESTS:-1}" = 1 ]; then
  python3 -m pytest -m gpu -q -x -p no:cacheprovider $TIMEOUT_ARGS ${PYTEST_ARGS:-tests} 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
  status=${PIPESTATUS[0]}
  echo "gpu tests exit status: $status"
fi
if [ "${BENCH:-1}" = 1 ]; then
  python3 scripts/bench.py --tokenizer .carry --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | grep -v '^\s*$' | tail -30
fi
exit $status
