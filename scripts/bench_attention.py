"""Benchmark the Triton attention kernels at the Llama-3-8B attention shape; one JSON line each.

    PYTHONPATH=. python scripts/bench_attention.py [--kv-cache-dtype auto,fp8,int8] [--mixed]

Decode: batch 32 and 256 at contexts 256..8192, every sequence at the same length, blocks of 16 in
a shuffled block table. Reports the median time and the achieved bandwidth of the K/V read (the
bytes decode must move) beside a device-to-device copy measured in the same run. Prefill: 2048
new tokens in one sequence, with no cached context and after 6144 cached tokens, in TFLOP/s of the
causal attention actually computed (4 * Hq * D flops per query-key pair). --kv-cache-dtype fp8
runs the same over a float8_e4m3fn cache (its bandwidth counts the fp8 bytes read), int8 over an
int8 cache with its scales per (token, kv head) (kv_int8.py; the bytes count the scales).
--batch-invariant runs the batch-invariant backend instead (triton_invariant.py: the prefill
kernel with one fixed tiling for every step, decode included, never split), labelled
"decode-invariant" / "prefill-invariant": compare with a run without it for its cost.
--mixed times mixed steps instead (kernel "mixed"): N decoding rows of 1,500 tokens of context
and one 1,536-token prefill chunk, through the varlen kernel alone and split (the decoding rows
through the decode kernel, as triton_backend.SPLIT_MIXED_MIN_ROWS allows), as CUDA-graph replays.
"""

from __future__ import annotations

import argparse
import json

import torch
from triton.testing import do_bench

from bulkgen.model.attention import triton_backend, triton_invariant
from bulkgen.model.attention.decode_tiling import decode_launch, num_kv_splits
from bulkgen.model.attention.kv_fp8 import is_fp8, resolve_kv_dtype
from bulkgen.model.attention.kv_int8 import INT8_DTYPE, is_int8, quantize
from bulkgen.model.attention.metadata import AttnMetadata
from bulkgen.model.attention.triton_backend import paged_attention

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
DTYPE = torch.bfloat16
DEVICE = torch.device("cuda")


def random_cache(shape: tuple[int, ...], kv_dtype) -> tuple[torch.Tensor, float | torch.Tensor]:
    """(cache, its scale): an int8 cache quantized with its scale tensor, others cast (1.0)."""
    x = torch.randn(shape, dtype=DTYPE, device=DEVICE)
    return quantize(x) if kv_dtype == INT8_DTYPE else (x.to(kv_dtype), 1.0)


