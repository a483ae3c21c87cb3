"""Admission: take a waiting request only when the KV cache can carry it to its horizon.

Admitting a request when its first chunk fits, and preempting when the cache runs out, thrashes
at large batch sizes: every running request grows by a token a step, the cache fills, the newest
requests are dropped and recomputed, and they are admitted again as soon as blocks free up
(issue 16: 1,000 tokens in and out at 512 seats ran at half the speed of 256).

The rule. A running request r has a horizon: the length its KV is expected to reach,

    H_r = L_r + ceil(s_r * R_r)

where L_r is its length when the horizon is set (prompt plus output so far), R_r the output it
may still generate (max_tokens, bounded by the model's context) and s_r the share of it that is
reserved. Admission keeps a running total of the blocks that running requests still owe to
their horizons, promised = sum over r of max(0, blocks(H_r) - blocks r holds), and admits a
request w only when

    owed(w) + promised <= free blocks,

so every admitted request can reach its horizon whatever the others do. A request that reaches
its horizon with output left gets a new one (its length now plus the share of what remains):
what it will still need keeps new admissions out, rather than being taken later from requests
admitted after it. Preemption (by recompute, newest first) stays as the safety valve for
requests that outgrow their horizon while the cache is full.

The share s_r is 1 when a request's length is known (ignore_eos with no stop token, stop string
or grammar: it runs to max_tokens), which makes admission TensorRT-LLM's "guaranteed no evict"
for such requests: a batch of them is never preempted. Otherwise it is learned from finished
requests: the 75th percentile of the share of its output budget each used, with a prior of a few
requests that used all of theirs, so that the first wave is admitted as if lengths were known.
A higher quantile leaves more of the cache idle, a lower one preempts more when a long tail
follows short requests (scripts/sim_admission.py compares them on synthetic workloads).
EngineConfig.output_reserve fixes the share instead (0: promise nothing and admit when the
first chunk fits, as vLLM does).

Costs: O(1) per admission attempt, per block allocated and per request finished; nothing per
running request per step.

max_num_seqs="auto" takes the batch-size cap from the same projection: the cache's blocks over
the mean projected blocks of the requests that have arrived, bounded by its ceiling and
max_batch_tokens (EngineConfig.seq_rows), the widest decode graph. The ceiling is
EngineConfig.auto_max_num_seqs (AUTO_MAX_NUM_SEQS by default). A fixed lower ceiling was tried
(256 rows for 16-bit GEMMs, 5ba166a) and dropped: on the H200 it won on 1,000 equal-length
requests (9,720 tok/s against 9,154 for auto at 441 rows), but 441 rows made waves of 441, 441
and 118 requests there, and where the waves came out even more rows won (400 requests: 9,254 at
400 rows against 8,879 at 256; the bulk workload: 11,315 at up to 758 against 10,671 at 256).
"""

from __future__ import annotations

import math

from bulkgen.config import EngineConfig, SamplingParams
from bulkgen.engine.blocks import BlockManager
from bulkgen.engine.request import Request


def known_length(params: SamplingParams) -> bool:
    """The request runs to max_tokens (or the context): nothing can end it earlier."""
    p = params
    return p.ignore_eos and not p.stop_token_ids and not p.stop and not p.constrained


