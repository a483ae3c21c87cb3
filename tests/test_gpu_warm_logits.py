"""The lm_head's GEMM never waits for the GPU at a row count a step can sample (GPU only).

cuBLAS's first GEMM at a new row count returned only once the GPU had finished everything queued
before it (H200, torch 2.11: scripts/bench_gemm_first_use.py), and the rows that sample change
from step to step; the engine's warm-up (warmup.warm_logits) runs the lm_head at every count."""

from __future__ import annotations

import pytest
import torch

from bulkgen.config import EngineConfig
from bulkgen.engine.engine import Engine
from bulkgen.model.shapes import LLAMA3_8B

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _waits(runner, hidden: torch.Tensor) -> bool:
    """Whether the lm_head's GEMM over `hidden` returned only after the GPU drained its queue
    (here a sleep of about 100 ms enqueued just before it)."""
    stream = runner.compute_stream
    with torch.cuda.stream(stream):
        torch.cuda._sleep(200_000_000)
        slept = torch.cuda.Event()
        slept.record(stream)
        runner.model.compute_logits(hidden, widen=False)
        waited = slept.query()
    stream.synchronize()
    return waited


def test_lm_head_never_waits_at_a_sampled_row_count():
    # The 8B shape's lm_head (a tiny model's GEMMs did not wait on the H200), one layer.
    shape = dict(LLAMA3_8B, num_hidden_layers=1)
    cfg = EngineConfig(model="llama3-8b-dummy", load_format="dummy", max_model_len=2048,
                       max_num_seqs=48, prefix_cache=False)  # fmt: skip
    engine = Engine(cfg, model_config=shape)
    runner, rows = engine.runner, engine.cfg.seq_rows
    table = runner.model.model.embed_tokens.weight
    hidden = table.new_zeros(rows + 64, table.shape[1])
    # Row counts past any step's: never warmed. If none of them waits, this stack's cuBLAS has
    # nothing to warm and the check below would prove nothing.
    if not any(_waits(runner, hidden[:m]) for m in (rows + 9, rows + 33, rows + 64)):
        pytest.skip("cuBLAS here does not wait at a new row count")
    waited = [m for m in (1, 2, 7, 23, rows - 1, rows) if _waits(runner, hidden[:m])]
    engine.close()
    assert waited == [], f"the lm_head waited for the GPU at {waited} rows"
