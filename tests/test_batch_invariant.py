"""--batch-invariant (issue 15): a seeded row gives the same tokens, and the same logprob bits,
alone, in a batch, in smaller batches with chunked prefill, with the prefix cache on or off,
after preemption, and from the synchronous loop; a resumed job writes the rows an uninterrupted
one does. CPU, tiny models in float32 (the GPU checks are in test_gpu_batch_invariant.py)."""

from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner

from bulkgen import LLM
from bulkgen.cli import main
from bulkgen.config import EngineConfig, SamplingParams

VOCAB = range(5, 200)


def prompts(seed: int, n: int, shared: list[int] | None = None) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        own = [rng.choice(VOCAB) for _ in range(rng.randint(3, 40))]
        out.append((shared or []) + own)
    return out


# The rows watched in every run: seeded, sampled with top-p, with logprobs (their bits show any
# difference in the logits). They share a 32-token prefix (two cache blocks) with half the others,
# so that with the prefix cache on they start from cached blocks in some runs and not in others.
PREFIX = prompts(99, 1)[0][:3] * 11
WATCHED = prompts(1, 4, PREFIX[:32])
OTHERS = prompts(2, 10, PREFIX[:32]) + prompts(3, 10)
PARAMS = [
    SamplingParams(
        max_tokens=20, temperature=1.0, top_p=0.9, seed=7 + i, logprobs=2, ignore_eos=True
    )
    for i in range(len(WATCHED))
]
FILLER = SamplingParams(max_tokens=24, temperature=0.8, seed=1, ignore_eos=True)


def outputs(outs) -> list[tuple]:
    return [(o.token_ids, o.logprobs, o.top_logprobs) for o in outs]


def run_watched(model_dir, invariant=True, mates=True, **engine) -> tuple[list[tuple], dict]:
    """The watched rows' outputs, run among the others (mates) or each alone."""
    llm = LLM(str(model_dir), dtype="float32", device="cpu", batch_invariant=invariant, **engine)
    try:
        if mates:
            batch = OTHERS[:10] + WATCHED + OTHERS[10:]
            params = [FILLER] * 10 + PARAMS + [FILLER] * 10
            outs = llm.generate(batch, params)[10 : 10 + len(WATCHED)]
        else:
            outs = [llm.generate([p], [sp])[0] for p, sp in zip(WATCHED, PARAMS, strict=True)]
        return outputs(outs), llm.engine.stats
    finally:
        llm.close()


@pytest.fixture(scope="module")
def alone(tiny_model_dir):
    return run_watched(tiny_model_dir, mates=False)[0]


@pytest.mark.parametrize(
    "engine",
    [
        {},
        {"max_num_seqs": 3, "max_batch_tokens": 16},  # small batches, prompts prefilled in chunks
        {"prefix_cache": False},
        {"async_loop": False},
    ],
    ids=["batch-of-24", "3-seqs-chunked", "no-prefix-cache", "sync"],
)
def test_a_row_gives_the_same_bits_alone_and_among_others(tiny_model_dir, alone, engine):
    batched, stats = run_watched(tiny_model_dir, **engine)
    assert stats["batch_invariant"] is True
    assert batched == alone


def test_a_row_gives_the_same_bits_after_preemption(tiny_model_dir, alone):
    # 14 blocks of 16 tokens for 24 requests of up to 92 tokens, and no output reserve at
    # admission: requests are preempted and recomputed through the prefill path.
    batched, stats = run_watched(tiny_model_dir, num_blocks=14, output_reserve=0.0)
    assert stats["preemptions"] > 0 and stats["recomputed_tokens"] > 0
    assert batched == alone


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_every_architecture_is_invariant(tiny_models, arch):
    """qwen2's QKV bias, qwen3's q/k norms and tied embeddings."""
    alone, _ = run_watched(tiny_models[arch], mates=False)
    batched, _ = run_watched(tiny_models[arch], max_num_seqs=5, max_batch_tokens=24)
    assert batched == alone


