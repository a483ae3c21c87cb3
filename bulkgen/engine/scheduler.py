"""Scheduler: which tokens of which requests the next step computes, and what their results mean.

schedule() -> Plan runs while the previous step is still on the device (the one-step lag of the
async loop), so a decoding request's newest token may not be on the host yet: it is "pending",
and the runner gathers it on the device from the previous step's output. update(plan, ids) then
applies a step's sampled ids. A request that finished at step N is computed once more at N+1;
its token is discarded in update.

Admission (engine/admission.py) takes a waiting request only when the cache can carry it to its
horizon beside every running request's own, so preemption is a safety valve, not a steady state.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from bulkgen.config import EngineConfig
from bulkgen.engine.admission import Admission
from bulkgen.engine.blocks import BlockManager
from bulkgen.engine.plan import Plan, ScheduledSeq
from bulkgen.engine.request import Request, RequestOutput, Status
from bulkgen.engine.token_logprobs import LogprobRecorder

if TYPE_CHECKING:
    from bulkgen.engine.step import StepResult


class Scheduler:
    def __init__(
        self, cfg: EngineConfig, blocks: BlockManager, max_model_len: int, eos_ids: list[int]
    ) -> None:
        self.cfg = cfg
        self.blocks = blocks
        self.max_model_len = max_model_len
        self.eos_ids = frozenset(eos_ids)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the last is preempted first
        # Rows of the runner's device tables, one per running request. A row freed at update(N)
        # is reused at N+2 at the earliest; the runner writes rows on its compute stream only,
        # after step N+1 (which may still read the old contents) in stream order.
        self.free_rows = list(range(cfg.seq_rows - 1, -1, -1))
        self.admission = Admission(cfg, blocks, max_model_len)
        # The room (admission.room) when the head of the queue last failed to be admitted: it is
        # tried again only once room has grown (no prefix lookups every step while it waits).
        self._blocked_room: int | None = None
        self.max_running = 0  # the most requests that ran at once (stats.json)
        self.finished: list[RequestOutput] = []
        self.num_preemptions = 0
        self.num_recomputed = 0  # tokens computed again after preemptions (stats.json)
        self.num_generated = 0  # tokens appended to outputs (read by progress and benchmarks)
        # Prompt tokens that requests took from the prefix cache at their first admission.
        self.num_cached_tokens = 0

    # ---- adding and ending requests -------------------------------------------------------

    def add(self, req: Request) -> None:
        problem = self._admission_problem(req)
        if problem:
            req.error = problem
            self._finish(req, "error")
            return
        self.admission.arrive(req)
        self.waiting.append(req)

    def _admission_problem(self, req: Request) -> str | None:
        if req.error:
            return req.error  # found before the scheduler saw it (its grammar, for one)
        n = len(req.prompt_ids)
        if n == 0:
            return "empty prompt: it has no tokens"
        if n >= self.max_model_len:
            return (
                f"prompt is {n} tokens; the context is {self.max_model_len} tokens (the model's, "
                "or all the KV cache holds; prompt plus at least one generated token must fit): "
                "shorten the prompt"
            )
        if self.blocks.cost(n + 1) > self.blocks.num_blocks:
            capacity = self.blocks.num_blocks * self.blocks.block_size
            return (
                f"prompt is {n} tokens; the KV cache holds only {capacity} tokens: "
                "give the cache more memory or shorten the prompt"
            )
        return None

    def abort(self, req: Request) -> None:
        """End a request now with what it has (a stop string was found off the engine thread)."""
        if not req.is_finished:
            self._finish(req, "stop")

    def _finish(self, req: Request, reason: str) -> None:
        req.finish_reason = reason
        req.status = Status.FINISHED
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._release(req)
        self.admission.finished(req)
        self._blocked_room = None
        self.finished.append(req.to_output())

    def _release(self, req: Request) -> None:
        # Tail first: least-recently-freed eviction then takes a cached chain from its end, not its
        # root (which would strand every block after it).
        self.admission.release(req)
        self.blocks.free(req.block_ids[::-1])
        req.block_ids = []
        if req.table_row is not None:
            self.free_rows.append(req.table_row)
            req.table_row, req.num_synced_blocks = None, 0
        req.num_hashed_blocks, req.last_key = 0, None

    def take_finished(self) -> list[RequestOutput]:
        done, self.finished = self.finished, []
        return done

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    # ---- planning --------------------------------------------------------------------------

    def _reserve(self, req: Request, end: int) -> bool:
        if end <= len(req.block_ids) * self.blocks.block_size:
            return True  # the common decode case: the token fits in the last block
        need = self.blocks.cost(end) - self.blocks.held(req.block_ids)  # >= 1: end is past them
        if need > self.blocks.num_free:
            return False
        owed = self.admission.owed(req)
        req.block_ids += self.blocks.allocate(need, first=not req.block_ids)
        self.admission.allocated(req, owed)
        return True

    def _preempt(self, req: Request) -> None:
        """Drop a request's cache and send it back to the front of the queue to recompute."""
        self.running.remove(req)
        self._release(req)
        req.num_computed = 0
        req.status = Status.WAITING
        self.waiting.appendleft(req)
        self._blocked_room = None
        self.num_preemptions += 1

    def schedule(self) -> Plan:
        plan = Plan()
        budget = self.cfg.max_batch_tokens
        # Running requests first, oldest first: a decode step (or the rest of a chunked prefill);
        # the per-row work of every step, in locals (_reserve only past the request's last block).
        running, seqs, max_len = self.running, plan.seqs, self.max_model_len
        bs = self.blocks.block_size
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            generated = len(req.output_ids) + req.num_pending
            total = len(req.prompt_ids) + generated  # req.num_tokens
            if generated >= req.params.max_tokens or total >= max_len:
                i += 1  # known at plan time: the tokens in hand and in flight reach a limit
                continue
            computed = req.num_computed
            n = min(total - computed, budget)
            if computed + n > len(req.block_ids) * bs:
                while not self._reserve(req, computed + n):
                    self._preempt(victim := running[-1])
                    if victim is req:
                        break
                if req.status is not Status.RUNNING:
                    break  # req preempted itself: nothing newer is left to run
            seqs.append(self._scheduled(req, n, total))
            budget -= n
            i += 1
        # Then admit waiting requests while seats, budget and the horizon rule allow.
        admission = self.admission
        while self.waiting and budget > 0 and len(self.running) < admission.cap:
            req = self.waiting[0]
            if req.num_pending:
                break  # its last token is still in flight; it can be admitted after update()
            if self._blocked_room is not None and admission.room <= self._blocked_room:
                break  # nothing has freed since it last failed
            self._take_cached_prefix(req)
            n = min(req.num_tokens - req.num_computed, budget)
            if not admission.admit(req) or not self._reserve(req, req.num_computed + n):
                self._release(req)
                req.num_computed = 0
                self._blocked_room = admission.room
                break
            self._blocked_room = None
            self.waiting.popleft()
            if not req.admitted:  # counted once: not for failed attempts, nor after preemption
                req.admitted, req.num_cached_tokens = True, req.num_computed
                self.num_cached_tokens += req.num_computed
            req.status = Status.RUNNING
            req.table_row = self.free_rows.pop()
            self.running.append(req)
            self.max_running = max(self.max_running, len(self.running))
            plan.seqs.append(self._scheduled(req, n))
            budget -= n
        if not plan.seqs and not self.running and self.waiting and not self.waiting[0].num_pending:
            # Nothing runs, so every block is free, and still it does not fit: it never will. It
            # ends at the length it reached (its prompt alone was checked to fit at admission).
            self._finish(self.waiting[0], "length")
        plan.partners = self.blocks.take_partner_changes() if plan.seqs else {}  # sent with it
        return plan

    def _take_cached_prefix(self, req: Request) -> None:
        """Reuse cached blocks for the longest known prefix (never the last token: it must be
        computed to sample from it)."""
        max_blocks = (req.num_tokens - 1) // self.blocks.block_size
        hits = self.blocks.lookup(req.all_token_ids, max_blocks)
        if not hits:
            return
        req.block_ids = hits
        req.num_computed = len(hits) * self.blocks.block_size
        req.num_hashed_blocks, req.last_key = len(hits), self.blocks.key_of(hits[-1])

    def _register_full_blocks(self, req: Request) -> None:
        """Offer the prefix cache every block whose tokens are known and whose KV is computed
        (or being computed by a launched step: later steps run after it on the device)."""
        if not self.blocks.prefix_cache:
            return
        bs = self.blocks.block_size
        known = min(req.num_computed, len(req.prompt_ids) + len(req.output_ids))
        while req.num_hashed_blocks < known // bs:
            i = req.num_hashed_blocks
            tokens = tuple(req.token_slice(i * bs, (i + 1) * bs))
            req.last_key = self.blocks.register(req.block_ids[i], req.last_key, tokens)
            req.num_hashed_blocks += 1

    def _scheduled(self, req: Request, n: int, num_tokens: int | None = None) -> ScheduledSeq:
        """n tokens of req from its first uncomputed one (num_tokens: req.num_tokens, if known)."""
        start = req.num_computed
        end = start + n
        sample = end == (req.num_tokens if num_tokens is None else num_tokens)
        pending = req.num_pending
        from_prev = pending > 0 and sample
        assert not (pending and n > 1), "a pending token is only ever decoded alone"
        req.num_computed = end
        if start < req.max_computed:
            self.num_recomputed += min(end, req.max_computed) - start
        if end > req.max_computed:
            req.max_computed = end
        if sample:
            req.num_pending = pending + 1
        if end // self.blocks.block_size > req.num_hashed_blocks:  # a block may be full
            self._register_full_blocks(req)
        return ScheduledSeq(req, start, n, sample, from_prev)

    # ---- applying a step's results ---------------------------------------------------------

    def update(self, plan: Plan, result: StepResult) -> None:
        bs, eos, max_len = self.blocks.block_size, self.eos_ids, self.max_model_len
        generated = 0
        for row, (seq, token) in enumerate(zip(plan.sampled, result.ids, strict=True)):
            req = seq.request
            req.num_pending -= 1
            if req.status is Status.FINISHED:
                continue  # finished at the previous step: this extra token is discarded
            (out := req.output_ids).append(token)
            generated += 1
            if req.num_computed // bs > req.num_hashed_blocks:  # a block may be full
                self._register_full_blocks(req)
            params, matcher = req.params, req.matcher
            if params.logprobs is not None:
                self._record_logprobs(req, result, row)
            if matcher is not None and not matcher.advance(token):
                # The mask allows only what the matcher accepts: a bug, kept to this row.
                req.error = f"grammar rejected sampled token {token}: {matcher.error}"
                self._finish(req, "error")
                continue
            if (  # anything _stop_reason could stop on (most rows: none)
                token in eos
                or token in params.stop_token_ids
                or matcher is not None
                or len(out) >= params.max_tokens
                or len(req.prompt_ids) + len(out) >= max_len
            ):
                reason = self._stop_reason(req, token)
                if reason:
                    self._finish(req, reason)
        self.num_generated += generated

    @staticmethod
    def _record_logprobs(req: Request, result: StepResult, row: int) -> None:
        if req.logprobs is None:
            req.logprobs = LogprobRecorder(req.params.logprobs)
        req.logprobs.append(result.logprobs[row], *result.top(row, req.logprobs.k))

    def _stop_reason(self, req: Request, token: int) -> str | None:
        params = req.params
        if not params.ignore_eos and token in self.eos_ids:
            return "stop"
        if token in params.stop_token_ids:
            return "stop"
        if req.matcher is not None and req.matcher.is_done:
            return "stop"  # the grammar is complete: before the length checks, it wins a tie
        if len(req.output_ids) >= params.max_tokens:
            return "length"
        if len(req.prompt_ids) + len(req.output_ids) >= self.max_model_len:
            return "length"
        return None
