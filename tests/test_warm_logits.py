"""warmup.warm_logits: the lm_head run once at every row count a step can sample, up to
WARM_LOGITS_ROWS (its effect, no GPU wait at those counts, is tests/test_gpu_warm_logits.py's)."""

from __future__ import annotations

import contextlib
import types

import torch

from bulkgen.engine import warmup


class _Model:
    """compute_logits records the row counts (and widening) it is asked for."""

    def __init__(self, hidden: int) -> None:
        table = torch.zeros(11, hidden, dtype=torch.bfloat16)
        self.model = types.SimpleNamespace(embed_tokens=types.SimpleNamespace(weight=table))
        self.calls: list[tuple[int, int, torch.dtype, bool]] = []

    def compute_logits(self, hidden: torch.Tensor, widen: bool = True) -> torch.Tensor:
        self.calls.append((*hidden.shape, hidden.dtype, widen))
        return hidden


def _run(monkeypatch, rows: int) -> list:
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    model = _Model(hidden=8)
    stream = types.SimpleNamespace(synchronize=lambda: None)
    warmup.warm_logits(model, rows, stream)
    return model.calls


def test_every_row_count_once_in_the_activations_dtype(monkeypatch):
    calls = _run(monkeypatch, 37)
    assert calls == [(m, 8, torch.bfloat16, False) for m in range(1, 38)]


def test_the_counts_stop_at_warm_logits_rows(monkeypatch):
    monkeypatch.setattr(warmup, "WARM_LOGITS_ROWS", 5)
    assert [c[0] for c in _run(monkeypatch, 4096)] == [1, 2, 3, 4, 5]