def test_without_the_flag_the_logits_depend_on_the_batch(tiny_model_dir):
    """Why the mode exists: the default kernels round a row differently among other rows (the
    logprobs' bits differ on this CPU), which the checks above would catch."""
    alone, _ = run_watched(tiny_model_dir, invariant=False, mates=False)
    batched, _ = run_watched(tiny_model_dir, invariant=False)
    assert [lp for _, lp, _ in batched] != [lp for _, lp, _ in alone]


def test_refused_with_tensor_parallel_and_fp8_weights():
    with pytest.raises(ValueError, match="tensor_parallel"):
        EngineConfig(model="m", batch_invariant=True, tensor_parallel=2)
    with pytest.raises(ValueError, match="--quantization fp8"):
        EngineConfig(model="m", batch_invariant=True, quantization="fp8")


# ---- bulkgen run --------------------------------------------------------------------------


def bulkgen(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def rows(out) -> dict[str, dict]:
    found = {}
    for path in sorted(out.glob("part-*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            found[row["id"]] = row
    return found


def test_a_resumed_job_writes_the_rows_of_an_uninterrupted_one(tmp_path, tiny_model_dir):
    inputs = tmp_path / "in.jsonl"
    rng = random.Random(5)
    words = ["sea", "tree", "blue", "cat", "run", "hello", "code", "sun", "why", "list"]
    inputs.write_text(
        "".join(
            json.dumps(
                {"id": f"r{i}", "prompt": " ".join(rng.choices(words, k=rng.randint(2, 30)))}
            )
            + "\n"
            for i in range(30)
        )
    )
    common = [inputs, "-m", tiny_model_dir, "--device", "cpu", "--dtype", "float32", "-q",
              "--format", "jsonl", "--shard-size", "5", "--max-tokens", "12",
              "--temperature", "0.9", "--seed", "3", "--logprobs", "1",
              "--max-num-seqs", "8", "--batch-invariant"]  # fmt: skip
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert bulkgen("run", *common, "-o", whole).exit_code == 0
    assert bulkgen("run", *common, "-o", resumed).exit_code == 0
    shards = sorted(resumed.glob("part-*.jsonl"))
    for lost in (shards[1], shards[-1]):  # a crash lost these: their rows run again, with others
        lost.unlink()
    result = bulkgen("run", *common, "-o", resumed)
    assert result.exit_code == 0, result.output
    expected, got = rows(whole), rows(resumed)
    assert len(got) == 30 and got == expected

    job = json.loads((whole / "job.json").read_text())
    assert job["batch_invariant"] is True and job["settings"]["batch_invariant"] is True
    assert json.loads((whole / "stats.json").read_text())["batch_invariant"] is True


def test_a_rerun_in_the_other_mode_asks_for_overwrite(tmp_path, tiny_model_dir):
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('{"prompt": "hello"}\n{"prompt": "sea"}\n')
    common = [inputs, "-m", tiny_model_dir, "--device", "cpu", "--dtype", "float32", "-q",
              "--max-tokens", "4", "-o", tmp_path / "out"]  # fmt: skip
    assert bulkgen("run", *common).exit_code == 0
    result = bulkgen("run", *common, "--batch-invariant")
    assert result.exit_code == 1
    assert "batch_invariant" in result.stderr and "--overwrite" in result.stderr
    assert bulkgen("run", *common, "--batch-invariant", "--overwrite").exit_code == 0


def test_the_cli_refuses_it_with_tensor_parallel(tmp_path, tiny_model_dir):
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('{"prompt": "hello"}\n')
    result = bulkgen("run", inputs, "-m", tiny_model_dir, "-o", tmp_path / "out",
                     "--batch-invariant", "--tensor-parallel", "2")  # fmt: skip
    assert result.exit_code == 2 and "tensor_parallel" in result.output
