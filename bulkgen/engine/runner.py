"""Model runner: owns the KV cache, the streams and the events; launches one step at a time.

launch(plan) enqueues the whole step without waiting for the device (as forward(plan) then
sample(forward): the engine enqueues a constrained step's sampling later, once its token masks are
on the host): inputs go to the device on a copy stream, the compute stream waits for that copy,
applies the step's block-table appends, runs the forward (a CUDA graph replay for decode steps) and
sampling, writes the sampled ids to the device's last-token table (the next step's decode inputs
come from it) and copies them into pinned host memory, then records an event. Step.wait() on it is
the host's one wait for the device. The KV cache is the runner's, passed to every forward.

Under tensor parallelism every rank has a runner over its own shard and KV heads. Rank 0's runs
the steps its scheduler plans and sends each packed step to the other ranks (`followers`), whose
runners replay it (forward_packed) with the same collectives in the same order; rank 0 alone
samples, and broadcasts the sampled ids so every rank's last-token table stays the same.
"""

from __future__ import annotations

import contextlib

import torch

from bulkgen.config import EngineConfig
from bulkgen.engine.gpu_gaps import mark
from bulkgen.engine.graphs import DecodeGraphs
from bulkgen.engine.host_out import HostOut
from bulkgen.engine.inputs import InputPacker, PackedStep, StepInputs
from bulkgen.engine.mixed_graphs import mixed_graphs_for
from bulkgen.engine.penalty_state import PenaltyState
from bulkgen.engine.plan import Plan
from bulkgen.engine.sampler import SamplingTensors, sample, top_logprobs, unpack_bitmask
from bulkgen.engine.step import Forward, Step
from bulkgen.engine.tables import DeviceTables
from bulkgen.engine.warmup import warm_logits
from bulkgen.model.attention.kv_fp8 import resolve_kv_dtype
from bulkgen.model.attention.kv_int8 import INT8_DTYPE, scale_bytes_per_token
from bulkgen.model.attention.kv_layout import allocate_kv_cache, values_slots_inner
from bulkgen.model.config import ModelConfig
from bulkgen.model.llama import LlamaForCausalLM
from bulkgen.model.parallel_layers import TensorParallel