def paged_inputs(
    seq_lens: list[int], query_lens: list[int], decode_only: bool, kv_dtype, block_size: int = 0
):
    """q, caches, metadata (every sequence's blocks scattered over the cache) and the caches'
    (k_scale, v_scale); blocks of block_size tokens (0: BLOCK_SIZE)."""
    block_size = block_size or BLOCK_SIZE
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks, width = sum(blocks_per_seq), max(blocks_per_seq)
    shape = (num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM)
    k_cache, k_scale = random_cache(shape, kv_dtype)
    v_cache, v_scale = random_cache(shape, kv_dtype)
    block_ids = torch.randperm(num_blocks, device=DEVICE).int()
    block_tables = torch.zeros(len(seq_lens), width, dtype=torch.int32, device=DEVICE)
    start = 0
    for b, n in enumerate(blocks_per_seq):
        block_tables[b, :n] = block_ids[start : start + n]
        start += n
    starts = torch.tensor([0] + query_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    meta = AttnMetadata(
        slot_mapping=torch.empty(0, dtype=torch.int64, device=DEVICE),
        query_start_loc=starts.to(DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_tables=block_tables,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        decode_only=decode_only,
    )
    q = torch.randn(sum(query_lens), NUM_Q_HEADS, HEAD_DIM, dtype=DTYPE, device=DEVICE)
    return q, k_cache, v_cache, meta, (k_scale, v_scale)


def median_ms(fn) -> float:
    return do_bench(fn, warmup=50, rep=300, return_mode="median")


def graph_ms(fn) -> float:
    """Median ms of fn captured in a CUDA graph and replayed (do_bench clears the L2 before each
    replay, as 32 layers' caches would): the kernels' time without the host's. Timed eagerly, the
    Python of a launch outlasted the L2 clear at 32 rows (~50 us kernels), and one launch measured
    anywhere from 0.04 to 0.16 ms at 49fbb99."""
    fn()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return median_ms(graph.replay)


def steps_us(calls: list) -> float:
    """Median microseconds per call of `calls` (no arguments each) captured back to back in one
    CUDA graph and replayed with no L2 clear: each call's time as a step's layers run it, one
    after another over their own caches. graph_ms's single replay after do_bench's L2 clear read
    6-11 us more per decode launch at 32 rows than this (bench_decode_layers.py, f85933e; the
    clear's dirty lines written back while the kernel reads would explain it, not verified)."""
    for call in calls:
        call()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(20):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return sorted(times)[len(times) // 2]


def copy_gb_per_s() -> float:
    """Device-to-device copy bandwidth (read + write) of a 1 GiB buffer: the practical roofline."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    return 2 * src.numel() / median_ms(lambda: dst.copy_(src)) / 1e6


def bench_decode(batch: int, context: int, copy_bw: float, kv_dtype, invariant: bool) -> dict:
    inputs = paged_inputs([context] * batch, [1] * batch, True, kv_dtype)
    q, k_cache, v_cache, meta, scales = inputs
    scale = HEAD_DIM**-0.5
    attend = triton_invariant.paged_attention if invariant else paged_attention
    ms = median_ms(lambda: attend(q, k_cache, v_cache, meta, scale, *scales))
    row_bytes = HEAD_DIM * k_cache.element_size() + (4 if is_int8(k_cache) else 0)
    kv_bytes = 2 * batch * context * NUM_KV_HEADS * row_bytes
    max_context = meta.block_tables.shape[1] * BLOCK_SIZE
    kind = "int8" if is_int8(k_cache) else "fp8" if is_fp8(k_cache) else "auto"
    launch = decode_launch(HEAD_DIM, kind != "auto", batch, kind)
    splits = launch.splits or num_kv_splits(
        batch, NUM_KV_HEADS, max_context, launch.block_n, DEVICE
    )
    gb_per_s = kv_bytes / ms / 1e6
    return {
        "kernel": "decode-invariant" if invariant else "decode",
        "kv_dtype": str(kv_dtype).removeprefix("torch."),
        "batch": batch,
        "context": context,
        "splits": 1 if invariant else splits,
        "ms": round(ms, 4),
        "kv_gb_per_s": round(gb_per_s, 1),
        "of_copy_bw": round(gb_per_s / copy_bw, 3),
    }


def bench_prefill(new_tokens: int, cached: int, kv_dtype, invariant: bool) -> dict:
    seq_len = cached + new_tokens
    q, k_cache, v_cache, meta, scales = paged_inputs([seq_len], [new_tokens], False, kv_dtype)
    scale = HEAD_DIM**-0.5
    attend = triton_invariant.paged_attention if invariant else paged_attention
    ms = median_ms(lambda: attend(q, k_cache, v_cache, meta, scale, *scales))
    # Query row i (0-based) of the new tokens attends to cached + i + 1 keys.
    pairs = new_tokens * cached + new_tokens * (new_tokens + 1) // 2
    flops = 4 * NUM_Q_HEADS * HEAD_DIM * pairs
    return {
        "kernel": "prefill-invariant" if invariant else "prefill",
        "kv_dtype": str(kv_dtype).removeprefix("torch."),
        "tokens": new_tokens,
        "cached": cached,
        "ms": round(ms, 4),
        "tflop_per_s": round(flops / ms / 1e9, 1),
    }


def bench_mixed(decode_rows: int, kv_dtype, context: int = 1500, chunk: int = 1536) -> dict:
    """A mixed step's attention: decode_rows one-row sequences (first, as the scheduler puts
    them), then a new request's prefill chunk; the varlen kernel alone against the split."""
    seq_lens, query_lens = [context] * decode_rows + [chunk], [1] * decode_rows + [chunk]
    q, k_cache, v_cache, meta, scales = paged_inputs(seq_lens, query_lens, False, kv_dtype)
    meta.num_decode_prefix = decode_rows
    scale = HEAD_DIM**-0.5
    ms = {}
    for split in (False, True):
        triton_backend.SPLIT_MIXED_MIN_ROWS = 1 if split else None
        ms[split] = graph_ms(lambda: paged_attention(q, k_cache, v_cache, meta, scale, *scales))
    triton_backend.SPLIT_MIXED_MIN_ROWS = None
    return {
        "kernel": "mixed",
        "kv_dtype": str(kv_dtype).removeprefix("torch."),
        "decode_rows": decode_rows,
        "context": context,
        "prefill_tokens": chunk,
        "varlen_ms": round(ms[False], 4),
        "split_ms": round(ms[True], 4),
        "split_speedup": round(ms[False] / ms[True], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kv-cache-dtype", default="auto", help="auto, fp8, int8 or a list: auto,fp8,int8"
    )
    parser.add_argument("--batch-invariant", action="store_true", help="the invariant backend")
    parser.add_argument("--mixed", action="store_true", help="mixed steps, varlen against split")
    args = parser.parse_args()
    if args.mixed:
        for name in args.kv_cache_dtype.split(","):
            for rows in (16, 64, 256, 448):
                row = bench_mixed(rows, resolve_kv_dtype(name, DTYPE))
                print(json.dumps(row), flush=True)
        return
    copy_bw = copy_gb_per_s()
    print(json.dumps({"kernel": "copy", "gb_per_s": round(copy_bw, 1)}), flush=True)
    for name in args.kv_cache_dtype.split(","):
        kv_dtype = resolve_kv_dtype(name, DTYPE)
        for batch in (32, 256):
            for context in (256, 512, 1024, 2048, 4096, 8192):
                row = bench_decode(batch, context, copy_bw, kv_dtype, args.batch_invariant)
                print(json.dumps(row), flush=True)
                torch.cuda.empty_cache()
        for cached in (0, 6144):
            row = bench_prefill(2048, cached, kv_dtype, args.batch_invariant)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
