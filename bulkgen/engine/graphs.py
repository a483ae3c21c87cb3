"""CUDA graphs of whole decode steps: forward, logits and sampling, one replay per step.

Captured for padded batch-size buckets into one shared memory pool. A step is padded up to its
bucket: padding rows write no KV (slot -1), attend to one token of block 0 and their samples are
never read. Greedy steps replay the greedy variant; steps with temperature sampling (no top-k/p,
min-p filters, no logprobs) replay the sampling variant. Anything else runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bulkgen.engine.inputs import StepInputs
from bulkgen.engine.sampler import SamplingTensors, sample
from bulkgen.model.attention.metadata import AttnMetadata
from bulkgen.model.llama import LlamaForCausalLM


def bucket_sizes(max_seqs: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8, 16, 24, 32) if b < max_seqs]
    sizes += list(range(48, max_seqs, 16))
    return sorted(set(sizes + [max_seqs]))


class DecodeGraphs:
    def __init__(
        self,
        model: LlamaForCausalLM,
        max_seqs: int,
        max_blocks_per_seq: int,
        device: torch.device,
        stream: torch.cuda.Stream,
    ) -> None:
        self.model, self.stream = model, stream
        self.buckets = bucket_sizes(max_seqs)
        n = self.buckets[-1]

        def zeros(*shape, dtype=torch.int64):
            return torch.zeros(shape, dtype=dtype, device=device)

        self.input_ids, self.positions, self.slots = zeros(n), zeros(n), zeros(n)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.block_tables = zeros(n, max_blocks_per_seq, dtype=torch.int32)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.temperature = torch.ones(n, dtype=torch.float32, device=device)
        self.seeds, self.sample_positions = zeros(n), zeros(n)
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def capture(self, greedy: bool = True) -> None:
        for b in reversed(self.buckets):  # largest first, so smaller ones reuse its pool memory
            self._capture(b, greedy)

    def _step_fn(self, b: int, greedy: bool) -> Callable[[], torch.Tensor]:
        meta = AttnMetadata(
            slot_mapping=self.slots[:b],
            query_start_loc=self.query_start_loc[: b + 1],
            seq_lens=self.seq_lens[:b],
            block_tables=self.block_tables[:b],
            max_query_len=1,
            max_seq_len=0,  # unused by graph-safe decode attention
            decode_only=True,
        )
        zeros_i = torch.zeros(b, dtype=torch.int64, device=self.input_ids.device)
        st = SamplingTensors(
            temperature=self.temperature[:b],
            top_k=zeros_i,
            top_p=torch.ones_like(self.temperature[:b]),
            min_p=torch.zeros_like(self.temperature[:b]),
            seed=self.seeds[:b],
            position=self.sample_positions[:b],
            all_greedy=greedy,
            any_filter=False,
        )

        def run() -> torch.Tensor:
            hidden = self.model(self.input_ids[:b], self.positions[:b], meta)
            return sample(self.model.compute_logits(hidden), st)

        return run

    @torch.inference_mode()
    def _capture(self, b: int, greedy: bool) -> None:
        run = self._step_fn(b, greedy)
        with torch.cuda.stream(self.stream):
            self.slots[:b].fill_(-1)  # warm-up writes nothing into the cache
            run()  # compiles kernels and picks algorithms outside the capture
        self.stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            out = run()
        self.graphs[(b, greedy)] = (graph, out)

    def bucket_for(self, b: int) -> int | None:
        return next((s for s in self.buckets if s >= b), None)

    @torch.inference_mode()
    def replay(self, inp: StepInputs, input_ids: torch.Tensor, greedy: bool) -> torch.Tensor:
        """Run one decode step of len(input_ids) rows on the current (compute) stream."""
        b = input_ids.shape[0]
        bucket = self.bucket_for(b)
        if (bucket, greedy) not in self.graphs:
            self._capture(bucket, greedy)
        graph, out = self.graphs[(bucket, greedy)]
        w = inp.block_tables.shape[1]
        self.input_ids[:b].copy_(input_ids)
        self.positions[:b].copy_(inp.positions)
        self.slots[:b].copy_(inp.slot_mapping)
        self.slots[b:bucket].fill_(-1)
        self.seq_lens[:b].copy_(inp.seq_lens)
        self.seq_lens[b:bucket].fill_(1)
        self.block_tables[:b, :w].copy_(inp.block_tables)
        if not greedy:
            self.temperature[:b].copy_(inp.temperature)
            self.seeds[:b].copy_(inp.seeds)
            self.sample_positions[:b].copy_(inp.sample_positions)
        graph.replay()
        return out[:b]
