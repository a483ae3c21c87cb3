"""Pinned host memory that a step's sampled ids (and logprobs) are copied into from the device."""

from __future__ import annotations

import torch


class HostOut:
    """Pinned host memory one step's samples land in (two alternate between steps)."""

    def __init__(self, rows: int, pin: bool) -> None:
        self.rows, self.pin = rows, pin
        self.ids = torch.empty(rows, dtype=torch.int64, pin_memory=pin)
        self.k = -1  # top-k width of the logprob buffers, allocated on first use
        self.chosen = self.top_ids = self.top_vals = torch.empty(0)

    def logprobs(self, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Contiguous [n], [n, k], [n, k] views (a strided pinned destination would make the
        device-to-host copy synchronous)."""
        if k > self.k:
            self.chosen = torch.empty(self.rows, dtype=torch.float32, pin_memory=self.pin)
            self.top_ids = torch.empty(self.rows * k, dtype=torch.int64, pin_memory=self.pin)
            self.top_vals = torch.empty(self.rows * k, dtype=torch.float32, pin_memory=self.pin)
            self.k = k
        return self.chosen[:n], self.top_ids[: n * k].view(n, k), self.top_vals[: n * k].view(n, k)
