"""scripts/fp8_accuracy.py's text sets and what a line reports: the documents set reads back as
six distinct texts of about 1,000 demo-model tokens (the size its docstring promises), and
agreement() gives the top-1 agreement, its binomial standard error and each text's own
agreement from the logprobs it is handed."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from fp8_accuracy import PAST, TEXTS, agreement, documents, long_texts  # noqa: E402


def test_documents_are_six_distinct_texts_of_about_a_thousand_tokens():
    docs = documents()
    assert len(docs) == 6 and len(set(docs)) == 6
    assert all("=====" not in d and d.strip() for d in docs)
    # 945-1,320 demo-model tokens each (MAX_TOKENS keeps the first 1,024): 4,400-4,900 characters.
    assert all(4000 <= len(d) <= 5500 for d in docs), [len(d) for d in docs]
    assert not any(d in "\n\n".join(TEXTS) for d in docs)
    assert len(long_texts()) == 2


def one_hot_logprobs(argmax: list[int], vocab: int = 5) -> torch.Tensor:
    lp = torch.full((len(argmax), vocab), -10.0)
    lp[torch.arange(len(argmax)), torch.tensor(argmax)] = 0.0
    return torch.log_softmax(lp, dim=-1)


def test_agreement_reports_the_standard_error_and_each_texts_agreement():
    # Two texts: 100 positions agreeing on 90, 80 positions agreeing on all but 8 past PAST.
    first = [0] * 100
    second = [1] * 80
    texts = [first, second]
    base = [one_hot_logprobs([0] * 100), one_hot_logprobs([1] * 80)]
    mode = [one_hot_logprobs([0] * 90 + [2] * 10), one_hot_logprobs([1] * 72 + [3] * 8)]
    line = agreement(texts, mode, base)
    top1 = (90 + 72) / 180
    assert line["positions"] == 180 and line["top1_agreement"] == round(top1, 4)
    assert line["top1_se"] == round(math.sqrt(top1 * (1 - top1) / 180), 4)
    assert line["top1_by_text"] == [0.9, 0.9]
    past = (100 - PAST) + (80 - PAST)
    assert line[f"positions_past_{PAST}"] == past
    assert line[f"top1_past_{PAST}"] == round((26 + 8) / past, 4)
