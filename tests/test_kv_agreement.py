"""scripts/kv_agreement.py: the agreement numbers the KV accuracy scripts report."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from kv_agreement import PAST, Tally  # noqa: E402


def test_counts_flips_by_position_and_past_the_shared_prompt():
    torch.manual_seed(0)
    ref = torch.log_softmax(torch.randn(PAST + 10, 7), dim=-1)
    got = ref.clone()
    got[[3, PAST + 2]] = ref[[3, PAST + 2]].flip(-1)  # two positions whose top choice moves
    flipped = ref.argmax(-1)[[3, PAST + 2]] != got.argmax(-1)[[3, PAST + 2]]
    tally = Tally()
    tally.add(ref, got)
    tally.add(ref, ref)  # a second text, identical to its reference
    summary = tally.summary()
    assert summary["disagree"] == int(flipped.sum())
    assert dict(summary["most_common_positions"]) == {
        p: 1 for p, f in zip((3, PAST + 2), flipped.tolist(), strict=True) if f
    }
    kl = (ref.exp() * (ref - got)).sum(-1)
    assert abs(summary["mean_kl"] - float(kl.sum()) / (2 * len(ref))) < 1e-6
    assert abs(summary[f"mean_kl_past_{PAST}"] - float(kl[PAST:].sum()) / 20) < 1e-6
    assert summary[f"top1_past_{PAST}"] == round(1 - int(flipped[1]) / 20, 5)
