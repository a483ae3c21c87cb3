"""CUDA graphs of the decode forward pass: embeddings to the last hidden state, one replay per
decode step.

Only the model is captured. The lm_head (two kernels: the logits GEMM and its float32 cast),
sampling, filters, penalties, masks and logprobs run after the replay, so every sampling setting,
and every mix of settings in one batch, decodes from a graph. Captured for padded batch-size
buckets into a memory pool shared with the mixed graphs' pieces (runner.py): each graph copies
its last hidden state into one static [max_batch, hidden] buffer, so that no tensor of the pool
outlives a capture and the pool needs only the largest of its graphs' intermediates, not their
sum (kv_sizing.py; when each graph kept its own output there, the 37 buckets of 1,024 rows held
twice the 512 rows' outputs and `--max-num-seqs auto` a row fewer than 512 on trt). One graph
replays at a time, on one stream, and its output is read before the next replays. A step is
padded up to its bucket: padding rows write no KV (slot -1), attend to one token of a stale
block and their logits are never computed. The attention backend owns the static metadata
buffers.

A bucket is not always dearer than a smaller one: the GEMM libraries choose kernels by shape, and
on the H200 (scripts/bench_fp8_mm.py --rows) the 8B shape's bf16 GEMMs of a step cost 13.6 ms at
448 rows against 10.7 at 512, the FP8 ones 6.8 ms at 288 against 6.6 at 512. So after capture
each graph's replay is timed (padding rows only: no KV written, one token attended) and a step
replays the cheapest graph at or above its size (`cheapest_at_or_above`); stats.json reports the
times and the buckets so replaced.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from bulkgen.engine.inputs import StepInputs
from bulkgen.engine.tables import DeviceTables
from bulkgen.model.attention.metadata import DecodeGraphBuffers
from bulkgen.model.llama import LlamaForCausalLM


def bucket_sizes(max_seqs: int) -> list[int]:
    """Buckets covering every batch size up to max_seqs: steps of 16 rows to 256, of 32 to 512
    and of 64 past it, so padding stays under 1/8 of a large step (a padding row costs far less
    than the weights every step reads) and 1024 rows take 37 graphs rather than 67."""
    sizes = [b for b in (1, 2, 4, 8, 16, 24, 32) if b < max_seqs]
    sizes += list(range(48, min(max_seqs, 256), 16))
    sizes += list(range(256, min(max_seqs, 512), 32))
    sizes += list(range(512, max_seqs, 64))
    return sorted(set(sizes + [max_seqs]))


def cheapest_at_or_above(ms: Sequence[float], margin: float = 0.03) -> list[int]:
    """For each bucket (ascending sizes, replay times ms), the index of the bucket its steps
    replay: itself, unless a larger one replays more than `margin` faster (timing noise never
    sends a step to a larger graph)."""
    best = list(range(len(ms)))
    for i in reversed(range(len(ms) - 1)):
        j = best[i + 1]
        if ms[j] < ms[i] * (1 - margin):
            best[i] = j
    return best


class DecodeGraphs:
    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_cache: Sequence[tuple[torch.Tensor, torch.Tensor]],
        max_seqs: int,
        max_blocks_per_seq: int,
        device: torch.device,
        stream: torch.cuda.Stream,
        kv_partners: torch.Tensor | None = None,
        pool: tuple | None = None,
    ) -> None:
        """pool: a graph memory pool to share (torch.cuda.graph_pool_handle), else its own."""
        from bulkgen.engine.triton_stage import stage_decode_inputs, warm_up_staging  # CUDA only

        self.model, self.kv_cache, self.stream = model, kv_cache, stream
        self.stage, self.warm_stage = stage_decode_inputs, warm_up_staging
        self.buckets = bucket_sizes(max_seqs)
        n = self.buckets[-1]
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.meta = DecodeGraphBuffers(n, max_blocks_per_seq, device, kv_partners)
        dtype = model.model.embed_tokens.weight.dtype
        self.hidden = torch.zeros(n, model.cfg.hidden_size, dtype=dtype, device=device)
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.replay_ms: list[float] = []  # by bucket, measured by calibrate()
        self.serve = list(range(len(self.buckets)))  # bucket index -> the bucket it replays

    @property
    def max_batch(self) -> int:
        return self.buckets[-1]

    def capture(self) -> None:
        for b in reversed(self.buckets):  # largest first, so smaller ones reuse its pool memory
            self._capture(b)

    @torch.inference_mode()
    def _capture(self, b: int) -> None:
        meta = self.meta.view(b)

        def run() -> torch.Tensor:
            return self.model(self.input_ids[:b], self.positions[:b], meta, self.kv_cache)

        with torch.cuda.stream(self.stream):
            self.meta.slot_mapping[:b].fill_(-1)  # warm-up writes nothing into the cache
            run()  # compiles kernels and picks algorithms outside the capture
        self.stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        # capture_begin/end rather than torch.cuda.graph(), whose entry empties the allocator's
        # cache: captured after the pieces (runner.py), that left the run's first steps to
        # cudaMalloc their eager buffers again (46 device mallocs in a trt run against 1).
        with torch.cuda.stream(self.stream):
            graph.capture_begin(self.pool)
            try:
                self.hidden[:b].copy_(run())
            finally:
                graph.capture_end()
        self.graphs[b] = graph

    @torch.inference_mode()
    def calibrate(self, replays: int = 3) -> None:
        """Time each graph's replay (after one untimed) on the graphs' stream and point every
        bucket at the cheapest graph at or above it. The buffers hold padding rows only here."""
        events = []
        with torch.cuda.stream(self.stream):
            for b in self.buckets:
                graph = self.graphs[b]
                graph.replay()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(True)
                start.record(self.stream)
                for _ in range(replays):
                    graph.replay()
                end.record(self.stream)
                events.append((start, end))
        self.stream.synchronize()
        ms = [start.elapsed_time(end) / replays for start, end in events]
        # Every tensor-parallel rank must replay the same graphs (their collectives pair up).
        ms = self.model.tp.broadcast(
            torch.tensor(ms, dtype=torch.float64, device=self.input_ids.device)
        )
        self.replay_ms = ms.tolist()
        self.serve = cheapest_at_or_above(self.replay_ms)

    @property
    def stats(self) -> dict:
        """The replay time of each bucket and the buckets whose steps replay a larger graph."""
        return {
            "graph_replay_ms": {
                b: round(t, 3) for b, t in zip(self.buckets, self.replay_ms, strict=False)
            },
            "graph_buckets_replaced": {
                b: self.buckets[j]
                for i, (b, j) in enumerate(zip(self.buckets, self.serve, strict=True))
                if j != i
            },
        }

    def bucket_for(self, b: int) -> int:
        i = next(i for i, s in enumerate(self.buckets) if s >= b)
        return self.buckets[self.serve[i]]

    def warm_up_staging(self, tables: DeviceTables) -> None:
        """Compile the staging kernel now rather than at the run's first decode step."""
        with torch.cuda.stream(self.stream):
            self.warm_stage(tables.last_token, tables.block_table, self.input_ids, self.positions,
                            self.meta)  # fmt: skip
        self.stream.synchronize()

    @torch.inference_mode()
    def replay_step(
        self, inp: StepInputs, tables: DeviceTables, widen: bool = True
    ) -> torch.Tensor:
        """Float32 logits [b, vocab] of a decode step of b rows (16-bit when not `widen`), on the
        current stream: its inputs staged into the static buffers by one kernel (triton_stage.py),
        the bucket's graph replayed, the lm_head run on the step's own rows."""
        b = inp.positions.shape[0]
        bucket = self.bucket_for(b)
        self.stage(inp, tables.last_token, tables.block_table, self.input_ids, self.positions,
                   self.meta, bucket)  # fmt: skip
        self.graphs[bucket].replay()
        return self.model.compute_logits(self.hidden[:b], widen)
