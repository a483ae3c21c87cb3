"""CUDA graphs of the decode forward pass: embeddings to the last hidden state, one replay per
decode step.

Only the model is captured. The lm_head (two kernels: the logits GEMM and its float32 cast),
sampling, filters, penalties, masks and logprobs run after the replay, so every sampling setting,
and every mix of settings in one batch, decodes from a graph. Captured for padded batch-size
buckets into one shared memory pool, where each graph keeps its output alive for the whole run:
a [bucket, hidden] state, where [bucket, vocab] float32 logits would hold some 6 GB for the 37
buckets of 1,024 rows at a 128K vocabulary. A step is padded up to its bucket: padding rows
write no KV (slot -1), attend to one token of a stale block and their logits are never computed.
The attention backend owns the static metadata buffers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from bulkgen.model.attention.metadata import AttnMetadata, DecodeGraphBuffers
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


class DecodeGraphs:
    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_cache: Sequence[tuple[torch.Tensor, torch.Tensor]],
        max_seqs: int,
        max_blocks_per_seq: int,
        device: torch.device,
        stream: torch.cuda.Stream,
    ) -> None:
        self.model, self.kv_cache, self.stream = model, kv_cache, stream
        self.buckets = bucket_sizes(max_seqs)
        n = self.buckets[-1]
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.meta = DecodeGraphBuffers(n, max_blocks_per_seq, device)
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

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
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            hidden = run()
        self.graphs[b] = (graph, hidden)

    def bucket_for(self, b: int) -> int:
        return next(s for s in self.buckets if s >= b)

    @torch.inference_mode()
    def replay(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttnMetadata
    ) -> torch.Tensor:
        """Float32 logits [b, vocab] of a decode step of b rows, on the current stream."""
        b = input_ids.shape[0]
        bucket = self.bucket_for(b)
        graph, hidden = self.graphs[bucket]
        self.input_ids[:b].copy_(input_ids)
        self.positions[:b].copy_(positions)
        self.meta.fill(meta, bucket)
        graph.replay()
        return self.model.compute_logits(hidden[:b])
