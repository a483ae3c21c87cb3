"""CUDA graphs for steps with prefill (EngineConfig.mixed_graphs; on by default on one GPU):
everything but attention, captured in pieces.

A step with prefill (a mixed step: decoding rows beside prompt chunks) cannot replay a decode
graph: its attention's launch depends on the step's sequences. Launched eagerly, a step of 441
decoding rows and a 1,607-token chunk took the H200's host 32 ms in bf16 and 44 ms with FP8
weights (scripts/bench_eager_host.py, 857eb9d), more than an FP8 mixed step's GPU time (40 ms);
through these pieces 10 and 14 ms. Here only attention stays eager. The rest is cut at each
attention into num_layers + 1 pieces: piece 0 is the embeddings and layer 0's begin (norm, qkv,
rotary, KV write); piece i is layer i-1's end (o_proj, norm, MLP) and layer i's begin; the last
piece is the last layer's end and the final norm (llama.py: DecoderLayer.begin / end). Each
piece is captured once per token bucket (multiples of EngineConfig.mixed_graph_tokens up to
max_batch_tokens). A step of T tokens is padded to its bucket: padding tokens write no KV (slot
-1) and sit at position 0, and their rows are never read (attention covers the step's own
tokens, logits are gathered from them).

Pieces exchange their results through static buffers shared by every piece and bucket (the
queries, the attention output, the residual stream, the final hidden state), so no tensor of the
graphs' shared memory pool outlives a capture: the pool holds one piece's intermediates at a
time. The rotary launch, attention and the norm that adds the residual write the queries, the
attention output and the residual stream straight into theirs (no copy: in an 8,192-token step
of the 8B shape each copy took 32 us a layer on the H200, 83f9c25's kernel profile). On the CPU
the pieces run eagerly through the same buffers (tests).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from bulkgen.config import EngineConfig
from bulkgen.model.attention.metadata import AttnMetadata
from bulkgen.model.llama import LlamaForCausalLM


def token_buckets(max_tokens: int, step: int, most: int = 24) -> list[int]:
    """Multiples of step below max_tokens, and max_tokens itself; past `most` buckets the step
    grows (in multiples of 16) so that a large step budget does not capture hundreds of pieces'
    graphs more (each bucket is num_layers + 1 graphs and one eager pass at start-up)."""
    at_least = -(-max_tokens // most)  # ceil(max_tokens / most)
    step = max(step, -(-at_least // 16) * 16)
    return sorted({*range(step, max_tokens, step), max_tokens})


class MixedGraphs:
    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_cache: Sequence[tuple[torch.Tensor, ...]],
        max_tokens: int,
        step: int,
        device: torch.device,
        stream: torch.cuda.Stream | None,
        kv_partners: torch.Tensor | None = None,
        pool: tuple | None = None,
    ) -> None:
        """pool: a graph memory pool to share (the decode graphs', runner.py), else its own."""
        self.model, self.kv_cache, self.stream = model, kv_cache, stream
        self.kv_partners = kv_partners  # the device table the writes read (kv_pairs.py)
        self.buckets = token_buckets(max_tokens, step)
        n, cfg = self.buckets[-1], model.cfg
        dtype = model.model.embed_tokens.weight.dtype
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slots = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.q = torch.zeros(n, cfg.num_heads, cfg.head_dim, dtype=dtype, device=device)
        self.o = torch.zeros_like(self.q)
        self.residual = torch.zeros(n, cfg.hidden_size, dtype=dtype, device=device)
        self.hidden = torch.zeros_like(self.residual)
        self.pool = pool
        if pool is None and device.type == "cuda":
            self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.steps = 0  # steps run through the pieces (stats.json)

    @property
    def max_tokens(self) -> int:
        return self.buckets[-1]

    def bucket_for(self, tokens: int) -> int:
        return next(b for b in self.buckets if b >= tokens)

    def _piece(self, i: int, bucket: int) -> None:
        """Piece i at a bucket's size, from the static buffers into them."""
        model, layers = self.model, self.model.model.layers
        if i == 0:
            h, residual = model.model.embed_tokens(self.input_ids[:bucket]), None
        else:
            h, residual = layers[i - 1].end(self.o[:bucket], self.residual[:bucket])
        if i == len(layers):
            self.hidden[:bucket].copy_(model.final_norm(h, residual))
            return
        meta = self._write_meta(bucket)
        args = (self.positions[:bucket], meta, model.rotary, self.kv_cache[i])
        out = {"q_out": self.q[:bucket], "residual_out": self.residual[:bucket]}
        layers[i].begin(h, residual, *args, **out)

    def _write_meta(self, bucket: int) -> AttnMetadata:
        """What a layer's begin reads of the metadata: the slots its keys and values go to (and
        an fp8 cache's first-block partners)."""
        empty = self.slots[:0]
        args = (self.slots[:bucket], empty, empty, empty, 0, 0, False)
        return AttnMetadata(*args, kv_partners=self.kv_partners)

    @torch.inference_mode()
    def capture(self) -> None:
        """Each bucket's pieces, largest bucket first, in one shared memory pool (after one
        eager pass of them: kernels compile and cuBLAS picks its algorithms outside capture)."""
        pieces = len(self.model.model.layers) + 1
        for bucket in reversed(self.buckets):
            self.slots[:bucket].fill_(-1)  # the passes write nothing into the cache
            with torch.cuda.stream(self.stream):
                for i in range(pieces):
                    self._piece(i, bucket)
            self.stream.synchronize()
            graphs = []
            with torch.cuda.stream(self.stream):
                for i in range(pieces):
                    # capture_begin/end rather than torch.cuda.graph(), whose entry syncs the
                    # device and empties the allocator's cache (older torch: also gc.collect()),
                    # hundreds of times here.
                    graph = torch.cuda.CUDAGraph()
                    graph.capture_begin(self.pool)
                    try:
                        self._piece(i, bucket)
                    finally:
                        graph.capture_end()
                    graphs.append(graph)
            self.graphs[bucket] = graphs

    @torch.inference_mode()
    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttnMetadata
    ) -> torch.Tensor:
        """Hidden states [T, hidden] after the final norm of a step of T <= max_tokens tokens, on
        the current stream; a view of the static buffer, valid until the next step's run."""
        tokens = input_ids.shape[0]
        bucket = self.bucket_for(tokens)
        self.input_ids[:tokens].copy_(input_ids)
        self.positions[:tokens].copy_(positions)
        self.positions[tokens:bucket].zero_()
        self.slots[:tokens].copy_(meta.slot_mapping)
        self.slots[tokens:bucket].fill_(-1)
        layers = self.model.model.layers
        graphs = self.graphs.get(bucket)
        for i in range(len(layers) + 1):
            if i:
                attention = layers[i - 1].self_attn
                attention.attend(self.q[:tokens], meta, self.kv_cache[i - 1], out=self.o[:tokens])
            if graphs is not None:
                graphs[i].replay()
            else:
                self._piece(i, bucket)
        self.steps += 1
        return self.hidden[:tokens]


