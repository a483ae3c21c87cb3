"""Engine: the step loop over scheduler and runner. Token ids in, RequestOutputs out.

Asynchronous by default: step N+1 is planned and launched while step N runs on the device, and
only then does the host wait for N's sampled ids (the one wait per step) and apply them.
With async_loop=False the same code waits right after each launch (the `--sync` baseline).

A step with constrained rows (structured output) is launched in two parts: its forward pass at
once, then, after the wait for the previous step and its update (which advance the matchers), the
token masks are filled on the host while the device runs that forward, and its sampling is
enqueued with them. Steps without constrained rows take the one-launch path unchanged.
Only the thread that created the engine may call it: it owns the device.

With tensor_parallel N > 1 the engine is rank 0 of a group (engine/tp_group.py): it starts the
other N - 1 ranks, each an Engine of its own over its shard (engine/tp_worker.py) that replays
the steps this one plans.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import time

from bulkgen.config import EngineConfig, SamplingParams
from bulkgen.engine.alloc_counts import AllocatorCounts
from bulkgen.engine.blocks import BlockManager
from bulkgen.engine.engine_stats import engine_stats
from bulkgen.engine.gc_policy import freeze_startup_objects, release_dead_engines
from bulkgen.engine.gpu_gaps import StepGaps
from bulkgen.engine.grammar import GrammarCompiler, load_tokenizer
from bulkgen.engine.host_times import HostTimes
from bulkgen.engine.kv_sizing import size_kv_cache
from bulkgen.engine.mixed_graphs import resolve_mixed_graphs
from bulkgen.engine.model_files import model_context, model_dir, read_eos_ids, resolve_device
from bulkgen.engine.monitor import GpuMonitor
from bulkgen.engine.request import Request, RequestOutput
from bulkgen.engine.runner import ModelRunner, kv_bytes_per_block
from bulkgen.engine.scheduler import Scheduler
from bulkgen.engine.step import Step
from bulkgen.engine.step_series import Series
from bulkgen.engine.tp_group import RankGroup, RankSpec, join
from bulkgen.engine.tp_membership import leave_group
from bulkgen.engine.warmup import warmup_plans
from bulkgen.model.attention import get_backend, kv_pairs
from bulkgen.model.attention.kv_fp8 import check_kv_cache_dtype, resolve_kv_dtype
from bulkgen.model.attention.kv_layout import block_size_for, values_slots_inner
from bulkgen.model.config import ModelConfig
from bulkgen.model.fp8 import fp8_unsupported, resolve_fast_accum
from bulkgen.model.fp8_checkpoint import weight_quantization
from bulkgen.model.loader import load_model, resolve_dtype

log = logging.getLogger(__name__)


class Engine:
    def __init__(
        self, cfg: EngineConfig, model_config: dict | None = None, rank: RankSpec | None = None
    ) -> None:
        """model_config: a config.json dict, for dummy weights with no model folder. rank: set
        in a tensor-parallel rank other than 0 (tp_worker.py)."""
        self.group: RankGroup | None = None  # rank 0's other ranks, under tensor parallelism
        try:
            self._init(cfg, model_config, rank)
        except BaseException:
            if self.group is not None:
                try:
                    self.group.raise_failure(wait_s=2.0)  # a rank's death, if that was the cause
                finally:
                    self.group.close()
            raise

    def _init(self, cfg: EngineConfig, model_config: dict | None, rank: RankSpec | None) -> None:
        t0 = time.perf_counter()
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        release_dead_engines(self.device)
        check_kv_cache_dtype(cfg.kv_cache_dtype, self.device)  # before anything is loaded
        given_config = model_config
        if model_config is None:
            self.model_dir = model_dir(cfg.model)
            model_config = json.loads((self.model_dir / "config.json").read_text())
        else:
            self.model_dir = None
        mcfg = ModelConfig.from_dict(model_config)
        self.model_config = mcfg
        dummy = cfg.load_format == "dummy" or self.model_dir is None
        self.quantization = weight_quantization(model_config, cfg.quantization, dummy)
        if self.quantization is not None and (reason := fp8_unsupported(self.device)):
            raise ValueError(reason)  # before any work (no rank started yet)
        if cfg.batch_invariant and self.quantization is not None:
            raise ValueError(f"{cfg.model} holds FP8 weights: batch_invariant needs 16-bit ones")
        fast_accum = resolve_fast_accum(cfg.fp8_fast_accum, self.quantization)
        pairs = kv_pairs.resolve_pair_first(cfg.fp8_kv_pair_first_block, cfg.kv_cache_dtype)
        replace = dataclasses.replace  # the settings as resolved, which stats.json reports
        cfg = self.cfg = replace(cfg, fp8_fast_accum=fast_accum, fp8_kv_pair_first_block=pairs)
        self.tp, self.group, self.device = join(cfg, mcfg, given_config, rank, self.device)
        cfg = self.cfg = replace(cfg, mixed_graphs=resolve_mixed_graphs(cfg, self.device))
        self.dtype = resolve_dtype(cfg.dtype, self.device, mcfg)
        self.kv_dtype = resolve_kv_dtype(cfg.kv_cache_dtype, self.dtype)
        self.eos_token_ids = read_eos_ids(self.model_dir, model_config)
        self.max_model_len = model_context(cfg.max_model_len, mcfg.max_position_embeddings)
        backend = get_backend(cfg.attention, self.device, cfg.batch_invariant)
        if cfg.block_size is None:  # every rank resolves it alike: the same table
            slots_inner = values_slots_inner(self.kv_dtype, backend.fp8_v_slots_inner)
            cfg = self.cfg = dataclasses.replace(cfg, block_size=block_size_for(slots_inner))
        load_format = cfg.load_format if self.model_dir is not None else "dummy"
        model = load_model(
            self.model_dir,
            mcfg,
            backend,
            self.dtype,
            self.device,
            load_format,
            self.tp,
            cfg.quantization,
            cfg.batch_invariant,
            cfg.fp8_fast_accum,
        )
        mcfg = model.cfg  # this rank's shape: its KV heads size its cache
        # The monitor measures copy bandwidth with buffers of its own, before the cache is made.
        cuda0 = self.device.type == "cuda" and self.tp.rank == 0
        self.monitor = self._monitor(model, mcfg) if cuda0 else None
        self.kv_sizing = size_kv_cache(model, cfg, self.device, self.kv_dtype, self.max_model_len)
        num_blocks = self.kv_sizing.blocks
        self.runner = ModelRunner(model, mcfg, cfg, self.device, num_blocks, self.max_model_len)
        # Every rank runs the same warm-up plans and captures the same graphs: their collectives
        # meet. Only then does rank 0 send its steps to the others.
        if self.device.type == "cuda":
            self.runner.warm_up(warmup_plans(cfg, self.max_model_len, num_blocks), logits=True)
        self.runner.capture_graphs()
        self.runner.followers = self.group
        if self.group is not None:
            self.group.busy = False  # started: the watcher's backstop now covers steps only
        blocks = BlockManager.for_engine(num_blocks, cfg)
        log.info("KV cache: %s, %d tokens", self.kv_dtype_name, num_blocks * cfg.block_size)
        self.max_model_len = blocks.context_that_fits(self.max_model_len)
        self.scheduler = Scheduler(cfg, blocks, self.max_model_len, self.eos_token_ids)
        self._requests: dict[str, Request] = {}  # unfinished requests by id, for abort()
        self._watched: dict[str, Request] = {}  # the unfinished ones with stop strings
        self._rng = random.Random(cfg.seed)
        self._prev: Step | None = None
        self.tokenizer = None  # for grammars; else loaded from the model folder when first needed
        self._grammars: GrammarCompiler | None = None
        self.num_constrained = 0  # unfinished constrained requests: none, no mask work at all
        self.mask_s = Series()  # host seconds filling masks, per constrained step
        self.async_loop = cfg.async_loop  # settable, so one loaded engine can run both loops
        self.num_steps = 0
        self.host_times = HostTimes()  # each step's host time, by kind and phase (stats.json)
        self.allocator = AllocatorCounts(self.device)  # cudaMalloc and retries while running
        self.gaps = StepGaps()  # the GPU's idle time between steps, on its clock (CUDA)
        self.startup_s = time.perf_counter() - t0
        self.gc_pauses = freeze_startup_objects()  # and the collections after it (stats.json)

    def _monitor(self, model, mcfg: ModelConfig) -> GpuMonitor:
        embed = model.model.embed_tokens.weight.numel() * self.dtype.itemsize
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        # Decode gathers a few embedding rows, but reads the table in full when it is the head.
        weights -= 0 if model.lm_head is None else embed
        return GpuMonitor(self.device, weights, kv_bytes_per_block(mcfg, 1, self.kv_dtype))

    # ---- the interface the pipeline drives ------------------------------------------------

    def add(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        req = Request(str(request_id), tuple(prompt_ids), params, seed)
        if params.constrained:
            try:
                req.matcher = self.grammars.matcher(params)
                self.num_constrained += 1
            except ValueError as e:
                req.error = f"{e}"  # the request ends as an error record; the run goes on
        self._requests[req.request_id] = req
        if params.stop:
            self._watched[req.request_id] = req
        self.scheduler.add(req)

    def abort(self, request_id: str) -> None:
        req = self._requests.get(request_id)
        if req is not None:
            self.scheduler.abort(req)

    def take_progress(self) -> list[tuple[str, list[int]]]:
        """New output tokens of unfinished requests that have stop strings, since the last call.

        Stop strings are matched on text, off the engine thread: the pipeline detokenizes these
        increments elsewhere and calls abort() when one appears, so no decode step is wasted
        past it for long.
        """
        progress = []
        for req in self._watched.values():
            if len(req.output_ids) > req.num_streamed:
                progress.append((req.request_id, req.output_ids[req.num_streamed :]))
                req.num_streamed = len(req.output_ids)
        return progress

    @property
    def grammars(self) -> GrammarCompiler:
        if self._grammars is None:
            tokenizer = self.tokenizer or load_tokenizer(self.model_dir)
            vocab = self.model_config.vocab_size
            self._grammars = GrammarCompiler(tokenizer, vocab, self.eos_token_ids)
        return self._grammars

    @property
    def generated_tokens(self) -> int:
        """Tokens generated so far (read by the progress bar from its own thread)."""
        return self.scheduler.num_generated

    @property
    def num_unfinished(self) -> int:
        return len(self._requests)

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def step(self) -> list[RequestOutput]:
        """One step of the loop; returns the requests that finished during it."""
        if self.group is None:
            return self._step()
        with self.group.stepping():  # a rank's death raises RankFailed here
            return self._step()

    def _step(self) -> list[RequestOutput]:
        t0 = time.perf_counter()
        plan = self.scheduler.schedule()
        t_scheduled, cpu_scheduled = time.perf_counter(), time.thread_time()
        launched = forward = None
        if plan:
            self.num_steps += 1
            if self.num_constrained and any(s.request.matcher for s in plan.sampled):
                forward = self.runner.forward(plan)  # its sampling waits for the masks below
            else:
                launched = self.runner.launch(plan)
            if self.monitor is not None:
                self.monitor.step(plan.decode_only, sum(s.end for s in plan.seqs))
        if not self.async_loop:
            self._prev, launched = launched, None
        t_launched, cpu_launched = time.perf_counter(), time.thread_time()
        waited = self._apply_prev()
        if forward is not None:
            t_mask = time.perf_counter()  # N applied (matchers advanced); N+1's forward runs
            words = self.runner.mask_words(len(plan.sampled))
            self.grammars.fill_masks(plan.sampled, words.numpy())
            self.mask_s.append(time.perf_counter() - t_mask)
            self._prev = self.runner.sample(forward, words)
            if not self.async_loop:
                waited += self._apply_prev()
        else:
            self._prev = launched
        done = self.scheduler.take_finished()
        for out in done:
            req = self._requests.pop(out.request_id, None)
            self._watched.pop(out.request_id, None)
            self.num_constrained -= req is not None and req.matcher is not None
        if not self._requests:
            self.gaps.pause()  # the engine ran dry: a generate() call's end, a pipeline's wait
        if plan:
            phases = (t_scheduled - t0, t_launched - t_scheduled)
            phases += (time.perf_counter() - t_launched - waited,)
            self.host_times.record(plan.decode_only, phases, cpu_launched - cpu_scheduled)
        return done

    def _apply_prev(self) -> float:
        """Wait for the launched step (the one host wait of a step), apply its ids; seconds."""
        if self._prev is None:
            return 0.0
        prev, self._prev = self._prev, None
        t_wait = time.perf_counter()
        prev.synchronize()
        waited = time.perf_counter() - t_wait
        self.gaps.add(prev)
        self.scheduler.update(prev.plan, prev.wait())
        return waited

    @property
    def stats(self) -> dict:
        return engine_stats(self)

    @property
    def kv_dtype_name(self) -> str:
        return str(self.kv_dtype).removeprefix("torch.")

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        if self.group is not None and self.group.failure is not None:
            self._prev = None  # its device work waits on a dead rank: never to be waited for
        try:
            if self._prev is not None:
                self._prev.wait()
                self._prev = None
        finally:
            if self.group is not None:
                self.group.close()
                self.group = None
            elif self.tp.size > 1:
                leave_group()
