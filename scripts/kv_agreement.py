"""Agreement of next-token distributions with a reference's, over the positions of a text set:
what scripts/accuracy_kv_schemes.py and accuracy_attn_fp8.py report for each scheme.

Per reference: top1 (argmax agreement), mean_kl (KL(ref || scheme), nats), clear_top1 (agreement
where the reference's top-2 log-probability margin is >= CLEAR), near_tie_share (the share of the
disagreements whose margin is < NEAR_TIE), most_common_positions ([position in its text,
disagreements]: texts that share a system prompt count one flip there once per text), and
top1 / mean_kl past position PAST.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

import torch

CLEAR, NEAR_TIE = 0.5, 0.1  # nats between the reference's top two log-probabilities
PAST = 64  # *_past_64: positions from here on (past the shared system prompt, and the kept tokens)


@dataclass
class Tally:
    """Agreement of a scheme's next-token distributions with one reference's."""

    positions: int = 0
    agree: int = 0
    kl: float = 0.0
    clear: int = 0
    clear_agree: int = 0
    disagree_near_tie: int = 0
    # position in its text -> disagreements there (texts share the chat template's system
    # prompt, so one flip there counts once per text)
    where: Counter = dataclasses.field(default_factory=Counter)
    past: int = 0
    past_agree: int = 0
    past_kl: float = 0.0

    def add(self, ref: torch.Tensor, got: torch.Tensor) -> None:
        top2 = ref.topk(2, dim=-1).values
        margin = top2[:, 0] - top2[:, 1]
        same = ref.argmax(-1) == got.argmax(-1)
        self.positions += len(ref)
        self.agree += int(same.sum())
        kl = (ref.exp() * (ref - got)).sum(-1)  # KL(ref || got) at each position
        self.kl += float(kl.sum())
        self.clear += int((margin >= CLEAR).sum())
        self.clear_agree += int((same & (margin >= CLEAR)).sum())
        self.disagree_near_tie += int((~same & (margin < NEAR_TIE)).sum())
        self.where.update((~same).nonzero().flatten().tolist())
        self.past += int(same[PAST:].numel())
        self.past_agree += int(same[PAST:].sum())
        self.past_kl += float(kl[PAST:].sum())

    def summary(self) -> dict:
        disagree = self.positions - self.agree
        return {
            "top1": round(self.agree / self.positions, 5),
            "mean_kl": round(self.kl / self.positions, 6),
            "clear_top1": round(self.clear_agree / max(self.clear, 1), 5),
            "disagree": disagree,
            "near_tie_share": round(self.disagree_near_tie / max(disagree, 1), 3),
            "most_common_positions": self.where.most_common(4),
            f"top1_past_{PAST}": round(self.past_agree / max(self.past, 1), 5),
            f"mean_kl_past_{PAST}": round(self.past_kl / max(self.past, 1), 6),
        }
