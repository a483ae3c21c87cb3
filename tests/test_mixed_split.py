"""A mixed step's decoding rows through the decode kernel (triton_backend.SPLIT_MIXED_MIN_ROWS): the
metadata counts them, and the output equals the varlen kernel's for every cache kind; the engine
generates the same tokens either way.

Without CUDA the kernels run under the Triton interpreter (TRITON_INTERPRET is set before triton
is imported).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from test_triton_kernels import DEVICE, metadata, nan_buffers, paged_kv, rel_err  # noqa: E402, F401

from bulkgen.model.attention import get_backend, torch_backend, triton_backend  # noqa: E402
from bulkgen.model.attention.kv_fp8 import FP8_DTYPE  # noqa: E402
from bulkgen.model.attention.kv_int8 import quantize  # noqa: E402

HEADS, GROUP, DIM, BLOCK = 2, 4, 64, 16


def test_the_metadata_counts_the_leading_one_row_sequences():
    backend = get_backend("torch", torch.device("cpu"))
    empty = torch.empty(0)

    def prefix(query_lens):
        seq_lens = [n + 5 for n in query_lens]
        return backend.metadata(empty, empty, empty, empty, query_lens, seq_lens).num_decode_prefix

    assert prefix([1, 1, 1, 40]) == 3
    assert prefix([1, 7, 1, 1]) == 1, "only the front: the kernels take contiguous runs"
    assert prefix([30, 1]) == 0
    assert prefix([1, 1, 1]) == 0, "a decode-only step has no mixed part to split"


def caches(seq_lens, kind):
    """K/V for the sequences in shuffled blocks (NaN where nobody's), and the scales to pass."""
    k, v, tables = paged_kv(seq_lens, BLOCK, HEADS, DIM, torch.float32)
    if kind == "fp8":
        return k.to(FP8_DTYPE), v.to(FP8_DTYPE), tables, {"k_scale": 0.5, "v_scale": 0.25}
    if kind == "int8":
        (kq, ks), (vq, vs) = quantize(k.nan_to_num()), quantize(v.nan_to_num())
        return kq, vq, tables, {"k_scale": ks, "v_scale": vs}
    return k, v, tables, {}


@pytest.mark.usefixtures("nan_buffers")  # outputs start as NaN: every row must be written
@pytest.mark.parametrize("kind", ["float32", "fp8", "int8"])
def test_a_split_mixed_step_equals_the_varlen_kernel_alone(monkeypatch, kind):
    """Decoding rows of very different contexts first, then a prefill chunk and a whole prompt."""
    seq_lens, query_lens = [7, 300, 64, 1, 90, 33], [1, 1, 1, 1, 17, 33]
    k, v, tables, scales = caches(seq_lens, kind)
    meta = metadata(seq_lens, query_lens, tables)
    meta.num_decode_prefix = 4
    q = torch.randn(sum(query_lens), HEADS * GROUP, DIM, device=DEVICE)
    outs = {}
    for split in (False, True):
        monkeypatch.setattr(triton_backend, "SPLIT_MIXED_MIN_ROWS", 1 if split else None)
        outs[split] = triton_backend.paged_attention(q, k, v, meta, DIM**-0.5, **scales)
        # Into a given buffer (mixed_graphs.py's static one): the same bits, the buffer back.
        into = torch.full_like(q, float("nan"))
        given = triton_backend.paged_attention(q, k, v, meta, DIM**-0.5, **scales, out=into)
        assert given is into and torch.equal(into, outs[split])
    assert outs[True].shape == q.shape and torch.isfinite(outs[True]).all()
    assert rel_err(outs[True], outs[False]) < 1e-5
    if kind == "float32":
        ref = torch_backend.paged_attention(q, k, v, meta, DIM**-0.5)
        assert rel_err(outs[True], ref) < 1e-5
        into = torch.full_like(q, float("nan"))
        given = torch_backend.paged_attention(q, k, v, meta, DIM**-0.5, out=into)
        assert given is into and torch.equal(into, ref)


def test_the_prefill_part_of_a_split_step_is_aligned_copies_built_once_a_step():
    seq_lens, query_lens = [7, 300, 64, 90, 33], [1, 1, 1, 17, 33]
    _, _, tables, _ = caches(seq_lens, "float32")
    meta = metadata(seq_lens, query_lens, tables)
    part = triton_backend.prefill_part(meta, 3)
    starts, lens, part_tables = part
    assert starts.tolist() == [0, 17, 50] and lens.tolist() == [90, 33]
    assert torch.equal(part_tables, tables[3:])
    # Three int32s in, a slice would sit 12 bytes past an alignment Triton specialises on.
    assert all(t.data_ptr() % 16 == 0 for t in part)
    assert triton_backend.prefill_part(meta, 3) is part, "the step's other layers reuse it"


def test_the_warm_up_runs_a_split_mixed_step_so_no_kernel_compiles_mid_run():
    from bulkgen.config import EngineConfig
    from bulkgen.engine.warmup import warmup_plans

    cfg = EngineConfig(model="-", block_size=16)  # as the engine resolves it
    prefixes = []
    for plan in warmup_plans(cfg, 4096):
        lens = [s.num_tokens for s in plan.seqs]
        if max(lens) > 1:
            prefixes.append(next(i for i, n in enumerate(lens) if n > 1))
    assert max(prefixes) >= triton_backend.SPLIT_MIXED_MIN_ROWS
    assert max(prefixes) % 4, "its prefill chunk's metadata starts off a 16-byte boundary"


def test_out_must_be_a_contiguous_tensor_of_the_query_s_shape():
    from bulkgen.model.attention.triton_decode import paged_decode

    k, v, tables, _ = caches([20, 9], "float32")
    q = torch.randn(2, HEADS * GROUP, DIM, device=DEVICE)
    seq_lens = torch.tensor([20, 9], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="out must be contiguous"):
        paged_decode(q, k, v, seq_lens, tables, 0.1, out=torch.empty(2, DIM, HEADS * GROUP).mT)
    out = torch.empty_like(q)
    assert paged_decode(q, k, v, seq_lens, tables, 0.1, out=out) is out


def engine_tokens(model_dir, monkeypatch, split: bool, device: str) -> list[list[int]]:
    from test_engine import PROMPTS, encode_all

    from bulkgen import LLM, SamplingParams

    monkeypatch.setattr(triton_backend, "SPLIT_MIXED_MIN_ROWS", 1 if split else None)
    # Mixed steps that gave their decoding rows the decode kernel: only they take the rest's
    # metadata apart (every launch may pass out= now: mixed_graphs.py's static buffer).
    mixed_decodes = []
    part = triton_backend.prefill_part

    def spy(meta, rows):
        mixed_decodes.append(rows)
        return part(meta, rows)

    monkeypatch.setattr(triton_backend, "prefill_part", spy)
    ids = encode_all(model_dir, PROMPTS)
    # Few tokens a step: chunked prefills beside decoding rows, so most steps are mixed.
    llm = LLM(str(model_dir), device=device, dtype="float32", attention="triton",
              max_num_seqs=8, max_batch_tokens=24, num_blocks=64)  # fmt: skip
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    tokens = [o.token_ids for o in llm.generate(ids, params)]
    assert any(mixed_decodes) == split, "mixed steps with decoding rows ran, split or not"
    return tokens


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU test below covers CUDA")
def test_the_engine_generates_the_same_tokens_with_mixed_steps_split(tiny_model_dir, monkeypatch):
    split = engine_tokens(tiny_model_dir, monkeypatch, True, "cpu")
    assert split == engine_tokens(tiny_model_dir, monkeypatch, False, "cpu")
    assert len({tuple(t) for t in split}) > 1  # not one degenerate answer for all


@pytest.mark.gpu
def test_gpu_the_engine_generates_the_same_tokens_with_mixed_steps_split(
    tiny_model_dir, monkeypatch
):
    split = engine_tokens(tiny_model_dir, monkeypatch, True, "cuda")
    assert split == engine_tokens(tiny_model_dir, monkeypatch, False, "cuda")