def kv_bytes_per_block(mcfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of keys and values for block_size tokens in a cache of this dtype (fp8: half of
    bf16's, so the same memory holds twice the blocks; int8: the same plus its scales)."""
    elem = dtype.itemsize
    values = 2 * mcfg.num_layers * block_size * mcfg.num_kv_heads * mcfg.head_dim * elem
    if dtype == INT8_DTYPE:
        return values + block_size * scale_bytes_per_token(mcfg.num_layers, mcfg.num_kv_heads)
    return values


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        mcfg: ModelConfig,
        ecfg: EngineConfig,
        device: torch.device,
        num_blocks: int,
        max_model_len: int,
        graphs: bool = True,
    ) -> None:
        self.model, self.mcfg, self.ecfg, self.device = model, mcfg, ecfg, device
        self.tp: TensorParallel = model.tp
        self.followers = None  # rank 0's channel to the other ranks (engine/tp_group.py)
        self.attention = model.attention
        dtype = resolve_kv_dtype(ecfg.kv_cache_dtype, model.model.embed_tokens.weight.dtype)
        # kv: per layer (k, v) views, and an int8 cache's scales (k_s, v_s) after them
        self.kv_cache, self.kv_scales, self.kv = allocate_kv_cache(
            mcfg.num_layers,
            num_blocks,
            ecfg.block_size,
            mcfg.num_kv_heads,
            mcfg.head_dim,
            dtype,
            device,
            v_slots_inner=values_slots_inner(dtype, self.attention.fp8_v_slots_inner),
            k_heads_outer=self.attention.k_heads_outer,
        )
        self.max_blocks_per_seq = -(-max_model_len // ecfg.block_size)
        self.packer = InputPacker(
            device,
            ecfg.block_size,
            ecfg.max_batch_tokens,
            ecfg.seq_rows,
            self.max_blocks_per_seq,
        )
        pair_blocks = num_blocks if ecfg.fp8_kv_pair_first_block else 0  # kv_pairs.py
        self.tables = DeviceTables(ecfg.seq_rows, self.max_blocks_per_seq, device, pair_blocks)
        partners = self.tables.partners
        self.penalties = PenaltyState(ecfg.seq_rows, mcfg.vocab_size, device)
        self.fused_sample = None  # Triton is a GPU dependency only: imported on CUDA
        if device.type == "cuda":
            from bulkgen.engine.triton_sampler import fused_sample

            self.fused_sample = fused_sample
        self.cuda = device.type == "cuda"
        self.copy_stream = torch.cuda.Stream(device) if self.cuda else None
        self.compute_stream = torch.cuda.Stream(device) if self.cuda else None
        # Decode graphs and the mixed steps' pieces share one memory pool: neither keeps a tensor
        # of it past a capture, one replays at a time (kv_sizing.py reserves the larger's needs).
        pool = torch.cuda.graph_pool_handle() if graphs and self.cuda else None
        self.graphs = None
        if graphs and self.cuda and ecfg.cuda_graphs and self.attention.graph_safe:
            self.graphs = DecodeGraphs(model, self.kv, ecfg.graph_rows, self.max_blocks_per_seq,
                                       device, self.compute_stream, partners, pool)  # fmt: skip
        # Steps with prefill: pieces around attention in CUDA graphs (EngineConfig.mixed_graphs).
        self.mixed_graphs = None
        if graphs:
            args = (model, self.kv, ecfg, device, self.compute_stream, partners, pool)
            self.mixed_graphs = mixed_graphs_for(*args)
        self.graph_steps = 0  # decode steps replayed from a graph
        self.eager_decode_steps = 0  # decode steps that ran eagerly (reported in stats.json)
        self.out_turn = 0
        self.host_out = [HostOut(ecfg.seq_rows, self.cuda) for _ in range(2)]
        self.mask_host: torch.Tensor | None = None  # allocated at the first constrained step
        self.mask_device: torch.Tensor | None = None

    def _stream_ctx(self):
        return torch.cuda.stream(self.compute_stream) if self.cuda else contextlib.nullcontext()

    def launch(self, plan: Plan) -> Step:
        """Forward and sampling of one step, enqueued back to back."""
        return self.sample(self.forward(plan))

    def forward(self, plan: Plan) -> Forward:
        """Enqueue the step's forward pass; sample() enqueues its sampling (with a mask)."""
        packed = self.packer.pack(plan, self.copy_stream)
        if self.followers is not None:
            self.followers.send(packed)
        return self.forward_packed(packed, plan)

    @torch.inference_mode()
    def forward_packed(self, packed: PackedStep, plan: Plan | None) -> Forward:
        """The forward pass of a packed step (plan None: a follower's copy of rank 0's step)."""
        with self._stream_ctx():
            if packed.ready is not None:
                self.compute_stream.wait_event(packed.ready)
            begin = mark(self.compute_stream) if self.cuda and plan else None  # gpu_gaps.py
            inp = packed.unpack()
            self.tables.apply_updates(inp)
            self.penalties.reset(packed.fresh_penalized)
            widen = packed.float_logits(self.ecfg.batch_invariant)
            if self._graphable(packed):
                self.graph_steps += 1
                logits = self.graphs.replay_step(inp, self.tables, widen)
                return Forward(plan, packed, inp, logits, begin)
            input_ids = self.tables.input_ids(inp, packed.from_prev)
            meta = self.attention.metadata(
                inp.slot_mapping,
                inp.query_start_loc.int(),
                inp.seq_lens.int(),
                self.tables.block_tables(inp),
                packed.query_lens,
                packed.seq_lens,
                self.tables.partners,
            )
            self.eager_decode_steps += meta.decode_only
            pieces = self.mixed_graphs
            if pieces is not None and input_ids.shape[0] <= pieces.max_tokens:
                hidden = pieces.run(input_ids, inp.positions, meta)
            else:
                hidden = self.model(input_ids, inp.positions, meta, self.kv)
            logits = None
            if packed.sizes[2]:  # rows that sample
                logits = self.model.compute_logits(hidden[inp.logits_indices], widen)
        return Forward(plan, packed, inp, logits, begin)

    @torch.inference_mode()
    def sample(self, fwd: Forward, mask: torch.Tensor | None = None) -> Step:
        """Enqueue the sampling of a forward. mask: host int32 words [len(plan.sampled), W]
        from mask_words(), the allowed tokens of each sampled row."""
        if self.tp.rank > 0:
            return self._follow_sample(fwd)
        with self._stream_ctx():
            allowed = None
            if mask is not None:
                allowed = mask
                if self.cuda:  # stream order: sampled after the upload, reused after `done`
                    allowed = self.mask_device[: mask.shape[0]]
                    allowed.copy_(mask, non_blocking=True)
            ids, lp = self._sample(fwd.packed, fwd.inp, fwd.logits, allowed)
            if self.tp.size > 1 and ids.numel():
                self.tp.broadcast(ids)  # the other ranks' last-token tables
            self.tables.record(fwd.inp, ids)
            step = self._copy_out(fwd, ids, lp)
        self.packer.release(fwd.packed, step.done)
        return step

    def _follow_sample(self, fwd: Forward) -> Step:
        """A rank other than 0: rank 0's sampled ids into the last-token table."""
        with self._stream_ctx():
            ids = self.tables.last_token.new_empty(fwd.packed.sizes[2])
            if ids.numel():
                self.tp.broadcast(ids)
            self.tables.record(fwd.inp, ids)
            done = None
            if self.cuda:
                done = torch.cuda.Event()
                done.record(self.compute_stream)
        self.packer.release(fwd.packed, done)
        return Step(fwd.plan, ids, None, done)

    def mask_words(self, rows: int) -> torch.Tensor:
        """The host (pinned) mask buffer's first rows. One buffer serves every step: the engine
        fills it for step N+1 only after step N, the last reader of its copy, has completed."""
        if self.mask_host is None:
            words = -(-self.mcfg.vocab_size // 32)
            shape = (self.ecfg.seq_rows, words)
            self.mask_host = torch.empty(shape, dtype=torch.int32, pin_memory=self.cuda)
            if self.cuda:
                self.mask_device = torch.empty(shape, dtype=torch.int32, device=self.device)
        return self.mask_host[:rows]

    def _graphable(self, packed: PackedStep) -> bool:
        """Decode steps whose every row samples replay a graph, whatever their sampling."""
        if self.graphs is None or not self.graphs.graphs:
            return False  # warm-up runs before the capture: its decode steps run eagerly
        tokens, seqs, sampled, _ = packed.sizes
        return tokens == seqs <= self.graphs.max_batch and sampled == seqs

    def warm_up(self, plans: list[Plan], logits: bool = False) -> None:
        """Run plans whose results are dropped (their fake requests write only their own blocks
        and table rows); `logits`: then the lm_head at every sampled row count (warm_logits)."""
        for plan in plans:
            self.launch(plan).wait()
        if logits and self.cuda:
            warm_logits(self.model, self.ecfg.seq_rows, self.compute_stream)
        self.graph_steps = self.eager_decode_steps = 0  # stats count the engine's own steps
        if self.mixed_graphs is not None:
            self.mixed_graphs.steps = 0

    def capture_graphs(self) -> None:
        # The pieces first: the decode graphs' smaller intermediates then reuse the pool's
        # segments the pieces' largest bucket made, rather than segments of their own beside them.
        if self.mixed_graphs is not None and self.cuda:
            self.mixed_graphs.capture()
        if self.graphs is not None:
            self.graphs.capture()
            self.graphs.calibrate()
            self.graphs.warm_up_staging(self.tables)  # its kernel compiled before the first step

    def _sample(
        self,
        packed: PackedStep,
        inp: StepInputs,
        logits: torch.Tensor | None,
        allowed: torch.Tensor | None,
    ):
        """Penalties, then sampling (the fused Triton sampler on CUDA, the torch reference
        elsewhere) restricted to the allowed tokens; logprobs are those of the model's own
        distribution (before penalties and mask). The choices of path read the step's distinct
        sampling parameters (packed.sampled_params), not every row's."""
        if not packed.sizes[2]:
            return inp.seeds.new_empty(0), None
        params = packed.sampled_params
        scores = logits
        if any(p.penalized for p in params):
            scores = self.penalties.apply(logits, inp)
        all_greedy = all(p.greedy for p in params)
        if self.fused_sample is not None and (allowed is not None or not all_greedy):
            ids = self.fused_sample(scores, inp.temperature, inp.top_k, inp.top_p, inp.min_p,
                                    inp.seeds, inp.sample_positions, allowed=allowed)  # fmt: skip
        else:
            st = SamplingTensors(
                temperature=inp.temperature,
                top_k=inp.top_k,
                top_p=inp.top_p,
                min_p=inp.min_p,
                seed=inp.seeds,
                position=inp.sample_positions,
                all_greedy=all_greedy,
                any_filter=any(p.filtered for p in params),
            )
            mask = None if allowed is None else unpack_bitmask(allowed, scores.shape[-1])
            ids = sample(scores, st, mask)
        if self.penalties.active:
            self.penalties.record(inp, ids)
        want = [p.logprobs for p in params if p.logprobs is not None]
        invariant = self.ecfg.batch_invariant
        lp = top_logprobs(logits, ids, max(want), batch_invariant=invariant) if want else None
        return ids, lp

    def _copy_out(self, fwd: Forward, ids: torch.Tensor, lp) -> Step:
        n = ids.shape[0]
        if not self.cuda:
            return Step(fwd.plan, ids, lp, None)
        host = self.host_out[self.out_turn]
        self.out_turn ^= 1
        out = host.ids[:n]
        out.copy_(ids, non_blocking=True)
        lp_host = None
        if lp is not None:
            lp_host = host.logprobs(n, lp[1].shape[1])
            for h, t in zip(lp_host, lp, strict=True):
                h.copy_(t, non_blocking=True)
        done = mark(self.compute_stream)
        return Step(fwd.plan, out, lp_host, done, fwd.begin)
