"""Model runner: owns the KV cache, the streams and the events; launches one step at a time.

launch(plan) enqueues the whole step without waiting for the device: inputs go host -> device on a
copy stream, the compute stream waits on that copy's event, runs forward and sampling, writes the
sampled ids to the previous-samples table (where the next step's decode inputs are gathered) and
copies them into pinned host memory, then records an event. Step.wait() on that event is the one
place the host waits for the device.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from bulkgen.config import EngineConfig, SamplingParams
from bulkgen.engine.graphs import DecodeGraphs
from bulkgen.engine.inputs import InputPacker, StepInputs
from bulkgen.engine.sampler import SamplingTensors, sample, top_logprobs
from bulkgen.engine.scheduler import Plan
from bulkgen.model.attention.metadata import AttnMetadata
from bulkgen.model.config import ModelConfig
from bulkgen.model.llama import LlamaForCausalLM


@dataclass
class StepResult:
    """Host values of one step's samples, in the order of plan.sampled."""

    ids: list[int]
    logprobs: list[float] | None = None
    top_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None


@dataclass
class Step:
    plan: Plan
    ids: torch.Tensor  # host (pinned) tensors, valid once `done` has fired
    logprob_tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    done: torch.cuda.Event | None

    def wait(self) -> StepResult:
        if self.done is not None:
            self.done.synchronize()
        result = StepResult(self.ids.tolist())
        if self.logprob_tensors is not None:
            chosen, top_ids, top_vals = self.logprob_tensors
            result.logprobs = chosen.tolist()
            result.top_ids, result.top_logprobs = top_ids.tolist(), top_vals.tolist()
        return result


def _plain_sampling(p: SamplingParams) -> bool:
    return p.logprobs is None and not p.filtered


