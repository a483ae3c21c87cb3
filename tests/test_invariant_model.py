"""make_batch_invariant on a loaded tiny model (issue 15): every GEMM swapped, nothing else
touched, and a sequence's logits the same bits whether it is prefilled alone or beside others.

The forward runs the torch attention backend on the CPU, which attends per prefilling sequence;
so the rows of a sequence meet their batch mates only in the linears and the logits, the GEMMs
that make_batch_invariant replaces (torch's own F.linear gives a row alone other float32 bits
than the same row in a batch on this CPU: tests/test_invariant_matmul.py).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bulkgen.model.attention import get_backend
from bulkgen.model.attention.metadata import AttnMetadata
from bulkgen.model.config import ModelConfig
from bulkgen.model.invariant import InvariantLinear, invariant_linear, make_batch_invariant
from bulkgen.model.loader import load_model

CPU = torch.device("cpu")
BLOCK = 16


def load(model_dir, quantization: str | None = None) -> nn.Module:
    cfg = ModelConfig.from_dir(model_dir)
    backend = get_backend("torch", CPU)
    return load_model(model_dir, cfg, backend, torch.float32, CPU, quantization=quantization)


def prefill_logits(model: nn.Module, sequences: list[list[int]]) -> list[torch.Tensor]:
    """One prefill step of these sequences together: each one's logits [len, vocab]."""
    cfg, lens = model.cfg, [len(s) for s in sequences]
    blocks = [-(-n // BLOCK) for n in lens]
    shape = (sum(blocks), BLOCK, cfg.num_kv_heads, cfg.head_dim)
    kv = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(cfg.num_layers)]
    first = [sum(blocks[:b]) for b in range(len(lens))]
    tables = torch.zeros(len(lens), max(blocks), dtype=torch.int32)
    for b, (start, count) in enumerate(zip(first, blocks, strict=True)):
        tables[b, :count] = torch.arange(start, start + count)
    slots = torch.cat(
        [start * BLOCK + torch.arange(n) for start, n in zip(first, lens, strict=True)]
    )
    meta = AttnMetadata(
        slot_mapping=slots,
        query_start_loc=torch.tensor(
            [0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32
        ),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        block_tables=tables,
        max_query_len=max(lens),
        max_seq_len=max(lens),
        decode_only=False,
        query_lens_host=lens,
        seq_lens_host=lens,
    )
    ids = torch.tensor([t for s in sequences for t in s])
    positions = torch.cat([torch.arange(n) for n in lens])
    with torch.no_grad():
        logits = model.compute_logits(model(ids, positions, meta, kv))
    return list(logits.split(lens))


# Short: MKL's float32 GEMM here gives rows of a 1..11-row matrix other bits than the same rows
# in a larger one, so without make_batch_invariant these logits differ alone and in the batches
# below (measured for both prompts and both models).
PROMPT = list(range(5, 12))
OTHERS = [list(range(40, 43)), list(range(100, 161)), [7] * 9]


@pytest.mark.parametrize("prompt", [PROMPT, [5]], ids=["7 tokens", "1 token"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # tied embeddings; untied head, qkv bias
def test_a_sequence_has_the_same_logits_alone_and_among_others(tiny_models, arch, prompt):
    model = make_batch_invariant(load(tiny_models[arch]))
    alone = prefill_logits(model, [prompt])[0]
    for batch in ([prompt, *OTHERS], [*OTHERS, prompt], [OTHERS[1], prompt]):
        together = prefill_logits(model, batch)[batch.index(prompt)]
        assert torch.equal(together, alone)


def test_logits_stay_those_of_the_model(tiny_model_dir):
    plain, invariant = load(tiny_model_dir), make_batch_invariant(load(tiny_model_dir))
    batch = [PROMPT, *OTHERS]
    got, want = prefill_logits(invariant, batch), prefill_logits(plain, batch)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_every_gemm_is_swapped_and_every_parameter_kept(tiny_models):
    model = load(tiny_models["qwen2"])
    before = {name: p for name, p in model.named_parameters()}
    make_batch_invariant(model)
    assert not [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    swapped = [n for n, m in model.named_modules() if isinstance(m, InvariantLinear)]
    assert len(swapped) == 4 * model.cfg.num_layers + 1  # qkv, o, gate_up, down; lm_head
    after = dict(model.named_parameters())
    assert after.keys() == before.keys()
    assert all(after[name] is param for name, param in before.items())
    assert model.model.embed_tokens.linear is invariant_linear
    make_batch_invariant(model)  # a second call changes nothing
    assert dict(model.named_parameters()).keys() == before.keys()


def test_fp8_weights_are_refused_with_the_option_to_drop(tiny_model_dir):
    model = load(tiny_model_dir, quantization="fp8")
    with pytest.raises(ValueError, match="--quantization fp8"):
        make_batch_invariant(model)