def resolve_mixed_graphs(cfg: EngineConfig, device: torch.device) -> bool:
    """EngineConfig.mixed_graphs as the engine runs it: unset means on for one CUDA device with
    cuda_graphs; off on the CPU (the pieces would only run eagerly there) and over several ranks
    (the pieces' collectives under capture have not run on GPUs)."""
    if cfg.mixed_graphs is not None:
        return cfg.mixed_graphs
    return device.type == "cuda" and cfg.cuda_graphs and cfg.tensor_parallel == 1


def mixed_graphs_for(
    model: LlamaForCausalLM,
    kv_cache: Sequence[tuple[torch.Tensor, ...]],
    cfg: EngineConfig,
    device: torch.device,
    stream: torch.cuda.Stream | None,
    kv_partners: torch.Tensor | None = None,
    pool: tuple | None = None,
) -> MixedGraphs | None:
    """The runner's pieces when cfg.mixed_graphs (captured on CUDA where cuda_graphs allows,
    run eagerly on the CPU), else None."""
    if not cfg.mixed_graphs or (device.type == "cuda" and not cfg.cuda_graphs):
        return None
    return MixedGraphs(
        model, kv_cache, cfg.max_batch_tokens, cfg.mixed_graph_tokens, device, stream, kv_partners,
        pool,
    )  # fmt: skip