def kv_bytes_per_block(mcfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.empty(0, dtype=dtype).element_size()
    return 2 * mcfg.num_layers * block_size * mcfg.num_kv_heads * mcfg.head_dim * elem


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
        dtype = next(model.parameters()).dtype
        shape = (mcfg.num_layers, 2, num_blocks, ecfg.block_size, mcfg.num_kv_heads, mcfg.head_dim)
        self.kv_cache = torch.empty(shape, dtype=dtype, device=device)
        model.bind_kv_cache(list(self.kv_cache[:, 0]), list(self.kv_cache[:, 1]))
        self.max_blocks_per_seq = -(-max_model_len // ecfg.block_size)
        self.packer = InputPacker(
            device,
            ecfg.block_size,
            ecfg.max_batch_tokens,
            ecfg.max_num_seqs,
            self.max_blocks_per_seq,
        )
        self.cuda = device.type == "cuda"
        self.copy_stream = torch.cuda.Stream(device) if self.cuda else None
        self.compute_stream = torch.cuda.Stream(device) if self.cuda else None
        self.prev_samples: torch.Tensor | None = None  # device ids sampled by the last step
        self.prev_rows: dict[int, int] = {}  # id(request) -> row in prev_samples
        self.graphs = None
        if graphs and self.cuda and ecfg.cuda_graphs and model.uses_graph_safe_attention:
            self.graphs = DecodeGraphs(
                model, ecfg.max_num_seqs, self.max_blocks_per_seq, device, self.compute_stream
            )
        self.out_turn = 0
        self.out_ids = [self._pinned(ecfg.max_num_seqs) for _ in range(2)]

    def _pinned(self, n: int) -> torch.Tensor:
        return torch.empty(n, dtype=torch.int64, pin_memory=self.cuda)

    def _stream_ctx(self):
        return torch.cuda.stream(self.compute_stream) if self.cuda else contextlib.nullcontext()

    @torch.inference_mode()
    def launch(self, plan: Plan) -> Step:
        packed = self.packer.pack(plan, self.prev_rows, self.copy_stream)
        sampled = plan.sampled
        with self._stream_ctx():
            if packed.ready is not None:
                self.compute_stream.wait_event(packed.ready)
            inp = packed.unpack()
            input_ids = self._gather_inputs(plan, inp)
            if self._graphable(plan):
                greedy = all(s.request.params.greedy for s in sampled)
                ids, lp = self.graphs.replay(inp, input_ids, greedy), None
            else:
                hidden = self.model(input_ids, inp.positions, self._metadata(plan, inp))
                ids, lp = self._sample(plan, inp, hidden)
            step = self._copy_out(plan, ids, lp)
        self.packer.release(packed, step.done)
        self.prev_samples = ids
        self.prev_rows = {id(s.request): i for i, s in enumerate(sampled)}
        return step

    def _graphable(self, plan: Plan) -> bool:
        """Decode steps whose every row samples without filters or logprobs replay a graph."""
        if self.graphs is None or not plan.decode_only or len(plan.seqs) > self.graphs.buckets[-1]:
            return False
        if len(plan.sampled) != len(plan.seqs):
            return False
        return all(_plain_sampling(s.request.params) for s in plan.seqs)

    def warm_up(self, plans: list[Plan]) -> None:
        """Run plans whose results are dropped (their fake requests write only their own blocks)."""
        for plan in plans:
            self.launch(plan).wait()
        self.prev_samples, self.prev_rows = None, {}

    def capture_graphs(self) -> None:
        """Both variants up front: a sampling variant captured on first use would stall the
        step loop once per batch bucket (the capture synchronises the stream)."""
        if self.graphs is not None:
            self.graphs.capture(greedy=True)
            self.graphs.capture(greedy=False)

    def _gather_inputs(self, plan: Plan, inp: StepInputs) -> torch.Tensor:
        """Decode inputs whose token is the previous step's sample are taken on the device."""
        if not any(s.from_prev for s in plan.seqs):
            return inp.input_ids
        prev = self.prev_samples[inp.prev_index.clamp(min=0)]
        return torch.where(inp.prev_index >= 0, prev, inp.input_ids)

    def _metadata(self, plan: Plan, inp: StepInputs) -> AttnMetadata:
        q_lens = [s.num_tokens for s in plan.seqs]
        seq_lens = [s.end for s in plan.seqs]
        return AttnMetadata(
            slot_mapping=inp.slot_mapping,
            query_start_loc=inp.query_start_loc,
            seq_lens=inp.seq_lens,
            block_tables=inp.block_tables,
            max_query_len=max(q_lens),
            max_seq_len=max(seq_lens),
            decode_only=plan.decode_only,
            query_lens_host=q_lens,
            seq_lens_host=seq_lens,
        )

    def _sample(self, plan: Plan, inp: StepInputs, hidden: torch.Tensor):
        sampled = plan.sampled
        if not sampled:
            return hidden.new_empty(0, dtype=torch.int64), None
        logits = self.model.compute_logits(hidden[inp.logits_indices])
        params = [s.request.params for s in sampled]
        st = SamplingTensors(
            temperature=inp.temperature,
            top_k=inp.top_k,
            top_p=inp.top_p,
            min_p=inp.min_p,
            seed=inp.seeds,
            position=inp.sample_positions,
            all_greedy=all(p.greedy for p in params),
            any_filter=any(p.filtered for p in params),
        )
        ids = sample(logits, st)
        want = [p.logprobs for p in params if p.logprobs is not None]
        lp = top_logprobs(logits, ids, max(want)) if want else None
        return ids, lp

    def _copy_out(self, plan: Plan, ids: torch.Tensor, lp) -> Step:
        n = ids.shape[0]
        if not self.cuda:
            return Step(plan, ids, lp, None)
        out = self.out_ids[self.out_turn][:n]
        self.out_turn ^= 1
        out.copy_(ids, non_blocking=True)
        lp_host = None
        if lp is not None:  # rare (--logprobs): pageable-size copies into fresh pinned memory
            lp_host = tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in lp)
            for h, t in zip(lp_host, lp, strict=True):
                h.copy_(t, non_blocking=True)
        done = torch.cuda.Event()
        done.record(self.compute_stream)
        return Step(plan, out, lp_host, done)
