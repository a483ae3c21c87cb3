"""Per-request token statistics on the device for the repetition, presence and frequency penalties.

One row per table row (Request.table_row), allocated on the first penalised request: output-token
counts [rows, vocab] int32 and a prompt-token mask [rows, vocab] bool. A request's row is rebuilt
from its tokens when it enters the running set (admission, or readmission after preemption: its
tokens are all on the host then); after that, every sampled id is counted on the device right
after sampling, so the next step's penalties see the token still in flight to the host.
Everything runs on the compute stream, after the graph replay, so it is never captured.
"""

from __future__ import annotations

import torch

from bulkgen.engine.inputs import StepInputs
from bulkgen.engine.penalties import apply_penalties, count_tokens
from bulkgen.engine.request import Request


class PenaltyState:
    def __init__(self, rows: int, vocab_size: int, device: torch.device) -> None:
        self.rows, self.vocab_size, self.device = rows, vocab_size, device
        self.counts: torch.Tensor | None = None
        self.prompt_mask: torch.Tensor | None = None

    @property
    def active(self) -> bool:
        return self.counts is not None

    def reset(self, fresh: list[Request]) -> None:
        """Rebuild the rows of requests that have just entered the running set."""
        penalised = [r for r in fresh if r.params.penalized]
        if not penalised:
            return
        if self.counts is None:
            self.counts = torch.zeros(self.rows, self.vocab_size, dtype=torch.int32,
                                      device=self.device)  # fmt: skip
            self.prompt_mask = torch.zeros(self.rows, self.vocab_size, dtype=torch.bool,
                                           device=self.device)  # fmt: skip
        rows = [r.table_row for r in penalised]
        out_rows = [r.table_row for r in penalised for _ in r.output_ids]
        out_ids = [t for r in penalised for t in r.output_ids]
        prompt_rows = [r.table_row for r in penalised for _ in r.prompt_ids]
        prompt_ids = [t for r in penalised for t in r.prompt_ids]
        # One pinned upload; the caching host allocator keeps it alive until the copy is done.
        flat = torch.tensor(rows + out_rows + out_ids + prompt_rows + prompt_ids, dtype=torch.int64)
        if self.device.type == "cuda":
            flat = flat.pin_memory().to(self.device, non_blocking=True)
        split = [len(rows), len(out_rows), len(out_ids), len(prompt_rows), len(prompt_ids)]
        rows_t, out_rows_t, out_ids_t, prompt_rows_t, prompt_ids_t = flat.split(split)
        self.counts[rows_t] = 0
        self.prompt_mask[rows_t] = False
        count_tokens(self.counts, out_rows_t, out_ids_t)
        self.prompt_mask[prompt_rows_t, prompt_ids_t] = True

    def apply(self, logits: torch.Tensor, inp: StepInputs) -> torch.Tensor:
        """The sampled rows' logits with their penalties (rows without any are unchanged)."""
        rows = inp.sample_rows
        return apply_penalties(
            logits,
            self.counts[rows],
            self.prompt_mask[rows],
            inp.repetition,
            inp.presence,
            inp.frequency,
        )

    def record(self, inp: StepInputs, ids: torch.Tensor) -> None:
        """Count this step's samples (a finished row's extra token is counted and never read)."""
        count_tokens(self.counts, inp.sample_rows, ids)
