"""What a launched step hands back: Step (the host buffers its samples land in, and the event
that says they have), its StepResult once waited for, and Forward (a forward pass whose sampling
is enqueued later, for constrained rows)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from bulkgen.engine.inputs import PackedStep, StepInputs
from bulkgen.engine.plan import Plan


@dataclass
class StepResult:
    """Host values of one step's samples, in the order of plan.sampled."""

    ids: list[int]
    logprobs: list[float] | None = None
    # The bytes of each row's top ids (int64) and their logprobs (float64), width per row: a
    # request appends its row's first k without making a Python object per entry. They may view
    # the step's pinned buffer: read them in Scheduler.update, before that buffer's next step.
    top_ids: memoryview | None = None
    top_logprobs: memoryview | None = None
    width: int = 0

    def top(self, row: int, k: int) -> tuple[memoryview, memoryview]:
        """The bytes of row's first k top ids and logprobs (8 bytes an entry)."""
        start = row * self.width * 8
        end = start + k * 8
        return self.top_ids[start:end], self.top_logprobs[start:end]


@dataclass
class Step:
    plan: Plan | None  # None on a tensor-parallel follower
    ids: torch.Tensor  # host (pinned) tensors, valid once `done` has fired
    logprob_tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    done: torch.cuda.Event | None
    begin: torch.cuda.Event | None = None  # where its work began (gpu_gaps.py)

    def synchronize(self) -> None:
        if self.done is not None:
            self.done.synchronize()

    def wait(self) -> StepResult:
        self.synchronize()
        result = StepResult(self.ids.tolist())
        if self.logprob_tensors is not None:
            chosen, top_ids, top_vals = self.logprob_tensors
            result.logprobs = chosen.tolist()
            result.width = top_ids.shape[1]
            result.top_ids = _bytes(top_ids)
            result.top_logprobs = _bytes(top_vals.double())  # float32 widens exactly
        return result


def _bytes(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous host tensor (no copy)."""
    return memoryview(t.contiguous().numpy().reshape(-1).view(np.uint8))


@dataclass
class Forward:
    """A launched forward pass whose sampling is not enqueued yet."""

    plan: Plan | None  # None on a tensor-parallel follower
    packed: PackedStep
    inp: StepInputs
    logits: torch.Tensor | None
    begin: torch.cuda.Event | None = None