class OutputShare:
    """The share of its output budget a request of unknown length is expected to use: a high
    quantile of what finished requests used, from a histogram (O(bins) per finished request)."""

    BINS = 20
    QUANTILE = 0.75
    PRIOR = 4  # pseudo-requests that used their whole budget

    def __init__(self) -> None:
        self.counts = [0] * self.BINS
        self.counts[-1] = self.total = self.PRIOR
        self.value = 1.0

    def observe(self, used: int, budget: int) -> None:
        self.counts[min(self.BINS - 1, used * self.BINS // max(budget, 1))] += 1
        self.total += 1
        target, seen = self.QUANTILE * self.total, 0
        for b, count in enumerate(self.counts):
            seen += count
            if seen >= target:
                self.value = (b + 1) / self.BINS  # the bin's upper edge
                return


class Admission:
    """The promised-blocks ledger and the batch-size cap (see the module docstring)."""

    def __init__(self, cfg: EngineConfig, blocks: BlockManager, max_model_len: int) -> None:
        self.blocks, self.max_model_len = blocks, max_model_len
        self.fixed_share = cfg.output_reserve
        self.share = OutputShare()
        self.promised = 0  # blocks running requests still owe to their horizons
        self.auto = cfg.auto_num_seqs
        self.ceiling = cfg.seq_rows
        self.cap = cfg.seq_rows  # the most requests running at once, now
        self.cap_max = 0 if self.auto else self.cap  # auto: the largest cap it chose
        # Arrived requests, for auto's projection: the horizon blocks of those whose share is
        # known at arrival, and the prompt tokens and output budgets of the others (the learned
        # share is applied when the cap is chosen, so that it reaches every one).
        self.arrived = self.known_blocks = 0
        self.unknown = self.unknown_prompts = self.unknown_budgets = 0

    def _end(self, req: Request) -> int:
        return min(len(req.prompt_ids) + req.params.max_tokens, self.max_model_len)

    def share_of(self, req: Request) -> float:
        if self.fixed_share is not None:
            return self.fixed_share
        return 1.0 if known_length(req.params) else self.share.value

    def horizon(self, req: Request) -> int:
        """Blocks of the request's horizon from its length now (at most the whole cache); none
        with a share of 0: nothing is promised, a request is admitted when its first chunk's
        blocks are free (vLLM's rule) and preemption makes room."""
        share = self.share_of(req)
        if share == 0.0:
            return 0
        length, end = req.num_tokens, self._end(req)
        tokens = min(end, length + math.ceil(share * max(0, end - length)))
        return min(self.blocks.cost(max(tokens, length)), self.blocks.num_blocks)

    def owed(self, req: Request) -> int:
        return max(0, req.horizon_blocks - self.blocks.held(req.block_ids))

    @property
    def room(self) -> int:
        """Free blocks that no running request's horizon claims (negative when overcommitted)."""
        return self.blocks.num_free - self.promised

    def admit(self, req: Request) -> bool:
        """Promise req its horizon if the cache can hold it beside every other promise (after
        req took its prefix-cache hits: they are blocks it holds)."""
        req.horizon_blocks = self.horizon(req)
        owed = self.owed(req)
        if owed > self.room:
            req.horizon_blocks = 0
            return False
        self.promised += owed
        return True

    def allocated(self, req: Request, owed_before: int) -> None:
        """req's blocks grew: they came out of its promise; at its horizon, it gets a new one."""
        self.promised -= owed_before - self.owed(req)
        if self.blocks.held(req.block_ids) >= req.horizon_blocks:
            req.horizon_blocks = self.horizon(req)
            self.promised += self.owed(req)

    def release(self, req: Request) -> None:
        """req leaves the running set (finished or preempted): its promise ends."""
        self.promised -= self.owed(req)
        req.horizon_blocks = 0

    # ---- what the workload teaches ---------------------------------------------------------

    def finished(self, req: Request) -> None:
        """Learn the output share from a request that ended by itself (not an error)."""
        if req.admitted and req.finish_reason != "error" and not known_length(req.params):
            self.share.observe(len(req.output_ids), self._end(req) - len(req.prompt_ids))
            self._choose_cap()

    def arrive(self, req: Request) -> None:
        """A new request: auto's cap follows the projected lengths of the arrived requests."""
        if not self.auto:
            return
        self.arrived += 1
        prompt = len(req.prompt_ids)
        budget = self._end(req) - prompt
        if self.fixed_share is not None or known_length(req.params):
            share = 1.0 if self.fixed_share is None else self.fixed_share
            self.known_blocks += self.blocks.cost(prompt + math.ceil(share * budget))
        else:
            self.unknown += 1
            self.unknown_prompts += prompt
            self.unknown_budgets += budget
        self._choose_cap()

    def _choose_cap(self) -> None:
        if not self.auto or not self.arrived:
            return
        tokens = self.unknown_prompts + self.share.value * self.unknown_budgets
        per_request = 0.5 + self.blocks.pair_first  # on average half an empty last block, a partner
        blocks = self.known_blocks + tokens / self.blocks.block_size + self.unknown * per_request
        fit = int(self.blocks.num_blocks * self.arrived / blocks)
        self.cap = max(1, min(self.ceiling, fit))
        self.cap_max = max(self.cap_max, self.cap)

    @property
    def stats(self) -> dict:
        """For stats.json: the batch-size cap (auto: the last and the largest it chose) and the
        output share admission reserved for requests of unknown length when the run ended."""
        share = self.share.value if self.fixed_share is None else self.fixed_share
        return {
            "max_num_seqs_chosen": self.cap,
            "max_num_seqs_chosen_max": self.cap_max,
            "max_num_seqs_ceiling": self.ceiling,
            "output_reserve_share": share,
        }
